"""The arithmetic model's data: the GSM8K-format problem generator, answer checking, tokenization and batches."""
from __future__ import annotations

import collections
import re

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from spot import gsm8k
from spot.training import arithmetic, bpe
from spot.training.arithmetic_corpus import (ArithmeticData, encode_problem, heldout_prompt_records, make_batch,
                                             train_tokenizer)
from spot.training.objective import mask_blocks


NUMBER_WORDS = {"twice": 2, "doubles": 2, "triples": 3, "three times": 3, "four times": 4, "five times": 5}


@pytest.fixture(scope="module")
def problems():
    return arithmetic.generate_problems(2000, seed=0)


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(512, seed=0, n_problems=3000)


def test_every_answer_is_recomputed_from_the_solutions_own_arithmetic(problems):
    for p in problems:
        sol = p.solution
        assert gsm8k.check_calculations(sol) == [], sol
        assert gsm8k.recompute_answer(sol) == gsm8k.final_answer(sol) == p.answer, sol
        # every step's result is written right after its annotation, and later steps use only numbers seen before
        seen = {int(n) for n in re.findall(r"\d+", p.question)}
        seen |= {v for w, v in NUMBER_WORDS.items() if w in p.question}
        for s in p.steps:
            assert s.a in seen and s.b in seen, (s, p.question)
            seen.add(s.value)
            assert f"<<{s.a}{s.op}{s.b}={s.value}>>{s.value}" in sol


def test_problems_cover_the_shapes_steps_and_bounds(problems):
    shapes = collections.Counter((p.family, len(p.steps)) for p in problems)
    assert {f for f, _ in shapes} == set(arithmetic.FAMILIES)
    assert {n for _, n in shapes} == {1, 2, 3, 4}
    assert all(arithmetic.within_bounds(p) for p in problems)
    assert {s.op for p in problems for s in p.steps} == {"+", "-", "*", "/"}
    assert len({p.question for p in problems}) == len(problems)
    names = {n for n, _ in arithmetic.NAMES}
    assert len({w for p in problems for w in p.question.split() if w in names}) > 30     # names vary widely
    text = problems[0].text
    assert text.startswith(arithmetic.PROMPT_PREFIX) and "\nAnswer:\n" in text and text.endswith(
        f"#### {problems[0].answer}")


def test_generation_is_a_pure_function_of_the_seed():
    a = arithmetic.generate_problems(50, seed=3)
    assert a == arithmetic.generate_problems(50, seed=3)
    assert a != arithmetic.generate_problems(50, seed=4)


def test_the_split_is_by_problem_instance():
    held = arithmetic.generate_problems(40, seed=1, heldout=True)
    train = arithmetic.generate_problems(400, seed=1, heldout=False)
    assert all(arithmetic.is_heldout(p.question) for p in held)
    assert not any(arithmetic.is_heldout(p.question) for p in train)
    assert not {p.question for p in held} & {p.question for p in train}
    share = np.mean([arithmetic.is_heldout(p.question) for p in arithmetic.generate_problems(2000, seed=2)])
    assert 0.03 < share < 0.08


@pytest.mark.parametrize("text, answer", [
    ("a\n#### 42", 42), ("#### 1,234", 1234), ("x <<2+3=5>>5\n####5", 5), ("#### -7", -7),
    ("no answer line", None), ("#### ", None), ("#### 12\n#### 13", 12)])
def test_final_answer(text, answer):
    assert gsm8k.final_answer(text) == answer


def test_answer_checking():
    assert gsm8k.is_correct("He has 3+4 = <<3+4=7>>7.\n#### 7", 7)
    assert not gsm8k.is_correct("#### 8", 7) and not gsm8k.is_correct("no answer", 7)
    assert gsm8k.check_calculations("<<15+40=34>>34 and <<6*7=42>>42") == ["<<15+40=34>>"]
    assert gsm8k.check_calculations("<<7/2=3>>3") == ["<<7/2=3>>"]         # inexact division is wrong
    assert gsm8k.check_calculations("<<a+b=c>>") == ["<<a+b=c>>"]          # not arithmetic: never right
    assert gsm8k.recompute_answer("<<2*3=6>>6 then <<6+1=8>>8\n#### 8") == 7
    with pytest.raises(ValueError):
        gsm8k.apply_op(1, "%", 2)


