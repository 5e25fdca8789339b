"""`spot demo`: export the embedded models (cached), then decode one held-out prompt of each with standard decoding
and with SPOT on ONNX Runtime and compare. Returns result dicts; the CLI prints them."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Callable

import spot.assets
from spot.assets import DEFAULT_MODEL, MODELS, embedded_name
from spot.engines.ort_engine import OrtEngine
from spot.errors import SpotError
import spot.export
from spot.export.presets import resolve_source
from spot.files import exclusive_lock, remove_tree, spot_cache, write_text_atomic
from spot.folder.manifest import load_manifest
from spot.folder.replaceable import check_replaceable
from spot.gsm8k import final_answer
from spot.runtime.decode_plan import DecodeRequest, run_decoder
from spot.runtime.drafter import load_drafter
from spot.runtime.spot import TreeBudget
from spot.runtime.step import Sampling
from spot.tokenizer import load_tokenizer

DEMO_MODELS = ("arithmetic", "code")      # the order spot demo shows them in: where SPOT pays most first
CODE_PROMPT_TOKENS = 128                  # the code model's prompt: at most this many tokens, from a line start


def cache_dir() -> Path:
    return spot_cache()


def _canonical(name: str) -> str:
    canonical = embedded_name(name)
    if canonical is None:
        embedded_model_dir(name)          # raises the unknown-name error with its hint
    return canonical


def embedded_model_dir(name: str) -> Path:
    """spot.assets.embedded_model_dir, looked up when called (tests stand a tiny model in for the shipped ones)."""
    return spot.assets.embedded_model_dir(name)


def embedded_export_dir(name: str = DEFAULT_MODEL) -> Path:
    """Where `spot demo` exports the embedded model `name` (fp32 ONNX): the ort / tensorrt backends' model for
    `--model NAME` (and for no --model: the default one)."""
    return cache_dir() / f"{_canonical(name)}-fp32-onnx"


def embedded_export_stamp(name: str = DEFAULT_MODEL) -> str:
    """What the demo's export was made from: the weights' mtime, the shipped drafter's manifest (it holds the ONNX
    hash) and the exporter's sources — a new drafter, or any change to how graphs are built (target, epilogue,
    kv_append), re-exports."""
    src = embedded_model_dir(name)
    exporter = hashlib.sha256()
    for source in sorted(Path(spot.export.__file__).parent.glob("*.py")):
        exporter.update(source.read_bytes())
    return f"{(src / 'model.safetensors').stat().st_mtime_ns} " \
           f"{hashlib.sha256((src / 'drafter.json').read_bytes()).hexdigest()[:16]} {exporter.hexdigest()[:16]}"


def embedded_export_stamp_path(name: str = DEFAULT_MODEL) -> Path:
    """Where the stamp of the demo's export of `name` is kept: beside the folder, not in it (an exported folder holds
    only what its manifest vouches for, spot.folder.replaceable.check_replaceable)."""
    folder = embedded_export_dir(name)
    return folder.parent / f".{folder.name}.stamp"


def embedded_export_current(name: str = DEFAULT_MODEL) -> bool:
    """Whether the demo's export of `name` was made from this spot's embedded model and exporter (its stamp)."""
    try:
        return embedded_export_stamp_path(name).read_text() == embedded_export_stamp(name)
    except OSError:
        return False


def exported_embedded(progress: Callable[[str], None], name: str = DEFAULT_MODEL) -> Path:
    """The embedded model `name` exported to fp32 ONNX, reused while its manifest checks out (re-exported
    otherwise). An export says one line; its steps are a progress bar's updates (spot.export.options.Progress)."""
    out = embedded_export_dir(name)
    stamp = embedded_export_stamp(name)

    def usable() -> bool:
        try:
            load_manifest(out)                      # hashes: a damaged cache is re-exported, never used
            return embedded_export_stamp_path(name).read_text() == stamp
        except (SpotError, OSError):
            return False
    if usable():
        return out
    # concurrent first runs (a CI matrix, a service's workers): one exports, the others wait and reuse its folder
    with exclusive_lock(out.parent / f".{out.name}.lock",
                        lambda: progress(f"waiting for another process exporting the {name} model to {out}")):
        if usable():
            return out
        # onnx: optional extra (spot.export.export imports it)
        from spot.export.export import export_checkpoint
        # onnx: optional extra (spot.export.options imports it)
        from spot.export.options import ExportOptions
        if out.is_dir():
            progress(f"cached export at {out} is stale or damaged: exporting again")
            try:
                check_replaceable(out)
            except SpotError:       # the cache's own folder, damaged past recognition as an export
                remove_tree(out)
        progress(f"exporting the {_canonical(name)} model to {out} (once, a few seconds; cached afterwards)")
        try:
            export_checkpoint(resolve_source(name), out, ExportOptions(dtype="fp32", overwrite=True),
                              lambda line: progress("\r" + line.strip()))
        finally:
            progress("\r")
        write_text_atomic(embedded_export_stamp_path(name), stamp)
    return out


