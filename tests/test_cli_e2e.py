"""The product surface end to end on a tiny model: `spot demo`, `spot bench` (report files), and the documented
error paths (one `error:` line, a hint, exit 2, no traceback)."""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import sys
import time
from dataclasses import replace
from pathlib import Path
from unittest.mock import ANY

import pytest
from click.testing import CliRunner

import spot.assets
from spot.cli import main
from spot.training.drafter import DrafterTrainSettings, train_drafter
from spot.training.traces import TracePlan, collect_traces
from spot.engines.torch_engine import TorchEngine
from spot.checkpoint import Checkpoint
from spot.reference.model import SDARModel
from spot.runtime.step import STATIC, THRESHOLD
from tinymodels import LINES, save_tiny_model, save_tiny_tokenizer


@pytest.fixture(scope="module")
def embedded(tmp_path_factory):
    """A tiny stand-in for the embedded model: weights, tokenizer, held-out prompts and a trained drafter."""
    folder = tmp_path_factory.mktemp("emb") / "embedded"
    save_tiny_model(folder)
    save_tiny_tokenizer(folder)
    (folder / "heldout_prompts.jsonl").write_text(
        "\n".join(json.dumps({"id": i, "file": f"f{i}.py", "text": t}) for i, t in enumerate(LINES)) + "\n")
    engine = TorchEngine(SDARModel.from_checkpoint(Checkpoint(folder)))
    plan = TracePlan(temperatures=(0.0, 1.0), rules=(STATIC, THRESHOLD), tau=0.9, seeds=1, max_new_tokens=8, depth=3)
    traces = collect_traces(engine, [[5, 6, 7], [8, 9], [10, 11, 12, 13], [20, 21]], plan)
    train_drafter(traces, folder, DrafterTrainSettings(epochs=1, batch_size=64, log_every=1000), log=lambda _: None)
    return folder


@pytest.fixture()
def as_embedded(embedded, monkeypatch, tmp_path):
    monkeypatch.setattr(spot.assets, "embedded_model_dir", lambda name="code": embedded)
    monkeypatch.setenv("SPOT_CACHE", str(tmp_path / "cache"))
    return embedded


def run(*args):
    return CliRunner().invoke(main, list(args))


def test_concurrent_first_runs_export_the_demo_cache_once(tmp_path, monkeypatch):
    """Workers starting together on a fresh cache each exported it, and one that looked in between another's swap
    and its stamp exported again and swapped the folder from under it (which then failed writing its stamp)."""
    import threading

    import spot.app.demo as demo_mod
    import spot.export.export as export_mod
    from spot.app.demo import embedded_export_dir, exported_embedded
    from spot.errors import SpotError
    monkeypatch.setenv("SPOT_CACHE", str(tmp_path / "cache"))
    exports = []

    def slow_export(source, out, options, progress):
        exports.append(out)
        time.sleep(0.5)
        out.mkdir(parents=True)
        (out / "manifest.json").write_text("{}")

    def load(folder, *args, **kwargs):
        if not (Path(folder) / "manifest.json").is_file():
            raise SpotError(f"{folder} has no manifest")
    monkeypatch.setattr(export_mod, "export_checkpoint", slow_export)
    monkeypatch.setattr(demo_mod, "load_manifest", load)       # the name the demo checks its cache with
    got, errors = [], []

    said, start = [], threading.Barrier(3)

    def worker():
        start.wait()
        try:
            got.append(exported_embedded(said.append))
        except Exception as e:      # noqa: BLE001 - reported below
            errors.append(e)
    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and got == [embedded_export_dir()] * 3 and len(exports) == 1
    assert any("waiting for another process exporting" in line for line in said)      # said, not silent
    assert (embedded_export_dir().parent / f".{embedded_export_dir().name}.stamp").is_file()


def test_demo_shows_identical_outputs_and_caches_the_export(as_embedded, tmp_path):
    first = run("demo", "--max-new-tokens", "8", "--budget", "6", "--depth", "3")
    assert first.exit_code == 0, first.output
    # both models, arithmetic first, each with its identical outputs and passes; then the summary and its reason
    assert first.output.index("=== arithmetic model") < first.output.index("=== code model")
    assert first.output.count("(standard decoding and SPOT, identical)") == 2, first.output
    assert "=== what SPOT bought ===" in first.output and "fewer passes" in first.output
    assert "exporting the arithmetic model" in first.output and "exporting the code model" in first.output
    assert "why the wall clock" in first.output
    # one line says an export (a cold demo printed a line per tensor, 47 for the code model), then the demo's own;
    # off a terminal a progress bar's update is printed only after 30 s without a line (a slow machine)
    said = first.stderr[:first.stderr.index("decoding with standard")].splitlines()
    assert "exporting the arithmetic model" in said[0] and not any("tensor" in line for line in said), said
    second = run("demo", "--model", "code", "--max-new-tokens", "8", "--temperature", "1.0", "--seed", "3",
                 "--depth", "3")
    assert second.exit_code == 0 and "(standard decoding and SPOT, identical)" in second.output, second.output
    assert "=== arithmetic model" not in second.output
    assert "exporting the code model" not in second.output          # the cached export is reused
    # a damaged cache is detected by its manifest and exported again, never used
    cached = tmp_path / "cache" / "code-fp32-onnx"
    (cached / "config.json").write_text((cached / "config.json").read_text() + " ")
    third = run("demo", "--max-new-tokens", "4", "--depth", "2")
    assert third.exit_code == 0 and "exporting again" in third.output


def test_progress_bars_are_one_line(monkeypatch, capsys):
    """Progress lines starting with "\\r" update a bar: in place on a terminal (cut to its width, cleared by the
    next line or "\\r" alone); elsewhere dropped unless 30 s passed without a line."""
    import sys

    import spot.cli.shared as cli_mod
    clock = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)
    say = cli_mod.stderr_progress()
    for i in range(47):
        say(f"\r  weights: tensor {i + 1}/47")
    clock[0] += 31
    say("\r  weights: tensor 47/47")
    say("  weights: 47 tensors")
    assert capsys.readouterr().err == "weights: tensor 47/47\n  weights: 47 tensors\n"
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    monkeypatch.setattr("shutil.get_terminal_size", lambda: os.terminal_size((12, 24)))
    say = cli_mod.stderr_progress()
    say("\r  a long step that does not fit")
    say("\r  step 2")
    say("done")
    say("\r  bar")
    say("\r")
    assert capsys.readouterr().err == ("\r\x1b[K  a long st\r\x1b[K  step 2\r\x1b[Kdone\n\r\x1b[K  bar"
                                       "\r\x1b[K")
    assert cli_mod.stderr_progress(quiet=True)("x") is None and capsys.readouterr().err == ""


def test_demo_reports_where_the_time_goes(as_embedded):
    from spot.app.demo import run_demo
    r, = run_demo(["code"], max_new_tokens=8, budget=(6, 3))
    assert r["model"] == "code" and r["identical"] and r["spot"]["verify_passes"] >= 1
    assert r["verify_cost"] > 0 and r["host_cost"] > 0
    assert r["spot"]["target_ms_per_verify"] > 0 and r["standard"]["verify_passes"] == 0


BLOCKER = '''import sys
class _Blocked:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "onnx", "safetensors", "scipy", "matplotlib"):
            raise ModuleNotFoundError(f"No module named {name!r} (a runtime-only install)", name=name)
        return None
sys.meta_path.insert(0, _Blocked())
'''


