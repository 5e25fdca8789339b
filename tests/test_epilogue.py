"""The sampling epilogue graph (spot.export.epilogue_graph) equals the numpy runtime bit for bit on ONNX Runtime CPU.

Bit identity rests on spot.exact_math reproducing the runtime's float64 exp/log (spot.runtime.libm: glibc's
__exp_fma/__log_fma on x86-64 with FMA) and numpy's pairwise summation; the first tests check those building blocks
directly.
"""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from spot.errors import SpotError
from spot import exact_math as xm
from spot.runtime import libm
from spot.runtime.noise import gumbel
from spot.runtime.step import Sampling

onnx = pytest.importorskip("onnx")
from spot.export.epilogue_graph import (EpilogueSpec, build_epilogue, build_noise_graph, declared_output_shapes,
                                  reference_epilogue, reference_noise)
from spot.folder.epilogue import (FALLBACK_OUTPUT, OUTPUTS, check_sampling, epilogue_feeds, graph_positions,
                                  make_epilogue_session, run_epilogue)


needs_glibc_fma = pytest.mark.skipif(not xm.reference_platform(),
                                     reason="the bit-exact reference is numpy on x86-64 glibc "
                                     ">= 2.28 with FMA (docs/noise.md); other libms round differently")

V, B, D = 500, 8, 3


# -- building blocks ------------------------------------------------------------------------------------------------
def test_emulated_fma_is_correctly_rounded():
    rng = np.random.default_rng(0)
    a = rng.standard_normal(3000) * 10.0 ** rng.integers(-8, 8, 3000)
    b = rng.standard_normal(3000) * 10.0 ** rng.integers(-8, 8, 3000)
    c = rng.standard_normal(3000) * 10.0 ** rng.integers(-8, 8, 3000)
    # hard cases: c cancels a*b almost exactly, and products landing on rounding midpoints
    c[:500] = -(a[:500] * b[:500])
    a[500:1000] = 1.0 + np.arange(500) * 2.0**-52
    b[500:1000] = 1.0 + 2.0**-53 * 3
    c[500:1000] = 2.0**-60 * rng.standard_normal(500)
    got = xm.fma(xm.NUMPY, a, b, c)
    want = np.array([float(Fraction(x) * Fraction(y) + Fraction(z)) for x, y, z in zip(a, b, c)])
    assert np.array_equal(got, want)


@needs_glibc_fma
def test_glibc_exp_and_log_match_the_runtime():
    rng = np.random.default_rng(1)
    x = np.concatenate([-rng.random(60000) * 745, rng.standard_normal(20000) * 30, -rng.random(5000) * 2.0**-50,
                        rng.uniform(-1100, -700, 5000), rng.uniform(512, 709.7, 2000),
                        [0.0, -0.0, -512.0, 512.0, -708.4, -745.1, -1024.0, -2000.0, 2.0**-55]])
    with np.errstate(all="ignore"):
        assert np.array_equal(xm.exp_np(x), libm.exp(x))
    u = np.concatenate([rng.random(60000), 1 - rng.random(10000) * 0.07, 1 + rng.random(5000) * 0.07,
                        rng.random(10000) * 40, 10.0 ** rng.uniform(-300, 300, 5000),
                        np.arange(1, 4000) * 2.0**-53, 1 - np.arange(1, 4000) * 2.0**-53, [1.0, 2.0, 0.5]])
    assert np.array_equal(xm.log_np(u), libm.log(u))


@needs_glibc_fma
def test_glibc_exp_reduction_ties_are_contracted_like_glibc():
    """x where N/ln2 * x rounds to a half-integer: glibc rounds the exact product (fused), a plain multiply not."""
    rng = np.random.default_rng(2)
    h = rng.integers(-100000, 1000, 4000) + 0.5
    x = h / xm.EXP_INVLN2N
    ties = x[(xm.EXP_INVLN2N * x == h) & np.array([Fraction(xm.EXP_INVLN2N) * Fraction(v) != Fraction(t)
                                                   for v, t in zip(x, h)])]
    assert ties.size > 100
    assert np.array_equal(xm.exp_np(ties), libm.exp(ties))


@pytest.mark.parametrize("n", [1, 7, 8, 9, 127, 128, 129, 500, 1000, 4099])
def test_pairwise_sum_matches_numpy(n):
    e = np.exp(np.random.default_rng(n).standard_normal((5, n)) * 3)
    assert np.array_equal(xm.pairwise_sum(xm.NUMPY, e, n), e.sum(axis=-1))


