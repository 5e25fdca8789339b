"""`spot generate` and `spot demo`: decode a prompt with one decoder; standard decoding beside SPOT on the embedded
models."""
from __future__ import annotations

import json

import click

from spot.cli.shared import (backend_option, echo_err, model_folder, placement_options, stderr_progress,
                              store_option)
from spot.engines.factory import open_engine
from spot.errors import SpotError
from spot.app.models import check_model_folder, find_drafter, resolve_backend
from spot.runtime.registry import REGISTRY, decoder_names
from spot.runtime.step import THRESHOLD, Sampling


@click.command()
@click.option("--model", "model_dir", type=click.Path(file_okay=False, path_type=str), default=None,
              help="SDAR checkpoint folder (config.json + safetensors; --backend torch) or exported folder "
                   "(spot-export; --backend ort). Default: the embedded model (--backend ort: spot demo's export "
                   "of it).")
@click.option("--prompt", default=None, help="Prompt text (needs the checkpoint's tokenizer).")
@click.option("--prompt-ids", default=None, help="Prompt as comma-separated token ids, e.g. 151644,872,198.")
@click.option("--prompt-file", type=click.Path(dir_okay=False, allow_dash=True, path_type=str), default=None,
              help="Prompt text from a UTF-8 file ('-': standard input), as --prompt.")
@click.option("--chat/--no-chat", default=None,
              help="Wrap --prompt in the chat template. Default: when the tokenizer has one.")
@click.option("--block-size", type=int, default=None, help="Block size B. Default: the config's block_size.")
@click.option("--mode", type=click.Choice(["static", "threshold"]), default="static", show_default=True,
              help="Commit rule: one token per pass, or every token with confidence > tau.")
@click.option("--tau", type=float, default=0.9, show_default=True,
              help=f"Threshold of the threshold rule, in [0, 1): --decoder {' / '.join(decoder_names(rule=THRESHOLD))}, "
                   "or --mode threshold.")
@click.option("--temperature", type=float, default=0.0, show_default=True, help="0 = greedy (argmax).")
@click.option("--top-k", type=int, default=0, show_default=True, help="0 disables top-k filtering.")
@click.option("--top-p", type=float, default=1.0, show_default=True, help="1 disables top-p filtering.")
@click.option("--seed", type=int, default=0, show_default=True, help="Noise seed (temperature > 0).")
@click.option("--max-new-tokens", type=int, default=128, show_default=True)
@click.option("--stop-ids", default=None,
              help="Comma-separated ids that end generation ('' = none). Default: the model's (config / export).")
@backend_option
@click.option("--device", default="cpu", show_default=True,
              help="Device of the backend (torch: cpu, cuda; ort: cpu, cuda, trt; tensorrt: cuda).")
@click.option("--decoder", type=click.Choice(decoder_names()), default="standard", show_default=True,
              help="; ".join(f"{d.name}: {d.summary}" for d in REGISTRY.values()) + ".")
@click.option("--budget", default="16", show_default=True,
              help="Tree nodes per verify pass (SPOT), or auto: the budget `spot tune` recorded for this model, "
                   "engine, decoder and machine (nodes and depth, tuned at the nearest temperature).")
@click.option("--depth", type=int, default=None,
              help="Deepest tree node below the root (SPOT). Default: 8, or the block size if smaller.")
@click.option("--drafter", "drafter_path", type=click.Path(path_type=str), default=None,
              help="drafter.onnx (or its folder). Default: the one beside the model, if any.")
@placement_options
@store_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text + stats.")
@click.option("--stream", is_flag=True,
              help="Print the output block by block as each block is final (with --json: one JSON line per block, "
                   "{\"block_ids\": [...]}, before the result).")
