"""The library API of the README (open_engine, DecodeRequest, run_decoder, load_drafter, TreeBudget, Sampling,
load_tokenizer, the tokenizer, TextStream, the engine's passes): a bad argument of any kind raises SpotError — never
AttributeError, TypeError, OverflowError, IndexError or ValueError from deep inside — and a token id the tokenizer
does not know is refused, not decoded to ''."""
from __future__ import annotations

import re

import numpy as np
import pytest

from spot.engines.factory import open_engine
from spot.errors import SpotError
from spot.export.export import export_checkpoint
from spot.export.options import ExportOptions
from spot.export.presets import resolve_source
from spot.runtime.decode import generate
from spot.runtime.decode_plan import DecodeRequest, run_decoder
from spot.runtime.drafter import load_drafter
from spot.runtime.spot import TreeBudget
from spot.runtime.step import Sampling
from spot.tokenizer import TextStream, load_tokenizer
from tinymodels import CFG, save_tiny_model, save_tiny_tokenizer

# every kind of wrong value: none, numbers out of range or of the wrong kind, text where numbers go and the
# reverse, bytes, a byte of a command line that was not UTF-8 (a lone surrogate), ragged and nested lists, arrays
BAD = [None, 5, -1, 2**70, -2**70, 1.5, float("nan"), float("inf"), True, np.int64(3), "x", "", "\udcff", b"x",
       [None], [-1], [99999], [1.5], ["a"], [2**70], [[1, 2], [3]], [True], (1, 2), {}, object(),
       np.array([1.0]), np.zeros((2, 2), dtype=np.int64)]


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    root = tmp_path_factory.mktemp("api")
    save_tiny_model(root / "ckpt")
    save_tiny_tokenizer(root / "ckpt")
    folder = export_checkpoint(resolve_source(str(root / "ckpt")), root / "onnx",
                               ExportOptions(dtype="fp32", validate=False))
    engine = open_engine("ort", folder)
    return folder, engine, load_tokenizer(folder)


def calls(folder, engine, tok):
    """(what, call with the bad value) for each argument of the API."""
    ids, req, block = [1, 2, 3], DecodeRequest(4), np.zeros((1, CFG.block_size), dtype=np.int64)
    return {
        "open_engine(backend)": lambda v: open_engine(v, folder),
        "open_engine(model_dir)": lambda v: open_engine("ort", v),
        "open_engine(block_size)": lambda v: open_engine("ort", folder, v),
        "open_engine(device)": lambda v: open_engine("ort", folder, None, v),
        "open_engine(sampler)": lambda v: open_engine("ort", folder, sampler=v),
        "open_engine(kv_cache)": lambda v: open_engine("ort", folder, kv_cache=v),
        "open_engine(threads)": lambda v: open_engine("ort", folder, threads=v),
        "open_engine torch(model_dir)": lambda v: open_engine("torch", v),
        "open_engine torch(device)": lambda v: open_engine("torch", folder.parent / "ckpt", None, v),
        "DecodeRequest(max_new_tokens)": lambda v: DecodeRequest(v),
        "DecodeRequest(mode)": lambda v: DecodeRequest(4, v),
        "DecodeRequest(tau)": lambda v: DecodeRequest(4, tau=v),
        "DecodeRequest(sampling)": lambda v: DecodeRequest(4, sampling=v),
        "DecodeRequest(budget)": lambda v: DecodeRequest(4, budget=v),
        "DecodeRequest(stop_ids)": lambda v: DecodeRequest(4, stop_ids=v),
        "DecodeRequest(independent_noise)": lambda v: DecodeRequest(4, independent_noise=v),
        "Sampling(temperature)": lambda v: Sampling(v),
        "Sampling(top_k)": lambda v: Sampling(1.0, v),
        "Sampling(top_p)": lambda v: Sampling(1.0, 0, v),
        "Sampling(seed)": lambda v: Sampling(1.0, seed=v),
        "TreeBudget(nodes)": lambda v: TreeBudget(v),
        "TreeBudget(depth)": lambda v: TreeBudget(4, v),
        "run_decoder(name)": lambda v: run_decoder(v, engine, ids, req),
        "run_decoder(engine)": lambda v: run_decoder("standard", v, ids, req),
        "run_decoder(prompt_ids)": lambda v: run_decoder("standard", engine, v, req),
        "run_decoder(request)": lambda v: run_decoder("standard", engine, ids, v),
        "run_decoder(drafter)": lambda v: run_decoder("spot", engine, ids, req, v),
        "run_decoder(on_block)": lambda v: run_decoder("standard", engine, ids, req, None, v),
        "generate(engine)": lambda v: generate(v, ids, max_new_tokens=4),
        "generate(prompt_ids)": lambda v: generate(engine, v, max_new_tokens=4),
        "generate(max_new_tokens)": lambda v: generate(engine, ids, max_new_tokens=v),
        "generate(stop_ids)": lambda v: generate(engine, ids, max_new_tokens=4, stop_ids=v),
        "load_drafter(path)": lambda v: load_drafter(v),
        "load_tokenizer(path)": lambda v: load_tokenizer(v),
        "tokenizer.encode": lambda v: tok.encode(v),
        "tokenizer.decode": lambda v: tok.decode(v),
        "tokenizer.decode([v])": lambda v: tok.decode([v]),
        "tokenizer.token_to_id": lambda v: tok.token_to_id(v),
        "tokenizer.chat_prompt_ids": lambda v: tok.chat_prompt_ids(v),
        "tokenizer.apply_chat_template": lambda v: tok.apply_chat_template(v),
        "TextStream(tokenizer)": lambda v: TextStream(v),
        "TextStream.feed": lambda v: TextStream(tok).feed(v),
        "engine.prefill": lambda v: engine.prefill(v),
        "engine.block_logits": lambda v: engine.block_logits(v),
        "engine.store": lambda v: engine.store(v),
        "engine.block_outputs(steps)": lambda v: engine.block_outputs(block, v, Sampling(), 0),
    }


