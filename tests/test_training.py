"""The embedded-target training pipeline: corpus split, BPE specials, the block-diffusion objective, the folder."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from spot.errors import SpotError
from spot.training import bpe, corpus
from spot.training.objective import diffusion_bias, diffusion_loss, mask_blocks
from spot.training.target import TrainSettings, init_model, lr_at, make_optimizer, model_config, train_target

TINY = TrainSettings(vocab_size=512, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                     num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=256,
                     block_size=16, seq_len=64, batch_size=2, warmup_steps=1, lr=1e-2, log_every=1,
                     eval_every=1000, ckpt_every=1000)


@pytest.fixture(scope="module")
def tiny_texts():
    train, _ = corpus.split_corpus()
    return [f.text for f in train[:6]]


def test_split_is_deterministic_and_follows_the_sha1_rule():
    rels = corpus.list_sources()
    assert rels == sorted(rels) and rels == corpus.list_sources()
    assert not any(part in ("test", "tests", "site-packages") for r in rels for part in r.split("/")[:-1])
    heldout = [r for r in rels if corpus.is_heldout(r)]
    assert 0.02 < len(heldout) / len(rels) < 0.10
    import hashlib
    assert all(int(hashlib.sha1(r.encode()).hexdigest(), 16) % 20 == 0 for r in heldout)


def test_bpe_has_the_specials_at_their_ids(tiny_texts):
    tok = bpe.train_bpe(tiny_texts, 512)
    assert tok.token_to_id("<|endoftext|>") == 0
    assert tok.token_to_id("<|MASK|>") == 511
    assert tok.get_vocab_size() == 512
    text = "def f(x):\n    return x + 1\n"
    ids = tok.encode(text, add_special_tokens=False).ids
    assert tok.decode(ids) == text and 0 not in ids and 511 not in ids


def test_diffusion_bias_is_sdars_training_mask():
    length, b = 8, 4
    allowed = diffusion_bias(length, b) == 0  # [2L, 2L]: rows/cols 0..L-1 noisy, L..2L-1 clean
    assert allowed[1, 3] and not allowed[1, 4]              # noisy block 0 sees itself only
    assert allowed[5, 4] and allowed[5, 7] and allowed[5, 8 + 3] and not allowed[5, 8 + 4]  # noisy 1: itself+clean 0
    assert not allowed[5, 0]                                # never another noisy block
    assert allowed[8 + 5, 8 + 0] and allowed[8 + 5, 8 + 7] and not allowed[8 + 1, 8 + 4]    # clean block-causal
    assert not allowed[8:, :8].any()                        # clean never sees noisy


def test_mask_blocks_masks_every_block_and_respects_the_ratio():
    gen = torch.Generator().manual_seed(0)
    x0 = torch.arange(2 * 64).view(2, 64) % 100
    xt, masked, t = mask_blocks(x0, 16, 511, gen, eps=1 / 16)
    assert masked.view(2, 4, 16).any(-1).all()
    assert torch.equal(xt[masked], torch.full((int(masked.sum()),), 511))
    assert torch.equal(xt[~masked], x0[~masked])
    _, full, _ = mask_blocks(x0, 16, 511, gen, eps=0.0, ratio=1.0)
    assert full.all()


def test_a_few_steps_lower_the_loss(tiny_texts):
    torch.set_num_threads(2)
    tok = bpe.train_bpe(tiny_texts, TINY.vocab_size)
    stream = np.concatenate([np.asarray(ids + [0]) for ids in bpe.encode_files(tok, tiny_texts)])
    x0 = torch.from_numpy(stream[: 2 * TINY.seq_len].reshape(2, TINY.seq_len)).long()
    model = init_model(model_config(TINY), 0)
    opt = make_optimizer(model, TINY)
    bias = diffusion_bias(TINY.seq_len, TINY.block_size)

    def fixed_loss():
        with torch.no_grad():
            return float(diffusion_loss(model, x0, bias, torch.Generator().manual_seed(5), TINY.mask_eps)[1])

    before = fixed_loss()
    gen = torch.Generator().manual_seed(1)
    for _ in range(15):
        loss, _ = diffusion_loss(model, x0, bias, gen, TINY.mask_eps)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert fixed_loss() < before - 0.5


def test_train_target_writes_a_folder_that_loads_and_generates(tmp_path):
    from spot.checkpoint import Checkpoint
    from spot.engines.torch_engine import TorchEngine
    from spot.runtime.decode import generate
    from spot.training.evaluate import decode_stats, load_prompts

    out = tmp_path / "model"
    report = train_target(out, 3, settings=TINY, work_dir=tmp_path / "work", max_files=6, progress=False,
                          n_prompts=4, final_eval=False)
    assert report["steps_done"] == 3 and len(report["history"]["train_loss"]) == 3
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == "sdar" and cfg["block_size"] == 16 and cfg["mask_token_id"] == 511
    assert cfg["eos_token_id"] == 0 and cfg["torch_dtype"] == "float16"
    ckpt = Checkpoint(out)
    assert ckpt.config.mask_token_id == 511 and ckpt.config.stop_ids == (0,)
    engine = TorchEngine.from_dir(out)
    g = generate(engine, np.arange(1, 20), max_new_tokens=16)   # runs to the block boundary: 19+16 -> 48
    assert len(g.token_ids) <= 48 - 19 and all(0 < t < 511 for t in g.token_ids)
    prompts = load_prompts(out)
    assert prompts and all({"id", "file", "text", "n_tokens"} <= set(p) for p in prompts)
    assert all(corpus.is_heldout(p["file"]) for p in prompts)
    from tokenizers import Tokenizer
    stats = decode_stats(out, Tokenizer.from_file(str(out / "tokenizer.json")), prompts[:1], max_new_tokens=16)
    assert 0.0 < stats["mean_committed_top1_prob"] <= 1.0 and stats["steps"] >= 16
    # resuming a finished run from its checkpoint trains nothing more and reproduces the same weights
    again = train_target(tmp_path / "model2", 3, settings=TINY, work_dir=tmp_path / "work", max_files=6,
                         progress=False, n_prompts=4, final_eval=False)
    assert again["history"] == report["history"]
    assert (out / "model.safetensors").read_bytes() == (tmp_path / "model2" / "model.safetensors").read_bytes()


def test_an_interrupted_run_resumes_to_the_same_weights_and_never_unpickles(tmp_path, monkeypatch):
    """Checkpoints are safetensors + JSON: a run interrupted after its step-2 checkpoint resumes there (model,
    AdamW state, both generators) and ends with the uninterrupted run's weights. A pickled ckpt.pt planted in the
    work folder (earlier versions wrote one and resumed with torch.load(weights_only=False)) is never read, so
    its code never runs."""
    import pickle

    import spot.training.target as target
    kw = dict(settings=replace(TINY, ckpt_every=1), max_files=6, progress=False, n_prompts=2, final_eval=False)
    train_target(tmp_path / "straight", 4, work_dir=tmp_path / "w1", **kw)
    ran = tmp_path / "the-pickle-ran"

    class Payload:
        def __reduce__(self):
            return (Path.touch, (ran,))
    (tmp_path / "w2").mkdir()
    (tmp_path / "w2" / "ckpt.pt").write_bytes(pickle.dumps({"settings": None, "model": Payload()}))
    losses = []
    real_loss = target.diffusion_loss

    def interrupted_at_step_3(*args, **kwargs):
        if len(losses) == 2:
            raise KeyboardInterrupt
        losses.append(1)
        return real_loss(*args, **kwargs)
    with monkeypatch.context() as m:
        m.setattr(target, "diffusion_loss", interrupted_at_step_3)
        with pytest.raises(KeyboardInterrupt):
            train_target(tmp_path / "resumed", 4, work_dir=tmp_path / "w2", **kw)
    assert (tmp_path / "w2" / "ckpt.safetensors").is_file() and not ran.exists()
    report = train_target(tmp_path / "resumed", 4, work_dir=tmp_path / "w2", **kw)
    log = (tmp_path / "w2" / "train.log").read_text()
    assert "resumed from" in log and "at step 2" in log and "pickled checkpoint" in log and not ran.exists()
    assert report["steps_done"] == 4
    assert (tmp_path / "straight" / "model.safetensors").read_bytes() == \
        (tmp_path / "resumed" / "model.safetensors").read_bytes()
    train_target(tmp_path / "longer", 5, work_dir=tmp_path / "w1", **kw)    # other settings: said, not silent
    said = (tmp_path / "w1" / "train.log").read_text()
    assert "was written with other settings (steps): training starts over" in said
    (tmp_path / "w2" / "ckpt.safetensors").write_bytes(b"\x00" * 40)       # damaged: named, not a traceback
    with pytest.raises(SpotError, match="not a readable training checkpoint"):
        train_target(tmp_path / "resumed", 4, work_dir=tmp_path / "w2", **kw)


def test_nothing_in_spot_unpickles():
    """No loader of pickles (torch.load, pickle, numpy's allow_pickle, TorchScript's archives) anywhere in the
    package, the scripts or the benchmarks: each can run code planted in a file."""
    import re
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    pattern = re.compile(r"torch\.load\(|torch\.jit\.load|\b(import|from)\s+(c?pickle|dill|joblib|shelve|marshal|"
                         r"cloudpickle)\b|\bpickle\.|allow_pickle\s*=\s*True|np\.load\((?![^)]*allow_pickle=False)")
    found = [f"{path.relative_to(root)}:{i}: {line.strip()}"
             for folder in ("spot", "scripts", "benchmarks", "cpp")
             for path in sorted((root / folder).rglob("*.py"))
             for i, line in enumerate(path.read_text().splitlines(), 1) if pattern.search(line.split("#")[0])]
    assert not found, "\n".join(found)


def test_train_target_replaces_its_folder_only_when_complete(tmp_path, monkeypatch):
    """An interrupt after the weights were written (during the final evaluation, minutes on the real recipe) left
    the new weights beside the previous report; now the folder is built aside and swapped in, keeping the files
    the run does not write (a drafter)."""
    import spot.training.target as target
    out = tmp_path / "model"
    kw = dict(settings=TINY, work_dir=tmp_path / "work", max_files=6, progress=False, n_prompts=4, final_eval=False)
    train_target(out, 2, **kw)
    (out / "drafter.json").write_text("{}")
    (out / "onnx").mkdir()                      # a user's subfolder: carried over, not removed with the old folder
    (out / "onnx" / "manifest.json").write_text("{}")
    before = {f.name: f.read_bytes() for f in out.iterdir() if f.is_file()}

    def interrupted(path, text):
        raise KeyboardInterrupt
    with monkeypatch.context() as m:
        m.setattr(target, "write_text_atomic", interrupted)
        with pytest.raises(KeyboardInterrupt):
            train_target(out, 3, **kw)
    assert {f.name: f.read_bytes() for f in out.iterdir() if f.is_file()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model", "work"]        # no partial folder left
    (tmp_path / "link").symlink_to(out)         # through a link: the folder it names is replaced, the link stays
    report = train_target(tmp_path / "link", 3, **kw)
    assert report["steps_done"] == 3 and json.loads((out / "training_report.json").read_text())["steps_done"] == 3
    assert (out / "drafter.json").read_text() == "{}" and (out / "onnx" / "manifest.json").read_text() == "{}"
    assert (tmp_path / "link").is_symlink() and sorted(p.name for p in tmp_path.iterdir()) == ["link", "model",
                                                                                                "work"]


@pytest.mark.parametrize("name", ["code", "arithmetic"])
def test_the_default_recipe_is_the_shipped_models(name):
    """`spot train-target --corpus NAME` with no other options reproduces the embedded model NAME: its report's
    settings are that recipe's."""
    import json
    from dataclasses import asdict

    from spot.assets import embedded_model_dir
    from spot.training.target import RECIPES
    folder = embedded_model_dir(name)
    report = json.loads((folder / "training_report.json").read_text())
    assert TrainSettings.from_dict(report["settings"]) == RECIPES[name]
    config = json.loads((folder / "config.json").read_text())
    shipped = model_config(RECIPES[name])
    assert (config["hidden_size"], config["num_hidden_layers"], config["vocab_size"], config["block_size"]) == (
        shipped.hidden_size, shipped.num_hidden_layers, shipped.vocab_size, shipped.block_size)