def test_digits_are_one_token_each_and_the_prompt_is_a_prefix(tokenizer, problems):
    vocab = tokenizer.get_vocab()
    assert all(not any(c.isdigit() for c in tok) or len(tok.strip("Ġ")) == 1 for tok in vocab)
    assert tokenizer.token_to_id(bpe.EOS_TOKEN) == 0 and tokenizer.token_to_id(bpe.MASK_TOKEN) == 511
    for p in problems[:200]:
        e = encode_problem(tokenizer, p)
        assert tokenizer.decode(list(e.ids[:-1])) == p.text and e.ids[-1] == bpe.EOS_ID
        assert list(e.ids[:e.prompt_len]) == tokenizer.encode(p.prompt, add_special_tokens=False).ids


def test_batches_score_the_solution_through_its_last_block(tokenizer, problems):
    enc = [encode_problem(tokenizer, p) for p in problems[:3]]
    b = make_batch(enc, 16)
    assert b.x0.shape[1] % 16 == 0 and b.x0.shape[1] >= max(len(e.ids) for e in enc)
    for row, e in enumerate(enc):
        end = -(-len(e.ids) // 16) * 16
        assert not b.eligible[row, :e.prompt_len].any()
        assert b.eligible[row, e.prompt_len:end].all() and not b.eligible[row, end:].any()
        assert (b.x0[row, len(e.ids):] == bpe.EOS_ID).all()
    x0 = torch.from_numpy(b.x0)
    eligible = torch.from_numpy(b.eligible)
    xt, masked, _ = mask_blocks(x0, 16, 511, torch.Generator().manual_seed(0), 1 / 16, eligible=eligible)
    assert not (masked & ~eligible).any()
    blocks = eligible.view(3, -1, 16).any(-1)
    assert torch.equal(masked.view(3, -1, 16).any(-1), blocks)        # one mask at least where anything is maskable
    assert torch.equal(xt[~masked], x0[~masked])


def test_train_batches_are_fresh_bucketed_and_resume_exactly(tokenizer):
    data = ArithmeticData(tokenizer, 32, 1024, seed=5, n_heldout=10)
    first = [data.train_batch() for _ in range(3)]
    for b in first:
        assert b.x0.shape[0] == 1024 // b.x0.shape[1]      # one padded length per batch, ~1024 tokens
    state = data.state()
    after = [data.train_batch() for _ in range(2)]
    again = ArithmeticData(tokenizer, 32, 1024, seed=5, n_heldout=10)
    again.load_state(state)
    for a, b in zip(after, [again.train_batch() for _ in range(2)]):
        assert np.array_equal(a.x0, b.x0) and np.array_equal(a.eligible, b.eligible)
    held = {p.question for p in data.heldout}
    seen = {tokenizer.decode(list(r)) for b in first for r in b.x0}
    assert not any(q in s for q in held for s in seen)


def test_heldout_records_carry_their_true_answers(tokenizer):
    probs = arithmetic.generate_problems(5, seed=9, heldout=True)
    for rec, p in zip(heldout_prompt_records(probs, tokenizer), probs):
        assert rec["text"] == p.prompt and rec["answer"] == p.answer == gsm8k.final_answer(rec["solution"])
        assert rec["n_tokens"] == len(tokenizer.encode(p.prompt, add_special_tokens=False).ids)


def tiny_arithmetic_recipe():
    """The arithmetic recipe's two stages at a tiny shape (the word problems; then practice from those weights)."""
    import dataclasses

    from spot.training.target import ARITHMETIC, ARITHMETIC_WORDS
    shape = dict(vocab_size=512, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                 num_key_value_heads=1, head_dim=16, tokens_per_batch=256, log_every=1, eval_every=1000,
                 ckpt_every=1000, accuracy_every=0)
    words = dataclasses.replace(ARITHMETIC_WORDS, steps=2, **shape)
    return dataclasses.replace(ARITHMETIC, warm_start=words, decay_steps=1, warmup_steps=1,
                               **{**shape, "accuracy_every": 2, "accuracy_problems": 1, "operation_problems": 2})


def test_train_target_on_the_arithmetic_corpus_writes_a_model_folder(tmp_path):
    """A few steps of the arithmetic recipe's shape, both stages (the warm start is trained first, in the work
    folder): the folder names its corpus, holds held-out problems with their answers, decodes, and its evaluation
    reports answers, per-operation results, confidence and threshold passes."""
    import json

    from spot.config import load_config, training_corpus
    from spot.training.evaluate import arithmetic_evaluation
    from spot.training.target import train_target
    tiny = tiny_arithmetic_recipe()
    out = tmp_path / "arith"
    report = train_target(out, 2, settings=tiny, work_dir=tmp_path / "work", progress=False, n_prompts=5,
                          final_eval=False)
    assert report["steps_done"] == 2 and report["corpus"]["generator"] == "spot.training.arithmetic"
    assert [step for step, _ in report["history"]["accuracy"]] == [2]
    [[step, ops]] = report["history"]["operation_accuracy"]
    assert step == 2 and set(ops) == set("+-*/") and sum(v["steps"] for v in ops.values()) >= 2
    words = tmp_path / "work" / "warm-start"          # the first stage, trained to completion, then started from
    assert json.loads((words / "training_report.json").read_text())["steps_done"] == 2
    assert report["warm_start"]["folder"] == str(words)
    assert (words / "tokenizer.json").read_text() == (out / "tokenizer.json").read_text()
    assert training_corpus(out) == "arithmetic" and load_config(out).block_size == 32
    records = [json.loads(line) for line in (out / "heldout_prompts.jsonl").read_text().splitlines()]
    assert len(records) == 5 and all(arithmetic.is_heldout(r["text"][len("Question: "):-len("\nAnswer:\n")])
                                     for r in records)
    assert all(gsm8k.final_answer(r["solution"]) == r["answer"] for r in records)

    class Data:      # the run's held-out problems and tokenizer, as train_target hands them over
        tokenizer = __import__("tokenizers").Tokenizer.from_file(str(out / "tokenizer.json"))
        heldout = arithmetic.generate_problems(2, seed=7, heldout=True)
    ev = arithmetic_evaluation(out, Data(), log=lambda _: None, n_decode=1, n_accuracy=2, n_operations=1)
    assert ev["greedy_answers"]["problems"] == 2 and 0 <= ev["greedy_answers"]["accuracy"] <= 1
    assert ev["gold_context_results"]["problems"] == 1
    assert ev["threshold_vs_static"]["static"]["target_passes"] >= ev["threshold_vs_static"]["threshold"][
        "target_passes"] > 0
    assert 0 < ev["greedy_decode"]["mean_committed_top1_prob"] <= 1


# -- practice lines (the arithmetic a word problem's steps use, every fact alike) -------------------------------
@pytest.mark.parametrize("op", arithmetic.PRACTICE_OPS)
def test_fact_tables_hold_every_fact_a_problem_computes_and_only_those(op, problems):
    """Each table is exactly the facts within BOUNDS (recomputed here by brute force over all operand pairs), and
    every step of 2,000 generated problems is in its table."""
    b = arithmetic.BOUNDS
    table = set(arithmetic.FACT_TABLES[op])
    expected = set()
    for x in range(1, b.max_value + 1):
        for y in range(1, b.max_value + 1):
            try:
                v = gsm8k.apply_op(x, op, y)
            except ValueError:
                continue
            if not 1 <= v <= b.max_value:
                continue
            if op == "*" and not (min(x, y) <= b.max_factor and max(x, y) <= b.max_multiplicand):
                continue
            if op == "/" and not (y <= b.max_divisor and v <= b.max_quotient):
                continue
            expected.add((x, y))
    assert table == expected and len(arithmetic.FACT_TABLES[op]) == len(table)
    assert {(s.a, s.b) for p in problems for s in p.steps if s.op == op} <= table


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.integers(0, 2**32 - 1))
def test_practice_samples_recompute_and_mark_their_result_digits(tokenizer, seed):
    """A practice sample's every line is a right calculation in the annotation format (its answer recomputed from
    the line), it fits PRACTICE_LEN with its end-of-text, its result digits are marked, and it scores exactly what
    follows each '<<a op b=' (never an operand)."""
    from spot.training.arithmetic_corpus import PRACTICE_LEN, practice_sample
    tok = tokenizer
    e = practice_sample(tok, np.random.default_rng(seed))
    text = tok.decode(list(e.ids[:-1]))
    lines = text.split("\n")
    assert e.ids[-1] == bpe.EOS_ID and len(e.ids) <= PRACTICE_LEN and e.prompt_len == 0
    for line in lines:
        m = re.fullmatch(r"(\d+)([-+*/])(\d+) = <<\1\2\3=(\d+)>>\4\.", line)
        assert m is not None, line
        a, op, b, c = int(m.group(1)), m.group(2), int(m.group(3)), int(m.group(4))
        assert gsm8k.apply_op(a, op, b) == c and (a, b) in set(arithmetic.FACT_TABLES[op])
    expected = "".join(2 * re.search(r"=(\d+)>>", line).group(1) for line in lines)
    assert "".join(tok.decode([e.ids[i]]) for i in e.results) == expected
    tails = "".join(re.search(r"=(\d+>>\d+\.)", line).group(1) + "\n" for line in lines)[:-1]
    assert tok.decode([e.ids[i] for i in e.scored]) == tails and set(e.results) <= set(e.scored)


