#!/usr/bin/env python3
"""Where a SPOT round's host time goes, per verify pass: drafter ORT calls, top-32 features, coupled sampling,
the rest of drafting (features, candidates, tree), the walk — beside the target pass, in one run.

    python benchmarks/host_split.py --model ~/.cache/spot/code-fp32-onnx --drafter spot/assets/embedded
    python benchmarks/host_split.py --model DIR --lookahead 0,4 --temperatures 0,1 --prompts 4
    python benchmarks/host_split.py --model DIR --runner-up-weights 0,0.17     # runner-up children's cost

Timers wrap the runtime's own functions (no profiler overhead); decoding itself is unchanged. Prints one JSON line
per (lookahead, runner-up weight, temperature): milliseconds per verify pass for each part, drafter calls and nodes
per pass, verify passes, and host / target.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from spot.prompts import heldout_prompts_path, load_prompts  # noqa: E402
from spot.engines.factory import open_engine  # noqa: E402
from spot.runtime import drafter as drafter_module  # noqa: E402
from spot.runtime import stale as stale_module  # noqa: E402
from spot.runtime.decode_plan import DecodeRequest, run_decoder  # noqa: E402
from spot.runtime.spot import TreeBudget  # noqa: E402
from spot.runtime.step import Sampling  # noqa: E402
from spot.tokenizer import load_tokenizer  # noqa: E402

SECONDS = Counter()   # part -> seconds, over the current measurement
COUNTS = Counter()    # drafter calls and nodes


def timed(module, name: str, part: str) -> None:
    """Replace module.name by a wrapper adding its wall time to SECONDS[part]."""
    inner = getattr(module, name)

    def wrapper(*args, **kwargs):
        t = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            SECONDS[part] += time.perf_counter() - t
    setattr(module, name, wrapper)


def instrument() -> None:
    timed(stale_module, "topk_logprobs", "topk_features")
    timed(stale_module, "scale_rows", "coupled_sampling")
    timed(stale_module, "step_gumbel", "coupled_sampling")
    timed(stale_module, "sample_scaled", "coupled_sampling")
    timed(stale_module, "top2_scaled", "coupled_sampling")
    run = drafter_module.Drafter.run

    def counted_run(self, inputs):
        COUNTS["drafter_calls"] += 1
        COUNTS["drafter_nodes"] += len(inputs["staleness"])
        t = time.perf_counter()
        try:
            return run(self, inputs)
        finally:
            SECONDS["drafter_ort"] += time.perf_counter() - t
    drafter_module.Drafter.run = counted_run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, type=Path, help="exported folder (spot-export / spot demo's cache)")
    ap.add_argument("--drafter", type=Path, default=None, help="default: the one in --model")
    ap.add_argument("--decoder", default="spot")
    ap.add_argument("--temperatures", default="0,1")
    ap.add_argument("--lookahead", default="4", help="drafter lookahead values to compare, e.g. 0,4")
    ap.add_argument("--runner-up-weights", default=None,
                    help="runner-up weights to compare, e.g. 0,0.17 (default: the drafter's own)")
    ap.add_argument("--budget", type=int, default=16)
    ap.add_argument("--depth", type=int, default=8)
    ap.add_argument("--prompts", type=int, default=4, help="first N held-out prompts of --model (its heldout_prompts.jsonl)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    args = ap.parse_args()

    instrument()
    engine = open_engine("ort", args.model)
    drafter = drafter_module.load_drafter(args.drafter or args.model)
    prompts = load_prompts(heldout_prompts_path(args.model), load_tokenizer(args.model),
                           limit=args.prompts, max_tokens=200)
    weights = [float(w) for w in args.runner_up_weights.split(",")] if args.runner_up_weights else \
        [drafter.runner_up_weight]
    for lookahead in (int(v) for v in args.lookahead.split(",")):
        for weight in weights:
            variant = drafter.with_settings(runner_up_weight=weight)
            variant.proposer = lambda branch=drafter_module.DEFAULT_BRANCH, la=lookahead, v=variant: \
                drafter_module.DrafterProposer(v, branch, la)
            for temperature in (float(t) for t in args.temperatures.split(",")):
                row = measure(engine, variant, prompts, args, temperature)
                print(json.dumps({"lookahead": lookahead, "runner_up_weight": weight, "temperature": temperature,
                                  **row}), flush=True)


def measure(engine, drafter, prompts, args, temperature: float) -> dict:
    """Decode the prompts; per verify pass: ms by part, host and target ms, drafter calls and nodes."""
    SECONDS.clear()
    COUNTS.clear()
    stats, rounds = Counter(), 0
    for p in prompts:
        req = DecodeRequest(max_new_tokens=args.max_new_tokens, sampling=Sampling(temperature, seed=0),
                            budget=TreeBudget(args.budget, args.depth))
        verify = run_decoder(args.decoder, engine, p.ids, req, drafter=drafter).stats.verify
        for k in ("draft_ms", "walk_ms", "target_ms"):
            stats[k] += getattr(verify, k)
        rounds += len(verify.accepted)
    parts = {k: 1e3 * v / rounds for k, v in SECONDS.items()}
    parts["features_candidates_tree"] = stats["draft_ms"] / rounds - sum(parts.values())
    parts["walk"] = stats["walk_ms"] / rounds
    host = (stats["draft_ms"] + stats["walk_ms"]) / rounds
    return {"verify_passes": rounds, "ms_per_verify": {k: round(v, 2) for k, v in parts.items()},
            "host_ms": round(host, 2), "target_ms": round(stats["target_ms"] / rounds, 2),
            "host_over_target": round(host * rounds / stats["target_ms"], 3),
            "drafter_calls_per_verify": round(COUNTS["drafter_calls"] / rounds, 2),
            "drafter_nodes_per_verify": round(COUNTS["drafter_nodes"] / rounds, 2)}

if __name__ == "__main__":
    main()