def test_wsd_holds_the_rate_then_decays_linearly_and_cosine_is_unchanged():
    wsd = replace(TINY, schedule="wsd", lr=1e-3, warmup_steps=10, steps=100, decay_steps=20, min_lr_ratio=0.1)
    rates = [lr_at(i, wsd) for i in range(100)]
    assert rates[0] == pytest.approx(1e-4) and rates[9] == pytest.approx(1e-3)
    assert all(r == 1e-3 for r in rates[10:80])
    assert rates[80] < 1e-3 and all(a > b for a, b in zip(rates[80:], rates[81:]))
    assert rates[99] == pytest.approx(1e-4)
    cos = replace(TINY, lr=1e-3, warmup_steps=10, steps=100, min_lr_ratio=0.1)
    assert lr_at(10, cos) == pytest.approx(1e-3) and lr_at(99, cos) == pytest.approx(1e-4, rel=0.01)


@pytest.mark.parametrize("recorded_steps, new_steps, at, resumes", [
    (6000, 5000, 1200, True),      # ended early: still stable in both schedules
    (5000, 8000, 3900, True),      # extended before the old decay began
    (5000, 8000, 4100, False),     # the old run was already decaying: its rates differ from the longer run's
    (5000, 4000, 3500, False),     # the shorter run would already decay at step 3500
])
def test_a_wsd_run_resumes_with_another_length_only_in_its_stable_phase(recorded_steps, new_steps, at, resumes):
    from dataclasses import asdict

    from spot.training.target import can_resume
    wsd = replace(TINY, schedule="wsd", decay_steps=1000)
    changed = can_resume(asdict(replace(wsd, steps=recorded_steps)), replace(wsd, steps=new_steps), at)
    assert changed == ([] if resumes else ["steps"])
    assert can_resume(asdict(replace(TINY, steps=5)), replace(TINY, steps=6), 1) == ["steps"]   # cosine: never
    assert can_resume(asdict(replace(wsd, lr=0.5)), wsd, 1) == ["lr"]


