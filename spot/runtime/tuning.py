"""Cost-aware tree budgets: choose (nodes, depth) that maximise expected tokens/s on the engine in use.

A pass over N states costs latency(N) (measured on the device: nearly flat where memory-bound, ~linear in N where
compute-bound). What a decoder did on the tuning prompts is counted, not modelled (hardware-free): its one-state
passes (each block's first pass, the store passes), the node count of every verify pass, its host milliseconds and
the commit steps it took. Expected milliseconds = the one-state passes x latency(1) + the sum of latency(nodes) over
verify passes + host ms; the same for standard decoding (every step a one-state pass, plus its own host sampling:
at T > 0 it computes the noise of every masked position, and leaving it out would overrate standard decoding against
small trees). Steps per verify pass alone would overrate trees: each block's first pass commits one step and the
last verify pass of a block often commits no free root (by 20-30% at SDAR's block size 4).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from spot.runtime.engine import Engine
from spot.runtime.step import Sampling


@dataclass(frozen=True)
class BudgetChoice:
    nodes: int
    depth: int
    expected_steps_per_ms: float
    standard_steps_per_ms: float

    @property
    def expected_speedup(self) -> float:
        return self.expected_steps_per_ms / self.standard_steps_per_ms


def measure_latency_curve(engine: Engine, prefix_ids: np.ndarray, node_counts: list[int], repeats: int = 5,
                          rng_seed: int = 0) -> dict[int, float]:
    """Milliseconds of one pass over N random states after a prefill of `prefix_ids`, as the decoders run it
    (Engine.block_outputs): the logits to the host, or — on an engine that samples on the device — the target
    alone: its epilogue runs per state when the walk reads it, so the decoders' walk and sampling times (the host
    ms choose_budget adds) carry that cost. The fastest of `repeats` (other work on the machine only adds time),
    then made non-decreasing in N: a pass over more states never costs less, and a dip (a 1-state pass measured
    at 10 ms beside 2 ms for 2 states on a busy machine) would make a tree look free."""
    rng = np.random.default_rng(rng_seed)
    b = engine.block_size
    engine.prefill(prefix_ids[: (len(prefix_ids) // b) * b])
    sampling = Sampling(1.0, seed=0, exclude_token=engine.config.mask_token_id)
    curve = {}
    for n in node_counts:
        states = rng.integers(0, engine.config.vocab_size, size=(n, b))
        states[:, b // 2:] = engine.config.mask_token_id
        steps = np.zeros(n, np.int64)
        engine.block_outputs(states, steps, sampling, 0)  # warm-up (allocations, kernel selection)
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            engine.block_outputs(states, steps, sampling, 0)
            times.append(1e3 * (time.perf_counter() - t))
        curve[n] = min(times)
    bound = float("inf")
    for n in sorted(curve, reverse=True):     # from the largest N down: a larger pass's time bounds a smaller one's
        curve[n] = bound = min(curve[n], bound)
    return dict(sorted(curve.items()))


def interpolate_latency(curve: dict[int, float], nodes: int) -> float:
    xs = sorted(curve)
    return float(np.interp(nodes, xs, [curve[x] for x in xs]))


@dataclass(frozen=True)
class PassProfile:
    """What one decoder did over the tuning prompts: commit steps, one-state passes (a block's first pass, store
    passes; standard decoding: every step's pass too), the node count of each verify pass, and host ms in all."""
    steps: int
    single_passes: int
    verify_nodes: tuple[int, ...] = ()
    host_ms: float = 0.0

    @classmethod
    def of(cls, generations, host_ms: float) -> "PassProfile":
        """From spot.runtime.decode.Generation results (one decoder, every tuning prompt; prefill left out: the same
        for every decoder)."""
        passes = [g.stats.passes for g in generations]
        return cls(sum(g.stats.steps for g in generations),
                   sum(p.get("block", 0) + p.get("store", 0) for p in passes),
                   tuple(n for g in generations for n in g.stats.extra.get("nodes_per_verify", [])), host_ms)

    def expected_ms(self, curve: dict[int, float]) -> float:
        return (self.single_passes * interpolate_latency(curve, 1) + self.host_ms
                + sum(interpolate_latency(curve, n) for n in self.verify_nodes))

    def steps_per_ms(self, curve: dict[int, float]) -> float:
        return self.steps / max(self.expected_ms(curve), 1e-9)


def choose_budget(curve: dict[int, float], standard: PassProfile,
                  candidates: dict[tuple[int, int], PassProfile]) -> BudgetChoice:
    """Pick the (nodes, depth) with the highest expected steps/s; (1, 1) — no speculation — is always a candidate,
    so the choice is never expected to be slower than standard decoding beyond the host overhead.

    curve: nodes -> ms of one pass; standard: standard decoding's profile on the tuning prompts; candidates:
    (nodes, depth) -> the speculative decoder's profile at that budget on the same prompts."""
    best = BudgetChoice(1, 1, standard.steps_per_ms(curve), standard.steps_per_ms(curve))
    for (n, d), profile in candidates.items():
        if profile.steps_per_ms(curve) > best.expected_steps_per_ms:
            best = BudgetChoice(n, d, profile.steps_per_ms(curve), best.standard_steps_per_ms)
    return best
