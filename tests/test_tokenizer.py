"""The SDAR tokenizer rebuilt from the slow Qwen2 files of the 8B fixture, chat prompts, and tokenizer-less folders."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from spot.config import load_config
from spot.errors import SpotError
from spot.tokenizer import added_tokens, load_tokenizer, parse_prompt_ids, prompt_ids_for, render_chat_template

FIXTURE = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "sdar-8b-chat"

IM_START, IM_END, ENDOFTEXT, MASK_ID = 151644, 151645, 151643, 151669


@pytest.fixture(scope="module")
def tok():
    if not FIXTURE.is_dir():
        pytest.skip(f"fixture {FIXTURE} is absent")
    t = load_tokenizer(FIXTURE)
    assert t is not None
    return t


def test_mask_token_is_id_151669(tok):
    # added_tokens.json calls it "<MASK>", tokenizer_config.json "<|MASK|>": the config wins
    assert tok.token_to_id("<|MASK|>") == MASK_ID == load_config(FIXTURE).mask_token_id
    assert tok.encode("<|MASK|>") == [MASK_ID]
    assert added_tokens(FIXTURE)[MASK_ID]["content"] == "<|MASK|>"
    assert tok.decode([MASK_ID]) == "<|MASK|>"


def test_special_tokens_encode_as_single_ids(tok):
    assert tok.encode("<|im_start|>") == [IM_START]
    assert tok.encode("<|im_end|><|endoftext|>") == [IM_END, ENDOFTEXT]
    assert tok.encode("<think>") == [151667]


def test_stop_ids(tok):
    cfg = load_config(FIXTURE)
    assert cfg.stop_ids == (IM_END, ENDOFTEXT)
    assert [tok.decode([i]) for i in cfg.stop_ids] == ["<|im_end|>", "<|endoftext|>"]


def test_known_qwen_ids(tok):
    assert tok.encode("Hello world") == [9707, 1879]
    assert tok.encode("2024") == [17, 15, 17, 19]   # \p{N}: one digit per pre-token


def test_chat_prompt_ids(tok):
    ids = tok.chat_prompt_ids("What is 2+2?")
    assert ids[:3] == [IM_START] + tok.encode("user\n")
    assert tok.encode("user") == [872]
    assert ids[-3:] == [IM_START] + tok.encode("assistant\n") == [IM_START, 77091, 198]
    assert IM_END in ids
    text = tok.apply_chat_template([{"role": "user", "content": "What is 2+2?"}])
    assert text == "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    assert prompt_ids_for(tok, "What is 2+2?", None, None) == ids          # chat by default
    assert prompt_ids_for(tok, "What is 2+2?", None, False) == tok.encode("What is 2+2?")


@pytest.mark.parametrize("text", [
    "The quick brown fox jumps over the lazy dog.  Twice!\n\nÜber café, naïve — 東京 🚀 3.14159",
    'def fib(n: int) -> int:\n    """Fibonacci."""\n    if n < 2:\n        return n\n'
    "    return fib(n - 1) + fib(n - 2)\n\n\tprint({'a': [1, 2]}, end='')\r\n",
])
def test_encode_decode_round_trip(tok, text):
    ids = tok.encode(text)
    assert len(ids) < len(text.encode())     # BPE merges happened
    assert tok.decode(ids) == text


def test_folder_without_tokenizer_files(tmp_path):
    with pytest.raises(SpotError, match="model folder .*missing does not exist"):    # not None, as for no files
        load_tokenizer(tmp_path / "missing")
    (tmp_path / "config.json").write_text("{}")
    assert load_tokenizer(tmp_path) is None
    (tmp_path / "vocab.json").write_text("{}")      # vocab without merges is not a tokenizer either
    assert load_tokenizer(tmp_path) is None
    with pytest.raises(SpotError, match="--prompt-ids"):
        prompt_ids_for(None, "hello", None, None)
    assert prompt_ids_for(None, None, "1, 2,3", None) == [1, 2, 3]


def test_tokenizer_json_and_template_from_tokenizer_config(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    model = tokenizers.models.WordLevel({"[UNK]": 0, "hi": 1, "there": 2, "<s>": 3}, unk_token="[UNK]")
    t = tokenizers.Tokenizer(model)
    t.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    t.add_special_tokens(["<s>"])
    t.save(str(tmp_path / "tokenizer.json"))
    template = "{% for m in messages %}<s>{{ m['content'] }}{% endfor %}{% if add_generation_prompt %} there{% endif %}"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    tok = load_tokenizer(tmp_path)
    assert tok.encode("hi there") == [1, 2]
    assert tok.chat_prompt_ids("hi") == [3, 1, 2]
    assert tok.token_to_id("<s>") == 3


def test_prompt_argument_errors():
    with pytest.raises(SpotError, match="exactly one"):
        prompt_ids_for(None, None, None, None)
    with pytest.raises(SpotError, match="exactly one"):
        prompt_ids_for(None, "a", "1", None)
    with pytest.raises(SpotError, match="'x'"):
        parse_prompt_ids("1,x,3")
    with pytest.raises(SpotError, match="--chat"):
        prompt_ids_for(None, None, "1", True)
    with pytest.raises(SpotError, match="chat template failed"):
        render_chat_template("{{ raise_exception('no system role') }}", [])


@pytest.mark.parametrize("name, content, says", [
    ("tokenizer_config.json", [], "holds a JSON list, expected an object"),
    ("tokenizer_config.json", {"added_tokens_decoder": 5}, "added_tokens_decoder is a int"),
    ("tokenizer_config.json", {"added_tokens_decoder": {"7": "x"}}, "added_tokens_decoder entry '7'"),
    ("tokenizer_config.json", {"chat_template": 3}, "chat_template is a int, expected a string"),
    ("vocab.json", [], "holds a JSON list, expected an object"),
    ("vocab.json", {"a": "x"}, "maps 'a' to 'x', expected an object of token -> id"),
    ("added_tokens.json", {"<x>": -1}, "maps '<x>' to -1"),
])
def test_tokenizer_files_of_the_wrong_shape_are_named(tmp_path, name, content, says):
    """Valid JSON of the wrong shape in a slow-tokenizer file: one error naming the file (these raised
    AttributeError / TypeError deep in the tokenizer build)."""
    (tmp_path / "vocab.json").write_text(json.dumps({"a": 0, "b": 1, "ab": 2}))
    (tmp_path / "merges.txt").write_text("#version: 0.2\na b\n")
    assert load_tokenizer(tmp_path).encode("ab") == [2]
    (tmp_path / name).write_text(json.dumps(content))
    with pytest.raises(SpotError) as info:
        load_tokenizer(tmp_path).chat_template
    assert str(tmp_path / name) in info.value.message and says in info.value.message, info.value.message
    assert info.value.hint == "restore the file from the checkpoint"
