"""One exported folder opened once for every engine that decodes from it: its ONNX Runtime sessions, and how they
are made (providers for --device, the TensorRT EP's options, the checks of each graph against the manifest).

A session holds its graph's initializers, the weights: engines that each opened their own held the weights once per
engine (`spot serve --engines 4` on ORT CPU, a 1.3 GB fp16 export: 4.2 GB more than one engine). ONNX Runtime's
InferenceSession.run and run_with_iobinding may be called from several threads at once, and what differs between
two requests is not in the session: the KV cache, the IOBindings and the outputs are each engine's own
(spot.engines.ort_engine.OrtEngine). So N engines over one OrtSessions hold the weights once, plus N KV caches and
the activations of the passes running at the same time (each pass's own, from the session's arena).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from spot.engines.buckets import trt_shape_option
from spot.errors import SpotError
from spot.files import opened_whole, spot_cache
from spot.folder.epilogue import INPUTS, OUTPUTS, check_positions, graph_positions
from spot.folder.manifest import NP_DTYPES, check_graph_io, load_manifest
from spot.folder.trt_profile import Profile
from spot.ortlib import load_onnxruntime
from spot.runtime.engine import check_threads

DEVICES = ("cpu", "cuda", "trt")
PLACES = ("auto", "host", "device")      # the choices of --sampler and --kv-cache
_GPU_HINT = ("install onnxruntime-gpu in place of onnxruntime (x86_64: `pip uninstall -y onnxruntime && pip install "
             "onnxruntime-gpu`: side by side the CPU build wins; Jetson/aarch64: the JetPack wheel from NVIDIA's "
             "Jetson AI Lab index, PyPI has none), or use `device=\"cpu\"`")


def trt_cache_dir(folder: Path) -> Path:
    """TensorRT engine cache outside the (possibly read-only) exported folder, keyed by the folder's manifest."""
    key = hashlib.sha256((folder / "manifest.json").read_bytes()).hexdigest()[:16]
    return spot_cache() / "trt" / key


def trt_options(cache: Path, fp16: bool, profile: Profile | None) -> dict:
    """ONNX Runtime TensorRT EP options: engine and timing caches under `cache`, fp16 kernels for an fp16 export and,
    given a profile, its explicit min / opt / max shapes (one engine build for every pass it spans:
    spot.folder.trt_profile.dynamic_trt_profile)."""
    opts = {"trt_engine_cache_enable": True, "trt_engine_cache_path": str(cache),
            "trt_timing_cache_enable": True, "trt_timing_cache_path": str(cache), "trt_fp16_enable": fp16}
    if profile is not None:
        for i, end in enumerate(("min", "opt", "max")):
            opts[f"trt_profile_{end}_shapes"] = trt_shape_option({k: v[i] for k, v in profile.shapes.items()})
    return opts


def providers_for(device: str, folder: Path, dtype: str, cuda_options: dict | None = None,
                  trt_profile: Profile | None = None) -> list:
    """Execution providers for --device, checked against what the installed onnxruntime offers; cuda_options: extra
    CUDA provider options; trt_profile: the TensorRT shape profile of the graph (--device trt)."""
    ort = load_onnxruntime()
    if not isinstance(device, str) or device not in DEVICES:
        raise SpotError(f"unknown device {device!r} for the ort backend, expected one of {', '.join(DEVICES)}",
                        "`device=\"cpu\"` runs anywhere; cuda and trt (TensorRT) need an onnxruntime-gpu build and an "
                        "NVIDIA GPU")
    available = ort.get_available_providers()
    if device == "cpu":
        return ["CPUExecutionProvider"]
    if "CUDAExecutionProvider" not in available:
        raise SpotError(f"`device=\"{device}\"` needs onnxruntime's CUDAExecutionProvider; the installed onnxruntime "
                        f"{ort.__version__} offers {', '.join(available)}", _GPU_HINT)
    cuda = ("CUDAExecutionProvider", dict(cuda_options or {}))
    if device == "cuda":
        return [cuda, "CPUExecutionProvider"]
    if "TensorrtExecutionProvider" not in available:
        raise SpotError(f"`device=\"trt\"` needs onnxruntime's TensorrtExecutionProvider; the installed onnxruntime "
                        f"{ort.__version__} offers {', '.join(available)}",
                        "use an onnxruntime-gpu build with TensorRT (and TensorRT's libraries), or `device=\"cuda\"`")
    cache = trt_cache_dir(folder)
    cache.mkdir(parents=True, exist_ok=True)
    return [("TensorrtExecutionProvider", trt_options(cache, dtype == "fp16", trt_profile)), cuda,
            "CPUExecutionProvider"]


