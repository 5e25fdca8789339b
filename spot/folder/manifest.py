"""manifest.json of an exported folder: what the runtime needs to open it, and hashes to refuse a changed one.

The runtime never guesses: it opens a folder by its manifest (model config, block size, mask/stop ids, dtype,
opset, graph files and their input/output contract) and checks every listed file before use.

Verification levels (`load_manifest(dir, verify=...)`):
  "quick" (default): every file's size; files up to QUICK_FULL_LIMIT bytes by full sha256, larger ones (the
           weights) by `sample_sha256` = sha256 over the file size (8 bytes, little endian) followed by
           SAMPLE_COUNT chunks of SAMPLE_BYTES read at offsets round(i * (size - SAMPLE_BYTES) / (SAMPLE_COUNT-1)).
           Catches truncation, replacement and most corruption in well under a second for 16 GB.
  "full":  full sha256 of every file (`spot verify DIR`); reads everything once.
  "none":  existence only.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import numpy as np

from spot.config import (DEFAULT_BLOCK_SIZE, DEFAULT_MASK_TOKEN_ID, DEFAULT_STOP_IDS, MAX_BLOCK_SIZE, MAX_POSITIONS,
                         MODEL_FIELDS, MODEL_SECTION, TOKEN_ID, ModelConfig, check_model_rules)
from spot.descriptors import load_descriptor, read_json, sha256_file
from spot.drafter_files import DRAFTER_JSON, DRAFTER_ONNX
from spot.errors import SpotError
from spot.files import opened_whole, plain_file_name
from spot.folder.manifest_record import MANIFEST_NAME, FileRecord, Manifest
from spot.replace import interrupted_replacement
from spot.schema import SHA256, Integer, ListOf, MapOf, Mismatch, Nullable, Record, Satisfies, Text, rule

# The model dtypes an exported folder may have (manifest "dtype") as numpy dtypes: here, not in spot.export.graph,
# because the runtime opens folders without onnx installed.
NP_DTYPES = {"fp32": np.float32, "fp16": np.float16}

FORMAT = "spot-exported-model"
# 2: the target graph takes each layer's cache as its own inputs past_k_<l> / past_v_<l> [Hkv,C,D] and reads the
# cached prefix once for all states of a pass (spot.export.graph.SHARED_PREFIX); kv_append appends one layer.
# `spot upgrade-export` turns a format 1 folder (one stacked cache input, the prefix broadcast) into format 2.
FORMAT_VERSION = 2
UPGRADABLE_VERSIONS = (1,)
QUICK_FULL_LIMIT = 64 * 1024 * 1024
SAMPLE_COUNT = 16
SAMPLE_BYTES = 64 * 1024
VERIFY_LEVELS = ("quick", "full", "none")
# The drafter pair is verified by drafter.json itself (its onnx_sha256, checked when the drafter loads), not by the
# export's manifest: `spot train-drafter` and `spot calibrate-drafter` replace it in place, and an export listing its
# hashes would be refused after every retraining (or, interrupted between the two writes, for good). Manifests
# written before list them under `files`; opening skips those entries.
DRAFTER_FILES = (DRAFTER_ONNX, DRAFTER_JSON)


# -- the manifest's fields (spot.schema; the C++ host checks the same: cpp/src/engine.cpp, cpp/src/bounds.h) ------
MAX_NODES = 4096                # spot-export's --max-nodes range
MAX_FILE_BYTES = 2**63 - 1      # a file's size as the C++ host holds it (int64)
MAX_DIMS = 8                    # dims of one input in a TensorRT shape profile


def folder_file_name(name: str) -> bool:
    """A name of a file in the exported folder itself: never a path that leaves it (nor a backslash, a separator
    on Windows), as both hosts read it."""
    return plain_file_name(name) and "\\" not in name


FILE_NAME = Satisfies(folder_file_name, "the name of a file in the exported folder itself")
FILE_RECORD = Record({"bytes": Integer(0, MAX_FILE_BYTES), "sha256": SHA256, "sample_sha256": SHA256},
                     ("bytes", "sha256", "sample_sha256"), what='{"bytes": N, "sha256": ..., "sample_sha256": ...}')
FILE_RECORDS = MapOf(FILE_NAME, FILE_RECORD)      # manifest["files"]
GRAPH = Record({"file": FILE_NAME}, ("file",), what='an object with a "file" name')
SHAPES = MapOf(Text(), ListOf(Integer(0, MAX_POSITIONS), MAX_DIMS), what="an object of input: [dims]")
TRT_PROFILE = Record({end: SHAPES for end in ("min", "opt", "max")}, ("min", "opt", "max"),
                     what='{"min"|"opt"|"max": {input: [dims]}}')
TARGET = Record({"file": FILE_NAME, "tensorrt_profile": Nullable(TRT_PROFILE)}, ("file",), what=GRAPH.what)
EPILOGUE = Record({"file": FILE_NAME, "future_steps": Integer(1, MAX_BLOCK_SIZE),
                   "positions_per_call": Nullable(Integer(1, MAX_BLOCK_SIZE))}, ("file", "future_steps"),
                  what='an object with a "file" name and "future_steps"')
MANIFEST = Record({
    "model": MODEL_SECTION,
    "dtype": Text(tuple(NP_DTYPES)),
    "block_size": Integer(1, MAX_BLOCK_SIZE),
    "max_nodes": Integer(1, MAX_NODES),
    "max_context": Integer(1, MAX_POSITIONS),
    "mask_token_id": TOKEN_ID,
    "stop_ids": MODEL_FIELDS["stop_ids"],
    "graphs": Record({"target": TARGET, "epilogue": Nullable(EPILOGUE)}, ("target",), others=GRAPH),
    "files": FILE_RECORDS,
    "ort_session_config": Nullable(MapOf(Text(), Text())),
}, ("model", "dtype", "block_size", "max_nodes", "max_context", "graphs", "files"))


def check_manifest_rules(manifest: dict) -> None:
    """The rules across a manifest's fields (each field checked by MANIFEST): the model's own, max_context within
    the model's positions, the epilogue's numbers within the block, each graph a file the files record hashes (the
    drafter's: drafter.json hashes it); Mismatch naming the field that breaks one."""
    model = {"block_size": DEFAULT_BLOCK_SIZE, "mask_token_id": DEFAULT_MASK_TOKEN_ID, **manifest["model"]}
    try:
        check_model_rules(model)
    except Mismatch as e:
        raise e.inside("model") from None
    block, positions = manifest["block_size"], model["max_position_embeddings"]
    rule(block <= manifest["max_context"] <= positions, "max_context", manifest["max_context"],
         f"an integer in {block}..{positions} (block_size..model.max_position_embeddings)")
    epilogue = manifest["graphs"].get("epilogue")
    if epilogue is not None:
        rule(epilogue["future_steps"] <= block, "graphs.epilogue.future_steps", epilogue["future_steps"],
             f"an integer in 1..{block} (the block size)")
        per_call = epilogue.get("positions_per_call")
        rule(per_call is None or (per_call <= block and block % per_call == 0), "graphs.epilogue.positions_per_call",
             per_call, f"a divisor of the block size {block}")
    for name, graph in manifest["graphs"].items():
        rule(name == "drafter" or graph is None or graph["file"] in manifest["files"], f"graphs.{name}.file",
             graph and graph["file"], "a file the files record lists (no hash vouches for it otherwise)")


def past_input_names(layers: int) -> list[tuple[str, str]]:
    """The target graph's cache inputs, (K, V) per layer: each layer's [Hkv,C,D] fed where it is, no copy."""
    return [(f"past_k_{layer}", f"past_v_{layer}") for layer in range(layers)]


def past_feeds(past_k, past_v) -> dict:
    """Stacked caches [L,Hkv,C,D] as the target graph's per-layer inputs (views, no copy)."""
    out = {}
    for layer, (k_name, v_name) in enumerate(past_input_names(len(past_k))):
        out[k_name], out[v_name] = past_k[layer], past_v[layer]
    return out


def io_contract(cfg: ModelConfig, dtype: str) -> dict:
    """The graph's inputs and outputs as JSON for the manifest (symbolic dims N, S, C, T = C + S)."""
    L, hkv, hd, v = cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, cfg.vocab_size
    dt = {"fp32": "float32", "fp16": "float16"}[dtype]
    return {
        "dims": {"N": "candidate block states sharing the cached prefix (1 for prefill/store)",
                 "S": "new tokens per state (block size B for block steps, P for a prefill of P tokens)",
                 "C": "cached prefix length (0 for prefill: pass empty past_k_<l>/past_v_<l>)",
                 "T": "C + S"},
        "inputs": [
            {"name": "input_ids", "dtype": "int64", "shape": ["N", "S"]},
            {"name": "position_ids", "dtype": "int64", "shape": ["S"], "note": "absolute positions C..C+S-1"},
            {"name": "attn_bias", "dtype": dt, "shape": ["S", "T"],
             "note": "additive mask, 0 = attend, -inf = masked; block-causal for prefill, zeros for a block step"},
            *({"name": name, "dtype": dt, "shape": [hkv, "C", hd],
               "note": f"layer {layer}'s cached {'K' if name.startswith('past_k') else 'V'}, fed where it is"}
              for layer, pair in enumerate(past_input_names(L)) for name in pair),
        ],
        "outputs": [
            {"name": "logits", "dtype": "float32", "shape": ["N", "S", v]},
            {"name": "new_k", "dtype": dt, "shape": [L, "N", hkv, "S", hd],
             "note": "K of the S new tokens only (after RoPE); the host appends it to its cache"},
            {"name": "new_v", "dtype": dt, "shape": [L, "N", hkv, "S", hd]},
        ],
    }


def graph_contracts(cfg: ModelConfig, dtype: str, future_steps: int | None = None) -> dict[str, dict]:
    """What the model section (and the epilogue's future_steps) says each graph declares: {graph: {"inputs": [...],
    "outputs": [...]}} with io_contract's records; only the dims the model fixes are numbers (the hosts check a
    folder's graphs against them when opening it)."""
    hkv, hd, dt = cfg.num_key_value_heads, cfg.head_dim, io_contract(cfg, dtype)
    kv = dt["inputs"][3]["dtype"]      # past_k_0's: the model dtype
    # kv_append appends one layer (format 2): num_hidden_layers is the target's to check (past_k_<l>, new_k)
    return {"target": {"inputs": dt["inputs"], "outputs": dt["outputs"]},
            "kv_append": {"inputs": [{"name": n, "dtype": kv, "shape": [hkv, "C", hd]} for n in ("past_k", "past_v")]
                          + [{"name": n, "dtype": kv, "shape": [hkv, "S", hd]} for n in ("new_k", "new_v")],
                          "outputs": [{"name": n, "dtype": kv, "shape": [hkv, "T", hd]} for n in ("k", "v")]},
            "epilogue": {"inputs": [{"name": "logits", "dtype": "float32", "shape": ["N", "P", cfg.vocab_size]}],
                         "outputs": [{"name": "future_tokens", "dtype": "int64", "shape": ["N", future_steps, "P"]}]}}


def check_graph_io(exported: "ExportedModel", name: str, declared: dict[str, tuple[str, list]]) -> None:
    """SpotError unless graph `name` declares what the manifest's model section says (graph_contracts). declared:
    input / output name -> (dtype as the manifest writes it, shape: numbers, or names / None where dynamic). An edited
    num_hidden_layers, num_key_value_heads, head_dim, vocab_size or dtype surfaced as an ONNX Runtime error and a
    traceback on the first pass (the C++ host checks the same when it opens a folder)."""
    graphs = exported.manifest.graphs
    contract = graph_contracts(exported.config, exported.dtype, graphs.epilogue and graphs.epilogue.future_steps)[name]
    graph = graphs.get(name).file
    for want in [*contract["inputs"], *contract["outputs"]]:
        dtype, shape = declared.get(want["name"], (None, None))
        fits = shape is not None and len(shape) == len(want["shape"]) and all(
            not isinstance(w, int) or not isinstance(g, int) or g == w for g, w in zip(shape, want["shape"]))
        if dtype != want["dtype"] or not fits:
            def show(d, s):
                return "none" if d is None else f"{d} [{', '.join(str(x) for x in s)}]"
            raise SpotError(f"{exported.folder}/{MANIFEST_NAME} contradicts {graph}: {want['name']} is "
                            f"{show(dtype, shape)} in the graph, the manifest implies "
                            f"{show(want['dtype'], want['shape'])} (from its dtype, model.num_hidden_layers, "
                            "num_key_value_heads, head_dim, vocab_size and the epilogue's future_steps: edited?)",
                            "restore manifest.json from the export, or re-export the model with spot-export")


def sample_sha256(path: Path) -> str:
    """sha256 of (size, SAMPLE_COUNT evenly spaced SAMPLE_BYTES chunks): a constant-time fingerprint."""
    size = path.stat().st_size
    h = hashlib.sha256(size.to_bytes(8, "little"))
    with open(path, "rb") as f:
        span = max(size - SAMPLE_BYTES, 0)
        for i in range(SAMPLE_COUNT):
            f.seek(round(i * span / (SAMPLE_COUNT - 1)))
            h.update(f.read(SAMPLE_BYTES))
    return h.hexdigest()


def file_entry(path: Path) -> FileRecord:
    """Manifest record of one file: bytes, sha256, sample_sha256."""
    return FileRecord(bytes=path.stat().st_size, sha256=sha256_file(path), sample_sha256=sample_sha256(path))


def verify_files(folder: Path, files: Mapping[str, FileRecord], level: str = "quick") -> None:
    """Raise SpotError naming the first listed file that is missing or differs from its manifest record."""
    if level not in VERIFY_LEVELS:
        raise SpotError(f"unknown verify level {level!r}, expected one of {', '.join(VERIFY_LEVELS)}")
    hint = "the folder was modified or copied incompletely: copy it again or re-export it with spot-export"
    for name, rec in files.items():
        if name in DRAFTER_FILES:
            continue
        change = file_change(folder / name, rec, level)
        if change == "missing":
            raise SpotError(f"{name} is missing from the exported folder {folder}", hint)
        if change is not None:
            raise SpotError(f"{name} in {folder} changed since export: {change}", hint)


def file_change(path: Path, rec: FileRecord, level: str = "quick") -> str | None:
    """How the file at `path` differs from its manifest record — "missing", its size, or its (sampled) sha256 — or
    None when it matches at `level` (the module's docstring)."""
    if not path.is_file():
        return "missing"
    if level == "none":
        return None
    size = path.stat().st_size
    if size != rec.bytes:
        return f"{size} bytes, manifest says {rec.bytes}"
    if level == "full" or size <= QUICK_FULL_LIMIT:
        ok, what = sha256_file(path) == rec.sha256, "sha256"
    else:
        ok, what = sample_sha256(path) == rec.sample_sha256, "sampled sha256"
    return None if ok else f"its {what} differs from the manifest"


@dataclass(frozen=True)
class ExportedModel:
    """An opened exported folder: the manifest's facts with paths resolved."""

    folder: Path
    manifest: Manifest
    config: ModelConfig

    @property
    def dtype(self) -> str:
        return self.manifest.dtype

    @property
    def block_size(self) -> int:
        return self.manifest.block_size

    @property
    def max_nodes(self) -> int:
        return self.manifest.max_nodes

    @property
    def max_context(self) -> int:
        return self.manifest.max_context

    def graph_path(self, name: str = "target") -> Path:
        graphs = self.manifest.graphs
        if name not in graphs:
            raise SpotError(f"the exported folder {self.folder} has no {name!r} graph "
                            f"(it has: {', '.join(graphs) or 'none'})", "re-export it with a newer spot-export")
        file = graphs.get(name).file
        if not folder_file_name(file):     # never a path that leaves the folder (checked when read, too)
            raise SpotError(f"{self.folder}/manifest.json names graph file {file!r}, expected a file name in its "
                            "own folder", "re-export it with spot-export")
        if file not in self.manifest.files and name != "drafter":    # (drafter.json hashes its graph)
            raise SpotError(f"{self.folder}/manifest.json names graph file {file!r}, which its files record does "
                            "not list (no hash vouches for it)", "re-export it with spot-export")
        return self.folder / file


def add_files(folder: Path, manifest: Manifest, names: list[str]) -> Manifest:
    """The manifest with `names` recorded (or recorded again) in its files, as they are in `folder` now."""
    return manifest.set(files={**manifest.files, **{name: file_entry(folder / name) for name in names}})


def load_manifest(folder: str | Path, verify: str = "quick", upgradable: bool = False) -> ExportedModel:
    """Open an exported folder by its manifest; SpotError (naming the file) when it is absent, foreign or changed.
    A folder replaced while it is checked is opened again, once (spot.files.opened_whole). upgradable: also a folder
    of an older format `spot upgrade-export` converts (UPGRADABLE_VERSIONS), which no engine runs."""
    return opened_whole(folder, lambda: _load_manifest_once(folder, verify, upgradable))


def _format_version(path: Path):
    try:
        data = read_json(path, "", strict=True)
    except (OSError, SpotError):
        return None
    version = data.get("format_version") if isinstance(data, dict) and data.get("format") == FORMAT else None
    return version if isinstance(version, int) and not isinstance(version, bool) else None


def _load_manifest_once(folder: str | Path, verify: str, upgradable: bool = False) -> ExportedModel:
    folder = Path(folder)
    if not folder.is_dir():
        aside = interrupted_replacement(folder)
        if aside is not None:       # the two-rename fallback of spot.replace, killed in its window
            raise SpotError(f"exported model folder {folder} does not exist: a run replacing it was killed, and the "
                            f"previous one is at {aside}", f"rename {aside} to {folder} (the next spot-export or "
                            "spot upgrade-export of it does that first)")
        what = "is a file" if folder.exists() else "does not exist"
        raise SpotError(f"exported model folder {folder} {what}", "pass the folder spot-export wrote, or export "
                        "one with `spot-export`")
    path = folder / MANIFEST_NAME
    if not path.is_file():
        hint = ("this looks like a Hugging Face checkpoint: export it first with `spot-export "
                f"{folder}`, or use `backend=\"torch\"`" if (folder / "config.json").is_file() and not
                any(folder.glob("*.onnx")) else "export a checkpoint with `spot-export` to get one")
        raise SpotError(f"{folder} is not an exported spot model folder (no {MANIFEST_NAME})", hint)
    remedy = "re-export the model with this version of spot-export"
    version = _format_version(path)
    if version in UPGRADABLE_VERSIONS and not upgradable:
        raise SpotError(f"{path} has format_version {version}, this spot reads {FORMAT_VERSION} (its target graph "
                        "takes each layer's cache as its own input and reads the cached prefix once per pass)",
                        f"run `spot upgrade-export {folder}` (seconds: the graph is rewritten, the weights stay)")
    manifest = load_descriptor(path, FORMAT, version if version in UPGRADABLE_VERSIONS else FORMAT_VERSION,
                               ("model", "dtype", "block_size", "max_nodes", "max_context", "graphs", "files"),
                               remedy, strict=True)
    check_manifest_fields(path, manifest, remedy)
    config = ModelConfig.from_dict(manifest["model"], f"{path}: model", remedy)
    manifest = Manifest.from_json(manifest)     # (an epilogue that is null: none, as if absent)
    if version == FORMAT_VERSION and "kv_append" not in manifest.graphs and not upgradable:
        # spot-export and spot upgrade-export write it into every format 2 folder: one without it is older
        raise SpotError(f"{path} lists no kv_append graph, expected one in every format {FORMAT_VERSION} folder",
                        f"run `spot upgrade-export {folder}` (seconds: the graph is written, the weights stay)")
    verify_files(folder, manifest.files, verify)
    return ExportedModel(folder, manifest, config)


def check_manifest_fields(path: Path, manifest: dict, remedy: str) -> None:
    """The manifest is not hashed: every field the hosts read is checked for type and range (MANIFEST), across
    fields (check_manifest_rules), and its decoding defaults against the model config they were copied from (the
    hosts decode with model.*), so an edited manifest is refused, not half-used — and never sizes an allocation."""
    try:
        MANIFEST.check(manifest)
        check_manifest_rules(manifest)
    except Mismatch as e:
        raise SpotError(e.message(str(path)), remedy) from None
    section = manifest["model"]
    model = {"block_size": section.get("block_size", DEFAULT_BLOCK_SIZE),
             "mask_token_id": section.get("mask_token_id", DEFAULT_MASK_TOKEN_ID),
             "stop_ids": list(section.get("stop_ids", DEFAULT_STOP_IDS))}
    for key, want in model.items():
        if key in manifest and manifest[key] != want:
            raise SpotError(f"{path}: {key} is {manifest[key]!r} but model.{key} is {want!r} (edited?)",
                            f"decoding uses model.{key}: edit both, or {remedy}")