def test_the_ort_runtime_needs_neither_torch_nor_onnx(embedded, tmp_path):
    """An edge install has numpy, onnxruntime, click and tokenizers only: an exported folder decodes (every ORT
    option), benches and verifies with torch, onnx, safetensors, scipy and matplotlib unimportable."""
    import os
    import subprocess
    import sys

    from spot.export.export import export_checkpoint
    from spot.export.options import ExportOptions
    from spot.export.presets import resolve_source
    folder = export_checkpoint(resolve_source(str(embedded)), tmp_path / "onnx", ExportOptions(dtype="fp32"))
    (tmp_path / "blocker").mkdir()
    (tmp_path / "blocker" / "sitecustomize.py").write_text(BLOCKER)
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "blocker")}

    def cli(*args):
        return subprocess.run([sys.executable, "-c", "from spot.cli import main; main()", *args], env=env,
                              capture_output=True, text=True, timeout=300)
    blocked = subprocess.run([sys.executable, "-c", "import torch"], env=env, capture_output=True, text=True)
    assert blocked.returncode != 0 and "runtime-only install" in blocked.stderr    # the blocker works
    for options in (["--decoder", "spot"], ["--decoder", "spot-sets", "--tau", "0.5", "--kv-cache", "device",
                                            "--sampler", "device", "--temperature", "1"]):
        proc = cli("generate", "--model", str(folder), "--backend", "ort", "--prompt", "the cat",
                   "--max-new-tokens", "6", "--budget", "6", "--depth", "3", "--json", *options)
        assert proc.returncode == 0, proc.stderr
        out = json.loads(proc.stdout)
        assert out["passes"]["verify"] >= 1 and out["placement"]["kv_cache"] == ("device" if "device" in options
                                                                                  else "host")
    proc = cli("bench", "--model", str(folder), "--backend", "ort", "--limit", "1", "--temperatures", "0",
               "--budgets", "4x2", "--max-new-tokens", "4", "--prompt-tokens", "8", "--no-plots", "--report",
               str(tmp_path / "report"))
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "report" / "bench.json").is_file()
    assert cli("verify", str(folder)).returncode == 0
    # without --model: the default (code) model's export in the cache, decoded even when it is stale (exporting it
    # again needs the export extra)
    shutil.copytree(folder, tmp_path / "cache" / "code-fp32-onnx")
    env["SPOT_CACHE"] = str(tmp_path / "cache")
    proc = cli("generate", "--prompt", "the cat", "--max-new-tokens", "4", "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout)["backend"] == "ort", proc.stderr
    assert "exporting it again needs the onnx package" in proc.stderr
    for args, says in ((["demo", "--model", "code"], "`spot demo` needs the onnx package"),
                       (["export", str(embedded), "--out", str(tmp_path / "x")], "`spot export` needs the onnx package"),
                       (["spot-export", str(embedded), "--out", str(tmp_path / "x")],
                        "`spot-export` needs the onnx package"),
                       (["generate", "--model", str(embedded), "--prompt", "a"], "the torch backend needs torch")):
        proc = cli(*args)      # what needs an extra says which, in one line
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert says in proc.stderr and "spot-edge[export]" in proc.stderr, proc.stderr


def test_bench_writes_json_markdown_and_plots(as_embedded, tmp_path):
    pytest.importorskip("matplotlib")
    report = tmp_path / "report"
    r = run("bench", "--limit", "3", "--temperatures", "0,1", "--budgets", "6x3", "--max-new-tokens", "8",
            "--tune", "--record-noisy", "--report", str(report),
            "--compare-drafter", f"again={as_embedded / 'drafter.onnx'}")
    assert r.exit_code == 0, r.output
    result = json.loads((report / "bench.json").read_text())
    variants = {row["variant"] for row in result["rows"]}
    assert {"standard", "threshold", "spot@6x3", "spot-sets@6x3", "chain@4x3+indep", "spot[again]@6x3",
            "spot-sets[again]@6x3", "chain-sets@4x3", "tree-sets@6x3"} <= variants     # a chain: depth + 1 nodes
    by = {(row["variant"], row["temperature"]): row for row in result["rows"]}
    for t in (0.0, 1.0):     # SPOT-Sets' training-free baselines: the threshold rule, judged against `threshold`
        sets_tree, tree = by[("tree-sets@6x3", t)], by[("tree@6x3", t)]
        assert sets_tree["decoder"] == "tree" and sets_tree["rule"] == "threshold" and tree["rule"] == "static"
        assert by[("spot-sets@6x3", t)]["rule"] == "threshold"
        assert sets_tree["passes_reduction"] == pytest.approx(by[("threshold", t)]["passes_per_token"]
                                                              / sets_tree["passes_per_token"])
    for name in ("spot", "spot-sets"):      # the same drafter again: the same trees, the same passes
        for t in (0.0, 1.0):
            again = by[(f"{name}[again]@6x3", t)]
            assert again["decoder"] == name and again["drafter"] == "again"
            assert again["target_passes"] == by[(f"{name}@6x3", t)]["target_passes"]
    for row in result["rows"]:
        if row["identical_share"] is not None:
            assert row["identical_share"] == 1.0, row["variant"]
    assert "| variant |" in (report / "bench.md").read_text()
    drafters = result["drafters"]          # which drafter ran, and its held-out accuracy from training
    manifest = json.loads((as_embedded / "drafter.json").read_text())
    top1 = manifest["accuracy"]["top1"]
    assert set(drafters) == {"", "again"} and drafters[""]["graph"] == manifest["graph"]
    assert drafters[""]["heldout_top1"] == {"all": top1["model"], "baseline": top1["baseline"],
                                            "staleness_1": top1["staleness_1"]["model"], "examples": top1["n"]}
    assert f"graph {manifest['graph']}" in (report / "bench.md").read_text()
    assert f"held-out next-commit top-1 {top1['model']} (staleness 1: {top1['staleness_1']['model']}; baseline " \
           f"{top1['baseline']})" in (report / "bench.md").read_text()
    assert result["host"]["libm"] in ("ext", "numpy") and result["host"]["sampling"] in ("c", "numpy")
    assert "Measured on" in (report / "bench.md").read_text()
    # the report's first line names the backend, device and placement; its versions are of what ran (a torch run's
    # report named ONNX Runtime's version alone)
    assert (report / "bench.md").read_text().startswith("# spot bench: ort backend on cpu (sampler host, KV cache "
                                                        "host), block size ")
    assert r.stdout.startswith("spot bench: ort backend on cpu") and "onnxruntime" in result["host"]
    torch_run = run("bench", "--backend", "torch", "--decoders", "standard,tree", "--limit", "1", "--temperatures",
                    "0", "--budgets", "4x2", "--max-new-tokens", "4", "--prompt-tokens", "8", "--no-plots",
                    "--report", str(tmp_path / "torch-report"))
    assert torch_run.exit_code == 0, torch_run.output
    md = (tmp_path / "torch-report" / "bench.md").read_text()
    assert md.startswith("# spot bench: torch backend on cpu, block size ") and "onnxruntime" not in md
    assert f"torch {__import__('torch').__version__}" in md.splitlines()[-1]
    for png in ("passes_and_speed.png", "acceptance_by_depth.png", "latency_vs_nodes.png"):
        assert (report / png).stat().st_size > 1000
    tune = result["tune"]
    assert set(tune["by_temperature"]) == {"0", "1"} and isinstance(tune["within_5_percent"], bool)
    assert tune["tuning_prompts"] == "corpus train split"       # never the held-out prompts it is judged on
    for t, tuned in tune["by_temperature"].items():     # per temperature: a choice, checked beside standard
        n, d = tuned["choice"]["nodes"], tuned["choice"]["depth"]
        at_choice = tuned["at_choice"]
        assert n >= 1 and at_choice["budget"] == f"{n}x{d}" and at_choice["decoder"] == "spot"
        assert at_choice["prompts"] == 3 and set(at_choice["tokens_per_s_ratio_to_standard"]) == {t}
        assert at_choice["identical_share"] == {t: 1.0}
        if n == 1:   # no speculation: exactly standard decoding's passes
            assert at_choice["passes_reduction"] == {t: 1.0}
    # bench --tune records its choices as spot tune does: --budget auto decodes with them
    auto = run("generate", "--prompt-ids", "5,6,7", "--max-new-tokens", "4", "--decoder", "spot", "--budget", "auto",
               "--temperature", "1", "--json")
    assert auto.exit_code == 0, auto.output
    chosen = tune["by_temperature"]["1"]["choice"]
    assert json.loads(auto.stdout)["budget"] == {"nodes": chosen["nodes"], "depth": chosen["depth"],
                                                 "tuned": {"temperature": 1.0, "record": ANY}}



def test_generate_json_names_the_prompt_ids_stop_ids_and_the_budget_it_verified_with(as_embedded):
    """What a C++ host needs to repeat a request (spot_cli --prompt-ids / --stop-ids), and a chain's budget as it
    verifies (depth + 1 nodes; the JSON said --budget's 16)."""
    base = ("generate", "--prompt-ids", "5, 6,7", "--max-new-tokens", "12", "--json")
    free = json.loads(run(*base, "--stop-ids", "").stdout)
    assert free["prompt_ids"] == [5, 6, 7] and not free["stopped"] and len(free["token_ids"]) >= 12
    stop = free["token_ids"][3]
    cut = run(*base, "--stop-ids", f"{stop}")
    assert cut.exit_code == 0, cut.output
    cut = json.loads(cut.stdout)
    assert cut["stopped"] and cut["token_ids"] == free["token_ids"][:free["token_ids"].index(stop)]
    bad = run(*base, "--stop-ids", "1,x")
    assert bad.exit_code == 2 and "--stop-ids takes comma-separated integers, got 'x'" in bad.output, bad.output
    chain = json.loads(run(*base, "--decoder", "chain", "--depth", "3").stdout)
    assert chain["budget"] == {"nodes": 4, "depth": 3, "tuned": None} and max(chain["nodes_per_verify"]) <= 4
    tree = json.loads(run(*base, "--decoder", "tree", "--budget", "6").stdout)
    assert tree["budget"]["nodes"] == 6 and tree["token_ids"] == free["token_ids"]


def test_bench_rows_always_have_their_baselines_and_a_mismatch_never_reads_100_percent():
    """--decoders spot-sets without threshold (or spot without standard) still gets the ratios and the identity
    check (the baseline runs anyway); a baseline row is not judged against itself; one mismatch in 300 is shown."""
    from spot.app.bench_run import BenchConfig, Variant, identical_cell, variants
    from spot.runtime.spot import TreeBudget
    cfg = BenchConfig(decoders=("spot-sets", "chain"), temperatures=(0.0,), seeds=(0,), budgets=(TreeBudget(4, 3),),
                      max_new_tokens=8, tau=0.9, independent_noise_ablation=False)
    rows = variants(cfg)
    assert rows[:2] == [Variant("standard", "standard"), Variant("threshold", "threshold")]
    assert {v.baseline for v in rows} == {"standard", "threshold"}
    assert variants(replace(cfg, decoders=("tree",)))[0] == Variant("standard", "standard")
    assert identical_cell({"identical_cases": [300, 300]}) == "100%"
    assert identical_cell({"identical_cases": [299, 300]}) == "99.6% (299/300)"
    assert identical_cell({"identical_cases": [2999, 3000]}) == "99.9% (2999/3000)"
    assert identical_cell({"identical_share": None}) == ""


def test_an_embedded_models_name_works_wherever_a_model_is_named(embedded, monkeypatch, tmp_path):
    """`arithmetic` and `code` (alias `embedded`) name the shipped models in spot-export, --model (torch: the
    checkpoint; ort: the export `spot demo` caches) and spot bench; two stand-ins with different weights tell them
    apart."""
    arithmetic = tmp_path / "arithmetic"
    shutil.copytree(embedded, arithmetic)
    save_tiny_model(arithmetic, seed=5)
    folders = {"code": embedded, "arithmetic": arithmetic}
    monkeypatch.setattr(spot.assets, "embedded_model_dir", lambda name="code": folders[spot.assets.embedded_name(name)])
    monkeypatch.setenv("SPOT_CACHE", str(tmp_path / "cache"))
    gen = ["--prompt-ids", "5,6,7", "--max-new-tokens", "8", "--decoder", "standard", "--json"]

    def ids(*args):
        r = run("generate", *args, *gen)
        assert r.exit_code == 0, r.output
        return json.loads(r.stdout)["token_ids"]
    by_name = {name: ids("--model", name, "--backend", "torch") for name in ("arithmetic", "code", "embedded")}
    assert by_name["arithmetic"] == ids("--model", str(arithmetic), "--backend", "torch")
    assert by_name["code"] == by_name["embedded"] == ids("--model", str(embedded), "--backend", "torch")
    assert by_name["arithmetic"] != by_name["code"]
    # ort: the first run exports the named model into the cache (as without --model), later runs reuse it
    first_ort = run("generate", "--model", "arithmetic", "--backend", "ort", *gen)
    assert first_ort.exit_code == 0 and "exporting the arithmetic model" in first_ort.stderr, first_ort.output
    assert json.loads(first_ort.stdout)["token_ids"] == by_name["arithmetic"]
    assert (tmp_path / "cache" / ".arithmetic-fp32-onnx.stamp").is_file()
    exported = run("spot-export", "arithmetic", "--out", str(tmp_path / "arithmetic-onnx"), "--quiet")
    assert exported.exit_code == 0, exported.output
    assert ids("--model", str(tmp_path / "arithmetic-onnx"), "--backend", "ort") == by_name["arithmetic"]
    report = tmp_path / "report"
    bench = run("bench", "--model", "arithmetic", "--backend", "torch", "--limit", "1", "--decoders", "standard",
                "--temperatures", "0", "--max-new-tokens", "4", "--no-plots", "--report", str(report))
    assert bench.exit_code == 0, bench.output
    assert json.loads((report / "bench.json").read_text())["config"]["model"] == str(arithmetic)
    typo = run("generate", "--model", "arithmtic", *gen)       # a misspelt name: the hint lists the names
    assert typo.exit_code == 2 and "model folder arithmtic does not exist" in typo.stderr
    assert "or an embedded model's name (arithmetic, code, embedded)" in typo.stderr


def test_without_model_the_embedded_model_runs_on_ort_exported_once(as_embedded, tmp_path):
    """Without --model (and --backend) spot generate ran the embedded checkpoint on torch (4.5-31 s for the README's
    first example, against 1.2-2.3 s on ONNX Runtime), and --backend ort said to run `spot demo` first. Now ONNX Runtime
    is the default where it is installed: the first run exports the embedded model (one progress line), later runs
    reuse that export, a stale one is exported again, and the tokens are the checkpoint's on torch."""
    args = ("generate", "--prompt-ids", "5,6,7", "--max-new-tokens", "4", "--json")
    first = run(*args)
    assert first.exit_code == 0, first.output
    said = first.stderr.splitlines()
    assert "exporting the code model" in said[0] and not any("tensor" in line for line in said), said
    assert json.loads(first.stdout)["backend"] == "ort"
    again = run(*args[:1], "--backend", "ort", *args[1:])
    assert again.exit_code == 0 and again.stderr == "", again.stderr           # the export is reused
    stamp = tmp_path / "cache" / ".code-fp32-onnx.stamp"     # beside the folder: not in it
    stamp.write_text("made by an older spot")
    stale = run(*args)
    assert stale.exit_code == 0 and "stale or damaged: exporting again" in stale.stderr
    assert json.loads(stale.stdout)["token_ids"] == json.loads(first.stdout)["token_ids"]
    torch_run = run(*args[:1], "--backend", "torch", *args[1:])
    assert json.loads(torch_run.stdout)["backend"] == "torch"
    assert json.loads(first.stdout)["token_ids"] == json.loads(torch_run.stdout)["token_ids"]


def test_bench_plots_follow_matplotlib(as_embedded, tmp_path, monkeypatch):
    """Without matplotlib (the README's install has no plots extra) the bench ran, then failed at the plots without
    bench.json: now the report is written without plots, and an explicit --plots is refused before decoding."""
    for name in ("matplotlib", "matplotlib.pyplot"):     # not installed, or installed and broken: import fails
        monkeypatch.setitem(sys.modules, name, None)
    args = ["bench", "--limit", "1", "--decoders", "standard", "--temperatures", "0", "--max-new-tokens", "4"]
    refused = run(*args, "--plots", "--report", str(tmp_path / "r1"))
    assert refused.exit_code == 2 and "--plots needs matplotlib" in refused.stderr
    assert "[1/1]" not in refused.stderr and not (tmp_path / "r1").exists()
    (tmp_path / "r2").mkdir()
    plot = b"a previous run's plot"         # removed: the previous bench.json lists it with its sha256
    (tmp_path / "r2" / "passes_and_speed.png").write_bytes(plot)
    (tmp_path / "r2" / "bench.json").write_text(json.dumps(
        {"files": {"passes_and_speed.png": hashlib.sha256(plot).hexdigest()}}))
    (tmp_path / "r2" / "acceptance_by_depth.png").write_bytes(b"not listed: the user's")     # kept, said
    r = run(*args, "--report", str(tmp_path / "r2"))
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in (tmp_path / "r2").iterdir()) == ["acceptance_by_depth.png", "bench.json",
                                                                    "bench.md"]
    assert "acceptance_by_depth.png is not from this run" in r.stderr
    assert "no plots: pip install 'spot-edge[plots]'" in r.stderr
    from spot.app.bench_run import write_report
    from spot.errors import SpotError
    with pytest.raises(SpotError, match="plots need matplotlib"):      # plotting fails: the measurements stay
        write_report(json.loads((tmp_path / "r2" / "bench.json").read_text()), tmp_path / "r3", plots=True)
    assert (tmp_path / "r3" / "bench.json").is_file()


