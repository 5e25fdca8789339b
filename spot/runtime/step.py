"""The step function F of docs/spec.md §3: sample every masked position, score it, commit by the static or
threshold rule.

All arithmetic is float64 on float32 logits, in the order the spec fixes, so that equal logits give equal decisions
in every decoder (standard, SPOT, SPOT-Sets) and every implementation.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from spot.errors import SpotError, integer_arg, number_arg
from spot.runtime import libm
from spot.runtime.gumbel_max import SamplingLevel, dense_top, gumbel_top, sampling_level
from spot.runtime.noise import NoiseBins, NoiseCache, noise_bins

STATIC = "static"
THRESHOLD = "threshold"
# F's commit decision compares confidences with each other (static rule) or with tau (threshold rule); it never
# returns them. So step_fn computes them with numpy's exp (its SIMD kernels, ~4x faster than the C library's per
# element on this project's AVX-512 CPUs) and redoes with the C library's exp (the definition) only the comparisons
# closer than this relative margin. The two exps differ by a few ulps (numpy's AVX-512 kernel rounds 4% of inputs
# differently), the softmax sums by < 2^-46 relative: 2^-30 leaves a factor of 2^16.
FAST_CONFIDENCE_MARGIN = 2.0 ** -30
# Below this, relative bounds do not hold (subnormal exponentials): such confidences are always redone.
FAST_CONFIDENCE_FLOOR = 2.0 ** -900


# below it L / T leaves float64's range for large logits; sampling there is argmax anyway (the C++ host's bound too)
MIN_TEMPERATURE = 1e-6
MAX_TOP_K = 2 ** 31 - 1     # what the C API's int and the epilogue's int64 input hold (spot_generate_options.top_k)


@dataclass(frozen=True)
class Sampling:
    """How F samples: temperature (0 = argmax), optional top-k / top-p filtering, noise seed.

    exclude_token: a token id never sampled (generate() sets the mask id: committing <|MASK|> would leave the
    position masked forever). It is removed from the argmax only; the confidence keeps the full softmax, so
    decisions equal SDAR's whenever SDAR's own decoder would not sample the mask id. -1 = none."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    exclude_token: int = -1

    def __post_init__(self):
        # kept as the checked float / int: a Fraction or float128 temperature would reach numpy as itself
        for name, coerce in (("temperature", number_arg), ("top_k", integer_arg), ("top_p", number_arg),
                             ("seed", integer_arg), ("exclude_token", integer_arg)):
            object.__setattr__(self, name, coerce(getattr(self, name), name))
        t = self.temperature
        if not np.isfinite(t) or t < 0 or 0 < t < MIN_TEMPERATURE:
            raise SpotError(f"temperature must be 0 or a finite number >= {MIN_TEMPERATURE:g}, got {t}",
                            "0 decodes greedily (argmax); 1 samples from the model's distribution")
        if not 0 <= self.top_k <= MAX_TOP_K:
            raise SpotError(f"top_k must be in [0, {MAX_TOP_K}] (0 disables it), got {self.top_k}",
                            "e.g. `top_k=40`, or 0; a top_k >= the vocabulary size keeps every token too")
        if not 0.0 < self.top_p <= 1.0:
            raise SpotError(f"top_p must be in (0, 1], got {self.top_p}", "e.g. `top_p=0.9`, or 1 to disable it")
        if not 0 <= self.seed <= 0xFFFFFFFF:
            raise SpotError(f"seed must be in [0, 2**32), got {self.seed}", "any integer from 0 to 4294967295")


