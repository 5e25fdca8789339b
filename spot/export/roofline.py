"""A roofline projection of a verify pass's time on a named device (`spot-export ... --plan DEVICE`), and of the
tokens/s SPOT's measured pass counts would give there: a PROJECTION from the export's shapes and the device's
data-sheet figures (spot.export.memory_plan.DEVICES), never a measurement (scripts/gpu_check.py measures).

A pass over N states of B tokens against C cached tokens takes max(bytes moved / DRAM bandwidth, FLOPs / peak):
  bytes  every weight read once; the cached prefix read once (the graph reads it once for all N states: format 2);
         the attention scores and probabilities (N*Hq*B*(C+B) elements per layer) each written and read once in
         the model dtype (an unfused graph moves more, a fused attention kernel less); the activations of every
         layer (q/k/v, attention output, gate/up/SwiGLU, residuals) written and read once; the new K/V and the
         float32 logits written once;
  FLOPs  2 per weight per token for the linear layers and lm_head, 4*Hq*D*(C+B) per token and layer for attention;
  peak   dense fp16 tensor-core FLOP/s for fp16 exports (int8/int4 weights are dequantized into fp16 GEMMs), FP32
         CUDA-core FLOP/s (2 per core per clock) for fp32 exports.
SPOT's tokens/s follows from pass counts: one-state passes (each block's first pass, standard steps, separate store
passes) cost t(1), a verify pass over n nodes t(n), a fused store pass (2B tokens of one state: docs/spec.md §1)
t(2). From a `spot bench` bench.json the counts are the measured ones per row; from
`--passes-reduction NODES=R` SPOT is taken to need R times fewer passes than standard decoding (static rule: one
commit per step, each block's first pass a fused store pass), every pass priced at t(NODES) (an upper bound of its
cost).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from spot.config import ModelConfig
from spot.descriptors import read_json
from spot.errors import SpotError
from spot.runtime.registry import decoder_names, exact_baseline, is_decoder
from spot.runtime.step import STATIC

SHORT_CONTEXT = 2048                       # the projection's short context (beside the plan's)


def peak_flops(device, dtype: str) -> float | None:
    """Peak FLOP/s the export's GEMMs can reach on `device` (spot.export.memory_plan.Device; None: not known, e.g.
    a device given by its memory size only)."""
    tflops = device.fp16_tflops if dtype == "fp16" else device.fp32_tflops
    return None if tflops is None else tflops * 1e12


@dataclass(frozen=True)
class PassCost:
    nodes: int
    context: int
    bytes_moved: dict          # name -> bytes
    flops: int

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes_moved.values())


def pass_cost(cfg: ModelConfig, dtype: str, weight_bytes: int, nodes: int, context: int) -> PassCost:
    """Bytes moved and FLOPs of one pass over `nodes` states of one block against `context` cached tokens."""
    e = {"fp32": 4, "fp16": 2}[dtype]
    rows = nodes * cfg.block_size                       # query tokens of the pass
    t = context + cfg.block_size
    L, h, inter, v = cfg.num_hidden_layers, cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    hq, hkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    kv_per_token = 2 * L * hkv * d * e
    per_row = (2 * hq + 2 * hkv) * d + 3 * inter + 2 * h        # q, k, v, attention out, gate, up, SwiGLU, residuals
    moved = {"weights": weight_bytes, "kv_cache": kv_per_token * context,
             "attention": L * rows * hq * t * 4 * e, "activations": L * 2 * rows * per_row * e,
             "new_kv": kv_per_token * rows, "logits": rows * v * 4}
    linear = L * (h * (hq + 2 * hkv) * d + hq * d * h + 3 * h * inter) + h * v
    flops = 2 * rows * linear + 4 * L * rows * hq * d * t
    return PassCost(nodes, context, moved, flops)


def pass_ms(cost: PassCost, device, dtype: str) -> tuple[float, str]:
    """(projected ms, "memory" | "compute": which bound sets it)."""
    memory = cost.total_bytes / (device.bandwidth_gbs * 1e9) * 1e3
    compute = cost.flops / peak_flops(device, dtype) * 1e3
    return (memory, "memory") if memory >= compute else (compute, "compute")


def pass_time(cfg: ModelConfig, dtype: str, weight_bytes: int, device, context: int):
    """nodes -> projected ms of one pass over that many states at `context` cached tokens on `device`."""
    def time_ms(nodes: int) -> float:
        return pass_ms(pass_cost(cfg, dtype, weight_bytes, nodes, context), device, dtype)[0]
    return time_ms


def node_counts(max_nodes: int) -> list[int]:
    """1, 2, 4, ... and max_nodes."""
    out, n = [], 1
    while n < max_nodes:
        out.append(n)
        n *= 2
    return out + [max_nodes]


# -- SPOT's pass counts ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PassCounts:
    """What one decoder did per generated token: one-state passes and verify passes with their mean node count."""
    label: str
    single_per_token: float
    verify_per_token: float = 0.0
    mean_nodes: float = 1.0
    note: str = ""
    fused_per_token: float = 0.0    # fused store passes: 2B tokens, priced as a pass over 2 states

    @property
    def verify_nodes(self) -> int:
        """The node count a verify pass is priced at: the mean, rounded (at least 1)."""
        return max(1, round(self.mean_nodes))

    def ms_per_token(self, time_ms) -> float:
        """time_ms(nodes) -> ms of a pass over that many states."""
        verify = time_ms(self.verify_nodes) if self.verify_per_token else 0.0
        fused = time_ms(2) if self.fused_per_token else 0.0
        return self.single_per_token * time_ms(1) + self.verify_per_token * verify + self.fused_per_token * fused

    def tokens_per_s(self, time_ms) -> float:
        """Projected tokens/s: the inverse of ms_per_token."""
        return 1e3 / self.ms_per_token(time_ms)


def row_pass_counts(row: dict) -> PassCounts:
    """A `spot bench` row's pass counts per generated token (one-state passes: each block's first and the store
    passes; fused store passes, two blocks each; verify passes at their mean node count), labelled "VARIANT T=t"."""
    kinds, tokens = row["passes_by_kind"], row["tokens"]
    single = (kinds.get("block", 0) + kinds.get("store", 0)) / tokens
    return PassCounts(f"{row['variant']} T={row['temperature']:g}", single, kinds.get("verify", 0) / tokens,
                      row.get("mean_nodes_per_verify", 1.0), fused_per_token=kinds.get("fused", 0) / tokens)


def counts_from_bench(path: str | Path) -> list[tuple[PassCounts, PassCounts]]:
    """(baseline, speculative) pass counts per row of a `spot bench` bench.json: every row of a decoder that
    speculates (not a ceiling) with the row of the decoder it is measured against at the same temperature."""
    path = Path(path)
    remedy = "pass the bench.json that `spot bench --out DIR` wrote"
    try:
        rows = read_json(path, remedy)["rows"]
    except SpotError as e:
        raise SpotError(f"--plan-bench {e.message}", remedy) from None
    except (OSError, KeyError, TypeError) as e:
        raise SpotError(f"--plan-bench {path}: not a bench.json of `spot bench` ({type(e).__name__}: {e})",
                        remedy) from None
    try:
        base = {(r["variant"], r["temperature"]): r for r in rows if is_decoder(r["decoder"], speculates=False)}
        out = []
        for r in rows:
            if (not is_decoder(r["decoder"], speculates=True, ceiling=False)
                    or not r.get("passes_by_kind", {}).get("verify")):
                continue
            baseline = base.get((exact_baseline(r.get("rule", STATIC)), r["temperature"]))
            if baseline is not None:
                out.append((row_pass_counts(baseline), row_pass_counts(r)))
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as e:
        raise SpotError(f"--plan-bench {path}: a row lacks pass counts ({type(e).__name__}: {e})",
                        "pass a bench.json written by this version's `spot bench`") from None
    if not out:
        raise SpotError(f"--plan-bench {path} has no {' / '.join(decoder_names(speculates=True, ceiling=False))} "
                        "row with its baseline",
                        "run `spot bench` with --decoders standard,spot (or tree) and pass its bench.json")
    return out


def counts_from_reductions(text: str, block_size: int, max_nodes: int) -> list[tuple[PassCounts, PassCounts]]:
    """--passes-reduction "16=1.9,64=2.3": (standard decoding, SPOT at that node budget) per entry."""
    standard = PassCounts("standard", 1 - 1 / block_size, fused_per_token=1 / block_size,
                          note="static rule: a pass per token, each block's first one storing the block before it "
                               "(the fused store pass, 2B tokens)")
    out = []
    for item in filter(None, (x.strip() for x in text.split(","))):
        m = re.fullmatch(r"(\d+)\s*=\s*(\d+(?:\.\d*)?|\.\d+)", item)
        if not m or not 1 <= int(m.group(1)) <= max_nodes or float(m.group(2)) <= 0:
            raise SpotError(f"--passes-reduction: got {item!r}, expected NODES=REDUCTION with NODES in "
                            f"1..{max_nodes} (--max-nodes) and REDUCTION > 0",
                            "for example --passes-reduction 16=1.9,64=2.3 (spot bench's passes reduction)")
        nodes, reduction = int(m.group(1)), float(m.group(2))
        out.append((standard, PassCounts(f"SPOT@{nodes} ({reduction:g}x fewer passes)", 0.0,
                                         (standard.single_per_token + standard.fused_per_token) / reduction, nodes,
                                         note="every pass priced at the budget's node count")))
    if not out:
        raise SpotError("--passes-reduction is empty", "for example --passes-reduction 16=1.9,64=2.3")
    return out


# -- rendering -------------------------------------------------------------------------------------------------------
def render_projection(cfg: ModelConfig, dtype: str, weight_bytes: int, device, max_nodes: int, context: int,
                      counts: list[tuple[PassCounts, PassCounts]] | None = None) -> str:
    """The projection's lines for the plan: pass time for 1..max_nodes states at a short context and at the plan's,
    then, given pass counts, projected tokens/s against the baseline per row."""
    peak = peak_flops(device, dtype)
    if peak is None or device.bandwidth_gbs is None:
        why = "a CPU, not a Jetson GPU" if device.cpu else "a size, not a named device"
        return f"  pass time projection: none for {device.name} ({why}: its bandwidth and GPU are unknown)"
    contexts = sorted({min(SHORT_CONTEXT, context) // cfg.block_size * cfg.block_size or cfg.block_size, context})
    kind = "fp16 tensor-core" if dtype == "fp16" else "fp32 CUDA-core"
    lines = [f"  pass time PROJECTION (roofline, not a measurement): max(bytes moved / {device.bandwidth_gbs:g} GB/s, "
             f"FLOPs / {peak / 1e12:.1f} TFLOP/s {kind} peak) -- {device.name} data-sheet figures "
             "(spot/export/memory_plan.py names the sources)",
             "    nodes" + "".join(f" | {f'at {c} tokens':>30}" for c in contexts)]
    for n in node_counts(max_nodes):
        cells = []
        for c in contexts:
            cost = pass_cost(cfg, dtype, weight_bytes, n, c)
            ms, bound = pass_ms(cost, device, dtype)
            cells.append(f"{cost.total_bytes / 1e9:6.1f} GB {cost.flops / 1e12:6.2f} TF {ms:7.0f} ms {bound[:3]}")
        lines.append(f"    {n:5d}" + "".join(f" | {cell:>30}" for cell in cells))
    if counts:
        for c in contexts:
            lines.append(f"  projected tokens/s at {c} tokens of context (pass counts x the projected pass times):")
            time_ms = pass_time(cfg, dtype, weight_bytes, device, c)
            for base, spec in counts:
                b_ms, s_ms = base.ms_per_token(time_ms), spec.ms_per_token(time_ms)
                lines.append(f"    {spec.label}: {1e3 / s_ms:7.2f} tokens/s vs {base.label} {1e3 / b_ms:7.2f} "
                             f"({b_ms / s_ms:.2f}x)")
        notes = sorted({x.note for pair in counts for x in pair if x.note})
        if notes:
            lines.append("    assumed: " + "; ".join(notes))
    return "\n".join(lines)
