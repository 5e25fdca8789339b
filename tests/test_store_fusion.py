"""The fused store pass (docs/spec.md §1): a finished block's K/V are cached by the next block's first pass, which
runs the block and the new state as 2B tokens with the block-causal mask; store mode "separate" keeps SDAR's store
pass per block. Pass counts are exact in both modes, every engine's fused pass is the store + the block pass in one
(equal up to float rounding: the K/V of a 2B-token pass), and the Engine's `store=` input is checked in the base
class. Every decoder's exactness against standard decoding in both modes: tests/test_spot.py, test_drafter.py,
test_device_kv.py; the C++ host: tests/test_cpp_host.py."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from spot.config import ModelConfig
from spot.engines.torch_engine import TorchEngine
from spot.errors import SpotError
from spot.reference.model import random_model
from spot.runtime.decode import FUSED, SEPARATE, STORE_MODES, generate
from spot.runtime.decode_plan import DecodeRequest, run_decoder
from spot.runtime.registry import decoder_names
from spot.runtime.summary import static_passes
from spot.runtime.spot import TreeBudget
from spot.runtime.step import Sampling

MASK = 63


def config(block_size: int) -> ModelConfig:
    return ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=512,
                       block_size=block_size, mask_token_id=MASK, stop_ids=(62,))


ENGINES: dict[int, TorchEngine] = {}


def engine_for(block_size: int) -> TorchEngine:
    if block_size not in ENGINES:
        model = random_model(config(block_size), 4, scale=1.0)
        with torch.no_grad():
            model.lm_head.weight.mul_(3.0)
        ENGINES[block_size] = TorchEngine(model)
    return ENGINES[block_size]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(block_size=st.sampled_from([2, 4, 8]), prompt_len=st.integers(0, 19), new=st.integers(1, 30),
       temperature=st.sampled_from([0.0, 1.0]), seed=st.integers(0, 3))
def test_standard_decoding_passes_are_prefill_plus_steps_with_the_fused_store(block_size, prompt_len, new,
                                                                              temperature, seed):
    """Static standard decoding of k blocks: prefill + one pass per step, nothing else (fused), + k store passes
    (separate). The first decoded block's first pass stores nothing; every later block's first pass is fused."""
    engine = engine_for(block_size)
    prompt = np.random.default_rng(seed).integers(0, 60, prompt_len)
    got = {}
    for mode in STORE_MODES:
        req = DecodeRequest(new, sampling=Sampling(temperature, seed=seed), stop_ids=(), store_mode=mode)
        gen = got[mode] = run_decoder("standard", engine, prompt, req)
        s, k = gen.stats, gen.stats.blocks
        prefill = 1 if prompt_len >= block_size else 0
        assert s.passes["prefill"] == prefill and s.passes["verify"] == 0
        assert k == -(-(prompt_len + new) // block_size) - prompt_len // block_size
        assert s.steps == k * block_size - prompt_len % block_size
        assert s.target_passes == static_passes(prompt_len, block_size, k, mode)
        if mode == FUSED:
            assert s.target_passes == prefill + s.steps
            assert (s.passes["fused"], s.passes["store"]) == (k - 1, 0)
        else:
            assert s.target_passes == prefill + s.steps + k
            assert (s.passes["fused"], s.passes["store"]) == (0, k)
    assert got[FUSED].stats.steps == got[SEPARATE].stats.steps


@pytest.mark.parametrize("store_mode", STORE_MODES)
def test_every_decoder_counts_its_passes_by_the_store_mode(store_mode):
    """Which mode ran shows in the pass kinds, for every decoder: fused passes (blocks - 1) and no store pass, or a
    store pass per block and no fused pass; a block's first pass and its store are one pass when fused."""
    engine = engine_for(4)
    prompt = np.arange(1, 8)
    for name in decoder_names():
        if name in ("spot", "spot-sets"):
            continue          # (the drafters' block size: tests/test_drafter.py runs them in both modes)
        req = DecodeRequest(18, sampling=Sampling(1.0, seed=3), budget=TreeBudget(6, 3), stop_ids=(),
                            store_mode=store_mode)
        s = run_decoder(name, engine, prompt, req).stats
        blocks = s.blocks
        if store_mode == FUSED:
            assert (s.passes["fused"], s.passes["store"]) == (blocks - 1, 0), name
        else:
            assert (s.passes["fused"], s.passes["store"]) == (0, blocks), name
        # every block has one first pass: a fused one or a plain block pass
        assert s.passes["fused"] + s.passes["block"] >= blocks, name


