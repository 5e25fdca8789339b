"""Proposers for SPOT trees: given tree nodes, candidate child states with log-probabilities (docs/spec.md §4-6).

A child commits what the proposer predicts F will commit at its parent: under the static rule one position, under
the threshold rule (SPOT-Sets) a whole set; its tokens are the coupled samples of the stale logits for the parent's
step. Proposers differ only in how they score positions:
- ConfidenceOrderProposer: stale confidence of the coupled sample (training-free; branch 1 = `chain`, FreeDave-style).
- DrafterProposer: the order model (spot.runtime.drafter) — `spot` / `spot-sets`; it also proposes runner-up
  coupled tokens (runner_up_alternatives), weighted by how narrowly they lost: a position's under the static rule,
  one set member's under the threshold rule.
- OracleProposer: reads the true standard trajectory, positions and tokens (diagnostic ceiling of the tree shape).
- OrderOracleProposer: reads only the true positions; tokens are the coupled samples like every drafter's
  (diagnostic ceiling of any order model proposing stale winners: what remains is the stale tokens' disagreement
  with the fresh ones, which DrafterProposer's runner-up children partly recover).
No proposer sees fresh logits; exactness never depends on what they propose.
"""
from __future__ import annotations

import math

import numpy as np

from spot.runtime import libm
from spot.runtime.stale import StaleView
from spot.runtime.step import STATIC, CommitRule
from spot.runtime.tree import Node

LOG_FLOOR = -30.0


class RoundInputs:
    """What every proposer may read in one round: the stale view, the rule, the mask id."""

    def __init__(self, stale: StaleView, rule: CommitRule, mask_id: int, block: int):
        self.stale, self.rule, self.mask_id, self.block = stale, rule, mask_id, block


