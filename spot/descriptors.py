"""The project's JSON descriptors (an export's manifest.json, a drafter's drafter.json): reading one with its format
checked, and the file hashes they record; and reading any text or JSON file a user hands spot as UTF-8. Every failure
is a SpotError naming the file and the remedy."""
from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path

from spot.errors import SpotError


def sha256_file(path: str | Path, chunk: int = 4 * 1024 * 1024) -> str:
    """Hex sha256 of a file, read in chunks (exported weights can be many GB)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def utf8_text(data: bytes, what: str, remedy: str) -> str:
    """`data` as UTF-8 text (a leading byte-order mark dropped); SpotError naming `what` and the first bad byte.
    Read with the locale's encoding, or without a check, such a file ended in a UnicodeDecodeError traceback."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise SpotError(f"{what} is not UTF-8 text (byte {e.start}: {data[e.start:e.start + 1]!r})", remedy) \
            from None


def read_text(path: str | Path, remedy: str) -> str:
    """The UTF-8 text of the file at `path` (utf8_text); OSError as open() raises it."""
    return utf8_text(Path(path).read_bytes(), str(path), remedy)


# Deeper nesting is refused (the C++ host's reader, cpp/src/json.cpp, refuses the same): no file spot reads nests
# more than a few levels, and Python's json module ends in a RecursionError near 1000.
MAX_JSON_DEPTH = 256


class _NotPortable(ValueError):
    """JSON that Python's json module reads but the C++ host's reader (nlohmann/json) refuses."""


def _object(pairs: list) -> dict:
    obj = dict(pairs)
    if len(obj) != len(pairs):      # Python keeps the last of duplicate keys, nlohmann/json's reader the first
        seen = set()
        key = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise _NotPortable(f"duplicate key {key!r:.60}")
    return obj


def _float(text: str) -> float:
    value = float(text)
    if math.isinf(value):           # 1e999: nlohmann/json's "number overflow"
        raise _NotPortable(f"number overflow parsing {text[:40]!r}")
    return value


def _int(text: str):
    """An integer as nlohmann/json reads it: exact where it fits 64 bits, else a double (1e400: overflow)."""
    if len(text) <= 20:
        value = int(text)
        if -2**63 <= value < 2**64:
            return value
    return _float(text)


# a \u escape that can make a NUL or a lone surrogate (Python's json module reads both, nlohmann/json neither); text
# decoded from UTF-8 holds neither otherwise, so strings are looked into only when one is there
_ESCAPE = re.compile(r"\\u(?:0000|[dD][89a-fA-F])")


def _too_deep_or_foreign(value, strings: bool) -> str | None:
    """What makes a parsed value unreadable by both hosts: nesting deeper than MAX_JSON_DEPTH, or (strings: looked
    into) a string or key holding a NUL (it would cut the string wherever it reaches C) or a lone surrogate (not
    UTF-8); None when fine."""
    stack = [(value, 0)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, str) and strings:
            if "\0" in v:
                return "NUL (\\u0000) in a string"
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                return "a lone surrogate (\\ud800..\\udfff) in a string"
        if not isinstance(v, (list, dict)):
            continue
        if depth >= MAX_JSON_DEPTH:
            return f"nesting deeper than {MAX_JSON_DEPTH}"
        items = v if isinstance(v, list) else [*v, *v.values()] if strings else v.values()
        kinds = (str, list, dict) if strings else (list, dict)
        stack.extend((x, depth + 1) for x in items if isinstance(x, kinds))
    return None


def parse_json(text: str, what: str, remedy: str, strict: bool = False):
    """The JSON value of `text` (the contents of `what`, a file or a line of one); SpotError naming `what` when it is
    not JSON or nests deeper than MAX_JSON_DEPTH. Every reader of a JSON file spot is handed goes through here: a
    file of 100,000 `[` was a RecursionError traceback. strict: one of spot's own formats (manifest.json and
    drafter.json, which the C++ host reads too; tuning records, prompt files, trace meta), read as the C++ host's
    reader reads JSON: duplicate keys, a NUL or a lone surrogate in a string and a number beyond double's range are
    refused, an integer beyond 64 bits is a double. Other files (a checkpoint's config.json and tokenizer, a training
    checkpoint's generator states of 128-bit integers) keep Python's exact reading."""
    hooks = {"object_pairs_hook": _object, "parse_float": _float, "parse_int": _int} if strict else {}
    try:
        value = json.loads(text, **hooks)
    except RecursionError:
        raise SpotError(f"{what} is not valid JSON (nesting deeper than {MAX_JSON_DEPTH})", remedy) from None
    except ValueError as e:     # JSONDecodeError, _NotPortable, an integer of more than 4300 digits
        raise SpotError(f"{what} is not valid JSON ({e})", remedy) from None
    strings = strict and _ESCAPE.search(text) is not None
    problem = _too_deep_or_foreign(value, strings)
    if problem:
        raise SpotError(f"{what} is not valid JSON ({problem})", remedy)
    return value


def read_json(path: str | Path, remedy: str, strict: bool = False):
    """The JSON value in the UTF-8 file at `path` (parse_json); SpotError naming the file when it is not UTF-8 or not
    JSON."""
    return parse_json(read_text(path, remedy), str(path), remedy, strict)


def _same_integer(value, want: int) -> bool:
    """value is the JSON integer want (not 2.0 nor true, which Python's == takes: the C++ host's reader does not)."""
    return isinstance(value, int) and not isinstance(value, bool) and value == want


def load_descriptor(path: Path, fmt: str, version: int, required: tuple[str, ...], remedy: str,
                    strict: bool = False) -> dict:
    """The JSON object at `path`, refused unless its "format" is fmt, its "format_version" is version and it has
    every key of `required`; `remedy` is the hint (e.g. "re-export the model with spot-export")."""
    data = read_json(path, remedy, strict)
    if not isinstance(data, dict) or data.get("format") != fmt:
        got = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise SpotError(f"{path} has format {got!r}, expected {fmt!r}", remedy)
    if not _same_integer(data.get("format_version"), version):
        raise SpotError(f"{path} has format_version {data.get('format_version')!r}, this spot reads {version}",
                        remedy)
    missing = [key for key in required if key not in data]
    if missing:
        raise SpotError(f"{path} lacks field {missing[0]!r}", remedy)
    return data
