"""What the commands call besides decoding: option lists and budgets parsed, a prompt file read, the streamed text
of `spot generate`, `spot demo`'s text, the outputs of bench and train-drafter checked before the work, the
prompts of traces and calibrate-drafter."""
import errno
import io
import sys
from types import SimpleNamespace

import pytest

from spot.errors import SpotError, number_list_arg, os_error_hint
from spot.runtime.spot import TreeBudget


def test_number_lists_and_tree_budgets_parse_or_name_the_option():
    assert number_list_arg("0, 0.5,1,", "--temperatures") == (0.0, 0.5, 1.0)
    for text, says in (("0,warm", "must be comma-separated numbers, got '0,warm'"),
                       (" , ", "must name at least one number")):
        with pytest.raises(SpotError, match=says) as e:
            number_list_arg(text, "--candidates")
        assert e.value.hint == "e.g. --candidates 0,1"
    from spot.app.tuned_budgets import parse_tree_budgets
    assert parse_tree_budgets("16x8, 64X16") == (TreeBudget(16, 8), TreeBudget(64, 16))
    for text in (",", "16", "16x8x2", "sixteen"):
        with pytest.raises(SpotError, match="budgets must look like 16x8,64x16"):
            parse_tree_budgets(text)


def test_the_auto_budget_note_says_what_and_why():
    from spot.app.tuned_budgets import tuned_note
    from spot.runtime.tuning import MIN_TREE_GAIN
    tuned = {"temperature": 1.0, "record": "/cache/tuning/x.json"}
    assert tuned_note(TreeBudget(16, 8), tuned) == ("budget auto: 16 nodes x depth 8, tuned at temperature 1 "
                                                    "(/cache/tuning/x.json)")
    single = tuned_note(TreeBudget(1, 1), {**tuned, "temperature": 0.5})
    assert single.startswith("budget auto: 1 node, so standard decoding") and f"{MIN_TREE_GAIN:g}x faster" in single
    assert single.endswith("tuned at temperature 0.5 (/cache/tuning/x.json)")


def test_a_prompt_file_is_read_as_utf8_or_refused_by_name(tmp_path, monkeypatch):
    from spot.prompts import read_prompt_file
    (tmp_path / "p.txt").write_bytes("\ufeffdef f():\n    é".encode())
    assert read_prompt_file(str(tmp_path / "p.txt")) == "def f():\n    é"       # the byte-order mark dropped
    monkeypatch.setattr(sys, "stdin", SimpleNamespace(buffer=io.BytesIO(b"from stdin")))
    assert read_prompt_file("-") == "from stdin"
    with pytest.raises(SpotError, match="cannot read the prompt file .*missing") as e:
        read_prompt_file(str(tmp_path / "missing"))
    assert "pass - to read the prompt from standard input" in e.value.hint
    with pytest.raises(SpotError, match="cannot read the prompt file") as e:
        read_prompt_file(str(tmp_path))          # a folder: the hint of its errno
    assert e.value.hint == os_error_hint(OSError(errno.EISDIR, "Is a directory"))
    (tmp_path / "latin1.txt").write_bytes(b"caf\xe9")
    with pytest.raises(SpotError, match="the prompt file .*latin1.txt"):
        read_prompt_file(str(tmp_path / "latin1.txt"))
    monkeypatch.setattr("spot.prompts.PROMPT_FILE_LIMIT", 4)
    with pytest.raises(SpotError, match="larger than 64 MiB"):
        read_prompt_file(str(tmp_path / "p.txt"))


class Chars:
    """A stand-in tokenizer for TextStream: id i is chr(i)."""

    def checked_ids(self, ids, refuse_unknown=True):
        return list(ids)

    def decode(self, ids, mark_unknown=False):
        return "".join(map(chr, ids))


def test_streamed_text_holds_trailing_whitespace_and_drops_it_at_the_end(monkeypatch):
    import spot.tokenizer
    from spot.tokenizer import TrimmedStream
    monkeypatch.setattr(spot.tokenizer, "SpotTokenizer", Chars)
    blocks = ["def f", "():\n  ", "\n", "  x\n\n", "\n"]
    stream = TrimmedStream(Chars())
    printed = [stream.feed([ord(c) for c in b]) for b in blocks] + [stream.end()]
    assert printed == ["def f", "():", "", "\n  \n  x", "", ""]
    assert "".join(printed) == "".join(blocks).rstrip()        # as the whole text is printed
    ids = TrimmedStream(None)         # no tokenizer: the ids, each after a space
    assert [ids.feed([5, 6]), ids.feed([7]), ids.end()] == [" 5 6", " 7", ""]


