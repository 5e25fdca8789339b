"""The SDAR target graph, declared node by node with onnx.helper (no tracing).

It mirrors spot/reference/model.py op for op: RMSNorm in fp32 with one cast at the end, per-head q/k RMSNorm
before RoPE, rotate-half RoPE with cos/sin computed in the graph from position ids, GQA by grouping the query heads
of each KV head, Q scaled before the first attention MatMul, masked fp32 softmax, SwiGLU, untied lm_head.
Only plain ONNX ops of opset 17/18 (no contrib ops), so one file runs on ORT CPU/CUDA/TensorRT EP and TensorRT.
Weight-only int8/int4 exports (spot.export.quantize) put DequantizeLinear before the linear MatMuls (int4: opset 21),
or ONNX Runtime's MatMulNBits with --ort-matmulnbits.

Contract (one graph serves prefill, block steps over N candidate states and the store pass):
  input_ids [N,S] int64, position_ids [S] int64, attn_bias [S,T] (model dtype, 0 or -inf, T = C+S),
  past_k_<l> / past_v_<l> [Hkv,C,D] for each layer l (model dtype; C may be 0): each layer's cache, fed in place
  -> logits [N,S,V] float32, new_k / new_v [L,N,Hkv,S,D] (model dtype; the K/V of the S new tokens only).

Attention reads the cached prefix once for all N states (SHARED_PREFIX, format 2 of the exported folder): the N x G x S
query rows of a KV head are one product against that head's prefix keys, the states' own S keys are a product per
state, the two score tensors are concatenated along the key axis for ONE softmax over prefix and block, and the
output is P_prefix @ V_prefix (one product again) + P_block @ V_block (per state). No tensor derived from the cache
is broadcast over the states. Batch invariance (a state's logits do not depend on its neighbours) holds because
each of those products computes a row from that row's inputs alone; ONNX Runtime's CPU GEMM does so for any row
count >= 2 but takes another path for a single row, so a model without GQA (G = 1) pads its query rows with a zero
row (docs/exported-folder.md, "Batch invariance"). BROADCAST builds format 1's graph (the cache [L,Hkv,C,D] in one
input, Expanded over the N states and Concatenated with each state's block): spot upgrade-export checks a new
graph against it, and benchmarks/shared_prefix.py measures both.
Weights are not part of the graph proto: `WeightSpec`s name the checkpoint tensor each initializer is made from,
and the writer streams them into one external data file.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from spot.config import ModelConfig
from spot.errors import SpotError
from spot.export.quantize import quantized_linear
from spot.export.weight_spec import ONNX_DTYPES, WeightSpec
from spot.folder.manifest import NP_DTYPES, past_input_names

SUPPORTED_OPSETS = (17, 18)
OUTPUT_NAMES = ("logits", "new_k", "new_v")
SHARED_PREFIX = "shared-prefix"    # the attention of format 2 (spot.folder.manifest.FORMAT_VERSION)
BROADCAST = "broadcast"            # format 1's: the prefix Expanded over the N states
ATTENTION_FORMS = (SHARED_PREFIX, BROADCAST)


def check_dtype(dtype: str) -> None:
    if dtype == "bf16":
        raise SpotError("--dtype bf16 is not supported: ONNX Runtime's CPU provider has no bfloat16 MatMul "
                        "(verified with onnxruntime 1.32), so the export could not be validated or run on CPU",
                        "use --dtype fp16 for GPUs/Jetson (TensorRT) or --dtype fp32 for exact CPU decoding")
    if dtype not in ONNX_DTYPES:
        raise SpotError(f"unknown dtype {dtype!r}, expected one of {', '.join(ONNX_DTYPES)}")


def check_opset(opset: int) -> None:
    if opset not in SUPPORTED_OPSETS:
        raise SpotError(f"opset {opset} is not supported, expected one of {', '.join(map(str, SUPPORTED_OPSETS))}",
                        "TensorRT 10.3 (JetPack 6) parses up to opset 20; the graph uses opset 17/18 ops only")


@dataclass
class TargetGraph:
    """The declared graph: nodes, small inline constants, weight specs (external data), typed inputs/outputs."""

    nodes: list = field(default_factory=list)
    constants: list = field(default_factory=list)      # TensorProto, stored inside the .onnx
    weights: list[WeightSpec] = field(default_factory=list)
    inputs: list = field(default_factory=list)         # ValueInfoProto
    outputs: list = field(default_factory=list)
    opset: int = 17
    quant: object = None                                # spot.export.quantize.QuantScheme (None: fp weights)
    domains: dict = field(default_factory=dict)        # extra opset imports, e.g. {"com.microsoft": 1}
    dtype: str = "fp32"
    attention: str = SHARED_PREFIX                      # SHARED_PREFIX (format 2) | BROADCAST (format 1)


class _Builder:
    """Appends nodes with unique, scoped output names ("/layers.3/attn/MatMul_2")."""

    def __init__(self, graph: TargetGraph):
        self.g = graph
        self.scope = ""
        self._count = 0

    def op(self, op_type: str, *inputs: str, **attrs) -> str:
        self._count += 1
        return self.named(f"{self.scope}/{op_type}_{self._count}", op_type, *inputs, **attrs)

    def named(self, out: str, op_type: str, *inputs: str, **attrs) -> str:
        """A node whose output has the given name (a value other scopes refer to)."""
        self.g.nodes.append(helper.make_node(op_type, list(inputs), [out], name=out, **attrs))
        return out

    def const(self, value, name: str, dtype=None) -> str:
        arr = np.asarray(value, dtype=dtype)
        self.g.constants.append(numpy_helper.from_array(arr, name))
        return name

    def weight(self, spec: WeightSpec) -> str:
        self.g.weights.append(spec)
        return spec.name

    def reduce_mean_last(self, x: str) -> str:
        """ReduceMean over the last axis, keepdims (axes moved from attribute to input in opset 18)."""
        if self.g.opset >= 18:
            return self.op("ReduceMean", x, "axes_last", keepdims=1)
        return self.op("ReduceMean", x, axes=[-1], keepdims=1)


def rope_inv_freq(head_dim: int, theta: float) -> np.ndarray:
    """inv_freq [D/2] float32, computed as the torch reference does (same float32 pow) when torch is present."""
    try:
        # torch: optional extra (spot[export])
        import torch
        exps = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
        return (1.0 / (theta ** exps)).numpy().astype(np.float32)
    except ImportError:  # float32 numpy pow: may differ from torch's by one ulp in a few entries
        exps = np.arange(0, head_dim, 2).astype(np.float32) / np.float32(head_dim)
        return (np.float32(1.0) / np.power(np.float32(theta), exps)).astype(np.float32)


def _rms_norm(b: _Builder, x: str, weight: str, eps: str, cast_back: bool) -> str:
    """x * 1/sqrt(mean(x^2) + eps) * w in fp32 (weight kept fp32), one cast back to the model dtype."""
    xf = b.op("Cast", x, to=TensorProto.FLOAT) if cast_back else x
    ms = b.reduce_mean_last(b.op("Mul", xf, xf))
    inv = b.op("Reciprocal", b.op("Sqrt", b.op("Add", ms, eps)))
    y = b.op("Mul", b.op("Mul", xf, inv), weight)
    return b.op("Cast", y, to=TensorProto.FLOAT16) if cast_back else y


def _linear(b: _Builder, x: str, name: str, out_f: int, in_f: int, dtype: str) -> str:
    """x @ W^T with W stored pre-transposed [in, out] (MatMul, the form int8/int4 weight-only quantizers take);
    with --weights int8/int4 the weight comes through DequantizeLinear (spot.export.quantize)."""
    if b.g.quant is not None and b.g.quant.quantized:
        return quantized_linear(b, x, name, out_f, in_f, dtype, b.g.quant)
    return b.op("MatMul", x, b.weight(WeightSpec(name, name, (in_f, out_f), dtype, transpose=True)))


def _rope(b: _Builder, x: str, cos: str, sin: str, half: int) -> str:
    """x * cos + rotate_half(x) * sin, x [N,H,S,D]; rotate_half(x) = concat(-x[..., D/2:], x[..., :D/2])."""
    x1 = b.op("Slice", x, "zero_1", f"half_{half}", "axis3_1")
    x2 = b.op("Slice", x, f"half_{half}", "int64_max_1", "axis3_1")
    rot = b.op("Concat", b.op("Neg", x2), x1, axis=-1)
    return b.op("Add", b.op("Mul", x, cos), b.op("Mul", rot, sin))


def _attention(b: _Builder, cfg: ModelConfig, layer: int, h: str, cos: str, sin: str, bias: str,
               past: tuple[str, str], dtype: str) -> tuple[str, str, str]:
    """h [N,S,H] -> attention output [N,S,H], k, v [N,Hkv,S,D]; past: this layer's cache inputs."""
    hq, hkv, hd, hid = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.hidden_size
    p = f"model.layers.{layer}.self_attn."
    fp16 = dtype == "fp16"
    eps = "rms_eps"

    # [N,S,heads*D] -> [N,S,heads,D]
    q = b.op("Reshape", _linear(b, h, p + "q_proj.weight", hq * hd, hid, dtype), "shape_q_heads")
    k = b.op("Reshape", _linear(b, h, p + "k_proj.weight", hkv * hd, hid, dtype), "shape_kv_heads")
    v = b.op("Reshape", _linear(b, h, p + "v_proj.weight", hkv * hd, hid, dtype), "shape_kv_heads")
    q_norm = b.weight(WeightSpec(p + "q_norm.weight", p + "q_norm.weight", (hd,), "fp32"))
    k_norm = b.weight(WeightSpec(p + "k_norm.weight", p + "k_norm.weight", (hd,), "fp32"))
    perm = [0, 2, 1, 3]
    q = b.op("Transpose", _rms_norm(b, q, q_norm, eps, fp16), perm=perm)    # [N,Hq,S,D]
    k = b.op("Transpose", _rms_norm(b, k, k_norm, eps, fp16), perm=perm)    # [N,Hkv,S,D]
    v = b.op("Transpose", v, perm=perm)                                     # [N,Hkv,S,D]
    q = _rope(b, q, cos, sin, hd // 2)
    k = _rope(b, k, cos, sin, hd // 2)
    # GQA: the G query heads of one KV head become G*S rows against that head's keys; Q is scaled first.
    qg = b.op("Reshape", b.op("Mul", q, "attn_scale"), "shape_grouped")                 # [N,Hkv,G*S,D]
    if b.g.attention == BROADCAST:
        out = _broadcast_attention(b, layer, qg, k, v, bias, fp16)
    else:
        out = _shared_prefix_attention(b, cfg, qg, k, v, past, bias, fp16)              # [N,Hkv,G*S,D]
    out = b.op("Reshape", out, "shape_ungrouped")                                       # [N,Hq,S,D]
    out = b.op("Reshape", b.op("Transpose", out, perm=perm), "shape_merge_heads")      # [N,S,Hq*D]
    return _linear(b, out, p + "o_proj.weight", hid, hq * hd, dtype), k, v


def _softmax(b: _Builder, scores: str, fp16: bool) -> str:
    """Softmax over the key axis, in fp32 for fp16 graphs (as torch's half softmax accumulates in fp32)."""
    if not fp16:
        return b.op("Softmax", scores, axis=-1)
    return b.op("Cast", b.op("Softmax", b.op("Cast", scores, to=TensorProto.FLOAT), axis=-1), to=TensorProto.FLOAT16)


def _shared_prefix_attention(b: _Builder, cfg: ModelConfig, qg: str, k: str, v: str, past: tuple[str, str],
                             bias: str, fp16: bool) -> str:
    """qg [N,Hkv,G*S,D] (scaled queries), k, v [N,Hkv,S,D] (the states' own), past K/V [Hkv,C,D] -> [N,Hkv,G*S,D].

    Prefix: per KV head ONE product of the N*G*S query rows with the prefix keys (and of their probabilities with
    the prefix values), the cache read where it is. Block: per state, as alone. One softmax over both."""
    past_k, past_v = past
    rows = b.op("Reshape", b.op("Transpose", qg, perm=[1, 0, 2, 3]), "shape_rows")    # [Hkv,N*G*S,D]
    s_prefix = b.op("Reshape", _row_product(b, cfg, rows, b.op("Transpose", past_k, perm=[0, 2, 1])),
                    "/mask/shape_prefix_scores", allowzero=1)                                       # [Hkv,N,G*S,C]
    s_block = b.op("Transpose", b.op("MatMul", qg, b.op("Transpose", k, perm=[0, 1, 3, 2])),
                   perm=[1, 0, 2, 3])                                                  # [Hkv,N,G*S,S]
    probs = _softmax(b, b.op("Add", b.op("Concat", s_prefix, s_block, axis=-1), bias), fp16)   # [Hkv,N,G*S,C+S]
    p_prefix = b.op("Reshape", b.op("Slice", probs, "zero_1", "/mask/cached_1", "axis3_1"),
                    "/mask/shape_prefix_rows", allowzero=1)                                         # [Hkv,N*G*S,C]
    p_block = b.op("Transpose", b.op("Slice", probs, "/mask/cached_1", "int64_max_1", "axis3_1"),
                   perm=[1, 0, 2, 3])                                                  # [N,Hkv,G*S,S]
    o_prefix = b.op("Transpose", b.op("Reshape", _row_product(b, cfg, p_prefix, past_v), "/mask/shape_prefix_out"),
                    perm=[1, 0, 2, 3])                                                 # [N,Hkv,G*S,D]
    return b.op("Add", o_prefix, b.op("MatMul", p_block, v))


def _row_product(b: _Builder, cfg: ModelConfig, rows: str, right: str) -> str:
    """MatMul(rows [Hkv,M,K], right [Hkv,K,X]) -> [Hkv,M,X], each row as alone whatever M. Without GQA (G = 1) a
    one-block pass of one state at block size 1 has M = 1, where ONNX Runtime's CPU GEMM takes another path than
    for M >= 2 (other rounding): such models append a zero row and drop its result (a copy of the product)."""
    if cfg.kv_groups > 1:
        return b.op("MatMul", rows, right)
    zero = b.op("ConstantOfShape", b.op("Concat", "heads_one_2", b.op("Slice", b.op("Shape", rows), "two_1",
                                                                         "three_1"), axis=0),
                value=numpy_helper.from_array(np.zeros(1, NP_DTYPES[b.g.dtype])))
    padded = b.op("MatMul", b.op("Concat", rows, zero, axis=1), right)
    return b.op("Slice", padded, "zero_1", "/mask/rows_1", "one_1")


def _broadcast_attention(b: _Builder, layer: int, qg: str, k: str, v: str, bias: str, fp16: bool) -> str:
    """Format 1's attention: the cached prefix [L,Hkv,C,D] Gathered for the layer, Expanded over the N states and
    Concatenated with each state's block."""
    layer_idx = b.const(np.array(layer, np.int64), f"layer_{layer}")
    keys = b.op("Concat", b.op("Expand", b.op("Gather", "past_k", layer_idx, axis=0), "/mask/expand_n"), k, axis=2)
    values = b.op("Concat", b.op("Expand", b.op("Gather", "past_v", layer_idx, axis=0), "/mask/expand_n"), v, axis=2)
    scores = b.op("Add", b.op("MatMul", qg, b.op("Transpose", keys, perm=[0, 1, 3, 2])), bias)  # [N,Hkv,G*S,T]
    return b.op("MatMul", _softmax(b, scores, fp16), values)


def _mlp(b: _Builder, cfg: ModelConfig, layer: int, h: str, dtype: str) -> str:
    p = f"model.layers.{layer}.mlp."
    hid, inter = cfg.hidden_size, cfg.intermediate_size
    gate = _linear(b, h, p + "gate_proj.weight", inter, hid, dtype)
    up = _linear(b, h, p + "up_proj.weight", inter, hid, dtype)
    act = b.op("Mul", b.op("Mul", gate, b.op("Sigmoid", gate)), up)       # silu(gate) * up
    return _linear(b, act, p + "down_proj.weight", hid, inter, dtype)


def _shape_values(b: _Builder, cache: str) -> None:
    """The pass's dims as 1-D int64 values the attention reshapes by, named /mask/...: N states, G*S query rows
    per state and KV head, C cached tokens (from the first cache input), and the shapes made of them."""
    ids = b.op("Shape", "input_ids")
    n = b.named("/mask/nodes_1", "Slice", ids, "zero_1", "one_1")
    gs = b.named("/mask/group_rows_1", "Mul", b.op("Slice", ids, "one_1", "two_1"), "groups_1")
    b.named("/mask/expand_n", "Concat", n, "ones_3", axis=0)                          # format 1: [N,1,1,1]
    c_axis = ("one_1", "two_1") if b.g.attention == SHARED_PREFIX else ("two_1", "three_1")   # [Hkv,C,D] | [L,..]
    cached = b.named("/mask/cached_1", "Slice", b.op("Shape", cache), *c_axis)
    rows = b.named("/mask/rows_1", "Mul", n, gs)                                       # N*G*S
    b.named("/mask/shape_prefix_scores", "Concat", "kv_heads_1", n, gs, cached, axis=0)
    b.named("/mask/shape_prefix_rows", "Concat", "kv_heads_1", rows, cached, axis=0)
    b.named("/mask/shape_prefix_out", "Concat", "kv_heads_1", n, gs, "head_dim_1", axis=0)


def _value_info(name: str, elem_type: int, shape: list) -> object:
    return helper.make_tensor_value_info(name, elem_type, shape)


def cache_inputs(cfg: ModelConfig, attention: str = SHARED_PREFIX) -> list[tuple[str, str]]:
    """The graph's (K, V) cache input names per layer: format 2's one pair per layer, format 1's one stacked pair
    (every layer reads it)."""
    if attention == BROADCAST:
        return [("past_k", "past_v")] * cfg.num_hidden_layers
    return list(past_input_names(cfg.num_hidden_layers))


def build_target_graph(cfg: ModelConfig, dtype: str, opset: int = 17, quant=None,
                       attention: str = SHARED_PREFIX) -> TargetGraph:
    """Declare the whole SDAR target graph for `cfg` in `dtype` (fp32 | fp16) at `opset` (17 | 18), with the linear
    weights quantized per `quant` (spot.export.quantize.QuantScheme; int4 DequantizeLinear graphs are opset 21).
    attention: SHARED_PREFIX (what spot-export writes) or BROADCAST (format 1's graph, for comparisons)."""
    check_dtype(dtype)
    check_opset(opset)
    if attention not in ATTENTION_FORMS:
        raise SpotError(f"unknown attention form {attention!r}, expected one of {', '.join(ATTENTION_FORMS)}")
    if quant is not None and quant.quantized:
        quant.check()
        quant.check_config(cfg)
        opset = quant.graph_opset(opset, dtype)
    g = TargetGraph(opset=opset, quant=quant, domains=dict(quant.domains) if quant is not None else {},
                    dtype=dtype, attention=attention)
    b = _Builder(g)
    elem = ONNX_DTYPES[dtype]
    npd = NP_DTYPES[dtype]
    fp16 = dtype == "fp16"
    L, hq, hkv, hd = cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    past = cache_inputs(cfg, attention)
    past_shape = [L, hkv, "C", hd] if attention == BROADCAST else [hkv, "C", hd]
    g.inputs = [
        _value_info("input_ids", TensorProto.INT64, ["N", "S"]),
        _value_info("position_ids", TensorProto.INT64, ["S"]),
        _value_info("attn_bias", elem, ["S", "T"]),
        *(_value_info(name, elem, past_shape) for name in dict.fromkeys(n for pair in past for n in pair)),
    ]
    g.outputs = [
        _value_info("logits", TensorProto.FLOAT, ["N", "S", cfg.vocab_size]),
        _value_info("new_k", elem, [L, "N", hkv, "S", hd]),
        _value_info("new_v", elem, [L, "N", hkv, "S", hd]),
    ]
    # shared constants
    b.const(np.array(cfg.rms_norm_eps, np.float32), "rms_eps")
    b.const(np.array(1.0 / np.sqrt(hd), npd), "attn_scale")
    b.const(np.array([0, 0, hq, hd], np.int64), "shape_q_heads")
    b.const(np.array([0, 0, hkv, hd], np.int64), "shape_kv_heads")
    b.const(np.array([0, hkv, -1, hd], np.int64), "shape_grouped")
    b.const(np.array([0, hq, -1, hd], np.int64), "shape_ungrouped")
    b.const(np.array([0, 0, hq * hd], np.int64), "shape_merge_heads")
    b.const(np.array([0], np.int64), "zero_1")
    b.const(np.array([hd // 2], np.int64), f"half_{hd // 2}")
    b.const(np.array([np.iinfo(np.int64).max], np.int64), "int64_max_1")
    b.const(np.array([3], np.int64), "axis3_1")
    b.const(np.array([-1], np.int64), "axes_last")
    b.const(np.array([1, 1, 1], np.int64), "ones_3")
    b.const(np.array([1], np.int64), "one_1")
    b.const(np.array([cfg.kv_groups, 1], np.int64), "bias_repeats")
    b.const(np.array([cfg.kv_groups], np.int64), "groups_1")
    b.const(np.array([hkv], np.int64), "kv_heads_1")
    b.const(np.array([hd], np.int64), "head_dim_1")
    b.const(np.array([hkv, 1], np.int64), "heads_one_2")
    b.const(np.array([2], np.int64), "two_1")
    b.const(np.array([3], np.int64), "three_1")
    b.const(np.array([hkv, -1, hd], np.int64), "shape_rows")
    b.const(rope_inv_freq(hd, cfg.rope_theta)[None, :], "rope_inv_freq")       # [1, D/2]

    b.scope = "/rope"
    freqs = b.op("Mul", b.op("Unsqueeze", b.op("Cast", "position_ids", to=TensorProto.FLOAT), "one_1"),
                 "rope_inv_freq")                                                 # [S, D/2]
    emb = b.op("Concat", freqs, freqs, axis=-1)                                   # [S, D]
    cos, sin = b.op("Cos", emb), b.op("Sin", emb)
    if fp16:
        cos, sin = b.op("Cast", cos, to=TensorProto.FLOAT16), b.op("Cast", sin, to=TensorProto.FLOAT16)
    b.scope = "/mask"
    # attn_bias [S,T] -> [G*S,T]: row g*S+s of the grouped scores belongs to query position s.
    bias = b.op("Tile", "attn_bias", "bias_repeats")
    _shape_values(b, past[0][0])

    b.scope = "/embed"
    x = b.op("Gather", b.weight(WeightSpec("model.embed_tokens.weight", "model.embed_tokens.weight",
                                           (cfg.vocab_size, cfg.hidden_size), dtype)), "input_ids", axis=0)
    ks, vs = [], []
    for layer in range(L):
        b.scope = f"/layers.{layer}"
        p = f"model.layers.{layer}."
        ln1 = b.weight(WeightSpec(p + "input_layernorm.weight", p + "input_layernorm.weight",
                                  (cfg.hidden_size,), "fp32"))
        ln2 = b.weight(WeightSpec(p + "post_attention_layernorm.weight", p + "post_attention_layernorm.weight",
                                  (cfg.hidden_size,), "fp32"))
        a, k, v = _attention(b, cfg, layer, _rms_norm(b, x, ln1, "rms_eps", fp16), cos, sin, bias, past[layer],
                             dtype)
        x = b.op("Add", x, a)
        x = b.op("Add", x, _mlp(b, cfg, layer, _rms_norm(b, x, ln2, "rms_eps", fp16), dtype))
        ks.append(b.op("Unsqueeze", k, "zero_1"))
        vs.append(b.op("Unsqueeze", v, "zero_1"))

    b.scope = "/head"
    x = _rms_norm(b, x, b.weight(WeightSpec("model.norm.weight", "model.norm.weight", (cfg.hidden_size,), "fp32")),
                  "rms_eps", fp16)
    head_src = "model.embed_tokens.weight" if cfg.tie_word_embeddings else "lm_head.weight"
    logits = b.op("MatMul", x, b.weight(WeightSpec("lm_head.weight", head_src, (cfg.hidden_size, cfg.vocab_size),
                                                   dtype, transpose=True)))
    g.nodes.append(helper.make_node("Cast", [logits], ["logits"], name="/head/Cast_logits", to=TensorProto.FLOAT))
    g.nodes.append(helper.make_node("Concat", ks, ["new_k"], name="/head/Concat_new_k", axis=0))
    g.nodes.append(helper.make_node("Concat", vs, ["new_v"], name="/head/Concat_new_v", axis=0))
    g.nodes = _reachable(g.nodes, OUTPUT_NAMES)                 # the shape values one form does not read
    used = {name for node in g.nodes for name in node.input}
    g.constants = [c for c in g.constants if c.name in used]   # e.g. axes_last below opset 18
    return g


def _reachable(nodes: list, outputs) -> list:
    """The nodes the outputs depend on, in their order."""
    producer = {out: node for node in nodes for out in node.output}
    wanted, todo = set(), list(outputs)
    while todo:
        node = producer.get(todo.pop())
        if node is not None and node.name not in wanted:
            wanted.add(node.name)
            todo.extend(node.input)
    return [node for node in nodes if node.name in wanted]