def make_session(graph: Path, device: str, dtype: str, threads: int | None = None, config: dict | None = None,
                 cuda_options: dict | None = None, trt_profile: Profile | None = None):
    """An InferenceSession on the requested provider; SpotError when the provider did not actually load."""
    ort = load_onnxruntime()
    threads = check_threads(threads)
    providers = providers_for(device, graph.parent, dtype, cuda_options, trt_profile)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = 3          # warnings about unused initializers etc. are not the user's business
    for key, value in (config or {}).items():   # e.g. a quantized export's ort_session_config (manifest)
        so.add_session_config_entry(key, str(value))
    if threads:
        so.intra_op_num_threads = int(threads)
        so.inter_op_num_threads = 1
    try:
        session = ort.InferenceSession(str(graph), so, providers=providers)
    except Exception as e:  # onnxruntime raises its own exception types (Fail, InvalidGraph, RuntimeException)
        raise SpotError(f"onnxruntime could not load {graph} on {device}: {str(e).splitlines()[0][:300]}",
                        "check that the folder was exported for this onnxruntime (opset) and device") from None
    wanted = providers[0] if isinstance(providers[0], str) else providers[0][0]
    if session.get_providers()[0] != wanted:
        raise SpotError(f"onnxruntime fell back from {wanted} to {session.get_providers()[0]}: the provider's "
                        "libraries (CUDA, cuDNN, TensorRT) did not load", _GPU_HINT)
    return session


# ONNX Runtime's names of the tensor types the graphs use, as the manifest writes them
ORT_DTYPES = {"tensor(float)": "float32", "tensor(float16)": "float16", "tensor(double)": "float64",
              "tensor(int64)": "int64"}


def checked(session, exported, name: str):
    """`session` of the folder's graph `name`, once its declared inputs and outputs agree with the manifest's model
    section (spot.folder.manifest.check_graph_io)."""
    declared = {a.name: (ORT_DTYPES.get(a.type, a.type), list(a.shape))
                for a in [*session.get_inputs(), *session.get_outputs()]}
    check_graph_io(exported, name, declared)
    return session


def target_session(exported, device: str, threads: int | None = None, trt_profile: Profile | None = None):
    """The session of an exported folder's target graph, with the manifest's session config (a quantized export
    keeps float32 activations in ONNX Runtime's fused MatMulNBits: docs/quantization.md)."""
    return checked(make_session(exported.graph_path("target"), device, exported.dtype, threads,
                                exported.manifest.ort_session_config or None, trt_profile=trt_profile),
                   exported, "target")


def recorded_trt_profile(exported) -> Profile:
    """The TensorRT shape profile spot-export recorded for the dynamic-shape engines (--device trt)."""
    entry = exported.manifest.graphs.target.tensorrt_profile
    if not entry:           # (absent, or null)
        raise SpotError(f"{exported.folder} was exported without a TensorRT shape profile, which "
                        "`device=\"trt\"` needs (without one, ONNX Runtime's TensorRT provider builds its engine "
                        "again whenever the KV cache outgrows the shapes it has seen)",
                        f"run `spot upgrade-export {exported.folder}` (seconds, the weights stay), or use "
                        "`device=\"cuda\"`")
    try:
        return Profile.from_dict(f"{exported.folder}'s tensorrt_profile", entry)
    except SpotError as e:
        raise SpotError(e.message, f"run `spot upgrade-export {exported.folder}` to write it again") from None


def check_epilogue_io(session, exported) -> None:
    """SpotError unless the folder's epilogue graph takes every input and gives every output this host binds
    (spot.folder.epilogue.INPUTS, OUTPUTS), checked once when it is opened: an epilogue exported before runner-ups
    (future_runner_up, future_gap) or position runs (first_position) lacks some, and `spot upgrade-export` writes
    the current one."""
    takes, gives = {i.name for i in session.get_inputs()}, {o.name for o in session.get_outputs()}
    missing = [n for n in INPUTS if n not in takes] + [n for n in OUTPUTS if n not in gives]
    if missing:
        raise SpotError(f"{exported.graph_path('epilogue')} is an older sampling epilogue: got no "
                        f"{', '.join(missing)}, expected inputs {', '.join(INPUTS)} and outputs {', '.join(OUTPUTS)}",
                        f"run `spot upgrade-export {exported.folder}` (seconds: the epilogue is rewritten, the weights "
                        "stay), or decode with `sampler=\"host\"`")


