"""The central property: SPOT-family decoders give exactly the standard decoder's tokens, in fewer passes.

Tiny random targets with sharpened heads (so threshold commits and real acceptance happen); many prompts, seeds,
temperatures, block sizes, budgets and both commit rules. Drafter-based decoders are covered in test_drafter.py.
"""
from __future__ import annotations

import re
import threading
import time
from dataclasses import replace
from fractions import Fraction

import numpy as np
import pytest
import torch

from spot.errors import SpotError
from spot.runtime.decode import STORE_MODES, DecodeContext, DecodeStats
from spot.runtime.decode_plan import DecodeRequest, run_decoder
from spot.runtime.outputs import HostOutputs
from spot.runtime.spot import SpotBlockDecoder, TreeBudget, walk
from spot.runtime.step import THRESHOLD, CommitRule, Sampling
from spot.runtime.tree import Node, build_tree
from tree_cases import TREE_CASES
from tree_cases import python_answer as python_tree_answer
from tinymodels import PEAKED_MASK, peaked_engine as engine_for

MASK = PEAKED_MASK



CASES = [(b, s) for b in (4, 8, 16) for s in (0, 1)]


@pytest.mark.parametrize("store_mode", STORE_MODES)
@pytest.mark.parametrize("block_size,model_seed", CASES)
def test_spot_family_equals_standard_decoding(block_size, model_seed, store_mode):
    """Under either store mode (docs/spec.md §1), every decoder gives standard decoding's tokens and steps."""
    engine = engine_for(block_size, model_seed)
    rng = np.random.default_rng(block_size * 10 + model_seed)
    cases = fewer = 0
    for prompt_len in (0, 5, 11):
        prompt = rng.integers(0, 60, size=prompt_len)
        for temperature in (0.0, 0.5, 1.0):
            for seed in (0, 7):
                for mode, base_name in (("static", "standard"), ("threshold", "threshold")):
                    req = DecodeRequest(24, mode, 0.6, Sampling(temperature, seed=seed),
                                        TreeBudget(8, min(6, block_size)), store_mode=store_mode)
                    base = run_decoder(base_name, engine, prompt, req)
                    passes = {}
                    for name in ("chain", "tree", "oracle", "order-oracle"):
                        got = run_decoder(name, engine, prompt, req)
                        assert got.token_ids == base.token_ids, (name, mode, temperature, seed, prompt_len)
                        assert got.stats.steps == base.stats.steps
                        assert got.stats.target_passes <= base.stats.target_passes
                        fewer += got.stats.target_passes < base.stats.target_passes
                        passes[name] = got.stats.target_passes
                        cases += 1
                    # the oracle's progress per round is the most any proposal can reach, and monotone in the
                    # starting step, so no decoder needs fewer passes
                    assert passes["oracle"] <= min(passes.values())
    assert cases == 3 * 3 * 2 * 2 * 4
    assert fewer > cases // 4          # speculation really happens on these targets


def test_a_one_node_budget_is_standard_decoding():
    """A tree of one node is its root alone: each round is one standard step, so the decoder runs the standard loop
    (the same tokens and pass counts, the passes booked as standard `block` passes) and never asks the proposer."""
    from spot.runtime.decode import generate

    class Refusing:
        lookahead = 0

        def begin_round(self, *args):
            raise AssertionError("a one-node tree has nothing to draft")

        propose = begin_round
    engine = engine_for(8, 0)
    prompt = np.random.default_rng(3).integers(0, 60, size=9)
    for temperature in (0.0, 1.0):
        for mode in ("static", "threshold"):
            req = DecodeRequest(20, mode, 0.6, Sampling(temperature, seed=4), TreeBudget(1, 3))
            base = run_decoder("standard", engine, prompt, req)
            for name in ("tree", "order-oracle"):
                got = run_decoder(name, engine, prompt, req)
                assert got.token_ids == base.token_ids and got.stats.passes == base.stats.passes, (name, mode)
            got = generate(engine, prompt, max_new_tokens=20, rule=CommitRule(mode, 0.6),
                           sampling=Sampling(temperature, seed=4),
                           block_decoder=SpotBlockDecoder(Refusing(), TreeBudget(1, 3)))
            assert got.token_ids == base.token_ids and got.stats.passes == base.stats.passes


def test_oracle_accepts_every_node_of_its_chain():
    engine = engine_for(8, 0)
    req = DecodeRequest(32, sampling=Sampling(1.0, seed=3), budget=TreeBudget(8, 8))
    gen = run_decoder("oracle", engine, np.arange(5), req)
    # each round accepts min(depth, remaining steps - 1): at most one verify pass per block beyond the first pass
    assert gen.stats.passes["verify"] <= gen.stats.blocks


