"""One exported folder opened once for every engine that decodes from it: its ONNX Runtime sessions.

A session holds its graph's initializers, the weights: engines that each opened their own held the weights once per
engine (`spot serve --engines 4` on ORT CPU, a 1.3 GB fp16 export: 4.2 GB more than one engine). ONNX Runtime's
InferenceSession.run and run_with_iobinding may be called from several threads at once, and what differs between
two requests is not in the session: the KV cache, the IOBindings and the outputs are each engine's own
(spot.engines.ort_engine.OrtEngine). So N engines over one OrtSessions hold the weights once, plus N KV caches and
the activations of the passes running at the same time (each pass's own, from the session's arena).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from spot.engines.buckets import Profile
from spot.engines.ort_engine import (check_epilogue_io, checked, epilogue_positions, make_session, on_device,
                                     recorded_trt_profile, target_session)
from spot.errors import SpotError
from spot.files import opened_whole
from spot.folder.manifest import NP_DTYPES, load_manifest


@dataclass(frozen=True)
class OrtSessions:
    """The sessions of one opened folder. target: the target graph's; kv_append: the device KV cache's append (None:
    the engines keep their caches in numpy); epilogue: the device sampler's (None: F samples on the host), with its
    future_steps and positions per call."""

    exported: object                     # spot.folder.manifest.ExportedFolder
    block_size: int
    device: str                          # cpu | cuda | trt
    target: object                       # onnxruntime.InferenceSession
    trt_profile: Profile | None = None
    kv_append: object | None = None
    epilogue: object | None = None
    future_steps: int | None = None
    epilogue_positions: int | None = None

    @property
    def place(self) -> str:
        """Where the target's outputs live (ONNX Runtime's device type)."""
        return "cpu" if self.device == "cpu" else "cuda"

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(NP_DTYPES[self.exported.dtype])


def shared_threads(per_engine: int | None, engines: int) -> int | None:
    """Intra-op threads of the sessions `engines` engines share, given each engine's `per_engine` (None or 0: ONNX
    Runtime's default, every core). A pass runs on its caller's thread plus the pool's: N separate sessions of T
    threads ran N callers and N x (T - 1) pool threads, and so does one session of N x (T - 1) + 1 (its pool has one
    thread fewer than its count), so N busy engines keep the threads they had, and one busy engine may borrow the
    idle engines' (T = 1: no pool, each pass on its engine's thread, as before)."""
    if not per_engine:
        return per_engine
    return engines * (per_engine - 1) + 1


def open_sessions(model_dir: str | Path, block_size: int | None = None, device: str = "cpu",
                  threads: int | None = None, verify: str = "quick", sampler: str = "auto",
                  kv_cache: str = "auto") -> OrtSessions:
    """The folder's sessions for engines decoding blocks of `block_size` (default: the export's) on `device` with
    `sampler` / `kv_cache` (auto | host | device: spot.engines.ort_engine.on_device); threads: the sessions'
    intra-op threads (None: ONNX Runtime's default). The manifest, its checks and the sessions read one folder
    (spot.files.opened_whole)."""
    return opened_whole(model_dir, lambda: _open(model_dir, block_size, device, threads, verify, sampler, kv_cache))


def _open(model_dir, block_size, device, threads, verify, sampler, kv_cache) -> OrtSessions:
    exported = load_manifest(model_dir, verify)
    block_size = int(block_size or exported.block_size)
    trt_profile = _trt_profile(exported, block_size) if device == "trt" else None
    target = target_session(exported, device, threads, trt_profile)
    place = "cpu" if device == "cpu" else "cuda"
    kv_append = _kv_append_session(exported, place, device, kv_cache, threads)
    epilogue, steps, positions = _epilogue_session(exported, place, device, block_size, sampler, threads)
    return OrtSessions(exported, block_size, device, target, trt_profile, kv_append, epilogue, steps, positions)


def _trt_profile(exported, block_size: int) -> Profile:
    if block_size != exported.block_size:
        raise SpotError(f"--device trt runs the TensorRT profile recorded for blocks of {exported.block_size}, the "
                        f"engine decodes blocks of {block_size}", "use the export's block size, or --device cuda")
    return recorded_trt_profile(exported)


def _kv_append_session(exported, place: str, device: str, kv_cache: str, threads: int | None):
    """kv_append.onnx's session when the KV cache lives on the device, else None."""
    if not on_device(kv_cache, "KV cache place", device, True):     # every folder has kv_append
        return None
    # a Concat with a new shape at every stored block: the CUDA provider, also under --device trt (a TensorRT
    # engine per shape would cost more than the copy), its arena grown by what is asked (the cache grows by one
    # block per store), not to the next power of two
    return checked(make_session(exported.graph_path("kv_append"), place, exported.dtype, threads,
                                cuda_options={"arena_extend_strategy": "kSameAsRequested"}), exported, "kv_append")


def _epilogue_session(exported, place: str, device: str, block_size: int, sampler: str, threads: int | None):
    """(session, future steps, positions per call) of the device sampler's epilogue, or (None, None, None) when F
    samples on the host."""
    graphs = exported.manifest["graphs"]
    usable = "epilogue" in graphs
    if sampler == "auto":      # not an epilogue built for another block size (--block-size overrides the export's)
        usable = usable and block_size == exported.block_size
    if not on_device(sampler, "sampler", device, usable):
        return None, None, None
    if "epilogue" not in graphs:
        raise SpotError(f"{exported.folder} has no sampling epilogue graph (needed by --sampler device)",
                        f"add one with `spot upgrade-export {exported.folder}` (--epilogue-steps N, N > 0; the "
                        "weights stay), or use --sampler host")
    if block_size != exported.block_size:
        raise SpotError(f"the epilogue graph is built for blocks of {exported.block_size}, the engine decodes blocks "
                        f"of {block_size}", "use the export's block size or --sampler host")
    # TensorRT has neither float64 nor uint32 arithmetic: on --device trt the epilogue runs on the CUDA EP, on the
    # same GPU, reading the target's logits where they are (docs/gpu-path.md).
    # spot-export's bound, before the graph is compared with it (as in the C++ host): an out-of-range future_steps
    # is named as such, not as a contradiction of the graph
    steps = int(graphs["epilogue"]["future_steps"])
    if not 1 <= steps <= block_size:
        raise SpotError(f"{exported.folder}/manifest.json: the epilogue's future_steps is {steps}, expected "
                        f"1..{block_size} (the block size)", "re-export the folder with spot-export")
    session = make_session(exported.graph_path("epilogue"), place, exported.dtype, threads)
    check_epilogue_io(session, exported)
    checked(session, exported, "epilogue")
    return session, steps, epilogue_positions(session, exported, block_size)
