"""Static shapes (buckets, preallocated KV cache) and the TensorRT entry points' behaviour without TensorRT."""
from __future__ import annotations

import importlib.util
import re
from types import SimpleNamespace

import numpy as np
import pytest
from click.testing import CliRunner

from spot.config import ModelConfig
from spot.engines.buckets import BucketPlan, capacity_buckets, node_buckets, pad_nodes, pick_bucket
from spot.engines.kv_cache import StaticKVCache
from spot.errors import SpotError

TINY = ModelConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=16, max_position_embeddings=256, block_size=4,
                   mask_token_id=127, stop_ids=(126,))
HAS_TRT = importlib.util.find_spec("tensorrt") is not None


# -- buckets ----------------------------------------------------------------------------------------------------
def test_pick_bucket_takes_the_smallest_that_fits():
    assert pick_bucket(1, (1, 2, 4, 8)) == 1
    assert pick_bucket(3, (1, 2, 4, 8)) == 4
    assert pick_bucket(8, (1, 2, 4, 8)) == 8
    with pytest.raises(SpotError, match="exceeds the largest bucket 8"):
        pick_bucket(9, (1, 2, 4, 8), "candidate states")


def test_default_bucket_ladders():
    assert node_buckets(16) == (1, 2, 4, 8, 16)
    assert node_buckets(12) == (1, 2, 4, 8, 12)
    assert node_buckets(1) == (1,)
    assert capacity_buckets(4096, 32) == (256, 512, 1024, 2048, 4096)
    assert capacity_buckets(1000, 32, smallest=100) == (128, 256, 512, 992)     # multiples of the block size
    assert capacity_buckets(40, 16, smallest=256) == (32,)
    with pytest.raises(SpotError):
        capacity_buckets(8, 16)


def test_pad_nodes_repeats_the_last_state():
    states = np.arange(12).reshape(3, 4)
    padded = pad_nodes(states, 4)
    assert padded.shape == (4, 4) and np.array_equal(padded[:3], states) and np.array_equal(padded[3], states[2])
    assert pad_nodes(states, 3) is states
    with pytest.raises(ValueError):
        pad_nodes(states, 2)


def test_bucket_plan_checks_and_lookups():
    plan = BucketPlan.default(256, 4, 8, smallest=16, prefill_blocks=2)
    assert plan.capacities == (16, 32, 64, 128, 256) and plan.nodes == (1, 2, 4, 8) and plan.prefill_chunk == 8
    assert plan.capacity_for(0) == 16 and plan.capacity_for(17) == 32 and plan.capacity_for(256) == 256
    with pytest.raises(SpotError, match="exceeds the largest capacity bucket"):
        plan.capacity_for(257)
    assert plan.nodes_for(5) == 8
    assert BucketPlan.from_dict(plan.to_dict()) == plan
    assert (8, 4, 64) in plan.static_shapes() and (1, 8, 16) in plan.static_shapes()
    for bad in (dict(capacities=(16, 8)), dict(capacities=(18,)), dict(nodes=(0, 2)), dict(prefill_chunk=6)):
        with pytest.raises(SpotError):
            BucketPlan(**{**plan.to_dict(), **bad})


def test_trt_profiles_fix_the_capacity_per_profile():
    """Per capacity: a block profile (N 1..8, S = B) and a prefill profile (N = 1, S 2B..chunk), so that no profile
    spans N_max x chunk tokens (TensorRT sizes a profile's memory for its max shapes)."""
    plan = BucketPlan.default(256, 4, 8, smallest=64, prefill_blocks=2)
    profiles = plan.trt_profiles(layers=2, kv_heads=2, head_dim=16)
    assert [p.name for p in profiles] == ["C64", "C64-prefill", "C128", "C128-prefill", "C256", "C256-prefill"]
    block, prefill = profiles[2].shapes, profiles[3].shapes
    assert block["past_k_0"] == prefill["past_v_1"] == ((2, 128, 16),) * 3 and "past_k" not in block
    assert block["input_ids"] == ((1, 4), (8, 4), (8, 4)) and prefill["input_ids"] == ((1, 8), (1, 8), (1, 8))
    assert block["attn_bias"] == ((4, 132),) * 3 and prefill["attn_bias"] == ((8, 136),) * 3
    assert plan.profile_index(128) == plan.profile_index(128, 4) == 2 and plan.profile_index(128, 8) == 3
    # prefill in passes of one block: the prefill profiles still take the fused store pass's two (docs/spec.md §1)
    one_block = BucketPlan.default(256, 4, 8, smallest=64, prefill_blocks=1)
    profiles = one_block.trt_profiles(2, 2, 16)
    assert [p.name for p in profiles] == ["C64", "C64-prefill", "C128", "C128-prefill", "C256", "C256-prefill"]
    assert profiles[5].shapes["input_ids"] == ((1, 8),) * 3 and one_block.profile_index(256, 8) == 5
    assert one_block.profile_index(256) == 4 and (1, 8, 64) in one_block.static_shapes()


