"""User-facing errors: one clear line saying what is wrong, plus a hint on how to fix it."""

import operator


class SpotError(Exception):
    """An error caused by the user's input (path, checkpoint, argument). The CLI prints it without a traceback."""

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\n  hint: {self.hint}"


def run_script(main) -> None:
    """Entry point of the scripts under benchmarks/ and scripts/: exit with main()'s status; a SpotError becomes one
    `error:` line (and its hint) with exit status 2, as in the CLI."""
    import sys
    try:
        sys.exit(main())
    except SpotError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


def integer_arg(value, what: str) -> int:
    """`value` as a Python int when it is an integer (numpy's and 0-d integer tensors included, bool and 2.0 not);
    SpotError naming `what` otherwise. For the library API's dataclasses: the CLI's options are typed already."""
    import numpy as np
    if isinstance(value, (bool, np.bool_)):
        raise SpotError(f"{what} must be an integer, got {value!r} (bool)")
    try:
        return operator.index(value)
    except TypeError:
        raise SpotError(f"{what} must be an integer, got {value!r} ({type(value).__name__})") from None


def number_arg(value, what: str) -> float:
    """`value` as a float when it is a real number (bool not); SpotError naming `what` otherwise."""
    import numbers
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise SpotError(f"{what} must be a number, got {value!r} ({type(value).__name__})")
    return float(value)
