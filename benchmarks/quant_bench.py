#!/usr/bin/env python3
"""Weight-only int8 / int4 exports of a model (default: the embedded one) on ONNX Runtime CPU, against fp32:

  1. held-out masked-token loss (nats/token) of each export and its delta vs fp32: windows of held-out text
     (the model folder's heldout_prompts.jsonl), a 2-block prefix prefilled, then the next block with 25 / 50 /
     100% of its positions masked (the same masks for every export), cross-entropy of the true tokens there;
  2. per-pass latency of a block step (1 state) and of a verify pass (16 states) after a 256-token prefix,
     interleaved round by round over the exports in one run (median), as ratios vs fp32;
  3. SPOT (tree) == standard decoding: share of (prompt, temperature, seed) runs with identical tokens per export;
  4. with --memory: peak RSS (/usr/bin/time -v) of exporting the SDAR-1.7B-shaped random checkpoint
     (scripts/make_random_checkpoint.py, 4.06 GB bf16) to fp16 and to int4 (minutes; run it once, niced).

    python benchmarks/quant_bench.py                       # embedded model, parts 1-3, JSON on stdout
    python benchmarks/quant_bench.py --model DIR --out results.json
    nice -n 10 python benchmarks/quant_bench.py --memory-only --work /tmp/spot-quant-memory
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from spot.errors import SpotError  # noqa: E402

VARIANTS = {   # name -> ExportOptions overrides (fp32 activations everywhere); int4 blocks that do not divide
    "fp32": {},                                          # the model's dims are skipped (and listed as skipped)
    "int8": {"weights": "int8"},
    "int4-b32": {"weights": "int4", "int4_block": 32},
    "int4-b64": {"weights": "int4", "int4_block": 64},
    "int4-b128": {"weights": "int4", "int4_block": 128},
    "int4-b64-matmulnbits": {"weights": "int4", "int4_block": 64, "matmulnbits": True},
}
MASK_RATIOS = (0.25, 0.5, 1.0)


def export_variants(model: Path, work: Path, names: list[str]) -> tuple[dict[str, Path], dict[str, str]]:
    """(name -> exported folder, name -> why it was skipped)."""
    from spot.config import load_config
    from spot.export.export import export_checkpoint
    from spot.export.options import ExportOptions
    from spot.export.presets import resolve_source
    cfg = load_config(model)
    out, skipped = {}, {}
    for name in names:
        opts = ExportOptions(dtype="fp32", overwrite=True, **VARIANTS[name])
        try:
            opts.quant.check_config(cfg)
        except SpotError as e:
            skipped[name] = e.message
            continue
        folder = work / name
        if not (folder / "manifest.json").is_file():
            export_checkpoint(resolve_source(str(model)), folder, opts)
        out[name] = folder
    return out, skipped


# -- 1. held-out masked-token loss ------------------------------------------------------------------------------
def heldout_windows(model: Path, block: int, n: int, prefix_blocks: int, seed: int) -> list[np.ndarray]:
    """n token windows of (prefix_blocks + 1) blocks from the held-out texts (one or two per text)."""
    from spot.tokenizer import load_tokenizer
    tok = load_tokenizer(model)
    path = model / "heldout_prompts.jsonl"
    if tok is None or not path.is_file():
        raise SpotError(f"{model} lacks a tokenizer or heldout_prompts.jsonl", "pass --model with both")
    length = (prefix_blocks + 1) * block
    rng = np.random.default_rng(seed)
    windows = []
    for line in path.read_text().splitlines():
        ids = np.array(tok.encode(json.loads(line)["text"]), np.int64)
        if len(ids) >= length:
            start = int(rng.integers(0, len(ids) - length + 1))
            windows.append(ids[start:start + length])
        if len(windows) == n:
            break
    if not windows:
        raise SpotError(f"no held-out text in {path} is {length} tokens long")
    return windows


def masked_loss(engine, windows: list[np.ndarray], block: int, mask_id: int, seed: int) -> dict[str, float]:
    """Mean cross-entropy (nats) of the true tokens at the masked positions of the last block, per mask ratio."""
    out = {}
    for ratio in MASK_RATIOS:
        rng = np.random.default_rng(seed)             # the same masks for every export
        total, count = 0.0, 0
        for w in windows:
            engine.prefill(w[:-block])
            target = w[-block:]
            masked = rng.random(block) < ratio
            masked[rng.integers(0, block)] = True
            state = np.where(masked, mask_id, target)
            logits = engine.block_logits(state[None])[0].astype(np.float64)     # [B, V]
            logz = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
            total += float((logz - logits[np.arange(block), target])[masked].sum())
            count += int(masked.sum())
        out[str(ratio)] = total / count
    out["mean"] = float(np.mean([out[str(r)] for r in MASK_RATIOS]))
    return out


# -- 2. latency ---------------------------------------------------------------------------------------------------
def latencies(engines: dict, block: int, vocab: int, context: int, nodes: tuple[int, ...], rounds: int,
              seed: int = 0) -> dict[str, dict[str, float]]:
    """Median seconds per block_logits call, engines interleaved round by round (drift hits all alike)."""
    rng = np.random.default_rng(seed)
    prefix = rng.integers(0, vocab - 1, size=context)
    states = {n: rng.integers(0, vocab - 1, size=(n, block)) for n in nodes}
    for e in engines.values():
        e.prefill(prefix)
        for n in nodes:
            e.block_logits(states[n])                 # warm-up (ORT prepacks on the first run)
    times = {name: {n: [] for n in nodes} for name in engines}
    for _ in range(rounds):
        for name, e in engines.items():
            for n in nodes:
                t0 = time.perf_counter()
                e.block_logits(states[n])
                times[name][n].append(time.perf_counter() - t0)
    return {name: {f"nodes_{n}": float(np.median(v)) for n, v in t.items()} for name, t in times.items()}


# -- 3. SPOT == standard --------------------------------------------------------------------------------------------
def exactness(engine, prompts: list[list[int]], max_new: int) -> dict:
    from spot.runtime.decode_plan import DecodeRequest, run_decoder
    from spot.runtime.spot import TreeBudget
    from spot.runtime.step import Sampling
    same = runs = 0
    passes = {"standard": 0, "tree": 0}
    for i, prompt in enumerate(prompts):
        for temperature in (0.0, 1.0):
            req = DecodeRequest(max_new_tokens=max_new, sampling=Sampling(temperature, seed=i),
                                budget=TreeBudget(16, min(8, engine.block_size)))
            std = run_decoder("standard", engine, prompt, req)
            tree = run_decoder("tree", engine, prompt, req)
            same += tree.token_ids == std.token_ids
            runs += 1
            passes["standard"] += std.stats.target_passes
            passes["tree"] += tree.stats.target_passes
    return {"runs": runs, "identical": same, "share": same / runs, "target_passes": passes}


# -- 4. export peak memory ----------------------------------------------------------------------------------------
def peak_rss_export(ckpt: Path, out: Path, extra: list[str]) -> dict:
    cmd = ["/usr/bin/time", "-v", sys.executable, "-m", "spot.cli", "export", str(ckpt), "--dtype", "fp16",
           "--no-validate", "--quiet", "--overwrite", "--out", str(out), *extra]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - t0
    if r.returncode:
        raise SpotError(f"export failed: {r.stderr[-2000:]}")
    rss = next(int(line.split(":")[1]) for line in r.stderr.splitlines() if "Maximum resident set size" in line)
    size = sum(p.stat().st_size for p in out.iterdir() if p.is_file())
    return {"args": extra, "peak_rss_kib": rss, "peak_rss_gb": round(rss * 1024 / 1e9, 3),
            "seconds": round(seconds, 1), "folder_bytes": size}


def memory_part(work: Path, shape: str, layers: int | None = None) -> dict:
    tag = shape + (f"-L{layers}" if layers else "")
    ckpt = work / f"ckpt-{tag}"
    if not (ckpt / "model.safetensors.index.json").is_file():
        subprocess.run([sys.executable, str(ROOT / "scripts" / "make_random_checkpoint.py"), "--shape", shape,
                        "--out", str(ckpt), *(["--layers", str(layers)] if layers else [])], check=True)
    fp16 = peak_rss_export(ckpt, work / f"onnx-{tag}-fp16", [])
    int4 = peak_rss_export(ckpt, work / f"onnx-{tag}-int4", ["--weights", "int4"])
    return {"shape": tag, "fp16": fp16, "int4": int4,
            "int4_below_fp16": int4["peak_rss_kib"] < fp16["peak_rss_kib"]}


# -- main ---------------------------------------------------------------------------------------------------------
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=None, help="SDAR checkpoint folder (default: the embedded model)")
    ap.add_argument("--work", type=Path, default=None, help="Exports go here (default: a temporary folder)")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="Comma-separated subset of " + ",".join(VARIANTS))
    ap.add_argument("--windows", type=int, default=48, help="Held-out windows for the loss")
    ap.add_argument("--rounds", type=int, default=30, help="Latency rounds (interleaved)")
    ap.add_argument("--context", type=int, default=256, help="Cached tokens before the timed passes")
    ap.add_argument("--prompts", type=int, default=6, help="Prompts for the SPOT == standard check (x T=0, T=1)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1, help="ORT intra-op threads")
    ap.add_argument("--memory", action="store_true", help="Also measure export peak RSS on the 1.7B shape")
    ap.add_argument("--memory-only", action="store_true", help="Only the export peak-RSS part")
    ap.add_argument("--memory-shape", default="sdar-1.7b")
    ap.add_argument("--memory-layers", type=int, default=None, help="Only the first K layers of that shape")
    ap.add_argument("--out", type=Path, default=None, help="Write the JSON here too")
    args = ap.parse_args(argv)
    from spot.assets import embedded_model_dir
    model = Path(args.model or embedded_model_dir())
    result: dict = {"model": str(model)}
    scratch = None
    if args.work is None:
        scratch = tempfile.TemporaryDirectory(prefix="spot-quant-bench-")
        args.work = Path(scratch.name)
    args.work.mkdir(parents=True, exist_ok=True)
    if not args.memory_only:
        from spot.config import load_config
        from spot.engines.ort_engine import OrtEngine
        import onnxruntime as ort
        cfg = load_config(model)
        names = [n for n in args.variants.split(",") if n]
        folders, skipped = export_variants(model, args.work, names)
        engines = {n: OrtEngine(f, threads=args.threads) for n, f in folders.items()}
        block = next(iter(engines.values())).block_size
        result.update({"onnxruntime": ort.__version__, "threads": args.threads, "block_size": block,
                       "skipped": skipped,
                       "weight_bytes": {n: e.exported.manifest.memory["weight_bytes"] for n, e in engines.items()}})
        windows = heldout_windows(model, block, args.windows, 2, seed=0)
        loss = {n: masked_loss(e, windows, block, cfg.mask_token_id, seed=1) for n, e in engines.items()}
        result["heldout_masked_ce"] = {"windows": len(windows), "by_export": loss,
                                       "delta_vs_fp32": {n: {k: v - loss["fp32"][k] for k, v in d.items()}
                                                         for n, d in loss.items()} if "fp32" in loss else None}
        lat = latencies(engines, block, cfg.vocab_size, args.context // block * block, (1, 16), args.rounds)
        result["latency_s"] = lat
        if "fp32" in lat:
            result["latency_ratio_vs_fp32"] = {n: {k: v / lat["fp32"][k] for k, v in d.items()}
                                               for n, d in lat.items()}
        rng = np.random.default_rng(7)
        prompts = [w[:int(rng.integers(5, 3 * block))].tolist() for w in windows[:args.prompts]]
        result["spot_equals_standard"] = {n: exactness(e, prompts, args.max_new_tokens)
                                          for n, e in engines.items() if n != "fp32"}
    if args.memory or args.memory_only:
        result["export_peak_memory"] = memory_part(args.work, args.memory_shape, args.memory_layers)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    if scratch is not None:
        scratch.cleanup()
    return 0


if __name__ == "__main__":
    from spot.errors import run_script
    run_script(main)
