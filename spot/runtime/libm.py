"""The C library's float64 `log` and `exp` over numpy arrays: the logarithm and exponential the noise and the
softmax are defined with (docs/noise.md: glibc's, as numpy on x86-64 with FMA used to call them).

numpy calls the C library only where it has no SIMD float64 kernel of its own for the CPU. On AVX-512 CPUs
(numpy 2.x dispatches X86_V4 kernels) np.log and np.exp are numpy's own and differ from glibc in the last bit
(measured on an AMD EPYC with AVX-512: exp on 4% of inputs, log on ~0.02%), so the Gumbel noise and the
confidences would differ from the C++ host, the ONNX epilogue and the torch reference. Every runtime call that is
part of the definition goes through `log` / `exp` here; the backend is chosen once, at first use:

  "ext"     spot.runtime._libm, a C loop calling the C library per element (built at install, optional)
  "numpy"   np.log / np.exp, when they equal math.log / math.exp (= the C library) on PROBE_SIZE probe values
            plus values where numpy's AVX-512 kernels are known to differ
  "python"  math.log / math.exp per element: exact, ~20x slower than the others; used only when neither above
            applies, with a warning saying how to get the fast path
math.log / math.exp are CPython's thin wrappers of the C library's log / exp (finite positive / finite input).
"""
from __future__ import annotations

import math
import warnings
from functools import lru_cache

import numpy as np

PROBE_SIZE = 20_000
# inputs where numpy 2.4's AVX-512 float64 kernels round differently from glibc (found on this project's CI kind)
KNOWN_LOG_MISMATCHES = (0.987777576672508, 0.9941286196828675, 0.917728611180298, 2.653142299120345)
KNOWN_EXP_MISMATCHES = (-4.616918330617272, -3.37828082269374, -31.865886142879848)


def _probe_values() -> tuple[np.ndarray, np.ndarray]:
    """(log inputs, exp inputs): the domains the runtime uses — u in (0, 1), -log(u) in (0, 37], softmax
    exponents <= 0 — and a spread beyond them."""
    rng = np.random.default_rng(20261201)
    n = PROBE_SIZE // 4
    logs = np.concatenate([rng.random(n), -np.log1p(-rng.random(n)) * 8, np.exp(rng.uniform(-700, 700, n)),
                           rng.random(n) * 2.0 ** -40, KNOWN_LOG_MISMATCHES])
    exps = np.concatenate([-rng.random(2 * n) * 745, rng.standard_normal(n) * 30, -rng.random(n) * 2.0 ** -30,
                           KNOWN_EXP_MISMATCHES])
    return logs, exps


def _c_log(v: float) -> float:
    """math.log with C's results where Python raises instead: log(0) = -inf, log(x < 0) = nan."""
    try:
        return math.log(v)
    except ValueError:
        return -math.inf if v == 0 else math.nan


def _c_exp(v: float) -> float:
    try:
        return math.exp(v)
    except OverflowError:
        return math.inf


def _python_into(fn):
    def apply(x: np.ndarray, out: np.ndarray) -> None:
        out[...] = np.fromiter(map(fn, x.ravel().tolist()), dtype=np.float64, count=x.size).reshape(x.shape)
    return apply


def numpy_matches_libm() -> bool:
    """Whether np.log / np.exp equal the C library's on the probe values (false on AVX-512 numpy builds)."""
    logs, exps = _probe_values()
    want_log, want_exp = np.empty_like(logs), np.empty_like(exps)
    _python_into(_c_log)(logs, want_log)
    _python_into(_c_exp)(exps, want_exp)
    return bool(np.array_equal(np.log(logs), want_log) and np.array_equal(np.exp(exps), want_exp))


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
                  "compiler available (pip install -e .) to build it", RuntimeWarning, stacklevel=2)
    return "python"


@lru_cache(maxsize=None)
def _kernels(name: str):
    if name == "ext":
        from spot.runtime import _libm
        return _libm.log_into, _libm.exp_into
    if name == "numpy":
        return (lambda x, out: np.log(x, out=out)), (lambda x, out: np.exp(x, out=out))
    return _python_into(_c_log), _python_into(_c_exp)


def _apply(which: int, x, out: np.ndarray | None) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    if not x.flags.c_contiguous:
        x = x.copy(order="C")
    if out is None:
        out = np.empty_like(x)
    if out.dtype != np.float64 or out.shape != x.shape or not out.flags.c_contiguous:
        raise ValueError(f"out: got {out.dtype} {out.shape} (contiguous: {out.flags.c_contiguous}), expected "
                         f"contiguous float64 {x.shape}")
    with np.errstate(divide="ignore", over="ignore", under="ignore", invalid="ignore"):
        _kernels(backend())[which](x, out)
    return out


def log(x, out: np.ndarray | None = None) -> np.ndarray:
    """The C library's log of every element (float64); `out` may be x itself."""
    return _apply(0, x, out)


def exp(x, out: np.ndarray | None = None) -> np.ndarray:
    """The C library's exp of every element (float64); `out` may be x itself."""
    return _apply(1, x, out)
