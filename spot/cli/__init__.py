"""Command line: `spot` (generate, bench, demo, training, engines) and `spot-export`.

User errors (SpotError, bad arguments) print two lines, `error: ...` and `  hint: ...`, and exit 2; `--debug` keeps
the traceback. The library's errors name its parameters (`depth=4`): they are printed as the options that set them
(--depth 4, PARAMETER_FLAGS).
This module holds the group, its error handling and the entry points; the commands live beside it (generate.py,
bench.py, export.py, training.py, serve.py), each a thin shell over library functions: parse, call, print.
"""
from __future__ import annotations

import copy
import signal
import sys
import threading

import click

from spot import __version__
from spot.cli import bench, export, generate, serve, training
from spot.errors import INTERRUPTED_LINE, TERMINATED_LINE, SpotError, exit_on_closed_pipe, os_error_hint

# Optional packages -> the extra that installs them: the runtime (generate/bench/tune/verify on an exported folder with
# --backend ort) needs none of them; export, training, the torch backend, plots and `spot serve` do.
OPTIONAL_EXTRAS = {"torch": "export", "onnx": "export", "safetensors": "export", "matplotlib": "plots",
                   "fastapi": "serve", "uvicorn": "serve", "prometheus_client": "serve"}

# the library's parameters, as its errors name them (spot.errors.PARAMETER), -> the option of a `spot` command that
# sets each (tests/test_error_parameters.py holds every name the library uses here, and every option to a command's)
PARAMETER_FLAGS = {
    "backend": "--backend", "device": "--device", "sampler": "--sampler", "kv_cache": "--kv-cache",
    "block_size": "--block-size", "drafter": "--drafter", "max_new_tokens": "--max-new-tokens", "mode": "--mode",
    "top_k": "--top-k", "top_p": "--top-p", "nodes": "--budget", "depth": "--depth", "store_mode": "--store",
    "out": "--out", "overwrite": "--overwrite",                                             # spot-export, demo
    "max_context": "--max-context", "max_nodes": "--max-nodes", "workspace_gib": "--workspace-gib",
    "fp16_flag": "--fp16-flag",                                                             # spot build-engine
}


def as_flag(parameter: str, value: str | None) -> str | None:
    """A library parameter (and the value the error names) as a command line gives it: `depth=4` -> --depth 4,
    `sampler="host"` -> --sampler host; None for a name that is no option's."""
    flag = PARAMETER_FLAGS.get(parameter)
    if flag is None or value is None:
        return flag
    return flag + " " + value.strip('"')


TERMINATED: list[int] = []      # the signal that ended the command, once terminate() ran


def terminate(signum, frame) -> None:
    """SIGTERM handler: exit with 128 + signum through the normal unwinding (temporary outputs removed)."""
    TERMINATED.append(signum)
    sys.exit(128 + signum)


class SpotGroup(click.Group):
    """Turns SpotError, click's usage errors and a missing optional package into an error line and a hint line
    (exit 2) unless --debug."""

    def make_context(self, info_name, args, parent=None, **extra):
        try:        # the group's own options: `spot --nope`
            return super().make_context(info_name, args, parent, **extra)
        except click.UsageError as e:
            self._fail(e.ctx, *usage_error(e, "spot"))
        except BrokenPipeError:     # `spot --help | head -1`
            exit_on_closed_pipe()

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except BrokenPipeError:     # `spot generate --stream ... | head -1`: the reader is gone, nothing is wrong
            exit_on_closed_pipe()
        except click.ClickException as e:       # a bad value, an unknown option or command, a missing argument
            if ctx.meta.get("spot.debug"):
                raise
            self._fail(ctx, *usage_error(e, command_name(ctx)))
        except SpotError as e:
            if ctx.meta.get("spot.debug"):
                raise
            e = e.renamed(as_flag)
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


COMMANDS = (generate.generate, generate.demo, export.export, export.verify, export.upgrade_export_cmd,
            export.build_engine_cmd, training.train_target_cmd, training.traces_cmd, training.train_drafter_cmd,
            training.calibrate_drafter_cmd, bench.bench, bench.tune, serve.serve, serve.triton_repo)
for _command in COMMANDS:        # `spot --help` lists them by name (click sorts them)
    main.add_command(_command)


# `spot-export` == `spot export`: a hidden copy of the command under the script's name, run with an empty program
# name, so that its usage line reads "spot-export [OPTIONS] SOURCE" (not "spot-export export ...")
def _export_version(ctx, _param, wanted: bool) -> None:
    if wanted:
        click.echo(f"spot-export, version {__version__}")
        ctx.exit()


_export_alias = copy.copy(export.export)
_export_alias.hidden = True
_export_alias.params = [*export.export.params,
                        click.Option(["--version"], is_flag=True, expose_value=False, is_eager=True,
                                     callback=_export_version, help="Show the version and exit.")]
main.add_command(_export_alias, "spot-export")


def export_main():  # console script `spot-export`
    sys.argv[0] = "spot-export"
    main(["spot-export", *sys.argv[1:]], prog_name="")