def _fused_against_separate(make_engine, block_size: int, atol: float):
    """An engine's fused pass (store=block) against a store pass then a block pass: the same logits and cache up to
    the float rounding of a 2B-token pass, and the same cached length."""
    cfg = config(block_size)
    rng = np.random.default_rng(7)
    prefix = rng.integers(0, 60, 2 * block_size)
    done = rng.integers(0, 60, block_size)
    state = np.full(block_size, cfg.mask_token_id)
    state[: block_size // 2] = rng.integers(0, 60, block_size // 2)
    fused, separate = make_engine(), make_engine()
    for e in (fused, separate):
        e.prefill(prefix)
    (a,) = fused.block_outputs(state[None], [0], Sampling(), 3, store=done)
    separate.store(done)
    (b,) = separate.block_outputs(state[None], [0], Sampling(), 3)
    assert fused.cached_len == separate.cached_len == 3 * block_size
    np.testing.assert_allclose(a.host_logits(), b.host_logits(), atol=atol)
    # the next pass reads the cache the fused pass appended to
    nxt = np.stack([rng.integers(0, 60, block_size) for _ in range(3)])
    np.testing.assert_allclose(fused.block_logits(nxt), separate.block_logits(nxt), atol=atol)
    return fused, separate


@pytest.mark.parametrize("block_size", [2, 4, 8])
def test_the_torch_engines_fused_pass_is_a_store_and_a_block_pass(block_size):
    model = random_model(config(block_size), 5, scale=1.0)
    _fused_against_separate(lambda: TorchEngine(model), block_size, 1e-5)


def test_the_ort_engines_fused_pass_is_a_store_and_a_block_pass(tmp_path):
    """OrtEngine (host cache, device cache: its K/V come to the host and go back) and StaticOrtEngine."""
    pytest.importorskip("onnx")
    from spot.engines.ort_engine import OrtEngine
    from spot.engines.static_ort import StaticOrtEngine
    from spot.export.export import export_checkpoint
    from spot.export.options import ExportOptions
    from spot.export.presets import resolve_source
    random_model(config(4), 6, scale=1.0).save_pretrained(tmp_path / "ckpt")
    folder = export_checkpoint(resolve_source(str(tmp_path / "ckpt")), tmp_path / "onnx",
                               ExportOptions(dtype="fp32", epilogue_steps=2))
    fused = {kv_cache: _fused_against_separate(lambda: OrtEngine(folder, threads=1, kv_cache=kv_cache), 4, 1e-5)[0]
             for kv_cache in ("host", "device")}
    k, v = fused["device"].device_kv.host_copy()      # the device cache holds what the host cache holds
    assert np.array_equal(k, np.stack(fused["host"]._k)) and np.array_equal(v, np.stack(fused["host"]._v))
    _fused_against_separate(lambda: StaticOrtEngine(folder, threads=1), 4, 1e-5)


def test_the_store_input_is_checked_once_in_the_base_class():
    engine = engine_for(4)
    engine.prefill(np.arange(4))
    two = np.full((2, 4), MASK)
    with pytest.raises(SpotError, match="got 2 states, expected 1"):
        engine.block_outputs(two, [0, 0], Sampling(), 1, store=np.arange(4))
    with pytest.raises(SpotError, match=r"block_outputs store: got shape \(3,\), expected \[4\]"):
        engine.block_outputs(two[:1], [0], Sampling(), 1, store=np.arange(3))
    with pytest.raises(SpotError, match="outside the vocabulary"):
        engine.block_outputs(two[:1], [0], Sampling(), 1, store=np.full(4, 99))
    engine.prefill(np.arange(512 - 4) % 60)          # room for one block, not for the fused pass's two
    with pytest.raises(SpotError, match="context of 516 tokens exceeds"):
        engine.block_outputs(two[:1], [0], Sampling(), 1, store=np.arange(4))
    assert engine.cached_len == 508


def test_store_modes_are_checked_where_a_request_is_made():
    with pytest.raises(SpotError, match="store mode must be one of fused, separate, got 'both'"):
        DecodeRequest(8, store_mode="both")
    with pytest.raises(SpotError, match="store mode must be one of"):
        generate(engine_for(4), [1, 2], max_new_tokens=4, store_mode=None)


def test_a_decoder_that_runs_no_pass_still_gets_the_block_before_it_stored():
    """generate() hands the finished block to the next block's first pass; a block decoder that finishes a block
    without a pass (here: a fixed answer) stores nothing, so generate() stores the pending block before going on."""
    engine = engine_for(4)

    def filled(engine, state, block, ctx):
        return np.where(state == MASK, 5, state)
    fused = generate(engine, [1, 2, 3, 4, 7], max_new_tokens=12, block_decoder=filled, stop_ids=())
    assert fused.stats.passes["store"] == fused.stats.blocks - 1 and fused.stats.passes["fused"] == 0
    assert engine.cached_len == 4 * (fused.stats.blocks - 1) + 4