def test_an_export_for_another_block_size_leaves_the_checkpoints_drafter_out(as_embedded, tmp_path):
    """spot-export --block-size 8 of a checkpoint whose drafter was trained for blocks of 4 copied it: every spot
    decode and spot tune on the export then failed on it (tune after its whole latency sweep)."""
    r = run("export", str(as_embedded), "--block-size", "8", "--dtype", "fp32", "--no-validate", "--tensorrt", "no",
            "--out", str(tmp_path / "b8"))
    assert r.exit_code == 0, r.output
    assert "the checkpoint's drafter was trained for blocks of 4, this export decodes blocks of 8: not copied" \
        in r.output
    assert not (tmp_path / "b8" / "drafter.onnx").exists() and not (tmp_path / "b8" / "drafter.json").exists()
    assert "drafter" not in json.loads((tmp_path / "b8" / "manifest.json").read_text())["graphs"]
    assert run("verify", str(tmp_path / "b8")).exit_code == 0
    same = run("export", str(as_embedded), "--dtype", "fp32", "--no-validate", "--tensorrt", "no", "--out",
               str(tmp_path / "b4"))
    assert same.exit_code == 0 and (tmp_path / "b4" / "drafter.onnx").is_file()

ERRORS = [
    (["bench", "--compare-drafter", "nopath"], "NAME=PATH"),
    # bench refuses before it decodes (or opens the model): each of these used to surface mid-run or never
    (["bench", "--model", "/nonexistent", "--budgets", ","], "budgets must look like 16x8,64x16"),
    (["bench", "--model", "/nonexistent", "--temperatures", "0,-1"], "temperature"),
    (["bench", "--model", "/nonexistent", "--seeds", "0,-1"], "seed"),
    (["bench", "--model", "/nonexistent", "--report", ""], "--report is empty"),
    (["bench", "--model", "/nonexistent", "--compare-drafter", "a=x", "--compare-drafter", "a=y"], "names 'a' twice"),
    (["bench", "--model", "/nonexistent", "--decoders", "standard,tree", "--compare-drafter", "a=x"],
     "neither spot nor spot-sets"),
    (["generate", "--model", "/nonexistent/model", "--prompt-ids", "1,2"], "does not exist"),
    (["generate", "--prompt-ids", "1,2", "--decoder", "spot", "--drafter", "/nonexistent/d.onnx"], "does not exist"),
    (["generate", "--prompt-ids", "1,2", "--decoder", "tree", "--budget", "0"], "budget must be >= 1"),
    (["generate", "--prompt-ids", "1,2", "--decoder", "tree", "--depth", "9"], "depth must be in 1..4"),
    (["generate", "--prompt-ids", "1,2", "--temperature", "-1"], "temperature"),
    # a bad --tau is named before the drafter (or the weights) is looked for
    (["generate", "--prompt-ids", "1,2", "--decoder", "spot-sets", "--tau", "5", "--drafter", "/nonexistent"],
     "tau must be in [0, 1), got 5"),
    (["bench", "--decoders", "standard,medusa"], "unknown decoder"),
    (["bench", "--budgets", "sixteen"], "budgets must look like"),
    (["bench", "--prompts", "/nonexistent.jsonl", "--decoders", "standard"], "does not exist"),
    (["export", "/nonexistent/ckpt"], ""),
    (["verify", "/nonexistent/folder"], ""),
    (["calibrate-drafter", "--budget", "16x8,64x16"], "takes one tree budget"),
    (["calibrate-drafter", "--candidates", "1,0"], "expected a number > 0"),
    (["calibrate-drafter", "--drafter", "/nonexistent/d"], "does not exist"),
    (["calibrate-drafter", "--runner-up-weights", "0,2"], "expected a number in [0, 1]"),
    (["calibrate-drafter", "--shape-budgets", "4x2,4x4"], "--shape-budgets: one budget per node count"),
    (["calibrate-drafter", "--shape-budgets", "4x9"], "--shape-budgets 4x9: depth must be in 1..4"),
    (["calibrate-drafter", "--branches", "0,2"], "--branches: got [0, 2], expected integers in 1..64"),
    (["calibrate-drafter", "--temperatures", "0,1e-9"],
     "--temperatures: temperature must be 0 or a finite number >= 1e-06, got 1e-09"),
    (["tune", "--limit", "0"], "--limit must be >= 1"),
    (["bench", "--decoders", ","], "--decoders names no decoder"),
    (["demo", "--prompt-index", "-1"], "--prompt-index must be in 0.."),
]


