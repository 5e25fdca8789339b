#!/usr/bin/env python3
"""Block-size sweep: where does SPOT's passes reduction turn into speed on this engine?

    python benchmarks/block_size_sweep.py                           # embedded model, ORT CPU, B = 4, 8, 16, 32
    python benchmarks/block_size_sweep.py --exported DIR --block-sizes 8,32 --limit 3 --out sweep.json

For each block size B, on the same exported folder and prompts, in one run:
  - latency(N) of one verify pass for N = 1..16 states (how far a pass is overhead-bound: latency(16)/latency(1));
  - the budget tuner's choice per temperature (spot/runtime/tuning.py) and that budget run beside standard
    decoding (tokens/s ratio, passes reduction, identical share), as `spot bench --tune` does;
  - fixed budgets 4x3 and 16x8 (depth capped at B) beside standard decoding.
The training-free `tree` decoder is used (the shipped drafter is trained for B = 32 only; with --drafter-b32 the
B = 32 row also runs `spot`). Prints progress to stderr and one JSON object to stdout (and --out).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from spot.app.bench_run import BenchConfig, run_bench, tune_by_temperature  # noqa: E402
from spot.prompts import load_prompts  # noqa: E402
from spot.engines.ort_engine import OrtEngine  # noqa: E402
from spot.export.export import export_checkpoint
from spot.export.options import ExportOptions  # noqa: E402
from spot.export.presets import resolve_source  # noqa: E402
from spot.runtime.spot import TreeBudget  # noqa: E402


def sweep_one(folder: Path, block: int, prompts, temps, decoder: str, drafter, max_new_tokens: int, say) -> dict:
    engine = OrtEngine(folder, block_size=block, sampler="host")
    cands = [TreeBudget(n, min(d, block)) for n, d in ((2, 1), (4, 3), (8, 4), (16, 8))]
    tune = tune_by_temperature(engine, prompts, BenchConfig((), tuple(temps), (0,), (), max_new_tokens), cands,
                               decoder, drafter, say, node_counts=(1, 2, 4, 8, 16))
    fixed = BenchConfig(("standard", decoder), tuple(temps), (0,), (TreeBudget(4, min(3, block)),
                                                                      TreeBudget(16, min(8, block))),
                        max_new_tokens, independent_noise_ablation=False)
    rows = run_bench(engine, prompts, fixed, drafter, progress=say)["rows"]
    curve = tune["latency_ms"]
    return {"block_size": block, "decoder": decoder, "latency_ms": curve,
            "latency_16_over_1": round(curve[16] / curve[1], 2),
            "tuned": {t: {"choice": v["choice"], **v["at_choice"]} for t, v in tune["by_temperature"].items()},
            "fixed": [{"variant": r["variant"], "temperature": r["temperature"],
                       "passes_reduction": round(r.get("passes_reduction", 1.0), 3),
                       "tokens_per_s_ratio": round(r.get("speedup", 1.0), 3),
                       "identical_share": r["identical_share"],
                       "host_ms_per_verify": round(r.get("draft_ms_per_verify", 0) + r.get("walk_ms_per_verify", 0), 2),
                       "target_ms_per_verify": round(r.get("target_ms_per_verify", 0), 2)}
                      for r in rows if r["decoder"] != "standard"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--exported", type=Path, default=None, help="an exported fp32 folder (default: export embedded)")
    ap.add_argument("--block-sizes", default="4,8,16,32")
    ap.add_argument("--limit", type=int, default=4, help="held-out prompts")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--temperatures", default="0,1")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--drafter-b32", action="store_true", help="also run `spot` (the shipped drafter) at B = 32")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    say = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    source = resolve_source("embedded")
    temps = [float(t) for t in args.temperatures.split(",")]
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="spot-sweep-") as tmp:
        folder = args.exported or export_checkpoint(source, Path(tmp) / "onnx", ExportOptions(dtype="fp32"))
        from spot.tokenizer import load_tokenizer
        prompts = load_prompts(Path(source.checkpoint) / "heldout_prompts.jsonl", load_tokenizer(source.checkpoint),
                               args.limit)
        prompts = [type(p)(p.id, p.ids[-args.prompt_tokens:], p.text) for p in prompts]
        results = []
        for block in (int(b) for b in args.block_sizes.split(",")):
            say(f"== block size {block}")
            results.append(sweep_one(folder, block, prompts, temps, "tree", None, args.max_new_tokens, say))
            if block == 32 and args.drafter_b32:
                from spot.app.models import find_drafter
                results.append(sweep_one(folder, block, prompts, temps, "spot", find_drafter(None, folder),
                                         args.max_new_tokens, say))
    out = {"engine": "ort-cpu fp32", "prompts": len(prompts), "temperatures": temps,
           "max_new_tokens": args.max_new_tokens, "seconds": round(time.time() - t0, 1), "results": results}
    text = json.dumps(out, indent=1)
    if args.out:
        args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    from spot.errors import run_script
    run_script(main)
