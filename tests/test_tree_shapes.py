"""SPOT's tree shape per budget (drafter.json tree_shapes): read and checked, chosen for the budget in use, grown by
the proposer, and calibrated by replayed target passes (spot calibrate-drafter)."""
from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from spot.config import ModelConfig
from spot.engines.torch_engine import TorchEngine
from spot.errors import SpotError
from spot.reference.model import random_model
from spot.runtime.decode_plan import DecodeRequest, run_decoder
from spot.runtime.drafter import (DEFAULT_BRANCH, DRAFTER_JSON, FORMAT, FORMAT_VERSION, Drafter, DrafterProposer,
                                  TreeShape, shape_entry)
from spot.runtime.proposers import RoundInputs
from spot.runtime.spot import TreeBudget
from spot.runtime.stale import StaleView
from spot.runtime.step import STATIC, CommitRule, Sampling
from spot.runtime.tree import Node, build_tree
from spot.training.drafter import OrderModel, OrderModelConfig, random_inputs, write_drafter
from spot.training.replay import record_standard, replay_passes

VOCAB, MASK, BLOCK = 64, 63, 8


def target() -> TorchEngine:
    cfg = ModelConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=256,
                      block_size=BLOCK, mask_token_id=MASK, stop_ids=(VOCAB - 2,))
    model = random_model(cfg, seed=0, scale=0.6)
    with torch.no_grad():
        model.lm_head.weight[MASK] = 0.0     # never the mask id at T = 0
        model.lm_head.weight.mul_(4.0)       # peaked: real acceptance at depth
    return TorchEngine(model)


@pytest.fixture(scope="module")
def engine():
    return target()


@pytest.fixture(scope="module")
def drafter_dir(engine, tmp_path_factory):
    """A drafter of the tiny target (a fresh order model: its baseline skips, sharpened so trees differ by shape)."""
    from spot.runtime.drafter import target_identity
    out = tmp_path_factory.mktemp("drafter")
    torch.manual_seed(0)
    model = OrderModel(OrderModelConfig(d_model=32, heads=4, ffn=64, layers=1), tau=0.9)
    manifest = {"format": FORMAT, "format_version": FORMAT_VERSION, "block_size": BLOCK,
                "target": target_identity(engine.config), "tau": 0.9, "max_staleness": 16,
                "order_temperature": 1.0, "runner_up_weight": 0.17}
    write_drafter(model, out, manifest, random_inputs(4, BLOCK))
    return out


def with_shapes(drafter_dir, tmp_path, shapes) -> Drafter:
    for name in ("drafter.onnx", DRAFTER_JSON):
        (tmp_path / name).write_bytes((drafter_dir / name).read_bytes())
    manifest = json.loads((tmp_path / DRAFTER_JSON).read_text())
    manifest["tree_shapes"] = shapes
    (tmp_path / DRAFTER_JSON).write_text(json.dumps(manifest))
    return Drafter.load(tmp_path)


def entry(nodes, branch=2, depth=3, t_o=1.5, w=0.0, bonus=0.0) -> dict:
    return {"nodes": nodes, "branch": branch, "depth": depth, "order_temperature": t_o, "runner_up_weight": w,
            "stale_top_bonus": bonus}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 80), max_size=6), st.integers(1, 100))
def test_a_budget_takes_the_shape_with_the_most_nodes_within_it(node_counts, nodes):
    shapes = [entry(n, branch=i + 1) for i, n in enumerate(node_counts)]
    fitting = [e for e in shapes if e["nodes"] <= nodes]
    got = shape_entry(shapes, nodes)
    if not fitting:
        assert got is None
    else:       # the most nodes; of equals the first listed
        most = max(e["nodes"] for e in fitting)
        assert got is next(e for e in fitting if e["nodes"] == most)


def test_no_entry_is_the_drafters_own_settings(drafter_dir, tmp_path):
    d = with_shapes(drafter_dir, tmp_path, [entry(8, branch=1, depth=2, t_o=3.0, w=0.5, bonus=2.0)])
    own = TreeShape(DEFAULT_BRANCH, None, d.order_temperature, d.runner_up_weight, 0.0)
    assert d.shape_for(None) == d.shape_for(7) == own
    assert d.shape_for(8) == d.shape_for(64) == TreeShape(1, 2, 3.0, 0.5, 2.0)
    assert d.proposer(nodes=64).shape == TreeShape(1, 2, 3.0, 0.5, 2.0)
    assert d.proposer(branch=5, nodes=64).branch == 5           # an explicit branch overrides the shape's


