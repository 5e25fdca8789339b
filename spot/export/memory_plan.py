"""Memory plans: will an export fit a Jetson (`spot-export MODEL --plan orin-nx-16gb|...|<N>GB|host`), served by
N engines at once (`--engines N`, spot serve's)?

A plan adds, in bytes (docs/quantization.md has the derivations):
  weights      every initializer the export writes (the same WeightSpecs the writer uses: per tensor, per
               precision, int8/int4 scales included; norm weights float32) — once, whatever the engines: the
               engines of a process share one copy (spot.engines.ort_sessions),
and per engine (each decodes one request, with its own cache and passes, at the same time as the others):
  KV cache     2 * layers * kv_heads * head_dim * dtype bytes per token (SDAR-8B fp16: 144 KiB) x --max-context,
  verify pass  the transient tensors of one target pass over --max-nodes states of B tokens at that context
               (at least 2: the fused store pass runs 2B tokens of one state, a block and the next one's first state):
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
               the default there). On `host` (ONNX Runtime on this machine's CPU) F samples on the host
               instead: no epilogue, and the host loop's float64 rows of a few states (HOST_SAMPLER_ROWS); an
               fp16 export's attention there reads float32 copies of the cache (ORT CPU has no fp16 GEMM),
and once more:
  runtime      CUDA context + TensorRT/cuBLAS workspaces + ONNX Runtime arena slack (assumed RUNTIME_GIB); on `host`
               the process without weights: Python, onnxruntime, the server, and what ONNX Runtime's CPU arena and
               malloc keep once passes have run (CPU_RUNTIME_GIB, measured: benchmarks/results.md),
  OS share     kernel carve-outs + a headless L4T userland in the unified memory (assumed per device); on `host`
               what the machine's other processes use now (MemTotal - MemAvailable);
and compares the sum with the device's memory. Every term but the weights grows linearly with the context, so the
largest context that fits is solved in closed form (a multiple of the block size, at most max_position_embeddings),
and every term but the weights, runtime and OS share with the engines (the most engines that fit).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path


from spot.config import ModelConfig
from spot.errors import SpotError
from spot.export.graph import build_target_graph
from spot.export.options import ExportOptions, check_options, effective_config
from spot.export.presets import PRESETS
from spot.export.quantize import QuantScheme
from spot.export.roofline import render_projection
from spot.folder.epilogue import EpilogueCall

GIB = 2 ** 30
RUNTIME_GIB = 0.9      # CUDA context (~0.3-0.5 GB with cuBLAS/cuDNN/TensorRT loaded) + workspaces + arena slack
OS_GIB = 1.0           # carve-outs (the 8 GB Orin Nano shows ~7.4 GiB to Linux) + headless L4T services
MIN_HINT_CONTEXT = 512       # tokens at one node a smaller model named by a hint must hold (a prompt and an answer)
# `--plan host`: the serving process without its weights on ONNX Runtime's CPU provider (Python, numpy, onnxruntime,
# FastAPI / uvicorn) plus what the CPU arena and malloc keep once passes have run: 0.08 GiB (fp32 export) to 0.23 GiB
# (fp16) measured by benchmarks/serve_memory.py on a 0.23B-parameter model with 1 and 4 engines (benchmarks/results.md)
CPU_RUNTIME_GIB = 0.15
# the host sampler's float64 [B, V] rows alive at once per engine (a state's scaled logits, their exponentials,
# the noisy scores, a stale view's): ~7 measured with tracemalloc on ORT CPU, rounded up
HOST_SAMPLER_ROWS = 8
MEMINFO = Path("/proc/meminfo")


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
    cpu: bool = False                  # ONNX Runtime on the CPU (`host`): F samples on the host, not in the
                                       # export's epilogue on the GPU; fp16 MatMul weights held in float32

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


def host_device(meminfo: Path = MEMINFO) -> Device:
    """`host`: this machine, ONNX Runtime on its CPU: its memory (MemTotal), of which the OS and the other processes
    use what is not available now (MemTotal - MemAvailable); the CPU process's runtime; F samples on the host."""
    try:
        fields = {line.split(":")[0]: int(line.split()[1]) for line in meminfo.read_text().splitlines()
                  if line.split()[1:2] and line.split()[1].isdigit()}
        total, available = fields["MemTotal"] * 1024, fields["MemAvailable"] * 1024
    except (OSError, KeyError, IndexError, ValueError):
        raise SpotError(f"--plan host reads the machine's memory from {meminfo}, which is absent or unreadable here",
                        "name the memory instead, e.g. --plan 16GB") from None
    return Device("host", "this machine (ONNX Runtime CPU)", total / GIB, None, os_gib=(total - available) / GIB,
                  runtime_gib=CPU_RUNTIME_GIB, cpu=True)


