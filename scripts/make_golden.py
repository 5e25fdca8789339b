"""Golden outputs of the Python runtime for the C++ host's conformance test (docs/cpp-host.md).

For an exported folder (and its drafter, when there is one) it decodes a set of prompts with every decoder the C++
host implements, at temperatures 0 and 1, and writes prompts, options, token ids and pass counts by kind to JSON:

    python scripts/make_golden.py --model /tmp/emb_onnx --drafter spot/assets/embedded \
        --out tests/data/golden/embedded.json

tests/test_cpp_host.py replays every case through the C++ example program and requires identical token ids and
pass counts. The golden file names the model by the sha256 of its weights file, so a retrained model is noticed.
The noise test vectors (tests/data/noise_vectors.json) are the other half of the conformance set.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from spot import __version__  # noqa: E402
from spot.runtime.decoders import DecodeRequest, run_decoder  # noqa: E402
from spot.runtime.spot import TreeBudget  # noqa: E402
from spot.runtime.step import STATIC, Sampling  # noqa: E402

FORMAT = "spot-golden"
FORMAT_VERSION = 1
DECODERS = ("standard", "threshold", "chain", "tree", "spot", "spot-sets")   # the C++ host's decoders
DRAFTER_DECODERS = ("spot", "spot-sets")
TEMPERATURES = (0.0, 1.0)


def case_options(decoder: str, temperature: float, seed: int, max_new_tokens: int, budget: int, depth: int,
                 tau: float = 0.9, mode: str = STATIC, top_k: int = 0, top_p: float = 1.0) -> dict:
    """One case's options, in the names of the C++ example program's flags."""
    return {"decoder": decoder, "temperature": temperature, "seed": seed, "tau": tau, "mode": mode,
            "max_new_tokens": max_new_tokens, "budget": budget, "depth": depth, "top_k": top_k, "top_p": top_p}


def run_case(engine, drafter, prompt_ids: list[int], opts: dict) -> dict:
    """Decode one case with the Python runtime; the fields the C++ host must reproduce, plus host timings."""
    req = DecodeRequest(max_new_tokens=opts["max_new_tokens"], mode=opts["mode"], tau=opts["tau"],
                        sampling=Sampling(opts["temperature"], opts.get("top_k", 0), opts.get("top_p", 1.0),
                                          opts["seed"]),
                        budget=TreeBudget(opts["budget"], opts["depth"]))
    gen = run_decoder(opts["decoder"], engine, prompt_ids, req, drafter)
    s = gen.stats
    passes = {k: int(s.passes.get(k, 0)) for k in ("prefill", "block", "verify", "store")}
    return {"token_ids": [int(t) for t in gen.token_ids], "stopped": bool(gen.stopped),
            "target_passes": int(s.target_passes), "passes": passes, "steps": int(s.steps), "blocks": int(s.blocks),
            "epilogue_states": int(s.extra.get("epilogue_states", 0)),
            "epilogue_ms": float(s.extra.get("epilogue_ms", 0.0)),
            "host": {"draft_ms": float(s.extra.get("draft_ms", 0.0)), "walk_ms": float(s.extra.get("walk_ms", 0.0)),
                     "target_ms": float(s.extra.get("target_ms", 0.0)), "seconds": float(s.seconds)}}


def golden_cases(engine, drafter, prompts: list[list[int]], *, max_new_tokens: int = 48, budget: int = 16,
                 depth: int = 8, seeds_t1: tuple[int, ...] = (1,), decoders=DECODERS,
                 temperatures=TEMPERATURES) -> list[dict]:
    """Every (prompt, decoder, temperature, seed) case with its expected output. Temperature 0 uses seed 0 only
    (the noise is not used there); decoders needing a drafter are left out when there is none."""
    cases = []
    for pi, prompt in enumerate(prompts):
        for decoder in decoders:
            if decoder in DRAFTER_DECODERS and drafter is None:
                continue
            for t in temperatures:
                for seed in ((0,) if t == 0 else seeds_t1):
                    opts = case_options(decoder, t, seed, max_new_tokens, budget, depth)
                    expected = run_case(engine, drafter, prompt, opts)
                    expected.pop("host")          # timings vary run to run: not part of the golden file
                    cases.append({"prompt": pi, "prompt_ids": [int(i) for i in prompt], **opts,
                                  "expected": expected})
    return cases


def model_identity(folder: Path) -> dict:
    """What names the exported model: the manifest's record of its weights and graph files."""
    manifest = json.loads((folder / "manifest.json").read_text())
    files = manifest["files"]
    return {"weights_sha256": files["target.onnx.data"]["sha256"], "graph_sha256": files["target.onnx"]["sha256"],
            "block_size": manifest["block_size"], "vocab_size": manifest["model"]["vocab_size"],
            "dtype": manifest["dtype"]}