@pytest.mark.parametrize("shapes, expected", [
    ([entry(0)], r"tree_shapes\[0\].nodes is 0, expected an integer in 1..4096"),
    ([entry(4, branch=0)], r"tree_shapes\[0\].branch is 0, expected an integer in 1..64"),
    ([entry(4, depth=65)], r"tree_shapes\[0\].depth is 65"),
    ([entry(4, t_o=0)], r"tree_shapes\[0\].order_temperature is 0, expected a number > 0"),
    ([entry(4, w=2)], r"tree_shapes\[0\].runner_up_weight is 2, expected a number in \[0, 1\]"),
    ([entry(4, bonus=-1)], r"tree_shapes\[0\].stale_top_bonus is -1, expected a number in \[0, 100\]"),
    ([{**entry(4), "lookahead": 2}], r"tree_shapes\[0\].lookahead"),
    ([{k: v for k, v in entry(4).items() if k != "depth"}], r"tree_shapes\[0\].depth"),
    ({"16": entry(16)}, "tree_shapes is .*expected null or a list of at most 32 items"),
    ([entry(4)] * 33, "expected null or a list of at most 32 items")])
def test_bad_tree_shapes_are_clear_errors(drafter_dir, tmp_path, shapes, expected):
    with pytest.raises(SpotError, match=expected):
        with_shapes(drafter_dir, tmp_path, shapes)


def test_a_shapes_depth_and_branch_shape_the_tree(drafter_dir):
    """A shape of depth 2 grows the tree build_tree would grow with max_depth 2 (the budget's depth is larger), and
    its branch caps each node's children."""
    d = Drafter.load(drafter_dir)
    rng = np.random.default_rng(3)
    for trial in range(6):
        logits = (rng.normal(size=(BLOCK, VOCAB)) * 2).astype(np.float32)
        state = np.full(BLOCK, MASK)
        state[: trial % 3] = 5
        stale = StaleView(logits, state == MASK, Sampling(0.0 if trial % 2 else 1.0, seed=trial), 0)
        trees = {}
        for name, shape, depth in (("capped", TreeShape(3, 2, 1.0, 0.0), 6), ("budget", TreeShape(3, None, 1.0, 0.0),
                                                                              2)):
            p = DrafterProposer(d, None, 4, shape)
            p.begin_round(RoundInputs(stale, CommitRule(STATIC), MASK, 0), state, 0)
            trees[name] = build_tree(state, 1, p, 12, depth, MASK, p.lookahead)
        assert [(n.state.tolist(), n.parent, n.depth, n.children) for n in trees["capped"]] == \
            [(n.state.tolist(), n.parent, n.depth, n.children) for n in trees["budget"]]
        assert max(n.depth for n in trees["capped"]) <= 2
        assert max(len(n.children) for n in trees["capped"]) <= 3


def test_the_stale_top_bonus_raises_the_most_confident_stale_position(drafter_dir):
    """Children's log-probabilities are log_softmax(order / T_o + bonus at the node's most confident stale masked
    position); a large bonus makes that position the first child."""
    d = Drafter.load(drafter_dir)
    rng = np.random.default_rng(5)
    logits = (rng.normal(size=(BLOCK, VOCAB)) * 2).astype(np.float32)
    state = np.full(BLOCK, MASK)
    state[[1, 4]] = 7
    stale = StaleView(logits, state == MASK, Sampling(0.0), 0)
    node = Node(state, -1, 0, 1)
    conf = np.where(state == MASK, stale.coupled(1)[1], -np.inf)
    top = int(np.argmax(conf))
    got = {}
    for bonus in (0.0, 0.7, 50.0):
        p = DrafterProposer(d, None, 0, TreeShape(BLOCK, None, 2.0, 0.0, bonus))
        p.begin_round(RoundInputs(stale, CommitRule(STATIC), MASK, 0), state, 0)
        got[bonus] = {int(np.flatnonzero(c != state)[0]): lp for lp, c in p.propose([node], [0])[0]}
    for pos in got[0.0]:
        raised = got[0.7][pos] - got[0.0][pos]
        others = got[0.7][next(q for q in got[0.0] if q != top)] - got[0.0][next(q for q in got[0.0] if q != top)]
        assert raised == pytest.approx(others + (0.7 if pos == top else 0.0), abs=1e-9)
    assert max(got[50.0], key=got[50.0].get) == top


