"""Command line: `spot` (generate, bench, demo, training, engines) and `spot-export`.

User errors (SpotError, bad arguments) print one line plus a hint and exit 2; `--debug` keeps the traceback.
Each command lives in this file as a thin shell over library functions: parse, call, print.
"""
from __future__ import annotations

import copy
import dataclasses
import signal
import sys
import threading

import click

from spot import __version__
from spot.engines.factory import BACKENDS, EXPORTED_BACKENDS
from spot.errors import INTERRUPTED_LINE, TERMINATED_LINE, SpotError
from spot.files import check_output_path
from spot.runtime.decoders import DECODERS
from spot.runtime.spot import DEFAULT_DEPTH
from spot.tuned import TUNABLE_DECODERS

# Optional packages -> the extra that installs them: the runtime (generate/bench/tune/verify on an exported folder with
# --backend ort) needs none of them; export, training, the torch backend, plots and `spot serve` do.
OPTIONAL_EXTRAS = {"torch": "export", "onnx": "export", "safetensors": "export", "matplotlib": "plots",
                   "fastapi": "serve", "uvicorn": "serve", "prometheus_client": "serve"}


TERMINATED: list[int] = []      # the signal that ended the command, once terminate() ran


def terminate(signum, frame) -> None:
    """SIGTERM handler: exit with 128 + signum through the normal unwinding (temporary outputs removed)."""
    TERMINATED.append(signum)
    sys.exit(128 + signum)


def os_error_hint(e: OSError) -> str:
    """What to check for an OSError, by its errno (the message says which path)."""
    import errno
    return {errno.EACCES: "check the permissions of that path (reading it, or writing in its folder)",
            errno.EPERM: "check the permissions of that path (reading it, or writing in its folder)",
            errno.ENOENT: "check the path: it, or the folder it should be written in, does not exist",
            errno.ENOSPC: "free disk space, or write to another disk",
            errno.EDQUOT: "free disk space (the disk quota is used up), or write to another disk",
            errno.EROFS: "that file system is read-only: choose a path on a writable one",
            errno.EISDIR: "that path is a folder: give a file path",
            errno.ENOTDIR: "a part of that path is a file, not a folder",
            errno.ENOTEMPTY: "something else wrote that path at the same time (another spot process?): run again",
            errno.EEXIST: "something else wrote that path at the same time (another spot process?): run again"}.get(
        e.errno, "check the path, its permissions, and free disk space")


class SpotGroup(click.Group):
    """Turns SpotError, click's usage errors and a missing optional package into one clear line + hint (exit 2)
    unless --debug."""

    def make_context(self, info_name, args, parent=None, **extra):
        try:        # the group's own options: `spot --nope`
            return super().make_context(info_name, args, parent, **extra)
        except click.UsageError as e:
            self._fail(e.ctx, *usage_error(e, "spot"))

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except click.ClickException as e:       # a bad value, an unknown option or command, a missing argument
            if ctx.meta.get("spot.debug"):
                raise
            self._fail(ctx, *usage_error(e, command_name(ctx)))
        except SpotError as e:
            if ctx.meta.get("spot.debug"):
                raise
            self._fail(ctx, e.message, e.hint or f"`{command_name(ctx)} --help` says what each option takes")
        except OSError as e:     # a path the user gave or the environment: not found, not writable, a file in the way
            if ctx.meta.get("spot.debug"):
                raise
            where = f": {e.filename}" if e.filename else ""
            self._fail(ctx, f"{e.strerror or e}{where}", os_error_hint(e))
        except KeyboardInterrupt:       # Ctrl-C: one line (temporary outputs were removed while unwinding)
            if ctx.meta.get("spot.debug"):
                raise
            click.echo("\n" + INTERRUPTED_LINE, err=True)
            ctx.exit(130)
        except SystemExit as e:
            if TERMINATED and e.code == 128 + TERMINATED[0]:
                click.echo(TERMINATED_LINE, err=True)
            raise
        except ImportError as e:
            if TERMINATED:      # SIGTERM's exit inside an extension's import surfaces as "initialization failed"
                click.echo(TERMINATED_LINE, err=True)
                raise SystemExit(128 + TERMINATED[0]) from None
            package = (e.name or "").split(".")[0]
            if (ctx.meta.get("spot.debug") or not isinstance(e, ModuleNotFoundError)
                    or package not in OPTIONAL_EXTRAS):
                raise
            extra = OPTIONAL_EXTRAS[package]
            self._fail(ctx, f"`{command_name(ctx)}` needs the {package} package, which is not "
                            "installed (the ONNX Runtime decoding of an exported folder needs none of the extras)",
                       f"pip install 'spot-edge[{extra}]'" + (" (torch==2.13.0 is the CPU build)"
                                                              if extra == "export" else ""))

    @staticmethod
    def _fail(ctx, message: str, hint: str | None):
        click.echo(f"error: {message}", err=True)
        if hint:
            click.echo(f"  hint: {hint}", err=True)
        if ctx is None:
            sys.exit(2)
        ctx.exit(2)


def command_name(ctx) -> str:
    """The command a user typed, as `spot generate` or `spot-export` (the group's context: its subcommand's)."""
    sub = ctx.invoked_subcommand
    return "spot-export" if sub == "spot-export" else f"spot {sub}" if sub else "spot"


def usage_error(e: click.ClickException, command: str) -> tuple[str, str]:
    """(message, hint) of one of click's own errors, in spot's form (click printed its usage line and `Error: ...`
    with no hint)."""
    message = e.format_message()
    if message[:1].isupper() and message[1:2].islower():
        message = message[0].lower() + message[1:]
    sub = getattr(e, "ctx", None)
    command = "spot-export" if sub is not None and sub.info_name == "spot-export" else command
    if isinstance(e, click.NoSuchOption):
        return message, f"`{command} --help` lists its options"
    if "No such command" in e.format_message():
        return message, "`spot --help` lists the commands"
    return message, f"`{command} --help` says what each option and argument takes"


@click.group(cls=SpotGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show full tracebacks for errors.")
@click.version_option(__version__)
@click.pass_context
def main(ctx, debug):
    """spot: SPOT speculative decoding for SDAR diffusion LMs on ONNX Runtime / TensorRT."""
    ctx.meta["spot.debug"] = debug
    for stream in (sys.stdout, sys.stderr):     # a path of bytes that are not UTF-8 is printed as those bytes
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="surrogateescape")
    # SIGTERM (a service manager, `timeout`) unwinds like Ctrl-C, so that half-written outputs are removed
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, terminate)


def placement_options(command):
    """--sampler and --kv-cache: where an ort engine samples and keeps its KV cache (commands that decode)."""
    command = click.option(
        "--kv-cache", type=click.Choice(["auto", "host", "device"]), default="auto", show_default=True,
        help="ort: keep the KV cache where the target runs (device: appended there by the export's kv_append.onnx) "
             "or in numpy arrays sent with every pass (host). auto: device on cuda/trt.")(command)
    return click.option(
        "--sampler", type=click.Choice(["auto", "host", "device"]), default="auto", show_default=True,
        help="ort: sample with the export's epilogue graph next to the target (device: only small arrays reach the "
             "host) or with numpy on the logits (host). auto: device on cuda/trt, host on cpu.")(command)


def stderr_progress(quiet: bool = False):
    """Progress lines to stderr (stdout stays the command's result), or none with --quiet. A line starting with "\r"
    updates a progress bar (spot.export.options.Progress): rewritten in place on a terminal ("\r" alone clears it),
    elsewhere printed at most every 30 s."""
    if quiet:
        return lambda line: None
    import shutil
    import time
    terminal, bar, last = sys.stderr.isatty(), [False], [time.monotonic()]

    def say(line: str) -> None:
        if line.startswith("\r"):
            text = line[1:]
            if terminal:
                width = shutil.get_terminal_size().columns - 1      # a wrapped line cannot be rewritten
                click.echo("\r\x1b[K" + text[:width], nl=False, err=True)
                bar[0] = bool(text)
            elif text and time.monotonic() - last[0] >= 30:
                click.echo(text.strip(), err=True)
                last[0] = time.monotonic()
            return
        if bar[0]:
            click.echo("\r\x1b[K", nl=False, err=True)
            bar[0] = False
        click.echo(line, err=True)
        last[0] = time.monotonic()
    return say


