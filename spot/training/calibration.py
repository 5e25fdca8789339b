"""Light per-target calibration of a drafter's tree settings (drafter.json `order_temperature`, `runner_up_weight`,
`set_flip_weight`).

The tree builder ranks and weighs children by softmax(order_logits / T_o) (spot.runtime.drafter), so T_o sets how
deep versus how wide the best-first tree grows; the runner-up weight sets how often a position's second-best coupled
token gets a child of its own (spot.runtime.proposers.runner_up_alternatives); the flip weight how often SPOT-Sets
spends a slot on the predicted set with one uncertain position flipped (proposers.set_candidates). Cross-entropy
calibration is the wrong yardstick here: what counts is target passes, and a tree also pays for stale tokens the
order model cannot see. So this decodes training prompts at each candidate value on the real engine and keeps the
one with the fewest target passes: T_o with `spot` (at the drafter's runner-up weight), then the runner-up weight
with `spot` at the chosen T_o, then the flip weight with `spot-sets` (threshold rule at the drafter's tau). Outputs
are identical at every setting (exactness never depends on the proposer); only the passes differ. numpy + ONNX
Runtime only.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Callable

from spot.descriptors import read_json
from spot.errors import SpotError
from spot.files import check_output_path, write_text_atomic
from spot.runtime.decoders import DecodeRequest, run_decoder
from spot.runtime.drafter import ORDER_TEMPERATURE, RUNNER_UP_WEIGHT, SET_FLIP_WEIGHT, Drafter, resolve_paths
from spot.runtime.spot import TreeBudget
from spot.runtime.step import Sampling


def passes_by_setting(engine, drafter: Drafter, prompts: list[list[int]], temperatures: list[float], name: str,
                      candidates: list[float], budget: TreeBudget, max_new_tokens: int = 64,
                      progress: Callable[[str], None] | None = None, decoder: str = "spot") -> dict[float, int]:
    """Target passes of `decoder` (spot, or spot-sets at the drafter's tau), summed over prompts x sampling
    temperatures (seed 0), per candidate value of the drafter setting `name` (ORDER_TEMPERATURE, RUNNER_UP_WEIGHT
    or SET_FLIP_WEIGHT; the others stay the drafter's)."""
    if not prompts:
        raise SpotError("no calibration prompts", "pass --corpus-prompts N (N > 0) or --prompts FILE.jsonl")
    tau = DecodeRequest().tau if drafter.tau is None else float(drafter.tau)     # the request default otherwise
    out = {}
    for i, value in enumerate(candidates):
        candidate = drafter.with_settings(**{name: value})
        total = 0
        for temperature in temperatures:
            req = DecodeRequest(max_new_tokens=max_new_tokens, tau=tau, sampling=Sampling(temperature, seed=0),
                                budget=budget)
            for ids in prompts:
                total += run_decoder(decoder, engine, ids, req, drafter=candidate).stats.target_passes
        out[value] = total
        if progress:
            progress(f"[{i + 1}/{len(candidates)}] {name.replace('_', ' ')} {value:g}: {total} target passes")
    return out


def best_order_temperature(passes: dict[float, int]) -> float:
    """Fewest passes; among equals the candidate closest to 1 (in log scale: the least change)."""
    return min(passes, key=lambda t: (passes[t], abs(math.log(t))))


def best_weight(passes: dict[float, int]) -> float:
    """A child weight (runner-up, flip): fewest passes; among equals the smallest weight (the fewest such children)."""
    return min(passes, key=lambda w: (passes[w], w))


def check_calibration_writable(drafter: Drafter) -> None:
    """SpotError now, before the decoding, where the drafter's drafter.json could not be rewritten at the end."""
    check_output_path(resolve_paths(drafter.path)[1], "drafter.json")


def write_calibration(drafter_path: str | Path, result: dict, onnx_sha256: str | None = None) -> Path:
    """Set order_temperature, runner_up_weight and set_flip_weight (and the calibration record) in drafter.json
    from calibrate_drafter's result: written to a temporary file, renamed. onnx_sha256: the calibrated drafter's;
    refused if drafter.json now describes another (replaced while the calibration ran)."""
    _, json_path = resolve_paths(drafter_path)
    manifest = read_json(json_path, "train the drafter again with spot train-drafter")
    if onnx_sha256 is not None and manifest.get("onnx_sha256") != onnx_sha256:
        raise SpotError(f"{json_path} now describes another drafter (onnx sha256 "
                        f"{str(manifest.get('onnx_sha256'))[:12]}...) than the one calibrated "
                        f"({onnx_sha256[:12]}...): it was replaced during the calibration; nothing written",
                        "run spot calibrate-drafter again")
    for name in (ORDER_TEMPERATURE, RUNNER_UP_WEIGHT, SET_FLIP_WEIGHT):
        manifest[name] = result[name]
    manifest["order_calibration"] = result["calibration"]
    write_text_atomic(json_path, json.dumps(manifest, indent=2) + "\n")
    return json_path


def check_settings(drafter: Drafter, temperatures, candidates, runner_up_candidates, flip_candidates) -> None:
    """SpotError naming the option, before any decoding, for an empty list or a value the drafter refuses."""
    if not candidates or not runner_up_candidates or not flip_candidates or not temperatures:
        raise SpotError(f"calibration needs order temperatures, runner-up weights, flip weights and sampling "
                        f"temperatures, got {list(candidates)}, {list(runner_up_candidates)}, "
                        f"{list(flip_candidates)} and {list(temperatures)}",
                        "e.g. --candidates 0.5,1,2,3 --runner-up-weights 0,0.1,0.17,0.3 --set-flip-weights 0,0.1,1 "
                        "--temperatures 0,1")
    for flag, name, values in (("--candidates", ORDER_TEMPERATURE, candidates),     # before any decoding
                               ("--runner-up-weights", RUNNER_UP_WEIGHT, runner_up_candidates),
                               ("--set-flip-weights", SET_FLIP_WEIGHT, flip_candidates)):
        for value in values:
            try:
                drafter.with_settings(**{name: value})
            except SpotError as e:      # the value came from the command line, not from drafter.json
                raise SpotError(f"{flag}: {e.message.split(': ', 1)[-1]}", f"fix {flag}") from None
    for t in temperatures:          # checked now, not when the candidate loop first reaches it
        try:
            Sampling(t)
        except SpotError as e:
            raise SpotError(f"--temperatures: {e.message}", "fix --temperatures, e.g. 0,1") from None


def calibrate_drafter(engine, drafter: Drafter, prompts: list[list[int]], temperatures: list[float],
                      candidates: list[float], runner_up_candidates: list[float], budget: TreeBudget,
                      max_new_tokens: int = 64, progress: Callable[[str], None] | None = None,
                      flip_candidates: list[float] = (0.0, 0.1, 1.0)) -> dict:
    """Measure every candidate and return {"order_temperature", "runner_up_weight", "set_flip_weight",
    "calibration": the record}."""
    drafter.check_compatible(engine)
    check_settings(drafter, temperatures, candidates, runner_up_candidates, flip_candidates)
    order = passes_by_setting(engine, drafter, prompts, temperatures, ORDER_TEMPERATURE, candidates, budget,
                              max_new_tokens, progress)
    best_t = best_order_temperature(order)
    tuned = drafter.with_settings(order_temperature=best_t)
    runner_up = passes_by_setting(engine, tuned, prompts, temperatures, RUNNER_UP_WEIGHT, runner_up_candidates,
                                  budget, max_new_tokens, progress)
    best_w = best_weight(runner_up)
    flips = passes_by_setting(engine, tuned.with_settings(runner_up_weight=best_w), prompts, temperatures,
                              SET_FLIP_WEIGHT, flip_candidates, budget, max_new_tokens, progress, decoder="spot-sets")
    record = {"target_passes": {f"{t:g}": n for t, n in order.items()},
              "runner_up_weight_at": drafter.runner_up_weight,
              "runner_up_target_passes": {f"{w:g}": n for w, n in runner_up.items()},
              "set_flip_target_passes": {f"{w:g}": n for w, n in flips.items()},
              "set_flip_decoder": "spot-sets",
              "prompts": len(prompts), "temperatures": list(temperatures), "budget": [budget.nodes, budget.depth],
              "max_new_tokens": max_new_tokens, "decoder": "spot"}
    return {ORDER_TEMPERATURE: best_t, RUNNER_UP_WEIGHT: best_w, SET_FLIP_WEIGHT: best_weight(flips),
            "calibration": record}
