"""The C++ host (cpp/, docs/cpp-host.md): build it, reproduce the noise vectors, decode exported folders with every
decoder bit-identically to the Python runtime (token ids and pass counts), refuse bad input with codes + messages.

Skips only when no C++ toolchain or no ONNX Runtime / nlohmann/json headers can be obtained (cpp/fetch_ort_headers.sh
fetches them from Debian's registry); a failing build is a failure (OpenSSL's libcrypto: libssl-dev, .ci/run).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from spot.config import ModelConfig
from spot.engines.ort_engine import OrtEngine
from spot.export.export import export_checkpoint
from spot.export.options import ExportOptions
from spot.export.presets import resolve_source
from spot.reference.model import random_model
from spot.errors import SpotError
from spot.runtime.decode import FUSED, SEPARATE
from spot.runtime.drafter import DEFAULT_RUNNER_UP_WEIGHT, DEFAULT_SET_FLIP_WEIGHT, load_drafter
from spot.runtime.step import STATIC, THRESHOLD, CommitRule

ROOT = Path(__file__).resolve().parents[1]
CPP = ROOT / "cpp"
BUILD = CPP / "build"
sys.path.insert(0, str(ROOT / "scripts"))
from make_golden import (COMPARED, EMBEDDED_GOLDEN, REGENERATE_EMBEDDED, case_options, case_store,  # noqa: E402
                         embedded_drafter_dir, golden_cases, model_identity, pass_counts, run_case)
from tinymodels import (CONTRADICTIONS, RUNNER_UPS, contradicting_copy, make_format1, nan_weights_copy,  # noqa: E402
                        older_epilogue_copy, renamed_input_drafter, train_encoder_drafter,
                        without_kv_append)
from tree_cases import TREE_CASES, input_lines, python_answer  # noqa: E402

# a C++ build and minutes of decoding: the full run's (python3 -m pytest --full, as CI), not the default one's
pytestmark = pytest.mark.slow

# spot_status codes of cpp/include/spot/spot.h
INVALID_ARGUMENT, NOT_FOUND, CORRUPT, INCOMPATIBLE, UNSUPPORTED, RUNTIME = 1, 2, 3, 4, 5, 6

# vocab 300: the softmax sums take numpy's pairwise recursion (> 128 terms) with remainders (not a multiple of 8)
TINY = ModelConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=8, max_position_embeddings=512, block_size=8,
                   mask_token_id=299, stop_ids=(298,))


# -- build --------------------------------------------------------------------------------------------------------
def _run(cmd, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


@pytest.fixture(scope="session")
def spot_cli() -> Path:
    """cpp/build/spot_cli, configured and built here (make -j1: a shared 2-core machine)."""
    cxx = shutil.which(os.environ.get("CXX", "c++")) or shutil.which("g++") or shutil.which("clang++")
    if shutil.which("cmake") is None or cxx is None:
        pytest.skip("no C++ toolchain: the C++ host needs cmake and a C++17 compiler (apt-get install cmake g++)")
    fetch = _run(["bash", str(CPP / "fetch_ort_headers.sh")], env={**os.environ, "PYTHON": sys.executable})
    if fetch.returncode != 0:
        last = fetch.stderr.strip().splitlines()[-1] if fetch.stderr.strip() else "no output"
        pytest.skip(f"ONNX Runtime or nlohmann/json headers could not be obtained (cpp/fetch_ort_headers.sh): "
                    f"{last}")
    BUILD.mkdir(exist_ok=True)
    cfg = _run(["cmake", "-S", str(CPP), "-B", str(BUILD), "-DCMAKE_BUILD_TYPE=Release"])
    assert cfg.returncode == 0, cfg.stdout + cfg.stderr
    build = _run(["cmake", "--build", str(BUILD), "-j1"])
    assert build.returncode == 0, build.stdout[-4000:] + build.stderr[-4000:]
    exe = BUILD / "spot_cli"
    assert exe.is_file()
    return exe


def cli(exe: Path, *args, stdin: str | None = None) -> subprocess.CompletedProcess:
    return _run([str(exe), *map(str, args)], input=stdin, timeout=600)


def request_line(opts: dict, prompt_ids: list[int]) -> str:
    return (f"--decoder {opts['decoder']} --temperature {opts['temperature']!r} --seed {opts['seed']} "
            f"--tau {opts['tau']!r} --mode {opts['mode']} --max-new-tokens {opts['max_new_tokens']} "
            f"--budget {opts['budget']} --depth {opts['depth']} --top-k {opts.get('top_k', 0)} "
            f"--top-p {opts.get('top_p', 1.0)!r} --store {case_store(opts)} "
            f"--prompt-ids {','.join(map(str, prompt_ids)) or repr('')}")


def run_batch(exe: Path, folder: Path, drafter: Path | None, cases: list[dict], *open_flags: str) -> list[dict]:
    """Every case through one `spot_cli batch` process (opened with open_flags); one JSON result per case."""
    args = ["batch", "--model", folder] + (["--drafter", drafter] if drafter else []) + list(open_flags)
    proc = cli(exe, *args, stdin="\n".join(request_line(c, c["prompt_ids"]) for c in cases) + "\n")
    results = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    assert len(results) == len(cases), proc.stderr[-2000:]
    return results


def mismatches(cases: list[dict], results: list[dict]) -> list[str]:
    out = []
    for c, r in zip(cases, results):
        if "error" in r:
            out.append(f"{c['decoder']} T={c['temperature']} seed={c['seed']} prompt {c.get('prompt')}: {r['error']}")
            continue
        def same(k: str) -> bool:      # (passes: a case written before the fused kind lists no fused passes)
            return pass_counts(r[k]) == pass_counts(c["expected"][k]) if k == "passes" else r[k] == c["expected"][k]
        diff = [k for k in COMPARED if not same(k)]
        if diff:
            out.append(f"{c['decoder']} T={c['temperature']} seed={c['seed']} store={case_store(c)} "
                       f"prompt {c.get('prompt')}: "
                       + ", ".join(f"{k} python {c['expected'][k]} c++ {r[k]}" for k in diff))
    return out


# -- the tiny exported model and its drafter -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A peaked random target (scale 0.6, the mask id's lm_head row zeroed so that T = 0 never re-commits it),
    exported fp32, and a drafter trained for one epoch on its traces — without weight selection, so that its graph
    is the whole encoder (every input fed; the baseline graph has its own test)."""
    from spot.training.drafter import DrafterTrainSettings
    from spot.training.traces import TracePlan, collect_traces

    tmp = tmp_path_factory.mktemp("cpp_host")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = random_model(TINY, seed=3, scale=0.6)
        with torch.no_grad():
            model.lm_head.weight[TINY.mask_token_id] = 0.0
        model.save_pretrained(tmp / "ckpt")
        folder = export_checkpoint(resolve_source(str(tmp / "ckpt")), tmp / "onnx", ExportOptions(dtype="fp32"))
        engine = OrtEngine(folder)
        plan = TracePlan(temperatures=(0.0, 1.0), rules=(STATIC, THRESHOLD), tau=0.9, seeds=1, max_new_tokens=16,
                         depth=4)
        traces = collect_traces(engine, random_prompts(6, seed=11), plan)
        train_encoder_drafter(traces, tmp / "drafter", DrafterTrainSettings(epochs=1, batch_size=64,
                                                                            log_every=10 ** 6))
    finally:
        torch.set_num_threads(threads)
    return folder, tmp / "drafter", engine, load_drafter(tmp / "drafter")


def random_prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    # lengths below, at and above a block: leftover prompt tokens open the first decoded block
    return [rng.integers(0, TINY.vocab_size - 2, int(rng.integers(3, 21))).tolist() for _ in range(n)]


# -- tests ----------------------------------------------------------------------------------------------------------
def test_noise_reads_lines_of_five_counters_and_help_is_not_an_error(spot_cli):
    """Each line is one (seed, block, step, position, token): lines of another length are usage errors (they were
    joined into one stream of numbers, or silently dropped)."""
    for bad in ("1 2 3\n4 5\n", "1 2 3 4 5 6\n", "1 2 3\n", "1 2 3 4 -5\n"):
        proc = cli(spot_cli, "noise", stdin=bad)
        assert proc.returncode == 64 and "usage error: noise" in proc.stderr, (bad, proc.stderr)
    proc = cli(spot_cli, "noise", stdin="1 2 3 4 5\n\n0 0 0 0 4294967295\n")     # blank lines are skipped
    assert proc.returncode == 0 and len(proc.stdout.split("\n")) == 3
    proc = cli(spot_cli, "--help")
    assert proc.returncode == 0 and proc.stdout.startswith("usage: spot_cli generate")


def test_noise_vectors(spot_cli):
    vectors = json.loads((ROOT / "tests" / "data" / "noise_vectors.json").read_text())["vectors"]
    lines = "".join(f"{v['seed']} {v['block']} {v['step']} {v['position']} {v['token']}\n" for v in vectors)
    proc = cli(spot_cli, "noise", stdin=lines)
    assert proc.returncode == 0, proc.stderr
    got = proc.stdout.split("\n")[: len(vectors)]
    assert len(got) == len(vectors)
    for v, line in zip(vectors, got):
        a, b, u, g = line.split()
        assert (int(a, 16), int(b, 16)) == (v["a"], v["b"]), v
        assert float.fromhex(u) == float.fromhex(v["u"]), v
        assert float.fromhex(g) == float.fromhex(v["g"]), v


def test_noise_matches_numpy_on_a_field(spot_cli):
    """Beyond the vectors: 20k random counters, every Gumbel value bit-identical to spot.runtime.noise."""
    from spot.runtime.noise import gumbel

    rng = np.random.default_rng(5)
    c = rng.integers(0, 2 ** 32, size=(20000, 5), dtype=np.uint64)
    c[:10000, 1:] %= np.array([64, 32, 32, 151936], dtype=np.uint64)   # the typical range too
    proc = cli(spot_cli, "noise", stdin="".join(" ".join(map(str, row)) + "\n" for row in c.tolist()))
    assert proc.returncode == 0, proc.stderr
    got = np.array([float.fromhex(line.split()[3]) for line in proc.stdout.splitlines()])
    want = gumbel(*(c[:, i].astype(np.uint32) for i in range(5)))
    assert np.array_equal(got, want), int((got != want).sum())


