"""The drafter (order model, docs/spec.md §6): features, traces, training, ONNX export, the runtime proposer inside
SPOT / SPOT-Sets (exactness against standard / threshold decoding) and the compatibility checks."""
from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from spot.config import ModelConfig
from spot.engines.torch_engine import TorchEngine
from spot.errors import SpotError
from spot.reference.model import random_model
from spot.runtime.decode import generate
from spot.runtime.decode_plan import DecodeRequest, run_decoder
from spot.runtime.drafter import (BASELINE_INPUTS, DEFAULT_RUNNER_UP_WEIGHT, DEFAULT_SET_FLIP_WEIGHT, DRAFTER_JSON,
                                  DRAFTER_ONNX, INPUT_NAMES, MAX_STALENESS, Drafter,
                                  DrafterProposer, drafter_inputs, node_inputs, target_identity)
from spot.runtime.noise import NoiseCache, gumbel_rows, noise_bins
from spot.runtime.proposers import RoundInputs
from spot.runtime.spot import SpotBlockDecoder, TreeBudget
from spot.runtime.stale import StaleView
from spot.runtime.step import STATIC, THRESHOLD, CommitRule, Sampling
from spot.runtime.tree import Node
from spot.training.drafter import (DrafterTrainSettings, OrderModel, OrderModelConfig, batch_loss,
                                   calibrate_threshold,
                                   example_inputs, export_onnx, make_examples, parameter_count,
                                   predicted_sets, random_inputs, to_torch, train_drafter, train_order_model,
                                   write_drafter)
from spot.training.traces import TracePlan, TraceRecorder, Traces, collect_traces, concat_traces
from tinymodels import renamed_input_drafter, train_encoder_drafter

VOCAB = 64
MASK = VOCAB - 1


def tiny_config(block_size: int = 8, vocab: int = VOCAB, hidden: int = 32) -> ModelConfig:
    return ModelConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=256,
                       block_size=block_size, mask_token_id=vocab - 1, stop_ids=(vocab - 2,))


def tiny_target(block_size: int = 8, vocab: int = VOCAB, seed: int = 0) -> TorchEngine:
    """A peaked random target (scale 0.6). Its lm_head row of the mask id is zeroed: a random model whose argmax is
    the mask token re-commits MASK forever at T = 0, so standard decoding of such a block would never end."""
    model = random_model(tiny_config(block_size, vocab), seed=seed, scale=0.6)
    with torch.no_grad():
        model.lm_head.weight[vocab - 1] = 0.0
    return TorchEngine(model)


def prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, VOCAB - 2, int(rng.integers(3, 14))).tolist() for _ in range(n)]


PLAN = TracePlan(temperatures=(0.0, 0.5, 1.0), rules=(STATIC, THRESHOLD), tau=0.9, seeds=1, max_new_tokens=16,
                 depth=4)


@pytest.fixture(scope="module")
def engine():
    return tiny_target()


@pytest.fixture(scope="module")
def traces(engine):
    return collect_traces(engine, prompts(8), PLAN)


@pytest.fixture(scope="module")
def drafter_dir(traces, tmp_path_factory):
    """A drafter folder whose graph is the whole encoder (tinymodels.train_encoder_drafter)."""
    out = tmp_path_factory.mktemp("drafter")
    train_encoder_drafter(traces, out, DrafterTrainSettings(epochs=1, batch_size=64, log_every=1000))
    return out


