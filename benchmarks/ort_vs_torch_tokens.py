#!/usr/bin/env python3
"""Token identity of standard decoding on the torch CPU reference and the ORT CPU engine, over a prompt set.

    python benchmarks/ort_vs_torch_tokens.py                          # embedded model, all held-out prompts
    python benchmarks/ort_vs_torch_tokens.py --limit 20 --max-new-tokens 32 --temperatures 0,1

For every prompt and temperature (seed fixed per prompt) both engines decode the same request; a prompt counts as
identical when the token streams are equal. fp32 exports must give 100%: anything less is a bug to explain, so
the first differing case is printed with the position and both tokens. Prints progress, then one JSON summary.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from spot.prompts import load_prompts  # noqa: E402
from spot.engines.ort_engine import OrtEngine  # noqa: E402
from spot.engines.torch_engine import TorchEngine  # noqa: E402
from spot.export.export import export_checkpoint
from spot.export.options import ExportOptions  # noqa: E402
from spot.export.presets import resolve_source  # noqa: E402
from spot.runtime.decode import generate  # noqa: E402
from spot.runtime.step import Sampling  # noqa: E402


def first_difference(a: list[int], b: list[int]) -> dict:
    i = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return {"position": i, "torch": a[i] if i < len(a) else None, "ort": b[i] if i < len(b) else None}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", default="embedded", help="checkpoint folder or preset (default: embedded)")
    ap.add_argument("--exported", type=Path, default=None, help="an exported fp32 folder of the same checkpoint")
    ap.add_argument("--prompts", default=None, help="JSONL prompt set (default: the model's held-out prompts)")
    ap.add_argument("--limit", type=int, default=None, help="first N prompts only")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--temperatures", default="0,1")
    ap.add_argument("--threads", type=int, default=2, help="threads for both engines")
    args = ap.parse_args(argv)
    import torch
    torch.set_num_threads(args.threads)
    source = resolve_source(args.checkpoint)
    temps = [float(t) for t in args.temperatures.split(",")]
    t_start = time.time()
    with tempfile.TemporaryDirectory(prefix="spot-tokens-") as tmp:
        exported = args.exported or export_checkpoint(source, Path(tmp) / "onnx", ExportOptions(dtype="fp32"))
        ort_engine = OrtEngine(exported, threads=args.threads, sampler="host")
        torch_engine = TorchEngine.from_dir(source.checkpoint, ort_engine.block_size)
        from spot.tokenizer import load_tokenizer
        prompt_file = args.prompts or Path(source.checkpoint) / "heldout_prompts.jsonl"
        prompts = [p.ids for p in load_prompts(prompt_file, load_tokenizer(source.checkpoint), args.limit)]
        identical = {t: 0 for t in temps}
        differences = []
        tokens = 0
        for i, ids in enumerate(prompts):
            for t in temps:
                sampling = Sampling(temperature=t, seed=1000 + i)
                a = generate(torch_engine, ids, max_new_tokens=args.max_new_tokens, sampling=sampling).token_ids
                b = generate(ort_engine, ids, max_new_tokens=args.max_new_tokens, sampling=sampling).token_ids
                tokens += len(a)
                if a == b:
                    identical[t] += 1
                else:
                    differences.append({"prompt": i, "temperature": t, **first_difference(a, b)})
                    print(f"DIFFERENT prompt {i} T={t}: {differences[-1]}", file=sys.stderr, flush=True)
            if (i + 1) % 10 == 0 or i + 1 == len(prompts):
                print(f"[{i + 1}/{len(prompts)}] identical " + ", ".join(f"T={t}: {identical[t]}/{i + 1}"
                                                                         for t in temps)
                      + f" ({time.time() - t_start:.0f} s)", file=sys.stderr, flush=True)
    summary = {"model": str(source.checkpoint), "prompts": len(prompts), "max_new_tokens": args.max_new_tokens,
               "generated_tokens_torch": tokens,
               "identical_share": {str(t): identical[t] / max(len(prompts), 1) for t in temps},
               "differences": differences[:20], "seconds": round(time.time() - t_start, 1)}
    print(json.dumps(summary))
    return 0 if not differences else 1


if __name__ == "__main__":
    from spot.errors import run_script
    run_script(main)