def test_every_decoder_matches_the_python_runtime(spot_cli, tiny):
    """standard, threshold, chain, tree, spot, spot-sets at T = 0 and 1 (two seeds): identical token ids and passes;
    plus standard / chain / tree / spot under the threshold rule, spot-sets with a tau the drafter was not trained
    for, and a one-node budget."""
    folder, drafter_dir, engine, drafter = tiny
    prompts = random_prompts(4, seed=2)
    cases = golden_cases(engine, drafter, prompts, max_new_tokens=24, budget=12, depth=6, seeds_t1=(1, 7),
                         stores=(FUSED, SEPARATE))
    for pi, prompt in enumerate(prompts[:2]):
        for opts in (case_options("chain", 1.0, 3, 24, 12, 6, mode=THRESHOLD),
                     case_options("tree", 1.0, 4, 24, 12, 6, mode=THRESHOLD),
                     case_options("standard", 1.0, 13, 24, 12, 6, mode=THRESHOLD, tau=0.6),
                     case_options("spot", 1.0, 14, 24, 12, 6, mode=THRESHOLD, tau=0.6),
                     case_options("tree", 0.0, 0, 24, 30, 8),
                     case_options("spot-sets", 1.0, 5, 24, 12, 6, tau=0.7),
                     case_options("threshold", 1.0, 6, 24, 12, 6, tau=0.5),
                     case_options("standard", 1.0, 8, 24, 12, 6, top_k=5),
                     case_options("spot", 0.7, 9, 24, 12, 6, top_p=0.8),
                     case_options("spot-sets", 1.0, 10, 24, 12, 6, tau=0.5, top_k=20, top_p=0.6),
                     case_options("spot", 1.0, 11, 24, 1, 6),          # one node: the standard loop
                     # T = 1e-4: every other token's exp(z - max) underflows, the C++ level is -inf and every
                     # token is ranked by its exact noise (the code a row the candidates cannot certify runs)
                     case_options("spot", 1e-4, 12, 24, 12, 6)):
            cases.append({"prompt": pi, "prompt_ids": prompt, **opts, "expected": run_case(engine, drafter, prompt,
                                                                                            opts)})
    assert {c["decoder"] for c in cases} == {"standard", "threshold", "chain", "tree", "spot", "spot-sets"}
    results = run_batch(spot_cli, folder, drafter_dir, cases)
    bad = mismatches(cases, results)
    assert not bad, f"{len(bad)} of {len(cases)} cases differ:\n" + "\n".join(bad[:20])
    # the speculative decoders did speculate (several steps per verify pass somewhere)
    spot_cases = [r for c, r in zip(cases, results) if c["decoder"] == "spot"]
    assert sum(r["steps"] for r in spot_cases) > sum(r["passes"]["verify"] + r["passes"]["block"]
                                                     for r in spot_cases)


def test_chunked_prefill_matches_the_python_runtime(spot_cli, tiny, tmp_path):
    """An export with max_nodes 2 prefills in chunks of 2 x B = 16 tokens in both hosts: long prompts give the same
    tokens and passes, with the host and with the device KV cache."""
    folder, drafter_dir, _, drafter = tiny
    narrow = export_checkpoint(resolve_source(str(folder.parent / "ckpt")), tmp_path / "narrow",
                               ExportOptions(dtype="fp32", validate=False, max_nodes=2))
    engine = OrtEngine(narrow)
    assert engine.prefill_chunk == 16
    prompts = [list(map(int, np.random.default_rng(s).integers(0, TINY.vocab_size - 2, n)))
               for s, n in ((1, 50), (2, 67))]
    cases = []
    for pi, prompt in enumerate(prompts):
        for opts in (case_options("standard", 0.0, 0, 16, 2, 1), case_options("spot", 1.0, 3, 16, 2, 1),
                     case_options("threshold", 1.0, 4, 16, 2, 1, tau=0.5)):
            cases.append({"prompt": pi, "prompt_ids": prompt, **opts,
                          "expected": run_case(engine, drafter, prompt, opts)})
    for flags in ((), ("--kv-cache", "device")):
        bad = mismatches(cases, run_batch(spot_cli, narrow, drafter_dir, cases, *flags))
        assert not bad, f"{len(bad)} of {len(cases)} cases differ ({flags}):\n" + "\n".join(bad[:20])
    # a chain verifies depth + 1 states whatever --budget says: the refusal names --depth (it named the budget and
    # told the user to lower it), and --depth 1 runs beside the default --budget 16, the same tokens in both hosts
    from spot.runtime.decode_plan import DecodeRequest, run_decoder
    from spot.runtime.spot import TreeBudget
    proc = cli(spot_cli, "generate", "--model", narrow, "--decoder", "chain", "--prompt-ids", "1,2,3")
    _fails(proc, INVALID_ARGUMENT, "a chain of depth 8 verifies 9 states, more than the 2", "use --depth 1 or less")
    for depth in ("100", "-3"):          # named as the depth (it was "budget 101 nodes exceeds ...")
        proc = cli(spot_cli, "generate", "--model", narrow, "--decoder", "chain", "--depth", depth, "--prompt-ids",
                   "1,2,3")
        _fails(proc, INVALID_ARGUMENT, f"depth must be in 1..8 (the block size), got {depth}")
        with pytest.raises(SpotError, match=f"depth must be in 1..8 \\(the block size\\), got {depth}"):
            run_decoder("chain", engine, [1, 2, 3], DecodeRequest(8, budget=TreeBudget(16, int(depth))))
    with pytest.raises(SpotError, match="a chain of depth 8 verifies 9 states") as e:
        run_decoder("chain", engine, [1, 2, 3], DecodeRequest(8))
    assert e.value.hint == "use `depth=1` or less"      # the CLI's "use --depth 1 or less", as spot_cli's
    ok = cli(spot_cli, "generate", "--model", narrow, "--decoder", "chain", "--depth", "1", "--budget", "16",
             "--prompt-ids", "1,2,3", "--max-new-tokens", "8")
    assert ok.returncode == 0, ok.stderr
    want = run_decoder("chain", engine, [1, 2, 3], DecodeRequest(8, budget=TreeBudget(16, 1))).token_ids
    assert json.loads(ok.stdout)["token_ids"] == want


def test_an_empty_prompt_matches_the_python_runtime(spot_cli, tiny):
    """No prompt: both hosts decode from an empty context (no prefill pass), the same tokens and passes."""
    folder, drafter_dir, engine, drafter = tiny
    for opts in (case_options("standard", 0.0, 0, 12, 8, 4), case_options("spot", 1.0, 5, 12, 8, 4),
                 case_options("spot-sets", 1.0, 6, 12, 8, 4, tau=0.5)):
        want = run_case(engine, drafter, [], opts)
        assert want["passes"]["prefill"] == 0 and len(want["token_ids"]) >= 12
        line = request_line(opts, [1]).split()
        at = line.index("--prompt-ids")
        proc = cli(spot_cli, "generate", "--model", folder, "--drafter", drafter_dir, *line[:at], *line[at + 2:],
                   "--prompt-ids", "")
        assert proc.returncode == 0, proc.stderr
        got = json.loads(proc.stdout)
        assert {k: got[k] for k in COMPARED} == {k: want[k] for k in COMPARED}, opts["decoder"]
    # and in a batch, whose lines are split on whitespace: --prompt-ids '' (it was two quote characters)
    cases = [{**opts, "prompt_ids": [], "expected": run_case(engine, drafter, [], opts)}
             for opts in (case_options("standard", 0.0, 0, 8, 8, 4), case_options("spot", 1.0, 5, 8, 8, 4))]
    assert mismatches(cases, run_batch(spot_cli, folder, drafter_dir, cases)) == []


@pytest.mark.parametrize("field, decoder", [("runner_up_weight", "spot"), ("runner_up_weight", "spot-sets"),
                                            ("set_flip_weight", "spot-sets")])
def test_tree_weights_are_read_from_drafter_json(spot_cli, tiny, tmp_path, field, decoder):
    """drafter.json's runner_up_weight and set_flip_weight (0 = none, 1 = heavy) change the trees in both hosts the
    same way."""
    from spot.runtime.drafter import Drafter
    folder, drafter_dir, engine, _ = tiny
    prompts = random_prompts(2, seed=12)
    tau = {"tau": 0.3} if decoder == "spot-sets" else {}      # tiny random targets: low confidences
    passes = {}
    for w in (0.0, 1.0):
        d = tmp_path / f"w{w:g}"
        shutil.copytree(drafter_dir, d)
        manifest = json.loads((d / "drafter.json").read_text())
        manifest[field] = w
        (d / "drafter.json").write_text(json.dumps(manifest))
        drafter = Drafter.load(d)
        cases = [{"prompt": pi, "prompt_ids": prompt, **opts, "expected": run_case(engine, drafter, prompt, opts)}
                 for pi, prompt in enumerate(prompts)
                 for opts in (case_options(decoder, 0.0, 0, 24, 12, 6, **tau),
                              case_options(decoder, 1.0, 3, 24, 12, 6, **tau))]
        bad = mismatches(cases, run_batch(spot_cli, folder, d, cases))
        assert not bad, f"{field} {w}: " + "\n".join(bad)
        passes[w] = [c["expected"]["passes"] for c in cases]
    assert passes[0.0] != passes[1.0]       # the weight reached the trees


def test_tree_shapes_are_read_from_drafter_json(spot_cli, tiny, tmp_path):
    """drafter.json's tree_shapes (branch, depth, order temperature, runner-up weight, stale-top bonus per budget)
    grow the same trees in both hosts: budgets below, at and above the entries, spot and spot-sets (which keeps the
    drafter's own settings)."""
    from spot.runtime.drafter import Drafter
    folder, drafter_dir, engine, _ = tiny
    prompts = random_prompts(2, seed=15)
    shapes = [{"nodes": 4, "branch": 1, "depth": 2, "order_temperature": 2.0, "runner_up_weight": 0.0,
               "stale_top_bonus": 30.0},
              {"nodes": 10, "branch": 2, "depth": 3, "order_temperature": 0.5, "runner_up_weight": 1.0,
               "stale_top_bonus": 0.7}]
    passes = {}
    for name, table in (("own", None), ("shaped", shapes)):
        d = tmp_path / name
        shutil.copytree(drafter_dir, d)
        manifest = json.loads((d / "drafter.json").read_text())
        manifest["tree_shapes"] = table
        (d / "drafter.json").write_text(json.dumps(manifest))
        drafter = Drafter.load(d)
        cases = [{"prompt": pi, "prompt_ids": prompt, **opts, "expected": run_case(engine, drafter, prompt, opts)}
                 for pi, prompt in enumerate(prompts)
                 for opts in (case_options("spot", 0.0, 0, 24, 3, 6), case_options("spot", 1.0, 3, 24, 6, 6),
                              case_options("spot", 0.0, 1, 24, 12, 6), case_options("spot", 1.0, 2, 24, 16, 6),
                              case_options("spot-sets", 1.0, 5, 24, 12, 6, tau=0.3))]
        bad = mismatches(cases, run_batch(spot_cli, folder, d, cases))
        assert not bad, f"{name}: " + "\n".join(bad)
        passes[name] = [c["expected"]["passes"] for c in cases]
    assert passes["own"] != passes["shaped"]       # the shapes reached the trees


def test_baseline_graph_drafter_matches(spot_cli, tiny, tmp_path):
    """A drafter exported as its baseline skips (zero heads: inputs masked and stale_conf only) decodes spot and
    spot-sets identically in both hosts; the C++ host feeds the graph only the inputs it declares."""
    from spot.training.drafter import OrderModel, OrderModelConfig, random_inputs, write_drafter
    folder, drafter_dir, engine, _ = tiny
    manifest = json.loads((drafter_dir / "drafter.json").read_text())    # write_drafter replaces its graph facts
    torch.manual_seed(4)
    written = write_drafter(OrderModel(OrderModelConfig(d_model=32, heads=4, ffn=64, layers=1), tau=0.9),
                            tmp_path / "baseline", manifest, random_inputs(4, 8))
    assert written["graph"] == "baseline" and written["inputs"] == ["masked", "stale_conf"]
    drafter = load_drafter(tmp_path / "baseline")
    prompts = random_prompts(3, seed=14)
    cases = [{"prompt": pi, "prompt_ids": prompt, **opts, "expected": run_case(engine, drafter, prompt, opts)}
             for pi, prompt in enumerate(prompts)
             for opts in (case_options("spot", 0.0, 0, 24, 12, 6), case_options("spot", 1.0, 3, 24, 12, 6),
                          case_options("spot-sets", 1.0, 5, 24, 12, 6, tau=0.3))]
    bad = mismatches(cases, run_batch(spot_cli, folder, tmp_path / "baseline", cases))
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("variant,options", [
    ("fp16", dict(dtype="fp16")),
    ("int8", dict(dtype="fp32", weights="int8")),
    ("int4", dict(dtype="fp32", weights="int4", int4_block=32)),
    ("int8-fp16", dict(dtype="fp16", weights="int8"))])
