"""Memory plans (`spot-export MODEL --plan DEVICE`): weights / KV / verify-pass / overhead terms against arithmetic
from SDAR-8B's real config.json, the largest context, impossible plans, the CLI and the manifest record."""
from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings, strategies as st

from spot.cli import main as cli
from spot.config import ModelConfig, load_config
from spot.errors import SpotError
from spot.export.memory_plan import (DEVICES, GIB, kv_bytes_per_token, make_plan, render, resolve_device,
                                     verify_pass_bytes, weight_bytes)
from spot.export.quantize import QuantScheme

FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures"
SDAR_8B = FIXTURES / "sdar-8b-chat"


@pytest.fixture(scope="module")
def raw() -> dict:
    if not (SDAR_8B / "config.json").is_file():
        pytest.skip("fixture sdar-8b-chat absent")
    return json.loads((SDAR_8B / "config.json").read_text())


@pytest.fixture(scope="module")
def cfg(raw) -> ModelConfig:
    return load_config(SDAR_8B)


def _linears(raw: dict) -> list[tuple[int, int]]:
    """(out, in) of the 7 linear weights of one layer, from config.json."""
    h, i, d = raw["hidden_size"], raw["intermediate_size"], raw["head_dim"]
    q, kv = raw["num_attention_heads"] * d, raw["num_key_value_heads"] * d
    return [(q, h), (kv, h), (kv, h), (h, q), (i, h), (i, h), (h, i)]


