"""Byte-level BPE tokenizer of the embedded model, trained with the `tokenizers` library on the training split.

Ids: `<|endoftext|>` = 0 (the trainer's first special token; also the file separator and the stop id),
`<|MASK|>` = vocab_size - 1 (added after training, so it takes the last id; SDAR's mask token marks undecided
positions and never occurs in text). Everything in between is the 256 byte symbols plus learned merges.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

from spot.errors import SpotError

EOS_TOKEN = "<|endoftext|>"
MASK_TOKEN = "<|MASK|>"
EOS_ID = 0
DEFAULT_VOCAB_SIZE = 4096


def train_bpe(texts: Iterable[str], vocab_size: int = DEFAULT_VOCAB_SIZE, split_digits: bool = False) -> Tokenizer:
    """Train on texts; the result has EOS at id 0 and MASK at id vocab_size-1 (checked, not assumed).

    split_digits: every digit is a pre-token of its own, so no merge ever holds a digit (Qwen's rule: numbers are
    read and written one digit per token)."""
    tok = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.pre_tokenizer = (pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(r"\p{N}"), "isolated"), byte_level])
                         if split_digits else byte_level)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - 1, special_tokens=[EOS_TOKEN], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    tok.add_special_tokens([MASK_TOKEN])
    check_specials(tok, vocab_size)
    return tok


def check_specials(tok: Tokenizer, vocab_size: int) -> None:
    got = (tok.token_to_id(EOS_TOKEN), tok.token_to_id(MASK_TOKEN), tok.get_vocab_size())
    if got != (EOS_ID, vocab_size - 1, vocab_size):
        raise SpotError(f"tokenizer has (eos id, mask id, size) = {got}, expected ({EOS_ID}, {vocab_size - 1}, "
                        f"{vocab_size})", "the corpus is too small to learn that many merges; lower vocab_size")


def save_tokenizer(tok: Tokenizer, out_dir: str | Path) -> None:
    """tokenizer.json plus a tokenizer_config.json naming the eos / mask tokens (Hugging Face layout)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": EOS_TOKEN, "pad_token": EOS_TOKEN,
              "mask_token": MASK_TOKEN, "bos_token": None, "unk_token": None, "model_max_length": 2048,
              "clean_up_tokenization_spaces": False}
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2))


def encode_files(tok: Tokenizer, texts: list[str]) -> list[list[int]]:
    """Token ids of each text (no specials added)."""
    return [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]
