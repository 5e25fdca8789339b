"""`spot upgrade-export DIR`: bring an exported folder's graphs (and the TensorRT shape profile its manifest records
for --device trt) up to this version without exporting again.

The sampling epilogue (epilogue.onnx: since session 14 it takes runs of `positions_per_call` positions, which is
what keeps it under 1 GiB per call at SDAR's vocabulary) and the device KV cache's append (kv_append.onnx) are built
from the manifest's model facts alone. A format 1 folder's target graph (the cached prefix broadcast over the states
of a pass) is declared again in format 2 (spot.export.graph.SHARED_PREFIX: per-layer cache inputs, the prefix read
once) over the same external data file: its weights (16 GB for SDAR-8B in fp16) are neither read nor copied, each
initializer keeps its offset in target.onnx.data, and the new graph is checked against the old one on ONNX Runtime's
CPU provider (validation cases of spot.export.validate, within the export's tolerances; the first 2 layers of models
above 300M parameters, both graphs built by the same code over the same bytes). The upgrade builds a sibling folder
of hard links (no copy of the weights), writes the new graphs there as new files, checks them (the small graphs bit
for bit, as spot-export does) and swaps the folders (spot.replace: one atomic exchange where the OS has it), so the
folder is either the old one or the new one, never half of each. A folder that is already current is left as it is, and a memory plan recorded at export
(`--plan`) is recomputed for the new graphs: an upgrade that would no longer fit that device is refused before
anything is written.
"""
from __future__ import annotations

import os
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Callable

import onnx
from onnx import TensorProto, helper

from spot.errors import SpotError
from spot.export.epilogue_graph import validate_epilogue, write_epilogue
from spot.export.kv_append_graph import validate_kv_append, write_kv_append
from spot.export.memory_plan import GIB, plan_for_options, plan_record, verify_pass_bytes
from spot.export.options import ExportOptions, check_options
from spot.export.quantize import QuantScheme
from spot.folder.epilogue import EpilogueCall
from spot.folder.manifest_record import EpilogueGraph, GraphRecord, Manifest
from spot.folder.trt_profile import dynamic_trt_profile
from spot.replace import building, output_folder, swap_in_folder
from spot.export.graph import BROADCAST, SHARED_PREFIX, build_target_graph
from spot.export.target_file import make_model
from spot.export.validate import (CASE_NAMES, DEFAULT_PARTIAL_LAYERS, VALIDATE_FULL_PARAMS, max_differences, ort_cases,
                                  truncated)
from spot.folder.manifest import FORMAT_VERSION, add_files, io_contract, load_manifest
from spot.ortlib import load_onnxruntime


def upgrade_export(folder: str | Path, future_steps: int | None = None, positions: int | None = None,
                   progress: Callable[[str], None] = print) -> tuple[Manifest, bool]:
    """Rewrite `folder`'s epilogue (D = future_steps, default: the folder's own — none for a folder exported with
    --epilogue-steps 0 — else, for a folder from before epilogues, spot-export's; 0 removes it;
    P = positions, default: the folder's own at its D, else spot-export's) and kv_append graphs. Returns (the
    folder's manifest, whether it changed)."""
    folder = output_folder(folder, "FOLDER")      # an upgrade killed while it swapped folders: recovered here
    exported = load_manifest(folder, upgradable=True)      # sizes checked: a damaged folder is refused here
    cfg, manifest = exported.config.with_block_size(exported.block_size), exported.manifest
    old = manifest.graphs.epilogue
    if future_steps is None and old is None and "kv_append" in manifest.graphs:
        future_steps = 0    # exported (or upgraded) by a version with epilogues, without one: --epilogue-steps 0
    old_steps = old.future_steps if old else None
    old_positions = (old.positions_per_call or None) if old else None      # (None or absent: not recorded)
    # the options spot-export would take for this folder: its checks and defaults (--epilogue-steps/-positions)
    options = ExportOptions(dtype=exported.dtype, max_nodes=manifest.max_nodes, max_context=manifest.max_context,
                            epilogue_steps=future_steps if future_steps is not None else old_steps,
                            epilogue_positions=positions if positions is not None else
                            old_positions if future_steps in (None, old_steps) else None)
    check_options(cfg, options)
    epilogue = options.epilogue_call(cfg)
    plan = _replanned(manifest, cfg, options)      # refused here when it no longer fits
    # the steps are a progress bar's updates ("\r", spot.export.options.Progress): a current folder says only that
    progress(f"checking {folder}'s format, sampling epilogue, kv_append graph and TensorRT profile against this "
             "version")
    with building(folder) as tmp:
        progress(f"\r  linking {folder} -> {tmp} (hard links: the weights are not copied)")
        try:
            shutil.copytree(folder, tmp, copy_function=os.link, dirs_exist_ok=True)
        except OSError as e:
            raise SpotError(f"could not hard-link {folder} into {tmp}: {e}",
                            "the upgrade needs write access beside the folder on a filesystem with hard links; "
                            "else export again with spot-export") from None
        try:
            manifest = upgraded_manifest(tmp, exported, epilogue, plan, progress)
        finally:
            progress("\r")
        if manifest is None:
            return exported.manifest, False
        # (every file of the folder is in the new one, hard-linked: swapping deletes nothing)
        swap_in_folder(tmp, folder)
    progress(f"upgraded {folder}")
    return manifest, True


