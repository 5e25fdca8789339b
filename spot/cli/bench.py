"""`spot bench` and `spot tune`: every decoder side by side on a prompt set; the tokens/s-optimal tree budget of an
engine, recorded for `--budget auto`."""
from __future__ import annotations

import click

from spot.cli.shared import backend_option, echo_err, open_model, placement_options, store_option
from spot.errors import SpotError
from spot.app.models import find_drafter, resolve_backend
from spot.runtime.registry import decoder as decoder_entry, decoder_names
from spot.runtime.step import THRESHOLD, Sampling
from spot.app.tuned_budgets import (check_tuning_dir, number_name, save_tuning, save_tunings, tunable_decoders,
                                    tuning_key)
import json
import sys


record_noisy_option = click.option(
    "--record-noisy", is_flag=True,
    help="Record the tuned budget even when the machine was busy while it was measured (repeated measurements "
         "spread more than 50%: by default it is then printed, not recorded).")


def recordable(tune_results: list[dict], save: bool, record_noisy: bool, say) -> bool:
    """Whether tune results (spot.app.bench_run.tune_budget's) are to be recorded: each measured on a quiet machine, or
    --record-noisy. Says why not (or warns, with --record-noisy or nothing to save)."""
    # the command's modules load when it runs: `import spot.cli` stays fast
    from spot.runtime.tuning import busy_machine_note
    noisy = [r["noise"] for r in tune_results if not r["noise"]["quiet"]]
    if not noisy:
        return save
    note = busy_machine_note(noisy[0])
    if save and not record_noisy:
        say(f"not recorded: {note}; run it again on a quiet machine (or pass --record-noisy)")
        return False
    say(f"warning: {note}")
    return save


@click.command()
@click.option("--model", "model_dir", type=click.Path(file_okay=False, path_type=str), default=None,
              help="Checkpoint or exported folder. Default: the embedded model (--backend ort: spot demo's export "
                   "of it).")
@backend_option
@click.option("--device", default="cpu", show_default=True)
@click.option("--block-size", type=int, default=None)
@click.option("--prompts", "prompts_path", type=click.Path(path_type=str), default=None,
              help="JSONL of prompts ({\"text\"} or {\"ids\"}). Default: the embedded held-out set.")
@click.option("--limit", type=click.IntRange(min=1), default=10, show_default=True, help="Number of prompts.")
@click.option("--prompt-tokens", type=click.IntRange(min=1), default=128, show_default=True,
              help="Keep the last N prompt tokens.")
@click.option("--decoders", default=",".join(decoder_names()), show_default=True)
@click.option("--temperatures", default="0,0.5,1.0", show_default=True)
@click.option("--seeds", default="0", show_default=True)
@click.option("--budgets", default=None,
              help="Comma-separated NODESxDEPTH. Default: 16x8, or 16xB when the block size B is smaller.")
@click.option("--node-sweep", default=None, metavar="N,N,...",
              help="Also report chain, tree, spot, order-oracle and oracle (those in --decoders) at each node count "
                   "(e.g. 2,4,8,16,64: small budgets): passes reduction, and the tokens/s those pass counts project "
                   "on the Jetson Orin boards (a roofline projection, not a measurement). Without --budgets: only "
                   "these budgets run.")
@click.option("--project-model", default="sdar-8b-b32", show_default=True,
              help="With --node-sweep: the preset whose memory plan prices the pass counts (at the bench's block "
                   "size, 2,048 tokens of context).")
@click.option("--project-weights", type=click.Choice(["fp", "int8", "int4"]), default="int4", show_default=True,
              help="With --node-sweep: --project-model's weights (fp16 otherwise).")
@click.option("--max-new-tokens", type=int, default=64, show_default=True)
@click.option("--tau", type=float, default=0.9, show_default=True)
@click.option("--drafter", "drafter_path", default=None, help="drafter.onnx (default: beside the model).")
@click.option("--compare-drafter", "compare_drafters", multiple=True, metavar="NAME=PATH",
              help=f"Also run {'/'.join(decoder_names(drafts=True))} with this drafter (labelled spot[NAME]), e.g. one recalibrated on a "
                   "quantized target. Repeatable.")
@click.option("--tune/--no-tune", default=False, help="Also measure latency(N) and pick the tokens/s-optimal budget.")
@record_noisy_option
@click.option("--report", "report_dir", type=click.Path(file_okay=False), default="bench-report", show_default=True)
@click.option("--plots/--no-plots", default=None,
              help="PNG plots beside the report. Default: when matplotlib is installed (the plots extra).")
