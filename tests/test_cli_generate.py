"""`spot generate` end to end on a tiny random checkpoint in the real format: output, determinism, user errors."""
from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner

from spot.assets import embedded_model_dir
from spot.cli import main
from spot.errors import SpotError
from spot.tokenizer import load_tokenizer
from tinymodels import CFG, save_tiny_model, save_tiny_tokenizer

@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    bare = save_tiny_model(root / "bare")
    with_tok = root / "tok"
    shutil.copytree(bare, with_tok)
    save_tiny_tokenizer(with_tok)
    return {"bare": str(bare), "tok": str(with_tok), "root": root}


def run(*args):
    return CliRunner().invoke(main, ["generate", *map(str, args)])


def run_json(*args) -> dict:
    result = run(*args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_json_output(model_dirs):
    out = run_json("--model", model_dirs["tok"], "--prompt", "the cat sat", "--max-new-tokens", 9)
    assert {"token_ids", "text", "target_passes", "passes", "seconds", "stopped"} <= set(out)
    assert all(0 <= t < CFG.vocab_size and t not in CFG.stop_ids for t in out["token_ids"])
    assert out["target_passes"] == sum(out["passes"].values()) > 0
    assert set(out["passes"]) == {"prefill", "block", "verify", "store", "fused"}     # zeros too, as spot_cli prints
    assert out["seconds"] > 0
    tok = load_tokenizer(model_dirs["tok"])
    assert out["text"] == tok.decode(out["token_ids"])
    if not out["stopped"]:   # decodes to the block boundary covering prompt + 9, returns 9
        assert len(out["token_ids"]) == 9
        assert out["prompt_len"] + 9 + len(out["overflow_ids"]) == -(-(out["prompt_len"] + 9) // 4) * 4


def test_chat_is_the_default_with_a_template(model_dirs):
    tok = load_tokenizer(model_dirs["tok"])
    chat = run_json("--model", model_dirs["tok"], "--prompt", "the cat", "--max-new-tokens", 4)
    plain = run_json("--model", model_dirs["tok"], "--prompt", "the cat", "--max-new-tokens", 4, "--no-chat")
    assert chat["prompt_len"] == len(tok.chat_prompt_ids("the cat")) > plain["prompt_len"] == len(tok.encode("the cat"))


def test_prompt_ids_without_tokenizer(model_dirs):
    out = run_json("--model", model_dirs["bare"], "--prompt-ids", "1,2,3,4,5", "--max-new-tokens", 6,
                   "--mode", "threshold", "--tau", "0.5", "--block-size", 8)
    assert "text" not in out
    assert out["block_size"] == 8 and out["prompt_len"] == 5


def test_default_depth_fits_a_block_of_4(model_dirs):
    """SDAR's block size is 4: the default tree depth is min(8, B), so `--decoder tree` runs without --depth."""
    out = run_json("--model", model_dirs["bare"], "--prompt-ids", "1,2,3", "--max-new-tokens", 8, "--decoder", "tree")
    assert out["block_size"] == 4 and out["passes"]["verify"] > 0
    result = run("--model", model_dirs["bare"], "--prompt-ids", "1,2,3", "--decoder", "tree", "--depth", 8)
    assert result.exit_code == 2 and "depth must be in 1..4" in result.stderr     # an explicit depth is checked


def test_human_output_is_text_plus_one_stats_line(model_dirs):
    result = run("--model", model_dirs["bare"], "--prompt-ids", "1,2,3", "--max-new-tokens", 5)
    assert result.exit_code == 0, result.output
    ids = result.stdout.split()
    assert ids and all(i.isdigit() for i in ids)
    stats = result.stderr.strip().splitlines()
    assert len(stats) == 1 and "target passes" in stats[0]


def test_seeded_sampling_is_deterministic(model_dirs):
    args = ("--model", model_dirs["bare"], "--prompt-ids", "5,6,7", "--max-new-tokens", 12, "--temperature", 1.0,
            "--top-k", 20, "--top-p", 0.95)
    first = run_json(*args, "--seed", 7)["token_ids"]
    assert run_json(*args, "--seed", 7)["token_ids"] == first
    others = [run_json(*args, "--seed", s)["token_ids"] for s in (8, 9, 10)]
    assert any(o != first for o in others)   # the seed does reach the noise
    greedy = [run_json("--model", model_dirs["bare"], "--prompt-ids", "5,6,7", "--max-new-tokens", 12,
                       "--seed", s)["token_ids"] for s in (1, 2)]
    assert greedy[0] == greedy[1]            # temperature 0 ignores the seed


def unknown_type_dir(model_dirs):
    folder = model_dirs["root"] / "llama"
    if not folder.exists():
        shutil.copytree(model_dirs["bare"], folder)
        cfg = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**cfg, "model_type": "llama"}))
    return str(folder)


