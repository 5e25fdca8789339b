"""`spot triton-repo EXPORT --out REPO`: a Triton model repository that serves an exported folder with the spot runtime.

    REPO/                        a Triton model repository: its other models are left as they are
      NAME/config.pbtxt          Python backend, decoupled (a response per finished block), `engines` engines per
                                 instance over one copy of the weights; the requests' defaults and the engine options
                                 as parameters — edit them to tune
      NAME/1/model.py            imports spot.triton.backend (the spot installed beside tritonserver decodes)
      NAME/1/export/             the exported folder, hard-linked where the file system allows, else copied
                                 (--reference: left where it is, named by its absolute path)
      NAME/.spot-triton-model    what wrote the model folder (spot's version, the export's manifest hash) and the
                                 sha256 of each file it wrote: --overwrite replaces only a model folder whose files
                                 are all vouched for by it (the export by its own manifest), never an edited one

The model folder is built beside NAME, in REPO, and swapped in (spot.replace): a failed or interrupted run leaves
NAME as it was.
"""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from spot import __version__
from spot.descriptors import read_json, sha256_file
from spot.engines.factory import EXPORTED_BACKENDS
from spot.errors import SpotError
from spot.files import check_output_path, present
from spot.folder.manifest import load_manifest
from spot.folder.replaceable import check_replaceable, sort_export
from spot.owned import recorded_file_matches, refuse_unproven, some
from spot.replace import building, output_folder, publish_folder, replaceable
from spot.serve.model import manifest_sha256

MARKER = ".spot-triton-model"
MODEL_PY = '''"""Triton Python-backend model written by `spot triton-repo`: the spot runtime on ./export
(spot.triton.backend). It needs spot (its wheel, docs/deployment.md) in the Python environment of Triton's Python
backend."""
from spot.triton.backend import TritonPythonModel  # noqa: F401
'''

# name, Triton data type, dims: the optional inputs besides the prompt (spot.triton.backend.FIELD_INPUTS). FP64, not
# FP32: a temperature of 0.7 must reach the sampler as the same double `spot generate --temperature 0.7` uses
INPUTS = (("text_input", "TYPE_STRING", "[ 1 ]"), ("prompt_ids", "TYPE_INT64", "[ -1 ]"),
          ("max_tokens", "TYPE_INT32", "[ 1 ]"), ("temperature", "TYPE_FP64", "[ 1 ]"), ("top_p", "TYPE_FP64", "[ 1 ]"),
          ("top_k", "TYPE_INT32", "[ 1 ]"), ("seed", "TYPE_INT64", "[ 1 ]"), ("decoder", "TYPE_STRING", "[ 1 ]"),
          ("budget", "TYPE_STRING", "[ 1 ]"), ("depth", "TYPE_INT32", "[ 1 ]"), ("mode", "TYPE_STRING", "[ 1 ]"),
          ("tau", "TYPE_FP64", "[ 1 ]"))
OUTPUTS = (("text_output", "TYPE_STRING", "[ 1 ]"), ("token_ids", "TYPE_INT64", "[ -1 ]"),
           ("finish_reason", "TYPE_STRING", "[ 1 ]"), ("usage", "TYPE_STRING", "[ 1 ]"))


@dataclass(frozen=True)
class TritonRepoOptions:
    name: str = "spot"
    instances: int = 1              # Triton instances: processes, each holding the weights and `engines` engines
    backend: str = "ort"
    device: str = "cpu"
    sampler: str = "auto"
    kv_cache: str = "auto"
    threads: int | None = None      # ONNX Runtime threads per engine; None: the cores shared out
    decoder: str = "standard"
    budget: str = "16"
    depth: int | None = None
    mode: str = "static"
    tau: float = 0.9
    temperature: float = 1.0
    max_tokens: int = 16
    reference: bool = False         # name the export by its absolute path instead of putting it in the repository
    overwrite: bool = False
    engines: int = 1                # requests one instance decodes at once, over one copy of the weights

    def check(self) -> None:
        if not self.name or not all(c.isalnum() or c in "-_." for c in self.name) or self.name.startswith("."):
            raise SpotError(f"--name must be letters, digits, '-', '_' or '.', got {self.name!r}", "e.g. --name spot")
        if self.instances < 1:
            raise SpotError(f"--instances must be >= 1, got {self.instances}")
        if self.engines < 1:
            raise SpotError(f"--engines must be >= 1, got {self.engines}")
        if self.backend not in EXPORTED_BACKENDS:
            raise SpotError(f"a Triton repository serves an exported folder: --backend must be one of "
                            f"{', '.join(EXPORTED_BACKENDS)}, got {self.backend!r}")
        if self.max_tokens < 1:
            raise SpotError(f"--max-tokens must be >= 1, got {self.max_tokens}")


