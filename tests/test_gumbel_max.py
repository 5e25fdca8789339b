"""Candidate sampling (spot.runtime.gumbel_max) against the dense definition: argmax_v(base_v + g_v) and its
runner-up over every token's exact noise, on rows whose answers are computed the slow way."""
from __future__ import annotations

import numpy as np
import pytest

from spot.runtime import gumbel_max, native
from spot.runtime.gumbel_max import candidate_indices, dense_top, gumbel_bounds, gumbel_top, sampling_level
from spot.runtime.noise import BIN_BITS, NoiseBins, gumbel_rows, noise_bins
from spot.runtime.step import Sampling, scale_rows, top2_scaled


def noise_and_exact(seed: int, k: int, v: int, step: int = 5) -> tuple[NoiseBins, np.ndarray]:
    positions = np.arange(k)
    return noise_bins(seed, 2, step, positions, v), gumbel_rows(seed, 2, step, positions, v)


def varied_rows(rng: np.random.Generator, k: int, v: int) -> np.ndarray:
    """Scaled logits of every kind sampling meets: flat, peaked, huge (T ~ 1e-3), filtered, a single token left."""
    scale = rng.choice([0.1, 1.0, 3.0, 10.0, 300.0, 3e4], size=(k, 1))
    base = rng.normal(size=(k, v)) * scale + rng.normal(size=(k, 1)) * 50
    base[::5, rng.integers(0, v, size=v // 3)] = -np.inf                  # top-k / top-p filtered tokens
    base[1::7, :] = -np.inf
    base[1::7, 3] = 1.5                                                   # only one token can be sampled
    base[2::9, rng.integers(0, v)] = base[2::9].max(axis=-1) + 800        # one token dominates by far
    return base


def level_of(base: np.ndarray):
    """sampling_level of scaled logits base [K, V], as scale_rows computes its inputs."""
    z_max = np.where(np.isfinite(base), base, -np.inf).max(axis=-1)
    with np.errstate(invalid="ignore"):
        e = np.exp(base - z_max[:, None])
    e = np.nan_to_num(e)
    return sampling_level(base, e, e.sum(axis=-1), z_max)


def dense(base: np.ndarray, exact: np.ndarray):
    return dense_top(base + exact, runner_up=True)


@pytest.fixture(params=["c", "numpy"])
def loops(request, monkeypatch):
    """Both implementations of the per-step loops: the C extension (when built) and the numpy twins."""
    if request.param == "c" and native.sampling is None:
        pytest.skip("the spot.runtime._sampling extension is not built")
    if request.param == "numpy":
        monkeypatch.setattr(native, "sampling", None)
    return request.param


@pytest.mark.parametrize("v", [5, 300, 2048])
def test_candidate_top_two_equals_the_dense_definition(v, loops):
    rng = np.random.default_rng(v)
    for seed in range(6):
        noise, exact = noise_and_exact(seed, 40, v, step=seed)
        base = varied_rows(rng, 40, v)
        want = dense(base, exact)
        got = gumbel_top(base, level_of(base), noise, runner_up=True)
        np.testing.assert_array_equal(got.tokens, want.tokens)
        np.testing.assert_array_equal(got.top, want.top)
        finite = np.isfinite(want.below)
        np.testing.assert_array_equal(got.below, np.where(finite, want.below, -np.inf))
        np.testing.assert_array_equal(got.second[finite], want.second[finite])
        alone = gumbel_top(base, level_of(base), noise, runner_up=False)
        np.testing.assert_array_equal(alone.tokens, want.tokens)


def test_bounds_cover_every_uniform_of_their_bin():
    bounds = gumbel_bounds()
    assert bounds.shape == (2 ** BIN_BITS,) and (np.diff(bounds) > 0).all()
    shift = 53 - BIN_BITS
    edges = np.arange(2 ** BIN_BITS, dtype=np.float64)
    largest = ((edges + 1) * 2.0 ** shift - 1) * 2.0 ** -53          # each bin's largest uniform, exact
    smallest = np.maximum(edges * 2.0 ** shift, 0.5) * 2.0 ** -53
    from spot.runtime.noise import gumbel_from_uniform, uniform_from_words
    assert (gumbel_from_uniform(largest.copy()) <= bounds).all()
    assert (gumbel_from_uniform(smallest.copy()) <= bounds).all()
    words = np.random.default_rng(1).integers(0, 2 ** 32, size=(2, 200_000), dtype=np.uint64).astype(np.uint32)
    g = gumbel_from_uniform(uniform_from_words(words[0], words[1]))
    assert (g <= bounds[words[0] >> np.uint32(32 - BIN_BITS)]).all()


def test_tokens_left_out_cannot_reach_the_level():
    """The soundness the certificate rests on: a token that is not a candidate scores below its row's level."""
    rng = np.random.default_rng(0)
    kept = []
    for seed in range(20):
        noise, exact = noise_and_exact(seed, 64, 2048, step=seed)
        base = varied_rows(rng, 64, 2048)
        level = level_of(base)
        candidate = gumbel_bounds()[noise.bins] + base >= level.threshold[:, None]
        candidate[np.arange(64), level.top] = True
        reaches = (base + exact >= level.level[:, None]) & np.isfinite(base)     # -inf: never sampled
        assert not (reaches & ~candidate).any()
        kept.append(candidate[~level.single].sum(axis=-1))
    # and few are kept: ~e^LEVEL_DROP = 20 per row on average
    assert np.mean(np.concatenate(kept)) < 2 * np.exp(gumbel_max.LEVEL_DROP)


def test_ties_go_to_the_smallest_token_id():
    v = 64
    noise, exact = noise_and_exact(3, 8, v)
    base = np.zeros((8, v))
    for r in range(8):      # two more tokens tie exactly with the row's winner (where rounding allows an exact tie)
        best, tied = exact[r].max(), 0
        for t in range(r + 1, v):
            if tied < 2 and exact[r, t] != best and (best - exact[r, t]) + exact[r, t] == best:
                base[r, t], tied = best - exact[r, t], tied + 1
    want = dense(base, exact)
    got = gumbel_top(base, level_of(base), noise, runner_up=True)
    np.testing.assert_array_equal(got.tokens, want.tokens)
    np.testing.assert_array_equal(got.second, want.second)
    scores = base + exact
    assert (scores[np.arange(8), got.tokens] == scores[np.arange(8), got.second]).all()
    assert (got.tokens < got.second).all()


def test_rows_the_candidates_cannot_certify_are_ranked_densely(monkeypatch):
    """A level no score reaches forces every row through the exact rows; the answer stays the definition's."""
    rng = np.random.default_rng(4)
    noise, exact = noise_and_exact(9, 16, 300)
    base = varied_rows(rng, 16, 300)
    dense_rows = []
    exact_rows = NoiseBins.exact_rows
    monkeypatch.setattr(NoiseBins, "exact_rows", lambda self, rows: dense_rows.append(len(rows)) or
                        exact_rows(self, rows))
    monkeypatch.setattr(gumbel_max, "LEVEL_DROP", -60.0)   # the level above every score
    got = gumbel_top(base, level_of(base), noise, runner_up=True)
    want = dense(base, exact)
    np.testing.assert_array_equal(got.tokens, want.tokens)
    assert level_of(base).single.sum() == 3 and sum(dense_rows) == 16 - 3   # one-token rows need no noise
    monkeypatch.undo()
    dense_rows.clear()
    monkeypatch.setattr(NoiseBins, "exact_rows", lambda self, rows: pytest.fail("no row needs the exact rows"))
    gumbel_top(base, level_of(base), noise, runner_up=True)


@pytest.mark.parametrize("sampling", [Sampling(1.0, seed=1), Sampling(0.3, top_k=7, seed=2),
                                      Sampling(2.0, top_p=0.6, seed=3, exclude_token=0)])
def test_top2_scaled_is_the_dense_runner_up_with_its_gap(sampling):
    logits = (np.random.default_rng(5).normal(size=(12, 500)) * 4).astype(np.float32)
    positions = np.arange(2, 12)
    rows = scale_rows(logits, positions, sampling)
    noise, exact = noise_bins(sampling.seed, 1, 4, positions, 500), gumbel_rows(sampling.seed, 1, 4, positions, 500)
    won, second, gap = top2_scaled(rows, noise)
    scores = rows.base + exact
    np.testing.assert_array_equal(won, np.argmax(scores, axis=-1))
    k = np.arange(len(positions))
    top = scores[k, won]
    scores[k, won] = -np.inf
    has = np.isfinite(scores.max(axis=-1))
    np.testing.assert_array_equal(second, np.where(has, np.argmax(scores, axis=-1), -1))
    np.testing.assert_array_equal(gap, np.where(has, top - scores.max(axis=-1), np.inf))


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_rows_where_filtering_kept_only_the_excluded_token_sample_like_the_definition():
    """top-k keeps only the excluded token (the mask id) in some rows: no token can be sampled there; the
    definition's argmax over all -inf is token 0 with no runner-up, and no NaN is computed on the way."""
    sampling = Sampling(1.0, top_k=1, seed=4, exclude_token=7)
    logits = (np.random.default_rng(6).normal(size=(10, 50)) * 2).astype(np.float32)
    logits[::2, 7] += 100.0                                  # the excluded token is the only one top-k keeps
    positions = np.arange(10)
    rows = scale_rows(logits, positions, sampling)
    won, second, gap = top2_scaled(rows, noise_bins(sampling.seed, 1, 2, positions, 50))
    assert won[::2].tolist() == [0] * 5 and second[::2].tolist() == [-1] * 5 and np.isinf(gap[::2]).all()
    np.testing.assert_array_equal(won[1::2], np.argmax(logits[1::2], axis=-1))      # top-1 left, one token each


def test_c_candidates_equal_the_numpy_twin(monkeypatch):
    """candidates_into == flatnonzero(bounds[bins] + base >= threshold) plus the tops, including a row with more
    candidates than the first output buffer holds."""
    if native.sampling is None:
        pytest.skip("the spot.runtime._sampling extension is not built")
    rng = np.random.default_rng(2)
    noise, _ = noise_and_exact(1, 24, 700)
    base = varied_rows(rng, 24, 700)
    level = level_of(base)
    loose = gumbel_max.SamplingLevel(level.top, level.level, level.threshold.copy(), level.single)
    loose.threshold[4] = -np.inf                        # every token of row 4: 700 > 64 per row
    for lv in (level, loose):
        c = candidate_indices(noise.bins, base, lv)
        with monkeypatch.context() as m:
            m.setattr(native, "sampling", None)
            np.testing.assert_array_equal(c, candidate_indices(noise.bins, base, lv))
    with pytest.raises(ValueError, match="expected"):
        native.sampling.candidates_into(noise.bins, base[:, :-1].copy(), level.threshold, level.top,
                                        gumbel_bounds(), 700, np.empty(10, np.int64))


def test_the_level_from_the_softmax_sum_equals_the_masked_sum():
    """scale_rows' unfiltered shortcut (the softmax sum less the top and the excluded token) and the general masked
    sum give the same levels, dominated rows (whose difference is lost to rounding) included."""
    rng = np.random.default_rng(6)
    z = rng.normal(size=(30, 400)) * rng.choice([0.5, 3.0, 40.0, 400.0], size=(30, 1))
    z[3, 17] += 60.0                                  # the others' mass ~e^-60 of the top: below float64's reach
    z_max = z.max(axis=-1)
    e = np.exp(z - z_max[:, None])
    base = z.copy()
    base[:, 7] = -np.inf                              # the excluded token
    shortcut = sampling_level(base, e, e.sum(axis=-1), z_max, excluded=7, filtered=False)
    general = sampling_level(base, e, e.sum(axis=-1), z_max, excluded=-1, filtered=True)
    np.testing.assert_array_equal(shortcut.top, general.top)
    np.testing.assert_allclose(shortcut.level, general.level, rtol=1e-9, atol=1e-9)
    assert np.isfinite(shortcut.level).all() and not shortcut.single.any()
    others = np.delete(base, 7, axis=1)
    others[np.arange(30), np.argmax(others, axis=-1)] = -np.inf
    want = others.max(axis=-1) + np.log(np.exp(others - others.max(axis=-1, keepdims=True)).sum(axis=-1))
    np.testing.assert_allclose(shortcut.level, want - gumbel_max.LEVEL_DROP, rtol=1e-9, atol=1e-9)


def test_decoding_samples_are_the_same_without_the_c_loops(monkeypatch):
    """What the decoders read — F's samples (sample_positions, through a NoiseCache) and a stale view's coupled
    samples and runner-ups — is the same with the C loops and with the numpy twins alone."""
    if native.sampling is None:
        pytest.skip("the spot.runtime._sampling extension is not built")
    from spot.runtime.noise import NoiseCache
    from spot.runtime.stale import StaleView
    from spot.runtime.step import sample_positions
    logits = (np.random.default_rng(9).normal(size=(16, 900)) * 3).astype(np.float32)
    masked = np.zeros(16, bool)
    masked[[0, 3, 4, 8, 9, 15]] = True
    positions = np.flatnonzero(masked)

    def samples():
        out = []
        for sampling in (Sampling(1.0, seed=4, exclude_token=899), Sampling(0.5, seed=5, top_k=9)):
            cache = NoiseCache(sampling.seed, 900)
            stale = StaleView(logits, masked, sampling, block=2, noise=cache)
            for step in (1, 2, 5):
                out += [*sample_positions(logits, positions, sampling, 2, step, cache), *stale.coupled(step),
                        *stale.runner_up(step)]
        return out
    with_c = samples()
    monkeypatch.setattr(native, "sampling", None)
    for a, b in zip(with_c, samples(), strict=True):
        np.testing.assert_array_equal(a, b)
