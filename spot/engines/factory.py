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
    device (spot.engines.ort_engine.on_device; tensorrt keeps the KV cache on the GPU). threads (ort): ONNX
    Runtime's intra-op threads of this engine's sessions (None: its default, every core) — set it when several
    engines share the machine's cores, one per thread."""
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise SpotError(f"unknown backend {backend!r}, expected one of {', '.join(BACKENDS)}",
                        "ort runs an exported folder (spot-export), torch a Hugging Face checkpoint")
    model_dir = path_arg(model_dir, "model_dir")
    for what, value, example in (("device", device, "cpu"), ("sampler", sampler, "auto"),
                                 ("kv_cache", kv_cache, "auto")):
        if not isinstance(value, str):
            raise SpotError(f"{what} must be a str, got {value!r:.40} ({type(value).__name__})", f"e.g. {example!r}")
    if threads is not None and backend != "ort":
        raise SpotError(f"threads sets ONNX Runtime's sessions of the ort backend, got backend {backend!r}",
                        "torch: torch.set_num_threads (process-wide); tensorrt runs on the GPU")
    if backend == "ort":  # an exported folder (spot-export), opened and checked by its manifest
        from spot.engines.ort_engine import OrtEngine
        if block_size is not None:
            check_block_size(block_size)
        return OrtEngine(model_dir, block_size, device, threads, sampler=sampler, kv_cache=kv_cache)
    if backend == "tensorrt":  # an exported folder, its TensorRT engine built (or taken from the engine cache)
        from spot.engines.tensorrt_engine import open_trt_engine
        return open_trt_engine(model_dir, block_size, device, sampler, kv_cache)
    for option, value, graph in (("sampler", sampler, "epilogue.onnx"), ("kv-cache", kv_cache, "kv_append.onnx")):
        if value == "device":
            raise SpotError(f"--{option} device needs the ort backend (an exported folder with {graph}), got "
                            f"--backend {backend}", f"use --backend ort, or --{option} host")
    if (Path(model_dir) / "manifest.json").is_file():
        raise SpotError(f"{model_dir} is an exported ONNX folder, and --backend {backend} reads Hugging Face "
                        "checkpoints", "use --backend ort")
    cfg = load_config(model_dir)  # clear errors (missing folder, model_type) before any heavy import
    block_size = cfg.block_size if block_size is None else block_size
    check_block_size(block_size, cfg.max_position_embeddings)
    from spot.engines.torch_engine import TorchEngine
    return TorchEngine.from_dir(model_dir, block_size, device)
