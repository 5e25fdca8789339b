"""The decoders by name and their traits: the one table every host, CLI, bench, server and report reads.

A decoder is one row of REGISTRY (a Decoder): its commit rule (the request's mode, or always the threshold rule),
whether it speculates (verify rounds over a draft tree sized by a TreeBudget; otherwise one target pass per commit
step: an exact baseline), how its proposer is built, whether that proposer reads a drafter (the order model),
whether `spot tune` tunes its budget, whether it is a ceiling (it reads the answer: a bound, not a decoder to use),
and whether the C++ host implements it (tests/test_decoder_registry.py holds cpp/src to that).

Adding a decoder: a proposer (spot/runtime/proposers.py or your own module) and a row here; nothing else names it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from spot.errors import SpotError
from spot.runtime.engine import Engine
from spot.runtime.proposers import ConfidenceOrderProposer, OracleProposer, OrderOracleProposer
from spot.runtime.spot import TreeBudget
from spot.runtime.step import STATIC, THRESHOLD, CommitRule

TREE_BRANCH = 4     # the tree decoder's candidates per node

# the decoder whose output a decoder under each commit rule reproduces token for token (and is measured against)
EXACT_BASELINES = {STATIC: "standard", THRESHOLD: "threshold"}


@dataclass(frozen=True)
class ProposerInputs:
    """What a proposer factory may read: the engine, the prompt, the checked drafter (drafting decoders only), the
    verified tree budget (a drafter's calibrated tree shape is per budget) and standard_run(observer): standard decoding of the same request with an observer of its steps (decode.generate's;
    the ceilings read the true trajectory from it, at the cost of a standard run first)."""

    engine: Engine
    prompt_ids: object
    drafter: object | None
    standard_run: Callable[[Callable], object]
    budget: TreeBudget


@dataclass(frozen=True)
class Decoder:
    """One decoder's traits. proposer: ProposerInputs -> a tree proposer (spot.runtime.tree.build_tree's), None for a
    decoder that does not speculate; rule: THRESHOLD for a decoder that always commits by threshold, None for one
    that follows the request's mode; nodes_from_depth: the tree is a chain, one node per depth (its budget's nodes
    are its depth + 1, whatever --budget says)."""

    name: str
    summary: str                      # what it is, in a few words (CLI help)
    proposer: Callable[[ProposerInputs], object] | None = None
    rule: str | None = None
    drafts: bool = False
    tunable: bool = False
    ceiling: bool = False
    nodes_from_depth: bool = False
    in_cpp_host: bool = False

    @property
    def speculates(self) -> bool:
        """Verify rounds over draft trees (a TreeBudget sizes them), not one target pass per commit step."""
        return self.proposer is not None

    def rule_kind(self, mode: str) -> str:
        """The kind of rule it commits by for a request of `mode`."""
        return self.rule or mode

    def baseline(self, mode: str) -> str:
        """The decoder whose output it reproduces token for token for a request of `mode` (and is measured against):
        standard under the static rule, threshold under the threshold rule (a baseline is its own)."""
        return exact_baseline(self.rule_kind(mode))

    def commit_rule(self, mode: str, tau: float) -> CommitRule:
        """The rule it commits by for a request of `mode` and `tau` (SpotError for a bad mode or tau)."""
        return CommitRule(self.rule_kind(mode), tau)

    def verified_budget(self, budget: TreeBudget, engine: Engine) -> TreeBudget:
        """The budget it verifies with on `engine`: the depth resolved, a chain's nodes its depth + 1."""
        budget = budget.resolve(engine)
        return TreeBudget(budget.depth + 1, budget.depth) if self.nodes_from_depth else budget


def exact_baseline(rule_kind: str) -> str:
    """The decoder a decoder committing by `rule_kind` must reproduce (and is measured against)."""
    return EXACT_BASELINES[rule_kind]


