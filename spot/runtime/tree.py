"""Draft trees for a SPOT round: nodes are full block states; best-first growth under a node budget and a depth.

The builder asks a proposer for each node's candidate children (log-probability, child state) and grows the tree in
order of path probability. Candidates of many nodes are requested in one batch: a node's children are only needed
once the node's own path probability (an upper bound on its children's) reaches the top of the queue, and then every
pending node is expanded together — exact best-first order, few drafter calls.
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
    def propose(self, tree: list[Node], nodes: list[int]) -> list[list[tuple[float, np.ndarray]]]:
        """For each node index, candidate children as (log-probability, child state), best first.
        Children of one node must be pairwise distinct states that differ from the node."""


def build_tree(root_state: np.ndarray, root_step: int, proposer: Proposer, budget: int, max_depth: int,
               mask_id: int) -> list[Node]:
    """Grow a tree of at most `budget` nodes (root included) and depth <= max_depth, best path probability first.
    Nodes without masks get no children (the block is complete there)."""
    tree = [Node(root_state, -1, 0, root_step)]
    counter = 0
    heap: list = []  # (-logp, tiebreak, kind, payload): kind 0 = node awaiting expansion, 1 = candidate child

    def can_expand(i: int) -> bool:
        return tree[i].depth < max_depth and bool((tree[i].state == mask_id).any())

    if can_expand(0):
        heapq.heappush(heap, (0.0, counter, 0, 0))
    while heap and len(tree) < budget:
        neg, _, kind, payload = heapq.heappop(heap)
        if kind == 0:
            pending = [payload] + [p for (_, _, k, p) in heap if k == 0]
            heap = [h for h in heap if h[2] != 0]
            heapq.heapify(heap)
            for i, cands in zip(pending, proposer.propose(tree, pending)):
                for logp, child in cands:
                    counter += 1
                    heapq.heappush(heap, (-(tree[i].logp + logp), counter, 1, (i, logp, child)))
            continue
        parent, logp, child = payload
        p = tree[parent]
        tree.append(Node(child, parent, p.depth + 1, p.step + 1, p.logp + logp))
        p.children.append(len(tree) - 1)
        if can_expand(len(tree) - 1):
            counter += 1
            heapq.heappush(heap, (neg, counter, 0, len(tree) - 1))
    return tree


def tree_states(tree: list[Node]) -> np.ndarray:
    """[N, B] int64: node states in tree order, root first (the verify batch)."""
    return np.stack([n.state for n in tree])
