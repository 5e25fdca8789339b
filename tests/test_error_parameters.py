"""The library's errors name its parameters (`depth=4`), never a command line's flags; the CLI prints each as the
option that sets it (--depth 4), the HTTP server as the request field (spot.errors.PARAMETER, SpotError.renamed)."""
from __future__ import annotations

import ast
import re
from pathlib import Path
from types import SimpleNamespace

import click
import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from spot.cli import PARAMETER_FLAGS, as_flag, main
from spot.errors import PARAMETER, SpotError
from spot.runtime.spot import TreeBudget

QUOTE = "\""
REPO = Path(__file__).resolve().parent.parent
LIBRARY = ("spot/runtime", "spot/engines", "spot/folder")
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
# a command the text tells the user to run, in backticks (`spot-export --max-nodes N`, `pip install ...`): its flags
# are that tool's, not the library's parameters
COMMAND = re.compile(r"`(?:spot|spot-export|pip|python3) [^`]*`")
# flags a library text may name outside a backticked command, and why
ALLOWED = {
    ("spot/engines/tensorrt_engine.py", "--ort-matmulnbits"):
        "what the folder was exported with, and re-exporting without it: spot-export's option, not a parameter of "
        "the engine",
    ("spot/engines/tensorrt_engine.py", "--tensorrt"):
        "check_before_export / build_after_export run spot-export's --tensorrt step (only spot-export calls them)",
    ("spot/engines/tensorrt_engine.py", "--backend"):
        "build_after_export's note, printed by spot-export --tensorrt auto (a progress line, not an error)",
    ("spot/runtime/libm.py", "--force-reinstall"): "pip's option, in the command the warning gives",
    ("spot/runtime/libm.py", "--no-deps"): "pip's option, in the command the warning gives",
}


def library_texts():
    """(path, text) of every string a library module holds outside its docstrings (an f-string's fields as {})."""
    for package in LIBRARY:
        for path in sorted((REPO / package).glob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                          if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                          and node.body and isinstance(node.body[0], ast.Expr)}
            parts = set()
            for node in ast.walk(tree):
                if isinstance(node, ast.JoinedStr):
                    parts.update(id(v) for v in node.values)
            rel = str(path.relative_to(REPO))
            for node in ast.walk(tree):
                if id(node) in docstrings or id(node) in parts:
                    continue
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    yield rel, node.value
                elif isinstance(node, ast.JoinedStr):
                    yield rel, "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)


TEXTS = list(library_texts())


def test_library_texts_name_no_flags():
    """Every --flag in a string of spot/runtime, spot/engines or spot/folder is part of a command the text tells the
    user to run, or ALLOWED with its reason."""
    found = {(path, flag) for path, text in TEXTS for flag in FLAG.findall(COMMAND.sub("", text))}
    assert found - set(ALLOWED) == set(), "name the library's parameter (`name` / `name=value`) instead"
    assert set(ALLOWED) - found == set(), "an allowed flag is gone: drop it from ALLOWED"


def test_every_parameter_the_library_names_is_an_option_of_the_cli():
    """Each `parameter` the library's texts name has its flag in PARAMETER_FLAGS, and each flag there is an option of
    a `spot` command: the CLI's table neither misses a name nor points at an option that does not exist."""
    named = {m.group(1) for _, text in TEXTS for m in PARAMETER.finditer(text)}
    assert named - set(PARAMETER_FLAGS) == set()
    options = {opt for command in main.commands.values() for param in command.params
               if isinstance(param, click.Option) for opt in param.opts + param.secondary_opts}
    assert set(PARAMETER_FLAGS.values()) - options == set()


@given(st.text().filter(lambda t: "`" not in t))
def test_text_without_parameters_is_kept(text):
    assert str(SpotError(text, text).renamed(as_flag)) == str(SpotError(text, text))


@given(st.sampled_from(sorted(PARAMETER_FLAGS)), st.one_of(st.none(), st.integers(0, 10**6).map(str),
                                                            st.sampled_from(['"host"', '"device"', '"cuda"'])))
def test_a_parameter_is_printed_as_its_flag(name, value):
    text = f"use `{name}`" if value is None else f"use `{name}={value}` or less"
    want = (f"use {PARAMETER_FLAGS[name]}" if value is None else
            f"use {PARAMETER_FLAGS[name]} {value.strip(QUOTE)} or less")
    renamed = SpotError(text, text).renamed(as_flag)
    assert renamed.message == renamed.hint == want
    assert SpotError("use `not_a_parameter=3`").renamed(as_flag).message == "use `not_a_parameter=3`"


