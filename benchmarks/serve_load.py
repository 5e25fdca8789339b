#!/usr/bin/env python3
"""Load test of `spot serve` on this machine (loopback only, bounded): C concurrent clients send R requests with
mixed decoders, temperatures and seeds (every 4th streamed), then every answer is checked against `spot generate`
with the same prompt, decoder, temperature and seed (token ids compared).

    python benchmarks/serve_load.py                              # 8 clients x 200 requests, 2 engines
    python benchmarks/serve_load.py --clients 4 --requests 40 --engines 1 --max-tokens 8

It starts `python -m spot serve --port 0` from this checkout on 127.0.0.1 with the embedded model's export (made
once, as `spot demo` does, in $SPOT_CACHE), or uses --url http://127.0.0.1:PORT (a loopback address only). The
requests cycle over --distinct cases (prompt from the held-out set, decoder, temperature, seed), so the reference
needs one `spot generate` per case (run in this process through the CLI, after the load phase). Reports requests
answered / failed / lost (sent, never answered) / unsent (the --timeout-s deadline came first), mismatches, wall
time, requests/s, returned tokens/s, and latency p50/p99 (streamed requests: until [DONE]) as one JSON object; exit
status 1 unless every request was sent, answered and equal to `spot generate`'s.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import queue
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from serve_process import start_server  # noqa: E402  (benchmarks/, this script's folder)

DECODERS = ("standard", "threshold", "spot", "spot-sets", "tree", "chain")
TEMPERATURES = (0.0, 0.7, 1.0)
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def cases(count: int, prompt_tokens: int) -> list[dict]:
    """`count` distinct requests: held-out prompts (their last prompt_tokens ids) x decoders x temperatures."""
    from spot.assets import embedded_model_dir
    from spot.prompts import load_prompts
    from spot.tokenizer import load_tokenizer
    folder = embedded_model_dir()
    prompts = load_prompts(folder / "heldout_prompts.jsonl", load_tokenizer(folder), count)
    return [{"prompt": prompts[i % len(prompts)].ids[-prompt_tokens:], "decoder": DECODERS[i % len(DECODERS)],
             "temperature": TEMPERATURES[i % len(TEMPERATURES)], "seed": 1000 + i} for i in range(count)]


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, math.ceil(len(ordered) * q / 100) - 1))]


def ask(http, model: str, case: dict, max_tokens: int, stream: bool) -> list[int]:
    """One request; its returned token ids (RuntimeError on any failure)."""
    body = {"model": model, "prompt": case["prompt"], "max_tokens": max_tokens, "decoder": case["decoder"],
            "temperature": case["temperature"], "seed": case["seed"], "stream": stream}
    if not stream:
        r = http.post("/v1/completions", json=body)
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {r.text[:200]}")
        return r.json()["choices"][0]["token_ids"]
    ids, done = [], False
    with http.stream("POST", "/v1/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {r.read()[:200]!r}")
        for line in r.iter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                event = json.loads(line[6:])
                if "error" in event:
                    raise RuntimeError(event["error"]["message"])
                if event["choices"]:
                    ids += event["choices"][0]["token_ids"]
    if not done:
        raise RuntimeError("the stream ended without [DONE]")
    return ids


def load(url: str, work: list[dict], clients: int, max_tokens: int, deadline: float,
         started: set[int]) -> dict[int, dict]:
    """C clients take requests off one queue until it is empty or the deadline passes; results by request index
    (`started`: the indices sent)."""
    import httpx
    todo: queue.Queue = queue.Queue()
    for i in range(len(work)):
        todo.put(i)
    results: dict[int, dict] = {}
    with httpx.Client(base_url=url, timeout=600) as probe:
        model = probe.get("/v1/models").json()["data"][0]["id"]

    def client():
        with httpx.Client(base_url=url, timeout=600) as http:
            while time.monotonic() < deadline:
                try:
                    i = todo.get_nowait()
                except queue.Empty:
                    return
                started.add(i)
                t0 = time.perf_counter()
                try:
                    ids = ask(http, model, work[i], max_tokens, stream=i % 4 == 3)
                    results[i] = {"ids": ids, "seconds": time.perf_counter() - t0}
                except Exception as e:      # noqa: BLE001 - counted and reported
                    results[i] = {"error": f"{type(e).__name__}: {e}", "seconds": time.perf_counter() - t0}
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def reference_ids(case: dict, max_tokens: int) -> list[int]:
    """`spot generate --json` (this checkout's CLI, run in this process) for the case: its first max_tokens ids."""
    from click.testing import CliRunner

    from spot.cli import main as cli
    args = ["generate", "--backend", "ort", "--prompt-ids", ",".join(map(str, case["prompt"])),
            "--decoder", case["decoder"], "--temperature", str(case["temperature"]), "--seed", str(case["seed"]),
            "--max-new-tokens", str(max_tokens), "--json"]
    r = CliRunner().invoke(cli, args)
    if r.exit_code != 0:
        raise SystemExit(f"spot {' '.join(args)} failed:\n{r.output}")
    return json.loads(r.stdout.strip().splitlines()[-1])["token_ids"][:max_tokens]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--engines", type=int, default=2, help="engines of the server this script starts")
    ap.add_argument("--distinct", type=int, default=36, help="distinct cases the requests cycle over")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--prompt-tokens", type=int, default=16, help="prompt length (16 + 16 new: one block of 32)")
    ap.add_argument("--timeout-s", type=float, default=1800, help="the load phase stops sending after this")
    ap.add_argument("--url", default=None, help="a running spot serve on a loopback address")
    ap.add_argument("--out", type=Path, default=None, help="also write the JSON report here")
    args = ap.parse_args(argv)
    if min(args.clients, args.requests, args.distinct, args.max_tokens) < 1:
        ap.error("--clients, --requests, --distinct and --max-tokens must be >= 1")
    if args.url and urlparse(args.url).hostname not in LOOPBACK:
        ap.error(f"--url must be a loopback address ({', '.join(LOOPBACK)}): this load test stays on this machine")
    from spot.app.demo import exported_embedded
    exported_embedded(lambda line: print(line, file=sys.stderr))
    work_cases = cases(args.distinct, args.prompt_tokens)
    work = [work_cases[i % len(work_cases)] for i in range(args.requests)]
    proc = None
    url = args.url
    if url is None:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        proc, url = start_server(["--engines", str(args.engines), "--queue-size", str(max(args.clients, 1))],
                                 ROOT, env)
    try:
        print(f"load: {args.clients} clients x {args.requests} requests on {url}", file=sys.stderr)
        t0 = time.perf_counter()
        started: set[int] = set()
        results = load(url, work, args.clients, args.max_tokens, time.monotonic() + args.timeout_s, started)
        wall = time.perf_counter() - t0
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(120)
    print(f"checking {len(work_cases)} cases against spot generate", file=sys.stderr)
    expected = [reference_ids(c, args.max_tokens) for c in work_cases]
    answered = {i: r for i, r in results.items() if "ids" in r}
    failed = {i: r["error"] for i, r in results.items() if "error" in r}
    taken = set(results) | set(started)
    unsent = [i for i in range(len(work)) if i not in taken]           # the deadline came first
    lost = [i for i in started if i not in results]                     # sent, and neither answered nor failed
    mismatched = [i for i, r in answered.items() if r["ids"] != expected[i % len(work_cases)]]
    latencies = [r["seconds"] for r in answered.values()]
    tokens = sum(len(r["ids"]) for r in answered.values())
    report = {"clients": args.clients, "requests": args.requests, "engines": args.engines if args.url is None else None,
              "distinct_cases": len(work_cases), "max_tokens": args.max_tokens, "prompt_tokens": args.prompt_tokens,
              "answered": len(answered), "failed": len(failed), "lost": len(lost), "unsent": len(unsent),
              "mismatched": len(mismatched),
              "identical_to_spot_generate": len(answered) - len(mismatched),
              "wall_s": round(wall, 2), "requests_per_s": round(len(answered) / wall, 3),
              "tokens_per_s": round(tokens / wall, 1),
              "latency_p50_s": round(percentile(latencies, 50), 3) if latencies else None,
              "latency_p99_s": round(percentile(latencies, 99), 3) if latencies else None,
              "load_average_1m": round(os.getloadavg()[0], 2),     # other work on the machine skews the figures
              "decoders": {d: sum(1 for i in answered if work[i]["decoder"] == d) for d in DECODERS},
              "first_failures": dict(list(failed.items())[:3]), "first_mismatches": mismatched[:5]}
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0 if not (failed or lost or unsent or mismatched) else 1


if __name__ == "__main__":
    from spot.errors import run_script
    run_script(main)