def test_bad_arguments_raise_spot_errors(api):
    """Before: run_decoder(..., None) as the engine was an AttributeError, open_engine("ort", 5) a TypeError,
    tokenizer.decode([-1]) an OverflowError, a ragged prompt numpy's ValueError."""
    wrong = []
    for what, call in calls(*api).items():
        for value in BAD:
            try:
                call(value)
            except SpotError as e:
                assert e.message and str(e), (what, value)
            except Exception as e:  # noqa: BLE001 - what the test looks for
                wrong.append(f"{what} with {value!r:.30}: {type(e).__name__}: {str(e)[:100]}")
    assert not wrong, f"{len(wrong)} calls raised other errors:\n" + "\n".join(wrong[:40])


def test_token_ids_outside_the_tokenizer_are_refused(api):
    """tokenizer.decode([99999]) returned '' and decode([-1]) raised OverflowError; a known id still decodes."""
    _, _, tok = api
    known = tok.encode("the cat")
    assert tok.decode(known) == "the cat" and tok.decode(np.asarray(known)) == "the cat"
    for ids in ([99999], [-1], [*known, tok.vocab_size], [2**70]):
        with pytest.raises(SpotError, match="is not in the tokenizer's vocabulary|must be an integer"):
            tok.decode(ids)
    stream = TextStream(tok)
    with pytest.raises(SpotError, match="99999 is not in the tokenizer's vocabulary"):
        stream.feed([99999])


@pytest.mark.parametrize("text,found", [("\udcff\udcfe abc", "the byte 0xff, which is not UTF-8"),
                                        ("abc \ud800", "a lone surrogate U+D800")])
def test_text_that_is_not_utf8_is_named(api, text, found):
    """A command-line prompt of non-UTF-8 bytes reaches Python as lone surrogates (`--prompt $'\\xff\\xfe abc'`):
    Tokenizer.encode raised a TypeError; bytes and None did too."""
    _, _, tok = api
    where = 0 if text[0] != "a" else 4
    with pytest.raises(SpotError, match=re.escape(f"not valid UTF-8 text: character {where} is {found}")):
        tok.encode(text)
    for value in (b"abc", None):
        with pytest.raises(SpotError, match="must be text"):
            tok.encode(value)