def upgraded_manifest(tmp: Path, exported, epilogue: EpilogueCall | None, plan: dict | None,
                      progress: Callable[[str], None]) -> Manifest | None:
    """Write the new graphs into `tmp` (the folder's hard-linked copy) and its new manifest; None when they are
    what the folder holds already (nothing to swap)."""
    cfg, b = exported.config.with_block_size(exported.block_size), exported.block_size
    manifest = exported.manifest
    graphs, files, names = manifest.graphs, manifest.files, []
    if epilogue is not None:
        d, p = epilogue.future_steps, epilogue.positions
        progress(f"\r  sampling epilogue: D = {d} future steps, {p} of {b} positions per call")
        name, entry = write_epilogue(tmp, cfg.vocab_size, b, d, positions=p)
        graphs = graphs.with_graph("epilogue", EpilogueGraph.from_json(entry).set(
            validation=validate_epilogue(tmp, cfg.vocab_size, b, d)))
        names = [name]
    else:
        graphs = graphs.without("epilogue")
        (tmp / "epilogue.onnx").unlink(missing_ok=True)
        files = {k: v for k, v in files.items() if k != "epilogue.onnx"}
    version = manifest.format_version
    if version != FORMAT_VERSION:
        progress(f"target graph: format {version} -> {FORMAT_VERSION} (the cached prefix read once per pass; the "
                 "weights stay where they are)")
        graphs = graphs.with_graph("target", graphs.target.set(**upgrade_target(tmp, exported, progress)))
        names.append(graphs.target.file)
    progress("\r  kv_append graph (the device KV cache)")
    heads, dim, dtype = cfg.num_key_value_heads, cfg.head_dim, exported.dtype
    name, entry = write_kv_append(tmp, heads, dim, dtype)
    graphs = graphs.with_graph("kv_append", GraphRecord.from_json(entry).set(
        validation=validate_kv_append(tmp, heads, dim, dtype)))
    progress("\r  TensorRT shape profile for --device trt")
    graphs = graphs.with_graph("target", graphs.target.set(tensorrt_profile=dynamic_trt_profile(
        cfg, manifest.max_nodes, manifest.max_context).to_dict()))
    manifest = manifest.set(format_version=FORMAT_VERSION, graphs=graphs, files=files)
    manifest = _refresh_memory_terms(add_files(tmp, manifest, [*names, name]), cfg, dtype, epilogue, plan)
    if _same_graphs(exported.manifest, manifest):
        return None
    manifest.write(tmp)
    load_manifest(tmp)                                 # the new manifest reads back, every file there
    return manifest


