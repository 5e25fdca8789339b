"""spot-export: graph, streaming writer, manifest, validation, presets, dry run, atomic output, bad input."""
from __future__ import annotations

import json
import os
import re
import shutil
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from click.testing import CliRunner

from spot.cli import main as cli
from spot.config import ModelConfig, load_config
from spot.errors import SpotError
from spot.export import export as export_mod
from spot.folder import manifest as manifest_mod
from spot.export.export import dry_run, export_checkpoint
from spot.export.target_file import DATA_FILE, TARGET_FILE
from spot.export.options import ExportOptions
from spot.folder.manifest import load_manifest
from spot.export.presets import PRESETS, resolve_source
from spot.reference.model import random_model
from tinymodels import CONTRADICTIONS, contradicting_copy

FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures"
TINY = ModelConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=16, max_position_embeddings=256, block_size=4,
                   mask_token_id=127, stop_ids=(126,))


def export(ckpt: Path, out: Path, **kw) -> Path:
    return export_checkpoint(resolve_source(str(ckpt)), out, ExportOptions(**{"dtype": "fp32", **kw}))


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("ckpt") / "tiny-sdar"
    random_model(TINY, seed=3).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def exported(ckpt, tmp_path_factory) -> Path:
    return export(ckpt, tmp_path_factory.mktemp("out") / "tiny-fp32")


def _no_leftovers(parent: Path) -> list[str]:
    return [p.name for p in parent.iterdir() if ".partial-" in p.name or ".old-" in p.name]


# -- the exported folder -----------------------------------------------------------------------------------------
def test_folder_has_graph_data_manifest_and_validation(exported):
    names = {p.name for p in exported.iterdir()}
    assert {TARGET_FILE, DATA_FILE, "manifest.json", "config.json"} <= names
    m = json.loads((exported / "manifest.json").read_text())
    assert m["model"] == {**TINY.to_dict(), "torch_dtype": "float32"} and m["dtype"] == "fp32" and m["opset"] == 17
    assert m["block_size"] == 4 and m["mask_token_id"] == 127 and m["stop_ids"] == [126]
    assert set(m["files"]) == {TARGET_FILE, DATA_FILE, "config.json", "epilogue.onnx", "kv_append.onnx"}
    assert m["graphs"]["epilogue"]["future_steps"] == 4        # min(8, block size 4) by default
    assert [i["name"] for i in m["graphs"]["target"]["inputs"]] == ["input_ids", "position_ids", "attn_bias",
                                                                     "past_k_0", "past_v_0", "past_k_1", "past_v_1"]
    assert m["format_version"] == 2 and m["graphs"]["target"]["inputs"][3]["shape"] == [2, "C", 16]
    cases = m["validation"]["cases"]
    assert len(cases) == 2 and all(c["ok"] and c["max_abs_dlogits"] < 1e-4 for c in cases)
    assert load_config(exported).block_size == 4      # config.json is readable by HF-style tools
    assert (exported / TARGET_FILE).stat().st_size < 100_000     # weights are external


