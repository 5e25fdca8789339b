"""Coupled samples from the stale logits L(s_m): what the drafter may read in a SPOT round (docs/spec.md §4).

At position i and future step tau the proposal token is argmax_v(L~_iv / T + gumbel(seed, b, tau, i, v)), the same
noise the target will use at that step, so proposal and target agree whenever the perturbed argmax did not move.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from spot.errors import SpotError
from spot.runtime import libm
from spot.runtime.noise import NoiseCache
from spot.runtime.step import (Sampling, ScaledRows, confidence, sample_scaled, scale_rows, step_gumbel,
                               top2_scaled)

TOPK_FEATURES = 32
INDEPENDENT_SEED_XOR = 0x5BD1E995


class StaleView:
    """Lazily computed, cached coupled samples of one round's stale logits.

    logits: [B, V] float32 = L(s_m);  masked: [B] bool = masks of s_m (every later node's masks are a subset).
    """

    def __init__(self, logits: np.ndarray, masked: np.ndarray, sampling: Sampling, block: int,
                 independent_noise: bool = False, noise: NoiseCache | None = None):
        self.logits = logits
        self.positions = np.flatnonzero(masked)
        # independent_noise: the ablation of docs/spec.md §7 — proposals drawn with noise unrelated to the target's
        self.sampling = replace(sampling, seed=sampling.seed ^ INDEPENDENT_SEED_XOR) if independent_noise else sampling
        self.noise = None if independent_noise else noise       # the cache holds the target's noise only
        self.block = block
        self._cache: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._runner_up: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.runner_ups_wanted = False      # set by a proposer that will ask: sampled with the coupled samples
        self._topk: np.ndarray | None = None
        self._rows: ScaledRows | None = None      # scaled once, sampled at each step

    def coupled(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        """tokens [B] int64 (-1 where not masked in s_m) and confidences [B] float64 (-inf there) for `step`."""
        key = step if self.sampling.temperature > 0 else 0      # greedy samples do not depend on the step
        if key not in self._cache:
            self._sample(step, key, self.runner_ups_wanted)
        return self._cache[key]

    def runner_up(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        """The second-best coupled sample for `step`: tokens [B] int64 (-1 where not masked in s_m) and the score
        gap [B] float64 to the coupled sample (inf there, and where no other token can be sampled)."""
        key = step if self.sampling.temperature > 0 else 0
        if key not in self._runner_up:
            self._sample(step, key, True)
        return self._runner_up[key]

    def _sample(self, step: int, key: int, with_runner_up: bool) -> None:
        b = self.logits.shape[0]
        tokens = np.full(b, -1, dtype=np.int64)
        conf = np.full(b, -np.inf)
        second = np.full(b, -1, dtype=np.int64)
        gap = np.full(b, np.inf)
        if self.positions.size:
            if self._rows is None:
                self._rows = scale_rows(self.logits, self.positions, self.sampling)
            g = step_gumbel(self.sampling, self.block, step, self.positions, self.logits.shape[-1], self.noise)
            if with_runner_up:      # both ranks in one pass over the rows (the same winners as sample_scaled)
                won, second[self.positions], gap[self.positions] = top2_scaled(self._rows, g)
                tokens[self.positions], conf[self.positions] = won, confidence(self._rows, won)
            else:
                tokens[self.positions], conf[self.positions] = sample_scaled(self._rows, g)
        self._cache.setdefault(key, (tokens, conf))
        if with_runner_up:
            self._runner_up[key] = (second, gap)

    def topk_logprobs(self) -> np.ndarray:
        """[B, 32] float32: the largest log-probabilities of softmax(L/T) (softmax(L) at T = 0), descending."""
        if self._topk is None:
            self._topk = topk_logprobs(self.logits, self.sampling.temperature)
        return self._topk


def topk_logprobs(logits: np.ndarray, temperature: float, k: int = TOPK_FEATURES) -> np.ndarray:
    """logits [..., V] -> [..., k] float32 top-k log-probabilities of softmax(logits / T), descending."""
    z = logits.astype(np.float64)
    if temperature > 0:
        z = z / temperature
    z = z - z.max(axis=-1, keepdims=True)
    lse = libm.log(libm.exp(z).sum(axis=-1, keepdims=True))
    k = min(k, z.shape[-1])
    # the k largest of z, then minus lse: the same values as the k largest of z - lse, subtracting k not V entries
    # (partitioning z itself at V - k: 2.7x faster than partitioning -z at k - 1 with numpy 2.4's AVX-512 select)
    top = np.partition(z, z.shape[-1] - k, axis=-1)[..., -k:] - lse
    out = -np.sort(-top, axis=-1)
    if out.shape[-1] < TOPK_FEATURES:  # tiny vocabularies: pad with -inf-like floor
        pad = np.full(out.shape[:-1] + (TOPK_FEATURES - out.shape[-1],), -1e4)
        out = np.concatenate([out, pad], axis=-1)
    return out.astype(np.float32)


class SampledStaleView:
    """The StaleView interface over coupled samples the device epilogue already computed (spot.runtime.outputs).

    future_tokens [D, B] int64, future_conf [D, B] float64: samples of the stale logits at steps first_step ..
    first_step + D - 1 for every position; masked [B] bool: masks of s_m; top_logprobs [B, 32] float32;
    future_runner_up [D, B] int64, future_gap [D, B] float64: their runner-ups and score gaps."""

    def __init__(self, future_tokens: np.ndarray, future_conf: np.ndarray, first_step: int, masked: np.ndarray,
                 top_logprobs: np.ndarray, future_runner_up: np.ndarray, future_gap: np.ndarray):
        self.future_tokens, self.future_conf = future_tokens, future_conf
        self.future_runner_up, self.future_gap = future_runner_up, future_gap
        self.first_step, self.masked, self._topk = first_step, np.asarray(masked, dtype=bool), top_logprobs
        self.runner_ups_wanted = False      # StaleView's flag; the epilogue computed them either way

    def _row(self, step: int) -> int:
        j = step - self.first_step
        depth = self.future_tokens.shape[0]
        if not 0 <= j < depth:
            raise SpotError(f"the device epilogue computed coupled samples for steps {self.first_step}.."
                            f"{self.first_step + depth - 1}, got a request for step {step}",
                            f"draft trees of depth <= {depth}, or rebuild the epilogue with more future steps "
                            "(`spot-export --epilogue-steps N`)")
        return j

    def coupled(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        j = self._row(step)
        return (np.where(self.masked, self.future_tokens[j], -1).astype(np.int64),
                np.where(self.masked, self.future_conf[j], -np.inf))

    def runner_up(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        """As StaleView.runner_up, from the epilogue's outputs."""
        j = self._row(step)
        return (np.where(self.masked, self.future_runner_up[j], -1).astype(np.int64),
                np.where(self.masked, self.future_gap[j], np.inf))

    def topk_logprobs(self) -> np.ndarray:
        return self._topk