def demo_result(model="code", identical=True, speedup=0.8, **extra):
    return {"model": model, "about": "some text", "prompt_id": 3, "prompt_file": "os.py", "prompt": "import os\n",
            "temperature": 0.7, "seed": 0, "budget": [16, 8], "identical": identical, "passes_reduction": 2.0,
            "speedup": speedup, "verify_cost": 3.0, "host_cost": 0.5,
            "standard": {"text": "x = 1\n\n", "target_passes": 40},
            "spot": {"text": "x = 1\n" if identical else "y = 2", "target_passes": 20, "verify_passes": 10}, **extra}


def test_demo_text_shows_the_prompt_the_output_and_the_passes():
    from spot.app.demo import demo_model_text, demo_summary
    text = demo_model_text(demo_result())
    assert text == ("\n=== code model (some text) ===\nheld-out prompt 3 (os.py), from a line start:\nimport os\n\n"
                    "--- decoded at temperature 0.7, seed 0 (standard decoding and SPOT, identical):\nx = 1\n"
                    "--- target passes: standard 40, SPOT 20 (16-node trees, depth 8): 2.00x fewer")
    wrong = demo_model_text(demo_result("arithmetic", identical=False, true_answer=4, answer=5, answer_right=False))
    assert "held-out problem 3:\nimport os\n---" in wrong and "(SPOT's differs!)" in wrong
    assert "\n--- SPOT:\ny = 2\n" in wrong and "--- answer 5: wrong (true answer 4)" in wrong
    summary = demo_summary([demo_result(), demo_result("arithmetic", speedup=1.5, true_answer=4, answer=4,
                                                       answer_right=True)])
    assert "code        identical  -       40 -> 20" in summary and "arithmetic  identical  right" in summary
    assert "why the wall clock" in summary and "arithmetic: 3.0" not in summary
    assert "\n    code: 3.0 standard passes' time in the target + 0.5 on the host" in summary
    assert max(len(line) for line in summary.splitlines()) <= 120
    counted = demo_model_text(demo_result("arithmetic", true_answer=4, answer=4, answer_right=True,
                                          heldout_answers={"right": 270, "problems": 300}))
    assert "--- answer 4: right (the model answers 270 of its 300 held-out problems right, 90%: greedy" in counted
    assert "why the wall clock" not in demo_summary([demo_result(speedup=1.2)])
    assert "outputs DIFFERENT: a bug" in demo_summary([demo_result(identical=False)])


def test_demo_budget_fills_in_the_first_models_default():
    from spot.assets import MODELS
    from spot.app.demo import demo_budget
    assert demo_budget((), None, None) is None          # each model its own
    assert demo_budget(("code",), None, 3) == (MODELS["code"].demo_budget[0], 3)
    assert demo_budget((), 6, None) == (6, MODELS["arithmetic"].demo_budget[1])     # arithmetic is shown first


def test_bench_report_paths_and_plots_are_checked_first(tmp_path, monkeypatch):
    from spot.app.bench_run import check_report_dir, check_report_files
    from spot.app.plots import PLOT_FILES, plot_choice
    with pytest.raises(SpotError, match="--report is empty"):
        check_report_dir("")
    (tmp_path / "file").write_text("x")
    with pytest.raises(SpotError, match="--report"):
        check_report_dir(str(tmp_path / "file"))
    (tmp_path / "rep").mkdir()
    (tmp_path / "rep" / PLOT_FILES[0]).mkdir()        # a folder where a plot goes
    check_report_files(tmp_path / "rep", plots=False)
    with pytest.raises(SpotError, match="is a folder, expected a file name"):
        check_report_files(tmp_path / "rep", plots=True)
    monkeypatch.setattr("spot.app.plots.can_plot", lambda: False)
    assert plot_choice(None) == (False, True) and plot_choice(False) == (False, False)
    with pytest.raises(SpotError, match="--plots needs matplotlib"):
        plot_choice(True)
    monkeypatch.setattr("spot.app.plots.can_plot", lambda: True)
    assert plot_choice(None) == (True, False) and plot_choice(True) == (True, False)


def test_bench_prompts_are_cut_and_checked_against_the_engine(tmp_path):
    from spot.app.bench_run import bench_prompts, default_budgets
    engine = SimpleNamespace(block_size=4, max_context=16, config=SimpleNamespace(vocab_size=32, mask_token_id=31))
    path = tmp_path / "p.jsonl"
    path.write_text('{"id": "a", "ids": [1, 2, 3, 4, 5, 6]}\n{"id": "b", "ids": [7, 8]}\n{"ids": [9]}\n')
    prompts, where = bench_prompts(path, tmp_path, None, 2, 3, engine, 4)
    assert where == path and [(p.id, p.ids) for p in prompts] == [("a", [4, 5, 6]), ("b", [7, 8])]
    own = tmp_path / "heldout_prompts.jsonl"       # no file named: the model folder's own held-out prompts
    own.write_text('{"id": "own", "ids": [1, 2]}\n')
    assert bench_prompts(None, tmp_path, None, 5, 8, engine, 4)[1] == own
    with pytest.raises(SpotError, match="prompt 'a' of .*p.jsonl: "):
        bench_prompts(path, tmp_path, None, 1, 8, engine, 64)        # no room for 64 new tokens
    assert default_budgets(engine) == (TreeBudget(16, 4),)
    assert default_budgets(SimpleNamespace(block_size=32)) == (TreeBudget(16, 8),)