def config_pbtxt(options: TritonRepoOptions, export: str, version: str) -> str:
    """config.pbtxt for the model: decoupled Python backend, no batching, `instances` instances of `engines`
    engines."""
    def tensors(specs, optional: bool) -> str:
        return ",\n".join(f'  {{ name: "{n}" data_type: {t} dims: {d}{" optional: true" if optional else ""} }}'
                          for n, t, d in specs)
    params = {"export": export, "engines": str(options.engines), "backend": options.backend,
              "device": options.device, "sampler": options.sampler,
              "kv_cache": options.kv_cache, "threads": "" if options.threads is None else str(options.threads),
              "decoder": options.decoder, "budget": options.budget,
              "depth": "" if options.depth is None else str(options.depth), "mode": options.mode,
              "tau": repr(float(options.tau)), "temperature": repr(float(options.temperature)),
              "max_tokens": str(options.max_tokens)}
    kind = "KIND_CPU" if options.device == "cpu" else "KIND_MODEL"     # (spot picks the GPU: --device)
    return "\n".join([
        f"# Written by `spot triton-repo` (spot {version}). Tune it here:",
        "#   parameters engines: requests one instance decodes at once, each engine with its own KV cache and",
        "#     buffers over the instance's one copy of the weights (spot-export --plan DEVICE --engines N says",
        "#     what fits)",
        "#   instance_group count: instances, each a process that holds its own copy of the weights (count x the",
        "#     weights' memory) and `engines` engines: raise engines, not count, to decode more requests at once",
        "#   parameters: the engine (backend, device, sampler, kv_cache, threads: ONNX Runtime threads per engine,",
        "#     empty = the cores shared out) and the defaults of requests that leave an input out (decoder, budget,",
        "#     depth, mode, tau, temperature, max_tokens). Requests name their own with the inputs of the same names.",
        "#   The model is decoupled: one response per finished block, the last one with finish_reason and usage.",
        f'name: "{options.name}"',
        'backend: "python"',
        "max_batch_size: 0",
        "model_transaction_policy { decoupled: true }",
        "input [", tensors(INPUTS, True), "]",
        "output [", tensors(OUTPUTS, False), "]",
        f"instance_group [ {{ count: {options.instances} kind: {kind} }} ]",
        *(f'parameters: {{ key: "{k}" value: {{ string_value: {json.dumps(v)} }} }}' for k, v in params.items()),
        ""])


def link_or_copy(src: str, dst: str) -> str:
    """A hard link (no second copy of GBs of weights), or a copy across file systems."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
    return dst


def write_triton_repo(export: str | Path, out: str | Path, options: TritonRepoOptions,
                      progress=lambda line: None) -> Path:
    """Write the model folder `options.name` serving the exported folder `export` into the repository `out` (see
    the module's docstring). Returns the repository."""
    options.check()
    repo = check_output_path(out, "--out", folder=True)
    export = Path(export).resolve()
    exported = load_manifest(export)    # an exported folder whose files match its manifest, or a clear error
    model = output_folder(repo / options.name, "--out")
    inside = Path(os.path.realpath(repo))
    if model == export or model in export.parents or inside == export or export in inside.parents:
        raise SpotError(f"--out {out} is the exported folder {export}, inside it, or would hold it in the model "
                        f"folder {model}", "choose an --out outside the exported folder")
    owned = replaceable(options.overwrite, check_model_replaceable, "choose another --name")
    if present(model):
        owned(model)                # before the work, not after it
    with building(model) as tmp:
        version_dir = tmp / "1"
        version_dir.mkdir()
        if options.reference:
            where = str(export)
        else:
            progress(f"linking (or copying) {export} into the repository")
            (version_dir / "export").mkdir()
            for name in sort_export(export, exported.manifest.files)[0]:     # the export's own files, not others there
                link_or_copy(export / name, version_dir / "export" / name)
            where = "export"
        written = {"config.pbtxt": config_pbtxt(options, where, __version__), "1/model.py": MODEL_PY}
        for name, text in written.items():
            (tmp / name).write_text(text)
        (tmp / MARKER).write_text(json.dumps({
            "spot": __version__, "export": str(export), "manifest_sha256": manifest_sha256(export),
            "files": {name: sha256_file(tmp / name) for name in written}}, indent=2) + "\n")
        publish_folder(tmp, model, owned)       # checked again: it may have changed meanwhile
    return repo


def check_model_replaceable(model: Path) -> None:
    """SpotError unless `model` is empty or a model folder spot triton-repo wrote, every file in it vouched for by
    its marker's sha256 (the export in 1/export by its manifest: spot.export.export.check_replaceable): another
    model of the repository, or a config.pbtxt tuned by hand, is not replaced."""
    hint = f"--overwrite replaces only a model folder spot triton-repo wrote: move those out of {model}, or " \
           "choose another --name"
    if not model.is_dir():
        raise SpotError(f"{model} is a file, expected a model folder", "choose another --out or --name")
    names = sorted(p.name for p in model.iterdir())
    if not names:
        return
    if not (model / MARKER).is_file():
        raise SpotError(f"{model} is not a model folder spot triton-repo wrote (no {MARKER}; it holds "
                        f"{some(names)})", hint)
    record = read_json(model / MARKER, hint)
    files = record.get("files") if isinstance(record, dict) else None
    if not isinstance(files, dict):
        raise SpotError(f"{model / MARKER} lists no files, expected the ones spot triton-repo wrote", hint)
    export = model / "1" / "export"
    if export.is_dir() and not export.is_symlink():
        check_replaceable(export, "the model's export")
    recorded_dirs = {p.as_posix() for f in files for p in PurePosixPath(f).parents if p.as_posix() != "."}
    unproven = []
    for path in entries(model, skip=export):
        rel = path.relative_to(model).as_posix()
        if path.is_dir() and not path.is_symlink():
            vouched = rel in recorded_dirs
        else:
            vouched = rel == MARKER or recorded_file_matches(path, files.get(rel))
        if not vouched:
            unproven.append(rel)
    refuse_unproven(model, "the model folder", unproven, hint)


def entries(folder: Path, skip: Path) -> list[Path]:
    """Every folder, file and link below `folder` (links not followed), `skip` and what it holds left out."""
    found = []
    for top, dirs, files in os.walk(folder):
        here = Path(top)
        dirs[:] = [d for d in dirs if here / d != skip]
        found += [here / name for name in dirs + files]
    return sorted(found)
