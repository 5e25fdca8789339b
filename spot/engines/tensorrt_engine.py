"""TensorRT engines for the exported target graph (ONNX Runtime's TensorRT execution provider, the simpler path, is
`--device trt` of the ORT engines: spot.engines.ort_sessions.providers_for).

STATUS: written to the documented TensorRT 10.x / 11.x Python API (name-based tensors, execute_async_v3,
optimisation profiles, timing cache) and NEVER RUN on this project's CI, which has no GPU and no TensorRT (the fused
store pass too: 2B tokens on the capacity's prefill profile, BucketPlan.trt_profiles).
Only the "TensorRT is missing" paths are tested (tests/test_trt_and_buckets.py). scripts/gpu_check.sh exercises the
rest on a machine with an NVIDIA GPU; docs/gpu-path.md lists what ran where.

Build (`spot build-engine DIR`): parse DIR/target.onnx (external weights next to it), a block profile and a prefill
profile per KV-capacity bucket (spot.engines.buckets.BucketPlan.trt_profiles), a persistent timing cache, and an
engine cache keyed by the manifest's sha256 of ONNX + weights + TensorRT version + GPU name + build options + profile
layout.
Precision: the network is strongly typed wherever TensorRT supports it (required in 11.x, which removed the
FP16/INT8 builder flags): the precision is the export's (`spot-export --dtype fp16`). On 10.x, `fp16_flag=True`
instead builds a weakly typed network from an fp32 export with BuilderFlag.FP16 (TensorRT picks fp16 kernels).
Engines of one folder (`spot serve --engines N`: open_trt_engines) share one deserialized ICudaEngine (TrtModel: the
weights once on the GPU); each spot engine runs its own IExecutionContext (not thread-safe, one per decoding thread)
on its own CUDA stream, with its own activation memory and KV cache (TrtRunner). Never run either; in particular two
contexts selecting the same optimization profile at once is assumed allowed (older TensorRT releases wanted a profile
per running context): the first GPU run of `spot serve --backend tensorrt --engines 2` is where it would show.
Run: device buffers are torch CUDA tensors; the KV cache (spot.engines.kv_cache.StaticKVCache) stays on the device,
the target's logits stay on the device and feed the sampling epilogue (spot.reference.noise_torch.epilogue_torch),
per state the walk reads (DeferredOutputs), so a verify pass copies O(B x (D + 32)) values per such state to the
host, never O(N x B x V).
"""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path

import numpy as np

from spot.descriptors import read_json
from spot.engines.buckets import BucketPlan, pad_nodes
from spot.engines.kv_cache import PlannedCacheLimits, StaticKVCache
from spot.errors import SpotError
from spot.files import atomic_output, spot_cache, write_text_atomic
from spot.folder.epilogue import OUTPUTS, EpilogueResult, check_sampling, default_epilogue_positions, join_runs
from spot.folder.manifest import load_manifest
from spot.runtime.engine import Engine
from spot.runtime.outputs import DeferredOutputs, sampled_outputs

INSTALL_HINT = ("Jetson (JetPack 6.x, TensorRT 10.3): `sudo apt install python3-libnvinfer` (part of JetPack; use the "
                "system python3 or a venv made by `python3 -m venv --system-site-packages`); workstation/server: "
                "`pip install tensorrt` (NVIDIA's wheels, also at https://pypi.nvidia.com), with a CUDA driver; "
                "or use `backend=\"ort\"` with `device=\"cuda\"` or `device=\"trt\"`")
TORCH_CUDA_HINT = ("TensorRT runs here on torch CUDA tensors: install a CUDA build of torch (Jetson: NVIDIA's "
                   "JetPack wheel), or use the ORT TensorRT execution provider (`backend=\"ort\"` with "
                   "`device=\"trt\"`)")


MIN_TRT_MAJOR = 10     # name-based tensor API, int64 tensors, strongly typed networks (JetPack 6)


