"""Target passes of tree decoders replayed from recorded standard decoding (spot.training.replay): exact, and without
target passes, so tree and proposer settings can be compared side by side on the bench's own prompts.

    python benchmarks/tree_replay.py --model arithmetic --limit 10 --temperatures 0,0.7 --budgets 16x8,64x16 \
        --max-new-tokens 160 --prompt-tokens 512

Records the standard decodes first (each run: no cache file, which would have to be a pickle). Prints passes and the reduction vs
standard decoding per decoder, budget and temperature, as `spot bench` reports them.
"""
from __future__ import annotations

import argparse

from spot.app.tuned_budgets import parse_tree_budgets
from spot.runtime.decode_plan import DecodeRequest
from spot.runtime.registry import TREE_BRANCH
from spot.runtime.proposers import ConfidenceOrderProposer, OrderOracleProposer
from spot.runtime.step import Sampling
from spot.training.replay import record_standard, replay_passes


def record(args) -> dict:
    from spot.app.bench_run import bench_prompts
    from spot.app.models import open_model
    engine, tokenizer, folder = open_model(args.backend, args.model, None, "cpu", sampler="host")
    prompts, _ = bench_prompts(None, folder, tokenizer, args.limit, args.prompt_tokens, engine, args.max_new_tokens)
    decodes = {}
    for t in args.temperatures:
        req = DecodeRequest(args.max_new_tokens, sampling=Sampling(t, seed=0))
        decodes[t] = [record_standard(engine, p.ids, req) for p in prompts]
    return {"folder": str(folder), "decodes": decodes}


def proposer_for(name: str, drafter, rec, branch: int | None, nodes: int):
    if name == "tree":
        return ConfidenceOrderProposer(branch=TREE_BRANCH)
    if name == "order-oracle":
        return OrderOracleProposer(rec.trajectories())
    return drafter.proposer(branch=branch, nodes=nodes)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="arithmetic")
    ap.add_argument("--backend", default="ort")
    ap.add_argument("--drafter", default=None, help="default: the model folder's")
    ap.add_argument("--limit", type=int, default=10)
    ap.add_argument("--temperatures", default="0,0.7")
    ap.add_argument("--budgets", default="16x8,64x16")
    ap.add_argument("--decoders", default="tree,spot,order-oracle")
    ap.add_argument("--branch", type=int, default=None, help="spot's branch (default: the proposer's)")
    ap.add_argument("--max-new-tokens", type=int, default=160)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    args = ap.parse_args()
    args.temperatures = [float(x) for x in args.temperatures.split(",")]
    data = record(args)     # recorded afresh each run: a pickled cache would run code planted in its file
    from spot.app.models import find_drafter
    drafter = find_drafter(args.drafter, data["folder"])
    print("| decoder | budget | T | passes | standard | reduction |\n|---|---|---|---|---|---|")
    for t in args.temperatures:
        decodes = data["decodes"][t]
        standard = sum(r.standard_passes for r in decodes)
        for budget in parse_tree_budgets(args.budgets):
            for name in args.decoders.split(","):
                passes = sum(replay_passes(r, proposer_for(name, drafter, r, args.branch, budget.nodes), budget)
                             for r in decodes)
                print(f"| {name} | {budget.nodes}x{budget.depth} | {t:g} | {passes} | {standard} | "
                      f"{standard / passes:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