@placement_options
@store_option
def bench(model_dir, backend, device, block_size, prompts_path, limit, prompt_tokens, decoders, temperatures, seeds,
          budgets, node_sweep, project_model, project_weights, max_new_tokens, tau, drafter_path, compare_drafters,
          tune, record_noisy, report_dir, plots, sampler, kv_cache, store_mode):
    """Every decoder side by side on a prompt set: passes per token, steps per verify, tokens/s, speed-up,
    identical-output share, acceptance by depth. Writes bench.json, bench.md and PNG plots to --report. It runs
    prompts x seeds x temperatures x rows decodes (said first; then progress with the time left): the defaults,
    10 x 1 x 3 x 12, take 10-15 minutes on a 2-core CPU.

    \b
    Examples:
      spot bench --limit 2 --temperatures 0 --budgets 16x8,64x16
      spot bench --model arithmetic --limit 4 --temperatures 0,0.7 --node-sweep 2,4,8,16,64 \\
          --decoders standard,chain,tree,spot,order-oracle,oracle
      spot bench --model out/code-fp32-onnx --backend ort --tune --report runs/ort
    """
    # the command's modules load when it runs: `import spot.cli` stays fast
    from spot.app.bench_run import (TUNE_CANDIDATES, BenchConfig, bench_prompts, bench_size, check_report_dir,
                            check_report_files, default_budgets, markdown_table, parse_compare_drafters,
                            parse_decoders, parse_sampling_grid, record_bench_inputs, report_title, run_bench,
                            tune_by_temperature, write_report)
    from spot.app.tuned_budgets import parse_tree_budgets
    from spot.app.node_sweep import ProjectionTarget, parse_node_sweep
    from spot.app.plots import plot_choice

    names = parse_decoders(decoders)
    temps, seed_list = parse_sampling_grid(temperatures, seeds)
    given_budgets = parse_tree_budgets(budgets) if budgets is not None else None
    sweep = parse_node_sweep(node_sweep, names) if node_sweep is not None else ()
    projection = ProjectionTarget(project_model, project_weights)
    if sweep:
        projection.check()              # an unknown preset now, not after the decoding
    check_report_dir(report_dir)       # before the decoding, not after
    if tune:                        # where --tune records its choices
        check_tuning_dir()
    compare = parse_compare_drafters(compare_drafters, names)
    plots, no_matplotlib = plot_choice(plots)
    check_report_files(report_dir, plots)
    backend = resolve_backend(backend, model_dir)
    engine, tokenizer, folder = open_model(backend, model_dir, block_size, device, sampler, kv_cache)
    prompts, prompts_path = bench_prompts(prompts_path, folder, tokenizer, limit, prompt_tokens, engine,
                                          max_new_tokens)
    drafting = any(decoder_entry(d).drafts for d in names)
    drafter = find_drafter(drafter_path, folder) if drafting else None
    others = {name: find_drafter(path, folder) for name, path in compare.items()}
    cfg = BenchConfig(names, temps, seed_list, given_budgets or (() if sweep else default_budgets(engine)),
                      max_new_tokens, tau, node_sweep=sweep, projection=projection,
                      store_mode=store_mode)
    echo_err(bench_size(engine, len(prompts), cfg, others))
    result = run_bench(engine, prompts, cfg, drafter, progress=echo_err, other_drafters=others, tokenizer=tokenizer)
    record_bench_inputs(result, folder, prompts_path, prompt_tokens)
    if tune:
        decoder = "spot" if drafter is not None else "tree"
        result["tune"] = tune_by_temperature(engine, prompts, cfg, TUNE_CANDIDATES, decoder, drafter,
                                             progress=echo_err, tokenizer=tokenizer, folder=folder)
    click.echo(f"{report_title(result)}\n\n{markdown_table(result)}")     # first: printed even if the report fails
    paths = write_report(result, report_dir, plots, echo_err)
    tuned = list(result["tune"]["by_temperature"].values()) if tune else []
    if tune and recordable(tuned, True, record_noisy, echo_err):   # after the report: what --budget auto decodes with
        record = save_tunings(tuning_key(engine, backend, folder, decoder, drafter), tuned, warn=echo_err)
        echo_err(f"recorded the tuned budgets in {record} (used by --budget auto)")
    echo_err("wrote " + ", ".join(str(p) for p in paths)
             + (" (no plots: pip install 'spot-edge[plots]' adds them)" if no_matplotlib else ""))


@click.command()
@click.option("--model", "model_dir", type=click.Path(file_okay=False, path_type=str), default=None,
              help="Checkpoint (--backend torch) or exported folder (--backend ort). Default: the embedded model "
                   "(--backend ort: spot demo's export of it).")