def heldout_record(name: str, index: int) -> dict:
    """Line `index` of the embedded model's heldout_prompts.jsonl; SpotError for an index outside the file."""
    path = embedded_model_dir(name) / "heldout_prompts.jsonl"
    records = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    if not 0 <= index < len(records):
        raise SpotError(f"--prompt-index must be in 0..{len(records) - 1} (the {name} model's held-out prompts), "
                        f"got {index}")
    return records[index]


def demo_prompt(name: str, index: int, tokenizer) -> tuple[dict, list[int]]:
    """The held-out record `index` of model `name` and the ids to decode from: the whole question of a GSM8K-format
    prompt; for other prompts their last CODE_PROMPT_TOKENS tokens, starting at a line start (a prompt shown from
    the middle of a token or an identifier reads as garbage)."""
    rec = heldout_record(name, index)
    text = rec["text"]
    if "answer" not in rec:
        text = tail_from_line_start(text, tokenizer, CODE_PROMPT_TOKENS)
    return rec, tokenizer.encode(text)


def tail_from_line_start(text: str, tokenizer, max_tokens: int) -> str:
    """The longest suffix of `text` that starts a line and encodes to at most max_tokens tokens (the last line
    alone, cut to its last max_tokens tokens, when even that one is longer)."""
    starts = [0] + [i + 1 for i, ch in enumerate(text) if ch == "\n" and i + 1 < len(text)]
    for start in starts:
        if len(tokenizer.encode(text[start:])) <= max_tokens:
            return text[start:]
    return tokenizer.decode(tokenizer.encode(text)[-max_tokens:])


def run_model_demo(name: str, prompt_index: int = 0, max_new_tokens: int | None = None,
                   temperature: float | None = None,
                   seed: int = 0, budget: tuple[int, int] | None = None,
                   progress: Callable[[str], None] = lambda s: None) -> dict:
    """Standard decoding and SPOT on one held-out prompt of the embedded model `name` (ONNX Runtime, its cached
    export): texts, passes, tokens/s, and for a GSM8K-format prompt whether the answer is right."""
    model = MODELS[_canonical(name)]
    temperature = model.demo_temperature if temperature is None else temperature
    max_new_tokens = model.demo_new_tokens if max_new_tokens is None else max_new_tokens
    nodes, depth = budget or model.demo_budget
    rec, ids = demo_prompt(model.name, prompt_index, load_tokenizer(embedded_model_dir(model.name)))
    folder = exported_embedded(progress, model.name)    # (a bad index is refused before the export)
    with OrtEngine(folder) as engine:
        tokenizer = load_tokenizer(folder)
        drafter = load_drafter(folder / "drafter.onnx")
        req = DecodeRequest(max_new_tokens, sampling=Sampling(temperature, seed=seed),
                            budget=TreeBudget(nodes, depth))
        req.budget.check(engine)        # before the standard decode, not after it
        run_decoder("standard", engine, ids, req)          # warm-up: first-call allocations out of the timing
        results = {}
        for decoder in ("standard", "spot"):
            progress(f"{model.name}: decoding with {decoder}")
            gen = run_decoder(decoder, engine, ids, req, drafter)
            rounds, verifies = gen.stats.verify, gen.stats.passes.get("verify", 0)
            results[decoder] = {"text": tokenizer.decode(gen.token_ids), "token_ids": gen.token_ids,
                                "target_passes": gen.stats.target_passes, "seconds": gen.stats.seconds,
                                "tokens_per_s": len(gen.token_ids) / gen.stats.seconds,
                                "verify_passes": verifies,
                                "target_ms_per_verify": gen.stats.target_ms / max(verifies, 1),
                                "host_ms_per_verify": (rounds.draft_ms + rounds.walk_ms if rounds else 0.0)
                                / max(verifies, 1)}
    std, spot = results["standard"], results["spot"]
    ms_per_pass = 1e3 * std["seconds"] / std["target_passes"]     # standard decoding: everything per pass
    out = {"model": model.name, "about": model.about, "prompt_id": rec.get("id"), "prompt_file": rec.get("file"),
           "prompt": tokenizer.decode(ids), "folder": str(folder), "temperature": temperature, "seed": seed,
           "budget": [nodes, depth], **results,
           "identical": std["token_ids"] == spot["token_ids"],
           "passes_reduction": std["target_passes"] / spot["target_passes"],
           "speedup": spot["tokens_per_s"] / std["tokens_per_s"],
           # where SPOT's time goes, in units of one standard pass
           "verify_cost": spot["target_ms_per_verify"] / ms_per_pass,
           "host_cost": spot["host_ms_per_verify"] / ms_per_pass}
    if "answer" in rec:
        got = final_answer(std["text"])
        out.update(true_answer=rec["answer"], answer=got, answer_right=got == rec["answer"],
                   heldout_answers=heldout_answers(model.name))
    return out


