"""manifest.json's content as typed, frozen records: what spot-export builds and writes (Manifest.write: temp file
+ rename), what spot upgrade-export rewrites, and what every reader reads (spot.folder.manifest.load_manifest makes
one once each field is checked: spot.folder.manifest.MANIFEST).

A record types the fields spot writes, in the order it writes them; a field it does not know is kept in `extra`, and
the order of the keys read is kept in `key_order`. So a manifest read and written back is the same JSON, byte for
byte (the C++ host reads the same file), and a record's `set` orders its fields as a dict assignment does.
ABSENT marks a field the object does not have (None is JSON's null). The values of the fields that only describe
(exporter, validation, the graphs' I/O contracts, memory, weights) are JSON as written; the hosts read none of them.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Mapping

MANIFEST_NAME = "manifest.json"

JSON = Any      # a value as the json module reads it


class _Absent:
    """The value of a field the JSON object does not have (falsy, as an absent field reads with .get)."""

    _instance = None

    def __new__(cls):
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "ABSENT"


ABSENT: Any = _Absent()
_OWN = ("extra", "key_order")


def _json(value) -> JSON:
    """A typed value as JSON (a record's to_json, a map of records, tuples as lists)."""
    if hasattr(value, "to_json"):
        return value.to_json()
    if isinstance(value, Mapping):
        return {k: _json(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [_json(v) for v in value]
    return value


@dataclass(frozen=True, kw_only=True)
class JsonRecord:
    """A JSON object of the manifest: its typed fields (those of the subclass, each a key of the same name; a field's
    metadata "from_json" turns the value read into the typed one), the other fields (extra) and the key order read."""

    extra: Mapping[str, JSON] = field(default_factory=dict)
    key_order: tuple[str, ...] = field(default=(), compare=False)

    @classmethod
    def typed_fields(cls) -> dict[str, Any]:
        return {f.name: f for f in fields(cls) if f.name not in _OWN}

    @classmethod
    def from_json(cls, data: Mapping[str, JSON]):
        """The record of a JSON object whose typed fields were checked (spot.folder.manifest.MANIFEST)."""
        typed = cls.typed_fields()
        values = {k: typed[k].metadata.get("from_json", lambda v: v)(v) for k, v in data.items() if k in typed}
        return cls(**values, extra={k: v for k, v in data.items() if k not in typed}, key_order=tuple(data))

    def to_json(self) -> dict[str, JSON]:
        out = {name: _json(getattr(self, name)) for name in self.typed_fields()}
        out = {k: v for k, v in out.items() if v is not ABSENT} | dict(self.extra)
        return {**{k: out[k] for k in self.key_order if k in out}, **out}

    def set(self, **values):
        """This record with `values` set as a dict assignment sets them: a field it has keeps its place, a new one
        goes last (in the order given), an ABSENT one is dropped. A field this record does not type goes to extra."""
        typed = self.typed_fields()
        order = [k for k in (self.key_order or tuple(self.to_json())) if values.get(k, None) is not ABSENT]
        order += [k for k, v in values.items() if v is not ABSENT and k not in order]
        extra = {**self.extra, **{k: v for k, v in values.items() if k not in typed}}
        return replace(self, **{k: v for k, v in values.items() if k in typed},
                       extra={k: v for k, v in extra.items() if v is not ABSENT}, key_order=tuple(order))


def _optional(from_json=None):
    """A field the object may lack (ABSENT)."""
    return field(default=ABSENT, metadata={} if from_json is None else {"from_json": from_json})


# -- files ----------------------------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class FileRecord(JsonRecord):
    """One file the manifest vouches for: its size, sha256 and sampled sha256 (spot.folder.manifest.sample_sha256)."""

    bytes: int
    sha256: str
    sample_sha256: str


def file_records(data: Mapping[str, JSON]) -> dict[str, FileRecord]:
    """manifest["files"] (checked: spot.folder.manifest.FILE_RECORDS) as records, in its order."""
    return {name: FileRecord.from_json(rec) for name, rec in data.items()}


# -- graphs ---------------------------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class GraphRecord(JsonRecord):
    """A graph of the folder (kv_append, drafter, one this version does not know): its file, and what the record says
    beside it (extra)."""

    file: str


@dataclass(frozen=True, kw_only=True)
class TargetGraph(GraphRecord):
    """The target graph: its file and external data, its I/O contract (spot.folder.manifest.io_contract), how its
    weights are laid out, a format upgrade's check, the TensorRT shape profile (spot.folder.trt_profile; None or
    ABSENT: none recorded) and whether only ONNX Runtime runs it."""

    data: str = _optional()
    dims: JSON = _optional()
    inputs: JSON = _optional()
    outputs: JSON = _optional()
    weights_layout: JSON = _optional()
    upgrade_check: JSON = _optional()
    tensorrt_profile: JSON = _optional()
    ort_only: JSON = _optional()


@dataclass(frozen=True, kw_only=True)
class EpilogueGraph(GraphRecord):
    """The sampling epilogue (spot.folder.epilogue): D = future_steps, the positions of a state one call takes
    (None or ABSENT: an epilogue exported before position runs), and how it was built and checked."""

    opset: JSON = _optional()
    future_steps: int
    exact: JSON = _optional()
    positions_per_call: int | None = _optional()
    inputs: JSON = _optional()
    outputs: JSON = _optional()
    validation: JSON = _optional()


GRAPH_RECORDS = {"target": TargetGraph, "epilogue": EpilogueGraph}


@dataclass(frozen=True)
class Graphs:
    """manifest["graphs"]: graph name -> record, in the order written (target, drafter, epilogue, kv_append)."""

    by_name: Mapping[str, GraphRecord]

    @staticmethod
    def from_json(data: Mapping[str, JSON]) -> "Graphs":
        return Graphs({name: GRAPH_RECORDS.get(name, GraphRecord).from_json(rec) for name, rec in data.items()
                       if rec is not None})      # (an epilogue may be null: none, as if absent)

    def to_json(self) -> dict[str, JSON]:
        return {name: rec.to_json() for name, rec in self.by_name.items()}

    def __contains__(self, name: str) -> bool:
        return name in self.by_name

    def __iter__(self):
        return iter(self.by_name)

    def get(self, name: str) -> GraphRecord | None:
        return self.by_name.get(name)

    @property
    def target(self) -> TargetGraph:
        return self.by_name["target"]

    @property
    def epilogue(self) -> EpilogueGraph | None:
        return self.by_name.get("epilogue")

    def with_graph(self, name: str, record: GraphRecord) -> "Graphs":
        """These graphs with `name`'s record set (an existing one keeps its place)."""
        return Graphs({**self.by_name, name: record})

    def without(self, name: str) -> "Graphs":
        return Graphs({k: v for k, v in self.by_name.items() if k != name})


# -- the manifest ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Manifest(JsonRecord):
    """manifest.json. The model section is as spot-export wrote it (ModelConfig.to_dict; spot.folder.manifest
    .ExportedModel.config is its ModelConfig); block_size, mask_token_id and stop_ids are its decoding defaults."""

    format: str
    format_version: int
    exporter: JSON = _optional()
    created: JSON = _optional()
    source: JSON = _optional()
    model: Mapping[str, JSON]
    block_size: int
    mask_token_id: int = _optional()
    stop_ids: tuple[int, ...] = _optional(tuple)
    dtype: str
    opset: JSON = _optional()
    max_nodes: int
    max_context: int
    graphs: Graphs = field(metadata={"from_json": Graphs.from_json})
    tokenizer_files: JSON = _optional()
    validation: JSON = _optional()
    files: Mapping[str, FileRecord] = field(metadata={"from_json": file_records})
    weights: JSON = _optional()
    ort_only: JSON = _optional()
    memory: JSON = _optional()
    ort_session_config: Mapping[str, str] | None = _optional()

    def text(self) -> str:
        """The file's text, as spot has always written it."""
        return json.dumps(self.to_json(), indent=2) + "\n"

    def write(self, folder: str | Path) -> Path:
        """Write `folder`/manifest.json whole or not at all (temp file + rename, fsynced)."""
        path = Path(folder) / MANIFEST_NAME
        tmp = path.with_name(MANIFEST_NAME + ".tmp")
        with open(tmp, "w") as f:
            f.write(self.text())
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(path)
        return path

    # -- what the fields that only describe say, read as tolerantly as they are written ---------------------------
    @property
    def weights_record(self) -> dict:
        """The `weights` record (spot.export.quantize.QuantScheme.describe), {} when there is none."""
        return self.weights if isinstance(self.weights, dict) else {}

    @property
    def quantized(self) -> bool:
        return bool(self.weights_record.get("quantized", False))

    @property
    def graph_opset(self) -> int:
        """The target graph's opset (17 for manifests written before it was recorded)."""
        return int(self.opset) if self.opset is not ABSENT else 17

    @property
    def recorded_plan(self) -> dict | None:
        """The memory plan recorded at export (`spot-export --plan`), or None."""
        return (self.memory or {}).get("plan") or None

    @property
    def model_name(self) -> str:
        """The exported model's name: its preset, else its checkpoint folder's name."""
        source = self.source or {}
        return source.get("preset") or Path(str(source.get("checkpoint", "model"))).name