class _FixedStale:
    """A stale view whose coupled samples are given: tokens [B] for every step."""

    def __init__(self, tokens):
        self.tokens = np.asarray(tokens, dtype=np.int64)

    def coupled(self, step):
        return self.tokens, np.ones(self.tokens.shape)


def test_order_oracle_takes_true_positions_with_the_stale_tokens():
    from spot.runtime.proposers import OrderOracleProposer, RoundInputs
    from spot.runtime.step import CommitRule

    m = MASK
    traj = [np.array([m, m, m, m]), np.array([m, 5, m, m]), np.array([m, 5, m, 7]), np.array([9, 5, m, 7])]
    # stale samples agree with the truth at positions 1 and 3, not at 0
    stale = _FixedStale([8, 5, 2, 7])
    proposer = OrderOracleProposer({0: traj})
    proposer.begin_round(RoundInputs(stale, CommitRule(), m, block=0), traj[0], 0)
    tree = build_tree(traj[0], 0, proposer, budget=10, max_depth=4, mask_id=m)
    states = [n.state.tolist() for n in tree]
    # a chain: s1 and s2 exactly, then position 0 (the true next commit) with the stale token 8, not the true 9;
    # that child is off the trajectory, so nothing grows below it
    assert states == [traj[0].tolist(), traj[1].tolist(), traj[2].tolist(), [8, 5, m, 7]]


def test_independent_noise_is_still_exact():
    engine = engine_for(8, 1)
    for temperature in (0.5, 1.0):
        req = DecodeRequest(24, sampling=Sampling(temperature, seed=5), budget=TreeBudget(8, 6),
                            independent_noise=True)
        base = run_decoder("standard", engine, np.arange(6), req)
        assert run_decoder("chain", engine, np.arange(6), req).token_ids == base.token_ids


def test_independent_drafting_noise_is_another_seeds_not_the_targets():
    """The ablation's proposals sample with the xor'd seed and never read the target's noise cache (reading the
    cache kept every decode exact but measured coupled SPOT under the ablation's name)."""
    from spot.runtime.noise import NoiseCache
    from spot.runtime.stale import INDEPENDENT_SEED_XOR, StaleView
    logits = np.random.default_rng(0).normal(size=(8, 50)).astype(np.float32)
    masked, sampling = np.ones(8, bool), Sampling(1.0, seed=5)
    cache = NoiseCache(sampling.seed, 50)
    independent = StaleView(logits, masked, sampling, 2, independent_noise=True, noise=cache)
    other_seed = StaleView(logits, masked, replace(sampling, seed=sampling.seed ^ INDEPENDENT_SEED_XOR), 2)
    coupled = StaleView(logits, masked, sampling, 2, noise=cache)
    for step in (1, 2, 3):
        np.testing.assert_array_equal(independent.coupled(step)[0], other_seed.coupled(step)[0])
    assert any((independent.coupled(k)[0] != coupled.coupled(k)[0]).any() for k in (1, 2, 3))


def test_each_round_drafts_from_its_states_logits_with_each_steps_noise():
    """Every round's stale view holds L(s_m) of that round's state s_m (not an earlier pass's: still exact, but
    more passes), and its coupled sample for a node at step k is F's sample at step k from those logits (not step
    k + 1's noise). Both were invisible to the exactness tests."""
    from spot.runtime.decode import generate
    from spot.runtime.proposers import ConfidenceOrderProposer
    from spot.runtime.step import sample_positions
    engine, sampling = engine_for(8, 1), Sampling(1.0, seed=3)
    rounds = []

    class Checking(ConfidenceOrderProposer):
        def begin_round(self, round_inputs, state, step):
            super().begin_round(round_inputs, state, step)
            stale = round_inputs.stale
            np.testing.assert_array_equal(stale.logits, engine.block_logits(state[None])[0])
            masked = np.flatnonzero(state == MASK)
            for k in (step + 1, step + 2):
                tokens, conf = sample_positions(stale.logits, masked, replace(sampling, exclude_token=MASK),
                                                round_inputs.block, k)
                np.testing.assert_array_equal(stale.coupled(k)[0][masked], tokens)
                np.testing.assert_array_equal(stale.coupled(k)[1][masked], conf)
            rounds.append(step)

    gen = generate(engine, np.arange(1, 12), max_new_tokens=24, sampling=sampling, stop_ids=(),
                   block_decoder=SpotBlockDecoder(Checking(branch=4), TreeBudget(8, 3)))
    assert len(gen.token_ids) >= 16 and len(rounds) >= 4 and any(step > 0 for step in rounds)


