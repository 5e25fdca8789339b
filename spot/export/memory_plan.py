"""Memory plans: will an export fit a Jetson (`spot-export MODEL --plan orin-nx-16gb|...|<N>GB`)?

A plan adds, in bytes (docs/quantization.md has the derivations):
  weights      every initializer the export writes (the same WeightSpecs the writer uses: per tensor, per
               precision, int8/int4 scales included; norm weights float32),
  KV cache     2 * layers * kv_heads * head_dim * dtype bytes per token (SDAR-8B fp16: 144 KiB) x --max-context,
  verify pass  the transient tensors of one target pass over --max-nodes states of B tokens at that context:
               logits N*B*V*4 bytes (+ the fp16 lm_head output before its Cast), attention scores + fp32 softmax
               (N*Hq*B*T elements, T = context + B: the states' queries against the shared prefix and their own
               block, one softmax over both), MLP/residual activations, the new K/V outputs, one layer's longer
               cache beside its old one while a stored block is appended (kv_append.onnx runs layer by layer on the
               device cache; the host cache grows per layer too) and, for quantized weights, one dequantized matrix
               in case the runtime does not fuse DequantizeLinear into its GEMM, and the sampling epilogue when the
               export has one (the device sampler, auto on GPUs): EPILOGUE_PEAK_FACTOR x (D+1) x P x V x 8 bytes —
               one call's, whatever N: the hosts run it for one state's P positions per call (EpilogueCall).
               The graph reads each layer's cache where it is (format 2): no copy of the cache per pass and no K/V
               broadcast over the states (format 1 Expanded the prefix to every state, ~3 x N x the layer's cache,
               and copied the cache beside itself at each store). With --kv-cache host on a GPU the cache is sent
               to the device for every pass: a second cache, which this plan does not count (the device cache is
               the default there),
  runtime      CUDA context + TensorRT/cuBLAS workspaces + ONNX Runtime arena slack (assumed RUNTIME_GIB),
  OS share     kernel carve-outs + a headless L4T userland in the unified memory (assumed per device);
and compares the sum with the device's memory. Every term but the weights grows linearly with the context, so the
largest context that fits is solved in closed form (a multiple of the block size, at most max_position_embeddings).
"""
from __future__ import annotations

import re
from dataclasses import dataclass


from spot.config import ModelConfig
from spot.errors import SpotError
from spot.export.graph import build_target_graph
from spot.export.options import ExportOptions, check_options, effective_config
from spot.export.presets import PRESETS
from spot.export.quantize import QuantScheme
from spot.folder.epilogue import EpilogueCall

GIB = 2 ** 30
RUNTIME_GIB = 0.9      # CUDA context (~0.3-0.5 GB with cuBLAS/cuDNN/TensorRT loaded) + workspaces + arena slack
OS_GIB = 1.0           # carve-outs (the 8 GB Orin Nano shows ~7.4 GiB to Linux) + headless L4T services
MIN_HINT_CONTEXT = 512       # tokens at one node a smaller model named by a hint must hold (a prompt and an answer)


@dataclass(frozen=True)
class Device:
    key: str
    name: str
    memory_gib: float             # unified LPDDR5, shared by CPU and GPU
    bandwidth_gbs: float | None   # DRAM bandwidth (decoding is memory-bound: a pass reads every weight once)
    os_gib: float = OS_GIB
    runtime_gib: float = RUNTIME_GIB
    fp16_tflops: float | None = None   # the GPU's peak dense fp16 tensor-core throughput (spot.export.roofline)
    fp32_tflops: float | None = None   # ... and its FP32 CUDA-core throughput

    @property
    def budget(self) -> int:
        return int(self.memory_gib * GIB)