def _trt():
    """The tensorrt module (10.x or later), or SpotError with what to install."""
    try:
        import tensorrt as trt  # noqa: F401
    except ImportError:
        raise SpotError("TensorRT's Python package (tensorrt) is not installed", INSTALL_HINT) from None
    version = getattr(trt, "__version__", None)
    major = str(version).split(".")[0]
    if not major.isdigit() or int(major) < MIN_TRT_MAJOR:
        # 8.x parses ONNX only into explicit-batch networks (another creation flag) and has no int64 tensors
        found = (f"TensorRT {version} is too old" if major.isdigit() else
                 f"the tensorrt package reports version {version!r}, not a TensorRT release")
        raise SpotError(f"{found}: spot's engines need TensorRT {MIN_TRT_MAJOR} or later",
                        "Jetson: JetPack 6.x (TensorRT 10.3); workstation: `pip install tensorrt`; or use "
                        "`backend=\"ort\"` with `device=\"cuda\"`")
    return trt


def _torch_cuda():
    try:
        # torch: optional extra (spot[export])
        import torch
    except ImportError:
        raise SpotError("the TensorRT engine needs torch for its device buffers", TORCH_CUDA_HINT) from None
    if not torch.cuda.is_available():
        raise SpotError("no CUDA device visible to torch", TORCH_CUDA_HINT)
    return torch


def trt_version() -> str:
    return _trt().__version__


def trt_major() -> int:
    return int(trt_version().split(".")[0])


def gpu_name() -> str:
    return _torch_cuda().cuda.get_device_name(0)


# -- build ------------------------------------------------------------------------------------------------------
DEFAULT_MAX_NODES = 16
DEFAULT_SAMPLER_STEPS = 8      # future steps the device sampler provides: trees up to depth 8 (DEFAULT_DEPTH)


@dataclass(frozen=True)
class BuildOptions:
    max_nodes: int | None = None            # default: min(DEFAULT_MAX_NODES, the export's max_nodes)
    max_context: int | None = None          # default: the export's max_context
    smallest_capacity: int = 256
    prefill_blocks: int = 4
    workspace_gib: float = 4.0
    fp16_flag: bool = False                 # TensorRT 10 only: weakly typed build of an fp32 export with FP16 kernels
    opt_level: int = 3                      # builder optimisation level 0..5 (3 is TensorRT's default)


# the order of BucketPlan.trt_profiles, which TrtEngine's profile indices assume: an engine built with another
# layout (one profile per capacity, before block and prefill profiles were split) is not reused
PROFILE_LAYOUT = "block+prefill per capacity, prefill from 2B (the fused store pass)"


def engine_cache_key(file_hashes: dict[str, str], version: str, gpu: str, options: BuildOptions,
                     plan: BucketPlan) -> str:
    """sha256 over the ONNX graph's and weights' sha256 (file name -> the manifest's record, which the folder was
    verified against when it opened: not hashed again, 16 GB for SDAR-8B at every open), the TensorRT version, the
    GPU name and the build options/buckets."""
    meta = json.dumps({"files": file_hashes, "trt": version, "gpu": gpu, "options": asdict(options),
                       "plan": plan.to_dict(), "profiles": PROFILE_LAYOUT}, sort_keys=True)
    return hashlib.sha256(meta.encode()).hexdigest()


def cache_dir() -> Path:
    return spot_cache() / "tensorrt"


def timing_cache_name(version: str, gpu: str) -> str:
    """Timing caches hold kernel timings of one TensorRT version on one GPU (NVIDIA: "specific to the targeted
    device, CUDA, TensorRT versions"): one file per pair, so an upgrade starts a new one instead of failing."""
    slug = "".join(c if c.isalnum() or c in ".-" else "_" for c in f"{version}-{gpu}")
    return f"timing-{slug}.cache"


def _network_flags(trt, strongly_typed: bool) -> int:
    flags = 0
    if strongly_typed and hasattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED"):
        flags |= 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    return flags


def check_parsable(exported) -> None:
    """SpotError when TensorRT cannot parse the folder's target graph (MatMulNBits is an ONNX Runtime operator)."""
    if exported.manifest.ort_only:
        raise SpotError(f"{exported.folder} was exported with `spot-export --ort-matmulnbits` (com.microsoft "
                        "MatMulNBits, an ONNX Runtime operator TensorRT cannot parse)",
                        "re-export without --ort-matmulnbits (int4 as DequantizeLinear -> MatMul), or run it with "
                        "`backend=\"ort\"`")