def test_standard_decoding_over_blocks_equals_f_without_a_noise_cache():
    """generate() at T > 0 over several blocks equals a plain loop of F with noise rows computed on each use: the
    decode's noise cache starts over at each block (reusing a previous block's rows passed every test that compares
    two decoders sharing the cache)."""
    from spot.runtime.decode import generate
    from spot.runtime.step import step_fn
    engine, rule = engine_for(4, 1), CommitRule()
    sampling = Sampling(1.0, seed=11)
    prompt = np.arange(1, 9)                          # two whole blocks of 4
    gen = generate(engine, prompt, max_new_tokens=12, sampling=sampling, stop_ids=())
    engine.prefill(prompt)
    out = []
    for block in (2, 3, 4):
        state, step = np.full(4, MASK, dtype=np.int64), 0
        while (state == MASK).any():
            logits = engine.block_logits(state[None])[0]
            state = step_fn(state, logits, MASK, rule, replace(sampling, exclude_token=MASK), block, step)
            step += 1
        engine.store(state)
        out += state.tolist()
    assert gen.token_ids == out


def _ctx(rule: CommitRule) -> DecodeContext:
    return DecodeContext(rule, Sampling(0.0), 9, DecodeStats())


def test_a_proposal_committing_a_strict_subset_of_the_target_set_is_rejected():
    """Threshold F commits positions {0, 1}; a child committing only {0} must not be accepted (docs/spec.md §5)."""
    rule = CommitRule(THRESHOLD, 0.5)
    root = np.array([9, 9, 9, 9])
    subset = np.array([1, 9, 9, 9])
    exact = np.array([1, 2, 9, 9])
    logits = np.full((4, 10), -10.0, dtype=np.float32)
    logits[0, 1] = logits[1, 2] = 10.0      # confident at positions 0 and 1 only
    logits[2:] = 0.0                        # positions 2, 3: flat, confidence 0.1
    tree = [Node(root, -1, 0, 1), Node(subset, 0, 1, 2)]
    tree[0].children = [1]
    ctx = _ctx(rule)
    out = {i: HostOutputs(logits, tree[i].step, ctx.sampling, 0) for i in range(2)}
    end, nxt = walk(tree, out, ctx)
    assert end == 0 and np.array_equal(nxt, exact)   # F(root) = exact, the subset child is not taken
    tree.append(Node(exact, 0, 1, 2))
    tree[0].children.append(2)
    out[2] = HostOutputs(logits, 2, ctx.sampling, 0)
    end, _ = walk(tree, out, ctx)
    assert end == 2


class FixedProposer:
    """Proposes the given (logp, child) lists by node depth (tests the tree builder alone)."""

    def __init__(self, by_depth, lookahead=0):
        self.by_depth, self.lookahead = by_depth, lookahead
        self.calls = self.nodes = 0

    def propose(self, tree, nodes):
        self.calls += 1
        self.nodes += len(nodes)
        return [self.by_depth(tree[i]) for i in nodes]


def test_tree_is_grown_best_first_under_budget_and_depth():
    def cands(node):
        masked = np.flatnonzero(node.state == 9)
        out = []
        for k, p in enumerate(masked[:3]):
            child = node.state.copy()
            child[p] = 1
            out.append((np.log([0.7, 0.2, 0.1][k]), child))
        return out
    proposer = FixedProposer(cands)
    tree = build_tree(np.full(6, 9), 1, proposer, budget=5, max_depth=3, mask_id=9)
    assert len(tree) == 5
    assert max(n.depth for n in tree) <= 3
    # best-first: the chain of 0.7s (0.7, 0.49, 0.343) beats the 0.2 branch, the 0.2 sibling beats 0.7^4
    logps = sorted(np.exp(n.logp) for n in tree[1:])
    assert logps == pytest.approx(sorted([0.7, 0.49, 0.343, 0.2]))
    assert proposer.calls <= 4
    states = [tuple(n.state) for n in tree]
    assert len(set(states)) == len(states)


@pytest.mark.parametrize("index", range(len(TREE_CASES)))
def test_trees_follow_the_stated_order_rule(index):
    """Known-answer trees (tests/tree_cases.py, the C++ builder runs the same table in test_cpp_host.py): equal
    path log-probabilities under different parents, where only the order rule decides which node enters."""
    assert python_tree_answer(index) == TREE_CASES[index][3], TREE_CASES[index][0]


def two_orders(node):
    """Children commit one of the first two masked positions, equally likely: every pair of commits is reached
    by both orders."""
    out = []
    for p in np.flatnonzero(node.state == 9)[:2]:
        child = node.state.copy()
        child[p] = 1
        out.append((np.log(0.5), child))
    return out


