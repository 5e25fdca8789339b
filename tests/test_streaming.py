"""Streaming (decode.generate's on_block, `spot generate --stream`): after each finished block the ids it adds to
the output, so the pieces joined are the output; a true return ends generation after that block."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from spot.cli import main as cli
from spot.config import ModelConfig
from spot.engines.torch_engine import TorchEngine
from spot.reference.model import random_model
from spot.runtime.decode_plan import DecodeRequest, run_decoder
from spot.runtime.spot import TreeBudget
from spot.runtime.step import Sampling
from spot.tokenizer import TextStream

CFG = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=8, max_position_embeddings=256, block_size=4, mask_token_id=63,
                  stop_ids=(62,))


@pytest.fixture(scope="module")
def engine():
    torch.manual_seed(0)
    return TorchEngine(random_model(CFG, seed=7, scale=0.5))


def _decode(engine, decoder, temperature, stop_ids=(), on_block=None, max_new_tokens=22):
    req = DecodeRequest(max_new_tokens=max_new_tokens, sampling=Sampling(temperature, seed=3),
                        budget=TreeBudget(6, 3), stop_ids=list(stop_ids))
    return run_decoder(decoder, engine, np.arange(5, 11), req, on_block=on_block)


@pytest.mark.parametrize("decoder", ["standard", "threshold", "chain", "tree"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_pieces_joined_are_the_output(engine, decoder, temperature):
    pieces = []
    gen = _decode(engine, decoder, temperature, on_block=lambda ids: pieces.append(list(ids)))
    assert sum(pieces, []) == gen.token_ids and len(pieces) == gen.stats.blocks
    assert [len(p) for p in pieces] == [2, 4, 4, 4, 4, 4]     # prompt of 6: its last 2 positions open block 1
    assert not gen.cancelled and gen.token_ids == _decode(engine, decoder, temperature).token_ids


def test_a_stop_id_cuts_the_last_piece(engine):
    full = _decode(engine, "standard", 1.0).token_ids
    stop = full[9]                       # inside the third block
    first = full.index(stop)
    pieces = []
    gen = _decode(engine, "standard", 1.0, stop_ids=[stop], on_block=lambda ids: pieces.append(list(ids)))
    assert gen.stopped and gen.token_ids == full[:first] == sum(pieces, [])
    assert stop not in pieces[-1] and len(pieces) == gen.stats.blocks


@pytest.mark.parametrize("decoder", ["standard", "tree"])
def test_a_true_return_ends_generation_after_that_block(engine, decoder):
    full = _decode(engine, decoder, 1.0)
    pieces = []
    gen = _decode(engine, decoder, 1.0, on_block=lambda ids: pieces.append(list(ids)) or len(pieces) == 2)
    assert gen.cancelled and not gen.stopped and gen.stats.blocks == 2
    assert gen.token_ids == sum(pieces, []) == full.token_ids[:6]
    # asking to stop at the last block ends nothing early
    last = _decode(engine, decoder, 1.0, on_block=lambda ids: True, max_new_tokens=2)
    assert not last.cancelled and last.token_ids == full.token_ids[:2]


@pytest.mark.parametrize("decoder", ["standard", "tree"])
def test_max_new_tokens_is_the_most_returned(engine, decoder):
    """`--max-new-tokens 64` returned 91 tokens: the last block is still decoded whole (the algorithm needs it), but
    the output, its pieces included, stops at max_new_tokens; the rest of that block is overflow_ids. A stop id
    there does not end the output early (it ends after max_new_tokens ids either way)."""
    whole = _decode(engine, decoder, 1.0, max_new_tokens=22).token_ids      # prompt 6 + 22: a block boundary
    for n in (19, 20, 21, 22):      # 6 + n -> the boundary 28: the same blocks decoded, n of them returned
        pieces = []
        gen = _decode(engine, decoder, 1.0, max_new_tokens=n, on_block=lambda ids: pieces.append(list(ids)))
        assert gen.token_ids == whole[:n] == sum(pieces, []) and gen.overflow_ids == whole[n:]
        assert gen.stats.blocks == 6 and not gen.stopped
    past = next(t for t in whole[19:] if t not in whole[:19])
    gen = _decode(engine, decoder, 1.0, stop_ids=[past], max_new_tokens=19)
    assert gen.token_ids == whole[:19] and not gen.stopped
    assert gen.overflow_ids == whole[19:whole.index(past)]
    inside = _decode(engine, decoder, 1.0, stop_ids=[whole[3]], max_new_tokens=19)
    assert inside.stopped and inside.token_ids == whole[:whole.index(whole[3])] and inside.overflow_ids == []


def test_text_stream_holds_back_incomplete_characters():
    from spot.assets import embedded_model_dir
    from spot.tokenizer import load_tokenizer
    tok = load_tokenizer(embedded_model_dir())
    text = "def f():\n    return 'é€漢字 ok'  # ünïcödé\n"
    ids = tok.encode(text)
    partial = [i for i in range(1, len(ids)) if tok.decode(ids[:i]).endswith("\ufffd")]
    assert partial, "the test text should split a character across tokens"
    stream = TextStream(tok)
    pieces = [stream.feed([i]) for i in ids]
    assert not any("\ufffd" in p for p in pieces)
    assert "".join(pieces) + stream.end() == tok.decode(ids) == text


def test_cli_stream_prints_what_generate_prints(tmp_path):
    args = ["generate", "--prompt", "import os", "--max-new-tokens", "40", "--decoder", "tree", "--temperature",
            "1", "--seed", "2"]
    plain, streamed = CliRunner().invoke(cli, args), CliRunner().invoke(cli, [*args, "--stream"])
    assert plain.exit_code == 0 and streamed.exit_code == 0, streamed.output
    assert streamed.stdout == plain.stdout
    lines = CliRunner().invoke(cli, [*args, "--stream", "--json"]).stdout.splitlines()
    blocks, result = [json.loads(x)["block_ids"] for x in lines[:-1]], json.loads(lines[-1])
    assert len(blocks) == result["blocks"] and sum(blocks, []) == result["token_ids"]


def test_text_output_ends_without_the_trailing_blank_lines(monkeypatch):
    """The embedded model's blocks often end in newlines: `--stream` printed ~30 blank lines before the stats line.
    The text output (streamed or not) holds trailing whitespace back until more text follows and drops it at the
    end; --json keeps the exact text."""
    import spot.app.request_options as request_options
    from spot.assets import embedded_model_dir
    from spot.runtime.decode import DecodeStats, Generation
    from spot.tokenizer import load_tokenizer
    tok = load_tokenizer(embedded_model_dir())
    blocks = [tok.encode("def f():\n    return 1\n\n"), tok.encode("\n\n  x = 2\n\n\n\n"), tok.encode("\n\n \n")]

    def fake_decode(plan, engine, ids, on_block=None):
        for block in blocks:
            if on_block is not None:
                on_block(block)
        return Generation(sum(blocks, []), False, DecodeStats(seconds=0.1), len(ids))
    monkeypatch.setattr(request_options, "run_plan", fake_decode)
    args = ["generate", "--model", str(embedded_model_dir()), "--prompt", "def"]
    plain, streamed = (CliRunner().invoke(cli, [*args, *more]) for more in ([], ["--stream"]))
    assert plain.exit_code == 0 and streamed.exit_code == 0, streamed.output
    assert plain.stdout == streamed.stdout == "def f():\n    return 1\n\n\n\n  x = 2\n"
    exact = json.loads(CliRunner().invoke(cli, [*args, "--json"]).stdout)["text"]
    assert exact == tok.decode(sum(blocks, [])) and exact.endswith("\n\n \n")