def test_exp_table_is_the_published_one():
    heads, tails = xm.exp_table()
    bits = lambda x: int(np.float64(x).view(np.uint64))  # noqa: E731
    # exp_data.c, N = 128: tab[2k] = asuint64(T[k]), tab[2k+1] = asuint64(H[k]) - (k << 45)
    published = {1: (0x3c9b3b4f1a88bf6e, 0x3feff63da9fb3335), 64: (0xbc93b3efbf5e2228, 0x3feea09e667f3bcd),
                 127: (0x3c5305c14160cc89, 0x3feff3c22b8f71f1)}
    for k, (tail, head) in published.items():
        assert bits(tails[k]) == tail and (bits(heads[k]) - (k << 45)) % 2**64 == head


# -- the graphs ---------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def session():
    return make_epilogue_session(build_epilogue(EpilogueSpec(V, B, D)))


def _logits(seed=0, n=4):
    logits = (np.random.default_rng(seed).standard_normal((n, B, V)) * 3).astype(np.float32)
    logits[0, 0, :6] = logits[0, 0, 6]          # exact ties: smallest id wins everywhere
    logits[1, 2, 10] = logits[1, 2].max() + 5   # a peaked row
    return logits


@needs_glibc_fma
def test_noise_graph_equals_numpy_noise():
    steps = np.array([0, 5, 2**32 - 4])
    got = make_epilogue_session(build_noise_graph(300, 4, 3)).run(
        None, {"node_steps": steps, "seed": np.array(2**32 - 1), "block": np.array(7)})[0]
    want = reference_noise(steps, 2**32 - 1, 7, 3, 4, 300)
    assert np.array_equal(got.view(np.int64), want.view(np.int64))
    assert np.array_equal(want, gumbel(2**32 - 1, 7, (steps[:, None] + np.arange(3))[:, :, None, None],
                                       np.arange(4)[None, None, :, None], np.arange(300)[None, None, None, :]))