def _expected_weight_bytes(raw: dict, weights: str, block: int = 128) -> int:
    """Arithmetic from config.json: fp16 embed + lm_head, float32 norms, linears per precision with fp16 scales."""
    h, v, layers, d = raw["hidden_size"], raw["vocab_size"], raw["num_hidden_layers"], raw["head_dim"]
    per_matrix = {"fp": lambda o, i: 2 * o * i,
                  "int8": lambda o, i: o * i + 2 * o,
                  "int4": lambda o, i: o * i // 2 + 2 * o * (i // block)}[weights]
    linear = layers * sum(per_matrix(o, i) for o, i in _linears(raw))
    norms = 4 * (layers * (2 * h + 2 * d) + h)
    return linear + 2 * (2 * v * h) + norms


def test_weight_bytes_match_config_arithmetic(raw, cfg):
    fp16 = weight_bytes(cfg, "fp16")
    assert fp16 == _expected_weight_bytes(raw, "fp")
    assert 16.3e9 < fp16 < 16.5e9                   # docs/spec.md §8: 16.4 GB
    int8 = weight_bytes(cfg, "fp16", QuantScheme("int8"))
    assert int8 == _expected_weight_bytes(raw, "int8") and 9.3e9 < int8 < 9.6e9      # ~9.5 GB
    for block in (32, 64, 128):
        int4 = weight_bytes(cfg, "fp16", QuantScheme("int4", block))
        assert int4 == _expected_weight_bytes(raw, "int4", block)
    assert 5.9e9 < weight_bytes(cfg, "fp16", QuantScheme("int4", 128)) < 6.2e9      # 2.49 GB of it: embed + head


def test_kv_cache_is_144_kib_per_token_fp16(raw, cfg):
    per = 2 * raw["num_hidden_layers"] * raw["num_key_value_heads"] * raw["head_dim"] * 2
    assert kv_bytes_per_token(cfg, "fp16") == per == 144 * 1024
    assert kv_bytes_per_token(cfg, "fp32") == 2 * per


@pytest.mark.parametrize("device", list(DEVICES))
def test_plan_terms_on_each_device(raw, cfg, device):
    """Each named device: the plan's terms are the config arithmetic; the largest context fits, one block more
    does not (unless capped by max_position_embeddings)."""
    dev = DEVICES[device]
    weights = "int4" if dev.memory_gib < 16 else ("int8" if dev.memory_gib < 32 else "fp")
    quant = QuantScheme(weights)
    b, nodes, ctx = cfg.block_size, 16, 4096
    plan = make_plan(cfg, "fp16", quant, ctx, nodes, dev, "sdar-8b")
    assert plan.weight_bytes == _expected_weight_bytes(raw, weights)
    assert plan.kv_bytes == 144 * 1024 * ctx
    assert plan.activations["logits"] == nodes * b * raw["vocab_size"] * (4 + 2)    # fp32 logits + fp16 head out
    t = ctx + b
    assert plan.activations["attention_scores"] == nodes * raw["num_attention_heads"] * b * t * (2 + 8)
    # the graph reads each layer's cache in place, once per pass: no broadcast K/V, no copy of the cache; a store
    # appends one layer at a time
    assert "kv_broadcast" not in plan.activations and "cache_copy" not in plan.activations
    assert plan.activations["layer_append"] == 2 * raw["num_key_value_heads"] * t * raw["head_dim"] * 2
    assert plan.runtime_bytes == int(0.9 * GIB) and plan.os_bytes == int(1.0 * GIB)
    assert plan.total == (plan.weight_bytes + plan.kv_bytes + sum(plan.activations.values()) + plan.runtime_bytes
                          + plan.os_bytes)
    assert plan.fits == (plan.total <= dev.memory_gib * GIB)
    for n, best in ((nodes, plan.max_context), (1, plan.max_context_one_node)):
        assert best % b == 0 and best <= cfg.max_position_embeddings
        if best:
            assert make_plan(cfg, "fp16", quant, best, n, dev).fits
        if best < cfg.max_position_embeddings:
            assert not make_plan(cfg, "fp16", quant, best + b, n, dev).fits
    assert plan.max_context_one_node >= plan.max_context
    text = render(plan, b)
    assert f"{plan.weight_bytes / GIB:.2f} GiB" in text and "144.0 KiB/token x 4096 tokens" in text
    assert dev.name in text


def test_orin_nx_16gb_holds_int4_sdar_8b_at_long_context(cfg):
    plan = make_plan(cfg, "fp16", QuantScheme("int4"), 8192, 16, DEVICES["orin-nx-16gb"])
    assert plan.fits and plan.max_context_one_node >= 32768 // 2


def test_sdar_8b_b32_on_orin_nx_holds_longer_contexts_without_the_broadcast():
    """The issue's case (spot-export sdar-8b-b32 --weights int4 --plan orin-nx-16gb): format 1's plan held 4224
    tokens at 64 nodes (12 GiB of K/V broadcast and 4.5 GiB of cache copy at 32k tokens) and 13504 at 16; without
    them at least 1.6x that."""
    from spot.export.options import ExportOptions
    from spot.export.presets import PRESETS
    cfg = PRESETS["sdar-8b-b32"].config()
    options = ExportOptions(dtype="fp16", weights="int4")
    epilogue = options.epilogue_call(cfg)
    at = {n: make_plan(cfg, "fp16", options.quant, 32768, n, DEVICES["orin-nx-16gb"], epilogue=epilogue)
          for n in (16, 64)}
    assert at[64].max_context >= 1.6 * 4224 and at[64].max_context == 7072
    assert at[16].max_context == 23872 and at[64].max_context_one_node == 32768
    assert "K/V broadcast" not in render(at[64], 32) and "cache copy" not in render(at[64], 32)


def test_impossible_plans_name_what_to_change(cfg):
    with pytest.raises(SpotError, match="weights alone take 15.2") as e:
        make_plan(cfg, "fp16", QuantScheme(), 4096, 16, DEVICES["orin-nano-8gb"], "sdar-8b")
    assert "--weights int4" in e.value.hint and "--weights int8" not in e.value.hint
    with pytest.raises(SpotError) as e:
        make_plan(cfg, "fp16", QuantScheme(), 4096, 16, DEVICES["orin-nx-16gb"], "sdar-8b")
    assert "--weights int8" in e.value.hint and "--weights int4" in e.value.hint
    with pytest.raises(SpotError) as e:
        make_plan(cfg, "fp16", QuantScheme("int4"), 4096, 16, resolve_device("6GB"), "sdar-8b")
    assert ("smaller model: sdar-4b (int4: up to 4428 tokens at 1 node), sdar-1.7b (int4: up to 18036 tokens at 1 "
            "node)") in e.value.hint           # with spot-export's default sampling epilogue, as exported


def test_the_hint_names_only_smaller_models_and_an_allowance_no_model_fits():
    """sdar-1.7b was told to use sdar-4b or sdar-1.7b; a device below the runtime + OS allowance was told to use a
    smaller model."""
    from spot.export.presets import PRESETS
    small = PRESETS["sdar-1.7b"].config()
    with pytest.raises(SpotError) as e:
        make_plan(small, "fp16", QuantScheme("int4"), 4096, 16, resolve_device("2.5GB"), "sdar-1.7b")
    assert e.value.hint.startswith("use a device with more memory") and "sdar-4b" not in e.value.hint
    with pytest.raises(SpotError) as e:
        make_plan(PRESETS["sdar-4b"].config(), "fp16", QuantScheme("int4"), 4096, 16, resolve_device("4.5GB"))
    assert "smaller model: sdar-1.7b (int4: up to 4620 tokens at 1 node)" in e.value.hint
    with pytest.raises(SpotError) as e:     # 4 GB: sdar-1.7b's int4 export fits with room for a few tokens only
        make_plan(PRESETS["sdar-4b"].config(), "fp16", QuantScheme("int4"), 4096, 16, resolve_device("4GB"))
    assert e.value.hint.startswith("use a device with more memory") and "sdar-1.7b" not in e.value.hint
    with pytest.raises(SpotError) as e:     # 2 GB: no model fits beside the runtime, none is suggested
        make_plan(PRESETS["sdar-8b"].config(), "fp16", QuantScheme(), 4096, 16, resolve_device("2GB"))
    assert "smaller model" not in e.value.hint
    tiny = ModelConfig(vocab_size=64, hidden_size=16, intermediate_size=24, num_hidden_layers=1,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=4, max_position_embeddings=64,
                       mask_token_id=63, stop_ids=(0,))
    with pytest.raises(SpotError) as e:
        make_plan(tiny, "fp32", QuantScheme(), 64, 4, resolve_device("1GB"))
    assert "the runtime and OS take 1.9 GiB of the device's 1 GiB before any weights" in e.value.hint


def test_device_names():
    assert resolve_device("AGX-Orin-64GB").memory_gib == 64
    assert resolve_device("12GB").budget == 12 * GIB and resolve_device("12.5gib").memory_gib == 12.5
    with pytest.raises(SpotError, match="unknown --plan device"):
        resolve_device("orin-nano")


def test_verify_pass_terms_grow_with_nodes_and_context():
    tiny = ModelConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
                       block_size=4, mask_token_id=127)
    def per_state(nodes, context):   # every term but the layer append grows with the states of a pass
        terms = verify_pass_bytes(tiny, "fp32", nodes, context, False)
        return sum(terms.values()) - terms["layer_append"]
    assert per_state(4, 64) == 2 * per_state(2, 64) and per_state(2, 128) > per_state(2, 64)
    # one node is sized as two: the fused store pass runs 2B tokens of one state (a block and the next one's state)
    assert per_state(1, 64) == per_state(2, 64)
    append = verify_pass_bytes(tiny, "fp32", 2, 64, False)["layer_append"]
    # one layer's cache with the block's tokens: a store's transient, one layer at a time
    assert append * tiny.num_hidden_layers == kv_bytes_per_token(tiny, "fp32") * (64 + tiny.block_size)
    assert "dequantized_matrix" in verify_pass_bytes(tiny, "fp32", 1, 64, True)


