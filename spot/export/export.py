"""`spot-export`: stream an SDAR checkpoint into an exported folder (target.onnx + one external data file +
tokenizer files + manifest.json), validate it against the torch reference, and publish it atomically.

Memory: weights are converted and written chunk by chunk (CHUNK_ELEMS elements at a time, read with pread, written
with pwrite), so peak memory is a few chunks plus the graph proto, not the model. The output appears only when
everything succeeded: it is built in a hidden sibling folder and renamed into place at the end.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from spot import __version__
from spot.checkpoint import INDEX_NAME, Checkpoint, TensorInfo, bf16_bits_to_float32, read_weight_map
from spot.config import ModelConfig
from spot.descriptors import read_json
from spot.errors import SpotError
from spot.export import quantize
from spot.export.epilogue_graph import validate_epilogue, write_epilogue
from spot.export.graph import TargetGraph, build_target_graph, check_dtype
from spot.export.kv_append_graph import validate_kv_append, write_kv_append
from spot.export.memory_plan import check_plan_fits, manifest_memory
from spot.export.options import ExportOptions, Progress, check_options, effective_config, quiet
from spot.export.presets import Source
from spot.export.quantize import ORT_SESSION_CONFIG, write_quantized
from spot.export.target_file import DATA_FILE, TARGET_FILE, check_graph, make_model, plan_layout
from spot.export.validate import validate_export
from spot.export.weight_spec import WeightSpec
from spot.files import folder_bytes, present
from spot.folder.manifest import DRAFTER_FILES, FORMAT, FORMAT_VERSION, NP_DTYPES, file_entry, io_contract
from spot.folder.manifest_record import ABSENT, EpilogueGraph, FileRecord, GraphRecord, Graphs, Manifest, TargetGraph
from spot.folder.replaceable import check_replaceable
from spot.folder.trt_profile import dynamic_trt_profile
from spot.replace import building, output_folder, owner_gone, publish_folder, replaceable
from spot.tokenizer import load_tokenizer

EXPORTER_REVISION = 1
CHUNK_ELEMS = 4 * 1024 * 1024    # elements converted per chunk (16 MiB as float32)
COPIED_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "special_tokens_map.json",
                "added_tokens.json", "chat_template.jinja", "generation_config.json",
                "drafter.onnx", "drafter.json",   # a drafter shipped beside the checkpoint travels with it
                "heldout_prompts.jsonl")          # and its held-out prompts (spot bench's default prompt set)
PROMPTS_FILE = "heldout_prompts.jsonl"
_SRC_NP = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}

# -- streaming weights ---------------------------------------------------------------------------------------------
def _read_rows(fd: int, info: TensorInfo, r0: int, r1: int) -> np.ndarray:
    """Rows r0..r1 of a checkpoint tensor as float32 (pread: nothing memory-mapped stays resident)."""
    row = int(np.prod(info.shape[1:], dtype=np.int64)) if len(info.shape) > 1 else 1
    itemsize = np.dtype(_SRC_NP[info.dtype]).itemsize
    want = (r1 - r0) * row * itemsize
    raw = os.pread(fd, want, info.offset + r0 * row * itemsize)
    if len(raw) != want:
        raise SpotError(f"{info.file} is truncated inside tensor {info.name}", "fetch the file again")
    arr = np.frombuffer(raw, dtype=_SRC_NP[info.dtype])
    arr = bf16_bits_to_float32(arr) if info.dtype == "BF16" else arr.astype(np.float32)
    return arr.reshape((r1 - r0, *info.shape[1:]) if info.shape else ())


def _convert(block: np.ndarray, spec: WeightSpec, source_finite: bool) -> np.ndarray:
    with np.errstate(over="ignore"):   # overflow is reported below, naming the tensor
        out = block.astype(NP_DTYPES[spec.dtype])
    if not np.isfinite(out).all():
        if source_finite and np.isfinite(block).all():
            raise SpotError(f"tensor {spec.source} has values beyond the {spec.dtype} range (max |x| = "
                            f"{np.abs(block).max():.4g})", "export with --dtype fp32")
        raise SpotError(f"tensor {spec.source} holds non-finite values", "the checkpoint is corrupt: fetch it again")
    return out


def write_weight(fd_out: int, offset: int, spec: WeightSpec, info: TensorInfo,
                 chunk_elems: int | None = None) -> None:
    """Convert one checkpoint tensor to `spec` and write it at `offset`, CHUNK_ELEMS (or `chunk_elems`) elements at
    a time.

    Transposed specs ([O,I] on disk -> [I,O] in the graph): each chunk of source rows o0..o1 becomes a column
    slab of the output, written as I short runs (one pwrite per output row) so no full tensor is ever in memory.
    """
    itemsize = np.dtype(NP_DTYPES[spec.dtype]).itemsize
    with open(info.file, "rb") as f:
        fd_in = f.fileno()
        if len(info.shape) < 2:
            os.pwrite(fd_out, _convert(_read_rows(fd_in, info, 0, info.shape[0] if info.shape else 1), spec,
                                       True).tobytes(), offset)
            return
        rows, cols = info.shape[0], int(np.prod(info.shape[1:], dtype=np.int64))
        step = max(1, (chunk_elems or CHUNK_ELEMS) // cols)
        for r0 in range(0, rows, step):
            r1 = min(rows, r0 + step)
            block = _convert(_read_rows(fd_in, info, r0, r1), spec, True)
            if not spec.transpose:
                os.pwrite(fd_out, block.tobytes(), offset + r0 * cols * itemsize)
                continue
            slab = np.ascontiguousarray(block.T)          # [cols, r1-r0]
            for i in range(cols):
                os.pwrite(fd_out, memoryview(slab[i]), offset + (i * rows + r0) * itemsize)


def write_weights(ckpt: Checkpoint, weights: list[WeightSpec], layout: dict[str, tuple[int, int]], total: int,
                  path: Path, progress: Progress) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    # a quantized export (made for memory-tight targets, possibly on the device itself) writes its fp tensors
    # (embedding, lm_head) in the quantizer's smaller chunks too, so its peak stays below the fp16 export's
    chunk = quantize.CHUNK_ELEMS if any(w.quant is not None for w in weights) else None
    try:
        t0 = time.perf_counter()
        for i, spec in enumerate(weights, 1):
            info = ckpt.tensors[spec.source]
            expected = spec.source_shape
            if info.shape != expected:
                raise SpotError(f"tensor {spec.source} has shape {list(info.shape)}, the graph needs "
                                f"{list(expected)}", "the checkpoint does not match its config.json")
            offset, nbytes = layout[spec.name]
            if spec.quant is None:
                write_weight(fd, offset, spec, info, chunk)
            elif spec.quant.role == "q":       # its scale tensor is written from the same source rows
                scale = next(w for w in weights if w.name == spec.quant.partner)
                with open(info.file, "rb") as f:
                    write_quantized(fd, spec, scale, offset, layout[scale.name][0],
                                    lambda r0, r1, fd_in=f.fileno(), info=info: _read_rows(fd_in, info, r0, r1))
            # one bar, not a line per tensor ("\r": an update of the line before; Progress)
            progress(f"\r  weights: tensor {i}/{len(weights)} {spec.name} {list(spec.shape)} {spec.dtype} "
                     f"{nbytes / 2**20:.1f} MiB ({time.perf_counter() - t0:.0f} s)")
        os.ftruncate(fd, total)
        os.fsync(fd)
        progress(f"  weights: {len(weights)} tensors, {total / 2**20:.1f} MiB in {time.perf_counter() - t0:.0f} s")
    finally:
        os.close(fd)


# -- folder --------------------------------------------------------------------------------------------------------
def drafter_fits(ckpt_dir: Path, block_size: int, progress: Progress) -> bool:
    """Whether the drafter shipped beside the checkpoint (if any) was trained for the exported block size: one
    that was not is left out of the export (it could only be refused there), with a note."""
    descriptor = ckpt_dir / "drafter.json"
    try:
        trained = read_json(descriptor, "").get("block_size")
    except (OSError, SpotError, AttributeError):
        return True         # none, or unreadable: copied as it is, and refused by name where it is loaded
    if trained is None or trained == block_size:
        return True
    progress(f"note: the checkpoint's drafter was trained for blocks of {trained}, this export decodes blocks of "
             f"{block_size}: not copied (spot traces + spot train-drafter make one for it)")
    return False


def _hf_config_json(ckpt_dir: Path, cfg: ModelConfig) -> str:
    """The checkpoint's config.json with the exported block size / mask id, so HF-style tools read the folder."""
    raw = read_json(ckpt_dir / "config.json", "restore the file from the checkpoint")
    raw.update({"block_size": cfg.block_size, "mask_token_id": cfg.mask_token_id})
    return json.dumps(raw, indent=2) + "\n"


