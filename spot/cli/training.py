"""The training commands: `spot train-target` (an embedded target), `spot traces` (standard-decoding traces),
`spot train-drafter` (the order model on them) and `spot calibrate-drafter` (its settings, by target passes)."""
from __future__ import annotations

import json

import click

from spot.cli.shared import backend_option, model_folder, open_model, placement_options, stderr_progress
from spot.errors import SpotError, number_list_arg
from spot.files import check_output_path
from spot.app.models import resolve_backend


@click.command("train-target")
@click.option("--corpus", type=click.Choice(["code", "arithmetic"]), default="code", show_default=True,
              help="What the target learns: code (the Python standard library, the code model's recipe) or "
                   "arithmetic (generated GSM8K-format word problems, the arithmetic model's recipe).")
@click.option("--out", type=click.Path(file_okay=False), default=None,
              help="Output Hugging Face folder. Default: the package's folder of that embedded model.")
@click.option("--steps", type=int, default=None,
              help="Optimizer steps. Default: the recipe's (code 2800 x 8 x 256 tokens; arithmetic: see "
                   "docs/embedded-model.md).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--minutes", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Wall-clock cap; stops early and still writes the folder.")
@click.option("--work-dir", type=click.Path(file_okay=False), default=None,
              help="Checkpoints and train.log (resumed when present). Default: next to --out.")
@click.option("--init-from", type=click.Path(file_okay=False, exists=True), default=None,
              help="arithmetic: start from this folder, trained by the recipe's first stage (the word problems "
                   "alone; its training_report.json is checked), instead of training that stage first.")
@click.option("--no-eval", is_flag=True, help="Skip the held-out evaluation written into training_report.json.")
@click.option("--quiet", is_flag=True, help="No progress lines.")
def train_target_cmd(corpus, out, steps, seed, minutes, work_dir, init_from, no_eval, quiet):
    """Train an embedded SDAR target (block diffusion, block 32): the code model on the Python standard library, or
    the arithmetic model on generated grade-school word problems.

    \b
    Examples:
      spot train-target --out /tmp/code --minutes 90
      spot train-target --corpus arithmetic --out /tmp/arithmetic
      spot train-target --corpus arithmetic --out /tmp/arithmetic --init-from ./words-stage
    """
    # the command's modules load when it runs: `import spot.cli` stays fast
    from spot.assets import model_folder_path
    from spot.training.target import RECIPES, train_target
    if steps is not None and steps < 1:
        raise SpotError(f"--steps must be >= 1, got {steps}",
                        "optimizer steps of 8 x 256 tokens; leave it out for the embedded recipe (2800)")
    if out is None:
        out = model_folder_path(corpus)
    check_output_path(out, "--out", folder=True, replaced=True)      # before the training, not after it
    report = train_target(out, steps, seed=seed, minutes=minutes, progress=not quiet, work_dir=work_dir,
                          settings=RECIPES[corpus], final_eval=not no_eval, init_from=init_from)
    click.echo(f"wrote {out}: {report['parameters']} parameters, {report['steps_done']} steps, "
               f"{report['train_seconds']:.0f}s")


@click.command("traces")
@click.option("--model", "model_dir", type=click.Path(file_okay=False, path_type=str), default=None,
              help="Target checkpoint (--backend torch) or exported folder (--backend ort). Default: the embedded "
                   "model (--backend ort: spot demo's export of it).")
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="Output .npz trace file.")
@click.option("--prompts", "prompts_file", type=click.Path(dir_okay=False), default=None,
              help="JSONL prompts: {\"ids\": [...]} or {\"text\": ...} per line.")
@click.option("--corpus-prompts", type=int, default=None,
              help="Instead of --prompts: N prompts cut from the TRAIN split of the embedded model's corpus.")
@click.option("--temperatures", default="0,0.5,1", show_default=True)
@click.option("--rules", default="static,threshold", show_default=True, help="Commit rules to trace.")
@click.option("--tau", type=float, default=0.9, show_default=True, help="Threshold of the threshold rule.")
@click.option("--seeds", type=int, default=2, show_default=True, help="Noise seeds per prompt at T > 0.")
@click.option("--cycle", is_flag=True,
              help="One request per prompt, going round temperature x rule x seed (more prompts per minute).")
