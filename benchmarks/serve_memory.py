#!/usr/bin/env python3
"""Resident memory of `spot serve --engines N` on ONNX Runtime CPU beside the memory plan's figure for N engines
(`spot-export --plan host --engines N`), side by side in one run: the weights must be held once, whatever N.

    python benchmarks/serve_memory.py                        # engines 1 and 4, a 0.23B random checkpoint
    python benchmarks/serve_memory.py --engines 1,2,4 --baseline /tmp/spot-before   # and another checkout's servers
    python benchmarks/serve_memory.py --layers 1 --vocab-size 151936 --max-context 512 --prompt-tokens 296
                                                             # the SDAR-1.7B-shaped one-layer checkpoint of issue 41

It writes (once per shape, under --work, default $SPOT_CACHE/bench/serve-memory) a random SDAR-1.7B-shaped
checkpoint (scripts/make_random_checkpoint.py; by default 4 layers and a vocabulary of 8192: 0.23B parameters, most
of them in MatMul weights) and its export (--dtype, default fp16; --max-nodes 16). Then for each N it starts `python
-m spot serve --engines N` from this checkout (and from --baseline's, when given) on 127.0.0.1, reads the server's
memory (/proc/PID/status: VmRSS, and its RssAnon / RssFile parts) once it listens, sends N requests at once that
fill the context at the export's max_nodes (the tree decoder, budget 16: every engine's cache and widest pass exist
together), reads it again, and stops the server. Reports per server: RSS after start and after the warm-up, the peak
sampled during it, the warm-up's tokens/s, and the plan's process figure (`spot-export --plan host --engines N`:
weights once + N x (KV cache + verify pass) + runtime); then RSS(N) - RSS(1) and RssAnon(N) - RssAnon(1) against the
plan's N - 1 engines' terms. RssFile is the weights file's pages ONNX Runtime maps (the embedding's rows, read as
token ids first appear: once per process, however many engines read them). Exit status 1 when, for this checkout,
RssAnon(N) - RssAnon(1) exceeds those terms by more than 10%, or a plan's figure is more than 10% off the measured
RSS.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from serve_process import start_server  # noqa: E402  (benchmarks/, this script's folder)

MIB = 2 ** 20
TOLERANCE = 0.10


def rss_mib(pid: int, field: str = "VmRSS") -> float:
    """A process's resident memory (MiB) from /proc/PID/status: VmRSS, or its part RssAnon / RssFile."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(rf"{field}:\s+(\d+) kB", status).group(1)) / 1024


def memory(pid: int) -> dict:
    return {field: round(rss_mib(pid, field), 1) for field in ("VmRSS", "RssAnon", "RssFile")}