# Figures from NVIDIA's module data sheets (Jetson Orin Nano Series DS-11105-001, Jetson Orin NX Series DS-10712-001,
# Jetson AGX Orin Series DS-10662-001; the standard power modes, not Orin Nano's "Super" mode): 128-bit LPDDR5 at
# 68 / 102.4 / 204.8 GB/s; GPU 1024 CUDA cores + 32 tensor cores at 625 MHz (Nano 8GB) and 918 MHz (NX 16GB),
# 1792 + 56 at 930 MHz (AGX 32GB), 2048 + 64 at 1.3 GHz (AGX 64GB). Dense fp16 tensor throughput = tensor cores x
# 512 FLOP per clock (Ampere: 256 fp16 FMA) x clock = 10.2 / 15.0 / 26.7 / 42.6 TFLOP/s, a quarter of the data
# sheets' sparse INT8 GPU TOPS (40 / 60 / 108 / 170); FP32 = CUDA cores x 2 x clock.
DEVICES = {
    "orin-nano-8gb": Device("orin-nano-8gb", "Jetson Orin Nano 8GB", 8, 68.0,      # 102 GB/s in Super mode
                            fp16_tflops=10.24, fp32_tflops=1.28),
    "orin-nx-16gb": Device("orin-nx-16gb", "Jetson Orin NX 16GB", 16, 102.4, fp16_tflops=15.04, fp32_tflops=1.88),
    "agx-orin-32gb": Device("agx-orin-32gb", "Jetson AGX Orin 32GB", 32, 204.8, fp16_tflops=26.67,
                            fp32_tflops=3.33),
    "agx-orin-64gb": Device("agx-orin-64gb", "Jetson AGX Orin 64GB", 64, 204.8, fp16_tflops=42.6,
                            fp32_tflops=5.32),
}


def resolve_device(text: str) -> Device:
    """A named Jetson or '<N>GB' (N GiB of unified memory, the same OS/runtime assumptions)."""
    key = text.strip().lower()
    if key in DEVICES:
        return DEVICES[key]
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*gi?b", key)
    if m:
        gib = float(m.group(1))
        if not 0 < gib <= 4096:
            raise SpotError(f"--plan {text}: a device size must be in (0, 4096] GiB", "for example --plan 12GB")
        return Device(key, f"{gib:g} GiB device", gib, None)
    raise SpotError(f"unknown --plan device {text!r}", f"use one of {', '.join(DEVICES)} or a size like 12GB")


# -- the terms -------------------------------------------------------------------------------------------------------
def weight_bytes(cfg: ModelConfig, dtype: str, quant=None) -> int:
    """Bytes of every initializer the export writes (sum of the graph's WeightSpecs, no alignment padding)."""
    scheme = quant if quant is not None else QuantScheme()
    opset = 17
    graph = build_target_graph(cfg, dtype, opset, scheme)
    return sum(w.nbytes for w in graph.weights)


def _itemsize(dtype: str) -> int:
    return {"fp32": 4, "fp16": 2}[dtype]


def kv_bytes_per_token(cfg: ModelConfig, dtype: str) -> int:
    return 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * _itemsize(dtype)


def verify_pass_bytes(cfg: ModelConfig, dtype: str, nodes: int, context: int, quantized: bool,
                      epilogue: EpilogueCall | None = None) -> dict[str, int]:
    """Transient bytes of one pass over `nodes` states of B tokens against `context` cached tokens (see the module
    docstring); a dict of named terms. epilogue: the export's sampling epilogue calls (None: no epilogue)."""
    e = _itemsize(dtype)
    n, s, t = nodes, cfg.block_size, context + cfg.block_size
    hq, hkv, d, h, inter, v = (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.hidden_size,
                               cfg.intermediate_size, cfg.vocab_size)
    terms = {
        "logits": n * s * v * (4 + (e if dtype == "fp16" else 0)),
        "attention_scores": n * hq * s * t * (e + 8 if dtype == "fp16" else 8),
        "hidden": n * s * (3 * inter + 4 * h) * e,
        "new_kv": 2 * cfg.num_hidden_layers * n * hkv * s * d * e,
        # a store appends one layer at a time: that layer's longer K and V exist beside the old ones
        "layer_append": 2 * hkv * t * d * e,
    }
    if quantized:
        terms["dequantized_matrix"] = max(h * inter, h * hq * d) * e
    if epilogue is not None:   # one state per call (spot.runtime.outputs.DeferredOutputs): not N
        terms["sampling_epilogue"] = epilogue.peak_bytes(v)
    return terms