@needs_glibc_fma
@pytest.mark.parametrize("temperature", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("top_k", [0, 1, 7])
@pytest.mark.parametrize("exclude_argmax", [False, True, "every row"])
def test_epilogue_is_bit_identical_to_numpy(session, temperature, top_k, exclude_argmax):
    logits = _logits()
    steps = np.array([0, 3, 1, 6])
    # excluding a token that is the argmax somewhere (as the mask id can be) must move the sample, not the softmax
    exclude = int(logits[0, 0].argmax()) if exclude_argmax else -1
    if exclude_argmax == "every row":       # with top-k 1 no token is left: token 0 (spec ties), as every host
        logits[..., exclude] = logits.max() + 3
    sampling = Sampling(temperature=temperature, top_k=top_k, seed=12345, exclude_token=exclude)
    got = run_epilogue(session, logits, steps, sampling, block=5)
    want = reference_epilogue(logits, steps, sampling, block=5, future_steps=D)
    for name in OUTPUTS:
        assert np.array_equal(getattr(got, name), getattr(want, name)), name
    if exclude >= 0:
        assert not (got.token == exclude).any() and not (got.future_tokens == exclude).any()
    if exclude_argmax == "every row" and top_k == 1 and temperature > 0:
        assert (got.token == 0).all()
    if temperature > 0 and top_k != 1:   # the noise matters: samples differ from the argmax, and from step to step
        assert (got.token != logits.argmax(-1)).any()
        assert (got.future_tokens != got.token[:, None]).any()


def _fallback_ran(session, logits, steps, sampling, block) -> bool:
    return bool(session.run([FALLBACK_OUTPUT], epilogue_feeds(logits, steps, sampling, block))[0])


@needs_glibc_fma
@pytest.mark.parametrize("top_k", [0, 1, 2])
def test_certified_sampling_runs_without_the_exact_noise_over_the_vocabulary(session, top_k):
    """Random logits never need the fallback: the native-noise ranking plus three exactly re-scored candidates
    settles every row's winner and runner-up (top-k 1 and 2 leave fewer finite scores than candidates + 1: still
    certified; top-k 1 leaves no runner-up)."""
    logits, steps = _logits(5), np.array([0, 3, 1, 6])
    sampling = Sampling(temperature=0.9, top_k=top_k, seed=2024)
    assert not _fallback_ran(session, logits, steps, sampling, 4)
    got, want = run_epilogue(session, logits, steps, sampling, 4), reference_epilogue(logits, steps, sampling, 4, D)
    for name in OUTPUTS:
        assert np.array_equal(getattr(got, name), getattr(want, name)), name
    assert ((got.future_runner_up == -1) == (top_k == 1)).all() and (np.isinf(got.future_gap) == (top_k == 1)).all()


@needs_glibc_fma
def test_a_near_tie_fails_the_certificate_and_the_exact_noise_decides():
    """Four tokens whose perturbed scores agree to < 5e-10 (built from the exact noise), at the first future step:
    the three exactly re-scored candidates cannot rule out the fourth for the runner-up, so the certificate fails
    and the exact branch returns numpy's winner and runner-up."""
    seed, block, step = 99, 2, 4
    g = gumbel(seed, block, step, 0, np.arange(V, dtype=np.uint32))
    # logits that cancel noise differences exactly enough: the gap between g_a - g_j and its float32 rounding
    diff = g[:, None] - g[None, :]
    gap = np.abs(diff - diff.astype(np.float32).astype(np.float64))
    np.fill_diagonal(gap, 1.0)
    partners = np.argsort(gap, axis=1)[:, :3]                  # each token's three best partners
    a = int(np.argmin(gap[np.arange(V), partners[:, 2]]))
    tied = [a, *partners[a]]
    assert (gap[a, partners[a]] < 5e-10).all()
    logits = np.full((1, B, V), -60.0, np.float32)
    logits[0, 0, tied] = [0.0, *(np.float32(diff[a, j]) for j in partners[a])]    # all four score ~ g_a
    sampling = Sampling(temperature=1.0, seed=seed)
    s = make_epilogue_session(build_epilogue(EpilogueSpec(V, B, 1)))
    assert _fallback_ran(s, logits, [step - 1], sampling, block)
    got = run_epilogue(s, logits, [step - 1], sampling, block)
    want = reference_epilogue(logits, [step - 1], sampling, block, 1)
    assert got.future_tokens[0, 0, 0] in tied and got.future_runner_up[0, 0, 0] in tied
    assert 0 <= got.future_gap[0, 0, 0] < 2e-9
    for name in OUTPUTS:
        assert np.array_equal(getattr(got, name), getattr(want, name)), name


@needs_glibc_fma
def test_forced_fallback_equals_the_certified_path():
    """noise_margin = inf fails every certificate: the exact-noise branch alone must give the same outputs."""
    forced = make_epilogue_session(build_epilogue(EpilogueSpec(V, B, D, noise_margin=float("inf"))))
    logits, steps, sampling = _logits(6, n=2), np.array([2, 0]), Sampling(temperature=0.6, seed=8, top_k=7)
    assert _fallback_ran(forced, logits, steps, sampling, 1)
    got, want = run_epilogue(forced, logits, steps, sampling, 1), reference_epilogue(logits, steps, sampling, 1, D)
    for name in OUTPUTS:
        assert np.array_equal(getattr(got, name), getattr(want, name)), name


@needs_glibc_fma
def test_epilogue_in_node_chunks_equals_one_call(session):
    logits, steps, sampling = _logits(1, n=5), np.arange(5), Sampling(temperature=0.7, seed=3)
    one, chunked = run_epilogue(session, logits, steps, sampling, 2), run_epilogue(session, logits, steps, sampling,
                                                                                   2, chunk=2)
    for name in OUTPUTS:
        assert np.array_equal(getattr(one, name), getattr(chunked, name))


@needs_glibc_fma
def test_tiny_vocabulary_and_no_future_steps():
    spec = EpilogueSpec(vocab_size=20, block_size=4, future_steps=0)
    s = make_epilogue_session(build_epilogue(spec))
    logits = (np.random.default_rng(4).standard_normal((2, 4, 20)) * 2).astype(np.float32)
    sampling = Sampling(temperature=1.0, seed=9)
    got, want = run_epilogue(s, logits, [2, 9], sampling, 0), reference_epilogue(logits, [2, 9], sampling, 0, 0)
    assert got.future_tokens.shape == (2, 0, 4) and got.top_logprobs.shape == (2, 4, 32)
    assert (got.top_ids[..., 20:] == -1).all() and (got.top_logprobs[..., 20:] == -1e4).all()
    for name in OUTPUTS:
        assert np.array_equal(getattr(got, name), getattr(want, name)), name


@needs_glibc_fma
@pytest.mark.parametrize("vocab", [2, 3, 4])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_vocabularies_at_most_the_candidates(vocab, temperature):
    """V <= CANDIDATES + 1: every token re-scored, or one left to certify against; with the mask id excluded a
    2-token vocabulary has no runner-up anywhere (-1, inf)."""
    s = make_epilogue_session(build_epilogue(EpilogueSpec(vocab_size=vocab, block_size=4, future_steps=2)))
    logits = (np.random.default_rng(vocab).standard_normal((2, 4, vocab)) * 2).astype(np.float32)
    sampling = Sampling(temperature=temperature, seed=5, exclude_token=vocab - 1)
    got, want = run_epilogue(s, logits, [0, 3], sampling, 1), reference_epilogue(logits, [0, 3], sampling, 1, 2)
    for name in OUTPUTS:
        assert np.array_equal(getattr(got, name), getattr(want, name)), name
    torch = pytest.importorskip("torch")
    from spot.reference.noise_torch import epilogue_torch
    with torch.inference_mode():
        twin = epilogue_torch(torch.from_numpy(logits), [0, 3], 5, 1, temperature, 0, 2, vocab - 1)
    for name in OUTPUTS:
        assert np.array_equal(twin[name].numpy(), getattr(want, name)), name
    if vocab == 2:
        assert (got.future_runner_up == -1).all() and np.isinf(got.future_gap).all()
    else:
        assert (got.future_runner_up >= 0).all() and np.isfinite(got.future_gap).all()


def test_outputs_are_small_whatever_the_vocabulary():
    """What a call copies to the host: O(N x B x (D + 32)) values, no output with a vocabulary axis."""
    for vocab, d in ((500, 3), (151936, 6)):
        model = build_epilogue(EpilogueSpec(vocab, 32, d))
        shapes = declared_output_shapes(model)
        assert set(shapes) == set(OUTPUTS) | {FALLBACK_OUTPUT} and shapes.pop(FALLBACK_OUTPUT) == []
        per_node = 0
        for name, dims in shapes.items():
            assert dims[0] == "N" and all(isinstance(x, int) for x in dims[1:]), (name, dims)
            assert vocab not in dims[1:], name
            per_node += int(np.prod(dims[1:]))
        assert per_node == 32 * (2 + 4 * d + 2 * 32)     # token, conf, 4 x future (+ runner-ups), 2 x top-32


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_position_runs_equal_whole_blocks(temperature):
    """A graph built for runs of P positions (first_position p: rows p .. p + P - 1 of each state; less memory)
    gives, run by run, the whole-block call's rows bit for bit."""
    logits, steps = _logits(3, n=3), np.array([0, 2, 5])
    sampling = Sampling(temperature=temperature, seed=4, top_k=7, exclude_token=V - 1)
    whole = run_epilogue(make_epilogue_session(build_epilogue(EpilogueSpec(V, B, D))), logits, steps, sampling, 2)
    want = reference_epilogue(logits, steps, sampling, 2, D)
    for positions in (1, 4):
        s = make_epilogue_session(build_epilogue(EpilogueSpec(V, B, D, positions)))
        assert graph_positions(s) == positions
        got = run_epilogue(s, logits, steps, sampling, 2)
        for name in OUTPUTS:
            assert np.array_equal(getattr(got, name), getattr(whole, name)), (positions, name)
            assert np.array_equal(getattr(got, name), getattr(want, name)), (positions, name)
    part = reference_epilogue(logits[:, 2:5], steps, sampling, 2, D, first_position=2)
    assert np.array_equal(part.future_tokens, want.future_tokens[..., 2:5])
    with pytest.raises(SpotError, match="divide the block size 8, got 3"):
        EpilogueSpec(V, B, D, 3)


def test_native_math_variant_is_close_but_not_exact():
    """exact=False uses the backend's Exp/Log/ReduceSum: tokens agree here, confidences only to ~1e-15."""
    s = make_epilogue_session(build_epilogue(EpilogueSpec(V, B, D, exact=False)))
    logits, steps, sampling = _logits(2), np.arange(4), Sampling(temperature=0.5, seed=1)
    got, want = run_epilogue(s, logits, steps, sampling, 1), reference_epilogue(logits, steps, sampling, 1, D)
    assert np.array_equal(got.token, want.token) and np.array_equal(got.future_tokens, want.future_tokens)
    np.testing.assert_allclose(got.confidence, want.confidence, rtol=1e-13)
    np.testing.assert_allclose(got.top_logprobs, want.top_logprobs, rtol=1e-6)


def test_top_p_stays_on_the_host():
    with pytest.raises(SpotError, match="top-p"):
        check_sampling(Sampling(temperature=1.0, top_p=0.9))
    with pytest.raises(SpotError, match=r"\[0, 2\*\*32\)"):
        run_epilogue(None, _logits(), [0, 0, 0, 2**32], Sampling(temperature=1.0), 0)


def test_spec_is_checked():
    with pytest.raises(SpotError):
        EpilogueSpec(0, 4, 1)
    with pytest.raises(SpotError):
        EpilogueSpec(10, 4, -1)
    with pytest.raises(SpotError, match="32"):
        EpilogueSpec(10, 4, 1, top_k_logprobs=16)


@needs_glibc_fma
@pytest.mark.parametrize("temperature, forced_fallback, exclude_argmax, top_k",
                         [(0.0, False, True, 5), (0.8, False, False, 5), (0.8, True, True, 5), (0.8, False, True, 5),
                          (0.8, False, "every row", 1)])
def test_torch_twin_is_bit_identical_to_numpy(temperature, forced_fallback, exclude_argmax, top_k, monkeypatch):
    """... including rows where top-k keeps only the excluded mask id: no token can win, and every implementation
    takes the smallest id (0) as the spec's ties rule does (the twin took the smallest of its arbitrary
    candidates)."""
    torch = pytest.importorskip("torch")
    from spot.reference.noise_torch import epilogue_torch
    if forced_fallback:               # every certificate fails: the exact noise over V decides
        monkeypatch.setattr("spot.export.epilogue_graph.NATIVE_NOISE_MARGIN", float("inf"))
    logits = _logits(3, n=2)[:, :, :200].copy()
    exclude = int(logits[0, 0].argmax()) if exclude_argmax else -1      # the mask id may be a row's argmax
    if exclude_argmax == "every row":
        logits[..., exclude] = logits.max() + 3
    sampling = Sampling(temperature=temperature, top_k=top_k, seed=77, exclude_token=exclude)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)          # small tensors on a shared 2-core CI machine
    try:
        with torch.inference_mode():
            got = epilogue_torch(torch.from_numpy(logits), [1, 4], 77, 3, temperature, top_k, 2, exclude)
            run = epilogue_torch(torch.from_numpy(logits[:, 3:6].copy()), [1, 4], 77, 3, temperature, top_k, 2, exclude,
                                 first_position=3)        # a run of positions: the same rows
    finally:
        torch.set_num_threads(threads)
    want = reference_epilogue(logits, [1, 4], sampling, 3, 2)
    for name in OUTPUTS:
        assert np.array_equal(got[name].numpy(), getattr(want, name)), name
        at = np.s_[..., 3:6] if name.startswith("future_") else np.s_[:, 3:6]
        assert np.array_equal(run[name].numpy(), getattr(want, name)[at]), name


