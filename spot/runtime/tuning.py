"""Cost-aware tree budgets: choose (nodes, depth) that maximise expected tokens/s on the engine in use.

A verify pass over N nodes costs latency(N) (measured on the device: nearly flat where memory-bound, ~linear in N
where compute-bound); it commits steps_per_verify(N, D) steps on average (measured from pass counts, hardware-free).
Expected steps/s = steps_per_verify / (latency(N) + host_ms(N)); standard decoding is
1 / (latency(1) + standard_host_ms): its own sampling on the host is not free either (at T > 0 it computes the
noise of every masked position), and leaving it out would overrate standard decoding against small trees.
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
    expected_steps_per_s: float
    standard_steps_per_s: float

    @property
    def expected_speedup(self) -> float:
        return self.expected_steps_per_s / self.standard_steps_per_s


def measure_latency_curve(engine: Engine, prefix_ids: np.ndarray, node_counts: list[int], repeats: int = 3,
                          rng_seed: int = 0) -> dict[int, float]:
    """Median milliseconds of one pass over N random states after a prefill of `prefix_ids`, as the decoders run
    it (Engine.block_outputs): the logits to the host, or — on an engine that samples on the device — the target
    alone: its epilogue runs per state when the walk reads it, so the decoders' walk and sampling times (the host
    ms choose_budget adds) carry that cost."""
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
        curve[n] = float(np.median(times))
    return curve


def interpolate_latency(curve: dict[int, float], nodes: int) -> float:
    xs = sorted(curve)
    return float(np.interp(nodes, xs, [curve[x] for x in xs]))


def choose_budget(curve: dict[int, float], steps_per_verify: dict[tuple[int, int], float],
                  host_ms: dict[tuple[int, int], float] | None = None, standard_host_ms: float = 0.0) -> BudgetChoice:
    """Pick the (nodes, depth) with the highest expected steps/s; (1, 1) — no speculation — is always a candidate,
    so the choice is never expected to be slower than standard decoding beyond the host overhead.

    curve: nodes -> ms of one pass; steps_per_verify, host_ms: (nodes, depth) -> steps per verify pass and host ms
    per verify pass (drafter + tree + walk); standard_host_ms: standard decoding's host ms per step."""
    host_ms = host_ms or {}
    standard = 1.0 / (interpolate_latency(curve, 1) + standard_host_ms)
    best = BudgetChoice(1, 1, standard, standard)
    for (n, d), spv in steps_per_verify.items():
        rate = spv / (interpolate_latency(curve, n) + host_ms.get((n, d), 0.0))
        if rate > best.expected_steps_per_s:
            best = BudgetChoice(n, d, rate, standard)
    return best
