"""The tokenizer of an SDAR checkpoint folder, and its chat template.

SDAR ships Qwen3's tokenizer either as `tokenizer.json` or as the slow Qwen2 files (`vocab.json` + `merges.txt`
+ `tokenizer_config.json` / `added_tokens.json`). The slow files are rebuilt here with the `tokenizers` library the
way transformers' Qwen2 converter does (NFC, Qwen2 split regex, byte-level BPE), so no transformers install is
needed. A folder without tokenizer files gives `None`: the runtime then works on token ids only.
"""
from __future__ import annotations

import functools
from pathlib import Path

from spot.chat_template import RenderLimits, render_chat_template
from spot.descriptors import read_json, read_text
from spot.errors import SpotError, integer_arg, path_arg, text_arg

# Qwen2's pre-tokenizer split; \p{N} alone splits numbers into single digits.
QWEN2_SPLIT_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                       r"|\s*[\r\n]+|\s+(?!\S)|\s+")


UNKNOWN_MARK = "<|id {}|>"      # an id the tokenizer does not know, where a text must show it (decode)


class SpotTokenizer:
    """encode / decode / chat template over a `tokenizers.Tokenizer`."""

    def __init__(self, tokenizer, chat_template: str | None = None, source: Path | None = None):
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.source = source

    def encode(self, text: str) -> list[int]:
        """Ids of `text` with no BOS/EOS added (SDAR's chat prompts carry their own special tokens). Through
        encode_batch, which releases the GIL (encode holds it): a server's other threads run while a long text
        is encoded."""
        text = text_arg(text, "the text to encode")
        return list(self.tokenizer.encode_batch([text], add_special_tokens=False)[0].ids)

    def max_text_chars(self, tokens: int) -> int:
        """The most characters a text of at most `tokens` tokens can have: a longer text needs more tokens, and is
        refused before it is encoded. Each token holds at most longest_token characters of the (normalized) text —
        a byte-level BPE token (SDAR's, Qwen's) one character per byte — and NFC normalization turns at most 1.5
        characters into one byte (3 code points into one 2-byte character, e.g. U+01D5). For tokenizers that keep
        every character (no normalizer or pre-tokenizer that drops text)."""
        return int(tokens * self.longest_token * 1.5)

    @functools.cached_property
    def longest_token(self) -> int:
        """The longest token of the vocabulary (added tokens included), in characters of its vocabulary string: a
        byte-level token's string has one character per byte it holds."""
        return max(map(len, self.tokenizer.get_vocab(with_added_tokens=True)), default=1)

    def decode(self, ids, mark_unknown: bool = False) -> str:
        """Text of `ids`, special tokens kept (they are part of what the model wrote). An id that is not a token of
        this vocabulary (the tokenizer rendered one as '', and -1 as an OverflowError) is a SpotError, or with
        mark_unknown shown as UNKNOWN_MARK ("<|id 151700|>": a model whose vocabulary is larger than its tokenizer's
        may write one)."""
        ids = self.checked_ids(ids, refuse_unknown=not mark_unknown)
        text, run = [], []
        for i in [*ids, None]:
            if i is not None and self.knows(i):
                run.append(i)
                continue
            text.append(self.tokenizer.decode(run, skip_special_tokens=False))
            run = []
            if i is not None:
                text.append(UNKNOWN_MARK.format(i))
        return "".join(text)

    def checked_ids(self, ids, refuse_unknown: bool = True) -> list[int]:
        """`ids` as Python ints (SpotError for anything else), each one of this tokenizer's unless refuse_unknown is
        false; SpotError naming the first that is not."""
        if isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__"):
            raise SpotError(f"token ids must be a sequence of integers, got {ids!r:.60} ({type(ids).__name__})",
                            "e.g. tokenizer.decode([12, 845, 9])")
        out = [integer_arg(i, "a token id") for i in ids]
        bad = next((i for i in out if not self.knows(i) and (refuse_unknown or i < 0)), None)
        if bad is not None:
            raise SpotError(f"token id {bad} is not in the tokenizer's vocabulary ({self.vocab_size} tokens, ids "
                            f"0..{self._known_ids[0] - 1})", "the ids do not belong to this tokenizer")
        return out

    def knows(self, i: int) -> bool:
        bound, gaps = self._known_ids
        return 0 <= i < bound and i not in gaps

    @functools.cached_property
    def _known_ids(self) -> tuple[int, frozenset]:
        """(1 + the largest id, the ids below it that name no token): ids may have gaps (build_qwen2_bpe)."""
        ids = set(self.tokenizer.get_vocab(with_added_tokens=True).values())
        bound = max(ids, default=-1) + 1
        return bound, frozenset(range(bound)) - ids if len(ids) < bound else frozenset()

    def token_to_id(self, token: str) -> int | None:
        return self.tokenizer.token_to_id(text_arg(token, "the token"))

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            limits: RenderLimits = RenderLimits()) -> str:
        """Render the checkpoint's chat template (jinja2, as transformers renders it) to the prompt text, within
        `limits` of time, memory and length (spot.chat_template)."""
        if not self.chat_template:
            raise SpotError(f"the tokenizer of {self.source} has no chat template",
                            "use the prompt as raw text: tokenizer.encode(text) (CLI: --no-chat)")
        if not isinstance(messages, list) or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
            raise SpotError(f"messages must be a list of {{\"role\": ..., \"content\": ...}} objects, got "
                            f"{messages!r:.80}", "e.g. [{\"role\": \"user\", \"content\": \"Hello\"}]")
        for m in messages:
            text_arg(m.get("content", ""), f"the content of a {m['role']} message")
        return render_chat_template(self.chat_template, messages, add_generation_prompt, limits)

    def chat_prompt_ids(self, user_text: str) -> list[int]:
        """Ids of a one-turn chat prompt ending with the assistant header."""
        return self.encode(self.apply_chat_template([{"role": "user", "content": text_arg(user_text, "the message")}]))


