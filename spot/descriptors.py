"""The project's JSON descriptors (an export's manifest.json, a drafter's drafter.json): reading one with its format
checked, and the file hashes they record; and reading any text or JSON file a user hands spot as UTF-8. Every failure
is a SpotError naming the file and the remedy."""
from __future__ import annotations

import hashlib
import json
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


def read_json(path: str | Path, remedy: str):
    """The JSON value in the UTF-8 file at `path`; SpotError naming the file when it is not UTF-8 or not JSON."""
    try:
        return json.loads(read_text(path, remedy))
    except json.JSONDecodeError as e:
        raise SpotError(f"{path} is not valid JSON ({e})", remedy) from None


def load_descriptor(path: Path, fmt: str, version: int, required: tuple[str, ...], remedy: str) -> dict:
    """The JSON object at `path`, refused unless its "format" is fmt, its "format_version" is version and it has
    every key of `required`; `remedy` is the hint (e.g. "re-export the model with spot-export")."""
    data = read_json(path, remedy)
    if not isinstance(data, dict) or data.get("format") != fmt:
        got = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise SpotError(f"{path} has format {got!r}, expected {fmt!r}", remedy)
    if data.get("format_version") != version:
        raise SpotError(f"{path} has format_version {data.get('format_version')!r}, this spot reads {version}",
                        remedy)
    missing = [key for key in required if key not in data]
    if missing:
        raise SpotError(f"{path} lacks field {missing[0]!r}", remedy)
    return data
