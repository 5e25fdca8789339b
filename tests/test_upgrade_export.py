"""`spot upgrade-export`: an older export's small graphs rewritten in place of the folder, weights untouched."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

from spot.cli import main as cli
from spot.config import ModelConfig
from spot.engines.ort_engine import OrtEngine
from spot.errors import SpotError
from spot.export.export import export_checkpoint
from spot.export.options import ExportOptions
from spot.folder.manifest import load_manifest
from spot.export.presets import resolve_source
from spot.reference.model import random_model
from spot.runtime.decode_plan import DecodeRequest, run_decoder
from spot.runtime.spot import TreeBudget
from spot.runtime.step import Sampling
from tinymodels import make_format1, manifest_json, write_manifest_json

pytest.importorskip("onnx")

CFG = ModelConfig(vocab_size=80, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=8, max_position_embeddings=128, block_size=8, mask_token_id=79,
                  stop_ids=(78,))


def _old_export(tmp_path):
    """A folder as an earlier version wrote it, simulated: format 1 (the cached prefix broadcast in the target
    graph, no kv_append graph), no TensorRT profile, an epilogue entry without positions_per_call."""
    random_model(CFG, seed=1).save_pretrained(tmp_path / "ckpt")
    folder = export_checkpoint(resolve_source(str(tmp_path / "ckpt")), tmp_path / "old",
                               ExportOptions(dtype="fp32", validate=False, epilogue_steps=2))
    make_format1(folder)
    manifest = manifest_json(folder)
    graphs = dict(manifest["graphs"])
    graphs["target"] = {k: v for k, v in graphs["target"].items() if k != "tensorrt_profile"}
    graphs["epilogue"] = {k: v for k, v in graphs["epilogue"].items() if k != "positions_per_call"}
    manifest["graphs"] = graphs
    write_manifest_json(folder, manifest)
    return folder


def test_upgrade_rewrites_the_graphs_and_keeps_the_weights(tmp_path):
    folder = _old_export(tmp_path)
    weights = folder / "target.onnx.data"
    load_manifest(folder, upgradable=True)
    inode, before = weights.stat().st_ino, manifest_json(folder)
    with pytest.raises(SpotError, match="has format_version 1, this spot reads 2") as refused:
        OrtEngine(folder)
    assert f"spot upgrade-export {folder}" in refused.value.hint
    r = CliRunner().invoke(cli, ["upgrade-export", str(folder), "--epilogue-steps", "3", "--epilogue-positions", "4"])
    assert r.exit_code == 0, r.output
    assert "target graph: format 1 -> 2" in r.output and "checking the new target graph" in r.output
    assert "epilogue D 3, 4 positions per call" in r.output
    load_manifest(folder, "full")                           # every hash matches
    after = manifest_json(folder)
    assert weights.stat().st_ino == inode                   # hard-linked, not copied
    assert after["files"]["target.onnx.data"] == before["files"]["target.onnx.data"]
    assert after["graphs"]["epilogue"]["positions_per_call"] == 4 and after["graphs"]["epilogue"]["future_steps"] == 3
    assert after["graphs"]["epilogue"]["validation"]["checked"] in (True, False) and "kv_append" in after["graphs"]
    # S up to two blocks: the fused store pass (a finished block and the next block's first state)
    assert after["graphs"]["target"]["tensorrt_profile"]["max"]["input_ids"] == [after["max_nodes"], 2 * CFG.block_size]
    assert after["format_version"] == 2 and after["files"]["target.onnx"] != before["files"]["target.onnx"]
    target = after["graphs"]["target"]
    assert [i["name"] for i in target["inputs"]][3:] == ["past_k_0", "past_v_0", "past_k_1", "past_v_1"]
    assert "past_k_1" in target["tensorrt_profile"]["min"] and "past_k" not in target["tensorrt_profile"]["min"]
    check = target["upgrade_check"]
    assert check["layers"] == 2 and all(c["ok"] and c["max_abs_dlogits"] < 1e-4 for c in check["cases"])
    assert "Expand" not in {n.op_type for n in onnx.load(str(folder / "target.onnx"), load_external_data=False)
                            .graph.node}
    # the same graph as a fresh export of the checkpoint: the same logits, bit for bit
    fresh = export_checkpoint(resolve_source(str(tmp_path / "ckpt")), tmp_path / "fresh",
                              ExportOptions(dtype="fp32", validate=False, epilogue_steps=2))
    assert (folder / "target.onnx").read_bytes() == (fresh / "target.onnx").read_bytes()
    assert not any(p.name.startswith((".old.", "old.")) for p in tmp_path.iterdir())      # no leftovers
    terms = after["memory"]["verify_pass_terms"]
    assert terms["sampling_epilogue"] == int(9.5 * 4 * 4 * CFG.vocab_size * 8)
    # it decodes as the host sampler does, with the device KV cache and the device sampler in runs of 4 positions
    engine = OrtEngine(folder, sampler="device", kv_cache="device", threads=1)
    host = OrtEngine(folder, sampler="host", kv_cache="host", threads=1)
    prompt = np.arange(3, 14)
    req = DecodeRequest(max_new_tokens=12, sampling=Sampling(1.0, seed=2), budget=TreeBudget(6, 3))
    assert run_decoder("tree", engine, prompt, req).token_ids == run_decoder("tree", host, prompt, req).token_ids


def test_upgrade_refuses_what_it_cannot_do(tmp_path, monkeypatch):
    folder = _old_export(tmp_path)
    from spot import replace as replace_mod

    def leftovers():
        return sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".old."))
    with monkeypatch.context() as m:           # a filesystem without hard links: a clear error, nothing left over
        m.setattr(os, "link", lambda *a, **k: (_ for _ in ()).throw(OSError(1, "Operation not permitted")))
        r = CliRunner().invoke(cli, ["upgrade-export", str(folder)])
        assert r.exit_code != 0 and "could not hard-link" in r.output and "Traceback" not in r.output
        assert leftovers() == [] and load_manifest(folder, "full", upgradable=True)
    real_rename = os.rename
    refused = OSError(1, "Operation not permitted")
    for failing in ("exchange", "old", ".old.partial"):   # a folder that cannot be renamed (immutable, busy)
        with monkeypatch.context() as m:
            def rename(src, dst, failing=failing):
                if Path(src).name.startswith(failing):
                    raise refused
                return real_rename(src, dst)
            m.setattr(replace_mod, "exchange", lambda a, b, failing=failing:
                      (_ for _ in ()).throw(refused) if failing == "exchange" else False)
            m.setattr(os, "rename", rename)
            r = CliRunner().invoke(cli, ["upgrade-export", str(folder)])
        assert r.exit_code == 2 and "could not" in r.output and "is unchanged" in r.output, r.output
        assert leftovers() == []
        assert "kv_append" not in load_manifest(folder, "full", upgradable=True).manifest.graphs   # intact
    with monkeypatch.context() as m:            # Ctrl-C between the two renames: the old folder back in place
        def interrupted(src, dst):
            if Path(src).name.startswith(".old.partial"):
                raise KeyboardInterrupt
            return real_rename(src, dst)
        m.setattr(replace_mod, "exchange", lambda a, b: False)
        m.setattr(os, "rename", interrupted)
        r = CliRunner().invoke(cli, ["upgrade-export", str(folder)])
    assert isinstance(r.exception, KeyboardInterrupt) or r.exit_code != 0
    assert leftovers() == []
    assert "kv_append" not in load_manifest(folder, "full", upgradable=True).manifest.graphs
    folder.rename(tmp_path / ".old.old-999999999")      # what a SIGKILL between the renames leaves: put back first
    r = CliRunner().invoke(cli, ["upgrade-export", str(folder), "--epilogue-positions", "3"])
    assert r.exit_code != 0 and "must divide the block size 8, got 3" in r.output
    assert leftovers() == [] and load_manifest(folder, "full", upgradable=True)
    r = CliRunner().invoke(cli, ["upgrade-export", str(tmp_path / "absent")])
    assert r.exit_code != 0 and "Traceback" not in r.output
    # --epilogue-steps 0 removes the epilogue
    r = CliRunner().invoke(cli, ["upgrade-export", str(folder), "--epilogue-steps", "0"])
    assert r.exit_code == 0 and "no epilogue" in r.output
    manifest = json.loads((folder / "manifest.json").read_text())
    assert "epilogue" not in manifest["graphs"] and not (folder / "epilogue.onnx").exists()


def test_upgrade_keeps_a_folder_exported_without_an_epilogue_without_one(tmp_path):
    """--epilogue-steps 0 at export (e.g. to save a Jetson's memory) survives an upgrade that only refreshes the
    other graphs; a folder from before epilogues (no kv_append either) still gets spot-export's default."""
    random_model(CFG, seed=1).save_pretrained(tmp_path / "ckpt")
    folder = export_checkpoint(resolve_source(str(tmp_path / "ckpt")), tmp_path / "none",
                               ExportOptions(dtype="fp32", validate=False, epilogue_steps=0))
    r = CliRunner().invoke(cli, ["upgrade-export", str(folder)])
    assert r.exit_code == 0, r.output
    assert "epilogue" not in load_manifest(folder).manifest.graphs and not (folder / "epilogue.onnx").exists()


def test_upgrade_leaves_a_current_folder_alone_and_keeps_its_memory_plan(tmp_path):
    """A second upgrade changes nothing (no swap, says so); a folder exported with --plan gets its plan recomputed
    for the new epilogue and an upgrade that would no longer fit that device is refused before anything is written."""
    from spot.export.memory_plan import make_plan, resolve_device
    from spot.folder.epilogue import EpilogueCall
    random_model(CFG, seed=1).save_pretrained(tmp_path / "ckpt")
    small, large = EpilogueCall(2, 1), EpilogueCall(2, 8)
    plans = [make_plan(CFG, "fp32", None, 128, 8, resolve_device("4GB"), epilogue=e) for e in (small, large)]
    assert plans[0].total < plans[1].total
    device = f"{(plans[0].total + plans[1].total) / 2 / 2**30:.9f}GB"     # fits P = 1, not P = 8
    folder = export_checkpoint(resolve_source(str(tmp_path / "ckpt")), tmp_path / "planned",
                               ExportOptions(dtype="fp32", validate=False, max_nodes=8, epilogue_steps=2,
                                             epilogue_positions=1, plan=device))
    before, inode = (folder / "manifest.json").read_bytes(), folder.stat().st_ino
    r = CliRunner().invoke(cli, ["upgrade-export", str(folder)])
    assert r.exit_code == 0 and "already current, nothing changed" in r.output, r.output
    # what it checked, then that: not the rebuild's steps first (they are a progress bar's updates)
    assert len(r.output.splitlines()) == 2 and "checking" in r.output and "linking" not in r.output, r.output
    assert (folder / "manifest.json").read_bytes() == before and folder.stat().st_ino == inode
    r = CliRunner().invoke(cli, ["upgrade-export", str(folder), "--epilogue-positions", "8"])
    assert r.exit_code == 2 and "would not fit" in r.output and "--epilogue-positions" in r.output, r.output
    assert (folder / "manifest.json").read_bytes() == before and not any(".planned." in p.name for p in tmp_path.iterdir())
    r = CliRunner().invoke(cli, ["upgrade-export", str(folder), "--epilogue-steps", "1"])    # D changed: P = 8
    assert r.exit_code == 2 and "would not fit" in r.output, r.output
    r = CliRunner().invoke(cli, ["upgrade-export", str(folder), "--epilogue-steps", "1", "--epilogue-positions", "2"])
    assert r.exit_code == 0 and "already current" not in r.output and "epilogue D 1, 2 positions" in r.output, r.output
    memory = load_manifest(folder, "full").manifest.memory
    expected = EpilogueCall(1, 2).peak_bytes(CFG.vocab_size)
    assert memory["plan"]["verify_pass_bytes"]["sampling_epilogue"] == expected
    assert memory["verify_pass_terms"]["sampling_epilogue"] == expected and memory["plan"]["device"] == device.lower()