def test_dynamic_trt_profile_spans_every_pass_of_one_block_and_the_fused_pass():
    """N states of one block, and the fused store pass: one state of two blocks (S = 2B)."""
    from spot.folder.trt_profile import Profile, dynamic_trt_profile
    p = dynamic_trt_profile(TINY, max_nodes=8, max_context=256)
    assert p.shapes["input_ids"] == ((1, 4), (8, 4), (8, 8))
    assert p.shapes["past_k_0"] == p.shapes["past_v_1"] == ((2, 0, 16), (2, 124, 16), (2, 252, 16))
    assert p.shapes["attn_bias"] == ((4, 4), (4, 128), (8, 260)) and p.shapes["position_ids"] == ((4,), (4,), (8,))
    assert Profile.from_dict("again", p.to_dict()).shapes == p.shapes
    with pytest.raises(SpotError, match="malformed"):
        Profile.from_dict("bad", {"min": {"input_ids": [1, 4]}})
    with pytest.raises(SpotError, match="max_context 2"):
        dynamic_trt_profile(TINY, max_nodes=8, max_context=2)


def test_ort_tensorrt_provider_options(tmp_path, monkeypatch):
    """--device trt: engine and timing caches, fp16 for an fp16 export, and the profile as ORT's shape strings
    (the provider list is built without a GPU by faking what onnxruntime offers)."""
    import onnxruntime as ort

    from spot.folder.trt_profile import dynamic_trt_profile
    from spot.engines.ort_sessions import providers_for
    monkeypatch.setattr(ort, "get_available_providers",
                        lambda: ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"])
    monkeypatch.setenv("SPOT_CACHE", str(tmp_path))
    profile = dynamic_trt_profile(TINY, max_nodes=8, max_context=256)
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "manifest.json").write_text("{}")      # the engine cache is keyed by its hash
    providers = providers_for("trt", tmp_path / "model", "fp16", trt_profile=profile)
    name, opts = providers[0]
    assert name == "TensorrtExecutionProvider" and providers[1][0] == "CUDAExecutionProvider"
    assert opts["trt_engine_cache_enable"] and opts["trt_engine_cache_path"].startswith(str(tmp_path))
    assert opts["trt_timing_cache_enable"] and opts["trt_fp16_enable"]
    assert opts["trt_profile_min_shapes"] == ("input_ids:1x4,position_ids:4,attn_bias:4x4,past_k_0:2x0x16,"
                                              "past_v_0:2x0x16,past_k_1:2x0x16,past_v_1:2x0x16")
    # (the fused store pass: S = 2B)
    assert opts["trt_profile_max_shapes"] == ("input_ids:8x8,position_ids:8,attn_bias:8x260,past_k_0:2x252x16,"
                                              "past_v_0:2x252x16,past_k_1:2x252x16,past_v_1:2x252x16")
    assert "input_ids:8x4" in opts["trt_profile_opt_shapes"]
    assert "trt_profile_min_shapes" not in providers_for("trt", tmp_path / "model", "fp32")[0][1]