def drafter_identity(drafter) -> dict | None:
    if drafter is None:
        return None
    return {"onnx_sha256": drafter.manifest["onnx_sha256"], "block_size": drafter.block_size,
            "order_temperature": drafter.order_temperature, "runner_up_weight": drafter.runner_up_weight,
            "set_flip_weight": drafter.set_flip_weight}


def embedded_prompts(tokenizer, n: int, lengths=(45, 70, 100, 37, 64, 90)) -> list[list[int]]:
    """The first n held-out prompts of the embedded model, cut to varied lengths (leftover tokens open a block)."""
    from spot.training.traces import prompts_from_jsonl

    path = ROOT / "spot" / "assets" / "embedded" / "heldout_prompts.jsonl"
    prompts = prompts_from_jsonl(path, tokenizer)
    return [p[: lengths[i % len(lengths)]] for i, p in enumerate(prompts[:n])]


def random_prompts(n: int, vocab: int, mask_id: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        ids = rng.integers(0, vocab, int(rng.integers(3, 3 * 16)))
        out.append([int(i) for i in ids if i != mask_id])
    return out


def write_golden(path: Path, folder: Path, drafter, cases: list[dict], settings: dict) -> Path:
    doc = {"format": FORMAT, "format_version": FORMAT_VERSION, "generator": f"spot {__version__}, numpy "
           f"{np.__version__}", "model": model_identity(folder), "drafter": drafter_identity(drafter),
           "settings": settings, "cases": cases}
    path.parent.mkdir(parents=True, exist_ok=True)
    # one case per line keeps the file diffable and small
    lines = [json.dumps({k: v for k, v in doc.items() if k != "cases"})[:-1] + ', "cases": [']
    lines += [json.dumps(c) + ("," if i + 1 < len(cases) else "") for i, c in enumerate(cases)]
    lines.append("]}")
    path.write_text("\n".join(lines) + "\n")
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, type=Path, help="exported folder (spot export)")
    ap.add_argument("--drafter", type=Path, default=None,
                    help="folder with drafter.onnx + drafter.json (default: the model folder's, if any)")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--prompts", type=int, default=3, help="number of prompts")
    ap.add_argument("--prompt-source", choices=("embedded", "random"), default="embedded")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--budget", type=int, default=16)
    ap.add_argument("--depth", type=int, default=8)
    ap.add_argument("--seeds", type=int, default=1, help="seeds at temperature 1")
    args = ap.parse_args(argv)

    from spot.engines.ort_engine import OrtEngine
    from spot.runtime.drafter import load_drafter

    engine = OrtEngine(args.model)
    drafter_dir = args.drafter or (args.model if (args.model / "drafter.onnx").is_file() else None)
    drafter = load_drafter(drafter_dir) if drafter_dir else None
    if args.prompt_source == "embedded":
        from spot.tokenizer import load_tokenizer
        prompts = embedded_prompts(load_tokenizer(ROOT / "spot" / "assets" / "embedded"), args.prompts)
    else:
        prompts = random_prompts(args.prompts, engine.config.vocab_size, engine.config.mask_token_id)
    settings = {"max_new_tokens": args.max_new_tokens, "budget": args.budget, "depth": args.depth,
                "seeds_t1": list(range(1, args.seeds + 1)), "temperatures": list(TEMPERATURES)}
    cases = golden_cases(engine, drafter, prompts, max_new_tokens=args.max_new_tokens, budget=args.budget,
                         depth=args.depth, seeds_t1=tuple(range(1, args.seeds + 1)))
    write_golden(args.out, args.model, drafter, cases, settings)
    print(f"wrote {args.out}: {len(cases)} cases")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