def test_a_state_reached_by_two_commit_orders_is_one_node():
    trees = {merge: build_tree(np.full(6, 9), 1, FixedProposer(two_orders), budget=8, max_depth=4, mask_id=9,
                               merge=merge) for merge in (False, True)}
    for merge, tree in trees.items():
        assert len(tree) == 8
        for i, node in enumerate(tree):
            for c in node.children:      # every edge commits one position, one step further
                assert tree[c].depth == node.depth + 1 and tree[c].step == node.step + 1
                assert ((node.state == 9) & (tree[c].state != 9)).sum() == 1
    distinct = {merge: len({(tuple(n.state), n.step) for n in tree}) for merge, tree in trees.items()}
    assert distinct[True] == 8 > distinct[False]           # merged: 8 states verified, unmerged: duplicates
    shared = [c for c in range(8) if sum(c in n.children for n in trees[True]) == 2]
    assert shared                                          # a node with two parents


def test_equal_states_at_different_steps_stay_apart():
    """A threshold rule can reach a state in one step or in two; F and the noise differ by step, so these are two
    nodes (merging them would walk on the wrong step's logits)."""
    def cands(node):
        masked = np.flatnonzero(node.state == 9)
        both = node.state.copy()
        both[masked[:2]] = 1
        one = node.state.copy()
        one[masked[0]] = 1
        return [(np.log(0.6), both), (np.log(0.4), one)] if masked.size >= 2 else []
    tree = build_tree(np.full(4, 9), 1, FixedProposer(cands), budget=6, max_depth=3, mask_id=9)
    pairs = [(tuple(n.state), n.step) for n in tree]
    assert len(set(pairs)) == len(pairs)
    states = [tuple(n.state) for n in tree]
    assert len(set(states)) < len(states)                  # the same state at two steps, kept twice


def test_merged_trees_stay_exact_and_save_verify_rows(monkeypatch):
    """On a real target at T = 0 commit orders collide; merged trees decode the standard tokens, and merging
    happened (a node listed by two parents)."""
    import spot.runtime.spot as spot_round
    links = []

    def counting(*args, **kwargs):
        tree = build_tree(*args, **kwargs)
        links.append(sum(len(n.children) for n in tree) - (len(tree) - 1))
        return tree
    monkeypatch.setattr(spot_round, "build_tree", counting)
    engine = engine_for(8, 0)
    rng = np.random.default_rng(5)
    for _ in range(4):
        prompt = rng.integers(0, 60, size=7)
        for temperature in (0.0, 1.0):
            req = DecodeRequest(24, "static", 0.6, Sampling(temperature, seed=3), TreeBudget(16, 6))
            base = run_decoder("standard", engine, prompt, req)
            assert run_decoder("tree", engine, prompt, req).token_ids == base.token_ids
    assert sum(links) > 0


def random_candidates(seed: int, mask_id: int, branch: int = 3):
    """A proposer table: children of a node commit up to `branch` masked positions with pseudo-random
    log-probabilities that depend only on the node's state: a dominant first child, as a confident drafter's
    (the tree then grows about one node per call without lookahead), and ties among the others (the tie-break)."""
    def cands(node):
        rng = np.random.default_rng([seed, *(int(v) for v in node.state)])
        masked = np.flatnonzero(node.state == mask_id)
        picks = rng.permutation(masked)[:branch]
        logp = np.log([rng.choice([0.9, 0.8, 0.6])] + list(rng.choice([0.1, 0.05, 0.05], size=len(picks) - 1)))
        out = []
        for p, lp in zip(picks, logp):
            child = node.state.copy()
            child[p] = int(rng.integers(0, 5))
            out.append((float(lp), child))
        return out
    return cands


@pytest.mark.parametrize("seed", range(12))
def test_lookahead_changes_the_calls_not_the_tree(seed):
    """Proposing ahead for queued candidates gives the same tree, node for node, in fewer proposer calls."""
    budget, depth = [(16, 8), (32, 6), (64, 16), (5, 2)][seed % 4]
    root = np.full(16, 9)
    root[seed % 5] = 1
    trees, calls, nodes = [], [], []
    for lookahead in (0, 1, 4, 16, 100):
        proposer = FixedProposer(random_candidates(seed, 9), lookahead)
        tree = build_tree(root, 3, proposer, budget=budget, max_depth=depth, mask_id=9, lookahead=lookahead)
        trees.append([(tuple(n.state), n.parent, n.depth, n.step, n.logp, n.children) for n in tree])
        calls.append(proposer.calls)
        nodes.append(proposer.nodes)
    assert all(t == trees[0] for t in trees)
    assert all(c <= calls[0] for c in calls)
    if budget >= 16:                             # room for candidates queued beside the node expanded
        assert calls[2] < calls[0]
    assert all(n >= nodes[0] for n in nodes)     # what lookahead costs: nodes proposed for and never expanded
    assert len(trees[0]) == budget