# -- KV cache -----------------------------------------------------------------------------------------------------
def test_static_cache_appends_in_place_and_masks_unused_slots():
    cache = StaticKVCache(layers=2, kv_heads=1, capacity=8, head_dim=3)
    k0 = cache.k
    new = np.ones((2, 1, 4, 3), np.float32)
    cache.append(new, 2 * new)
    assert cache.length == 4 and cache.k is k0 and cache.k[:, :, :4].sum() == 24 and cache.v[:, :, 4:].sum() == 0
    bias = cache.bias(new=4, block_size=4)                        # a block step at positions 4..7
    assert bias.shape == (4, 12)
    assert (bias[:, :4] == 0).all() and np.isneginf(bias[:, 4:8]).all() and (bias[:, 8:] == 0).all()
    cache.reset()
    chunk = cache.bias(new=8, block_size=4)                        # a prefill chunk of two blocks, empty cache
    assert np.isneginf(chunk[:, :8]).all()
    assert (chunk[:4, 8:12] == 0).all() and np.isneginf(chunk[:4, 12:]).all() and (chunk[4:, 8:] == 0).all()
    cache.append(new, new)          # a chunk not aligned to the cache's blocks: positions 4..9, blocks 1, 1, 1, 1, 2, 2
    mixed = cache.bias(new=6, block_size=4, dtype=np.float16)
    assert mixed.dtype == np.float16 and mixed.shape == (6, 14)
    blocks = (4 + np.arange(6)) // 4
    want = np.where(np.concatenate([np.broadcast_to(np.arange(8) < 4, (6, 8)), blocks[None, :] <= blocks[:, None]],
                                   axis=1), 0.0, -np.inf)
    assert np.array_equal(mixed.astype(np.float64), want)


def test_static_cache_grows_to_a_bigger_bucket_and_refuses_overflow():
    cache = StaticKVCache(layers=1, kv_heads=1, capacity=4, head_dim=2)
    cache.append(np.full((1, 1, 4, 2), 3.0, np.float32), np.full((1, 1, 4, 2), 4.0, np.float32))
    with pytest.raises(SpotError, match="KV cache full"):
        cache.append(np.zeros((1, 1, 1, 2), np.float32), np.zeros((1, 1, 1, 2), np.float32))
    assert cache.ensure(8) and not cache.ensure(8) and cache.capacity == 8
    assert (cache.k[:, :, :4] == 3).all() and (cache.v[:, :, :4] == 4).all() and cache.length == 4
    with pytest.raises(ValueError, match="expected"):
        cache.append(np.zeros((1, 2, 1, 2), np.float32), np.zeros((1, 2, 1, 2), np.float32))


# -- the static-shape engine against the dynamic one, on an exported tiny model ---------------------------------------
@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    torch = pytest.importorskip("torch")
    from spot.export.export import export_checkpoint
    from spot.export.options import ExportOptions
    from spot.export.presets import resolve_source
    from spot.reference.model import random_model
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    tmp = tmp_path_factory.mktemp("static")
    random_model(TINY, seed=3).save_pretrained(tmp / "ckpt")
    out = export_checkpoint(resolve_source(str(tmp / "ckpt")), tmp / "onnx",
                            ExportOptions(dtype="fp32", max_nodes=8, validate=False))
    yield out
    torch.set_num_threads(threads)


def _states(rng, n):
    s = rng.integers(0, TINY.vocab_size, size=(n, TINY.block_size))
    s[rng.random(s.shape) < 0.5] = TINY.mask_token_id
    return s


def test_static_capacity_gives_the_dynamic_logits(exported):
    """Masked capacity slots only change reduction lengths: logits agree with the dynamic path within 1e-5."""
    from spot.engines.static_ort import StaticOrtEngine
    from spot.engines.ort_engine import OrtEngine
    dyn = OrtEngine(exported)
    static = StaticOrtEngine(exported, BucketPlan.default(256, 4, 8, smallest=16, prefill_blocks=2))
    rng = np.random.default_rng(0)
    seen, worst = set(), 0.0
    for blocks in (0, 1, 3, 5, 9):
        ids = rng.integers(0, 120, blocks * 4)
        dyn.prefill(ids)
        static.prefill(ids)
        for n in (1, 3, 8):
            st = _states(rng, n)
            worst = max(worst, float(np.abs(dyn.block_logits(st) - static.block_logits(st)).max()))
            seen.add(static.last_shapes)
        done = rng.integers(0, 120, 4)
        dyn.store(done)
        static.store(done)
        st = _states(rng, 2)
        worst = max(worst, float(np.abs(dyn.block_logits(st) - static.block_logits(st)).max()))
    assert worst < 1e-5
    assert {(1, 4, 16), (4, 4, 16), (8, 4, 32), (8, 4, 64)} <= seen          # node and capacity buckets were used