def test_other_precisions_match(spot_cli, tiny, tmp_path, variant, options):
    """fp16: the host's K/V cache holds float16 bits. int8 / int4 (weight-only): ONNX Runtime fuses DequantizeLinear ->
    MatMul into MatMulNBits, and the manifest's ort_session_config keeps its activations float32 — the C++ host must
    apply it as the Python engine does, or its logits (int8-quantized activations) and tokens differ. Decoding
    equals the Python runtime in each."""
    _, drafter_dir, _, drafter = tiny
    # no validation: this peaked random model (weights of scale 0.6) is outside the fp16 tolerance of the exporter's
    # torch comparison; what is tested here is that both hosts run the same graph the same way
    folder = export_checkpoint(resolve_source(str(tiny[0].parent / "ckpt")), tmp_path / variant,
                               ExportOptions(validate=False, **options))
    if variant != "fp16":
        assert json.loads((folder / "manifest.json").read_text())["ort_session_config"]
    engine = OrtEngine(folder)
    prompts = random_prompts(2, seed=9)
    cases = golden_cases(engine, drafter, prompts, max_new_tokens=16, budget=8, depth=4, seeds_t1=(2,),
                         decoders=("standard", "spot"))
    bad = mismatches(cases, run_batch(spot_cli, folder, drafter_dir, cases))
    assert not bad, "\n".join(bad)


def test_device_sampler_matches_the_python_runtime(spot_cli, tiny):
    """--sampler device: the export's sampling epilogue runs after the target (on the CPU provider here; the GPU
    path's code: the logits bound where the target runs, fed to the epilogue as an ORT value) and the host loop reads
    only its samples — the same tokens and passes as the Python runtime's device sampler and as host sampling."""
    folder, drafter_dir, host_engine, drafter = tiny
    engine = OrtEngine(folder, sampler="device")
    assert engine.sampler_depth == 8 and host_engine.sampler_depth is None
    prompts = random_prompts(3, seed=5)
    cases = golden_cases(engine, drafter, prompts, max_new_tokens=24, budget=12, depth=6, seeds_t1=(1, 4))
    cases.append({"prompt": 0, "prompt_ids": prompts[0], **(o := case_options("tree", 1.0, 3, 24, 12, 6, top_k=5,
                                                                              mode=THRESHOLD)),
                  "expected": run_case(engine, drafter, prompts[0], o)})
    results = run_batch(spot_cli, folder, drafter_dir, cases, "--sampler", "device")
    bad = mismatches(cases, results)
    assert not bad, f"{len(bad)} of {len(cases)} cases differ:\n" + "\n".join(bad[:20])
    # both hosts run the epilogue for the states the walk reads, one per call: once per commit step, any decoder
    assert [r["epilogue_states"] for r in results] == [r["steps"] for r in results] == \
        [c["expected"]["epilogue_states"] for c in cases]
    assert all(0 < r["epilogue_ms"] <= 1e3 * r["seconds"] for r in results)     # the time inside those calls
    host = [run_case(host_engine, drafter, c["prompt_ids"], c) for c in cases]
    assert [h["token_ids"] for h in host] == [c["expected"]["token_ids"] for c in cases]


def test_an_older_epilogue_is_refused_until_upgrade_export_rewrites_it(spot_cli, tiny, tmp_path):
    """An epilogue exported before runner-ups (no future_runner_up / future_gap outputs) or before position runs (no
    first_position input, no positions_per_call) is refused when the C++ host opens it (SPOT_ERR_INCOMPATIBLE, naming
    what it lacks, the upgrade command as the hint; the host sampler never opens it). `spot upgrade-export` rewrites
    it, and the upgraded folder decodes in C++ as the Python runtime decodes the fresh export."""
    from spot.export.upgrade import upgrade_export
    folder, drafter_dir, _, drafter = tiny
    ids = ["--prompt-ids", "1,2,3"]
    for name, outputs, whole_blocks in (("runner-ups", RUNNER_UPS, False), ("whole-blocks", (), True),
                                        ("both", RUNNER_UPS, True)):
        old = older_epilogue_copy(folder, tmp_path / name, outputs, whole_blocks)
        lacks = ", ".join([*(["first_position"] if whole_blocks else []), *outputs])
        _fails(cli(spot_cli, "generate", "--model", old, "--sampler", "device", *ids), INCOMPATIBLE,
               f"older sampling epilogue: got no {lacks}, expected inputs", f"`spot upgrade-export {old}`")
        assert "token_ids" in json.loads(cli(spot_cli, "generate", "--model", old, *ids).stdout)   # auto: host
    # the graph current, the manifest without positions_per_call
    unrecorded = older_epilogue_copy(folder, tmp_path / "unrecorded", outputs=(), whole_blocks=False)
    manifest = json.loads((unrecorded / "manifest.json").read_text())
    del manifest["graphs"]["epilogue"]["positions_per_call"]
    (unrecorded / "manifest.json").write_text(json.dumps(manifest))
    _fails(cli(spot_cli, "generate", "--model", unrecorded, "--sampler", "device", *ids), INCOMPATIBLE,
           "records no positions_per_call", f"`spot upgrade-export {unrecorded}`")
    old = tmp_path / "both"
    assert upgrade_export(old, progress=lambda _: None)[1]
    cases = golden_cases(OrtEngine(folder, sampler="device"), drafter, random_prompts(1, seed=4), max_new_tokens=24,
                         budget=12, depth=6, decoders=("standard", "spot"))
    results = run_batch(spot_cli, old, drafter_dir, cases, "--sampler", "device")
    assert not mismatches(cases, results)
    assert [r["epilogue_states"] for r in results] == [c["expected"]["epilogue_states"] for c in cases]


def test_device_sampler_over_runs_of_positions(spot_cli, tiny, tmp_path):
    """An export whose epilogue takes 2 of a state's 8 positions per call (spot-export --epilogue-positions): the C++
    host joins the runs as the Python runtime does (the same tokens, passes and sampled states; at T = 1 a wrong
    first position would change the noise); a positions_per_call that does not divide the block is refused."""
    folder, drafter_dir, _, drafter = tiny
    runs = export_checkpoint(resolve_source(str(folder.parent / "ckpt")), tmp_path / "runs",
                             ExportOptions(dtype="fp32", validate=False, epilogue_positions=2))
    engine = OrtEngine(runs, sampler="device")
    cases = golden_cases(engine, drafter, random_prompts(2, seed=9), max_new_tokens=24, budget=12, depth=6,
                         decoders=("standard", "tree", "spot", "spot-sets"))
    results = run_batch(spot_cli, runs, drafter_dir, cases, "--sampler", "device")
    assert not mismatches(cases, results)
    assert [r["epilogue_states"] for r in results] == [c["expected"]["epilogue_states"] for c in cases]
    # the same cases from whole-block calls: identical
    assert [run_case(OrtEngine(folder, sampler="device"), drafter, c["prompt_ids"], c)["token_ids"]
            for c in cases[:4]] == [c["expected"]["token_ids"] for c in cases[:4]]
    manifest = json.loads((runs / "manifest.json").read_text())
    manifest["graphs"]["epilogue"]["positions_per_call"] = 3
    (runs / "manifest.json").write_text(json.dumps(manifest))
    _fails(cli(spot_cli, "generate", "--model", runs, "--sampler", "device", "--verify", "none", "--prompt-ids",
               "1,2"), CORRUPT, "positions_per_call is 3, expected a divisor of the block size 8")
    with pytest.raises(SpotError, match="positions_per_call is 3, expected a divisor of the block size 8"):
        OrtEngine(runs, sampler="device")


def test_device_sampler_refusals(spot_cli, tiny, tmp_path):
    """What the epilogue does not serve: top-p, trees deeper than its future steps, a folder without one."""
    folder, drafter_dir = tiny[0], tiny[1]
    ids = ["--prompt-ids", "1,2,3"]
    device = ["generate", "--model", folder, "--drafter", drafter_dir, "--sampler", "device", *ids]
    _fails(cli(spot_cli, *device, "--top-p", "0.9", "--temperature", "1"), UNSUPPORTED,
           "does not implement top-p", "host sampler")
    shallow = export_checkpoint(resolve_source(str(folder.parent / "ckpt")), tmp_path / "shallow",
                                ExportOptions(dtype="fp32", validate=False, epilogue_steps=3))
    _fails(cli(spot_cli, "generate", "--model", shallow, "--drafter", drafter_dir, "--sampler", "device",
               "--decoder", "spot", "--depth", "4", *ids), INVALID_ARGUMENT,
           "tree depth 4 exceeds the 3 future steps", "--epilogue-steps")
    ok = json.loads(cli(spot_cli, "generate", "--model", shallow, "--drafter", drafter_dir, "--sampler", "device",
                        "--decoder", "spot", "--depth", "3", *ids).stdout)
    assert ok["passes"]["verify"] > 0
    none = export_checkpoint(resolve_source(str(folder.parent / "ckpt")), tmp_path / "none",
                             ExportOptions(dtype="fp32", validate=False, epilogue_steps=0))
    _fails(cli(spot_cli, "generate", "--model", none, "--sampler", "device", *ids), INCOMPATIBLE,
           "no sampling epilogue graph", "host sampler")
    assert "token_ids" in json.loads(cli(spot_cli, "generate", "--model", none, *ids).stdout)   # auto: host
    proc = cli(spot_cli, "generate", "--model", folder, "--sampler", "gpu", *ids)
    assert proc.returncode == 64 and "--sampler expects auto, host or device, got gpu" in proc.stderr


def test_device_kv_cache_matches_the_python_runtime(spot_cli, tiny, tmp_path):
    """--kv-cache device: the cache stays in ORT values where the target runs (host memory on the CPU provider; the
    GPU path's code), each stored block appended by kv_append.onnx — the same tokens and passes as the Python
    runtime, with either sampler. A format 2 folder without kv_append (hand-made: every export and upgrade writes
    it) is refused when it opens, the upgrade command as the hint; the upgrade writes it."""
    folder, drafter_dir, host_engine, drafter = tiny
    prompts = random_prompts(3, seed=8)
    cases = golden_cases(host_engine, drafter, prompts, max_new_tokens=40, budget=10, depth=5, seeds_t1=(2,))
    bad = mismatches(cases, run_batch(spot_cli, folder, drafter_dir, cases, "--kv-cache", "device"))
    assert not bad, f"{len(bad)} of {len(cases)} cases differ:\n" + "\n".join(bad[:20])
    sampled = golden_cases(OrtEngine(folder, sampler="device", kv_cache="device"), drafter, prompts[:1],
                           max_new_tokens=40, budget=10, depth=5, seeds_t1=(2,))
    bad = mismatches(sampled, run_batch(spot_cli, folder, drafter_dir, sampled, "--kv-cache", "device",
                                        "--sampler", "device"))
    assert not bad, f"{len(bad)} of {len(sampled)} cases differ:\n" + "\n".join(bad[:20])
    info = {kv: json.loads(cli(spot_cli, "info", "--model", folder, "--kv-cache", kv).stdout)
            for kv in ("auto", "device")}
    assert info["auto"]["cache_on_device"] is False and info["device"]["cache_on_device"] is True
    from spot.export.upgrade import upgrade_export
    old = tmp_path / "old"
    shutil.copytree(folder, old)
    without_kv_append(old)
    ids = ["--prompt-ids", "1,2,3"]
    for kv_cache in ("auto", "host", "device"):
        _fails(cli(spot_cli, "generate", "--model", old, "--kv-cache", kv_cache, *ids), INCOMPATIBLE,
               "lists no kv_append graph, expected one in every format 2 folder", f"`spot upgrade-export {old}`")
    assert upgrade_export(old, progress=lambda _: None)[1]
    bad = mismatches(cases[:2], run_batch(spot_cli, old, drafter_dir, cases[:2], "--kv-cache", "device"))
    assert not bad, bad