def note_other_partials(out: Path, progress=lambda _: None) -> None:
    """Name the partial folders a killed export to another name (retried as another --out) left beside `out`: they
    may be someone else's, so they are named, not removed (those of `out` itself: spot.replace.recover_beside)."""
    for left in out.parent.glob(".*.partial-*"):
        try:        # another user's folder may not be readable: never a reason to stop this export
            if owner_gone(left) and left.is_dir() and not left.is_symlink() and (left / DATA_FILE).is_file():
                progress(f"note: {left} ({folder_bytes(left) / 2**30:.2f} GiB) was left by a killed spot-export of "
                         "another --out; delete it to free the space")
        except OSError:
            continue


def build_manifest(cfg: ModelConfig, options: ExportOptions, max_context: int, source: Source, ckpt: Checkpoint,
                   copied: list[str], validation: dict | None, opset: int, graphs: dict[str, GraphRecord],
                   files: dict[str, FileRecord], created: str) -> Manifest:
    """The export's manifest: the model, the decoding defaults, the graphs (the target's, the drafter's when one was
    copied, then `graphs`: the epilogue, kv_append), the files and their hashes, the weights' precision and scheme
    (docs/quantization.md), the memory numbers (spot.export.memory_plan) and, quantized, the ORT session config."""
    quant = options.quant
    target = TargetGraph(file=TARGET_FILE, data=DATA_FILE, **io_contract(cfg, options.dtype),
                         weights_layout=quant.layout_note() if quant.quantized else
                         "linear weights stored transposed [in, out] for MatMul; norm weights float32; embed [V, H]",
                         tensorrt_profile=dynamic_trt_profile(cfg, options.max_nodes, max_context).to_dict(),
                         ort_only=quant.matmulnbits if quant.quantized else ABSENT)
    drafter = {"drafter": GraphRecord(file="drafter.onnx", extra={"manifest": "drafter.json"})} \
        if "drafter.onnx" in copied else {}
    return Manifest(
        format=FORMAT, format_version=FORMAT_VERSION,
        exporter={"name": "spot-export", "version": __version__, "revision": EXPORTER_REVISION},
        created=created,
        source={"checkpoint": str(Path(ckpt.dir).resolve()), "preset": source.preset,
                "storage_dtype": ckpt.storage_dtype},
        model=cfg.to_dict(), block_size=cfg.block_size, mask_token_id=cfg.mask_token_id, stop_ids=tuple(cfg.stop_ids),
        dtype=options.dtype, opset=opset, max_nodes=options.max_nodes, max_context=max_context,
        graphs=Graphs({"target": target, **drafter, **graphs}),
        tokenizer_files=[n for n in copied if not n.startswith("drafter.") and n != PROMPTS_FILE],
        validation=validation, files=files,
        weights=quant.describe(options.dtype), ort_only=quant.matmulnbits,
        memory=manifest_memory(cfg, options, max_context),
        ort_session_config=dict(ORT_SESSION_CONFIG) if quant.quantized else ABSENT)


