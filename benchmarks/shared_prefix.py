#!/usr/bin/env python3
"""A verify pass that reads the cached prefix once (format 2's target graph) against format 1's, which broadcast the
prefix to every state: peak memory and latency side by side in one run, ONNX Runtime CPU, over the same weights.

    python benchmarks/shared_prefix.py                      # SDAR-1.7B's attention shape, 2 layers, fp32
    python benchmarks/shared_prefix.py --layers 4 --max-context 8192 --nodes 1,16,64 --repeats 5

The model is a random checkpoint with SDAR-1.7B's attention and MLP shape (hidden 2048, 16 query heads, 8 KV heads,
head dim 128, intermediate 6144, block size 4) and few layers (and a small vocabulary: the lm_head is not what is
compared); it is exported once with spot-export, and format 1's graph (spot.export.graph.BROADCAST) is declared over
the same data file. Memory: each graph runs one verify pass of --max-nodes states at the longest context
(--max-context - B cached tokens) in a fresh process with ONNX Runtime's memory arena off; the pass's transient is
the rise of the peak RSS over the RSS before it (the kernel's peak is reset there: /proc/self/clear_refs).
Latency: the median of --repeats passes per (nodes, context), the two graphs alternately. Logits of the two
graphs must agree within the export's fp32 tolerance (the script fails otherwise). Prints one JSON object.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from spot.config import ModelConfig  # noqa: E402
from spot.errors import SpotError, run_script  # noqa: E402
from spot.files import write_text_atomic  # noqa: E402
from spot.folder.manifest import past_feeds  # noqa: E402

FORMS = ("broadcast", "shared-prefix")      # format 1's graph, format 2's
FILES = {"broadcast": "broadcast.onnx", "shared-prefix": "target.onnx"}
MIB = 2 ** 20


def sdar_1_7b_shape(layers: int, vocab: int, max_context: int) -> ModelConfig:
    return ModelConfig(vocab_size=vocab, hidden_size=2048, intermediate_size=6144, num_hidden_layers=layers,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=max_context,
                       block_size=4, mask_token_id=vocab - 1, stop_ids=(vocab - 2,))


def export_both(cfg: ModelConfig, folder: Path, max_nodes: int) -> Path:
    """A random checkpoint exported (format 2) plus format 1's graph over the same data file."""
    from spot.export.export import export_checkpoint
    from spot.export.target_file import make_model, plan_layout
    from spot.export.options import ExportOptions
    from spot.export.graph import BROADCAST, build_target_graph
    from spot.export.presets import resolve_source
    from spot.reference.model import random_model
    random_model(cfg, seed=0).save_pretrained(folder / "ckpt")
    out = export_checkpoint(resolve_source(str(folder / "ckpt")), folder / "onnx",
                            ExportOptions(dtype="fp32", validate=False, max_nodes=max_nodes,
                                          max_context=cfg.max_position_embeddings, epilogue_steps=0))
    old = build_target_graph(cfg, "fp32", 17, None, BROADCAST)
    (out / FILES["broadcast"]).write_bytes(make_model(old, plan_layout(old.weights)[0]).SerializeToString())
    return out


def session(folder: Path, form: str, threads: int, arena: bool = True):
    from spot.ortlib import load_onnxruntime
    ort = load_onnxruntime()
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    so.enable_cpu_mem_arena = arena
    so.log_severity_level = 3
    return ort.InferenceSession(str(folder / FILES[form]), so, providers=["CPUExecutionProvider"])


def feeds(cfg: ModelConfig, form: str, nodes: int, cached: int, seed: int = 0) -> dict:
    """A verify pass's inputs: `nodes` random states of one block after `cached` random cached tokens."""
    rng = np.random.default_rng(seed)
    b, shape = cfg.block_size, (cfg.num_hidden_layers, cfg.num_key_value_heads, cached, cfg.head_dim)
    k, v = (rng.standard_normal(shape).astype(np.float32) for _ in range(2))
    cache = {"past_k": k, "past_v": v} if form == "broadcast" else past_feeds(k, v)
    return {"input_ids": rng.integers(0, cfg.vocab_size, (nodes, b)), "position_ids": np.arange(cached, cached + b),
            "attn_bias": np.zeros((b, cached + b), np.float32), **cache}


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise SpotError(f"/proc/self/status has no {field} (the memory measurement needs Linux)")


def measure_memory(folder: Path, cfg: ModelConfig, form: str, nodes: int, cached: int, threads: int) -> dict:
    """In this (fresh) process: the peak RSS rise of one pass over the RSS before it, arena off."""
    s = session(folder, form, threads, arena=False)
    f = feeds(cfg, form, nodes, cached)
    s.run(["logits"], feeds(cfg, form, 1, cfg.block_size))      # first-run allocations out of the way
    before = _status_kib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")              # the peak RSS (VmHWM) starts again from here
    s.run(["logits"], f)
    peak = _status_kib("VmHWM")
    return {"form": form, "rss_before_mib": round(before / 1024, 1), "pass_peak_rise_mib": round((peak - before) / 1024,
                                                                                                    1)}