def test_generate_command_prints_the_result(spot_cli, tiny):
    folder, drafter_dir, engine, drafter = tiny
    prompt = random_prompts(1, seed=4)[0]
    opts = case_options("spot", 1.0, 9, 20, 10, 5)
    want = run_case(engine, drafter, prompt, opts)
    proc = cli(spot_cli, "generate", "--model", folder, "--drafter", drafter_dir,
               *request_line(opts, prompt).split())
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert {k: got[k] for k in COMPARED} == {k: want[k] for k in COMPARED}
    standard = json.loads(cli(spot_cli, "generate", "--model", folder, "--prompt-ids", "1,2,3").stdout)
    assert standard["target_ms"] > 0 and standard["draft_ms"] == 0     # standard's passes are timed too, as in Python
    info = json.loads(cli(spot_cli, "info", "--model", folder, "--drafter", drafter_dir).stdout)
    assert info["block_size"] == 8 and info["vocab_size"] == 300 and info["has_drafter"] is True


def test_max_new_tokens_is_the_most_returned_in_both_hosts(spot_cli, tiny):
    """Both hosts decode to the block boundary and return at most max_new_tokens ids (before: up to B - 1 more), the
    same ids and the same `stopped` when a stop id lies in the cut-off rest of the block; spot_output_capacity is
    max_new_tokens."""
    import ctypes
    folder, drafter_dir, engine, drafter = tiny
    from spot.runtime.decode_plan import DecodeRequest, run_decoder
    from spot.runtime.spot import TreeBudget
    from spot.runtime.step import Sampling
    folder, _, engine, _ = tiny
    prompt = random_prompts(1, seed=6)[0]

    def decode(n: int, stop: list[int]):
        req = DecodeRequest(n, sampling=Sampling(1.0, seed=2), budget=TreeBudget(6, 3), stop_ids=stop)
        return run_decoder("tree", engine, prompt, req)
    first = decode(20, [])
    whole = first.token_ids + first.overflow_ids        # to the block boundary
    for n in (len(whole) - 7, len(whole) - 1, len(whole)):      # the same blocks decoded, n ids returned
        for stop in ([], [next(t for t in whole[n:] if t not in whole[:n])] if n < len(whole) else []):
            opts = case_options("tree", 1.0, 2, n, 6, 3)
            flags = [*request_line(opts, prompt).split(), "--stop-ids", ",".join(map(str, stop))]
            got = json.loads(cli(spot_cli, "generate", "--model", folder, *flags).stdout)
            python = decode(n, stop)
            assert got["token_ids"] == python.token_ids == whole[:n] and not got["stopped"] and not python.stopped
    lib = ctypes.CDLL(str(spot_cli.parent / "libspot.so"))
    lib.spot_output_capacity.restype = ctypes.c_size_t
    handle = ctypes.c_void_p()
    assert lib.spot_open(str(folder).encode(), None, ctypes.byref(handle), None) == 0
    try:
        assert [lib.spot_output_capacity(handle, ctypes.c_size_t(5), n) for n in (1, 13, 64)] == [1, 13, 64]
    finally:
        lib.spot_close(handle)


@pytest.mark.parametrize("decoder,limit", [("spot", 0), ("spot-sets", 0), ("standard", 2), ("spot", 2)])
def test_streaming_matches_the_python_runtime(spot_cli, tiny, decoder, limit):
    """spot_generate_stream through `spot_cli generate --stream N`: the same pieces as the Python runtime's on_block,
    in order, joined into the output; with N > 0 the callback ends generation after N blocks in both hosts
    (stats->stopped = 2, "cancelled")."""
    from spot.runtime.decode_plan import DecodeRequest, run_decoder
    from spot.runtime.spot import TreeBudget
    from spot.runtime.step import Sampling
    folder, drafter_dir, engine, drafter = tiny
    prompt = random_prompts(1, seed=6)[0]
    opts = case_options(decoder, 1.0, 4, 30, 10, 5, tau=0.3)
    pieces = []
    req = DecodeRequest(max_new_tokens=30, tau=0.3, sampling=Sampling(1.0, seed=4), budget=TreeBudget(10, 5))
    want = run_decoder(decoder, engine, prompt, req, drafter,
                       on_block=lambda ids: pieces.append(list(ids)) or len(pieces) == limit)
    proc = cli(spot_cli, "generate", "--model", folder, "--drafter", drafter_dir, "--stream", str(limit),
               *request_line(opts, prompt).split())
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    got_pieces, result = [json.loads(x)["block_ids"] for x in lines[:-1]], json.loads(lines[-1])
    assert got_pieces == pieces and result["token_ids"] == want.token_ids == sum(pieces, [])
    assert result["cancelled"] is want.cancelled is (limit > 0) and result["blocks"] == want.stats.blocks
    assert result["target_passes"] == want.stats.target_passes


def test_the_c_streaming_example(spot_cli, tiny):
    """cpp/examples/stream.c, built as C99 (-pedantic: the header stays C): a line of ids per finished block, the
    callback's stop after 2 blocks, and the same ids as spot_cli's streaming of that request."""
    folder = tiny[0]
    prompt = ",".join(map(str, random_prompts(1, seed=8)[0]))
    proc = _run([str(spot_cli.parent / "spot_stream"), str(folder), prompt, "2"], timeout=600)
    assert proc.returncode == 0, proc.stderr
    lines = [list(map(int, line.split())) for line in proc.stdout.splitlines()]
    assert len(lines) == 2 and "stopped by the callback" in proc.stderr
    ref = cli(spot_cli, "generate", "--model", folder, "--decoder", "tree", "--temperature", "1", "--seed", "1",
              "--max-new-tokens", "48", "--prompt-ids", prompt, "--stream", "2")
    assert [json.loads(x)["block_ids"] for x in ref.stdout.splitlines()[:-1]] == lines
    for args, words in (([prompt + ","], "comma-separated integers"), (["1,,3"], "comma-separated integers"),
                        (["abc"], "expects an integer"), ([prompt, "-1"], "STOP_AFTER_BLOCKS"),
                        ([prompt, "2", "extra"], "usage")):
        proc = _run([str(spot_cli.parent / "spot_stream"), str(folder), *args], timeout=600)
        assert proc.returncode == 64 and words in proc.stderr, (args, proc.stderr)


# (kind, rule args, values, the answer): filter -> the ids top-k / top-p keep; select -> the indices committed
STEP_RULE_CASES = [
    ("filter", (0, 0.45), np.log([0.2, 0.5, 0.3]).tolist(), [1]),
    ("filter", (0, 0.75), np.log([0.2, 0.5, 0.3]).tolist(), [1, 2]),
    ("filter", (0, 0.85), np.log([0.2, 0.5, 0.3]).tolist(), [0, 1, 2]),
    ("filter", (0, 0.25), [0.0] * 4, [0, 1]),        # mass exactly p does not exceed it: the next token is kept
    ("filter", (0, 0.5), [0.0] * 4, [0, 1, 2]),
    ("filter", (0, 0.2), [0.0] * 4, [0]),            # equal values in id order; the first token always
    ("filter", (0, 0.1), [0.0, 1.0, 1.0, 0.0], [1]),
    ("filter", (2, 1.0), [0.0, 3.0, 3.0, 1.0], [1, 2]),
    ("filter", (3, 1.0), [0.0, 3.0, 3.0, 1.0], [1, 2, 3]),
    ("filter", (2, 1.0), [2.0, 1.0, 1.0, 0.0], [0, 1, 2]),      # ties with the k-th largest are kept
    ("filter", (2, 0.5), [0.0] * 4, [0, 1, 2]),      # top-k keeps the 4 ties, then top-p
    ("select", ("threshold", 0.5), [0.5, 0.5, 0.25], [0]),      # strict: none passes -> the single best, first tie
    ("select", ("threshold", 0.5), [0.75, 0.5, 0.75], [0, 2]),
    ("select", ("threshold", 0.76), [0.5, 0.75, 0.5, 0.75], [1]),
    ("select", ("threshold", 0.4), [0.5, 0.75], [0, 1]),
    ("select", ("threshold", 0.0), [0.0, 1e-300], [1]),
    ("select", ("static", 0.9), [0.2, 0.7, 0.7], [1]),          # ties: the smallest position
    ("select", ("static", 0.9), [0.3], [0]),
]


def test_the_step_rules_give_the_written_answers_in_both_hosts(spot_cli):
    """The commit rule and the top-k / top-p filter on cases whose answers are written down, through the numpy
    runtime and the C++ rules (cpp/tests/step_rules.cpp): a confidence equal to tau and a mass equal to p never
    occur on random models, so a `>=` for a `>` in either host passed every end-to-end comparison."""
    from spot.runtime.step import filter_scaled_logits, select_commits
    lines, python = [], []
    for kind, args, values, _ in STEP_RULE_CASES:
        lines.append(" ".join([kind, *map(str, args), *map(repr, values)]))
        if kind == "filter":
            kept = np.isfinite(filter_scaled_logits(np.array([values]), args[0], args[1]))[0]
            python.append(np.flatnonzero(kept).tolist())
        else:
            rule = CommitRule(THRESHOLD if args[0] == "threshold" else STATIC, args[1])
            python.append(select_commits(np.array(values), rule).tolist())
    build = _run(["cmake", "--build", str(BUILD), "--target", "spot_step_rules", "-j1"])     # (not in `all`)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    proc = _run([str(spot_cli.parent / "spot_step_rules")], input="\n".join(lines) + "\n", timeout=60)
    assert proc.returncode == 0, proc.stderr
    cpp = [list(map(int, line.split())) for line in proc.stdout.splitlines()]
    assert python == [answer for *_, answer in STEP_RULE_CASES]
    assert cpp == python


def test_both_hosts_build_the_written_trees(spot_cli):
    """The tree builders of both hosts on the known-answer cases of tests/tree_cases.py (cpp/tests/tree_rules.cpp):
    equal path log-probabilities under different parents, so a host taking its nodes in another order than the
    stated rule (its heap's layout, as the C++ host once copied CPython's) builds another tree."""
    build = _run(["cmake", "--build", str(BUILD), "--target", "spot_tree_rules", "-j1"])     # (not in `all`)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    lines = [line for i in range(len(TREE_CASES)) for line in input_lines(i)]
    proc = _run([str(spot_cli.parent / "spot_tree_rules")], input="\n".join(lines) + "\n", timeout=60)
    assert proc.returncode == 0, proc.stderr
    cpp = [block.splitlines() for block in proc.stdout.split("end\n")[:-1]]
    written = [answer for *_, answer in TREE_CASES]
    assert [python_answer(i) for i in range(len(TREE_CASES))] == written
    assert cpp == written