@dataclass(frozen=True)
class MemoryPlan:
    model: str
    device: Device
    dtype: str
    weights: str                  # precision label, e.g. "int4 (blocks of 128)"
    parameters: int
    weight_bytes: int
    kv_per_token: int
    context: int
    nodes: int
    kv_bytes: int
    activations: dict
    runtime_bytes: int
    os_bytes: int
    max_context: int              # largest context that fits at `nodes` states per pass (0: none)
    max_context_one_node: int     # ... with one state per pass (standard decoding)
    config: ModelConfig | None = None    # the model's shapes (the pass time projection)

    @property
    def activation_bytes(self) -> int:
        return sum(self.activations.values())

    @property
    def total(self) -> int:
        return self.weight_bytes + self.kv_bytes + self.activation_bytes + self.runtime_bytes + self.os_bytes

    @property
    def fits(self) -> bool:
        return self.total <= self.device.budget

    @property
    def min_pass_ms(self) -> float | None:
        """Lower bound of one pass when memory-bound: every weight byte read once at the DRAM bandwidth."""
        bw = self.device.bandwidth_gbs
        return None if bw is None else self.weight_bytes / (bw * 1e9) * 1e3

    def to_dict(self) -> dict:
        return {"device": self.device.key, "device_name": self.device.name, "memory_bytes": self.device.budget,
                "dtype": self.dtype, "weights": self.weights, "parameters": self.parameters,
                "weight_bytes": self.weight_bytes, "kv_bytes_per_token": self.kv_per_token,
                "context": self.context, "nodes": self.nodes, "kv_bytes": self.kv_bytes,
                "verify_pass_bytes": dict(self.activations), "runtime_bytes": self.runtime_bytes,
                "os_bytes": self.os_bytes, "total_bytes": self.total, "fits": self.fits,
                "max_context": self.max_context, "max_context_one_node": self.max_context_one_node,
                "min_pass_ms": None if self.min_pass_ms is None else round(self.min_pass_ms, 2),
                "assumptions": {"runtime_gib": self.device.runtime_gib, "os_gib": self.device.os_gib,
                                "bandwidth_gbs": self.device.bandwidth_gbs}}


def _fixed_and_per_token(cfg, dtype, nodes, quantized, fixed_extra, epilogue=None) -> tuple[int, int]:
    """total(context) = fixed + per_token * context (every context-dependent term is linear)."""
    def total(c: int) -> int:
        return kv_bytes_per_token(cfg, dtype) * c + sum(verify_pass_bytes(cfg, dtype, nodes, c, quantized,
                                                                          epilogue).values())
    return fixed_extra + total(0), total(1) - total(0)


def largest_context(cfg: ModelConfig, dtype: str, nodes: int, quantized: bool, fixed: int, budget: int,
                    epilogue: EpilogueCall | None = None) -> int:
    """Largest multiple of the block size <= max_position_embeddings whose total fits `budget` (0: none)."""
    base, per_token = _fixed_and_per_token(cfg, dtype, nodes, quantized, fixed, epilogue)
    if base > budget:
        return 0
    ctx = (budget - base) // per_token
    ctx = min(int(ctx), cfg.max_position_embeddings) // cfg.block_size * cfg.block_size
    return max(ctx, 0)


def precision_label(dtype: str, quant) -> str:
    if quant is None or not quant.quantized:
        return dtype
    label = quant.weights + (f" (blocks of {quant.int4_block})" if quant.weights == "int4" else " (per channel)")
    return f"{label}, scales/embed/lm_head {dtype}"


def make_plan(cfg: ModelConfig, dtype: str, quant, context: int, nodes: int, device: Device,
              model: str = "model", epilogue: EpilogueCall | None = None) -> MemoryPlan:
    """The plan for `cfg` exported as `dtype` + `quant` decoding `nodes` states per pass at `context` tokens on
    `device`. SpotError when the weights alone (plus runtime and OS share) exceed the device."""
    quantized = quant is not None and quant.quantized
    w = weight_bytes(cfg, dtype, quant)
    runtime, osb = int(device.runtime_gib * GIB), int(device.os_gib * GIB)
    if w + runtime + osb > device.budget:
        raise SpotError(f"{model} does not fit {device.name}: its {precision_label(dtype, quant)} weights alone "
                        f"take {w / GIB:.2f} GiB, plus {device.runtime_gib + device.os_gib:.1f} GiB runtime and OS "
                        f"share, of {device.memory_gib:g} GiB", _smaller_hint(cfg, dtype, quant, device))
    fixed = w + runtime + osb
    plan = MemoryPlan(model=model, device=device, dtype=dtype, weights=precision_label(dtype, quant),
                      parameters=cfg.parameter_count(), weight_bytes=w, kv_per_token=kv_bytes_per_token(cfg, dtype),
                      context=context, nodes=nodes, kv_bytes=kv_bytes_per_token(cfg, dtype) * context,
                      activations=verify_pass_bytes(cfg, dtype, nodes, context, quantized, epilogue),
                      runtime_bytes=runtime, os_bytes=osb,
                      max_context=largest_context(cfg, dtype, nodes, quantized, fixed, device.budget, epilogue),
                      max_context_one_node=largest_context(cfg, dtype, 1, quantized, fixed, device.budget,
                                                           epilogue), config=cfg)
    return plan


