"""The target graph as an ONNX file: target.onnx with every weight an external-data reference into one data file
(target.onnx.data), at page-aligned offsets so ONNX Runtime can memory-map them. spot.export.export streams the
weights into that file; validation and upgrade-export write the same graph over the same data."""
from __future__ import annotations

from pathlib import Path

import onnx
from onnx import TensorProto, helper

from spot import __version__
from spot.export.graph import TargetGraph
from spot.export.weight_spec import WeightSpec

TARGET_FILE = "target.onnx"
DATA_FILE = "target.onnx.data"
ALIGN = 4096                     # page-aligned offsets let ONNX Runtime memory-map the weights


def plan_layout(weights: list[WeightSpec], align: int = ALIGN) -> tuple[dict[str, tuple[int, int]], int]:
    """name -> (offset, nbytes) in the data file, each offset aligned; and the file size."""
    layout, pos = {}, 0
    for w in weights:
        pos = -(-pos // align) * align
        layout[w.name] = (pos, w.nbytes)
        pos += w.nbytes
    return layout, pos


def _external_tensor(spec: WeightSpec, offset: int, nbytes: int, location: str) -> TensorProto:
    t = TensorProto()
    t.name = spec.name
    t.data_type = spec.onnx_type
    t.dims.extend(spec.shape)
    t.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(nbytes))):
        entry = t.external_data.add()
        entry.key, entry.value = key, value
    return t


def make_model(graph: TargetGraph, layout: dict[str, tuple[int, int]], location: str = DATA_FILE,
               name: str = "sdar_target") -> onnx.ModelProto:
    """The ModelProto with every weight as an external-data reference into `location` (no weight bytes inside)."""
    weights = [_external_tensor(w, *layout[w.name], location) for w in graph.weights]
    g = helper.make_graph(graph.nodes, name, graph.inputs, graph.outputs, initializer=graph.constants + weights)
    imports = [helper.make_opsetid("", graph.opset)] + [helper.make_opsetid(d, v) for d, v in graph.domains.items()]
    model = helper.make_model(g, opset_imports=imports, producer_name="spot-export", producer_version=__version__)
    model.ir_version = {17: 8, 18: 9, 19: 9, 21: 10}[graph.opset]   # opset 17/18/19/21 (ONNX 1.12/13/14/16)
    return model


def check_graph(model_path: Path) -> None:
    """onnx.checker (full: strict shape inference) on a saved graph; its external data file must exist next to it
    (the checker resolves data locations relative to the model file)."""
    try:
        onnx.checker.check_model(str(model_path), full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as e:
        raise RuntimeError(f"the exported graph fails onnx.checker: {e}") from e