def export_checkpoint(source: Source, out: str | Path, options: ExportOptions = ExportOptions(),
                      progress: Progress = quiet) -> Path:
    """Export `source` into the folder `out`; nothing appears at `out` unless every step succeeds."""
    if source.checkpoint is None:
        raise SpotError(f"no checkpoint folder for {source.preset}", "pass --checkpoint DIR")
    out = output_folder(out, "--out")
    source_dir = Path(source.checkpoint).resolve()
    if out.resolve() == source_dir or out.resolve() in source_dir.parents:
        raise SpotError(f"--out {out} is the checkpoint folder {source.checkpoint} or holds it: replacing it would "
                        "delete the checkpoint", "choose another --out")
    owned = replaceable(options.overwrite, check_replaceable, "choose another --out")
    if present(out):
        owned(out)      # before the work, not after it
    check_dtype(options.dtype)
    cfg = effective_config(source.checkpoint_config(), source, options, progress)
    max_context = check_options(cfg, options)
    ckpt = Checkpoint(source.checkpoint, cfg)
    load_tokenizer(ckpt.dir)     # the tokenizer files the export copies must load: refused now, not at generate time
    graph = build_target_graph(cfg, options.dtype, options.opset, options.quant)
    if options.plan:   # refuse before writing anything when the export would not fit the device
        check_plan_fits(cfg, options, max_context, progress, source.preset or source.default_name)
    layout, total = plan_layout(graph.weights)
    note_other_partials(out, progress)
    with building(out) as tmp:
        progress(f"exporting {ckpt.dir} -> {out} ({options.dtype}{options.quant.summary()}, opset {graph.opset}, "
                 f"{len(graph.nodes)} nodes, {len(graph.weights)} tensors, {total / 2**30:.2f} GiB)")
        write_weights(ckpt, graph.weights, layout, total, tmp / DATA_FILE, progress)
        (tmp / TARGET_FILE).write_bytes(make_model(graph, layout).SerializeToString())
        check_graph(tmp / TARGET_FILE)
        copied = [n for n in COPIED_FILES if (ckpt.dir / n).is_file()]
        if not drafter_fits(ckpt.dir, cfg.block_size, progress):
            copied = [n for n in copied if n not in DRAFTER_FILES]
        for name in copied:
            shutil.copyfile(ckpt.dir / name, tmp / name)
        (tmp / "config.json").write_text(_hf_config_json(ckpt.dir, cfg))
        extra_graphs, extra_files = {}, []
        depth = options.epilogue_depth(cfg.block_size)
        if depth:
            progress(f"sampling epilogue graph (D = {depth} future steps)")
            name, entry = write_epilogue(tmp, cfg.vocab_size, cfg.block_size, depth,
                                         positions=options.epilogue_call(cfg).positions)
            epilogue = EpilogueGraph.from_json(entry)
            if options.validate:
                epilogue = epilogue.set(validation=validate_epilogue(tmp, cfg.vocab_size, cfg.block_size, depth))
            extra_graphs["epilogue"], extra_files = epilogue, [name]
        # the device KV cache's append (spot.engines.device_kv): tiny, written for every export
        name, entry = write_kv_append(tmp, cfg.num_key_value_heads, cfg.head_dim, options.dtype)
        extra_graphs["kv_append"] = GraphRecord.from_json(entry).set(
            validation=validate_kv_append(tmp, cfg.num_key_value_heads, cfg.head_dim, options.dtype))
        extra_files = [*extra_files, name]
        validation = None
        if options.validate:
            validation = validate_export(tmp, ckpt, graph, layout, options, progress)
        created = datetime.now(timezone.utc).isoformat(timespec="seconds")
        progress("hashing files")
        hashed = [TARGET_FILE, DATA_FILE, "config.json", *extra_files,
                  *(n for n in copied if n not in DRAFTER_FILES)]       # (drafter.json vouches for the drafter)
        files = {n: file_entry(tmp / n) for n in hashed}
        build_manifest(cfg, options, max_context, source, ckpt, copied, validation, graph.opset, extra_graphs, files,
                       created).write(tmp)
        publish_folder(tmp, out, owned)     # checked again: it may have changed during the export
    progress(f"done: {out}")
    return out