def test_the_default_budget_fits_any_block_size():
    """DecodeRequest()'s budget: 16 nodes, depth 8 capped at the block size (as the CLI's and the C API's default);
    an explicit depth beyond the block is still refused."""
    engine = engine_for(4, 0)
    assert TreeBudget().resolve(engine) == TreeBudget(16, 4) and TreeBudget(16).resolve(engine_for(16, 0)).depth == 8
    want = run_decoder("standard", engine, np.arange(4), DecodeRequest(8)).token_ids
    assert run_decoder("tree", engine, np.arange(4), DecodeRequest(8)).token_ids == want
    with pytest.raises(SpotError, match="depth must be in 1..4"):
        run_decoder("tree", engine, np.arange(4), DecodeRequest(8, budget=TreeBudget(16, 8)))


def test_bad_budgets_are_clear_errors():
    engine = engine_for(8, 0)
    for budget, match in ((TreeBudget(0, 4), "budget must be >= 1"), (TreeBudget(8, 9), "depth must be in 1..8")):
        with pytest.raises(SpotError, match=match):
            run_decoder("tree", engine, np.arange(4), DecodeRequest(8, budget=budget))
    with pytest.raises(SpotError, match="needs a drafter"):
        run_decoder("spot", engine, np.arange(4), DecodeRequest(8))
    with pytest.raises(SpotError, match="unknown decoder"):
        run_decoder("medusa", engine, np.arange(4), DecodeRequest(8))


@pytest.mark.parametrize("make, says", [
    (lambda: DecodeRequest(max_new_tokens=2.5), "max_new_tokens must be an integer, got 2.5"),
    (lambda: DecodeRequest(max_new_tokens=True), "max_new_tokens must be an integer, got True"),
    (lambda: DecodeRequest(stop_ids="746"), "stop_ids must be a sequence of token ids"),
    (lambda: DecodeRequest(stop_ids=[5.5]), "a stop id must be an integer"),
    (lambda: DecodeRequest(sampling={"temperature": 1}), "DecodeRequest.sampling must be a Sampling"),
    (lambda: DecodeRequest(budget=16), "DecodeRequest.budget must be a TreeBudget, got 16"),      # was "treebudget"
    (lambda: DecodeRequest(max_new_tokens=0), "max_new_tokens must be >= 1, got 0"),       # at construction now
    (lambda: run_decoder("standard", engine_for(8, 0), [1, 2], {"max_new_tokens": 8}),
     "the request must be a DecodeRequest, got dict"),
    (lambda: run_decoder("standard", engine_for(8, 0), [1, 2], DecodeRequest(4), on_block=5),
     "on_block must be a function or None, got 5"),
    (lambda: run_decoder("spot", engine_for(8, 0), [1, 2], DecodeRequest(4), drafter="drafter.onnx"),
     "drafter must be a loaded drafter, got str"),
    (lambda: DecodeRequest(mode="threshold", tau="0.5"), "tau must be a number, got '0.5'"),
    (lambda: Sampling(temperature="1"), "temperature must be a number"),
    (lambda: Sampling(5e-324), "temperature must be 0 or a finite number >= 1e-06"),
    (lambda: Sampling(1.0, seed=2.9), "seed must be an integer, got 2.9"),
    (lambda: Sampling(1.0, top_k=2.5), "top_k must be an integer"),
    (lambda: Sampling(1.0, top_k=-1), "top_k must be in [0, 2147483647] (0 disables it), got -1"),
    (lambda: Sampling(1.0, top_k=2 ** 63), "top_k must be in [0, 2147483647]"),    # the epilogue's int64 overflowed
    (lambda: TreeBudget(2.5, 3), "budget nodes must be an integer"),
    (lambda: TreeBudget(4, 2.5), "tree depth must be an integer"),
    (lambda: DecodeRequest(independent_noise="no"), "independent_noise must be True or False, got 'no'"),
])
def test_library_arguments_of_the_wrong_type_are_named(make, says):
    """The Python API's request types check what they hold (a float seed was truncated, a string of stop ids was
    a set of characters, a tiny temperature overflowed L / T into a traceback)."""
    with pytest.raises(SpotError, match=re.escape(says)):
        make()


