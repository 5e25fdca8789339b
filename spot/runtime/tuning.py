"""Cost-aware tree budgets: choose (nodes, depth) that maximise tokens/s on the engine in use.

A pass over N states costs latency(N) (measured on the device: nearly flat where memory-bound, ~linear in N where
compute-bound). The tuner decodes its prompts with standard decoding and with the speculative decoder at each
candidate budget, and records what each did (PassProfile): commit steps, one-state passes (each block's first pass,
the store passes), the node count of every verify pass, the milliseconds inside the target's passes and outside
them (host: drafting, sampling, the walk, every line of Python). The choice is by measured steps per ms, each
candidate's fastest of 3 decodes against standard decoding's fastest of 3, run alternately (machine drift hits both
alike, and noise only adds time); (1, 1) — no speculation — wins unless a tree measured more than 3% faster.
Beside it, the curve's prediction from the pass counts (one-state passes x latency(1) + latency(nodes) per verify
pass + host ms) says why: on a compute-bound CPU it ran 10-25% above the measured speed-up for small trees (the
decodes' passes, between host work, cost more than the curve's tight loop).
Steps per verify pass alone overrate trees: each block's first pass commits one step and a block's last verify
pass often commits no free root (by 20-30% at SDAR's block size 4).
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from spot.runtime.engine import Engine
from spot.runtime.step import Sampling


@dataclass(frozen=True)
class BudgetChoice:
    nodes: int
    depth: int
    expected_speedup: float      # measured steps/s at this budget / standard decoding's (1.0 for no speculation)


def measure_latency_samples(engine: Engine, prefix_ids: np.ndarray, node_counts: list[int], repeats: int = 5,
                            rng_seed: int = 0) -> dict[int, list[float]]:
    """Milliseconds of each of `repeats` passes over N random states after a prefill of `prefix_ids` (a warm-up pass
    first: allocations, kernel selection), as the decoders run it (Engine.block_outputs): the logits to the host,
    or — on an engine that samples on the device — the target alone: its epilogue runs per state when the walk
    reads it, so the decoders' walk and sampling times (the host ms choose_budget adds) carry that cost."""
    rng = np.random.default_rng(rng_seed)
    b = engine.block_size
    engine.prefill(prefix_ids[: (len(prefix_ids) // b) * b])
    sampling = Sampling(1.0, seed=0, exclude_token=engine.config.mask_token_id)
    samples = {}
    for n in node_counts:
        states = rng.integers(0, engine.config.vocab_size, size=(n, b))
        states[:, b // 2:] = engine.config.mask_token_id
        steps = np.zeros(n, np.int64)
        engine.block_outputs(states, steps, sampling, 0)
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            engine.block_outputs(states, steps, sampling, 0)
            times.append(1e3 * (time.perf_counter() - t))
        samples[n] = times
    return samples


def latency_curve(samples: dict[int, list[float]]) -> dict[int, float]:
    """The fastest sample of each N (other work on the machine only adds time), made non-decreasing in N: a pass over
    more states never costs less, and a dip (a 1-state pass measured at 10 ms beside 2 ms for 2 states on a busy
    machine) would make a tree look free."""
    curve = {n: min(times) for n, times in samples.items()}
    bound = float("inf")
    for n in sorted(curve, reverse=True):     # from the largest N down: a larger pass's time bounds a smaller one's
        curve[n] = bound = min(curve[n], bound)
    return dict(sorted(curve.items()))


def measure_latency_curve(engine: Engine, prefix_ids: np.ndarray, node_counts: list[int], repeats: int = 5,
                          rng_seed: int = 0) -> dict[int, float]:
    """Milliseconds of one pass over N states by N (measure_latency_samples, then latency_curve)."""
    return latency_curve(measure_latency_samples(engine, prefix_ids, node_counts, repeats, rng_seed))


def interpolate_latency(curve: dict[int, float], nodes: int) -> float:
    xs = sorted(curve)
    return float(np.interp(nodes, xs, [curve[x] for x in xs]))


@dataclass(frozen=True)
class PassProfile:
    """What one decoder did over the tuning prompts: commit steps, one-state passes (a block's first pass, store
    passes; standard decoding: every step's pass too), the node count of each verify pass, fused store passes, and
    the ms spent inside the target's passes (prefill included) and outside them (host)."""
    steps: int
    single_passes: int
    verify_nodes: tuple[int, ...] = ()
    host_ms: float = 0.0
    pass_ms: float = 0.0
    fused_passes: int = 0      # fused store passes: 2B tokens of one state, priced as a pass over 2 states

    @classmethod
    def of(cls, generations, host_ms: float = 0.0, pass_ms: float = 0.0) -> "PassProfile":
        """From spot.runtime.decode.Generation results (one decoder, every tuning prompt) and their times
        (decode_timed)."""
        passes = [g.stats.passes for g in generations]
        return cls(sum(g.stats.steps for g in generations),
                   sum(p.get("block", 0) + p.get("store", 0) for p in passes),
                   tuple(n for g in generations if g.stats.verify for n in g.stats.verify.nodes), host_ms, pass_ms,
                   sum(p.get("fused", 0) for p in passes))

    def steps_per_ms(self) -> float:
        """Measured: steps / (host + pass ms)."""
        return self.steps / max(self.host_ms + self.pass_ms, 1e-9)

    def curve_ms(self, curve: dict[int, float]) -> float:
        """What the latency curve predicts for these passes (prefill left out: the same for every decoder)."""
        return (self.single_passes * interpolate_latency(curve, 1) + self.host_ms
                + self.fused_passes * interpolate_latency(curve, 2)
                + sum(interpolate_latency(curve, n) for n in self.verify_nodes))


def decode_timed(engine: Engine, decode: Callable[[], object]) -> tuple[object, float, float]:
    """decode() -> (its result, ms outside the engine's passes (host work), ms inside them)."""
    before, t0 = engine.pass_seconds, time.perf_counter()
    result = decode()
    inside = engine.pass_seconds - before
    return result, 1e3 * ((time.perf_counter() - t0) - inside), 1e3 * inside


# The machine was busy while the tuner measured (other processes, a contended core) when a repeated measurement's
# median lies this far above its fastest, or a pass over more states costs this much more than proportionally more
# (a spin-waiting thread pool: 2 states measured at 60.9 ms beside 2.8 ms for 1). A curve and speed-ups measured so
# are the load's, not the engine's: spot tune says so and records nothing.
NOISE_LIMIT = 0.5


def spread(times) -> float:
    """How far the median of repeated timings of one thing lies above the fastest, as a fraction (0: all equal)."""
    fastest = min(times)
    return statistics.median(times) / fastest - 1.0 if fastest > 0 else 0.0


def latency_spreads(samples: dict[int, list[float]]) -> dict[str, float]:
    """Each pass size's spread, and how much more than proportionally each larger pass's fastest time grew over the
    next smaller one's (0 when it grew proportionally or less)."""
    out = {f"latency of {n} node{'s' if n != 1 else ''}": spread(times) for n, times in samples.items()}
    fastest = {n: min(times) for n, times in sorted(samples.items())}
    sizes = list(fastest)
    for small, large in zip(sizes, sizes[1:]):
        if fastest[small] > 0:
            out[f"latency from {small} to {large} nodes"] = max(
                fastest[large] / (fastest[small] * large / small) - 1.0, 0.0)
    return out


@dataclass(frozen=True)
class Noise:
    """The worst spread among a tuning run's repeated measurements, and which measurement it was."""
    spread: float
    where: str
    limit: float = NOISE_LIMIT

    @classmethod
    def of(cls, spreads: dict[str, float], limit: float = NOISE_LIMIT) -> "Noise":
        if not spreads:
            return cls(0.0, "nothing repeated", limit)
        where = max(spreads, key=spreads.get)
        return cls(spreads[where], where, limit)

    @property
    def quiet(self) -> bool:
        return self.spread <= self.limit

    def to_dict(self) -> dict:
        return {"largest_spread": round(self.spread, 3), "where": self.where, "limit": self.limit,
                "quiet": self.quiet}


def busy_machine_note(noise: dict) -> str:
    """What a tuning result's noise (Noise.to_dict) says to a user when the machine was busy."""
    return (f"the machine was busy while it was measured: the {noise['where']} spread {noise['largest_spread']:.0%} "
            f"(more than {noise['limit']:.0%}), so the latency curve and the speed-ups are the load's, not this "
            "engine's")


MIN_TREE_GAIN = 1.03      # a tree must measure this much faster than standard decoding: more than the noise left


def choose_budget(speedups: dict[tuple[int, int], float]) -> BudgetChoice:
    """The (nodes, depth) with the highest measured speed-up over standard decoding; (1, 1) — no speculation, 1.0 —
    unless a tree measured more than MIN_TREE_GAIN faster."""
    best = BudgetChoice(1, 1, 1.0)
    for (n, d), speedup in speedups.items():
        if speedup > max(best.expected_speedup, MIN_TREE_GAIN):
            best = BudgetChoice(n, d, speedup)
    return best
