"""Light per-target calibration of a drafter's order temperature (drafter.json `order_temperature`).

The tree builder ranks and weighs children by softmax(order_logits / T_o) (spot.runtime.drafter), so T_o sets
how deep versus how wide the best-first tree grows. Cross-entropy calibration is the wrong yardstick here: what
counts is target passes, and a tree also pays for stale tokens the order model cannot see. So this decodes
training prompts with `spot` at each candidate T_o on the real engine and keeps the one with the fewest target
passes (ties: the candidate closest to 1, i.e. the least change). Outputs are identical at every T_o (exactness
never depends on the proposer); only the passes differ. numpy + ONNX Runtime only.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Callable

from spot.errors import SpotError
from spot.runtime.decoders import DecodeRequest, run_decoder
from spot.runtime.drafter import DRAFTER_JSON, ORDER_TEMPERATURE, Drafter, resolve_paths
from spot.runtime.spot import TreeBudget
from spot.runtime.step import Sampling

DEFAULT_CANDIDATES = (0.5, 1.0, 2.0, 3.0)


def passes_by_order_temperature(engine, drafter: Drafter, prompts: list[list[int]], temperatures: list[float],
                                candidates: list[float], budget: TreeBudget, max_new_tokens: int = 64,
                                progress: Callable[[str], None] | None = None) -> dict[float, int]:
    """Target passes of `spot`, summed over prompts x sampling temperatures (seed 0), per order temperature."""
    if not prompts:
        raise SpotError("no calibration prompts", "pass --prompts N (> 0) or a --prompts-file with prompts")
    out = {}
    for i, t_o in enumerate(candidates):
        candidate = drafter.with_order_temperature(t_o)
        total = 0
        for temperature in temperatures:
            req = DecodeRequest(max_new_tokens=max_new_tokens, sampling=Sampling(temperature, seed=0), budget=budget)
            for ids in prompts:
                total += run_decoder("spot", engine, ids, req, drafter=candidate).stats.target_passes
        out[t_o] = total
        if progress:
            progress(f"[{i + 1}/{len(candidates)}] order temperature {t_o:g}: {total} target passes")
    return out


def best_order_temperature(passes: dict[float, int]) -> float:
    """Fewest passes; among equals the candidate closest to 1 (in log scale: the least change)."""
    return min(passes, key=lambda t: (passes[t], abs(math.log(t))))


def write_order_temperature(drafter_path: str | Path, temperature: float, record: dict) -> Path:
    """Set order_temperature (and the calibration record) in drafter.json: written to a temporary file, renamed."""
    _, json_path = resolve_paths(drafter_path)
    manifest = json.loads(json_path.read_text())
    manifest[ORDER_TEMPERATURE] = temperature
    manifest["order_calibration"] = record
    tmp = json_path.with_name(DRAFTER_JSON + ".partial")
    tmp.write_text(json.dumps(manifest, indent=2) + "\n")
    os.replace(tmp, json_path)
    return json_path


def calibrate_order_temperature(engine, drafter: Drafter, prompts: list[list[int]], temperatures: list[float],
                                candidates: list[float], budget: TreeBudget, max_new_tokens: int = 64,
                                progress: Callable[[str], None] | None = None) -> dict:
    """Measure every candidate and return {"order_temperature": best, "calibration": the record to keep}."""
    drafter.check_compatible(engine)
    if not candidates or not temperatures:
        raise SpotError(f"calibration needs order temperatures and sampling temperatures, got {list(candidates)} "
                        f"and {list(temperatures)}", "e.g. --candidates 0.5,1,2,3 --temperatures 0,1")
    for t in candidates:
        drafter.with_order_temperature(t)          # refuses <= 0 / non-finite candidates before any decoding
    passes = passes_by_order_temperature(engine, drafter, prompts, temperatures, candidates, budget,
                                         max_new_tokens, progress)
    best = best_order_temperature(passes)
    record = {"target_passes": {f"{t:g}": n for t, n in passes.items()}, "prompts": len(prompts),
              "temperatures": list(temperatures), "budget": [budget.nodes, budget.depth],
              "max_new_tokens": max_new_tokens, "decoder": "spot"}
    return {"order_temperature": best, "calibration": record}
