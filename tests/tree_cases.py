"""Known-answer draft trees, shared by the Python tree builder's test (test_spot.py) and the C++ one's
(test_cpp_host.py, through cpp/tests/tree_rules.cpp): one table, two implementations, answers written down.

A scripted proposer answers from a table: a state's candidate children (log-probability, child), best first;
states are strings of one-digit token ids. The cases put equal path log-probabilities under different parents, so
the tree depends on the stated order rule (docs/decisions.md, "Trees"): queue key (-path log-probability,
counter), nodes expanded together taken in key order. A host that took them in its heap's array order instead
(as CPython's heapq lays them out) builds another tree in the first case.

The answer of a case, line by line: each proposer call with the states it asked about ("call S S ..."), then each
node in tree order ("node STATE PARENT STEP CHILDREN", children as tree indices, "-" for none).
"""
from __future__ import annotations

import numpy as np

# the tree of the two lookahead cases, whatever the lookahead
LOOKAHEAD_TREE = ["node 999 -1 0 1,3",
                  "node 199 0 1 2,5",
                  "node 119 1 2 4",
                  "node 919 0 1 -",
                  "node 111 2 3 -",
                  "node 191 1 2 -"]

# (name, settings, proposals, answer); settings: budget, depth, lookahead, mask id, root step, root state
TREE_CASES = [
    ("equal keys under two parents: the first node expanded pushes first",
     dict(budget=8, depth=4, lookahead=0, mask=9, root_step=0, root="9999"),
     {"9999": [(0.0, "9909"), (0.0, "0999")],
      "0999": [(-0.5, "0909"), (-0.5, "0991")],
      "0991": [(0.0, "0911")],
      "0911": [(-0.5, "0111")],
      "0909": [(0.0, "0109")],
      "0109": [(-0.5, "0101")],
      "9909": [(-0.5, "9009"), (-0.5, "9900")],
      "9900": [(-0.5, "0900")],
      "0900": [(-0.5, "0100")],
      "9009": [(-0.5, "0009")],
      "0009": [(-0.5, "0000")]},
     ["call 9999",
      "call 9909 0999",
      "call 9009 9900 0909 0991",
      "node 9999 -1 0 1,2",
      "node 9909 0 1 3,4",
      "node 0999 0 1 5,6",
      "node 9009 1 2 -",
      "node 9900 1 2 -",
      "node 0909 2 2 7",
      "node 0991 2 2 -",
      "node 0109 5 3 -"]),
    ("without lookahead: one call per node expanded",
     dict(budget=6, depth=3, lookahead=0, mask=9, root_step=0, root="999"),
     {"999": [(-0.25, "199"), (-1.0, "919")],
      "199": [(-0.25, "119"), (-1.0, "191")],
      "919": [(-0.25, "911")],
      "119": [(-0.5, "111")]},
     ["call 999",
      "call 199",
      "call 119",
      "call 919"] + LOOKAHEAD_TREE),
    ("proposing ahead for the best queued candidates: the same tree in fewer calls",
     dict(budget=6, depth=3, lookahead=2, mask=9, root_step=0, root="999"),
     None,     # the previous case's proposals
     ["call 999",
      "call 199 919",
      "call 119 191"] + LOOKAHEAD_TREE),
    ("two commit orders reach one state: one node with two parents, the freed slot to the next best",
     dict(budget=5, depth=3, lookahead=0, mask=9, root_step=2, root="999"),
     {"999": [(-0.25, "199"), (-0.5, "919")],
      "199": [(-0.25, "119"), (-1.0, "191")],
      "919": [(0.0, "119")],
      "119": [(-0.5, "111")]},
     ["call 999",
      "call 199",
      "call 919 119",
      "node 999 -1 2 1,2",
      "node 199 0 3 3",
      "node 919 0 3 3",
      "node 119 1 4 4",
      "node 111 3 5 -"]),
    ("nodes at the depth limit and complete nodes are never expanded",
     dict(budget=8, depth=2, lookahead=0, mask=9, root_step=0, root="999"),
     {"999": [(-0.5, "199"), (-0.5, "919"), (-2.0, "111")],
      "199": [(0.0, "119")],
      "919": [(-1.0, "911")],
      "119": [(0.0, "111")]},
     ["call 999",
      "call 199 919",
      "node 999 -1 0 1,2,5",
      "node 199 0 1 3",
      "node 919 0 1 4",
      "node 119 1 2 -",
      "node 911 2 2 -",
      "node 111 0 1 -"]),
]


def case_proposals(index: int) -> dict:
    """A case's proposal table (a case with None reuses the previous one's)."""
    while TREE_CASES[index][2] is None:
        index -= 1
    return TREE_CASES[index][2]


def input_lines(index: int) -> list[str]:
    """The case as cpp/tests/tree_rules.cpp reads it."""
    _, s, _, _ = TREE_CASES[index]
    lines = [f"tree {s['budget']} {s['depth']} {s['lookahead']} {s['mask']} {s['root_step']} {s['root']}"]
    for state, cands in case_proposals(index).items():
        lines.append(" ".join(["propose", state, *(f"{lp!r} {child}" for lp, child in cands)]))
    return lines + ["end"]


class ScriptedProposer:
    """spot.runtime.tree's Proposer answering from a case's table, recording its calls."""

    def __init__(self, proposals: dict, lookahead: int):
        self.proposals, self.lookahead, self.calls = proposals, lookahead, []

    def propose(self, tree, nodes):
        asked = [state_text(tree[i].state) for i in nodes]
        self.calls.append("call " + " ".join(asked))
        return [[(lp, state_array(child)) for lp, child in self.proposals.get(s, [])] for s in asked]


def state_text(state) -> str:
    return "".join(str(int(v)) for v in state)


def state_array(text: str) -> np.ndarray:
    return np.array([int(c) for c in text], dtype=np.int64)


def python_answer(index: int) -> list[str]:
    """The case through spot.runtime.tree.build_tree, in the answer's lines."""
    from spot.runtime.tree import build_tree
    _, s, _, _ = TREE_CASES[index]
    proposer = ScriptedProposer(case_proposals(index), s["lookahead"])
    tree = build_tree(state_array(s["root"]), s["root_step"], proposer, s["budget"], s["depth"], s["mask"],
                      s["lookahead"])
    return proposer.calls + [f"node {state_text(n.state)} {n.parent} {n.step} "
                             + (",".join(map(str, n.children)) or "-") for n in tree]