@dataclass(frozen=True)
class CommitRule:
    """static: commit the single most confident masked position; threshold: all with confidence > tau."""

    kind: str = STATIC
    tau: float = 0.9

    def __post_init__(self):
        if not isinstance(self.kind, str) or self.kind not in (STATIC, THRESHOLD):
            raise SpotError(f"commit rule must be 'static' or 'threshold', got {self.kind!r}")
        object.__setattr__(self, "tau", number_arg(self.tau, "tau"))
        if self.kind == THRESHOLD and not 0.0 <= self.tau < 1.0:
            raise SpotError(f"tau must be in [0, 1), got {self.tau}",
                            "the threshold rule commits every position whose confidence exceeds tau (at least the "
                            "most confident one): at tau >= 1 it is the static rule, `mode=\"static\"`")


def filter_scaled_logits(z: np.ndarray, top_k: int, top_p: float) -> np.ndarray:
    """Top-k then top-p filtering of scaled logits z [K, V] (float64); filtered entries become -inf.

    top-k keeps every token >= the k-th largest value (ties kept). top-p keeps the smallest prefix of the order
    (value descending, token id ascending) whose probability mass exceeds p (the token that crosses p is the last
    kept), always keeping the first token.
    """
    if top_k > 0 and top_k < z.shape[-1]:
        kth = -np.partition(-z, top_k - 1, axis=-1)[:, top_k - 1:top_k]
        z = np.where(z < kth, -np.inf, z)
    if top_p < 1.0:
        order = np.lexsort((np.broadcast_to(np.arange(z.shape[-1]), z.shape), -z), axis=-1)
        zs = np.take_along_axis(z, order, axis=-1)
        p = libm.exp(zs - zs[:, :1])
        cum = np.cumsum(p / p.sum(axis=-1, keepdims=True), axis=-1)
        drop_sorted = np.zeros_like(cum, dtype=bool)
        drop_sorted[:, 1:] = cum[:, :-1] > top_p
        drop = np.empty_like(drop_sorted)
        np.put_along_axis(drop, order, drop_sorted, axis=-1)
        z = np.where(drop, -np.inf, z)
    return z


@dataclass(frozen=True)
class ScaledRows:
    """The step-independent half of sampling K positions of one state's logits, computed once per state.

    base [K, V] float64: what the noise is added to (L/T filtered, at T = 0 L itself), the excluded token at -inf;
    exp_shifted [K, V] float64 = exp(L/T - max) unfiltered, exp_sum [K] its row sums (the confidence's softmax);
    level: which tokens can win at any step (spot.runtime.gumbel_max; None at T = 0);
    exact: exp_shifted is the C library's exp (the definition), else numpy's (step_fn: approximate confidences).
    A SPOT round samples the same stale logits at up to D future steps: each step then costs one hash per token
    and the exact noise of ~20 candidates per row, and at T = 0 nothing (the sample does not depend on the step)."""

    base: np.ndarray
    exp_shifted: np.ndarray
    exp_sum: np.ndarray
    level: SamplingLevel | None = None
    exact: bool = True