def build_engine(model_dir: str | Path, options: BuildOptions = BuildOptions(), out: str | Path | None = None,
                 progress=print) -> Path:
    """Build (or reuse from the cache) a TensorRT engine for the exported folder; returns the engine file.
    Writes next to it `<key>.json` (versions, buckets) and keeps a timing cache per TensorRT version and GPU in the
    cache folder (timing_cache_name)."""
    exported = load_manifest(model_dir)      # a wrong folder is named before TensorRT is looked for
    check_parsable(exported)
    trt = _trt()
    cfg = exported.config
    major = trt_major()
    if options.fp16_flag and major >= 11:
        raise SpotError("TensorRT 11 has no FP16 builder flag (networks are strongly typed)",
                        "export the model with `spot-export --dtype fp16` and build without `fp16_flag`")
    options = resolve_options(options, exported.max_nodes)
    max_ctx = min(options.max_context or exported.max_context, exported.max_context, cfg.max_position_embeddings)
    plan = BucketPlan.default(max_ctx, exported.block_size, options.max_nodes, options.smallest_capacity,
                              options.prefill_blocks)
    onnx_path = exported.graph_path("target")
    files = exported.manifest.files
    hashes = {n: files[n].sha256 for n in (onnx_path.name, onnx_path.name + ".data") if n in files}
    gpu = gpu_name()
    key = engine_cache_key(hashes, trt.__version__, gpu, options, plan)
    folder = Path(out) if out else cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    engine_file = folder / f"{key[:24]}.engine"
    meta_file = folder / f"{key[:24]}.json"
    if engine_file.is_file() and meta_file.is_file():
        progress(f"engine cache hit: {engine_file}")
        return engine_file

    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(_network_flags(trt, strongly_typed=not options.fp16_flag))
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise SpotError(f"TensorRT {trt.__version__} could not parse {onnx_path}: {errors[:500]}",
                        "TensorRT 10.3 parses opset <= 20; re-export with `spot-export --opset 17`")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(options.workspace_gib * 2**30))
    config.builder_optimization_level = options.opt_level
    if options.fp16_flag:
        config.set_flag(trt.BuilderFlag.FP16)
    timing_file = folder / timing_cache_name(trt.__version__, gpu)
    timing = config.create_timing_cache(timing_file.read_bytes() if timing_file.is_file() else b"")
    if not config.set_timing_cache(timing, ignore_mismatch=False):
        progress(f"note: {timing_file} does not fit this TensorRT / GPU; building without it")
        timing_file.unlink(missing_ok=True)
        config.set_timing_cache(config.create_timing_cache(b""), ignore_mismatch=False)
    profiles = plan.trt_profiles(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim)
    for prof in profiles:
        p = builder.create_optimization_profile()
        for name, (lo, opt, hi) in prof.shapes.items():
            p.set_shape(name, lo, opt, hi)
        config.add_optimization_profile(p)
    progress(f"building TensorRT {trt.__version__} engine on {gpu}: {len(profiles)} profiles "
             f"(capacities {list(plan.capacities)}, up to {plan.nodes[-1]} nodes); this takes minutes")
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise SpotError("TensorRT failed to build the engine (see its log above)",
                        "lower `max_context` or `max_nodes`, or raise `workspace_gib`")
    # the engine, then its .json (a cache hit needs both: an interrupted write is rebuilt, never loaded half)
    with atomic_output(engine_file) as tmp:
        tmp.write_bytes(bytes(serialized))
    write_text_atomic(meta_file, json.dumps({"key": key, "tensorrt": trt.__version__, "gpu": gpu,
                                             "model_dir": str(model_dir), "options": asdict(options),
                                             "plan": plan.to_dict()}, indent=2))
    try:        # only speeds up later builds: a failure here costs the next build time, not this engine
        with atomic_output(timing_file) as tmp:
            tmp.write_bytes(bytes(config.get_timing_cache().serialize()))
    except (OSError, RuntimeError, AttributeError) as e:
        progress(f"note: the timing cache was not saved ({e})")
    progress(f"wrote {engine_file}")
    return engine_file


