"""The typed manifest (spot.folder.manifest_record): it writes what spot wrote before it was typed, byte for byte (the
C++ host reads the same file), and its edits order fields as dict assignments did.

tests/data/manifests/ holds manifests spot-export and spot upgrade-export wrote at commit 75d0c2f, when the manifest
was a nested dict, for tests/tinymodels' tiny checkpoint (with a drafter pair beside it) at /tmp/fm_cmp/ckpt:
E1 fp32; E2 fp16, validated; E3 without an epilogue; E4 int4 as MatMulNBits; E5 int8 with a memory plan (4GB); U1
E1 upgraded to D 3, 2 positions; U2 E3 given an epilogue; U3-format1 E1 as format 1 wrote it (no kv_append, no
TensorRT profile, no positions_per_call) and U3 its upgrade; U4 E5 upgraded to D 1, 2 positions (its plan
recomputed); U6 E1 upgraded without an epilogue.
"""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spot.config import ModelConfig
from spot.export import export as export_mod
from spot.export.export import COPIED_FILES, build_manifest
from spot.export.options import ExportOptions
from spot.folder.manifest import MANIFEST, check_manifest_rules
from spot.folder.manifest_record import (ABSENT, EpilogueGraph, GraphRecord, Manifest, TargetGraph, file_records)

FIXTURES = Path(__file__).parent / "data" / "manifests"
WRITTEN = {path.stem: path.read_text() for path in sorted(FIXTURES.glob("*.json"))}
EXPORTS = {
    "E1": ExportOptions(dtype="fp32", validate=False),
    "E2": ExportOptions(dtype="fp16", validate=True),
    "E3": ExportOptions(dtype="fp32", validate=False, epilogue_steps=0),
    "E4": ExportOptions(dtype="fp32", validate=False, weights="int4", int4_block=32, matmulnbits=True),
    "E5": ExportOptions(dtype="fp32", validate=False, weights="int8", max_nodes=8, epilogue_steps=2,
                        epilogue_positions=1, plan="4GB"),
}


def test_the_fixtures_are_manifests_spot_reads():
    assert len(WRITTEN) == 11
    for text in WRITTEN.values():
        data = json.loads(text)
        MANIFEST.check(data)
        check_manifest_rules(data)


@pytest.mark.parametrize("name", sorted(WRITTEN))
def test_a_manifest_read_and_written_back_is_the_same_file(name):
    manifest = Manifest.from_json(json.loads(WRITTEN[name]))
    assert manifest.text() == WRITTEN[name]


@pytest.mark.parametrize("name", sorted(EXPORTS))
def test_the_export_builds_the_manifest_it_wrote_as_a_dict(name, monkeypatch):
    """The typed builder, given what the export measured (hashes, validation, the small graphs' records, the time),
    writes the file the dict builder wrote: every derived field (the I/O contract, the TensorRT profile, the weights'
    scheme, the memory numbers, the tokenizer files, the drafter) in the same place with the same value."""
    written = json.loads(WRITTEN[name])
    monkeypatch.setattr(export_mod, "__version__", written["exporter"]["version"])
    source = written["source"]
    drafter = "drafter" in written["graphs"]
    copied = [n for n in COPIED_FILES if n in written["tokenizer_files"] or drafter and n.startswith("drafter.")]
    graphs = {n: (EpilogueGraph if n == "epilogue" else GraphRecord).from_json(written["graphs"][n])
              for n in ("epilogue", "kv_append") if n in written["graphs"]}
    built = build_manifest(ModelConfig.from_dict(written["model"]), EXPORTS[name], written["max_context"],
                           SimpleNamespace(preset=source["preset"]),
                           SimpleNamespace(dir=source["checkpoint"], storage_dtype=source["storage_dtype"]), copied,
                           written["validation"], written["opset"], graphs, file_records(written["files"]),
                           written["created"])
    assert built.text() == WRITTEN[name]
    assert built.key_order == () and built == Manifest.from_json(written)     # built, not read: the same record


