"""What several commands share: the engine placement options, and progress and notes printed to stderr (stdout
stays the command's result)."""
from __future__ import annotations

import shutil
import sys
import time

import click

from spot.engines.factory import BACKENDS
from spot.app.models import model_folder as resolve_folder, open_model as open_resolved


def echo_err(line: str) -> None:
    """A note or progress line, to stderr."""
    click.echo(line, err=True)


# --backend of the commands that pick it from --model (spot.app.models.resolve_backend)
backend_option = click.option(
    "--backend", type=click.Choice(BACKENDS), default=None,
    help="Default: ort for an exported folder, torch for a checkpoint; without --model, the embedded model on ort "
         "(its export, made on first use) where onnxruntime is installed.")


# --store of the commands that decode (spot.runtime.decode.STORE_MODES; the values spelled here: the CLI imports no
# numpy before it needs it)
store_option = click.option(
    "--store", "store_mode", type=click.Choice(["fused", "separate"]), default="fused", show_default=True,
    help="Where a finished block's K/V are cached: fused into the next block's first pass (2 blocks in one pass; "
         "the last block is never stored), or a separate store pass per block, as SDAR's own decoder counts.")


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


def model_folder(backend: str, model_dir):
    """spot.app.models.model_folder with its progress and note on stderr (an embedded model's export, on first use)."""
    return resolve_folder(backend, model_dir, stderr_progress(), echo_err)


def open_model(backend: str, model_dir, block_size, device: str, sampler: str = "auto", kv_cache: str = "auto"):
    """spot.app.models.open_model with its progress and note on stderr: (engine, tokenizer, folder)."""
    return open_resolved(backend, model_dir, block_size, device, sampler, kv_cache, stderr_progress(), echo_err)