def record_trajectories(trajectories: dict[int, list[np.ndarray]]):
    """An observer for generate() that stores each block's standard trajectory [s_0, s_1, ..., s_k]."""
    def observe(block, step, state, outputs, nxt):
        traj = trajectories.setdefault(block, [state.copy()])
        traj.append(nxt.copy())
    return observe


def trajectory_proposer(kind) -> Callable[[ProposerInputs], object]:
    """A ceiling's factory: standard decoding first, its trajectory recorded, then `kind` reading it."""
    def build(inputs: ProposerInputs):
        trajectories: dict[int, list[np.ndarray]] = {}
        inputs.standard_run(record_trajectories(trajectories))
        return kind(trajectories)
    return build


def drafter_proposer(inputs: ProposerInputs):
    return inputs.drafter.proposer(nodes=inputs.budget.nodes)      # the tree shape calibrated for this budget


REGISTRY: dict[str, Decoder] = {}


def register(decoder: Decoder) -> Decoder:
    """Add a decoder to the table (SpotError for a name taken or a trait it cannot have)."""
    if not isinstance(decoder, Decoder):
        raise SpotError(f"register takes a Decoder, got {type(decoder).__name__}")
    if not decoder.name or decoder.name in REGISTRY:
        raise SpotError(f"decoder name {decoder.name!r} is empty or taken", "give the decoder a new name")
    if decoder.rule not in (None, *EXACT_BASELINES):
        raise SpotError(f"decoder {decoder.name!r}: rule must be None or one of {', '.join(EXACT_BASELINES)}, "
                        f"got {decoder.rule!r}")
    if not decoder.speculates and (decoder.drafts or decoder.tunable or decoder.ceiling or decoder.nodes_from_depth):
        raise SpotError(f"decoder {decoder.name!r} drafts, tunes, reads the answer or sizes a chain but builds no "
                        "proposer", "give it a proposer factory")
    REGISTRY[decoder.name] = decoder
    return decoder


for _decoder in (
        Decoder("standard", "one target pass per commit step", in_cpp_host=True),
        Decoder("threshold", "one target pass per commit step, threshold rule", rule=THRESHOLD, in_cpp_host=True),
        Decoder("chain", "SPOT with the training-free order, one candidate per depth",
                lambda inputs: ConfidenceOrderProposer(branch=1), nodes_from_depth=True, in_cpp_host=True),
        Decoder("tree", "SPOT with the training-free order, a tree",
                lambda inputs: ConfidenceOrderProposer(branch=TREE_BRANCH), tunable=True, in_cpp_host=True),
        Decoder("oracle", "a diagnostic ceiling reading the true states", trajectory_proposer(OracleProposer),
                ceiling=True),
        Decoder("order-oracle", "a diagnostic ceiling reading the true positions (stale tokens, as a drafter's)",
                trajectory_proposer(OrderOracleProposer), ceiling=True),
        Decoder("spot", "SPOT with the drafter", drafter_proposer, drafts=True, tunable=True, in_cpp_host=True),
        Decoder("spot-sets", "SPOT-Sets with the drafter, threshold rule", drafter_proposer, rule=THRESHOLD,
                drafts=True, tunable=True, in_cpp_host=True)):
    register(_decoder)
del _decoder


def decoder(name: str) -> Decoder:
    """The decoder `name` (SpotError naming the known ones otherwise)."""
    if not isinstance(name, str) or name not in REGISTRY:
        raise SpotError(f"unknown decoder {name!r}, expected one of {', '.join(REGISTRY)}")
    return REGISTRY[name]


def decoder_names(**traits) -> tuple[str, ...]:
    """The decoders' names in table order, those whose traits equal `traits` (e.g. drafts=True, ceiling=False)."""
    return tuple(name for name, d in REGISTRY.items() if all(getattr(d, t) == v for t, v in traits.items()))


def is_decoder(name, **traits) -> bool:
    """Whether `name` (e.g. a row of an old report) names a decoder with `traits`."""
    return isinstance(name, str) and name in decoder_names(**traits)
