"""Weight-only int8 / int4 quantization of the linear layers, streamed tensor by tensor into the export.

Scheme (`spot-export --weights int8|int4`, docs/quantization.md):
  - int8: one scale per output channel, q = round_half_even(w / s) in [-127, 127], s = max|w| / 127.
  - int4: one scale per block of `block` (32 | 64 | 128) consecutive input features of one output channel,
          q in [-7, 7], s = max|w| / 7.
  - symmetric, no zero point (TensorRT rejects non-zero int4 zero points); the scale is stored in the model dtype
    (fp32 | fp16) rounded *up*, so |w| / s <= qmax and nothing is clipped: |w - q * s| <= s / 2 for every weight
    (s the stored scale, product in exact arithmetic). That is the error bound the tests check.
  - only q/k/v/o and gate/up/down; the embedding, lm_head and the norms keep the export dtype.

Graph forms:
  - standard ("dq"): DequantizeLinear(q, scale) -> MatMul, q stored [in, out] like the fp weights.
      int8: per-axis DQ (axis 1): the requested opset 17/18 with fp32 scales; opset 19 with fp16 scales (the first
      DequantizeLinear taking float16 scales; TensorRT 10.3 parses up to 20).
      int4: blocked DQ (axis 0, block_size), the INT4 element type: opset 21 (graph opset 21, IR 10).
      INT4 tensors are packed two values per byte, LOW NIBBLE FIRST, in row-major order (ONNX's layout,
      also TensorRT's).
  - ORT-only ("nbits", `--ort-matmulnbits`, int4 only): com.microsoft MatMulNBits with B [out, in/block, block/2]
      uint8 (q + 8, the operator's default zero point for 4 bits, low nibble first) and scales [out * in/block];
      accuracy_level 1 (activations stay float32: weight-only).

ONNX Runtime 1.32's CPU provider rewrites both standard forms into MatMulNBits itself (its DQ -> MatMul fusion);
that fusion quantizes the activations to int8 unless the session says otherwise, so a quantized export records
`ort_session_config` {"session.qdq_matmulnbits_accuracy_level": "1"} in its manifest and the ORT engine applies it.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

import numpy as np
from onnx import TensorProto

from spot.errors import SpotError
from spot.export.weight_spec import WeightSpec

WEIGHT_CHOICES = ("fp", "int8", "int4")
INT4_BLOCKS = (32, 64, 128)
DEFAULT_INT4_BLOCK = 128
QMAX = {"int8": 127, "int4": 7}
LINEAR_SUFFIXES = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                   "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight")
INT4_OPSET = 21                 # INT4 element type + DequantizeLinear block_size
INT8_FP16_OPSET = 19            # DequantizeLinear with float16 scales
NBITS_ACCURACY_LEVEL = 1        # MatMulNBits: 1 = float32 activations (4 would quantize them to int8)
ORT_SESSION_CONFIG = {"session.qdq_matmulnbits_accuracy_level": str(NBITS_ACCURACY_LEVEL)}
# source elements quantized per chunk: half the fp16 writer's 4M, so an int4/int8 export's temporaries (source
# rows as float32, their quotient, int8 codes) stay below the fp16 export's (the benchmark checks peak RSS)
CHUNK_ELEMS = 2 * 1024 * 1024
_SCALE_NP = {"fp32": np.float32, "fp16": np.float16}
_SCALE_ONNX = {"fp32": TensorProto.FLOAT, "fp16": TensorProto.FLOAT16}


# -- the scheme --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class QuantScheme:
    """What `--weights / --int4-block / --ort-matmulnbits` asked for."""

    weights: str = "fp"               # fp (the export dtype) | int8 | int4
    int4_block: int = DEFAULT_INT4_BLOCK
    matmulnbits: bool = False         # ORT-only MatMulNBits form (int4)

    @property
    def quantized(self) -> bool:
        return self.weights != "fp"

    @property
    def block(self) -> int:
        """Input features per scale: the int4 block, 0 for int8's one scale per output channel."""
        return self.int4_block if self.weights == "int4" else 0

    def check(self) -> None:
        if self.weights not in WEIGHT_CHOICES:
            raise SpotError(f"unknown --weights {self.weights!r}, expected one of {', '.join(WEIGHT_CHOICES)}")
        if self.int4_block not in INT4_BLOCKS:
            raise SpotError(f"--int4-block must be one of {', '.join(map(str, INT4_BLOCKS))}, got {self.int4_block}")
        if self.matmulnbits and self.weights != "int4":
            raise SpotError(f"--ort-matmulnbits needs --weights int4, got --weights {self.weights}",
                            "MatMulNBits is ONNX Runtime's operator for blocked 4-bit weights")

    def check_config(self, cfg) -> None:
        """Every quantized matrix must split into whole int4 blocks and whole bytes."""
        if self.weights != "int4":
            return
        for in_f, what in ((cfg.hidden_size, "hidden_size"), (cfg.num_attention_heads * cfg.head_dim,
                                                              "num_attention_heads * head_dim"),
                           (cfg.intermediate_size, "intermediate_size")):
            if in_f % self.int4_block:
                fits = [b for b in INT4_BLOCKS if in_f % b == 0]
                raise SpotError(f"--int4-block {self.int4_block} does not divide the model's {what} {in_f}",
                                f"use --int4-block {fits[-1]}" if fits else "use --weights int8")
        for out_f, what in ((cfg.num_key_value_heads * cfg.head_dim, "num_key_value_heads * head_dim"),
                            (cfg.hidden_size, "hidden_size"), (cfg.intermediate_size, "intermediate_size")):
            if out_f % 2:
                raise SpotError(f"int4 packs two output channels per byte, but the model's {what} is odd ({out_f})",
                                "use --weights int8")

    def graph_opset(self, requested: int, dtype: str) -> int:
        """The opset the graph is written at: int4 DequantizeLinear needs 21, int8 with fp16 scales 19 (the first
        DequantizeLinear taking float16 scales); everything else keeps `requested`."""
        if self.weights == "int4" and not self.matmulnbits:
            return INT4_OPSET
        if self.weights == "int8" and dtype == "fp16":
            return max(requested, INT8_FP16_OPSET)
        return requested

    @property
    def domains(self) -> dict[str, int]:
        return {"com.microsoft": 1} if self.matmulnbits else {}

    def summary(self) -> str:
        """", int4 weights (blocks of 128)" etc. for progress lines; "" for fp weights."""
        if not self.quantized:
            return ""
        return (f", {self.weights} weights" + (f" (blocks of {self.int4_block})" if self.weights == "int4" else "")
                + (", MatMulNBits: ONNX Runtime only" if self.matmulnbits else ""))

    def layout_note(self) -> str:
        """The manifest's description of how the linear weights are stored."""
        if self.matmulnbits:
            return ("linear weights as com.microsoft MatMulNBits B [out, in/block, block/2] uint8 (q + 8, low nibble "
                    "first) + scales [out * in/block] (model dtype); embed, lm_head in the model dtype; norm weights "
                    "float32")
        scales = "[out]" if self.weights == "int8" else "[in/block, out]"
        packing = "; int4 packed two per byte, low nibble first" if self.weights == "int4" else ""
        return (f"linear weights {self.weights} [in, out] + scales {scales} (model dtype) -> DequantizeLinear -> "
                f"MatMul{packing}; embed, lm_head in the model dtype; norm weights float32")

    @staticmethod
    def from_record(weights: dict, ort_only: bool = False) -> "QuantScheme":
        """The scheme a manifest's `weights` record (describe) and `ort_only` flag name."""
        if not weights.get("quantized"):
            return QuantScheme()
        return QuantScheme(weights["precision"], weights.get("block_size") or DEFAULT_INT4_BLOCK, bool(ort_only))

    def describe(self, dtype: str) -> dict:
        """The manifest's `weights` record."""
        if not self.quantized:
            return {"precision": dtype, "quantized": False}
        form = "MatMulNBits (com.microsoft, ONNX Runtime only)" if self.matmulnbits else "DequantizeLinear -> MatMul"
        per = (f"blocks of {self.int4_block} input features per output channel" if self.weights == "int4"
               else "one scale per output channel")
        return {"precision": self.weights, "quantized": True, "tensors": [f"model.layers.*.{s}" for s in
                                                                          LINEAR_SUFFIXES],
                "kept_in_dtype": ["model.embed_tokens.weight", "lm_head.weight", "norm weights (float32)"],
                "scheme": f"symmetric weight-only, {per}, q in [-{QMAX[self.weights]}, {QMAX[self.weights]}], "
                          "no zero point",
                "block_size": self.block or None, "scale_dtype": dtype, "form": form,
                "int4_packing": "two values per byte, low nibble first" if self.weights == "int4" else None,
                "error_bound": "|w - q * scale| <= scale / 2"}


