"""`spot bench --node-sweep`: chain, tree, spot and the ceilings at each node count (small budgets), the passes
reduction measured and the tokens/s it projects on the Orin boards (spot.app.node_sweep); what a bench row says it verifies
(a chain's nodes are its depth + 1)."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from click.testing import CliRunner
from hypothesis import given, settings, strategies as st

from spot.app.bench_run import BenchConfig, variants
from spot.errors import SpotError
from spot.export.memory_plan import DEVICES, Device, weight_bytes
from spot.export.presets import PRESETS
from spot.export.quantize import QuantScheme
from spot.export.roofline import PassCounts, pass_cost, pass_ms
from spot.runtime.spot import TreeBudget
from spot.app.node_sweep import (BOARDS, ProjectionTarget, check_node_sweep, parse_node_sweep, sweep_budget, sweep_markdown,
                        sweep_points, sweep_report)


def engine(block_size: int = 32, sampler_depth: int | None = None, max_nodes: int = 64):
    return SimpleNamespace(block_size=block_size, sampler_depth=sampler_depth, max_nodes=max_nodes)


def test_the_budget_each_decoder_verifies_at_n_nodes():
    e = engine(32)
    assert [sweep_budget("chain", n, e) for n in (2, 4, 8, 16, 64)] == [
        TreeBudget(2, 1), TreeBudget(4, 3), TreeBudget(8, 7), TreeBudget(16, 15), TreeBudget(33, 32)]
    for d in ("tree", "spot", "order-oracle", "oracle"):
        assert [sweep_budget(d, n, e) for n in (2, 4, 8, 16, 64)] == [
            TreeBudget(2, 1), TreeBudget(4, 3), TreeBudget(8, 7), TreeBudget(16, 8), TreeBudget(64, 8)]
    assert sweep_budget("chain", 16, engine(4)) == TreeBudget(5, 4) and sweep_budget("tree", 16, engine(4)) == \
        TreeBudget(16, 4)
    assert sweep_budget("chain", 8, engine(32, sampler_depth=3)) == TreeBudget(4, 3)    # the device epilogue's steps


@settings(max_examples=200, deadline=None)
@given(nodes=st.integers(2, 128), block=st.integers(1, 64), sampler=st.one_of(st.none(), st.integers(1, 16)),
       decoder=st.sampled_from(("chain", "tree", "spot", "order-oracle", "oracle")))
def test_every_sweep_budget_fits_n_nodes_and_the_engine(nodes, block, sampler, decoder):
    """Within N nodes, N - 1 deep, and verifiable by the engine (TreeBudget.check); a chain is as long as both
    allow; the others take the runtime's default depth when it can bind."""
    e = engine(block, sampler, max_nodes=nodes)
    b = sweep_budget(decoder, nodes, e)
    b.check(e)
    deepest = min(block, sampler or block)
    assert b.nodes <= nodes and 1 <= b.depth <= min(nodes - 1, deepest)
    if decoder == "chain":
        assert b.nodes == b.depth + 1 == min(nodes, deepest + 1)
    else:
        assert b.nodes == nodes and b.depth == min(8, block, nodes - 1, deepest)


def test_bad_node_sweeps_are_named():
    assert parse_node_sweep("64, 2,8,2") == (2, 8, 64)
    for bad, says in (("1,2", "2 or more"), ("x", "comma-separated"), ("", "2 or more"), ("2.5", "comma-separated")):
        with pytest.raises(SpotError, match=says) as e:
            parse_node_sweep(bad)
        assert "--node-sweep" in e.value.message and "--node-sweep 2,4,8,16,64" in e.value.hint
    with pytest.raises(SpotError, match="--decoders has none of them"):
        parse_node_sweep("2,4", ("standard", "spot-sets"))
    with pytest.raises(SpotError, match="--node-sweep 64 exceeds the 16 states"):
        check_node_sweep((2, 64), engine(max_nodes=16))
    with pytest.raises(SpotError, match="--project-model: unknown preset 'sdar-9b'"):
        ProjectionTarget("sdar-9b").check()