# -- dry run -------------------------------------------------------------------------------------------------------
def _index_names(ckpt_dir: Path) -> set[str] | None:
    index = ckpt_dir / INDEX_NAME
    if not index.is_file():
        return None
    return set(read_weight_map(index))


def dry_run(source: Source, options: ExportOptions = ExportOptions(), progress: Progress = quiet) -> dict:
    """Build and check the graph of the real config without weights: onnx.checker with strict shape inference
    on a proto whose weights are external references (nothing is written)."""
    t0 = time.perf_counter()
    check_dtype(options.dtype)
    if source.checkpoint is not None:
        cfg, where = source.checkpoint_config(), str(source.checkpoint)
    else:
        cfg, where = source.builtin_config, f"built-in config of {source.preset} (no local checkpoint)"
    cfg = effective_config(cfg, source, options, progress)
    max_context = check_options(cfg, options)
    graph = build_target_graph(cfg, options.dtype, options.opset, options.quant)
    names = _index_names(source.checkpoint) if source.checkpoint is not None else None
    if names is not None:
        missing = sorted({w.source for w in graph.weights} - names)
        if missing:
            raise SpotError(f"{INDEX_NAME} in {source.checkpoint} lacks {len(missing)} tensor(s) the graph needs, "
                            f"e.g. {missing[0]}", "the checkpoint does not match its config.json")
    layout, total = plan_layout(graph.weights)
    model = make_model(graph, layout)
    with tempfile.TemporaryDirectory(prefix="spot-dry-run-") as scratch:
        # the checker wants the data file to exist: an empty sparse stand-in of the planned size, no bytes written
        with open(Path(scratch) / DATA_FILE, "wb") as f:
            f.truncate(total)
        (Path(scratch) / TARGET_FILE).write_bytes(model.SerializeToString())
        check_graph(Path(scratch) / TARGET_FILE)
    seconds = time.perf_counter() - t0
    report = {"config": where, "layers": cfg.num_hidden_layers, "dtype": options.dtype, "opset": graph.opset,
              "weight_precision": options.weights,
              "nodes": len(graph.nodes), "weights": len(graph.weights), "weight_bytes": total,
              "graph_bytes": model.ByteSize(), "block_size": cfg.block_size, "max_context": max_context,
              "index_checked": names is not None, "seconds": round(seconds, 2)}
    progress(f"dry run: {report['nodes']} nodes, {report['weights']} weight tensors ({total / 2**30:.2f} GiB "
             f"{options.dtype}), graph proto {report['graph_bytes'] / 2**20:.2f} MiB, onnx.checker + strict shape "
             f"inference passed in {seconds:.1f} s ({where})")
    return report