def test_both_clis_report_the_same_result_keys(spot_cli, tiny):
    """`spot generate --json` and `spot_cli generate` agree on the request's outcome keys (mode, stopped,
    cancelled, passes, steps) and tokens, for a static and a threshold decoder."""
    from click.testing import CliRunner

    from spot.cli import main
    folder, drafter = tiny[:2]
    for decoder in ("tree", "spot-sets"):
        flags = ["--decoder", decoder, "--temperature", "1", "--seed", "4", "--max-new-tokens", "12",
                 "--budget", "6", "--depth", "3", "--tau", "0.3", "--prompt-ids", "1,2,3"]
        cpp = json.loads(cli(spot_cli, "generate", "--model", folder, "--drafter", drafter, *flags).stdout)
        r = CliRunner().invoke(main, ["generate", "--model", str(folder), "--backend", "ort", "--drafter",
                                      str(drafter), *flags, "--json"])
        assert r.exit_code == 0, r.output
        python = json.loads(r.stdout)
        keys = ("token_ids", "mode", "stopped", "cancelled", "target_passes", "passes", "steps", "blocks")
        assert {k: python[k] for k in keys} == {k: cpp[k] for k in keys}
        assert cpp["mode"] == ("threshold" if decoder == "spot-sets" else "static")


def test_the_binary_interface_is_versioned_and_installs_and_failures_leave_zeros(spot_cli, tiny, tmp_path):
    """An application checks spot_abi_version() against the header it was built with, and a library of another
    interface has another SONAME (the structs grew three times under libspot.so.0). `cmake --install` gave binaries
    that found neither libspot nor ONNX Runtime. A failed spot_generate left *stats as the caller's bytes."""
    import ctypes
    import re
    header = (CPP / "include" / "spot" / "spot.h").read_text()
    abi = int(re.search(r"^#define SPOT_ABI_VERSION (\d+)$", header, re.M).group(1))
    lib = ctypes.CDLL(str(spot_cli.parent / "libspot.so"))
    assert lib.spot_abi_version() == abi
    assert os.path.realpath(spot_cli.parent / "libspot.so") == str((spot_cli.parent / f"libspot.so.{abi}").resolve())
    stats_size = 120            # spot_stats: 8 int64 (fused_passes: ABI 2), an int (padded), 4 doubles, an int64, a
    # double
    for model, prompt in ((None, [1, 2]), ("open", [1, 300])):        # no model; a token id outside the vocabulary
        handle = ctypes.c_void_p()
        if model:
            assert lib.spot_open(str(tiny[0]).encode(), None, ctypes.byref(handle), None) == 0
        stats = (ctypes.c_ubyte * (stats_size + 16))(*([0xAB] * (stats_size + 16)))
        out, n = (ctypes.c_int64 * 64)(), ctypes.c_size_t(7)
        ids = (ctypes.c_int64 * len(prompt))(*prompt)
        status = lib.spot_generate(handle, ids, ctypes.c_size_t(len(prompt)), None, out, ctypes.c_size_t(64),
                                   ctypes.byref(n), stats, None)
        lib.spot_close(handle)
        assert status == 1 and n.value == 0
        assert bytes(stats[:stats_size]) == bytes(stats_size) and bytes(stats[stats_size:]) == b"\xab" * 16
    prefix = tmp_path / "prefix"
    subprocess.run(["cmake", "--install", str(BUILD), "--prefix", str(prefix)], check=True, capture_output=True)
    installed = subprocess.run([str(prefix / "bin" / "spot_cli"), "info", "--model", str(tiny[0])],
                               capture_output=True, text=True)
    assert installed.returncode == 0 and json.loads(installed.stdout)["abi_version"] == abi, installed.stderr


def c_api(spot_cli):
    """libspot.so beside spot_cli with the C API's signatures declared: (the library, spot_error, the block callback
    type). Options are passed as a void pointer; a test that builds spot_generate_options redeclares spot_generate."""
    import ctypes
    lib = ctypes.CDLL(str(spot_cli.parent / "libspot.so"))

    class Error(ctypes.Structure):
        _fields_ = [("code", ctypes.c_int), ("message", ctypes.c_char * 1024)]
    callback_type = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_int64), ctypes.c_size_t, ctypes.c_void_p)
    lib.spot_open.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(Error)]
    lib.spot_close.argtypes = [ctypes.c_void_p]
    lib.spot_context_open.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(Error)]
    lib.spot_context_close.argtypes = [ctypes.c_void_p]
    lib.spot_output_capacity.restype = ctypes.c_size_t
    lib.spot_output_capacity.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    head = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int64), ctypes.c_size_t, ctypes.c_void_p]
    tail = [ctypes.POINTER(ctypes.c_int64), ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t), ctypes.c_void_p,
            ctypes.POINTER(Error)]
    for name in ("spot_generate", "spot_context_generate"):
        getattr(lib, name).argtypes = head + tail
        getattr(lib, name + "_stream").argtypes = head + [callback_type, ctypes.c_void_p] + tail
    return lib, Error, callback_type


def test_the_c_api_names_the_registry_decoders(spot_cli):
    """spot_decoder_name / spot_decoder_from_name know the registry's C++ decoders, in the C enum's order, refuse its
    other decoders as Python-only (SPOT_ERR_UNSUPPORTED) and a name outside it as invalid (tests/
    test_decoder_registry.py holds the source to the same table)."""
    import ctypes

    from spot.runtime.registry import decoder_names
    lib, Error, _ = c_api(spot_cli)
    lib.spot_decoder_name.restype = ctypes.c_char_p
    lib.spot_decoder_name.argtypes = [ctypes.c_int]
    lib.spot_decoder_from_name.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(Error)]
    hosted = decoder_names(in_cpp_host=True)
    assert tuple(lib.spot_decoder_name(i).decode() for i in range(len(hosted))) == hosted
    assert lib.spot_decoder_name(len(hosted)) == b"unknown"
    for name in decoder_names() + ("medusa",):
        value, err = ctypes.c_int(-1), Error()
        status = lib.spot_decoder_from_name(name.encode(), ctypes.byref(value), ctypes.byref(err))
        if name in hosted:
            assert (status, value.value) == (0, hosted.index(name)), err.message
        else:
            assert status == (UNSUPPORTED if name in decoder_names() else INVALID_ARGUMENT), (name, err.message)


def test_sizes_past_the_context_are_invalid_and_the_capacity_agrees(spot_cli, tiny):
    """spot_generate copied n_prompt ids by pointer arithmetic that wrapped: n_prompt = 2**62 with a 3-id buffer
    returned SPOT_OK and decoded an empty prompt, 2**61 + 3 decoded 3 ids, n_stop_ids = 2**61 + 1 returned OK and
    SIZE_MAX ran out of memory (INTERNAL). A size past the model's context (or past SPOT_MAX_STOP_IDS stop ids) is
    SPOT_ERR_INVALID_ARGUMENT before anything is read or allocated, and spot_output_capacity is 0 exactly for the
    sizes spot_generate refuses."""
    import ctypes
    lib, Error, _ = c_api(spot_cli)

    class Options(ctypes.Structure):      # spot_generate_options
        _fields_ = [("decoder", ctypes.c_int), ("temperature", ctypes.c_double), ("seed", ctypes.c_uint32),
                    ("tau", ctypes.c_double), ("max_new_tokens", ctypes.c_int), ("budget", ctypes.c_int),
                    ("depth", ctypes.c_int), ("mode", ctypes.c_int), ("top_k", ctypes.c_int),
                    ("top_p", ctypes.c_double), ("stop_ids", ctypes.POINTER(ctypes.c_int64)),
                    ("n_stop_ids", ctypes.c_size_t), ("store_mode", ctypes.c_int)]
    lib.spot_generate.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int64), ctypes.c_size_t,
                                  ctypes.POINTER(Options), ctypes.POINTER(ctypes.c_int64), ctypes.c_size_t,
                                  ctypes.POINTER(ctypes.c_size_t), ctypes.c_void_p, ctypes.POINTER(Error)]
    model, err = ctypes.c_void_p(), Error()
    assert lib.spot_open(str(tiny[0]).encode(), None, ctypes.byref(model), ctypes.byref(err)) == 0, err.message
    context = TINY.max_position_embeddings
    prompt = (ctypes.c_int64 * (context + 1))(*([1] * (context + 1)))
    stops = (ctypes.c_int64 * 1024)(*([298] * 1024))
    out = (ctypes.c_int64 * 64)()

    def generate(n_prompt: int, max_new_tokens: int = 4, n_stop_ids: int | None = None,
                 store_mode: int | None = None) -> tuple[int, str, int]:
        options, n, e = Options(), ctypes.c_size_t(7), Error()
        lib.spot_generate_options_init(ctypes.byref(options))
        assert options.store_mode == 0         # SPOT_STORE_FUSED, the default
        options.max_new_tokens = max_new_tokens
        if store_mode is not None:
            options.store_mode = store_mode
        if n_stop_ids is not None:
            options.stop_ids, options.n_stop_ids = ctypes.cast(stops, ctypes.POINTER(ctypes.c_int64)), n_stop_ids
        status = lib.spot_generate(model, prompt, n_prompt, ctypes.byref(options), out, 64, ctypes.byref(n), None,
                                   ctypes.byref(e))
        return status, e.message.decode(), n.value
    try:
        for n_prompt in (2**62, 2**61 + 3, 2**64 - 1, context + 1):
            status, message, n = generate(n_prompt)
            assert (status, n) == (INVALID_ARGUMENT, 0) and "exceeds the model's context of 512" in message, message
            assert lib.spot_output_capacity(model, n_prompt, 4) == 0
        for n_stop_ids in (2**61 + 1, 2**64 - 1, 1025):
            status, message, n = generate(3, n_stop_ids=n_stop_ids)
            assert (status, n) == (INVALID_ARGUMENT, 0) and "exceeds SPOT_MAX_STOP_IDS (1024)" in message, message
        assert generate(3, n_stop_ids=1024)[0] == 0
        assert generate(3, store_mode=1)[0] == 0 and generate(3, store_mode=0)[0] == 0
        status, message, n = generate(3, store_mode=2)
        assert (status, n) == (INVALID_ARGUMENT, 0) and "unknown store_mode 2, expected SPOT_STORE_FUSED" in message
        for n_prompt in (0, 3, context - 9, context - 8, context - 4, context - 1, context):
            for max_new in (1, 4, 8, 9, 2**31 - 1):
                status, message, n = generate(n_prompt, max_new)
                capacity = lib.spot_output_capacity(model, n_prompt, max_new)
                assert (status == 0) == (capacity > 0), (n_prompt, max_new, capacity, message)
                assert status in (0, INVALID_ARGUMENT) and n <= capacity
    finally:
        lib.spot_close(model)


def test_a_handle_decodes_one_request_at_a_time(spot_cli, tiny):
    """spot_generate called back from on_block on the same handle is refused (SPOT_ERR_INVALID_ARGUMENT), as
    Python's request lock refuses it; before, both calls returned 0 and the outer request's tokens changed. The
    handle works again once the request ends; a spot_close from on_block takes effect when the request returns."""
    import ctypes
    lib, Error, callback_type = c_api(spot_cli)
    model, err = ctypes.c_void_p(), Error()
    assert lib.spot_open(str(tiny[0]).encode(), None, ctypes.byref(model), ctypes.byref(err)) == 0, err.message
    prompt = (ctypes.c_int64 * 3)(1, 2, 3)
    capacity = lib.spot_output_capacity(model, 3, 64)

    def generate(on_block=None) -> tuple[int, bytes, list[int]]:
        out, n, e = (ctypes.c_int64 * capacity)(), ctypes.c_size_t(), Error()
        if on_block is None:
            status = lib.spot_generate(model, prompt, 3, None, out, capacity, ctypes.byref(n), None, ctypes.byref(e))
        else:
            status = lib.spot_generate_stream(model, prompt, 3, None, on_block, None, out, capacity, ctypes.byref(n),
                                              None, ctypes.byref(e))
        return status, e.message, list(out[:n.value])
    inner = []
    try:
        reference = generate()
        assert reference[0] == 0
        outer = generate(callback_type(lambda ids, n, user: inner.append(generate()) or 0))
        assert outer == reference and inner                       # the outer request, untouched
        assert all(status == 1 and b"already decoding a request" in message for status, message, _ in inner)
        assert generate() == reference                            # the handle is free again
        # spot_close from on_block: the request ends after that block and the handle is freed when it returns (it
        # deleted the model under the request: a use-after-free under AddressSanitizer)
        closed = generate(callback_type(lambda ids, n, user: lib.spot_close(model) or 0))
        assert closed[0] == 0 and 0 < len(closed[2]) < len(reference[2])
        assert closed[2] == reference[2][:len(closed[2])]
        model = None
    finally:
        lib.spot_close(model)