def resolve_device(text: str) -> Device:
    """A named Jetson, '<N>GB' (N GiB of unified memory, the same OS/runtime assumptions) or `host` (this machine's
    CPU: host_device)."""
    key = text.strip().lower()
    if key in DEVICES:
        return DEVICES[key]
    if key == "host":
        return host_device()
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*gi?b", key)
    if m:
        gib = float(m.group(1))
        if not 0 < gib <= 4096:
            raise SpotError(f"--plan {text}: a device size must be in (0, 4096] GiB", "for example --plan 12GB")
        return Device(key, f"{gib:g} GiB device", gib, None)
    raise SpotError(f"unknown --plan device {text!r}",
                    f"use one of {', '.join(DEVICES)}, a size like 12GB, or host (this machine's CPU)")


# -- the terms -------------------------------------------------------------------------------------------------------
def weight_bytes(cfg: ModelConfig, dtype: str, quant=None, on_cpu: bool = False) -> int:
    """Bytes of every initializer the export writes (sum of the graph's WeightSpecs, no alignment padding); on_cpu:
    as ONNX Runtime's CPU provider holds them, an fp16 MatMul weight in float32 (it has no fp16 GEMM on x86-64: it
    inserts a Cast and folds it into a float32 copy when the session loads, measured: benchmarks/results.md; the
    embedding's Gather and the norms keep their dtype, int8/int4 weights are counted as stored)."""
    scheme = quant if quant is not None else QuantScheme()
    opset = 17
    graph = build_target_graph(cfg, dtype, opset, scheme)
    return sum(w.nbytes * (2 if on_cpu and _upcast_on_cpu(w) else 1) for w in graph.weights)


def _upcast_on_cpu(weight) -> bool:
    """An fp16 MatMul weight (stored transposed to [in, out] for MatMul), which ORT CPU holds in float32."""
    return weight.transpose and weight.quant is None and weight.dtype == "fp16"


def _itemsize(dtype: str) -> int:
    return {"fp32": 4, "fp16": 2}[dtype]


def kv_bytes_per_token(cfg: ModelConfig, dtype: str) -> int:
    return 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * _itemsize(dtype)


FUSED_PASS_BLOCKS = 2        # the fused store pass: the finished block and the next block's first state


def verify_pass_bytes(cfg: ModelConfig, dtype: str, nodes: int, context: int, quantized: bool,
                      epilogue: EpilogueCall | None = None, cpu: bool = False) -> dict[str, int]:
    """Transient bytes of one pass over `nodes` states of B tokens against `context` cached tokens (see the module
    docstring); a dict of named terms. epilogue: the export's sampling epilogue calls (None: no epilogue, or F
    samples on the host); cpu: on ONNX Runtime's CPU provider (`host`): F samples on the host (its float64 rows),
    and an fp16 export's attention reads float32 copies of the cache."""
    e = _itemsize(dtype)
    # the fused store pass (docs/spec.md §1) runs one state's block after the block it stores: 2B tokens, the rows
    # (and about the attention) of a 2-node pass, so no budget's widest pass is narrower than that
    n, s, t = max(nodes, FUSED_PASS_BLOCKS), cfg.block_size, context + cfg.block_size
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
    if cpu:                    # a few states' rows at a time (the walk's, a round's stale view), not N
        terms["host_sampler"] = HOST_SAMPLER_ROWS * s * v * 8
    if cpu and dtype == "fp16":
        # no fp16 GEMM on x86-64: ORT casts each layer's past K and V to float32 for the attention's MatMuls, as
        # much as a float32 copy of the whole cache per pass (measured with 1 and 4 layers: benchmarks/results.md)
        terms["cache_fp32_copy"] = 2 * cfg.num_hidden_layers * hkv * t * d * 4
    return terms