def test_training_prompts_come_from_the_file_or_the_corpus(tmp_path):
    from spot.training.traces import training_prompts
    path = tmp_path / "p.jsonl"
    path.write_text('{"ids": [1, 2, 3]}\n')
    assert training_prompts(path, 5, 0, None, tmp_path) == [[1, 2, 3]]
    with pytest.raises(SpotError, match=f"--corpus-prompts needs the model's tokenizer, and {tmp_path} has none"):
        training_prompts(None, 5, 0, None, tmp_path)


def test_train_drafter_output_is_refused_before_the_training(tmp_path):
    from spot.training.drafter import drafter_out_folder
    traces = SimpleNamespace(meta={"model_dir": str(tmp_path / "target")})
    assert drafter_out_folder(None, traces) == str(tmp_path / "target")
    with pytest.raises(SpotError, match="the traces do not name their target folder"):
        drafter_out_folder(None, SimpleNamespace(meta={}))
    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "drafter.onnx").write_bytes(b"")
    with pytest.raises(SpotError, match="already has a drafter") as e:
        drafter_out_folder(None, traces)
    assert "--overwrite" in e.value.hint
    # --overwrite replaces only a pair spot wrote: drafter.json a spot drafter descriptor vouching for drafter.onnx
    with pytest.raises(SpotError, match="are not a drafter spot wrote"):
        drafter_out_folder(None, traces, overwrite=True)
    import hashlib
    import json
    (tmp_path / "target" / "drafter.json").write_text(json.dumps(
        {"format": "spot-drafter", "format_version": 1, "onnx_sha256": hashlib.sha256(b"").hexdigest()}))
    assert drafter_out_folder(None, traces, overwrite=True) == str(tmp_path / "target")
    (tmp_path / "target" / "drafter.onnx").write_bytes(b"the user's")       # a changed drafter.onnx: not spot's
    with pytest.raises(SpotError, match="are not a drafter spot wrote"):
        drafter_out_folder(None, traces, overwrite=True)
    (tmp_path / "file").write_text("x")
    with pytest.raises(SpotError, match="is a file, expected a folder"):
        drafter_out_folder(tmp_path / "file" / "d", traces)


def test_save_tunings_records_every_temperature(tmp_path, monkeypatch):
    import json

    from spot.app.tuned_budgets import save_tunings
    monkeypatch.setenv("SPOT_CACHE", str(tmp_path))
    path = save_tunings({"model": "x"}, [{"temperature": t, "choice": {"nodes": 4, "depth": 3}} for t in (0.0, 1.0)])
    assert sorted(json.loads(path.read_text())["by_temperature"]) == ["0", "1"]


def test_every_command_that_opens_a_model_picks_its_backend_from_the_model():
    """--backend is left to spot.app.models.resolve_backend (ort for an exported folder, torch for a checkpoint) in every
    command that opens a model: `spot calibrate-drafter` and `spot traces` defaulted to torch where the others ran
    the same folder on ONNX Runtime. (`spot serve` and `spot triton-repo` take exported folders only: ort.)"""
    from spot.cli import main
    defaults = {name: param.default for name, cmd in main.commands.items() for param in cmd.params
                if param.name == "backend"}
    assert {"generate", "bench", "tune", "traces", "calibrate-drafter"} <= set(defaults)
    assert {name: d for name, d in defaults.items() if d is not None} == {"serve": "ort", "triton-repo": "ort"}


def test_benchmarks_read_the_held_out_prompts_of_the_model_they_are_given(tmp_path):
    """A folder's own heldout_prompts.jsonl (the arithmetic model's problems), the default model's only for a folder
    without any; and no benchmark or command builds that path from the default model on its own
    (benchmarks/stale_token_rank.py read the code model's prompts whatever --model said)."""
    import re
    from pathlib import Path

    from spot.assets import embedded_model_dir
    from spot.prompts import HELDOUT_PROMPTS, heldout_prompts_path
    assert heldout_prompts_path(embedded_model_dir("arithmetic")) == embedded_model_dir("arithmetic") / HELDOUT_PROMPTS
    assert heldout_prompts_path(tmp_path) == embedded_model_dir() / HELDOUT_PROMPTS
    root = Path(__file__).resolve().parents[1]
    pattern = re.compile(r"embedded_model_dir\(\)\)?\s*/\s*\"heldout_prompts\.jsonl\"")
    found = [str(p.relative_to(root)) for folder in ("spot", "benchmarks", "scripts")
             for p in sorted((root / folder).rglob("*.py")) if pattern.search(p.read_text())]
    assert found == [], found