def test_graph_is_plain_onnx_with_external_weights(exported):
    import onnx
    model = onnx.load(str(exported / TARGET_FILE), load_external_data=False)
    assert {o.domain for o in model.opset_import} == {""}
    assert all(n.domain in ("", "ai.onnx") for n in model.graph.node)
    external = [t for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    assert len(external) == len(TINY.expected_tensor_shapes())
    for t in external:
        meta = {e.key: e.value for e in t.external_data}
        assert meta["location"] == DATA_FILE and int(meta["offset"]) % 4096 == 0
    # Q is scaled (Mul by attn_scale) right before the first attention MatMul of every layer
    consumers = {i: n for n in model.graph.node for i in n.input}
    scaled = [n for n in model.graph.node if n.op_type == "Mul" and "attn_scale" in n.input]
    assert len(scaled) == TINY.num_hidden_layers
    for mul in scaled:
        reshape = consumers[mul.output[0]]
        assert reshape.op_type == "Reshape" and consumers[reshape.output[0]].op_type == "MatMul"


def _cache_cone(graph) -> list:
    """The nodes that read, directly or through other nodes, a cache input (past_k* / past_v*)."""
    tainted = {i.name for i in graph.inputs if i.name.startswith("past_")}
    cone = []
    for node in graph.nodes:          # declared in topological order
        if tainted & set(node.input):
            cone.append(node)
            tainted |= set(node.output)
    return cone


@pytest.mark.parametrize("dtype,weights", [("fp32", "fp"), ("fp16", "fp"), ("fp16", "int8"), ("fp16", "int4"),
                                           ("fp32", "nbits")])
def test_no_tensor_from_the_cache_is_broadcast_over_the_states(dtype, weights):
    """Format 2: nothing derived from the cache inputs is Expanded or Tiled, each layer's own cache inputs are read
    by one product each (K via its transpose), and one softmax per layer spans the prefix and the block; format 1's
    graph (BROADCAST) had an Expand per layer for K and for V, which the same walk finds."""
    from spot.export.graph import BROADCAST, build_target_graph
    from spot.export.quantize import QuantScheme
    quant = QuantScheme("int4", 32, weights == "nbits") if weights in ("int4", "nbits") else QuantScheme(weights)
    graph = build_target_graph(TINY, dtype, 17, quant)
    cone = _cache_cone(graph)
    assert not [n.name for n in cone if n.op_type in ("Expand", "Tile")]
    assert [i.name for i in graph.inputs][3:] == ["past_k_0", "past_v_0", "past_k_1", "past_v_1"]
    for layer in range(TINY.num_hidden_layers):
        readers = {name: sorted(n.op_type for n in graph.nodes if name in n.input)
                   for name in (f"past_k_{layer}", f"past_v_{layer}")}
        assert readers[f"past_k_{layer}"] in (["Transpose"], ["Shape", "Transpose"])     # layer 0 gives C
        assert readers[f"past_v_{layer}"] == ["MatMul"]
    assert sum(n.op_type == "Softmax" for n in graph.nodes) == TINY.num_hidden_layers
    old = build_target_graph(TINY, dtype, 17, quant, BROADCAST)
    assert sum(n.op_type == "Expand" for n in _cache_cone(old)) == 2 * TINY.num_hidden_layers


def test_streamed_chunks_give_identical_bytes(ckpt, exported, tmp_path, monkeypatch):
    """Tiny chunks exercise the multi-chunk and transposed-slab paths: same bytes as one chunk per tensor."""
    monkeypatch.setattr(export_mod, "CHUNK_ELEMS", 100)
    out = export(ckpt, tmp_path / "chunked", validate=False)
    assert (out / DATA_FILE).read_bytes() == (exported / DATA_FILE).read_bytes()


def test_weights_in_file_equal_checkpoint(exported, ckpt):
    from spot.checkpoint import Checkpoint
    import onnx
    from onnx import numpy_helper
    model = onnx.load(str(exported / TARGET_FILE))    # loads the external data
    weights = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    c = Checkpoint(ckpt)
    np.testing.assert_array_equal(weights["model.layers.1.mlp.down_proj.weight"],
                                  c.tensor("model.layers.1.mlp.down_proj.weight").T)
    np.testing.assert_array_equal(weights["model.embed_tokens.weight"], c.tensor("model.embed_tokens.weight"))


@pytest.mark.parametrize("opset", [17, 18])
def test_fp16_and_opset18_exports_validate(ckpt, tmp_path, opset):
    out = export(ckpt, tmp_path / "f16", dtype="fp16", opset=opset)
    m = json.loads((out / "manifest.json").read_text())
    assert m["dtype"] == "fp16" and m["opset"] == opset
    for case in m["validation"]["cases"]:
        assert case["ok"] and case["max_abs_dlogits"] <= case["tol_logits"]
    sess = ort.InferenceSession(str(out / TARGET_FILE), providers=["CPUExecutionProvider"])
    assert sess.get_inputs()[2].type == "tensor(float16)" and sess.get_outputs()[0].type == "tensor(float)"


def test_fp16_validation_scales_k_and_v_tolerances_separately(tmp_path):
    """K and V are compared each against its own scale: in this model max |V| is ~9x max |K|, and the fp16 rounding
    of V exceeded a tolerance taken from K (an fp16 export of a valid model was refused)."""
    from tinymodels import save_tiny_model
    out = export(save_tiny_model(tmp_path / "ck"), tmp_path / "f16", dtype="fp16")
    cases = json.loads((out / "manifest.json").read_text())["validation"]["cases"]
    assert all(c["ok"] for c in cases)
    assert any(c["tol_v"] > 2 * c["tol_k"] and c["max_abs_dv"] > c["tol_k"] for c in cases)


def test_bf16_source_checkpoint_exports_and_validates(tmp_path):
    """A bf16 sharded checkpoint written by scripts/make_random_checkpoint.py (the benchmark's input)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "make_random_checkpoint", Path(__file__).resolve().parents[1] / "scripts" / "make_random_checkpoint.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--shape", "tiny", "--layers", "1", "--out", str(tmp_path / "ck"), "--shard-gb", "0.0002"]) == 0
    assert len(list((tmp_path / "ck").glob("model-*.safetensors"))) > 1
    out = export(tmp_path / "ck", tmp_path / "out", dtype="fp16")
    m = json.loads((out / "manifest.json").read_text())
    assert m["source"]["storage_dtype"] == "BF16" and all(c["ok"] for c in m["validation"]["cases"])


def test_truncated_layer_validation_uses_the_shipped_bytes(ckpt, tmp_path):
    out = export(ckpt, tmp_path / "partial", validate_layers=1)
    v = json.loads((out / "manifest.json").read_text())["validation"]
    assert v["layers"] == 1 and v["of_layers"] == 2 and all(c["ok"] for c in v["cases"])
    assert not (out / ".validate.onnx").exists()


# -- atomic output ----------------------------------------------------------------------------------------------
def test_validation_failure_fails_with_numbers_and_leaves_nothing(ckpt, tmp_path):
    with pytest.raises(SpotError, match=r"validation failed: .*max \|ORT - torch\| logits"):
        export(ckpt, tmp_path / "bad", atol=1e-12)
    assert not (tmp_path / "bad").exists() and _no_leftovers(tmp_path) == []


def test_interrupted_write_leaves_nothing(ckpt, tmp_path, monkeypatch):
    calls = []

    def interrupt(*args):
        calls.append(1)
        if len(calls) == 5:
            raise KeyboardInterrupt
        return real(*args)
    real = export_mod.write_weight
    monkeypatch.setattr(export_mod, "write_weight", interrupt)
    with pytest.raises(KeyboardInterrupt):
        export(ckpt, tmp_path / "int", validate=False)
    assert not (tmp_path / "int").exists() and _no_leftovers(tmp_path) == []


def test_the_same_model_exported_again_keeps_its_fingerprint(ckpt, tmp_path):
    """Tuned budgets are keyed by the model's fingerprint: it hashed the whole manifest, whose export time differs
    between two exports of the same checkpoint, so `--budget auto` lost its budgets after a re-export."""
    from spot.app.tuned_budgets import model_fingerprint
    first = export(ckpt, tmp_path / "a", validate=False)
    again = export(ckpt, tmp_path / "b", validate=False)
    created = json.loads((first / "manifest.json").read_text())["created"]
    text = (again / "manifest.json").read_text()
    (again / "manifest.json").write_text(text.replace(json.loads(text)["created"], created[:-6] + "+09:00"))
    assert (first / "manifest.json").read_text() != (again / "manifest.json").read_text()
    assert model_fingerprint(first) == model_fingerprint(again)
    other = export(ckpt, tmp_path / "c", validate=False, dtype="fp16")
    assert model_fingerprint(other) != model_fingerprint(first)


def test_partial_folder_of_a_killed_export_is_cleaned(ckpt, tmp_path):
    stale = tmp_path / ".k.partial-999999999"        # no such process
    stale.mkdir()
    (stale / DATA_FILE).write_bytes(b"half")
    other = tmp_path / ".int4.partial-999999996"     # a killed export to another --out: named, not removed
    other.mkdir()
    (other / DATA_FILE).write_bytes(b"x" * 4096)
    said = []
    export_checkpoint(resolve_source(str(ckpt)), tmp_path / "k", ExportOptions(dtype="fp32", validate=False),
                      progress=said.append)
    assert not stale.exists() and _no_leftovers(tmp_path) == [other.name]
    assert any(f"{other} (0.00 GiB) was left by a killed spot-export of another --out" in s for s in said), said


def test_a_folder_replaced_while_it_is_opened_is_opened_again(ckpt, tmp_path, monkeypatch):
    """The manifest read from the old folder, the files checked in the new one: a false "changed since export"
    for a folder replaced by rename, the way docs/deployment.md recommends (1 open in 62 during upgrade-export)."""
    live = export(ckpt, tmp_path / "live", validate=False)
    other = export(ckpt, tmp_path / "other", dtype="fp16", validate=False)
    verify = manifest_mod.verify_files
    swaps = []

    def swapped_meanwhile(folder, files, level):
        if not swaps:
            swaps.append(1)
            live.rename(tmp_path / "aside")
            other.rename(live)
        return verify(folder, files, level)
    monkeypatch.setattr(manifest_mod, "verify_files", swapped_meanwhile)
    assert load_manifest(live).dtype == "fp16" and swaps
    monkeypatch.setattr(manifest_mod, "verify_files", verify)
    # the same while ONNX Runtime loads the graphs (a wider window than the checks): the engine opens it again
    from spot.engines import ort_engine, ort_sessions
    make_session, swaps = ort_sessions.make_session, []

    def swapped_while_loading(graph, *args, **kwargs):
        if not swaps:
            swaps.append(1)
            live.rename(tmp_path / "aside2")
            (tmp_path / "aside").rename(live)           # the fp32 export again
        return make_session(graph, *args, **kwargs)
    monkeypatch.setattr(ort_sessions, "make_session", swapped_while_loading)
    engine = ort_engine.OrtEngine(live)
    assert swaps and engine.exported.dtype == "fp32" and engine.dtype == np.float32
    monkeypatch.setattr(ort_sessions, "make_session", make_session)
    (live / DATA_FILE).write_bytes(b"changed")          # a folder really changed is still refused
    with pytest.raises(SpotError, match="changed since export"):
        load_manifest(live)


def test_a_folder_put_in_place_by_another_process_mid_swap_stays_and_the_old_one_goes(tmp_path, monkeypatch):
    """Two processes replacing one folder (concurrent --overwrite exports, or demo's cache) where the file system
    cannot exchange folders: the one whose rename lost said "{folder} is unchanged" — it held the other's folder —
    and left the old one aside, many GB."""
    from spot import replace as replace_mod
    folder, new = tmp_path / "out", tmp_path / ".out.partial-1"
    for d, name in ((folder, "old"), (new, "mine")):
        d.mkdir()
        (d / "who").write_text(name)
    rename = os.rename

    def racing(src, dst):
        if Path(src) == new:         # the other process's folder lands first
            Path(dst).mkdir()
            (Path(dst) / "who").write_text("theirs")
        return rename(src, dst)
    monkeypatch.setattr(replace_mod, "exchange", lambda a, b: False)
    monkeypatch.setattr(os, "rename", racing)
    with pytest.raises(SpotError, match="another process replaced .* now holds that process's"):
        replace_mod.swap_in_folder(new, folder)
    assert (folder / "who").read_text() == "theirs" and _no_leftovers(tmp_path) == [new.name]


def test_overwrite_through_a_link_replaces_what_it_points_to(ckpt, tmp_path):
    """--out a link to a folder: the folder it points to is replaced and the link stays (the link itself was
    replaced, and the previous export left behind a hidden link no cleanup removed)."""
    real = tmp_path / "real"
    export(ckpt, real, validate=False)
    previous = (real / "manifest.json").stat().st_ino
    (tmp_path / "link").symlink_to(real)
    export(ckpt, tmp_path / "link", validate=False, overwrite=True)
    assert (tmp_path / "link").is_symlink() and (real / "manifest.json").is_file()
    assert (real / "manifest.json").stat().st_ino != previous and _no_leftovers(tmp_path) == []
    (tmp_path / ".k.old-999999997").symlink_to(real)     # a link an older version moved aside: put back, not followed
    with pytest.raises(SpotError, match="already exists"):
        export(ckpt, tmp_path / "k", validate=False)
    assert os.readlink(tmp_path / "k") == str(real) and (real / "manifest.json").is_file()


@pytest.mark.parametrize("exchanges", [True, False])
def test_an_overwrite_interrupted_at_the_swap_keeps_one_export_in_place(ckpt, tmp_path, monkeypatch, exchanges):
    """Ctrl-C between moving the old export aside and renaming the new one in (a file system without an atomic
    exchange) puts the old one back; Ctrl-C while the old one is being removed (the new one in place) ends the
    export normally, the rest left to the next one."""
    from spot import replace as replace_mod
    if not exchanges:
        monkeypatch.setattr(replace_mod, "exchange", lambda a, b: False)
    out = tmp_path / "o"
    export(ckpt, out, validate=False)
    old = (out / "manifest.json").stat().st_ino
    real_rename = os.rename

    def interrupted_rename(src, dst):
        if ".partial-" in Path(src).name and Path(dst) == out:
            raise KeyboardInterrupt
        return real_rename(src, dst)
    with monkeypatch.context() as m:
        m.setattr(os, "rename", interrupted_rename)
        m.setattr(replace_mod, "exchange", lambda a, b: (_ for _ in ()).throw(KeyboardInterrupt()))
        with pytest.raises(KeyboardInterrupt):
            export(ckpt, out, validate=False, overwrite=True)
    assert (out / "manifest.json").stat().st_ino == old and _no_leftovers(tmp_path) == []

    real_rmtree = shutil.rmtree
    replaced = ".partial-" if exchanges else ".old-"       # where the old folder is when it is removed

    def interrupted_rmtree(path, *a, **kw):
        if replaced in Path(path).name and (out / "manifest.json").stat().st_ino != old:
            raise KeyboardInterrupt
        return real_rmtree(path, *a, **kw)
    monkeypatch.setattr(shutil, "rmtree", interrupted_rmtree)
    export(ckpt, out, validate=False, overwrite=True)          # returns: the new export is in place
    assert load_manifest(out) and (out / "manifest.json").stat().st_ino != old
    assert _no_leftovers(tmp_path) == [f".o{replaced}{os.getpid()}"]  # this process is alive: the next one removes it


def test_existing_output_needs_overwrite(ckpt, tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    with pytest.raises(SpotError, match="already exists"):
        export(ckpt, out, validate=False)
    export(ckpt, out, validate=False, overwrite=True)       # an empty folder
    assert (out / "manifest.json").exists() and _no_leftovers(tmp_path) == []
    export(ckpt, out, validate=False, overwrite=True)       # an export
    assert (out / "manifest.json").exists() and _no_leftovers(tmp_path) == []


def test_overwrite_replaces_only_what_spot_wrote(ckpt, tmp_path):
    """`--out DIR --overwrite` deleted DIR whatever it held (`--out ~/projects` took the user's files with it): it
    replaces an empty folder or an export holding only what spot writes there, and refuses anything else before
    any work, leaving every file in place."""
    from click.testing import CliRunner

    from spot.cli import main
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("the user's")
    export_with_notes = export(ckpt, tmp_path / "exp", validate=False)
    (export_with_notes / "notes.txt").write_text("the user's, beside an export")
    sub = export(ckpt, tmp_path / "sub", validate=False)
    (sub / "runs").mkdir()
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "manifest.json").write_text("{not json")
    cases = [(mine, "is not a spot export (no manifest.json; it holds notes.txt)"),
             (export_with_notes, "holds what spot did not write (or what changed since): notes.txt"),
             (sub, "holds what spot did not write (or what changed since): runs"),
             (broken, "is not valid JSON")]
    for out, words in cases:
        before = sorted(p.relative_to(out) for p in out.rglob("*"))
        with pytest.raises(SpotError, match=re.escape(words)) as e:
            export(ckpt, out, validate=False, overwrite=True)
        assert "`overwrite` replaces only an earlier spot export" in e.value.hint
        assert sorted(p.relative_to(out) for p in out.rglob("*")) == before and _no_leftovers(tmp_path) == []
    res = CliRunner().invoke(main, ["export", str(ckpt), "--out", str(mine), "--overwrite", "--quiet"])
    assert res.exit_code == 2 and "error: --out" in res.output and "hint: --overwrite replaces only" in res.output
    assert (mine / "notes.txt").read_text() == "the user's"


# -- manifest verification ----------------------------------------------------------------------------------------
def _copy(folder: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "copy"
    shutil.copytree(folder, dst)
    return dst


@pytest.mark.parametrize("name", [DATA_FILE, TARGET_FILE, "config.json"])
def test_changed_file_is_refused_by_name(exported, tmp_path, name):
    folder = _copy(exported, tmp_path)
    data = bytearray((folder / name).read_bytes())
    data[len(data) // 3] ^= 0x01
    (folder / name).write_bytes(bytes(data))
    with pytest.raises(SpotError, match=f"{name} in .* changed since export"):
        load_manifest(folder)


def test_truncated_or_missing_file_is_refused(exported, tmp_path):
    folder = _copy(exported, tmp_path)
    with open(folder / DATA_FILE, "r+b") as f:
        f.truncate(1000)
    with pytest.raises(SpotError, match=f"{DATA_FILE} .* 1000 bytes"):
        load_manifest(folder)
    (folder / DATA_FILE).unlink()
    with pytest.raises(SpotError, match=f"{DATA_FILE} is missing"):
        load_manifest(folder)


def test_quick_check_samples_large_files_and_full_check_reads_all(exported, tmp_path, monkeypatch):
    monkeypatch.setattr(manifest_mod, "QUICK_FULL_LIMIT", 0)       # treat every file as large
    monkeypatch.setattr(manifest_mod, "SAMPLE_BYTES", 64)          # leave gaps between the sampled chunks
    folder = _copy(exported, tmp_path)
    m = load_manifest(folder, "none").manifest      # (its hashes: the sampling above changed them)
    manifest_mod.add_files(folder, m, list(m.files)).write(folder)
    load_manifest(folder, "quick")
    data = bytearray((folder / DATA_FILE).read_bytes())
    second = round((len(data) - 64) / (manifest_mod.SAMPLE_COUNT - 1))
    assert second > 128
    data[second - 1] ^= 0x01                         # between the first two sampled chunks
    (folder / DATA_FILE).write_bytes(bytes(data))
    load_manifest(folder, "quick")                   # the sampled fingerprint cannot see this byte ...
    with pytest.raises(SpotError, match="its sha256 differs"):
        load_manifest(folder, "full")                # ... the full check does
    data[0] ^= 0x01                                  # the first chunk is always sampled
    (folder / DATA_FILE).write_bytes(bytes(data))
    with pytest.raises(SpotError, match="sampled sha256 differs"):
        load_manifest(folder, "quick")


@pytest.mark.parametrize("edit,message", [
    (lambda m: "{not json", "is not valid JSON"),
    (lambda m: {**m, "format": "onnx-zoo"}, "has format 'onnx-zoo', expected 'spot-exported-model'"),
    (lambda m: {**m, "format_version": 99}, "has format_version 99, this spot reads 2"),
    (lambda m: {k: v for k, v in m.items() if k != "max_nodes"}, "lacks field 'max_nodes'"),
    (lambda m: {**m, "model": {"vocab_size": "many"}}, "lacks field 'model.hidden_size'"),
    (lambda m: {**m, "model": {**m["model"], "vocab_size": "many"}}, "model.vocab_size is 'many', expected an integer"),
    (lambda m: {**m, "max_nodes": "64"}, "max_nodes is '64', expected an integer in 1..4096"),
    (lambda m: {**m, "max_context": 1e9}, "max_context is 1000000000.0, expected an integer"),
    (lambda m: {**m, "dtype": "int8"}, "dtype is 'int8', expected one of fp32, fp16"),
    (lambda m: {**m, "stop_ids": [12]}, r"stop_ids is \[12\] but model.stop_ids is"),
    (lambda m: {**m, "mask_token_id": 5}, "mask_token_id is 5 but model.mask_token_id is"),
    # a files entry outside the folder was stat'ed there (its size printed by `spot verify`); one of another shape
    # was a TypeError
    (lambda m: {**m, "files": {**m["files"], "/etc/passwd": m["files"]["config.json"]}},
     "files lists '/etc/passwd', expected the name of a file in the exported folder itself"),
    (lambda m: {**m, "files": {**m["files"], "../ckpt/config.json": m["files"]["config.json"]}}, "files lists '../"),
    (lambda m: {**m, "files": {**m["files"], "config.json": {**m["files"]["config.json"], "bytes": "12"}}},
     "files.config.json.bytes is '12'"),
    (lambda m: {**m, "files": {**m["files"], "config.json": 7}}, "files.config.json is 7, expected {\"bytes\""),
    (lambda m: {**m, "files": ["config.json"]}, "files is \\['config.json'\\], expected an object"),
    (lambda m: {**m, "graphs": {**m["graphs"], "target": "target.onnx"}}, "graphs.target is 'target.onnx'"),
])
def test_a_foreign_or_damaged_manifest_is_refused(exported, tmp_path, edit, message):
    folder = _copy(exported, tmp_path)
    edited = edit(json.loads((folder / "manifest.json").read_text()))
    (folder / "manifest.json").write_text(edited if isinstance(edited, str) else json.dumps(edited))
    with pytest.raises(SpotError, match=message) as e:
        load_manifest(folder)
    assert "re-export" in e.value.hint
    from click.testing import CliRunner

    from spot.cli import main
    res = CliRunner().invoke(main, ["verify", str(folder)])        # one line and a hint, nothing read outside
    assert res.exit_code == 2 and res.output.startswith("error:") and "hint:" in res.output, res.output
    assert "Traceback" not in res.output and "ok:" not in res.output


@pytest.mark.parametrize("field,value,graph", CONTRADICTIONS)
def test_a_manifest_that_contradicts_its_graphs_is_refused_at_open(exported, tmp_path, field, value, graph):
    """An edited num_hidden_layers, num_key_value_heads, head_dim, vocab_size or dtype (or the epilogue's
    future_steps) came up as ONNX Runtime's error and a traceback on the first pass: the engine compares each graph's
    declared inputs and outputs with what the manifest implies when it opens the folder."""
    from click.testing import CliRunner

    from spot.cli import main
    from spot.engines.ort_engine import OrtEngine
    folder = contradicting_copy(exported, tmp_path / "edited", field, value)
    with pytest.raises(SpotError, match=f"manifest.json contradicts {graph}") as e:
        OrtEngine(folder, sampler="device", kv_cache="device")
    assert "re-export" in e.value.hint
    res = CliRunner().invoke(main, ["generate", "--model", str(folder), "--backend", "ort", "--prompt-ids", "1,2",
                                    "--sampler", "device", "--max-new-tokens", "2"])
    assert res.exit_code == 2 and "contradicts" in res.output and "hint:" in res.output
    assert "Traceback" not in res.output, res.output


@pytest.mark.parametrize("name", ["manifest.json", "config.json", "tokenizer_config.json", "drafter.json"])
def test_non_utf8_bytes_in_a_json_file_are_named(exported, tmp_path, name):
    """Non-UTF-8 bytes in manifest.json, config.json, a tokenizer file or drafter.json ended in a
    UnicodeDecodeError traceback; now one line names the file and the byte."""
    from click.testing import CliRunner

    from spot.cli import main
    from spot.config import load_config
    from spot.runtime.drafter import load_drafter
    from spot.tokenizer import load_tokenizer
    from spot.assets import embedded_model_dir
    from tinymodels import save_tiny_tokenizer
    folder = _copy(exported, tmp_path)
    save_tiny_tokenizer(folder)
    for pair in ("drafter.onnx", "drafter.json"):
        shutil.copyfile(embedded_model_dir() / pair, folder / pair)
    path = folder / name
    path.write_bytes(path.read_bytes().replace(b"{", b'{"note": "caf\xe9 \xff\xfe", ', 1))
    load = {"manifest.json": load_manifest, "config.json": load_config, "tokenizer_config.json": load_tokenizer,
            "drafter.json": load_drafter}[name]
    with pytest.raises(SpotError, match=f"{re.escape(str(path))} is not UTF-8 text \\(byte [0-9]+: b'\\\\xe9'\\)"):
        load(folder)
    if name == "manifest.json":
        res = CliRunner().invoke(main, ["verify", str(folder)])
        assert res.exit_code == 2 and "is not UTF-8 text" in res.output and "Traceback" not in res.output


def test_the_checkpoint_itself_is_never_the_output(ckpt, tmp_path):
    """--out SOURCE --overwrite (or a folder holding SOURCE) would replace the checkpoint by the export."""
    import shutil
    src = tmp_path / "parent" / "ck"
    shutil.copytree(ckpt, src)
    for out in (src, src.parent, tmp_path):
        with pytest.raises(SpotError, match="would delete the checkpoint"):
            export(src, out, overwrite=True, validate=False)
    assert (src / "config.json").is_file() and any(src.glob("*.safetensors"))


def test_a_preset_with_another_models_checkpoint_is_refused():
    """`spot-export sdar-4b --checkpoint <the 8B>` would have exported the 8B under the 4B's name."""
    import pathlib
    fixture = pathlib.Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "sdar-8b-chat"
    if not (fixture / "config.json").is_file():
        pytest.skip("../shared/fixtures/sdar-8b-chat is not here")
    from spot.export.export import dry_run
    with pytest.raises(SpotError, match="is not sdar-4b: hidden_size 4096 \\(preset: 2560\\)") as e:
        dry_run(resolve_source("sdar-4b", str(fixture), True), ExportOptions(), lambda line: None)
    assert "preset of that checkpoint" in e.value.hint
    assert dry_run(resolve_source("sdar-8b", str(fixture), True), ExportOptions(), lambda line: None)["layers"] == 36


def test_spot_export_script_usage_and_errors(monkeypatch, capsys):
    """The `spot-export` console script: its own usage line, and user errors as one line (exit 2)."""
    import sys
    from spot.cli import export_main
    for argv, code in ((["spot-export", "--help"], 0), (["spot-export", "/nonexistent"], 2)):
        monkeypatch.setattr(sys, "argv", argv)
        with pytest.raises(SystemExit) as e:
            export_main()
        assert e.value.code == code
    out = capsys.readouterr()
    assert "Usage: spot-export [OPTIONS] SOURCE" in out.out
    assert "error: '/nonexistent' is neither an existing folder nor a preset" in out.err


def test_not_an_exported_folder(ckpt, tmp_path):
    with pytest.raises(SpotError, match="not an exported spot model folder") as e:
        load_manifest(ckpt)
    assert "spot-export" in e.value.hint
    with pytest.raises(SpotError, match="does not exist"):
        load_manifest(tmp_path / "nope")


# -- bad input ----------------------------------------------------------------------------------------------------
def test_non_sdar_folder_is_refused(ckpt, tmp_path):
    folder = _copy(ckpt, tmp_path)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["model_type"] = "llama"
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(SpotError, match="unknown model_type 'llama'"):
        export(folder, tmp_path / "o")
    with pytest.raises(SpotError, match="no config.json"):
        export(tmp_path, tmp_path / "o2")
    assert not (tmp_path / "o").exists() and not (tmp_path / "o2").exists()


def test_shard_missing_from_index_is_refused(ckpt, tmp_path):
    folder = _copy(ckpt, tmp_path)
    shutil.move(folder / "model.safetensors", folder / "model-00001-of-00002.safetensors")
    weight_map = {n: "model-00001-of-00002.safetensors" for n in TINY.expected_tensor_shapes()}
    weight_map["lm_head.weight"] = "model-00002-of-00002.safetensors"
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(SpotError, match="shard.*missing"):
        export(folder, tmp_path / "o")
    assert not (tmp_path / "o").exists() and _no_leftovers(tmp_path) == []


def test_broken_tokenizer_files_are_refused_before_the_weights(ckpt, tmp_path):
    """The export copies the tokenizer files: one that would fail `spot generate --prompt` is refused up front."""
    folder = _copy(ckpt, tmp_path)
    (folder / "vocab.json").write_text("[]")
    (folder / "merges.txt").write_text("#version: 0.2\n")
    with pytest.raises(SpotError, match="vocab.json holds a JSON list, expected an object"):
        export(folder, tmp_path / "o")
    assert not (tmp_path / "o").exists() and _no_leftovers(tmp_path) == []


@pytest.mark.parametrize("kw,match", [({"dtype": "bf16"}, "bf16 is not supported"),
                                      ({"dtype": "int3"}, "unknown dtype"),
                                      ({"opset": 13}, "opset 13 is not supported"),
                                      ({"max_nodes": 0}, "--max-nodes"),
                                      ({"max_context": 10}, "--max-context")])
def test_bad_options_are_refused(ckpt, tmp_path, kw, match):
    with pytest.raises(SpotError, match=match):
        export(ckpt, tmp_path / "o", **kw)
    assert not (tmp_path / "o").exists()


def test_fp16_overflow_names_the_tensor(tmp_path):
    model = random_model(TINY)
    with __import__("torch").no_grad():
        model.layers[0].mlp.up_proj.weight[0, 0] = 1e6
    model.save_pretrained(tmp_path / "ck")
    with pytest.raises(SpotError, match="model.layers.0.mlp.up_proj.weight has values beyond the fp16 range"):
        export(tmp_path / "ck", tmp_path / "o", dtype="fp16")


# -- presets and dry run --------------------------------------------------------------------------------------------
def test_preset_resolves_hf_cache_layout(ckpt, tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(SpotError, match=r"no local weights for sdar-1\.7b.*models--JetLM--SDAR-1\.7B-Chat") as e:
        resolve_source("sdar-1.7b")
    assert "huggingface-cli download JetLM/SDAR-1.7B-Chat" in e.value.hint
    snap = tmp_path / "hf" / "hub" / "models--JetLM--SDAR-1.7B-Chat" / "snapshots" / "0123abc"
    shutil.copytree(ckpt, snap)
    src = resolve_source("sdar-1.7b")
    assert src.checkpoint == snap and src.block_size == 4
    assert resolve_source("sdar-8b-b32", checkpoint=str(ckpt)).block_size == 32
    with pytest.raises(SpotError, match="neither an existing folder nor a preset"):
        resolve_source("sdar-9b")


def test_preset_block_size_is_recorded(ckpt, tmp_path):
    # the tiny checkpoint stands in for the preset's architecture (a real mismatch is refused: test above)
    src = replace(resolve_source("sdar-8b-b16", checkpoint=str(ckpt)), builtin_config=load_config(ckpt))
    out = export_checkpoint(src, tmp_path / "b16", ExportOptions(dtype="fp32", validate=False))
    m = json.loads((out / "manifest.json").read_text())
    assert m["block_size"] == 16 and m["source"]["preset"] == "sdar-8b-b16"


@pytest.mark.parametrize("preset,fixture", [("sdar-8b", "sdar-8b-chat"), ("sdar-4b", "sdar-4b-chat")])
def test_builtin_preset_configs_match_the_real_ones(preset, fixture):
    if not (FIXTURES / fixture / "config.json").is_file():
        pytest.skip(f"fixture {fixture} absent")
    real = load_config(FIXTURES / fixture)
    builtin = PRESETS[preset].config()
    assert replace(real, stop_ids=builtin.stop_ids) == builtin


def test_dry_run_of_sdar_8b_fixture_under_a_minute():
    if not (FIXTURES / "sdar-8b-chat" / "config.json").is_file():
        pytest.skip("fixture sdar-8b-chat absent")
    t0 = time.perf_counter()
    report = dry_run(resolve_source("sdar-8b", str(FIXTURES / "sdar-8b-chat"), dry_run=True),
                     ExportOptions(dtype="fp16"))
    assert time.perf_counter() - t0 < 60
    assert report["layers"] == 36 and report["weights"] == 36 * 11 + 3 and report["index_checked"]
    assert 16.3e9 < report["weight_bytes"] < 16.5e9


def test_dry_run_without_checkpoint_uses_builtin_config(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    report = dry_run(resolve_source("sdar-1.7b-b32", dry_run=True), ExportOptions(dtype="fp32", opset=18))
    assert report["block_size"] == 32 and report["layers"] == 28 and "built-in" in report["config"]


# -- command line -----------------------------------------------------------------------------------------------
def test_cli_export_verify_and_errors(ckpt, tmp_path):
    runner = CliRunner()
    out = tmp_path / "cli"
    r = runner.invoke(cli, ["export", str(ckpt), "--out", str(out), "--dtype", "fp32", "--no-validate"])
    assert r.exit_code == 0, r.output
    # the weights' progress is one bar (off a terminal: its summary), not a line per tensor
    assert "weights: 25 tensors" in r.output and "tensor 1/25" not in r.output and (out / "manifest.json").exists()
    r = runner.invoke(cli, ["verify", str(out)])
    assert r.exit_code == 0 and "ok:" in r.output
    (out / "config.json").write_text("{}")
    r = runner.invoke(cli, ["verify", str(out)])
    assert r.exit_code == 2 and "config.json" in r.output and "changed since export" in r.output
    r = runner.invoke(cli, ["export", str(tmp_path / "missing"), "--out", str(tmp_path / "x")])
    assert r.exit_code == 2 and "neither an existing folder nor a preset" in r.output
    r = runner.invoke(cli, ["export", str(ckpt), "--dtype", "bf16", "--out", str(tmp_path / "y")])
    assert r.exit_code == 2 and "bf16" in r.output and not (tmp_path / "y").exists()
    r = runner.invoke(cli, ["export", "sdar-8b", "--dry-run", "--quiet", "--checkpoint", str(ckpt)])
    assert r.exit_code == 2 and "is not sdar-8b: hidden_size 64 (preset: 4096)" in r.output
    r = runner.invoke(cli, ["export", str(ckpt), "--dry-run", "--weights", "int8", "--int4-block", "64"])
    assert r.exit_code == 2 and "--int4-block applies to --weights int4, got --weights int8" in r.output