# -- features ---------------------------------------------------------------------------------------------------
def test_node_features_shapes_dtypes_and_values():
    rng = np.random.default_rng(0)
    b = 8
    logits = (rng.normal(size=(b, VOCAB)) * 3).astype(np.float32)
    s_m = np.full(b, MASK)
    s_m[:2] = [5, 6]
    stale = StaleView(logits, s_m == MASK, Sampling(1.0, seed=3), block=2)
    child = s_m.copy()
    child[4] = 9
    nodes = [Node(s_m, -1, 0, 7), Node(child, 0, 1, 8), Node(child, 0, 40, 47)]
    f = node_inputs(stale, nodes, MASK)
    assert f["topk"].shape == (3, b, 32) and f["topk"].dtype == np.float32
    assert f["masked"].shape == (3, b) and f["masked"].dtype == np.float32
    assert f["stale_conf"].shape == (3, b) and f["stale_conf"].dtype == np.float32
    assert f["staleness"].shape == (3,) and f["staleness"].dtype == np.int64
    np.testing.assert_array_equal(f["staleness"], [1, 2, MAX_STALENESS])
    np.testing.assert_array_equal(f["topk"][1], stale.topk_logprobs())
    np.testing.assert_array_equal(f["masked"][1], (child == MASK).astype(np.float32))
    conf8 = stale.coupled(8)[1]
    np.testing.assert_array_equal(f["stale_conf"][1], np.where(child == MASK, conf8, 0).astype(np.float32))
    assert f["stale_conf"][1, 4] == 0 and f["stale_conf"][1, 0] == 0
    assert (f["stale_conf"][0, 2:] > 0).all()
    # T = 0: the log-probabilities of softmax(L) and the argmax confidence, whatever the step
    stale0 = StaleView(logits, s_m == MASK, Sampling(0.0), block=2)
    f0 = node_inputs(stale0, nodes[:2], MASK)
    z = logits.astype(np.float64)
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    np.testing.assert_allclose(f0["topk"][0, :, 0], np.log(p.max(-1)), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(f0["stale_conf"][0, 2:], p.max(-1)[2:], rtol=1e-6)


@pytest.mark.parametrize("sampling", [Sampling(0.5, seed=11), Sampling(1.0, seed=12),
                                      Sampling(1.0, top_k=5, seed=13), Sampling(0.7, top_p=0.8, seed=14)])
def test_cached_noise_samples_are_bit_identical(sampling):
    """The decoders' and the traces' NoiseCache gives the samples of freshly computed noise, in any request order."""
    rng = np.random.default_rng(1)
    logits = (rng.normal(size=(8, VOCAB)) * 2).astype(np.float32)
    masked = np.zeros(8, bool)
    masked[[1, 3, 4, 7]] = True
    fresh = StaleView(logits, masked, sampling, block=5)
    cache = NoiseCache(sampling.seed, VOCAB)
    cached = StaleView(logits, masked, sampling, block=5, noise=cache)
    pos = np.flatnonzero(masked)
    cache.rows(5, 3, pos[::-1][:2])                      # a partial row set first, in another order
    for step in (0, 3, 9, 3):
        for a, b in zip(cached.coupled(step), fresh.coupled(step)):
            np.testing.assert_array_equal(a, b)
        rows = cache.rows(5, step, pos[::-1])
        np.testing.assert_array_equal(rows.bins, noise_bins(sampling.seed, 5, step, pos[::-1], VOCAB).bins)
        np.testing.assert_array_equal(rows.exact_rows(np.arange(4)), gumbel_rows(sampling.seed, 5, step, pos[::-1],
                                                                                 VOCAB))
    cache.forget_before(4)
    assert set(cache.steps) == {9}
    cache.rows(6, 0, pos)                                # a new block drops the old one
    assert set(cache.steps) == {0} and cache.block == 6


# -- traces -----------------------------------------------------------------------------------------------------
def test_traces_hold_the_standard_trajectory(engine, traces, tmp_path):
    rows = traces.rows
    per_prompt = sum(1 if t == 0 else PLAN.seeds for t in PLAN.temperatures) * len(PLAN.rules)
    assert traces.n_traces == 8 * per_prompt
    assert rows["topk"].shape == (traces.n_rows, 8, 32) and rows["future_conf"].shape == (traces.n_rows, 4, 8)
    # consecutive rows of one block: s_{t+1} = s_t with the committed positions filled
    same = (rows["trace"][1:] == rows["trace"][:-1]) & (rows["block"][1:] == rows["block"][:-1])
    assert same.sum() > 100
    for r in np.flatnonzero(same):
        changed = rows["state"][r + 1] != rows["state"][r]
        assert not (changed & ~rows["committed"][r]).any()
        assert rows["step"][r + 1] == rows["step"][r] + 1
    # static trajectories commit exactly their `best` position; threshold ones {conf > tau} or best
    rule = traces.traces["rule"][rows["trace"]]
    for r in range(traces.n_rows):
        want = rows["fresh_conf"][r] > PLAN.tau if rule[r] == 1 else np.zeros(8, bool)
        if not want.any():
            want[rows["best"][r]] = True
        np.testing.assert_array_equal(rows["committed"][r], want)
    path = traces.save(tmp_path / "t.npz")
    back = Traces.load(path)
    assert back.meta == traces.meta
    for k, v in traces.rows.items():
        np.testing.assert_array_equal(back.rows[k], v)
    both = concat_traces([traces, back])
    assert both.n_traces == 2 * traces.n_traces and both.rows["trace"].max() == 2 * traces.n_traces - 1


def test_trace_future_conf_is_the_stale_view_of_later_steps(engine):
    """future_conf[t, k-1] must equal what a SPOT round at s_t feeds a node at staleness k."""
    seen = []
    sampling, rule = Sampling(1.0, seed=5), CommitRule(STATIC)
    rec = TraceRecorder(0, rule, sampling, MASK, 8, VOCAB, depth=4)

    def observe(block, step, state, outputs, nxt):
        seen.append((block, step, state.copy(), outputs.host_logits().copy()))
        rec(block, step, state, outputs, nxt)

    from spot.runtime.decode import generate
    generate(engine, prompts(1, seed=4)[0], max_new_tokens=8, rule=rule, sampling=sampling, observer=observe)
    for i, (block, step, state, logits) in enumerate(seen):
        stale = StaleView(logits, state == MASK, replace(sampling, exclude_token=MASK), block)   # F's sampling
        np.testing.assert_array_equal(rec.rows["topk"][i], stale.topk_logprobs())
        for k in range(1, 5):
            conf = stale.coupled(step + k)[1]
            want = np.where(state == MASK, conf, 0).astype(np.float32)
            np.testing.assert_array_equal(rec.rows["future_conf"][i][k - 1], want)


def test_examples_pair_rows_of_one_block(traces):
    ex = make_examples(traces)
    rows = traces.rows
    node = ex.src + ex.k
    assert set(np.unique(ex.k)) == {1, 2, 3, 4}
    assert (rows["block"][node] == rows["block"][ex.src]).all()
    assert (rows["step"][node] == rows["step"][ex.src] + ex.k).all()
    inputs = example_inputs(traces, ex.subset(np.arange(5)))
    assert inputs["topk"].shape == (5, 8, 32) and inputs["staleness"].dtype == np.int64
    # node masks are a subset of the stale state's masks, and stale_conf is positive exactly on them
    assert ((inputs["masked"] > 0) <= (rows["state"][ex.src[:5]] == MASK)).all()
    assert ((inputs["stale_conf"] > 0) == (inputs["masked"] > 0)).all()


# -- training and export ----------------------------------------------------------------------------------------
def test_order_model_has_the_reference_shape():
    n = parameter_count(OrderModel())
    assert 0.58e6 < n < 0.66e6, n


def test_short_training_lowers_the_loss(traces):
    ids = np.arange(traces.n_traces)
    ex = make_examples(traces, ids)
    probe = ex.subset(np.arange(0, len(ex), max(1, len(ex) // 256)))
    torch.manual_seed(0)
    with torch.no_grad():
        before = float(batch_loss(OrderModel(), traces, probe, 0.9)[0])  # same init as training (seed 0)
    model, report = train_order_model(traces, ids, DrafterTrainSettings(epochs=2, batch_size=32, lr=2e-3,
                                                                        warmup_steps=5, log_every=1000),
                                      log=lambda _: None)
    with torch.no_grad():
        after = float(batch_loss(model, traces, probe, 0.9)[0])
    assert report["steps"] > 10
    assert after < before - 0.05, (before, after)


def test_onnx_drafter_equals_torch(traces, tmp_path):
    torch.manual_seed(1)
    model = OrderModel().eval()
    ex = make_examples(traces)
    sample = example_inputs(traces, ex.subset(np.arange(6)))
    with torch.no_grad():
        model.head.weight.normal_()          # trained heads: the whole encoder is exported
    exported = export_onnx(model, tmp_path / "d.onnx", sample)
    assert exported["graph"] == "encoder" and exported["inputs"] == list(INPUT_NAMES)
    assert exported["max_abs_diff"] <= 1e-4
    import onnxruntime as ort
    sess = ort.InferenceSession(str(tmp_path / "d.onnx"), providers=["CPUExecutionProvider"])
    other = example_inputs(traces, ex.subset(np.arange(10, 31)))         # another K
    wide = drafter_inputs(np.zeros((16, 32), np.float32) - 3, np.ones((2, 16), bool), np.full((2, 16), 0.3),
                          np.array([1, 7]))                             # another B
    for inputs in (other, wide):
        with torch.no_grad():
            ref = [t.numpy() for t in model(*to_torch(inputs))]
        for r, g in zip(ref, sess.run(None, inputs)):
            np.testing.assert_allclose(g, r, atol=1e-4, rtol=0)


def test_zero_heads_export_the_baseline_graph(tmp_path):
    """An order model whose heads are zero computes its skips alone: export writes only them (inputs masked and
    stale_conf), and ORT's outputs equal the whole torch model's bit for bit, on other K and B too."""
    import onnxruntime as ort
    torch.manual_seed(2)
    model = OrderModel(OrderModelConfig(d_model=32, heads=4, ffn=64, layers=1)).eval()
    assert model.heads_are_zero()
    exported = export_onnx(model, tmp_path / "d.onnx", random_inputs(4, 8))
    assert exported == {"graph": "baseline", "inputs": ["masked", "stale_conf"], "max_abs_diff": 0.0}
    sess = ort.InferenceSession(str(tmp_path / "d.onnx"), providers=["CPUExecutionProvider"])
    assert [i.name for i in sess.get_inputs()] == list(BASELINE_INPUTS)
    for k, b, seed in ((1, 8, 3), (9, 32, 4), (2, 3, 5)):
        inputs = random_inputs(k, b, seed)
        with torch.no_grad():
            ref = [t.numpy() for t in model(*to_torch(inputs))]
        got = sess.run(None, {n: inputs[n] for n in BASELINE_INPUTS})
        assert all(np.array_equal(r, g) for r, g in zip(ref, got))
    assert export_onnx(model, tmp_path / "e.onnx", random_inputs(4, 8), graph="encoder")["inputs"] == \
        list(INPUT_NAMES)
    with torch.no_grad():
        model.head.bias[1] = 0.5
    assert not model.heads_are_zero()
    with pytest.raises(SpotError, match="heads are zero, got trained heads"):
        export_onnx(model, tmp_path / "f.onnx", random_inputs(4, 8), graph="baseline")
    with pytest.raises(SpotError, match="drafter graph 'tiny': expected 'encoder' or 'baseline'"):
        export_onnx(model, tmp_path / "f.onnx", random_inputs(4, 8), graph="tiny")


def test_baseline_graph_builds_the_same_trees(drafter_dir, engine, tmp_path, monkeypatch):
    """The same zero-head model exported whole and as its baseline graph: the same tokens, rounds and nodes per
    verify pass under SPOT and SPOT-Sets, and the baseline drafter never computes the top-32 features."""
    manifest = json.loads((drafter_dir / DRAFTER_JSON).read_text())    # write_drafter replaces its graph facts
    torch.manual_seed(5)
    model = OrderModel(OrderModelConfig(d_model=32, heads=4, ffn=64, layers=1), tau=0.9).eval()
    whole, baseline = tmp_path / "whole", tmp_path / "baseline"
    write_drafter(model, baseline, manifest, random_inputs(4, 8))
    real_export = export_onnx
    monkeypatch.setattr("spot.training.drafter.export_onnx",
                        lambda *a, **kw: real_export(*a, **{**kw, "graph": "encoder"}))
    write_drafter(model, whole, manifest, random_inputs(4, 8))
    drafters = {d: Drafter.load(d) for d in (whole, baseline)}
    assert drafters[whole].reads_topk and not drafters[baseline].reads_topk
    assert json.loads((baseline / DRAFTER_JSON).read_text())["graph"] == "baseline"
    rounds = {}
    for folder, drafter in drafters.items():
        if folder == baseline:
            monkeypatch.setattr(StaleView, "topk_logprobs", lambda self: pytest.fail("top-32 features computed"))
        for i, prompt in enumerate(prompts(3, seed=31)):
            for temperature in (0.0, 1.0):
                for decoder in ("spot", "spot-sets"):
                    req = DecodeRequest(max_new_tokens=20, sampling=Sampling(temperature, seed=i),
                                        budget=TreeBudget(10, 5))
                    gen = run_decoder(decoder, engine, prompt, req, drafter=drafter)
                    rounds.setdefault(folder, []).append(
                        (gen.token_ids, gen.stats.verify.accepted, gen.stats.verify.nodes))
    assert rounds[whole] == rounds[baseline]


def test_exported_drafter_folder(drafter_dir, engine, traces):
    manifest = json.loads((drafter_dir / DRAFTER_JSON).read_text())
    assert manifest["block_size"] == 8 and manifest["target"] == target_identity(engine.config)
    assert manifest["temperatures"] == [0.0, 0.5, 1.0] and manifest["tau"] == 0.9
    assert 0.0 < manifest["member_threshold"] < 1.0
    assert manifest["onnx_vs_torch_max_abs_diff"] <= 1e-4
    assert 0.58e6 < manifest["architecture"]["parameters"] < 0.66e6
    acc = manifest["accuracy"]["top1"]
    assert set(acc["per_staleness"]) <= {1, 2, 3, 4} or set(acc["per_staleness"]) <= {"1", "2", "3", "4"}
    assert 0.0 <= acc["model"] <= 1.0 and 0.0 <= acc["baseline"] <= 1.0
    assert (drafter_dir / DRAFTER_ONNX).stat().st_size < 5e6
    assert not list(drafter_dir.glob(".spot-*"))        # atomic_output's temporaries: none left


def test_calibrated_threshold_is_the_proposer_cut(drafter_dir, traces):
    """DrafterProposer's first SPOT-Sets candidate is the set the calibration scored (threshold folded in)."""
    drafter = Drafter.load(drafter_dir)
    ex = make_examples(traces)
    ex = ex.subset(np.arange(0, len(ex), max(1, len(ex) // 40)))
    inputs = example_inputs(traces, ex)
    order, member = drafter.run(inputs)
    masked = inputs["masked"] > 0
    sets = predicted_sets(member, order, masked, drafter.member_threshold)
    proposer = drafter.proposer()
    for j in range(len(ex)):
        src, k = int(ex.src[j]), int(ex.k[j])
        state = traces.rows["state"][src + k].astype(np.int64)
        stale = _StaleFromTrace(traces, src, inputs["topk"][j])
        proposer.begin_round(RoundInputs(stale, CommitRule(THRESHOLD, 0.9), MASK, 0), state, 0)
        node = Node(state, -1, k - 1, 100 + k)
        cands = proposer.propose([node], [0])[0]
        committed = (cands[0][1] != MASK) & (state == MASK)
        np.testing.assert_array_equal(committed, sets[j])


class _StaleFromTrace:
    """A StaleView stand-in that serves one trace row's stored features (tokens are placeholders)."""

    def __init__(self, traces, src, topk):
        self.conf = traces.rows["future_conf"][src]
        self.topk = topk

    def topk_logprobs(self):
        return self.topk

    def coupled(self, step):
        k = step - 100
        return np.zeros(self.conf.shape[1], np.int64), np.where(self.conf[k - 1] > 0, self.conf[k - 1], -np.inf)

    def runner_up(self, step):       # traces store no runner-ups: none at any position (-1, gap inf)
        width = self.conf.shape[1]
        return np.full(width, -1, np.int64), np.full(width, np.inf)


def test_calibration_picks_the_best_threshold():
    rng = np.random.default_rng(0)
    p = rng.random((400, 8))
    masked = np.ones((400, 8), bool)
    target = p > 0.7
    target[~target.any(1), 0] = True
    member = np.log(p) - np.log1p(-p)
    order = np.zeros((400, 8))
    order[:, 0] = 1.0
    thr, acc = calibrate_threshold(member, order, masked, target)
    assert abs(thr - 0.7) < 0.03 and acc > 0.9


# -- the drafter inside SPOT / SPOT-Sets ------------------------------------------------------------------------
@pytest.mark.parametrize("store_mode", ["fused", "separate"])
@pytest.mark.parametrize("budget", [TreeBudget(8, 4), TreeBudget(3, 2)])
def test_spot_with_the_drafter_equals_standard_decoding(drafter_dir, engine, budget, store_mode):
    """Under either store mode (docs/spec.md §1): spot == standard, spot-sets == threshold decoding."""
    drafter = Drafter.load(drafter_dir)
    cases = 0
    for i, prompt in enumerate(prompts(3, seed=9)):
        for temperature in (0.0, 0.5, 1.0):
            for seed in ((0,) if temperature == 0 else (i, 100 + i, 2 ** 32 - 1 - i)):
                req = DecodeRequest(max_new_tokens=20, sampling=Sampling(temperature, seed=seed), budget=budget,
                                    store_mode=store_mode)
                for fast, slow in (("spot", "standard"), ("spot-sets", "threshold")):
                    ref = run_decoder(slow, engine, prompt, req)
                    got = run_decoder(fast, engine, prompt, req, drafter=drafter)
                    assert got.token_ids == ref.token_ids, (fast, prompt, temperature, seed)
                    assert got.stats.steps == ref.stats.steps
                    assert got.stats.passes["verify"] <= ref.stats.passes["block"]
                    cases += 1
    assert cases == 2 * 3 * 7


def test_proposer_batches_nodes_into_one_call(drafter_dir, engine):
    drafter = Drafter.load(drafter_dir)
    calls = []
    run = drafter.run
    drafter.run = lambda inputs: calls.append(inputs["masked"].shape[0]) or run(inputs)
    proposer = DrafterProposer(drafter, branch=3)
    rng = np.random.default_rng(2)
    logits = (rng.normal(size=(8, VOCAB)) * 3).astype(np.float32)
    state = np.full(8, MASK)
    stale = StaleView(logits, state == MASK, Sampling(1.0, seed=1), 0)      # the mask id may be sampled here
    proposer.begin_round(RoundInputs(stale, CommitRule(STATIC), MASK, 0), state, 0)
    tree = [Node(state, -1, 0, 1)]
    for p in range(1, 4):
        child = state.copy()
        child[p] = 3
        tree.append(Node(child, 0, 1, 2))
    out = proposer.propose(tree, [0, 1, 2, 3])
    assert calls == [4]
    for node, cands in zip(tree, out):
        assert 3 <= len(cands) <= 6         # three positions, each with its runner-up unless that is the mask id
        states = [c for _, c in cands]
        assert all(((s != MASK) & (node.state == MASK)).sum() == 1 for s in states)
        assert len({s.tobytes() for s in states}) == len(cands)
        assert [lp for lp, _ in cands] == sorted((lp for lp, _ in cands), reverse=True)


def test_lookahead_saves_drafter_calls_with_the_same_trees(drafter_dir, engine):
    """Decoding with the drafter's lookahead gives the same rounds (accepted steps and nodes per verify pass, so the
    same trees) and tokens as without it, in fewer drafter calls. Relies on the drafter's ORT outputs not depending
    on which other nodes share a call (checked here too)."""
    drafter = Drafter.load(drafter_dir)
    inputs = node_inputs(StaleView((np.random.default_rng(4).normal(size=(8, VOCAB)) * 3).astype(np.float32),
                                   np.full(8, True), Sampling(1.0, seed=2), 0),
                         [Node(np.full(8, MASK), -1, d, 1 + d) for d in range(5)], MASK)
    together = drafter.run(inputs)
    for k in range(5):
        alone = drafter.run({name: v[k:k + 1] for name, v in inputs.items()})
        assert all(np.array_equal(a[0], t[k]) for a, t in zip(alone, together))
    calls = {}
    for lookahead in (0, 4):
        per_case = []
        for i, prompt in enumerate(prompts(3, seed=21)):
            for temperature in (0.0, 1.0):
                proposer = DrafterProposer(drafter, lookahead=lookahead)
                gen = generate(engine, prompt, max_new_tokens=20, sampling=Sampling(temperature, seed=i),
                               block_decoder=SpotBlockDecoder(proposer, TreeBudget(12, 6)))
                per_case.append((gen.token_ids, gen.stats.verify.accepted, gen.stats.verify.nodes))
                calls[lookahead] = calls.get(lookahead, 0) + proposer.calls
        if lookahead:
            assert per_case == without
        without = per_case
    assert calls[4] < calls[0]
    with pytest.raises(SpotError, match="lookahead must be >= 0, got -1"):
        DrafterProposer(drafter, lookahead=-1)


# -- compatibility and bad input --------------------------------------------------------------------------------
def test_mismatched_drafter_is_refused(drafter_dir):
    drafter = Drafter.load(drafter_dir)
    with pytest.raises(SpotError, match="blocks of 4: expected 8"):
        drafter.check_compatible(tiny_target(block_size=4))
    with pytest.raises(SpotError, match="another target: vocab_size is 96.*expected 64"):
        drafter.check_compatible(tiny_target(vocab=96))
    anonymous = drafter.with_settings()
    anonymous.target = {}              # a drafter.json whose target was emptied fits no target (it fit every one)
    with pytest.raises(SpotError, match="drafter.json names no target vocab_size"):
        anonymous.check_compatible(tiny_target())
    req = DecodeRequest(max_new_tokens=8)
    with pytest.raises(SpotError, match="block size"):
        run_decoder("spot", tiny_target(block_size=4), [1, 2, 3], req, drafter=drafter)
    with pytest.raises(SpotError, match="needs a drafter"):
        run_decoder("spot-sets", tiny_target(), [1, 2, 3], req)


def test_broken_drafter_files_are_refused(drafter_dir, tmp_path):
    with pytest.raises(SpotError, match="does not exist"):
        Drafter.load(tmp_path)
    (tmp_path / DRAFTER_ONNX).write_bytes((drafter_dir / DRAFTER_ONNX).read_bytes()[:-10])
    with pytest.raises(SpotError, match="drafter.json does not exist"):
        Drafter.load(tmp_path)
    (tmp_path / DRAFTER_JSON).write_text((drafter_dir / DRAFTER_JSON).read_text())
    with pytest.raises(SpotError, match="does not match its manifest"):
        Drafter.load(tmp_path)
    (tmp_path / DRAFTER_JSON).write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(SpotError, match="has format 'something-else', expected 'spot-drafter'"):
        Drafter.load(tmp_path / DRAFTER_ONNX)
    good = json.loads((drafter_dir / DRAFTER_JSON).read_text())
    for edited, message in (({**good, "format_version": 7}, "format_version 7"),
                            ({k: v for k, v in good.items() if k != "target"}, "lacks field 'target'"),
                            ("[1, 2", "not valid JSON")):
        (tmp_path / DRAFTER_JSON).write_text(edited if isinstance(edited, str) else json.dumps(edited))
        with pytest.raises(SpotError, match=message):
            Drafter.load(tmp_path)


def test_drafter_graph_with_unknown_inputs_is_refused(drafter_dir, tmp_path):
    folder = renamed_input_drafter(drafter_dir, tmp_path / "renamed")
    with pytest.raises(SpotError, match=r"has inputs \('topk', 'mask_bits', 'stale_conf', 'staleness'\), "
                                        r"expected some of \('topk', 'masked', 'stale_conf', 'staleness'\)"):
        Drafter.load(folder)


def test_trace_and_training_inputs_are_checked(engine):
    with pytest.raises(SpotError, match="depth must be in 1..8"):
        collect_traces(engine, prompts(1), TracePlan(depth=9))
    with pytest.raises(SpotError, match="no prompts"):
        collect_traces(engine, [], PLAN)
    with pytest.raises(SpotError, match="commit rule"):
        collect_traces(engine, prompts(1), TracePlan(rules=("sometimes",), depth=4))
    with pytest.raises(SpotError, match="does not exist"):
        Traces.load("/nonexistent/traces.npz")


# -- command line -----------------------------------------------------------------------------------------------
def test_cli_traces_and_train_drafter(tmp_path):
    from spot.cli import main
    model = random_model(tiny_config(4), seed=3, scale=0.6)
    with torch.no_grad():
        model.lm_head.weight[MASK] = 0.0
    model.save_pretrained(tmp_path / "target")
    (tmp_path / "p.jsonl").write_text("".join(json.dumps({"ids": p}) + "\n" for p in prompts(4, seed=5)))
    runner = CliRunner()
    res = runner.invoke(main, ["traces", "--model", str(tmp_path / "target"), "--prompts", str(tmp_path / "p.jsonl"),
                               "--out", str(tmp_path / "t.npz"), "--temperatures", "0,1", "--seeds", "1",
                               "--max-new-tokens", "8", "--depth", "3", "--quiet"])
    assert res.exit_code == 0, res.output
    assert "wrote" in res.output and (tmp_path / "t.npz").is_file()
    res = runner.invoke(main, ["train-drafter", "--traces", str(tmp_path / "t.npz"), "--epochs", "1",
                               "--batch-size", "64", "--width", "30", "--heads", "4"])
    assert res.exit_code == 2 and "width 30 must be a multiple of its heads, got 4 heads" in res.output
    assert not (tmp_path / "target" / DRAFTER_ONNX).exists()
    # a drafter sized for a small target (docs/drafter.md): the shape is the one asked for, and recorded
    res = runner.invoke(main, ["train-drafter", "--traces", str(tmp_path / "t.npz"), "--epochs", "1",
                               "--batch-size", "64", "--width", "32", "--layers", "1", "--heads", "4", "--ffn", "64",
                               "--quiet"])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "target" / DRAFTER_ONNX).is_file() and (tmp_path / "target" / DRAFTER_JSON).is_file()
    arch = json.loads((tmp_path / "target" / DRAFTER_JSON).read_text())["architecture"]
    assert (arch["d_model"], arch["layers"], arch["heads"], arch["ffn"]) == (32, 1, 4, 64)
    assert arch["parameters"] == parameter_count(OrderModel(OrderModelConfig(d_model=32, heads=4, ffn=64, layers=1)))
    assert arch["parameters"] < 0.05e6
    drafter = Drafter.load(tmp_path / "target")
    drafter.check_compatible(TorchEngine(model))
    # the folder has a drafter now (for the embedded model: the shipped one): not replaced without --overwrite
    again = ["train-drafter", "--traces", str(tmp_path / "t.npz"), "--epochs", "1", "--batch-size", "64", "--width",
             "32", "--layers", "1", "--heads", "4", "--ffn", "64", "--quiet"]
    res = runner.invoke(main, again)
    assert res.exit_code == 2 and "already has a drafter" in res.output and "--overwrite" in res.output
    assert runner.invoke(main, [*again, "--overwrite"]).exit_code == 0
    for bad in (["--minutes", "0"], ["--lr", "-1"], ["--threads", "0"]):
        res = runner.invoke(main, [*again, "--overwrite", *bad])
        assert res.exit_code == 2 and "Traceback" not in res.output, (bad, res.output)
    res = runner.invoke(main, ["traces", "--model", str(tmp_path / "target"), "--out", str(tmp_path / "u.npz")])
    assert res.exit_code == 2 and "exactly one of --prompts" in res.output


def test_spot_sets_with_another_tau_stays_exact(drafter_dir, engine):
    """A tau the membership head was not trained for falls back to stale-confidence membership: still exact."""
    drafter = Drafter.load(drafter_dir)
    for temperature, seed in ((0.0, 0), (1.0, 3)):
        req = DecodeRequest(max_new_tokens=16, tau=0.6, sampling=Sampling(temperature, seed=seed),
                            budget=TreeBudget(6, 3))
        for prompt in prompts(2, seed=21):
            ref = run_decoder("threshold", engine, prompt, req)
            got = run_decoder("spot-sets", engine, prompt, req, drafter=drafter)
            assert got.token_ids == ref.token_ids and got.stats.steps == ref.stats.steps


# -- order temperature (light per-target calibration) -------------------------------------------------------------
def test_order_temperature_divides_the_order_logits(drafter_dir):
    """Children's log-probabilities are log_softmax(order / T_o) over the masked positions; ranks are unchanged."""
    base = Drafter.load(drafter_dir)
    rng = np.random.default_rng(4)
    logits = (rng.normal(size=(8, VOCAB)) * 3).astype(np.float32)
    state = np.full(8, MASK)
    state[[0, 5]] = [3, 4]
    stale = StaleView(logits, state == MASK, Sampling(0.0), 0)
    inputs = node_inputs(stale, [Node(state, -1, 0, 1)], MASK, base.max_staleness)
    order = base.run(inputs)[0][0].astype(np.float64)
    masked = state == MASK
    got = {}
    for t_o in (1.0, 2.5):
        proposer = DrafterProposer(base.with_settings(order_temperature=t_o, runner_up_weight=0), branch=6)
        proposer.begin_round(RoundInputs(stale, CommitRule(STATIC), MASK, 0), state, 0)
        (cands,) = proposer.propose([Node(state, -1, 0, 1)], [0])
        z = order[masked] / t_o
        want = np.sort(z - z.max() - np.log(np.exp(z - z.max()).sum()))[::-1]
        np.testing.assert_allclose([lp for lp, _ in cands], want, rtol=0, atol=1e-12)
        got[t_o] = [c.tobytes() for _, c in cands]
    assert got[1.0] == got[2.5]


@pytest.mark.parametrize("field, value, expected", [
    *(("order_temperature", v, "expected null or a number > 0") for v in (0, -1.0, "warm", float("nan"))),
    *(("runner_up_weight", v, r"expected null or a number in \[0, 1\]") for v in (-0.1, 1.5, "many", float("nan"))),
    *(("set_flip_weight", v, r"expected null or a number in \[0, 1\]") for v in (-1, 2.0, "some")),
    # every field the hosts read is typed and bounded when drafter.json is read (null: an optional one's default)
    ("block_size", 2**40, "expected an integer in 1..64"), ("block_size", 4.0, "expected an integer in 1..64"),
    ("max_staleness", 10**9, r"expected null or an integer in 1..32"),
    ("member_threshold", 1, r"expected null or a number in \(0, 1\)"),
    ("tau", [0.9], r"expected null or a number in \[0, 1\)"),
    ("target", [], "expected an object of the target's facts"),
    ("onnx_sha256", 7, "expected a sha256")])
def test_bad_tree_settings_are_clear_errors(drafter_dir, tmp_path, field, value, expected):
    for name in (DRAFTER_ONNX, DRAFTER_JSON):
        (tmp_path / name).write_bytes((drafter_dir / name).read_bytes())
    manifest = json.loads((tmp_path / DRAFTER_JSON).read_text())
    manifest[field] = value
    (tmp_path / DRAFTER_JSON).write_text(json.dumps(manifest))
    with pytest.raises(SpotError, match=f"{field} is .*{expected}"):
        Drafter.load(tmp_path)


def test_a_null_setting_is_its_default(drafter_dir, tmp_path):
    """null in an optional field of drafter.json is its default, as the C++ host reads it (Python read
    member_threshold null as float(None): a TypeError traceback; order_temperature null: refused)."""
    for name in (DRAFTER_ONNX, DRAFTER_JSON):
        (tmp_path / name).write_bytes((drafter_dir / name).read_bytes())
    manifest = json.loads((tmp_path / DRAFTER_JSON).read_text())
    fields = ("member_threshold", "max_staleness", "tau", "order_temperature", "runner_up_weight", "set_flip_weight")
    (tmp_path / DRAFTER_JSON).write_text(json.dumps({**manifest, **dict.fromkeys(fields)}))
    d = Drafter.load(tmp_path)
    assert (d.member_threshold, d.max_staleness, d.tau, d.order_temperature, d.runner_up_weight,
            d.set_flip_weight) == (0.5, MAX_STALENESS, None, 1.0, DEFAULT_RUNNER_UP_WEIGHT, DEFAULT_SET_FLIP_WEIGHT)


def test_calibration_keeps_the_fewest_passes(drafter_dir, engine, tmp_path):
    from spot.training.calibration import best_order_temperature, best_weight, calibrate_drafter, write_calibration
    for name in (DRAFTER_ONNX, DRAFTER_JSON):
        (tmp_path / name).write_bytes((drafter_dir / name).read_bytes())
    drafter = Drafter.load(tmp_path)
    budget, ps = TreeBudget(8, 4), prompts(3, seed=5)
    result = calibrate_drafter(engine, drafter, ps, [0.0, 1.0], [0.25, 1.0, 4.0], [0.0, 0.5], budget, 16,
                               flip_candidates=[0.0, 1.0])
    record = result["calibration"]
    passes, weights = record["target_passes"], record["runner_up_target_passes"]
    flips = record["set_flip_target_passes"]

    def decoded(decoder="spot", **settings):   # what `decoder` decodes with those settings, prompts x T = 0 and 1
        candidate = drafter.with_settings(**settings)
        tau = drafter.tau if drafter.tau is not None else 0.9
        return sum(run_decoder(decoder, engine, p, DecodeRequest(max_new_tokens=16, tau=tau,
                                                                 sampling=Sampling(t, seed=0), budget=budget),
                               drafter=candidate).stats.target_passes for t in (0.0, 1.0) for p in ps)
    # each figure is a decode with that setting: T_o at the drafter's runner-up weight, then weights at the best T_o,
    # then spot-sets' flip weights at both
    assert passes["4"] == decoded(order_temperature=4.0)
    assert record["runner_up_weight_at"] == drafter.runner_up_weight
    best_t, best_w = result["order_temperature"], result["runner_up_weight"]
    assert passes[f"{best_t:g}"] == min(passes.values())
    assert weights["0.5"] == decoded(order_temperature=best_t, runner_up_weight=0.5)
    assert weights[f"{best_w:g}"] == min(weights.values())
    assert flips["0"] == decoded("spot-sets", order_temperature=best_t, runner_up_weight=best_w, set_flip_weight=0.0)
    assert flips[f"{result['set_flip_weight']:g}"] == min(flips.values())
    sha = json.loads((tmp_path / DRAFTER_JSON).read_text())["onnx_sha256"]
    write_calibration(tmp_path, result)
    reloaded = Drafter.load(tmp_path)
    assert reloaded.order_temperature == best_t and reloaded.runner_up_weight == best_w
    assert reloaded.set_flip_weight == result["set_flip_weight"]
    assert reloaded.manifest["onnx_sha256"] == sha and reloaded.manifest["order_calibration"]["prompts"] == 3
    assert not list(tmp_path.glob(".spot-*"))
    assert best_order_temperature({0.5: 10, 1.0: 10, 3.0: 9}) == 3.0
    assert best_order_temperature({0.5: 10, 1.0: 10, 3.0: 10}) == 1.0   # ties: the least change
    assert best_order_temperature({0.5: 10, 3.0: 10}) == 0.5            # |log 0.5| < |log 3|
    assert best_weight({0.0: 10, 0.1: 9, 0.3: 9}) == 0.1                # ties: the fewest such children
    with pytest.raises(SpotError, match="expected a number > 0"):
        calibrate_drafter(engine, drafter, ps, [0.0], [1.0, 0.0], [0.0], budget, 16)
    with pytest.raises(SpotError, match=r"expected a number in \[0, 1\]"):
        calibrate_drafter(engine, drafter, ps, [0.0], [1.0], [0.0, 2.0], budget, 16)
    with pytest.raises(SpotError, match=r"set_flip_weight is 3.*expected a number in \[0, 1\]"):
        calibrate_drafter(engine, drafter, ps, [0.0], [1.0], [0.0], budget, 16, flip_candidates=[3.0])


def test_replacing_the_drafter_of_an_exported_folder_keeps_the_folder_valid(drafter_dir, tmp_path):
    """The drafter pair vouches for itself (drafter.json's onnx_sha256), not the export's manifest: calibrating or
    retraining it in place — or either interrupted between its writes — never makes the folder refused as changed
    since export, also where an older manifest lists the pair; a pair that does not match itself is refused when the
    drafter loads, naming it."""
    from spot.folder.manifest import file_entry, verify_files
    from spot.training.calibration import write_calibration
    for name in (DRAFTER_ONNX, DRAFTER_JSON):
        (tmp_path / name).write_bytes((drafter_dir / name).read_bytes())
    (tmp_path / "config.json").write_text("{}")
    # an older export: the pair listed with its hashes
    files = {name: file_entry(tmp_path / name) for name in ("config.json", DRAFTER_ONNX, DRAFTER_JSON)}
    (tmp_path / "manifest.json").write_text(json.dumps({"format": "spot-exported-model",
                                                        "files": {n: r.to_json() for n, r in files.items()}}))
    result = {"order_temperature": 2.0, "runner_up_weight": 0.1, "set_flip_weight": 0.0, "calibration": {}}
    calibrated = json.loads((tmp_path / DRAFTER_JSON).read_text())["onnx_sha256"]
    with pytest.raises(SpotError, match="now describes another drafter .* nothing written"):
        write_calibration(tmp_path, result, "0" * 64)       # replaced while the calibration ran
    write_calibration(tmp_path, result, calibrated)
    verify_files(tmp_path, files, "full")
    assert Drafter.load(tmp_path).order_temperature == 2.0
    (tmp_path / DRAFTER_ONNX).write_bytes((tmp_path / DRAFTER_ONNX).read_bytes() + b"\0")   # half a retraining
    verify_files(tmp_path, files, "full")
    with pytest.raises(SpotError, match="drafter.onnx does not match its manifest"):
        Drafter.load(tmp_path)
    (tmp_path / "config.json").write_text("{ }")          # every other file is still checked
    with pytest.raises(SpotError, match="config.json in .* changed since export"):
        verify_files(tmp_path, files, "quick")


# -- runner-up children -------------------------------------------------------------------------------------------
def brute_runner_up(logits, positions, sampling, block, step):
    """The second-best of (filtered L/T + the definition's noise) per position, and the score gap, in plain numpy."""
    from spot.runtime.step import filter_scaled_logits
    z = logits[positions].astype(np.float64)
    if sampling.temperature > 0:
        z = filter_scaled_logits(z / sampling.temperature, sampling.top_k, sampling.top_p)
        z = z + gumbel_rows(sampling.seed, block, step, positions, logits.shape[-1])
    z[:, sampling.exclude_token] = -np.inf
    order = np.argsort(-z, axis=-1, kind="stable")
    top, second = z[np.arange(len(positions)), order[:, 0]], z[np.arange(len(positions)), order[:, 1]]
    return order[:, 1], np.where(np.isfinite(second), top - second, np.inf)


@pytest.mark.parametrize("sampling", [Sampling(0.0, exclude_token=MASK), Sampling(1.0, seed=3, exclude_token=MASK),
                                      Sampling(0.7, seed=4, top_k=2, exclude_token=MASK),
                                      Sampling(1.0, seed=5, top_p=0.3, exclude_token=MASK)])
def test_runner_up_is_the_second_best_coupled_sample(sampling):
    rng = np.random.default_rng(7)
    logits = (rng.normal(size=(8, VOCAB)) * 2).astype(np.float32)
    logits[2, 10] = logits[2, 11] = logits[2].max() + 1.0        # a tie: the smaller id wins, the other is second
    masked = np.ones(8, bool)
    masked[5] = False
    stale = StaleView(logits, masked, sampling, block=3, noise=NoiseCache(sampling.seed, VOCAB))
    positions = np.flatnonzero(masked)
    stale.runner_ups_wanted = True         # step 4: sampled together with the coupled samples
    for step in (1, 4):
        if step == 1:
            stale.runner_up(step)          # before the coupled samples: sampled on its own
        want_tokens, want_gap = brute_runner_up(logits, positions, sampling, 3, step)
        tokens, gap = stale.runner_up(step)
        assert tokens[5] == -1 and gap[5] == np.inf
        tokens, gap = tokens[positions], gap[positions]
        finite = np.isfinite(want_gap)
        np.testing.assert_array_equal(tokens[finite], want_tokens[finite])
        np.testing.assert_array_equal(gap, want_gap)                  # exact: the definition's noise
        assert (tokens != stale.coupled(step)[0][positions]).all()
        plain = StaleView(logits, masked, sampling, block=3)          # the same winners without runner-ups
        np.testing.assert_array_equal(plain.coupled(step)[0], stale.coupled(step)[0])
        np.testing.assert_array_equal(plain.coupled(step)[1], stale.coupled(step)[1])
    if sampling.temperature == 0:
        assert tokens[2] == 11 and gap[2] == 0.0
    if sampling.top_k == 2:                 # one token left besides the winner: finite gaps everywhere
        assert np.isfinite(gap).all()
    if sampling.top_p < 0.5:                # top-p keeps only the winner on peaked rows: no runner-up there
        assert np.isinf(gap).any()


def test_position_candidates_add_runner_up_children():
    from spot.runtime.proposers import LOG_FLOOR, position_candidates
    state = np.array([MASK, 7, MASK, MASK, MASK])
    logq = np.array([np.log(0.5), -np.inf, np.log(0.3), np.log(0.15), np.log(0.05)])
    tokens = np.array([10, -1, 20, 30, 40])
    alt = (np.array([11, -1, 21, 31, 41]), np.array([np.log(0.2), -np.inf, -np.inf, np.log(0.5), -200.0]))
    node = Node(state, -1, 0, 1)
    plain = position_candidates(node, logq, tokens, MASK, 3)
    assert [c[p] for (_, c), p in zip(plain, (0, 2, 3))] == [10, 20, 30]
    got = position_candidates(node, logq, tokens, MASK, 3, alt)
    # runner-up children of the top-3 positions whose weight is finite, all sorted by log-probability (stable)
    want = [(np.log(0.5), 0, 10), (np.log(0.3), 2, 20), (np.log(0.15), 3, 30), (np.log(0.5) + np.log(0.2), 0, 11),
            (np.log(0.15) + np.log(0.5), 3, 31)]
    want.sort(key=lambda w: -w[0])
    assert len(got) == len(want)
    for (lp, child), (wlp, pos, tok) in zip(got, want):
        assert lp == pytest.approx(wlp, abs=1e-12)
        expected = state.copy()
        expected[pos] = tok
        np.testing.assert_array_equal(child, expected)
    floor = position_candidates(node, logq, tokens, MASK, 4, alt)       # position 4: weight floored, not dropped
    assert floor[-1][0] == LOG_FLOOR and floor[-1][1][4] == 41


def test_set_candidates_merge_flips_and_runner_up_swaps():
    """SPOT-Sets alternatives: flips (weighted by flip_weight, none at 0) and swaps of one member's token for its
    runner-up (weighted by the runner-up log weight), merged best first after the predicted set."""
    from spot.runtime.proposers import set_candidates
    state = np.array([MASK, 7, MASK, MASK, MASK])
    member = np.array([0.9, 0.5, 0.8, 0.55, 0.2])            # predicted set {0, 2, 3}; position 1 is not masked
    tokens = np.array([10, -1, 20, 30, 40])
    # runner-ups: position 2 likely (weight 0.6), 0 unlikely, 3 none (weight -inf), 4 not in the set (no swap)
    alt = (np.array([11, -1, 21, 31, 41]), np.array([np.log(0.01), 0.0, np.log(0.6), -np.inf, np.log(0.9)]))
    node = Node(state, -1, 0, 1)
    p = member[[0, 2, 3, 4]]

    def logp(in_set):
        return float(np.where(in_set, np.log(p), np.log1p(-p)).sum())
    base = np.array([True, True, True, False])
    commit = {0: 10, 2: 20, 3: 30}

    def child(changes):
        c = state.copy()
        for pos, tok in changes.items():
            c[pos] = tok
        return c
    plain = set_candidates(node, member, 0, tokens, MASK, 3)       # before runner-ups: the set and 2 flips
    assert [lp for lp, _ in plain] == pytest.approx([logp(base), logp([True, True, False, False]),
                                                     logp([True, True, True, True])], abs=1e-12)
    np.testing.assert_array_equal(plain[0][1], child(commit))
    got = set_candidates(node, member, 0, tokens, MASK, 4, alt, flip_weight=0.5)
    want = [(logp(base), child(commit)),
            (logp(base) + np.log(0.6), child({**commit, 2: 21})),                        # the swap at position 2
            (logp([True, True, False, False]) + np.log(0.5), child({0: 10, 2: 20})),     # flips, weighted 0.5
            (logp([True, True, True, True]) + np.log(0.5), child({**commit, 4: 40}))]
    assert [lp for lp, _ in got] == pytest.approx([lp for lp, _ in want], abs=1e-12)
    for (_, c), (_, w) in zip(got, want):
        np.testing.assert_array_equal(c, w)
    no_flips = set_candidates(node, member, 0, tokens, MASK, 4, alt, flip_weight=0.0)
    assert len(no_flips) == 3                                  # the set and its two swaps (position 3 has none)
    np.testing.assert_array_equal(no_flips[2][1], child({**commit, 0: 11}))
    assert no_flips[2][0] == pytest.approx(logp(base) + np.log(0.01), abs=1e-12)


def test_runner_up_alternatives_weigh_the_gap_and_drop_the_mask_id():
    """log weight = log(weight) - gap; -inf where no runner-up exists and where it is the mask id (that child would
    equal its parent); None when the weight is 0."""
    from spot.runtime.proposers import runner_up_alternatives

    class Stale:
        def runner_up(self, step):
            return np.array([11, -1, MASK, 41]), np.array([0.5, np.inf, 0.1, 2.0])
    tokens, logw = runner_up_alternatives(Stale(), 3, 0.25, MASK)
    np.testing.assert_array_equal(tokens, [11, -1, MASK, 41])
    np.testing.assert_allclose(logw, [np.log(0.25) - 0.5, -np.inf, -np.inf, np.log(0.25) - 2.0])
    assert runner_up_alternatives(Stale(), 3, 0.0, MASK) is None


def test_drafter_runner_up_children_weigh_the_score_gap(drafter_dir):
    base = Drafter.load(drafter_dir)
    assert base.runner_up_weight == 0.17                # the default when drafter.json does not set it
    rng = np.random.default_rng(4)
    logits = (rng.normal(size=(8, VOCAB)) * 3).astype(np.float32)
    state = np.full(8, MASK)
    state[[0, 5]] = [3, 4]
    sampling = Sampling(1.0, seed=2, exclude_token=MASK)
    stale = StaleView(logits, state == MASK, sampling, 0)
    node = Node(state, -1, 0, 1)
    by_weight = {}
    for w in (0.0, 0.3):
        proposer = DrafterProposer(base.with_settings(runner_up_weight=w), branch=3)
        proposer.begin_round(RoundInputs(stale, CommitRule(STATIC), MASK, 0), state, 0)
        (cands,) = proposer.propose([node], [0])
        by_weight[w] = cands
    tokens, _ = stale.coupled(1)
    second, gap = stale.runner_up(1)
    plain = {int(np.flatnonzero(c != state)[0]): lp for lp, c in by_weight[0.0]}
    assert len(plain) == 3 and all(c[np.flatnonzero(c != state)[0]] in tokens for _, c in by_weight[0.0])
    alternatives = [(lp, c) for lp, c in by_weight[0.3] if c[np.flatnonzero(c != state)[0]] != tokens[c != state]]
    assert len(by_weight[0.3]) == 6 and len(alternatives) == 3
    for lp, c in alternatives:
        (p,) = np.flatnonzero(c != state)
        assert c[p] == second[p]
        assert lp == pytest.approx(plain[p] + np.log(0.3) - gap[p], abs=1e-12)


def test_runner_up_children_are_accepted_and_stay_exact(drafter_dir, engine, monkeypatch):
    """With a heavy runner-up weight, runner-up children enter the trees and the walk ends on some of them; every
    output still equals standard decoding, and the trees differ from those without runner-ups."""
    from spot.runtime import spot as spot_module
    runner_up_states = set()
    real_propose = DrafterProposer.propose

    def propose(self, tree, nodes):
        answers = real_propose(self, tree, nodes)
        for i, cands in zip(nodes, answers):
            coupled = self.round.stale.coupled(tree[i].step)[0]
            for _, child in cands:
                (p,) = np.flatnonzero(child != tree[i].state)
                if child[p] != coupled[p]:
                    runner_up_states.add((child.tobytes(), tree[i].step + 1))
        return answers
    ends = []
    real_walk = spot_module.walk

    def walk(tree, outputs, ctx):
        end, nxt = real_walk(tree, outputs, ctx)
        ends.append((tree[end].state.tobytes(), tree[end].step) in runner_up_states)
        return end, nxt
    monkeypatch.setattr(DrafterProposer, "propose", propose)
    monkeypatch.setattr(spot_module, "walk", walk)
    base = Drafter.load(drafter_dir)
    rows = {0.0: [], 1.0: []}
    for i, prompt in enumerate(prompts(4, seed=31)):
        for temperature in (0.0, 1.0):
            req = DecodeRequest(max_new_tokens=20, sampling=Sampling(temperature, seed=i), budget=TreeBudget(10, 4))
            ref = run_decoder("standard", engine, prompt, req)
            for w in rows:
                got = run_decoder("spot", engine, prompt, req, drafter=base.with_settings(runner_up_weight=w))
                assert got.token_ids == ref.token_ids, (prompt, temperature, w)
                rows[w].append(got.stats.verify.nodes + got.stats.verify.accepted)
    assert sum(ends) > 0, "no round ended on a runner-up child"
    assert rows[0.0] != rows[1.0]


def test_load_drafter_checks_threads_and_names_a_file_that_is_not_the_drafter(tmp_path):
    """threads as for every ORT session (5000 hung for minutes starting threads); an .onnx beside a drafter.json
    that is not the drafter.onnx it describes (an export's target.onnx) is named as such, not as 'changed'."""
    import shutil

    from spot.assets import embedded_model_dir
    from spot.runtime.drafter import load_drafter
    shipped = Path(embedded_model_dir())
    for threads, says in ((5000, "threads must be in 0..256"), (-1, "threads must be in 0..256"),
                          (2.5, "threads must be an integer")):
        with pytest.raises(SpotError, match=re.escape(says)):
            load_drafter(shipped, threads=threads)
    assert load_drafter(shipped / "drafter.onnx", threads=1).block_size == 32
    shutil.copy(shipped / "drafter.json", tmp_path / "drafter.json")
    shutil.copy(shipped / "drafter.onnx", tmp_path / "target.onnx")
    with pytest.raises(SpotError, match="target.onnx is not a drafter: a drafter is drafter.onnx beside its"):
        load_drafter(tmp_path / "target.onnx")
