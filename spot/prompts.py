"""Prompt sets for benchmarks, traces and tuning: JSONL files of text or token ids, with optional true answers."""
from __future__ import annotations

from dataclasses import dataclass
import errno
from pathlib import Path
import sys

from spot.assets import embedded_model_dir
from spot.config import MAX_POSITIONS, TOKEN_ID
from spot.descriptors import parse_json, utf8_text
from spot.errors import SpotError, os_error_hint
from spot.schema import AnyOf, Integer, ListOf, Mismatch, Nullable, Record, Text

PROMPT_FILE_LIMIT = 64 * 2**20     # far beyond any context; a device or a wrong file is refused before it fills memory
HELDOUT_PROMPTS = "heldout_prompts.jsonl"


def heldout_prompts_path(folder) -> Path:
    """The held-out prompts of the model in `folder` (an embedded model's folder holds them and spot-export copies
    them); the default model's for a folder without any (a real SDAR export)."""
    own = Path(folder) / HELDOUT_PROMPTS
    return own if own.is_file() else embedded_model_dir() / HELDOUT_PROMPTS


def read_prompt_file(path: str) -> str:
    """The text of a prompt file ('-': standard input), UTF-8; SpotError naming the file otherwise."""
    try:
        if path == "-":
            data = sys.stdin.buffer.read(PROMPT_FILE_LIMIT + 1)
        else:
            with open(path, "rb") as f:
                data = f.read(PROMPT_FILE_LIMIT + 1)
    except OSError as e:
        raise SpotError(f"cannot read the prompt file {path}: {e.strerror}",
                        "check the path, or pass - to read the prompt from standard input" if e.errno == errno.ENOENT
                        else os_error_hint(e)) from None
    if len(data) > PROMPT_FILE_LIMIT:
        raise SpotError(f"the prompt file {path} is larger than 64 MiB", "pass the prompt text itself")
    # (a leading byte-order mark is not part of the prompt)
    return utf8_text(data, f"the prompt file {path}", "convert it to UTF-8, or pass token ids with --prompt-ids")


ID_KEYS = ("ids", "prompt_ids", "token_ids")
# a line's fields (its others, such as "file" or "solution", are the prompt set's own): token ids as a model reads
# them, no more than any context holds; an answer within 64 bits
IDS = ListOf(TOKEN_ID, MAX_POSITIONS)
INT64 = Integer(-2**63, 2**63 - 1)
PROMPT_LINE = Record({**{k: IDS for k in ID_KEYS}, "text": Text(), "id": AnyOf((Text(), INT64)),
                      "answer": Nullable(INT64)},
                     what='an object with "ids" (a list of token ids) or "text"')
HINT = "write one {\"text\": ...} or {\"ids\": [...]} per line"


@dataclass
class Prompt:
    id: str
    ids: list[int]
    text: str | None = None
    answer: int | None = None       # a GSM8K-format prompt's true final answer (the arithmetic model's held-out set)


def load_prompts(path: str | Path, tokenizer=None, limit: int | None = None, max_tokens: int | None = None
                 ) -> list[Prompt]:
    """JSONL with {"id", "text"} (needs a tokenizer) or {"id", "ids": [...]} ("prompt_ids" / "token_ids" too, or a
    bare list of ids) per line; an optional integer "answer" is the true final answer of a GSM8K-format prompt."""
    path = Path(path)
    if not path.is_file():
        what = "is a folder" if path.is_dir() else "does not exist"
        raise SpotError(f"prompt file {path} {what}", "pass a JSONL file with one {\"text\": ...} per line")
    text = utf8_text(path.read_bytes(), f"prompt file {path}",
                     "write it as UTF-8 JSONL, one {\"text\": ...} or {\"ids\": [...]} per line")
    prompts = []
    # JSON lines end at \n only: str.splitlines() also splits inside a string at U+2028, U+0085, \x0c ..., which
    # json.dumps(ensure_ascii=False) writes unescaped
    for n, line in enumerate(text.split("\n")):
        line = line.removesuffix("\r")
        if not line.strip():
            continue
        rec = parse_json(line, f"{path}:{n + 1}", HINT, strict=True)     # spot's own format: read strictly
        if not isinstance(rec, dict):
            rec = {"ids": rec}
        try:
            PROMPT_LINE.check(rec)
        except Mismatch as e:
            raise SpotError(e.message(f"{path}:{n + 1}"), HINT) from None
        ids = next((rec[k] for k in ID_KEYS if k in rec), None)
        if ids is not None and "text" in rec:
            raise SpotError(f"{path}:{n + 1} holds both token ids and text",
                            "keep one of them: spot cannot tell whether they agree")
        if ids is None and "text" in rec:
            if tokenizer is None:
                raise SpotError(f"{path}:{n + 1} holds text but the model has no tokenizer",
                                "give token ids in the JSONL ({\"ids\": [...]}) or use a model with tokenizer files")
            ids = tokenizer.encode(rec["text"])
        if ids is None:
            raise SpotError(f"{path}:{n + 1}: expected an object with \"ids\" (a list of ints) or \"text\"", HINT)
        answer = rec.get("answer")
        if max_tokens:
            ids = ids[:max_tokens]
        prompts.append(Prompt(str(rec.get("id", n)), ids, rec.get("text"), answer))
        if limit and len(prompts) >= limit:
            break
    if not prompts:
        raise SpotError(f"{path} holds no prompts")
    return prompts