class TextStream:
    """Text of a growing id sequence, piece by piece (streaming block by block): each `feed(ids)` returns the text
    the new ids complete. The whole sequence is decoded each time — byte-level BPE pieces only read right across
    token boundaries — and a trailing U+FFFD (a UTF-8 character whose bytes are not all there yet) is held back
    until the next ids complete it (or `end()`). The pieces joined are tokenizer.decode(all ids, mark_unknown)."""

    def __init__(self, tokenizer: SpotTokenizer, mark_unknown: bool = False):
        if not isinstance(tokenizer, SpotTokenizer):
            raise SpotError(f"TextStream needs a tokenizer, got {tokenizer!r:.60}",
                            "TextStream(spot.tokenizer.load_tokenizer(folder))")
        self.tokenizer, self.ids, self.shown, self.mark_unknown = tokenizer, [], 0, mark_unknown

    def feed(self, ids) -> str:
        self.ids.extend(self.tokenizer.checked_ids(ids, refuse_unknown=not self.mark_unknown))
        text = self.tokenizer.decode(self.ids, self.mark_unknown)
        ready = len(text.rstrip("\ufffd"))
        if ready < self.shown:      # a held-back character decoded otherwise: never unsay printed text
            ready = self.shown
        piece, self.shown = text[self.shown:ready], ready
        return piece

    def end(self) -> str:
        text = self.tokenizer.decode(self.ids, self.mark_unknown)
        piece, self.shown = text[self.shown:], len(text)
        return piece


class TrimmedStream:
    """A decode's text printed block by block as a whole text is printed (right-stripped): trailing whitespace waits
    for more text and the end drops it (the embedded model's blocks often end in newlines: ~30 blank lines stood
    before the stats line). Without a tokenizer the ids, each after a space. `feed(block_ids)` returns what to print
    now, `end()` the rest."""

    def __init__(self, tokenizer: SpotTokenizer | None):
        self.text = TextStream(tokenizer, mark_unknown=True) if tokenizer is not None else None
        self.held = ""

    def feed(self, block_ids) -> str:
        piece = self.held + (self.text.feed(block_ids) if self.text else "".join(f" {i}" for i in block_ids))
        self.held = piece[len(piece.rstrip()):]
        return piece.rstrip()

    def end(self) -> str:
        return (self.held + self.text.end()).rstrip() if self.text else ""