def test_bench_defaults_fit_a_block_of_4_and_reports_are_readable(as_embedded, tmp_path):
    """The default budget is 16x8 capped at the block size (the stand-in's B = 4, SDAR's too), and the reports
    are written readable (0666 less the umask), not as mkstemp's 0600."""
    import os
    import stat
    report = tmp_path / "r"
    r = run("bench", "--limit", "1", "--temperatures", "0,0,-0", "--decoders", "standard,tree,tree",
            "--max-new-tokens", "8", "--no-plots", "--report", str(report))
    assert r.exit_code == 0, r.output
    result = json.loads((report / "bench.json").read_text())
    assert {row["variant"] for row in result["rows"]} == {"standard", "tree@16x4"}
    assert len(result["rows"]) == 2          # duplicate decoders and temperatures (0, -0) run once
    tree = next(row for row in result["rows"] if row["variant"] == "tree@16x4")
    assert len(tree["acceptance_by_depth"]) == 4        # every depth of the budget, reached or not
    umask = os.umask(0)
    os.umask(umask)
    for name in ("bench.json", "bench.md"):
        assert stat.S_IMODE((report / name).stat().st_mode) == 0o666 & ~umask


def test_prompt_files_are_read_as_json_lines(tmp_path):
    """JSONL lines end at \\n (and \\r\\n) only: a text holding U+2028 / U+0085 (json.dumps(ensure_ascii=False)
    writes them raw) is one record; a byte-order mark is dropped; ids that are booleans, or ids beside a text, are
    refused with the line."""
    from spot.assets import embedded_model_dir
    from spot.prompts import load_prompts
    from spot.errors import SpotError
    from spot.tokenizer import load_tokenizer
    tokenizer = load_tokenizer(embedded_model_dir())
    text = "a = 1\u2028b = 2\x85c"
    path = tmp_path / "p.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + (json.dumps({"id": "t", "text": text}, ensure_ascii=False) + "\r\n"
                                          + json.dumps({"ids": [5, 6]}) + "\r\n\r\n").encode())
    prompts = load_prompts(path, tokenizer)
    assert [p.id for p in prompts] == ["t", "1"] and prompts[0].ids == tokenizer.encode(text)
    assert prompts[1].ids == [5, 6]
    for line, says in (('{"ids": [1, true]}', r"ids\[1\] is True, expected an integer"),
                       ('{"ids": [1], "text": "x"}', "both")):
        path.write_text('{"ids": [1]}\n' + line + "\n")
        with pytest.raises(SpotError, match=f"p.jsonl:2.*{says}"):
            load_prompts(path, tokenizer)


def test_bench_names_a_bad_prompt_and_a_report_path_before_decoding_and_records_what_it_measured(as_embedded,
                                                                                                tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "ok", "ids": [5, 6, 7]}\n{"id": "bad", "ids": [5, 299]}\n')
    r = run("bench", "--prompts", str(prompts), "--decoders", "standard", "--max-new-tokens", "8", "--report",
            str(tmp_path / "r"))
    assert r.exit_code == 2 and "prompt 'bad' of" in r.output and "id 299 is outside" in r.output, r.output
    assert "standard" not in r.stderr.split("error:")[0]             # nothing decoded first
    (tmp_path / "r2" / "bench.md").mkdir(parents=True)
    r = run("bench", "--prompts", str(prompts), "--limit", "1", "--report", str(tmp_path / "r2"))
    assert r.exit_code == 2 and "bench.md is a folder" in r.output, r.output
    (tmp_path / "r3" / "passes_and_speed.png").mkdir(parents=True)      # a plot's name: refused only with plots
    r = run("bench", "--prompts", str(prompts), "--limit", "1", "--plots", "--report", str(tmp_path / "r3"))
    assert r.exit_code == 2 and "passes_and_speed.png is a folder" in r.output, r.output
    r = run("bench", "--prompts", str(prompts), "--limit", "1", "--decoders", "standard", "--temperatures", "0",
            "--max-new-tokens", "4", "--no-plots", "--report", str(tmp_path / "r3"))
    assert r.exit_code == 0, r.output
    config = json.loads((tmp_path / "r3" / "bench.json").read_text())["config"]
    assert config["prompts_file"] == str(prompts) and config["prompts"] == 1 and config["prompt_tokens"] == 128
    assert config["model"] and len(config["model_sha256"]) == 64