def test_static_engine_applies_a_quantized_exports_session_config(tmp_path):
    """The static engine opens the target as OrtEngine does (ort_sessions.target_session): a weight-only int8 export's
    session config keeps ORT's fused MatMulNBits on float32 activations, so both engines agree within 1e-5 (int8
    activations would differ by ~1e-2)."""
    torch = pytest.importorskip("torch")
    from spot.engines.static_ort import StaticOrtEngine
    from spot.engines.ort_engine import OrtEngine
    from spot.export.export import export_checkpoint
    from spot.export.options import ExportOptions
    from spot.export.presets import resolve_source
    from spot.reference.model import random_model
    random_model(TINY, seed=3).save_pretrained(tmp_path / "ckpt")
    with torch.no_grad():
        folder = export_checkpoint(resolve_source(str(tmp_path / "ckpt")), tmp_path / "int8",
                                   ExportOptions(dtype="fp32", weights="int8", max_nodes=8, validate=False))
    dyn, static = OrtEngine(folder), StaticOrtEngine(folder, BucketPlan.default(256, 4, 8, smallest=16))
    rng = np.random.default_rng(2)
    ids = rng.integers(0, 120, 12)
    dyn.prefill(ids)
    static.prefill(ids)
    st = _states(rng, 3)
    assert np.abs(dyn.block_logits(st) - static.block_logits(st)).max() < 1e-5


def test_a_static_engines_sibling_shares_its_session_and_keeps_its_own_cache(exported):
    """StaticOrtEngine.sibling(): the same session (the weights once) and bucket plan, its own StaticKVCache; the
    two decode different prefixes side by side with the logits each gives alone."""
    from spot.engines.static_ort import StaticOrtEngine
    one = StaticOrtEngine(exported, BucketPlan.default(256, 4, 8, smallest=16))
    two = one.sibling()
    assert two.session is one.session and two.plan is one.plan and two.cache is not one.cache
    rng = np.random.default_rng(4)
    a, b = rng.integers(0, 120, 8), rng.integers(0, 120, 12)
    st = _states(rng, 3)
    one.prefill(a)
    want_a = one.block_logits(st)
    one.prefill(b)
    want_b = one.block_logits(st)
    one.prefill(a)
    two.prefill(b)
    assert np.array_equal(one.block_logits(st), want_a) and np.array_equal(two.block_logits(st), want_b)
    assert two.cached_len == 12 and one.cached_len == 8


def test_the_tuner_sweeps_only_the_node_counts_an_export_takes(exported):
    """An export with --max-nodes 8 (16 is the Jetson example) failed spot tune: the latency sweep always ran
    1..64 nodes. Now up to max_nodes; the candidates that fit are measured, each beside standard decoding."""
    from spot.app.bench_run import TUNE_CANDIDATES, tune_budget
    from spot.prompts import Prompt
    from spot.engines.ort_engine import OrtEngine
    engine = OrtEngine(exported)
    assert engine.max_nodes == 8
    prompts = [Prompt("p", list(range(1, 13)))]
    tuned = tune_budget(engine, prompts, 1.0, TUNE_CANDIDATES, decoder="tree")
    assert set(tuned["latency_ms"]) == {1, 2, 4, 8}
    assert set(tuned["measured_speedup"]) == {"2x1", "4x3", "8x4"}
    assert tuned["choice"]["nodes"] in (1, 2, 4, 8)


def test_padded_node_buckets_are_batch_invariant(exported):
    """The real rows of a padded batch equal each state run alone, bit for bit (docs/spec.md §4 batch invariance)."""
    from spot.engines.static_ort import StaticOrtEngine
    static = StaticOrtEngine(exported, BucketPlan.default(256, 4, 8, smallest=16, prefill_blocks=2))
    rng = np.random.default_rng(1)
    static.prefill(rng.integers(0, 120, 12))
    states = _states(rng, 5)
    together = static.block_logits(states)
    assert static.last_shapes[0] == 8
    alone = np.stack([static.block_logits(states[i:i + 1])[0] for i in range(5)])
    assert np.array_equal(together, alone)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_spot_equals_standard_decoding_on_the_static_engine(exported, temperature):
    from spot.engines.static_ort import StaticOrtEngine
    from spot.runtime.decode_plan import DecodeRequest, run_decoder
    from spot.runtime.spot import TreeBudget
    from spot.runtime.step import Sampling
    static = StaticOrtEngine(exported, BucketPlan.default(256, 4, 8, smallest=16, prefill_blocks=2))
    prompt = np.random.default_rng(2).integers(0, 120, 10)
    req = DecodeRequest(max_new_tokens=24, sampling=Sampling(temperature=temperature, seed=5),
                        budget=TreeBudget(8, 4), stop_ids=())
    standard = run_decoder("standard", static, prompt, req)
    tree = run_decoder("tree", static, prompt, req)
    assert tree.token_ids == standard.token_ids
    assert tree.stats.target_passes < standard.stats.target_passes