def test_settings_of_older_reports_read_with_the_defaults_of_fields_added_since():
    from dataclasses import asdict
    old = {k: v for k, v in asdict(TINY).items() if k not in ("practice_share", "result_weight", "schedule",
                                                              "decay_steps", "operation_problems", "warm_start")}
    assert TrainSettings.from_dict(old) == TINY
    nested = replace(TINY, warm_start=replace(TINY, steps=7))
    assert TrainSettings.from_dict(json.loads(json.dumps(asdict(nested)))) == nested
    with pytest.raises(SpotError, match="unknown fields"):
        TrainSettings.from_dict({**old, "new_knob": 1})


def test_a_warm_start_folder_must_come_from_the_recipes_first_stage(tmp_path):
    from spot.training.target import check_warm_start
    kw = dict(work_dir=tmp_path / "work", max_files=6, progress=False, n_prompts=2, final_eval=False)
    train_target(tmp_path / "first", 2, settings=TINY, **kw)
    check_warm_start(tmp_path / "first", replace(TINY, steps=2))
    with pytest.raises(SpotError, match=r"settings that differ: \['lr'\]"):
        check_warm_start(tmp_path / "first", replace(TINY, steps=2, lr=0.5))
    with pytest.raises(SpotError, match="steps done 2, expected 3"):
        check_warm_start(tmp_path / "first", replace(TINY, steps=3))
    with pytest.raises(SpotError, match="not a readable training report"):
        check_warm_start(tmp_path, TINY)
    with pytest.raises(SpotError, match="starts from random weights"):
        train_target(tmp_path / "second", 2, settings=TINY, init_from=tmp_path / "first", **kw)