def prepared_export(work: Path, layers: int, vocab: int, max_context: int, dtype: str = "fp16") -> Path:
    """The random checkpoint and its export under `work` (made once per shape)."""
    ckpt = work / f"ckpt-l{layers}-v{vocab}"
    export = work / f"onnx-{dtype}-l{layers}-v{vocab}-c{max_context}"
    if not (ckpt / "config.json").is_file():
        subprocess.run([sys.executable, str(ROOT / "scripts" / "make_random_checkpoint.py"), "--shape", "sdar-1.7b",
                        "--layers", str(layers), "--vocab-size", str(vocab), "--out", str(ckpt)], check=True)
    if not (export / "manifest.json").is_file():
        subprocess.run([sys.executable, "-c", "import sys; from spot.entry import spot_export; "
                        "sys.argv[0] = 'spot-export'; spot_export()", str(ckpt), "--out", str(export),
                        "--dtype", dtype, "--max-nodes", "16", "--max-context", str(max_context), "--no-validate",
                        "--tensorrt", "no", "--quiet"], check=True, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    return export


def warm_up(url: str, model: str, engines: int, prompt: list[int], max_tokens: int, budget: int) -> int:
    """`engines` requests at once, each filling the context with the tree decoder at `budget` nodes; tokens
    returned."""
    import httpx
    returned, errors = [], []

    def ask(i: int) -> None:
        body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "decoder": "tree", "budget": str(budget),
                "temperature": 0.7, "seed": i}
        try:
            with httpx.Client(base_url=url, timeout=3600) as http:
                r = http.post("/v1/completions", json=body)
            r.raise_for_status()
            returned.append(len(r.json()["choices"][0]["token_ids"]))
        except Exception as e:       # noqa: BLE001 - reported
            errors.append(f"{type(e).__name__}: {e}")
    threads = [threading.Thread(target=ask, args=(i,)) for i in range(engines)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise SystemExit(f"warm-up requests failed: {errors[:2]}")
    return sum(returned)


def measure(checkout: Path, export: Path, engines: int, prompt: list[int], max_tokens: int, budget: int) -> dict:
    proc, url = start_server(["--model", str(export), "--engines", str(engines)], checkout,
                             {**os.environ, "PYTHONPATH": str(checkout)})
    try:
        after_start = memory(proc.pid)
        peak, done = [after_start["VmRSS"]], threading.Event()

        def sample() -> None:       # the peak while serving (VmHWM would be the weights' loading)
            while not done.wait(0.02):
                peak[0] = max(peak[0], rss_mib(proc.pid))
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        t0 = time.perf_counter()
        tokens = warm_up(url, export.name, engines, prompt, max_tokens, budget)
        seconds = time.perf_counter() - t0
        done.set()
        sampler.join()
        warm = memory(proc.pid)
        return {"engines": engines, "rss_after_start_mib": after_start["VmRSS"],
                "rss_after_warm_up_mib": warm["VmRSS"], "anon_after_warm_up_mib": warm["RssAnon"],
                "file_after_warm_up_mib": warm["RssFile"], "rss_peak_mib": round(peak[0], 1),
                "warm_up_s": round(seconds, 1), "tokens_per_s": round(tokens / seconds, 2)}
    finally:
        proc.terminate()
        proc.wait(120)


def main(argv=None) -> int:
    from spot.files import spot_cache
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engines", default="1,4", help="comma-separated engine counts; the first is the reference")
    ap.add_argument("--baseline", type=Path, default=None,
                    help="another spot checkout whose `spot serve` runs the same servers (e.g. the code before a "
                         "change: `git archive REV | tar -x -C DIR`)")
    ap.add_argument("--work", type=Path, default=None, help="where the checkpoints and exports are kept")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab-size", type=int, default=8192)
    ap.add_argument("--max-context", type=int, default=2048)
    ap.add_argument("--dtype", choices=["fp16", "fp32"], default="fp16")
    ap.add_argument("--prompt-tokens", type=int, default=1896)
    ap.add_argument("--out", type=Path, default=None, help="also write the JSON report here")
    args = ap.parse_args(argv)
    counts = [int(n) for n in args.engines.split(",")]
    if not counts or min(counts) < 1:
        ap.error("--engines takes counts >= 1, e.g. 1,4")
    from spot.export.memory_plan import host_device, plan_for_export
    from spot.folder.manifest import load_manifest
    export = prepared_export(args.work or spot_cache() / "bench" / "serve-memory", args.layers, args.vocab_size,
                             args.max_context, args.dtype)
    exported = load_manifest(export)
    b = exported.block_size
    prompt = [100 + i % (exported.config.vocab_size - 200) for i in range(args.prompt_tokens)]
    # the context filled to the last whole block: prompt + new tokens at most max_context
    max_tokens = (exported.max_context - args.prompt_tokens) // b * b - b
    checkouts = {"this checkout": ROOT} | ({"baseline": args.baseline.resolve()} if args.baseline else {})
    rows = []
    for n in counts:
        plan = plan_for_export(exported, host_device(), n)
        for name, checkout in checkouts.items():
            print(f"{name}: spot serve --engines {n}", file=sys.stderr)
            row = measure(checkout, export, n, prompt, max_tokens, exported.max_nodes)
            row |= {"checkout": name, "plan_process_mib": round(plan.process_bytes / MIB, 1),
                    "plan_engine_mib": round(plan.engine_bytes / MIB, 1)}
            row["plan_error"] = round(row["plan_process_mib"] / row["rss_after_warm_up_mib"] - 1, 3)
            rows.append(row)
    first = {r["checkout"]: r for r in rows if r["engines"] == counts[0]}
    failures = []
    for r in rows:
        ref = first[r["checkout"]]
        r["rss_over_first_mib"] = round(r["rss_after_warm_up_mib"] - ref["rss_after_warm_up_mib"], 1)
        r["anon_over_first_mib"] = round(r["anon_after_warm_up_mib"] - ref["anon_after_warm_up_mib"], 1)
        r["plan_over_first_mib"] = round((r["engines"] - counts[0]) * r["plan_engine_mib"], 1)
        if r["checkout"] == "this checkout":
            if r["anon_over_first_mib"] > (1 + TOLERANCE) * r["plan_over_first_mib"] + 1:
                failures.append(f"{r['engines']} engines hold {r['anon_over_first_mib']} MiB more anonymous memory "
                                f"than {counts[0]}, the plan's terms {r['plan_over_first_mib']} MiB")
            if abs(r["plan_error"]) > TOLERANCE:
                failures.append(f"{r['engines']} engines: the plan's {r['plan_process_mib']} MiB is "
                                f"{r['plan_error']:+.1%} off the measured {r['rss_after_warm_up_mib']} MiB")
    report = {"export": str(export), "weight_bytes": plan.weight_bytes, "max_context": exported.max_context,
              "max_nodes": exported.max_nodes, "prompt_tokens": args.prompt_tokens, "max_tokens": max_tokens,
              "load_average_1m": round(os.getloadavg()[0], 2), "rows": rows, "failures": failures}
    header = (f"{'checkout':14} {'N':>2} {'RSS start':>10} {'RSS warm':>9} {'anon':>7} {'file':>6} {'peak':>7} "
              f"{'plan':>7} {'plan err':>8} {'RSS-RSS(1)':>10} {'anon-anon(1)':>12} {'plan terms':>10} {'tok/s':>6}")
    print(header, file=sys.stderr)
    for r in rows:
        print(f"{r['checkout']:14} {r['engines']:>2} {r['rss_after_start_mib']:>10} {r['rss_after_warm_up_mib']:>9} "
              f"{r['anon_after_warm_up_mib']:>7} {r['file_after_warm_up_mib']:>6} {r['rss_peak_mib']:>7} "
              f"{r['plan_process_mib']:>7} {r['plan_error']:>+8.1%} {r['rss_over_first_mib']:>10} "
              f"{r['anon_over_first_mib']:>12} {r['plan_over_first_mib']:>10} {r['tokens_per_s']:>6}",
              file=sys.stderr)
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 1 if failures else 0


if __name__ == "__main__":
    from spot.errors import run_script
    run_script(main)