@pytest.mark.parametrize("placement", [(), ("--sampler", "device", "--kv-cache", "device")])
def test_decoders_over_one_opened_model_decode_at_once_as_python_does(spot_cli, tiny, placement):
    """`spot_cli batch --contexts 3`: the model handle and two spot_contexts over it (one set of sessions) decode the
    requests on three threads at once, each with its own KV cache (host, or device OrtValues appended by the shared
    kv_append session) and the shared epilogue: every decoder's tokens and passes are the Python runtime's."""
    folder, drafter_dir, host_engine, drafter = tiny
    engine = OrtEngine(folder, sampler="device", kv_cache="device") if placement else host_engine
    prompts = random_prompts(4, seed=21)
    cases = golden_cases(engine, drafter, prompts, max_new_tokens=24, budget=10, depth=5, seeds_t1=(3,))
    results = run_batch(spot_cli, folder, drafter_dir, cases, "--contexts", "3", *placement)
    bad = mismatches(cases, results)
    assert not bad, f"{len(bad)} of {len(cases)} cases differ:\n" + "\n".join(bad[:20])
    assert {c["decoder"] for c in cases} == {"standard", "threshold", "chain", "tree", "spot", "spot-sets"}


def _peak_rss_kib(cmd: list, stdin: str) -> tuple[int, str]:
    """(the peak resident memory of `cmd`, in KiB, from wait4: this child alone; its stdout). stdin and stdout are a
    few lines: written and read whole without a deadlock."""
    proc = subprocess.Popen([str(c) for c in cmd], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    proc.stdin.write(stdin)
    proc.stdin.close()
    out = proc.stdout.read()
    proc.stdout.close()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    assert proc.returncode == 0, out
    return usage.ru_maxrss, out


def test_contexts_hold_the_weights_once(spot_cli, tmp_path):
    """Four decoders over one opened model (a 34M-parameter export whose 134 MB of weights dwarf its KV caches)
    peak within half the weights of one decoder (measured: +34 MiB, three more threads' passes and malloc arenas;
    a copy of the weights per decoder would add three times 130 MiB): the sessions, and so the weights, exist
    once."""
    cfg = ModelConfig(vocab_size=65536, hidden_size=256, intermediate_size=512, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=256,
                      block_size=4, mask_token_id=65535, stop_ids=(65534,))
    torch.manual_seed(0)
    random_model(cfg, seed=1).save_pretrained(tmp_path / "ckpt")
    folder = export_checkpoint(resolve_source(str(tmp_path / "ckpt")), tmp_path / "onnx",
                               ExportOptions(dtype="fp32", max_nodes=4, max_context=64, validate=False,
                                             epilogue_steps=0), lambda _: None)
    weights = (folder / "target.onnx.data").stat().st_size
    lines = "\n".join(f"--decoder tree --budget 4 --depth 2 --max-new-tokens 8 --seed {i} --temperature 1.0 "
                      f"--prompt-ids {i + 1},{i + 2},{i + 3}" for i in range(4)) + "\n"
    peak = {}
    for n in (1, 4):
        peak[n], out = _peak_rss_kib([spot_cli, "batch", "--model", folder, "--contexts", n], lines)
        assert len([json.loads(line)["token_ids"] for line in out.splitlines()]) == 4
    assert (peak[4] - peak[1]) * 1024 < weights / 2, (peak, weights)


def test_a_context_is_a_decoder_of_its_own_over_the_models_weights(spot_cli, tiny):
    """The C API's contexts: one request at a time each (a second call from its on_block is refused), a request on
    another decoder of the model from on_block runs, the model handle closes before its contexts (which keep
    decoding) and NULL arguments are refused."""
    import ctypes
    lib, Error, callback_type = c_api(spot_cli)
    model, err = ctypes.c_void_p(), Error()
    assert lib.spot_open(str(tiny[0]).encode(), None, ctypes.byref(model), ctypes.byref(err)) == 0, err.message
    prompt = (ctypes.c_int64 * 3)(1, 2, 3)
    capacity = lib.spot_output_capacity(model, 3, 64)

    def run(call, handle, *callback) -> tuple[int, bytes, list[int]]:
        out, n, e = (ctypes.c_int64 * capacity)(), ctypes.c_size_t(), Error()
        status = call(handle, prompt, 3, None, *callback, out, capacity, ctypes.byref(n), None, ctypes.byref(e))
        return status, e.message, list(out[:n.value])
    contexts = [ctypes.c_void_p(), ctypes.c_void_p()]
    try:
        for c in contexts:
            assert lib.spot_context_open(model, ctypes.byref(c), ctypes.byref(err)) == 0, err.message
        reference = run(lib.spot_generate, model)
        assert reference[0] == 0 and reference[2]
        inner = []
        on_block = callback_type(lambda ids, n, user: inner.append((run(lib.spot_context_generate, contexts[0]),
                                                                    run(lib.spot_context_generate, contexts[1])))
                                 or 0)
        outer = run(lib.spot_context_generate_stream, contexts[0], on_block, None)
        assert outer == reference and inner
        for same, other in inner:   # its own decoder is busy; another decoder of the model decodes
            assert same[0] == 1 and b"already decoding a request" in same[1]
            assert other == reference
        lib.spot_close(model)       # the handle first: the contexts keep the sessions
        model = None
        assert run(lib.spot_context_generate, contexts[1]) == reference
        refused = Error()
        assert lib.spot_context_open(None, ctypes.byref(ctypes.c_void_p()), ctypes.byref(refused)) == 1
        assert b"model is NULL" in refused.message
        assert run(lib.spot_context_generate, None)[0] == 1
    finally:
        for c in contexts:
            lib.spot_context_close(c)
        lib.spot_close(model)


def test_a_broken_drafter_beside_the_model_stops_only_the_decoders_that_need_it(spot_cli, tiny, tmp_path):
    """The folder's own drafter.onnx, found rather than named: garbled or for another block size, spot_open failed
    and no decoder could run, while `spot generate` decodes standard / chain / tree without it. Now both hosts do,
    and spot / spot-sets fail with the drafter's error; a drafter the caller names is still refused at open."""
    from spot.runtime.decode_plan import DecodeRequest, run_decoder
    folder, drafter_dir = tiny[0], tiny[1]
    ids = "--prompt-ids", "1,2,3", "--max-new-tokens", "8"
    for name, breaks, code, says in (
            ("garbled", lambda d: (d / "drafter.onnx").write_bytes(b"garbage"), CORRUPT, "does not match"),
            ("foreign", lambda d: (d / "drafter.json").write_text(json.dumps(
                {**json.loads((d / "drafter.json").read_text()), "block_size": 16})), INCOMPATIBLE, "block size")):
        model = tmp_path / name
        shutil.copytree(folder, model)
        for f in ("drafter.onnx", "drafter.json"):
            shutil.copy(drafter_dir / f, model / f)
        breaks(model)
        for decoder in ("standard", "tree"):
            proc = cli(spot_cli, "generate", "--model", model, "--decoder", decoder, *ids)
            assert proc.returncode == 0, (name, decoder, proc.stderr)
            python = run_decoder(decoder, tiny[2], [1, 2, 3], DecodeRequest(8))
            assert json.loads(proc.stdout)["token_ids"] == python.token_ids
        for decoder in ("spot", "spot-sets"):
            _fails(cli(spot_cli, "generate", "--model", model, "--decoder", decoder, *ids), code, says,
                   "the drafter beside the model")
        _fails(cli(spot_cli, "generate", "--model", folder, "--drafter", model, *ids), code, says)
        info = cli(spot_cli, "info", "--model", model)
        assert info.returncode == 0 and json.loads(info.stdout)["has_drafter"] is False, info.stdout


# -- bad input: exit code = spot_status, message on stderr ---------------------------------------------------------
def _fails(proc: subprocess.CompletedProcess, code: int, *words: str) -> None:
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert "spot_cli: error" in proc.stderr
    for w in words:
        assert w in proc.stderr, (w, proc.stderr)


def test_spot_cli_takes_an_embedded_models_name(spot_cli, tiny, tmp_path, monkeypatch):
    """--model arithmetic / code / embedded opens the export `spot demo` caches ($SPOT_CACHE/NAME-fp32-onnx), as the
    Python CLI does; a name whose export is missing is a usage error that says how to make it."""
    monkeypatch.setenv("SPOT_CACHE", str(tmp_path))
    missing = cli(spot_cli, "info", "--model", "arithmetic")
    assert missing.returncode == 64 and "spot demo --model arithmetic" in missing.stderr, missing.stderr
    assert str(tmp_path / "arithmetic-fp32-onnx") in missing.stderr
    shutil.copytree(tiny[0], tmp_path / "code-fp32-onnx")
    want = json.loads(cli(spot_cli, "info", "--model", tiny[0]).stdout)
    for name in ("code", "embedded"):
        got = cli(spot_cli, "info", "--model", name)
        assert got.returncode == 0, got.stderr
        assert json.loads(got.stdout) == want
    (tmp_path / "code").mkdir()          # as in Python, a name wins over a folder of that name; ./code is the folder
    monkeypatch.chdir(tmp_path)
    assert cli(spot_cli, "info", "--model", "code").returncode == 0
    _fails(cli(spot_cli, "info", "--model", "./code"), NOT_FOUND, "manifest.json")


def test_bad_folders_are_refused(spot_cli, tiny, tmp_path):
    folder = tiny[0]
    ids = "--prompt-ids", "1,2,3"
    _fails(cli(spot_cli, "generate", "--model", tmp_path / "nowhere", *ids), NOT_FOUND, "does not exist")
    _fails(cli(spot_cli, "generate", "--model", tmp_path, *ids), NOT_FOUND, "no manifest.json")
    changed = tmp_path / "changed"
    shutil.copytree(folder, changed)
    cfg = changed / "config.json"
    cfg.write_text(cfg.read_text().replace("300", "301", 1))
    _fails(cli(spot_cli, "generate", "--model", changed, *ids), CORRUPT, "config.json", "changed since export")
    cfg.unlink()
    _fails(cli(spot_cli, "generate", "--model", changed, *ids), NOT_FOUND, "config.json", "missing")
    shutil.copyfile(folder / "config.json", cfg)
    data = changed / "target.onnx.data"
    with open(data, "r+b") as f:
        f.truncate(data.stat().st_size - 1)
    _fails(cli(spot_cli, "generate", "--model", changed, *ids), CORRUPT, "target.onnx.data", "bytes")
    manifest = json.loads((folder / "manifest.json").read_text())
    (changed / "manifest.json").write_text(json.dumps({**manifest, "stop_ids": [12]}))      # edited, not hashed
    _fails(cli(spot_cli, "generate", "--model", changed, *ids), CORRUPT, "stop_ids differ from model.*")
    (changed / "manifest.json").write_text("{not json")
    _fails(cli(spot_cli, "generate", "--model", changed, *ids), CORRUPT, "not valid JSON")
    old = make_format1(shutil.copytree(folder, tmp_path / "format1"))     # the prefix broadcast, one stacked cache
    _fails(cli(spot_cli, "generate", "--model", old, *ids), INCOMPATIBLE, "format_version 1",
           f"spot upgrade-export {old}")


def test_manifests_are_read_as_pythons_json_writes_them(spot_cli, tiny, tmp_path):
    """The manifest reader (nlohmann/json underneath) takes what Python's json module writes, NaN / Infinity /
    -Infinity included (drafter.json's accuracy over an empty selection is NaN), as values, not as text inside
    strings; and refuses what is not JSON, naming the file."""
    folder, drafter_dir = tiny[0], tiny[1]
    ids = "--prompt-ids", "1,2,3", "--decoder", "spot", "--max-new-tokens", "8"
    want = json.loads(cli(spot_cli, "generate", "--model", folder, "--drafter", drafter_dir, *ids).stdout)

    def drafter_with(name: str, text_of) -> Path:
        d = tmp_path / name
        shutil.copytree(drafter_dir, d)
        (d / "drafter.json").write_text(text_of(json.loads((d / "drafter.json").read_text())))
        return d

    odd = drafter_with("odd", lambda m: json.dumps({**m, "accuracy": {"a": float("nan"), "b": [float("inf"), -1e999],
                                                                      "NaN": "Infinity, NaN"}}, indent=1))
    assert "NaN," in (odd / "drafter.json").read_text() and "-Infinity" in (odd / "drafter.json").read_text()
    load_drafter(odd)
    got = cli(spot_cli, "generate", "--model", folder, "--drafter", odd, *ids)
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout)["token_ids"] == want["token_ids"]
    for name, text_of, says in (
            ("nan_size", lambda m: json.dumps({**m, "block_size": float("nan")}), "expected an integer"),
            ("glued", lambda m: json.dumps(m)[:-1] + ', "x": [NaN1]}', "not valid JSON"),
            ("trailing", lambda m: json.dumps(m) + " {}", "not valid JSON"),
            ("deep", lambda m: json.dumps({**m, "x": "@"}).replace('"@"', "[" * 300 + "]" * 300),
             "nesting deeper than 256"),
            # what Python's json module reads but nlohmann/json does not (or reads otherwise): both hosts refuse it
            ("deeper", lambda m: json.dumps({**m, "x": "@"}).replace('"@"', "[" * 100_000 + "]" * 100_000),
             "nesting deeper than 256"),
            ("twice", lambda m: json.dumps(m)[:-1] + ', "tau": 0.5}', "duplicate key 'tau'"),
            ("huge", lambda m: json.dumps({**m, "x": "@"}).replace('"@"', "1e999"), "number overflow"),
            ("nul", lambda m: json.dumps({**m, "x": "a\0b"}), r"NUL (\u0000) in a string"),
            ("surrogate", lambda m: json.dumps({**m, "x": "\ud800"}), "surrogate")):
        bad = drafter_with(name, text_of)
        _fails(cli(spot_cli, "generate", "--model", folder, "--drafter", bad, *ids), CORRUPT, "drafter.json", says)
        with pytest.raises(SpotError, match="drafter.json") as e:
            load_drafter(bad)
        assert says in e.value.message, e.value.message