def child_with(state: np.ndarray, positions: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    child = state.copy()
    child[positions] = tokens[positions]
    return child


def position_candidates(node: Node, logq: np.ndarray, tokens: np.ndarray, mask_id: int, branch: int,
                        runner_up: tuple[np.ndarray, np.ndarray] | None = None) -> list[tuple[float, np.ndarray]]:
    """Static rule: one child per top-`branch` masked position. logq [B] log P(next commit = i), tokens [B].

    runner_up: (tokens [B], log weights [B]) from runner_up_alternatives, or None: each of those positions also gets
    the child committing its runner-up token, weighted logq + log weight (skipped where the weight is -inf).
    Children are returned best first (stable: a position's main child before its runner-up)."""
    masked = np.flatnonzero(node.state == mask_id)
    order = masked[np.argsort(-logq[masked], kind="stable")][:branch]
    out = []
    for p in order:
        out.append((float(max(logq[p], LOG_FLOOR)), child_with(node.state, np.array([p]), tokens)))
        if runner_up is not None and runner_up[1][p] > -np.inf:
            out.append((float(max(logq[p] + runner_up[1][p], LOG_FLOOR)),
                        child_with(node.state, np.array([p]), runner_up[0])))
    out.sort(key=lambda c: -c[0])           # stable
    return out


def runner_up_alternatives(stale, step: int, weight: float, mask_id: int) -> tuple[np.ndarray, np.ndarray] | None:
    """The runner-up coupled tokens [B] of `step` and their log weights [B] = log(weight) - gap, -inf where there is
    none or it is the mask id (that child would equal its parent; decoders exclude the mask id from sampling
    anyway); or None at weight 0. The target's fresh sample is the stale
    runner-up mostly where the stale winner won by little: exp(-gap) is the stale probability ratio runner-up /
    winner at T = 0, and the perturbed-score ratio at T > 0; `weight` (drafter.json `runner_up_weight`) scales it."""
    if weight <= 0:
        return None
    tokens, gap = stale.runner_up(step)
    return tokens, np.where(tokens == mask_id, -np.inf, math.log(weight) - gap)


def set_candidates(node: Node, member_p: np.ndarray, best: int, tokens: np.ndarray, mask_id: int, branch: int,
                   runner_up: tuple[np.ndarray, np.ndarray] | None = None,
                   flip_weight: float = 1.0) -> list[tuple[float, np.ndarray]]:
    """Threshold rule: the predicted set {i : P(i in S) > 0.5} (or the single best position when empty), then up to
    `branch - 1` alternatives, best first (ties: a flip before a swap):
    - flips: the set with its least certain position flipped; log-probability under independence + log flip_weight
      (none at 0);
    - swaps, with runner_up (tokens [B], log weights [B] from runner_up_alternatives): the same set with one member
      committing its runner-up token; log-probability of the set + that log weight (skipped at -inf). A
      whole-set proposal fails on any stale token the fresh sample changed.
    member_p [B] in (0, 1)."""
    masked = np.flatnonzero(node.state == mask_id)
    p = np.clip(member_p[masked], 1e-6, 1 - 1e-6)
    floor = LOG_FLOOR * len(masked)

    def logp_of(chosen: np.ndarray) -> float:
        return float(np.where(chosen, libm.log(p), libm.log1p(-p)).sum())    # the C library's, as the C++ host

    base = p > 0.5
    if not base.any():
        base = masked == best
    base_logp, base_child = logp_of(base), child_with(node.state, masked[base], tokens)
    flips = []
    if flip_weight > 0:
        for j in np.argsort(np.abs(p - 0.5), kind="stable"):
            if len(flips) >= branch - 1:
                break
            flipped = base.copy()
            flipped[j] = not flipped[j]
            if flipped.any():
                flips.append((logp_of(flipped) + math.log(flip_weight), child_with(node.state, masked[flipped],
                                                                                   tokens)))
    swaps = []
    if runner_up is not None:
        for i in masked[base]:
            if runner_up[1][i] > -np.inf:
                child = base_child.copy()
                child[i] = runner_up[0][i]
                swaps.append((base_logp + float(runner_up[1][i]), child))
        swaps.sort(key=lambda c: -c[0])     # stable
    out = [(max(base_logp, floor), base_child)]
    out += [(max(logp, floor), child) for logp, child in merged_best_first(flips, swaps, branch - 1)]
    return out


def merged_best_first(a: list, b: list, n: int) -> list:
    """The first n of two lists of (log-probability, child), each best first, merged best first (ties: a's first)."""
    out, i, j = [], 0, 0
    while len(out) < n and (i < len(a) or j < len(b)):
        if j >= len(b) or (i < len(a) and a[i][0] >= b[j][0]):
            out.append(a[i])
            i += 1
        else:
            out.append(b[j])
            j += 1
    return out


class ConfidenceOrderProposer:
    """Order positions by the stale confidence of their coupled sample (no learned model)."""

    lookahead = 0      # per node numpy work: nothing to gain from larger batches

    def __init__(self, branch: int = 1, sharpness: float = 8.0):
        self.branch, self.sharpness = branch, sharpness
        self.round: RoundInputs | None = None

    def begin_round(self, round_inputs: RoundInputs, state: np.ndarray, step: int) -> None:
        self.round = round_inputs

    def propose(self, tree: list[Node], nodes: list[int]) -> list[list[tuple[float, np.ndarray]]]:
        r = self.round
        out = []
        for i in nodes:
            node = tree[i]
            tokens, conf = r.stale.coupled(node.step)
            masked = node.state == r.mask_id
            if r.rule.kind == STATIC:
                score = np.where(masked, self.sharpness * libm.log(np.maximum(conf, 1e-30)), -np.inf)
                logq = score - np.logaddexp.reduce(score[masked])
                out.append(position_candidates(node, logq, tokens, r.mask_id, self.branch))
            else:
                member = 1.0 / (1.0 + libm.exp(-self.sharpness * 4 * (conf - r.rule.tau)))
                best = int(np.argmax(np.where(masked, conf, -np.inf)))
                out.append(set_candidates(node, member, best, tokens, r.mask_id, self.branch))
        return out


class OracleProposer:
    """Diagnostic: proposes the true next state, read from a standard decoding trajectory of the same request.

    trajectories: block index -> list of states [s_0, s_1, ..., s_k] of standard decoding (s_t before step t)."""

    lookahead = 0

    def __init__(self, trajectories: dict[int, list[np.ndarray]]):
        self.trajectories = trajectories
        self.round: RoundInputs | None = None

    def begin_round(self, round_inputs: RoundInputs, state: np.ndarray, step: int) -> None:
        self.round = round_inputs

    def propose(self, tree: list[Node], nodes: list[int]) -> list[list[tuple[float, np.ndarray]]]:
        traj = self.trajectories.get(self.round.block, [])
        out = []
        for i in nodes:
            node = tree[i]
            t = node.step
            on_path = t + 1 < len(traj) and np.array_equal(traj[t], node.state)
            # off the true trajectory nothing below can be accepted
            out.append([(0.0, self.child(node, traj[t], traj[t + 1]))] if on_path else [])
        return out

    def child(self, node: Node, now: np.ndarray, nxt: np.ndarray) -> np.ndarray:
        """The proposal for an on-trajectory node (state == now [B]; standard decoding goes on to nxt [B])."""
        return nxt.copy()


class OrderOracleProposer(OracleProposer):
    """Diagnostic: commits the positions standard decoding commits next (read from its trajectory) with the stale
    view's coupled tokens. An order model proposing stale winners proposes exactly these children at best, so
    SPOT's gap to this decoder is the drafter's, and this decoder's gap to `oracle` is the stale tokens': once a
    stale sample differs from the fresh one, no such proposal is accepted (SPOT's runner-up children recover some)."""

    def child(self, node: Node, now: np.ndarray, nxt: np.ndarray) -> np.ndarray:
        return child_with(node.state, np.flatnonzero(nxt != now), self.round.stale.coupled(node.step)[0])