@pytest.mark.parametrize("body, says", [
    ("raise AttributeError('_ARRAY_API not found')", "installed but could not be imported: _ARRAY_API not found"),
    ("import numpy.core._not_there", "installed but could not be imported"),
    ("raise ModuleNotFoundError('gone', name='onnxruntime')", "needs onnxruntime, which is not installed"),
])
def test_an_unimportable_onnxruntime_is_one_clear_line_wherever_it_is_first_needed(tmp_path, body, says):
    """An onnxruntime built for numpy 1.x beside numpy 2 fails inside its import: `spot verify` (the drafter's
    session) printed a traceback and the ort backend said "not installed"; every graph now loads it through one
    function."""
    import os
    import subprocess
    import sys
    (tmp_path / "onnxruntime").mkdir()
    (tmp_path / "onnxruntime" / "__init__.py").write_text(body + "\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    for code in ("from spot.ortlib import load_onnxruntime; load_onnxruntime()",
                 # the shipped drafter's session (what `spot verify` opened with a bare import)
                 "from spot.assets import embedded_model_dir; from spot.runtime.drafter import load_drafter; "
                 "load_drafter(embedded_model_dir())"):
        proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode != 0 and says in proc.stderr and "spot.errors.SpotError" in proc.stderr, proc.stderr


