#!/usr/bin/env python3
"""Write a random-weight SDAR checkpoint of a real shape (e.g. SDAR-1.7B, 4.06 GB bf16) for export benchmarks.

Shards + model.safetensors.index.json + config.json, written tensor by tensor and chunk by chunk: memory stays at
a few tens of MB whatever the model size. Weights are normal(0, 0.02), norm weights 1 + 0.1 * normal.

    python scripts/make_random_checkpoint.py --shape sdar-1.7b --out /tmp/sdar-1.7b-random
    python scripts/make_random_checkpoint.py --shape tiny --out /tmp/tiny          # seconds, for smoke tests
    python scripts/make_random_checkpoint.py --layers 4 --vocab-size 8192 --out /tmp/m   # 0.23B, weights in layers
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from spot.checkpoint import SAFETENSORS_ITEMSIZE, write_safetensors_stream  # noqa: E402
from spot.config import ModelConfig  # noqa: E402
from spot.export.presets import PRESETS  # noqa: E402

CHUNK_ELEMS = 4 * 1024 * 1024
DTYPES = SAFETENSORS_ITEMSIZE
TINY = ModelConfig(vocab_size=1024, hidden_size=128, intermediate_size=384, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=1024,
                   mask_token_id=1023, stop_ids=(1022,))


def plan_shards(shapes: dict[str, tuple[int, ...]], dtype: str, shard_bytes: int) -> list[list[str]]:
    shards, current, size = [], [], 0
    for name, shape in shapes.items():
        nbytes = int(np.prod(shape)) * DTYPES[dtype]
        if current and size + nbytes > shard_bytes:
            shards.append(current)
            current, size = [], 0
        current.append(name)
        size += nbytes
    if current:
        shards.append(current)
    return shards


def write_shard(path: Path, names: list[str], shapes: dict, dtype: str, rng: np.random.Generator) -> int:
    """One safetensors file, each tensor generated and written in row chunks (never whole in memory)."""
    def chunks(name):
        shape = shapes[name]
        if len(shape) == 1:
            yield 1.0 + 0.1 * rng.standard_normal(shape, dtype=np.float32)
            return
        rows, cols = shape
        step = max(1, CHUNK_ELEMS // cols)
        for r0 in range(0, rows, step):
            yield rng.standard_normal((min(step, rows - r0), cols), dtype=np.float32) * np.float32(0.02)
    return write_safetensors_stream(path, {n: shapes[n] for n in names}, dtype, chunks)


def config_json(cfg: ModelConfig, dtype: str) -> dict:
    torch_dtype = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}[dtype]
    return {"architectures": ["SDARForCausalLM"], "model_type": "sdar", "attention_bias": False, "hidden_act": "silu",
            "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
            "num_hidden_layers": cfg.num_hidden_layers, "num_attention_heads": cfg.num_attention_heads,
            "num_key_value_heads": cfg.num_key_value_heads, "head_dim": cfg.head_dim,
            "max_position_embeddings": cfg.max_position_embeddings, "rms_norm_eps": cfg.rms_norm_eps,
            "rope_theta": cfg.rope_theta, "rope_scaling": None, "block_size": cfg.block_size,
            "mask_token_id": cfg.mask_token_id, "eos_token_id": list(cfg.stop_ids),
            "tie_word_embeddings": cfg.tie_word_embeddings, "torch_dtype": torch_dtype}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="sdar-1.7b", choices=["tiny", "sdar-1.7b", "sdar-4b", "sdar-8b"])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--layers", type=int, default=None, help="override the number of layers")
    ap.add_argument("--vocab-size", type=int, default=None,
                    help="override the vocabulary (its last ids become the mask and stop ids)")
    ap.add_argument("--dtype", default="BF16", choices=list(DTYPES))
    ap.add_argument("--shard-gb", type=float, default=2.0, help="shard size limit in GB")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    cfg = TINY if args.shape == "tiny" else PRESETS[args.shape].config()
    if args.layers:
        cfg = replace(cfg, num_hidden_layers=args.layers)
    if args.vocab_size:
        if args.vocab_size < 3:
            ap.error("--vocab-size must be >= 3 (a mask id, a stop id and a token)")
        cfg = replace(cfg, vocab_size=args.vocab_size, mask_token_id=args.vocab_size - 1,
                      stop_ids=(args.vocab_size - 2,))
    shapes = cfg.expected_tensor_shapes()
    shards = plan_shards(shapes, args.dtype, int(args.shard_gb * 1e9))
    args.out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(args.seed)
    weight_map, total = {}, 0
    for i, names in enumerate(shards, 1):
        fname = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        total += write_shard(args.out / fname, names, shapes, args.dtype, rng)
        weight_map.update({n: fname for n in names})
        print(f"wrote {fname} ({len(names)} tensors)", file=sys.stderr)
    (args.out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    (args.out / "config.json").write_text(json.dumps(config_json(cfg, args.dtype), indent=2))
    print(f"{args.out}: {cfg.parameter_count() / 1e9:.2f}B parameters, {total / 1e9:.2f} GB {args.dtype}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