RESTORE = "restore the file from the checkpoint"


def _read_json(path: Path) -> dict:
    """A tokenizer file's JSON object; SpotError naming the file when it is not UTF-8 JSON or not an object."""
    data = read_json(path, RESTORE)
    if not isinstance(data, dict):
        raise SpotError(f"{path} holds a JSON {type(data).__name__}, expected an object", RESTORE)
    return data


def _token_ids(path: Path, data: dict) -> dict[str, int]:
    """A {token: id} object (vocab.json, added_tokens.json) checked: ids are non-negative integers."""
    bad = next(((t, i) for t, i in data.items() if not isinstance(i, int) or isinstance(i, bool) or i < 0), None)
    if bad is not None:
        raise SpotError(f"{path} maps {bad[0]!r} to {bad[1]!r}, expected an object of token -> id (an integer "
                        ">= 0)", RESTORE)
    return data


def added_tokens(model_dir: Path) -> dict[int, dict]:
    """id -> {content, special, lstrip, rstrip, single_word} from added_tokens.json and tokenizer_config.json.

    tokenizer_config.json's `added_tokens_decoder` wins: SDAR's added_tokens.json names id 151669 "<MASK>" while
    the config (and the model's mask_token) say "<|MASK|>".
    """
    out: dict[int, dict] = {}
    path = model_dir / "added_tokens.json"
    if path.is_file():
        for content, idx in _token_ids(path, _read_json(path)).items():
            out[idx] = {"content": content, "special": True}
    path = model_dir / "tokenizer_config.json"
    if path.is_file():
        decoder = _read_json(path).get("added_tokens_decoder") or {}
        if not isinstance(decoder, dict):
            raise SpotError(f"{path}: added_tokens_decoder is a {type(decoder).__name__}, expected an object of "
                            "id -> token", RESTORE)
        for idx, entry in decoder.items():
            if not (idx.isdigit() and isinstance(entry, dict) and isinstance(entry.get("content"), str)):
                raise SpotError(f"{path}: added_tokens_decoder entry {idx!r} is {entry!r}, expected an id -> "
                                "{\"content\": token, ...}", RESTORE)
            out[int(idx)] = dict(entry)
    return out


def _chat_template_from(model_dir: Path) -> str | None:
    path = model_dir / "chat_template.jinja"
    if path.is_file():
        return read_text(path, RESTORE)
    cfg_path = model_dir / "tokenizer_config.json"
    if not cfg_path.is_file():
        return None
    template = _read_json(cfg_path).get("chat_template")
    if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or next(iter(named.values()), None)
    if template is not None and not isinstance(template, str):
        raise SpotError(f"{cfg_path}: chat_template is a {type(template).__name__}, expected a string (or a list of "
                        "{\"name\", \"template\"} objects)", RESTORE)
    return template or None


def build_qwen2_bpe(vocab_path: Path, merges_path: Path, extra_tokens: dict[int, dict]):
    """A byte-level BPE tokenizer equal to transformers' Qwen2TokenizerFast for these files."""
    # tokenizers: loaded when a tokenizer is built, not at start-up
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    vocab = _token_ids(vocab_path, _read_json(vocab_path))
    merges = []
    for line in read_text(merges_path, RESTORE).splitlines():
        if line.startswith("#version") or not line.strip():
            continue
        parts = line.split(" ")
        if len(parts) != 2:
            raise SpotError(f"{merges_path}: malformed merge line {line!r}", RESTORE)
        merges.append((parts[0], parts[1]))
    # Added tokens go into the model vocabulary too, so that each keeps its exact id (ids may have gaps).
    for idx, entry in extra_tokens.items():
        vocab[entry["content"]] = idx
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, dropout=None, unk_token=None,
                               continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False,
                               byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    added = [AddedToken(e["content"], single_word=bool(e.get("single_word", False)),
                        lstrip=bool(e.get("lstrip", False)), rstrip=bool(e.get("rstrip", False)),
                        normalized=bool(e.get("normalized", False)), special=bool(e.get("special", True)))
             for _, e in sorted(extra_tokens.items())]
    tok.add_special_tokens(added)  # matched before BPE, so each encodes as one id
    for idx, entry in extra_tokens.items():
        got = tok.token_to_id(entry["content"])
        if got != idx:
            raise SpotError(f"added token {entry['content']!r} got id {got}, expected {idx}",
                            "the tokenizer files of the checkpoint disagree with each other")
    return tok