def read_prompt_file(path: str) -> str:
    """The text of --prompt-file ('-': standard input), UTF-8; SpotError naming the file otherwise."""
    limit = 64 * 2**20     # far beyond any context; a device or a wrong file is refused before it fills memory
    try:
        if path == "-":
            data = sys.stdin.buffer.read(limit + 1)
        else:
            with open(path, "rb") as f:
                data = f.read(limit + 1)
    except OSError as e:
        import errno
        raise SpotError(f"cannot read the prompt file {path}: {e.strerror}",
                        "check the path, or pass - to read the prompt from standard input" if e.errno == errno.ENOENT
                        else os_error_hint(e)) from None
    if len(data) > limit:
        raise SpotError(f"the prompt file {path} is larger than 64 MiB", "pass the prompt text itself")
    from spot.descriptors import utf8_text      # (a leading byte-order mark is not part of the prompt)
    return utf8_text(data, f"the prompt file {path}", "convert it to UTF-8, or pass token ids with --prompt-ids")


def check_model_folder(backend: str, folder) -> None:
    """The model folder's errors before anything loads from it: an exported folder (ort) by its manifest — a
    missing or edited config.json there is a changed export, not a broken checkpoint — a checkpoint by config.json."""
    if backend in EXPORTED_BACKENDS:
        from spot.folder.manifest import load_manifest
        load_manifest(folder)
    else:
        from spot.config import load_config
        load_config(folder)


def resolve_backend(backend: str | None, model_dir) -> str:
    """--backend, else what --model is: an exported folder (manifest.json) runs on ort, a checkpoint on torch; an
    embedded model (no --model, or its name) runs on ONNX Runtime, the product runtime, wherever onnxruntime is
    installed (spot demo's export of it), else on torch."""
    from spot.assets import embedded_name
    if backend is not None:
        return backend
    if model_dir is not None and embedded_name(model_dir) is None:
        from pathlib import Path
        return "ort" if (Path(model_dir) / "manifest.json").is_file() else "torch"
    import importlib.util
    return "ort" if importlib.util.find_spec("onnxruntime") is not None else "torch"


def model_folder(backend: str, model_dir):
    """--model: a folder, or an embedded model's name (spot.assets: code, arithmetic) — its checkpoint (torch) or
    its export by `spot demo` (ort, tensorrt), made here on first use (one progress line, seconds) and reused. No
    --model: the default embedded model."""
    from spot.assets import DEFAULT_MODEL, embedded_model_dir, embedded_name
    name = DEFAULT_MODEL if model_dir is None else embedded_name(model_dir)
    if name is None:
        return model_dir
    if backend not in EXPORTED_BACKENDS:
        return embedded_model_dir(name)
    from spot.demo import embedded_export_dir, exported_embedded
    folder = embedded_export_dir(name)
    try:
        return exported_embedded(stderr_progress(), name)
    except ModuleNotFoundError as e:        # no export extra here: a copied or older export still decodes
        if e.name not in ("torch", "onnx", "safetensors") or not (folder / "manifest.json").is_file():
            raise
        click.echo(f"note: {folder} was exported from another version of spot or of its embedded model; "
                   f"exporting it again needs the {e.name} package (pip install 'spot-edge[export]')", err=True)
        return folder


def find_drafter(path, model_dir):
    """The drafter given by --drafter, else drafter.onnx beside the model; SpotError naming where it looked."""
    from pathlib import Path

    from spot.runtime.drafter import load_drafter
    if path is not None:
        return load_drafter(path)
    here = Path(model_dir) / "drafter.onnx"
    if here.is_file():
        return load_drafter(here)
    raise SpotError(f"no drafter given and none found at {here}",
                    "pass --drafter PATH (train one with `spot train-drafter`), or use --decoder chain/tree")


@main.command()
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
              help="Threshold of the threshold rule, in [0, 1): --decoder threshold / spot-sets, or --mode threshold.")
@click.option("--temperature", type=float, default=0.0, show_default=True, help="0 = greedy (argmax).")
@click.option("--top-k", type=int, default=0, show_default=True, help="0 disables top-k filtering.")
@click.option("--top-p", type=float, default=1.0, show_default=True, help="1 disables top-p filtering.")
@click.option("--seed", type=int, default=0, show_default=True, help="Noise seed (temperature > 0).")
@click.option("--max-new-tokens", type=int, default=128, show_default=True)
@click.option("--stop-ids", default=None,
              help="Comma-separated ids that end generation ('' = none). Default: the model's (config / export).")
@click.option("--backend", type=click.Choice(BACKENDS), default=None,
              help="Default: ort for an exported folder, torch for a checkpoint; without --model, "
                   "the embedded model on ort (its export, made on first use) where onnxruntime is "
                   "installed.")
@click.option("--device", default="cpu", show_default=True,
              help="Device of the backend (torch: cpu, cuda; ort: cpu, cuda, trt; tensorrt: cuda).")
@click.option("--decoder", type=click.Choice(DECODERS), default="standard", show_default=True,
              help="standard/threshold: one pass per step; chain/tree: SPOT with the training-free order; "
                   "spot/spot-sets: SPOT with the drafter; oracle / order-oracle: diagnostic ceilings (true "
                   "states / true positions with the drafter's tokens).")
@click.option("--budget", default="16", show_default=True,
              help="Tree nodes per verify pass (SPOT), or auto: the budget `spot tune` recorded for this model, "
                   "engine, decoder and machine (nodes and depth, tuned at the nearest temperature).")
@click.option("--depth", type=int, default=None,
              help="Deepest tree node below the root (SPOT). Default: 8, or the block size if smaller.")
@click.option("--drafter", "drafter_path", type=click.Path(path_type=str), default=None,
              help="drafter.onnx (or its folder). Default: the one beside the model, if any.")
@placement_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text + stats.")
@click.option("--stream", is_flag=True,
              help="Print the output block by block as each block is final (with --json: one JSON line per block, "
                   "{\"block_ids\": [...]}, before the result).")
def generate(model_dir, prompt, prompt_ids, prompt_file, chat, block_size, mode, tau, temperature, top_k, top_p, seed,
             max_new_tokens, stop_ids, backend, device, decoder, budget, depth, drafter_path, sampler, kv_cache,
             as_json, stream):
    """Generate with one decoder. SPOT decoders give the same tokens as standard decoding, in fewer passes.

    \b
    Examples:
      spot generate --prompt "def fibonacci(n):" --max-new-tokens 64
      spot generate --prompt "import os" --decoder spot --budget 16 --depth 8 --json
      spot generate --model out/code-fp32-onnx --backend ort --decoder spot-sets --tau 0.9 --prompt "x = ["
      spot generate --prompt "class Stack:" --decoder spot --stream
    """
    import json
    from dataclasses import replace

    from spot.budgets import budget_nodes, tree_budget as resolve_tree_budget, tune_command
    from spot.engines.factory import open_engine
    from spot.runtime.decoders import TREE_DECODERS, DecodeRequest, rule_for, run_decoder, verified_budget
    from spot.runtime.step import Sampling
    from spot.tokenizer import UNKNOWN_MARK, TextStream, load_tokenizer, parse_prompt_ids, prompt_ids_for

    nodes = budget_nodes(budget, decoder)      # before the weights load
    if prompt_file is not None:     # before the model (the embedded model's export, on first use)
        if prompt is not None:
            raise SpotError("give one of --prompt TEXT or --prompt-file PATH, not both", "leave out one of them")
        prompt = read_prompt_file(prompt_file)
    sampling = Sampling(temperature, top_k, top_p, seed)
    stops = None if stop_ids is None else tuple(parse_prompt_ids(stop_ids, "--stop-ids"))
    request = DecodeRequest(max_new_tokens, mode, tau, sampling, stop_ids=stops)
    rule = rule_for(decoder, request)     # a bad --tau before the weights load
    backend = resolve_backend(backend, model_dir)
    folder = model_folder(backend, model_dir)
    check_model_folder(backend, folder)  # folder / config errors first, before the tokenizer and the weights
    tokenizer = load_tokenizer(folder)
    ids = prompt_ids_for(tokenizer, prompt, prompt_ids, chat)
    engine = open_engine(backend, folder, block_size, device, sampler, kv_cache)
    drafter = find_drafter(drafter_path, folder) if decoder in ("spot", "spot-sets") else None
    # the command that records what --budget auto looks for: the same model, engine options, decoder, temperature
    command = tune_command(model_dir, backend, device, sampler, kv_cache, block_size, drafter_path, decoder,
                           temperature, rule)
    tree_budget, tuned = resolve_tree_budget(nodes, depth, engine, backend, folder, decoder, drafter, rule,
                                             request.sampling.temperature, command)
    request = replace(request, budget=tree_budget)
    if tuned is not None and not as_json:       # what --budget auto chose, and why (--json: "budget")
        click.echo(_tuned_note(verified_budget(decoder, tree_budget, engine), tuned), err=True)
    on_block, text_stream, held = None, None, [""]
    if stream and as_json:
        def on_block(block_ids):
            click.echo(json.dumps({"block_ids": block_ids}))
    elif stream:
        text_stream = TextStream(tokenizer, mark_unknown=True) if tokenizer is not None else None

        def on_block(block_ids):
            # trailing whitespace waits for more text, and the end drops it, as without --stream (the embedded
            # model's blocks often end in newlines: ~30 blank lines stood before the stats line)
            piece = held[0] + (text_stream.feed(block_ids) if text_stream else "".join(f" {i}" for i in block_ids))
            held[0] = piece[len(piece.rstrip()):]
            click.echo(piece.rstrip(), nl=False)
    gen = run_decoder(decoder, engine, ids, request, drafter, on_block)
    text = tokenizer.decode(gen.token_ids, mark_unknown=True) if tokenizer is not None else None
    stats = gen.stats
    if as_json:
        verified = verified_budget(decoder, tree_budget, engine) if decoder in TREE_DECODERS else None
        out = {"token_ids": gen.token_ids, "stopped": gen.stopped, "cancelled": gen.cancelled,
               "overflow_ids": gen.overflow_ids,      # the last block past --max-new-tokens: not in the output
               "prompt_len": gen.prompt_len, "prompt_ids": ids,     # the ids a C++ host (spot_cli) decodes the same
               "block_size": engine.block_size, "mode": rule.kind, "decoder": decoder,
               "backend": backend,
               "placement": engine.placement,
               "budget": ({"nodes": verified.nodes, "depth": verified.depth, "tuned": tuned}
                          if verified is not None else None), **stats.to_dict()}
        if text is not None:
            out["text"] = text
        click.echo(json.dumps(out))
        return
    if stream:
        click.echo((held[0] + text_stream.end()).rstrip() if text_stream else "")
    else:
        click.echo(text.rstrip() if text is not None else " ".join(map(str, gen.token_ids)))
    unknown = [i for i in gen.token_ids if tokenizer is not None and not tokenizer.knows(i)]
    if unknown:
        click.echo(f"note: {len(unknown)} of the ids are not in the tokenizer's vocabulary (the model's is larger): "
                   f"shown as {UNKNOWN_MARK.format(unknown[0])}", err=True)
    passes = ", ".join(f"{k} {v}" for k, v in sorted(stats.passes.items()))
    rate = len(gen.token_ids) / stats.seconds if stats.seconds > 0 else 0.0
    click.echo(f"[{decoder}: {len(gen.token_ids)} tokens, {stats.target_passes} target passes ({passes}), "
               f"{stats.steps} steps, {stats.seconds:.2f} s, {rate:.1f} tok/s{', stopped' if gen.stopped else ''}]",
               err=True)


