#!/usr/bin/env python3
"""How often the stale logits' coupled sample is the token the target commits k steps later, and how often the
stale runner-up is (why SPOT proposes runner-up children; docs/drafter.md).

    python benchmarks/stale_token_rank.py --model ~/.cache/spot/code-fp32-onnx --prompts 6

Decodes held-out prompts with standard decoding, keeps every step's state and logits, and for each step m and
k = 1..--staleness ranks the token committed at step m + k among the stale scores L(s_m)/T + gumbel(step m + k)
at the committed position (L(s_m) alone at T = 0; the mask id excluded). Prints one JSON line per (temperature,
k): the share of rank 0 (the stale winner), rank 1 (the runner-up), ranks 2-3 and 4+; then, over k <= 4, the
runner-up's share of {winner, runner-up} by the stale score gap between them.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from spot.prompts import heldout_prompts_path, load_prompts  # noqa: E402
from spot.engines.factory import open_engine  # noqa: E402
from spot.runtime.decode import generate  # noqa: E402
from spot.runtime.noise import gumbel_rows  # noqa: E402
from spot.runtime.step import Sampling  # noqa: E402
from spot.tokenizer import load_tokenizer  # noqa: E402

GAP_BINS = (0.0, 0.25, 0.5, 1.0, 2.0, 4.0, np.inf)


def committed_ranks(engine, ids: list[int], temperature: float, staleness: int, max_new_tokens: int):
    """(k, rank of the committed token among the stale scores, stale gap winner - runner-up) per (step, k)."""
    steps = defaultdict(list)     # block -> [(state, logits, next state)] in step order

    def observe(block, step, state, outputs, nxt):
        steps[block].append((state.copy(), outputs.host_logits().astype(np.float64), nxt.copy()))
    mask = engine.config.mask_token_id
    generate(engine, ids, max_new_tokens=max_new_tokens, sampling=Sampling(temperature, seed=0), observer=observe)
    for block, rows in steps.items():
        for m in range(len(rows)):
            stale = rows[m][1]
            for k in range(1, staleness + 1):
                if m + k >= len(rows):
                    break
                state, _, nxt = rows[m + k]
                p = int(np.flatnonzero(nxt != state)[0])
                z = stale[p] / temperature if temperature > 0 else stale[p].copy()
                if temperature > 0:
                    z = z + gumbel_rows(0, block, m + k, np.array([p]), z.size)[0]
                z[mask] = -np.inf
                top = np.sort(z)[-2:]
                yield k, int((z > z[nxt[p]]).sum()), float(top[1] - top[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, type=Path, help="exported folder (spot-export / spot demo's cache)")
    ap.add_argument("--prompts", type=int, default=6, help="first N held-out prompts of --model (its heldout_prompts.jsonl)")
    ap.add_argument("--temperatures", default="0,1")
    ap.add_argument("--staleness", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    args = ap.parse_args()
    engine = open_engine("ort", args.model)
    prompts = load_prompts(heldout_prompts_path(args.model), load_tokenizer(args.model),
                           limit=args.prompts, max_tokens=200)
    for temperature in (float(t) for t in args.temperatures.split(",")):
        ranks, by_gap = defaultdict(Counter), defaultdict(Counter)
        for prompt in prompts:
            for k, rank, gap in committed_ranks(engine, prompt.ids, temperature, args.staleness,
                                                args.max_new_tokens):
                ranks[k]["0" if rank == 0 else "1" if rank == 1 else "2-3" if rank < 4 else "4+"] += 1
                if k <= 4 and rank <= 1:
                    lo = max(b for b in GAP_BINS if b <= gap)
                    by_gap[lo][rank] += 1
        for k in sorted(ranks):
            n = sum(ranks[k].values())
            print(json.dumps({"temperature": temperature, "staleness": k, "n": n,
                              "share_by_rank": {r: round(ranks[k][r] / n, 3) for r in ("0", "1", "2-3", "4+")}}))
        print(json.dumps({"temperature": temperature, "runner_up_share_of_top2_by_gap": {
            f"{lo:g}+": round(c[1] / (c[0] + c[1]), 3) for lo, c in sorted(by_gap.items())}}), flush=True)


if __name__ == "__main__":
    main()