def test_numpy_scalars_and_generators_are_accepted_where_they_mean_the_same():
    assert DecodeRequest(7, stop_ids=(i for i in (3, 4))).stop_ids == (3, 4)
    assert Sampling(np.float64(0.5), np.int64(3), seed=np.uint32(7)) == Sampling(0.5, 3, seed=7)
    # held as float / int: a Fraction or float128 temperature reached numpy as itself (TypeError mid-decode)
    for held in (Sampling(Fraction(7, 10), top_p=np.longdouble(0.5)), Sampling(np.longdouble(0.7), top_p=0.5)):
        assert held == Sampling(0.7, top_p=0.5) and type(held.temperature) is float and type(held.top_p) is float
    assert type(CommitRule(THRESHOLD, Fraction(1, 2)).tau) is float
    assert TreeBudget(np.int64(4), 2) == TreeBudget(4, 2)
    assert DecodeRequest(7, stop_ids=[torch.tensor(5)]).stop_ids == (5,)       # as prompt ids may be tensors
    engine = engine_for(8, 0)
    for stop in ([10**9], [-1]):
        with pytest.raises(SpotError, match="stop id .* is outside the vocabulary"):
            run_decoder("standard", engine, [1, 2], DecodeRequest(4, stop_ids=stop))


def test_prompt_ids_out_of_range_are_named_with_their_value():
    engine = engine_for(8, 0)
    for prompt, says in (([2**70], f"prompt token id {2**70} is outside"),
                         (np.array([2**63 + 5], np.uint64), f"prompt token id {2**63 + 5} is outside"),
                         ((i for i in (5, 6)), "prompt ids must be a list or array of token ids, got a generator"),
                         ("5,6", "got a str")):
        with pytest.raises(SpotError, match=re.escape(says)):
            run_decoder("standard", engine, prompt, DecodeRequest(8))


@pytest.mark.parametrize("decoder", ["standard", "tree"])
def test_one_request_at_a_time_per_engine(decoder):
    """An engine holds ONE KV cache: a second request while one runs (inside on_block, or from another thread)
    is refused instead of resetting the cache under the first (whose tokens then came out wrong, silently)."""
    engine = engine_for(8, 1)
    req = DecodeRequest(24, sampling=Sampling(1.0, seed=3), budget=TreeBudget(6, 3))
    prompt = np.arange(5, 12)
    want = run_decoder(decoder, engine, prompt, req).token_ids
    refused = []

    def nested(_ids):
        with pytest.raises(SpotError, match="already decoding a request") as info:
            run_decoder("standard", engine, [1, 2, 3], DecodeRequest(4))
        refused.append(info.value.hint)
        # the engine's own passes too, on the request's thread: a prefill here changed 23 of 29 tokens silently
        with pytest.raises(SpotError, match="on_block ran a pass of the engine"):
            engine.prefill(np.arange(8))
        with pytest.raises(SpotError, match="on_block ran a pass of the engine"):
            engine.store(np.zeros(8, np.int64))
    assert run_decoder(decoder, engine, prompt, req, on_block=nested).token_ids == want
    assert refused and "one engine per thread" in refused[0]

    started, release = threading.Event(), threading.Event()
    errors = []

    def blocked(_ids):
        started.set()
        release.wait(120)
    results = []
    worker = threading.Thread(target=lambda: results.append(run_decoder(decoder, engine, prompt, req,
                                                                        on_block=blocked).token_ids))
    worker.start()
    assert started.wait(120)
    try:
        run_decoder(decoder, engine, prompt, req)
    except SpotError as e:
        errors.append(e.message)
    # the engine's own passes from this thread too: a prefill here reset the worker's cache (70 of 92 tokens
    # changed, silently)
    for call in (lambda: engine.prefill(np.arange(8)), lambda: engine.store(np.zeros(8, np.int64)),
                 lambda: engine.block_logits(np.zeros((1, 8), np.int64))):
        with pytest.raises(SpotError, match="decoding a request on another thread"):
            call()
    release.set()
    worker.join()
    assert errors and "already decoding" in errors[0] and results == [want]
    assert run_decoder(decoder, engine, prompt, req).token_ids == want      # released after each request


def test_the_tuner_picks_the_budget_with_the_most_steps_per_second():
    """The choice is by measured speed-up over standard decoding: no tree unless one measured faster. Beside it,
    the latency curve's prediction from pass counts, known answers: 25 blocks of 4 steps; standard decoding = 100
    one-state step passes + 25 store passes; a 4x3 tree = per block its first pass, 2 verify passes of 4 nodes, the
    store pass; a 16x8 tree = its first pass, 1 verify pass of 16 nodes, the store pass."""
    from spot.runtime.tuning import PassProfile, choose_budget
    assert choose_budget({(4, 3): 0.8, (16, 8): 0.5}) == choose_budget({}) and choose_budget({}).nodes == 1
    c = choose_budget({(4, 3): 1.3, (16, 8): 1.6, (2, 1): 1.1})
    assert (c.nodes, c.depth, c.expected_speedup) == (16, 8, 1.6)
    assert choose_budget({(2, 1): 1.02}).nodes == 1         # within the measurement's noise: no tree
    standard = PassProfile(steps=100, single_passes=125, host_ms=100.0, pass_ms=400.0)
    small = PassProfile(steps=100, single_passes=50, verify_nodes=(4,) * 50, host_ms=200.0)
    big = PassProfile(steps=100, single_passes=50, verify_nodes=(16,) * 25)
    assert standard.steps_per_ms() == pytest.approx(100 / 500)
    compute_bound = {1: 4.0, 4: 12.0, 16: 44.0}
    assert standard.curve_ms(compute_bound) == 125 * 4 + 100
    assert small.curve_ms(compute_bound) == 50 * 4 + 50 * 12 + 200
    memory_bound = {1: 10.0, 4: 10.5, 16: 12.0}
    assert big.curve_ms(memory_bound) == 50 * 10 + 25 * 12