@pytest.mark.skipif(importlib.util.find_spec("onnx") is None, reason="needs onnx")
def test_epilogue_in_the_exported_folder_runs_on_the_engine_logits(exported):
    """epilogue.onnx registered in the manifest, fed by the static engine's logits, equals the numpy runtime."""
    from spot.engines.static_ort import StaticOrtEngine
    from spot.export.epilogue_graph import reference_epilogue
    from spot.folder.epilogue import OUTPUTS, make_epilogue_session, run_epilogue
    from spot.folder.manifest import load_manifest
    from spot.export.upgrade import upgrade_export
    from spot.runtime.step import Sampling
    upgrade_export(exported, future_steps=2, progress=lambda line: None)
    folder = load_manifest(exported, verify="full")
    assert folder.manifest.graphs.epilogue.outputs["future_tokens"] == ["N", 2, 4]
    static = StaticOrtEngine(exported, BucketPlan.default(256, 4, 8, smallest=16, prefill_blocks=2))
    rng = np.random.default_rng(3)
    static.prefill(rng.integers(0, 120, 8))
    logits = static.block_logits(_states(rng, 3))
    session = make_epilogue_session(folder.graph_path("epilogue"))
    sampling = Sampling(temperature=0.8, seed=21)
    got, want = run_epilogue(session, logits, [0, 1, 2], sampling, 2), reference_epilogue(logits, [0, 1, 2],
                                                                                          sampling, 2, 2)
    for name in OUTPUTS:
        assert np.array_equal(getattr(got, name), getattr(want, name)), name
    # the TensorRT engine's sampling (the torch twin, never run on TensorRT here) over runs of positions: the same
    torch = pytest.importorskip("torch")
    from spot.engines.tensorrt_engine import TrtEngine
    with torch.inference_mode():
        runs = TrtEngine._epilogue(None, torch.from_numpy(logits), [0, 1, 2], sampling, 2, 2, positions=2)
    for name in OUTPUTS:
        assert np.array_equal(getattr(runs, name), getattr(want, name)), name


# -- TensorRT: clean failures without it ----------------------------------------------------------------------------
needs_no_trt = pytest.mark.skipif(HAS_TRT, reason="tensorrt is installed here")


@needs_no_trt
def test_every_tensorrt_entry_point_says_what_to_install(exported, tmp_path):
    from spot.engines import tensorrt_engine as te
    from spot.engines.factory import open_engine
    from spot.engines.factory import open_engines
    calls = [te.trt_version, te.trt_major, lambda: te.build_engine(exported), lambda: te.TrtRunner(tmp_path / "x"),
             lambda: te.TrtEngine(exported), lambda: open_engine("tensorrt", exported, device="cuda"),
             lambda: te.load_trt_model(exported), lambda: open_engines("tensorrt", exported, 2, device="cuda")]
    for call in calls:
        with pytest.raises(SpotError) as err:
            call()
        assert "tensorrt" in err.value.message.lower()
        assert "python3-libnvinfer" in err.value.hint and "pip install tensorrt" in err.value.hint


@needs_no_trt
def test_build_engine_cli_fails_cleanly(exported, tmp_path):
    from spot.cli import main
    result = CliRunner().invoke(main, ["build-engine", str(exported)])
    assert result.exit_code == 2
    assert "TensorRT" in result.output and "python3-libnvinfer" in result.output
    assert "Traceback" not in result.output
    wrong = CliRunner().invoke(main, ["build-engine", str(tmp_path / "nowhere")])   # the folder first, not TensorRT
    assert wrong.exit_code == 2 and "nowhere" in wrong.stderr and "python3-libnvinfer" not in wrong.stderr


