"""A decode's tree budget from what a user asks: a number of nodes or `auto` (and a depth), as `spot generate --budget
/ --depth` and a `spot serve` request's `budget` / `depth` fields give it. `auto` is the budget `spot tune` recorded
for the model, engine, decoder, commit rule and machine (spot.tuned)."""
from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from spot.errors import SpotError
from spot.runtime.registry import decoder as decoder_entry
from spot.runtime.spot import TreeBudget
from spot.runtime.tuning import MIN_TREE_GAIN
from spot.tuned import check_tunable, number_name, tuned_budget, tuning_key

CLI_NAMES = ("--budget", "--depth")      # how a message names the budget and the depth (a server: its fields)


def budget_nodes(budget, decoder: str, names: tuple[str, str] = CLI_NAMES) -> int | None:
    """A budget (a number of nodes, or "auto") as its number of nodes, None for auto; 1 (no tree) for standard /
    threshold decoding. SpotError naming names[0] for anything else."""
    if isinstance(budget, str) and budget.strip().lower() == "auto":
        if not decoder_entry(decoder).speculates:
            return 1
        check_tunable(decoder)
        return None
    hint = (f"e.g. {names[0]} 16 (tree nodes per verify pass, the root included) with {names[1]} 8 (the deepest "
            f"node), or {names[0]} auto")
    if isinstance(budget, bool) or isinstance(budget, float):       # int(2.5) would drop the fraction unsaid
        raise SpotError(f"{names[0]} takes a number of nodes or auto, got {budget!r}", hint)
    try:
        return int(budget)
    except (TypeError, ValueError):
        raise SpotError(f"{names[0]} takes a number of nodes or auto, got {budget!r}", hint) from None


def parse_tree_budgets(text: str) -> tuple[TreeBudget, ...]:
    """Comma-separated NODESxDEPTH (spot bench --budgets, calibrate-drafter --budget) as TreeBudgets; SpotError
    when none is given or one does not read."""
    try:
        pairs = [b.lower().split("x") for b in text.split(",") if b.strip()]
        budgets = tuple(TreeBudget(int(n), int(d)) for n, d in pairs)
    except ValueError:
        budgets = ()
    if not budgets:         # (",": no budget at all — the tree rows were dropped without a word)
        raise SpotError(f"budgets must look like 16x8,64x16 (nodes x depth), got {text!r}",
                        "comma-separated NODESxDEPTH: nodes per verify pass (the root included) x the deepest node")
    return budgets


@dataclass(frozen=True)
class ModelArgs:
    """The model and engine options as the user gave them: what `auto` looks up (spot.tuned.tuning_key) and the
    `spot tune` command that records it names. folder: the model folder as resolved (spot.models.model_folder);
    model_arg / drafter_arg: --model / --drafter as given (None: the defaults, left out of the command)."""

    folder: str | Path
    backend: str
    model_arg: str | None = None
    device: str = "cpu"
    sampler: str = "auto"
    kv_cache: str = "auto"
    block_size: int | None = None
    drafter_arg: str | None = None


def auto_budget(engine, model: ModelArgs, decoder: str, drafter, rule, temperature: float
                ) -> tuple[TreeBudget, dict]:
    """`auto`: the budget `spot tune` recorded for this model, engine, decoder (its drafter) and commit rule at the
    temperature nearest `temperature` (spot.tuned), checked against `engine`, and where it came from; SpotError
    naming the `spot tune` command that records one when there is none."""
    key = tuning_key(engine, model.backend, model.folder, decoder, drafter, rule)
    found, tuned_at, path = tuned_budget(key, temperature, tune_command(model, decoder, temperature, rule), engine)
    return found, {"temperature": tuned_at, "record": str(path)}


def tuned_note(budget: TreeBudget, tuned: dict) -> str:
    """The line that says what an auto budget decodes with (tuned: auto_budget's record of it), and why when it is
    no tree at all."""
    where = f"tuned at temperature {number_name(tuned['temperature'])} ({tuned['record']})"
    if budget.nodes == 1:
        return (f"budget auto: 1 node, so standard decoding (one target pass per commit step): `spot tune` measured no "
                f"tree more than {MIN_TREE_GAIN:g}x faster than it for this model, engine and machine; {where}")
    return f"budget auto: {budget.nodes} nodes x depth {budget.depth}, {where}"


def tune_command(model: ModelArgs, decoder: str, temperature: float, rule) -> str:
    """The `spot tune` command that records what `auto` looks for: the same model, engine options, decoder, commit
    rule and temperature (model.model_arg / drafter_arg None: the defaults, left out)."""
    return shlex.join(["spot", "tune", *(["--model", str(model.model_arg)] if model.model_arg is not None else []),
                       "--backend", model.backend, "--device", model.device,
                       *(["--sampler", model.sampler] if model.sampler != "auto" else []),
                       *(["--kv-cache", model.kv_cache] if model.kv_cache != "auto" else []),
                       *(["--block-size", str(model.block_size)] if model.block_size is not None else []),
                       *(["--drafter", str(model.drafter_arg)] if model.drafter_arg is not None else []),
                       "--decoder", decoder, "--temperature", number_name(temperature),
                       # --mode only where the decoder follows it (spot-sets always commits by threshold)
                       *(["--mode", "threshold"] if rule.kind == "threshold" and decoder_entry(decoder).rule is None
                         else []),
                       *(["--tau", number_name(rule.tau)] if rule.kind == "threshold" else [])])