def test_decoders_grow_their_budgets_shape(drafter_dir, engine, tmp_path):
    """run_decoder's spot grows the shape of its budget (the replayed passes of that shape), exactly; spot-sets
    keeps the drafter's own settings."""
    shapes = [entry(4, branch=1, depth=2, t_o=1.0, bonus=30.0), entry(12, branch=2, depth=3, t_o=0.5, w=0.3)]
    d = with_shapes(drafter_dir, tmp_path, shapes)
    prompt = [1, 2, 3, 4, 5]
    differs = False
    for budget in (TreeBudget(3, 4), TreeBudget(6, 4), TreeBudget(16, 6)):
        for t in (0.0, 1.0):
            req = DecodeRequest(16, sampling=Sampling(t, seed=2), budget=budget)
            got = run_decoder("spot", engine, prompt, req, drafter=d)
            assert got.token_ids == run_decoder("standard", engine, prompt, req).token_ids
            rec = record_standard(engine, prompt, req)
            want = replay_passes(rec, DrafterProposer(d, None, 4, d.shape_for(budget.nodes)), budget)
            assert got.stats.target_passes == want, (budget, t)
            own = run_decoder("spot", engine, prompt, req, drafter=d.with_tree_shapes([]))
            differs |= want != own.stats.target_passes
            sets = run_decoder("spot-sets", engine, prompt, req, drafter=d)
            own = run_decoder("spot-sets", engine, prompt, req, drafter=d.with_tree_shapes([]))
            assert sets.stats.target_passes == own.stats.target_passes
    assert differs          # the shapes reached the trees


def test_tree_shape_calibration_keeps_the_fewest_passes(drafter_dir, engine, tmp_path):
    from spot.training.calibration import (SHAPE_FIELDS, calibrate_tree_shapes, record_prompts, shape_for_budget,
                                           write_calibration)
    d = with_shapes(drafter_dir, tmp_path, [entry(2)])      # an old table: replaced, never read by the calibration
    prompts = [[1, 2, 3, 4, 5], [9, 8, 7]]
    budgets = [TreeBudget(3, 2), TreeBudget(8, 4)]
    result = calibrate_tree_shapes(engine, d, prompts, [0.0, 1.0], budgets, [0.5, 2.0], [0.0, 0.3], [1, 3], 16,
                                   bonuses=[0.0, 30.0])
    decodes = record_prompts(engine, prompts, [0.0, 1.0], 16)
    own = d.with_tree_shapes([])
    for budget, shape in zip(budgets, result["tree_shapes"]):
        tried = result["shape_calibration"]["passes_by_budget"][f"{budget.nodes}x{budget.depth}"]
        assert list(tried) == list(SHAPE_FIELDS)
        chosen = TreeShape(shape["branch"], shape["depth"], shape["order_temperature"], shape["runner_up_weight"],
                           shape["stale_top_bonus"])
        assert shape["nodes"] == budget.nodes and 1 <= chosen.depth <= budget.depth
        final = replay_passes_of(decodes, own, chosen, budget)
        assert tried["depth"][f"{chosen.depth:g}"] == final == min(tried["depth"].values())
        for field in SHAPE_FIELDS:      # every field's pick is its fewest passes, and the search only improves
            assert min(tried[field].values()) >= final
        assert (chosen, tried) == shape_for_budget(own, decodes, budget, [0.5, 2.0], [0.0, 0.3], [1, 3], [0.0, 30.0])
    write_calibration(tmp_path, result)
    reloaded = Drafter.load(tmp_path)
    assert reloaded.tree_shapes == result["tree_shapes"]
    assert reloaded.manifest["tree_shape_calibration"]["prompts"] == 2
    assert reloaded.order_temperature == d.order_temperature         # the drafter's own settings are kept
    with pytest.raises(SpotError, match="one budget per node count"):
        calibrate_tree_shapes(engine, d, prompts, [0.0], [TreeBudget(8, 2), TreeBudget(8, 4)], [1.0], [0.0])
    with pytest.raises(SpotError, match="--branches"):
        calibrate_tree_shapes(engine, d, prompts, [0.0], budgets, [1.0], [0.0], [0, 2])
    with pytest.raises(SpotError, match="--stale-top-bonuses"):
        calibrate_tree_shapes(engine, d, prompts, [0.0], budgets, [1.0], [0.0], [2], bonuses=[-1.0])


def replay_passes_of(decodes, drafter, shape: TreeShape, budget: TreeBudget) -> int:
    return sum(replay_passes(r, DrafterProposer(drafter, None, 4, replace(shape)), budget) for r in decodes)
