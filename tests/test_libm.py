"""spot.runtime.libm: the C library's float64 log/exp/log1p/tanh over arrays, whatever SIMD kernels numpy dispatches.

math.log / math.exp call the C library directly, so they are the reference here; the glibc-vs-exact_math identity
(the ONNX/torch side) is tests/test_epilogue.py's."""
from __future__ import annotations

import math

import numpy as np
import pytest

from spot.runtime import libm


def reference(fn, x: np.ndarray) -> np.ndarray:
    return np.array([fn(float(v)) for v in x.ravel()]).reshape(x.shape)


def values():
    rng = np.random.default_rng(3)
    u = np.concatenate([rng.random(30000), 1 - rng.random(3000) * 2.0 ** -20, libm.KNOWN_LOG_MISMATCHES])
    g = -np.log(rng.random(30000))                      # the second log's inputs, (0, 37]
    z = np.concatenate([-rng.random(30000) * 745, rng.standard_normal(3000) * 20, libm.KNOWN_EXP_MISMATCHES])
    p = -rng.random(20000)                              # log1p(-p) of probabilities
    t = rng.standard_normal(20000) * 8                  # tanh(x / 2) of logits
    return u, g, z, p, t


@pytest.mark.parametrize("backend", ["ext", "numpy", "python"])
def test_every_backend_is_the_c_library(backend, monkeypatch):
    if backend == "ext":
        pytest.importorskip("spot.runtime._libm")
    if backend == "numpy" and not libm.numpy_matches_libm():
        pytest.skip("numpy's own float64 kernels run on this CPU (e.g. AVX-512): the numpy backend is not used")
    monkeypatch.setattr(libm, "backend", lambda: backend)
    u, g, z, p, t = values()
    assert np.array_equal(libm.log(u), reference(math.log, u))
    assert np.array_equal(libm.log(g), reference(math.log, g))
    assert np.array_equal(libm.exp(z), reference(math.exp, z))
    assert np.array_equal(libm.log1p(p), reference(math.log1p, p))
    assert np.array_equal(libm.tanh(t), reference(math.tanh, t))


@pytest.mark.parametrize("backend", ["ext", "python"])
def test_shapes_in_place_and_edge_values(backend, monkeypatch):
    if backend == "ext":
        pytest.importorskip("spot.runtime._libm")
    monkeypatch.setattr(libm, "backend", lambda: backend)
    x = np.random.default_rng(0).random((4, 6))
    want = reference(math.log, x)
    assert libm.log(x[:, ::2]).shape == (4, 3) and np.array_equal(libm.log(x[:, ::2]), want[:, ::2])  # strided
    assert libm.log(np.float64(0.5)).shape == () and libm.log(0.5) == math.log(0.5)
    y = x.copy()
    assert libm.log(y, out=y) is y and np.array_equal(y, want)                                         # in place
    with np.errstate(all="raise"):        # C semantics, never a Python exception or a numpy warning
        assert np.array_equal(libm.log(np.array([0.0, np.inf])), [-np.inf, np.inf])
        assert np.isnan(libm.log(np.array([-1.0, np.nan]))).all()
        assert np.array_equal(libm.exp(np.array([-np.inf, -1e4, 1e4, np.inf])), [0.0, 0.0, np.inf, np.inf])
        assert np.array_equal(libm.log1p(np.array([-1.0, 0.0])), [-np.inf, 0.0])
        assert np.array_equal(libm.tanh(np.array([-np.inf, 0.0, np.inf])), [-1.0, 0.0, 1.0])
    with pytest.raises(ValueError, match="expected contiguous float64"):
        libm.exp(x, out=np.empty((4, 6), dtype=np.float32))


def test_numpy_is_used_only_where_it_equals_the_c_library(monkeypatch):
    def returning(name):
        kernel = libm._kernel("python", name)

        def f(x, *args, **kwargs):
            out = np.empty(np.shape(x))
            kernel(np.asarray(x, dtype=np.float64), out)
            return out
        return f

    for name in libm.FUNCTIONS:
        monkeypatch.setattr(np, name, returning(name))
    assert libm.numpy_matches_libm()          # a numpy that calls the C library is used

    exact = np.log

    def off_by_one_ulp(x, *args, **kwargs):   # one whose SIMD log rounds one known input the other way is not
        out = exact(x)
        return np.where(np.asarray(x) == libm.KNOWN_LOG_MISMATCHES[0], np.nextafter(out, np.inf), out)

    monkeypatch.setattr(np, "log", off_by_one_ulp)
    assert not libm.numpy_matches_libm()


def test_a_source_install_has_a_fast_exact_backend():
    """CI installs from source with a C compiler: the extension must have been built (or numpy must match the C
    library), never the per-element Python path, which costs ~20x more per Gumbel row."""
    assert libm.backend() in ("ext", "numpy")
