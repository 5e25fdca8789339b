"""The sdist and the wheel hold what a user of each needs, and nothing stray: the sdist the C++ host's sources, the
docs, the tests with their data and the licence (it had none of them); the wheel the embedded model's files by name
(a glob took in __pycache__ and temporary files). The wheel is built from the sdist, so the sdist builds too."""
from __future__ import annotations

import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ASSETS = ("config.json", "drafter.json", "drafter.onnx", "heldout_prompts.jsonl", "model.safetensors",
          "tokenizer.json", "tokenizer_config.json", "training_report.json")
FOLDERS = tuple(sorted(m.folder for m in __import__("spot.assets").assets.MODELS.values()))   # every embedded model


def _run(args, cwd) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def sdist(tmp_path_factory) -> Path:
    setuptools = pytest.importorskip("setuptools")
    if int(setuptools.__version__.split(".")[0]) < 77:
        pytest.skip(f"setuptools {setuptools.__version__} < 77 cannot build this pyproject (license = 'MIT')")
    out = tmp_path_factory.mktemp("sdist")
    proc = _run([sys.executable, "-c", f"from setuptools import build_meta; build_meta.build_sdist({str(out)!r})"],
                ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (archive,) = out.glob("spot_edge-*.tar.gz")
    return archive


def test_the_sdist_holds_the_sources_docs_tests_and_licence(sdist):
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    for needed in ("LICENSE", "pyproject.toml", "README.md", "cpp/CMakeLists.txt", "cpp/include/spot/spot.h",
                   "cpp/src/engine.cpp", "cpp/tests/step_rules.cpp", "cpp/fetch_ort_headers.sh", "docs/cpp-host.md",
                   "tests/conftest.py", "tests/tinymodels.py", "tests/data/noise_vectors.json",
                   "spot/runtime/_libm.c", "spot/runtime/_sampling.c", *(f"spot/assets/{f}/{a}" for f in FOLDERS for a in ASSETS)):
        assert needed in names, needed
    stray = [n for n in names if n.startswith(("cpp/build/", "cpp/third_party/")) or "__pycache__" in n
             or n.endswith((".so", ".pyc"))]
    assert not stray, stray


def test_the_wheel_built_from_the_sdist_holds_the_package_and_its_assets_by_name(sdist, tmp_path):
    with tarfile.open(sdist) as tar:
        tar.extractall(tmp_path / "src", **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    (src,) = (tmp_path / "src").iterdir()
    (src / "spot" / "assets" / "embedded" / "stray.tmp").write_text("x")      # not an asset: stays out
    proc = _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(src),
                 "-w", str(tmp_path / "wheel")], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (wheel,) = (tmp_path / "wheel").glob("spot_edge-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for folder in FOLDERS:
        assets = {n.rsplit("/", 1)[1] for n in names if n.startswith(f"spot/assets/{folder}/")}
        assert assets == set(ASSETS), folder
    assert {"spot/cli/__init__.py", "spot/cli/generate.py", "spot/entry.py", "spot/__main__.py", "spot/runtime/spot.py"} <= names
    assert any(n.endswith("LICENSE") and ".dist-info/" in n for n in names)
    assert not [n for n in names if "__pycache__" in n or n.startswith(("tests/", "cpp/", "docs/"))]
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "spot = spot.entry:spot" in text and "spot-export = spot.entry:spot_export" in text