def test_a_library_error_names_the_parameter():
    """A library user reads TreeBudget's field (it said "CLI: --depth"); a request's JSON field on the server."""
    engine = SimpleNamespace(block_size=4, max_nodes=64, sampler_depth=None)
    with pytest.raises(SpotError, match=r"depth must be in 1\.\.4 \(the block size\), got 99") as e:
        TreeBudget(16, 99).check(engine)
    assert "`depth=4`" in e.value.hint and "--" not in str(e.value)
    pytest.importorskip("fastapi")
    from spot.serve.http_errors import spot_error
    assert 'e.g. "depth": 4' in spot_error(e.value).message
    with pytest.raises(SpotError) as e:
        TreeBudget(0, 4).check(engine)
    assert "`nodes=16`" in e.value.hint and 'e.g. "budget": 16' in spot_error(e.value).message


def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


# parameter -> (the command whose library error names it, what its error lines say), on the tiny model: "ckpt" is
# the checkpoint (torch), "onnx" its export (ort)
CLI_CASES = {
    "depth": (lambda m: ["generate", "--model", m["ckpt"], "--prompt-ids", "1", "--decoder", "tree", "--depth", 99],
              ["error: depth must be in 1..4 (the block size), got 99", "e.g. --depth 4"]),
    "nodes": (lambda m: ["generate", "--model", m["ckpt"], "--prompt-ids", "1", "--decoder", "tree", "--budget", 0],
              ["error: budget must be >= 1 node, got 0", "e.g. --budget 16"]),
    "top_k": (lambda m: ["generate", "--model", m["onnx"], "--prompt-ids", "1", "--top-k", -1],
              ["top_k must be in", "hint: e.g. --top-k 40"]),
    "top_p": (lambda m: ["generate", "--model", m["onnx"], "--prompt-ids", "1", "--top-p", 2],
              ["top_p must be in (0, 1], got 2.0", "hint: e.g. --top-p 0.9"]),
    "max_new_tokens": (lambda m: ["generate", "--model", m["onnx"], "--prompt-ids", "1", "--max-new-tokens", 0],
                       ["max_new_tokens must be >= 1, got 0", "hint: e.g. --max-new-tokens 64"]),
    "mode": (lambda m: ["generate", "--model", m["onnx"], "--prompt-ids", "1", "--mode", "threshold", "--tau", 1.5],
             ["tau must be in [0, 1), got 1.5", "the static rule, --mode static"]),
    "sampler": (lambda m: ["generate", "--model", m["ckpt"], "--backend", "torch", "--sampler", "device",
                           "--prompt-ids", "1"],
                ["error: --sampler device needs the ort backend", "got --backend torch",
                 "hint: use --backend ort, or --sampler host"]),
    "kv_cache": (lambda m: ["generate", "--model", m["ckpt"], "--backend", "torch", "--kv-cache", "device",
                            "--prompt-ids", "1"],
                 ["error: --kv-cache device needs the ort backend", "hint: use --backend ort, or --kv-cache host"]),
    "backend": (lambda m: ["generate", "--model", m["onnx"], "--backend", "torch", "--prompt-ids", "1"],
                ["is an exported ONNX folder, and --backend torch reads", "hint: use --backend ort"]),
    "device": (lambda m: ["generate", "--model", m["onnx"], "--device", "gpu7", "--prompt-ids", "1"],
               ["unknown device 'gpu7' for the ort backend", "hint: --device cpu runs anywhere"]),
    "out": (lambda m: ["export", m["ckpt"], "--out", m["mine"], "--overwrite", "--no-validate", "--quiet"],
            ["error: --out", "is not a spot export", "or choose another --out"]),
    "overwrite": (lambda m: ["export", m["ckpt"], "--out", m["mine"], "--overwrite", "--no-validate", "--quiet"],
                  ["hint: --overwrite replaces only an earlier spot export"]),
}


@pytest.fixture(scope="module")
def models(tiny_ckpt, tiny_onnx, tmp_path_factory):
    mine = tmp_path_factory.mktemp("mine")
    (mine / "notes.txt").write_text("the user's")
    return {"ckpt": tiny_ckpt, "onnx": tiny_onnx, "mine": mine}


@pytest.mark.parametrize("parameter", sorted(CLI_CASES))
def test_the_cli_names_the_flag_of_each_parameter(parameter, models):
    """`spot generate --depth 99`: the library's error names `depth=4`, the user reads --depth 4."""
    args, says = CLI_CASES[parameter]
    r = cli(*args(models))
    assert r.exit_code == 2, r.output
    for words in says:
        assert words in r.stderr, r.stderr
    assert PARAMETER_FLAGS[parameter] in r.stderr and not PARAMETER.search(r.stderr), r.stderr
