#!/usr/bin/env python3
"""Decode throughput of N engines over one set of ONNX Runtime sessions (spot serve --engines N since issue 41)
against N engines with their own sessions (before), in one run: each of N threads decodes the same requests on its
engine at once; the two layouts alternate, --rounds times each, and the least disturbed round of each counts (a
shared machine slows rounds at random, not one layout), with every round's figure listed.

    python benchmarks/engines_throughput.py                  # 4 engines, the embedded model's export
    python benchmarks/engines_throughput.py --engines 2 --model DIR --rounds 7

Each engine gets ONNX Runtime threads as spot serve gives them (the cores / N; the shared sessions the same total:
spot.engines.ort_sessions.shared_threads). The requests cycle over decoders and temperatures; every layout's tokens
are compared with the first round's (exit status 1 on a difference).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DECODERS = ("standard", "spot", "tree", "threshold")


def layouts(folder: Path, engines: int) -> dict:
    """name -> a function opening `engines` engines in that layout."""
    from spot.engines.factory import open_engines
    from spot.engines.ort_engine import OrtEngine
    from spot.serve.model import threads_per_engine
    threads = threads_per_engine(None, engines)
    return {"shared sessions": lambda: open_engines("ort", folder, engines, threads=threads),
            "own sessions": lambda: [OrtEngine(folder, threads=threads) for _ in range(engines)]}


def one_round(engines: list, drafter, prompts: list[list[int]], max_tokens: int) -> tuple[float, int, list]:
    """Every engine decodes every prompt, all engines at once; (seconds, tokens, the answers)."""
    from spot.runtime.decode_plan import DecodeRequest, run_decoder
    from spot.runtime.spot import TreeBudget
    from spot.runtime.step import Sampling
    answers: dict[tuple[int, int], list[int]] = {}
    start = threading.Barrier(len(engines))

    def work(k: int) -> None:
        start.wait()
        for i, prompt in enumerate(prompts):
            req = DecodeRequest(max_tokens, sampling=Sampling((0.0, 0.7)[i % 2], seed=i), budget=TreeBudget(16))
            answers[k, i] = run_decoder(DECODERS[i % len(DECODERS)], engines[k], prompt, req, drafter).token_ids
    threads = [threading.Thread(target=work, args=(k,)) for k in range(len(engines))]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - t0
    ordered = [answers[key] for key in sorted(answers)]
    return seconds, sum(len(a) for a in ordered), ordered


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=None, help="an exported folder (default: the embedded model's)")
    ap.add_argument("--engines", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--prompts", type=int, default=4, help="requests per engine per round")
    ap.add_argument("--max-tokens", type=int, default=32)
    args = ap.parse_args(argv)
    from spot.runtime.drafter import load_drafter
    folder = args.model
    if folder is None:
        from spot.app.demo import exported_embedded
        folder = exported_embedded(lambda line: print(line, file=sys.stderr))
    drafter = load_drafter(folder) if (Path(folder) / "drafter.onnx").is_file() else None
    prompts = [list(range(40 + 11 * i, 80 + 11 * i)) for i in range(args.prompts)]
    opened = {name: make() for name, make in layouts(Path(folder), args.engines).items()}
    rounds: dict[str, list[float]] = {name: [] for name in opened}
    first, differ = None, []
    for _ in range(args.rounds):
        for name, engines in opened.items():
            seconds, tokens, answers = one_round(engines, drafter, prompts, args.max_tokens)
            rounds[name].append(round(tokens / seconds, 1))
            first = answers if first is None else first
            if answers != first:
                differ.append(name)
    report = {"model": str(folder), "engines": args.engines, "rounds": args.rounds,
              "requests_per_round": args.engines * args.prompts, "max_tokens": args.max_tokens,
              "load_average_1m": round(os.getloadavg()[0], 2),
              "tokens_per_s": {name: {"best": max(r), "median": statistics.median(r), "rounds": r}
                               for name, r in rounds.items()},
              "identical_answers": not differ}
    print(json.dumps(report, indent=2))
    return 1 if differ else 0


if __name__ == "__main__":
    from spot.errors import run_script
    run_script(main)