def _smaller_hint(cfg: ModelConfig, dtype: str, quant, device: Device) -> str:
    """Name what fits instead: --weights int8/int4 of this model, else a smaller model."""
    room = device.budget - int((device.runtime_gib + device.os_gib) * GIB)
    current = quant.weights if quant is not None and quant.quantized else "fp"
    options = []
    for weights in ("int8", "int4"):
        if weights == current or (current == "int4" and weights == "int8"):
            continue
        try:
            wb = weight_bytes(cfg, dtype, QuantScheme(weights))
        except SpotError:
            continue
        if wb < room:
            options.append(f"--weights {weights} ({wb / GIB:.2f} GiB of weights)")
    if options:
        return "export with " + " or ".join(options) + " and check again with --plan"
    if room <= 0:
        return (f"the runtime and OS take {device.runtime_gib + device.os_gib:g} GiB of the device's "
                f"{device.memory_gib:g} GiB before any weights: use a device with more memory")
    # smaller presets whose smallest form (int4 weights, spot-export's default sampling epilogue) holds a usable
    # context with standard decoding: not a model that fails the same way, nor one that fits with a few dozen tokens
    smaller: dict[str, tuple[int, int]] = {}          # name -> (parameters, largest context at 1 node)
    int4 = QuantScheme("int4")
    for preset in PRESETS.values():
        small = preset.config()
        if small.parameter_count() >= cfg.parameter_count():
            continue
        fixed = weight_bytes(small, dtype, int4) + device.budget - room
        epilogue = ExportOptions(dtype=dtype, weights="int4").epilogue_call(small)
        context = largest_context(small, dtype, 1, True, fixed, device.budget, epilogue)
        name = preset.name.split("-b")[0]
        if context >= MIN_HINT_CONTEXT and context > smaller.get(name, (0, 0))[1]:
            smaller[name] = (small.parameter_count(), context)
    listed = ", ".join(f"{name} (int4: up to {context} tokens at 1 node)" for name, (_, context)
                       in sorted(smaller.items(), key=lambda kv: -kv[1][0]))
    return ((f"use a smaller model: {listed}; or " if smaller else "use ")
            + "a device with more memory" + ("; --weights int4 is the smallest form" if current != "int4" else ""))


# -- rendering / export hooks ----------------------------------------------------------------------------------------
def _gib(n: int) -> str:
    return f"{n / GIB:.2f} GiB"


# the verify-pass terms render names
_NAMED = ("logits", "attention_scores", "layer_append", "sampling_epilogue")