@click.option("--max-new-tokens", type=int, default=64, show_default=True)
@click.option("--depth", type=int, default=16, show_default=True, help="Staleness 1..D recorded per step.")
@click.option("--minutes", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Stop collecting after this long.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the corpus prompt draw.")
@click.option("--block-size", type=int, default=None, help="Block size. Default: the config's.")
@backend_option
@click.option("--device", default="cpu", show_default=True)
@click.option("--quiet", is_flag=True, help="No progress lines.")
def traces_cmd(model_dir, out, prompts_file, corpus_prompts, temperatures, rules, tau, seeds, cycle, max_new_tokens,
               depth, minutes, seed, block_size, backend, device, quiet):
    """Collect standard-decoding traces for training the drafter (docs/spec.md §6).

    \b
    Example:
      spot traces --corpus-prompts 400 --cycle --minutes 8 --depth 16 --out traces.npz
    """
    # the command's modules load when it runs: `import spot.cli` stays fast
    from spot.engines.factory import open_engine
    from spot.app.models import check_model_folder
    from spot.tokenizer import load_tokenizer
    from spot.training.traces import TracePlan, collect_traces, fit_prompts, training_prompts

    backend = resolve_backend(backend, model_dir)
    folder = model_folder(backend, model_dir)
    check_model_folder(backend, folder)
    if (prompts_file is None) == (corpus_prompts is None):
        raise SpotError("give exactly one of --prompts FILE.jsonl and --corpus-prompts N",
                        "e.g. --corpus-prompts 400 (prompts cut from the embedded corpus's train split)")
    prompts = training_prompts(prompts_file, corpus_prompts, seed, load_tokenizer(folder), folder)
    plan = TracePlan(number_list_arg(temperatures, "--temperatures"), tuple(r.strip() for r in rules.split(",")),
                     tau, seeds, max_new_tokens, depth, cycle)
    check_output_path(out, "--out")       # a bad --out fails now, not after the decoding
    engine = open_engine(backend, folder, block_size, device, sampler="host")   # traces record the full logits
    if prompts_file is None:
        prompts = fit_prompts(prompts, engine, max_new_tokens)
    traces = collect_traces(engine, prompts, plan, minutes=minutes, progress=None if quiet else click.echo,
                            model_dir=str(folder))
    path = traces.save(out)
    click.echo(f"wrote {path}: {traces.n_traces} traces, {traces.n_rows} steps ({traces.meta['seconds']} s)")


@click.command("train-drafter")
@click.option("--traces", "trace_files", multiple=True, required=True, type=click.Path(dir_okay=False),
              help="Trace files from `spot traces` (repeatable).")
@click.option("--heldout-traces", multiple=True, type=click.Path(dir_okay=False),
              help="Held-out trace files for the accuracy report. Default: 10% of the prompts of --traces.")
@click.option("--out", type=click.Path(file_okay=False), default=None,
              help="Folder for drafter.onnx + drafter.json. Default: the target folder the traces came from.")
@click.option("--epochs", type=int, default=4, show_default=True)
@click.option("--batch-size", type=int, default=256, show_default=True)
@click.option("--lr", type=click.FloatRange(min=0, min_open=True), default=1e-3, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--minutes", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Wall-clock cap on training.")
@click.option("--tau", type=float, default=None, help="Threshold the membership head learns. Default: the traces'.")
@click.option("--threads", type=click.IntRange(1, 256), default=1, show_default=True)
@click.option("--width", type=int, default=128, show_default=True, help="Order model width (reference: 128).")
@click.option("--layers", type=int, default=3, show_default=True, help="Encoder layers (reference: 3).")
@click.option("--heads", type=int, default=8, show_default=True, help="Attention heads (reference: 8).")
@click.option("--ffn", type=int, default=512, show_default=True, help="FFN width (reference: 512).")
@click.option("--overwrite", is_flag=True, help="Replace a drafter already in the output folder.")
@click.option("--quiet", is_flag=True, help="No progress lines.")
def train_drafter_cmd(trace_files, heldout_traces, out, epochs, batch_size, lr, seed, minutes, tau, threads, width,
                      layers, heads, ffn, overwrite, quiet):
    """Train the order model on traces, calibrate SPOT-Sets' threshold, export drafter.onnx + drafter.json.

    \b
    Example:
      spot train-drafter --traces traces.npz --minutes 8 --out my-drafter
    """
    # the command's modules load when it runs: `import spot.cli` stays fast
    from spot.training.drafter import DrafterTrainSettings, OrderModelConfig, drafter_out_folder, train_drafter
    from spot.training.traces import Traces, concat_traces

    if epochs < 1 or batch_size < 1:
        raise SpotError(f"--epochs and --batch-size must be >= 1, got {epochs} and {batch_size}",
                        "e.g. --epochs 4 --batch-size 256 (the defaults)")
    config = OrderModelConfig(d_model=width, heads=heads, ffn=ffn, layers=layers)   # checks the shape first
    traces = concat_traces([Traces.load(p) for p in trace_files])
    heldout = concat_traces([Traces.load(p) for p in heldout_traces]) if heldout_traces else None
    out = drafter_out_folder(out, traces, overwrite)      # before the training, not after it
    settings = DrafterTrainSettings(epochs=epochs, batch_size=batch_size, lr=lr, seed=seed, minutes=minutes,
                                    tau=traces.meta["tau"] if tau is None else tau, threads=threads)
    log = (lambda _: None) if quiet else click.echo
    manifest = train_drafter(traces, out, settings, heldout, log=log, config=config)
    acc = manifest["accuracy"].get("top1", {})
    click.echo(f"wrote {out}: {manifest['architecture']['parameters']} parameters, held-out next-commit top-1 "
               f"{acc.get('model')} (stale-confidence baseline {acc.get('baseline')}), member threshold "
               f"{manifest['member_threshold']}")


@click.command("calibrate-drafter")
@click.option("--model", "model_dir", type=click.Path(file_okay=False, path_type=str), default=None,
              help="Target folder (checkpoint, or exported with --backend ort). Default: the embedded model "
                   "(--backend ort: spot demo's export of it).")
@click.option("--drafter", "drafter_path", default=None,
              help="Drafter folder or drafter.onnx to calibrate (its drafter.json is updated). Default: --model's.")
@backend_option
@click.option("--device", default="cpu", show_default=True)
@click.option("--prompts", "prompts_file", type=click.Path(dir_okay=False), default=None,
              help="JSONL training prompts ({\"ids\": [...]} or {\"text\": ...}); never the held-out ones.")
@click.option("--corpus-prompts", type=int, default=12, show_default=True,
              help="Without --prompts: N prompts cut from the TRAIN split of the embedded model's corpus.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the corpus prompt draw.")
@click.option("--temperatures", default="0,1", show_default=True, help="Sampling temperatures decoded.")
@click.option("--candidates", default="0.5,1,2,3", show_default=True, help="Order temperatures tried.")
@click.option("--runner-up-weights", default="0,0.1,0.17,0.3", show_default=True,
              help="Runner-up child weights tried (at the chosen order temperature); 0 = none.")
@click.option("--set-flip-weights", default="0,0.1,1", show_default=True,
              help="SPOT-Sets flip-variant weights tried (spot-sets, at the chosen settings); 0 = none.")
@click.option("--budget", default="16x8", show_default=True, help="Tree budget (nodes x depth).")
@click.option("--shape-budgets", default=None,
              help="Budgets that get their own tree shape (branch, depth, order temperature, runner-up weight), "
                   "priced by replaying standard decodes; 'none': no tree_shapes. Default: 2x2,4x4,8x8,16x8,64x16 "
                   "(depths capped at the block size, budgets over the export's max nodes left out).")
@click.option("--branches", default="1,2,4,8", show_default=True, help="Branches tried per tree shape.")
@click.option("--stale-top-bonuses", default="0,1,30", show_default=True,
              help="Order-logit bonuses of the most confident stale position tried per tree shape (0 = none).")
@click.option("--shapes-only", is_flag=True,
              help="Calibrate the tree shapes alone, from the drafter's own settings (no --budget decoding).")
@click.option("--max-new-tokens", type=int, default=64, show_default=True)
@click.option("--dry-run", is_flag=True, help="Measure and print; do not write drafter.json.")
@click.option("--quiet", is_flag=True, help="No progress lines.")
@placement_options
def calibrate_drafter_cmd(model_dir, drafter_path, backend, device, prompts_file, corpus_prompts, seed, temperatures,
                          candidates, runner_up_weights, set_flip_weights, budget, shape_budgets, branches,
                          stale_top_bonuses, shapes_only, max_new_tokens, dry_run, quiet, sampler, kv_cache):
    """Pick the drafter's order temperature, runner-up weight and SPOT-Sets flip weight by target passes on
    training prompts, then SPOT's tree shape per budget (writes drafter.json).

    \b
    Example (the drafter of the embedded model's export by spot demo):
      spot calibrate-drafter --model ~/.cache/spot/code-fp32-onnx --backend ort
      spot calibrate-drafter --model arithmetic --backend ort --shapes-only
    """
    # the command's modules load when it runs: `import spot.cli` stays fast
    from spot.app.tuned_budgets import parse_tree_budgets
    from spot.app.models import find_drafter
    from spot.training.calibration import (DEFAULT_SHAPE_BUDGETS, calibrate_drafter, calibrate_tree_shapes,
                                           check_calibration_writable, check_settings, check_shape_settings,
                                           fitted_shape_budgets, write_calibration)
    from spot.training.traces import fit_prompts, training_prompts

    budgets = parse_tree_budgets(budget)
    if len(budgets) != 1:
        raise SpotError(f"--budget takes one tree budget such as 16x8, got {budget!r}",
                        "calibrate at one budget: NODESxDEPTH, e.g. --budget 16x8")
    temps, cands = number_list_arg(temperatures, "--temperatures"), number_list_arg(candidates, "--candidates")
    weights = number_list_arg(runner_up_weights, "--runner-up-weights")
    flips = number_list_arg(set_flip_weights, "--set-flip-weights")
    shape_list = () if (shape_budgets or "").strip().lower() == "none" else \
        parse_tree_budgets(shape_budgets or DEFAULT_SHAPE_BUDGETS)
    branch_list = [int(b) if float(b).is_integer() else b for b in number_list_arg(branches, "--branches")]
    bonus_list = number_list_arg(stale_top_bonuses, "--stale-top-bonuses")
    if shapes_only and not shape_list:
        raise SpotError("--shapes-only with --shape-budgets none calibrates nothing",
                        "give --shape-budgets, e.g. 2x2,4x4,8x8,16x8,64x16")
    engine, tokenizer, folder = open_model(resolve_backend(backend, model_dir), model_dir, None, device, sampler,
                                           kv_cache)
    drafter = find_drafter(drafter_path, folder)
    check_settings(drafter, temps, cands, weights, flips)       # before the prompts are drawn and fitted
    if shape_list:
        shape_list = fitted_shape_budgets(shape_list, engine, shape_budgets is not None)
        check_shape_settings(drafter, shape_list, cands, weights, branch_list, bonus_list)
    if not dry_run:             # drafter.json is rewritten at the end: a read-only one is refused now
        check_calibration_writable(drafter)
    prompts = training_prompts(prompts_file, corpus_prompts, seed, tokenizer, folder)
    if prompts_file is None:
        prompts = fit_prompts(prompts, engine, max_new_tokens)
    result = {}
    if not shapes_only:
        result = calibrate_drafter(engine, drafter, prompts, temps, cands, weights, budgets[0], max_new_tokens,
                                   progress=stderr_progress(quiet), flip_candidates=flips)
        drafter = drafter.with_settings(result["order_temperature"], result["runner_up_weight"],
                                        result["set_flip_weight"])
    if shape_list:
        result.update(calibrate_tree_shapes(engine, drafter, prompts, temps, list(shape_list), cands, weights,
                                            branch_list, max_new_tokens, progress=stderr_progress(quiet),
                                            bonuses=bonus_list))
    click.echo(json.dumps(result, indent=2))
    if not dry_run:
        path = write_calibration(drafter.path, result, drafter.manifest["onnx_sha256"])
        click.echo(f"wrote {', '.join(k for k in result if not k.endswith('calibration'))} into {path}")
