"""The model a server decodes with: its folder and engine options, its tokenizer (and chat template), the defaults of
the requests that leave a field out, and its engines (one per concurrent request, over one copy of the weights)."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from spot.descriptors import sha256_file
from spot.engines.factory import open_engines
from spot.errors import SpotError
from spot.runtime.drafter import load_drafter
from spot.tokenizer import SpotTokenizer, load_tokenizer


@dataclass(frozen=True)
class RequestDefaults:
    """What a request that leaves a spot field out decodes with (`spot serve --decoder / --budget / ...`)."""

    decoder: str = "standard"
    budget: str = "16"
    depth: int | None = None
    mode: str = "static"
    tau: float = 0.9
    temperature: float = 1.0         # OpenAI's default
    top_p: float = 1.0


@dataclass(frozen=True)
class ServedModel:
    """An opened model: `folder` as resolved by the CLI (spot.app.models.model_folder), `model_arg` / `drafter_arg` as the
    user gave them (None: the defaults), for the `spot tune` command a missing tuned budget names."""

    name: str
    folder: Path
    backend: str
    device: str = "cpu"
    sampler: str = "auto"
    kv_cache: str = "auto"
    block_size: int | None = None
    model_arg: str | None = None
    drafter_arg: str | None = None
    defaults: RequestDefaults = RequestDefaults()
    tokenizer: object = None        # spot.tokenizer.SpotTokenizer, or None: token ids only
    drafter_path: Path | None = None    # the drafter every engine loads, or None: spot / spot-sets refused
    manifest_sha256: str | None = None  # sha256 of the export's manifest.json (None: a checkpoint folder)

    def open_engine(self, threads: int | None):
        """One engine over this model, and its drafter (None where there is none)."""
        return self.open_engines(1, threads)[0]

    def open_engines(self, count: int, threads: int | None) -> list[tuple]:
        """`count` (engine, drafter) pairs over one copy of the weights (spot.engines.factory.open_engines): each
        engine has its own KV cache, and the drafter (stateless: a session and its settings) is shared too.
        threads: each engine's ONNX Runtime threads (ort)."""
        engines = open_engines(self.backend, self.folder, count, self.block_size, self.device, self.sampler,
                               self.kv_cache, threads=threads if self.backend == "ort" else None)
        drafter = None
        if self.drafter_path is not None:
            drafter = load_drafter(self.drafter_path, threads=1)
            drafter.check_compatible(engines[0])
        return [(engine, drafter) for engine in engines]


def manifest_sha256(folder: Path) -> str | None:
    """sha256 of an exported folder's manifest.json (it records every file's hash: it names the export exactly), None
    for a checkpoint folder."""
    path = Path(folder) / "manifest.json"
    return sha256_file(path) if path.is_file() else None


def threads_per_engine(threads: int | None, engines: int) -> int:
    """ONNX Runtime threads of each engine: `threads`, else the machine's cores shared out (at least 1): engines
    that each take every core slow each other down."""
    if threads is not None:
        return threads
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // engines)


def served_tokenizer(folder: Path, chat_template: str | Path | None = None):
    """The model's tokenizer (None: token ids only), with the Jinja chat template file `chat_template` in place of
    its own where one is given (`spot serve --chat-template`)."""
    tokenizer = load_tokenizer(folder)
    if chat_template is None:
        return tokenizer
    if tokenizer is None:
        raise SpotError(f"--chat-template needs the model's tokenizer, and {folder} has no tokenizer files",
                        "use a model folder with tokenizer.json (or vocab.json + merges.txt)")
    return SpotTokenizer(tokenizer.tokenizer, load_chat_template(chat_template), tokenizer.source)


def load_chat_template(path: str | Path) -> str:
    """A Jinja chat template file's text (`spot serve --chat-template`); SpotError naming the file otherwise."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise SpotError(f"cannot read the chat template {path}: {getattr(e, 'strerror', None) or e}",
                        "pass a UTF-8 Jinja file, as the chat_template of a tokenizer_config.json holds") from None