def _tuned_note(budget, tuned: dict) -> str:
    """The line that says what --budget auto decodes with, and why when it is no tree at all."""
    from spot.runtime.tuning import MIN_TREE_GAIN
    from spot.tuned import number_name
    where = f"tuned at temperature {number_name(tuned['temperature'])} ({tuned['record']})"
    if budget.nodes == 1:
        return (f"budget auto: 1 node, so standard decoding (one target pass per commit step): `spot tune` measured no "
                f"tree more than {MIN_TREE_GAIN:g}x faster than it for this model, engine and machine; {where}")
    return f"budget auto: {budget.nodes} nodes x depth {budget.depth}, {where}"


@main.command("export")
@click.argument("source")
@click.option("--checkpoint", type=click.Path(file_okay=False), default=None,
              help="Checkpoint folder of a preset (default: the Hugging Face cache, $HF_HOME/hub).")
@click.option("--out", type=click.Path(file_okay=False), default=None,
              help="Output folder (default: ./NAME-DTYPE-onnx). Written atomically.")
@click.option("--dtype", type=click.Choice(["fp32", "fp16", "bf16"]), default=None,
              help="Weight dtype. Default: fp16 (fp32 for `embedded`). bf16 is refused (no ORT CPU kernels).")
@click.option("--opset", type=int, default=17, show_default=True, help="ONNX opset: 17 or 18.")
@click.option("--max-nodes", type=int, default=64, show_default=True,
              help="Most candidate states per verify pass (recorded; the engine enforces it).")
@click.option("--max-context", type=int, default=None,
              help="Longest context in tokens (recorded; default: max_position_embeddings).")
@click.option("--block-size", type=int, default=None, help="Decoding block size (default: preset, else config).")
@click.option("--dry-run", is_flag=True, help="Build and check the graph of the real config without weights.")
@click.option("--no-validate", is_flag=True, help="Skip the comparison with the torch reference (not advised).")
@click.option("--validate-layers", type=click.IntRange(min=1), default=None,
              help="Validate the first K layers only (default: all up to 300M parameters, else 2).")
@click.option("--overwrite", is_flag=True, help="Replace an existing --out folder.")
@click.option("--weights", type=click.Choice(["fp", "int8", "int4"]), default="fp", show_default=True,
              help="Linear-layer weights: fp (= --dtype), int8 per channel or int4 in blocks (weight-only; embed, "
                   "lm_head stay in --dtype). int4 graphs are opset 21.")
@click.option("--int4-block", type=click.Choice(["32", "64", "128"]), default=None,
              help="Input features per int4 scale (--weights int4 only). Default: 128.")
@click.option("--ort-matmulnbits", is_flag=True,
              help="int4 as com.microsoft MatMulNBits: ONNX Runtime only (TensorRT cannot parse it).")
@click.option("--plan", "plan_device", default=None, metavar="DEVICE",
              help="Memory plan for orin-nano-8gb, orin-nx-16gb, agx-orin-32gb, agx-orin-64gb or <N>GB: printed "
                   "(and nothing exported; exit status 1 when it does not fit) unless --out is given; with --out "
                   "the export must fit.")
@click.option("--plan-bench", type=click.Path(dir_okay=False), default=None,
              help="With --plan: a `spot bench` bench.json whose measured pass counts project SPOT's tokens/s on "
                   "the device against standard decoding (a roofline projection, not a measurement).")
@click.option("--passes-reduction", default=None, metavar="NODES=R,...",
              help="With --plan, without a bench.json: measured passes reductions by node budget (e.g. "
                   "16=1.9,64=2.3) for the same projection.")
@click.option("--epilogue-steps", type=int, default=None,
              help="Future steps D of the device sampling epilogue (epilogue.onnx, used on GPU paths; the deepest "
                   "SPOT tree it serves). Default: 8, or the block size if smaller. 0: no epilogue.")
@click.option("--epilogue-positions", type=int, default=None,
              help="Block positions per device-epilogue call (a divisor of the block size): its memory is "
                   "9.5 x (D+1) x P x V x 8 bytes. Default: the most that keep it under 1 GiB.")
@click.option("--tensorrt", "tensorrt_mode", type=click.Choice(["auto", "yes", "no"]), default="auto",
              show_default=True,
              help="Also build the TensorRT engine (spot build-engine's defaults, into its cache): auto = when "
                   "TensorRT and a CUDA GPU are here (engines are specific to the GPU and TensorRT version).")
@click.option("--quiet", is_flag=True, help="No progress lines.")
def export(source, checkpoint, out, dtype, opset, max_nodes, max_context, block_size, dry_run, no_validate,
           validate_layers, overwrite, weights, int4_block, ort_matmulnbits, plan_device, plan_bench,
           passes_reduction, epilogue_steps, epilogue_positions, tensorrt_mode, quiet):
    """Export an SDAR checkpoint to an ONNX folder (SOURCE: a checkpoint folder, an embedded model: arithmetic,
    code, or a preset: sdar-1.7b, sdar-4b, sdar-8b and their -b16 / -b32 variants).

    \b
    Examples:
      spot-export sdar-8b --checkpoint /path/to/SDAR-8B-Chat --out sdar-8b-fp16-onnx
      spot-export sdar-8b-b32 --weights int4 --plan orin-nx-16gb --max-nodes 16
      spot-export sdar-8b-b32 --weights int4 --plan orin-nx-16gb --passes-reduction 16=1.9,64=2.3
      spot-export arithmetic --out arithmetic-fp32-onnx
    """
    import json
    from pathlib import Path

    from spot.export.export import dry_run as run_dry_run, export_checkpoint
    from spot.export.options import ExportOptions
    from spot.export.presets import resolve_source
    from spot.export.quantize import DEFAULT_INT4_BLOCK

    plan_only = plan_device is not None and out is None
    if (plan_bench or passes_reduction) and not plan_only:
        raise SpotError("--plan-bench and --passes-reduction project a memory plan's pass times: they need --plan "
                        "DEVICE (and no --out)")
    resolved = resolve_source(source, checkpoint, dry_run or plan_only)
    from spot.assets import EMBEDDED_MODELS
    dtype = dtype or ("fp32" if resolved.preset in EMBEDDED_MODELS else "fp16")
    if int4_block is not None and weights != "int4":
        raise SpotError(f"--int4-block applies to --weights int4, got --weights {weights}",
                        "add --weights int4, or leave out --int4-block")
    options = ExportOptions(dtype=dtype, opset=opset, max_nodes=max_nodes, max_context=max_context,
                            block_size=block_size, validate=not no_validate, validate_layers=validate_layers,
                            overwrite=overwrite, weights=weights, int4_block=int(int4_block or DEFAULT_INT4_BLOCK),
                            matmulnbits=ort_matmulnbits, plan=plan_device, epilogue_steps=epilogue_steps,
                            epilogue_positions=epilogue_positions)
    options.quant.check()
    progress = stderr_progress(quiet)
    if plan_only:
        from spot.export.memory_plan import plan_source, render
        from spot.export.roofline import counts_from_bench, counts_from_reductions
        plan, cfg = plan_source(resolved, options, progress)
        counts = counts_from_bench(plan_bench) if plan_bench else []
        if passes_reduction:
            counts += counts_from_reductions(passes_reduction, cfg.block_size, max_nodes)
        click.echo(render(plan, cfg.block_size, counts))
        if not plan.fits:        # for scripts: 0 fits, 1 does not fit, 2 an error (e.g. the weights alone)
            sys.exit(1)
        return
    if dry_run:
        click.echo(json.dumps(run_dry_run(resolved, options, progress)))
        return
    from spot.engines.tensorrt_engine import build_after_export, check_before_export
    check_before_export(tensorrt_mode, ort_matmulnbits)
    tag = dtype if weights == "fp" else weights
    folder = export_checkpoint(resolved, Path(out) if out else Path(f"{resolved.default_name}-{tag}-onnx"),
                               options, progress)
    build_after_export(folder, tensorrt_mode, progress)


