"""A server's Prometheus metrics (`GET /metrics`, text format 0.0.4): requests by endpoint and status, tokens,
target passes (and the passes static decoding would spend on the same blocks), queue depth, busy engines, and
latency histograms (whole request, queue wait, first block, decode). One registry per server: two servers in one
process (tests) keep their own counts."""
from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from spot.serve.jobs import pass_figures

# seconds: a block of a small model on a CPU takes milliseconds, a long answer of an 8B model minutes
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 60, 120, 300)
CONTENT_TYPE = CONTENT_TYPE_LATEST


class ServeMetrics:
    def __init__(self, pool, block_size: int):
        self.block_size = block_size
        r = self.registry = CollectorRegistry()
        self.requests = Counter("spot_requests", "Requests answered, by endpoint and HTTP status "
                                "(499: the client went away)", ["endpoint", "status"], registry=r)
        self.prompt_tokens = Counter("spot_prompt_tokens", "Prompt tokens of decoded requests", registry=r)
        self.completion_tokens = Counter("spot_completion_tokens", "Tokens returned to clients", registry=r)
        self.decoded_tokens = Counter("spot_decoded_tokens", "Tokens decoded (to the block boundary)", ["decoder"],
                                      registry=r)
        self.target_passes = Counter("spot_target_passes", "Target passes of the decodes", ["decoder"], registry=r)
        self.static_passes = Counter("spot_static_passes", "Target passes static standard decoding spends on the "
                                     "same blocks (passes reduction = static / target)", ["decoder"], registry=r)
        self.cancelled = Counter("spot_cancelled_decodes", "Decodes ended early: the client went away", registry=r)
        Gauge("spot_queue_depth", "Requests waiting for an engine", registry=r).set_function(
            lambda: pool.queue_depth)
        Gauge("spot_engines_busy", "Engines decoding a request", registry=r).set_function(
            lambda: pool.engines - pool.free_engines)
        Gauge("spot_engines", "Engines of the pool", registry=r).set_function(lambda: pool.engines)
        self.latency = Histogram("spot_request_seconds", "Request latency, from arrival to the last byte",
                                 ["endpoint"], buckets=LATENCY_BUCKETS, registry=r)
        self.queue_wait = Histogram("spot_queue_wait_seconds", "Time a request waited for an engine",
                                    buckets=LATENCY_BUCKETS, registry=r)
        self.first_block = Histogram("spot_first_block_seconds", "Time from a request's arrival to its first "
                                     "finished block", buckets=LATENCY_BUCKETS, registry=r)
        self.decode_seconds = Histogram("spot_decode_seconds", "Decode time on an engine", ["decoder"],
                                        buckets=LATENCY_BUCKETS, registry=r)

    def decoded(self, ticket, gen) -> None:
        """A decode ran (the pool's on_done, on the engine's thread)."""
        job, decoder = ticket.job, ticket.job.decoder
        figures = pass_figures(job, gen, self.block_size)
        self.queue_wait.observe(ticket.started - ticket.submitted)
        self.decode_seconds.labels(decoder).observe(ticket.finished - ticket.started)
        self.prompt_tokens.inc(len(job.prompt_ids))
        self.decoded_tokens.labels(decoder).inc(len(gen.token_ids))
        self.target_passes.labels(decoder).inc(figures["target_passes"])
        self.static_passes.labels(decoder).inc(figures["static_passes"])
        if gen.cancelled:
            self.cancelled.inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
