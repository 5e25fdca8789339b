"""`spot triton-repo EXPORT --out REPO`: a Triton model repository that serves an exported folder with the spot runtime.

    REPO/
      .spot-triton-repo          what wrote it (spot's version, the export's manifest hash): --overwrite replaces
                                 only a folder that has it
      NAME/config.pbtxt          Python backend, decoupled (a response per finished block), `engines` engines per
                                 instance over one copy of the weights; the requests' defaults and the engine options
                                 as parameters — edit them to tune
      NAME/1/model.py            imports spot.triton.backend (the spot installed beside tritonserver decodes)
      NAME/1/export/             the exported folder, hard-linked where the file system allows, else copied
                                 (--reference: left where it is, named by its absolute path)

The repository is built beside REPO and renamed into place: a failed or interrupted run leaves nothing at REPO.
"""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from spot.errors import SpotError
from spot.files import beside, remove_stale_beside, remove_tree, swap_in_folder

MARKER = ".spot-triton-repo"
MODEL_PY = '''"""Triton Python-backend model written by `spot triton-repo`: the spot runtime on ./export
(spot.triton.backend). It needs spot (pip install spot-edge) in the Python environment of Triton's Python backend."""
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
        from spot.engines.factory import EXPORTED_BACKENDS
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
    """Write the repository for the exported folder `export` at `out` (see the module's docstring)."""
    from spot import __version__
    from spot.folder.manifest import load_manifest
    from spot.serve.model import manifest_sha256
    options.check()
    export, out = Path(export).resolve(), Path(out)
    load_manifest(export)           # an exported folder whose files match its manifest, or a clear error
    if out.exists() and not (out / MARKER).is_file():
        raise SpotError(f"{out} exists and is not a repository spot triton-repo wrote",
                        "choose another --out (spot replaces only its own repositories, with --overwrite)")
    if out.exists() and not options.overwrite:
        raise SpotError(f"{out} already exists", "pass --overwrite to replace it, or choose another --out")
    if out.resolve() == export or out.resolve() in export.parents:
        raise SpotError(f"--out {out} is the exported folder or holds it", "choose another --out")
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_beside(out)
    tmp = beside(out, "partial")
    remove_tree(tmp)
    try:
        version_dir = tmp / options.name / "1"
        version_dir.mkdir(parents=True)
        if options.reference:
            where = str(export)
        else:
            progress(f"linking (or copying) {export} into the repository")
            shutil.copytree(export, version_dir / "export", copy_function=link_or_copy)
            where = "export"
        (version_dir / "model.py").write_text(MODEL_PY)
        (tmp / options.name / "config.pbtxt").write_text(config_pbtxt(options, where, __version__))
        (tmp / MARKER).write_text(json.dumps({"spot": __version__, "export": str(export),
                                              "manifest_sha256": manifest_sha256(export)}) + "\n")
        if out.exists():
            swap_in_folder(tmp, out, beside(out, "old"))
        else:
            tmp.rename(out)
    except BaseException:
        remove_tree(tmp)
        raise
    return out