@pytest.mark.parametrize("field,value,graph", CONTRADICTIONS)
def test_a_manifest_that_contradicts_its_graphs_is_refused_at_open_in_both_hosts(spot_cli, tiny, tmp_path, field,
                                                                               value, graph):
    """The C++ host refused such an edit only when ONNX Runtime failed on the first pass (code 6); now both hosts
    compare every graph's declared inputs and outputs with the manifest when they open the folder."""
    folder = contradicting_copy(tiny[0], tmp_path / "edited", field, value)
    _fails(cli(spot_cli, "info", "--model", folder, "--sampler", "device", "--kv-cache", "device"), CORRUPT,
           f"manifest.json contradicts {folder / graph.split(':')[0]}: {graph.split(': ')[1]} is", "re-export")
    with pytest.raises(SpotError, match=f"manifest.json contradicts {graph}"):
        OrtEngine(folder, sampler="device", kv_cache="device")


def test_non_finite_logits_are_refused(spot_cli, tiny, tmp_path):
    """Weights that make NaN logits: a runtime error naming the block, with the host sampler (the logits' check) and
    the device sampler (where NaN logits can make the epilogue itself fail)."""
    broken = nan_weights_copy(tiny[0], tmp_path / "nan")
    for sampler in ("host", "device"):
        _fails(cli(spot_cli, "generate", "--model", broken, "--prompt-ids", "1,2,3", "--sampler", sampler), RUNTIME,
               "non-finite logits", "block at position 0")


def test_mismatched_drafters_are_refused(spot_cli, tiny, tmp_path):
    folder, drafter_dir = tiny[0], tiny[1]
    ids = "--prompt-ids", "1,2,3"

    def edited(name: str, edit) -> Path:
        d = tmp_path / name
        shutil.copytree(drafter_dir, d)
        manifest = json.loads((d / "drafter.json").read_text())
        edit(manifest)
        (d / "drafter.json").write_text(json.dumps(manifest))
        return d

    other_block = edited("b16", lambda m: m.update(block_size=16))
    _fails(cli(spot_cli, "generate", "--model", folder, "--drafter", other_block, *ids), INCOMPATIBLE, "block size")
    other_target = edited("target", lambda m: m["target"].update(vocab_size=4096))
    _fails(cli(spot_cli, "generate", "--model", folder, "--drafter", other_target, *ids), INCOMPATIBLE,
           "another target", "vocab_size")
    for name, edit, says in (("member", lambda m: m.update(member_threshold=2.0), "member_threshold is 2"),
                             ("stale", lambda m: m.update(max_staleness=0), "max_staleness is 0")):
        bad = edited(name, edit)
        _fails(cli(spot_cli, "generate", "--model", folder, "--drafter", bad, *ids), CORRUPT, says)
        with pytest.raises(SpotError, match=says):
            load_drafter(bad)
    epilogue = tmp_path / "epilogue"          # a manifest's future_steps beyond the block: refused at open
    shutil.copytree(folder, epilogue)
    manifest = json.loads((epilogue / "manifest.json").read_text())
    manifest["graphs"]["epilogue"]["future_steps"] = 2**31
    (epilogue / "manifest.json").write_text(json.dumps(manifest))
    _fails(cli(spot_cli, "generate", "--model", epilogue, "--sampler", "device", *ids), CORRUPT,
           "future_steps is 2147483648, expected an integer in 1..")
    with pytest.raises(SpotError, match="future_steps is 2147483648, expected an integer in 1.."):
        OrtEngine(epilogue, sampler="device")
    manifest["graphs"]["epilogue"]["future_steps"] = 2
    manifest["graphs"]["epilogue"]["file"] = "../../etc/passwd"       # a graph outside the folder
    (epilogue / "manifest.json").write_text(json.dumps(manifest))
    outside = "graphs.epilogue.file is '../../etc/passwd', expected the name of a file in the exported folder itself"
    _fails(cli(spot_cli, "generate", "--model", epilogue, *ids), CORRUPT, outside)
    with pytest.raises(SpotError, match=re.escape(outside)):
        OrtEngine(epilogue, sampler="device")
    # a graph no hash vouches for (a file of the folder the files record leaves out), and a NUL that would cut the
    # name at C's boundary ("epilogue.onnx\0x" opened epilogue.onnx in both hosts)
    for name, host_error, python_error in (
            ("config.json.bak", "expected a file the files record lists", "expected a file the files record lists"),
            ("epilogue.onnx\0x", r"NUL (\u0000) in a string", r"NUL \(\\u0000\) in a string")):
        manifest["graphs"]["epilogue"]["file"] = name
        (epilogue / "manifest.json").write_text(json.dumps(manifest))
        _fails(cli(spot_cli, "generate", "--model", epilogue, *ids), CORRUPT, host_error)
        with pytest.raises(SpotError, match=python_error):
            OrtEngine(epilogue, sampler="device")
    anonymous = edited("anonymous", lambda m: m.update(target={}))
    _fails(cli(spot_cli, "generate", "--model", folder, "--drafter", anonymous, *ids), CORRUPT,
           "names no target vocab_size")
    bad_weight = edited("weight", lambda m: m.update(runner_up_weight=1.5))
    _fails(cli(spot_cli, "generate", "--model", folder, "--drafter", bad_weight, *ids), CORRUPT,
           "runner_up_weight is 1.5", "expected null or a number in [0, 1]")
    bad_flips = edited("flips", lambda m: m.update(set_flip_weight=-1))
    _fails(cli(spot_cli, "generate", "--model", folder, "--drafter", bad_flips, *ids), CORRUPT,
           "set_flip_weight is -1", "expected null or a number in [0, 1]")
    swapped = edited("swapped", lambda m: m.update(onnx_sha256="0" * 64))
    _fails(cli(spot_cli, "generate", "--model", folder, "--drafter", swapped, *ids), CORRUPT, "does not match")
    _fails(cli(spot_cli, "generate", "--model", folder, "--drafter", tmp_path / "none", *ids), NOT_FOUND)
    renamed = renamed_input_drafter(drafter_dir, tmp_path / "renamed")
    _fails(cli(spot_cli, "generate", "--model", folder, "--drafter", renamed, *ids), INCOMPATIBLE,
           "has an input 'mask_bits'", "expected some of topk, masked, stale_conf, staleness")


@pytest.mark.parametrize("flags, code, words", [
    (["--decoder", "tree", "--budget", "0"], INVALID_ARGUMENT, ["budget must be >= 1"]),
    (["--decoder", "spot", "--depth", "9"], INVALID_ARGUMENT, ["depth must be in 1..8"]),
    (["--temperature", "-0.5"], INVALID_ARGUMENT, ["temperature must be"]),
    (["--temperature", "5e-324"], INVALID_ARGUMENT, ["temperature must be 0 or a finite number >= 1e-06, got "]),
    (["--decoder", "threshold", "--tau", "1.5"], INVALID_ARGUMENT, ["tau must be in [0, 1)"]),
    (["--decoder", "threshold", "--tau", "-1e-9"], INVALID_ARGUMENT, ["tau must be in [0, 1), got -1e-09"]),
    (["--top-p", "1.0000001"], INVALID_ARGUMENT, ["top_p must be in (0, 1], got 1.0000001"]),   # not "1.000000"
    (["--max-new-tokens", "0"], INVALID_ARGUMENT, ["max_new_tokens must be >= 1"]),
    (["--max-new-tokens", "4000"], INVALID_ARGUMENT, ["more than the model's limit"]),
    (["--top-k", "-1"], INVALID_ARGUMENT, ["top_k must be in [0, 2147483647] (0 disables it), got -1"]),
    (["--top-p", "0"], INVALID_ARGUMENT, ["top_p must be in (0, 1]"]),
    (["--prompt-ids", "1,300,2"], INVALID_ARGUMENT, ["token id 300 is outside the vocabulary [0, 300)"]),
    (["--prompt-ids", "1,-4"], INVALID_ARGUMENT, ["outside the vocabulary"]),
    (["--stop-ids", "300"], INVALID_ARGUMENT, ["stop id 300 is outside the vocabulary [0, 300)"]),
    (["--prompt-ids", "5,299"], INVALID_ARGUMENT, ["mask token id 299"]),
    (["--decoder", "tree", "--budget", "200", "--depth", "8"], INVALID_ARGUMENT,
     ["budget 200 nodes exceeds the 64 states one verify pass"]),
    (["--decoder", "spot", "--budget", "100000"], INVALID_ARGUMENT, ["budget 100000 nodes exceeds"]),
    (["--threads", "100000"], INVALID_ARGUMENT, ["threads must be in 0..256"]),
])
def test_invalid_options_are_refused(spot_cli, tiny, flags, code, words):
    args = ["generate", "--model", tiny[0], "--drafter", tiny[1], "--prompt-ids", "1,2,3", *flags]
    _fails(cli(spot_cli, *args), code, *words)