def softmax_parts(logits: np.ndarray, positions: np.ndarray, temperature: float,
                  exact: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """logits [B, V] float32, positions [K] -> z = L/T [K, V] float64 (L at T = 0), z_max [K, 1], exp(z - z_max)
    [K, V] and its row sums [K], in the spec's order; exact: the C library's exp (spot.runtime.libm), else numpy's."""
    z = logits[positions].astype(np.float64)
    if temperature > 0:
        z = z / temperature
    z_max = z.max(axis=-1, keepdims=True)
    e = z - z_max
    (libm.exp if exact else np.exp)(e, out=e)
    return z, z_max, e, e.sum(axis=-1)


def scale_rows(logits: np.ndarray, positions: np.ndarray, sampling: Sampling, exact: bool = True) -> ScaledRows:
    """logits [B, V] float32, positions [K] -> ScaledRows of those positions (float64, in the spec's order).
    exact=False: the softmax with numpy's exp, for certified_commits only (the samples are exact either way)."""
    t = sampling.temperature
    z, z_max, e, exp_sum = softmax_parts(logits, positions, t, exact)
    base = filter_scaled_logits(z, sampling.top_k, sampling.top_p) if t > 0 else z
    filtered = base is not z                # filter_scaled_logits returns z itself when it filters nothing
    if sampling.exclude_token >= 0:
        base = base.copy()          # filtering may return z itself, and the confidence's softmax keeps the token
        base[:, sampling.exclude_token] = -np.inf
    level = None
    if t > 0 and base.shape[0]:     # any level is exact (gumbel_max): approximate sums serve as well
        level = sampling_level(base, e, exp_sum, z_max[:, 0], sampling.exclude_token, filtered)
    return ScaledRows(base, e, exp_sum, level, exact)


def sample_tokens(rows: ScaledRows, gumbel: NoiseBins | None) -> np.ndarray:
    """Tokens [K] int64 of one step: argmax(base + gumbel) with the step's noise (None at T = 0: argmax(base));
    ties -> smallest id."""
    if gumbel is None or rows.base.shape[0] == 0:
        tokens = np.argmax(rows.base, axis=-1)
    else:
        tokens = gumbel_top(rows.base, rows.level, gumbel, runner_up=False).tokens
    return tokens.astype(np.int64)


def sample_scaled(rows: ScaledRows, gumbel: NoiseBins | None) -> tuple[np.ndarray, np.ndarray]:
    """sample_tokens and their confidences [K] float64 = softmax(L/T)[token], unfiltered."""
    tokens = sample_tokens(rows, gumbel)
    return tokens, confidence(rows, tokens)


def _softmax_at(exp_shifted: np.ndarray, exp_sum: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    return np.take_along_axis(exp_shifted, tokens[:, None], axis=-1)[:, 0] / exp_sum


def confidence(rows: ScaledRows, tokens: np.ndarray) -> np.ndarray:
    """[K] float64 softmax(L/T)[token] of each row (unfiltered)."""
    if not rows.exact:
        raise ValueError("confidence() of rows scaled with numpy's exp: scale with exact=True, or decide with "
                         "certified_commits")
    return _softmax_at(rows.exp_shifted, rows.exp_sum, tokens)


def exact_confidence(logits: np.ndarray, positions: np.ndarray, tokens: np.ndarray, temperature: float) -> np.ndarray:
    """[k] float64 softmax(L/T)[token] at positions [k] of logits [B, V], as scale_rows + confidence compute it."""
    _, _, e, exp_sum = softmax_parts(logits, positions, temperature)
    return _softmax_at(e, exp_sum, tokens)


def top2_scaled(rows: ScaledRows, gumbel: NoiseBins | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The winner and the runner-up of each row's scores base + g (base alone at T = 0: gumbel None), g the
    definition's noise: tokens [K] int64 (= sample_scaled's), runner-ups [K] int64 (the argmax without the winner;
    ties: smallest id) and gap [K] float64 = score(winner) - score(runner-up) >= 0; runner-up -1 and gap inf where
    no other token can be sampled (filtered or excluded)."""
    if gumbel is None or rows.base.shape[0] == 0:
        best = dense_top(rows.base.copy(), runner_up=True)
    else:
        best = gumbel_top(rows.base, rows.level, gumbel, runner_up=True)
    some = np.isfinite(best.below)
    gap = np.full(some.shape, np.inf)
    gap[some] = best.top[some] - best.below[some]
    return best.tokens.astype(np.int64), np.where(some, best.second, -1).astype(np.int64), gap


def step_gumbel(sampling: Sampling, block: int, step: int, positions: np.ndarray, vocab_size: int,
                noise: NoiseCache | None = None) -> NoiseBins | None:
    """The noise of (seed, block, step) at positions [K], None at T = 0 (greedy uses no noise)."""
    if sampling.temperature <= 0:
        return None
    if noise is not None:
        return noise.rows(block, step, positions)
    return noise_bins(sampling.seed, block, step, positions, vocab_size)


def sample_positions(logits: np.ndarray, positions: np.ndarray, sampling: Sampling, block: int,
                     step: int, noise: NoiseCache | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Sample tokens and confidences at `positions` of one block state.

    logits: [B, V] float32, the target's logits of the state.  positions: [K] int, masked positions to sample.
    noise: a NoiseCache of sampling.seed (same values, computed once), or None to compute the rows here.
    Returns tokens [K] int64 and confidences [K] float64 = softmax(L/T)[x] (unfiltered; softmax(L) at T = 0).
    """
    return sample_scaled(scale_rows(logits, positions, sampling),
                         step_gumbel(sampling, block, step, positions, logits.shape[-1], noise))


def select_commits(conf: np.ndarray, rule: CommitRule) -> np.ndarray:
    """Indices into `conf` [K] (masked positions in ascending order) that the rule commits."""
    best = np.argmax(conf)                      # ties -> smallest position
    if rule.kind == THRESHOLD:
        chosen = np.flatnonzero(conf > rule.tau)
        if chosen.size:
            return chosen
    return np.array([best])


def certified_commits(approx: np.ndarray, rule: CommitRule,
                      exact_at: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """select_commits(c, rule) of the exact confidences c [K], from approximations [K] within FAST_CONFIDENCE_MARGIN
    of c (relative; absolute below FAST_CONFIDENCE_FLOOR). exact_at(indices) -> c[indices] is called only where the
    approximations cannot decide: a confidence near tau, or several near the best."""
    margin, floor = FAST_CONFIDENCE_MARGIN, FAST_CONFIDENCE_FLOOR
    c = approx
    if rule.kind == THRESHOLD:
        near = np.abs(c - rule.tau) <= 2 * margin * np.maximum(c, rule.tau) + floor
        if near.any():
            c = c.copy()
            idx = np.flatnonzero(near)
            c[idx] = exact_at(idx)
        chosen = np.flatnonzero(c > rule.tau)
        if chosen.size:
            return chosen
    # the best exact confidence is among these (and no position outside them ties with it)
    contenders = np.flatnonzero(c >= c.max() * (1 - 4 * margin) - floor)
    if contenders.size == 1:
        return contenders
    return contenders[[int(np.argmax(exact_at(contenders)))]]        # ties -> smallest position


def step_fn(state: np.ndarray, logits: np.ndarray, mask_id: int, rule: CommitRule, sampling: Sampling,
            block: int, step: int, noise: NoiseCache | None = None) -> np.ndarray:
    """F_step(state): the next block state. state [B] int64 with mask_id at undecided positions; logits [B, V].
    Equal to commit_samples(state, masked, *sample_positions(...), rule); the confidences only decide, so they are
    computed with numpy's exp and certified (certified_commits)."""
    masked = np.flatnonzero(state == mask_id)
    if masked.size == 0:
        return state
    rows = scale_rows(logits, masked, sampling, exact=False)
    tokens = sample_tokens(rows, step_gumbel(sampling, block, step, masked, logits.shape[-1], noise))
    pick = certified_commits(_softmax_at(rows.exp_shifted, rows.exp_sum, tokens), rule,
                             lambda i: exact_confidence(logits, masked[i], tokens[i], sampling.temperature))
    return _committed(state, masked, tokens, pick)


def commit_samples(state: np.ndarray, masked: np.ndarray, tokens: np.ndarray, conf: np.ndarray,
                   rule: CommitRule) -> np.ndarray:
    """The commit half of F: state [B]; masked [K] its masked positions (ascending); tokens [K], conf [K] the
    samples of F's step there (from sample_positions, or from the device epilogue, which equals it bit for bit)."""
    return _committed(state, masked, tokens, select_commits(conf, rule))


def _committed(state: np.ndarray, masked: np.ndarray, tokens: np.ndarray, pick: np.ndarray) -> np.ndarray:
    out = state.copy()
    out[masked[pick]] = tokens[pick]
    return out