def memory_in_subprocess(folder: Path, args, form: str, cached: int) -> dict:
    cmd = [sys.executable, __file__, "--measure-memory", form, "--folder", str(folder), "--layers", str(args.layers),
           "--vocab", str(args.vocab), "--max-context", str(args.max_context), "--threads", str(args.threads),
           "--cached", str(cached), "--max-nodes", str(args.max_nodes)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SpotError(f"the memory measurement of the {form} graph failed: {proc.stderr.strip()[-500:]}")
    return json.loads(proc.stdout)


def latency(folder: Path, cfg: ModelConfig, node_counts: list[int], contexts: list[int], repeats: int,
            threads: int) -> list[dict]:
    """Median ms per pass of each graph at each (nodes, cached), run alternately; their logits compared."""
    sessions = {form: session(folder, form, threads) for form in FORMS}
    rows = []
    for cached in contexts:
        for n in node_counts:
            inputs = {form: feeds(cfg, form, n, cached, seed=n) for form in FORMS}
            logits = {form: sessions[form].run(["logits"], inputs[form])[0] for form in FORMS}   # warm-up
            diff = float(np.abs(logits["broadcast"].astype(np.float64) - logits["shared-prefix"]).max())
            if diff > 1e-4:
                raise SpotError(f"the two graphs' logits differ by {diff:.3g} at {n} nodes, {cached} cached tokens "
                                "(the export's fp32 tolerance is 1e-4)")
            times = {form: [] for form in FORMS}
            for _ in range(repeats):
                for form in FORMS:
                    t0 = time.perf_counter()
                    sessions[form].run(["logits"], inputs[form])
                    times[form].append((time.perf_counter() - t0) * 1e3)
            ms = {form: statistics.median(t) for form, t in times.items()}
            rows.append({"nodes": n, "cached": cached, "broadcast_ms": round(ms["broadcast"], 1),
                         "shared_prefix_ms": round(ms["shared-prefix"], 1),
                         "shared_over_broadcast": round(ms["shared-prefix"] / ms["broadcast"], 3),
                         "max_abs_dlogits": diff})
            print(f"nodes {n:3d} cached {cached:5d}: broadcast {ms['broadcast']:8.1f} ms, shared prefix "
                  f"{ms['shared-prefix']:8.1f} ms ({ms['shared-prefix'] / ms['broadcast']:.2f}x)", file=sys.stderr)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--max-context", type=int, default=4096, help="the export's; the longest pass caches this - B")
    ap.add_argument("--max-nodes", type=int, default=64, help="states of the memory-measured verify pass")
    ap.add_argument("--nodes", default="1,16,64", help="node counts of the latency table")
    ap.add_argument("--short", type=int, default=256, help="cached tokens of the short-prefix latency rows")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    ap.add_argument("--measure-memory", choices=FORMS, help=argparse.SUPPRESS)     # the child process's job
    ap.add_argument("--folder", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--cached", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    cfg = sdar_1_7b_shape(args.layers, args.vocab, args.max_context)
    if args.measure_memory:
        print(json.dumps(measure_memory(args.folder, cfg, args.measure_memory, args.max_nodes, args.cached,
                                        args.threads)))
        return 0
    from spot.export.memory_plan import verify_pass_bytes
    longest = args.max_context - cfg.block_size
    with tempfile.TemporaryDirectory(prefix="spot-shared-prefix-") as tmp:
        folder = export_both(cfg, Path(tmp), args.max_nodes)
        memory = {form: memory_in_subprocess(folder, args, form, longest) for form in FORMS}
        rows = latency(folder, cfg, [int(x) for x in args.nodes.split(",")], [args.short, longest], args.repeats,
                       args.threads)
    t = longest + cfg.block_size
    e = 4
    terms = verify_pass_bytes(cfg, "fp32", args.max_nodes, longest, False)
    result = {
        "model": {"layers": cfg.num_hidden_layers, "hidden": cfg.hidden_size, "heads": cfg.num_attention_heads,
                  "kv_heads": cfg.num_key_value_heads, "head_dim": cfg.head_dim, "vocab": cfg.vocab_size,
                  "block_size": cfg.block_size, "dtype": "fp32"},
        "runtime": "onnxruntime CPUExecutionProvider", "threads": args.threads,
        "memory": {"nodes": args.max_nodes, "cached": longest, **{form: memory[form] for form in FORMS},
                   "shared_over_broadcast": round(memory["shared-prefix"]["pass_peak_rise_mib"]
                                                  / memory["broadcast"]["pass_peak_rise_mib"], 3),
                   # what format 1 broadcast per layer (the Expanded K and V, the Concats with the blocks, K^T)
                   "format1_broadcast_per_layer_mib": round(3 * args.max_nodes * cfg.num_key_value_heads * t
                                                            * cfg.head_dim * e / MIB, 1),
                   "kv_cache_mib": round(2 * cfg.num_hidden_layers * cfg.num_key_value_heads * longest
                                         * cfg.head_dim * e / MIB, 1),
                   "plan_verify_pass_mib": round(sum(terms.values()) / MIB, 1),
                   "plan_terms_mib": {k: round(v / MIB, 1) for k, v in terms.items()}},
        "latency": rows,
    }
    text = json.dumps(result)
    print(text)
    if args.out is not None:
        write_text_atomic(args.out, text + "\n")
    return 0


if __name__ == "__main__":
    run_script(main)