def test_the_typed_fields_are_what_the_readers_read():
    m = Manifest.from_json(json.loads(WRITTEN["U4"]))
    assert (m.format_version, m.dtype, m.block_size, m.max_nodes, m.max_context, m.stop_ids) == (2, "fp32", 4, 8, 64,
                                                                                                  (62,))
    assert isinstance(m.graphs.target, TargetGraph) and m.graphs.target.file == "target.onnx"
    assert (m.graphs.epilogue.future_steps, m.graphs.epilogue.positions_per_call) == (1, 2)
    assert m.graphs.get("kv_append").extra["validation"]["checked"] and m.files["target.onnx"].bytes > 0
    assert m.quantized and not m.ort_only and m.recorded_plan["device"] == "4gb" and m.graph_opset == 17
    assert m.ort_session_config and m.model_name == "ckpt"
    old = Manifest.from_json(json.loads(WRITTEN["U3-format1"]))
    assert old.graphs.target.tensorrt_profile is ABSENT and old.graphs.epilogue.positions_per_call is ABSENT
    assert "kv_append" not in old.graphs and old.memory["plan"] is None and old.recorded_plan is None


def test_writing_is_whole_or_nothing(tmp_path):
    manifest = Manifest.from_json(json.loads(WRITTEN["E1"]))
    assert manifest.write(tmp_path).read_text() == WRITTEN["E1"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["manifest.json"]         # no temp file left


# -- properties: any key order, any field spot does not know, any edit ----------------------------------------------
JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers(-3, 3) | st.text(max_size=4),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner,
                                                                                        max_size=3), max_leaves=6)
# the fields whose values are JSON as written (graphs and files hold records), and some spot does not know
MANIFEST_KEYS = [k for k in Manifest.typed_fields() if k not in ("graphs", "files")] + ["legacy", "note"]
TARGET_KEYS = [k for k in TargetGraph.typed_fields() if k != "file"] + ["legacy"]


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(sorted(WRITTEN)), st.randoms(use_true_random=False),
       st.dictionaries(st.sampled_from(["legacy", "note", "x"]), JSON_VALUES, max_size=2))
def test_any_key_order_and_unknown_fields_are_kept(name, rnd, unknown):
    data = json.loads(WRITTEN[name])
    items = [*data.items(), *unknown.items()]
    rnd.shuffle(items)
    data = dict(items)
    target = list(data["graphs"]["target"].items())
    rnd.shuffle(target)
    data["graphs"]["target"] = dict(target)
    assert Manifest.from_json(data).text() == json.dumps(data, indent=2) + "\n"


EDITS = st.lists(st.tuples(st.booleans(), st.integers(0, 100), st.one_of(st.just(ABSENT), JSON_VALUES)), max_size=8)


@settings(max_examples=80, deadline=None)
@given(st.sampled_from(sorted(WRITTEN)), st.booleans(), EDITS)
def test_edits_order_fields_as_dict_assignments_do(name, built, edits):
    """A record's `set` keeps a field's place, puts a new one last and drops an ABSENT one, as `d[k] = v` and
    `d.pop(k)` do on the JSON (upgrade-export wrote its manifests so); a built record (no key order read) too."""
    data = json.loads(WRITTEN[name])
    manifest = Manifest.from_json(data)
    target = manifest.graphs.target
    if built and name in EXPORTS:      # an export's order is the records' own: the builder's
        manifest, target = replace(manifest, key_order=()), replace(target, key_order=())
    for on_target, which, value in edits:
        obj, keys = (data["graphs"]["target"], TARGET_KEYS) if on_target else (data, MANIFEST_KEYS)
        key = keys[which % len(keys)]
        obj.pop(key, None) if value is ABSENT else obj.__setitem__(key, value)
        if on_target:
            target = target.set(**{key: value})
        else:
            manifest = manifest.set(**{key: value})
    manifest = manifest.set(graphs=manifest.graphs.with_graph("target", target))
    assert manifest.text() == json.dumps(data, indent=2) + "\n"