def test_result_digits_of_a_problem_are_weighted_and_practice_scores_only_them(tokenizer, problems):
    """In a word problem the result digits (each '=c>>c' and the answer) weigh result_weight; a practice batch masks
    nothing but what follows each '=' (the results weighted)."""
    from spot.training.arithmetic_corpus import practice_sample
    p = problems[3]
    e = encode_problem(tokenizer, p)
    digits = "".join(tokenizer.decode([e.ids[i]]) for i in e.results)
    assert digits == "".join(2 * str(s.value) for s in p.steps) + str(p.answer)
    batch = make_batch([e, practice_sample(tokenizer, np.random.default_rng(1))], 32, result_weight=3.0)
    assert set(np.flatnonzero(batch.weight[0] == 3.0)) == set(e.results)
    assert set(np.flatnonzero(batch.weight[1] == 3.0)) < set(np.flatnonzero(batch.eligible[1]))
    assert make_batch([e], 32).weight is None


def test_practice_batches_come_at_their_share_and_resume_exactly(tokenizer):
    data = ArithmeticData(tokenizer, 32, 2048, seed=3, practice_share=0.5, result_weight=3.0)
    kinds = []
    for _ in range(40):
        b = data.train_batch()
        kinds.append(b.x0.shape[1] == 128 and bool((b.x0[:, 0] != b.x0[0, 0]).any()))
    assert 10 <= sum(kinds) <= 30
    state = data.state()
    again = ArithmeticData(tokenizer, 32, 2048, seed=99, practice_share=0.5, result_weight=3.0)
    again.load_state(state)
    for _ in range(5):
        a, b = data.train_batch(), again.train_batch()
        assert (a.x0 == b.x0).all() and (a.eligible == b.eligible).all() and (a.weight == b.weight).all()
