"""What one decode request did: target passes by kind, commit steps, and the records of the decoders that keep
them, as typed fields (a mistyped name is an error, not a new key), like the C++ host's DecodeStats and vLLM's
SpecDecodingStats. `DecodeStats.to_dict()` is the JSON of `spot generate --json`: a record's keys appear only where
a decoder kept it.
"""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, TypeVar

# fused: a block's first pass that also stores the finished block before it (the default store mode); store: a
# separate store pass (store mode "separate", SDAR's accounting). Which of the two a decode counts shows its mode.
PASS_KINDS = ("prefill", "block", "verify", "store", "fused")

T = TypeVar("T")


def timed(fn: Callable[..., T], *args) -> tuple[T, float]:
    """fn(*args) and the milliseconds it took."""
    t0 = time.perf_counter()
    result = fn(*args)
    return result, 1e3 * (time.perf_counter() - t0)


class PassCounts(Counter):
    """Target passes by kind (PASS_KINDS: prefill, block = a block's first pass or a standard step, verify,
    store, fused = a block's first pass that stores the block before it); an unknown kind raises KeyError instead of
    counting under a new key."""

    def __missing__(self, kind):
        _check_kind(kind)
        return 0

    def __setitem__(self, kind, count):
        _check_kind(kind)
        super().__setitem__(kind, count)


def _check_kind(kind) -> None:
    if kind not in PASS_KINDS:
        raise KeyError(f"unknown pass kind {kind!r}: one of {', '.join(PASS_KINDS)}")


@dataclass(slots=True)
class StandardStepStats:
    """Standard steps (one target pass per commit step): where their time went."""

    target_ms: float = 0.0    # the target passes
    sample_ms: float = 0.0    # F on the host after each pass

    def add_step(self, target_ms: float, sample_ms: float) -> None:
        self.target_ms += target_ms
        self.sample_ms += sample_ms


@dataclass(slots=True)
class VerifyStats:
    """A tree decoder's verify rounds (chain, tree, spot, spot-sets, the oracles): one entry per verify pass."""

    accepted: list[int] = field(default_factory=list)   # the depth the walk accepted below the free root
    nodes: list[int] = field(default_factory=list)      # states the pass verified
    draft_ms: float = 0.0     # stale view, proposer (drafter) and tree building
    target_ms: float = 0.0    # the verify passes
    walk_ms: float = 0.0      # the exact walk over the fresh outputs

    def add_round(self, accepted: int, nodes: int, draft_ms: float, target_ms: float, walk_ms: float) -> None:
        self.accepted.append(accepted)
        self.nodes.append(nodes)
        self.draft_ms += draft_ms
        self.target_ms += target_ms
        self.walk_ms += walk_ms


@dataclass(slots=True)
class EpilogueStats:
    """The device sampler: the states its epilogue sampled and the time inside those calls."""

    states: int = 0
    ms: float = 0.0


@dataclass(slots=True)
class DecodeStats:
    """Target passes by kind, commit steps, finished blocks, wall seconds, and the records the decoders kept:
    standard steps' times, verify rounds, the device sampler's epilogue (None where none ran)."""

    passes: PassCounts = field(default_factory=PassCounts)
    steps: int = 0
    blocks: int = 0
    seconds: float = 0.0
    standard: StandardStepStats | None = None
    verify: VerifyStats | None = None
    epilogue: EpilogueStats | None = None

    @property
    def target_passes(self) -> int:
        return sum(self.passes.values())

    @property
    def target_ms(self) -> float:
        """The target passes the block decoders timed: standard steps and verify passes."""
        return sum(r.target_ms for r in (self.standard, self.verify) if r is not None)

    def standard_record(self) -> StandardStepStats:
        """The standard steps' record, made on first use."""
        if self.standard is None:
            self.standard = StandardStepStats()
        return self.standard

    def verify_record(self) -> VerifyStats:
        """The verify rounds' record, made on first use (also by a block whose first pass ends it)."""
        if self.verify is None:
            self.verify = VerifyStats()
        return self.verify

    def to_dict(self) -> dict:
        """Every pass kind listed, zeros too (the C++ host's JSON does the same); a record's keys where it exists."""
        out = {"target_passes": self.target_passes, "passes": {kind: int(self.passes[kind]) for kind in PASS_KINDS},
               "steps": self.steps, "blocks": self.blocks, "seconds": self.seconds}
        if self.verify is not None:
            out |= {"accepted_per_verify": self.verify.accepted, "nodes_per_verify": self.verify.nodes,
                    "draft_ms": self.verify.draft_ms, "walk_ms": self.verify.walk_ms}
        if self.standard is not None or self.verify is not None:
            out["target_ms"] = self.target_ms
        if self.standard is not None:
            out["sample_ms"] = self.standard.sample_ms
        if self.epilogue is not None:
            out |= {"epilogue_states": self.epilogue.states, "epilogue_ms": self.epilogue.ms}
        return out