def test_a_chain_row_names_the_nodes_it_verifies():
    """chain@16x8 verified 9 nodes (its depth + 1): the row is chain@9x8 now, and two budgets that give one chain
    run it once."""
    cfg = BenchConfig(("chain", "tree"), budgets=(TreeBudget(16, 8), TreeBudget(32, 8)),
                      independent_noise_ablation=False)
    labels = [v.label for v in variants(cfg)]
    assert labels == ["standard", "chain@9x8", "tree@16x8", "tree@32x8"]
    sweep = variants(BenchConfig(("standard", "chain", "spot"), budgets=(), node_sweep=(2, 64),
                                 independent_noise_ablation=False), engine=engine(32))
    assert [v.label for v in sweep] == ["standard", "chain@2x1", "spot@2x1", "chain@33x32", "spot@64x8"]
    assert sweep[3].budget == TreeBudget(33, 32)


class HandTarget(ProjectionTarget):
    """Pass times a hand can price: t(n) = 10 + 5 n ms on one board."""

    def pass_times(self, block_size: int, boards=BOARDS) -> dict:
        return {"easy": (Device("easy", "Easy board", 16, 100.0), lambda n: 10.0 + 5.0 * n)}


def _row(variant, decoder, kinds, tokens=100, temperature=0.0, **kw):
    return {"variant": variant, "decoder": decoder, "temperature": temperature, "tokens": tokens,
            "passes_by_kind": kinds, "passes_per_token": sum(kinds.values()) / tokens, "identical_share": 1.0, **kw}


def test_the_projection_arithmetic_by_hand():
    """standard: 125 one-state passes per 100 tokens (+ a prefill, not priced) at t(1) = 15 ms -> 18.75 ms a token,
    53.33 tokens/s; spot: 50 one-state passes and 30 verify passes of 6.4 nodes (priced at t(6) = 40 ms) per 100
    tokens -> 7.5 + 12 = 19.5 ms a token, 51.28 tokens/s, 0.96x; passes 126 / 81 -> 1.56x fewer."""
    rows = [_row("standard", "standard", {"prefill": 1, "block": 100, "store": 25}),
            _row("spot@8x7", "spot", {"prefill": 1, "block": 25, "verify": 30, "store": 25},
                 mean_nodes_per_verify=6.4)]
    points = [{"nodes": 8, "decoder": "spot", "variant": "spot@8x7", "budget": [8, 7]}]
    out = sweep_report(rows, points, HandTarget(), 32)
    (std,), (spot,) = out["standard"], out["rows"]
    assert std["projected_tokens_per_s"]["easy"] == pytest.approx(1000 / 18.75)
    assert spot["projected_tokens_per_s"]["easy"] == pytest.approx(1000 / 19.5)
    assert spot["projected_speedup"]["easy"] == pytest.approx(18.75 / 19.5)
    assert spot["passes_reduction"] == pytest.approx(126 / 81)
    assert out["projection"]["boards"]["easy"]["pass_ms"] == {"1": 15.0, "6": 40.0}
    assert PassCounts("x", 0.5, 0.3, 6.4).tokens_per_s(lambda n: 10.0 + 5.0 * n) == pytest.approx(1000 / 19.5)
    text = sweep_markdown(out)
    assert "| 0 | 8 | 1.56x |" in text and "| 0 | 8 | spot | 6.4 | 1.56x | 51.28 (0.96x) |" in text
    assert "| 0 | 1 | standard | 1.0 | 1.00x | 53.33 |" in text


def test_the_default_projection_is_the_plans_orin_nx_figure():
    """SDAR-8B, int4, at 2,048 tokens on an Orin NX: 71 ms for one 32-token node, 557 ms for 16 (docs)."""
    (_, t_nx) = ProjectionTarget().pass_times(32, ("orin-nx-16gb",))["orin-nx-16gb"]
    assert round(t_nx(1)) == 71 and round(t_nx(16)) == 557


