"""The noise test vectors (tests/data/noise_vectors.json, docs/noise.md): numpy, torch and ONNX reproduce them."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from spot.runtime import native
from spot.runtime.noise import (LANE_A, LANE_B, BIN_BITS, NoiseBins, gumbel, lane_prefix, mix32, mix32_scalar,
                                noise_bins, row_prefixes, uniform, uniform_from_words)

VECTORS = json.loads((Path(__file__).parent / "data" / "noise_vectors.json").read_text())["vectors"]
COUNTERS = ("seed", "block", "step", "position", "token")


def _column(name: str) -> np.ndarray:
    return np.array([v[name] for v in VECTORS], dtype=np.int64)


def test_vectors_cover_the_extremes_and_both_log_paths():
    assert len(VECTORS) >= 50
    for extreme in (0, 2**32 - 1):
        assert any(all(v[c] == extreme for c in COUNTERS) for v in VECTORS)
    u = np.array([float.fromhex(v["u"]) for v in VECTORS])
    assert (u > 1 - 2**-4).any(), "no vector takes glibc log's near-1 path in log(u)"
    assert ((-np.log(u) >= 1 - 2**-4) & (-np.log(u) < 1 + 0x109 / 2**12)).any(), "none in log(-log(u))'s"


def test_numpy_noise_reproduces_the_vectors():
    args = [_column(c) for c in COUNTERS]
    tok = args[4].astype(np.uint32)
    a = mix32(lane_prefix(LANE_A, *args[:4]) ^ tok)
    b = mix32(lane_prefix(LANE_B, *args[:4]) ^ tok)
    assert np.array_equal(a, _column("a")) and np.array_equal(b, _column("b"))
    k = (a.astype(np.int64) >> 5) * 2**26 + (b.astype(np.int64) >> 6)
    assert np.array_equal(k, _column("k"))
    assert [x.hex() for x in uniform(*args)] == [v["u"] for v in VECTORS]
    assert [x.hex() for x in gumbel(*args)] == [v["g"] for v in VECTORS]


@pytest.mark.parametrize("c_loops", [True, False])
def test_sampling_paths_reproduce_the_vectors(c_loops, monkeypatch):
    """What sampling reads — row prefixes from scalar counters, every token's bin, exact values at (row, token) —
    equals the vectors, with the C loops (spot/runtime/_sampling.c) and with their numpy twins."""
    if c_loops and native.sampling is None:
        pytest.skip("the spot.runtime._sampling extension is not built")
    if not c_loops:
        monkeypatch.setattr(native, "sampling", None)
    got = []
    for v in VECTORS:
        prefix_a, prefix_b = row_prefixes(v["seed"], v["block"], v["step"], [v["position"]])
        assert prefix_a[0] == lane_prefix(LANE_A, *(v[c] for c in COUNTERS[:4]))
        noise = NoiseBins(np.zeros((1, 1), np.uint16), prefix_a, prefix_b)
        got.append(noise.exact_at(np.array([0]), np.array([v["token"]]))[0].hex())
        if v["token"] < 4096:
            bins = noise_bins(v["seed"], v["block"], v["step"], [v["position"]], v["token"] + 1).bins
            assert bins[0, -1] == v["a"] >> (32 - BIN_BITS)
    assert got == [v["g"] for v in VECTORS]
    x = np.random.default_rng(0).integers(0, 2**32, 1000, dtype=np.uint64)
    assert [mix32_scalar(int(i)) for i in x] == mix32(x.astype(np.uint32)).tolist()


def test_uniform_clamps_the_zero_word_pair():
    # k = 0 would give u = 0 and an infinite Gumbel value; it maps to 0.5 * 2**-53 instead (no preimage known).
    u = uniform_from_words(np.array([0, 31], np.uint32), np.array([63, 0], np.uint32))
    assert u[0] == 2.0**-54 and u[1] == 2.0**-54
    assert np.isfinite(-np.log(-np.log(u))).all()


def test_torch_twin_reproduces_the_vectors():
    torch = pytest.importorskip("torch")
    from spot.reference import noise_torch as nt
    args = [torch.from_numpy(_column(c)) for c in COUNTERS]
    a, b = nt.words(*args)
    assert a.tolist() == [v["a"] for v in VECTORS] and b.tolist() == [v["b"] for v in VECTORS]
    assert [x.hex() for x in nt.uniform(*args).tolist()] == [v["u"] for v in VECTORS]
    assert [x.hex() for x in nt.gumbel(*args).tolist()] == [v["g"] for v in VECTORS]
    with pytest.raises(ValueError, match=r"\[0, 2\*\*32\)"):
        nt.gumbel(2**32, 0, 0, 0, 0)


def test_torch_int64_product_matches_uint32_wrapping():
    torch = pytest.importorskip("torch")
    from spot.reference.noise_torch import mul32
    x = np.array([0, 1, 0xFFFF, 0x10000, 0xFFFFFFFF, 0x80000000, 123456789], dtype=np.uint32)
    for c in (0x21F0AAAD, 0x735A2D97, 0xFFFFFFFF):
        with np.errstate(over="ignore"):
            expected = x * np.uint32(c)
        assert mul32(torch.from_numpy(x.astype(np.int64)), c).tolist() == expected.tolist()


def test_onnx_noise_reproduces_the_vectors():
    pytest.importorskip("onnx")
    from spot.export.epilogue_graph import build_counter_noise_graph
    from spot.folder.epilogue import make_epilogue_session
    session = make_epilogue_session(build_counter_noise_graph())
    a, b, g = session.run(["a", "b", "g"], {c: _column(c) for c in COUNTERS})
    assert a.tolist() == [v["a"] for v in VECTORS] and b.tolist() == [v["b"] for v in VECTORS]
    assert [x.hex() for x in g.tolist()] == [v["g"] for v in VECTORS]
