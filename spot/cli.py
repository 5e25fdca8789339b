"""Command line: `spot` (generate, bench, demo, training, engines) and `spot-export`.

User errors (SpotError, bad arguments) print one line plus a hint and exit 2; `--debug` keeps the traceback.
Each command lives in this file as a thin shell over library functions: parse, call, print.
"""
from __future__ import annotations

import sys

import click

from spot import __version__
from spot.errors import SpotError


class SpotGroup(click.Group):
    """Turns SpotError into one clear line + hint (exit 2) unless --debug was given."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except SpotError as e:
            if ctx.meta.get("spot.debug"):
                raise
            click.echo(f"error: {e.message}", err=True)
            if e.hint:
                click.echo(f"  hint: {e.hint}", err=True)
            ctx.exit(2)


@click.group(cls=SpotGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show full tracebacks for errors.")
@click.version_option(__version__)
@click.pass_context
def main(ctx, debug):
    """spot: SPOT speculative decoding for SDAR diffusion LMs on ONNX Runtime / TensorRT."""
    ctx.meta["spot.debug"] = debug


def export_main():  # console script `spot-export` == `spot export`
    sys.argv[0] = "spot-export"
    main(["export", *sys.argv[1:]], prog_name="spot-export")


if __name__ == "__main__":
    main()
