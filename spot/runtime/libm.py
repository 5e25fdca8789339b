"""The C library's float64 `log`, `exp`, `log1p` and `tanh` over numpy arrays: the logarithm and exponential the
noise and the softmax are defined with (docs/noise.md: glibc's, as numpy on x86-64 with FMA used to call them), and
the two functions that weigh tree candidates, so that the C++ host (which calls the C library) builds the same trees.

numpy calls the C library only where it has no SIMD float64 kernel of its own for the CPU. On AVX-512 CPUs
(numpy 2.x dispatches X86_V4 kernels) np.log and np.exp are numpy's own and differ from glibc in the last bit
(measured on an AMD EPYC with AVX-512: exp on 4% of inputs, log on ~0.02%), so the Gumbel noise and the
confidences would differ from the C++ host, the ONNX epilogue and the torch reference. Every runtime call that is
part of the definition goes through the functions here; the backend is chosen once, at first use:

  "ext"     spot.runtime._libm, a C loop calling the C library per element (built at install, optional)
  "numpy"   numpy's ufuncs, when they equal math.* (= the C library) on PROBE_SIZE probe values per function plus
            values where numpy's AVX-512 kernels are known to differ
  "python"  math.* per element: exact, ~20x slower than the others; used only when neither above applies, with a
            warning saying how to get the fast path
math.log / exp / log1p / tanh are CPython's thin wrappers of the C library's functions (finite inputs).
"""
from __future__ import annotations

import math
import warnings
from functools import lru_cache

import numpy as np

FUNCTIONS = ("log", "exp", "log1p", "tanh")
PROBE_SIZE = 20_000
# inputs where numpy 2.4's AVX-512 float64 kernels round differently from glibc (found on this project's CI kind)
KNOWN_LOG_MISMATCHES = (0.987777576672508, 0.9941286196828675, 0.917728611180298, 2.653142299120345)
KNOWN_EXP_MISMATCHES = (-4.616918330617272, -3.37828082269374, -31.865886142879848)


def _probe_values() -> dict[str, np.ndarray]:
    """Per function, inputs over the domains the runtime uses — u in (0, 1), -log(u) in (0, 37], softmax exponents
    <= 0, probabilities for log1p(-p), logits / 2 for tanh — and a spread beyond them."""
    rng = np.random.default_rng(20261201)
    n = PROBE_SIZE // 4
    return {
        "log": np.concatenate([rng.random(n), -np.log1p(-rng.random(n)) * 8, np.exp(rng.uniform(-700, 700, n)),
                               rng.random(n) * 2.0 ** -40, 1 - np.arange(1, 1001) * 2.0 ** -53,
                               1 - rng.random(1000) * 2.0 ** -20, KNOWN_LOG_MISMATCHES]),
        "exp": np.concatenate([-rng.random(2 * n) * 745, rng.standard_normal(n) * 30, -rng.random(n) * 2.0 ** -30,
                               KNOWN_EXP_MISMATCHES]),
        "log1p": np.concatenate([-rng.random(2 * n), rng.random(n) * 2.0 ** -30 - 2.0 ** -31,
                                 rng.standard_normal(n) * 10]),
        "tanh": np.concatenate([rng.standard_normal(2 * n) * 4, rng.standard_normal(n) * 30,
                                rng.standard_normal(n) * 2.0 ** -20]),
    }


def _c_log(v: float) -> float:
    """math.log with C's results where Python raises instead: log(0) = -inf, log(x < 0) = nan."""
    try:
        return math.log(v)
    except ValueError:
        return -math.inf if v == 0 else math.nan


def _c_log1p(v: float) -> float:
    try:
        return math.log1p(v)
    except ValueError:
        return -math.inf if v == -1 else math.nan


def _c_exp(v: float) -> float:
    try:
        return math.exp(v)
    except OverflowError:
        return math.inf


_PYTHON = {"log": _c_log, "exp": _c_exp, "log1p": _c_log1p, "tanh": math.tanh}
_NUMPY = {"log": np.log, "exp": np.exp, "log1p": np.log1p, "tanh": np.tanh}


def _python_into(fn):
    def apply(x: np.ndarray, out: np.ndarray) -> None:
        out[...] = np.fromiter(map(fn, x.ravel().tolist()), dtype=np.float64, count=x.size).reshape(x.shape)
    return apply


def numpy_matches_libm() -> bool:
    """Whether numpy's log/exp/log1p/tanh equal the C library's on the probe values (false on AVX-512 builds)."""
    for name, x in _probe_values().items():
        want = np.empty_like(x)
        _python_into(_PYTHON[name])(x, want)
        with np.errstate(all="ignore"):
            if not np.array_equal(getattr(np, name)(x), want, equal_nan=True):
                return False
    return True


@lru_cache(maxsize=None)
def backend() -> str:
    """The backend in use: "ext", "numpy" or "python" (see the module docstring)."""
    try:
        from spot.runtime import _libm  # noqa: F401  (the optional C extension)
        return "ext"
    except ImportError:
        pass
    if numpy_matches_libm():
        return "numpy"
    warnings.warn("spot: numpy's float64 log/exp differ from the C library's on this CPU and the spot.runtime._libm "
                  "extension is not built, so exact sampling uses a slow per-element path; reinstall spot with a C "
                  "compiler available to build it (in its checkout: pip install --force-reinstall --no-deps -e .)",
                  RuntimeWarning, stacklevel=2)
    return "python"


@lru_cache(maxsize=None)
def _kernel(backend_name: str, name: str):
    if backend_name == "ext":
        # the optional C extension (absent where it was not built)
        from spot.runtime import _libm
        return getattr(_libm, f"{name}_into")
    if backend_name == "numpy":
        ufunc = _NUMPY[name]
        return lambda x, out: ufunc(x, out=out)
    return _python_into(_PYTHON[name])


def _apply(name: str, x, out: np.ndarray | None) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    if not x.flags.c_contiguous:
        x = x.copy(order="C")
    if out is None:
        out = np.empty_like(x)
    if out.dtype != np.float64 or out.shape != x.shape or not out.flags.c_contiguous:
        raise ValueError(f"out: got {out.dtype} {out.shape} (contiguous: {out.flags.c_contiguous}), expected "
                         f"contiguous float64 {x.shape}")
    with np.errstate(divide="ignore", over="ignore", under="ignore", invalid="ignore"):
        _kernel(backend(), name)(x, out)
    return out


def log(x, out: np.ndarray | None = None) -> np.ndarray:
    """The C library's log of every element (float64); `out` may be x itself."""
    return _apply("log", x, out)


def exp(x, out: np.ndarray | None = None) -> np.ndarray:
    """The C library's exp of every element (float64); `out` may be x itself."""
    return _apply("exp", x, out)


def log1p(x, out: np.ndarray | None = None) -> np.ndarray:
    """The C library's log1p of every element (float64)."""
    return _apply("log1p", x, out)


def tanh(x, out: np.ndarray | None = None) -> np.ndarray:
    """The C library's tanh of every element (float64)."""
    return _apply("tanh", x, out)
