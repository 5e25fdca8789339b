"""Build an engine for a backend name: the one place the CLI and tools turn `--backend X` into an Engine."""
from __future__ import annotations

from pathlib import Path

from spot.config import check_block_size, load_config
from spot.errors import SpotError, path_arg
from spot.runtime.engine import Engine

BACKENDS = ("torch", "ort", "tensorrt")
EXPORTED_BACKENDS = ("ort", "tensorrt")     # those that run an exported folder (spot-export), not a checkpoint


def open_engine(backend: str, model_dir: str | Path, block_size: int | None = None, device: str = "cpu",
                sampler: str = "auto", kv_cache: str = "auto", threads: int | None = None) -> Engine:
    """An engine over the checkpoint in `model_dir` decoding blocks of `block_size` (default: the config's).

    ort and tensorrt: sampler, where F's sampling runs, and kv_cache, where the KV cache lives — auto | host |
    device (spot.engines.ort_sessions.on_device; tensorrt keeps the KV cache on the GPU). threads (ort): ONNX
    Runtime's intra-op threads of this engine's sessions (None: its default, every core)."""
    return open_engines(backend, model_dir, 1, block_size, device, sampler, kv_cache, threads)[0]


def open_engines(backend: str, model_dir: str | Path, count: int, block_size: int | None = None, device: str = "cpu",
                 sampler: str = "auto", kv_cache: str = "auto", threads: int | None = None) -> list[Engine]:
    """`count` engines over one copy of the model's weights (open_engine's arguments): each decodes one request at a
    time with its own KV cache, and they may decode at the same time from `count` threads. ort: one session per graph
    that every engine runs (spot.engines.ort_sessions); tensorrt: one deserialized engine, an execution context per
    spot engine; torch: one module. threads (ort): each engine's share of ONNX Runtime's threads
    (ort_sessions.shared_threads: the sessions' pool holds what `count` sessions of `threads` held)."""
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise SpotError(f"unknown backend {backend!r}, expected one of {', '.join(BACKENDS)}",
                        "ort runs an exported folder (spot-export), torch a Hugging Face checkpoint")
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise SpotError(f"engines must be an int >= 1, got {count!r:.40}", "e.g. 1")
    model_dir = path_arg(model_dir, "model_dir")
    for what, value, example in (("device", device, "cpu"), ("sampler", sampler, "auto"),
                                 ("kv_cache", kv_cache, "auto")):
        if not isinstance(value, str):
            raise SpotError(f"{what} must be a str, got {value!r:.40} ({type(value).__name__})", f"e.g. {example!r}")
    if threads is not None and backend != "ort":
        raise SpotError(f"threads sets ONNX Runtime's sessions of the ort backend, got backend {backend!r}",
                        "torch: torch.set_num_threads (process-wide); tensorrt runs on the GPU")
    if backend == "ort":  # an exported folder (spot-export), opened and checked by its manifest
        # start-up: spot.cli loads this module; the engine modules load when one opens
        from spot.engines.ort_engine import OrtEngine
        from spot.engines.ort_sessions import open_sessions, shared_threads
        if block_size is not None:
            check_block_size(block_size)
        sessions = open_sessions(model_dir, block_size, device, shared_threads(threads, count), sampler=sampler,
                                 kv_cache=kv_cache)
        return [OrtEngine.over(sessions) for _ in range(count)]
    if backend == "tensorrt":  # an exported folder, its TensorRT engine built (or taken from the engine cache)
        # start-up: spot.cli loads this module; the engine modules load when one opens
        from spot.engines.tensorrt_engine import open_trt_engines
        return open_trt_engines(model_dir, count, block_size, device, sampler, kv_cache)
    for option, value, graph in (("sampler", sampler, "epilogue.onnx"), ("kv_cache", kv_cache, "kv_append.onnx")):
        if value == "device":
            raise SpotError(f"`{option}=\"device\"` needs the ort backend (an exported folder with {graph}), got "
                            f"`backend=\"{backend}\"`", f"use `backend=\"ort\"`, or `{option}=\"host\"`")
    if (Path(model_dir) / "manifest.json").is_file():
        raise SpotError(f"{model_dir} is an exported ONNX folder, and `backend=\"{backend}\"` reads Hugging Face "
                        "checkpoints", "use `backend=\"ort\"`")
    cfg = load_config(model_dir)  # clear errors (missing folder, model_type) before any heavy import
    block_size = cfg.block_size if block_size is None else block_size
    check_block_size(block_size, cfg.max_position_embeddings)
    # torch: optional extra (spot.engines.torch_engine imports it)
    from spot.engines.torch_engine import TorchEngine
    first = TorchEngine.from_dir(model_dir, block_size, device)
    return [first] + [TorchEngine(first.model, block_size, device) for _ in range(count - 1)]
