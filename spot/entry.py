"""Console-script entry points (`spot`, `spot-export`): import the CLI, then run it.

They live apart from spot.cli so that Ctrl-C or SIGTERM while numpy, ONNX Runtime and click are still being imported
(a third of a second, longer on a Jetson's SD card) ends with the same one line as during a command, not a traceback.
"""
from __future__ import annotations

import signal
import sys

from spot.errors import INTERRUPTED_LINE, TERMINATED_LINE


_SIGNALS: list[int] = []      # SIGTERM received while importing


def _terminate_during_import(signum, frame) -> None:
    _SIGNALS.append(signum)
    raise SystemExit(128 + signum)


def _load_cli():
    """spot.cli, imported with Ctrl-C / SIGTERM ending the process with one line (130 / 143)."""
    previous = signal.signal(signal.SIGTERM, _terminate_during_import)
    try:
        # start-up: imported under the signal handler above
        import spot.cli as cli
    except KeyboardInterrupt:
        print("\n" + INTERRUPTED_LINE, file=sys.stderr)
        raise SystemExit(130) from None
    except (SystemExit, ImportError):
        if not _SIGNALS:
            raise
        # the exit may surface as an extension's "initialization failed" ImportError
        print(TERMINATED_LINE, file=sys.stderr)
        raise SystemExit(128 + _SIGNALS[0]) from None
    finally:
        signal.signal(signal.SIGTERM, previous)
    return cli


def spot() -> None:
    """`spot ...`"""
    _load_cli().main()


def spot_export() -> None:
    """`spot-export ...`"""
    _load_cli().export_main()