def upgrade_target(folder: Path, exported, progress: Callable[[str], None]) -> dict:
    """Write `folder`'s target graph in this format over its own data file (a new file replacing the hard link, so
    the folder upgraded from is untouched), check it against the old graph, and return the manifest's target
    entry fields that change."""
    cfg, dtype = exported.config, exported.dtype
    path = folder / exported.graph_path("target").name
    old = onnx.load(str(path), load_external_data=False)
    graph = declared_target(exported.manifest, cfg)
    layout, location = _old_layout(old, graph, path)
    model = make_model(graph, layout, location)
    _check_structure(model)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(model.SerializeToString())
    tmp.replace(path)                                  # a new inode: the hard-linked original stays as it was
    check = check_upgraded_target(folder, exported, old, graph, layout, location, progress)
    return {**io_contract(cfg, dtype), "upgrade_check": check}


def _check_structure(model) -> None:
    """onnx.checker with strict shape inference on the graph, its external weights declared as typed inputs:
    the checker refuses to open a data file with several hard links (a possible hard-link attack), and the
    upgrade's data file is one by design (the weights are linked, not copied)."""
    structure = onnx.ModelProto()
    structure.CopyFrom(model)
    external = [t for t in structure.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    kept = [t for t in structure.graph.initializer if t.data_location != onnx.TensorProto.EXTERNAL]
    del structure.graph.initializer[:]
    structure.graph.initializer.extend(kept)
    structure.graph.input.extend(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in external)
    try:
        onnx.checker.check_model(structure, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as e:
        raise RuntimeError(f"the upgraded graph fails onnx.checker: {e}") from e


def declared_target(manifest: Manifest, cfg, attention: str | None = None):
    """The target graph (spot.export.graph.TargetGraph) an exported folder's manifest describes — its config, dtype,
    weight scheme and opset — with the given attention form (default: this format's)."""
    # the manifest records the graph's opset: 19 / 21 where the weights' quantization needs it, which rebuilds the
    # same graph from the --opset 17 default
    opset = manifest.graph_opset
    return build_target_graph(cfg, manifest.dtype, opset if opset in (17, 18) else 17, _quant(manifest),
                              attention or SHARED_PREFIX)


def _quant(manifest: Manifest) -> QuantScheme:
    return QuantScheme.from_record(manifest.weights_record, bool(manifest.ort_only))


def _old_layout(old, graph, path: Path) -> tuple[dict[str, tuple[int, int]], str]:
    """Offsets of the new graph's weights in the old graph's data file, taken from the old graph's external-data
    records, each checked to be the same tensor (name, element type, dims)."""
    records = {t.name: t for t in old.graph.initializer if t.data_location == TensorProto.EXTERNAL}
    layout, locations = {}, set()
    for spec in graph.weights:
        t = records.get(spec.name)
        if t is None or t.data_type != spec.onnx_type or tuple(t.dims) != tuple(spec.shape):
            got = "absent" if t is None else f"type {t.data_type} dims {list(t.dims)}"
            raise SpotError(f"{path}: weight {spec.name} is {got}, the graph needs type {spec.onnx_type} dims "
                            f"{list(spec.shape)}", "the folder was not written by spot-export: export it again")
        entry = {e.key: e.value for e in t.external_data}
        layout[spec.name] = (int(entry.get("offset", 0)), int(entry["length"]))
        locations.add(entry["location"])
    if len(locations) != 1:
        raise SpotError(f"{path}: its weights are in {sorted(locations)}, expected one data file",
                        "export the folder again with spot-export")
    return layout, locations.pop()


def check_upgraded_target(folder: Path, exported, old, graph, layout: dict, location: str,
                          progress: Callable[[str], None]) -> dict:
    """The validation cases (spot.export.validate) on the old and the new graph on ONNX Runtime's CPU provider:
    logits and new K/V must agree within the export's tolerances (only the attention's summation order changed).
    Models above VALIDATE_FULL_PARAMS parameters: both graphs of their first DEFAULT_PARTIAL_LAYERS layers, built
    by the same code over the same data file; smaller ones: the folder's own old graph, whole."""
    ort = load_onnxruntime()
    cfg, dtype = exported.config, exported.dtype
    layers = cfg.num_hidden_layers
    new_model, old_model = make_model(graph, layout, location), old
    if cfg.parameter_count() > VALIDATE_FULL_PARAMS:
        layers = min(DEFAULT_PARTIAL_LAYERS, layers)
        cfg = truncated(cfg, layers)
        new_model = make_model(declared_target(exported.manifest, cfg), layout, location)
        old_model = make_model(declared_target(exported.manifest, cfg, BROADCAST), layout, location)
    progress(f"checking the new target graph against the old one ({layers} of {exported.config.num_hidden_layers} "
             "layers, ONNX Runtime CPU)")
    so = ort.SessionOptions()
    for key, value in (exported.manifest.ort_session_config or {}).items():
        so.add_session_config_entry(key, str(value))
    outputs = []
    for model, stacked in ((old_model, True), (new_model, False)):
        scratch = folder / ".upgrade-check.onnx"      # beside the data file: the session resolves it from there
        try:
            scratch.write_bytes(model.SerializeToString())
            session = ort.InferenceSession(str(scratch), so, providers=["CPUExecutionProvider"])
            outputs.append(ort_cases(session, cfg, dtype, stacked))
            del session
        finally:
            scratch.unlink(missing_ok=True)
    cases = [max_differences(name, new, old, dtype) for name, new, old in zip(CASE_NAMES, outputs[1], outputs[0])]
    for c in cases:
        progress(f"  {c['case']}: max |dlogits| {c['max_abs_dlogits']:.3g} (tol {c['tol_logits']:.3g})")
        if not c["ok"]:
            raise SpotError(f"the upgraded target graph differs from the old one: {c['case']}: logits "
                            f"{c['max_abs_dlogits']:.4g} (tolerance {c['tol_logits']:.4g}), K {c['max_abs_dk']:.4g}, "
                            f"V {c['max_abs_dv']:.4g}; {exported.folder} is unchanged",
                            "export the folder again with spot-export, and please report these numbers")
    return {"reference": "the folder's format 1 target graph", "runtime": f"onnxruntime {ort.__version__} "
            "CPUExecutionProvider", "layers": layers, "of_layers": exported.config.num_hidden_layers, "cases": cases}


def _same_graphs(old: Manifest, new: Manifest) -> bool:
    """The upgrade rebuilt what the folder holds: the same files (sha256), graph records (validation aside) and
    memory record."""
    def records(m: Manifest) -> dict:
        return {name: {k: v for k, v in entry.items() if k != "validation"}
                for name, entry in m.graphs.to_json().items()}
    return old.files == new.files and records(old) == records(new) and old.memory == new.memory


def _replanned(manifest: Manifest, cfg, options: ExportOptions) -> dict | None:
    """The memory plan recorded at export (--plan), recomputed as spot-export computes it for `options` (the
    upgrade's epilogue) with the export's weights, device and context; SpotError when it no longer fits."""
    recorded = manifest.recorded_plan
    if not recorded:
        return None
    quant = _quant(manifest)
    options = replace(options, plan=recorded["device"], weights=quant.weights, int4_block=quant.int4_block,
                      matmulnbits=quant.matmulnbits)
    name = manifest.model_name
    plan = plan_for_options(cfg, options, int(recorded["context"]), name)
    if not plan.fits:
        raise SpotError(f"the upgraded {name} would not fit {plan.device.name}, the device of its memory plan: "
                        f"{plan.total / GIB:.2f} GiB of {plan.device.memory_gib:g} GiB at {plan.context} tokens and "
                        f"{plan.nodes} nodes (sampling epilogue "
                        f"{plan.activations.get('sampling_epilogue', 0) / 2**20:.1f} MiB)",
                        "lower --epilogue-positions or --epilogue-steps (0: no epilogue; decode with --sampler host)")
    return plan_record(plan, cfg.block_size)


def _refresh_memory_terms(manifest: Manifest, cfg, dtype: str, epilogue: EpilogueCall | None,
                          plan: dict | None) -> Manifest:
    """The manifest with its verify-pass memory terms, and the plan recorded at export (if any), for the new
    epilogue."""
    memory = manifest.memory
    if not memory or "verify_pass_terms" not in memory:
        return manifest
    memory = dict(memory)
    if plan is not None:
        memory["plan"] = plan
    terms = verify_pass_bytes(cfg, dtype, manifest.max_nodes, manifest.max_context, manifest.quantized, epilogue)
    memory["verify_pass_terms"] = terms
    memory["verify_pass_bytes_at_max_nodes_and_context"] = sum(terms.values())
    return manifest.set(memory=memory)
