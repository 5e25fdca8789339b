"""User-facing errors: a message saying what is wrong and a hint on how to fix it (the CLI prints them as two lines,
`error: ...` and `  hint: ...`)."""

import errno
import numbers
import operator
import os
from pathlib import Path
import re
import sys
from typing import Callable

# the one line a command interrupted by Ctrl-C or SIGTERM ends with (spot.entry while importing, spot.cli after)
INTERRUPTED_LINE = "error: interrupted (Ctrl-C); outputs not completed were not written"
TERMINATED_LINE = "error: terminated (SIGTERM); outputs not completed were not written"

# a library parameter as an error's text names it, in backticks: `depth`, or `depth=4` with the value to give (a
# string value in double quotes: `sampler="host"`). The library's own words; a front end shows each in its own
# (SpotError.renamed: the CLI as its flag, --depth 4; the HTTP server as its JSON field)
PARAMETER = re.compile(r"`([a-z][a-z0-9_]*)(?:=([^`]*))?`")


class SpotError(Exception):
    """An error caused by the user's input (path, checkpoint, argument). The CLI prints it without a traceback."""

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\n  hint: {self.hint}"

    def renamed(self, spelling: Callable[[str, str | None], str | None]) -> "SpotError":
        """This error in a front end's words: each library parameter its message and hint name (PARAMETER: `depth`,
        `depth=4`) as spelling(name, value) writes it (value: the text after "=", None for a bare name); one that
        spelling returns None for stays in the library's words."""
        def spelt(match: re.Match) -> str:
            words = spelling(match.group(1), match.group(2))
            return match.group(0) if words is None else words

        def respelt(text: str | None) -> str | None:
            return None if text is None else PARAMETER.sub(spelt, text)
        return SpotError(respelt(self.message), respelt(self.hint))


def os_error_hint(e: OSError) -> str:
    """What to check for an OSError, by its errno (the message says which path)."""
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


# the status a command whose output pipe closed ends with: a shell's for a command SIGPIPE ended (128 + 13)
CLOSED_PIPE_STATUS = 141


def exit_on_closed_pipe():
    """End the process quietly because the reader of its output went away (`spot generate --stream ... | head -1`):
    no `error:` line and no hint (nothing is wrong, and no reader is left to see one), and no "Exception ignored"
    when Python flushes the dead stdout at exit (it is pointed at /dev/null first). Exit status CLOSED_PIPE_STATUS."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        for stream in (sys.stdout, sys.stderr):
            os.dup2(devnull, stream.fileno())
    except (OSError, ValueError, AttributeError):     # a stream without a file descriptor: nothing to flush there
        pass
    sys.exit(CLOSED_PIPE_STATUS)


def run_script(main) -> None:
    """Entry point of the scripts under benchmarks/ and scripts/: exit with main()'s status; a SpotError becomes one
    `error:` line (and its hint) with exit status 2, as in the CLI; a closed output pipe ends quietly
    (exit_on_closed_pipe)."""
    try:
        sys.exit(main())
    except SpotError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except BrokenPipeError:
        exit_on_closed_pipe()


def integer_arg(value, what: str) -> int:
    """`value` as a Python int when it is an integer (numpy's and 0-d integer tensors included, bool and 2.0 not);
    SpotError naming `what` otherwise. For the library API's dataclasses: the CLI's options are typed already."""
    # numpy: spot.entry imports this module before its Ctrl-C handler, and numpy loads under that handler
    import numpy as np
    if isinstance(value, (bool, np.bool_)):
        raise SpotError(f"{what} must be an integer, got {value!r} (bool)")
    try:
        return operator.index(value)
    except TypeError:
        raise SpotError(f"{what} must be an integer, got {value!r} ({type(value).__name__})") from None


def number_arg(value, what: str) -> float:
    """`value` as a float when it is a real number (bool not); SpotError naming `what` otherwise."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise SpotError(f"{what} must be a number, got {value!r} ({type(value).__name__})")
    return float(value)


def number_list_arg(text: str, what: str) -> tuple[float, ...]:
    """A comma-separated list of numbers as an option gives it (e.g. --temperatures 0,1); SpotError naming `what`
    when it holds something else or nothing."""
    try:
        values = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise SpotError(f"{what} must be comma-separated numbers, got {text!r}", f"e.g. {what} 0,1") from None
    if not values:
        raise SpotError(f"{what} must name at least one number, got {text!r}", f"e.g. {what} 0,1")
    return values


def path_arg(value, what: str):
    """`value` as a pathlib.Path when it is a str or os.PathLike naming a UTF-8 path; SpotError naming `what`
    otherwise (a path given as None, a number or bytes was a TypeError deep in pathlib; one of bytes that are not
    UTF-8, ONNX Runtime's or the tokenizer's error with an unrelated hint)."""
    if isinstance(value, (str, os.PathLike)) and not isinstance(value, bytes):
        path = Path(value)
        if "\0" not in str(path) and str(value):
            text_arg(str(path), f"{what} {path}", "rename it: ONNX Runtime and the tokenizer library open UTF-8 "
                     "paths only")
            return path
    raise SpotError(f"{what} must be a path (str or pathlib.Path), got {value!r} ({type(value).__name__})",
                    "e.g. \"sdar-8b-fp16-onnx\" or pathlib.Path(...)")


def text_arg(value, what: str, hint: str = "pass a str of Unicode text (bytes: data.decode(\"utf-8\"))") -> str:
    """`value` when it is a str that encodes as UTF-8; SpotError naming `what` otherwise: a bytes argument, None, or
    text holding a byte that was not UTF-8 (Python keeps such a byte of a command line as a lone surrogate,
    U+DC80..U+DCFF) or another lone surrogate was a TypeError in the tokenizer."""
    if not isinstance(value, str):
        raise SpotError(f"{what} must be text (a str), got {value!r:.60} ({type(value).__name__})", hint)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        char = value[e.start]
        found = (f"the byte 0x{ord(char) - 0xDC00:02x}, which is not UTF-8" if 0xDC80 <= ord(char) <= 0xDCFF
                 else f"a lone surrogate U+{ord(char):04X}")
        raise SpotError(f"{what} is not valid UTF-8 text: character {e.start} is {found}", hint) from None
    return value
