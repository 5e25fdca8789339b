"""`spot bench --node-sweep`: the passes reduction at each node count (small budgets included), and the tokens/s
those pass counts PROJECT on the Jetson Orin boards — a roofline projection (spot.export.roofline), never a
measurement.

What a decoder verifies at N nodes (sweep_budget):
  chain                          depth N - 1 (a chain's nodes are its depth + 1), at most the deepest the engine
                                 verifies (the block size; an engine sampling on the device: its epilogue's future
                                 steps): with block 32 a chain at 64 nodes is 32 deep, 33 nodes (its row says so);
  tree, spot, order-oracle,      the depth a budget of N nodes gets by default (TreeBudget(N).resolve: 8, the block
  oracle                         size if smaller), at most N - 1. A tree of N nodes is at most N - 1 deep, so below 9
                                 nodes no depth limit binds: the rows at 2, 4 and 8 nodes hold for any depth.
The projection prices each row's measured pass counts (spot.export.roofline.row_pass_counts: one-state passes at
t(1), verify passes at t(mean nodes)) with the plan's pass times of a deployment model (default: SDAR-8B, int4
weights, fp16, at 2,048 tokens of context, with the bench's block size: a node is the same block of tokens).
"""
from __future__ import annotations

from dataclasses import dataclass

from spot.errors import SpotError
from spot.export.presets import PRESETS
from spot.export.roofline import pass_time, row_pass_counts
from spot.runtime.registry import decoder as decoder_entry, decoder_names
from spot.runtime.spot import TreeBudget

# the tree decoders that follow the request's rule (static here): spot-sets commits by threshold, so its trees are
# not compared with standard decoding's passes. Ceilings last.
SWEEP_DECODERS = tuple(sorted(decoder_names(speculates=True, rule=None), key=lambda d: decoder_entry(d).ceiling))
DEFAULT_NODE_SWEEP = (2, 4, 8, 16, 64)
BOARDS = ("orin-nano-8gb", "orin-nx-16gb", "agx-orin-32gb", "agx-orin-64gb")
PROJECTION_NOTE = ("PROJECTION, not a measurement: a roofline (max(bytes moved / DRAM bandwidth, FLOPs / peak) from "
                   "data-sheet figures, spot/export/roofline.py) of {model} with {weights} weights in {dtype}, block "
                   "{block}, at {context} tokens of context, priced with this run's measured pass counts per token "
                   "(one-state passes at t(1), verify passes at t(their mean nodes))")


def parse_node_sweep(text: str, decoders=SWEEP_DECODERS) -> tuple[int, ...]:
    """--node-sweep: comma-separated node counts >= 2, each once, ascending; SpotError naming the flag, also when
    `decoders` (--decoders) has none of SWEEP_DECODERS."""
    hint = f"e.g. --node-sweep {','.join(map(str, DEFAULT_NODE_SWEEP))} (states per verify pass, the root included)"
    try:
        nodes = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise SpotError(f"--node-sweep takes comma-separated node counts, got {text!r}", hint) from None
    if not nodes or nodes[0] < 2:
        raise SpotError(f"--node-sweep takes node counts of 2 or more, got {text!r} (1 node is standard decoding)",
                        hint)
    if not set(SWEEP_DECODERS) & set(decoders):
        raise SpotError(f"--node-sweep reports {', '.join(SWEEP_DECODERS)}, and --decoders has none of them",
                        "e.g. --decoders standard,chain,tree,spot,order-oracle,oracle")
    return tuple(nodes)


def deepest_verifiable(engine) -> int:
    """The deepest tree node `engine` verifies: the block size, or the device epilogue's future steps if fewer."""
    sampler = engine.sampler_depth
    return min(engine.block_size, sampler if sampler is not None else engine.block_size)


def sweep_budget(decoder: str, nodes: int, engine) -> TreeBudget:
    """The budget `decoder` verifies with at `nodes` nodes in the sweep (the module docstring's rule)."""
    deepest = deepest_verifiable(engine)
    if decoder_entry(decoder).nodes_from_depth:
        depth = min(nodes - 1, deepest)
        return TreeBudget(depth + 1, depth)
    return TreeBudget(nodes, min(TreeBudget(nodes).resolve(engine).depth, nodes - 1, deepest))