def test_versions_and_python_dash_m():
    """`spot --version`, `spot-export --version` and `python -m spot` (the same CLI as the console script)."""
    import subprocess
    import sys

    from spot import __version__
    assert run("--version").output.strip().endswith(f"version {__version__}")
    assert run("spot-export", "--version").output.strip() == f"spot-export, version {__version__}"
    proc = subprocess.run([sys.executable, "-m", "spot", "generate", "--help"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and "--decoder" in proc.stdout, proc.stderr


def test_json_reports_a_budget_only_for_decoders_with_verify_rounds(as_embedded):
    for decoder, budget in (("threshold", None), ("tree", {"nodes": 6, "depth": 2, "tuned": None})):
        r = run("generate", "--prompt-ids", "1,2", "--decoder", decoder, "--budget", "6", "--depth", "2",
                "--max-new-tokens", "4", "--json")
        assert r.exit_code == 0 and json.loads(r.stdout)["budget"] == budget, r.output


@pytest.mark.parametrize("args,message", ERRORS, ids=[" ".join(a[:2]) + f"-{i}" for i, (a, _) in enumerate(ERRORS)])
def test_user_errors_are_one_clear_line(as_embedded, args, message):
    r = run(*args)
    assert r.exit_code == 2, r.output
    errors = [line for line in r.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and message in errors[0], r.output
    assert "Traceback" not in r.output


def test_traces_refuse_a_bad_temperature_before_decoding(as_embedded, tmp_path):
    """A temperature the sampler refuses was found when the loop reached it, after decoding every combination
    before it (and nothing was written)."""
    r = run("traces", "--corpus-prompts", "1", "--temperatures", "0,1e-9", "--rules", "static", "--max-new-tokens",
            "4", "--out", str(tmp_path / "t.npz"))
    assert r.exit_code == 2 and "temperature must be 0 or a finite number >= 1e-06, got 1e-09" in r.output, r.output
    assert "trace 1" not in r.output and not (tmp_path / "t.npz").exists()


def test_mismatched_drafter_is_refused(as_embedded, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(as_embedded, other)
    cfg = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**cfg, "block_size": 8}))
    r = run("generate", "--model", str(other), "--prompt-ids", "1,2", "--decoder", "spot")
    assert r.exit_code == 2 and "block size" in r.output


def test_tuning_prompts_come_from_the_corpus_train_split():
    """The tuner measures acceptance on training text, never on the held-out prompts a benchmark judges it on."""
    from spot.app.bench_run import tuning_prompts
    from spot.prompts import Prompt
    from spot.tokenizer import load_tokenizer
    from spot.training import corpus
    tokenizer = load_tokenizer(spot.assets.embedded_model_dir())      # the shipped byte-level BPE: decodes exactly
    prompts, source = tuning_prompts(tokenizer, [], n=3)
    assert source == "corpus train split" and len(prompts) == 3
    train, _ = corpus.split_corpus()     # (held-out files may share a line or two with train files: codec tables)
    for p in prompts:
        assert 64 <= len(p.ids) <= 128
        assert any(tokenizer.decode(p.ids) in f.text for f in train)
    short, _ = tuning_prompts(tokenizer, [], n=3, max_tokens=20)        # cut to what the engine's context holds
    assert [q.ids for q in short] == [q.ids[-20:] for q in prompts]
    fallback = [Prompt("a", [1, 2, 3]), Prompt("b", [4, 5]), Prompt("c", [6])]
    prompts, source = tuning_prompts(None, fallback, n=2)
    assert prompts == fallback[:2] and "no tokenizer" in source


def test_every_command_has_help_with_examples():
    """The README's promise: every command's --help shows examples."""
    from spot.cli import main
    for name, command in main.commands.items():
        if command.hidden:
            continue
        r = CliRunner().invoke(main, [name, "--help"])
        assert r.exit_code == 0 and "Example" in r.output, name


def test_tune_on_a_busy_machine_prints_and_records_nothing(as_embedded, tmp_path, monkeypatch):
    """A busy machine's curve (2 nodes at 22x 1 node's time) was recorded for --budget auto: now spot tune prints it
    with the noise, says why it records nothing and exits 1; --record-noisy records it with a warning. spot bench
    --tune writes its report and records nothing either."""
    import spot.app.bench_run as bench
    monkeypatch.setattr(bench, "latency_spreads", lambda samples: {"latency from 1 to 2 nodes": 9.88})
    busy = run("tune", "--temperature", "1", "--limit", "1")
    assert busy.exit_code == 1, busy.output
    assert json.loads(busy.stdout)["noise"] == {"largest_spread": 9.88, "where": "latency from 1 to 2 nodes",
                                                "limit": 0.5, "quiet": False}
    assert "not recorded: the machine was busy while it was measured: the latency from 1 to 2 nodes spread 988% " \
           "(more than 50%)" in busy.stderr and "--record-noisy" in busy.stderr
    assert not (tmp_path / "cache" / "tuning").exists() or not list((tmp_path / "cache" / "tuning").glob("*.json"))
    kept = run("tune", "--temperature", "1", "--limit", "1", "--record-noisy")
    assert kept.exit_code == 0 and "warning: the machine was busy" in kept.stderr and "recorded" in kept.stderr
    assert len(list((tmp_path / "cache" / "tuning").glob("*.json"))) == 1
    shutil.rmtree(tmp_path / "cache" / "tuning")
    report = tmp_path / "report"
    r = run("bench", "--decoders", "standard,spot", "--limit", "1", "--temperatures", "1", "--budgets", "4x2",
            "--max-new-tokens", "4", "--tune", "--no-plots", "--report", str(report))
    assert r.exit_code == 0 and "not recorded: the machine was busy" in r.stderr, r.output
    assert json.loads((report / "bench.json").read_text())["tune"]["quiet"] is False
    assert not list((tmp_path / "cache" / "tuning").glob("*.json"))


def test_tune_records_the_budget_that_generate_budget_auto_decodes_with(as_embedded, tmp_path, monkeypatch):
    """`spot tune` records its choice per model, engine, decoder and machine; `spot generate --budget auto` decodes
    with the one tuned at the nearest temperature (same tokens as standard decoding), and says how to make one."""
    import spot.app.bench_run as bench
    # a quiet machine's spreads, whatever else this machine runs: a busy one is the test below
    monkeypatch.setattr(bench, "latency_spreads", lambda samples: {"latency from 1 to 2 nodes": 0.05})
    gen = ("generate", "--prompt-ids", "5,6,7,8", "--max-new-tokens", "8", "--json")
    missing = run(*gen, "--decoder", "spot", "--budget", "auto", "--temperature", "0.9")
    assert missing.exit_code == 2 and "no tuned budget" in missing.stderr, missing.output
    # (without --model: the embedded model on ONNX Runtime, the default where onnxruntime is installed)
    assert "run `spot tune --backend ort --device cpu --decoder spot --temperature 0.9` first" in missing.stderr

    # (--record-noisy: a busy test machine's curve is recorded all the same; test_tune_on_a_busy_machine_... below)
    tuned = run("tune", "--temperature", "1", "--limit", "1", "--record-noisy")
    assert tuned.exit_code == 0, tuned.output
    choice = json.loads(tuned.stdout)["choice"]
    assert "recorded" in tuned.stderr and "used by --budget auto" in tuned.stderr
    engine = json.loads(tuned.stdout)["engine"]          # what the latencies are of
    assert {k: engine[k] for k in ("name", "device", "sampler", "kv_cache")} == {"name": "ort", "device": "cpu",
                                                                                  "sampler": "host", "kv_cache": "host"}
    auto = json.loads(run(*gen, "--decoder", "spot", "--budget", "auto", "--temperature", "0.9").stdout)
    assert (auto["budget"]["nodes"], auto["budget"]["depth"]) == (choice["nodes"], choice["depth"])
    assert auto["budget"]["tuned"]["temperature"] == 1.0
    standard = json.loads(run(*gen, "--temperature", "0.9").stdout)
    assert auto["token_ids"] == standard["token_ids"]

    # a record per temperature: T = 0 goes beside T = 1 and serves T = 0.2; --no-save records nothing
    assert run("tune", "--temperature", "0", "--limit", "1", "--no-save").exit_code == 0
    again = json.loads(run(*gen, "--decoder", "spot", "--budget", "auto", "--temperature", "0.2").stdout)
    assert again["budget"]["tuned"]["temperature"] == 1.0
    assert run("tune", "--temperature", "0", "--limit", "1", "--record-noisy").exit_code == 0
    record = json.loads((tmp_path / "cache" / "tuning").joinpath(Path(again["budget"]["tuned"]["record"]).name)
                        .read_text())
    assert set(record["by_temperature"]) == {"0", "1"} and record["key"]["decoder"] == "spot"
    nearest = json.loads(run(*gen, "--decoder", "spot", "--budget", "auto", "--temperature", "0.2").stdout)
    assert nearest["budget"]["tuned"]["temperature"] == 0.0

    # another decoder, tau or block size is another key; --depth is the record's; chain has no tuned budget
    for args, says in ((("--decoder", "spot-sets"), "--decoder spot-sets --temperature 0 --tau 0.9"),
                       (("--decoder", "tree"), "--decoder tree"),
                       (("--decoder", "spot", "--block-size", "8"), "--block-size 8 --decoder spot"),
                       (("--decoder", "spot", "--depth", "2"), "--depth is part of the tuned budget"),
                       (("--decoder", "chain"), "--budget auto applies to the decoders spot, spot-sets, tree")):
        r = run(*gen, *args, "--budget", "auto")
        assert r.exit_code == 2 and says in r.stderr and "Traceback" not in r.output, (args, r.output)
    assert run(*gen, "--budget", "auto").exit_code == 0          # standard decoding: no tree to size
    sets = run("tune", "--decoder", "spot-sets", "--tau", "0.5", "--limit", "1", "--record-noisy")   # vs threshold
    assert sets.exit_code == 0, sets.output
    sets_auto = json.loads(run(*gen, "--decoder", "spot-sets", "--tau", "0.5", "--budget", "auto").stdout)
    threshold = json.loads(run(*gen, "--decoder", "threshold", "--tau", "0.5").stdout)
    assert sets_auto["token_ids"] == threshold["token_ids"] and sets_auto["budget"]["tuned"]["temperature"] == 0
    assert sets_auto["budget"]["tuned"]["record"] != nearest["budget"]["tuned"]["record"]
    bad = run(*gen, "--decoder", "spot", "--budget", "16x8")
    assert bad.exit_code == 2 and "--budget takes a number of nodes or auto, got '16x8'" in bad.stderr
    assert "hint: e.g. --budget 16 (tree nodes per verify pass, the root included) with --depth 8" in bad.stderr

    # the threshold rule of spot / tree is its own key, and the hint's command makes it (with the drafter given)
    threshold = run(*gen, "--decoder", "tree", "--mode", "threshold", "--tau", "0.5", "--budget", "auto")
    assert "--decoder tree --temperature 0 --mode threshold --tau 0.5` first" in threshold.stderr, threshold.stderr
    assert run("tune", "--decoder", "tree", "--mode", "threshold", "--tau", "0.5", "--limit", "1",
               "--record-noisy").exit_code == 0
    assert run(*gen, "--decoder", "tree", "--mode", "threshold", "--tau", "0.5", "--budget", "auto").exit_code == 0
    given = run(*gen, "--decoder", "spot", "--drafter", str(as_embedded), "--budget", "auto", "--temperature", "0.5",
                "--block-size", "8")
    assert f"--drafter {as_embedded} --decoder spot" in given.stderr, given.stderr

    # a damaged record is named, with the way out; a damaged entry too; spot tune replaces an unreadable record
    path = Path(nearest["budget"]["tuned"]["record"])
    saved = path.read_text()
    for damage in ("{", saved.replace('"nodes": ', '"nodes": 2.5, "was": ', 1),
                   saved.replace('"temperature": 0.0', '"temperature": NaN', 1)):
        path.write_text(damage)
        broken = run(*gen, "--decoder", "spot", "--budget", "auto")
        assert broken.exit_code == 2 and str(path) in broken.stderr and "run `spot tune` again" in broken.stderr
    path.write_text(saved.replace('"nodes": ', '"nodes": 4000, "was": '))     # a record's bound, not the engine's
    too_big = run(*gen, "--decoder", "spot", "--budget", "auto", "--temperature", "0")
    assert too_big.exit_code == 2 and f"the tuned budget in {path} does not fit this engine" in too_big.stderr
    path.write_text(saved.replace('"format_version": 2', '"format_version": 1'))   # the old tuner's choice
    old = run(*gen, "--decoder", "spot", "--budget", "auto")
    assert old.exit_code == 2 and "has format_version 1, this spot reads 2" in old.stderr
    assert "run `spot tune` again" in old.stderr
    path.write_text("{")
    retuned = run("tune", "--temperature", "0", "--limit", "1", "--record-noisy")
    assert retuned.exit_code == 0 and "replacing an unreadable tuning record" in retuned.stderr
    assert json.loads(path.read_text())["by_temperature"].keys() == {"0"}

    # the text output says what --budget auto chose, and why when it is no tree (it quietly decoded standard)
    record = json.loads(path.read_text())
    for nodes, depth, says in ((1, 1, "budget auto: 1 node, so standard decoding (one target pass per commit step): "
                                      "`spot tune` measured no tree more than 1.03x faster than it"),
                               (4, 2, "budget auto: 4 nodes x depth 2, tuned at temperature 0")):
        record["by_temperature"]["0"] |= {"nodes": nodes, "depth": depth}
        path.write_text(json.dumps(record))
        text = run(*gen[:-1], "--decoder", "spot", "--budget", "auto", "--temperature", "0")
        assert text.exit_code == 0 and says in text.stderr and str(path) in text.stderr, text.stderr


def test_a_tuned_budget_is_keyed_by_the_machines_gpu_models(tmp_path, monkeypatch):
    """ORT's CUDA provider has no device query: the key names the driver's GPU models (or a Jetson board), so a
    record tuned on one GPU is not read on another; a machine without one keeps the CPU key."""
    import spot.app.tuned_budgets as tuned
    monkeypatch.setattr(tuned, "NVIDIA_GPU_INFO", str(tmp_path / "none"))
    monkeypatch.setattr(tuned, "DEVICE_TREE_MODEL", str(tmp_path / "none"))
    cpu_only = tuned.machine_identity()
    assert "gpus" not in cpu_only
    for index, model in (("0000:01:00.0", "NVIDIA H200"), ("0000:02:00.0", "NVIDIA L4")):
        (tmp_path / "gpus" / index).mkdir(parents=True)
        (tmp_path / "gpus" / index / "information").write_text(f"Model: \t\t {model}\nIRQ:   123\n")
    monkeypatch.setattr(tuned, "NVIDIA_GPU_INFO", str(tmp_path / "gpus"))
    assert tuned.machine_identity() == {**cpu_only, "gpus": ["NVIDIA H200", "NVIDIA L4"]}
    monkeypatch.setattr(tuned, "NVIDIA_GPU_INFO", str(tmp_path / "none"))
    (tmp_path / "model").write_bytes(b"NVIDIA Jetson Orin NX Engineering Reference Developer Kit\0")
    monkeypatch.setattr(tuned, "DEVICE_TREE_MODEL", str(tmp_path / "model"))
    assert tuned.gpu_models() == ["NVIDIA Jetson Orin NX Engineering Reference Developer Kit"]
    (tmp_path / "model").write_bytes(b"Raspberry Pi 4 Model B\0")
    assert tuned.gpu_models() == []


def test_tuned_entries_and_suggested_commands_name_temperatures_and_tau_exactly(tmp_path, monkeypatch):
    """-0 is 0 (one entry); temperatures that agree to 6 digits keep two entries; the `spot tune` command that
    --budget auto suggests writes --tau 0.9999999 as given (rounded to "1", it was refused)."""
    from spot.app.tuned_budgets import number_name, save_tuning
    monkeypatch.setenv("SPOT_CACHE", str(tmp_path))
    assert [number_name(x) for x in (-0.0, 1.0, 0.7, 0.1234567, 0.9999999)] == ["0", "1", "0.7", "0.1234567",
                                                                                  "0.9999999"]
    for t in (-0.0, 0.0, 0.1234567, 0.1234568):
        path = save_tuning({"model": "x"}, {"temperature": t, "choice": {"nodes": 4, "depth": 3}})
    assert sorted(json.loads(path.read_text())["by_temperature"]) == ["0", "0.1234567", "0.1234568"]
    r = run("generate", "--prompt-ids", "1,2", "--decoder", "spot-sets", "--tau", "0.9999999", "--budget", "auto",
            "--max-new-tokens", "4")
    assert r.exit_code == 2 and "--tau 0.9999999" in r.output, r.output


def test_concurrent_tunes_keep_every_entry(tmp_path, monkeypatch):
    """Two processes recording into one tuning file at once: each entry survives (a lock around the read-modify-
    write; without it about half were lost)."""
    import subprocess
    import sys
    monkeypatch.setenv("SPOT_CACHE", str(tmp_path))
    code = ("import sys; from spot.app.tuned_budgets import save_tuning\n"
            "for i in range(60): save_tuning({'model': 'x'}, {'temperature': float(sys.argv[1]) + i / 1000, "
            "'choice': {'nodes': 4, 'depth': 3}})")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(k)]) for k in (1, 2)]
    assert all(p.wait() == 0 for p in procs)
    record = json.loads(next((tmp_path / "tuning").glob("*.json")).read_text())
    assert len(record["by_temperature"]) == 120