def test_bench_reports_the_node_sweep(tiny_onnx, tmp_path):
    """A tiny export, two temperatures, 2 / 4 / 8 nodes: one sweep row per (T, nodes, decoder), each identical to
    standard decoding, its passes reduction and projected tokens/s the ones its row's pass counts give, and both
    tables in bench.md, the projection labelled a projection."""
    from spot.cli import main as cli
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "ids": [1 + i, 5, 9, 13, 17, 21][: 3 + i]}) + "\n"
                               for i in range(2)))
    report = tmp_path / "report"
    r = CliRunner().invoke(cli, ["bench", "--model", str(tiny_onnx), "--backend", "ort", "--prompts", str(prompts),
                                 "--limit", "2", "--temperatures", "0,1", "--node-sweep", "8,2,4", "--decoders",
                                 "standard,chain,tree,order-oracle,oracle", "--max-new-tokens", "8", "--no-plots",
                                 "--report", str(report)])
    assert r.exit_code == 0, r.output
    result = json.loads((report / "bench.json").read_text())
    sweep = result["node_sweep"]
    assert sweep["nodes"] == [2, 4, 8] and sweep["decoders"] == ["chain", "tree", "oracle", "order-oracle"]
    assert [(s["temperature"], s["nodes"], s["decoder"]) for s in sweep["rows"]] == [
        (t, n, d) for t in (0.0, 1.0) for n in (2, 4, 8) for d in sweep["decoders"]]
    by = {(row["variant"], row["temperature"]): row for row in result["rows"]}
    assert {s["variant"] for s in sweep["rows"] if s["nodes"] == 8} == {"chain@5x4", "tree@8x4", "order-oracle@8x4",
                                                                         "oracle@8x4"}    # block 4
    cfg = PRESETS["sdar-8b-b32"].config().with_block_size(4)
    w = weight_bytes(cfg, "fp16", QuantScheme("int4"))

    def tokens_per_s(row: dict, board: str) -> float:
        t = lambda n: pass_ms(pass_cost(cfg, "fp16", w, n, 2048), DEVICES[board], "fp16")[0]  # noqa: E731
        kinds = row["passes_by_kind"]
        ms = ((kinds.get("block", 0) + kinds.get("store", 0)) * t(1) + kinds.get("fused", 0) * t(2)  # 2B tokens
              + kinds.get("verify", 0) * t(max(1, round(row.get("mean_nodes_per_verify", 1)))))
        return 1e3 * row["tokens"] / ms
    md = (report / "bench.md").read_text()
    for s in sweep["rows"]:
        row, base = by[(s["variant"], s["temperature"])], by[("standard", s["temperature"])]
        assert row["budget"] == s["budget"] and row["identical_share"] == 1.0 == s["identical_share"]
        assert s["passes_reduction"] == pytest.approx(base["passes_per_token"] / row["passes_per_token"])
        for board in BOARDS:
            assert s["projected_tokens_per_s"][board] == pytest.approx(tokens_per_s(row, board))
            assert s["projected_speedup"][board] == pytest.approx(tokens_per_s(row, board)
                                                                  / tokens_per_s(base, board))
        nx = s["projected_tokens_per_s"]["orin-nx-16gb"]
        assert f"{nx:.2f} ({s['projected_speedup']['orin-nx-16gb']:.2f}x)" in md
    assert "## Node sweep: passes reduction against standard decoding (measured)" in md
    assert "## Node sweep: projected tokens/s on Jetson Orin boards (PROJECTION, not a measurement)" in md
    assert "Jetson Orin NX 16GB: projected tokens/s (x standard)" in md and "| 0 | 8 | 1." in md
    assert "(5x4)" in md          # the chain at 8 nodes of block 4: 5 nodes, 4 deep
    assert "PROJECTION, not a measurement: a roofline" in md and "sdar-8b-b32 with int4 weights" in md
    assert not any(row["variant"].endswith("+indep") for row in result["rows"])    # the sweep alone: no ablation
