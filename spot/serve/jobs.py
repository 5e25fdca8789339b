"""A request's decoding fields -> a checked decode job, before it waits for an engine; a finished decode -> what the
request gets back (at most max_tokens ids, why it ended, spot's pass figures).

A request is resolved as `spot generate` resolves one (spot.app.request_options: its checks, its messages, its budget
resolved once) and checked against the model's context (check_request): a bad request is refused with the same
message the CLI gives, and never takes a place in the queue.
"""
from __future__ import annotations

import secrets
from dataclasses import dataclass

from spot.app.tuned_budgets import ModelArgs
from spot.errors import SpotError
from spot.app.request_options import RequestOptions, ResolvedRequest, resolve_request
from spot.runtime.decode import Generation, check_request
from spot.runtime.decode_plan import DecodeRequest
from spot.runtime.summary import static_passes
from spot.runtime.registry import decoder as decoder_entry
from spot.runtime.step import Sampling
from spot.serve.model import ServedModel

FIELD_NAMES = ("budget", "depth")       # how messages name the budget fields of a request


@dataclass(frozen=True)
class DecodeFields:
    """What one request asks; None: the server's default (spot.serve.model.RequestDefaults), a random seed."""

    max_tokens: int
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    decoder: str | None = None
    budget: int | str | None = None
    depth: int | None = None
    mode: str | None = None
    tau: float | None = None


@dataclass(frozen=True)
class Job:
    """A checked decode, resolved once (spot.app.request_options.ResolvedRequest): run(engine, on_block) decodes it on
    any engine of the model, of which the request gets the first max_tokens ids."""

    prompt_ids: list[int]
    resolved: ResolvedRequest
    max_tokens: int

    @property
    def decoder(self) -> str:
        return self.resolved.decoder

    @property
    def request(self) -> DecodeRequest:
        return self.resolved.request

    @property
    def tree(self) -> dict | None:
        """The budget a tree decoder verifies with, {nodes, depth, tuned: where an `auto` budget came from, else
        None}; None for a decoder without trees."""
        return self.resolved.budget_facts()

    @property
    def seed(self) -> int:
        return self.request.sampling.seed

    def run(self, engine, on_block=None) -> Generation:
        return self.resolved.run(engine, self.prompt_ids, on_block)


def _given(value, default):
    return default if value is None else value


def build_job(model: ServedModel, engine, drafter, prompt_ids, fields: DecodeFields) -> Job:
    """The job `fields` ask for on `engine` (any engine of the model: only its shape is read); SpotError naming
    what is wrong otherwise. max_tokens is the decode's max_new_tokens (it decodes to the block boundary after it)."""
    d = model.defaults
    decoder = _given(fields.decoder, d.decoder)
    if decoder_entry(decoder).drafts and drafter is None:
        raise SpotError(f"decoder {decoder!r} needs a drafter (order model), and {model.name} is served without one",
                        "use decoder tree or chain (SPOT without a drafter), or start the server with --drafter "
                        "PATH")
    # a request's own budget comes with its own depth (or the default one); the server's budget with the server's
    depth = fields.depth if fields.budget is not None else _given(fields.depth, d.depth)
    seed = secrets.randbelow(2**32) if fields.seed is None else fields.seed     # reported back: reproducible
    sampling = Sampling(_given(fields.temperature, d.temperature), _given(fields.top_k, 0),
                        _given(fields.top_p, d.top_p), seed)
    options = RequestOptions(decoder, _given(fields.budget, d.budget), depth, fields.max_tokens,
                             _given(fields.mode, d.mode), _given(fields.tau, d.tau), sampling, names=FIELD_NAMES)
    prompt = check_request(engine, prompt_ids, fields.max_tokens)
    args = ModelArgs(model.folder, model.backend, model.model_arg, model.device, model.sampler, model.kv_cache,
                     model.block_size, model.drafter_arg)
    # the budget's own checks now, not when an engine is free
    return Job([int(i) for i in prompt], resolve_request(options, engine, args, lambda: drafter), fields.max_tokens)


def check_prompt_fits(prompt: str | list, tokenizer, context: int) -> None:
    """SpotError for a prompt that cannot fit in `context` tokens, decided before a text is encoded (more characters
    than tokenizer.max_text_chars(context)) or a list of ids read: encoding a 10 MB text took 44 s, to be refused
    after it."""
    if isinstance(prompt, str):
        limit = tokenizer.max_text_chars(context)
        if len(prompt) > limit:
            raise SpotError(f"the prompt is {len(prompt)} characters, more than the model's limit of {context} tokens "
                            f"holds ({limit} characters at most with this tokenizer)", "shorten the prompt")
    elif len(prompt) > context:
        raise SpotError(f"the prompt is {len(prompt)} token ids, more than the model's limit of {context}",
                        "shorten the prompt")


def check_defaults(model: ServedModel, engine, drafter) -> None:
    """SpotError now, at startup, when the defaults themselves make a bad request (a budget or depth this engine
    cannot verify, a decoder that needs a drafter there is none of, `auto` with nothing tuned): a request that
    names nothing would get it."""
    build_job(model, engine, drafter, [], DecodeFields(max_tokens=1, seed=0))


def room_left(ids: list[int], sent: int, max_tokens: int) -> list[int]:
    """The part of a finished block's ids a request still gets after `sent` ids: the decode runs to the block
    boundary after max_tokens, the request gets max_tokens at most."""
    return ids[: max(0, max_tokens - sent)]


def finish_reason(gen: Generation, max_tokens: int) -> str:
    """"stop": a stop id ended the text within max_tokens; "length": max_tokens (or the block boundary) ended it."""
    return "stop" if gen.stopped and len(gen.token_ids) <= max_tokens else "length"


def usage(job: Job, gen: Generation, returned: int, block_size: int) -> dict:
    """OpenAI's usage of a request that got `returned` ids, and spot's pass figures beside it."""
    return {"prompt_tokens": len(job.prompt_ids), "completion_tokens": returned,
            "total_tokens": len(job.prompt_ids) + returned, **pass_figures(job, gen, block_size)}


def pass_figures(job: Job, gen: Generation, block_size: int) -> dict:
    """spot's figures of one decode: its target passes (by kind), the passes static standard decoding spends on the
    same blocks (spot.runtime.summary.static_passes: computed, not decoded a second time), their ratio, and
    target passes per decoded token (decoded: to the block boundary, max_tokens or not); the decoder, its tree
    budget (Job.tree) and the seed."""
    static = static_passes(len(job.prompt_ids), block_size, gen.stats.blocks, job.request.store_mode)
    passes = gen.stats.target_passes
    return {"target_passes": passes, "passes": gen.stats.to_dict()["passes"],
            "static_passes": static, "passes_reduction": static / passes if passes else None,
            "decoded_tokens": len(gen.token_ids), "passes_per_token": passes / max(len(gen.token_ids), 1),
            "decoder": job.decoder, "budget": job.tree, "seed": job.seed}
