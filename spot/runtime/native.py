"""The optional C loops of per-step sampling (spot/runtime/_sampling.c, built by `pip install` where a C compiler
exists), or None without them: every caller then runs its numpy twin, which gives the same values (tests hold the
two equal)."""
from __future__ import annotations

try:
    from spot.runtime import _sampling as sampling
except ImportError:  # pragma: no cover - an install without a C compiler
    sampling = None
