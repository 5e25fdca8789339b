"""Suite-wide settings: one torch thread (tiny models run ~40x faster than with 2 contended threads)."""
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
