"""Decoding a request with a decoder by name (spot.runtime.registry: the decoders and their traits), as `spot
generate --decoder`, `spot bench`, `spot serve` and the Triton backend run it.

standard / threshold: docs/spec.md §3 with the static / threshold rule (one target pass per step).
chain / tree: SPOT with the training-free stale-confidence order (branch 1 = FreeDave-style chain, branch k = tree).
oracle: SPOT whose proposer reads the true standard trajectory (a diagnostic ceiling, costs a standard run first).
order-oracle: the same, but only the true positions; tokens are the coupled stale samples like a drafter's (the
  ceiling of any order model proposing the stale winners: spot -> order-oracle is the drafter's gap, order-oracle ->
  oracle the stale tokens'; spot's runner-up children win back part of the latter).
spot / spot-sets: SPOT with the learned order model (static rule / threshold rule with whole-set verification).
standard, chain, tree, oracle and spot follow the commit rule given (static unless mode is threshold).

A request is checked against an engine once (plan_decode: its decoder, commit rule, verified budget and drafter),
then decoded (run_plan); run_decoder does both.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from spot.errors import SpotError, integer_arg
from spot.runtime.decode import (FUSED, Generation, check_engine, check_max_new_tokens, check_store_mode, generate,
                                 standard_block, stop_id_tuple)
from spot.runtime.engine import Engine
from spot.runtime.registry import Decoder, ProposerInputs, decoder
from spot.runtime.spot import SpotBlockDecoder, TreeBudget
from spot.runtime.step import STATIC, CommitRule, Sampling


@dataclass(frozen=True)
class DecodeRequest:
    """What to decode, for run_decoder. max_new_tokens: the most ids returned (generation runs to the block boundary
    covering prompt + max_new_tokens: Generation.overflow_ids is the rest of the last block); mode: the commit rule
    of standard / chain / tree / spot (threshold and spot-sets always use the threshold rule), tau its threshold;
    budget: tree decoders only (a chain's nodes are its depth + 1); stop_ids: None = the model's stop ids, () = none;
    store_mode: fused (a finished block is stored by the next block's first pass) or separate (a store pass per
    block, SDAR's accounting): spot.runtime.decode.STORE_MODES.
    """

    max_new_tokens: int = 64
    mode: str = STATIC
    tau: float = 0.9
    sampling: Sampling = Sampling()
    budget: TreeBudget = TreeBudget()
    stop_ids: tuple[int, ...] | None = None
    independent_noise: bool = False   # ablation: proposals use noise unrelated to the target's (docs/spec.md §7)
    store_mode: str = FUSED

    def __post_init__(self):
        check_max_new_tokens(integer_arg(self.max_new_tokens, "max_new_tokens"))      # now, not when decoding
        check_store_mode(self.store_mode)
        if not isinstance(self.independent_noise, bool):      # a truthy string turned the ablation on
            raise SpotError(f"independent_noise must be True or False, got {self.independent_noise!r}")
        for name, kind in (("sampling", Sampling), ("budget", TreeBudget)):
            if not isinstance(getattr(self, name), kind):
                raise SpotError(f"DecodeRequest.{name} must be a {kind.__name__}, got {getattr(self, name)!r}",
                                f"e.g. {name}={kind.__name__}(...)")
        CommitRule(self.mode, self.tau)         # an unknown mode or a tau outside [0, 1) now, not mid-decode
        # (frozen: a generator is read once, here)
        object.__setattr__(self, "stop_ids", stop_id_tuple(self.stop_ids))


@dataclass(frozen=True)
class DecodePlan:
    """A request checked against an engine's shape, once (plan_decode): the decoder, its commit rule, the request
    with the budget it verifies with (depth resolved, a chain's nodes its depth + 1; checked: nothing resolves or
    checks it again) and its drafter (checked against the engine; None for a decoder that does not draft). Any
    engine of the same model runs it (run_plan)."""

    decoder: Decoder
    request: DecodeRequest
    rule: CommitRule
    drafter: object | None = None

    @property
    def budget(self) -> TreeBudget | None:
        """The budget its trees are verified with, None for a decoder that does not speculate."""
        return self.request.budget if self.decoder.speculates else None


def plan_decode(name: str, engine: Engine, req: DecodeRequest, drafter=None) -> DecodePlan:
    """Check the request `req` for the decoder `name` on `engine`: SpotError naming what is wrong, else its plan."""
    entry = decoder(name)
    check_engine(engine)
    if not isinstance(req, DecodeRequest):          # checked once here, not as an AttributeError mid-decode
        raise SpotError(f"the request must be a DecodeRequest, got {type(req).__name__}",
                        "e.g. DecodeRequest(max_new_tokens=64)")
    if drafter is not None and not hasattr(drafter, "proposer"):
        raise SpotError(f"drafter must be a loaded drafter, got {type(drafter).__name__}",
                        "drafter=spot.runtime.drafter.load_drafter(folder)")
    rule = entry.commit_rule(req.mode, req.tau)
    if not entry.speculates:
        return DecodePlan(entry, req, rule)
    budget = entry.verified_budget(req.budget, engine)
    if entry.nodes_from_depth:
        if 1 <= budget.depth <= engine.block_size and budget.nodes > engine.max_nodes:
            raise SpotError(f"a chain of depth {budget.depth} verifies {budget.nodes} states, more than the "
                            f"{engine.max_nodes} one verify pass of this engine takes (the export's max_nodes)",
                            f"use `depth={engine.max_nodes - 1}` or less" if engine.max_nodes > 1 else
                            "re-export with max_nodes 2 or more (`spot-export --max-nodes 2`)")
    budget.check(engine)
    if not entry.drafts:
        return DecodePlan(entry, replace(req, budget=budget), rule)
    if drafter is None:
        raise SpotError(f"decoder {name!r} needs a drafter (order model)",
                        "pass a `drafter` (spot.runtime.drafter.load_drafter(PATH)), or use an exported folder "
                        "that ships drafter.onnx")
    drafter.check_compatible(engine)
    return DecodePlan(entry, replace(req, budget=budget), rule, drafter)


def run_plan(plan: DecodePlan, engine: Engine, prompt_ids,
             on_block: Callable[[list[int]], bool | None] | None = None) -> Generation:
    """Decode `prompt_ids` on `engine` (of the model `plan` was checked for) as `plan` says: tokens and stats."""
    if on_block is not None and not callable(on_block):
        raise SpotError(f"on_block must be a function or None, got {on_block!r}")
    req = plan.request
    common = dict(max_new_tokens=req.max_new_tokens, rule=plan.rule, sampling=req.sampling, stop_ids=req.stop_ids,
                  store_mode=req.store_mode)
    if not plan.decoder.speculates:
        return generate(engine, prompt_ids, block_decoder=standard_block, on_block=on_block, **common)

    def standard_run(observer):
        return generate(engine, prompt_ids, block_decoder=standard_block, observer=observer, **common)
    proposer = plan.decoder.proposer(ProposerInputs(engine, prompt_ids, plan.drafter, standard_run,
                                                     req.budget))
    return generate(engine, prompt_ids, block_decoder=SpotBlockDecoder(proposer, req.budget, req.independent_noise),
                    on_block=on_block, **common)


def run_decoder(name: str, engine: Engine, prompt_ids, req: DecodeRequest, drafter=None,
                on_block: Callable[[list[int]], bool | None] | None = None) -> Generation:
    """Decode `prompt_ids` with the decoder `name`; returns tokens and stats (no printing). drafter: a loaded
    drafter (spot.runtime.drafter.load_drafter), for spot / spot-sets; on_block: streaming, as in
    decode.generate."""
    return run_plan(plan_decode(name, engine, req, drafter), engine, prompt_ids, on_block)
