"""The README's test command is one a newcomer can live with: the tests marked slow are left out unless --full (the
summary says how many and how to run them), and every skip says why (-rs)."""
from __future__ import annotations

import re
from pathlib import Path

pytest_plugins = "pytester"

ROOT = Path(__file__).resolve().parents[1]
TESTS = """
import pytest

@pytest.mark.slow
def test_slow():
    pass

def test_quick():
    pass

def test_needs_a_toolchain():
    pytest.skip("no C++ toolchain: apt-get install cmake g++")
"""


def suite_settings() -> str:
    """This project's [tool.pytest.ini_options], as pyproject.toml has them."""
    text = (ROOT / "pyproject.toml").read_text()
    return text[text.index("[tool.pytest.ini_options]"):].split("\n[", 1)[0].replace('testpaths = ["tests"]\n', "")


def project(pytester):
    pytester.makeconftest((ROOT / "tests" / "conftest.py").read_text())
    pytester.makepyprojecttoml(suite_settings())
    pytester.makepyfile(test_example=TESTS)


def test_the_default_run_leaves_the_slow_tests_out_and_says_so(pytester):
    project(pytester)
    result = pytester.runpytest("-q")
    result.assert_outcomes(passed=1, skipped=1, deselected=1)
    result.stdout.fnmatch_lines(["*1 slow tests not run (the C++ host, the HTTP servers, Triton): "
                                 "`python3 -m pytest --full` runs everything, as CI does*"])


def test_the_full_run_runs_everything(pytester):
    project(pytester)
    result = pytester.runpytest("-q", "--full")
    result.assert_outcomes(passed=2, skipped=1)
    assert "slow tests not run" not in result.stdout.str()


def test_every_skip_says_why_in_the_summary(pytester):
    project(pytester)
    result = pytester.runpytest("-q")
    assert re.search(r"SKIPPED \[1\] test_example.py:\d+: no C\+\+ toolchain: apt-get install cmake g\+\+",
                     result.stdout.str()), result.stdout.str()
