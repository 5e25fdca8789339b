"""Suite-wide settings: one torch thread (tiny models run ~40x faster than with 2 contended threads), and a spot
cache of the session's own."""
import os

import pytest


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread():
    try:
        import torch
    except ImportError:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def embedded_export(tmp_path_factory):
    """The embedded model exported as `spot demo` exports it, into this test session's own cache: (cache, folder).
    Shared by the serving tests (spot serve, the Triton repository)."""
    from spot.demo import exported_embedded
    cache = tmp_path_factory.mktemp("embedded-export-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPOT_CACHE", str(cache))
        folder = exported_embedded(lambda line: None)
    return cache, folder


@pytest.fixture(autouse=True, scope="session")
def _session_spot_cache(tmp_path_factory):
    """The cache (the embedded model's export, tuned budgets, engine caches) in a temporary folder, not the user's
    ~/.cache/spot: commands run without --model export the embedded model there once (spot.demo.exported_embedded)."""
    before = os.environ.get("SPOT_CACHE")
    os.environ["SPOT_CACHE"] = str(tmp_path_factory.mktemp("spot-cache"))
    yield
    if before is None:
        os.environ.pop("SPOT_CACHE", None)
    else:
        os.environ["SPOT_CACHE"] = before
