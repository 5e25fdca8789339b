"""A model as a command names it: `--model NAME|FOLDER` and `--backend` resolved to a folder and a backend, the folder
checked before anything loads from it, its drafter found, its engine and tokenizer opened.

A folder with manifest.json is an export (ONNX Runtime, TensorRT), one with config.json a checkpoint (torch); an
embedded model's name (spot.assets) is its checkpoint, or for an exported backend `spot demo`'s export of it.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Callable

import spot.config
from spot.engines.factory import EXPORTED_BACKENDS, open_engine
from spot.errors import SpotError
from spot.folder.manifest import DRAFTER_FILES, load_manifest


def _quiet(line: str) -> None:
    pass


def check_model_folder(backend: str, folder) -> None:
    """The model folder's errors before anything loads from it: an exported folder (ort) by its manifest — a
    missing or edited config.json there is a changed export, not a broken checkpoint — a checkpoint by config.json."""
    if backend in EXPORTED_BACKENDS:
        load_manifest(folder)
    else:
        spot.config.load_config(folder)   # by its module: the tests replace it there


def resolve_backend(backend: str | None, model_dir) -> str:
    """--backend, else what --model is: an exported folder (manifest.json) runs on ort, a checkpoint on torch; an
    embedded model (no --model, or its name) runs on ONNX Runtime, the product runtime, wherever onnxruntime is
    installed (spot demo's export of it), else on torch."""
    # start-up: spot.cli loads this module; the embedded models when one is named
    from spot.assets import embedded_name
    if backend is not None:
        return backend
    if model_dir is not None and embedded_name(model_dir) is None:
        return "ort" if (Path(model_dir) / "manifest.json").is_file() else "torch"
    return "ort" if importlib.util.find_spec("onnxruntime") is not None else "torch"


def model_folder(backend: str, model_dir, progress: Callable[[str], None] = _quiet,
                 warn: Callable[[str], None] = _quiet):
    """--model: a folder, or an embedded model's name (spot.assets: code, arithmetic) — its checkpoint (torch) or
    its export by `spot demo` (ort, tensorrt), made here on first use (progress: one line, seconds) and reused. No
    --model: the default embedded model. warn: the line saying an older export is used where none can be made."""
    # start-up: spot.cli loads this module; the embedded models when one is named
    from spot.assets import DEFAULT_MODEL, embedded_model_dir, embedded_name
    name = DEFAULT_MODEL if model_dir is None else embedded_name(model_dir)
    if name is None:
        return model_dir
    if backend not in EXPORTED_BACKENDS:
        return embedded_model_dir(name)
    # start-up: spot.cli loads this module; the demo's export when it is used
    from spot.app.demo import embedded_export_dir, exported_embedded
    folder = embedded_export_dir(name)
    try:
        return exported_embedded(progress, name)
    except ModuleNotFoundError as e:        # no export extra here: a copied or older export still decodes
        if e.name not in ("torch", "onnx", "safetensors") or not (folder / "manifest.json").is_file():
            raise
        warn(f"note: {folder} was exported from another version of spot or of its embedded model; "
             f"exporting it again needs the {e.name} package (pip install 'spot-edge[export]')")
        return folder


def open_model(backend: str, model_dir, block_size, device: str, sampler: str = "auto", kv_cache: str = "auto",
               progress: Callable[[str], None] = _quiet, warn: Callable[[str], None] = _quiet):
    """(engine, tokenizer or None, folder) of --model on the backend (model_folder resolves it)."""
    # start-up: spot.cli loads this module; the tokenizer when a model opens
    from spot.tokenizer import load_tokenizer
    folder = model_folder(backend, model_dir, progress, warn)
    return open_engine(backend, folder, block_size, device, sampler, kv_cache), load_tokenizer(folder), folder


def find_drafter(path, model_dir):
    """The drafter given by --drafter, else drafter.onnx beside the model; SpotError naming where it looked."""
    # start-up: spot.cli loads this module; the drafter loads when one is used
    from spot.runtime.drafter import load_drafter
    if path is not None:
        return load_drafter(path)
    here = Path(model_dir) / "drafter.onnx"
    if here.is_file():
        return load_drafter(here)
    raise SpotError(f"no drafter given and none found at {here}",
                    "pass --drafter PATH (train one with `spot train-drafter`), or use --decoder chain/tree")


def drafter_file(path, model_dir) -> Path | None:
    """The drafter.onnx a server loads per engine: --drafter's (checked now by loading it), else the one beside the
    model, else None (requests for spot / spot-sets are then refused)."""
    if path is not None:
        return find_drafter(path, model_dir).path
    here = Path(model_dir) / "drafter.onnx"
    return here if here.is_file() else None


def verify_export(folder, quick: bool = False) -> tuple[int, int, bool]:
    """Every file of an exported folder checked against its manifest (full sha256, or sizes and sampled hashes when
    quick), and its drafter pair, if any, against its drafter.json and the model. Returns (files, bytes, whether a
    drafter was checked); SpotError naming the first mismatch."""
    # start-up: spot.cli loads this module; the drafter loads when one is used
    from spot.runtime.drafter import DRAFTER_ONNX, load_drafter

    exported = load_manifest(folder, "quick" if quick else "full")
    files = {n: rec for n, rec in exported.manifest.files.items() if n not in DRAFTER_FILES}
    total = sum(rec.bytes for rec in files.values())
    if "drafter" in exported.manifest.graphs and not (Path(folder) / DRAFTER_ONNX).is_file():
        raise SpotError(f"{folder} was exported with a drafter, and {DRAFTER_ONNX} is missing",
                        "copy drafter.onnx and drafter.json back, or train one with `spot traces` + "
                        "`spot train-drafter`")
    if not (Path(folder) / DRAFTER_ONNX).is_file():
        return len(files), total, False
    pair = load_drafter(folder)      # the drafter pair vouches for itself (drafter.json)
    try:
        pair.check_compatible(exported)      # (block_size and config, as an engine has)
    except SpotError as e:
        raise SpotError(e.message, f"train a drafter for this export (`spot traces --model {folder} --backend "
                                   "ort` + `spot train-drafter`), or remove drafter.onnx and drafter.json") from None
    return len(files), total, True