def resolve_options(options: BuildOptions, export_max_nodes: int) -> BuildOptions:
    """options with max_nodes filled in: the given value (checked against the export's), else
    min(DEFAULT_MAX_NODES, the export's) — an export made with --max-nodes 8 builds its engine by default."""
    if options.max_nodes is None:
        return replace(options, max_nodes=min(DEFAULT_MAX_NODES, export_max_nodes))
    if not 1 <= options.max_nodes <= export_max_nodes:
        raise SpotError(f"`max_nodes` must be in 1..{export_max_nodes} (the export's max_nodes), got "
                        f"{options.max_nodes}", "leave out `max_nodes` to build for the export's")
    return options


def check_before_export(mode: str, ort_only: bool) -> None:
    """spot-export --tensorrt yes: SpotError before the export (minutes for an 8B model) when its engine cannot be
    built: a graph TensorRT cannot parse (--ort-matmulnbits), no TensorRT, no CUDA GPU."""
    if mode != "yes":
        return
    if ort_only:
        raise SpotError("--tensorrt yes with --ort-matmulnbits: TensorRT cannot parse com.microsoft MatMulNBits",
                        "drop --ort-matmulnbits (int4 as DequantizeLinear -> MatMul parses), or use --tensorrt no")
    try:
        _trt()
        _torch_cuda()
    except SpotError as e:
        raise SpotError(f"--tensorrt yes, but no engine can be built here: {e.message}",
                        f"{e.hint}; or use --tensorrt auto (export now, build on the target machine with spot "
                        "build-engine)" if e.hint else "use --tensorrt auto") from None


def build_after_export(folder: str | Path, mode: str, progress=print) -> Path | None:
    """spot-export --tensorrt: "auto" builds the engine (build_engine's defaults, the engine cache) when TensorRT,
    a CUDA GPU and a graph TensorRT parses are all here, and otherwise says why not and how to build it later;
    "yes" requires them; "no" skips. The export itself is complete either way."""
    if mode == "no":
        return None

    def not_built(e: SpotError, advice: str) -> None:
        if mode == "yes":
            raise SpotError(f"the export in {folder} is complete, but no TensorRT engine was built: {e.message}",
                            e.hint) from None
        progress(f"TensorRT engine: {advice}")
    try:
        check_parsable(load_manifest(folder))
    except SpotError as e:         # no machine can build it: say so, not "build it on the target machine"
        return not_built(e, f"none for this export ({e.message}); ONNX Runtime runs it (--backend ort)")
    try:
        _trt()
        _torch_cuda()
    except SpotError as e:
        return not_built(e, f"not built here ({e.message}); on the target machine: spot build-engine {folder}")
    return build_engine(folder, BuildOptions(), progress=progress)


def open_trt_engine(model_dir: str | Path, block_size: int | None = None, device: str = "cuda",
                    sampler: str = "auto", kv_cache: str = "auto") -> "TrtEngine":
    """`--backend tensorrt`: a TrtEngine over the exported folder, its engine built with the default BuildOptions
    or reused from the engine cache (spot-export --tensorrt and spot build-engine put it there)."""
    return open_trt_engines(model_dir, 1, block_size, device, sampler, kv_cache)[0]