def load_tokenizer(model_dir: str | Path) -> SpotTokenizer | None:
    """The checkpoint's tokenizer: tokenizer.json, else vocab.json + merges.txt; None when the folder has neither
    (SpotError when there is no such folder)."""
    model_dir = path_arg(model_dir, "the model folder")
    if not model_dir.is_dir():
        raise SpotError(f"model folder {model_dir} {'is a file' if model_dir.exists() else 'does not exist'}",
                        "pass the checkpoint's folder, or the folder spot-export wrote")
    tokenizer_json = model_dir / "tokenizer.json"
    vocab, merges = model_dir / "vocab.json", model_dir / "merges.txt"
    if tokenizer_json.is_file():
        # tokenizers: loaded when a tokenizer is built, not at start-up
        from tokenizers import Tokenizer
        try:
            tok = Tokenizer.from_file(str(tokenizer_json))
        except Exception as e:  # tokenizers raises a bare Exception on malformed files
            # tokenizers: loaded when a tokenizer is built, not at start-up
            import tokenizers
            raise SpotError(f"{tokenizer_json} could not be read by tokenizers {tokenizers.__version__} ({e})",
                            "spot needs tokenizers >= 0.20 (older ones cannot read merges stored as pairs): "
                            "pip install -U tokenizers; if it is current, " + RESTORE) from None
    elif vocab.is_file() and merges.is_file():
        tok = build_qwen2_bpe(vocab, merges, added_tokens(model_dir))
    else:
        return None
    return SpotTokenizer(tok, _chat_template_from(model_dir), model_dir)


def parse_prompt_ids(text: str, flag: str = "--prompt-ids") -> list[int]:
    """'1,2, 3' -> [1, 2, 3] (the syntax of --prompt-ids, and of --stop-ids); SpotError naming the bad item."""
    items = [s.strip() for s in text.split(",")]
    if items == [""]:
        return []
    ids = []
    for item in items:
        try:
            ids.append(int(item))
        except ValueError:
            raise SpotError(f"{flag} takes comma-separated integers, got {item!r} in {text!r}",
                            f"example: {flag} 151644,872,198") from None
    return ids


def prompt_ids_for(tokenizer: SpotTokenizer | None, prompt: str | None, prompt_ids: str | None,
                   chat: bool | None) -> list[int]:
    """The prompt as ids from exactly one of text (optionally chat-formatted) or an id list.

    chat=None means: chat-format text prompts when the tokenizer has a chat template.
    """
    if (prompt is None) == (prompt_ids is None):
        raise SpotError("give exactly one of --prompt TEXT, --prompt-file PATH or --prompt-ids 1,2,3")
    if prompt_ids is not None:
        if chat:
            raise SpotError("--chat applies to text prompts, not to --prompt-ids",
                            "pass the chat-formatted ids yourself, or use --prompt TEXT --chat")
        return parse_prompt_ids(prompt_ids)
    if tokenizer is None:
        raise SpotError("this checkpoint has no tokenizer files (tokenizer.json or vocab.json + merges.txt), "
                        "so --prompt TEXT cannot be encoded", "pass token ids with --prompt-ids 1,2,3")
    text_arg(prompt, "--prompt", "pass UTF-8 text (a UTF-8 locale or terminal), a UTF-8 file with --prompt-file, or "
             "token ids with --prompt-ids")
    if chat is None:
        chat = bool(tokenizer.chat_template)
    return tokenizer.chat_prompt_ids(prompt) if chat else tokenizer.encode(prompt)