def test_the_tuners_pass_profile_counts_what_the_decoders_did():
    """Every pass of a run is in its profile (one-state passes, one latency term per verify pass) and a tree's steps
    are standard decoding's; steps per verify counts the steps verify passes committed (block 4: 1 + the mean
    accepted depth overrated it by ~25%, and the tuner with it)."""
    from spot.runtime.summary import summarize
    from spot.runtime.tuning import PassProfile
    engine = engine_for(4, 3)
    prompt = np.arange(1, 7)
    req = DecodeRequest(max_new_tokens=24, sampling=Sampling(1.0, seed=5), budget=TreeBudget(8, 3))
    standard = run_decoder("standard", engine, prompt, req)
    for decoder in ("tree", "oracle"):
        gen = run_decoder(decoder, engine, prompt, req)
        profile = PassProfile.of([gen])
        assert profile.steps == standard.stats.steps
        assert profile.single_passes + len(profile.verify_nodes) + profile.fused_passes \
            + gen.stats.passes.get("prefill", 0) == gen.stats.target_passes
        s = summarize([gen])
        assert s["steps_per_verify"] == pytest.approx((gen.stats.steps - gen.stats.passes["block"]
                                                       - gen.stats.passes["fused"]) / gen.stats.passes["verify"])
        assert s["steps_per_verify"] <= 1 + np.mean(gen.stats.verify.accepted)
        assert profile.fused_passes == gen.stats.passes["fused"] == gen.stats.blocks - 1
    fused = standard.stats.passes["fused"]
    assert PassProfile.of([standard]) == PassProfile(standard.stats.steps, standard.stats.target_passes
                                                     - standard.stats.passes.get("prefill", 0) - fused,
                                                     fused_passes=fused)


def test_decode_stats_are_typed_and_keep_their_json_keys():
    """A mistyped pass kind or record field is an error (they were dict keys: a typo counted under a new key), and
    `spot generate --json`'s keys stay those of each decoder's records."""
    engine = engine_for(4, 0)
    req = DecodeRequest(8, sampling=Sampling(1.0, seed=2), budget=TreeBudget(4, 2))
    base = {"target_passes", "passes", "steps", "blocks", "seconds"}
    standard = run_decoder("standard", engine, [1, 2, 3], req).stats
    assert set(standard.to_dict()) == base | {"target_ms", "sample_ms"} and standard.verify is None
    tree = run_decoder("tree", engine, [1, 2, 3], req).stats
    assert set(tree.to_dict()) == base | {"target_ms", "accepted_per_verify", "nodes_per_verify", "draft_ms",
                                          "walk_ms"}
    assert len(tree.verify.accepted) == len(tree.verify.nodes) == tree.passes["verify"] > 0
    assert tree.to_dict()["target_ms"] == tree.verify.target_ms > 0
    assert list(tree.to_dict()["passes"]) == ["prefill", "block", "verify", "store", "fused"]
    with pytest.raises(KeyError, match="unknown pass kind 'verfy'"):
        tree.passes["verfy"] += 1
    with pytest.raises(AttributeError):
        tree.verify.draft_msec = 1.0


def test_acceptance_by_depth_lists_every_depth_of_the_budget():
    """A depth the tree never reached reads 0, not absent (chain@4x2 listed [0.185] only)."""
    from spot.runtime.summary import summarize
    engine = engine_for(8, 1)
    gen = run_decoder("tree", engine, np.arange(1, 7), DecodeRequest(16, sampling=Sampling(1.0, seed=2),
                                                                     budget=TreeBudget(8, 6)))
    reached = max(gen.stats.verify.accepted)
    assert reached < 6
    listed = summarize([gen], depth=6)["acceptance_by_depth"]
    assert len(listed) == 6 and listed[reached:] == [0.0] * (6 - reached) and listed[0] > 0
    assert len(summarize([gen])["acceptance_by_depth"]) == max(reached, 1)