def is_quantized_linear(name: str) -> bool:
    return name.startswith("model.layers.") and name.endswith(LINEAR_SUFFIXES)


# -- the math (pure numpy) ---------------------------------------------------------------------------------------
def scales_for(amax: np.ndarray, qmax: int, dtype: str, what: str = "a weight group") -> np.ndarray:
    """Scales in `dtype` with amax / scale <= qmax: amax / qmax rounded up to the next representable value
    (1 for all-zero groups). amax float32 [...] -> scales [...] in dtype. The graph computes q * scale in `dtype`,
    so weights beyond its range are refused here, naming the tensor (`what`), as the unquantized path does."""
    npd = _SCALE_NP[dtype]
    s = (amax.astype(np.float32) / np.float32(qmax)).astype(np.float32)
    s = np.where(amax > 0, s, np.float32(1.0))
    with np.errstate(over="ignore"):
        sd = s.astype(npd)
    low = sd.astype(np.float32) < s
    sd = np.where(low, np.nextafter(sd, npd(np.inf)), sd).astype(npd)
    # the graph rebuilds q * scale in `dtype`: qmax * scale must stay finite there (rounding the scale up can push
    # a weight just under the fp16 maximum over it)
    with np.errstate(over="ignore"):
        rebuilt = (sd * npd(qmax)).astype(npd)
    if not np.isfinite(rebuilt).all():
        raise SpotError(f"{what} has values beyond what {dtype} holds once quantized (max |x| = "
                        f"{float(amax.max()):.7g}; q * scale is rebuilt in {dtype}, max {float(np.finfo(npd).max):g})",
                        "export with --dtype fp32")
    return sd


