"""The KV-append graph (kv_append.onnx): a stored block's K/V appended to one layer's cache on the device the target
runs on.

Its file and inputs/outputs are the folder contract of spot.folder.kv_append.

Why a graph: a host that keeps the cache in device memory (spot.engines.device_kv, the C++ host's device cache) must
append there, and ONNX Runtime offers its users no device-side copy nor a view of a slice of a device tensor; the
cache layout [Hkv,C,D] makes the new tokens' slot strided anyway. The hosts run it once per layer at a store: each
layer's longer cache is built beside its old one, which is then released, so the transient is one layer's cache
(format 1 appended the whole [L,Hkv,C,D] cache at once: a second cache beside the first). Pure data movement: the
result is bit-identical to numpy's concatenate (checked at export, `validate_kv_append`).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from spot.errors import SpotError
from spot.folder.kv_append import INPUTS, KV_APPEND_FILE, OUTPUTS
from spot.folder.manifest import NP_DTYPES
from spot.ortlib import load_onnxruntime

OPSET = 17


def build_kv_append(kv_heads: int, head_dim: int, dtype: str):
    """The graph for one layer of a target with `kv_heads` x `head_dim` in `dtype` ("fp32" | "fp16")."""
    # onnx: optional extra (spot[export])
    from onnx import TensorProto, helper
    elem = {"fp32": TensorProto.FLOAT, "fp16": TensorProto.FLOAT16}.get(dtype)
    if elem is None:
        raise SpotError(f"kv_append: got dtype {dtype!r}, expected fp32 or fp16")
    past = [helper.make_tensor_value_info(n, elem, [kv_heads, "C", head_dim]) for n in INPUTS[:2]]
    new = [helper.make_tensor_value_info(n, elem, [kv_heads, "S", head_dim]) for n in INPUTS[2:]]
    out = [helper.make_tensor_value_info(n, elem, [kv_heads, "T", head_dim]) for n in OUTPUTS]
    nodes = [helper.make_node("Concat", [p, n], [o], name=f"concat_{o}", axis=1)
             for p, n, o in zip(INPUTS[:2], INPUTS[2:], OUTPUTS)]
    graph = helper.make_graph(nodes, "spot_kv_append", past + new, out)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="spot-edge")
    model.ir_version = 8
    return model


def write_kv_append(folder: str | Path, kv_heads: int, head_dim: int, dtype: str) -> tuple[str, dict]:
    """Save kv_append.onnx into `folder` (temp file + rename); returns (file name, its manifest graphs entry)."""
    model = build_kv_append(kv_heads, head_dim, dtype)
    tmp = Path(folder) / (KV_APPEND_FILE + ".tmp")
    tmp.write_bytes(model.SerializeToString())
    tmp.replace(Path(folder) / KV_APPEND_FILE)
    return KV_APPEND_FILE, {"file": KV_APPEND_FILE, "opset": OPSET, "per_layer": True, "inputs": list(INPUTS),
                            "outputs": list(OUTPUTS)}


def validate_kv_append(folder: str | Path, kv_heads: int, head_dim: int, dtype: str) -> dict:
    """Run the saved graph on ORT's CPU provider for an empty and a filled cache and require numpy's concatenate
    exactly (SpotError otherwise): the export fails rather than ship a cache that drifts."""
    ort = load_onnxruntime()
    np_dtype = NP_DTYPES[dtype]
    session = ort.InferenceSession(str(Path(folder) / KV_APPEND_FILE), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(3)
    checked = []
    for cached, new in ((0, 5), (7, 3)):
        feeds = {n: rng.standard_normal((kv_heads, cached, head_dim)).astype(np_dtype) for n in INPUTS[:2]}
        feeds |= {n: rng.standard_normal((kv_heads, new, head_dim)).astype(np_dtype) for n in INPUTS[2:]}
        got = session.run(list(OUTPUTS), feeds)
        for past, n, out in zip(INPUTS[:2], INPUTS[2:], got):
            want = np.concatenate([feeds[past], feeds[n]], axis=1)
            if out.shape != want.shape or not np.array_equal(out, want):
                raise SpotError(f"kv_append.onnx: got {out.shape} differing from the numpy append {want.shape} "
                                f"(cache of {cached}, {new} new tokens)", "report this onnxruntime version")
        checked.append([cached, new])
    return {"checked": True, "cases": checked}