def heldout_answers(name: str) -> dict | None:
    """How many of its held-out problems the embedded model `name` answers right with greedy standard decoding, as
    its training_report.json measured it ({"right": k, "problems": n}); None when the report has no such figure.
    The demo's one problem is a sample: this is the model's accuracy."""
    try:
        report = json.loads((embedded_model_dir(name) / "training_report.json").read_text())
        answers = report["evaluation"]["greedy_answers"]
        return {"right": int(answers["right"]), "problems": int(answers["problems"])}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def demo_budget(models, budget: int | None, depth: int | None) -> tuple[int, int] | None:
    """spot demo's --budget / --depth as one tree shape for every model: the first model's own default for the one
    not given; None (each model its own) when neither is."""
    if budget is None and depth is None:
        return None
    defaults = [MODELS[m].demo_budget for m in (models or DEMO_MODELS) if m in MODELS]
    default_nodes, default_depth = defaults[0] if defaults else (16, 8)
    return (default_nodes if budget is None else budget, default_depth if depth is None else depth)


def run_demo(models=DEMO_MODELS, prompt_index: int = 0, max_new_tokens: int | None = None,
             temperature: float | None = None, seed: int = 0, budget: tuple[int, int] | None = None,
             progress: Callable[[str], None] = lambda s: None) -> list[dict]:
    """run_model_demo for each model, in order (per-model defaults where max_new_tokens / temperature / budget are
    None)."""
    names = [_canonical(m) for m in models]
    for name in names:          # every prompt index checked before the first export
        heldout_record(name, prompt_index)
    return [run_model_demo(name, prompt_index, max_new_tokens, temperature, seed, budget, progress)
            for name in names]


def demo_model_text(r: dict) -> str:
    """One model's part of `spot demo`: its prompt, the decoded text (both decoders', identical), the answer, passes."""
    nodes, depth = r["budget"]
    head = f"\n=== {r['model']} model ({r['about']}) ==="
    if "true_answer" in r:
        prompt = f"held-out problem {r['prompt_id']}:\n{r['prompt'].rstrip()}"
    else:
        prompt = f"held-out prompt {r['prompt_id']} ({r['prompt_file']}), from a line start:\n{r['prompt']}"
    same = "standard decoding and SPOT, identical" if r["identical"] else "STANDARD DECODING (SPOT's differs!)"
    text = f"{head}\n{prompt}\n--- decoded at temperature {r['temperature']:g}, seed {r['seed']} ({same}):\n" \
           f"{r['standard']['text'].rstrip()}"
    if not r["identical"]:
        text += f"\n--- SPOT:\n{r['spot']['text'].rstrip()}"
    if "true_answer" in r:
        verdict = "right" if r["answer_right"] else f"wrong (true answer {r['true_answer']})"
        text += f"\n--- answer {r['answer']}: {verdict}"
        if r.get("heldout_answers"):
            k, n = r["heldout_answers"]["right"], r["heldout_answers"]["problems"]
            text += f" (the model answers {k} of its {n} held-out problems right, {k / n:.0%}: greedy decoding)"
    return text + (f"\n--- target passes: standard {r['standard']['target_passes']}, SPOT {r['spot']['target_passes']} "
                   f"({nodes}-node trees, depth {depth}): {r['passes_reduction']:.2f}x fewer")


def demo_summary(results: list[dict]) -> str:
    """The table a person reads at a glance, then the wall clock on this machine and why."""
    lines = ["\n=== what SPOT bought ===",
             f"{'model':<11} {'output':<10} {'answer':<7} {'target passes':<22} {'fewer passes':<13} wall clock here",
             ]
    for r in results:
        passes = f"{r['standard']['target_passes']} -> {r['spot']['target_passes']}"
        answer = ("right" if r["answer_right"] else "wrong") if "true_answer" in r else "-"
        lines.append(f"{r['model']:<11} {'identical' if r['identical'] else 'DIFFERENT':<10} {answer:<7} "
                     f"{passes:<22} {r['passes_reduction']:<13.2f} {r['speedup']:.2f}x tokens/s")
    if any(not r["identical"] for r in results):
        lines.append("outputs DIFFERENT: a bug, please report it")
    slower = [r for r in results if round(r["speedup"], 2) < 1.0 and r["spot"]["verify_passes"] > 0]
    if slower:
        lines += ["why the wall clock: on this CPU (ONNX Runtime) a pass is compute-bound, so one verify pass over a "
                  "tree",
                  "  costs the time of several standard passes, more than the passes it saves:",
                  *(f"    {r['model']}: {r['verify_cost']:.1f} standard passes' time in the target + "
                    f"{r['host_cost']:.1f} on the host" for r in slower),
                  "  Where a pass is memory-bound (GPUs, Jetson Orin) a verify pass costs about one pass, and fewer "
                  "passes",
                  "  become speed: `spot-export sdar-8b-b32 --plan orin-nx-16gb` projects it, `spot tune` measures "
                  "this",
                  "  engine's curve, `spot generate --budget auto` decodes with the fastest budget "
                  "(docs/benchmarks.md)."]
    return "\n".join(lines)