def epilogue_positions(session, exported, block_size: int) -> int:
    """Positions of a state per epilogue call: the manifest's positions_per_call, a divisor of the block size and
    the graph's static logits dim."""
    p = exported.manifest.graphs.epilogue.positions_per_call
    if not p:               # (absent, or null)
        raise SpotError(f"{exported.folder}/manifest.json records no positions_per_call for its epilogue (an epilogue "
                        "exported before position runs)", f"run `spot upgrade-export {exported.folder}`")
    remedy = "re-export the folder with spot-export (or spot upgrade-export it)"
    check_positions(p, block_size, "the manifest's epilogue positions_per_call", remedy)
    if graph_positions(session) not in (p, None):
        raise SpotError(f"the manifest's epilogue positions_per_call is {p}, the graph's logits take "
                        f"{graph_positions(session)} positions", remedy)
    return p


def on_device(choice: str, what: str, device: str, available: bool) -> bool:
    """--sampler and --kv-cache (`what` names which, for the error): device = on the target's device, through the
    export's graph for it (required; the epilogue samples next to the target, kv_append grows the cache there);
    host = numpy on the host; auto = device on GPU providers when that graph is `available`. On a CPU auto is host:
    the epilogue's exact float64 softmax over V costs more than the numpy step, and both caches are host memory
    there (the numpy one skips the IOBinding bookkeeping)."""
    if not isinstance(choice, str) or choice not in PLACES:
        raise SpotError(f"unknown {what} {choice!r}, expected one of {', '.join(PLACES)}")
    return choice == "device" or (choice == "auto" and device != "cpu" and available)


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
    per_engine = check_threads(per_engine)
    if not per_engine:
        return per_engine
    return engines * (per_engine - 1) + 1


def open_sessions(model_dir: str | Path, block_size: int | None = None, device: str = "cpu",
                  threads: int | None = None, verify: str = "quick", sampler: str = "auto",
                  kv_cache: str = "auto") -> OrtSessions:
    """The folder's sessions for engines decoding blocks of `block_size` (default: the export's) on `device` with
    `sampler` / `kv_cache` (auto | host | device: on_device); threads: the sessions'
    intra-op threads (None: ONNX Runtime's default). The manifest, its checks and the sessions read one folder
    (spot.files.opened_whole)."""
    return opened_whole(model_dir, lambda: _open(model_dir, block_size, device, threads, verify, sampler, kv_cache))


def _open(model_dir, block_size, device, threads, verify, sampler, kv_cache) -> OrtSessions:
    exported = load_manifest(model_dir, verify)
    block_size = exported.block_size if block_size is None else int(block_size)    # 0 is refused, not the default
    trt_profile = _trt_profile(exported, block_size) if device == "trt" else None
    target = target_session(exported, device, threads, trt_profile)
    place = "cpu" if device == "cpu" else "cuda"
    kv_append = _kv_append_session(exported, place, device, kv_cache, threads)
    epilogue, steps, positions = _epilogue_session(exported, place, device, block_size, sampler, threads)
    return OrtSessions(exported, block_size, device, target, trt_profile, kv_append, epilogue, steps, positions)


def _trt_profile(exported, block_size: int) -> Profile:
    if block_size != exported.block_size:
        raise SpotError(f"`device=\"trt\"` runs the TensorRT profile recorded for blocks of {exported.block_size}, "
                        f"the engine decodes blocks of {block_size}", "use the export's block size, or "
                        "`device=\"cuda\"`")
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
    graphs = exported.manifest.graphs
    usable = "epilogue" in graphs
    if sampler == "auto":      # not an epilogue built for another block size (--block-size overrides the export's)
        usable = usable and block_size == exported.block_size
    if not on_device(sampler, "sampler", device, usable):
        return None, None, None
    if "epilogue" not in graphs:
        raise SpotError(f"{exported.folder} has no sampling epilogue graph (needed by `sampler=\"device\"`)",
                        f"add one with `spot upgrade-export {exported.folder} --epilogue-steps N` (N > 0; the "
                        "weights stay), or use `sampler=\"host\"`")
    if block_size != exported.block_size:
        raise SpotError(f"the epilogue graph is built for blocks of {exported.block_size}, the engine decodes blocks "
                        f"of {block_size}", "use the export's block size or `sampler=\"host\"`")
    # TensorRT has neither float64 nor uint32 arithmetic: on --device trt the epilogue runs on the CUDA EP, on the
    # same GPU, reading the target's logits where they are (docs/gpu-path.md).
    # spot-export's bound, before the graph is compared with it (as in the C++ host): an out-of-range future_steps
    # is named as such, not as a contradiction of the graph
    steps = graphs.epilogue.future_steps
    if not 1 <= steps <= block_size:
        raise SpotError(f"{exported.folder}/manifest.json: the epilogue's future_steps is {steps}, expected "
                        f"1..{block_size} (the block size)", "re-export the folder with spot-export")
    session = make_session(exported.graph_path("epilogue"), place, exported.dtype, threads)
    check_epilogue_io(session, exported)
    checked(session, exported, "epilogue")
    return session, steps, epilogue_positions(session, exported, block_size)
