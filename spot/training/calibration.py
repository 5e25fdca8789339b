"""Light per-target calibration of a drafter's tree settings (drafter.json `order_temperature`, `runner_up_weight`,
`set_flip_weight`, and `tree_shapes`: SPOT's shape per verify budget).

The tree builder ranks and weighs children by softmax(order_logits / T_o) (spot.runtime.drafter), so T_o sets how
deep versus how wide the best-first tree grows; the runner-up weight sets how often a position's second-best coupled
token gets a child of its own (spot.runtime.proposers.runner_up_alternatives); the flip weight how often SPOT-Sets
spends a slot on the predicted set with one uncertain position flipped (proposers.set_candidates). Cross-entropy
calibration is the wrong yardstick here: what counts is target passes, and a tree also pays for stale tokens the
order model cannot see. So this decodes training prompts at each candidate value on the real engine and keeps the
one with the fewest target passes: T_o with `spot` (at the drafter's runner-up weight), then the runner-up weight
with `spot` at the chosen T_o, then the flip weight with `spot-sets` (threshold rule at the drafter's tau). Outputs
are identical at every setting (exactness never depends on the proposer); only the passes differ.

Tree shapes per budget (branch, depth, order temperature, runner-up weight) are priced by replay instead
(spot.training.replay): the prompts are decoded once with standard decoding per temperature, and every candidate
shape's exact `spot` passes are replayed from those decodes without the target. Each budget starts from the drafter's
own settings (branch 4, the budget's depth, no stale-top bonus) and takes each field in turn — order temperature,
branch, runner-up weight, stale-top bonus, depth — keeping the value with the fewest passes (ties: the value it had). numpy + ONNX Runtime only.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Callable

from spot.descriptors import read_json
from spot.errors import SpotError
from spot.files import check_output_path, write_text_atomic
from dataclasses import asdict, replace

from spot.runtime.decode_plan import DecodeRequest, run_decoder
from spot.runtime.drafter import (DEFAULT_LOOKAHEAD, MAX_BLOCK, MAX_STALE_TOP_BONUS, ORDER_TEMPERATURE,
                                  RUNNER_UP_WEIGHT, SET_FLIP_WEIGHT, STALE_TOP_BONUS, TREE_SHAPES, Drafter,
                                  DrafterProposer, TreeShape, resolve_paths)
from spot.runtime.spot import TreeBudget
from spot.runtime.step import Sampling
from spot.training.replay import RecordedDecode, record_standard, replay_passes

DEFAULT_SHAPE_BUDGETS = "2x2,4x4,8x8,16x8,64x16"
DEFAULT_BRANCHES = (1, 2, 4, 8)
DEFAULT_STALE_TOP_BONUSES = (0.0, 1.0, 30.0)
DEPTHS = (2, 3, 4, 6, 8, 12, 16, 24, 32)      # depth candidates, those within the budget's depth
# the order the fields are calibrated in
SHAPE_FIELDS = (ORDER_TEMPERATURE, "branch", RUNNER_UP_WEIGHT, STALE_TOP_BONUS, "depth")


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
    """Set what calibrate_drafter's result holds (order_temperature, runner_up_weight and set_flip_weight with the
    calibration record; tree_shapes with its record, from calibrate_tree_shapes) in drafter.json: written to a
    temporary file, renamed. onnx_sha256: the calibrated drafter's; refused if drafter.json now describes another
    (replaced while the calibration ran)."""
    _, json_path = resolve_paths(drafter_path)
    manifest = read_json(json_path, "train the drafter again with spot train-drafter")
    if onnx_sha256 is not None and manifest.get("onnx_sha256") != onnx_sha256:
        raise SpotError(f"{json_path} now describes another drafter (onnx sha256 "
                        f"{str(manifest.get('onnx_sha256'))[:12]}...) than the one calibrated "
                        f"({onnx_sha256[:12]}...): it was replaced during the calibration; nothing written",
                        "run spot calibrate-drafter again")
    for name in (ORDER_TEMPERATURE, RUNNER_UP_WEIGHT, SET_FLIP_WEIGHT, TREE_SHAPES):
        if name in result:
            manifest[name] = result[name]
    if "calibration" in result:
        manifest["order_calibration"] = result["calibration"]
    if "shape_calibration" in result:
        manifest["tree_shape_calibration"] = result["shape_calibration"]
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
    drafter = drafter.with_tree_shapes([])      # the drafter's own settings at every budget: what this calibrates
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


def record_prompts(engine, prompts: list[list[int]], temperatures: list[float], max_new_tokens: int
                   ) -> list[RecordedDecode]:
    """Standard decodes of every prompt at every temperature (seed 0), kept for replay."""
    if not prompts:
        raise SpotError("no calibration prompts", "pass --corpus-prompts N (N > 0) or --prompts FILE.jsonl")
    return [record_standard(engine, ids, DecodeRequest(max_new_tokens, sampling=Sampling(t, seed=0)))
            for t in temperatures for ids in prompts]


def shape_candidates(field: str, budget: TreeBudget, order_temperatures, runner_up_weights, branches,
                     bonuses) -> list:
    """The values tried for one field of a budget's shape."""
    if field == "depth":
        return sorted({d for d in DEPTHS if d < budget.depth} | {budget.depth})
    return list({ORDER_TEMPERATURE: order_temperatures, RUNNER_UP_WEIGHT: runner_up_weights,
                 "branch": branches, STALE_TOP_BONUS: bonuses}[field])