def check_node_sweep(nodes: tuple[int, ...], engine) -> None:
    """SpotError, before any decoding, for a node count one verify pass of `engine` cannot take."""
    too_many = [n for n in nodes if n > engine.max_nodes]
    if too_many:
        raise SpotError(f"--node-sweep {too_many[0]} exceeds the {engine.max_nodes} states one verify pass of this "
                        "engine takes (the export's max_nodes)",
                        f"sweep node counts up to {engine.max_nodes}, or re-export with a larger --max-nodes")


@dataclass(frozen=True)
class ProjectionTarget:
    """The deployment model whose plan prices the pass counts: a preset (spot.export.presets), its weights and
    dtype, and the context its passes attend to."""

    model: str = "sdar-8b-b32"
    weights: str = "int4"
    dtype: str = "fp16"
    context: int = 2048

    def pass_times(self, block_size: int, boards=BOARDS) -> dict:
        """board key -> (Device, nodes -> projected ms) at this target's context with `block_size` tokens per node."""
        # onnx: optional extra (spot.export.memory_plan imports it)
        from spot.export.memory_plan import DEVICES, weight_bytes
        # onnx: optional extra (spot.export.quantize imports it)
        from spot.export.quantize import QuantScheme
        self.check()
        cfg = PRESETS[self.model].config().with_block_size(block_size)
        quant = QuantScheme(self.weights) if self.weights != "fp" else QuantScheme()
        w = weight_bytes(cfg, self.dtype, quant)
        return {key: (DEVICES[key], pass_time(cfg, self.dtype, w, DEVICES[key], self.context)) for key in boards}

    def check(self) -> None:
        """SpotError for a model that is not a preset."""
        if self.model not in PRESETS:
            raise SpotError(f"--project-model: unknown preset {self.model!r}, expected one of {', '.join(PRESETS)}",
                            "e.g. --project-model sdar-8b-b32")

    def note(self, block_size: int) -> str:
        return PROJECTION_NOTE.format(model=self.model, weights=self.weights, dtype=self.dtype, block=block_size,
                                      context=self.context)


def sweep_points(nodes: tuple[int, ...], decoders, engine) -> list[dict]:
    """Per node count and sweep decoder in `decoders`: the row label it runs as and its budget."""
    out = []
    for n in nodes:
        for d in SWEEP_DECODERS:
            if d in decoders:
                b = sweep_budget(d, n, engine)
                out.append({"nodes": n, "decoder": d, "variant": f"{d}@{b.nodes}x{b.depth}",
                            "budget": [b.nodes, b.depth]})
    return out


def sweep_report(rows: list[dict], points: list[dict], target: ProjectionTarget, block_size: int) -> dict:
    """bench.json's `node_sweep`: per temperature and sweep point the measured passes reduction against standard
    decoding (from the rows' pass counts) and the projected tokens/s on each board, standard decoding's beside."""
    boards = target.pass_times(block_size)
    by = {(r["variant"], r["temperature"]): r for r in rows}
    priced: set[int] = {1}

    def projected(row: dict) -> dict:
        counts = row_pass_counts(row)
        priced.add(counts.verify_nodes)
        return {key: counts.tokens_per_s(time_ms) for key, (_, time_ms) in boards.items()}
    out_rows, standard = [], {}
    for t in sorted({r["temperature"] for r in rows}):
        base = by.get(("standard", t))
        if base is None:
            continue
        standard[t] = {"passes_per_token": base["passes_per_token"], "projected_tokens_per_s": projected(base)}
        for p in points:
            row = by.get((p["variant"], t))
            if row is None:
                continue
            tps = projected(row)
            out_rows.append({**p, "temperature": t, "ceiling": decoder_entry(p["decoder"]).ceiling,
                             "mean_nodes_per_verify": row.get("mean_nodes_per_verify"),
                             "passes_per_token": row["passes_per_token"],
                             "passes_reduction": base["passes_per_token"] / row["passes_per_token"],
                             "identical_share": row.get("identical_share"),
                             "projected_tokens_per_s": tps,
                             "projected_speedup": {k: v / standard[t]["projected_tokens_per_s"][k]
                                                   for k, v in tps.items()}})
    return {"nodes": sorted({p["nodes"] for p in points}),
            "decoders": list(dict.fromkeys(p["decoder"] for p in points)), "rows": out_rows, "standard": [{"temperature": t, **s} for t, s in standard.items()],
            "projection": {"note": target.note(block_size), "model": target.model, "weights": target.weights,
                           "dtype": target.dtype, "context": target.context, "block_size": block_size,
                           "boards": {key: {"name": dev.name, "pass_ms": {str(n): time_ms(n)
                                                                           for n in sorted(priced)}}
                                      for key, (dev, time_ms) in boards.items()}}}


