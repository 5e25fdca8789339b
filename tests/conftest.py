"""Suite-wide settings: the slow tests left out unless --full, one torch thread (tiny models run ~40x faster than with
2 contended threads), and a spot cache of the session's own."""
import os

import pytest

FULL = "--full"
SLOW_KEY = pytest.StashKey[int]()


def pytest_addoption(parser):
    parser.addoption(FULL, action="store_true",
                     help="also run the tests marked slow (the C++ host's build and conformance, the HTTP servers, "
                          "Triton): the full run, as CI runs it")


def pytest_collection_modifyitems(config, items):
    """Without --full the tests marked slow are deselected (a newcomer's run stays within minutes); the summary says
    how many and how to run them."""
    if config.getoption(FULL):
        return
    slow = [item for item in items if item.get_closest_marker("slow")]
    if slow:
        items[:] = [item for item in items if not item.get_closest_marker("slow")]
        config.hook.pytest_deselected(items=slow)
    config.stash[SLOW_KEY] = len(slow)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    left_out = config.stash.get(SLOW_KEY, 0)
    if left_out:
        terminalreporter.write_line(
            f"{left_out} slow tests not run (the C++ host, the HTTP servers, Triton): `python3 -m pytest {FULL}` "
            "runs everything, as CI does (README.md)")


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
    from spot.app.demo import exported_embedded
    cache = tmp_path_factory.mktemp("embedded-export-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPOT_CACHE", str(cache))
        folder = exported_embedded(lambda line: None)
    return cache, folder


@pytest.fixture(autouse=True, scope="session")
def _session_spot_cache(tmp_path_factory):
    """The cache (the embedded model's export, tuned budgets, engine caches) in a temporary folder, not the user's
    ~/.cache/spot: commands run without --model export the embedded model there once (spot.app.demo.exported_embedded)."""
    before = os.environ.get("SPOT_CACHE")
    os.environ["SPOT_CACHE"] = str(tmp_path_factory.mktemp("spot-cache"))
    yield
    if before is None:
        os.environ.pop("SPOT_CACHE", None)
    else:
        os.environ["SPOT_CACHE"] = before


@pytest.fixture(scope="module")
def tiny_ckpt(tmp_path_factory):
    """A tiny random SDAR checkpoint with its tokenizer (tinymodels), one per test module."""
    from tinymodels import save_tiny_model, save_tiny_tokenizer
    folder = tmp_path_factory.mktemp("ckpt") / "tiny"
    save_tiny_model(folder)
    save_tiny_tokenizer(folder)
    return folder


@pytest.fixture(scope="module")
def tiny_onnx(tiny_ckpt, tmp_path_factory):
    """tiny_ckpt exported in fp32 without validation, one per test module."""
    from spot.export.export import export_checkpoint
    from spot.export.options import ExportOptions
    from spot.export.presets import resolve_source
    return export_checkpoint(resolve_source(str(tiny_ckpt)), tmp_path_factory.mktemp("exported") / "tiny-onnx",
                             ExportOptions(dtype="fp32", validate=False))