@backend_option
@click.option("--device", default="cpu", show_default=True)
@click.option("--block-size", type=int, default=None, help="Block size B. Default: the config's block_size.")
@click.option("--temperature", type=float, default=0.0, show_default=True)
@click.option("--limit", type=int, default=2, show_default=True,
              help="Prompts used to measure acceptance (cut from the embedded corpus's train split with the "
                   "model's tokenizer).")
@click.option("--drafter", "drafter_path", default=None,
              help=f"drafter.onnx (or its folder) for {' / '.join(decoder_names(drafts=True))}. Default: the one "
                   "beside the model, if any.")
@click.option("--decoder", type=click.Choice(tunable_decoders()), default=None,
              help="Decoder to tune. Default: spot with a drafter (--drafter, or the one beside the model), else "
                   "tree.")
@click.option("--mode", type=click.Choice(["static", "threshold"]), default="static", show_default=True,
              help=f"Commit rule of {' / '.join(sorted(decoder_names(tunable=True, rule=None)))} "
                   f"({', '.join(decoder_names(tunable=True, rule=THRESHOLD))}: always threshold), as in spot "
                   "generate.")
@click.option("--tau", type=float, default=0.9, show_default=True, help="Threshold of the threshold rule.")
@click.option("--save/--no-save", default=True, show_default=True,
              help="Record the choice for `--budget auto` (in $SPOT_CACHE/tuning, for this model, engine, decoder "
                   "and machine).")
@record_noisy_option
@placement_options
def tune(model_dir, backend, device, block_size, temperature, limit, drafter_path, decoder, mode, tau, save,
         record_noisy, sampler, kv_cache):
    """Measure verify latency vs node count on this engine and pick the tokens/s-optimal tree budget; `spot generate
    --budget auto` then decodes with it. A few minutes on a 2-core CPU, with progress and the time left. On a busy
    machine (repeated measurements more than 50% apart) it prints the result, records nothing and exits 1.

    \b
    Examples:
      spot tune --model out/code-fp32-onnx --backend ort --temperature 1
      spot generate --model out/code-fp32-onnx --backend ort --decoder spot --budget auto --temperature 1 \\
          --prompt "import os"
    """
    # the command's modules load when it runs: `import spot.cli` stays fast
    from spot.app.bench_run import TUNE_CANDIDATES, engine_facts, tune_budget, tuning_drafter, tuning_prompts, tuning_room
    from spot.app.request_options import RequestOptions

    temperature += 0.0           # -0 is 0: one tuning entry
    Sampling(temperature)        # a bad temperature is refused now, not after the latency sweep
    RequestOptions(mode=mode, tau=tau)     # a bad --tau is refused now, not after the latency sweep
    if limit < 1:
        raise SpotError(f"--limit must be >= 1, got {limit}", "e.g. --limit 2 (the default)")
    if save:                    # an unwritable cache is refused now, not after the sweep
        check_tuning_dir()
    backend = resolve_backend(backend, model_dir)
    engine, tokenizer, folder = open_model(backend, model_dir, block_size, device, sampler, kv_cache)
    prompts, source = tuning_prompts(tokenizer, [], limit, max_tokens=tuning_room(engine), folder=folder)
    if not prompts:
        raise SpotError(f"spot tune cuts its prompts from the embedded corpus's train split with the model's "
                        f"tokenizer, and {folder} has none", "use a model folder with tokenizer files, or "
                        "`spot bench --tune --prompts FILE.jsonl` with token ids")
    echo_err(f"measuring acceptance on {len(prompts)} prompt{'s' if len(prompts) != 1 else ''} from the {source}")
    drafter, decoder = tuning_drafter(decoder, drafter_path, folder, engine, echo_err)
    rule = decoder_entry(decoder).commit_rule(mode, tau)
    out = tune_budget(engine, prompts, temperature, TUNE_CANDIDATES, drafter, decoder, progress=echo_err, rule=rule)
    out["decoder"], out["rule"] = decoder, {"kind": rule.kind, "tau": rule.tau}
    out["engine"] = engine_facts(engine)      # what the latencies are of: backend, device, placement
    click.echo(json.dumps(out, indent=2))       # first: the measurement is printed even if recording fails
    record = recordable([out], save, record_noisy, echo_err)
    if save and not record:
        sys.exit(1)             # measured, not recorded: `spot tune && spot generate --budget auto` stops here
    if record:
        path = save_tuning(tuning_key(engine, backend, folder, decoder, drafter, rule), out, warn=echo_err)
        echo_err(f"recorded {out['choice']['nodes']}x{out['choice']['depth']} at temperature "
                 f"{number_name(temperature)} in {path} (used by --budget auto)")
