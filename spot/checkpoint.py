"""Read SDAR checkpoint weights (safetensors, single file or shards + index) tensor by tensor, without torch.

The reader parses the safetensors header itself and memory-maps the data, so exporters and quantizers can stream
one tensor at a time (peak memory ~ the largest tensor, not the model).
"""
from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from spot.config import ModelConfig, load_config
from spot.descriptors import parse_json, read_json
from spot.errors import SpotError
from spot.files import plain_file_name

_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "F64": np.float64, "I64": np.int64,
           "I32": np.int32, "I8": np.int8, "U8": np.uint8}
WEIGHT_DTYPES = ("BF16", "F16", "F32")    # what an SDAR weight may be stored as (other dtypes: buffers, never read)
INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"


def bf16_bits_to_float32(bits: np.ndarray) -> np.ndarray:
    """bfloat16 stored as uint16 -> float32 (exact: bf16 is the top half of an fp32)."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


@dataclass(frozen=True)
class TensorInfo:
    name: str
    file: Path
    dtype: str      # safetensors dtype string (F32, F16, BF16, ...)
    shape: tuple[int, ...]
    offset: int     # absolute byte offset of the data in the file
    nbytes: int


def read_safetensors_header(path: Path) -> dict[str, TensorInfo]:
    """Parse one .safetensors file's header; raise SpotError naming the file when it is truncated or corrupt: as
    the safetensors library, every tensor's bytes must lie in the data area without overlapping another's."""
    refetch = "the download is probably incomplete or corrupt: fetch the file again"
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise ValueError("file shorter than the 8-byte header length")
            (hlen,) = struct.unpack("<Q", head)
            if hlen > size - 8 or hlen > 100_000_000:
                raise ValueError(f"header length {hlen} exceeds the file size {size}")
            try:
                header = parse_json(f.read(hlen).decode("utf-8"), "its header", refetch)
            except SpotError as e:
                raise ValueError(e.message) from None
        if not isinstance(header, dict):
            raise ValueError(f"its header is a JSON {type(header).__name__}, expected an object")
    except FileNotFoundError:
        if path.is_symlink():       # a Hugging Face cache snapshot links to blobs; a partial download leaves none
            raise SpotError(f"weights file {path} is a broken link (to {os.readlink(path)})",
                            "the download is incomplete: fetch the checkpoint again") from None
        raise SpotError(f"weights file {path} is missing", "download the complete checkpoint") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise SpotError(f"{path} is not a valid safetensors file ({e})", refetch) from None
    base = 8 + hlen
    out: dict[str, TensorInfo] = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        try:
            start, end = (int(v) for v in meta["data_offsets"])
            dtype, shape = meta["dtype"], tuple(int(s) for s in meta["shape"])
            if not all(isinstance(v, int) for v in (*meta["data_offsets"], *meta["shape"])):
                raise TypeError("offsets and shape must be integers")
        except (KeyError, TypeError, ValueError):
            raise SpotError(f"{path}: malformed header entry for tensor {name!r}", refetch) from None
        if dtype not in _DTYPES:
            raise SpotError(f"{path}: tensor {name} has dtype {dtype}, expected one of {', '.join(_DTYPES)}",
                            f"SDAR weights are {', '.join(WEIGHT_DTYPES)}: fetch the checkpoint again")
        if not 0 <= start <= end or any(d < 0 for d in shape):
            raise SpotError(f"{path}: tensor {name} has data_offsets [{start}, {end}] and shape {list(shape)}, "
                            "expected 0 <= start <= end and dimensions >= 0", refetch)
        if base + end > size:
            raise SpotError(f"{path} is truncated: tensor {name} ends at byte {base + end}, file has {size}",
                            "the download is incomplete: fetch the file again")
        expected = int(np.prod(shape, dtype=np.int64)) * np.dtype(_DTYPES[dtype]).itemsize
        if end - start != expected:
            raise SpotError(f"{path}: tensor {name} has {end - start} bytes, expected {expected} for "
                            f"{dtype}{list(shape)}", "the file is corrupt: fetch it again")
        out[name] = TensorInfo(name, path, dtype, shape, base + start, end - start)
    spans = sorted(out.values(), key=lambda t: (t.offset, t.nbytes))
    for before, after in zip(spans, spans[1:]):
        if after.offset < before.offset + before.nbytes:
            raise SpotError(f"{path}: tensors {before.name} and {after.name} overlap (bytes {after.offset - base}.."
                            f"{before.offset + before.nbytes - base} of the data)", refetch)
    return out


def read_weight_map(index: Path) -> dict[str, str]:
    """model.safetensors.index.json's weight_map: tensor name -> shard file name (a file of the checkpoint folder
    itself); SpotError naming the file otherwise."""
    remedy = "restore the file from the checkpoint (it maps every tensor name to a shard file name)"
    data = read_json(index, remedy)
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        got = type(weight_map).__name__ if isinstance(data, dict) else f"a JSON {type(data).__name__}"
        raise SpotError(f"{index} is not a valid safetensors index: weight_map must be an object of tensor name -> "
                        f"shard file name, got {got if not isinstance(weight_map, dict) else 'non-string shards'}",
                        remedy)
    outside = [s for s in weight_map.values() if not plain_file_name(s)]
    if outside:
        raise SpotError(f"{index} names shard {outside[0]!r}, expected a file name in its own folder", remedy)
    return weight_map


class Checkpoint:
    """An SDAR checkpoint folder: config plus lazily read weights. `tensor(name)` returns float32 numpy."""

    def __init__(self, model_dir: str | Path, config: ModelConfig | None = None):
        self.dir = Path(model_dir)
        self.config = config or load_config(self.dir)
        self.tensors = self._index()
        self._validate()

    def _index(self) -> dict[str, TensorInfo]:
        """Tensor name -> where its bytes are. As transformers: model.safetensors when present, else the index's
        shards, each tensor from the shard the index names."""
        index = self.dir / INDEX_NAME
        single = self.dir / SINGLE_NAME
        if single.is_file() or (single.is_symlink() and not index.is_file()):
            return read_safetensors_header(single)
        if index.is_file():
            weight_map = read_weight_map(index)
            shards = sorted(set(weight_map.values()))
            missing = [s for s in shards if not (self.dir / s).is_file()]
            if missing:
                broken = [s for s in missing if (self.dir / s).is_symlink()]
                raise SpotError(f"{len(missing)} shard(s) named in {INDEX_NAME} are missing from {self.dir}: "
                                f"{', '.join(missing[:4])}" + (f" ({len(broken)} of them broken links: an "
                                                               "incomplete download)" if broken else ""),
                                "download every shard of the checkpoint")
            headers = {shard: read_safetensors_header(self.dir / shard) for shard in shards}
            absent = [n for n, s in weight_map.items() if n not in headers[s]]
            if absent:
                raise SpotError(f"{len(absent)} tensor(s) listed in {INDEX_NAME} are not in their shard, "
                                f"e.g. {absent[0]} (not in {weight_map[absent[0]]})",
                                "the shards do not match the index: download them again")
            return {n: headers[s][n] for n, s in weight_map.items()}
        raise SpotError(f"{self.dir} has neither {SINGLE_NAME} nor {INDEX_NAME}",
                        "download the weights (*.safetensors) next to config.json")

    def _validate(self) -> None:
        expected = self.config.expected_tensor_shapes()
        missing = [n for n in expected if n not in self.tensors]
        if missing:
            raise SpotError(f"checkpoint {self.dir} lacks {len(missing)} tensor(s) the config requires, "
                            f"e.g. {missing[0]}", "the checkpoint does not match its config.json")
        for name, shape in expected.items():
            info = self.tensors[name]
            if info.shape != shape:
                raise SpotError(f"tensor {name} has shape {list(info.shape)}, expected {list(shape)} from "
                                "config.json", "the checkpoint does not match its config.json")
            if info.dtype not in WEIGHT_DTYPES:
                raise SpotError(f"tensor {name} in {info.file} is stored as {info.dtype}, expected one of "
                                f"{', '.join(WEIGHT_DTYPES)}", "the checkpoint is corrupt or not an SDAR "
                                "checkpoint: fetch it again")

    def tensor(self, name: str) -> np.ndarray:
        """Read one tensor as float32 (a fresh array; the file is memory-mapped only while reading)."""
        info = self.tensors.get(name)
        if info is None:
            raise SpotError(f"tensor {name} is not in checkpoint {self.dir}")
        raw = np.memmap(info.file, dtype=_DTYPES[info.dtype], mode="r", offset=info.offset,
                        shape=info.shape if info.shape else (1,))
        if info.dtype == "BF16":
            arr = bf16_bits_to_float32(np.asarray(raw))
        else:
            arr = np.array(raw, dtype=np.float32)
        del raw
        if not info.shape:
            arr = arr.reshape(())
        if not np.isfinite(arr).all():
            raise SpotError(f"tensor {name} in {info.file.name} holds non-finite values",
                            "the checkpoint is corrupt: fetch it again")
        return arr

    def iter_tensors(self) -> Iterator[tuple[str, np.ndarray]]:
        for name in self.config.expected_tensor_shapes():
            yield name, self.tensor(name)

    @property
    def storage_dtype(self) -> str:
        return self.tensors["model.embed_tokens.weight"].dtype


SAFETENSORS_ITEMSIZE = {"F32": 4, "F16": 2, "BF16": 2}


def encode_tensor(arr: np.ndarray, dtype: str) -> bytes:
    """float32 values -> the bytes of a safetensors dtype: F32, F16, or BF16 rounded to nearest even."""
    arr = np.ascontiguousarray(arr, dtype=np.float32)
    if dtype == "F32":
        return arr.tobytes()
    if dtype == "F16":
        return arr.astype(np.float16).tobytes()
    if dtype == "BF16":
        bits = arr.view(np.uint32).astype(np.uint64)
        return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16).tobytes()
    raise ValueError(f"dtype {dtype}")


def write_safetensors_stream(path: str | Path, shapes: dict[str, tuple[int, ...]], dtype: str, chunks) -> int:
    """Write a safetensors file atomically (temp file, fsync, rename), one tensor at a time: chunks(name) yields
    float32 arrays whose row-major concatenation is the tensor, so no tensor needs to be in memory whole.
    Returns the bytes of tensor data."""
    path = Path(path)
    header, offset = {}, 0
    for name, shape in shapes.items():
        nbytes = int(np.prod(shape, dtype=np.int64)) * SAFETENSORS_ITEMSIZE[dtype]
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    hbytes = json.dumps(header).encode()
    hbytes += b" " * (-len(hbytes) % 8)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(struct.pack("<Q", len(hbytes)))
            f.write(hbytes)
            for name in shapes:
                written = 0
                for part in chunks(name):
                    data = encode_tensor(part, dtype)
                    f.write(data)
                    written += len(data)
                start, end = header[name]["data_offsets"]
                if written != end - start:
                    raise ValueError(f"tensor {name}: got {written} bytes, expected {end - start}")
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    tmp.replace(path)
    return offset


def write_safetensors(path: str | Path, tensors: dict[str, np.ndarray], dtype: str = "F32") -> None:
    """Write a safetensors file atomically (temp file + rename). dtype: F32, F16 or BF16 (rounded to nearest even)."""
    if dtype not in SAFETENSORS_ITEMSIZE:
        raise ValueError(f"dtype {dtype}")
    arrays = {name: np.ascontiguousarray(arr, dtype=np.float32) for name, arr in tensors.items()}
    write_safetensors_stream(path, {name: arr.shape for name, arr in arrays.items()}, dtype,
                             lambda name: [arrays[name]])
