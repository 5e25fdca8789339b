"""Figures that a command prints, as the README and docs quote them, are checked against the command: a figure written
by hand drifts (the README's Orin NX plan said 13.2 GiB after the plan printed 11.39).

Three forms are found and checked, in README.md and docs/*.md:
- a command line `spot-export ... --plan DEVICE ...` whose comment ends with a total, `# ... (11.39 GiB)`;
- a table row whose first cell is such a command: `| `spot-export ...` | total | verdict | largest context |`;
- prose, listed in PROSE_CLAIMS with the command whose output holds each figure.
"""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

from spot.cli import main as cli

ROOT = Path(__file__).resolve().parents[1]
DOCS = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
PLAN_COMMAND = re.compile(r"spot-export [^#`|\n]*--plan [^#`|\n]*")
COMMENT_TOTAL = re.compile(r"\(([\d.]+ GiB)\)\s*$")
PRINTED_TOTAL = re.compile(r"^\s*total\s+([\d.]+ GiB) of [^:]*: (fits|does NOT fit)$", re.M)
PRINTED_LARGEST = re.compile(r"largest context that fits: (\d+ tokens) at")

# prose that quotes a plan: (doc, the sentence's words, the plan's arguments, what the plan prints for them)
PROSE_CLAIMS = [
    ("docs/benchmarks.md", "71 ms for one\nstate at 2048 tokens, 557 ms for 16 and 2228 ms for 64",
     "sdar-8b-b32 --weights int4 --plan orin-nx-16gb --max-context 2048 --max-nodes 64",
     ("1 |    7.3 GB   0.52 TF      71 ms", "16 |   20.7 GB   8.38 TF     557 ms",
      "64 |   63.5 GB  33.51 TF    2228 ms")),
]


def plan_args(command: str) -> list[str]:
    """The `spot` arguments that print the plan of a documented `spot-export ... --plan` command: `export ...`,
    without --out (which would export after planning)."""
    words = shlex.split(command)
    assert words[0] == "spot-export", command
    args = ["export"]
    rest = iter(words[1:])
    for word in rest:
        if word == "--out":
            next(rest)
        else:
            args.append(word)
    return args


def run_plan(args: list[str]) -> str:
    result = CliRunner().invoke(cli, args)
    assert result.exit_code in (0, 1), f"{shlex.join(args)}:\n{result.output}"     # 1: printed, does not fit
    return result.output


def printed_figures(output: str) -> tuple[str, str, str]:
    """(total, verdict, largest context at the plan's node count) as the plan prints them."""
    total = PRINTED_TOTAL.search(output)
    largest = PRINTED_LARGEST.search(output)
    assert total and largest, output
    return total.group(1), total.group(2), largest.group(1)


def comment_claims() -> list[tuple[str, str, str]]:
    """(doc, command, total) for every plan command line whose comment quotes its total."""
    found = []
    for doc in DOCS:
        for line in doc.read_text().splitlines():
            command, sep, comment = line.partition("#")
            plan = PLAN_COMMAND.search(command)
            total = COMMENT_TOTAL.search(comment)
            if plan and sep and total:
                found.append((doc.name, plan.group(0).strip(), total.group(1)))
    return found


def table_claims() -> list[tuple[str, str, tuple[str, ...]]]:
    """(doc, command, the row's other cells) for every table row whose first cell is a plan command."""
    found = []
    for doc in DOCS:
        for line in doc.read_text().splitlines():
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if line.lstrip().startswith("|") and PLAN_COMMAND.fullmatch(cells[0].strip("`")):
                found.append((doc.name, cells[0].strip("`"), tuple(cells[1:])))
    return found


@pytest.fixture(autouse=True)
def _builtin_configs(tmp_path, monkeypatch):
    """The plans of the built-in SDAR configs, whatever checkpoints this machine's Hugging Face cache holds."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub"))


def test_the_docs_quote_plans_in_each_form():
    """The forms are found (a reworded doc would otherwise leave its figures unchecked without a word)."""
    assert any(doc == "README.md" for doc, _, _ in comment_claims())
    assert len(table_claims()) >= 4


@pytest.mark.parametrize("doc, command, total", comment_claims())
def test_a_commented_total_is_what_the_plan_prints(doc, command, total):
    assert printed_figures(run_plan(plan_args(command)))[0] == total, f"{doc}: {command}"


@pytest.mark.parametrize("doc, command, cells", table_claims())
def test_a_table_row_is_what_the_plan_prints(doc, command, cells):
    assert cells == printed_figures(run_plan(plan_args(command))), f"{doc}: {command}"


@pytest.mark.parametrize("doc, words, command, printed", PROSE_CLAIMS)
def test_prose_figures_are_what_the_plan_prints(doc, words, command, printed):
    assert words in (ROOT / doc).read_text(), f"{doc} no longer says {words!r}: update PROSE_CLAIMS"
    output = run_plan(plan_args("spot-export " + command))
    for line in printed:
        assert line in output, output


def test_plan_args_drop_the_export_folder():
    assert plan_args("spot-export sdar-8b --plan orin-nx-16gb --out sdar-8b-int4 --max-context 8192") == [
        "export", "sdar-8b", "--plan", "orin-nx-16gb", "--max-context", "8192"]
