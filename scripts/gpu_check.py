"""GPU check: every GPU path present on this machine against the CPU reference, in one run (< 8 minutes).

    python scripts/gpu_check.py [--out DIR] [--quick] [--budget-s 420]      (scripts/gpu_check.sh wraps it)

Paths, each run only when present: torch CUDA (TorchEngine), ONNX Runtime CUDA EP and TensorRT EP (OrtEngine,
StaticOrtEngine), TensorRT (TrtEngine, needs tensorrt + torch CUDA), the sampling epilogue on ORT CUDA and on torch
CUDA. Checks: logits vs the CPU torch reference (max |diff| relative to max |logit|), token identity of standard
decoding vs the CPU (T = 0 and T = 1), SPOT (the training-free tree decoder: the test model is random, so no
learned drafter fits it) equal to standard decoding on the same engine, epilogue bit identity vs numpy. Reports
latency vs node count and the SPOT vs standard speed-up, latency(N) of a verify pass on CUDA beside the roofline
projection of spot-export --plan (spot.export.roofline) for this GPU (--roofline-figures GBS,TFLOPS for one the
script does not know), and writes gpu_check.json to --out (default: $OUT, else the current folder).
Without a GPU it still runs the CPU parts (ORT CPU, the epilogue on ORT CPU) so the script itself is tested.
Every section is guarded: a failure is recorded in the report and the next section runs.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from spot.config import ModelConfig  # noqa: E402
from spot.runtime.step import Sampling  # noqa: E402

QUICK = ModelConfig(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=512,
                    block_size=8, mask_token_id=511, stop_ids=(510,))
# big enough that a GPU pass is not pure launch overhead, small enough to export and run in seconds
FULL = ModelConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=6,
                   num_attention_heads=16, num_key_value_heads=4, head_dim=64, max_position_embeddings=2048,
                   block_size=16, mask_token_id=31999, stop_ids=(31998,))


NEW_BLOCKS = 3          # blocks generated per decode (each block is B standard passes)


class Report:
    def __init__(self, budget_s: float):
        self.t0 = time.time()
        self.budget_s = budget_s
        self.data: dict = {"env": {}, "model": {}, "checks": [], "info": [], "latency_ms": {}, "speedup": {},
                           "errors": [], "skipped": []}

    def left(self) -> float:
        return self.budget_s - (time.time() - self.t0)

    def section(self, name: str, fn, min_left: float = 20.0):
        if self.left() < min_left:
            self.data["skipped"].append(f"{name}: time budget")
            print(f"[skip] {name}: time budget", flush=True)
            return None
        t = time.time()
        print(f"[run ] {name}", flush=True)
        try:
            out = fn()
            print(f"[done] {name} ({time.time() - t:.1f}s)", flush=True)
            return out
        except Exception as e:  # one failing backend must not hide the others' results
            self.data["errors"].append({"section": name, "error": f"{type(e).__name__}: {e}",
                                        "traceback": traceback.format_exc()[-2000:]})
            print(f"[fail] {name}: {type(e).__name__}: {e}", flush=True)
            return None

    def info(self, name: str, **details):
        """A measured fact with no pass/fail (e.g. fp16 token agreement with the fp32 CPU reference)."""
        self.data["info"].append({"name": name, **details})
        print(f"       INFO {name} {json.dumps(details, default=str)[:300]}", flush=True)

    def check(self, name: str, passed: bool, **details):
        self.data["checks"].append({"name": name, "passed": bool(passed), **details})
        print(f"       {'PASS' if passed else 'FAIL'} {name} {json.dumps(details, default=str)[:300]}", flush=True)


def environment() -> dict:
    env = {"python": sys.version.split()[0], "platform": platform.platform(), "machine": platform.machine(),
           "numpy": np.__version__}
    try:
        import torch
        env["torch"] = torch.__version__
        env["torch_cuda"] = torch.cuda.is_available()
        if torch.cuda.is_available():
            env["gpu"] = torch.cuda.get_device_name(0)
            env["cuda"] = torch.version.cuda
    except ImportError:
        env["torch"] = None
    try:
        import onnxruntime as ort
        env["onnxruntime"] = ort.__version__
        env["ort_providers"] = ort.get_available_providers()
    except ImportError:
        env["onnxruntime"] = None
    try:
        import tensorrt
        env["tensorrt"] = tensorrt.__version__
    except ImportError:
        env["tensorrt"] = None
    try:
        import spot.runtime.decode_plan  # noqa: F401
        env["spot_decoders"] = True
    except ImportError:
        env["spot_decoders"] = False
    return env


def make_model(cfg: ModelConfig, work: Path) -> dict:
    import torch

    from spot.export.export import export_checkpoint
    from spot.export.options import ExportOptions
    from spot.export.presets import resolve_source
    from spot.reference.model import random_model
    torch.manual_seed(0)
    model = random_model(cfg, seed=0, scale=0.05)
    model.save_pretrained(work / "ckpt")
    folders = {}
    for dtype in ("fp32", "fp16"):
        folders[dtype] = export_checkpoint(resolve_source(str(work / "ckpt")), work / f"onnx-{dtype}",
                                           ExportOptions(dtype=dtype, max_nodes=16, validate=False))
    # the device sampler's epilogue in runs of 2 positions per call (what --epilogue-positions does at SDAR's
    # vocabulary): in-place bindings at offsets inside a state's rows
    folders["fp16-runs"] = export_checkpoint(resolve_source(str(work / "ckpt")), work / "onnx-fp16-runs",
                                             ExportOptions(dtype="fp16", max_nodes=16, validate=False,
                                                           epilogue_positions=2))
    return {"model": model, "folders": folders}


def prompts(cfg: ModelConfig, n: int = 2, length: int = 21) -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    return [rng.integers(0, cfg.vocab_size - 2, length) for _ in range(n)]


def states(cfg: ModelConfig, n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    s = rng.integers(0, cfg.vocab_size - 2, (n, cfg.block_size))
    s[rng.random(s.shape) < 0.5] = cfg.mask_token_id
    return s


def logits_diff(engine, reference, cfg: ModelConfig) -> dict:
    rng = np.random.default_rng(1)
    worst, scale = 0.0, 0.0
    for blocks in (0, 2, 5):
        ids = rng.integers(0, cfg.vocab_size - 2, blocks * cfg.block_size)
        engine.prefill(ids)
        reference.prefill(ids)
        for n in (1, 4, 16):
            st = states(cfg, n, seed=blocks * 10 + n)
            a, b = engine.block_logits(st), reference.block_logits(st)
            worst, scale = max(worst, float(np.abs(a - b).max())), max(scale, float(np.abs(b).max()))
    return {"max_abs": worst, "max_ref": scale, "rel": worst / max(scale, 1.0)}


def decode(engine, prompt, temperature: float, decoder: str = "standard"):
    """Standard decoding (spot.runtime.decode), or a SPOT decoder by name (spot.runtime.decode_plan, guarded)."""
    sampling = Sampling(temperature=temperature, seed=11)
    t = time.perf_counter()
    if decoder == "standard":
        from spot.runtime.decode import generate
        gen = generate(engine, prompt, max_new_tokens=NEW_BLOCKS * engine.block_size, sampling=sampling, stop_ids=())
    else:
        from spot.runtime.decode_plan import DecodeRequest, run_decoder
        from spot.runtime.spot import TreeBudget
        req = DecodeRequest(max_new_tokens=NEW_BLOCKS * engine.block_size, sampling=sampling,
                            budget=TreeBudget(nodes=16, depth=min(8, engine.block_size)), stop_ids=())
        gen = run_decoder(decoder, engine, prompt, req)
    return gen, time.perf_counter() - t


def check_engine(rep: Report, name: str, engine, reference, cfg: ModelConfig, tol: float, cpu_tokens: dict):
    """Logits within `tol` of the CPU reference; standard decoding tokens equal to the CPU's. fp16 engines cannot
    be expected to reproduce fp32 tokens (near-ties flip), so their token agreement is reported as info."""
    d = logits_diff(engine, reference, cfg)
    rep.check(f"{name}: logits vs CPU reference", d["rel"] <= tol, tolerance=tol, **d)
    for temp in (0.0, 1.0):
        same = [decode(engine, p, temp)[0].token_ids == cpu_tokens[(i, temp)] for i, p in enumerate(prompts(cfg))]
        label = f"{name}: standard decoding tokens == CPU fp32 (T={temp})"
        if "fp16" in name:
            rep.info(label, identical=sum(same), of=len(same))
        else:
            rep.check(label, all(same), identical=sum(same), of=len(same))


def latency(rep: Report, name: str, engine, cfg: ModelConfig, epilogue=None, reps: int = 10):
    """Median ms of one block pass vs node count (after a 5-block prefill); with the epilogue when given."""
    engine.prefill(np.arange(5 * cfg.block_size) % (cfg.vocab_size - 2))
    out = {}
    for n in (1, 2, 4, 8, 16):
        st = states(cfg, n)
        fn = (lambda: engine.block_logits(st)) if epilogue is None else (lambda: epilogue(st))
        fn()
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e3)
        out[n] = round(statistics.median(times), 3)
    rep.data["latency_ms"][name] = out
    print(f"       latency {name}: {out}", flush=True)


# Known GPUs for the roofline comparison: (substring of the name torch reports, memory GB/s, dense fp16 tensor
# TFLOP/s) from NVIDIA's product pages (H100 SXM5 / PCIe / NVL, H200 SXM, A100 80GB SXM); a Jetson is recognised by
# its board's model string (/proc/device-tree/model) and takes spot.export.memory_plan.DEVICES' figures.
GPU_FIGURES = (("H100 PCIe", 2000.0, 756.0), ("H100 NVL", 3900.0, 835.0), ("H100", 3350.0, 989.4),
               ("H200", 4800.0, 989.4), ("A100", 2039.0, 312.0))
JETSONS = (("Orin Nano", "orin-nano-8gb"), ("Orin NX", "orin-nx-16gb"), ("AGX Orin", "agx-orin-64gb"))


def roofline_device(override: str | None):
    """The memory_plan.Device whose figures the projection uses: --roofline-figures, a known GPU, a Jetson board,
    or None (then latency(N) is measured and the projection left out)."""
    from spot.export.memory_plan import DEVICES, Device
    if override:
        gbs, tflops = (float(x) for x in override.split(","))
        return Device("given", f"--roofline-figures {override}", 0, gbs, fp16_tflops=tflops)
    try:
        import torch
        name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else ""
    except ImportError:
        name = ""
    for part, gbs, tflops in GPU_FIGURES:
        if part in name:
            return Device(part, name, 0, gbs, fp16_tflops=tflops)
    board = Path("/proc/device-tree/model")
    model = board.read_text(errors="replace") if board.is_file() else ""
    for part, key in JETSONS:
        if part in model:
            return DEVICES[key]
    return None


def projected_vs_measured(rep: Report, name: str, engine, folder, cfg: ModelConfig, device, dtype: str = "fp16"):
    """latency(N) of one pass (the decoders' block_outputs, spot.runtime.tuning.measure_latency_curve) at half the
    model's context, beside the roofline projection spot-export --plan prints for that device: measured / projected
    per node count (a projection is a bound-based estimate: the ratio is the finding, not a pass/fail)."""
    from spot.folder.manifest import load_manifest
    from spot.export.roofline import pass_cost, pass_ms
    from spot.runtime.tuning import measure_latency_curve
    context = cfg.max_position_embeddings // 2 // cfg.block_size * cfg.block_size
    prefix = np.arange(context) % (cfg.vocab_size - 2)
    curve = measure_latency_curve(engine, prefix, [1, 2, 4, 8, 16], repeats=5)
    weights = load_manifest(folder).manifest.memory["weight_bytes"]
    rows = {}
    for n, ms in curve.items():
        row = {"measured_ms": round(ms, 3)}
        if device is not None:
            projected, bound = pass_ms(pass_cost(cfg, dtype, weights, n, context), device, dtype)
            row |= {"projected_ms": round(projected, 3), "bound": bound,
                    "measured_over_projected": round(ms / projected, 2)}
        rows[n] = row
    rep.info(f"{name}: latency(N) measured vs roofline projection at {context} cached tokens",
             device=None if device is None else {"name": device.name, "bandwidth_gbs": device.bandwidth_gbs,
                                                 "fp16_tflops": device.fp16_tflops},
             rows=rows, note=None if device is not None else "no figures for this device: --roofline-figures")
    rep.data["latency_ms"][f"{name} vs projection"] = rows


def speedup(rep: Report, name: str, engine, cfg: ModelConfig):
    """Standard vs SPOT (the training-free tree decoder) on the same engine: wall time and target passes."""
    if not rep.data["env"].get("spot_decoders"):
        rep.data["skipped"].append(f"{name} speed-up: spot.runtime.decode_plan is not importable")
        return
    rows = {}
    for temp in (0.0, 1.0):
        std_s, tree_s, std_p, tree_p, same = 0.0, 0.0, 0, 0, True
        for p in prompts(cfg):
            g0, t0 = decode(engine, p, temp, "standard")
            g1, t1 = decode(engine, p, temp, "tree")
            std_s, tree_s = std_s + t0, tree_s + t1
            std_p, tree_p = std_p + g0.stats.target_passes, tree_p + g1.stats.target_passes
            same = same and g0.token_ids == g1.token_ids
        rows[f"T={temp}"] = {"standard_s": round(std_s, 4), "spot_tree_s": round(tree_s, 4),
                             "speedup": round(std_s / tree_s, 3), "standard_passes": std_p, "spot_passes": tree_p}
        rep.check(f"{name}: SPOT (tree) output == standard (T={temp})", same)
    rep.data["speedup"][name] = rows
    print(f"       speed-up {name}: {rows}", flush=True)


def kv_places(rep: Report, name: str, folder, cfg: ModelConfig, device: str, sampler: str):
    """The device KV cache (kv_append.onnx) beside the host cache: the same tokens, and the wall time of tree
    decoding at T = 1 measured alternately, prompt by prompt, with prompts that fill the context (what it saves on a
    GPU: the cache's copy to the device on every pass; on the CPU both are host memory)."""
    from spot.engines.ort_engine import OrtEngine
    engines = {kv: OrtEngine(folder, device=device, sampler=sampler, kv_cache=kv) for kv in ("host", "device")}
    long = prompts(cfg, 2, cfg.max_position_embeddings - (NEW_BLOCKS + 1) * cfg.block_size)
    for eng in engines.values():                 # first-call allocations out of the timing
        decode(eng, long[0], 1.0, "tree")
    seconds, same = {"host": 0.0, "device": 0.0}, []
    for p in long:
        tokens = {}
        for kv, eng in engines.items():
            gen, s = decode(eng, p, 1.0, "tree")
            seconds[kv] += s
            tokens[kv] = gen.token_ids
        same.append(tokens["host"] == tokens["device"])
    rep.check(f"{name}: device KV cache == host KV cache, tree decoder (T=1)", all(same), identical=sum(same),
              of=len(same))
    row = {"prompt_tokens": len(long[0]), "host_cache_s": round(seconds["host"], 4),
           "device_cache_s": round(seconds["device"], 4), "speedup": round(seconds["host"] / seconds["device"], 3)}
    rep.data["speedup"][f"{name} device KV cache"] = row
    print(f"       device KV cache {name}: {row}", flush=True)


def device_sampler(rep: Report, name: str, folders: dict, cfg: ModelConfig, device: str):
    """The device sampler (the export's epilogue bound to the target's logits where they are, one state per call,
    whole blocks or runs of 2 positions) against the host sampler: the same tokens for the tree decoder at T = 0 and
    1, and one sampled state per commit step."""
    from spot.engines.ort_engine import OrtEngine
    host = OrtEngine(folders["fp16"], device=device, sampler="host", kv_cache="host")
    for kind in ("fp16", "fp16-runs"):
        dev = OrtEngine(folders[kind], device=device, sampler="device", kv_cache="host")
        for temp in (0.0, 1.0):
            runs = [(decode(host, p, temp, "tree")[0], decode(dev, p, temp, "tree")[0]) for p in prompts(cfg)]
            same = [a.token_ids == b.token_ids for a, b in runs]
            per_step = [b.stats.epilogue.states == b.stats.steps for _, b in runs]
            rep.check(f"{name} {kind}: device sampler == host sampler, tree decoder (T={temp})",
                      all(same) and all(per_step), identical=sum(same), of=len(same), once_per_step=all(per_step))


def tuner(rep: Report, name: str, engine, cfg: ModelConfig):
    """The budget tuner on this engine (spot.app.bench_run.tune_budget, training-free tree decoder, T = 1): the latency
    curve as the decoders' passes run, the chosen budget, and that budget beside standard decoding in one run — the
    tokens/s ratio reported against the tuner's promise (>= 0.95; it picks 1 node where no tree pays), identical
    outputs checked."""
    from spot.app.bench_run import BenchConfig, check_tuned_budget, tune_budget
    from spot.prompts import Prompt
    from spot.runtime.spot import TreeBudget
    ps = [Prompt(f"p{i}", p.tolist()) for i, p in enumerate(prompts(cfg))]
    cands = [TreeBudget(n, min(d, cfg.block_size)) for n, d in ((2, 1), (4, 3), (8, 4), (16, 8))]
    tune = tune_budget(engine, ps, 1.0, cands, decoder="tree", node_counts=(1, 2, 4, 8, 16))
    check = check_tuned_budget(engine, ps, tune, BenchConfig(max_new_tokens=NEW_BLOCKS * cfg.block_size), "tree")
    rep.data["speedup"][f"{name} tuner"] = {"latency_ms": tune["latency_ms"], "choice": tune["choice"],
                                           "check": check}
    # pass/fail on exactness only: the tokens/s ratio is a measurement (reported), not a check a busy machine fails
    rep.check(f"{name}: the tuned budget keeps outputs identical to standard decoding (T=1)",
              all(v == 1.0 for v in check["identical_share"].values()), budget=check["budget"],
              ratio=check["tokens_per_s_ratio_to_standard"], within_5_percent=check["within_5_percent"])
    print(f"       tuner {name}: {tune['choice']} -> {check['tokens_per_s_ratio_to_standard']}", flush=True)


def epilogue_checks(rep: Report, cfg: ModelConfig, providers: list, tag: str, nodes: int = 8, future: int = 3):
    from spot.export.epilogue_graph import EpilogueSpec, build_epilogue, reference_epilogue
    from spot.folder.epilogue import OUTPUTS, make_epilogue_session, run_epilogue
    import onnxruntime as ort
    rng = np.random.default_rng(5)
    logits = (rng.standard_normal((nodes, cfg.block_size, cfg.vocab_size)) * 3).astype(np.float32)
    steps = np.arange(nodes)
    model = build_epilogue(EpilogueSpec(cfg.vocab_size, cfg.block_size, future))
    if providers[0] != "CPUExecutionProvider":   # does every node run on the GPU?
        so = ort.SessionOptions()
        so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
        try:
            ort.InferenceSession(model.SerializeToString(), so, providers=providers)
            rep.data["model"][f"epilogue_{tag}_all_nodes_on_device"] = True
        except Exception as e:
            rep.data["model"][f"epilogue_{tag}_all_nodes_on_device"] = False
            rep.data["model"][f"epilogue_{tag}_fallback_reason"] = str(e)[:500]
    session = make_epilogue_session(model, providers=providers)
    for temp in (0.0, 0.5, 1.0):
        sampling = Sampling(temperature=temp, seed=3)
        t = time.perf_counter()
        got = run_epilogue(session, logits, steps, sampling, block=2)
        ms = (time.perf_counter() - t) * 1e3
        want = reference_epilogue(logits, steps, sampling, 2, future)
        equal = {f: bool(np.array_equal(getattr(got, f), getattr(want, f))) for f in OUTPUTS}
        rep.check(f"epilogue ({tag}) bit-identical to numpy (T={temp})", all(equal.values()), fields=equal,
                  ms=round(ms, 2))


def epilogue_cost(rep: Report):
    """benchmarks/epilogue_cost.py on ORT CUDA at SDAR's vocabulary: certified vs exact-everywhere vs native."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from epilogue_cost import measure
    result = measure(151936, 32, 4, 1, 3, ["CUDAExecutionProvider", "CPUExecutionProvider"], log=print)
    rep.info("epilogue cost, ORT CUDA, V 151936, B 32, D 4, 1 state", **result)
    rep.check("epilogue (ort-cuda, V 151936): certified == exact noise everywhere", result["certified_equals_exact"])


def torch_epilogue_checks(rep: Report, cfg: ModelConfig):
    import torch

    from spot.export.epilogue_graph import reference_epilogue
    from spot.folder.epilogue import OUTPUTS
    from spot.reference.noise_torch import epilogue_torch
    rng = np.random.default_rng(6)
    logits = (rng.standard_normal((8, cfg.block_size, cfg.vocab_size)) * 3).astype(np.float32)
    dev = torch.from_numpy(logits).cuda()
    for temp in (0.0, 0.5, 1.0):
        torch.cuda.synchronize()
        t = time.perf_counter()
        out = epilogue_torch(dev, np.arange(8), 3, 2, temp, 0, 3, exclude_token=cfg.mask_token_id)
        torch.cuda.synchronize()
        ms = (time.perf_counter() - t) * 1e3
        want = reference_epilogue(logits, np.arange(8), Sampling(temperature=temp, seed=3,
                                                                 exclude_token=cfg.mask_token_id), 2, 3)
        equal = {f: bool(np.array_equal(out[f].cpu().numpy(), getattr(want, f))) for f in OUTPUTS}
        rep.check(f"epilogue (torch CUDA) bit-identical to numpy (T={temp})", all(equal.values()), fields=equal,
                  ms=round(ms, 2))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--quick", action="store_true", help="tiny model (CPU smoke test of the script)")
    ap.add_argument("--full", action="store_true", help="the larger test model even without a GPU")
    ap.add_argument("--budget-s", type=float, default=420.0, help="stop starting sections after this many seconds")
    ap.add_argument("--roofline-figures", default=None, metavar="GBS,TFLOPS",
                    help="memory GB/s and dense fp16 TFLOP/s of this GPU, for the projected latency(N)")
    args = ap.parse_args(argv)
    rep = Report(args.budget_s)
    rep.data["env"] = env = environment()
    print(json.dumps(env), flush=True)
    has_cuda = bool(env.get("torch_cuda"))
    quick = args.quick or not (args.full or has_cuda or "CUDAExecutionProvider" in env.get("ort_providers", []))
    cfg = QUICK if quick else FULL
    rep.data["model"]["config"] = cfg.to_dict()
    rep.data["model"]["quick"] = quick
    work = Path(tempfile.mkdtemp(prefix="spot-gpu-check-"))
    made = rep.section("export the test model", lambda: make_model(cfg, work), min_left=60)
    if made is None:
        return finish(rep, args.out)
    import torch
    # tiny models: torch's CPU thread pool costs more than it saves; the full model uses up to 8 cores
    torch.set_num_threads(1 if quick else min(8, os.cpu_count() or 1))
    from spot.engines.ort_engine import OrtEngine
    from spot.engines.torch_engine import TorchEngine
    cpu_ref = TorchEngine(made["model"], device="cpu")
    cpu_tokens = {}

    def reference_tokens():
        for i, p in enumerate(prompts(cfg)):
            for temp in (0.0, 1.0):
                cpu_tokens[(i, temp)] = decode(cpu_ref, p, temp)[0].token_ids
    rep.section("CPU reference decoding", reference_tokens)

    def ort_cpu():
        eng = OrtEngine(made["folders"]["fp32"], device="cpu")
        check_engine(rep, "ort-cpu fp32", eng, cpu_ref, cfg, 1e-4, cpu_tokens)
        latency(rep, "ort-cpu fp32", eng, cfg, reps=3)
        if quick:   # on GPU machines the CPU speed-up is not the point and costs a minute
            speedup(rep, "ort-cpu fp32", eng, cfg)
            kv_places(rep, "ort-cpu fp32", made["folders"]["fp32"], cfg, "cpu", "host")
            tuner(rep, "ort-cpu fp32", eng, cfg)
            device_sampler(rep, "ort-cpu", made["folders"], cfg, "cpu")
            # the measurement half of the CUDA section's comparison (no CPU figures: no projection)
            projected_vs_measured(rep, "ort-cpu fp32", eng, made["folders"]["fp32"], cfg, None, "fp32")
    rep.section("ONNX Runtime CPU", ort_cpu)
    # the epilogue's float64 work is slow on a CPU core (benchmarks/epilogue_cost.py): keep the CPU case small
    rep.section("epilogue on ORT CPU", lambda: epilogue_checks(rep, cfg, ["CPUExecutionProvider"], "ort-cpu",
                                                                nodes=8 if quick else 2, future=3 if quick else 1))

    if has_cuda:
        def torch_cuda():
            eng = TorchEngine(made["model"], device="cuda")
            check_engine(rep, "torch-cuda fp32", eng, cpu_ref, cfg, 1e-3, cpu_tokens)
            latency(rep, "torch-cuda fp32", eng, cfg)
            speedup(rep, "torch-cuda fp32", eng, cfg)
        rep.section("torch CUDA", torch_cuda)
        rep.section("epilogue on torch CUDA", lambda: torch_epilogue_checks(rep, cfg))
    if "CUDAExecutionProvider" in env.get("ort_providers", []):
        def ort_cuda():
            from spot.engines.buckets import BucketPlan
            from spot.engines.static_ort import StaticOrtEngine
            for dtype, tol in (("fp32", 1e-3), ("fp16", 2e-2)):
                eng = OrtEngine(made["folders"][dtype], device="cuda", sampler="host", kv_cache="host")
                check_engine(rep, f"ort-cuda {dtype}", eng, cpu_ref, cfg, tol, cpu_tokens)
                latency(rep, f"ort-cuda {dtype}", eng, cfg)
                speedup(rep, f"ort-cuda {dtype}", eng, cfg)
            # the device sampler: logits stay on the GPU (IOBinding into epilogue.onnx), tokens must not change
            device_sampler(rep, "ort-cuda", made["folders"], cfg, "cuda")
            dev = OrtEngine(made["folders"]["fp16"], device="cuda", sampler="device", kv_cache="host")
            speedup(rep, "ort-cuda fp16 device sampler", dev, cfg)
            kv_places(rep, "ort-cuda fp16", made["folders"]["fp16"], cfg, "cuda", "device")
            auto = OrtEngine(made["folders"]["fp16"], device="cuda")
            tuner(rep, "ort-cuda fp16 (auto: device sampler and KV cache)", auto, cfg)
            projected_vs_measured(rep, "ort-cuda fp16 (auto)", auto, made["folders"]["fp16"], cfg,
                                  roofline_device(args.roofline_figures))
            plan = BucketPlan.default(cfg.max_position_embeddings, cfg.block_size, 16, smallest=128)
            eng = StaticOrtEngine(made["folders"]["fp16"], plan, device="cuda")
            check_engine(rep, "ort-cuda-static fp16", eng, cpu_ref, cfg, 2e-2, cpu_tokens)
            latency(rep, "ort-cuda-static fp16", eng, cfg)
        rep.section("ONNX Runtime CUDA EP", ort_cuda)
        rep.section("epilogue on ORT CUDA EP", lambda: epilogue_checks(
            rep, cfg, ["CUDAExecutionProvider", "CPUExecutionProvider"], "ort-cuda"))
        if not quick:
            rep.section("epilogue cost on ORT CUDA EP, SDAR vocabulary", lambda: epilogue_cost(rep), min_left=90)
    if "TensorrtExecutionProvider" in env.get("ort_providers", []):
        def ort_trt():
            t = time.time()
            eng = OrtEngine(made["folders"]["fp16"], device="trt")
            # the export's shape profile (graphs.target.tensorrt_profile) makes the first pass build the engine
            # once; every later pass, at any cache length, should only run it
            eng.prefill(np.arange(cfg.block_size) % (cfg.vocab_size - 2))
            first_s = time.time() - t
            check_engine(rep, "ort-trt fp16", eng, cpu_ref, cfg, 2e-2, cpu_tokens)
            t = time.time()
            long_prompt = np.arange(cfg.max_position_embeddings // 2) % (cfg.vocab_size - 2)
            decode(eng, long_prompt[: len(long_prompt) // cfg.block_size * cfg.block_size], 0.0)
            rep.info("ort-trt fp16 engine builds", first_pass_with_build_s=round(first_s, 2),
                     long_request_s=round(time.time() - t, 2), profile=eng.trt_profile.to_dict()["max"])
            latency(rep, "ort-trt fp16", eng, cfg)
        rep.section("ONNX Runtime TensorRT EP", ort_trt, min_left=120)
    if env.get("tensorrt") and has_cuda:
        def tensorrt():
            from spot.engines.tensorrt_engine import BuildOptions, TrtEngine, build_engine
            opts = BuildOptions(max_nodes=16, max_context=cfg.max_position_embeddings, smallest_capacity=128,
                                workspace_gib=2.0)
            t = time.time()
            engine_file = build_engine(made["folders"]["fp16"], opts, work / "trt", progress=print)
            rep.data["model"]["trt_build_s"] = round(time.time() - t, 1)
            eng = TrtEngine(made["folders"]["fp16"], engine_file)
            check_engine(rep, "tensorrt fp16", eng, cpu_ref, cfg, 2e-2, cpu_tokens)
            latency(rep, "tensorrt fp16", eng, cfg)
            latency(rep, "tensorrt fp16 + epilogue (D=3)", eng, cfg,
                    epilogue=lambda st: eng.block_epilogue(st, np.zeros(len(st), np.int64), Sampling(1.0, seed=1),
                                                           0, 3))
            speedup(rep, "tensorrt fp16", eng, cfg)
        rep.section("TensorRT", tensorrt, min_left=150)
    return finish(rep, args.out)


def finish(rep: Report, out: str) -> int:
    rep.data["elapsed_s"] = round(time.time() - rep.t0, 1)
    rep.data["summary"] = {"checks": len(rep.data["checks"]),
                           "failed": [c["name"] for c in rep.data["checks"] if not c["passed"]],
                           "errors": [e["section"] for e in rep.data["errors"]]}
    path = Path(out)
    path.mkdir(parents=True, exist_ok=True)
    (path / "gpu_check.json").write_text(json.dumps(rep.data, indent=1, default=str))
    print(f"wrote {path / 'gpu_check.json'}: {json.dumps(rep.data['summary'])}", flush=True)
    return 1 if rep.data["summary"]["failed"] or rep.data["summary"]["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
