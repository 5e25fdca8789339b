#!/usr/bin/env python3
"""Per-pass latency of the ORT CPU engine vs the torch CPU reference, side by side in one run (same thread count).

    python benchmarks/ort_vs_torch_latency.py                       # the embedded model, exported to a temp dir
    python benchmarks/ort_vs_torch_latency.py --checkpoint DIR --nodes 1,4,16 --prefix-blocks 16

Prints one JSON line per node count: median milliseconds per block pass for torch and ort, and torch/ort.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from spot.engines.ort_engine import OrtEngine  # noqa: E402
from spot.engines.torch_engine import TorchEngine  # noqa: E402
from spot.export.export import export_checkpoint
from spot.export.options import ExportOptions  # noqa: E402
from spot.export.presets import resolve_source  # noqa: E402


def median_ms(engine, states: np.ndarray, repeats: int) -> float:
    engine.block_logits(states)  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        engine.block_logits(states)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", default="embedded", help="checkpoint folder or preset (default: embedded)")
    ap.add_argument("--exported", type=Path, default=None, help="an exported fp32 folder of the same checkpoint")
    ap.add_argument("--nodes", default="1,4,16", help="comma-separated node counts N")
    ap.add_argument("--prefix-blocks", type=int, default=8, help="cached prefix length in blocks")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--threads", type=int, default=None, help="threads for both engines (default: library's)")
    args = ap.parse_args(argv)
    import torch
    if args.threads:
        torch.set_num_threads(args.threads)
    source = resolve_source(args.checkpoint)
    with tempfile.TemporaryDirectory(prefix="spot-latency-") as tmp:
        exported = args.exported or export_checkpoint(source, Path(tmp) / "onnx",
                                                      ExportOptions(dtype="fp32", validate=False))
        ort_engine = OrtEngine(exported, threads=args.threads)
        torch_engine = TorchEngine.from_dir(source.checkpoint, ort_engine.block_size)
        cfg, b = ort_engine.config, ort_engine.block_size
        rng = np.random.default_rng(0)
        prefix = rng.integers(0, cfg.vocab_size, size=args.prefix_blocks * b)
        prefix[prefix == cfg.mask_token_id] = 0
        for engine in (ort_engine, torch_engine):
            engine.prefill(prefix)
        for n in (int(x) for x in args.nodes.split(",")):
            states = rng.integers(0, cfg.vocab_size, size=(n, b))
            t_ms, o_ms = median_ms(torch_engine, states, args.repeats), median_ms(ort_engine, states, args.repeats)
            print(json.dumps({"model": str(source.checkpoint), "nodes": n, "block_size": b,
                              "prefix": int(prefix.size), "threads": args.threads, "torch_ms": round(t_ms, 3),
                              "ort_ms": round(o_ms, 3), "torch_over_ort": round(t_ms / o_ms, 2)}))
    return 0


if __name__ == "__main__":
    from spot.errors import run_script
    run_script(main)
