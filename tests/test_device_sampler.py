"""The device sampler: decoders fed by the export's epilogue graph (IOBinding, logits never reach numpy) give the same
tokens and passes as the numpy host sampler, and a pass hands the host O(N x B x (D + 32)) values, never N x B x V.

Runs on ORT CPU here; on a GPU the same code binds the logits on CUDA (scripts/gpu_check.sh)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from spot.config import ModelConfig
from spot.engines.factory import open_engine
from spot.engines.ort_engine import OrtEngine
from spot.errors import SpotError
from spot.export.export import export_checkpoint
from spot.export.options import ExportOptions
from spot.export.presets import resolve_source
from spot.reference.model import random_model
from spot.runtime.decode import generate
from spot.runtime.decode_plan import DecodeRequest, run_decoder
from spot.runtime.summary import summarize
from spot.runtime.outputs import SampledOutputs
from spot.runtime.spot import TreeBudget
from spot.runtime.step import CommitRule, Sampling
from tinymodels import RUNNER_UPS, older_epilogue_copy

pytest.importorskip("onnx")
from spot import exact_math  # noqa: E402

# peaked enough that threshold decoding commits several positions per step
CFG = ModelConfig(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, max_position_embeddings=256, block_size=8,
                  mask_token_id=95, stop_ids=(94,))
DEPTH = 4
exact_platform = pytest.mark.skipif(not exact_math.reference_platform(),
                                    reason="bit identity with numpy holds on x86-64 glibc with FMA (docs/noise.md)")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sampler")
    ckpt = tmp / "ckpt"
    random_model(CFG, seed=3).save_pretrained(ckpt)
    with_epilogue = export_checkpoint(resolve_source(str(ckpt)), tmp / "onnx",
                                      ExportOptions(dtype="fp32", epilogue_steps=DEPTH))
    without = export_checkpoint(resolve_source(str(ckpt)), tmp / "onnx-plain",
                                ExportOptions(dtype="fp32", epilogue_steps=0, validate=False))
    runs = export_checkpoint(resolve_source(str(ckpt)), tmp / "onnx-runs",     # 2 positions per epilogue call
                             ExportOptions(dtype="fp32", epilogue_steps=DEPTH, epilogue_positions=2, validate=False))
    return with_epilogue, without, runs


def _prompt(seed, n):
    return np.random.default_rng(seed).integers(0, CFG.vocab_size - 2, size=n)


def test_export_writes_and_validates_the_epilogue(folders):
    manifest = json.loads((folders[0] / "manifest.json").read_text())
    entry = manifest["graphs"]["epilogue"]
    assert entry["future_steps"] == DEPTH and "epilogue.onnx" in manifest["files"]
    assert entry["validation"]["checked"] == exact_math.reference_platform()
    for name, dims in entry["outputs"].items():          # no output carries the vocabulary axis
        assert CFG.vocab_size not in dims[1:], name
    assert "epilogue" not in json.loads((folders[1] / "manifest.json").read_text())["graphs"]


@pytest.mark.parametrize("sampler", ["host", "device"])
def test_nan_logits_are_a_clear_error(folders, tmp_path, sampler):
    """NaN logits (broken weights) can send the epilogue's candidate indices out of range inside onnxruntime: the
    engine says what is wrong either way, never onnxruntime's traceback."""
    from tinymodels import nan_weights_copy
    engine = OrtEngine(nan_weights_copy(folders[0], tmp_path / "nan"), sampler=sampler, threads=1)
    with pytest.raises(SpotError, match="non-finite logits .* block at position 0"):
        generate(engine, _prompt(0, 5), max_new_tokens=4, sampling=Sampling(1.0, seed=3))


def _count_epilogue_runs(engine) -> list:
    calls, run = [], engine.epilogue.run_with_iobinding
    engine.epilogue.run_with_iobinding = lambda binding: (calls.append(1), run(binding))[1]
    return calls