def test_os_errors_are_one_line_with_a_hint_for_their_cause(monkeypatch):
    """A path the system refuses: one error line naming it, with a hint for that cause (not a write hint for a
    read error)."""
    import errno

    import spot.config
    from spot.errors import os_error_hint

    def refused(*_):
        raise NotADirectoryError(errno.ENOTDIR, "Not a directory", "/data/file/model")
    monkeypatch.setattr(spot.config, "load_config", refused)
    # torch: the checkpoint's config.json is read here (the default, ort, reuses the embedded model's export)
    r = run("generate", "--backend", "torch", "--prompt-ids", "1,2")
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert "error: Not a directory: /data/file/model" in r.stderr and "a part of that path is a file" in r.stderr
    assert "permissions" in os_error_hint(OSError(errno.EACCES, "Permission denied", "x"))
    assert "disk" in os_error_hint(OSError(errno.ENOSPC, "No space left on device", "x"))
    assert "check the path" in os_error_hint(OSError(errno.EIO, "Input/output error", "x"))


def test_sigterm_during_an_extension_import_exits_143_quietly(monkeypatch):
    """SIGTERM's exit raised inside a C extension's import (torch's, during an export) surfaces as ImportError
    'initialization failed': the command ends with status 128 + 15 and no traceback, as elsewhere."""
    import spot.cli
    import spot.config

    def killed_during_import(*_):
        spot.cli.TERMINATED.append(15)
        raise ImportError("initialization failed")
    monkeypatch.setattr(spot.config, "load_config", killed_during_import)
    monkeypatch.setattr(spot.cli, "TERMINATED", [])
    r = CliRunner().invoke(main, ["generate", "--backend", "torch", "--prompt-ids", "1,2"])
    assert r.exit_code == 143 and "Traceback" not in r.output and not isinstance(r.exception, ImportError)
    assert "error: terminated (SIGTERM)" in r.stderr
    monkeypatch.setattr(spot.cli, "TERMINATED", [])      # without a SIGTERM an ImportError is not hidden

    def broken_import(*_):
        raise ImportError("initialization failed")
    monkeypatch.setattr(spot.config, "load_config", broken_import)
    r = CliRunner().invoke(main, ["generate", "--backend", "torch", "--prompt-ids", "1,2"])
    assert isinstance(r.exception, ImportError)


def test_the_readmes_python_example_runs(as_embedded, tmp_path, capsys):
    """README.md's "From Python" block, run as written on an exported folder (the demo's export of the stand-in)."""
    assert run("demo", "--max-new-tokens", "4", "--depth", "2").exit_code == 0
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    code = readme.split("## From Python\n```python\n", 1)[1].split("```", 1)[0]
    assert 'model = "sdar-8b-fp16-onnx"' in code
    code = code.replace('"sdar-8b-fp16-onnx"', repr(str(tmp_path / "cache" / "code-fp32-onnx")))
    # the stand-in's block is 4 and its context 64
    code = code.replace("TreeBudget(16, 8)", "TreeBudget(6, 3)").replace("max_new_tokens=64", "max_new_tokens=16")
    exec(compile(code, "README.md", "exec"), {})
    assert "'target_passes'" in capsys.readouterr().out


def test_spot_verify_checks_the_drafter_pair_by_its_own_descriptor(as_embedded, tmp_path):
    """An export's manifest does not list the drafter pair (drafter.json vouches for drafter.onnx, and train-drafter /
    calibrate-drafter replace it in place): `spot verify` checks the pair and its fit to the model separately."""
    assert run("demo", "--max-new-tokens", "4", "--depth", "2").exit_code == 0
    folder = tmp_path / "cache" / "code-fp32-onnx"
    manifest = json.loads((folder / "manifest.json").read_text())
    assert "drafter" in manifest["graphs"] and not {"drafter.onnx", "drafter.json"} & set(manifest["files"])
    ok = run("verify", str(folder))
    assert ok.exit_code == 0 and "; the drafter matches its drafter.json and this model" in ok.output, ok.output
    (folder / "drafter.onnx").write_bytes((folder / "drafter.onnx").read_bytes() + b"\0")
    broken = run("verify", str(folder))
    assert broken.exit_code == 2 and "drafter.onnx does not match its manifest" in broken.stderr
    assert "ok:" not in broken.stdout and "run it again, or copy the pair again" in broken.stderr
    other = tmp_path / "other"        # a drafter of another block size: the hint fits an export (no --block-size)
    shutil.copytree(folder, other)
    descriptor = json.loads((other / "drafter.json").read_text())
    (other / "drafter.onnx").write_bytes((as_embedded / "drafter.onnx").read_bytes())
    (other / "drafter.json").write_text(json.dumps({**descriptor, "block_size": 8}))
    r = run("verify", str(other))
    assert r.exit_code == 2 and "block size" in r.stderr and "train a drafter for this export" in r.stderr
    for name in ("drafter.onnx", "drafter.json"):
        (other / name).unlink()
    r = run("verify", str(other))
    assert r.exit_code == 2 and "was exported with a drafter, and drafter.onnx is missing" in r.stderr