def _decoder_header(decoder: str) -> str:
    return f"{decoder} (ceiling)" if decoder_entry(decoder).ceiling else decoder


def sweep_markdown(sweep: dict) -> str:
    """The node sweep's two tables: measured passes reduction by node count, then the projected tokens/s."""
    decoders, rows = sweep["decoders"], sweep["rows"]
    by = {(r["temperature"], r["nodes"], r["decoder"]): r for r in rows}
    temps = sorted({r["temperature"] for r in rows})

    def reduction(r: dict) -> str:
        nodes, depth = r["budget"]
        shape = f" ({nodes}x{depth})" if nodes != r["nodes"] else ""     # a chain capped at the deepest node
        return f"{r['passes_reduction']:.2f}x{shape}"
    lines = ["## Node sweep: passes reduction against standard decoding (measured)", "",
             "| T | nodes | " + " | ".join(map(_decoder_header, decoders)) + " |", "|" + "---|" * (2 + len(decoders))]
    for t in temps:
        for n in sweep["nodes"]:
            cells = [reduction(by[(t, n, d)]) if (t, n, d) in by else "" for d in decoders]
            lines.append(f"| {t:g} | {n} | " + " | ".join(cells) + " |")
    lines.append("\nAt N nodes a chain is N - 1 deep (its nodes are its depth + 1; capped at the deepest node the "
                 "engine verifies, shown as NODESxDEPTH), every other decoder gets the default depth of an N-node "
                 "budget, at most N - 1 (below 9 nodes no depth limit binds).")
    proj = sweep["projection"]
    boards = proj["boards"]
    standard = {s["temperature"]: s for s in sweep["standard"]}
    lines += ["", "## Node sweep: projected tokens/s on Jetson Orin boards (PROJECTION, not a measurement)", "",
              "| T | nodes | decoder | nodes/verify | passes reduction (measured) | "
              + " | ".join(f"{b['name']}: projected tokens/s (x standard)" for b in boards.values()) + " |",
              "|" + "---|" * (5 + len(boards))]
    for t in temps:
        lines.append(f"| {t:g} | 1 | standard | 1.0 | 1.00x | "
                     + " | ".join(f"{standard[t]['projected_tokens_per_s'][k]:.2f}" for k in boards) + " |")
        for n in sweep["nodes"]:
            for d in decoders:
                r = by.get((t, n, d))
                if r is None:
                    continue
                mean = r["mean_nodes_per_verify"]
                cells = [f"{t:g}", str(n), _decoder_header(d), "" if mean is None else f"{mean:.1f}", reduction(r)]
                cells += [f"{r['projected_tokens_per_s'][k]:.2f} ({r['projected_speedup'][k]:.2f}x)" for k in boards]
                lines.append("| " + " | ".join(cells) + " |")
    times = ", ".join(f"{b['name']} " + " / ".join(f"{float(ms):.0f}" for ms in b["pass_ms"].values())
                      for b in boards.values())
    lines.append(f"\n{proj['note']}. Projected pass ms at {', '.join(boards[next(iter(boards))]['pass_ms'])} nodes: "
                 f"{times}.")
    return "\n".join(lines) + "\n"
