"""Draft trees for a SPOT round: nodes are full block states; best-first growth under a node budget and a depth.

The builder asks a proposer for each node's candidate children (log-probability, child state) and grows the tree in
order of path probability; a state reached by two commit orders is one node with two parents (verified once).
Candidates of many nodes are requested in one batch: a node's children are only needed once the node's own path
probability (an upper bound on its children's) reaches the top of the queue, and then every pending node is expanded
together — exact best-first order. With a lookahead the same call also proposes for the best queued candidates
before they enter the tree (most do): the tree is unchanged, the drafter is called about half as often at 16 nodes.

Order rule (docs/decisions.md, the same in the C++ host): every queue entry has the total key (-path log-probability,
counter), the counter numbering entries in the order they are pushed. The queue pops the smallest key; the nodes
expanded together are taken in ascending key order, and their candidates are pushed in that order, each node's best
first. The heap's internal layout never decides anything (tests/test_cpp_host.py: known-answer trees, both hosts).
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np


@dataclass
class Node:
    state: np.ndarray            # [B] int64 block state (mask id at undecided positions)
    parent: int                  # index of the parent node, -1 for the root
    depth: int                   # 0 for the root
    step: int                    # commit step F applies at this node: m + 1 + depth
    logp: float = 0.0            # path log-probability under the proposer
    children: list[int] = field(default_factory=list)


class Proposer(Protocol):
    lookahead: int     # build_tree's lookahead for this proposer: > 0 where one call costs more than one node

    def propose(self, tree: list[Node], nodes: list[int]) -> list[list[tuple[float, np.ndarray]]]:
        """For each index in `nodes`, candidate children of tree[index] as (log-probability, child state), best
        first. Children of one node must be pairwise distinct states that differ from the node. `tree` may be
        build_tree's batch of nodes rather than the tree itself: read a node's state, step and depth only."""


def build_tree(root_state: np.ndarray, root_step: int, proposer: Proposer, budget: int, max_depth: int,
               mask_id: int, lookahead: int = 0, merge: bool = True) -> list[Node]:
    """Grow a tree of at most `budget` nodes (root included) and depth <= max_depth, best path probability first.
    Nodes without masks get no children (the block is complete there).

    lookahead: per proposer call, also propose for up to this many of the best queued candidate children that could
    still enter the tree (their proposals are kept until they do). The tree is the same for any lookahead; a
    proposer with a per-call cost (one ONNX Runtime call) makes fewer, larger calls.
    merge: a candidate whose (state, step) is already a node — the same commits reached in another order — is
    linked to that node instead of added (a node may then have several parents; the walk only follows children).
    Its logits would be the same, so verifying it twice wastes a slot of the budget that a new state can use.
    Equal states at different steps stay apart: F and the noise depend on the step."""
    tree = [Node(root_state, -1, 0, root_step)]
    index_of = {(root_state.tobytes(), root_step): 0}
    counter = 0
    heap: list = []  # (-logp, tiebreak, kind, payload): kind 0 = node awaiting expansion, 1 = candidate child
    prefetched: dict[int, list] = {}    # candidate tiebreak -> its proposals, computed before it entered the tree
    key_of: dict[int, int] = {}         # tree index -> tiebreak of the candidate it came from

    def expandable(depth: int, state: np.ndarray) -> bool:
        return depth < max_depth and bool((state == mask_id).any())

    def speculative(limit: int) -> list:
        """The best queued candidates that could still enter the tree and would be expanded there."""
        cands = heapq.nsmallest(limit, (h for h in heap if h[2] == 1))
        out = []
        for _, tiebreak, _, (parent, logp, child) in cands:
            p = tree[parent]
            merged = merge and (child.tobytes(), p.step + 1) in index_of     # will be linked, not expanded
            if tiebreak not in prefetched and not merged and expandable(p.depth + 1, child):
                out.append((tiebreak, Node(child, parent, p.depth + 1, p.step + 1)))
        return out

    if expandable(0, root_state):
        heapq.heappush(heap, (0.0, counter, 0, 0))
    while heap and len(tree) < budget:
        neg, tiebreak, kind, payload = heapq.heappop(heap)
        if kind == 0:
            pending = [payload] + [p for (_, _, _, p) in sorted(h for h in heap if h[2] == 0)]   # key order
            heap = [h for h in heap if h[2] != 0]
            heapq.heapify(heap)
            ask = [i for i in pending if key_of.get(i) not in prefetched]
            extra = speculative(min(lookahead, budget - len(tree))) if lookahead and ask else []
            batch = [tree[i] for i in ask] + [node for _, node in extra]
            answers = proposer.propose(batch, list(range(len(batch)))) if batch else []
            fresh = dict(zip(ask, answers))
            prefetched.update((t, a) for (t, _), a in zip(extra, answers[len(ask):]))
            for i in pending:
                cands = fresh[i] if i in fresh else prefetched.pop(key_of[i])
                for logp, child in cands:
                    counter += 1
                    heapq.heappush(heap, (-(tree[i].logp + logp), counter, 1, (i, logp, child)))
            continue
        parent, logp, child = payload
        p = tree[parent]
        if merge:
            key = (child.tobytes(), p.step + 1)
            known = index_of.get(key)
            if known is not None:       # reached before by another commit order: link it, verify it once
                if known not in p.children:
                    p.children.append(known)
                continue
            index_of[key] = len(tree)
        tree.append(Node(child, parent, p.depth + 1, p.step + 1, p.logp + logp))
        key_of[len(tree) - 1] = tiebreak
        p.children.append(len(tree) - 1)
        if expandable(p.depth + 1, child):
            counter += 1
            heapq.heappush(heap, (neg, counter, 0, len(tree) - 1))
    return tree


def tree_states(tree: list[Node]) -> np.ndarray:
    """[N, B] int64: node states in tree order, root first (the verify batch)."""
    return np.stack([n.state for n in tree])
