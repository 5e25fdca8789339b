"""`spot demo`: export the embedded model (cached), then decode one held-out prompt with standard decoding and SPOT
on ONNX Runtime and compare. Returns a result dict; the CLI prints it."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Callable

from spot.errors import SpotError
from spot.files import exclusive_lock, spot_cache, write_text_atomic

# Sampled, not greedy: greedy text of the small embedded model loops, and the claim to show is exactness at any
# temperature (the tree shares the target's Gumbel noise)
DEMO_TEMPERATURE = 0.7


def cache_dir() -> Path:
    return spot_cache()


def embedded_export_dir() -> Path:
    """Where `spot demo` exports the embedded model (fp32 ONNX): the ort / tensorrt backends' default model."""
    return cache_dir() / "embedded-fp32-onnx"


def embedded_export_stamp() -> str:
    """What the demo's export was made from: the weights' mtime, the shipped drafter's manifest (it holds the ONNX
    hash) and the exporter's sources — a new drafter, or any change to how graphs are built (target, epilogue,
    kv_append), re-exports."""
    import spot.export
    from spot.assets import embedded_model_dir
    src = embedded_model_dir()
    exporter = hashlib.sha256()
    for source in sorted(Path(spot.export.__file__).parent.glob("*.py")):
        exporter.update(source.read_bytes())
    return f"{(src / 'model.safetensors').stat().st_mtime_ns} " \
           f"{hashlib.sha256((src / 'drafter.json').read_bytes()).hexdigest()[:16]} {exporter.hexdigest()[:16]}"


def embedded_export_current() -> bool:
    """Whether the demo's export was made from this spot's embedded model and exporter (its stamp)."""
    try:
        return (embedded_export_dir() / ".stamp").read_text() == embedded_export_stamp()
    except OSError:
        return False


def exported_embedded(progress: Callable[[str], None]) -> Path:
    """The embedded model exported to fp32 ONNX, reused while its manifest checks out (re-exported otherwise)."""
    from spot.export.export import ExportOptions, export_checkpoint
    from spot.export.manifest import load_manifest
    from spot.export.presets import resolve_source

    out = embedded_export_dir()
    stamp = embedded_export_stamp()

    def usable() -> bool:
        try:
            load_manifest(out)                      # hashes: a damaged cache is re-exported, never used
            return (out / ".stamp").read_text() == stamp
        except (SpotError, OSError):
            return False
    if usable():
        return out
    # concurrent first runs (a CI matrix, a service's workers): one exports, the others wait and reuse its folder
    with exclusive_lock(out.parent / f".{out.name}.lock",
                        lambda: progress(f"waiting for another process exporting the embedded model to {out}")):
        if usable():
            return out
        if out.is_dir():
            progress(f"cached export at {out} is stale or damaged: exporting again")
        progress(f"exporting the embedded model to {out} (once; cached afterwards)")
        export_checkpoint(resolve_source("embedded"), out, ExportOptions(dtype="fp32", overwrite=True), progress)
        write_text_atomic(out / ".stamp", stamp)
    return out


def heldout_prompt(index: int, max_tokens: int) -> tuple[str, list[int]]:
    from spot.assets import embedded_model_dir
    from spot.tokenizer import load_tokenizer
    path = embedded_model_dir() / "heldout_prompts.jsonl"
    lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    if not 0 <= index < len(lines):
        raise SpotError(f"--prompt-index must be in 0..{len(lines) - 1} (the held-out prompts), got {index}")
    rec = lines[index]
    ids = load_tokenizer(embedded_model_dir()).encode(rec["text"])[-max_tokens:]
    return rec.get("file", str(index)), ids


def run_demo(prompt_index: int = 0, max_new_tokens: int = 64, temperature: float = DEMO_TEMPERATURE, seed: int = 0,
             nodes: int = 16, depth: int = 8, progress: Callable[[str], None] = lambda s: None) -> dict:
    from spot.engines.ort_engine import OrtEngine
    from spot.runtime.decoders import DecodeRequest, run_decoder
    from spot.runtime.drafter import load_drafter
    from spot.runtime.spot import TreeBudget
    from spot.runtime.step import Sampling
    from spot.tokenizer import load_tokenizer

    name, ids = heldout_prompt(prompt_index, 128)     # a bad index is refused before the export
    folder = exported_embedded(progress)
    engine = OrtEngine(folder)
    tokenizer = load_tokenizer(folder)
    drafter = load_drafter(folder / "drafter.onnx")
    req = DecodeRequest(max_new_tokens, sampling=Sampling(temperature, seed=seed), budget=TreeBudget(nodes, depth))
    req.budget.check(engine)        # before the standard decode, not after it
    run_decoder("standard", engine, ids, req)          # warm-up: first-call allocations out of the timing
    results = {}
    for decoder in ("standard", "spot"):
        progress(f"decoding with {decoder}")
        gen = run_decoder(decoder, engine, ids, req, drafter)
        rounds, verifies = gen.stats.verify, gen.stats.passes["verify"]
        results[decoder] = {"text": tokenizer.decode(gen.token_ids), "token_ids": gen.token_ids,
                            "target_passes": gen.stats.target_passes, "seconds": gen.stats.seconds,
                            "tokens_per_s": len(gen.token_ids) / gen.stats.seconds,
                            "verify_passes": verifies,
                            "target_ms_per_verify": gen.stats.target_ms / max(verifies, 1),
                            "host_ms_per_verify": (rounds.draft_ms + rounds.walk_ms if rounds else 0.0)
                            / max(verifies, 1)}
    std, spot = results["standard"], results["spot"]
    ms_per_pass = 1e3 * std["seconds"] / std["target_passes"]     # standard decoding: everything per pass
    return {"prompt_file": name, "prompt": tokenizer.decode(ids), "folder": str(folder), **results,
            "identical": std["token_ids"] == spot["token_ids"],
            "passes_reduction": std["target_passes"] / spot["target_passes"],
            "speedup": spot["tokens_per_s"] / std["tokens_per_s"],
            # where SPOT's time goes, in units of one standard pass
            "verify_cost": spot["target_ms_per_verify"] / ms_per_pass,
            "host_cost": spot["host_ms_per_verify"] / ms_per_pass}
