"""`spot upgrade-export DIR`: bring an exported folder's small graphs (and the TensorRT shape profile its manifest
records for --device trt) up to this version without exporting again.

The sampling epilogue (epilogue.onnx: since session 14 it takes runs of `positions_per_call` positions, which is
what keeps it under 1 GiB per call at SDAR's vocabulary) and the device KV cache's append (kv_append.onnx) are built
from the manifest's model facts alone; the target graph and its weights (16 GB for SDAR-8B in fp16) stay as they
are. The upgrade builds a sibling folder of hard links (no copy of the weights), writes the new graphs there, checks
them bit for bit (as spot-export does) and swaps the folders by renames, so the folder is either the old one or the
new one, never half of each. A folder that is already current is left as it is, and a memory plan recorded at export
(`--plan`) is recomputed for the new epilogue: an upgrade that would no longer fit that device is refused before
anything is written.
"""
from __future__ import annotations

import os
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Callable

from spot.engines.buckets import dynamic_trt_profile
from spot.errors import SpotError
from spot.files import swap_in_folder
from spot.export.epilogue import validate_epilogue, write_epilogue
from spot.export.export import ExportOptions, check_options
from spot.export.kv_append import validate_kv_append, write_kv_append
from spot.export.manifest import add_files, load_manifest, write_manifest
from spot.export.memory_plan import GIB, EpilogueCall, plan_for_options, plan_record, verify_pass_bytes
from spot.export.quantize import QuantScheme


def upgrade_export(folder: str | Path, future_steps: int | None = None, positions: int | None = None,
                   progress: Callable[[str], None] = print) -> tuple[dict, bool]:
    """Rewrite `folder`'s epilogue (D = future_steps, default: the folder's own — none for a folder exported with
    --epilogue-steps 0 — else, for a folder from before epilogues, spot-export's; 0 removes it;
    P = positions, default: the folder's own at its D, else spot-export's) and kv_append graphs. Returns (the
    folder's manifest, whether it changed)."""
    folder = Path(folder)
    moved = folder.with_name(folder.name + ".replaced")
    if not folder.exists() and moved.is_dir():
        raise SpotError(f"{folder} does not exist, but {moved} does (an upgrade killed while it swapped folders)",
                        f"rename {moved} back to {folder} and run the upgrade again")
    exported = load_manifest(folder)                       # sizes checked: a damaged folder is refused here
    cfg, b = exported.config.with_block_size(exported.block_size), exported.block_size
    manifest = dict(exported.manifest)
    graphs = dict(manifest["graphs"])
    old = graphs.get("epilogue") or {}
    if future_steps is None and not old and "kv_append" in graphs:
        future_steps = 0    # exported (or upgraded) by a version with epilogues, without one: --epilogue-steps 0
    # the options spot-export would take for this folder: its checks and defaults (--epilogue-steps/-positions)
    options = ExportOptions(dtype=exported.dtype, max_nodes=int(manifest["max_nodes"]),
                            max_context=int(manifest["max_context"]),
                            epilogue_steps=future_steps if future_steps is not None else old.get("future_steps"),
                            epilogue_positions=positions if positions is not None else
                            old.get("positions_per_call") if future_steps in (None, old.get("future_steps")) else None)
    check_options(cfg, options)
    epilogue = options.epilogue_call(cfg)
    plan = _replanned(manifest, cfg, options)      # refused here when it no longer fits
    tmp, previous = folder.with_name(folder.name + ".upgrading"), folder.with_name(folder.name + ".replaced")
    for leftover in (tmp, previous):
        if leftover.exists():
            raise SpotError(f"{leftover} exists (an interrupted upgrade?)",
                            f"if {folder} opens, remove {leftover}; else rename {leftover} back to {folder.name}")
    # the steps are a progress bar's updates ("\r", spot.export.export.Progress): a current folder says only that
    progress(f"checking {folder}'s sampling epilogue, kv_append graph and TensorRT profile against this version")
    progress(f"\r  linking {folder} -> {tmp} (hard links: the weights are not copied)")
    try:
        tmp.mkdir()       # exclusive: a concurrent upgrade of the same folder stops here, not in the other's files
    except FileExistsError:
        raise SpotError(f"{tmp} appeared meanwhile: another upgrade of {folder} is running",
                        "wait for it to finish") from None
    try:
        shutil.copytree(folder, tmp, copy_function=os.link, dirs_exist_ok=True)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise SpotError(f"could not hard-link {folder} into {tmp}: {e}",
                        "the upgrade needs write access beside the folder on a filesystem with hard links; "
                        "else export again with spot-export") from None
    try:
        names = []
        if epilogue is not None:
            d, p = epilogue.future_steps, epilogue.positions
            progress(f"\r  sampling epilogue: D = {d} future steps, {p} of {b} positions per call")
            name, entry = write_epilogue(tmp, cfg.vocab_size, b, d, positions=p)
            entry["validation"] = validate_epilogue(tmp, cfg.vocab_size, b, d)
            graphs["epilogue"], names = entry, [name]
        else:
            graphs.pop("epilogue", None)
            (tmp / "epilogue.onnx").unlink(missing_ok=True)
            manifest["files"] = {k: v for k, v in manifest["files"].items() if k != "epilogue.onnx"}
        progress("\r  kv_append graph (the device KV cache)")
        layers, heads, dim, dtype = cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, exported.dtype
        name, entry = write_kv_append(tmp, layers, heads, dim, dtype)
        entry["validation"] = validate_kv_append(tmp, layers, heads, dim, dtype)
        graphs["kv_append"] = entry
        progress("\r  TensorRT shape profile for --device trt")
        graphs["target"] = {**graphs["target"], "tensorrt_profile": dynamic_trt_profile(
            cfg, int(manifest["max_nodes"]), int(manifest["max_context"])).to_dict()}
        manifest["graphs"] = graphs
        manifest = add_files(tmp, manifest, [*names, name])
        _refresh_memory_terms(manifest, cfg, dtype, epilogue, plan)
        if _same_graphs(exported.manifest, manifest):
            shutil.rmtree(tmp)
            progress("\r")
            return exported.manifest, False
        write_manifest(tmp, manifest)
        load_manifest(tmp)                                 # the new manifest reads back, every file there
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        progress("\r")
        raise
    progress("\r")
    try:      # an old copy an interrupt leaves aside is named by the next upgrade's check
        swap_in_folder(tmp, folder, previous)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    progress(f"upgraded {folder}")
    return manifest, True


