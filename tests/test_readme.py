"""What the README and docs tell a new user to run holds in a checkout: the examples' outputs stay out of `git status`,
spot is installed the way it can be (it is not on a package index), and CI runs the README's test command."""
from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
OUTPUT_OPTION = re.compile(r"(?:--out|--report)\s+(\S+)")
# writes into the tree on purpose (a shipped model, a golden file) or a placeholder to fill in
INTENDED = re.compile(r"^(/|~|\$|spot/assets/|tests/data/)|^[A-Z_]+$|[A-Z]{3,}")


def example_outputs() -> list[tuple[str, str]]:
    """(doc, path) for every relative output path a documented command writes (--out, --report)."""
    found = []
    for doc in DOCS:
        for line in doc.read_text().splitlines():
            for path in OUTPUT_OPTION.findall(line):
                path = path.strip("`'\"[]")
                if path and not INTENDED.search(path):
                    found.append((doc.name, path))
    return sorted(set(found))


def test_the_readme_examples_write_outputs():
    """The scan finds the README's examples (a reworded README would otherwise leave its outputs unchecked)."""
    readme = {path for doc, path in example_outputs() if doc == "README.md"}
    assert {"bench-report", "code-fp32-onnx", "triton-repo"} <= readme, readme


@pytest.mark.parametrize("doc, path", example_outputs())
def test_example_outputs_stay_out_of_git_status(doc, path):
    """Running an example in the checkout leaves nothing untracked (.gitignore names what the examples write)."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: .gitignore is not in force")
    ignored = subprocess.run(["git", "check-ignore", "--no-index", "-q", path + "/"], cwd=ROOT)
    ignored_file = subprocess.run(["git", "check-ignore", "--no-index", "-q", path], cwd=ROOT)
    assert 0 in (ignored.returncode, ignored_file.returncode), \
        f"{doc}'s example writes {path}, which `git status` would show: add it to .gitignore"


# `pip install spot-edge` (or --no-deps spot-edge) asks a package index for a distribution that is not published there
INDEX_INSTALL = re.compile(r"pip install\b[^\n`\"]*?(?<![\w/.\[-])spot-edge(?![\w\[-])")


def test_no_doc_installs_spot_from_a_package_index():
    texts = {doc.name: doc.read_text() for doc in DOCS}
    texts.update({str(p.relative_to(ROOT)): p.read_text() for p in (ROOT / "spot").rglob("*.py")})
    found = [f"{name}: {m.group(0)}" for name, text in texts.items() for m in INDEX_INSTALL.finditer(text)]
    assert not found, found


def test_the_index_install_pattern():
    for bad in ("pip install spot-edge", "pip install --no-deps spot-edge and",
                "pip install spot-edge && tritonserver"):
        assert INDEX_INSTALL.search(bad), bad
    for fine in ("pip install -e '.[serve]'", "pip install dist/spot_edge-0.1.0-*.whl",
                 "a venv with `spot-edge[triton]`", "pip install 'spot-edge[plots]'"):
        assert not INDEX_INSTALL.search(fine), fine


def readme_test_command() -> str:
    """The command of the README's second line, the one that runs the tests."""
    lines = [line for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("pip install")]
    assert lines[1].endswith("# the tests"), lines[1]
    return lines[1].split("#")[0].split("&&")[-1].strip()


def test_ci_runs_the_readmes_test_command_in_full():
    """CI runs the README's test command with the flag the README documents as the full run; the slow tests are not
    left out of CI."""
    command = readme_test_command()
    assert command == "python3 -m pytest -q"
    full = command + " --full"
    assert f"`{full}`" in (ROOT / "README.md").read_text()
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert full in ci and command not in ci