def test_a_device_pass_samples_a_state_when_it_is_read(folders):
    """A pass returns deferred outputs: the epilogue runs for a state when its outputs are first read (once), over
    that state's rows of the device logits bound in place, and gives that state's row of the whole pass's epilogue
    bit for bit; the host receives small arrays only."""
    from spot.folder.epilogue import run_epilogue
    from spot.runtime.outputs import DeferredOutputs
    engine = OrtEngine(folders[0], sampler="device", threads=1)
    host = OrtEngine(folders[0], sampler="host", threads=1)
    for e in (engine, host):
        e.prefill(_prompt(0, 8))
    calls = _count_epilogue_runs(engine)
    states = np.full((5, CFG.block_size), CFG.mask_token_id)
    states[1:, 0] = [3, 4, 5, 6]
    steps, sampling = [0, 1, 1, 1, 1], Sampling(1.0, seed=2, exclude_token=CFG.mask_token_id)
    outs = engine.block_outputs(states, steps, sampling, block=1)
    assert all(isinstance(o, DeferredOutputs) and not o.sampled for o in outs) and not calls
    want = run_epilogue(engine.epilogue, host.block_logits(states), steps, sampling, block=1)
    for i in (3, 0, 3):
        got = outs[i].outputs()
        assert isinstance(got, SampledOutputs) and got.step == steps[i]
        for field in ("token", "confidence", "future_tokens", "future_conf", "top_logprobs", "future_runner_up",
                      "future_gap"):
            assert np.array_equal(getattr(got, field), getattr(want, field)[i]), (i, field)
    assert len(calls) == 2 and [o.sampled for o in outs] == [True, False, False, True, False]
    per_state = sum(getattr(outs[0].outputs(), f).size for f in ("token", "confidence", "future_tokens",
                                                                "future_conf", "top_logprobs", "future_runner_up",
                                                                "future_gap"))
    assert per_state == CFG.block_size * (2 + 4 * DEPTH + 32)
    with pytest.raises(SpotError, match="samples on the device"):
        outs[1].host_logits()
    assert not outs[1].sampled


@exact_platform
@pytest.mark.parametrize("decoder,mode", [("standard", "static"), ("tree", "static"), ("tree", "threshold")])
def test_the_epilogue_runs_once_per_commit_step_whatever_the_tree(folders, decoder, mode):
    """The walk reads F of the root and of each accepted node, and the state it ends at is the next round's root:
    every decoder runs the epilogue once per commit step, for one state — as often as standard decoding — however
    many nodes a verify pass holds (stats epilogue_states; runs counted at the engine's session)."""
    engine = OrtEngine(folders[0], sampler="device", threads=1)
    calls = _count_epilogue_runs(engine)
    for temperature in (0.0, 1.0):
        calls.clear()
        req = DecodeRequest(max_new_tokens=16, mode=mode, tau=0.3,
                            sampling=Sampling(temperature, seed=5), budget=TreeBudget(12, DEPTH))
        gen = run_decoder(decoder, engine, _prompt(1, 6), req)
        stats = gen.stats
        assert stats.epilogue.states == len(calls) == stats.steps, (decoder, temperature)
        assert 0 < stats.epilogue.ms <= 1e3 * stats.seconds
        assert summarize([gen])["epilogue_ms_per_step"] == stats.epilogue.ms / stats.steps
        if decoder != "standard":   # sampling every node of every pass would have taken more calls
            assert sum(stats.verify.nodes) + stats.passes["block"] > stats.steps


@exact_platform
@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("decoder,mode", [("standard", "static"), ("threshold", "static"), ("chain", "static"),
                                          ("tree", "static"), ("tree", "threshold"), ("oracle", "static")])
@pytest.mark.parametrize("store_mode", ["fused", "separate"])
def test_device_sampler_decodes_like_the_host_sampler(folders, decoder, mode, temperature, store_mode):
    """Either store mode: a fused pass's state is the second block of its logits' rows, where the epilogue reads
    it."""
    host = OrtEngine(folders[0], sampler="host", threads=1)
    device = OrtEngine(folders[0], sampler="device", threads=1)
    assert host.sampler_depth is None and device.sampler_depth == DEPTH
    for i in range(3):
        req = DecodeRequest(max_new_tokens=12, mode=mode, tau=0.3, sampling=Sampling(temperature, seed=40 + i),
                            budget=TreeBudget(6, DEPTH), store_mode=store_mode)
        prompt = _prompt(i, 5 + 3 * i)
        a, b = run_decoder(decoder, host, prompt, req), run_decoder(decoder, device, prompt, req)
        assert a.token_ids == b.token_ids and a.stats.passes == b.stats.passes, (decoder, i)
        assert a.stats.steps == b.stats.steps