ERROR_CASES = {
    "missing folder": (lambda d: ["--model", str(d["root"] / "nope"), "--prompt-ids", "1"], "does not exist"),
    "unknown model_type": (lambda d: ["--model", unknown_type_dir(d), "--prompt-ids", "1"], "model_type 'llama'"),
    "prompt too long": (lambda d: ["--model", d["bare"], "--prompt-ids", ",".join(["1"] * 70)], "limit of 64"),
    "prompt + new tokens too long": (lambda d: ["--model", d["bare"], "--prompt-ids", "1,2",
                                                "--max-new-tokens", 63], "limit of 64"),
    "id out of vocab": (lambda d: ["--model", d["bare"], "--prompt-ids", "1,2,64"], "outside the vocabulary"),
    "negative id": (lambda d: ["--model", d["bare"], "--prompt-ids", "1,-2"], "outside the vocabulary"),
    "mask id in prompt": (lambda d: ["--model", d["bare"], "--prompt-ids", "1,63"], "mask token"),
    "bad id list": (lambda d: ["--model", d["bare"], "--prompt-ids", "1,x"], "'x'"),
    "block size not dividing": (lambda d: ["--model", d["bare"], "--prompt-ids", "1", "--block-size", 3],
                                "does not divide"),
    "block size zero": (lambda d: ["--model", d["bare"], "--prompt-ids", "1", "--block-size", 0], "block size"),
    "negative temperature": (lambda d: ["--model", d["bare"], "--prompt-ids", "1", "--temperature", -0.5],
                             "temperature"),
    "bad tau": (lambda d: ["--model", d["bare"], "--prompt-ids", "1", "--mode", "threshold", "--tau", 1.5], "tau"),
    "bad top-p": (lambda d: ["--model", d["bare"], "--prompt-ids", "1", "--top-p", 0], "top_p"),
    "no new tokens": (lambda d: ["--model", d["bare"], "--prompt-ids", "1", "--max-new-tokens", 0],
                      "max_new_tokens"),
    "text without tokenizer": (lambda d: ["--model", d["bare"], "--prompt", "hello"], "no tokenizer"),
    "no prompt": (lambda d: ["--model", d["bare"]], "exactly one"),
    "missing prompt file": (lambda d: ["--model", d["tok"], "--prompt-file", str(d["root"] / "none.txt")],
                            "cannot read the prompt file"),
    "prompt file not UTF-8": (lambda d: ["--model", d["tok"], "--prompt-file", latin1_file(d)], "not UTF-8"),
    "prompt and prompt file": (lambda d: ["--model", d["tok"], "--prompt", "a", "--prompt-file", latin1_file(d)],
                               "not both"),
    "exported folder on torch": (lambda d: ["--model", exported_like(d), "--backend", "torch", "--prompt-ids", "1"],
                                 "is an exported ONNX folder"),
    # each printed no hint line
    "budget 0x0": (lambda d: ["--model", d["bare"], "--prompt-ids", "1", "--decoder", "tree", "--budget", "0x0"],
                   "--budget takes a number of nodes or auto, got '0x0'"),
    "budget 16x99": (lambda d: ["--model", d["bare"], "--prompt-ids", "1", "--decoder", "tree", "--budget",
                                "16x99"], "--budget takes a number of nodes or auto, got '16x99'"),
    "budget not a number": (lambda d: ["--model", d["bare"], "--prompt-ids", "1", "--budget", "abc"],
                            "--budget takes a number of nodes or auto, got 'abc'"),
    "budget of no nodes": (lambda d: ["--model", d["bare"], "--prompt-ids", "1", "--decoder", "tree", "--budget",
                                      0], "budget must be >= 1 node"),
    "depth deeper than a block": (lambda d: ["--model", d["bare"], "--prompt-ids", "1", "--decoder", "tree",
                                             "--depth", 99], "depth must be in 1..4"),
    "depth 0": (lambda d: ["--model", d["bare"], "--prompt-ids", "1", "--decoder", "tree", "--depth", 0],
                "depth must be in 1..4"),
    "unknown device": (lambda d: ["--model", d["bare"], "--prompt-ids", "1", "--device", "gpu7"],
                       "unknown device 'gpu7'"),
    "prompt not UTF-8": (lambda d: ["--model", d["tok"], "--prompt", "\udcff\udcfe abc"],
                         "--prompt is not valid UTF-8 text: character 0 is the byte 0xff, which is not UTF-8"),
    "prompt with a lone surrogate": (lambda d: ["--model", d["tok"], "--prompt", "abc \ud800"],
                                     "character 4 is a lone surrogate U+D800"),
    "bad backend": (lambda d: ["--model", d["bare"], "--prompt-ids", "1", "--backend", "onnx"],
                    "invalid value for '--backend': 'onnx' is not one of"),
    "unknown option": (lambda d: ["--model", d["bare"], "--prompt-ids", "1", "--max-tokens", 3],
                       "no such option '--max-tokens'"),
    "option without its value": (lambda d: ["--model", d["bare"], "--prompt-ids"],
                                 "option '--prompt-ids' requires an argument"),
}


