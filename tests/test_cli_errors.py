"""Every exit-2 error of the command line is one `error:` line and one `hint:` line, never a traceback nor click's
usage block: a bad value of each typed option of every command, an option without its value, an unknown option or
command, a missing argument, and a prompt of bytes that are not UTF-8 (the real command line, not click's runner)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from spot.cli import main

ROOT = Path(__file__).resolve().parents[1]


def bad_value(param: click.Parameter) -> str | None:
    """A value click itself refuses for `param`, or None when it takes any text."""
    t = param.type
    if isinstance(t, click.Choice):
        return "no-such-choice"
    if isinstance(t, (click.IntRange, click.FloatRange)) and t.min is not None:
        return str(t.min - 1)
    if isinstance(t, (click.types.IntParamType, click.types.FloatParamType)):
        return "abc"
    if isinstance(t, click.Path) and not t.dir_okay:
        return str(ROOT)            # a folder where a file goes
    if isinstance(t, click.Path) and not t.file_okay:
        return str(ROOT / "README.md")       # a file where a folder goes
    return None


def cases() -> list[tuple[str, list[str]]]:
    out = [("no such command", ["nope"]), ("group option", ["--nope"])]
    for name, command in sorted(main.commands.items()):
        required = [p for p in command.params if p.required]
        filler = []         # the required options a bad value is given beside (arguments left out: also an error)
        for p in required:
            if isinstance(p, click.Option):
                filler += [p.opts[0], "x.npz"]
        out.append((f"{name}: unknown option", [name, *filler, "--no-such-option"]))
        for p in command.params:
            if not isinstance(p, click.Option) or p.is_flag or p.name in ("help", "version"):
                continue
            out.append((f"{name} {p.opts[0]}: no value", [name, *filler, p.opts[0]]))
            value = bad_value(p)
            if value is not None:
                out.append((f"{name} {p.opts[0]} {value}", [name, *filler, p.opts[0], value]))
        if any(isinstance(p, click.Argument) for p in command.params):
            out.append((f"{name}: missing argument", [name, *filler]))
    return out


@pytest.mark.parametrize("what,args", cases(), ids=[c[0] for c in cases()])
def test_every_usage_error_is_one_line_and_a_hint(what, args):
    result = CliRunner().invoke(main, args)
    lines = result.output.splitlines()
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert len(lines) == 2 and lines[0].startswith("error: ") and lines[1].startswith("  hint: "), result.output
    assert "Traceback" not in result.output and "Usage:" not in result.output


def test_a_prompt_of_bytes_that_are_not_utf8_is_one_line(tmp_path):
    """`spot generate --prompt $'\\xff\\xfe abc'` ended in a TypeError traceback from the tokenizer."""
    from tinymodels import save_tiny_model, save_tiny_tokenizer
    folder = save_tiny_model(tmp_path / "m")
    save_tiny_tokenizer(folder)
    proc = subprocess.run([sys.executable, "-m", "spot", "generate", "--model", str(folder).encode(), "--prompt",
                           b"\xff\xfe abc", "--max-new-tokens", "2"], cwd=ROOT, capture_output=True)
    err = proc.stderr.decode()
    assert proc.returncode == 2 and "Traceback" not in err, err
    assert err.splitlines() == ["error: --prompt is not valid UTF-8 text: character 0 is the byte 0xff, which is "
                                "not UTF-8", "  hint: pass UTF-8 text (a UTF-8 locale or terminal), a UTF-8 file "
                                "with --prompt-file, or token ids with --prompt-ids"], err


def test_a_path_of_bytes_that_are_not_utf8_is_named(tmp_path):
    """ONNX Runtime and the tokenizer library take UTF-8 paths only: a folder named with other bytes ended in their
    errors, with hints about tokenizers versions and retraining the drafter."""
    import os
    import shutil

    from spot.export.export import export_checkpoint
    from spot.export.options import ExportOptions
    from spot.export.presets import resolve_source
    from tinymodels import save_tiny_model, save_tiny_tokenizer
    save_tiny_tokenizer(save_tiny_model(tmp_path / "m"))
    folder = Path(os.fsdecode(bytes(tmp_path) + b"/caf\xe9"))
    shutil.copytree(export_checkpoint(resolve_source(str(tmp_path / "m")), tmp_path / "onnx",
                                      ExportOptions(dtype="fp32", validate=False)), folder)
    result = CliRunner().invoke(main, ["generate", "--model", str(folder), "--prompt", "the cat"])
    lines = result.output.splitlines()
    assert result.exit_code == 2 and len(lines) == 2, result.output
    assert f"character {len(str(folder)) - 1} is the byte 0xe9, which is not UTF-8" in lines[0]
    assert lines[1] == "  hint: rename it: ONNX Runtime and the tokenizer library open UTF-8 paths only"
    # what needs neither reads it, and prints the path as the bytes it is (printing it was a UnicodeEncodeError)
    result = CliRunner().invoke(main, ["verify", str(folder)])
    assert result.exit_code == 0 and result.stdout_bytes.startswith(b"ok: " + bytes(folder) + b": "), result.output


# -- hostile input: one line and a hint, never a traceback; a closed pipe ends quietly -----------------------------
@pytest.fixture(scope="module")
def tiny_export(tmp_path_factory) -> Path:
    from spot.export.export import export_checkpoint
    from spot.export.options import ExportOptions
    from spot.export.presets import resolve_source
    from tinymodels import save_tiny_model
    tmp = tmp_path_factory.mktemp("hostile")
    return export_checkpoint(resolve_source(str(save_tiny_model(tmp / "m"))), tmp / "onnx",
                             ExportOptions(dtype="fp32", validate=False))


def spot(*args, stdin=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "spot", *map(str, args)], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, input=stdin)


def one_error_line(proc: subprocess.CompletedProcess, *says: str) -> None:
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert len(lines) == 2 and lines[0].startswith("error: ") and lines[1].startswith("  hint: "), proc.stderr
    assert all(s in lines[0] for s in says), lines[0]


def edited_copy(folder: Path, out: Path, edit) -> Path:
    import json
    import shutil
    shutil.copytree(folder, out)
    manifest = json.loads((out / "manifest.json").read_text())
    text = edit(manifest)
    (out / "manifest.json").write_text(text if isinstance(text, str) else json.dumps(manifest))
    return out


@pytest.mark.parametrize("name, edit, says", [
    ("layers", lambda m: m["model"].update(num_hidden_layers=1_000_000_000),
     "num_hidden_layers is 1000000000, expected an integer in 1..1024"),
    ("deep", lambda m: "[" * 100_000, "is not valid JSON (nesting deeper than 256)"),
    ("dtype", lambda m: m.update(dtype=["fp32"]), "dtype is ['fp32'], expected one of fp32, fp16"),
    ("stops", lambda m: m.update(stop_ids=[[0]]), "stop_ids[0] is [0], expected an integer"),
    ("vocab", lambda m: m["model"].update(vocab_size=2048.5), "vocab_size is 2048.5, expected an integer"),
    ("none", lambda m: m["model"].update(num_hidden_layers=0), "num_hidden_layers is 0, expected an integer in 1.."),
    ("minus", lambda m: m["model"].update(num_hidden_layers=-3), "num_hidden_layers is -3"),
])
def test_a_hostile_manifest_is_one_line(tiny_export, tmp_path, name, edit, says):
    """A manifest number drove an allocation without end (num_hidden_layers 1e9), 100,000 `[` a RecursionError
    traceback, a field of the wrong JSON type a TypeError deep in the runtime: each is one line naming the field."""
    folder = edited_copy(tiny_export, tmp_path / name, edit)
    one_error_line(spot("generate", "--model", folder, "--prompt-ids", "1,2,3", "--decoder", "spot",
                        "--max-new-tokens", "4"), "manifest.json", says)


def test_a_deeply_nested_tuning_record_is_one_line(tiny_export):
    """`--budget auto` read the tuning record with json.loads: 100,000 `[` was a RecursionError traceback."""
    import re
    args = ("generate", "--model", tiny_export, "--prompt-ids", "1,2,3", "--decoder", "tree", "--budget", "auto")
    missing = spot(*args)
    one_error_line(missing, "no tuned budget")
    record = Path(re.search(r"looked for (\S+\.json)\)", missing.stderr).group(1))
    record.parent.mkdir(parents=True, exist_ok=True)
    try:
        record.write_text("[" * 100_000)
        one_error_line(spot(*args), str(record), "is not valid JSON (nesting deeper than 256)")
        record.write_text('{"format": "spot-tuning", "format_version": 2, "key": {}, "by_temperature": '
                          '{"0": {"temperature": 0, "nodes": 1e12, "depth": 4}}}')
        one_error_line(spot(*args), "by_temperature.0.nodes is 1000000000000.0, expected an integer in 1..4096")
    finally:
        record.unlink()


@pytest.mark.parametrize("line, says", [
    ("[" * 100_000, "prompts.jsonl:2 is not valid JSON (nesting deeper than 256)"),
    ('{"ids": [[0]]}', "prompts.jsonl:2: ids[0] is [0], expected an integer"),
    ('{"ids": [1e400]}', "prompts.jsonl:2 is not valid JSON (number overflow"),
    ('{"ids": [1, 2], "answer": 2.5}', "prompts.jsonl:2: answer is 2.5, expected null or an integer"),
    ('{"ids": [1], "ids": [2]}', "prompts.jsonl:2 is not valid JSON (duplicate key 'ids')"),
])
def test_a_hostile_prompt_file_is_one_line(tiny_export, tmp_path, line, says):
    """`spot bench --prompts` read each line with json.loads: 100,000 `[` was a RecursionError traceback."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"ids": [1, 2, 3]}\n' + line + "\n")
    one_error_line(spot("bench", "--model", tiny_export, "--prompts", prompts, "--decoders", "standard",
                        "--temperatures", "0", "--report", tmp_path / "report", "--no-plots"), says)


@pytest.mark.parametrize("args", [
    ["generate", "--model", "MODEL", "--prompt-ids", "1,2,3", "--max-new-tokens", "48", "--stream"],
    ["generate", "--model", "MODEL", "--prompt-ids", "1,2,3", "--max-new-tokens", "8", "--json"],
    ["verify", "MODEL"], ["--help"]], ids=["generate --stream", "generate --json", "verify", "--help"])
def test_a_closed_output_pipe_ends_quietly(tiny_export, args):
    """`spot generate --stream ... | head -1`: the reader closing the pipe ended in `error: Broken pipe` with a hint
    about paths and disk space (exit 2). Now every command that prints ends quietly: nothing on stderr, exit 141 (a
    shell's for SIGPIPE). The reader here is gone before the first line, so that the write surely meets it."""
    args = [str(tiny_export) if a == "MODEL" else a for a in args]
    proc = subprocess.Popen([sys.executable, "-m", "spot", *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=600) == 141 and err == "", err