@exact_platform
@pytest.mark.parametrize("decoder,mode", [("standard", "threshold"), ("tree", "static"), ("tree", "threshold")])
def test_epilogue_runs_over_positions_decode_the_same(folders, decoder, mode):
    """An export whose epilogue takes 2 of a state's 8 positions per call (less memory: spot-export
    --epilogue-positions): the engine joins the runs, and decodes the tokens and passes of the host sampler."""
    entry = json.loads((folders[2] / "manifest.json").read_text())["graphs"]["epilogue"]
    assert entry["positions_per_call"] == 2 and "first_position" in entry["inputs"]
    assert json.loads((folders[0] / "manifest.json").read_text())["graphs"]["epilogue"]["positions_per_call"] == 8
    host = OrtEngine(folders[0], sampler="host", threads=1)
    runs = OrtEngine(folders[2], sampler="device", threads=1)
    calls = _count_epilogue_runs(runs)
    for temperature in (0.0, 1.0):
        calls.clear()
        req = DecodeRequest(max_new_tokens=12, mode=mode, tau=0.3, sampling=Sampling(temperature, seed=7),
                            budget=TreeBudget(6, DEPTH))
        a, b = run_decoder(decoder, host, _prompt(3, 7), req), run_decoder(decoder, runs, _prompt(3, 7), req)
        assert a.token_ids == b.token_ids and a.stats.passes == b.stats.passes, (decoder, temperature)
        assert len(calls) == 4 * b.stats.epilogue.states == 4 * b.stats.steps


def test_a_manifest_that_misstates_the_epilogue_positions_is_refused(folders, tmp_path):
    import shutil

    from tinymodels import manifest_json, write_manifest_json
    for p, message in ((3, "positions_per_call is 3, expected a divisor of the block size 8"),
                       (4, "positions_per_call is 4, the graph's logits take 2 positions"),
                       (None, "records no positions_per_call for its epilogue")):
        folder = tmp_path / f"p{p}"
        shutil.copytree(folders[2], folder)
        manifest = manifest_json(folder)
        entry = {k: v for k, v in manifest["graphs"]["epilogue"].items() if k != "positions_per_call"}
        manifest["graphs"] = {**manifest["graphs"], "epilogue": {**entry, **({} if p is None else
                                                                             {"positions_per_call": p})}}
        write_manifest_json(folder, manifest)
        with pytest.raises(SpotError, match=message):
            OrtEngine(folder, sampler="device", threads=1)


@exact_platform
def test_spot_with_the_drafter_on_the_device_sampler(folders, tmp_path):
    """The drafter reads the epilogue's top-32 log-probabilities and coupled confidences: the same trees, passes and
    tokens as from host logits (spot and spot-sets)."""
    import torch

    from spot.runtime.drafter import load_drafter
    from spot.runtime.step import STATIC, THRESHOLD
    from spot.training.drafter import DrafterTrainSettings, train_drafter
    from spot.training.traces import TracePlan, collect_traces
    host = OrtEngine(folders[0], sampler="host", threads=1)
    device = OrtEngine(folders[0], sampler="device", threads=1)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        plan = TracePlan(temperatures=(0.0, 1.0), rules=(STATIC, THRESHOLD), tau=0.3, seeds=1, max_new_tokens=16,
                         depth=DEPTH)
        traces = collect_traces(host, [_prompt(s, 6).tolist() for s in range(4)], plan)
        train_drafter(traces, tmp_path / "drafter", DrafterTrainSettings(epochs=1, batch_size=64, log_every=10 ** 6),
                      log=lambda _: None)
    finally:
        torch.set_num_threads(threads)
    # with and without runner-up children (the epilogue returns the coupled samples' runner-ups too)
    with_runner_ups = load_drafter(tmp_path / "drafter", threads=1)
    assert with_runner_ups.runner_up_weight > 0
    for drafter in (with_runner_ups, with_runner_ups.with_settings(runner_up_weight=0)):
        for decoder in ("spot", "spot-sets"):
            for temperature in (0.0, 1.0):
                req = DecodeRequest(max_new_tokens=16, tau=0.3, sampling=Sampling(temperature, seed=5),
                                    budget=TreeBudget(6, DEPTH))
                a = run_decoder(decoder, host, _prompt(9, 7), req, drafter)
                b = run_decoder(decoder, device, _prompt(9, 7), req, drafter)
                assert a.token_ids == b.token_ids and a.stats.passes == b.stats.passes, (decoder, temperature)
                assert a.stats.verify.accepted == b.stats.verify.accepted
                assert a.stats.verify.nodes == b.stats.verify.nodes