def test_the_tuner_decodes_standard_only_beside_each_candidate(monkeypatch):
    """TUNE_REPEATS standard decodes per prompt beside each candidate, and none besides (a separate standard run
    only for the report cost one more decode of every prompt)."""
    import spot.app.bench_run as bench
    from spot.prompts import Prompt
    engine = engine_for(4, 3)
    prompts = [Prompt("p", [1, 2, 3, 4, 5]), Prompt("q", [6, 7, 8])]
    calls = []

    def counting(name, *args, **kwargs):
        calls.append(name)
        return run_decoder(name, *args, **kwargs)
    monkeypatch.setattr(bench, "run_decoder", counting)
    tuned = bench.tune_budget(engine, prompts, 1.0, [TreeBudget(2, 1), TreeBudget(4, 2)], decoder="tree",
                              curve={1: 1.0, 2: 1.5, 4: 2.0})
    assert calls.count("standard") == calls.count("tree") == 2 * len(prompts) * bench.TUNE_REPEATS
    assert tuned["standard_host_ms_per_step"] > 0 and set(tuned["curve_speedup"]) == {"2x1", "4x2"}


def test_a_decodes_host_time_is_its_wall_time_outside_the_engines_passes():
    """Counting only the draft and walk timers left a tree's rounds 20-25% cheaper than measured: the tuner charges
    each decode its wall time minus the engine's pass time (prefill, block, verify, store passes alike)."""
    from spot.runtime.tuning import decode_timed
    engine = engine_for(4, 3)
    req = DecodeRequest(max_new_tokens=12, sampling=Sampling(1.0, seed=5), budget=TreeBudget(4, 2))

    def slow_decode():
        gen = run_decoder("tree", engine, np.arange(1, 7), req)
        time.sleep(0.05)            # host work no timer inside the decoder sees
        return gen
    gen, host_ms, pass_ms = decode_timed(engine, slow_decode)
    assert host_ms >= 50.0 and pass_ms > 0
    assert host_ms + pass_ms >= 1e3 * gen.stats.seconds


@pytest.mark.parametrize("decoder", ["tree", "chain"])
def test_non_finite_logits_of_a_candidate_the_walk_never_reads_do_not_fail(decoder):
    """A verify pass runs candidates standard decoding never runs; NaN / inf in their logits (fp16 overflow on an
    odd branch) must not fail SPOT where standard decoding succeeds: only the states the walk reads are checked.
    Here every state standard decoding never evaluates gets NaN logits; SPOT reads exactly the standard states."""
    engine = engine_for(8, 2)
    seen = set()
    real = engine._block_logits

    def recording(states):
        seen.update((engine.cached_len, s.tobytes()) for s in states)
        return real(states)
    req = DecodeRequest(24, sampling=Sampling(1.0, seed=4), budget=TreeBudget(8, 4))
    engine._block_logits = recording
    want = run_decoder("standard", engine, np.arange(5, 11), req)

    def poisoned(states):
        logits = real(states).copy()
        for i, s in enumerate(states):
            if (engine.cached_len, s.tobytes()) not in seen:
                logits[i, 0, 0] = np.nan
        return logits
    engine._block_logits = poisoned
    got = run_decoder(decoder, engine, np.arange(5, 11), req)
    assert got.token_ids == want.token_ids and got.stats.passes["verify"] > 0
    engine._block_logits = lambda states: np.full_like(real(states), np.nan)     # what the walk reads: refused
    with pytest.raises(SpotError, match="non-finite logits"):
        run_decoder(decoder, engine, np.arange(5, 11), req)


def test_the_latency_curve_never_falls_with_more_nodes():
    """On a busy machine a 1-state pass measured at 10 ms beside 2 ms for 2 states made the tuner expect a 2-node
    tree to be 3.9x faster: the curve is each count's fastest repeat, bounded by every larger count's."""
    from spot.runtime.tuning import measure_latency_curve
    engine = engine_for(4, 3)
    extra_ms = {1: 10.0, 2: 2.0, 4: 3.0}       # what the busy machine adds to every pass of N states
    real = engine.block_outputs

    def busy(states, steps, sampling, block, noise=None):
        time.sleep(extra_ms[len(states)] / 1e3)
        return real(states, steps, sampling, block, noise)
    engine.block_outputs = busy
    curve = measure_latency_curve(engine, np.arange(1, 9), [1, 2, 4])
    assert list(curve) == [1, 2, 4] and curve[1] <= curve[2] <= curve[4]
    assert curve[1] < 5.0 and curve[2] >= 2.0 and curve[4] >= 3.0       # 1 node: bounded by 2 nodes' fastest
