"""Light per-target calibration of a drafter's tree settings (drafter.json `order_temperature`, `runner_up_weight`).

The tree builder ranks and weighs children by softmax(order_logits / T_o) (spot.runtime.drafter), so T_o sets how
deep versus how wide the best-first tree grows; the runner-up weight sets how often a position's second-best coupled
token gets a child of its own (spot.runtime.proposers.runner_up_alternatives). Cross-entropy calibration is the
wrong yardstick here: what counts is target passes, and a tree also pays for stale tokens the order model cannot
see. So this decodes training prompts with `spot` at each candidate value on the real engine and keeps the one with
the fewest target passes: first T_o (at the drafter's runner-up weight), then the runner-up weight at the chosen
T_o. Outputs are identical at every setting (exactness never depends on the proposer); only the passes differ.
numpy + ONNX Runtime only.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Callable

from spot.errors import SpotError
from spot.runtime.decoders import DecodeRequest, run_decoder
from spot.runtime.drafter import DRAFTER_JSON, ORDER_TEMPERATURE, RUNNER_UP_WEIGHT, Drafter, resolve_paths
from spot.runtime.spot import TreeBudget
from spot.runtime.step import Sampling


def passes_by_setting(engine, drafter: Drafter, prompts: list[list[int]], temperatures: list[float], name: str,
                      candidates: list[float], budget: TreeBudget, max_new_tokens: int = 64,
                      progress: Callable[[str], None] | None = None) -> dict[float, int]:
    """Target passes of `spot`, summed over prompts x sampling temperatures (seed 0), per candidate value of the
    drafter setting `name` (ORDER_TEMPERATURE or RUNNER_UP_WEIGHT; the other setting stays the drafter's)."""
    if not prompts:
        raise SpotError("no calibration prompts", "pass --prompts N (> 0) or a --prompts-file with prompts")
    out = {}
    for i, value in enumerate(candidates):
        candidate = drafter.with_settings(**{name: value})
        total = 0
        for temperature in temperatures:
            req = DecodeRequest(max_new_tokens=max_new_tokens, sampling=Sampling(temperature, seed=0), budget=budget)
            for ids in prompts:
                total += run_decoder("spot", engine, ids, req, drafter=candidate).stats.target_passes
        out[value] = total
        if progress:
            progress(f"[{i + 1}/{len(candidates)}] {name.replace('_', ' ')} {value:g}: {total} target passes")
    return out


def best_order_temperature(passes: dict[float, int]) -> float:
    """Fewest passes; among equals the candidate closest to 1 (in log scale: the least change)."""
    return min(passes, key=lambda t: (passes[t], abs(math.log(t))))


def best_runner_up_weight(passes: dict[float, int]) -> float:
    """Fewest passes; among equals the smallest weight (the fewest runner-up children)."""
    return min(passes, key=lambda w: (passes[w], w))


def write_calibration(drafter_path: str | Path, result: dict) -> Path:
    """Set order_temperature and runner_up_weight (and the calibration record) in drafter.json from
    calibrate_drafter's result: written to a temporary file, renamed."""
    _, json_path = resolve_paths(drafter_path)
    manifest = json.loads(json_path.read_text())
    manifest[ORDER_TEMPERATURE] = result[ORDER_TEMPERATURE]
    manifest[RUNNER_UP_WEIGHT] = result[RUNNER_UP_WEIGHT]
    manifest["order_calibration"] = result["calibration"]
    tmp = json_path.with_name(DRAFTER_JSON + ".partial")
    tmp.write_text(json.dumps(manifest, indent=2) + "\n")
    os.replace(tmp, json_path)
    return json_path


def calibrate_drafter(engine, drafter: Drafter, prompts: list[list[int]], temperatures: list[float],
                      candidates: list[float], runner_up_candidates: list[float], budget: TreeBudget,
                      max_new_tokens: int = 64, progress: Callable[[str], None] | None = None) -> dict:
    """Measure every candidate and return {"order_temperature", "runner_up_weight", "calibration": the record}."""
    drafter.check_compatible(engine)
    if not candidates or not runner_up_candidates or not temperatures:
        raise SpotError(f"calibration needs order temperatures, runner-up weights and sampling temperatures, got "
                        f"{list(candidates)}, {list(runner_up_candidates)} and {list(temperatures)}",
                        "e.g. --candidates 0.5,1,2,3 --runner-up-weights 0,0.1,0.17,0.3 --temperatures 0,1")
    for t in candidates:                # refuses bad candidates before any decoding
        drafter.with_settings(order_temperature=t)
    for w in runner_up_candidates:
        drafter.with_settings(runner_up_weight=w)
    order = passes_by_setting(engine, drafter, prompts, temperatures, ORDER_TEMPERATURE, candidates, budget,
                              max_new_tokens, progress)
    best_t = best_order_temperature(order)
    runner_up = passes_by_setting(engine, drafter.with_settings(order_temperature=best_t), prompts, temperatures,
                                  RUNNER_UP_WEIGHT, runner_up_candidates, budget, max_new_tokens, progress)
    record = {"target_passes": {f"{t:g}": n for t, n in order.items()},
              "runner_up_weight_at": drafter.runner_up_weight,
              "runner_up_target_passes": {f"{w:g}": n for w, n in runner_up.items()},
              "prompts": len(prompts), "temperatures": list(temperatures), "budget": [budget.nodes, budget.depth],
              "max_new_tokens": max_new_tokens, "decoder": "spot"}
    return {ORDER_TEMPERATURE: best_t, RUNNER_UP_WEIGHT: best_runner_up_weight(runner_up), "calibration": record}
