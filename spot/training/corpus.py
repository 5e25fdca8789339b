"""The training corpus: the Python standard library's own `.py` sources, present on every machine with Python.

Selection (deterministic for a given interpreter):
- root = sysconfig.get_paths()["stdlib"]; every `*.py` below it, paths sorted by their POSIX relative path;
- excluded: anything under site-packages/dist-packages, test suites (`test/`, `tests/`, `idlelib/idle_test/`,
  `lib2to3/tests/`, i.e. any path component named test, tests or idle_test), and files over 200 KB;
- split by FILE: a file is held out when int(sha1(relative POSIX path).hexdigest(), 16) % 20 == 0 (about 5%),
  everything else is training text. The split depends only on the path, so it is stable across machines and
  Python versions for the files they share.
Files are decoded as UTF-8 (undecodable files are skipped) and joined with the `<|endoftext|>` separator.
"""
from __future__ import annotations

import hashlib
import sysconfig
from dataclasses import dataclass
from pathlib import Path

MAX_FILE_BYTES = 200_000
HELDOUT_MODULUS = 20
EXCLUDED_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}


@dataclass(frozen=True)
class SourceFile:
    rel: str        # POSIX path relative to the stdlib root
    text: str


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def is_heldout(rel: str) -> bool:
    """The documented split rule: sha1 of the relative POSIX path, as an integer, mod 20 == 0."""
    return int(hashlib.sha1(rel.encode("utf-8")).hexdigest(), 16) % HELDOUT_MODULUS == 0


def list_sources(root: Path | None = None) -> list[str]:
    """Sorted relative POSIX paths of the corpus files under root (the stdlib by default)."""
    root = Path(root) if root is not None else stdlib_root()
    out = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root).as_posix()
        if EXCLUDED_DIRS.intersection(rel.split("/")[:-1]):
            continue
        if not path.is_file() or path.stat().st_size > MAX_FILE_BYTES:
            continue
        out.append(rel)
    return sorted(out)


def read_sources(rels: list[str], root: Path | None = None) -> list[SourceFile]:
    root = Path(root) if root is not None else stdlib_root()
    files = []
    for rel in rels:
        try:
            text = (root / rel).read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # a few stdlib files carry other encodings; skip them rather than guess
        if text.strip():
            files.append(SourceFile(rel, text))
    return files


def split_corpus(root: Path | None = None) -> tuple[list[SourceFile], list[SourceFile]]:
    """(train files, held-out files), each in sorted path order."""
    files = read_sources(list_sources(root), root)
    return [f for f in files if not is_heldout(f.rel)], [f for f in files if is_heldout(f.rel)]


def split_digest(files: list[SourceFile]) -> str:
    """sha1 over the paths and contents of a split: recorded in the training report to pin the corpus."""
    h = hashlib.sha1()
    for f in files:
        h.update(f.rel.encode("utf-8") + b"\0" + f.text.encode("utf-8") + b"\0")
    return h.hexdigest()
