"""Aggregate decoding stats into the figures of docs/spec.md §7 (pure functions over Generation results)."""
from __future__ import annotations

from collections import Counter

import numpy as np

from spot.runtime.decode import FUSED, SEPARATE


def acceptance_by_depth(accepted: list[int], depth: int) -> list[float]:
    """P(a verify pass accepts at least d steps beyond the root), d = 1..depth, from per-pass accepted depths."""
    if not accepted:
        return [0.0] * depth
    a = np.asarray(accepted)
    return [float((a >= d).mean()) for d in range(1, depth + 1)]


def static_passes(prompt_len: int, block_size: int, blocks: int, store_mode: str = FUSED) -> int:
    """The target passes standard decoding with the static rule (one token per pass) spends on `blocks` decoded blocks
    after a prompt of prompt_len tokens: a prefill pass when the prompt fills a block, one pass per masked position
    (the first block's are those the prompt's P mod B leftover tokens leave) and, in the separate store mode, a
    store pass per block (fused: the next block's first pass stores a block). The baseline a single decode's passes
    are compared with, without decoding twice (decode.generate counts passes the same way)."""
    if blocks < 1:
        return 0
    prefill = 1 if prompt_len >= block_size else 0
    masked = blocks * block_size - prompt_len % block_size
    return prefill + masked + (blocks if store_mode == SEPARATE else 0)


def summarize(runs: list, seconds_key: str = "seconds", depth: int | None = None) -> dict:
    """runs: Generation objects of one decoder over many cases -> passes per token, tokens/s, steps per verify.
    depth: the budget's, so that acceptance_by_depth lists every depth the tree could reach (default: the deepest
    reached)."""
    tokens = sum(max(len(r.token_ids), 1) for r in runs)
    passes = sum(r.stats.target_passes for r in runs)
    seconds = sum(r.stats.seconds for r in runs)
    kinds: Counter = Counter()
    for r in runs:
        kinds.update(r.stats.passes)
    rounds = [r.stats.verify for r in runs if r.stats.verify is not None]
    accepted = [a for v in rounds for a in v.accepted]
    nodes = [n for v in rounds for n in v.nodes]
    out = {
        "cases": len(runs),
        "tokens": tokens,
        "target_passes": passes,
        "passes_by_kind": dict(kinds),
        "passes_per_token": passes / tokens,
        "passes_per_block": passes / max(sum(r.stats.blocks for r in runs), 1),
        "tokens_per_s": tokens / seconds if seconds > 0 else 0.0,
        "seconds": seconds,
    }
    if accepted:
        # commit steps a verify pass took: every step but each block's first (its own one-state pass, fused with
        # the store of the block before it or not); not 1 + the mean accepted depth, which also counts a free root
        # where a pass ended the block
        out["steps_per_verify"] = ((sum(r.stats.steps for r in runs) - kinds["block"] - kinds["fused"])
                                   / max(kinds["verify"], 1))
        out["mean_nodes_per_verify"] = float(np.mean(nodes))
        out["acceptance_by_depth"] = acceptance_by_depth(accepted, depth or max(max(accepted), 1))
        verifies = max(len(accepted), 1)
        out["draft_ms_per_verify"] = sum(v.draft_ms for v in rounds) / verifies
        out["walk_ms_per_verify"] = sum(v.walk_ms for v in rounds) / verifies
        out["target_ms_per_verify"] = sum(v.target_ms for v in rounds) / verifies
    epilogues = [r.stats.epilogue for r in runs if r.stats.epilogue is not None]
    if epilogues:   # the device sampler: once per commit step, any decoder
        out["epilogue_ms_per_step"] = sum(e.ms for e in epilogues) / max(sum(r.stats.steps for r in runs), 1)
    return out
