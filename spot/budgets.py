"""A decode's tree budget from what a user asks: a number of nodes or `auto` (and a depth), as `spot generate --budget
/ --depth` and a `spot serve` request's `budget` / `depth` fields give it. `auto` is the budget `spot tune` recorded
for the model, engine, decoder, commit rule and machine (spot.tuned)."""
from __future__ import annotations

import shlex

from spot.errors import SpotError
from spot.runtime.decoders import TREE_DECODERS
from spot.runtime.spot import TreeBudget
from spot.tuned import check_tunable, number_name

CLI_NAMES = ("--budget", "--depth")      # how a message names the budget and the depth (a server: its fields)


def budget_nodes(budget, decoder: str, names: tuple[str, str] = CLI_NAMES) -> int | None:
    """A budget (a number of nodes, or "auto") as its number of nodes, None for auto; 1 (no tree) for standard /
    threshold decoding. SpotError naming names[0] for anything else."""
    if isinstance(budget, str) and budget.strip().lower() == "auto":
        if decoder not in TREE_DECODERS:
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


def tree_budget(nodes: int | None, depth, engine, backend, folder, decoder, drafter, rule, temperature: float,
                tune_command: str, names: tuple[str, str] = CLI_NAMES):
    """nodes / depth (default depth: 8, at most the block size), or auto (nodes None): the budget `spot tune`
    recorded for this decoder and commit rule at the temperature nearest `temperature` (spot.tuned; tune_command is
    the command that records it). Returns (TreeBudget, where an auto budget came from, or None)."""
    if nodes is not None:
        return TreeBudget(nodes, depth).resolve(engine), None
    if depth is not None:
        raise SpotError(f"{names[1]} is part of the tuned budget with {names[0]} auto",
                        f"leave out {names[1]}, or pass {names[0]} N {names[1]} D")
    from spot.tuned import tuned_budget, tuning_key
    key = tuning_key(engine, backend, folder, decoder, drafter, rule)
    found, tuned_at, path = tuned_budget(key, temperature, tune_command, engine)
    return found, {"temperature": tuned_at, "record": str(path)}


def tuned_note(budget: TreeBudget, tuned: dict) -> str:
    """The line that says what an auto budget decodes with (tuned: tree_budget's record of it), and why when it is
    no tree at all."""
    from spot.runtime.tuning import MIN_TREE_GAIN
    where = f"tuned at temperature {number_name(tuned['temperature'])} ({tuned['record']})"
    if budget.nodes == 1:
        return (f"budget auto: 1 node, so standard decoding (one target pass per commit step): `spot tune` measured no "
                f"tree more than {MIN_TREE_GAIN:g}x faster than it for this model, engine and machine; {where}")
    return f"budget auto: {budget.nodes} nodes x depth {budget.depth}, {where}"


def tune_command(model_dir, backend: str, device: str, sampler: str, kv_cache: str, block_size, drafter_path,
                 decoder: str, temperature: float, rule) -> str:
    """The `spot tune` command that records what `auto` looks for: the same model, engine options, decoder, commit
    rule and temperature (model_dir / drafter_path None: the defaults, left out)."""
    return shlex.join(["spot", "tune", *(["--model", str(model_dir)] if model_dir is not None else []),
                       "--backend", backend, "--device", device,
                       *(["--sampler", sampler] if sampler != "auto" else []),
                       *(["--kv-cache", kv_cache] if kv_cache != "auto" else []),
                       *(["--block-size", str(block_size)] if block_size is not None else []),
                       *(["--drafter", str(drafter_path)] if drafter_path is not None else []),
                       "--decoder", decoder, "--temperature", number_name(temperature),
                       *(["--mode", "threshold"] if rule.kind == "threshold" and decoder != "spot-sets" else []),
                       *(["--tau", number_name(rule.tau)] if rule.kind == "threshold" else [])])
