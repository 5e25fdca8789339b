"""The arithmetic target's training data: generated GSM8K-format problems, tokenized, one problem per sample.

Unlike the code corpus (random windows of one long stream), each sample here is one whole problem at absolute
position 0, as at inference: `Question: ...\\nAnswer:\\n` is the prompt, the worked solution and `#### N` follow,
then `<|endoftext|>` up to the block boundary (what the model must write after the answer, so that decoding stops
after that block). Only the solution side is ever masked and scored — the prompt is given at inference, as in
SDAR's chat fine-tuning — so the model's capacity goes into the arithmetic, not into guessing the question's
random names and numbers.

Practice samples (practice_share of the batches) are lines of single calculations in the solutions' annotation
format, each fact drawn uniformly from its operation's table (arithmetic.FACT_TABLES): only what follows each
'<<a op b=' is masked and scored (the result, '>>', its copy, the full stop), since the operands are random by
construction; the layout is masked with the digits, as it is when a solution is decoded. In both kinds of sample the result digits (of
every `<<a op b=c>>c` and the `#### N` line) weigh result_weight times a plain token in the loss: they are ~4 of
~154 solution tokens, and the ones the answer depends on.

Samples are batched by padded length (whole blocks), so a batch wastes no padding and every batch holds about
the same number of tokens. Training problems come fresh from a seeded generator (held-out questions excluded by
the split rule), so the model never sees the same problem twice and cannot memorise answers.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

import numpy as np

from spot.errors import SpotError
from spot.training import arithmetic, bpe
from spot.training.batch import Batch

TOKENIZER_PROBLEMS = 20_000        # train-split problems the BPE is learned from
HELDOUT_SEED = 1_000_003           # the held-out stream's seed (the split itself is by question hash)
PRACTICE_LEN = 128                 # tokens of a practice sample (4 blocks; lines are added while they fit)
# how often a practice line is of each operation: + and - have the large tables and were the weak ones, / was weak
# with a small table, * was learned already
PRACTICE_OP_WEIGHTS = {"+": 0.35, "-": 0.35, "*": 0.1, "/": 0.2}
_RESULT_DIGITS = re.compile(r"=(\d+)>>(\d+)|#### (\d+)")
_AFTER_EQUALS = re.compile(r"=(\d+>>\d+\.\n?)")


@dataclass(frozen=True)
class EncodedProblem:
    ids: tuple[int, ...]       # prompt + solution + <|endoftext|>
    prompt_len: int
    results: tuple[int, ...] = ()    # positions of result digits (weighted in the loss)
    scored: tuple[int, ...] | None = None   # the positions masked and scored (None: the solution's)


def result_positions(encoding, text: str) -> tuple[int, ...]:
    """Token positions of the result digits of `text` (each calculation's c in '=c>>c', and the '#### N' answer), from
    the encoding's character offsets (digits are tokens of their own)."""
    return _positions_within(encoding, [m.span(g) for m in _RESULT_DIGITS.finditer(text) for g in (1, 2, 3)
                                        if m.group(g) is not None])


def _positions_within(encoding, spans: list[tuple[int, int]]) -> tuple[int, ...]:
    """Positions of the tokens whose characters lie inside one of `spans` (character offsets)."""
    return tuple(i for i, (start, end) in enumerate(encoding.offsets)
                 if end > start and any(a <= start and end <= b for a, b in spans))


def train_tokenizer(vocab_size: int, seed: int, n_problems: int = TOKENIZER_PROBLEMS):
    """Byte-level BPE over train-split problems with every digit its own token (Qwen's rule)."""
    texts = [p.text for p in arithmetic.generate_problems(n_problems, seed, heldout=False)]
    return bpe.train_bpe(texts, vocab_size, split_digits=True)


def encode_problem(tok, problem: arithmetic.Problem) -> EncodedProblem:
    """Ids of the problem; the prompt's own encoding must be a prefix of the whole (checked: the boundary after
    'Answer:\\n' is a pre-token boundary, so the prompt a user types encodes to what the model was trained on)."""
    prompt = tok.encode(problem.prompt, add_special_tokens=False).ids
    encoding = tok.encode(problem.text, add_special_tokens=False)
    full = encoding.ids
    if full[:len(prompt)] != prompt:
        raise SpotError(f"the prompt of {problem.question[:60]!r} does not tokenize as a prefix of its text",
                        "the tokenizer's pre-tokenizer must split at the line break after 'Answer:'")
    return EncodedProblem(tuple(full) + (bpe.EOS_ID,), len(prompt), result_positions(encoding, problem.text))


def draw_fact(rng: np.random.Generator) -> tuple[int, str, int]:
    """(a, op, b): an operation by PRACTICE_OP_WEIGHTS, then a fact uniformly from its table."""
    ops = list(PRACTICE_OP_WEIGHTS)
    op = ops[int(rng.choice(len(ops), p=list(PRACTICE_OP_WEIGHTS.values())))]
    table = arithmetic.FACT_TABLES[op]
    a, b = table[int(rng.integers(len(table)))]
    return a, op, b


def practice_sample(tok, rng: np.random.Generator, max_tokens: int = PRACTICE_LEN) -> EncodedProblem:
    """Practice lines, one per line, as many as fit in max_tokens with the closing <|endoftext|>."""
    lines: list[str] = []
    best = None
    while True:
        lines.append(arithmetic.practice_line(*draw_fact(rng)))
        text = "\n".join(lines)
        encoding = tok.encode(text, add_special_tokens=False)
        if len(encoding.ids) + 1 > max_tokens:
            if best is None:
                raise SpotError(f"one practice line is longer than {max_tokens} tokens", "raise PRACTICE_LEN")
            return best
        scored = _positions_within(encoding, [m.span(1) for m in _AFTER_EQUALS.finditer(text)])
        best = EncodedProblem(tuple(encoding.ids) + (bpe.EOS_ID,), 0, result_positions(encoding, text), scored)


def padded_len(n: int, block_size: int) -> int:
    return -(-n // block_size) * block_size


def make_batch(encoded: list[EncodedProblem], block_size: int, with_prompt: bool = False,
               result_weight: float = 1.0) -> Batch:
    """Pad to the longest sample's whole blocks. Eligible: the solution and its <|endoftext|>, through the end of
    the block holding that token (the rest of that block is end-of-text too: what decoding writes there); with_prompt:
    the question too; a practice sample: its `scored` positions. Result digits weigh result_weight."""
    length = max(padded_len(len(e.ids), block_size) for e in encoded)
    x0 = np.full((len(encoded), length), bpe.EOS_ID, dtype=np.int64)
    eligible = np.zeros((len(encoded), length), dtype=bool)
    weight = np.ones((len(encoded), length), dtype=np.float32)
    for i, e in enumerate(encoded):
        x0[i, :len(e.ids)] = e.ids
        if e.scored is not None:
            eligible[i, list(e.scored)] = True
        else:
            eligible[i, 0 if with_prompt else e.prompt_len:padded_len(len(e.ids), block_size)] = True
        weight[i, list(e.results)] = result_weight
    return Batch(x0, eligible, weight if result_weight != 1.0 else None)


class ArithmeticData:
    """Fresh train batches from a seeded problem stream, bucketed by padded length; fixed held-out problems."""

    corpus = "arithmetic"

    def __init__(self, tokenizer, block_size: int, tokens_per_batch: int, seed: int, n_heldout: int = 300,
                 with_prompt: bool = False, practice_share: float = 0.0, result_weight: float = 1.0):
        self.tokenizer, self.block_size, self.tokens_per_batch = tokenizer, block_size, tokens_per_batch
        self.with_prompt, self.practice_share, self.result_weight = with_prompt, practice_share, result_weight
        self.seed = seed
        self.rng = np.random.default_rng(seed)
        self.buckets: dict[int, list[EncodedProblem]] = {}
        self.heldout = arithmetic.generate_problems(n_heldout, HELDOUT_SEED + seed, heldout=True)
        self.problems_drawn = 0

    @classmethod
    def build(cls, vocab_size: int, block_size: int, tokens_per_batch: int, seed: int) -> "ArithmeticData":
        return cls(train_tokenizer(vocab_size, seed), block_size, tokens_per_batch, seed)

    def _next_train_problem(self) -> arithmetic.Problem:
        while True:
            p = arithmetic.make_problem(self.rng)
            if not arithmetic.is_heldout(p.question):
                self.problems_drawn += 1
                return p

    def train_batch(self) -> Batch:
        """A batch of practice samples (with probability practice_share), else the next full bucket of problems:
        samples of one padded length L, tokens_per_batch // L of them."""
        if self.practice_share and self.rng.random() < self.practice_share:
            n = max(1, self.tokens_per_batch // PRACTICE_LEN)
            return self._batch([practice_sample(self.tokenizer, self.rng) for _ in range(n)])
        while True:
            e = encode_problem(self.tokenizer, self._next_train_problem())
            length = padded_len(len(e.ids), self.block_size)
            bucket = self.buckets.setdefault(length, [])
            bucket.append(e)
            if len(bucket) >= max(1, self.tokens_per_batch // length):
                self.buckets[length] = []
                return self._batch(bucket)

    def _batch(self, encoded: list[EncodedProblem]) -> Batch:
        return make_batch(encoded, self.block_size, self.with_prompt, self.result_weight)

    def heldout_batches(self, n: int, batch: int = 8) -> list[Batch]:
        enc = [encode_problem(self.tokenizer, p) for p in self.heldout[:n]]
        enc.sort(key=lambda e: len(e.ids))
        return [make_batch(enc[i:i + batch], self.block_size) for i in range(0, len(enc), batch)]

    def state(self) -> dict:
        """What resuming needs: the generator and the partly filled buckets (as id lists)."""
        return {"rng": self.rng.bit_generator.state, "problems_drawn": self.problems_drawn,
                "buckets": {str(k): [[list(e.ids), e.prompt_len, list(e.results)] for e in v]
                            for k, v in self.buckets.items()}}

    def load_state(self, state: dict) -> None:
        self.rng.bit_generator.state = state["rng"]
        self.buckets = {int(k): [EncodedProblem(tuple(ids), int(n), tuple(results)) for ids, n, results in v]
                        for k, v in state["buckets"].items()}
        self.problems_drawn = int(state["problems_drawn"])

    def describe(self) -> str:
        return (f"corpus: generated GSM8K-format problems (fresh each batch, ~{self.tokens_per_batch} tokens per "
                f"batch), {len(self.heldout)} held-out problems")

    def report(self) -> dict:
        return {"generator": "spot.training.arithmetic", "families": sorted(arithmetic.FAMILIES),
                "practice": {"share_of_batches": self.practice_share, "op_weights": PRACTICE_OP_WEIGHTS,
                             "sample_tokens": PRACTICE_LEN, "facts": {op: len(t) for op, t in
                                                                      arithmetic.FACT_TABLES.items()}},
                "result_weight": self.result_weight,
                "bounds": dataclasses.asdict(arithmetic.BOUNDS), "steps_per_problem": [1, 4],
                "split_rule": f"held-out iff int(sha1(question), 16) % {arithmetic.HELDOUT_MODULUS} == 0",
                "train_problems_drawn": self.problems_drawn, "heldout_problems": len(self.heldout),
                "heldout_seed": HELDOUT_SEED + self.seed, "tokenizer_problems": TOKENIZER_PROBLEMS}

    def prompt_records(self, n: int, seed: int, max_tokens: int) -> list[dict]:
        return heldout_prompt_records(self.heldout[:n], self.tokenizer)


def heldout_prompt_records(problems: list[arithmetic.Problem], tok) -> list[dict]:
    """heldout_prompts.jsonl lines: the prompt text, its true answer and solution, its shape."""
    return [{"id": i, "text": p.prompt, "answer": p.answer, "solution": p.solution, "family": p.family,
             "steps": len(p.steps), "n_tokens": len(tok.encode(p.prompt, add_special_tokens=False).ids)}
            for i, p in enumerate(problems)]


def train_prompts(tokenizer, n: int, seed: int = 0, max_tokens: int | None = None) -> list[list[int]]:
    """Ids of n prompts of TRAIN-split problems (never held-out ones; a seed stream of its own): what traces, the
    drafter's calibration and the tuner decode."""
    out = []
    for p in arithmetic.generate_problems(4 * n + 16, seed + 7_919, heldout=False):
        ids = tokenizer.encode(p.prompt)            # (a spot.tokenizer.SpotTokenizer: a list of ids)
        if max_tokens is None or len(ids) <= max_tokens:
            out.append(ids)
        if len(out) == n:
            break
    return out
