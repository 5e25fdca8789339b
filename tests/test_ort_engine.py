"""The ONNX Runtime engine over exported folders: agreement with torch, batch invariance, decoding equality."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from click.testing import CliRunner

from spot.config import ModelConfig
from spot.engines.factory import BACKENDS, open_engine
from spot.engines.ort_engine import OrtEngine
from spot.engines.torch_engine import TorchEngine
from spot.errors import SpotError
from spot.export.export import export_checkpoint
from spot.export.options import ExportOptions
from spot.export.presets import resolve_source
from spot.reference.model import random_model
from spot.runtime.decode import generate
from spot.runtime.step import CommitRule, Sampling

TINY = ModelConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=16, max_position_embeddings=256, block_size=4,
                   mask_token_id=127, stop_ids=(126,))
# wide enough that MLAS uses its blocked GEMM paths (K > 256) and several threads split the work
WIDE = ModelConfig(vocab_size=512, hidden_size=512, intermediate_size=1536, num_hidden_layers=1,
                   num_attention_heads=8, num_key_value_heads=2, head_dim=64, max_position_embeddings=256,
                   block_size=4, mask_token_id=511, stop_ids=(510,))
FP16_TOL = 1e-2   # relative to max(1, max |reference|), as the export's validation (docs/exported-folder.md)


def _export(cfg, tmp, dtype, seed=5, **kw):
    ckpt = tmp / f"ckpt-{seed}"
    if not ckpt.exists():
        random_model(cfg, seed=seed).save_pretrained(ckpt)
    out = export_checkpoint(resolve_source(str(ckpt)), tmp / f"onnx-{dtype}-{seed}-{len(kw)}",
                            ExportOptions(dtype=dtype, **kw))
    return ckpt, out


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tiny")
    ckpt, fp32 = _export(TINY, tmp, "fp32")
    _, fp16 = _export(TINY, tmp, "fp16")
    return ckpt, fp32, fp16


def _states(rng, n, cfg):
    s = rng.integers(0, cfg.vocab_size, size=(n, cfg.block_size))
    s[rng.random(s.shape) < 0.5] = cfg.mask_token_id
    return s


def _max_diffs(a, b, cfg, prefix_blocks=(0, 1, 3), nodes=(1, 2, 3, 4, 5), seed=0):
    """Largest |logits a - logits b| (and the largest |b|) over prefills, block steps with N nodes, and stores."""
    rng = np.random.default_rng(seed)
    worst, scale = 0.0, 0.0
    for blocks in prefix_blocks:
        ids = rng.integers(0, cfg.vocab_size - 2, size=blocks * cfg.block_size)
        a.prefill(ids)
        b.prefill(ids)
        for n in nodes:
            st = _states(rng, n, cfg)
            la, lb = a.block_logits(st), b.block_logits(st)
            worst, scale = max(worst, float(np.abs(la - lb).max())), max(scale, float(np.abs(lb).max()))
        done = rng.integers(0, cfg.vocab_size - 2, size=cfg.block_size)
        a.store(done)
        b.store(done)
        st = _states(rng, 3, cfg)
        worst = max(worst, float(np.abs(a.block_logits(st) - b.block_logits(st)).max()))
    return worst, scale


def test_fp32_logits_match_torch(tiny):
    ckpt, fp32, _ = tiny
    worst, _ = _max_diffs(OrtEngine(fp32), TorchEngine.from_dir(ckpt), TINY)
    assert worst <= 1e-4, worst


@pytest.mark.parametrize("kv_cache", ["host", "device"])
def test_long_prompts_prefill_in_chunks_of_the_widest_verify_pass(tiny, tmp_path, kv_cache):
    """A prompt longer than max_nodes x B tokens is prefilled in chunks of that many tokens (one pass never holds
    the logits and attention scores of the whole prompt): the same logits as torch's one-shot prefill within the
    fp32 tolerance, and the same K/V as the unchunked export's up to float rounding."""
    ckpt, fp32, _ = tiny
    _, narrow = _export(TINY, tmp_path, "fp32", max_nodes=2)    # chunks of 2 x 4 = 8 tokens
    chunked = OrtEngine(narrow, kv_cache=kv_cache)
    assert chunked.prefill_chunk == 8 and OrtEngine(fp32).prefill_chunk == 64 * TINY.block_size
    passes = []
    extend = chunked._extend
    chunked._extend = lambda ids, bias: (passes.append((ids.shape[0], bias.shape)), extend(ids, bias))
    reference = TorchEngine.from_dir(ckpt)
    ids = np.random.default_rng(3).integers(0, TINY.vocab_size - 2, size=7 * TINY.block_size)   # 28 tokens
    chunked.prefill(ids)
    reference.prefill(ids)
    assert passes == [(8, (8, 8)), (8, (8, 16)), (8, (8, 24)), (4, (4, 28))] and chunked.cached_len == 28
    states = _states(np.random.default_rng(4), 2, TINY)
    assert np.abs(chunked.block_logits(states) - reference.block_logits(states)).max() <= 1e-4


