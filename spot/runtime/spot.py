"""The SPOT round (docs/spec.md §4) and SPOT-Sets (§5) as a block decoder for spot.runtime.decode.generate.

Round: free root r = F_m(s_m) from the known logits; a draft tree rooted at r; ONE target pass over every incomplete
node (nodes on the batch axis); walk from the root to the child equal to F of the node's fresh logits. Output equals
standard decoding with the same seed whatever the proposer does, because every accepted node is F of its parent.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from spot.errors import SpotError, integer_arg
from spot.runtime.decode import DecodeContext, standard_block, state_pass
from spot.runtime.engine import Engine
from spot.runtime.proposers import RoundInputs
from spot.runtime.stats import timed
from spot.runtime.tree import build_tree


DEFAULT_DEPTH = 8      # a budget's depth unless given, capped at the block size (SDAR's B = 4: 4)


@dataclass(frozen=True)
class TreeBudget:
    nodes: int = 16           # verify batch size N (root included)
    depth: int | None = None  # deepest node below the root; None: DEFAULT_DEPTH, or the block size if smaller

    def __post_init__(self):
        integer_arg(self.nodes, "budget nodes")
        if self.depth is not None:
            integer_arg(self.depth, "tree depth")

    def resolve(self, engine: Engine) -> "TreeBudget":
        """This budget with its depth filled in for `engine` (the C API's depth 0 and the CLI's default alike)."""
        if self.depth is not None:
            return self
        return TreeBudget(self.nodes, min(DEFAULT_DEPTH, engine.block_size))

    def check(self, engine: Engine) -> None:
        """SpotError unless `engine` can verify trees of this budget: depth within the block and, for an engine that
        samples on the device, within its epilogue's future steps (a one-node tree runs the standard loop)."""
        self = self.resolve(engine)
        if not 1 <= self.depth <= engine.block_size:      # first: a chain's node count is its depth + 1
            raise SpotError(f"depth must be in 1..{engine.block_size} (the block size), got {self.depth}",
                            "the deepest tree node below the root, e.g. "
                            f"`depth={min(DEFAULT_DEPTH, engine.block_size)}` (TreeBudget(nodes, depth))")
        if self.nodes < 1:
            raise SpotError(f"budget must be >= 1 node, got {self.nodes}",
                            "the states one verify pass checks, the root included, e.g. `nodes=16` (TreeBudget(nodes))")
        if self.nodes > engine.max_nodes:
            raise SpotError(f"budget {self.nodes} nodes exceeds the {engine.max_nodes} states one verify pass of this "
                            "engine takes (the export's max_nodes)",
                            "use a smaller budget (`nodes`), or re-export with a larger max_nodes "
                            "(`spot-export --max-nodes N`)")
        if self.nodes > 1 and engine.sampler_depth is not None and self.depth > engine.sampler_depth:
            raise SpotError(f"tree depth {self.depth} exceeds the {engine.sampler_depth} future steps the engine's "
                            "device sampling epilogue provides",
                            f"use `depth` <= {engine.sampler_depth} (budgets NODESx{engine.sampler_depth} or less), "
                            "`sampler=\"host\"`, or re-export with more epilogue steps (`spot-export "
                            "--epilogue-steps N`)")

    def fits(self, engine: Engine) -> bool:
        try:
            self.check(engine)
        except SpotError:
            return False
        return True


def verify(engine: Engine, tree, block: int, ctx: DecodeContext) -> dict:
    """ONE target pass over every incomplete node of the tree (nodes on the batch axis): tree index -> that node's
    spot.runtime.outputs (complete nodes end the block: nothing to verify)."""
    incomplete = [i for i, n in enumerate(tree) if (n.state == ctx.mask_id).any()]
    outputs = engine.block_outputs(np.stack([tree[i].state for i in incomplete]), [tree[i].step for i in incomplete],
                                   ctx.sampling, block, ctx.noise)
    return dict(zip(incomplete, outputs))


def walk(tree, node_outputs: dict, ctx: DecodeContext) -> tuple[int, np.ndarray]:
    """From the root, follow the child equal to F of the node's fresh outputs. Returns (end node, F(end node)).

    node_outputs: tree index -> spot.runtime.outputs of that node's verify pass (incomplete nodes only)."""
    u = 0
    while True:
        node = tree[u]
        nxt = node_outputs[u].next_state(node.state, ctx.mask_id, ctx.rule)
        match = next((c for c in node.children if np.array_equal(tree[c].state, nxt)), None)
        if match is None:
            return u, nxt
        u = match
        if u not in node_outputs:          # a complete node: the block is finished there
            return u, tree[u].state


class SpotBlockDecoder:
    """Callable BlockDecoder; `proposer` has begin_round(RoundInputs, state, step), propose(tree, nodes) and
    lookahead (spot.runtime.tree.build_tree). budget: with its depth, checked against the engine once before the
    decode (TreeBudget.check; spot.runtime.decode_plan.plan_decode), not per block."""

    def __init__(self, proposer, budget: TreeBudget, independent_noise: bool = False):
        if not isinstance(budget, TreeBudget) or budget.depth is None:
            raise SpotError(f"SpotBlockDecoder needs a budget with its depth, got {budget!r}",
                            "budget.resolve(engine), then budget.check(engine)")
        self.proposer, self.budget, self.independent_noise = proposer, budget, independent_noise

    def __call__(self, engine: Engine, state: np.ndarray, block: int, ctx: DecodeContext) -> np.ndarray:
        if self.budget.nodes == 1:
            # a one-node tree is its root alone: every round is one standard step (the same passes and tokens), so
            # run the standard loop without the round's bookkeeping (~0.1 ms a step, 4-5% of an embedded-model
            # step on ORT CPU) — what `spot tune` picks where verifying more nodes does not pay
            return standard_block(engine, state, block, ctx)
        record = ctx.stats.verify_record()
        step = 0
        current = state_pass(engine, state, step, block, ctx)
        root = current.next_state(state, ctx.mask_id, ctx.rule)     # the free root: F of the known logits
        while (root == ctx.mask_id).any():
            # one round: draft a tree rooted at the free root, verify it in ONE pass, walk it (each step timed)
            tree, draft_ms = timed(self.draft, root, current, state, step, block, ctx)
            fresh, target_ms = timed(verify, engine, tree, block, ctx)
            ctx.stats.passes["verify"] += 1
            (end, root), walk_ms = timed(walk, tree, fresh, ctx)
            record.add_round(tree[end].depth, len(fresh), draft_ms, target_ms, walk_ms)
            state, step = tree[end].state, tree[end].step
            if ctx.noise is not None:   # later rounds sample steps > step only
                ctx.noise.forget_before(step + 1)
            current = fresh.get(end, current)      # (a complete end node finishes the block)
            del fresh       # a device sampler's unread outputs hold the pass's logits on the device: not into the next
        ctx.stats.steps += step + 1 if (state == ctx.mask_id).any() else step
        return root

    def draft(self, root: np.ndarray, current, state: np.ndarray, step: int, block: int, ctx: DecodeContext):
        """The round's draft tree rooted at the free root: the proposer reads the stale view of `state`'s outputs
        (`current`), never the fresh logits of the nodes."""
        stale = current.stale(state == ctx.mask_id, self.independent_noise)
        self.proposer.begin_round(RoundInputs(stale, ctx.rule, ctx.mask_id, block), state, step)
        return build_tree(root, step + 1, self.proposer, self.budget.nodes, self.budget.depth, ctx.mask_id,
                          self.proposer.lookahead)