@main.command("verify")
@click.argument("folder", type=click.Path())
@click.option("--quick", is_flag=True, help="Sizes + sampled hashes of large files instead of full sha256.")
def verify(folder, quick):
    """Check every file of an exported folder against its manifest (full sha256 by default).

    \b
    Example:
      spot verify sdar-8b-fp16-onnx
    """
    from pathlib import Path

    from spot.folder.manifest import DRAFTER_FILES, load_manifest
    from spot.runtime.drafter import DRAFTER_ONNX, load_drafter

    exported = load_manifest(folder, "quick" if quick else "full")
    files = {n: rec for n, rec in exported.manifest["files"].items() if n not in DRAFTER_FILES}
    total = sum(rec["bytes"] for rec in files.values())
    drafter = ""
    if "drafter" in exported.manifest["graphs"] and not (Path(folder) / DRAFTER_ONNX).is_file():
        raise SpotError(f"{folder} was exported with a drafter, and {DRAFTER_ONNX} is missing",
                        "copy drafter.onnx and drafter.json back, or train one with `spot traces` + "
                        "`spot train-drafter`")
    if (Path(folder) / DRAFTER_ONNX).is_file():      # the drafter pair vouches for itself (drafter.json)
        pair = load_drafter(folder)
        try:
            pair.check_compatible(exported)      # (block_size and config, as an engine has)
        except SpotError as e:
            raise SpotError(e.message, f"train a drafter for this export (`spot traces --model {folder} --backend "
                                       "ort` + `spot train-drafter`), or remove drafter.onnx and drafter.json") \
                from None
        drafter = "; the drafter matches its drafter.json and this model"
    click.echo(f"ok: {folder}: {len(files)} files, {total / 2**20:.1f} MiB match the manifest{drafter}")


@main.command("upgrade-export")
@click.argument("folder", type=click.Path(file_okay=False))
@click.option("--epilogue-steps", type=int, default=None,
              help="Future steps D of the new sampling epilogue (default: the folder's, none if it has none; for "
                   "a folder from before epilogues spot-export's default; 0 removes it).")
@click.option("--epilogue-positions", type=int, default=None,
              help="Block positions per epilogue call (default: the folder's own, unless --epilogue-steps "
                   "changes D; else the most that keep a call under 1 GiB).")
@click.option("--quiet", is_flag=True, help="No progress lines.")
def upgrade_export_cmd(folder, epilogue_steps, epilogue_positions, quiet):
    """Rewrite an exported folder's sampling epilogue and kv_append graphs and its TensorRT shape profile (for
    --device trt) for this version, keeping its weights (no re-export): hard links into a sibling folder, the new
    graphs checked, then swapped in by renames.

    \b
    Example:
      spot upgrade-export sdar-8b-fp16-onnx --epilogue-positions 2
    """
    from spot.export.upgrade import upgrade_export
    progress = stderr_progress(quiet)
    manifest, changed = upgrade_export(folder, epilogue_steps, epilogue_positions, progress)
    epi = manifest["graphs"].get("epilogue")
    current = "" if changed else " (already current, nothing changed)"
    graphs = (f"epilogue D {epi['future_steps']}, {epi['positions_per_call']} positions per call" if epi
              else "no epilogue")
    click.echo(f"ok: {folder}{current}: {graphs}, kv_append, TensorRT profile")


@main.command("train-target")
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
@click.option("--no-eval", is_flag=True, help="Skip the held-out evaluation written into training_report.json.")
@click.option("--quiet", is_flag=True, help="No progress lines.")
def train_target_cmd(corpus, out, steps, seed, minutes, work_dir, no_eval, quiet):
    """Train an embedded SDAR target (block diffusion, block 32): the code model on the Python standard library, or
    the arithmetic model on generated grade-school word problems.

    \b
    Examples:
      spot train-target --out /tmp/code --minutes 90
      spot train-target --corpus arithmetic --out /tmp/arithmetic
    """
    from spot.assets import MODELS
    from spot.training.target import RECIPES, train_target
    if steps is not None and steps < 1:
        raise SpotError(f"--steps must be >= 1, got {steps}",
                        "optimizer steps of 8 x 256 tokens; leave it out for the embedded recipe (2800)")
    if out is None:
        from pathlib import Path
        out = Path(__file__).parent / "assets" / MODELS[corpus].folder
    check_output_path(out, "--out", folder=True)      # before the training, not after it
    report = train_target(out, steps, seed=seed, minutes=minutes, progress=not quiet, work_dir=work_dir,
                          settings=RECIPES[corpus], final_eval=not no_eval)
    click.echo(f"wrote {out}: {report['parameters']} parameters, {report['steps_done']} steps, "
               f"{report['train_seconds']:.0f}s")


@main.command("build-engine")
@click.argument("folder", type=click.Path(file_okay=False))
@click.option("--out", type=click.Path(file_okay=False), default=None,
              help="Folder for the engine. Default: the engine cache ($SPOT_CACHE/tensorrt, ~/.cache/spot/tensorrt).")
@click.option("--max-nodes", type=int, default=None,
              help="Largest node bucket (verify pass). Default: 16, or the export's max_nodes if smaller.")
@click.option("--max-context", type=int, default=None, help="Largest KV capacity bucket. Default: the export's.")
@click.option("--smallest-capacity", type=int, default=256, show_default=True, help="Smallest KV capacity bucket.")
@click.option("--workspace-gib", type=float, default=4.0, show_default=True, help="TensorRT workspace limit.")
@click.option("--fp16-flag", is_flag=True, help="TensorRT 10 only: FP16 kernels for an fp32 export (weak typing).")
def build_engine_cmd(folder, out, max_nodes, max_context, smallest_capacity, workspace_gib, fp16_flag):
    """Build a TensorRT engine for an exported FOLDER (block and prefill profiles per KV-capacity bucket, timing
    cache).

    \b
    Example:
      spot build-engine sdar-8b-fp16-onnx --max-nodes 16 --max-context 8192
    """
    from spot.engines.tensorrt_engine import BuildOptions, build_engine
    if out is not None:
        check_output_path(out, "--out", folder=True)      # before a build of minutes, not after it
    opts = BuildOptions(max_nodes=max_nodes, max_context=max_context, smallest_capacity=smallest_capacity,
                        workspace_gib=workspace_gib, fp16_flag=fp16_flag)
    build_engine(folder, opts, out, progress=click.echo)


def _float_list(text: str, what: str) -> tuple[float, ...]:
    try:
        values = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise SpotError(f"{what} must be comma-separated numbers, got {text!r}", f"e.g. {what} 0,1") from None
    if not values:
        raise SpotError(f"{what} must name at least one number, got {text!r}", f"e.g. {what} 0,1")
    return values