def open_trt_engines(model_dir: str | Path, count: int, block_size: int | None = None, device: str = "cuda",
                     sampler: str = "auto", kv_cache: str = "auto") -> list["TrtEngine"]:
    """`count` TrtEngines over one deserialized TensorRT engine (the weights once on the GPU), each with its own
    execution context, CUDA stream and KV cache (open_trt_engine's arguments)."""
    exported = load_manifest(model_dir)
    if device != "cuda":
        raise SpotError(f"`backend=\"tensorrt\"` runs on a CUDA GPU, got `device=\"{device}\"`",
                        "use `device=\"cuda\"`")
    if block_size is not None and block_size != exported.block_size:
        raise SpotError(f"`block_size={block_size}`, but {model_dir} was exported for blocks of "
                        f"{exported.block_size}", "leave out `block_size`, or export again with "
                        "`spot-export --block-size N`")
    if kv_cache == "host":
        raise SpotError("`backend=\"tensorrt\"` keeps the KV cache on the GPU, got `kv_cache=\"host\"`",
                        "leave out `kv_cache`, or use `backend=\"ort\"` for a host KV cache")
    check_parsable(exported)
    model = load_trt_model(model_dir)
    steps = None if sampler == "host" else DEFAULT_SAMPLER_STEPS
    return [TrtEngine.over(model, sampler_steps=steps) for _ in range(count)]


# -- run ---------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TrtModel:
    """An exported folder's TensorRT engine, deserialized once: the weights on the GPU, shared by every TrtEngine
    over it (each runs its own execution context: TrtRunner). exported: the folder's manifest; plan: the bucket plan
    the engine was built for."""

    exported: object              # spot.folder.manifest.ExportedFolder
    engine_file: Path
    plan: BucketPlan
    runtime: object               # tensorrt.Runtime (kept alive as long as its engine)
    engine: object                # tensorrt.ICudaEngine
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


def load_trt_model(model_dir: str | Path, engine_file: str | Path | None = None,
                   options: BuildOptions = BuildOptions()) -> TrtModel:
    """The folder's TensorRT engine (`engine_file`, else built with `options` or taken from the engine cache),
    deserialized."""
    trt = _trt()
    _torch_cuda()
    exported = load_manifest(model_dir)
    engine_file = Path(engine_file) if engine_file else build_engine(model_dir, options)
    meta = read_json(engine_file.with_suffix(".json"), f"delete {engine_file} and its .json to build it again")
    runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
    engine = runtime.deserialize_cuda_engine(engine_file.read_bytes())
    if engine is None:
        raise SpotError(f"TensorRT could not load {engine_file}",
                        "engines are specific to the TensorRT version and GPU: rebuild with spot build-engine")
    names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
    inputs = tuple(n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT)
    return TrtModel(exported, engine_file, BucketPlan.from_dict(meta["plan"]), runtime, engine, inputs,
                    tuple(n for n in names if n not in inputs))


class TrtRunner:
    """One execution context of a TrtModel's engine, with its own CUDA stream: what one spot engine runs. TensorRT's
    IExecutionContext is not thread-safe, its ICudaEngine is shared: one context per thread that decodes, each with
    its own activation memory (allocated when the context is created); runs on torch CUDA tensors (no host copies)."""

    def __init__(self, model: TrtModel):
        trt = _trt()
        torch = _torch_cuda()
        self.trt, self.torch, self.model = trt, torch, model
        self.engine = model.engine
        self.context = self.engine.create_execution_context()
        if self.context is None:      # its activation memory did not fit beside the other contexts'
            raise SpotError("TensorRT could not create another execution context (GPU memory)",
                            "serve fewer engines, or check the memory plan (`spot-export --plan DEVICE --engines N`)")
        self.inputs, self.outputs = list(model.inputs), list(model.outputs)
        self.stream = torch.cuda.Stream()
        self.profile = -1

    def _torch_dtype(self, name: str):
        trt, torch = self.trt, self.torch
        table = {trt.float32: torch.float32, trt.float16: torch.float16, trt.int64: torch.int64,
                 trt.int32: torch.int32, trt.bool: torch.bool}
        return table[self.engine.get_tensor_dtype(name)]

    def run(self, feeds: dict, profile: int, wanted: list[str]) -> dict:
        """feeds: input name -> contiguous CUDA tensor. Returns the wanted outputs (fresh CUDA tensors)."""
        torch = self.torch
        if profile != self.profile:
            self.context.set_optimization_profile_async(profile, self.stream.cuda_stream)
            self.profile = profile
        for name in self.inputs:
            t = feeds[name]
            if not t.is_contiguous():
                raise ValueError(f"input {name} must be contiguous")
            self.context.set_input_shape(name, tuple(t.shape))
            self.context.set_tensor_address(name, t.data_ptr())
        outs = {}
        for name in self.outputs:
            shape = tuple(self.context.get_tensor_shape(name))
            outs[name] = torch.empty(shape, dtype=self._torch_dtype(name), device="cuda")
            self.context.set_tensor_address(name, outs[name].data_ptr())
        self.stream.wait_stream(torch.cuda.current_stream())
        if not self.context.execute_async_v3(self.stream.cuda_stream):
            raise SpotError("TensorRT execution failed (see its log)")
        torch.cuda.current_stream().wait_stream(self.stream)
        return {n: outs[n] for n in wanted}