def exported_like(d) -> str:
    folder = d["root"] / "exported-like"
    if not folder.exists():
        shutil.copytree(d["bare"], folder)
        (folder / "manifest.json").write_text("{}")
    return str(folder)


def latin1_file(d) -> str:
    path = d["root"] / "latin1.txt"
    path.write_bytes("café".encode("latin-1"))
    return str(path)


def test_prompt_file_and_stdin_equal_the_prompt_text(model_dirs):
    text = "the cat sat\non the mat é"
    path = model_dirs["root"] / "prompt.txt"
    path.write_bytes(b"\xef\xbb\xbf" + text.encode("utf-8"))      # a byte-order mark is not part of the prompt
    args = ("--model", model_dirs["tok"], "--max-new-tokens", 6, "--no-chat", "--json")
    want = run_json("--prompt", text, *args[:-1])
    got_file = run_json("--prompt-file", path, *args[:-1])
    got_stdin = json.loads(CliRunner().invoke(main, ["generate", "--prompt-file", "-", *map(str, args)],
                                              input=text.encode("utf-8")).stdout)
    for got in (got_file, got_stdin):
        assert got["token_ids"] == want["token_ids"] and got["prompt_len"] == want["prompt_len"]


@pytest.mark.parametrize("case", list(ERROR_CASES))
def test_user_errors_exit_2_with_one_error_line(model_dirs, case):
    make_args, expected = ERROR_CASES[case]
    result = run(*make_args(model_dirs))
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert isinstance(result.exception, SystemExit)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    assert expected in errors[0], errors[0]
    assert result.stderr.splitlines()[-1].startswith("  hint: "), result.stderr      # every one says what to do
    assert "Traceback" not in result.output and "Usage:" not in result.output
    assert result.stdout == ""


def test_default_model_is_the_embedded_one():
    try:
        folder = embedded_model_dir()
    except SpotError as e:
        assert "spot train-target" in e.hint
        result = CliRunner().invoke(main, ["generate", "--prompt-ids", "1"])
        assert result.exit_code == 2 and "embedded model is not built" in result.stderr
    else:
        assert (folder / "config.json").is_file()


def test_json_mode_is_the_rule_the_decoder_ran(model_dirs):
    """threshold and spot-sets always run the threshold rule, whatever --mode says (it is static by default)."""
    for decoder, mode in (("standard", "static"), ("threshold", "threshold"), ("tree", "static")):
        out = run_json("--model", model_dirs["bare"], "--prompt-ids", "1,2,3", "--max-new-tokens", 4,
                       "--decoder", decoder)
        assert out["mode"] == mode, decoder


def test_an_exported_folder_is_checked_by_its_manifest_first(model_dirs, tmp_path):
    """A missing or edited config.json in an exported folder is a changed export (say so), not a broken checkpoint."""
    from spot.export.export import export_checkpoint
    from spot.export.options import ExportOptions
    from spot.export.presets import resolve_source
    out = export_checkpoint(resolve_source(model_dirs["bare"]), tmp_path / "x", ExportOptions(dtype="fp32",
                                                                                              validate=False))
    (out / "config.json").unlink()
    r = run("--model", out, "--backend", "ort", "--prompt-ids", "1,2", "--max-new-tokens", 4)
    assert r.exit_code == 2 and "config.json is missing from the exported folder" in r.stderr, r.output