def test_backend_tensorrt_opens_an_export_and_says_what_it_needs(exported, tmp_path):
    """--backend tensorrt runs an exported folder with its TensorRT engine: wrong device, block size or KV placement
    are named before TensorRT is looked for; generate ends with one line."""
    from spot.cli import main
    from spot.engines.factory import open_engine
    for kwargs, says in [({}, 'runs on a CUDA GPU, got `device="cpu"`'),
                         ({"device": "cuda", "block_size": 8}, "exported for blocks of 4"),
                         ({"device": "cuda", "kv_cache": "host"}, "keeps the KV cache on the GPU")]:
        with pytest.raises(SpotError, match=re.escape(says)):
            open_engine("tensorrt", exported, **kwargs)
    with pytest.raises(SpotError, match="manifest"):
        open_engine("tensorrt", tmp_path, device="cuda")
    r = CliRunner().invoke(main, ["generate", "--backend", "tensorrt", "--device", "cuda", "--model", str(exported),
                                  "--prompt-ids", "1,2"])
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert ("is not installed" in r.stderr) if not HAS_TRT else r.stderr


def test_engine_build_options_default_to_what_the_export_allows():
    """spot-export --max-nodes 8 then --tensorrt auto (default BuildOptions) built nothing: 16 > 8 was refused."""
    from spot.engines.tensorrt_engine import BuildOptions, resolve_options
    assert resolve_options(BuildOptions(), 8).max_nodes == 8
    assert resolve_options(BuildOptions(), 64).max_nodes == 16
    assert resolve_options(BuildOptions(max_nodes=32), 64).max_nodes == 32
    with pytest.raises(SpotError, match=r"`max_nodes` must be in 1\.\.8 \(the export's max_nodes\), got 16"):
        resolve_options(BuildOptions(max_nodes=16), 8)


def test_old_tensorrt_and_timing_caches_per_version(monkeypatch):
    """TensorRT 8.x (JetPack 5) is named as too old (its ONNX parser needs another network flag; no int64 tensors);
    a timing cache is one file per TensorRT version and GPU (a cache from another version is not loaded)."""
    import sys
    import types
    from spot.engines import tensorrt_engine as te
    monkeypatch.setitem(sys.modules, "tensorrt", types.SimpleNamespace(__version__="8.6.2"))
    with pytest.raises(SpotError, match="TensorRT 8.6.2 is too old: spot's engines need TensorRT 10") as e:
        te.trt_major()
    assert "JetPack 6" in e.value.hint
    monkeypatch.setitem(sys.modules, "tensorrt", types.SimpleNamespace())
    with pytest.raises(SpotError, match="reports version None, not a TensorRT release: spot's engines need"):
        te.trt_major()
    monkeypatch.setitem(sys.modules, "tensorrt", types.SimpleNamespace(__version__="10.3.0"))
    assert te.trt_major() == 10
    names = {te.timing_cache_name(v, g) for v in ("10.3.0", "10.7.0") for g in ("Orin (nvgpu)", "NVIDIA H200")}
    assert len(names) == 4 and all(n.startswith("timing-") and "/" not in n and " " not in n for n in names)


def test_the_engine_cache_key_comes_from_the_manifests_hashes():
    """The key holds the manifest's sha256 of the graph and weights (verified when the folder opens), not a second
    full hash of 16 GB at every open of --backend tensorrt; any change of file, TensorRT, GPU or options moves it."""
    from spot.engines.tensorrt_engine import BuildOptions, engine_cache_key
    plan = BucketPlan.default(256, 4, 8, 64, 2)
    files = {"target.onnx": "a" * 64, "target.onnx.data": "b" * 64}
    key = engine_cache_key(files, "10.3.0", "Orin", BuildOptions(max_nodes=8), plan)
    assert key == engine_cache_key(dict(files), "10.3.0", "Orin", BuildOptions(max_nodes=8), plan)
    for other in (engine_cache_key({**files, "target.onnx.data": "c" * 64}, "10.3.0", "Orin",
                                   BuildOptions(max_nodes=8), plan),
                  engine_cache_key(files, "10.7.0", "Orin", BuildOptions(max_nodes=8), plan),
                  engine_cache_key(files, "10.3.0", "H200", BuildOptions(max_nodes=8), plan),
                  engine_cache_key(files, "10.3.0", "Orin", BuildOptions(max_nodes=4), plan)):
        assert other != key