@main.command("traces")
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
@click.option("--backend", type=click.Choice(BACKENDS), default="torch", show_default=True)
@click.option("--device", default="cpu", show_default=True)
@click.option("--quiet", is_flag=True, help="No progress lines.")
def traces_cmd(model_dir, out, prompts_file, corpus_prompts, temperatures, rules, tau, seeds, cycle, max_new_tokens,
               depth, minutes, seed, block_size, backend, device, quiet):
    """Collect standard-decoding traces for training the drafter (docs/spec.md §6).

    \b
    Example:
      spot traces --corpus-prompts 400 --cycle --minutes 8 --depth 16 --out traces.npz
    """
    from spot.engines.factory import open_engine
    from spot.tokenizer import load_tokenizer
    from spot.training.traces import (TracePlan, collect_traces, corpus_prompts as draw_prompts, fit_prompts,
                                      prompts_from_jsonl)

    folder = model_folder(backend, model_dir)
    check_model_folder(backend, folder)
    if (prompts_file is None) == (corpus_prompts is None):
        raise SpotError("give exactly one of --prompts FILE.jsonl and --corpus-prompts N",
                        "e.g. --corpus-prompts 400 (prompts cut from the embedded corpus's train split)")
    tokenizer = load_tokenizer(folder)
    if prompts_file is not None:
        prompts = prompts_from_jsonl(prompts_file, tokenizer)
    else:
        if tokenizer is None:
            raise SpotError(f"--corpus-prompts needs the model's tokenizer, and {folder} has none",
                            "pass --prompts FILE.jsonl with token ids")
        from spot.config import training_corpus
        prompts = draw_prompts(tokenizer, corpus_prompts, seed, corpus=training_corpus(folder))
    plan = TracePlan(_float_list(temperatures, "--temperatures"), tuple(r.strip() for r in rules.split(",")), tau,
                     seeds, max_new_tokens, depth, cycle)
    check_output_path(out, "--out")       # a bad --out fails now, not after the decoding
    engine = open_engine(backend, folder, block_size, device, sampler="host")   # traces record the full logits
    if prompts_file is None:
        prompts = fit_prompts(prompts, engine, max_new_tokens)
    traces = collect_traces(engine, prompts, plan, minutes=minutes, progress=None if quiet else click.echo,
                            model_dir=str(folder))
    path = traces.save(out)
    click.echo(f"wrote {path}: {traces.n_traces} traces, {traces.n_rows} steps ({traces.meta['seconds']} s)")


@main.command("train-drafter")
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
    from spot.training.drafter import DrafterTrainSettings, OrderModelConfig, train_drafter
    from spot.training.traces import Traces, concat_traces

    if epochs < 1 or batch_size < 1:
        raise SpotError(f"--epochs and --batch-size must be >= 1, got {epochs} and {batch_size}",
                        "e.g. --epochs 4 --batch-size 256 (the defaults)")
    config = OrderModelConfig(d_model=width, heads=heads, ffn=ffn, layers=layers)   # checks the shape first
    traces = concat_traces([Traces.load(p) for p in trace_files])
    heldout = concat_traces([Traces.load(p) for p in heldout_traces]) if heldout_traces else None
    if out is None:
        out = traces.meta.get("model_dir")
        if not out:
            raise SpotError("the traces do not name their target folder", "pass --out FOLDER")
    from pathlib import Path

    from spot.runtime.drafter import DRAFTER_ONNX
    if (Path(out) / DRAFTER_ONNX).exists() and not overwrite:   # e.g. the embedded model's shipped drafter
        raise SpotError(f"{out} already has a drafter ({DRAFTER_ONNX})",
                        "pass --overwrite to replace it, or --out FOLDER")
    check_output_path(out, "--out", folder=True)      # before the training, not after it
    settings = DrafterTrainSettings(epochs=epochs, batch_size=batch_size, lr=lr, seed=seed, minutes=minutes,
                                    tau=traces.meta["tau"] if tau is None else tau, threads=threads)
    log = (lambda _: None) if quiet else click.echo
    manifest = train_drafter(traces, out, settings, heldout, log=log, config=config)
    acc = manifest["accuracy"].get("top1", {})
    click.echo(f"wrote {out}: {manifest['architecture']['parameters']} parameters, held-out next-commit top-1 "
               f"{acc.get('model')} (stale-confidence baseline {acc.get('baseline')}), member threshold "
               f"{manifest['member_threshold']}")


@main.command("calibrate-drafter")
@click.option("--model", "model_dir", type=click.Path(file_okay=False, path_type=str), default=None,
              help="Target folder (checkpoint, or exported with --backend ort). Default: the embedded model "
                   "(--backend ort: spot demo's export of it).")
@click.option("--drafter", "drafter_path", default=None,
              help="Drafter folder or drafter.onnx to calibrate (its drafter.json is updated). Default: --model's.")
@click.option("--backend", type=click.Choice(BACKENDS), default="torch", show_default=True)
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
@click.option("--max-new-tokens", type=int, default=64, show_default=True)
@click.option("--dry-run", is_flag=True, help="Measure and print; do not write drafter.json.")
@click.option("--quiet", is_flag=True, help="No progress lines.")
@placement_options
def calibrate_drafter_cmd(model_dir, drafter_path, backend, device, prompts_file, corpus_prompts, seed, temperatures,
                          candidates, runner_up_weights, set_flip_weights, budget, max_new_tokens, dry_run, quiet,
                          sampler, kv_cache):
    """Pick the drafter's order temperature, runner-up weight and SPOT-Sets flip weight by target passes on
    training prompts (writes drafter.json).

    \b
    Example (the drafter of the embedded model's export by spot demo):
      spot calibrate-drafter --model ~/.cache/spot/code-fp32-onnx --backend ort
    """
    import json

    from spot.training.calibration import calibrate_drafter, check_settings, write_calibration
    from spot.training.traces import corpus_prompts as draw_prompts, fit_prompts, prompts_from_jsonl

    budgets = _budgets(budget)
    if len(budgets) != 1:
        raise SpotError(f"--budget takes one tree budget such as 16x8, got {budget!r}",
                        "calibrate at one budget: NODESxDEPTH, e.g. --budget 16x8")
    temps, cands = _float_list(temperatures, "--temperatures"), _float_list(candidates, "--candidates")
    weights = _float_list(runner_up_weights, "--runner-up-weights")
    flips = _float_list(set_flip_weights, "--set-flip-weights")
    engine, tokenizer, folder = _open_bench_engine(backend, model_dir, None, device, sampler, kv_cache)
    drafter = find_drafter(drafter_path, folder)
    check_settings(drafter, temps, cands, weights, flips)       # before the prompts are drawn and fitted
    if not dry_run:             # drafter.json is rewritten at the end: a read-only one is refused now
        from spot.runtime.drafter import resolve_paths
        check_output_path(resolve_paths(drafter.path)[1], "drafter.json")
    if prompts_file is not None:
        prompts = prompts_from_jsonl(prompts_file, tokenizer)
    elif tokenizer is None:
        raise SpotError(f"--corpus-prompts needs the model's tokenizer, and {folder} has none",
                        "pass --prompts FILE.jsonl with token ids")
    else:
        from spot.config import training_corpus
        prompts = fit_prompts(draw_prompts(tokenizer, corpus_prompts, seed, corpus=training_corpus(folder)), engine,
                              max_new_tokens)
    result = calibrate_drafter(engine, drafter, prompts, temps, cands, weights, budgets[0], max_new_tokens,
                               progress=stderr_progress(quiet), flip_candidates=flips)
    click.echo(json.dumps(result, indent=2))
    if not dry_run:
        path = write_calibration(drafter.path, result, drafter.manifest["onnx_sha256"])
        click.echo(f"wrote order_temperature {result['order_temperature']:g}, runner_up_weight "
                   f"{result['runner_up_weight']:g} and set_flip_weight {result['set_flip_weight']:g} into {path}")


@main.command()
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
    from spot.assets import MODELS
    from spot.demo import DEMO_MODELS, run_demo
    if temperature is not None:
        from spot.runtime.step import Sampling
        Sampling(temperature, seed=seed)        # refused now, not after the exports
    shape = None
    if budget is not None or depth is not None:
        defaults = [MODELS[m].demo_budget for m in (models or DEMO_MODELS) if m in MODELS]
        default_nodes, default_depth = defaults[0] if defaults else (16, 8)
        shape = (default_nodes if budget is None else budget, default_depth if depth is None else depth)
    results = run_demo(models or DEMO_MODELS, prompt_index, max_new_tokens, temperature, seed, shape,
                       progress=stderr_progress())
    for r in results:
        click.echo(demo_model_text(r))
    click.echo(demo_summary(results))
    if not all(r["identical"] for r in results):
        raise SystemExit(1)