class TrtEngine(PlannedCacheLimits, Engine):
    """Engine over a built TensorRT engine: static shapes (capacity x node buckets), device-resident KV cache.
    `block_logits` returns host logits (the Engine contract, for tests and the host step function);
    `block_epilogue` keeps the logits on the device and returns only the epilogue's small outputs, and the decoders
    use it (`block_outputs`) unless sampler_steps is None (then F samples on the host from copied logits)."""

    name = "tensorrt"

    def __init__(self, model_dir: str | Path, engine_file: str | Path | None = None,
                 options: BuildOptions = BuildOptions(), sampler_steps: int | None = DEFAULT_SAMPLER_STEPS):
        self._attach(load_trt_model(model_dir, engine_file, options), sampler_steps)

    @classmethod
    def over(cls, model: TrtModel, sampler_steps: int | None = DEFAULT_SAMPLER_STEPS) -> "TrtEngine":
        """An engine over a deserialized engine other TrtEngines use as well: its own execution context and KV
        cache, the weights shared."""
        engine = cls.__new__(cls)
        engine._attach(model, sampler_steps)
        return engine

    def _attach(self, model: TrtModel, sampler_steps: int | None) -> None:
        torch = _torch_cuda()
        self.torch = torch
        self.exported = model.exported
        super().__init__(self.exported.config, self.exported.block_size)
        self.plan = model.plan
        self.runner = TrtRunner(model)
        cfg = self.config
        dt = {"fp32": torch.float32, "fp16": torch.float16}[self.exported.dtype]
        self.kv_dtype = dt
        self.cache = StaticKVCache(cfg.num_hidden_layers, cfg.num_key_value_heads, self.plan.capacities[0],
                                   cfg.head_dim, dt, like=torch.empty(0, device="cuda"))
        self._future_steps = sampler_steps
        # positions per epilogue call (memory): the export's choice, else the default for this vocabulary
        epilogue = self.exported.manifest.graphs.epilogue
        self._epilogue_positions = int(epilogue and epilogue.positions_per_call or default_epilogue_positions(
            cfg.vocab_size, self.block_size, sampler_steps or 0))

    @property
    def sampler_depth(self) -> int | None:
        return self._future_steps

    @property
    def placement(self) -> dict[str, str]:
        """The GPU by name (a tuned budget holds for one device: spot.app.tuned_budgets), where F samples, the KV cache."""
        return {"device": f"tensorrt ({gpu_name()})", "sampler": "host" if self._future_steps is None else "device",
                "kv_cache": "device"}

    def _run(self, ids: np.ndarray, wanted: list[str]) -> dict:
        torch = self.torch
        n, s = ids.shape
        self.cache.ensure(self.plan.capacity_for(self.cache.length + s))
        feeds = {"input_ids": torch.from_numpy(np.ascontiguousarray(ids, np.int64)).cuda(),
                 "position_ids": torch.arange(self.cache.length, self.cache.length + s, device="cuda"),
                 "attn_bias": self.cache.bias(s, self.block_size, np.float32).to(self.kv_dtype).contiguous(),
                 **self.cache.feeds()}
        return self.runner.run(feeds, self.plan.profile_index(self.cache.capacity, s), wanted)

    def _release(self) -> None:       # its context and device KV cache; the engine goes with its last context
        self.runner = self.cache = None

    def _reset(self) -> None:
        self.cache.reset()

    def _prefill(self, ids: np.ndarray) -> None:
        for start in range(0, ids.shape[0], self.plan.prefill_chunk):
            out = self._run(ids[start:start + self.plan.prefill_chunk][None], ["new_k", "new_v"])
            self.cache.append(out["new_k"][:, 0], out["new_v"][:, 0])

    def _device_logits(self, states: np.ndarray, store: np.ndarray | None = None):
        """Logits [N,B,V] float32 as a CUDA tensor (padded rows dropped); with `store`, the fused pass (N = 1):
        [store, state] as 2B tokens (the plan's prefill profile), store's K/V cached, the state's rows returned."""
        n = states.shape[0]
        if store is None:
            return self._run(pad_nodes(states, self.plan.nodes_for(n)), ["logits"])["logits"][:n]
        b = self.block_size
        out = self._run(np.concatenate([store, states[0]])[None], ["logits", "new_k", "new_v"])
        self.cache.append(out["new_k"][:, 0, :, :b], out["new_v"][:, 0, :, :b])
        return out["logits"][:, b:]

    def _block_logits(self, states: np.ndarray) -> np.ndarray:
        return self._device_logits(states).cpu().numpy()

    def block_epilogue(self, states: np.ndarray, node_steps, sampling, block: int, future_steps: int):
        """The sampling epilogue over every state of one pass (spot.reference.noise_torch.epilogue_torch): returns
        spot.folder.epilogue.EpilogueResult with O(N x B x (D + 32)) values copied to the host. The decoders use
        `block_outputs`, which runs it per state on demand."""
        self._check_caller()
        check_sampling(sampling)
        logits = self._finite_device_logits(self._check_states(states))
        return self._epilogue(logits, node_steps, sampling, block, future_steps)

    def _store_and_logits(self, store: np.ndarray, state: np.ndarray) -> np.ndarray:
        return self._device_logits(state[None], store).cpu().numpy()

    def _finite_device_logits(self, states: np.ndarray, store: np.ndarray | None = None):
        logits = self._device_logits(states, store)
        # before the twin: NaN / inf logits can turn its table lookups' indices out of range (on CUDA a device-side
        # assert that ends the process); one reduction on the device
        if not bool(logits.isfinite().all()):
            self._non_finite()
        return logits

    def _epilogue(self, logits, node_steps, sampling, block: int, future_steps: int, positions: int | None = None):
        """The torch twin over logits [N, B, V], `positions` of B per call (default: all)."""
        # torch: optional extra (spot.reference.noise_torch imports it)
        from spot.reference.noise_torch import epilogue_torch
        b = logits.shape[1]
        p = positions or b

        def run(first: int) -> EpilogueResult:
            out = epilogue_torch(logits[:, first:first + p], node_steps, sampling.seed, block, sampling.temperature,
                                 sampling.top_k, future_steps, sampling.exclude_token, first_position=first)
            return EpilogueResult(*(out[f].cpu().numpy() for f in OUTPUTS))
        return join_runs(b, p, run)

    def _block_outputs(self, states: np.ndarray, steps: np.ndarray, sampling, block: int, noise,
                       store: np.ndarray | None = None) -> list:
        """As OrtEngine's: the logits stay on the device and each state's epilogue runs when the walk or the next
        round first reads it (DeferredOutputs), over that state's rows only."""
        if self._future_steps is None:
            return super()._block_outputs(states, steps, sampling, block, noise, store)
        check_sampling(sampling)
        logits = self._finite_device_logits(states, store)

        def sample(i: int):
            t0 = time.perf_counter()
            result = self._epilogue(logits[i:i + 1], steps[i:i + 1], sampling, block, self._future_steps,
                                    self._epilogue_positions)
            self.epilogue_states += 1
            self.epilogue_seconds += time.perf_counter() - t0
            return sampled_outputs(result, steps[i:i + 1])[0]
        return [DeferredOutputs(partial(sample, i)) for i in range(states.shape[0])]

    def _store(self, state: np.ndarray) -> None:
        out = self._run(state[None], ["new_k", "new_v"])
        self.cache.append(out["new_k"][:, 0], out["new_v"][:, 0])
