"""Tree budgets as users ask for them and as `spot tune` records them: a number of nodes or `auto` (and a depth), as
`spot generate --budget / --depth` and a `spot serve` request's `budget` / `depth` fields give it; `auto` is the
budget `spot tune` recorded for the model, engine, decoder, commit rule and machine (one concept: the budget a
decode verifies with; the latency-curve arithmetic that picks it is spot.runtime.tuning).

Which budget is fastest depends on the device's latency curve (spot.runtime.tuning) and on acceptance, which depends on
the model, the drafter and its tree settings, the commit rule and the temperature. A record therefore lives under a
key naming all of them (`tuning_key`), in $SPOT_CACHE/tuning/<hash of the key>.json, one entry per tuned temperature.
A record from another machine or engine is never found (its key differs); an outdated one on this machine only costs
speed: SPOT's output is the same at every budget.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import shlex
import time
from dataclasses import dataclass
from pathlib import Path

from spot.config import MAX_BLOCK_SIZE
from spot.descriptors import load_descriptor
from spot.errors import SpotError
from spot.files import check_output_path, exclusive_lock, spot_cache, write_text_atomic
from spot.folder.manifest import MAX_NODES
from spot.runtime.registry import decoder as decoder_entry, decoder_names, is_decoder
from spot.runtime.spot import TreeBudget
from spot.runtime.step import THRESHOLD
from spot.runtime.tuning import MIN_TREE_GAIN
from spot.schema import Integer, MapOf, Number, Record, Text, checked


# 2: the tuner chooses by measured speed; version 1's choices came from a model that overrated trees
FORMAT, FORMAT_VERSION = "spot-tuning", 2


def number_name(x: float) -> str:
    """A temperature or tau as an entry name or a command-line value: "1", "0.7", "-0" as "0"; exact where six
    digits are not (0.1234567 and 0.1234568 keep two names, and a suggested --tau 0.9999999 is not "1")."""
    x = float(x) + 0.0
    short = f"{x:g}"
    return short if float(short) == x else repr(x)


def tuning_dir() -> Path:
    return spot_cache() / "tuning"


def check_tuning_dir() -> None:
    """SpotError now, before a sweep of minutes, when the tuned budgets could not be recorded."""
    check_output_path(tuning_dir(), "the tuning cache ($SPOT_CACHE/tuning)", folder=True)


# where a machine names its GPUs without a GPU library: the NVIDIA driver (one folder per GPU), a Jetson's board
NVIDIA_GPU_INFO = "/proc/driver/nvidia/gpus"
DEVICE_TREE_MODEL = "/proc/device-tree/model"


def gpu_models() -> list[str]:
    """The machine's NVIDIA GPU models as the driver names them (or the Jetson board's model), [] when none: a
    budget tuned on one GPU is not another's, whichever backend ran it (ORT's CUDA provider has no device query)."""
    models = []
    folder = Path(NVIDIA_GPU_INFO)
    for info in sorted(folder.glob("*/information")) if folder.is_dir() else ():
        try:
            for line in info.read_text(errors="replace").splitlines():
                if line.startswith("Model:"):
                    models.append(line.split(":", 1)[1].strip())
        except OSError:
            continue
    if not models:
        try:
            board = Path(DEVICE_TREE_MODEL).read_bytes().rstrip(b"\0").decode(errors="replace").strip()
        except OSError:
            board = ""
        if "jetson" in board.lower() or "nvidia" in board.lower():
            models.append(board)
    return models


def machine_identity() -> dict:
    """The host a latency curve was measured on: name, architecture, CPU model and count, and its NVIDIA GPUs (key
    left out where there are none, so CPU records keep their key)."""
    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()   # taskset, cgroups
    identity = {"host": platform.node(), "arch": platform.machine(), "cpu": cpu, "cpus": cpus}
    gpus = gpu_models()
    if gpus:
        identity["gpus"] = gpus
    return identity


def model_fingerprint(folder: str | Path) -> str:
    """sha256 naming the model in `folder`: an export's manifest.json (it records every file's hash) but its
    "created" line — the same model exported again keeps its tuned budgets — else a checkpoint's config.json with
    its weight files' names and sizes (hashing GBs of weights per request would cost more than it saves)."""
    folder = Path(folder)
    h = hashlib.sha256()
    manifest = folder / "manifest.json"
    if manifest.is_file():
        for line in manifest.read_bytes().splitlines(keepends=True):
            if not line.lstrip().startswith(b'"created":'):
                h.update(line)
    else:
        h.update((folder / "config.json").read_bytes())
        for f in sorted(folder.glob("*.safetensors")):
            h.update(f"{f.name}:{f.stat().st_size}".encode())
    return h.hexdigest()


def tunable_decoders() -> tuple[str, ...]:
    """The decoders whose speed the (nodes, depth) budget sets, those `spot tune` tunes (by name)."""
    return tuple(sorted(decoder_names(tunable=True)))