# -- CLI -------------------------------------------------------------------------------------------------------------
def test_cli_plan_prints_and_exports_nothing(raw, cfg, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(cli, ["export", "sdar-8b", "--checkpoint", str(SDAR_8B), "--plan", "orin-nx-16gb",
                                 "--weights", "int4", "--max-context", "8192", "--max-nodes", "16", "--quiet"])
    assert r.exit_code == 0, r.output
    expected = _expected_weight_bytes(raw, "int4")
    assert f"{expected / GIB:.2f} GiB" in r.output and "144.0 KiB/token x 8192 tokens" in r.output
    assert "Jetson Orin NX 16GB" in r.output and "GiB: fits" in r.output
    assert list(tmp_path.iterdir()) == []


def test_cli_impossible_plan_is_an_error(tmp_path, monkeypatch):
    if not (SDAR_8B / "config.json").is_file():
        pytest.skip("fixture sdar-8b-chat absent")
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(cli, ["export", "sdar-8b", "--checkpoint", str(SDAR_8B), "--plan", "orin-nano-8gb"])
    assert r.exit_code == 2
    assert "does not fit Jetson Orin Nano 8GB" in r.output and "--weights int4" in r.output


def test_cli_plan_that_does_not_fit_exits_1(tmp_path, monkeypatch):
    """A printed plan that does not fit exits 1 (scripts test it); bad device sizes are clear errors."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub"))
    r = CliRunner().invoke(cli, ["export", "sdar-8b-b32", "--weights", "int4", "--plan", "orin-nano-8gb",
                                 "--max-nodes", "16"])
    assert r.exit_code == 1 and "does NOT fit" in r.output
    for size in ("0GB", "99999999999999999999GB"):
        r = CliRunner().invoke(cli, ["export", "sdar-8b", "--plan", size])
        assert r.exit_code == 2 and "a device size must be in (0, 4096] GiB" in r.output


def test_cli_plan_without_local_weights_uses_the_builtin_config(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub"))
    r = CliRunner().invoke(cli, ["export", "sdar-1.7b", "--plan", "orin-nano-8gb", "--max-context", "4096",
                                 "--max-nodes", "16", "--epilogue-steps", "0"])
    assert r.exit_code == 0, r.output
    assert "sdar-1.7b" in r.output and "GiB: fits" in r.output and "sampling epilogue 0.00 GiB" in r.output


def test_cli_epilogue_positions(tmp_path, monkeypatch):
    """--epilogue-positions sets the epilogue's positions per call (its memory term); it must divide the block."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub"))
    args = ["export", "sdar-1.7b-b32", "--weights", "int4", "--plan", "orin-nano-8gb", "--max-context", "4096",
            "--max-nodes", "16"]
    default, fewer = (CliRunner().invoke(cli, args + extra) for extra in ([], ["--epilogue-positions", "2"]))
    assert default.exit_code == fewer.exit_code == 0, default.output + fewer.output
    assert "sampling epilogue 0.77 GiB" in default.output and "sampling epilogue 0.19 GiB" in fewer.output
    bad = CliRunner().invoke(cli, args + ["--epilogue-positions", "3"])
    assert bad.exit_code != 0 and "--epilogue-positions must divide the block size 32, got 3" in bad.output


def test_the_plan_counts_the_sampling_epilogue(cfg):
    """The device sampler's epilogue (measured on ORT CPU: ~9 x its (D+1) x P x V float64 tensor per call) is a
    pass term of its own: it grows with the future steps and the positions per call, not with the nodes (the hosts
    call it for one state at a time), and no epilogue means no term. The default positions keep it under 1 GiB."""
    from spot.folder.epilogue import EPILOGUE_PEAK_FACTOR, EpilogueCall, default_epilogue_positions
    quant, dev = QuantScheme("int4"), DEVICES["orin-nx-16gb"]
    call = EpilogueCall(4, cfg.block_size)
    with_epi = make_plan(cfg, "fp16", quant, 8192, 2, dev, "sdar-8b", epilogue=call)
    without = make_plan(cfg, "fp16", quant, 8192, 2, dev, "sdar-8b")
    term = with_epi.activations["sampling_epilogue"]
    assert term == int(EPILOGUE_PEAK_FACTOR * 5 * cfg.block_size * cfg.vocab_size * 8)
    assert "sampling_epilogue" not in without.activations and with_epi.total == without.total + term
    assert term > with_epi.activations["logits"]
    tight = resolve_device("9GB")           # (on the 16 GB Orin NX both reach the model's 32768 tokens)
    assert (make_plan(cfg, "fp16", quant, 8192, 2, tight, epilogue=call).max_context
            < make_plan(cfg, "fp16", quant, 8192, 2, tight).max_context)
    assert make_plan(cfg, "fp16", quant, 8192, 64, dev, "sdar-8b", epilogue=call).activations[
        "sampling_epilogue"] == term
    assert EpilogueCall(8, 32).peak_bytes(cfg.vocab_size) == int(EPILOGUE_PEAK_FACTOR * 9 * 32 * cfg.vocab_size * 8)
    assert EpilogueCall(8, 8).peak_bytes(cfg.vocab_size) * 4 == EpilogueCall(8, 32).peak_bytes(cfg.vocab_size)
    # the defaults: SDAR's vocabulary at B 32, D 8 -> 8 positions (0.77 GiB); at B 4 the whole block; tiny vocabularies
    assert default_epilogue_positions(cfg.vocab_size, 32, 8) == 8
    assert default_epilogue_positions(cfg.vocab_size, 4, 4) == 4 and default_epilogue_positions(2048, 32, 8) == 32
    assert default_epilogue_positions(10 ** 9, 32, 8) == 1
    assert "sampling epilogue" in render(with_epi, cfg.block_size) and "--sampler host" in render(with_epi,
                                                                                                     cfg.block_size)


def test_cli_plan_with_out_names_the_model(tmp_path):
    """With --out the plan and its refusal called the model "model"; now the source's name, as without --out."""
    pytest.importorskip("torch")
    from tinymodels import save_tiny_model, save_tiny_tokenizer
    ckpt = tmp_path / "tinyckpt"
    save_tiny_model(ckpt)
    save_tiny_tokenizer(ckpt)
    r = CliRunner().invoke(cli, ["export", str(ckpt), "--dtype", "fp32", "--plan", "1GB", "--out",
                                 str(tmp_path / "out")])
    assert r.exit_code == 2 and "error: tinyckpt does not fit" in r.stderr, r.output
    assert not (tmp_path / "out").exists()


# -- engines: the weights once, a KV cache and a pass per engine ------------------------------------------------------
SMALL = ModelConfig(vocab_size=4096, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=64, max_position_embeddings=8192, block_size=4, mask_token_id=4095,
                    stop_ids=(4094,))


@settings(max_examples=30, deadline=None)
@given(engines=st.integers(1, 8), nodes=st.integers(1, 32), blocks=st.integers(1, 512),
       room=st.floats(0.05, 1.5), host=st.booleans())
def test_a_plan_holds_the_weights_once_and_each_engines_cache_and_pass(engines, nodes, blocks, room, host):
    """N engines: the weights, runtime and OS share once, N x (KV cache + verify pass); the most engines that fit
    do and one more does not; the largest context at N engines fits them and one block more does not."""
    from spot.export.memory_plan import host_device
    dev = replace(host_device(), memory_gib=1.9 + room, os_gib=1.5) if host else resolve_device(f"{1.9 + room:.4f}GB")
    context, b = blocks * SMALL.block_size, SMALL.block_size

    def plan(n, c=context):
        return make_plan(SMALL, "fp32", QuantScheme(), c, nodes, dev, engines=n)
    one, many = plan(1), plan(engines)
    assert many.kv_bytes == one.kv_bytes and many.activations == one.activations
    assert many.total == (many.weight_bytes + engines * (many.kv_bytes + many.activation_bytes) + many.runtime_bytes
                          + many.os_bytes)
    assert many.total - one.total == (engines - 1) * one.engine_bytes
    assert many.process_bytes == many.total - many.os_bytes
    most = many.max_engines
    assert most == one.max_engines and (most == 0 or plan(most).fits) and not plan(most + 1).fits
    assert many.fits == (engines <= most)
    best = many.max_context
    assert best % b == 0 and best <= SMALL.max_position_embeddings
    if best:
        assert plan(engines, best).fits
    if best < SMALL.max_position_embeddings:
        assert not plan(engines, best + b).fits
    assert ("host_sampler" in many.activations) == host


def test_host_plans_sample_on_the_host(tmp_path):
    """`--plan host`: this machine's memory from /proc/meminfo (the OS share: what is not available now), the CPU
    process's runtime; F samples on the host: no epilogue term, the host loop's rows instead."""
    from spot.export.memory_plan import CPU_RUNTIME_GIB, HOST_SAMPLER_ROWS, host_device
    from spot.folder.epilogue import EpilogueCall
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       16777216 kB\nMemFree:         1000 kB\nMemAvailable:   12582912 kB\n")
    dev = host_device(meminfo)
    assert dev.memory_gib == 16 and dev.os_gib == 4 and dev.runtime_gib == CPU_RUNTIME_GIB and dev.cpu
    plan = make_plan(SMALL, "fp16", QuantScheme(), 512, 16, dev, epilogue=EpilogueCall(4, 4), engines=3)
    assert "sampling_epilogue" not in plan.activations
    assert plan.activations["host_sampler"] == HOST_SAMPLER_ROWS * SMALL.block_size * SMALL.vocab_size * 8
    assert "host sampler" in render(plan, 4) and "3 engines" in render(plan, 4)
    # ORT CPU holds an fp16 export's MatMul weights in float32, the embedding (a Gather) and norms as exported
    assert plan.weight_bytes == weight_bytes(SMALL, "fp32") - SMALL.vocab_size * SMALL.hidden_size * 2
    assert make_plan(SMALL, "fp32", QuantScheme(), 512, 16, dev).weight_bytes == weight_bytes(SMALL, "fp32")
    meminfo.write_text("nothing here\n")
    with pytest.raises(SpotError, match="--plan host reads the machine's memory") as e:
        host_device(meminfo)
    assert "--plan 16GB" in e.value.hint
    assert resolve_device("host").cpu          # this machine (Linux)


def test_cli_plan_counts_engines_and_refuses_naming_the_engines_that_fit(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub"))
    args = ["export", "sdar-1.7b", "--plan", "orin-nano-8gb", "--max-context", "4096", "--max-nodes", "16"]
    r = CliRunner().invoke(cli, args + ["--engines", "3"])
    assert r.exit_code == 0, r.output
    assert "3 engines" in r.output and "3 x (KV cache + verify pass)" in r.output
    assert "most engines that fit" in r.output
    alone = CliRunner().invoke(cli, ["export", "sdar-1.7b", "--engines", "2"])
    assert alone.exit_code == 2 and "--engines sizes a memory plan: it needs --plan DEVICE" in alone.stderr
    pytest.importorskip("torch")
    from tinymodels import save_tiny_model, save_tiny_tokenizer
    ckpt = tmp_path / "tinyckpt"
    save_tiny_model(ckpt)
    save_tiny_tokenizer(ckpt)
    refused = CliRunner().invoke(cli, ["export", str(ckpt), "--dtype", "fp32", "--plan", "2GB", "--engines", "100000",
                                       "--out", str(tmp_path / "out")])
    assert refused.exit_code == 2 and "--engines 100000" in refused.stderr, refused.output
    assert re.search(r"hint: serve with --engines \d+ \(the most that fit at \d+ tokens\)", refused.stderr)
    assert not (tmp_path / "out").exists()


def test_serve_plan_refuses_what_does_not_fit_and_names_the_engines_that_do(embedded_export):
    """`spot serve --plan DEVICE --engines N`: the plan of N engines over the export, before any weights load; one
    engine more than fit is refused naming how many do."""
    from spot.export.memory_plan import plan_for_export
    from spot.folder.manifest import load_manifest
    pytest.importorskip("uvicorn", reason="spot serve needs the serve extra")
    folder = embedded_export[1]
    big = plan_for_export(load_manifest(folder), resolve_device("64GB"), 1)
    # a device with room for the weights, the runtime and OS share, and two and a half engines
    size = f"{(big.weight_bytes + big.runtime_bytes + big.os_bytes + 2.5 * big.engine_bytes) / 2 ** 30:.6f}GB"
    most = plan_for_export(load_manifest(folder), resolve_device(size), 1).max_engines
    assert most == 2
    r = CliRunner().invoke(cli, ["serve", "--model", str(folder), "--plan", size, "--engines", str(most + 1)])
    assert r.exit_code == 2 and f"serve with --engines {most} (the most that fit" in r.stderr, r.output
    assert f"{most + 1} engines" in r.stderr and "does NOT fit" in r.stderr
    torch = CliRunner().invoke(cli, ["serve", "--backend", "torch", "--model", str(folder), "--plan", "8GB"])
    assert torch.exit_code == 2 and "--plan sizes an exported folder, got --backend torch" in torch.stderr