def demo_model_text(r: dict) -> str:
    """One model's part of `spot demo`: its prompt, the decoded text (both decoders', identical), the answer, passes."""
    nodes, depth = r["budget"]
    head = f"\n=== {r['model']} model ({r['about']}) ==="
    if "true_answer" in r:
        prompt = f"held-out problem {r['prompt_id']}:\n{r['prompt'].rstrip()}"
    else:
        prompt = f"held-out prompt {r['prompt_id']} ({r['prompt_file']}), from a line start:\n{r['prompt']}"
    same = "standard decoding and SPOT, identical" if r["identical"] else "STANDARD DECODING (SPOT's differs!)"
    text = f"{head}\n{prompt}\n--- decoded at temperature {r['temperature']:g}, seed {r['seed']} ({same}):\n" \
           f"{r['standard']['text'].rstrip()}"
    if not r["identical"]:
        text += f"\n--- SPOT:\n{r['spot']['text'].rstrip()}"
    if "true_answer" in r:
        verdict = "right" if r["answer_right"] else f"wrong (true answer {r['true_answer']})"
        text += f"\n--- answer {r['answer']}: {verdict}"
    return text + (f"\n--- target passes: standard {r['standard']['target_passes']}, SPOT {r['spot']['target_passes']} "
                   f"({nodes}-node trees, depth {depth}): {r['passes_reduction']:.2f}x fewer")


def demo_summary(results: list[dict]) -> str:
    """The table a person reads at a glance, then the wall clock on this machine and why."""
    lines = ["\n=== what SPOT bought ===",
             f"{'model':<11} {'output':<10} {'answer':<7} {'target passes':<22} {'fewer passes':<13} wall clock here",
             ]
    for r in results:
        passes = f"{r['standard']['target_passes']} -> {r['spot']['target_passes']}"
        answer = ("right" if r["answer_right"] else "wrong") if "true_answer" in r else "-"
        lines.append(f"{r['model']:<11} {'identical' if r['identical'] else 'DIFFERENT':<10} {answer:<7} "
                     f"{passes:<22} {r['passes_reduction']:<13.2f} {r['speedup']:.2f}x tokens/s")
    if any(not r["identical"] for r in results):
        lines.append("outputs DIFFERENT: a bug, please report it")
    slower = [r for r in results if round(r["speedup"], 2) < 1.0 and r["spot"]["verify_passes"] > 0]
    if slower:
        costs = ", ".join(f"{r['model']} {r['verify_cost']:.1f} + {r['host_cost']:.1f} host" for r in slower)
        lines += ["why the wall clock: on this CPU (ONNX Runtime) a pass is compute-bound, so one verify pass over a "
                  "tree",
                  f"  costs several standard passes ({costs}), more than the passes it saves.",
                  "  Where a pass is memory-bound (GPUs, Jetson Orin) a verify pass costs about one pass, and fewer "
                  "passes",
                  "  become speed: `spot-export sdar-8b-b32 --plan orin-nx-16gb` projects it, `spot tune` measures "
                  "this",
                  "  engine's curve, `spot generate --budget auto` decodes with the fastest budget "
                  "(docs/benchmarks.md)."]
    return "\n".join(lines)


def _open_bench_engine(backend, model_dir, block_size, device, sampler="auto", kv_cache="auto"):
    from spot.engines.factory import open_engine
    from spot.tokenizer import load_tokenizer
    folder = model_folder(backend, model_dir)
    return open_engine(backend, folder, block_size, device, sampler, kv_cache), load_tokenizer(folder), folder


def _budgets(text: str):
    from spot.runtime.spot import TreeBudget
    try:
        pairs = [b.lower().split("x") for b in text.split(",") if b.strip()]
        budgets = tuple(TreeBudget(int(n), int(d)) for n, d in pairs)
    except ValueError:
        budgets = ()
    if not budgets:         # (",": no budget at all — the tree rows were dropped without a word)
        raise SpotError(f"budgets must look like 16x8,64x16 (nodes x depth), got {text!r}",
                        "comma-separated NODESxDEPTH: nodes per verify pass (the root included) x the deepest node")
    return budgets


@main.command()
@click.option("--model", "model_dir", type=click.Path(file_okay=False, path_type=str), default=None,
              help="Checkpoint or exported folder. Default: the embedded model (--backend ort: spot demo's export "
                   "of it).")
@click.option("--backend", type=click.Choice(BACKENDS), default=None,
              help="Default: ort for an exported folder, torch for a checkpoint; without --model, "
                   "the embedded model on ort (its export, made on first use) where onnxruntime is "
                   "installed.")
@click.option("--device", default="cpu", show_default=True)
@click.option("--block-size", type=int, default=None)
@click.option("--prompts", "prompts_path", type=click.Path(path_type=str), default=None,
              help="JSONL of prompts ({\"text\"} or {\"ids\"}). Default: the embedded held-out set.")
@click.option("--limit", type=click.IntRange(min=1), default=10, show_default=True, help="Number of prompts.")
@click.option("--prompt-tokens", type=click.IntRange(min=1), default=128, show_default=True,
              help="Keep the last N prompt tokens.")
@click.option("--decoders", default="standard,threshold,chain,tree,oracle,order-oracle,spot,spot-sets",
              show_default=True)
@click.option("--temperatures", default="0,0.5,1.0", show_default=True)
@click.option("--seeds", default="0", show_default=True)
@click.option("--budgets", default=None,
              help="Comma-separated NODESxDEPTH. Default: 16x8, or 16xB when the block size B is smaller.")
@click.option("--max-new-tokens", type=int, default=64, show_default=True)
@click.option("--tau", type=float, default=0.9, show_default=True)
@click.option("--drafter", "drafter_path", default=None, help="drafter.onnx (default: beside the model).")
@click.option("--compare-drafter", "compare_drafters", multiple=True, metavar="NAME=PATH",
              help="Also run spot/spot-sets with this drafter (labelled spot[NAME]), e.g. one recalibrated on a "
                   "quantized target. Repeatable.")
@click.option("--tune/--no-tune", default=False, help="Also measure latency(N) and pick the tokens/s-optimal budget.")
@click.option("--report", "report_dir", type=click.Path(file_okay=False), default="bench-report", show_default=True)
@click.option("--plots/--no-plots", default=None,
              help="PNG plots beside the report. Default: when matplotlib is installed (the plots extra).")
@placement_options
def bench(model_dir, backend, device, block_size, prompts_path, limit, prompt_tokens, decoders, temperatures, seeds,
          budgets, max_new_tokens, tau, drafter_path, compare_drafters, tune, report_dir, plots, sampler, kv_cache):
    """Every decoder side by side on a prompt set: passes per token, steps per verify, tokens/s, speed-up,
    identical-output share, acceptance by depth. Writes bench.json, bench.md and PNG plots to --report.

    \b
    Examples:
      spot bench --limit 5 --budgets 16x8,64x16
      spot bench --model out/code-fp32-onnx --backend ort --tune --report runs/ort
    """
    from pathlib import Path

    from spot.bench import (TUNE_CANDIDATES, BenchConfig, markdown_table, parse_compare_drafters, parse_decoders,
                            parse_sampling_grid, report_title, run_bench, tune_by_temperature, write_report)
    from spot.prompts import load_prompts
    from spot.runtime.decode import check_request
    from spot.runtime.spot import TreeBudget

    names = parse_decoders(decoders)
    temps, seed_list = parse_sampling_grid(temperatures, seeds)
    given_budgets = _budgets(budgets) if budgets is not None else None
    if not report_dir:
        raise SpotError("--report is empty", "name a folder for bench.json and bench.md")
    check_output_path(report_dir, "--report", folder=True)       # before the decoding, not after
    if tune:                        # where --tune records its choices
        from spot.tuned import check_tuning_dir
        check_tuning_dir()
    compare = parse_compare_drafters(compare_drafters, names)
    from spot.plots import can_plot
    no_matplotlib = plots is not False and not can_plot()
    if plots and no_matplotlib:      # refused now, not after an hour of decoding
        raise SpotError("--plots needs matplotlib, which cannot be imported here",
                        "pip install 'spot-edge[plots]', or leave out --plots (the report is written without them)")
    plots = plots is not False and not no_matplotlib
    from spot.plots import PLOT_FILES
    for name in ("bench.json", "bench.md", *(PLOT_FILES if plots else ())):    # the files this run writes
        check_output_path(Path(report_dir) / name, "--report", folder=False)
    backend = resolve_backend(backend, model_dir)
    engine, tokenizer, folder = _open_bench_engine(backend, model_dir, block_size, device, sampler, kv_cache)
    if prompts_path is None:        # the model's own held-out prompts (a spot-export copies them), else the code model's
        from spot.assets import embedded_model_dir
        own = Path(folder) / "heldout_prompts.jsonl"
        prompts_path = own if own.is_file() else Path(embedded_model_dir()) / "heldout_prompts.jsonl"
    prompts = load_prompts(prompts_path, tokenizer, limit, None)
    prompts = [dataclasses.replace(p, ids=p.ids[-prompt_tokens:]) for p in prompts]
    for p in prompts:               # a bad prompt named now, not when the loop reaches it
        try:
            check_request(engine, p.ids, max_new_tokens)
        except SpotError as e:
            raise SpotError(f"prompt {p.id!r} of {prompts_path}: {e.message}", e.hint) from None
    drafting = {"spot", "spot-sets"} & set(names)
    drafter = find_drafter(drafter_path, folder) if drafting else None
    others = {name: find_drafter(path, folder) for name, path in compare.items()}
    default_budget = (TreeBudget(16, min(DEFAULT_DEPTH, engine.block_size)),)     # SDAR's B = 4: 16x4
    cfg = BenchConfig(names, temps, seed_list, given_budgets or default_budget, max_new_tokens, tau)
    say = lambda line: click.echo(line, err=True)  # noqa: E731
    result = run_bench(engine, prompts, cfg, drafter, progress=say, other_drafters=others, tokenizer=tokenizer)
    # what was measured: the model (a manifest's hash names an export exactly) and the prompts
    from spot.tuned import model_fingerprint
    result["config"].update(model=str(folder), model_sha256=model_fingerprint(folder),
                            prompts_file=str(prompts_path), prompt_tokens=prompt_tokens)
    if tune:
        decoder = "spot" if drafter is not None else "tree"
        result["tune"] = tune_by_temperature(engine, prompts, cfg, TUNE_CANDIDATES, decoder, drafter, progress=say,
                                             tokenizer=tokenizer, folder=folder)
    click.echo(f"{report_title(result)}\n\n{markdown_table(result)}")     # first: printed even if the report fails
    paths = write_report(result, report_dir, plots)
    if tune:       # after the report: what --budget auto then decodes with
        from spot.tuned import save_tuning, tuning_key
        key = tuning_key(engine, backend, folder, decoder, drafter)
        for tuned in result["tune"]["by_temperature"].values():
            record = save_tuning(key, tuned, warn=say)
        say(f"recorded the tuned budgets in {record} (used by --budget auto)")
    click.echo("wrote " + ", ".join(str(p) for p in paths)
               + (" (no plots: pip install 'spot-edge[plots]' adds them)" if no_matplotlib else ""), err=True)