def check_tunable(decoder: str) -> None:
    if not is_decoder(decoder, tunable=True):
        raise SpotError(f"--budget auto applies to the decoders {', '.join(tunable_decoders())} (those `spot tune` "
                        f"tunes), got --decoder {decoder}", "pass --budget N --depth D")


def tuning_key(engine, backend: str, folder: str | Path, decoder: str, drafter=None, rule=None) -> dict:
    """What a tuned budget holds for: model, engine and its placement, decoder (with the drafter's identity and tree
    settings, and the threshold rule's tau where it applies) and machine. rule: the decoder's CommitRule."""
    check_tunable(decoder)
    key = {"model": model_fingerprint(folder), "backend": backend, "block_size": engine.block_size,
           "placement": engine.placement, "decoder": decoder, "machine": machine_identity()}
    if rule is not None and rule.kind == THRESHOLD:
        key["tau"] = rule.tau
    if drafter is not None:
        key["drafter"] = {"onnx_sha256": drafter.manifest["onnx_sha256"],
                          "order_temperature": drafter.order_temperature,
                          "runner_up_weight": drafter.runner_up_weight, "set_flip_weight": drafter.set_flip_weight}
    return key


def record_path(key: dict) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]
    return tuning_dir() / f"{digest}.json"


REMEDY = "delete the file and run `spot tune` again"


# an entry of a record: what `spot tune` writes (its other fields, such as "measured", are a report); nodes within
# spot-export's --max-nodes range, depth within a block
ENTRY = Record({"temperature": Number(), "nodes": Integer(1, MAX_NODES), "depth": Integer(1, MAX_BLOCK_SIZE)},
               ("temperature", "nodes", "depth"), what="a tuned budget {\"temperature\", \"nodes\", \"depth\"}")
RECORD = Record({"key": Record({}), "by_temperature": MapOf(Text(), ENTRY)}, ("key", "by_temperature"))


def load_record(path: Path) -> dict:
    data = load_descriptor(path, FORMAT, FORMAT_VERSION, ("key", "by_temperature"), REMEDY, strict=True)
    return checked(data, RECORD, str(path), REMEDY)


def save_tuning(key: dict, tune_result: dict, warn=None) -> Path:
    """Record spot.app.bench_run.tune_budget's result under `key`, beside the temperatures tuned before (an unreadable
    record is replaced, said through `warn`: it is a cache); the file path. Concurrent tunes each keep their entry
    (the read-modify-write holds a lock file)."""
    path = record_path(key)
    with exclusive_lock(path.with_suffix(".lock")):
        record = {"format": FORMAT, "format_version": FORMAT_VERSION, "key": key, "by_temperature": {}}
        if path.is_file():
            try:
                record = load_record(path)
            except SpotError as e:
                if warn:
                    warn(f"replacing an unreadable tuning record ({e.message})")
        t = float(tune_result["temperature"]) + 0.0       # -0 is 0
        record["by_temperature"][number_name(t)] = {**tune_result["choice"], "temperature": t,
                                                    "measured": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        write_text_atomic(path, json.dumps(record, indent=2) + "\n")
    return path


def save_tunings(key: dict, tune_results, warn=None) -> Path | None:
    """save_tuning for each of several temperatures' results (spot bench --tune); the record's path."""
    path = None
    for tuned in tune_results:
        path = save_tuning(key, tuned, warn=warn)
    return path


def tuned_budget(key: dict, temperature: float, tune_command: str, engine=None) -> tuple[TreeBudget, float, Path]:
    """The budget tuned under `key` at the temperature nearest `temperature` (acceptance, and so the choice, moves
    with it): (budget, the temperature it was tuned at, the record's path), checked against `engine` when given.
    SpotError naming `tune_command`, the command that makes one, when there is none; naming the record when it is
    damaged."""
    path = record_path(key)
    if not path.is_file():
        raise SpotError(f"no tuned budget for this model, engine, decoder and machine (looked for {path})",
                        f"run `{tune_command}` first, or pass --budget N --depth D")
    entries = [(float(e["temperature"]), TreeBudget(e["nodes"], e["depth"]))
               for e in load_record(path)["by_temperature"].values()]
    if not entries:
        raise SpotError(f"{path} holds no tuned budget", REMEDY)
    tuned_at, budget = min(entries, key=lambda tb: (abs(tb[0] - temperature), tb[0]))
    if engine is not None:
        try:
            budget.check(engine)
        except SpotError as e:
            raise SpotError(f"the tuned budget in {path} does not fit this engine: {e.message}", REMEDY) from None
    return budget, tuned_at, path


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
    """The model and engine options as the user gave them: what `auto` looks up (spot.app.tuned_budgets.tuning_key) and the
    `spot tune` command that records it names. folder: the model folder as resolved (spot.app.models.model_folder);
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
    temperature nearest `temperature` (spot.app.tuned_budgets), checked against `engine`, and where it came from; SpotError
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
