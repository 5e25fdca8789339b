"""Exact Gumbel-max sampling from a few candidates per row: the winner and the runner-up of base_v + g_v, with g the
definition's noise (spot.runtime.noise), computing g exactly for ~20 of the V tokens of a row instead of all.

Why it is exact (docs/noise.md, "candidate sampling"):
- A uniform's top BIN_BITS bits are the top bits of its lane-A word, so one uint32 hash per token bounds its Gumbel
  value from above: gumbel_bounds()[bin], the definition's value at the bin's largest uniform, plus a rounding margin.
- Each row gets a level: logsumexp over the tokens other than the row's top, minus LEVEL_DROP. The best of those
  tokens alone misses it with probability exp(-e^LEVEL_DROP) ~ 2e-9, so the winner and the runner-up almost always
  reach it. A token whose bound cannot reach it (base + bound < level, with a margin for the sums' rounding) cannot
  score as much, so only the others — ~e^LEVEL_DROP = 20 per row, and the row's top — get their exact noise.
- The candidates' exact scores are ranked. When the best (and, if asked, the second best) reaches the level, no
  token left out can beat it. Rows where it does not are ranked again over all V exact scores. Any level is exact;
  the level only decides how many candidates there are and how rarely a row is ranked densely.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from spot.runtime import native
from spot.runtime.noise import BIN_BITS, NoiseBins, gumbel_from_uniform

LEVEL_DROP = 3.0           # ~e^3 = 20 candidates per row; the level is missed with probability exp(-e^3) ~ 2e-9
BOUND_MARGIN = 2.0 ** -40  # relative, on each bound: far above the ~2 ulp by which glibc's two logs may round
SUM_MARGIN = 2.0 ** -40    # relative to the level: far above the rounding of base + g (one ulp of numbers ~ level)


@lru_cache(maxsize=1)
def gumbel_bounds() -> np.ndarray:
    """[2**BIN_BITS] float64: bound[j] >= the definition's Gumbel value of every uniform whose lane-A word's top
    BIN_BITS bits are j. The largest such uniform is u = ((j + 1) * 2**(53 - BIN_BITS) - 1) * 2**-53 (exact in
    float64), and -log(-log(u)) increases with u."""
    u_max = np.arange(1, 2 ** BIN_BITS + 1, dtype=np.float64) * 2.0 ** -BIN_BITS - 2.0 ** -53
    g = gumbel_from_uniform(u_max)
    return g + BOUND_MARGIN * (1.0 + np.abs(g))


@dataclass(frozen=True)
class SamplingLevel:
    """Per state, per row [K]: top (argmax of base: always a candidate), level (the score a certified winner /
    runner-up reaches), threshold (the candidates' bound must reach it: level less the sums' margin) and single (only
    the top can be sampled: the answer needs no noise)."""

    top: np.ndarray
    level: np.ndarray
    threshold: np.ndarray
    single: np.ndarray


def sampling_level(base: np.ndarray, exp_shifted: np.ndarray, exp_sum: np.ndarray, z_max: np.ndarray,
                   excluded: int = -1, filtered: bool = True) -> SamplingLevel:
    """The rows' levels. base [K, V] float64: scaled logits z, -inf where filtered or excluded; exp_shifted [K, V] =
    exp(z - z_max) unfiltered, exp_sum [K] its row sums, z_max [K]; excluded: the one token set to -inf without
    filtering (-1: none); filtered: whether top-k / top-p may have set others to -inf."""
    kk, v = base.shape
    k = np.arange(kk)
    top = np.argmax(base, axis=-1)
    if filtered:
        finite = np.isfinite(base)
        count = finite.sum(axis=-1)
        rest = np.where(finite, exp_shifted, 0.0).sum(axis=-1) - exp_shifted[k, top]
    else:
        count = np.full(kk, v - (excluded >= 0))
        rest = exp_sum - exp_shifted[k, top] - (exp_shifted[:, excluded] if excluded >= 0 else 0.0)
    single = count <= 1     # 0: filtering kept only the excluded token, which argmax(base) answers too
    # the others' mass is a difference: where it is (nearly) lost to rounding or underflow, sum it directly,
    # relative to the largest other token
    direct = np.flatnonzero((rest <= 2.0 ** -40 * exp_sum) & ~single)
    rest[single] = 1.0                                      # no others: the level is not used
    rest[direct] = 1.0
    lse_others = z_max + np.log(rest)
    if direct.size:
        sub = base[direct]
        sub[np.arange(direct.size), top[direct]] = -np.inf
        runner = sub.max(axis=-1)
        lse_others[direct] = runner + np.log(np.exp(sub - runner[:, None]).sum(axis=-1))
    level = lse_others - LEVEL_DROP
    threshold = np.where(single, np.inf, level - SUM_MARGIN * (64.0 + np.abs(level)))
    return SamplingLevel(top, level, threshold, single)


@dataclass(frozen=True)
class TopTwo:
    """Per row [K]: the winner's token and exact score; the runner-up's token and exact score (-1 / -inf where no
    other token can be sampled; only when asked for)."""

    tokens: np.ndarray
    top: np.ndarray
    second: np.ndarray | None
    below: np.ndarray | None


def candidate_indices(bins: np.ndarray, base: np.ndarray, level: SamplingLevel) -> np.ndarray:
    """Flat indices [M] int64 (ascending) of the candidates: bound(bins) + base >= threshold, and each row's top.
    bins [K, V] uint16, base [K, V] float64."""
    if native.sampling is None:
        candidate = gumbel_bounds()[bins]
        np.add(candidate, base, out=candidate)
        candidate = candidate >= level.threshold[:, None]
        candidate[np.arange(base.shape[0]), level.top] = True
        return np.flatnonzero(candidate)
    args = (np.ascontiguousarray(bins, np.uint16), np.ascontiguousarray(base, np.float64),
            np.ascontiguousarray(level.threshold, np.float64), np.ascontiguousarray(level.top, np.int64),
            gumbel_bounds(), base.shape[-1])
    # ~20 per row, plus the tokens in each row's topmost bin (V / 2**BIN_BITS on average)
    out = np.empty(base.shape[0] * (64 + 2 * (base.shape[-1] >> BIN_BITS)), np.int64)
    n = native.sampling.candidates_into(*args, out)
    if n > out.size:                                  # rare: a loose level
        out = np.empty(n, np.int64)
        n = native.sampling.candidates_into(*args, out)
    return out[:n]


def gumbel_top(base: np.ndarray, level: SamplingLevel, noise: NoiseBins, runner_up: bool) -> TopTwo:
    """argmax_v(base + g) per row of base [K, V] (ties: smallest id), and with runner_up the argmax without the
    winner, with their exact scores; g = the definition's noise of noise's K positions."""
    kk, v = base.shape
    k = np.arange(kk)
    flat = candidate_indices(noise.bins, base, level)
    rows, toks = np.divmod(flat, v)
    scores = base.reshape(-1)[flat] + noise.exact_at(rows, toks)
    order = np.lexsort((toks, -scores, rows))            # per row: best first, ties by smaller token id
    rows, toks, scores = rows[order], toks[order], scores[order]
    first = np.searchsorted(rows, k)                     # every row has its top as a candidate
    tokens, top = toks[first], scores[first]
    sure = level.single | (top >= level.level)
    second = below = None
    if runner_up:
        nxt = np.minimum(first + 1, rows.size - 1)
        has_next = (first + 1 < rows.size) & (rows[nxt] == k)
        second = np.where(has_next, toks[nxt], -1)
        below = np.where(has_next, scores[nxt], -np.inf)
        sure &= level.single | (below >= level.level)
    redo = np.flatnonzero(~sure)
    if redo.size:
        dense = dense_top(base[redo] + noise.exact_rows(redo), runner_up)
        tokens[redo], top[redo] = dense.tokens, dense.top
        if runner_up:
            second[redo], below[redo] = dense.second, dense.below
    return TopTwo(tokens.astype(np.int64), top, None if second is None else second.astype(np.int64), below)


def dense_top(scores: np.ndarray, runner_up: bool) -> TopTwo:
    """TopTwo of every row of scores [K, V] (first maxima on ties; the winners' entries are set to -inf in place)."""
    k = np.arange(scores.shape[0])
    tokens = np.argmax(scores, axis=-1)
    top = scores[k, tokens]
    if not runner_up:
        return TopTwo(tokens, top, None, None)
    scores[k, tokens] = -np.inf
    second = np.argmax(scores, axis=-1)
    return TopTwo(tokens, top, second, scores[k, second])