@exact_platform
def test_runner_ups_from_the_epilogue_equal_the_host_ones(folders):
    """The device stale view serves the same runner-ups and gaps as the host one."""
    host = OrtEngine(folders[0], sampler="host", threads=1)
    device = OrtEngine(folders[0], sampler="device", threads=1)
    states = np.full((2, CFG.block_size), CFG.mask_token_id)
    states[1, :3] = [3, 4, 5]
    masked = states[1] == CFG.mask_token_id
    for temperature in (0.0, 1.0):
        sampling = Sampling(temperature, seed=2, exclude_token=CFG.mask_token_id)
        for engine in (host, device):
            engine.prefill(_prompt(0, 8))
        want = host.block_outputs(states, [0, 2], sampling, block=1)[1].stale(masked)
        got = device.block_outputs(states, [0, 2], sampling, block=1)[1].stale(masked)
        for step in range(3, 3 + DEPTH):
            w_tokens, w_gap = want.runner_up(step)
            g_tokens, g_gap = got.runner_up(step)
            np.testing.assert_array_equal(g_gap, w_gap)
            np.testing.assert_array_equal(g_tokens, w_tokens)
            assert (g_tokens[~masked] == -1).all() and np.isfinite(g_gap[masked]).all()


def test_an_older_epilogue_is_refused_until_upgrade_export_rewrites_it(folders, tmp_path):
    """An epilogue exported before runner-ups (no future_runner_up / future_gap) or before position runs (no
    first_position input), or missing any other output, is refused when the engine opens it, in one line naming
    what it lacks, with `spot upgrade-export FOLDER` as the hint (the host sampler never opens it). The upgrade
    writes the current epilogue, which decodes as the fresh export's does."""
    from spot.export.upgrade import upgrade_export
    olds = {"runner-ups": (RUNNER_UPS, False), "whole-blocks": ((), True), "both": (RUNNER_UPS, True),
            "half": (("future_gap",), False), "no-top": (("top_logprobs",), False)}
    for name, (outputs, whole_blocks) in olds.items():
        old = older_epilogue_copy(folders[0], tmp_path / name, outputs, whole_blocks)
        with pytest.raises(SpotError) as e:
            OrtEngine(old, sampler="device", threads=1)
        lacks = ", ".join([*(["first_position"] if whole_blocks else []), *outputs])
        assert f"older sampling epilogue: got no {lacks}, expected inputs " in e.value.message, e.value.message
        assert "\n" not in e.value.message and e.value.hint.startswith(f"run `spot upgrade-export {old}`")
        assert OrtEngine(old, sampler="host", threads=1).placement["sampler"] == "host"
    old = tmp_path / "both"
    assert upgrade_export(old, progress=lambda _: None)[1]
    assert (old / "epilogue.onnx").read_bytes() == (folders[0] / "epilogue.onnx").read_bytes()
    upgraded, fresh = OrtEngine(old, sampler="device", threads=1), OrtEngine(folders[0], sampler="device", threads=1)
    for decoder in ("standard", "tree"):
        for temperature in (0.0, 1.0):
            req = DecodeRequest(max_new_tokens=12, sampling=Sampling(temperature, seed=3), budget=TreeBudget(6, DEPTH))
            a, b = run_decoder(decoder, upgraded, _prompt(2, 6), req), run_decoder(decoder, fresh, _prompt(2, 6), req)
            assert a.token_ids == b.token_ids and a.stats.passes == b.stats.passes, (decoder, temperature)
            assert a.stats.epilogue.states == b.stats.epilogue.states > 0


def test_device_sampler_errors_are_clear(folders):
    device = OrtEngine(folders[0], sampler="device", threads=1)
    with pytest.raises(SpotError, match="exceeds the 4 future steps"):
        run_decoder("tree", device, _prompt(0, 4), DecodeRequest(8, budget=TreeBudget(8, DEPTH + 1)))
    with pytest.raises(SpotError, match="top-p"):
        generate(device, _prompt(0, 4), max_new_tokens=4, sampling=Sampling(1.0, top_p=0.9))
    with pytest.raises(SpotError, match="independent-noise ablation"):
        run_decoder("tree", device, _prompt(0, 4), DecodeRequest(8, sampling=Sampling(1.0), budget=TreeBudget(6, DEPTH),
                                                                independent_noise=True))
    with pytest.raises(SpotError, match="no sampling epilogue graph"):
        OrtEngine(folders[1], sampler="device")
    with pytest.raises(SpotError, match="unknown sampler"):
        OrtEngine(folders[0], sampler="gpu")
    with pytest.raises(SpotError, match="needs the ort backend"):
        open_engine("torch", folders[0], sampler="device")
    # auto keeps the numpy sampler on a CPU (the epilogue's float64 work costs more than it saves there)
    assert OrtEngine(folders[0], sampler="auto").sampler_depth is None


