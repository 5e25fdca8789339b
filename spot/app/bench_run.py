"""`spot bench`: every decoder side by side in one run, on one engine, on a prompt set (docs/spec.md §7).

For each (prompt, seed, temperature) the decoders run back to back, so machine drift hits all of them alike.
Reports passes per token, steps per verify pass, tokens/s, ratios to standard decoding, the share of outputs
identical to the baseline (standard for static-rule decoders, threshold for SPOT-Sets and the threshold-rule
chain-sets / tree-sets), acceptance by depth, the host/target split, and coupled vs independent drafting noise.
Writes JSON + Markdown (+ PNG plots with matplotlib).
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
import platform
from typing import Callable

import numpy as np

from spot.errors import SpotError
from spot.descriptors import sha256_file
from spot.app.ceilings import CEILING_NOTE, row_label
from spot.config import training_corpus
from spot.files import check_output_path, present, write_text_atomic
from spot.gsm8k import is_correct
from spot.app.models import find_drafter
from spot.ortlib import load_onnxruntime
from spot.owned import recorded_file_matches
from spot.app.plots import PLOT_FILES, plot_report
from spot.app.request_options import RequestOptions, resolve_request
from spot.runtime.decode_plan import DecodeRequest, run_decoder
from spot.runtime.registry import decoder as decoder_entry, decoder_names, exact_baseline, is_decoder
from spot.runtime.summary import summarize
from spot.runtime.spot import DEFAULT_DEPTH, TreeBudget
from spot.runtime.step import STATIC, THRESHOLD, CommitRule, Sampling
from spot.progress import Progress
from spot.prompts import Prompt, heldout_prompts_path, load_prompts
from spot.runtime import libm, native
from spot.runtime.decode import check_request
from spot.app.node_sweep import ProjectionTarget, check_node_sweep, sweep_markdown, sweep_points, sweep_report
from spot.runtime.tuning import (Noise, PassProfile, choose_budget, decode_timed, latency_curve, latency_spreads,
                                 measure_latency_samples, spread)
from spot.training.traces import corpus_prompts
from spot.app.tuned_budgets import model_fingerprint, number_name

@dataclass
class BenchConfig:
    decoders: tuple[str, ...] = field(default_factory=decoder_names)      # every decoder
    temperatures: tuple[float, ...] = (0.0, 0.5, 1.0)
    seeds: tuple[int, ...] = (0,)
    budgets: tuple[TreeBudget, ...] = (TreeBudget(16, 8),)
    max_new_tokens: int = 64
    tau: float = 0.9
    independent_noise_ablation: bool = True     # also run NOISE_ABLATION_DECODERS with independent drafting noise
    latency_nodes: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    node_sweep: tuple[int, ...] = ()            # --node-sweep: chain / tree / spot / ceilings at each node count
    projection: ProjectionTarget = ProjectionTarget()    # whose plan prices the sweep's pass counts (a projection)
    store_mode: str = "fused"       # spot.runtime.decode.STORE_MODES (--store)


def parse_decoders(text: str) -> tuple[str, ...]:
    """--decoders: comma-separated decoder names, each once, in order; SpotError naming any unknown one."""
    known = decoder_names()
    names = tuple(dict.fromkeys(d.strip() for d in text.split(",") if d.strip()))
    if not names:
        raise SpotError("--decoders names no decoder", f"e.g. --decoders standard,spot (any of {', '.join(known)})")
    unknown = [d for d in names if d not in known]
    if unknown:
        raise SpotError(f"unknown decoder(s) {', '.join(unknown)}, expected some of {', '.join(known)}",
                        "e.g. --decoders standard,spot")
    return names


def parse_sampling_grid(temperatures: str, seeds: str) -> tuple[tuple[float, ...], tuple[int, ...]]:
    """--temperatures and --seeds: comma-separated numbers, each once; every (temperature, seed) is checked now,
    not when the bench loop reaches it."""
    try:
        temps = tuple(dict.fromkeys(float(t) + 0.0 for t in temperatures.split(",")))     # -0.0 is 0.0
        seed_list = tuple(dict.fromkeys(int(x) for x in seeds.split(",")))
    except ValueError:
        raise SpotError("--temperatures and --seeds take comma-separated numbers",
                        "e.g. --temperatures 0,0.5,1.0 --seeds 0,1") from None
    for t in temps:
        for s in seed_list:
            Sampling(t, seed=s)
    return temps, seed_list


def parse_compare_drafters(specs, decoders: tuple[str, ...]) -> dict[str, str]:
    """--compare-drafter NAME=PATH (repeatable) -> {name: path}; only with a drafting decoder in `decoders`."""
    compare: dict[str, str] = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise SpotError(f"--compare-drafter expects NAME=PATH, got {spec!r}",
                            "e.g. --compare-drafter int8=int8-drafter/drafter.onnx")
        if name in compare:
            raise SpotError(f"--compare-drafter names {name!r} twice", "give each drafter its own name")
        compare[name] = path
    drafting = decoder_names(drafts=True)
    if compare and not set(drafting) & set(decoders):
        raise SpotError(f"--compare-drafter compares drafters, but --decoders has neither {' nor '.join(drafting)}",
                        f"add {' or '.join(drafting)} to --decoders")
    return compare


def check_report_dir(report_dir) -> None:
    """--report checked before the decoding, not after it."""
    if not report_dir:
        raise SpotError("--report is empty", "name a folder for bench.json and bench.md")
    check_output_path(report_dir, "--report", folder=True)


def check_report_files(report_dir, plots: bool) -> None:
    """Every file a run writes in --report (bench.json, bench.md, the plots), checked before the decoding."""
    for name in ("bench.json", "bench.md", *(PLOT_FILES if plots else ())):
        check_output_path(Path(report_dir) / name, "--report", folder=False)


def bench_prompts(path, folder, tokenizer, limit: int, prompt_tokens: int, engine, max_new_tokens: int
                  ) -> tuple[list[Prompt], Path]:
    """The first `limit` prompts of the JSONL file `path` — default: the model's own held-out prompts (a spot-export
    copies them), else the code model's — each cut to its last prompt_tokens tokens, and the file they came from.
    A prompt the engine cannot decode max_new_tokens after is named now, not when the loop reaches it."""
    if path is None:
        path = heldout_prompts_path(folder)
    prompts = [replace(p, ids=p.ids[-prompt_tokens:]) for p in load_prompts(path, tokenizer, limit, None)]
    for p in prompts:
        try:
            check_request(engine, p.ids, max_new_tokens)
        except SpotError as e:
            raise SpotError(f"prompt {p.id!r} of {path}: {e.message}", e.hint) from None
    return prompts, path


def default_budgets(engine) -> tuple[TreeBudget, ...]:
    """The tree budget a bench runs without --budgets: 16 nodes, depth 8 or the block size (SDAR's B = 4: 16x4)."""
    return (TreeBudget(16, min(DEFAULT_DEPTH, engine.block_size)),)


def record_bench_inputs(result: dict, folder, prompts_path, prompt_tokens: int) -> None:
    """Name what was measured in the result's config: the model (a manifest's hash names an export exactly) and the
    prompts."""
    result["config"].update(model=str(folder), model_sha256=model_fingerprint(folder),
                            prompts_file=str(prompts_path), prompt_tokens=prompt_tokens)


@dataclass(frozen=True)
class Variant:
    """One row of the bench: a decoder with its budget, commit rule and drafter."""

    label: str
    decoder: str
    budget: TreeBudget | None = None
    independent_noise: bool = False
    drafter: str = ""            # "" = the main drafter, else a --compare-drafter name
    mode: str = STATIC           # chain / tree's commit rule (threshold and spot-sets always use the threshold rule)

    @property
    def rule(self) -> str:
        """The commit rule it decodes with."""
        return decoder_entry(self.decoder).rule_kind(self.mode)

    @property
    def baseline(self) -> str:
        """The decoder whose output this variant must reproduce and whose passes it is measured against."""
        return decoder_entry(self.decoder).baseline(self.mode)


# the independent-noise ablation's rows: a training-free and a drafted decoder, static rule (not every row twice)
NOISE_ABLATION_DECODERS = ("chain", "spot")


def threshold_variant_of(name: str, decoders) -> bool:
    """Whether the training-free decoder `name` also runs under the threshold rule ("chain-sets"): beside a
    drafting decoder that always commits by threshold (SPOT-Sets' training-free baselines)."""
    return (is_decoder(name, speculates=True, drafts=False, ceiling=False, rule=None)
            and any(is_decoder(d, drafts=True, rule=THRESHOLD) for d in decoders))


def variants(cfg: BenchConfig, other_drafters=(), engine=None) -> list[Variant]:
    """The bench's rows in run order, each once; baselines first — every baseline a row is measured against, also
    when --decoders leaves it out. spot / spot-sets run once with the main drafter and once per name in
    other_drafters (label "spot[name]@NxD"). With spot-sets in the bench, chain and tree also run under the
    threshold rule ("chain-sets@NxD", "tree-sets@NxD"): SPOT-Sets' training-free baselines. A row's NxD is the
    budget it verifies: a chain's nodes are its depth + 1 (chain@9x8 at --budgets 16x8). Then the --node-sweep rows
    (spot.app.node_sweep.sweep_points; `engine` sizes them)."""
    out = []
    for given in cfg.budgets:
        for d in cfg.decoders:
            if not decoder_entry(d).speculates:
                continue
            budget = decoder_entry(d).verified_budget(given, engine)
            shape = f"@{budget.nodes}x{budget.depth}"
            out.append(Variant(d + shape, d, budget))
            if cfg.independent_noise_ablation and d in NOISE_ABLATION_DECODERS:
                out.append(Variant(d + shape + "+indep", d, budget, independent_noise=True))
            if threshold_variant_of(d, cfg.decoders):
                out.append(Variant(d + "-sets" + shape, d, budget, mode=THRESHOLD))
            if decoder_entry(d).drafts:
                out.extend(Variant(f"{d}[{name}]{shape}", d, budget, drafter=name) for name in other_drafters)
    if cfg.node_sweep:
        out += [Variant(p["variant"], p["decoder"], TreeBudget(*p["budget"]))
                for p in sweep_points(cfg.node_sweep, cfg.decoders, engine)]
    wanted = set(cfg.decoders) | {v.baseline for v in out}
    unique = {v.label: v for v in reversed(out)}            # two budgets, one chain (16x8, 32x8): run once
    return [Variant(d, d) for d in decoder_names(speculates=False) if d in wanted] + [v for v in out
                                                                                       if unique[v.label] is v]


def runnable_config(engine, cfg: BenchConfig) -> BenchConfig:
    """cfg as `engine` runs it: no independent-noise rows where it samples on the device (that noise is drawn from
    host logits, which a device-sampling engine never hands over)."""
    if engine.sampler_depth is not None and cfg.independent_noise_ablation:
        return replace(cfg, independent_noise_ablation=False)
    return cfg


def bench_size(engine, prompts: int, cfg: BenchConfig, other_drafters=()) -> str:
    """The line `spot bench` says before its first decode: how many decodes the run is, and why."""
    cfg = runnable_config(engine, cfg)
    rows = len(variants(cfg, tuple(other_drafters), engine))
    return (f"{prompts * len(cfg.seeds) * len(cfg.temperatures) * rows} decodes: {prompts} prompt(s) x "
            f"{len(cfg.seeds)} seed(s) x {len(cfg.temperatures)} temperature(s) x {rows} rows (fewer: --limit, "
            "--temperatures, --decoders, --budgets, --node-sweep)")


def run_bench(engine, prompts: list[Prompt], cfg: BenchConfig, drafter=None,
              progress: Callable[[str], None] | None = None, other_drafters: dict | None = None,
              tokenizer=None) -> dict:
    """Run every variant on every (prompt, seed, temperature); returns the JSON-ready result.

    other_drafters: name -> Drafter, compared with `drafter` on the same engine (e.g. one recalibrated on a
    quantized target). tokenizer: decodes outputs of prompts that carry a true answer (answers_right per row)."""
    other_drafters = other_drafters or {}
    needs_drafter = any(decoder_entry(d).drafts for d in cfg.decoders)
    if needs_drafter and drafter is None:
        raise SpotError(f"the bench includes {'/'.join(decoder_names(drafts=True))} but no drafter was given",
                        f"pass --drafter, or drop them with --decoders {','.join(decoder_names(drafts=False))}")
    for budget in cfg.budgets:          # before any decoding: a budget the engine cannot verify ends the run
        budget.check(engine)
    check_node_sweep(cfg.node_sweep, engine)
    if runnable_config(engine, cfg) != cfg:
        cfg = runnable_config(engine, cfg)
        if progress:
            progress("the engine samples on the device: no independent-noise rows (they need --sampler host)")
    runs: dict[tuple[str, float], list] = {}
    identical: dict[tuple[str, float], list[bool]] = {}
    right: dict[tuple[str, float], list[bool]] = {}     # prompts with a true answer: is the decoded one right
    plan = {v.label: v for v in variants(cfg, tuple(other_drafters), engine)}
    decodes = Progress(len(prompts) * len(cfg.seeds) * len(cfg.temperatures) * len(plan), progress)
    for prompt in prompts:
        for seed in cfg.seeds:
            for temp in cfg.temperatures:
                outputs = {}
                for v in plan.values():
                    options = RequestOptions(v.decoder, v.budget or TreeBudget(), None, cfg.max_new_tokens, v.mode,
                                             cfg.tau, Sampling(temp, seed=seed),
                                             independent_noise=v.independent_noise, store_mode=cfg.store_mode)
                    row_drafter = other_drafters[v.drafter] if v.drafter else drafter
                    gen = resolve_request(options, engine, drafter=lambda d=row_drafter: d).run(engine, prompt.ids)
                    outputs[v.label] = gen
                    runs.setdefault((v.label, temp), []).append(gen)
                    if prompt.answer is not None and tokenizer is not None:
                        right.setdefault((v.label, temp), []).append(
                            is_correct(tokenizer.decode(gen.token_ids), prompt.answer))
                    base = outputs.get(v.baseline)
                    if base is not None:
                        identical.setdefault((v.label, temp), []).append(gen.token_ids == base.token_ids)
                    decodes.step(f"prompt {prompt.id} seed {seed} T={temp:g} {v.label}")
    rows = []
    for (label, temp), gens in runs.items():
        v = plan[label]
        depth = v.budget.depth if v.budget is not None else None
        row = {"variant": label, "decoder": v.decoder, "rule": v.rule, "temperature": temp,
               **summarize(gens, depth=depth)}
        if v.budget is not None:
            row["budget"] = [v.budget.nodes, v.budget.depth]     # what it verifies: a chain's nodes are depth + 1
        if v.drafter:
            row["drafter"] = v.drafter
        if decoder_entry(v.decoder).ceiling:
            row["ceiling"] = True
        base = summarize(runs[(v.baseline, temp)]) if (v.baseline, temp) in runs else None
        if base:
            row["passes_reduction"] = base["passes_per_token"] / row["passes_per_token"]
            row["speedup"] = row["tokens_per_s"] / base["tokens_per_s"] if base["tokens_per_s"] else 0.0
        same = identical.get((label, temp), []) if label != v.baseline else []     # a baseline is not judged
        row["identical_share"] = float(np.mean(same)) if same else None
        if same:
            row["identical_cases"] = [int(sum(same)), len(same)]
        answers = right.get((label, temp))
        if answers:
            row["answers_right"] = [int(sum(answers)), len(answers)]
        rows.append(row)
    drafters = {"": drafter, **other_drafters} if needs_drafter else {}
    result = {"config": {"decoders": list(cfg.decoders), "temperatures": list(cfg.temperatures),
                         "seeds": list(cfg.seeds), "budgets": [[b.nodes, b.depth] for b in cfg.budgets],
                         "max_new_tokens": cfg.max_new_tokens, "tau": cfg.tau, "prompts": len(prompts),
                         "independent_noise_ablation": cfg.independent_noise_ablation,
                         "node_sweep": list(cfg.node_sweep), "store_mode": cfg.store_mode},
              "engine": engine_facts(engine),
              "drafters": {name: drafter_facts(d) for name, d in drafters.items()},
              "host": host_facts(engine, bool(drafters)), "rows": rows}
    if cfg.node_sweep:
        result["node_sweep"] = sweep_report(rows, sweep_points(cfg.node_sweep, cfg.decoders, engine),
                                            cfg.projection, engine.block_size)
    return result


def drafter_facts(drafter) -> dict:
    """Which drafter a row ran and how good its order model is: the graph (`encoder`, or `baseline` = the
    stale-confidence baseline's skips, its heads being zero), the trained shape, and the held-out next-commit
    top-1 / whole-set accuracy that training measured on held-out traces (drafter.json), beside the baseline's."""
    m = drafter.manifest
    acc = m.get("accuracy", {})

    def summary(name: str) -> dict | None:
        a = acc.get(name)
        if not a:
            return None
        return {"all": a.get("model"), "baseline": a.get("baseline"),
                "staleness_1": (a.get("staleness_1") or {}).get("model"), "examples": a.get("n")}
    arch = m.get("architecture", {})
    return {"path": str(drafter.path), "graph": m.get("graph", "encoder"), "parameters": arch.get("parameters"),
            "trained_shape": {k: arch[k] for k in ("d_model", "layers", "heads", "ffn") if k in arch},
            "heldout_top1": summary("top1"), "heldout_whole_set": summary("whole_set"),
            "accuracy_source": "drafter.json: held-out traces, measured at training"}


def host_facts(engine, drafted: bool = False) -> dict:
    """Where the timings were taken: speed figures are this machine's, passes and exactness are not. The versions
    are of what ran: the engine's runtime (torch, ONNX Runtime, TensorRT), and ONNX Runtime for a drafter (a torch
    run's report named ONNX Runtime's version alone)."""
    runtimes = {}
    if engine.name == "torch":
        # torch: optional extra (spot[export])
        import torch
        runtimes["torch"] = torch.__version__
    if engine.name == "tensorrt":
        # tensorrt: optional extra (spot[trt])
        import tensorrt
        runtimes["tensorrt"] = tensorrt.__version__
    if engine.name.startswith("ort") or drafted:
        runtimes["onnxruntime"] = load_onnxruntime().__version__
    return {"machine": platform.machine(), "cpus": os.cpu_count(), "python": platform.python_version(),
            "numpy": np.__version__, **runtimes, "libm": libm.backend(),
            "sampling": "numpy" if native.sampling is None else "c"}     # the per-step loops (spot.runtime.native)


def engine_facts(engine) -> dict:
    """What ran the passes: the backend, block size, device and placement (a report's header names them)."""
    return {"name": engine.name, "block_size": engine.block_size, **engine.placement}


def report_title(result: dict) -> str:
    """The report's first line: what ran where — backend, device, placement, block size."""
    e = result["engine"]
    place = ", ".join(f"{what} {e[key]}" for key, what in (("sampler", "sampler"), ("kv_cache", "KV cache"))
                      if key in e)
    return (f"spot bench: {e['name']} backend on {e.get('device', 'cpu')}" + (f" ({place})" if place else "")
            + f", block size {e['block_size']}")


TUNE_NEW_TOKENS = 48       # tokens decoded per prompt while the tuner measures acceptance
# each candidate's decodes, alternating with standard decoding's; each keeps its fastest. One reading of a 100-300 ms
# decode on a busy 2-core machine ranged 0.61x-1.39x for the same block-4 budget, and picked trees at 0.46x
TUNE_REPEATS = 3
# the budgets spot tune and spot bench --tune try (beside no speculation; those that do not fit an engine are skipped)
TUNE_CANDIDATES = tuple(TreeBudget(n, d) for n, d in ((2, 1), (4, 3), (8, 4), (16, 8), (32, 8), (64, 16)))


def tune_budget(engine, prompts: list[Prompt], temperature: float, candidates: list[TreeBudget],
                drafter=None, decoder: str = "spot", node_counts=(1, 2, 4, 8, 16, 32, 64),
                progress: Callable[[str], None] | None = None, curve: dict | None = None,
                rule: CommitRule | None = None) -> dict:
    """Measure latency(N) on this engine (unless `curve` already holds it), then decode `prompts` at `temperature`
    with `decoder` at each candidate budget, each beside standard decoding, and pick the budget with the highest
    measured steps/s over standard decoding's (choose_budget; the curve's prediction is reported beside). Acceptance
    depends on the temperature, so a choice holds for the temperature it was measured at. rule: the decoder's
    (Decoder.commit_rule; default: static, spot-sets threshold at tau 0.9); a threshold-rule decoder is compared with
    threshold decoding, a static one with standard decoding."""
    candidates = [b for b in candidates if b.fits(engine)]   # deeper than the block or the device epilogue: none
    node_counts = [n for n in node_counts if n <= engine.max_nodes]     # an export with --max-nodes 16: up to 16
    spreads = {}
    if curve is None:
        samples = measure_latency_samples(engine, np.asarray(prompts[0].ids), sorted(set(node_counts) | {1}))
        curve, spreads = latency_curve(samples), latency_spreads(samples)
        if progress:
            progress("latency ms by nodes: " + ", ".join(f"{n}:{ms:.1f}" for n, ms in curve.items()))
    rule = rule or RequestOptions(decoder).rule
    request = DecodeRequest(TUNE_NEW_TOKENS, mode=rule.kind, tau=rule.tau, sampling=Sampling(temperature))
    baseline = exact_baseline(rule.kind)
    decodes = Progress(len(candidates) * TUNE_REPEATS * 2 * len(prompts), progress)

    def profile(name: str, req: DecodeRequest, d=None, budget: TreeBudget | None = None
                ) -> tuple[PassProfile, list]:
        runs = []
        for p in prompts:
            runs.append(decode_timed(engine, lambda p=p: run_decoder(name, engine, p.ids, req, d)))
            if budget is not None:
                decodes.step(f"tuning decodes at {budget.nodes}x{budget.depth}")
        gens = [g for g, _, _ in runs]
        return PassProfile.of(gens, sum(h for _, h, _ in runs), sum(t for _, _, t in runs)), gens

    def fastest(a: tuple[PassProfile, list] | None, b: tuple[PassProfile, list]) -> tuple[PassProfile, list]:
        return b if a is None or b[0].steps_per_ms() > a[0].steps_per_ms() else a
    spv, profiles, speedups, by_curve = {}, {}, {}, {}
    standard_best = None        # standard decoding's fastest run of all: its host ms per step is reported
    for budget in candidates:
        key = (budget.nodes, budget.depth)
        beside = measured = None
        ms_per_step = {baseline: [], decoder: []}
        for _ in range(TUNE_REPEATS):   # alternating with standard decoding: drift hits both alike; noise only
            for name, req, d in ((baseline, request, None), (decoder, replace(request, budget=budget), drafter)):
                run = profile(name, req, d, budget)        # adds time, so each keeps its fastest
                ms_per_step[name].append(1.0 / max(run[0].steps_per_ms(), 1e-12))
                if name == baseline:
                    beside = fastest(beside, run)
                else:
                    measured = fastest(measured, run)
        spreads.update({f"decodes of {name}" + ("" if name == baseline else f" {budget.nodes}x{budget.depth}"):
                        spread(ms) for name, ms in ms_per_step.items()})
        standard_best = fastest(standard_best, beside)
        profiles[key], gens = measured
        spv[key] = summarize(gens).get("steps_per_verify", 1.0)
        speedups[key] = profiles[key].steps_per_ms() / beside[0].steps_per_ms()
        by_curve[key] = (profiles[key].steps / profiles[key].curve_ms(curve)) / (
            beside[0].steps / beside[0].curve_ms(curve))
        if progress:
            progress(f"budget {budget.nodes}x{budget.depth}: {spv[key]:.2f} steps/verify; measured "
                     f"{speedups[key]:.2f}x {baseline} decoding's steps/s (the choice goes by this), "
                     f"{by_curve[key]:.2f}x predicted from the latency curve (an explanation; far apart when the "
                     "machine is busy)")
    choice = choose_budget(speedups)
    standard_profile = (standard_best or profile(baseline, request))[0]     # (no candidate fits: one run)

    def host_per_step(p: PassProfile) -> float:
        return p.host_ms / max(p.steps, 1)

    def by_budget(values: dict) -> dict:
        return {f"{n}x{d}": v for (n, d), v in values.items()}
    return {"temperature": temperature, "latency_ms": curve,
            "standard_host_ms_per_step": host_per_step(standard_profile),
            "steps_per_verify": by_budget(spv),
            "host_ms_per_step": by_budget({k: host_per_step(p) for k, p in profiles.items()}),
            "measured_speedup": by_budget(speedups), "curve_speedup": by_budget(by_curve),
            "choice": {"nodes": choice.nodes, "depth": choice.depth,
                       "expected_speedup": choice.expected_speedup},
            "noise": Noise.of(spreads).to_dict()}


def check_tuned_budget(engine, prompts: list[Prompt], tune: dict, cfg: BenchConfig, decoder: str, drafter=None,
                       progress: Callable[[str], None] | None = None) -> dict:
    """Run `decoder` at the tuner's choice beside standard decoding, in the same runs (TUNE_REPEATS, each
    decoder's fastest), on `prompts` at the tuned temperature: the tokens/s ratio. The tuner's promise: never more
    than 5% slower than standard decoding (ratio >= 0.95; when no tree pays on this device it picks 1 node, and only
    the host loop's overhead remains)."""
    choice = TreeBudget(tune["choice"]["nodes"], tune["choice"]["depth"])
    check = BenchConfig(("standard", decoder), (tune["temperature"],), cfg.seeds, (choice,), cfg.max_new_tokens,
                        cfg.tau, independent_noise_ablation=False)
    # TUNE_REPEATS runs, each decoder's fastest (noise only adds time: one run of a few short decodes read a 1-node
    # choice, the standard loop itself, at 0.75x)
    runs = [run_bench(engine, prompts, check, drafter, progress)["rows"] for _ in range(TUNE_REPEATS)]
    best = {name: max((r for rows in runs for r in rows if r["decoder"] == name), key=lambda r: r["tokens_per_s"])
            for name in ("standard", decoder)}
    rows = [best[decoder]]
    ratio = best[decoder]["tokens_per_s"] / best["standard"]["tokens_per_s"] if best["standard"]["tokens_per_s"] \
        else 0.0
    ratios = {number_name(best[decoder]["temperature"]): round(ratio, 4)}
    return {"budget": f"{choice.nodes}x{choice.depth}", "decoder": decoder, "prompts": len(prompts),
            "tokens_per_s_ratio_to_standard": ratios,
            "passes_reduction": {number_name(r["temperature"]): round(r["passes_reduction"], 4) for r in rows},
            "identical_share": {number_name(r["temperature"]): r["identical_share"] for r in rows},
            "within_5_percent": all(v >= 0.95 for v in ratios.values())}


def tuning_drafter(decoder: str | None, drafter_path, folder, engine, say: Callable[[str], None]):
    """The (drafter, decoder) `spot tune` measures: spot / spot-sets with the drafter given or beside the model,
    checked against the engine before the latency sweep; no decoder named: spot where such a drafter fits, else the
    training-free tree decoder (say: the line that says so)."""
    drafter = None
    if decoder is not None and decoder_entry(decoder).drafts:
        drafter = find_drafter(drafter_path, folder)
        drafter.check_compatible(engine)        # before the latency sweep, not after it
    elif decoder is None:
        try:
            drafter, decoder = find_drafter(drafter_path, folder), "spot"
            drafter.check_compatible(engine)
        except SpotError as e:
            if drafter_path is not None:        # the drafter the user named must fit
                raise
            say(f"tuning the training-free tree decoder ({e.message}; --decoder spot with a drafter for this model "
                "tunes SPOT)")
            drafter, decoder = None, "tree"
    return drafter, decoder


TRAIN_SPLIT = "corpus train split"


def tuning_prompts(tokenizer, fallback: list[Prompt], n: int = 2, max_tokens: int = 128,
                   folder=None) -> tuple[list[Prompt], str]:
    """Prompts on which the tuner measures acceptance, and where they come from: the TRAIN split of the model's
    training corpus (spot.config.training_corpus of `folder`; spot.training.traces.corpus_prompts: code cut to
    64-128 tokens, then their last max_tokens) — never the prompts a benchmark then judges the choice on — or, for a
    model without a tokenizer to encode them, the first n of `fallback`."""
    if tokenizer is not None and max_tokens > 0:
        try:
            drawn = corpus_prompts(tokenizer, n, seed=0, min_tokens=64, max_tokens=128,
                                   corpus=training_corpus(folder) if folder is not None else "code")
        except SpotError:          # no corpus on this interpreter
            drawn = []
        if len(drawn) == n:
            return [Prompt(f"train-{i}", ids[-max_tokens:]) for i, ids in enumerate(drawn)], TRAIN_SPLIT
    return fallback[:n], "benchmark prompts (no tokenizer to cut training prompts with)"


def tuning_room(engine, max_tokens: int = 128) -> int:
    """The longest tuning prompt the engine's context holds with TUNE_NEW_TOKENS more (block-rounded)."""
    return min(max_tokens, engine.max_context - TUNE_NEW_TOKENS - engine.block_size)


def tune_by_temperature(engine, prompts: list[Prompt], cfg: BenchConfig, candidates: list[TreeBudget], decoder: str,
                        drafter=None, progress: Callable[[str], None] | None = None,
                        node_counts=(1, 2, 4, 8, 16, 32, 64), tokenizer=None, folder=None) -> dict:
    """One latency curve, then per bench temperature: the tuned budget (acceptance measured on 2 tuning_prompts)
    and that budget checked beside standard decoding on every benchmark prompt (`at_choice`)."""
    tuning, source = tuning_prompts(tokenizer, prompts, max_tokens=tuning_room(engine), folder=folder)
    curve, by_t = None, {}
    for t in cfg.temperatures:
        tuned = tune_budget(engine, tuning, t, candidates, drafter, decoder, node_counts, progress, curve)
        curve = tuned.pop("latency_ms")
        if progress:
            progress(f"T={t:g}: tuned budget {tuned['choice']['nodes']}x{tuned['choice']['depth']}; checking it "
                     "against standard decoding on every prompt")
        tuned["at_choice"] = check_tuned_budget(engine, prompts, tuned, cfg, decoder, drafter, progress)
        by_t[number_name(t)] = tuned
    return {"latency_ms": curve, "decoder": decoder, "tuning_prompts": source, "by_temperature": by_t,
            "within_5_percent": all(v["at_choice"]["within_5_percent"] for v in by_t.values()),
            "quiet": all(v["noise"]["quiet"] for v in by_t.values())}


def identical_cell(row: dict) -> str:
    """"100%" only when every case equals the baseline: 299 of 300 reads "99.6% (299/300)", never a rounded 100%."""
    cases = row.get("identical_cases")
    if not cases:
        return ""
    same, total = cases
    return "100%" if same == total else f"{math.floor(1000 * same / total) / 10:.1f}% ({same}/{total})"


def markdown_table(result: dict) -> str:
    cols = [("variant", "variant", "{}"), ("T", "temperature", "{:g}"), ("passes/token", "passes_per_token", "{:.3f}"),
            ("passes reduction", "passes_reduction", "{:.2f}x"), ("steps/verify", "steps_per_verify", "{:.2f}"),
            ("nodes/verify", "mean_nodes_per_verify", "{:.1f}"),
            ("tokens/s", "tokens_per_s", "{:.1f}"), ("speed-up", "speedup", "{:.2f}x"),
            ("identical", "identical_share", "{:.0%}"), ("host ms/verify", None, None)]
    if any("answers_right" in row for row in result["rows"]):
        cols.insert(-1, ("answers right", "answers_right", None))
    if any("epilogue_ms_per_step" in row for row in result["rows"]):
        # the device sampler: its epilogue runs inside the host times (once per commit step, any decoder)
        cols.append(("device epilogue ms/step", "epilogue_ms_per_step", "{:.1f}"))
    lines = ["| " + " | ".join(c[0] for c in cols) + " |", "|" + "---|" * len(cols)]
    for row in sorted(result["rows"], key=lambda r: r["temperature"]):     # then in run order: baselines first
        cells = []
        for _, key, fmt in cols:
            if key is None:
                host = row.get("draft_ms_per_verify", 0) + row.get("walk_ms_per_verify", 0)
                tgt = row.get("target_ms_per_verify")
                cells.append(f"{host:.1f} / {tgt:.1f}" if tgt else "")
                continue
            v = row.get(key)
            if key == "variant":
                cells.append(row_label(row))
                continue
            if key == "answers_right":
                cells.append(f"{v[0]}/{v[1]}" if v else "")
                continue
            cells.append(identical_cell(row) if key == "identical_share" else fmt.format(v) if v is not None else "")
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("\nRatios: static-rule rows against `standard`, threshold-rule rows (threshold, spot-sets, "
                 "chain-sets, tree-sets) against `threshold`, same temperature; a baseline row is 1.00x by definition.")
    if any(is_decoder(row.get("decoder"), ceiling=True) for row in result["rows"]):
        lines.append("\n" + CEILING_NOTE)
    if "node_sweep" in result:
        lines.append("\n" + sweep_markdown(result["node_sweep"]).rstrip("\n"))
    host = result.get("host")
    if host:
        lines.append("\nMeasured on " + ", ".join(f"{k} {v}" for k, v in host.items()))
    for name, d in result.get("drafters", {}).items():
        top1, whole = d.get("heldout_top1") or {}, d.get("heldout_whole_set") or {}
        shape = d.get("trained_shape", {})
        lines.append(f"\nDrafter{f' [{name}]' if name else ''} {d['path']}: graph {d['graph']}"
                     + (" (heads zero: the stale-confidence baseline)" if d["graph"] == "baseline" else "")
                     + (f", trained d {shape.get('d_model')} x {shape.get('layers')} layers, "
                        f"{d.get('parameters')} parameters" if shape else "")
                     + (f"; held-out next-commit top-1 {top1.get('all')} (staleness 1: {top1.get('staleness_1')}; "
                        f"baseline {top1.get('baseline')})" if top1 else "")
                     + (f", whole-set match {whole.get('all')}" if whole else "")
                     + (f" — {d['accuracy_source']}" if top1 else ""))
    return "\n".join(lines) + "\n"


def write_report(result: dict, out_dir: str | Path, plots: bool = True,
                 note: Callable[[str], None] = lambda line: None) -> list[Path]:
    """bench.json, bench.md and, when plots=True, PNG plots (matplotlib). Returns the paths. bench.json goes last
    (a previous one and its plots removed first): where it exists, the plots beside it are from its run — also when
    plotting fails, which then raises after bench.json is written. A previous run's plot is removed only when its
    bench.json lists it with the sha256 it still has ("files"): a file of that name spot did not write stays (said
    with note)."""
    out = Path(out_dir)
    written = [out / "bench.json", out / "bench.md"]
    previous = recorded_report_files(written[0])
    written[0].unlink(missing_ok=True)
    md = f"# {report_title(result)}\n\n" + markdown_table(result)
    if "tune" in result:
        md += "\n## Budget tuning\n\n```\n" + json.dumps(result["tune"], indent=2) + "\n```\n"
    write_text_atomic(written[1], md)
    for name in PLOT_FILES:            # a previous run's plots are not left beside this run's bench.json
        if recorded_file_matches(out / name, previous.get(name)):
            (out / name).unlink()
    try:
        if plots:
            written += plot_report(result, out)
    finally:                           # the measurements are kept even when plotting fails
        files = {p.name: sha256_file(p) for p in written[2:]}
        write_text_atomic(written[0], json.dumps({**result, "files": files}, indent=2))
    for name in PLOT_FILES:
        if present(out / name) and out / name not in written:
            note(f"note: {out / name} is not from this run, nor a plot an earlier spot bench listed in its "
                 "bench.json: left as it is")
    return written


def recorded_report_files(bench_json: Path) -> dict:
    """The plots a report's bench.json lists with their sha256 ({} for none, or an unreadable file)."""
    try:
        files = json.loads(bench_json.read_text()).get("files")
    except (OSError, ValueError, AttributeError):
        return {}
    return files if isinstance(files, dict) else {}
