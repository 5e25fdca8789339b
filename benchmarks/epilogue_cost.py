#!/usr/bin/env python3
"""Cost of the sampling epilogue per block state: the certified graph (the default) vs the exact noise over the
whole vocabulary (what every row fell back to before) vs the backend's native math, side by side in one run.

    python benchmarks/epilogue_cost.py                                   # the embedded model's shape, ORT CPU
    python benchmarks/epilogue_cost.py --vocab 151936 --nodes 2 --future 8 --provider CUDAExecutionProvider

All three graphs run on the same logits (T = 1); the certified outputs must equal the exact ones bit for bit
(the script fails otherwise). Prints one JSON object: median ms per call and per state for each graph, and the
ratio exact / certified.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from spot.errors import SpotError, run_script  # noqa: E402
from spot.export.epilogue_graph import EpilogueSpec, build_epilogue
from spot.folder.epilogue import FALLBACK_OUTPUT, OUTPUTS, epilogue_feeds, make_epilogue_session
from spot.runtime.step import Sampling  # noqa: E402

VARIANTS = {  # name -> EpilogueSpec overrides
    "certified": {},
    "exact_everywhere": {"noise_margin": float("inf")},   # every certificate fails: the exact noise over V
    "native": {"exact": False},                           # the backend's Exp/Log/ReduceSum: not bit-exact
}


def measure(vocab: int, block: int, future: int, nodes: int, repeats: int, providers: list[str],
            log=print) -> dict:
    """Median milliseconds per epilogue call of each variant on the same random logits (T = 1)."""
    logits = (np.random.default_rng(0).standard_normal((nodes, block, vocab)) * 3).astype(np.float32)
    feeds = epilogue_feeds(logits, np.arange(nodes), Sampling(temperature=1.0, seed=5), block=1)
    result = {"vocab": vocab, "block": block, "future_steps": future, "nodes": nodes, "providers": providers,
              "repeats": repeats, "ms": {}, "ms_per_state": {}}
    outputs = {}
    for name, overrides in VARIANTS.items():
        session = make_epilogue_session(build_epilogue(EpilogueSpec(vocab, block, future, **overrides)),
                                        providers=providers)
        outs = session.run(list(OUTPUTS) + [FALLBACK_OUTPUT], feeds)     # warm-up, and the outputs compared
        outputs[name] = outs
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            session.run(list(OUTPUTS), feeds)
            times.append((time.perf_counter() - t0) * 1e3)
        ms = statistics.median(times)
        result["ms"][name], result["ms_per_state"][name] = round(ms, 2), round(ms / nodes, 2)
        log(f"{name}: {ms:.1f} ms per call ({ms / nodes:.1f} ms per state), fallback {bool(outs[-1])}")
    result["certified_fell_back"] = bool(outputs["certified"][-1])
    same = all(np.array_equal(a, b) for a, b in zip(outputs["certified"][:-1], outputs["exact_everywhere"][:-1]))
    if not same:
        raise SpotError("the certified epilogue differs from the exact-everywhere one: it must be bit-identical")
    result["certified_equals_exact"] = same
    result["exact_over_certified"] = round(result["ms"]["exact_everywhere"] / result["ms"]["certified"], 2)
    result["certified_over_native"] = round(result["ms"]["certified"] / result["ms"]["native"], 2)
    return result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab", type=int, default=2048)
    ap.add_argument("--block", type=int, default=32)
    ap.add_argument("--future", type=int, default=8, help="D: future steps sampled per state")
    ap.add_argument("--nodes", type=int, default=4, help="block states per call")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--provider", default="CPUExecutionProvider")
    ap.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = ap.parse_args(argv)
    result = measure(args.vocab, args.block, args.future, args.nodes, args.repeats, [args.provider])
    text = json.dumps(result)
    print(text)
    if args.out is not None:
        tmp = args.out.with_name(args.out.name + ".tmp")
        tmp.write_text(text + "\n")
        tmp.replace(args.out)
    return 0


if __name__ == "__main__":
    run_script(main)