@pytest.mark.parametrize("device", ["cuda", "trt"])
def test_gpu_devices_need_a_gpu_onnxruntime(spot_cli, tiny, device, tmp_path, monkeypatch):
    """The C++ host links the same libonnxruntime as this Python (cpp/fetch_ort_headers.sh): without its CUDA
    provider, --device cuda / trt name what is missing and how to get it, before any cache folder is made."""
    import onnxruntime as ort
    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this onnxruntime has the CUDA provider: scripts/gpu_check.sh runs the GPU path")
    monkeypatch.setenv("SPOT_CACHE", str(tmp_path / "cache"))
    proc = cli(spot_cli, "generate", "--model", tiny[0], "--device", device, "--prompt-ids", "1,2")
    _fails(proc, UNSUPPORTED, f"device {device} needs ONNX Runtime's CUDAExecutionProvider", "CPUExecutionProvider",
           "onnxruntime-gpu", "or use device cpu")
    assert not (tmp_path / "cache").exists()
    proc = cli(spot_cli, "generate", "--model", tiny[0], "--device", "gpu", "--prompt-ids", "1,2")
    assert proc.returncode == 64 and "--device expects cpu, cuda or trt, got gpu" in proc.stderr


def test_tensorrt_needs_the_recorded_shape_profile(spot_cli, tiny, tmp_path, monkeypatch):
    """--device trt runs the TensorRT shape profile spot-export records (the Python engine's contract); a folder
    exported before it was recorded is refused before any provider or cache folder is touched, with the fix."""
    old = tmp_path / "old"
    shutil.copytree(tiny[0], old)
    manifest = json.loads((old / "manifest.json").read_text())
    # (two blocks: the fused store pass, docs/spec.md §1)
    assert manifest["graphs"]["target"]["tensorrt_profile"]["max"]["position_ids"] == [2 * TINY.block_size]
    del manifest["graphs"]["target"]["tensorrt_profile"]
    (old / "manifest.json").write_text(json.dumps(manifest))
    monkeypatch.setenv("SPOT_CACHE", str(tmp_path / "cache"))
    proc = cli(spot_cli, "generate", "--model", old, "--device", "trt", "--prompt-ids", "1,2")
    _fails(proc, INCOMPATIBLE, "without a TensorRT shape profile", "spot upgrade-export", "or use device cuda")
    assert not (tmp_path / "cache").exists()
    # damaged: refused when the manifest is read (every field is checked then, in both hosts), on every device
    manifest["graphs"]["target"]["tensorrt_profile"] = {"max": {"input_ids": [1, 8]}}
    (old / "manifest.json").write_text(json.dumps(manifest))
    for device in ("trt", "cpu"):
        proc = cli(spot_cli, "generate", "--model", old, "--device", device, "--prompt-ids", "1,2")
        _fails(proc, CORRUPT, "lacks field 'graphs.target.tensorrt_profile.min'")
    with pytest.raises(SpotError, match="lacks field 'graphs.target.tensorrt_profile.min'"):
        OrtEngine(old)
    # a null profile is none: the CPU provider decodes this folder, device trt names the fix
    manifest["graphs"]["target"]["tensorrt_profile"] = None
    (old / "manifest.json").write_text(json.dumps(manifest))
    assert cli(spot_cli, "generate", "--model", old, "--prompt-ids", "1,2", "--max-new-tokens", "4").returncode == 0
    _fails(cli(spot_cli, "generate", "--model", old, "--device", "trt", "--prompt-ids", "1,2"), INCOMPATIBLE,
           "without a TensorRT shape profile")


def test_spot_without_a_drafter_and_usage_errors(spot_cli, tiny, tmp_path):
    _fails(cli(spot_cli, "generate", "--model", tiny[0], "--decoder", "spot", "--prompt-ids", "1,2"),
           INVALID_ARGUMENT, "needs a drafter")
    proc = cli(spot_cli, "generate", "--model", tiny[0], "--decoder", "oracle", "--prompt-ids", "1")
    assert proc.returncode == 64 and "oracle" in proc.stderr
    proc = cli(spot_cli, "generate", "--model", tiny[0], "--prompt-ids", "1,x")
    assert proc.returncode == 64 and "expects an integer" in proc.stderr
    # values beyond the C API's int fields are usage errors, not wrapped (4294967304 used to decode as 8)
    for flag in ("--max-new-tokens", "--budget", "--depth", "--top-k", "--threads"):
        proc = cli(spot_cli, "generate", "--model", tiny[0], "--prompt-ids", "1", flag, "4294967304")
        assert proc.returncode == 64 and f"{flag} expects an integer in [-2147483648, 2147483647]" in proc.stderr
    proc = cli(spot_cli, "generate", "--model", tiny[0], "--max-new-tokens", "4")
    assert proc.returncode == 64 and "--prompt-ids is required" in proc.stderr
    # --depth 0 (the C API's "default depth") is out of range for a tree decoder like any other, as in Python, and
    # ignored by the baseline decoders, as in Python
    for depth in ("0", "-1"):
        _fails(cli(spot_cli, "generate", "--model", tiny[0], "--prompt-ids", "1", "--decoder", "tree", "--depth",
                   depth), INVALID_ARGUMENT, f"depth must be in 1..8 (the block size), got {depth}")
    assert cli(spot_cli, "generate", "--model", tiny[0], "--prompt-ids", "1", "--max-new-tokens", "2", "--depth",
               "0").returncode == 0
    proc = cli(spot_cli, "generate", "--model", tiny[0], "--prompt-ids", "1,2,")
    assert proc.returncode == 64 and "trailing comma" in proc.stderr
    # strtod rounds 1e-400 to 0: a sampling request decoded greedily
    proc = cli(spot_cli, "generate", "--model", tiny[0], "--prompt-ids", "1", "--temperature", "1e-400")
    assert proc.returncode == 64 and "--temperature 1e-400 is too small for a double" in proc.stderr
    # ids with spaces, as Python reads them; spot generate's default of 128 new tokens (the C API keeps 64); and
    # --stop-ids '' = none, on a copy whose manifest stops at a token the request generates (an empty vector's
    # data() is NULL: the C API read it as "the manifest's stop ids")
    from spot.runtime.decode_plan import DecodeRequest, run_decoder
    free = run_decoder("standard", tiny[2], [1, 2], DecodeRequest(128, stop_ids=())).token_ids
    stops = tmp_path / "stops"
    shutil.copytree(tiny[0], stops)
    manifest = json.loads((stops / "manifest.json").read_text())
    manifest["stop_ids"] = manifest["model"]["stop_ids"] = [free[5]]
    (stops / "manifest.json").write_text(json.dumps(manifest))
    for flags, want in ((["--stop-ids", ""], free), (["--stop-ids", " "], free), ([], free[:free.index(free[5])])):
        proc = cli(spot_cli, "generate", "--model", stops, "--prompt-ids", "1, 2 ", *flags)
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["token_ids"] == want and len(free) > 64, flags
    # a batch reports a failed request and goes on with the next one
    proc = cli(spot_cli, "batch", "--model", tiny[0], stdin="--budget 0 --decoder tree --prompt-ids 1\n"
                                                            "--prompt-ids 1,2 --max-new-tokens 4\n")
    lines = [json.loads(x) for x in proc.stdout.splitlines()]
    assert lines[0]["error"]["code"] == INVALID_ARGUMENT and "token_ids" in lines[1]
    assert proc.returncode == INVALID_ARGUMENT
    # an absurd max_new_tokens: the context's error, not a buffer of spot_output_capacity ids allocated first (2e9
    # ids: 16 GB, std::bad_alloc ended the batch)
    proc = cli(spot_cli, "batch", "--model", tiny[0], stdin="--prompt-ids 1,2 --max-new-tokens 2000000000\n"
                                                            "--prompt-ids 1,2 --max-new-tokens 4\n")
    lines = [json.loads(x) for x in proc.stdout.splitlines()]
    assert "more than the model's limit" in lines[0]["error"]["message"] and "token_ids" in lines[1]
    proc = cli(spot_cli, "batch", "--model", tiny[0], stdin="garbage\n")
    assert "expected --flag value pairs, got 'garbage'" in json.loads(proc.stdout)["error"]["message"]


# -- the embedded model: the committed golden file -----------------------------------------------------------------
def test_embedded_golden(spot_cli, tmp_path_factory):
    """tests/data/golden/embedded.json (scripts/make_golden.py on `spot export embedded` + the shipped drafter).
    Another embedded model or drafter fails here, naming the one command that regenerates the file: a skip would
    have turned the only Python == C++ check on the shipped model into a pass."""
    from click.testing import CliRunner

    from spot.cli import main

    regenerate = f"regenerate it: {REGENERATE_EMBEDDED}"
    assert EMBEDDED_GOLDEN.is_file(), f"no golden file for the embedded model: {regenerate}"
    golden = json.loads(EMBEDDED_GOLDEN.read_text())
    out = tmp_path_factory.mktemp("embedded") / "emb_onnx"
    res = CliRunner().invoke(main, ["export", "embedded", "--out", str(out), "--quiet"])
    assert res.exit_code == 0, res.output
    assert model_identity(out)["weights_sha256"] == golden["model"]["weights_sha256"], \
        f"the golden file was made for another embedded model: {regenerate}"
    drafter_dir = embedded_drafter_dir(out)
    assert golden["drafter"] is not None, f"the golden file was made without the embedded drafter: {regenerate}"
    assert (drafter_dir / "drafter.json").is_file(), f"no embedded drafter at {drafter_dir}"
    manifest = json.loads((drafter_dir / "drafter.json").read_text())
    assert manifest["onnx_sha256"] == golden["drafter"]["onnx_sha256"], \
        f"the golden file was made for another embedded drafter: {regenerate}"
    # the same model recalibrated (spot calibrate-drafter) proposes other trees: pass counts change. (setting, its
    # default in drafter.json, its value in a golden file made before the setting existed, what the error names)
    for setting, default, before, what in (
            ("order_temperature", 1.0, 1.0, "another drafter order temperature"),
            ("runner_up_weight", DEFAULT_RUNNER_UP_WEIGHT, 0.0, "another drafter runner-up weight"),
            ("set_flip_weight", DEFAULT_SET_FLIP_WEIGHT, DEFAULT_SET_FLIP_WEIGHT, "another drafter flip weight"),
            ("tree_shapes", [], [], "other drafter tree shapes")):
        assert manifest.get(setting, default) == golden["drafter"].get(setting, before), \
            f"the golden file was made with {what}: {regenerate}"
    cases = golden["cases"]
    results = run_batch(spot_cli, out, drafter_dir, cases)
    bad = mismatches(cases, results)
    assert not bad, f"{len(bad)} of {len(cases)} golden cases differ:\n" + "\n".join(bad[:20])
