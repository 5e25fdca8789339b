"""Exact target-pass counts of tree decoders replayed from recorded standard decoding, without the target.

A SPOT round's tree depends only on its stale logits L(s_m) (and the proposer); its walk accepts a child exactly when
that child is the next state of standard decoding (every accepted node is F of its parent, docs/spec.md §4). The
rounds start on the standard trajectory, so recording each block's trajectory s_0..s_k with the logits L(s_t) of
every step is enough to replay any proposer and budget: the same trees, the same accepted depths, the same passes
as decoding on the engine (tests/test_replay.py checks them equal). One standard decode per prompt then prices any
number of tree settings (spot.training.calibration, benchmarks/tree_replay.py); only the proposer runs.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from spot.runtime.decode import generate, standard_block
from spot.runtime.decode_plan import DecodeRequest
from spot.runtime.registry import decoder as decoder_entry
from spot.runtime.proposers import RoundInputs
from spot.runtime.spot import TreeBudget
from spot.runtime.stale import StaleView
from spot.runtime.step import CommitRule, Sampling
from spot.runtime.tree import build_tree


@dataclass
class RecordedBlock:
    block: int
    states: list[np.ndarray]        # s_0 .. s_k [B] int64: standard decoding's trajectory of the block
    logits: list[np.ndarray]        # L(s_0) .. L(s_{k-1}) [B, V] float32


@dataclass
class RecordedDecode:
    """One standard decode: its blocks, and the passes outside any block decoder (prefill; stores in separate
    store mode: a fused store is a block's first pass)."""

    blocks: list[RecordedBlock]
    sampling: Sampling              # as the decode loop samples (mask id excluded)
    rule: CommitRule
    mask_id: int
    other_passes: int

    @property
    def standard_passes(self) -> int:
        return self.other_passes + sum(len(b.logits) for b in self.blocks)

    def trajectories(self) -> dict[int, list[np.ndarray]]:
        """Block index -> trajectory, as the oracle proposers read it."""
        return {b.block: b.states for b in self.blocks}


def record_standard(engine, prompt_ids, req: DecodeRequest, decoder: str = "spot") -> RecordedDecode:
    """Decode `prompt_ids` with standard decoding under `decoder`'s commit rule, keeping every step's logits."""
    rule = decoder_entry(decoder).commit_rule(req.mode, req.tau)
    blocks: dict[int, RecordedBlock] = {}

    def observe(block, step, state, outputs, nxt):
        rec = blocks.setdefault(block, RecordedBlock(block, [state.copy()], []))
        rec.logits.append(np.array(outputs.host_logits(), dtype=np.float32, copy=True))
        rec.states.append(nxt.copy())

    gen = generate(engine, prompt_ids, max_new_tokens=req.max_new_tokens, rule=rule, sampling=req.sampling,
                   stop_ids=req.stop_ids, store_mode=req.store_mode, block_decoder=standard_block, observer=observe)
    recorded = [blocks[k] for k in sorted(blocks)]
    other = gen.stats.target_passes - sum(len(b.logits) for b in recorded)
    sampling = replace(req.sampling, exclude_token=engine.config.mask_token_id)     # as generate() samples
    return RecordedDecode(recorded, sampling, rule, engine.config.mask_token_id, other)


def replay_block(rec: RecordedBlock, proposer, budget: TreeBudget, sampling: Sampling, rule: CommitRule,
                 mask_id: int) -> int:
    """Target passes SpotBlockDecoder spends on this block with `proposer` (budget resolved: depth set)."""
    traj = rec.states
    if budget.nodes == 1:               # a one-node tree runs the standard loop
        return len(rec.logits)
    m, passes = 0, 1                    # the block's first pass: L(s_0)
    while m < len(rec.logits) and (traj[m + 1] == mask_id).any():
        stale = StaleView(rec.logits[m], traj[m] == mask_id, sampling, rec.block)
        proposer.begin_round(RoundInputs(stale, rule, mask_id, rec.block), traj[m], m)
        tree = build_tree(traj[m + 1], m + 1, proposer, budget.nodes, budget.depth, mask_id, proposer.lookahead)
        passes += 1
        m = walk_end_step(tree, traj, mask_id)
    return passes


def walk_end_step(tree, traj, mask_id: int) -> int:
    """The step of the node the walk ends at (from the root, the child equal to the trajectory's next state)."""
    u = 0
    while (tree[u].state == mask_id).any():
        nxt = traj[tree[u].step + 1]
        match = next((c for c in tree[u].children if np.array_equal(tree[c].state, nxt)), None)
        if match is None:
            break
        u = match
    return tree[u].step


def replay_passes(rec: RecordedDecode, proposer, budget: TreeBudget) -> int:
    """Target passes of the whole decode with `proposer` under `budget` (depth resolved)."""
    return rec.other_passes + sum(replay_block(b, proposer, budget, rec.sampling, rec.rule, rec.mask_id)
                                  for b in rec.blocks)