def _same_graphs(old: dict, new: dict) -> bool:
    """The upgrade rebuilt what the folder holds: the same files (sha256), graph records (validation aside) and
    memory record."""
    def records(m: dict) -> dict:
        return {name: {k: v for k, v in entry.items() if k != "validation"} for name, entry in m["graphs"].items()}
    return old["files"] == new["files"] and records(old) == records(new) and old.get("memory") == new.get("memory")


def _replanned(manifest: dict, cfg, options: ExportOptions) -> dict | None:
    """The memory plan recorded at export (--plan), recomputed as spot-export computes it for `options` (the
    upgrade's epilogue) with the export's weights, device and context; SpotError when it no longer fits."""
    recorded = (manifest.get("memory") or {}).get("plan")
    if not recorded:
        return None
    quant = QuantScheme.from_record(manifest.get("weights") or {}, bool(manifest.get("ort_only")))
    options = replace(options, plan=recorded["device"], weights=quant.weights, int4_block=quant.int4_block,
                      matmulnbits=quant.matmulnbits)
    source = manifest.get("source") or {}
    name = source.get("preset") or Path(str(source.get("checkpoint", "model"))).name
    plan = plan_for_options(cfg, options, int(recorded["context"]), name)
    if not plan.fits:
        raise SpotError(f"the upgraded {name} would not fit {plan.device.name}, the device of its memory plan: "
                        f"{plan.total / GIB:.2f} GiB of {plan.device.memory_gib:g} GiB at {plan.context} tokens and "
                        f"{plan.nodes} nodes (sampling epilogue "
                        f"{plan.activations.get('sampling_epilogue', 0) / 2**20:.1f} MiB)",
                        "lower --epilogue-positions or --epilogue-steps (0: no epilogue; decode with --sampler host)")
    return plan_record(plan, cfg.block_size)


def _refresh_memory_terms(manifest: dict, cfg, dtype: str, epilogue: EpilogueCall | None,
                          plan: dict | None) -> None:
    """The manifest's verify-pass memory terms, and the plan recorded at export (if any), for the new epilogue."""
    memory = manifest.get("memory")
    if not memory or "verify_pass_terms" not in memory:
        return
    memory = manifest["memory"] = dict(memory)
    if plan is not None:
        memory["plan"] = plan
    quantized = bool(manifest.get("weights", {}).get("quantized", False))
    terms = verify_pass_bytes(cfg, dtype, int(manifest["max_nodes"]), int(manifest["max_context"]), quantized,
                              epilogue)
    memory["verify_pass_terms"] = terms
    memory["verify_pass_bytes_at_max_nodes_and_context"] = sum(terms.values())