def engine_bytes(cfg: ModelConfig, dtype: str, nodes: int, context: int, quantized: bool,
                 epilogue: EpilogueCall | None = None, cpu: bool = False) -> int:
    """What one engine adds: its KV cache at `context` tokens and one pass's transient bytes (verify_pass_bytes)."""
    return kv_bytes_per_token(cfg, dtype) * context + sum(verify_pass_bytes(cfg, dtype, nodes, context, quantized,
                                                                             epilogue, cpu).values())


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
    max_context: int              # largest context that fits at `nodes` states per pass (0: none), `engines` engines
    max_context_one_node: int     # ... with one state per pass (standard decoding)
    config: ModelConfig | None = None    # the model's shapes (the pass time projection)
    engines: int = 1              # engines decoding at once (spot serve --engines): kv_bytes and activations each
    max_engines: int = 0          # most engines that fit at `context` and `nodes` (0: none)

    @property
    def activation_bytes(self) -> int:
        """One engine's pass."""
        return sum(self.activations.values())

    @property
    def engine_bytes(self) -> int:
        """What each engine adds: its KV cache and its pass."""
        return self.kv_bytes + self.activation_bytes

    @property
    def process_bytes(self) -> int:
        """What the serving process holds: the weights once, each engine's cache and pass, the runtime."""
        return self.weight_bytes + self.engines * self.engine_bytes + self.runtime_bytes

    @property
    def total(self) -> int:
        return self.process_bytes + self.os_bytes

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
                "verify_pass_bytes": dict(self.activations), "engines": self.engines,
                "engine_bytes": self.engine_bytes, "runtime_bytes": self.runtime_bytes,
                "process_bytes": self.process_bytes, "os_bytes": self.os_bytes, "total_bytes": self.total,
                "fits": self.fits, "max_context": self.max_context,
                "max_context_one_node": self.max_context_one_node, "max_engines": self.max_engines,
                "min_pass_ms": None if self.min_pass_ms is None else round(self.min_pass_ms, 2),
                "assumptions": {"runtime_gib": self.device.runtime_gib, "os_gib": self.device.os_gib,
                                "bandwidth_gbs": self.device.bandwidth_gbs}}


def _fixed_and_per_token(cfg, dtype, nodes, quantized, fixed_extra, epilogue=None, engines=1,
                         cpu=False) -> tuple[int, int]:
    """total(context) = fixed + per_token * context (every context-dependent term is linear)."""
    def total(c: int) -> int:
        return engines * engine_bytes(cfg, dtype, nodes, c, quantized, epilogue, cpu)
    return fixed_extra + total(0), total(1) - total(0)


