"""The KV-append graph (kv_append.onnx): a stored block's K/V appended to the cache on the device the target runs on.

  inputs   past_k, past_v [L,Hkv,C,D]     the cache (model dtype; C may be 0)
           new_k, new_v [L,1,Hkv,S,D]     the target graph's new_k / new_v of one state (N = 1: prefill, store)
  outputs  k, v [L,Hkv,C+S,D]             Concat(past, Squeeze(new, axis 1)) along the sequence axis

Why a graph: a host that keeps the cache in device memory (spot.engines.device_kv, the C++ host's DeviceKv) must
append there, and ONNX Runtime offers its users no device-side copy nor a view of a slice of a device tensor; the
cache layout [L,Hkv,C,D] makes the new tokens' slot strided anyway. A Concat on the same provider copies the cache
once per stored block (device to device) instead of sending the whole cache to the device on every pass.
Pure data movement: the result is bit-identical to numpy's concatenate (checked at export, `validate_kv_append`).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from spot.errors import SpotError
from spot.export.manifest import NP_DTYPES

KV_APPEND_FILE = "kv_append.onnx"
OPSET = 17
INPUTS = ("past_k", "past_v", "new_k", "new_v")
OUTPUTS = ("k", "v")


def build_kv_append(layers: int, kv_heads: int, head_dim: int, dtype: str):
    """The graph for a target of `layers` x `kv_heads` x `head_dim` in `dtype` ("fp32" | "fp16")."""
    from onnx import TensorProto, helper
    elem = {"fp32": TensorProto.FLOAT, "fp16": TensorProto.FLOAT16}.get(dtype)
    if elem is None:
        raise SpotError(f"kv_append: got dtype {dtype!r}, expected fp32 or fp16")
    past = [helper.make_tensor_value_info(n, elem, [layers, kv_heads, "C", head_dim]) for n in INPUTS[:2]]
    new = [helper.make_tensor_value_info(n, elem, [layers, 1, kv_heads, "S", head_dim]) for n in INPUTS[2:]]
    out = [helper.make_tensor_value_info(n, elem, [layers, kv_heads, "T", head_dim]) for n in OUTPUTS]
    axis = helper.make_tensor("squeeze_axis", TensorProto.INT64, [1], [1])
    nodes = []
    for p, n, o in zip(INPUTS[:2], INPUTS[2:], OUTPUTS):
        nodes.append(helper.make_node("Squeeze", [n, "squeeze_axis"], [f"{n}_1"], name=f"squeeze_{n}"))
        nodes.append(helper.make_node("Concat", [p, f"{n}_1"], [o], name=f"concat_{o}", axis=2))
    graph = helper.make_graph(nodes, "spot_kv_append", past + new, out, initializer=[axis])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="spot-edge")
    model.ir_version = 8
    return model


def write_kv_append(folder: str | Path, layers: int, kv_heads: int, head_dim: int, dtype: str) -> tuple[str, dict]:
    """Save kv_append.onnx into `folder` (temp file + rename); returns (file name, its manifest graphs entry)."""
    model = build_kv_append(layers, kv_heads, head_dim, dtype)
    tmp = Path(folder) / (KV_APPEND_FILE + ".tmp")
    tmp.write_bytes(model.SerializeToString())
    tmp.replace(Path(folder) / KV_APPEND_FILE)
    return KV_APPEND_FILE, {"file": KV_APPEND_FILE, "opset": OPSET, "inputs": list(INPUTS), "outputs": list(OUTPUTS)}


def validate_kv_append(folder: str | Path, layers: int, kv_heads: int, head_dim: int, dtype: str) -> dict:
    """Run the saved graph on ORT's CPU provider for an empty and a filled cache and require numpy's concatenate
    exactly (SpotError otherwise): the export fails rather than ship a cache that drifts."""
    from spot.ortlib import load_onnxruntime
    ort = load_onnxruntime()
    np_dtype = NP_DTYPES[dtype]
    session = ort.InferenceSession(str(Path(folder) / KV_APPEND_FILE), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(3)
    checked = []
    for cached, new in ((0, 5), (7, 3)):
        feeds = {n: rng.standard_normal((layers, kv_heads, cached, head_dim)).astype(np_dtype) for n in INPUTS[:2]}
        feeds |= {n: rng.standard_normal((layers, 1, kv_heads, new, head_dim)).astype(np_dtype) for n in INPUTS[2:]}
        got = session.run(list(OUTPUTS), feeds)
        for past, n, out in zip(INPUTS[:2], INPUTS[2:], got):
            want = np.concatenate([feeds[past], feeds[n][:, 0]], axis=2)
            if out.shape != want.shape or not np.array_equal(out, want):
                raise SpotError(f"kv_append.onnx: got {out.shape} differing from the numpy append {want.shape} "
                                f"(cache of {cached}, {new} new tokens)", "report this onnxruntime version")
        checked.append([cached, new])
    return {"checked": True, "cases": checked}