@pytest.mark.parametrize("signal_kind", ["SIGINT", "SIGTERM"])
def test_an_interrupted_command_ends_with_one_line(monkeypatch, signal_kind):
    """Ctrl-C: 'error: interrupted' and status 130 (click said 'Aborted!', status 1); SIGTERM: 'error: terminated'
    and 143 (it said nothing)."""
    import spot.cli
    import spot.config

    def interrupted(*_):
        if signal_kind == "SIGINT":
            raise KeyboardInterrupt
        spot.cli.terminate(15, None)
    monkeypatch.setattr(spot.config, "load_config", interrupted)
    monkeypatch.setattr(spot.cli, "TERMINATED", [])
    r = CliRunner().invoke(main, ["generate", "--backend", "torch", "--prompt-ids", "1,2"])
    code, says = (130, "error: interrupted (Ctrl-C)") if signal_kind == "SIGINT" else (143, "error: terminated")
    assert r.exit_code == code and says in r.stderr and "Aborted" not in r.output and "Traceback" not in r.output


def test_output_paths_are_checked_before_the_work(tmp_path):
    """What used to fail only after the decoding (or the whole export), naming a temporary file: a link to nothing,
    a name one byte too long for the file system once a temporary suffix was added, a folder where a file goes,
    a place where nothing can be created."""
    from spot.errors import SpotError
    from spot.files import atomic_output, check_output_path, write_text_atomic
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere" / "x")
    cases = [((tmp_path / "dangling", "--out"), "is a link to"),
             ((tmp_path / ("a" * 256 + ".npz"), "--out"), "the name has 260 bytes, this file system allows 255"),
             ((tmp_path, "--out"), "is a folder, expected a file name"),
             ((tmp_path / "dangling", "--report", True), "is a link to"),
             ((Path("/proc/spot-test/x.npz"), "--out"), "cannot write --out /proc/spot-test/x.npz")]
    for args, says in cases:
        with pytest.raises(SpotError, match=re.escape(says)):
            check_output_path(*args)
    legal = tmp_path / ("b" * 255)        # the longest legal name: its temporary name is short, so it is written
    write_text_atomic(check_output_path(legal, "--out"), "x")
    assert legal.read_text() == "x"
    with pytest.raises(RuntimeError):
        with atomic_output(tmp_path / "t.npz", ".npz") as tmp:
            tmp.write_text("half")
            raise RuntimeError
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["dangling", "b" * 255])    # no temporary left
    check_output_path(tmp_path / "new" / "deeper" / "report", "--report", folder=True)
    assert not (tmp_path / "new").exists()         # probed where it would be made: nothing left if the work fails
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "t.txt").write_text("old")
    (tmp_path / "link.txt").symlink_to(tmp_path / "data" / "t.txt")
    write_text_atomic(check_output_path(tmp_path / "link.txt", "--out"), "new")      # written through the link
    assert (tmp_path / "link.txt").is_symlink() and (tmp_path / "data" / "t.txt").read_text() == "new"


def test_bench_refuses_a_bad_report_path_before_decoding(as_embedded, tmp_path):
    (tmp_path / "rep").symlink_to(tmp_path / "gone")
    r = run("bench", "--decoders", "standard", "--limit", "1", "--report", str(tmp_path / "rep"))
    assert r.exit_code == 2 and "--report" in r.stderr and "is a link to" in r.stderr
    assert "prompt" not in r.stderr          # no decoding progress: refused first


def test_corpus_prompts_fit_a_small_context_in_calibrate_drafter_and_traces(as_embedded, tmp_path):
    """Prompts drawn from the corpus (64-448 tokens) are cut to what the model's context holds beside the new
    tokens (the stand-in's is 64: both commands failed there); calibrate-drafter --quiet prints only its result."""
    t = run("traces", "--corpus-prompts", "1", "--temperatures", "0", "--rules", "static", "--max-new-tokens", "4",
            "--depth", "2", "--quiet", "--out", str(tmp_path / "t.npz"))
    assert t.exit_code == 0 and (tmp_path / "t.npz").is_file(), t.output
    r = run("calibrate-drafter", "--corpus-prompts", "1", "--temperatures", "0", "--candidates", "1,2",
            "--runner-up-weights", "0", "--set-flip-weights", "0", "--budget", "4x2", "--max-new-tokens", "4",
            "--dry-run", "--quiet")
    assert r.exit_code == 0, r.output
    assert r.stderr == "" and json.loads(r.stdout)["order_temperature"] in (1.0, 2.0)
    # the default shape budgets fitted to the stand-in's block of 4: every depth within it
    shapes = json.loads(r.stdout)["tree_shapes"]
    assert [s["nodes"] for s in shapes][:4] == [2, 4, 8, 16] and all(s["depth"] <= 4 for s in shapes)


def test_outputs_written_after_minutes_of_work_are_checked_first(as_embedded, tmp_path, monkeypatch):
    """train-drafter's --out, spot tune's and bench --tune's tuning cache were found unwritable only after the
    training or the sweep (whose JSON was then not printed)."""
    t = run("traces", "--corpus-prompts", "1", "--temperatures", "0", "--rules", "static", "--max-new-tokens", "4",
            "--depth", "2", "--quiet", "--out", str(tmp_path / "t.npz"))
    assert t.exit_code == 0, t.output
    (tmp_path / "file").write_text("x")
    r = run("train-drafter", "--traces", str(tmp_path / "t.npz"), "--epochs", "1", "--out",
            str(tmp_path / "file" / "drafter"))
    assert r.exit_code == 2 and "--out" in r.stderr and "is a file, expected a folder" in r.stderr, r.output
    assert "step" not in r.output and "held-out" not in r.output        # refused before training
    monkeypatch.setenv("SPOT_CACHE", str(tmp_path / "file"))            # the cache's tuning folder under a file
    r = run("tune", "--limit", "1")
    assert r.exit_code == 2 and "the tuning cache" in r.stderr and "measuring" not in r.stderr, r.output
    r = run("bench", "--decoders", "standard", "--limit", "1", "--tune", "--report", str(tmp_path / "rep"))
    assert r.exit_code == 2 and "the tuning cache" in r.stderr and "prompt" not in r.stderr, r.output


@pytest.mark.parametrize("signal_kind", ["SIGINT", "SIGTERM"])
def test_a_signal_while_the_cli_is_imported_ends_with_one_line(monkeypatch, capsys, signal_kind):
    """Ctrl-C / SIGTERM during the first third of a second (numpy, ONNX Runtime, click being imported, before click
    runs): the console script says the same one line as during a command (130 / 143), not a traceback."""
    import builtins
    import spot.entry
    monkeypatch.delitem(sys.modules, "spot.cli")
    real_import = builtins.__import__

    def import_interrupted(name, *args, **kwargs):
        if name == "spot.cli":
            if signal_kind == "SIGINT":
                raise KeyboardInterrupt
            os.kill(os.getpid(), signal.SIGTERM)     # the handler spot.entry installed for the import raises here
        return real_import(name, *args, **kwargs)
    monkeypatch.setattr(builtins, "__import__", import_interrupted)
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as ended:
        spot.entry.spot()
    code, says = (130, "error: interrupted (Ctrl-C)") if signal_kind == "SIGINT" else (143, "error: terminated")
    assert ended.value.code == code and says in capsys.readouterr().err
    assert signal.getsignal(signal.SIGTERM) is before       # the import's handler is not left behind


def test_bench_arguments_are_parsed_and_checked_by_the_bench_module():
    """spot bench's option checks live in spot.app.bench_run (the CLI only parses and prints), each a SpotError naming the
    option."""
    from spot.app.bench_run import parse_compare_drafters, parse_decoders, parse_sampling_grid
    from spot.errors import SpotError
    assert parse_decoders("spot, standard,spot") == ("spot", "standard")
    with pytest.raises(SpotError, match=r"unknown decoder\(s\) nope"):
        parse_decoders("spot,nope")
    assert parse_sampling_grid("0,-0.0,1", "3,3") == ((0.0, 1.0), (3,))
    with pytest.raises(SpotError, match="comma-separated numbers"):
        parse_sampling_grid("0,x", "0")
    with pytest.raises(SpotError, match="temperature"):
        parse_sampling_grid("-1", "0")
    assert parse_compare_drafters(["a=x.onnx"], ("spot",)) == {"a": "x.onnx"}
    for specs, decoders, says in ((["a"], ("spot",), "NAME=PATH"), (["a=x", "a=y"], ("spot",), "twice"),
                                  (["a=x"], ("tree",), "neither spot nor spot-sets")):
        with pytest.raises(SpotError, match=says):
            parse_compare_drafters(specs, decoders)
