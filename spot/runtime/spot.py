"""The SPOT round (SPEC §4) and SPOT-Sets (§5) as a block decoder for spot.runtime.decode.generate.

Round: free root r = F_m(s_m) from the known logits; a draft tree rooted at r; ONE target pass over every incomplete
node (nodes on the batch axis); walk from the root to the child equal to F of the node's fresh logits. Output equals
standard decoding with the same seed whatever the proposer does, because every accepted node is F of its parent.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from spot.errors import SpotError
from spot.runtime.decode import DecodeContext
from spot.runtime.engine import Engine
from spot.runtime.proposers import RoundInputs
from spot.runtime.stale import StaleView
from spot.runtime.step import step_fn
from spot.runtime.tree import build_tree


@dataclass(frozen=True)
class TreeBudget:
    nodes: int = 16   # verify batch size N (root included)
    depth: int = 8    # deepest node below the root

    def check(self, block_size: int) -> None:
        if self.nodes < 1:
            raise SpotError(f"budget must be >= 1 node, got {self.nodes}")
        if not 1 <= self.depth <= block_size:
            raise SpotError(f"depth must be in 1..{block_size} (the block size), got {self.depth}")


def walk(tree, node_logits: dict[int, np.ndarray], ctx: DecodeContext, block: int) -> tuple[int, np.ndarray]:
    """From the root, follow the child equal to F of the node's fresh logits. Returns (end node, F(end node))."""
    u = 0
    while True:
        node = tree[u]
        nxt = step_fn(node.state, node_logits[u], ctx.mask_id, ctx.rule, ctx.sampling, block, node.step)
        match = next((c for c in node.children if np.array_equal(tree[c].state, nxt)), None)
        if match is None:
            return u, nxt
        u = match
        if u not in node_logits:          # a complete node: the block is finished there
            return u, tree[u].state


class SpotBlockDecoder:
    """Callable BlockDecoder; `proposer` has begin_round(RoundInputs, state, step) and propose(tree, nodes)."""

    def __init__(self, proposer, budget: TreeBudget, independent_noise: bool = False):
        self.proposer, self.budget, self.independent_noise = proposer, budget, independent_noise

    def __call__(self, engine: Engine, state: np.ndarray, block: int, ctx: DecodeContext) -> np.ndarray:
        self.budget.check(engine.block_size)
        stats = ctx.stats
        extra = stats.extra
        accepted = extra.setdefault("accepted_per_verify", [])
        extra.setdefault("nodes_per_verify", [])
        extra.setdefault("draft_ms", 0.0)
        extra.setdefault("walk_ms", 0.0)
        extra.setdefault("target_ms", 0.0)   # verify passes only: the split host vs target per verify
        logits = engine.block_logits(state[None])[0]
        stats.passes["block"] += 1
        step = 0
        root = step_fn(state, logits, ctx.mask_id, ctx.rule, ctx.sampling, block, step)
        while (root == ctx.mask_id).any():
            t0 = time.perf_counter()
            stale = StaleView(logits, state == ctx.mask_id, ctx.sampling, block, self.independent_noise)
            self.proposer.begin_round(RoundInputs(stale, ctx.rule, ctx.mask_id, block), state, step)
            tree = build_tree(root, step + 1, self.proposer, self.budget.nodes, self.budget.depth, ctx.mask_id)
            incomplete = [i for i, n in enumerate(tree) if (n.state == ctx.mask_id).any()]
            t1 = time.perf_counter()
            fresh = engine.block_logits(np.stack([tree[i].state for i in incomplete]))
            t2 = time.perf_counter()
            stats.passes["verify"] += 1
            end, root = walk(tree, dict(zip(incomplete, fresh)), ctx, block)
            t3 = time.perf_counter()
            extra["draft_ms"] += 1e3 * (t1 - t0)
            extra["target_ms"] += 1e3 * (t2 - t1)
            extra["walk_ms"] += 1e3 * (t3 - t2)
            accepted.append(tree[end].depth)
            extra["nodes_per_verify"].append(len(incomplete))
            state, step = tree[end].state, tree[end].step
            if end in incomplete:
                logits = fresh[incomplete.index(end)]
        stats.steps += step + 1 if (state == ctx.mask_id).any() else step
        return root