def test_traces_need_the_host_sampler(folders):
    from spot.training.traces import TraceRecorder
    device = OrtEngine(folders[0], sampler="device", threads=1)
    rec = TraceRecorder(0, CommitRule(), Sampling(1.0), CFG.mask_token_id, CFG.block_size, CFG.vocab_size, 2)
    with pytest.raises(SpotError, match='`sampler="host"`'):
        generate(device, _prompt(1, 4), max_new_tokens=4, sampling=Sampling(1.0), observer=rec)


def test_bench_and_tuner_on_a_device_sampling_engine(folders):
    """The bench and the tuner on an engine that samples on the device: no independent-noise rows (they need host
    logits), a budget deeper than the epilogue's future steps refused before any decoding, tuner candidates limited
    to what the epilogue serves, and the latency curve timing the passes the decoders run."""
    from dataclasses import replace

    from spot.app.bench_run import BenchConfig, run_bench, tune_budget
    from spot.prompts import Prompt
    engine = OrtEngine(folders[0], sampler="device", threads=1)
    prompts = [Prompt("p0", _prompt(0, 6).tolist())]
    cfg = BenchConfig(("standard", "chain", "tree"), (1.0,), (0,), (TreeBudget(6, DEPTH),), 8, 0.3)
    notes = []
    result = run_bench(engine, prompts, cfg, progress=notes.append)
    labels = {row["variant"] for row in result["rows"]}
    assert f"chain@{DEPTH + 1}x{DEPTH}" in labels and not any(label.endswith("+indep") for label in labels)
    assert result["config"]["independent_noise_ablation"] is False and result["engine"]["sampler"] == "device"
    assert any("independent-noise" in n for n in notes)
    assert all(row["identical_share"] in (None, 1.0) for row in result["rows"])
    # the epilogue's time per commit step, for every row, and its column in the Markdown table
    from spot.app.bench_run import markdown_table
    assert all(row["epilogue_ms_per_step"] > 0 for row in result["rows"])
    assert markdown_table(result).splitlines()[0].endswith("| device epilogue ms/step |")
    before = len(notes)
    with pytest.raises(SpotError, match=f"exceeds the {DEPTH} future steps"):
        run_bench(engine, prompts, replace(cfg, budgets=(TreeBudget(6, DEPTH + 1),)), progress=notes.append)
    assert len(notes) == before         # refused before decoding anything
    tuned = tune_budget(engine, prompts, 1.0, [TreeBudget(2, 1), TreeBudget(6, DEPTH), TreeBudget(8, DEPTH + 2)],
                        decoder="tree", node_counts=(1, 2))
    assert set(tuned["steps_per_verify"]) == {"2x1", f"6x{DEPTH}"} and set(tuned["latency_ms"]) == {1, 2}


def test_traces_read_host_logits_whatever_the_device(folders, tmp_path, monkeypatch):
    """`spot traces` records full distributions: it opens the engine with the host sampler (on a GPU, auto would
    pick the device sampler, which never hands logits over)."""
    from click.testing import CliRunner

    import spot.engines.factory as factory
    from spot.cli import main
    seen = {}
    real = factory.open_engine

    def spy(*args, **kwargs):
        seen.update(kwargs)
        return real(*args, **kwargs)
    monkeypatch.setattr(factory, "open_engine", spy)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"ids": _prompt(1, 5).tolist()}) + "\n")
    r = CliRunner().invoke(main, ["traces", "--model", str(folders[0]), "--backend", "ort", "--prompts", str(prompts),
                                  "--out", str(tmp_path / "t.npz"), "--max-new-tokens", "8", "--depth", "2",
                                  "--temperatures", "1", "--seeds", "1", "--quiet"])
    assert r.exit_code == 0, r.output
    assert seen["sampler"] == "host" and (tmp_path / "t.npz").is_file()
