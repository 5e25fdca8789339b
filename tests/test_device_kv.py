"""The KV cache kept where the target runs (spot.engines.device_kv + the export's kv_append.onnx): the same cache
contents, tokens and passes as the numpy cache, for every decoder and with either sampler.

Runs on ORT CPU here (the OrtValues live in host memory, the code path is the GPU one); on a GPU the same code keeps
the cache in CUDA memory (scripts/gpu_check.py)."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from spot.config import ModelConfig
from spot.engines.ort_engine import OrtEngine
from spot.engines.ort_sessions import on_device
from spot.errors import SpotError
from spot.export.export import export_checkpoint
from spot.export.options import ExportOptions
from spot.export.kv_append_graph import validate_kv_append, write_kv_append
from spot.export.presets import resolve_source
from spot.reference.model import random_model
from spot.runtime.decode_plan import DecodeRequest, run_decoder
from spot.runtime.spot import TreeBudget
from spot.runtime.step import Sampling
from tinymodels import without_kv_append

pytest.importorskip("onnx")

CFG = ModelConfig(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, max_position_embeddings=256, block_size=8,
                  mask_token_id=95, stop_ids=(94,))
DEPTH = 4


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("kv")
    random_model(CFG, seed=5).save_pretrained(tmp / "ckpt")
    return export_checkpoint(resolve_source(str(tmp / "ckpt")), tmp / "onnx",
                             ExportOptions(dtype="fp32", epilogue_steps=DEPTH))


def _prompt(seed, n):
    return np.random.default_rng(seed).integers(0, CFG.vocab_size - 2, size=n)


def test_export_writes_and_validates_kv_append(folder, tmp_path):
    manifest = json.loads((folder / "manifest.json").read_text())
    entry = manifest["graphs"]["kv_append"]
    assert "kv_append.onnx" in manifest["files"] and entry["validation"]["checked"]
    assert entry["inputs"] == ["past_k", "past_v", "new_k", "new_v"] and entry["outputs"] == ["k", "v"]
    assert entry["per_layer"]
    # fp16 caches (GPU exports) append exactly too
    write_kv_append(tmp_path, 2, 8, "fp16")
    assert validate_kv_append(tmp_path, 2, 8, "fp16")["checked"]


def test_the_device_cache_holds_what_the_host_cache_holds(folder):
    host = OrtEngine(folder, threads=1, kv_cache="host")
    device = OrtEngine(folder, threads=1, kv_cache="device")
    assert host.device_kv is None and device.device_kv is not None
    for engine in (host, device):
        engine.prefill(_prompt(1, 2 * CFG.block_size))
        engine.store(_prompt(2, CFG.block_size))
    k, v = device.device_kv.host_copy()
    assert k.shape == (2, 2, 3 * CFG.block_size, 16)
    assert np.array_equal(k, np.stack(host._k)) and np.array_equal(v, np.stack(host._v))
    states = np.stack([_prompt(s, CFG.block_size) for s in range(3)])
    assert np.array_equal(host.block_logits(states), device.block_logits(states))
    device.prefill(_prompt(3, CFG.block_size))          # a new request starts from an empty cache
    assert device.device_kv.length == CFG.block_size == device.cached_len


@pytest.mark.parametrize("store_mode", ["fused", "separate"])
@pytest.mark.parametrize("sampler", ["host", "device"])
@pytest.mark.parametrize("decoder,mode", [("standard", "static"), ("threshold", "static"), ("chain", "static"),
                                          ("tree", "static"), ("tree", "threshold")])
def test_device_cache_decodes_like_the_host_cache(folder, decoder, mode, sampler, store_mode):
    """Either store mode: the fused pass's stored block reaches the device cache through the host (ort_engine
    OrtEngine._append_host), with the same tokens and passes."""
    host = OrtEngine(folder, threads=1, sampler=sampler, kv_cache="host")
    device = OrtEngine(folder, threads=1, sampler=sampler, kv_cache="device")
    for i, temperature in enumerate((0.0, 1.0, 0.7)):
        req = DecodeRequest(max_new_tokens=20, mode=mode, tau=0.3, sampling=Sampling(temperature, seed=30 + i),
                            budget=TreeBudget(6, DEPTH), store_mode=store_mode)
        prompt = _prompt(i, 5 + 4 * i)       # prompts that are not whole blocks: padded prefill + stored blocks
        a, b = run_decoder(decoder, host, prompt, req), run_decoder(decoder, device, prompt, req)
        assert a.token_ids == b.token_ids and a.stats.passes == b.stats.passes, (decoder, i)


def test_where_the_cache_lives(folder, tmp_path):
    kv = "KV cache place"
    assert not on_device("auto", kv, "cpu", True) and on_device("auto", kv, "cuda", True)
    assert not on_device("auto", kv, "trt", False) and on_device("device", kv, "cpu", True)
    assert OrtEngine(folder, threads=1).device_kv is None             # auto on the CPU: the numpy cache
    assert OrtEngine(folder, threads=1).placement == {"device": "cpu", "sampler": "host", "kv_cache": "host"}
    assert OrtEngine(folder, threads=1, kv_cache="device", sampler="device").placement == {
        "device": "cpu", "sampler": "device", "kv_cache": "device"}
    with pytest.raises(SpotError, match="unknown KV cache place 'gpu'"):
        OrtEngine(folder, threads=1, kv_cache="gpu")
    # a format 2 folder without kv_append (hand-made: every export and upgrade writes it) is refused wherever its
    # cache would live, with the upgrade as the fix; the upgrade writes it
    from spot.export.upgrade import upgrade_export
    old = tmp_path / "old"
    shutil.copytree(folder, old)
    without_kv_append(old)
    for kv_cache in ("auto", "host", "device"):
        with pytest.raises(SpotError, match="lists no kv_append graph, expected one in every format 2 folder") as e:
            OrtEngine(old, threads=1, kv_cache=kv_cache)
        assert e.value.hint.startswith(f"run `spot upgrade-export {old}`")
    assert upgrade_export(old, progress=lambda _: None)[1]
    assert OrtEngine(old, threads=1, kv_cache="device").placement["kv_cache"] == "device"


def test_only_the_ort_backend_has_a_device_cache(folder):
    from spot.engines.factory import open_engine
    with pytest.raises(SpotError, match='`kv_cache="device"` needs the ort backend') as e:
        open_engine("torch", folder.parent / "ckpt", kv_cache="device")
    assert '`kv_cache="host"`' in e.value.hint


def test_the_append_session_grows_its_cuda_arena_by_what_it_asks(folder, tmp_path, monkeypatch):
    """On a GPU the append session's CUDA provider gets arena_extend_strategy kSameAsRequested (the cache grows by
    one block per store); the provider list is built without a GPU by faking what onnxruntime offers."""
    import onnxruntime as ort

    from spot.engines.ort_sessions import providers_for
    monkeypatch.setattr(ort, "get_available_providers",
                        lambda: ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"])
    monkeypatch.setenv("SPOT_CACHE", str(tmp_path))
    options = {"arena_extend_strategy": "kSameAsRequested"}
    assert providers_for("cuda", folder, "fp16", options) == [("CUDAExecutionProvider", options),
                                                              "CPUExecutionProvider"]
    trt = providers_for("trt", folder, "fp16")
    assert trt[0][0] == "TensorrtExecutionProvider" and trt[1] == ("CUDAExecutionProvider", {})
    assert providers_for("cpu", folder, "fp32", options) == ["CPUExecutionProvider"]