def test_fp16_logits_within_stated_tolerance(tiny):
    ckpt, _, fp16 = tiny
    engine = OrtEngine(fp16)
    assert engine.dtype == np.float16
    worst, scale = _max_diffs(engine, TorchEngine.from_dir(ckpt, dtype="fp16"), TINY)
    assert worst <= FP16_TOL * max(1.0, scale), (worst, scale)


@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_batch_invariance_bit_exact(tmp_path, block_size):
    """A state's logits alone and inside a batch of N states are bit-identical (docs/spec.md §4), threads = 2."""
    cfg = WIDE.with_block_size(block_size)
    _, out = _export(cfg, tmp_path, "fp32", validate=False)
    engine = OrtEngine(out, threads=2)
    rng = np.random.default_rng(1)
    engine.prefill(rng.integers(0, 500, size=2 * block_size))
    states = _states(rng, 8, cfg)
    batch = engine.block_logits(states)
    for i in range(8):
        assert np.array_equal(engine.block_logits(states[i:i + 1])[0], batch[i]), i
    for n in range(1, 8):
        assert np.array_equal(engine.block_logits(states[:n]), batch[:n]), n


# no GQA (one query head per KV head): at block size 1 a one-state pass puts a single query row into the shared-prefix
# products, where ONNX Runtime's CPU GEMM takes another kernel than for >= 2 rows (the graph pads it)
NO_GQA = ModelConfig(vocab_size=256, hidden_size=256, intermediate_size=512, num_hidden_layers=1,
                     num_attention_heads=4, num_key_value_heads=4, head_dim=64, max_position_embeddings=1024,
                     block_size=1, mask_token_id=255, stop_ids=(254,))