@needs_glibc_fma
def test_onnx_exp_and_log_match_numpy_including_subnormal_results():
    from onnx import TensorProto, helper

    from spot.export.epilogue_graph import OnnxOps
    o = OnnxOps("t")
    exp_out, log_out = xm.glibc_exp(o, "x"), xm.glibc_log(o, "y")
    o.nodes += [helper.make_node("Identity", [exp_out], ["ex"]), helper.make_node("Identity", [log_out], ["ly"])]
    vec = lambda n: helper.make_tensor_value_info(n, TensorProto.DOUBLE, ["M"])  # noqa: E731
    graph = helper.make_graph(o.nodes, "t", [vec("x"), vec("y")], [vec("ex"), vec("ly")], initializer=o.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    rng = np.random.default_rng(8)
    x = np.concatenate([-rng.random(20000) * 745, rng.uniform(-746, -700, 5000), rng.uniform(-1500, -1000, 100),
                        rng.standard_normal(5000) * 20, [0.0, -0.0, -1e-300, -512.0, -1024.0]])
    y = np.concatenate([rng.random(20000), 1 - rng.random(5000) * 0.07, rng.random(5000) * 40, [1.0, 2.0**-1022]])
    y = np.resize(y, x.size)
    ex, ly = make_epilogue_session(model).run(["ex", "ly"], {"x": x, "y": y})
    with np.errstate(all="ignore"):
        assert np.array_equal(ex, libm.exp(x))
    assert np.array_equal(ly, libm.log(y))
    assert (ex[(x < -708.4) & (x > -745)] < 2.0**-1022).all()        # subnormal results were exercised


@needs_glibc_fma
def test_cost_benchmark_runs_the_three_graphs_side_by_side(tmp_path):
    """benchmarks/epilogue_cost.py (also what scripts/gpu_check.py runs on ORT CUDA at V 151936), tiny shape."""
    import json
    import subprocess
    import sys
    from pathlib import Path
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "epilogue_cost.py"
    out = tmp_path / "cost.json"
    proc = subprocess.run([sys.executable, str(script), "--vocab", "60", "--block", "4", "--future", "1", "--nodes",
                           "2", "--repeats", "1", "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    assert result["certified_equals_exact"] and not result["certified_fell_back"]
    assert set(result["ms_per_state"]) == {"certified", "exact_everywhere", "native"}
    assert result["exact_over_certified"] > 0
