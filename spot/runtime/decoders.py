"""The decoders by name, as `spot generate --decoder` and `spot bench` expose them.

standard / threshold: docs/spec.md §3 with the static / threshold rule (one target pass per step).
chain / tree: SPOT with the training-free stale-confidence order (branch 1 = FreeDave-style chain, branch k = tree).
oracle: SPOT whose proposer reads the true standard trajectory (a diagnostic ceiling, costs a standard run first).
order-oracle: the same, but only the true positions; tokens are the coupled stale samples like a drafter's (the
  ceiling of any order model proposing the stale winners: spot -> order-oracle is the drafter's gap, order-oracle ->
  oracle the stale tokens'; spot's runner-up children win back part of the latter).
spot / spot-sets: SPOT with the learned order model (static rule / threshold rule with whole-set verification).
standard, chain, tree, oracle and spot follow the commit rule given (static unless mode is threshold).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from spot.errors import SpotError, integer_arg
from spot.runtime.decode import (Generation, check_engine, check_max_new_tokens, generate, standard_block,
                                 stop_id_tuple)
from spot.runtime.engine import Engine
from spot.runtime.proposers import ConfidenceOrderProposer, OracleProposer, OrderOracleProposer
from spot.runtime.spot import SpotBlockDecoder, TreeBudget
from spot.runtime.step import STATIC, THRESHOLD, CommitRule, Sampling

DECODERS = ("standard", "threshold", "chain", "tree", "oracle", "order-oracle", "spot", "spot-sets")
BASELINE_DECODERS = ("standard", "threshold")      # one target pass per commit step: no tree
TREE_DECODERS = tuple(d for d in DECODERS if d not in BASELINE_DECODERS)   # verify rounds: --budget / --depth size
CEILING_DECODERS = ("oracle", "order-oracle")     # read the true trajectory: bounds for a drafter, not decoders to use
TREE_BRANCH = 4


@dataclass(frozen=True)
class DecodeRequest:
    """What to decode, for run_decoder. max_new_tokens: the most ids returned (generation runs to the block boundary
    covering prompt + max_new_tokens: Generation.overflow_ids is the rest of the last block); mode: the commit rule
    of standard / chain / tree / spot (threshold and spot-sets always use the threshold rule), tau its threshold;
    budget: tree decoders only (a chain's nodes are its depth + 1); stop_ids: None = the model's stop ids, () = none.
    """

    max_new_tokens: int = 64
    mode: str = STATIC
    tau: float = 0.9
    sampling: Sampling = Sampling()
    budget: TreeBudget = TreeBudget()
    stop_ids: tuple[int, ...] | None = None
    independent_noise: bool = False   # ablation: proposals use noise unrelated to the target's (docs/spec.md §7)

    def __post_init__(self):
        check_max_new_tokens(integer_arg(self.max_new_tokens, "max_new_tokens"))      # now, not when decoding
        if not isinstance(self.independent_noise, bool):      # a truthy string turned the ablation on
            raise SpotError(f"independent_noise must be True or False, got {self.independent_noise!r}")
        for name, kind in (("sampling", Sampling), ("budget", TreeBudget)):
            if not isinstance(getattr(self, name), kind):
                raise SpotError(f"DecodeRequest.{name} must be a {kind.__name__}, got {getattr(self, name)!r}",
                                f"e.g. {name}={kind.__name__}(...)")
        CommitRule(self.mode, self.tau)         # an unknown mode or a tau outside [0, 1) now, not mid-decode
        # (frozen: a generator is read once, here)
        object.__setattr__(self, "stop_ids", stop_id_tuple(self.stop_ids))


def check_decoder(name: str) -> None:
    """SpotError unless `name` is a decoder (checked by run_decoder, and by a server before a request queues)."""
    if not isinstance(name, str) or name not in DECODERS:
        raise SpotError(f"unknown decoder {name!r}, expected one of {', '.join(DECODERS)}")


def rule_for(decoder: str, req: DecodeRequest) -> CommitRule:
    """threshold / spot-sets always use the threshold rule; every other decoder follows the request's mode."""
    if decoder in ("threshold", "spot-sets"):
        return CommitRule(THRESHOLD, req.tau)
    return CommitRule(req.mode, req.tau)


def record_trajectories(trajectories: dict[int, list[np.ndarray]]):
    """An observer for generate() that stores each block's standard trajectory [s_0, s_1, ..., s_k]."""
    def observe(block, step, state, outputs, nxt):
        traj = trajectories.setdefault(block, [state.copy()])
        traj.append(nxt.copy())
    return observe


def verified_budget(name: str, budget: TreeBudget, engine: Engine) -> TreeBudget:
    """The budget the tree decoder `name` verifies with on `engine`: its depth resolved, and a chain's nodes its
    depth + 1 (one node per depth: --budget does not size a chain, its depth does)."""
    budget = budget.resolve(engine)
    return TreeBudget(budget.depth + 1, budget.depth) if name == "chain" else budget


def run_decoder(name: str, engine: Engine, prompt_ids, req: DecodeRequest, drafter=None,
                on_block: Callable[[list[int]], bool | None] | None = None) -> Generation:
    """Decode `prompt_ids` with the decoder `name`; returns tokens and stats (no printing). drafter: a loaded
    drafter (spot.runtime.drafter.load_drafter), for spot / spot-sets; on_block: streaming, as in
    decode.generate."""
    check_decoder(name)
    check_engine(engine)
    if not isinstance(req, DecodeRequest):          # checked once here, not as an AttributeError mid-decode
        raise SpotError(f"the request must be a DecodeRequest, got {type(req).__name__}",
                        "e.g. DecodeRequest(max_new_tokens=64)")
    if on_block is not None and not callable(on_block):
        raise SpotError(f"on_block must be a function or None, got {on_block!r}")
    if drafter is not None and not hasattr(drafter, "proposer"):
        raise SpotError(f"drafter must be a loaded drafter, got {type(drafter).__name__}",
                        "drafter=spot.runtime.drafter.load_drafter(folder)")
    rule = rule_for(name, req)
    common = dict(max_new_tokens=req.max_new_tokens, rule=rule, sampling=req.sampling, stop_ids=req.stop_ids)
    if name in BASELINE_DECODERS:
        return generate(engine, prompt_ids, block_decoder=standard_block, on_block=on_block, **common)
    budget = verified_budget(name, req.budget, engine)
    if name == "chain":
        if 1 <= budget.depth <= engine.block_size and budget.nodes > engine.max_nodes:
            raise SpotError(f"a chain of depth {budget.depth} verifies {budget.nodes} states, more than the "
                            f"{engine.max_nodes} one verify pass of this engine takes (the export's max_nodes)",
                            f"use --depth {engine.max_nodes - 1} or less" if engine.max_nodes > 1 else
                            "re-export with --max-nodes 2 or more")
    budget.check(engine)
    if name == "chain":
        proposer = ConfidenceOrderProposer(branch=1)
    elif name == "tree":
        proposer = ConfidenceOrderProposer(branch=TREE_BRANCH)
    elif name in CEILING_DECODERS:
        trajectories: dict[int, list[np.ndarray]] = {}
        generate(engine, prompt_ids, block_decoder=standard_block, observer=record_trajectories(trajectories),
                 **common)
        oracle = OracleProposer if name == "oracle" else OrderOracleProposer
        proposer = oracle(trajectories)
    else:
        if drafter is None:
            raise SpotError(f"decoder {name!r} needs a drafter (order model)",
                            "pass drafter=load_drafter(PATH) (CLI: --drafter PATH), or use an exported folder "
                            "that ships drafter.onnx")
        drafter.check_compatible(engine)
        proposer = drafter.proposer(nodes=budget.nodes)      # the tree shape calibrated for this budget
    return generate(engine, prompt_ids, block_decoder=SpotBlockDecoder(proposer, budget, req.independent_noise),
                    on_block=on_block, **common)