@pytest.mark.parametrize("name", ["gqa-b3", "no-gqa-b1"])
def test_a_state_alone_and_inside_many_states_over_a_long_prefix(tmp_path, name):
    """The shared-prefix products put the query rows of all N states into one GEMM per KV head: a state's logits
    must still be bit-identical alone and inside N states, for odd and large N, short and long prefixes (spec.md §4)."""
    cfg = replace(WIDE, block_size=3, max_position_embeddings=1020) if name == "gqa-b3" else NO_GQA
    _, out = _export(cfg, tmp_path, "fp32", validate=False, max_nodes=65, epilogue_steps=0)
    engine = OrtEngine(out, threads=2)
    rng = np.random.default_rng(2)
    states = _states(rng, 65, cfg)
    for prefix in (cfg.block_size, 900 // cfg.block_size * cfg.block_size):
        engine.prefill(rng.integers(0, cfg.vocab_size - 2, size=prefix))
        alone = np.stack([engine.block_logits(states[i:i + 1])[0] for i in range(65)])
        for n in (2, 3, 7, 16, 33, 64, 65):
            assert np.array_equal(engine.block_logits(states[:n]), alone[:n]), (prefix, n)


PROMPTS = [[5, 9, 2], [17, 3, 88, 41, 7], [1, 2, 3, 4, 5, 6, 7, 8], [64, 12, 99, 23, 51, 8, 30, 2, 77], [42]]


@pytest.mark.parametrize("temperature,seed", [(0.0, 0), (1.0, 7)])
def test_standard_decoding_streams_equal_on_torch_and_ort(tiny, temperature, seed):
    ckpt, fp32, _ = tiny
    torch_engine, ort_engine = TorchEngine.from_dir(ckpt), OrtEngine(fp32)
    same = 0
    for prompt in PROMPTS:
        kw = dict(max_new_tokens=14, rule=CommitRule(), sampling=Sampling(temperature=temperature, seed=seed))
        a = generate(torch_engine, np.array(prompt), **kw)
        b = generate(ort_engine, np.array(prompt), **kw)
        same += a.token_ids == b.token_ids and a.stats.passes == b.stats.passes
    assert same == len(PROMPTS)


def test_threshold_decoding_streams_equal(tiny):
    ckpt, fp32, _ = tiny
    kw = dict(max_new_tokens=12, rule=CommitRule("threshold", 0.02), sampling=Sampling(temperature=0.7, seed=3))
    torch_engine, ort_engine = TorchEngine.from_dir(ckpt), OrtEngine(fp32)
    for prompt in PROMPTS[:3]:
        a, b = generate(torch_engine, np.array(prompt), **kw), generate(ort_engine, np.array(prompt), **kw)
        assert a.token_ids == b.token_ids and a.stats.steps == b.stats.steps


def test_factory_opens_exported_folder(tiny):
    ckpt, fp32, _ = tiny
    assert "ort" in BACKENDS
    engine = open_engine("ort", fp32)
    assert isinstance(engine, OrtEngine) and engine.block_size == 4
    assert open_engine("ort", fp32, block_size=8).block_size == 8
    for unknown in ("onnx", "trt"):     # named as unknown, not "an exported folder, and --backend X reads checkpoints"
        with pytest.raises(SpotError, match=f"unknown backend '{unknown}', expected one of torch, ort, tensorrt"):
            open_engine(unknown, fp32)
    with pytest.raises(SpotError, match="not an exported spot model folder") as e:
        open_engine("ort", ckpt)
    assert "spot-export" in e.value.hint
    # the library's threads (one engine per thread shares the cores), as spot_open_options.threads
    one = open_engine("ort", fp32, threads=1)
    assert one.session.get_session_options().intra_op_num_threads == 1
    with pytest.raises(SpotError, match="threads sets ONNX Runtime's sessions of the ort backend"):
        open_engine("torch", ckpt, threads=1)


def test_close_releases_the_mapped_weights_at_once(tiny, tmp_path):
    """close() (or leaving a with block) drops the sessions, so ONNX Runtime unmaps target.onnx.data even while
    the engine object is still referenced; later passes, and closing during a request, are clear errors."""
    import gc
    import os
    import threading

    import shutil

    from spot.runtime.decode_plan import DecodeRequest, run_decoder
    fp32 = Path(shutil.copytree(tiny[1], tmp_path / "own"))       # no other test's engine maps this copy

    def mapped() -> bool:
        return str(os.path.realpath(fp32 / "target.onnx.data")) in Path("/proc/self/maps").read_text()
    if not Path("/proc/self/maps").is_file():
        pytest.skip("needs /proc/self/maps")
    gc.collect()
    assert not mapped()
    with OrtEngine(fp32, sampler="device", kv_cache="device") as engine:
        assert mapped()
        placement = engine.placement
        want = run_decoder("standard", engine, [1, 2, 3], DecodeRequest(8)).token_ids
        started, release = threading.Event(), threading.Event()

        def waiting(_ids):
            started.set()
            release.wait(120)
        worker = threading.Thread(target=lambda: run_decoder("standard", engine, [1, 2, 3], DecodeRequest(8),
                                                             on_block=waiting))
        worker.start()
        assert started.wait(120)
        with pytest.raises(SpotError, match="decoding a request"):
            engine.close()
        release.set()
        worker.join()
        with engine.request_lock:       # a request that has the lock but has not yet named its thread
            with pytest.raises(SpotError, match="decoding a request"):
                engine.close()
    gc.collect()
    assert engine.closed and not mapped()          # `engine` still names the object
    assert engine.placement == placement == {"device": "cpu", "sampler": "device", "kv_cache": "device"}
    with pytest.raises(SpotError, match="this engine is closed") as e:
        run_decoder("standard", engine, [1, 2, 3], DecodeRequest(8))
    assert "open the model again" in e.value.hint
    engine.close()                                 # twice: nothing more to do
    with engine.request_lock:                      # ... also while another close() holds the lock
        engine.close()
    assert run_decoder("standard", OrtEngine(fp32), [1, 2, 3], DecodeRequest(8)).token_ids == want


def test_cli_generate_with_ort_backend(tiny):
    ckpt, fp32, _ = tiny
    runner = CliRunner()
    from spot.cli import main as cli
    args = ["generate", "--prompt-ids", "5,9,2,17,3", "--max-new-tokens", "10", "--json"]
    r_ort = runner.invoke(cli, [*args, "--backend", "ort", "--model", str(fp32)])
    r_torch = runner.invoke(cli, [*args, "--backend", "torch", "--model", str(ckpt)])
    assert r_ort.exit_code == 0, r_ort.output
    assert json.loads(r_ort.output)["token_ids"] == json.loads(r_torch.output)["token_ids"]


def test_limits_from_manifest_are_enforced(tmp_path):
    _, out = _export(TINY, tmp_path, "fp32", validate=False, max_nodes=2, max_context=16)
    engine = OrtEngine(out)
    assert engine.max_context == 16
    engine.prefill(np.arange(8))
    with pytest.raises(SpotError, match="exceed the export's max_nodes 2"):
        engine.block_logits(np.zeros((3, 4), np.int64))
    with pytest.raises(SpotError, match="limit of 16"):
        generate(engine, np.arange(10), max_new_tokens=10)


def test_a_budget_beyond_the_exports_max_nodes_is_refused_before_decoding(tmp_path):
    """Checked with the other budget checks, before any pass (it used to surface from the first verify pass, after
    building a tree of that many nodes: 100,000 nodes took minutes); torch engines cap it at 4096."""
    from spot.runtime.decode_plan import DecodeRequest, run_decoder
    from spot.runtime.spot import TreeBudget
    ckpt, out = _export(TINY, tmp_path, "fp32", validate=False, max_nodes=8)
    engine = OrtEngine(out)
    for budget in (TreeBudget(9, 3), TreeBudget(100000, 3)):
        with pytest.raises(SpotError, match="states one verify pass of this engine takes") as e:
            run_decoder("tree", engine, np.arange(4), DecodeRequest(max_new_tokens=8, budget=budget))
        assert "--max-nodes" in e.value.hint
    assert run_decoder("tree", engine, np.arange(4), DecodeRequest(max_new_tokens=8, budget=TreeBudget(8, 3))).stats
    with pytest.raises(SpotError, match="budget 5000 nodes exceeds the 4096"):
        run_decoder("tree", TorchEngine.from_dir(ckpt), np.arange(4),
                    DecodeRequest(max_new_tokens=8, budget=TreeBudget(5000, 3)))


def test_missing_execution_provider_is_a_clear_error(tiny):
    _, fp32, _ = tiny
    available = ort.get_available_providers()
    if "CUDAExecutionProvider" not in available:
        with pytest.raises(SpotError, match="CUDAExecutionProvider") as e:
            OrtEngine(fp32, device="cuda")
        assert "onnxruntime-gpu" in e.value.hint
    if "TensorrtExecutionProvider" not in available:
        with pytest.raises(SpotError, match="ExecutionProvider"):
            OrtEngine(fp32, device="trt")
    with pytest.raises(SpotError, match="unknown device 'tpu'"):
        OrtEngine(fp32, device="tpu")
    with pytest.raises(SpotError, match=r"threads must be in 0..256 \(0: ONNX Runtime's default\), got 100000"):
        OrtEngine(fp32, threads=100000)     # ONNX Runtime would start them all (and run out of memory)


def test_changed_folder_is_refused_on_open(tiny, tmp_path):
    import shutil
    _, fp32, _ = tiny
    folder = tmp_path / "copy"
    shutil.copytree(fp32, folder)
    with open(folder / "target.onnx.data", "r+b") as f:
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(SpotError, match="target.onnx.data .* changed since export"):
        OrtEngine(folder)


class _ShapeLog:
    """A session proxy recording the input shapes of every target pass."""

    def __init__(self, session):
        self.session, self.shapes = session, []

    def run(self, outputs, feeds):
        self.shapes.append({k: tuple(v.shape) for k, v in feeds.items()})
        return self.session.run(outputs, feeds)

    def __getattr__(self, name):
        return getattr(self.session, name)


@pytest.mark.parametrize("decoder", ["standard", "tree"])
def test_every_pass_under_tensorrt_lies_inside_the_recorded_profile(tmp_path, decoder):
    """--device trt (ORT's TensorRT EP) runs the profile spot-export recorded: N 1..max_nodes states of one block,
    or one state of two (the fused store pass), against 0..max_context - B cached tokens. Simulated on the CPU
    provider — the engine set up as on trt (the profile; prefill in passes of its longest, two blocks): every input
    shape of a long prompt's prefill, block steps, verify passes of the tree decoder and fused store passes lies
    between the profile's min and max, and the tokens equal the CPU engine's."""
    from spot.engines.ort_sessions import recorded_trt_profile
    from spot.runtime.decode_plan import DecodeRequest, run_decoder
    from spot.runtime.spot import TreeBudget
    _, folder = _export(TINY, tmp_path, "fp32", validate=False, max_nodes=8, max_context=128)
    cpu, as_trt = OrtEngine(folder), OrtEngine(folder)
    as_trt.trt_profile = recorded_trt_profile(as_trt.exported)
    as_trt.session = log = _ShapeLog(as_trt.session)
    assert as_trt.prefill_chunk == 2 * TINY.block_size and cpu.prefill_chunk == 8 * TINY.block_size
    prompt = np.random.default_rng(1).integers(0, TINY.vocab_size - 2, size=45)
    req = DecodeRequest(max_new_tokens=40, sampling=Sampling(1.0, seed=4), budget=TreeBudget(8, 3))
    assert run_decoder(decoder, as_trt, prompt, req).token_ids == run_decoder(decoder, cpu, prompt, req).token_ids
    assert len(log.shapes) > 20 and any(s["input_ids"] == (1, 2 * TINY.block_size) for s in log.shapes[-8:])
    for shapes in log.shapes:
        for name, shape in shapes.items():
            lo, _, hi = as_trt.trt_profile.shapes[name]
            assert all(a <= d <= b for a, d, b in zip(lo, shape, hi)), (name, shape, lo, hi)


def test_tensorrt_needs_the_recorded_profile_and_its_block_size(tmp_path):
    """An export without the profile (written before it was recorded) and a --block-size override are refused on
    --device trt before any provider is asked for, with what to do."""
    from tinymodels import manifest_json, write_manifest_json
    _, folder = _export(TINY, tmp_path, "fp32", validate=False)
    with pytest.raises(SpotError, match="blocks of 4, the engine decodes blocks of 8"):
        OrtEngine(folder, block_size=8, device="trt")
    manifest = manifest_json(folder)
    manifest["graphs"] = {**manifest["graphs"], "target": {k: v for k, v in manifest["graphs"]["target"].items()
                                                           if k != "tensorrt_profile"}}
    write_manifest_json(folder, manifest)
    with pytest.raises(SpotError, match="without a TensorRT shape profile") as e:
        OrtEngine(folder, device="trt")
    assert "spot upgrade-export" in e.value.hint and '`device="cuda"`' in e.value.hint
    # damaged: refused when the manifest is read, on every device (every field is checked then, in both hosts)
    manifest["graphs"]["target"]["tensorrt_profile"] = {"max": {"input_ids": [1, 4]}}
    write_manifest_json(folder, manifest)
    for device in ("trt", "cpu"):
        with pytest.raises(SpotError, match="lacks field 'graphs.target.tensorrt_profile.min'"):
            OrtEngine(folder, device=device)
    manifest["graphs"]["target"]["tensorrt_profile"] = None      # null: none, as absent
    write_manifest_json(folder, manifest)
    OrtEngine(folder)
    with pytest.raises(SpotError, match="without a TensorRT shape profile"):
        OrtEngine(folder, device="trt")


def test_a_tensorrt_profile_of_one_block_refuses_the_fused_pass_with_the_fix(tmp_path):
    """A folder exported before the fused store pass records a profile whose passes stop at one block: its fused pass
    (2B tokens) would leave it. Refused with the fix; --store separate still decodes (simulated as above)."""
    from spot.folder.trt_profile import Profile
    from spot.runtime.decode_plan import DecodeRequest, run_decoder
    _, folder = _export(TINY, tmp_path, "fp32", validate=False, max_nodes=8, max_context=128)
    engine = OrtEngine(folder)
    b, dims = TINY.block_size, (TINY.num_hidden_layers, TINY.num_key_value_heads, TINY.head_dim)
    engine.trt_profile = Profile.spanning("old", dims, (1, b, 0), (8, b, 64), (8, b, 128 - b))
    prompt = np.arange(1, 10)
    with pytest.raises(SpotError, match="profile takes passes of one block, the fused store pass runs two") as e:
        run_decoder("standard", engine, prompt, DecodeRequest(max_new_tokens=12))
    assert f"spot upgrade-export {folder}" in e.value.hint and "`store_mode=\"separate\"`" in e.value.hint
    separate = run_decoder("standard", engine, prompt, DecodeRequest(max_new_tokens=12, store_mode="separate"))
    assert separate.stats.passes["store"] == separate.stats.blocks