def shape_for_budget(drafter: Drafter, decodes: list[RecordedDecode], budget: TreeBudget, order_temperatures,
                     runner_up_weights, branches, bonuses=DEFAULT_STALE_TOP_BONUSES) -> tuple[TreeShape, dict]:
    """The shape with the fewest replayed `spot` passes for `budget` (module docstring), and the passes of every
    candidate tried ({field: {value: passes}})."""
    def passes(shape: TreeShape) -> int:
        return sum(replay_passes(r, DrafterProposer(drafter, None, DEFAULT_LOOKAHEAD, shape), budget)
                   for r in decodes)

    base = drafter.shape_for(None)
    shape = replace(base, depth=budget.depth)
    record = {}
    for field in SHAPE_FIELDS:
        tried = {}
        for value in shape_candidates(field, budget, order_temperatures, runner_up_weights, branches, bonuses):
            tried[value] = passes(replace(shape, **{field: value}))
        current = getattr(shape, field)
        best = min(tried, key=lambda v: (tried[v], v != current))    # ties: keep the value it had
        shape = replace(shape, **{field: best})
        record[field] = {f"{v:g}": n for v, n in tried.items()}
    return shape, record


def calibrate_tree_shapes(engine, drafter: Drafter, prompts: list[list[int]], temperatures: list[float],
                          budgets: list[TreeBudget], order_temperatures, runner_up_weights,
                          branches=DEFAULT_BRANCHES, max_new_tokens: int = 64,
                          progress: Callable[[str], None] | None = None,
                          bonuses=DEFAULT_STALE_TOP_BONUSES) -> dict:
    """SPOT's tree shape per budget, by replayed target passes on training prompts: {"tree_shapes": drafter.json's
    list, "shape_calibration": the record}. The drafter's own order_temperature and runner_up_weight are each
    budget's starting point (calibrate_drafter's, where it ran first)."""
    drafter.check_compatible(engine)
    check_shape_settings(drafter, budgets, order_temperatures, runner_up_weights, branches, bonuses)
    drafter = drafter.with_tree_shapes([])
    decodes = record_prompts(engine, prompts, temperatures, max_new_tokens)
    shapes, record = [], {}
    for budget in budgets:
        shape, tried = shape_for_budget(drafter, decodes, budget, order_temperatures, runner_up_weights, branches,
                                        bonuses)
        shapes.append({"nodes": budget.nodes, **asdict(shape)})
        record[f"{budget.nodes}x{budget.depth}"] = tried
        if progress:
            progress(f"tree shape {budget.nodes}x{budget.depth}: branch {shape.branch}, depth {shape.depth}, order "
                     f"temperature {shape.order_temperature:g}, runner-up weight {shape.runner_up_weight:g}, "
                     f"stale-top bonus {shape.stale_top_bonus:g}")
    summary = {"prompts": len(prompts), "temperatures": list(temperatures), "max_new_tokens": max_new_tokens,
               "decoder": "spot", "passes_by_budget": record}
    return {TREE_SHAPES: shapes, "shape_calibration": summary}


def fitted_shape_budgets(budgets, engine, given: bool) -> list[TreeBudget]:
    """--shape-budgets for `engine`: a given list checked (SpotError naming the option); the default one fitted to
    it (depths capped at the block size, budgets over the export's max nodes left out)."""
    if not given:
        capped = [TreeBudget(b.nodes, min(b.depth, engine.block_size)) for b in budgets]
        return [b for b in capped if b.nodes <= engine.max_nodes]
    for b in budgets:
        try:
            b.check(engine)
        except SpotError as e:
            raise SpotError(f"--shape-budgets {b.nodes}x{b.depth}: {e.message}", "fix --shape-budgets") from None
    return list(budgets)


def check_shape_settings(drafter: Drafter, budgets, order_temperatures, runner_up_weights, branches,
                         bonuses=DEFAULT_STALE_TOP_BONUSES) -> None:
    """SpotError naming the option, before any decoding: two budgets of one node count, a branch outside
    1..MAX_BLOCK, a bonus outside 0..MAX_STALE_TOP_BONUS, or a weight / temperature the drafter refuses."""
    nodes = [b.nodes for b in budgets]
    if len(set(nodes)) != len(nodes):
        raise SpotError(f"--shape-budgets: one budget per node count, got {[f'{b.nodes}x{b.depth}' for b in budgets]}",
                        "e.g. --shape-budgets 2x2,4x4,8x8,16x8,64x16")
    if not branches or any(not isinstance(b, int) or not 1 <= b <= MAX_BLOCK for b in branches):
        raise SpotError(f"--branches: got {list(branches)}, expected integers in 1..{MAX_BLOCK}",
                        "e.g. --branches 1,2,4,8")
    if not bonuses or any(not 0 <= b <= MAX_STALE_TOP_BONUS for b in bonuses):
        raise SpotError(f"--stale-top-bonuses: got {list(bonuses)}, expected numbers in 0..{MAX_STALE_TOP_BONUS:g}",
                        "e.g. --stale-top-bonuses 0,1,30")
    check_settings(drafter, [0.0], order_temperatures, runner_up_weights, [0.0])
