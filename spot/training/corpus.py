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
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from spot.errors import SpotError
from spot.training import bpe
from spot.training.batch import Batch

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


# -- the code model's training data: random windows of the joined train files ----------------------------------
def token_stream(files_ids: list[list[int]]) -> np.ndarray:
    """All files joined with <|endoftext|> (also after the last one): int64 [T]."""
    out = []
    for ids in files_ids:
        out.extend(ids)
        out.append(bpe.EOS_ID)
    return np.asarray(out, dtype=np.int64)


def sample_windows(stream: np.ndarray, n: int, length: int, rng: np.random.Generator) -> np.ndarray:
    """n windows int64 [n, length] at uniform random offsets of the stream."""
    if stream.size < length + 1:
        raise SpotError(f"the token stream has {stream.size} tokens, fewer than one window of {length}",
                        "use a larger corpus slice or a shorter seq_len")
    starts = rng.integers(0, stream.size - length, size=n)
    return np.stack([stream[s:s + length] for s in starts])


def eval_windows(stream: np.ndarray, n: int, length: int) -> np.ndarray:
    """n evenly spaced (deterministic) windows int64 [n, length] of the held-out stream."""
    starts = np.linspace(0, stream.size - length - 1, n).astype(np.int64)
    return np.stack([stream[s:s + length] for s in starts])


@dataclass
class PreparedCorpus:
    tokenizer: object
    train_files: list
    heldout_files: list
    train_stream: np.ndarray
    heldout_stream: np.ndarray
    heldout_ids: list = field(default_factory=list)


def prepare_corpus(vocab_size: int, root: Path | None = None, max_files: int | None = None,
                   tokenizer=None) -> PreparedCorpus:
    """Split, train the BPE on the train split (unless a tokenizer is given), tokenize both splits. max_files slices
    the corpus (tests)."""
    train_files, heldout_files = split_corpus(root)
    if max_files is not None:
        train_files, heldout_files = train_files[:max_files], heldout_files[:max(1, max_files // 10)]
    if not train_files or not heldout_files:
        raise SpotError(f"the corpus has {len(train_files)} train and {len(heldout_files)} held-out files",
                        "pass a folder of .py files with at least a few dozen files")
    tok = tokenizer or bpe.train_bpe([f.text for f in train_files], vocab_size)
    train_ids = bpe.encode_files(tok, [f.text for f in train_files])
    heldout_ids = bpe.encode_files(tok, [f.text for f in heldout_files])
    return PreparedCorpus(tok, train_files, heldout_files, token_stream(train_ids), token_stream(heldout_ids),
                          heldout_ids)


class CodeData:
    """Train batches of `batch_size` windows of `seq_len` tokens from the train stream (every position maskable);
    held-out windows evenly spaced over the held-out stream."""

    corpus = "code"

    def __init__(self, prep: PreparedCorpus, root: Path | None, batch_size: int, seq_len: int, seed: int):
        self.prep, self.root, self.batch_size, self.seq_len = prep, root, batch_size, seq_len
        self.tokenizer = prep.tokenizer
        self.rng = np.random.default_rng(seed)

    def train_batch(self) -> Batch:
        return Batch(sample_windows(self.prep.train_stream, self.batch_size, self.seq_len, self.rng), None)

    def heldout_batches(self, n: int, batch: int = 8) -> list[Batch]:
        windows = eval_windows(self.prep.heldout_stream, n, self.seq_len)
        return [Batch(windows[i:i + batch], None) for i in range(0, n, batch)]

    def state(self) -> dict:
        return {"rng": self.rng.bit_generator.state}

    def load_state(self, state: dict) -> None:
        self.rng.bit_generator.state = state["rng"]

    def describe(self) -> str:
        p = self.prep
        return (f"corpus: {len(p.train_files)} train files ({p.train_stream.size} tokens), "
                f"{len(p.heldout_files)} held-out files ({p.heldout_stream.size} tokens)")

    def report(self) -> dict:
        p = self.prep
        return {"root": str(Path(self.root) if self.root else stdlib_root()),
                "split_rule": "held-out iff int(sha1(relative posix path), 16) % 20 == 0",
                "train_files": len(p.train_files), "heldout_files": len(p.heldout_files),
                "train_tokens": int(p.train_stream.size), "heldout_tokens": int(p.heldout_stream.size),
                "train_sha1": split_digest(p.train_files), "heldout_sha1": split_digest(p.heldout_files)}

    def prompt_records(self, n: int, seed: int, max_tokens: int) -> list[dict]:
        return heldout_prompts(self.prep, n, seed, max_tokens=max_tokens)


def heldout_prompts(prep: PreparedCorpus, n: int, seed: int, min_tokens: int = 64,
                    max_tokens: int = 448) -> list[dict]:
    """n prompts of min..max tokens cut from held-out files at line starts, drawn with a seeded Generator.

    A file is picked with probability proportional to its token count; the prompt starts at the beginning of a
    line and leaves at least 64 tokens of the file after it. n_tokens is the length of the re-encoded text."""
    tok = prep.tokenizer
    rng = np.random.default_rng(seed + 7)
    sizes = np.array([len(ids) for ids in prep.heldout_ids], dtype=np.float64)
    ok = sizes >= min_tokens + 64
    if not ok.any():
        return []
    weights = np.where(ok, sizes, 0.0) / sizes[ok].sum()
    newline_ids = {i for t, i in tok.get_vocab().items() if t.endswith("Ċ")}
    prompts, tries = [], 0
    while len(prompts) < n and tries < 50 * n:
        tries += 1
        fi = int(rng.choice(len(sizes), p=weights))
        ids = prep.heldout_ids[fi]
        length = int(rng.integers(min_tokens, max_tokens + 1))
        length = min(length, len(ids) - 64)
        if length < min_tokens:
            continue
        starts = [0] + [j + 1 for j in range(len(ids) - length - 64) if ids[j] in newline_ids]
        start = starts[int(rng.integers(len(starts)))]
        text = tok.decode(ids[start:start + length])
        n_tokens = len(tok.encode(text, add_special_tokens=False).ids)
        if not min_tokens <= n_tokens <= max_tokens:
            continue
        prompts.append({"id": len(prompts), "file": prep.heldout_files[fi].rel, "text": text, "n_tokens": n_tokens})
    return prompts