def test_an_onnx_runtime_only_export_gets_no_build_engine_advice(monkeypatch):
    """--ort-matmulnbits exports cannot be parsed by TensorRT anywhere: auto says so instead of naming spot
    build-engine (which refuses it); yes fails."""
    from spot.engines import tensorrt_engine as te

    class Folder:
        folder, manifest = "e4-nbits", SimpleNamespace(ort_only=True)
    monkeypatch.setattr(te, "load_manifest", lambda folder: Folder())
    lines = []
    assert te.build_after_export("e4-nbits", "auto", progress=lines.append) is None
    assert lines and "none for this export" in lines[0] and "build-engine" not in lines[0]
    with pytest.raises(SpotError, match="no TensorRT engine was built"):
        te.build_after_export("e4-nbits", "yes")


@needs_no_trt
def test_spot_export_builds_the_engine_where_tensorrt_exists(tmp_path):
    """spot-export --tensorrt auto (the default) exports and says why no engine was built here and how to build it
    on the target; --tensorrt yes fails before exporting, naming what is missing (or a graph TensorRT cannot parse);
    no says nothing."""
    torch = pytest.importorskip("torch")
    from spot.cli import main
    from spot.reference.model import random_model
    with torch.no_grad():
        random_model(TINY, seed=3).save_pretrained(tmp_path / "ckpt")
    base = ["export", str(tmp_path / "ckpt"), "--dtype", "fp32", "--no-validate"]
    auto = CliRunner().invoke(main, [*base, "--out", str(tmp_path / "auto")])
    assert auto.exit_code == 0, auto.output
    assert "TensorRT engine: not built here (TensorRT's Python package (tensorrt) is not installed)" in auto.stderr
    assert f"spot build-engine {tmp_path / 'auto'}" in auto.stderr
    required = CliRunner().invoke(main, [*base, "--out", str(tmp_path / "yes"), "--tensorrt", "yes"])
    assert required.exit_code == 2 and "--tensorrt yes, but no engine can be built here" in required.stderr
    assert "TensorRT's Python package" in required.stderr and "python3-libnvinfer" in required.stderr
    assert not (tmp_path / "yes").exists()
    nbits = CliRunner().invoke(main, [*base, "--out", str(tmp_path / "nbits"), "--tensorrt", "yes", "--weights",
                                      "int4", "--int4-block", "32", "--ort-matmulnbits"])
    assert nbits.exit_code == 2 and "cannot parse com.microsoft MatMulNBits" in nbits.stderr
    assert not (tmp_path / "nbits").exists()
    skipped = CliRunner().invoke(main, [*base, "--out", str(tmp_path / "no"), "--tensorrt", "no"])
    assert skipped.exit_code == 0 and "TensorRT" not in skipped.stderr


def test_tensorrt_refuses_an_onnx_runtime_only_graph(tmp_path):
    from spot.engines.tensorrt_engine import check_parsable

    class Folder:
        folder, manifest = tmp_path, SimpleNamespace(ort_only=True)
    with pytest.raises(SpotError, match="MatMulNBits") as e:
        check_parsable(Folder())
    assert "without --ort-matmulnbits" in e.value.hint
    Folder.manifest = SimpleNamespace(ort_only=False)
    check_parsable(Folder())


@pytest.mark.slow
def test_gpu_check_script_runs_its_cpu_parts(tmp_path):
    """scripts/gpu_check.py without a GPU: the CPU checks run (tiny model) and the JSON report is written."""
    import json
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    env = {**__import__("os").environ, "PYTHONPATH": str(root)}
    proc = subprocess.run([sys.executable, str(root / "scripts" / "gpu_check.py"), "--quick", "--out", str(tmp_path),
                           "--budget-s", "200"], capture_output=True, text=True, timeout=300, env=env)
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    names = [c["name"] for c in report["checks"]]
    assert any("epilogue (ort-cpu)" in n for n in names) and any("SPOT (tree)" in n for n in names)
    assert any("fp16-runs: device sampler == host sampler" in n for n in names)
    assert all(c["passed"] for c in report["checks"]) and not report["errors"]
    assert set(report["latency_ms"]["ort-cpu fp32"]) == {"1", "2", "4", "8", "16"}
    measured = report["latency_ms"]["ort-cpu fp32 vs projection"]      # latency(N); no CPU figures to project
    assert set(measured) == {"1", "2", "4", "8", "16"} and all(r["measured_ms"] > 0 for r in measured.values())
