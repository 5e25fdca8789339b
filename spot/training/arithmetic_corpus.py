"""The arithmetic target's training data: generated GSM8K-format problems, tokenized, one problem per sample.

Unlike the code corpus (random windows of one long stream), each sample here is one whole problem at absolute
position 0, as at inference: `Question: ...\\nAnswer:\\n` is the prompt, the worked solution and `#### N` follow,
then `<|endoftext|>` up to the block boundary (what the model must write after the answer, so that decoding stops
after that block). Only the solution side is ever masked and scored — the prompt is given at inference, as in
SDAR's chat fine-tuning — so the model's capacity goes into the arithmetic, not into guessing the question's
random names and numbers.

Samples are batched by padded length (whole blocks), so a batch wastes no padding and every batch holds about
the same number of tokens. Training problems come fresh from a seeded generator (held-out questions excluded by
the split rule), so the model never sees the same problem twice and cannot memorise answers.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from spot.errors import SpotError
from spot.training import arithmetic, bpe
from spot.training.batch import Batch

TOKENIZER_PROBLEMS = 20_000        # train-split problems the BPE is learned from
HELDOUT_SEED = 1_000_003           # the held-out stream's seed (the split itself is by question hash)


@dataclass(frozen=True)
class EncodedProblem:
    ids: tuple[int, ...]       # prompt + solution + <|endoftext|>
    prompt_len: int


def train_tokenizer(vocab_size: int, seed: int, n_problems: int = TOKENIZER_PROBLEMS):
    """Byte-level BPE over train-split problems with every digit its own token (Qwen's rule)."""
    texts = [p.text for p in arithmetic.generate_problems(n_problems, seed, heldout=False)]
    return bpe.train_bpe(texts, vocab_size, split_digits=True)


def encode_problem(tok, problem: arithmetic.Problem) -> EncodedProblem:
    """Ids of the problem; the prompt's own encoding must be a prefix of the whole (checked: the boundary after
    'Answer:\\n' is a pre-token boundary, so the prompt a user types encodes to what the model was trained on)."""
    prompt = tok.encode(problem.prompt, add_special_tokens=False).ids
    full = tok.encode(problem.text, add_special_tokens=False).ids
    if full[:len(prompt)] != prompt:
        raise SpotError(f"the prompt of {problem.question[:60]!r} does not tokenize as a prefix of its text",
                        "the tokenizer's pre-tokenizer must split at the line break after 'Answer:'")
    return EncodedProblem(tuple(full) + (bpe.EOS_ID,), len(prompt))


def padded_len(n: int, block_size: int) -> int:
    return -(-n // block_size) * block_size


def make_batch(encoded: list[EncodedProblem], block_size: int, with_prompt: bool = False) -> Batch:
    """Pad to the longest sample's whole blocks. Eligible: the solution and its <|endoftext|>, through the end of
    the block holding that token (the rest of that block is end-of-text too: what decoding writes there); with_prompt:
    the question too."""
    length = max(padded_len(len(e.ids), block_size) for e in encoded)
    x0 = np.full((len(encoded), length), bpe.EOS_ID, dtype=np.int64)
    eligible = np.zeros((len(encoded), length), dtype=bool)
    for i, e in enumerate(encoded):
        x0[i, :len(e.ids)] = e.ids
        eligible[i, 0 if with_prompt else e.prompt_len:padded_len(len(e.ids), block_size)] = True
    return Batch(x0, eligible)


class ArithmeticData:
    """Fresh train batches from a seeded problem stream, bucketed by padded length; fixed held-out problems."""

    corpus = "arithmetic"

    def __init__(self, tokenizer, block_size: int, tokens_per_batch: int, seed: int, n_heldout: int = 300,
                 with_prompt: bool = False):
        self.tokenizer, self.block_size, self.tokens_per_batch = tokenizer, block_size, tokens_per_batch
        self.with_prompt = with_prompt
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
        """The next full bucket: samples of one padded length L, tokens_per_batch // L of them."""
        while True:
            e = encode_problem(self.tokenizer, self._next_train_problem())
            length = padded_len(len(e.ids), self.block_size)
            bucket = self.buckets.setdefault(length, [])
            bucket.append(e)
            if len(bucket) >= max(1, self.tokens_per_batch // length):
                self.buckets[length] = []
                return make_batch(bucket, self.block_size, self.with_prompt)

    def heldout_batches(self, n: int, batch: int = 8) -> list[Batch]:
        enc = [encode_problem(self.tokenizer, p) for p in self.heldout[:n]]
        enc.sort(key=lambda e: len(e.ids))
        return [make_batch(enc[i:i + batch], self.block_size) for i in range(0, len(enc), batch)]

    def state(self) -> dict:
        """What resuming needs: the generator and the partly filled buckets (as id lists)."""
        return {"rng": self.rng.bit_generator.state, "problems_drawn": self.problems_drawn,
                "buckets": {str(k): [[list(e.ids), e.prompt_len] for e in v] for k, v in self.buckets.items()}}

    def load_state(self, state: dict) -> None:
        self.rng.bit_generator.state = state["rng"]
        self.buckets = {int(k): [EncodedProblem(tuple(ids), int(n)) for ids, n in v]
                        for k, v in state["buckets"].items()}
        self.problems_drawn = int(state["problems_drawn"])

    def describe(self) -> str:
        return (f"corpus: generated GSM8K-format problems (fresh each batch, ~{self.tokens_per_batch} tokens per "
                f"batch), {len(self.heldout)} held-out problems")

    def report(self) -> dict:
        return {"generator": "spot.training.arithmetic", "families": sorted(arithmetic.FAMILIES),
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
