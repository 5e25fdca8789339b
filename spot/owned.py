"""What spot can prove it wrote in a folder it is about to replace or write into: a file is spot's when a record spot
wrote (an export's manifest, a Triton model's marker, a training report, a drafter.json) lists it with the hash it
still has — never because of its name: a user's chat_template.jinja beside an export is the user's."""
from __future__ import annotations

from pathlib import Path

from spot.descriptors import load_descriptor, sha256_file
from spot.errors import SpotError
from spot.drafter_files import DRAFTER_JSON, DRAFTER_ONNX, FORMAT as DRAFTER_FORMAT, \
    FORMAT_VERSION as DRAFTER_FORMAT_VERSION

DRAFTER_PAIR = (DRAFTER_ONNX, DRAFTER_JSON)


def drafter_pair_vouched(folder: Path) -> bool:
    """Whether the drafter files in `folder` are a pair spot wrote: drafter.json a spot drafter descriptor whose
    onnx_sha256 is drafter.onnx's (or drafter.onnx absent)."""
    try:
        manifest = load_descriptor(Path(folder) / DRAFTER_JSON, DRAFTER_FORMAT, DRAFTER_FORMAT_VERSION,
                                   ("onnx_sha256",), "")
    except (SpotError, OSError):
        return False
    onnx = Path(folder) / DRAFTER_ONNX
    if not (onnx.exists() or onnx.is_symlink()):
        return True
    try:
        return onnx.is_file() and sha256_file(onnx) == manifest["onnx_sha256"]
    except OSError:
        return False


def recorded_file_matches(path: Path, sha256: object) -> bool:
    """Whether the file at `path` is a plain file with the sha256 a record gives it."""
    try:
        return path.is_file() and not path.is_symlink() and sha256_file(path) == sha256
    except OSError:
        return False


def some(names: list[str]) -> str:
    """The first names of a list, and how many more: for a message."""
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def refuse_unproven(folder: Path, what: str, unproven: list[str], remedy: str) -> None:
    """SpotError naming what in `folder` spot cannot prove it wrote (its user's: never deleted)."""
    if unproven:
        raise SpotError(f"{what} {folder} holds what spot did not write (or what changed since): {some(unproven)}",
                        remedy)
