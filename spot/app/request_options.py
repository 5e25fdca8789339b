"""A decode request as users give it — `spot generate`'s flags, a `spot serve` request's fields (and so a Triton
request's inputs), a `spot bench` row — resolved once into what the runtime decodes.

RequestOptions checks what can be checked before a model loads (the decoder, the budget's form, sampling, the commit
rule, max_new_tokens, stop ids); resolve_request then, on the opened engine, loads the drafter where the decoder
drafts, looks up an `auto` budget (spot.app.tuned_budgets.auto_budget) and plans the decode (spot.runtime.decode_plan.plan_decode:
the budget's depth resolved for the engine and checked, once). ResolvedRequest.run decodes the plan: nothing after
resolve_request resolves or checks the budget again.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

from spot.app.tuned_budgets import CLI_NAMES, ModelArgs, auto_budget, budget_nodes
from spot.errors import SpotError
from spot.runtime.decode import FUSED, Generation
from spot.runtime.decode_plan import DecodePlan, DecodeRequest, plan_decode, run_plan
from spot.runtime.registry import Decoder, decoder
from spot.runtime.spot import TreeBudget
from spot.runtime.step import STATIC, CommitRule, Sampling


@dataclass(frozen=True)
class RequestOptions:
    """One decode as a user asks it. budget: a number of nodes, "auto" (spot tune's record) or a TreeBudget (then
    with its own depth); depth: None = 8, or the block size if smaller; stop_ids: None = the model's, () = none;
    store_mode: how a finished block is stored (spot.runtime.decode: fused or separate); names: how messages name
    the budget and the depth (CLI flags, or a server request's fields). SpotError now for
    anything wrong that needs no model."""

    decoder: str = "standard"
    budget: int | str | TreeBudget = 16
    depth: int | None = None
    max_new_tokens: int = 64
    mode: str = STATIC
    tau: float = 0.9
    sampling: Sampling = Sampling()
    stop_ids: tuple[int, ...] | None = None
    independent_noise: bool = False
    store_mode: str = FUSED
    names: tuple[str, str] = CLI_NAMES
    # derived, once: the decoder's entry, its commit rule, the request (budget not yet resolved), the tree budget
    # asked for (None: auto)
    entry: Decoder = field(init=False, repr=False, compare=False)
    rule: CommitRule = field(init=False, repr=False, compare=False)
    request: DecodeRequest = field(init=False, repr=False, compare=False)
    tree: TreeBudget | None = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        entry = decoder(self.decoder)
        tree = self.asked_budget()
        request = DecodeRequest(self.max_new_tokens, self.mode, self.tau, self.sampling, stop_ids=self.stop_ids,
                                independent_noise=self.independent_noise, store_mode=self.store_mode)
        for name, value in (("entry", entry), ("rule", entry.commit_rule(self.mode, self.tau)),
                            ("request", request), ("tree", tree)):
            object.__setattr__(self, name, value)

    def asked_budget(self) -> TreeBudget | None:
        """The tree budget as asked, its depth not yet resolved; None for auto."""
        if isinstance(self.budget, TreeBudget):
            if self.depth is not None:
                raise SpotError(f"give the depth once: in the TreeBudget {self.budget} or as depth {self.depth}",
                                "e.g. budget=TreeBudget(16, 8) with depth=None")
            return self.budget
        nodes = budget_nodes(self.budget, self.decoder, self.names)
        if nodes is not None:
            return TreeBudget(nodes, self.depth)
        if self.depth is not None:
            raise SpotError(f"{self.names[1]} is part of the tuned budget with {self.names[0]} auto",
                            f"leave out {self.names[1]}, or pass {self.names[0]} N {self.names[1]} D")
        return None


@dataclass(frozen=True)
class ResolvedRequest:
    """A request resolved on an engine: the runtime's plan (decoder, commit rule, the request with its verified
    budget, the drafter) and, for an `auto` budget, where it came from ({temperature, record}; else None)."""

    plan: DecodePlan
    tuned: dict | None = None

    @property
    def decoder(self) -> str:
        return self.plan.decoder.name

    @property
    def request(self) -> DecodeRequest:
        return self.plan.request

    def budget_facts(self) -> dict | None:
        """{nodes, depth, tuned} of the budget its trees are verified with; None for a decoder without trees."""
        budget = self.plan.budget
        return None if budget is None else {"nodes": budget.nodes, "depth": budget.depth, "tuned": self.tuned}

    def run(self, engine, prompt_ids, on_block: Callable[[list[int]], bool | None] | None = None) -> Generation:
        """Decode `prompt_ids` on `engine` (any engine of the model it was resolved for)."""
        return run_plan(self.plan, engine, prompt_ids, on_block)


def resolve_request(options: RequestOptions, engine, model: ModelArgs | None = None,
                    drafter: Callable[[], object] | None = None) -> ResolvedRequest:
    """`options` resolved on `engine`: drafter() (called only for a decoder that drafts) gives its drafter; `model`
    names what an `auto` budget was tuned for (None: auto is refused). SpotError naming what is wrong."""
    entry = options.entry
    loaded = drafter() if entry.drafts and drafter is not None else None
    tree, tuned = options.tree, None
    if tree is None:
        if model is None:
            raise SpotError(f"{options.names[0]} auto needs the model the budget was tuned for",
                            f"pass {options.names[0]} N {options.names[1]} D")
        tree, tuned = auto_budget(engine, model, entry.name, loaded, options.rule, options.sampling.temperature)
    return ResolvedRequest(plan_decode(entry.name, engine, replace(options.request, budget=tree), loaded), tuned)