def render(plan: MemoryPlan, block_size: int, counts=None) -> str:
    """The plan as text, with the roofline projection of pass times (spot.export.roofline) and, given pass counts
    (roofline.counts_from_bench / counts_from_reductions), SPOT's projected tokens/s."""
    a = plan.activations
    lines = [
        f"memory plan: {plan.model} ({plan.parameters / 1e9:.2f}B parameters) on {plan.device.name} "
        f"({plan.device.memory_gib:g} GiB unified memory)",
        f"  weights      {plan.weights}: {_gib(plan.weight_bytes)}",
        f"  KV cache     {plan.kv_per_token / 1024:.1f} KiB/token x {plan.context} tokens ({plan.dtype}): "
        f"{_gib(plan.kv_bytes)}",
        f"  verify pass  {plan.nodes} nodes x {block_size} tokens: logits {_gib(a['logits'])}, attention scores "
        f"{_gib(a['attention_scores'])}, layer append {_gib(a['layer_append'])}, sampling epilogue "
        f"{_gib(a.get('sampling_epilogue', 0))}, other "
        f"{_gib(plan.activation_bytes - sum(a.get(k, 0) for k in _NAMED))}: {_gib(plan.activation_bytes)}",
        f"  runtime      CUDA context + TensorRT/ORT workspaces (assumed): {_gib(plan.runtime_bytes)}",
        f"  OS share     carve-outs + headless L4T (assumed): {_gib(plan.os_bytes)}",
        f"  total        {_gib(plan.total)} of {plan.device.memory_gib:g} GiB: "
        + ("fits" if plan.fits else "does NOT fit"),
        f"  largest context that fits: {plan.max_context} tokens at {plan.nodes} node{'s' if plan.nodes > 1 else ''} "
        "per pass, "
        f"{plan.max_context_one_node} tokens at 1 node (standard decoding)",
    ]
    if plan.config is not None:
        from spot.export.roofline import render_projection
        lines.append(render_projection(plan.config.with_block_size(block_size), plan.dtype, plan.weight_bytes,
                                       plan.device, plan.nodes, plan.context, counts))
    if a.get("sampling_epilogue", 0) > a["logits"]:
        lines.append("  the sampling epilogue (the device sampler, auto on GPUs; one state per call) takes more than "
                     "the logits: fewer --epilogue-positions or --epilogue-steps shrink it, and decoding with "
                     "--sampler host needs only the logits' copy")
    return "\n".join(lines)


def plan_for_options(cfg: ModelConfig, options, context: int, model: str = "model") -> MemoryPlan:
    """The plan for an ExportOptions (spot.export.export) with options.plan set."""
    return make_plan(cfg, options.dtype, options.quant, context, options.max_nodes, resolve_device(options.plan),
                     model, options.epilogue_call(cfg))


def check_plan_fits(cfg: ModelConfig, options, context: int, progress, model: str = "model") -> MemoryPlan:
    """Before an export with --plan: SpotError unless the plan fits at the requested context."""
    plan = plan_for_options(cfg, options, context, model)
    progress(render(plan, cfg.block_size))
    if not plan.fits:
        hint = (f"export with --max-context {plan.max_context}" if plan.max_context else
                "lower --max-nodes or use smaller weights (--weights int4)")
        if plan.max_context == 0 and plan.max_context_one_node:
            hint += f" (with --max-nodes 1: up to {plan.max_context_one_node} tokens)"
        raise SpotError(f"the export does not fit {plan.device.name} at --max-context {context} with "
                        f"--max-nodes {options.max_nodes}: {_gib(plan.total)} of {plan.device.memory_gib:g} GiB",
                        hint)
    return plan


def plan_record(plan: MemoryPlan, block_size: int) -> dict:
    """A plan as the manifest's memory record holds it."""
    return plan.to_dict() | {"block_size": block_size}


def manifest_memory(cfg: ModelConfig, options, context: int) -> dict:
    """The manifest's `memory` record: device-independent numbers, plus the plan when --plan was given."""
    quant = options.quant
    quantized = quant.quantized
    act = verify_pass_bytes(cfg, options.dtype, options.max_nodes, context, quantized, options.epilogue_call(cfg))
    out = {"weight_bytes": weight_bytes(cfg, options.dtype, quant),
           "kv_bytes_per_token": kv_bytes_per_token(cfg, options.dtype),
           "kv_bytes_at_max_context": kv_bytes_per_token(cfg, options.dtype) * context,
           "verify_pass_bytes_at_max_nodes_and_context": sum(act.values()),
           "verify_pass_terms": act, "plan": None}
    if options.plan:
        out["plan"] = plan_record(plan_for_options(cfg, options, context), cfg.block_size)
    return out


def plan_source(source, options, progress) -> tuple[MemoryPlan, ModelConfig]:
    """`spot-export SOURCE --plan DEVICE` without --out: the plan of the source's config (its checkpoint folder's
    config.json, else the preset's built-in config: no weights needed)."""
    if source.checkpoint is not None:
        cfg = source.checkpoint_config()
    elif source.builtin_config is not None:
        cfg = source.builtin_config
    else:
        raise SpotError(f"no config for {source.preset}", "pass --checkpoint DIR")
    cfg = effective_config(cfg, source, options, progress)
    context = check_options(cfg, options)
    return plan_for_options(cfg, options, context, source.preset or source.default_name), cfg