@main.command()
@click.option("--model", "model_dir", type=click.Path(file_okay=False, path_type=str), default=None,
              help="Checkpoint (--backend torch) or exported folder (--backend ort). Default: the embedded model "
                   "(--backend ort: spot demo's export of it).")
@click.option("--backend", type=click.Choice(BACKENDS), default=None,
              help="Default: ort for an exported folder, torch for a checkpoint; without --model, "
                   "the embedded model on ort (its export, made on first use) where onnxruntime is "
                   "installed.")
@click.option("--device", default="cpu", show_default=True)
@click.option("--block-size", type=int, default=None, help="Block size B. Default: the config's block_size.")
@click.option("--temperature", type=float, default=0.0, show_default=True)
@click.option("--limit", type=int, default=2, show_default=True,
              help="Prompts used to measure acceptance (cut from the embedded corpus's train split with the "
                   "model's tokenizer).")
@click.option("--drafter", "drafter_path", default=None,
              help="drafter.onnx (or its folder) for spot / spot-sets. Default: the one beside the model, if any.")
@click.option("--decoder", type=click.Choice(TUNABLE_DECODERS), default=None,
              help="Decoder to tune. Default: spot with a drafter (--drafter, or the one beside the model), else "
                   "tree.")
@click.option("--mode", type=click.Choice(["static", "threshold"]), default="static", show_default=True,
              help="Commit rule of spot / tree (spot-sets: always threshold), as in spot generate.")
@click.option("--tau", type=float, default=0.9, show_default=True, help="Threshold of the threshold rule.")
@click.option("--save/--no-save", default=True, show_default=True,
              help="Record the choice for `--budget auto` (in $SPOT_CACHE/tuning, for this model, engine, decoder "
                   "and machine).")
@placement_options
def tune(model_dir, backend, device, block_size, temperature, limit, drafter_path, decoder, mode, tau, save,
         sampler, kv_cache):
    """Measure verify latency vs node count on this engine and pick the tokens/s-optimal tree budget; `spot generate
    --budget auto` then decodes with it.

    \b
    Examples:
      spot tune --model out/code-fp32-onnx --backend ort --temperature 1
      spot generate --model out/code-fp32-onnx --backend ort --decoder spot --budget auto --temperature 1 \\
          --prompt "import os"
    """
    import json

    from spot.bench import TUNE_CANDIDATES, engine_facts, tune_budget, tuning_prompts, tuning_room
    from spot.runtime.decoders import DecodeRequest, rule_for
    from spot.runtime.step import Sampling
    from spot.tuned import check_tuning_dir, number_name, save_tuning, tuning_key

    temperature += 0.0           # -0 is 0: one tuning entry
    Sampling(temperature)        # a bad temperature is refused now, not after the latency sweep
    request = DecodeRequest(mode=mode, tau=tau)
    if limit < 1:
        raise SpotError(f"--limit must be >= 1, got {limit}", "e.g. --limit 2 (the default)")
    if save:                    # an unwritable cache is refused now, not after the sweep
        check_tuning_dir()
    backend = resolve_backend(backend, model_dir)
    engine, tokenizer, folder = _open_bench_engine(backend, model_dir, block_size, device, sampler, kv_cache)
    prompts, source = tuning_prompts(tokenizer, [], limit, max_tokens=tuning_room(engine), folder=folder)
    if not prompts:
        raise SpotError(f"spot tune cuts its prompts from the embedded corpus's train split with the model's "
                        f"tokenizer, and {folder} has none", "use a model folder with tokenizer files, or "
                        "`spot bench --tune --prompts FILE.jsonl` with token ids")
    click.echo(f"measuring acceptance on {len(prompts)} prompt{'s' if len(prompts) != 1 else ''} from the "
               f"{source}", err=True)
    drafter = None
    if decoder in ("spot", "spot-sets"):
        drafter = find_drafter(drafter_path, folder)
        drafter.check_compatible(engine)        # before the latency sweep, not after it
    elif decoder is None:
        try:
            drafter, decoder = find_drafter(drafter_path, folder), "spot"
            drafter.check_compatible(engine)
        except SpotError as e:
            if drafter_path is not None:        # the drafter the user named must fit
                raise
            click.echo(f"tuning the training-free tree decoder ({e.message}; --decoder spot with a drafter "
                       "for this model tunes SPOT)", err=True)
            drafter, decoder = None, "tree"
    rule = rule_for(decoder, request)
    out = tune_budget(engine, prompts, temperature, TUNE_CANDIDATES, drafter, decoder,
                      progress=lambda line: click.echo(line, err=True), rule=rule)
    out["decoder"], out["rule"] = decoder, {"kind": rule.kind, "tau": rule.tau}
    out["engine"] = engine_facts(engine)      # what the latencies are of: backend, device, placement
    click.echo(json.dumps(out, indent=2))       # first: the measurement is printed even if recording fails
    if save:
        path = save_tuning(tuning_key(engine, backend, folder, decoder, drafter, rule), out,
                           warn=lambda line: click.echo(line, err=True))
        click.echo(f"recorded {out['choice']['nodes']}x{out['choice']['depth']} at temperature "
                   f"{number_name(temperature)} in {path} (used by --budget auto)", err=True)


@main.command()
@click.option("--model", "model_dir", type=click.Path(file_okay=False, path_type=str), default=None,
              help="Exported folder (--backend ort / tensorrt) or checkpoint (--backend torch). Default: the embedded "
                   "model (ort, tensorrt: spot demo's export of it).")
@click.option("--backend", type=click.Choice(BACKENDS), default="ort", show_default=True)
@click.option("--device", default="cpu", show_default=True,
              help="Device of the backend (torch: cpu, cuda; ort: cpu, cuda, trt; tensorrt: cuda).")
@click.option("--block-size", type=int, default=None, help="Block size B. Default: the model's.")
@placement_options
@click.option("--drafter", "drafter_path", type=click.Path(path_type=str), default=None,
              help="drafter.onnx (or its folder) for requests decoded with spot / spot-sets. Default: the one beside "
                   "the model, if any (else those decoders are refused).")
@click.option("--engines", type=click.IntRange(min=1), default=1, show_default=True,
              help="Engines, each decoding one request at a time (each holds its own KV cache).")
@click.option("--threads", type=click.IntRange(min=0), default=None,
              help="ort: ONNX Runtime threads per engine. Default: the machine's cores / --engines.")