def largest_context(cfg: ModelConfig, dtype: str, nodes: int, quantized: bool, fixed: int, budget: int,
                    epilogue: EpilogueCall | None = None, engines: int = 1, cpu: bool = False) -> int:
    """Largest multiple of the block size <= max_position_embeddings whose total with `engines` engines fits
    `budget` (0: none); fixed: the weights, runtime and OS share."""
    base, per_token = _fixed_and_per_token(cfg, dtype, nodes, quantized, fixed, epilogue, engines, cpu)
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
              model: str = "model", epilogue: EpilogueCall | None = None, engines: int = 1) -> MemoryPlan:
    """The plan for `cfg` exported as `dtype` + `quant` decoding `nodes` states per pass at `context` tokens on
    `device`, with `engines` engines at once. SpotError when the weights alone (plus runtime and OS share) exceed
    the device."""
    if isinstance(engines, bool) or not isinstance(engines, int) or engines < 1:
        raise SpotError(f"--engines must be an integer >= 1, got {engines!r}", "e.g. --engines 2")
    quantized = quant is not None and quant.quantized
    host = device.cpu
    if host:                   # F samples on the host: the epilogue does not run
        epilogue = None
    w = weight_bytes(cfg, dtype, quant, on_cpu=host)
    runtime, osb = int(device.runtime_gib * GIB), int(device.os_gib * GIB)
    if w + runtime + osb > device.budget:
        raise SpotError(f"{model} does not fit {device.name}: its {precision_label(dtype, quant)} weights alone "
                        f"take {w / GIB:.2f} GiB, plus {device.runtime_gib + device.os_gib:.1f} GiB runtime and OS "
                        f"share, of {device.memory_gib:g} GiB", _smaller_hint(cfg, dtype, quant, device))
    fixed = w + runtime + osb
    each = engine_bytes(cfg, dtype, nodes, context, quantized, epilogue, host)
    plan = MemoryPlan(model=model, device=device, dtype=dtype, weights=precision_label(dtype, quant),
                      parameters=cfg.parameter_count(), weight_bytes=w, kv_per_token=kv_bytes_per_token(cfg, dtype),
                      context=context, nodes=nodes, kv_bytes=kv_bytes_per_token(cfg, dtype) * context,
                      activations=verify_pass_bytes(cfg, dtype, nodes, context, quantized, epilogue, host),
                      runtime_bytes=runtime, os_bytes=osb,
                      max_context=largest_context(cfg, dtype, nodes, quantized, fixed, device.budget, epilogue,
                                                  engines, host),
                      max_context_one_node=largest_context(cfg, dtype, 1, quantized, fixed, device.budget,
                                                           epilogue, engines, host), config=cfg,
                      engines=engines, max_engines=max(0, (device.budget - fixed) // each))
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


_CPU_FP16 = " (fp16 MatMul weights in float32 on ORT CPU)"
# the verify-pass terms render names
_NAMED = ("logits", "attention_scores", "layer_append", "sampling_epilogue", "host_sampler", "cache_fp32_copy")


def render(plan: MemoryPlan, block_size: int, counts=None) -> str:
    """The plan as text, with the roofline projection of pass times (spot.export.roofline) and, given pass counts
    (roofline.counts_from_bench / counts_from_reductions), SPOT's projected tokens/s."""
    a, host, n = plan.activations, plan.device.cpu, plan.engines
    engines = f"{n} engine{'s' * (n > 1)}"
    each = " (each engine)" if n > 1 else ""
    sampling = (f"host sampler {_gib(a.get('host_sampler', 0))}" if host else
                f"sampling epilogue {_gib(a.get('sampling_epilogue', 0))}")
    if "cache_fp32_copy" in a:
        sampling += f", float32 copy of the cache {_gib(a['cache_fp32_copy'])}"
    lines = [
        f"memory plan: {plan.model} ({plan.parameters / 1e9:.2f}B parameters) on {plan.device.name} "
        f"({plan.device.memory_gib:.3g} GiB {'of memory' if host else 'unified memory'}), {engines}",
        f"  weights      {plan.weights}{_CPU_FP16 if host and plan.dtype == 'fp16' else ''}: "
        f"{_gib(plan.weight_bytes)} (once: the engines share them)",
        f"  KV cache     {plan.kv_per_token / 1024:.1f} KiB/token x {plan.context} tokens ({plan.dtype}){each}: "
        f"{_gib(plan.kv_bytes)}",
        f"  verify pass  {plan.nodes} nodes x {block_size} tokens{each}: logits {_gib(a['logits'])}, attention "
        f"scores {_gib(a['attention_scores'])}, layer append {_gib(a['layer_append'])}, {sampling}, other "
        f"{_gib(plan.activation_bytes - sum(a.get(k, 0) for k in _NAMED))}: {_gib(plan.activation_bytes)}",
        f"  engines      {n} x (KV cache + verify pass): {_gib(n * plan.engine_bytes)}",
        ("  runtime      Python + ONNX Runtime CPU + server, arena kept (assumed): " if host else
         "  runtime      CUDA context + TensorRT/ORT workspaces (assumed): ") + _gib(plan.runtime_bytes),
        f"  process      weights + engines + runtime: {_gib(plan.process_bytes)}",
        ("  OS share     the OS and other processes now: " if host else
         "  OS share     carve-outs + headless L4T (assumed): ") + _gib(plan.os_bytes),
        f"  total        {_gib(plan.total)} of {plan.device.memory_gib:.3g} GiB: "
        + ("fits" if plan.fits else "does NOT fit"),
        f"  largest context that fits: {plan.max_context} tokens at {plan.nodes} node{'s' if plan.nodes > 1 else ''} "
        "per pass, "
        f"{plan.max_context_one_node} tokens at 1 node (standard decoding), with {engines}",
        f"  most engines that fit at {plan.context} tokens and {plan.nodes} node{'s' if plan.nodes > 1 else ''}: "
        f"{plan.max_engines}",
    ]
    if plan.config is not None:
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
                     model, options.epilogue_call(cfg), options.plan_engines)


def what_fits(plan: MemoryPlan, context_remedy: str) -> str:
    """The hint of a plan that does not fit: the most engines that fit at its context, and the largest context at
    its engines (context_remedy: how the user sets it, e.g. "export with --max-context"), else what to shrink."""
    options = []
    if plan.engines > 1 and plan.max_engines:
        options.append(f"serve with --engines {plan.max_engines} (the most that fit at {plan.context} tokens)")
    if plan.max_context:
        options.append(f"{context_remedy} {plan.max_context} (the largest that fits {plan.engines} "
                       f"engine{'s' * (plan.engines > 1)})")
    elif plan.max_context_one_node:
        options.append(f"{context_remedy} {plan.max_context_one_node} with --max-nodes 1")
    if not options:
        return "lower --max-nodes or --engines, or use smaller weights (--weights int4)"
    return " or ".join(options)


def check_plan_fits(cfg: ModelConfig, options, context: int, progress, model: str = "model") -> MemoryPlan:
    """Before an export with --plan: SpotError unless the plan fits at the requested context."""
    plan = plan_for_options(cfg, options, context, model)
    progress(render(plan, cfg.block_size))
    if not plan.fits:
        engines = f" and --engines {plan.engines}" if plan.engines > 1 else ""
        raise SpotError(f"the export does not fit {plan.device.name} at --max-context {context} with "
                        f"--max-nodes {options.max_nodes}{engines}: {_gib(plan.total)} of "
                        f"{plan.device.memory_gib:.3g} GiB", what_fits(plan, "export with --max-context"))
    return plan


def plan_for_export(exported, device: Device, engines: int = 1) -> MemoryPlan:
    """The plan of an exported folder (spot.folder.manifest.ExportedFolder) served by `engines` engines on `device`:
    its config, dtype, weights' precision and sampling epilogue as the manifest records them, at its max_context and
    max_nodes (what a request may reach)."""
    m = exported.manifest
    cfg = exported.config.with_block_size(exported.block_size)
    entry = m.graphs.epilogue
    epilogue = None
    if entry is not None:
        epilogue = EpilogueCall(entry.future_steps, entry.positions_per_call or cfg.block_size)
    context = min(exported.max_context, cfg.max_position_embeddings)
    return make_plan(cfg, exported.dtype, QuantScheme.from_record(m.weights_record, bool(m.ort_only)),
                     context, exported.max_nodes, device, exported.folder.name, epilogue, engines)


def check_serving_fits(exported, device_text: str, engines: int, progress) -> MemoryPlan:
    """`spot serve --plan DEVICE`: the plan of the export served by `engines` engines, printed; SpotError naming the
    most engines (or the largest context) that fit unless it fits."""
    plan = plan_for_export(exported, resolve_device(device_text), engines)
    progress(render(plan, plan.config.block_size))
    if not plan.fits:
        raise SpotError(f"{engines} engine{'s' * (engines > 1)} over {exported.folder} do not fit "
                        f"{plan.device.name}: {_gib(plan.total)} of {plan.device.memory_gib:.3g} GiB at its "
                        f"max_context {plan.context} and max_nodes {plan.nodes}",
                        what_fits(plan, "re-export with --max-context"))
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