def quantize_rows(w: np.ndarray, weights: str, block: int, dtype: str,
                  what: str = "a linear weight") -> tuple[np.ndarray, np.ndarray]:
    """w [rows, in] float32 (rows = output channels) -> (q [rows, in] int8, scales in dtype:
    [rows] for int8, [rows, in/block] for int4). what: the tensor, for messages."""
    if not np.isfinite(w).all():
        raise SpotError(f"{what} holds non-finite values", "the checkpoint is corrupt: fetch it again")
    qmax = QMAX[weights]
    rows, cols = w.shape
    g = cols if weights == "int8" else block
    groups = w.reshape(rows, cols // g, g)
    amax = np.maximum(groups.max(axis=2), -groups.min(axis=2))               # no |w| temporary
    s = scales_for(amax, qmax, dtype, what)                                  # [rows, cols/g]
    q = groups / s.astype(np.float32)[..., None]                             # the one full-size temporary
    np.rint(q, out=q)
    np.clip(q, -qmax, qmax, out=q)                                           # never fires (s rounded up)
    return q.astype(np.int8).reshape(rows, cols), (s[:, 0] if weights == "int8" else s)


def dequantize_rows(q: np.ndarray, scales: np.ndarray, block: int) -> np.ndarray:
    """Reference dequantization in float64: q [rows, in] int8, scales [rows] or [rows, in/block] -> [rows, in]."""
    rows, cols = q.shape
    s = scales.astype(np.float64).reshape(rows, -1)
    g = cols // s.shape[1]
    return (q.astype(np.float64).reshape(rows, -1, g) * s[..., None]).reshape(rows, cols)


def pack_int4(q: np.ndarray) -> np.ndarray:
    """int values in [-8, 7], even count -> uint8, two per byte, LOW NIBBLE FIRST (ONNX / TensorRT INT4 layout)."""
    flat = np.asarray(q, dtype=np.int8).reshape(-1)
    if flat.size % 2:
        raise ValueError(f"pack_int4 needs an even number of values, got {flat.size}")
    u = flat.view(np.uint8) & 0x0F
    return (u[0::2] | (u[1::2] << 4)).astype(np.uint8)


def unpack_int4(packed: np.ndarray, count: int | None = None) -> np.ndarray:
    """uint8 bytes -> int8 values in [-8, 7] (low nibble first, sign-extended)."""
    p = np.asarray(packed, dtype=np.uint8).reshape(-1)
    out = np.empty(p.size * 2, np.int8)
    out[0::2] = ((p & 0x0F) ^ 0x08).astype(np.int8) - 8
    out[1::2] = ((p >> 4) ^ 0x08).astype(np.int8) - 8
    return out if count is None else out[:count]


def pack_nbits_rows(q: np.ndarray, block: int) -> np.ndarray:
    """MatMulNBits B for rows of q [rows, in] in [-7, 7]: uint8 [rows, in/block, block/2], q + 8 low nibble first."""
    rows, cols = q.shape
    u = (q.astype(np.int16) + 8).astype(np.uint8).reshape(rows, cols // block, block)
    return (u[..., 0::2] | (u[..., 1::2] << 4)).astype(np.uint8)


# -- initializers and nodes ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class QuantTensor:
    """How one initializer is derived from a linear weight [out, in] of the checkpoint."""

    role: str                 # "q" | "scale"
    weights: str              # int8 | int4
    form: str                 # "dq" | "nbits"
    block: int                # 0: per output channel
    source_shape: tuple[int, int]
    dtype: str                # the export dtype (= the scales' dtype)
    partner: str              # the other initializer made from the same source (q <-> scale)

    @property
    def onnx_type(self) -> int:
        if self.role == "scale":
            return _SCALE_ONNX[self.dtype]
        if self.form == "nbits":
            return TensorProto.UINT8
        return TensorProto.INT8 if self.weights == "int8" else TensorProto.INT4

    @property
    def nbytes(self) -> int:
        out_f, in_f = self.source_shape
        if self.role == "scale":
            per_row = 1 if self.weights == "int8" else in_f // self.block
            return out_f * per_row * np.dtype(_SCALE_NP[self.dtype]).itemsize
        return out_f * in_f if self.weights == "int8" else out_f * in_f // 2


def quantized_linear(b, x: str, name: str, out_f: int, in_f: int, dtype: str, scheme: QuantScheme) -> str:
    """x [..., in] @ W^T as DequantizeLinear -> MatMul (or MatMulNBits); `b` is spot.export.graph._Builder."""
    form = "nbits" if scheme.matmulnbits else "dq"
    q_name, s_name = f"{name}.{scheme.weights}", f"{name}.scale"
    common = dict(weights=scheme.weights, form=form, block=scheme.block, source_shape=(out_f, in_f), dtype=dtype)
    qt = QuantTensor(role="q", partner=s_name, **common)
    st = QuantTensor(role="scale", partner=q_name, **common)
    blk = scheme.block
    if form == "nbits":
        q = b.weight(WeightSpec(q_name, name, (out_f, in_f // blk, blk // 2), dtype, quant=qt))
        s = b.weight(WeightSpec(s_name, name, (out_f * (in_f // blk),), dtype, quant=st))
        return b.op("MatMulNBits", x, q, s, domain="com.microsoft", K=in_f, N=out_f, bits=4, block_size=blk,
                    accuracy_level=NBITS_ACCURACY_LEVEL)
    q = b.weight(WeightSpec(q_name, name, (in_f, out_f), dtype, quant=qt))
    if scheme.weights == "int8":
        s = b.weight(WeightSpec(s_name, name, (out_f,), dtype, quant=st))
        w = b.op("DequantizeLinear", q, s, axis=1)
    else:
        s = b.weight(WeightSpec(s_name, name, (in_f // blk, out_f), dtype, quant=st))
        w = b.op("DequantizeLinear", q, s, axis=0, block_size=blk)
    return b.op("MatMul", x, w)


# -- streaming writer ----------------------------------------------------------------------------------------------
RowReader = Callable[[int, int], np.ndarray]     # (r0, r1) -> rows r0..r1 of the source [out, in] as float32


def write_quantized(fd_out: int, q_spec, s_spec, q_offset: int, s_offset: int, read_rows: RowReader,
                    chunk_elems: int | None = None) -> None:
    """Quantize one linear weight chunk by chunk (a few source rows at a time) and write its q and scale tensors.

    "dq" form: q is stored [in, out] (transposed, like the fp weights) and scales [out] or [in/block, out], so each
    chunk of output rows o0..o1 becomes a column slab: one pwrite per input row (int4: (o1-o0)/2 bytes, o0 even).
    "nbits" form: B [out, in/block, block/2] and scales [out * in/block] keep the checkpoint's row order.
    """
    qt = q_spec.quant
    out_f, in_f = qt.source_shape
    elems = CHUNK_ELEMS if chunk_elems is None else chunk_elems
    step = max(2, (elems // in_f) // 2 * 2)          # even: int4 column slabs start on a byte
    s_item = np.dtype(_SCALE_NP[qt.dtype]).itemsize
    for o0 in range(0, out_f, step):
        o1 = min(out_f, o0 + step)
        q, s = quantize_rows(read_rows(o0, o1), qt.weights, qt.block, qt.dtype, f"tensor {q_spec.source}")
        if qt.form == "nbits":
            os.pwrite(fd_out, pack_nbits_rows(q, qt.block).tobytes(), q_offset + o0 * (in_f // 2))
            os.pwrite(fd_out, s.tobytes(), s_offset + o0 * (in_f // qt.block) * s_item)
            continue
        slab = np.ascontiguousarray(q.T)                 # [in, o1-o0]
        if qt.weights == "int8":
            for i in range(in_f):
                os.pwrite(fd_out, memoryview(slab[i]).cast("B"), q_offset + i * out_f + o0)
            os.pwrite(fd_out, s.tobytes(), s_offset + o0 * s_item)
            continue
        for i in range(in_f):
            os.pwrite(fd_out, pack_int4(slab[i]).tobytes(), q_offset + (i * out_f + o0) // 2)
        s_slab = np.ascontiguousarray(s.T)               # [in/block, o1-o0]
        for j in range(s_slab.shape[0]):
            os.pwrite(fd_out, s_slab[j].tobytes(), s_offset + (j * out_f + o0) * s_item)


# -- reference weights for validation --------------------------------------------------------------------------------
class DequantizedCheckpoint:
    """A Checkpoint look-alike whose quantized linear weights come back quantized-then-dequantized (float32), so
    the torch reference computes with exactly the weights the export ships (validation of quantized exports)."""

    def __init__(self, ckpt, scheme: QuantScheme, dtype: str):
        self._ckpt, self.scheme, self.dtype = ckpt, scheme, dtype
        self.config, self.dir = ckpt.config, ckpt.dir

    def tensor(self, name: str) -> np.ndarray:
        w = self._ckpt.tensor(name)
        if not (self.scheme.quantized and is_quantized_linear(name)):
            return w
        q, s = quantize_rows(np.asarray(w, np.float32), self.scheme.weights, self.scheme.block, self.dtype)
        return dequantize_rows(q, s, self.scheme.block).astype(np.float32)