def generate(model_dir, prompt, prompt_ids, prompt_file, chat, block_size, mode, tau, temperature, top_k, top_p, seed,
             max_new_tokens, stop_ids, backend, device, decoder, budget, depth, drafter_path, sampler, kv_cache,
             store_mode, as_json, stream):
    """Generate with one decoder. SPOT decoders give the same tokens as standard decoding, in fewer passes.

    \b
    Examples:
      spot generate --prompt "def fibonacci(n):" --max-new-tokens 64
      spot generate --prompt "import os" --decoder spot --budget 16 --depth 8 --json
      spot generate --model out/code-fp32-onnx --backend ort --decoder spot-sets --tau 0.9 --prompt "x = ["
      spot generate --prompt "class Stack:" --decoder spot --stream
    """
    # the command's modules load when it runs: `import spot.cli` stays fast
    from spot.app.tuned_budgets import ModelArgs, tuned_note
    from spot.app.request_options import RequestOptions, resolve_request
    from spot.tokenizer import UNKNOWN_MARK, TrimmedStream, load_tokenizer, parse_prompt_ids, prompt_ids_for

    # every check that needs no model (the budget's form, sampling, the commit rule) before the weights load
    stops = None if stop_ids is None else tuple(parse_prompt_ids(stop_ids, "--stop-ids"))
    options = RequestOptions(decoder, budget, depth, max_new_tokens, mode, tau,
                             Sampling(temperature, top_k, top_p, seed), stops, store_mode=store_mode)
    if prompt_file is not None:     # before the model (the embedded model's export, on first use)
        if prompt is not None:
            raise SpotError("give one of --prompt TEXT or --prompt-file PATH, not both", "leave out one of them")
        # the command's modules load when it runs: `import spot.cli` stays fast
        from spot.prompts import read_prompt_file
        prompt = read_prompt_file(prompt_file)
    backend = resolve_backend(backend, model_dir)
    folder = model_folder(backend, model_dir)
    check_model_folder(backend, folder)  # folder / config errors first, before the tokenizer and the weights
    tokenizer = load_tokenizer(folder)
    ids = prompt_ids_for(tokenizer, prompt, prompt_ids, chat)
    engine = open_engine(backend, folder, block_size, device, sampler, kv_cache)
    # --budget auto looks for what `spot tune` recorded for the same model, engine options, decoder, temperature
    model = ModelArgs(folder, backend, model_dir, device, sampler, kv_cache, block_size, drafter_path)
    resolved = resolve_request(options, engine, model, lambda: find_drafter(drafter_path, folder))
    if resolved.tuned is not None and not as_json:       # what --budget auto chose, and why (--json: "budget")
        echo_err(tuned_note(resolved.plan.budget, resolved.tuned))
    printed = TrimmedStream(tokenizer) if stream and not as_json else None

    def on_block(block_ids):
        if as_json:
            click.echo(json.dumps({"block_ids": block_ids}))
        else:
            click.echo(printed.feed(block_ids), nl=False)
    gen = resolved.run(engine, ids, on_block if stream else None)
    text = tokenizer.decode(gen.token_ids, mark_unknown=True) if tokenizer is not None else None
    stats = gen.stats
    if as_json:
        out = {"token_ids": gen.token_ids, "stopped": gen.stopped, "cancelled": gen.cancelled,
               "overflow_ids": gen.overflow_ids,      # the last block past --max-new-tokens: not in the output
               "prompt_len": gen.prompt_len, "prompt_ids": ids,     # the ids a C++ host (spot_cli) decodes the same
               "block_size": engine.block_size, "mode": resolved.plan.rule.kind, "decoder": decoder,
               "backend": backend,
               "placement": engine.placement,
               "budget": resolved.budget_facts(), **stats.to_dict()}
        if text is not None:
            out["text"] = text
        click.echo(json.dumps(out))
        return
    if stream:
        click.echo(printed.end())
    else:
        click.echo(text.rstrip() if text is not None else " ".join(map(str, gen.token_ids)))
    unknown = [i for i in gen.token_ids if tokenizer is not None and not tokenizer.knows(i)]
    if unknown:
        echo_err(f"note: {len(unknown)} of the ids are not in the tokenizer's vocabulary (the model's is larger): "
                 f"shown as {UNKNOWN_MARK.format(unknown[0])}")
    passes = ", ".join(f"{k} {v}" for k, v in sorted(stats.passes.items()))
    rate = len(gen.token_ids) / stats.seconds if stats.seconds > 0 else 0.0
    echo_err(f"[{decoder}: {len(gen.token_ids)} tokens, {stats.target_passes} target passes ({passes}), "
             f"{stats.steps} steps, {stats.seconds:.2f} s, {rate:.1f} tok/s{', stopped' if gen.stopped else ''}]")


@click.command()
@click.option("--model", "models", multiple=True, metavar="NAME",
              help="Show only this embedded model (repeatable): arithmetic, code. Default: both, arithmetic first.")
@click.option("--prompt-index", type=int, default=0, show_default=True,
              help="Which held-out prompt of each model to decode.")
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=None,
              help="Default: the model's (arithmetic 160: a whole solution, it stops at its end; code 64).")
@click.option("--temperature", type=float, default=None,
              help="Sampling temperature for every model; SPOT's text is identical at any. Default: the model's "
                   "(arithmetic 0 = greedy, code 0.7: its greedy text loops).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--budget", type=int, default=None, help="Tree nodes per verify pass. Default: the model's.")
@click.option("--depth", type=int, default=None, help="Tree depth. Default: the model's.")
def demo(models, prompt_index, max_new_tokens, temperature, seed, budget, depth):
    """Export the embedded models to ONNX (cached), decode a held-out prompt of each with standard decoding and
    with SPOT on ONNX Runtime, and show that both texts are identical — in fewer target passes.

    \b
    Example:
      spot demo
      spot demo --model arithmetic --prompt-index 5
      spot demo --temperature 1.0 --seed 3
    """
    # the command's modules load when it runs: `import spot.cli` stays fast
    from spot.app.demo import DEMO_MODELS, demo_budget, demo_model_text, demo_summary, run_demo
    if temperature is not None:
        Sampling(temperature, seed=seed)        # refused now, not after the exports
    results = run_demo(models or DEMO_MODELS, prompt_index, max_new_tokens, temperature, seed,
                       demo_budget(models, budget, depth), progress=stderr_progress())
    for r in results:
        click.echo(demo_model_text(r))
    click.echo(demo_summary(results))
    if not all(r["identical"] for r in results):
        raise SystemExit(1)
