"""One initializer of the target graph, described before any weight is read: which checkpoint tensor it is made
from, its shape and dtype, and (for int8/int4 linear layers) its quantized form. The graph builder lists them,
the exporter streams them into the data file, and the memory plan sums their sizes."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from onnx import TensorProto

from spot.folder.manifest import NP_DTYPES

ONNX_DTYPES = {"fp32": TensorProto.FLOAT, "fp16": TensorProto.FLOAT16}


@dataclass(frozen=True)
class WeightSpec:
    """An initializer made from one checkpoint tensor, converted to `dtype` (and transposed to [in, out] for
    MatMul when `transpose`)."""

    name: str
    source: str
    shape: tuple[int, ...]
    dtype: str
    transpose: bool = False
    quant: object = None    # spot.export.quantize.QuantTensor for the int8/int4 forms of a linear weight

    @property
    def nbytes(self) -> int:
        if self.quant is not None:
            return self.quant.nbytes
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(NP_DTYPES[self.dtype]).itemsize

    @property
    def onnx_type(self) -> int:
        return self.quant.onnx_type if self.quant is not None else ONNX_DTYPES[self.dtype]

    @property
    def source_shape(self) -> tuple[int, ...]:
        """The checkpoint tensor's shape this initializer is made from."""
        if self.quant is not None:
            return self.quant.source_shape
        return self.shape[::-1] if self.transpose else self.shape