@click.option("--queue-size", type=click.IntRange(min=0), default=16, show_default=True,
              help="Requests that may wait for a free engine; one more is answered 429.")
@click.option("--decoder", type=click.Choice(DECODERS), default="standard", show_default=True,
              help="Decoder of the requests that name none (a request's `decoder` field picks another).")
@click.option("--budget", default="16", show_default=True,
              help="Tree nodes per verify pass (or auto: spot tune's) of the requests that name none.")
@click.option("--depth", type=int, default=None, help="Tree depth of the requests that name no budget.")
@click.option("--mode", type=click.Choice(["static", "threshold"]), default="static", show_default=True,
              help="Commit rule of the requests that name none.")
@click.option("--tau", type=float, default=0.9, show_default=True, help="Threshold of the threshold rule (default).")
@click.option("--chat-template", type=click.Path(dir_okay=False, path_type=str), default=None,
              help="Jinja chat template of /v1/chat/completions. Default: the tokenizer's.")
@click.option("--chat-max-tokens", type=click.IntRange(min=1), default=256, show_default=True,
              help="max_tokens of a chat request that gives none (/v1/completions: 16, as OpenAI's).")
@click.option("--served-model-name", default=None,
              help="The model's name in the API (requests' `model` field). Default: the model folder's name.")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on: loopback only unless you name another (0.0.0.0: every interface).")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True, help="0: any free port.")
@click.option("--api-key", envvar="SPOT_API_KEY", default=None,
              help="Require `Authorization: Bearer KEY` on /v1/ (default: $SPOT_API_KEY, else none).")
@click.option("--graceful-timeout", type=click.FloatRange(min=0), default=None,
              help="Seconds a shutdown waits for running requests. Default: until they finish.")
@click.option("--log-level", type=click.Choice(["critical", "error", "warning", "info", "debug"]), default="warning",
              show_default=True, help="uvicorn's log level (info: one line per request).")
def serve(model_dir, backend, device, block_size, sampler, kv_cache, drafter_path, engines, threads, queue_size,
          decoder, budget, depth, mode, tau, chat_template, chat_max_tokens, served_model_name, host, port, api_key,
          graceful_timeout, log_level):
    """Serve the model over HTTP, OpenAI-compatible (/v1/completions, /v1/chat/completions, /v1/models), with
    /health, /ready and /metrics: a pool of engines, one request each, behind a bounded queue (docs/deployment.md).

    \b
    Examples:
      spot serve --engines 2
      curl -s localhost:8000/v1/completions -H 'Content-Type: application/json' \\
          -d '{"model": "code-fp32-onnx", "prompt": "def add(a, b):", "max_tokens": 32, "decoder": "spot"}'
      spot serve --model sdar-8b-fp16-onnx --device trt --host 0.0.0.0 --api-key "$KEY"
    """
    from pathlib import Path

    from spot.budgets import budget_nodes
    from spot.runtime.decoders import DecodeRequest
    from spot.serve.model import RequestDefaults, ServedModel, load_chat_template, manifest_sha256
    from spot.serve.run import ServeOptions, serve as run_server
    from spot.tokenizer import SpotTokenizer, load_tokenizer

    budget_nodes(budget, decoder)                   # the defaults' errors before the weights load
    DecodeRequest(mode=mode, tau=tau)
    folder = Path(model_folder(backend, model_dir))
    check_model_folder(backend, folder)
    tokenizer = load_tokenizer(folder)
    if chat_template is not None:
        if tokenizer is None:
            raise SpotError(f"--chat-template needs the model's tokenizer, and {folder} has no tokenizer files",
                            "use a model folder with tokenizer.json (or vocab.json + merges.txt)")
        tokenizer = SpotTokenizer(tokenizer.tokenizer, load_chat_template(chat_template), tokenizer.source)
    drafter_file = find_drafter(drafter_path, folder).path if drafter_path is not None else (
        folder / "drafter.onnx" if (folder / "drafter.onnx").is_file() else None)
    model = ServedModel(served_model_name or folder.resolve().name, folder, backend, device, sampler, kv_cache,
                        block_size, model_dir, drafter_path,
                        RequestDefaults(decoder, budget, depth, mode, tau), tokenizer, drafter_file,
                        manifest_sha256(folder))
    options = ServeOptions(host, port, engines, threads, queue_size, api_key, chat_max_tokens, graceful_timeout,
                           log_level)
    run_server(model, options, lambda line: click.echo(line, err=True))


@main.command("triton-repo")
@click.argument("export_dir", metavar="EXPORT", type=click.Path(file_okay=False, path_type=str))
@click.option("--out", required=True, type=click.Path(file_okay=False, path_type=str),
              help="Folder of the Triton model repository to write (atomically).")
@click.option("--name", default="spot", show_default=True, help="The model's name in Triton.")
@click.option("--instances", type=click.IntRange(min=1), default=1, show_default=True,
              help="Model instances, each a process with one engine: requests decoded at once.")
@click.option("--backend", type=click.Choice(["ort", "tensorrt"]), default="ort", show_default=True)
@click.option("--device", default="cpu", show_default=True, help="ort: cpu, cuda, trt; tensorrt: cuda.")
@placement_options
@click.option("--threads", type=click.IntRange(min=0), default=None,
              help="ort: ONNX Runtime threads per instance. Default: the machine's cores / --instances.")
@click.option("--decoder", type=click.Choice(DECODERS), default="standard", show_default=True,
              help="Decoder of the requests that name none.")
@click.option("--budget", default="16", show_default=True, help="Tree nodes (or auto) of the requests that name none.")
@click.option("--depth", type=int, default=None, help="Tree depth of the requests that name no budget.")
@click.option("--mode", type=click.Choice(["static", "threshold"]), default="static", show_default=True)
@click.option("--tau", type=float, default=0.9, show_default=True)
@click.option("--temperature", type=float, default=1.0, show_default=True,
              help="Temperature of the requests that name none.")
@click.option("--max-tokens", type=click.IntRange(min=1), default=16, show_default=True,
              help="max_tokens of the requests that name none.")
@click.option("--reference", is_flag=True,
              help="Name EXPORT by its absolute path instead of putting it (hard-linked, else copied) in the "
                   "repository.")
@click.option("--overwrite", is_flag=True, help="Replace a repository spot triton-repo wrote at --out.")
def triton_repo(export_dir, out, name, instances, backend, device, sampler, kv_cache, threads, decoder, budget, depth,
                mode, tau, temperature, max_tokens, reference, overwrite):
    """Write a Triton Inference Server model repository that serves the exported folder EXPORT with the spot
    runtime: a Python-backend model, decoupled (one response per finished block), one engine per instance, and a
    config.pbtxt to tune (docs/deployment.md).

    \b
    Examples:
      spot triton-repo sdar-8b-fp16-onnx --out triton-repo --instances 2 --device trt
      docker run --rm -p 8000:8000 -v $PWD/triton-repo:/models nvcr.io/nvidia/tritonserver:24.10-py3 \\
          bash -c "pip install spot-edge && tritonserver --model-repository /models"
    """
    from spot.budgets import budget_nodes
    from spot.runtime.decoders import DecodeRequest
    from spot.runtime.step import Sampling
    from spot.triton.repo import TritonRepoOptions, write_triton_repo

    budget_nodes(budget, decoder)           # the defaults checked as a request's are
    DecodeRequest(mode=mode, tau=tau, sampling=Sampling(temperature))
    check_output_path(out, "--out", folder=True)
    options = TritonRepoOptions(name, instances, backend, device, sampler, kv_cache, threads, decoder, budget, depth,
                                mode, tau, temperature, max_tokens, reference, overwrite)
    repo = write_triton_repo(export_dir, out, options, lambda line: click.echo(line, err=True))
    click.echo(f"wrote {repo}: model {name!r}, {instances} instance{'s' * (instances > 1)}; serve it with "
               f"`tritonserver --model-repository {repo}` where spot is installed (docs/deployment.md)")


# `spot-export` == `spot export`: a hidden copy of the command under the script's name, run with an empty program
# name, so that its usage line reads "spot-export [OPTIONS] SOURCE" (not "spot-export export ...")
def _export_version(ctx, _param, wanted: bool) -> None:
    if wanted:
        click.echo(f"spot-export, version {__version__}")
        ctx.exit()


_export_alias = copy.copy(export)
_export_alias.hidden = True
_export_alias.params = [*export.params, click.Option(["--version"], is_flag=True, expose_value=False, is_eager=True,
                                                     callback=_export_version, help="Show the version and exit.")]
main.add_command(_export_alias, "spot-export")


def export_main():  # console script `spot-export`
    sys.argv[0] = "spot-export"
    main(["spot-export", *sys.argv[1:]], prog_name="")


if __name__ == "__main__":
    main()
