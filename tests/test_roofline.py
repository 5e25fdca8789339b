"""The plan's roofline projection (spot.export.roofline): bytes and FLOPs of a pass from the shapes, the bound that
sets its time, the data-sheet figures, SPOT's projected tokens/s from pass counts, and the CLI that prints them."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from spot.cli import main as cli
from spot.config import ModelConfig
from spot.errors import SpotError
from spot.export.memory_plan import DEVICES, Device, make_plan, render, resolve_device
from spot.export.quantize import QuantScheme
from spot.export.roofline import (PassCounts, counts_from_bench, counts_from_reductions, node_counts, pass_cost,
                                  pass_ms, peak_flops, render_projection)

CFG = ModelConfig(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, max_position_embeddings=4096, block_size=4, mask_token_id=999,
                  stop_ids=(998,))
# 100 GB/s and 1 fp16 TFLOP/s: easy numbers
EASY = Device("easy", "easy device", 16, 100.0, fp16_tflops=1.0, fp32_tflops=0.5)


def test_pass_cost_is_the_shape_arithmetic():
    cost = pass_cost(CFG, "fp16", weight_bytes=10_000, nodes=3, context=100)
    rows, t = 3 * 4, 104
    per_row = (2 * 4 + 2 * 2) * 16 + 3 * 128 + 2 * 64
    assert cost.bytes_moved == {"weights": 10_000, "kv_cache": 2 * 2 * 2 * 16 * 2 * 100,
                                "attention": 2 * rows * 4 * t * 4 * 2, "activations": 2 * 2 * rows * per_row * 2,
                                "new_kv": 2 * 2 * 2 * 16 * 2 * rows, "logits": rows * 1000 * 4}
    linear = 2 * (64 * (4 + 4) * 16 + 64 * 64 + 3 * 64 * 128) + 64 * 1000
    assert cost.flops == 2 * rows * linear + 4 * 2 * rows * 4 * 16 * t
    # the prefix is read once whatever the node count; the per-state terms grow with it
    more = pass_cost(CFG, "fp16", 10_000, 6, 100)
    assert more.bytes_moved["kv_cache"] == cost.bytes_moved["kv_cache"]
    assert more.bytes_moved["attention"] == 2 * cost.bytes_moved["attention"] and more.flops == 2 * cost.flops


def test_the_pass_time_is_the_larger_bound():
    small = pass_cost(CFG, "fp16", 10 ** 9, 1, 100)          # 1 GB of weights: 10 ms at 100 GB/s
    ms, bound = pass_ms(small, EASY, "fp16")
    assert bound == "memory" and ms == pytest.approx(small.total_bytes / 1e8)
    wide = pass_cost(CFG, "fp16", 10 ** 5, 4096, 4000)       # ~38 GFLOP over ~4.4 GB: 8.7 FLOP per byte
    ms, bound = pass_ms(wide, EASY, "fp16")
    assert bound == "memory" and ms == pytest.approx(wide.total_bytes / 1e8)
    ms, bound = pass_ms(wide, EASY, "fp32")                  # the FP32 peak, half the fp16 one here
    assert bound == "compute" and ms == pytest.approx(wide.flops / 0.5e9)
    assert node_counts(64) == [1, 2, 4, 8, 16, 32, 64] and node_counts(12) == [1, 2, 4, 8, 12]


def test_device_figures_are_the_data_sheet_arithmetic():
    """Tensor cores x 512 dense fp16 FLOP per clock (Ampere) x the maximum GPU clock; a size-only device has none."""
    for key, cores, ghz in (("orin-nano-8gb", 32, 0.625), ("orin-nx-16gb", 32, 0.918), ("agx-orin-32gb", 56, 0.93),
                            ("agx-orin-64gb", 64, 1.3)):
        assert DEVICES[key].fp16_tflops == pytest.approx(cores * 512 * ghz / 1e3, rel=2e-3)
    assert peak_flops(DEVICES["orin-nx-16gb"], "fp16") == pytest.approx(15.04e12)
    assert peak_flops(resolve_device("12GB"), "fp16") is None
    assert "none for 12 GiB device" in render_projection(CFG, "fp16", 10 ** 6, resolve_device("12GB"), 4, 512)


def test_spot_tokens_per_s_from_pass_counts():
    """ms per token = one-state passes x t(1) + verify passes x t(mean nodes) + fused store passes x t(2) (2B
    tokens); tokens/s its inverse."""
    base = PassCounts("standard", 1.25)
    spec = PassCounts("spot@4x2", 0.5, 0.25, 3.4)
    fused = PassCounts("spot@4x2", 0.25, 0.25, 3.4, fused_per_token=0.25)
    t = {1: 10.0, 2: 11.0, 3: 12.0}.__getitem__
    assert base.ms_per_token(t) == 12.5 and spec.ms_per_token(t) == 0.5 * 10 + 0.25 * 12
    assert fused.ms_per_token(t) == 0.25 * 10 + 0.25 * 12 + 0.25 * 11
    (std, spot), = counts_from_reductions("16=2.5", block_size=4, max_nodes=64)
    # standard decoding: a pass per token, one in B of them the fused store pass
    assert std.single_per_token == 0.75 and std.fused_per_token == 0.25
    assert spot.verify_per_token == 0.4 and spot.mean_nodes == 16
    for bad in ("16", "0=2", "65=2", "16=0", "16=x", ""):
        with pytest.raises(SpotError, match="--passes-reduction"):
            counts_from_reductions(bad, 4, 64)
    text = render_projection(CFG, "fp16", 10 ** 8, EASY, 16, 1024, [(std, spot)])
    assert "PROJECTION (roofline, not a measurement)" in text and "100 GB/s" in text
    one = pass_ms(pass_cost(CFG, "fp16", 10 ** 8, 1, 1024), EASY, "fp16")[0]
    sixteen = pass_ms(pass_cost(CFG, "fp16", 10 ** 8, 16, 1024), EASY, "fp16")[0]
    two = pass_ms(pass_cost(CFG, "fp16", 10 ** 8, 2, 1024), EASY, "fp16")[0]
    assert f"{1e3 / (0.4 * sixteen):7.2f} tokens/s vs standard {1e3 / (0.75 * one + 0.25 * two):7.2f}" in text
    assert "every pass priced at the budget's node count" in text


def _bench(tmp_path, rows):
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({"rows": rows}))
    return path


def test_pass_counts_from_a_bench_json(tmp_path):
    row = lambda variant, decoder, kinds, **kw: {"variant": variant, "decoder": decoder, "temperature": 0.0,  # noqa
                                                 "rule": "static", "tokens": 100, "passes_by_kind": kinds, **kw}
    path = _bench(tmp_path, [row("standard", "standard", {"prefill": 1, "block": 100, "store": 25}),
                             row("spot@8x4", "spot", {"prefill": 1, "block": 25, "verify": 30, "store": 25},
                                 mean_nodes_per_verify=6.5)])
    (base, spot), = counts_from_bench(path)
    assert base.single_per_token == 1.25 and base.verify_per_token == 0 and base.fused_per_token == 0
    assert spot.single_per_token == 0.5 and spot.verify_per_token == 0.3 and spot.mean_nodes == 6.5
    assert spot.label == "spot@8x4 T=0"
    # the fused store mode's rows: the fused passes priced apart (2B tokens), not as one-state passes
    fused = _bench(tmp_path, [row("standard", "standard", {"prefill": 1, "block": 76, "fused": 24}),
                              row("spot@8x4", "spot", {"prefill": 1, "block": 1, "fused": 24, "verify": 30},
                                  mean_nodes_per_verify=6.5)])
    (base, spot), = counts_from_bench(fused)
    assert (base.single_per_token, base.fused_per_token) == (0.76, 0.24)
    assert (spot.single_per_token, spot.fused_per_token, spot.verify_per_token) == (0.01, 0.24, 0.3)
    (tmp_path / "other.json").write_text("{}")
    with pytest.raises(SpotError, match="not a bench.json"):
        counts_from_bench(tmp_path / "other.json")
    (tmp_path / "deep.json").write_text("[" * 100_000)         # a RecursionError traceback before
    with pytest.raises(SpotError, match="is not valid JSON \\(nesting deeper than 256\\)"):
        counts_from_bench(tmp_path / "deep.json")
    with pytest.raises(SpotError, match="no chain / tree / spot / spot-sets row"):
        counts_from_bench(_bench(tmp_path, [row("standard", "standard", {"block": 4})]))


def test_the_plan_prints_the_projection_and_the_cli_takes_pass_counts(tmp_path, monkeypatch):
    plan = make_plan(CFG, "fp16", QuantScheme(), 1024, 16, DEVICES["orin-nx-16gb"])
    text = render(plan, CFG.block_size)
    assert "pass time PROJECTION" in text and "at 1024 tokens" in text and "15.0 TFLOP/s" in text
    assert "tokens/s" not in text                           # no pass counts: no tokens/s
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub"))
    args = ["export", "sdar-8b", "--weights", "int4", "--plan", "orin-nx-16gb", "--max-context", "4096",
            "--max-nodes", "16"]
    r = CliRunner().invoke(cli, args + ["--passes-reduction", "4=1.5,16=2"])
    assert r.exit_code == 0, r.output
    assert "projected tokens/s at 2048 tokens" in r.output and "SPOT@16 (2x fewer passes)" in r.output
    r = CliRunner().invoke(cli, args + ["--plan-bench", str(tmp_path / "absent.json")])
    assert r.exit_code == 2 and "not a bench.json" in r.output
    r = CliRunner().invoke(cli, ["export", "sdar-8b", "--passes-reduction", "16=2", "--out", str(tmp_path / "x")])
    assert r.exit_code == 2 and "need --plan DEVICE" in r.output and not (tmp_path / "x").exists()
