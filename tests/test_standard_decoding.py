"""Standard decoding (docs/spec.md §1, §3) against SDAR's own evaluation decoder, cache equivalence, batch invariance,
and the step function F on hand-built logits whose answers are known."""
from __future__ import annotations

from collections import Counter
from dataclasses import replace

import numpy as np
import pytest
import torch

from spot.checkpoint import Checkpoint
from spot.config import ModelConfig
from spot.engines.torch_engine import TorchEngine
from spot.reference.model import SDARModel, block_causal_bias, random_model
from spot.runtime.decode import SEPARATE, generate
from spot.runtime.noise import gumbel_rows
from spot.runtime.step import (STATIC, THRESHOLD, CommitRule, Sampling, filter_scaled_logits, sample_positions,
                               select_commits, step_fn)

MASK = 63


def tiny_config(block_size: int, vocab: int = 64, hidden: int = 32, layers: int = 2) -> ModelConfig:
    return ModelConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=128,
                       block_size=block_size, mask_token_id=vocab - 1, stop_ids=(vocab - 2,))


# ---------------------------------------------------------------------------------------------------------------
# (a) A faithful re-implementation of JetAstra/SDAR generate.py `block_diffusion_generate`, with uncached
#     full-sequence forwards of the reference model instead of a KV cache. Only the temperature-0 path is needed.
# ---------------------------------------------------------------------------------------------------------------
def get_num_transfer_tokens(block_length: int, steps: int) -> torch.Tensor:
    base = block_length // steps
    remainder = block_length % steps
    num_transfer_tokens = torch.zeros(steps, dtype=torch.int64) + base
    num_transfer_tokens[:remainder] += 1
    return num_transfer_tokens


class UncachedSDAR:
    """Counts forwards; each forward runs the whole sequence so far with the full block-causal mask."""

    def __init__(self, model: SDARModel, block_length: int):
        self.model, self.block_length = model, block_length
        self.forwards = 0

    @torch.no_grad()
    def __call__(self, seq: torch.Tensor) -> torch.Tensor:
        """seq [1, T] (T a multiple of the block) -> logits of its last block [1, B, V]."""
        self.forwards += 1
        t = seq.shape[1]
        bias = block_causal_bias(t, self.block_length)
        logits, _, _ = self.model(seq, torch.arange(t), bias)
        return logits[:, t - self.block_length:]


@torch.no_grad()
def sdar_block_diffusion_generate(model: UncachedSDAR, input_ids: torch.Tensor, mask_id: int, gen_length: int,
                                  block_length: int, denoising_steps: int, remasking_strategy: str,
                                  confidence_threshold: float, stopping_criteria_idx, commit_sizes: Counter):
    prompt_length = input_ids.shape[1]
    num_blocks = (prompt_length + gen_length + block_length - 1) // block_length
    total_length = num_blocks * block_length
    x = torch.full((1, total_length), mask_id, dtype=torch.long)
    x[:, :prompt_length] = input_ids
    prefill_blocks = prompt_length // block_length
    prefill_length = prefill_blocks * block_length
    if prefill_length > 0:
        model(x[:, :prefill_length])                                   # prefill (store_kv=True)
    num_transfer_tokens = get_num_transfer_tokens(block_length, denoising_steps)
    last_block = prefill_blocks - 1
    for num_block in range(prefill_blocks, num_blocks):
        last_block = num_block
        lo, hi = num_block * block_length, (num_block + 1) * block_length
        cur_x = x[:, lo:hi].clone()
        for step in range(denoising_steps + 1):
            mask_index = cur_x == mask_id
            if mask_index.sum() == 0:
                model(torch.cat([x[:, :lo], cur_x], dim=1))             # store pass (store_kv=True)
                break
            logits = model(torch.cat([x[:, :lo], cur_x], dim=1))        # denoising pass (store_kv=False)
            # temperature 0: argmax, probability from the unfiltered softmax
            probs = torch.softmax(logits, dim=-1)
            x0 = torch.argmax(logits, dim=-1)
            x0_p = torch.gather(probs, -1, x0[..., None])[..., 0]
            confidence = torch.where(mask_index, x0_p, -torch.inf)
            transfer_index = torch.zeros_like(x0, dtype=torch.bool)
            if remasking_strategy == "low_confidence_static":
                for j in range(confidence.shape[0]):
                    _, idx = torch.topk(confidence[j], int(num_transfer_tokens[step]))
                    transfer_index[j, idx] = True
            elif remasking_strategy == "low_confidence_dynamic":
                for j in range(confidence.shape[0]):
                    high_conf_mask = confidence[j] > confidence_threshold
                    if high_conf_mask.sum() >= num_transfer_tokens[step]:
                        transfer_index[j] = high_conf_mask
                    else:
                        _, idx = torch.topk(confidence[j], int(num_transfer_tokens[step]))
                        transfer_index[j, idx] = True
            else:
                raise ValueError(remasking_strategy)
            commit_sizes[int(transfer_index.sum())] += 1
            cur_x[transfer_index] = x0[transfer_index]
        x[:, lo:hi] = cur_x
        if any(stop_idx in x[:, prompt_length:] for stop_idx in stopping_criteria_idx):
            break
    return x, last_block


def reference_tokens(x: torch.Tensor, last_block: int, prompt_length: int, block_length: int, stop_ids) -> list[int]:
    """Generated ids of the reference output (decoded blocks only), cut at the first stop id."""
    out = x[0, prompt_length:(last_block + 1) * block_length].tolist()
    for i, t in enumerate(out):
        if t in stop_ids:
            return out[:i]
    return out


def saved_model(tmp_path, cfg: ModelConfig, seed: int, head_gain: float, dtype: str) -> str:
    """A random checkpoint in the real format; head_gain sharpens the logits so threshold commits happen.

    The mask token's LM-head row is zeroed (logit 0, below the max of 62 random logits) so that greedy decoding
    never writes the mask id, as a trained SDAR never does: SDAR's decoder is undefined there (it re-samples the
    position until its step budget runs out, then fails).
    """
    model = random_model(cfg, seed, scale=1.0)
    with torch.no_grad():
        model.lm_head.weight.mul_(head_gain)
        model.lm_head.weight[cfg.mask_token_id] = 0.0
    folder = tmp_path / f"b{cfg.block_size}-s{seed}-{dtype}"
    model.save_pretrained(folder, dtype=dtype)
    return str(folder)


CHECKPOINTS = [(4, 0, 1.0, "F32"), (4, 1, 3.0, "BF16"), (8, 2, 3.0, "F32"), (8, 3, 1.0, "F16")]


@pytest.mark.parametrize("block_size,seed,head_gain,dtype", CHECKPOINTS)
def test_matches_sdar_evaluation_decoder(tmp_path, block_size, seed, head_gain, dtype):
    folder = saved_model(tmp_path, tiny_config(block_size), seed, head_gain, dtype)
    engine = TorchEngine.from_dir(folder)
    ref = UncachedSDAR(SDARModel.from_checkpoint(Checkpoint(folder)), block_size)
    cfg = engine.config
    rng = np.random.default_rng(seed)
    gen_length = 2 * block_size + 3
    commit_sizes: Counter = Counter()
    outcomes = Counter()
    for prompt_len in range(14):
        prompt = rng.integers(0, cfg.vocab_size - 2, prompt_len)  # never the mask id or the default stop id
        # stop ids: on odd lengths none that occur; on even ones a token the static decoder writes mid-way
        stop_ids = [cfg.vocab_size - 2]
        if prompt_len % 2 == 0:
            unstopped = generate(engine, prompt, max_new_tokens=gen_length, stop_ids=[])
            unstopped = unstopped.token_ids + unstopped.overflow_ids        # to the block boundary
            stop_ids = [unstopped[len(unstopped) // 2]]
        tau = 0.5 if prompt_len % 4 < 2 else 0.9
        for rule, strategy in [(CommitRule(STATIC), "low_confidence_static"),
                               (CommitRule(THRESHOLD, tau), "low_confidence_dynamic")]:
            ref.forwards = 0
            x, last_block = sdar_block_diffusion_generate(
                ref, torch.from_numpy(prompt)[None], cfg.mask_token_id, gen_length, block_size, block_size,
                strategy, rule.tau, stop_ids, commit_sizes)
            want = reference_tokens(x, last_block, prompt_len, block_size, stop_ids)
            # SDAR's accounting: a store pass per block (store mode separate); its forward counts match
            got = generate(engine, prompt, max_new_tokens=gen_length, rule=rule, stop_ids=stop_ids,
                           store_mode=SEPARATE)
            case = f"P={prompt_len} stop={stop_ids} rule={rule}"
            # the same block-boundary decode; the output is at most gen_length of it, the rest overflow_ids
            assert got.token_ids == want[:gen_length], case
            assert got.token_ids + got.overflow_ids == want, case
            assert got.stats.target_passes == ref.forwards, case
            assert got.stats.passes["prefill"] == (1 if prompt_len >= block_size else 0), case
            blocks = last_block - prompt_len // block_size + 1
            assert got.stats.passes["store"] == blocks, case
            # fused (the default): the same tokens here, each store inside the next block's first pass and the last
            # block's never run
            fused = generate(engine, prompt, max_new_tokens=gen_length, rule=rule, stop_ids=stop_ids)
            assert fused.token_ids + fused.overflow_ids == want, case
            assert fused.stats.target_passes == ref.forwards - blocks, case
            assert (fused.stats.passes["store"], fused.stats.passes["fused"]) == (0, blocks - 1), case
            outcomes["stopped" if got.stopped else "ran out"] += 1
    # the comparison covered what it claims: multi-token threshold commits, stops and full-length runs
    assert max(commit_sizes) > 1, commit_sizes
    assert commit_sizes[1] > 0
    assert outcomes["stopped"] > 0 and outcomes["ran out"] > 0, outcomes


# ---------------------------------------------------------------------------------------------------------------
# (b) cached block decoding == one uncached forward with the full block-causal mask
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("block_size", [4, 8])
def test_cached_block_logits_equal_uncached_forward(block_size):
    cfg = tiny_config(block_size)
    model = random_model(cfg, seed=11, scale=0.5)
    engine = TorchEngine(model)
    rng = np.random.default_rng(block_size)
    prompt = rng.integers(0, cfg.vocab_size - 1, 2 * block_size)
    engine.prefill(prompt)
    stored = [rng.integers(0, cfg.vocab_size - 1, block_size) for _ in range(2)]
    for block in stored:
        engine.store(block)
    prefix = np.concatenate([prompt, *stored])
    states = rng.integers(0, cfg.vocab_size, (5, block_size))      # mask id included at random positions
    states[:, ::3] = cfg.mask_token_id
    cached = engine.block_logits(states)
    worst = 0.0
    for i, state in enumerate(states):
        seq = torch.from_numpy(np.concatenate([prefix, state]))[None]
        t = seq.shape[1]
        with torch.no_grad():
            full, _, _ = model(seq, torch.arange(t), block_causal_bias(t, block_size))
        worst = max(worst, float(np.abs(cached[i] - full[0, -block_size:].numpy()).max()))
    assert worst <= 1e-4, worst


def test_prefill_of_zero_blocks_then_blocks_equals_uncached():
    """An empty prompt: the first block attends only to itself."""
    cfg = tiny_config(4)
    model = random_model(cfg, seed=5, scale=0.5)
    engine = TorchEngine(model)
    engine.prefill(np.zeros(0, dtype=np.int64))
    state = np.array([[3, MASK, MASK, 9]])
    with torch.no_grad():
        full, _, _ = model(torch.from_numpy(state), torch.arange(4), block_causal_bias(4, 4))
    assert np.abs(engine.block_logits(state)[0] - full[0].numpy()).max() <= 1e-4


# ---------------------------------------------------------------------------------------------------------------
# (c) batch invariance: a state's logits alone and inside a batch of N are bit-identical
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("hidden,vocab,threads", [(32, 64, 1), (128, 512, 1), (128, 512, 2)])
def test_torch_engine_batch_invariance(hidden, vocab, threads):
    cfg = tiny_config(8, vocab=vocab, hidden=hidden)
    engine = TorchEngine(random_model(cfg, seed=3, scale=0.5))
    rng = np.random.default_rng(0)
    torch.set_num_threads(threads)
    try:
        engine.prefill(rng.integers(0, vocab - 1, 16))
        for n in (2, 7, 16):
            states = rng.integers(0, vocab - 1, (n, 8))
            states[rng.random((n, 8)) < 0.5] = cfg.mask_token_id
            batch = engine.block_logits(states)
            for i in range(n):
                alone = engine.block_logits(states[i:i + 1])[0]
                assert np.array_equal(alone, batch[i]), f"N={n} row {i}: max diff {np.abs(alone - batch[i]).max()}"
    finally:
        torch.set_num_threads(1)


# ---------------------------------------------------------------------------------------------------------------
# (d) the step function on hand-built logits
# ---------------------------------------------------------------------------------------------------------------
def logits_rows(*rows) -> np.ndarray:
    return np.array(rows, dtype=np.float32)


def test_greedy_ties_pick_smallest_token_and_smallest_position():
    # positions 1 and 2 are masked with identical rows; token ids 2 and 3 tie for the max
    logits = logits_rows([9, 0, 0, 0], [0, 1, 5, 5], [0, 1, 5, 5], [0, 0, 0, 9])
    state = np.array([7, MASK, MASK, 7])
    out = step_fn(state, logits, MASK, CommitRule(STATIC), Sampling(), block=0, step=0)
    assert out.tolist() == [7, 2, MASK, 7]


def test_static_commits_the_most_confident_position():
    logits = logits_rows([0, 1, 2, 0], [0, 0, 8, 0], [3, 0, 0, 0], [0, 0, 0, 0])
    state = np.full(4, MASK)
    assert step_fn(state, logits, MASK, CommitRule(STATIC), Sampling(), 0, 0).tolist() == [MASK, 2, MASK, MASK]


def test_threshold_is_strict_and_falls_back_to_the_single_best():
    # V=2 rows [a, a] give confidence exactly 0.5; [log 3, 0] gives 0.75
    half, three_q = [1.0, 1.0], [float(np.log(3.0)), 0.0]
    logits = logits_rows(half, three_q, half, three_q)
    state = np.full(4, MASK)
    # tau 0.5: 0.5 is not > 0.5, both 0.75 positions are
    out = step_fn(state, logits, MASK, CommitRule(THRESHOLD, 0.5), Sampling(), 0, 0)
    assert out.tolist() == [MASK, 0, MASK, 0]
    # tau 0.75 + a hair: nobody passes -> only the best (first of the tied 0.75) is committed
    out = step_fn(state, logits, MASK, CommitRule(THRESHOLD, 0.76), Sampling(), 0, 0)
    assert out.tolist() == [MASK, 0, MASK, MASK]
    # tau below every confidence: all masked positions at once
    out = step_fn(state, logits, MASK, CommitRule(THRESHOLD, 0.4), Sampling(), 0, 0)
    assert out.tolist() == [0, 0, 0, 0]
    # exactly-equal confidence is not committed by select_commits either
    assert select_commits(np.array([0.5, 0.5, 0.25]), CommitRule(THRESHOLD, 0.5)).tolist() == [0]


def test_certified_commits_equal_select_commits_of_the_exact_confidences():
    """Approximations anywhere within the margin (relative; absolute below the floor) give select_commits' answer on
    the exact values: exact ties (smallest position), confidences equal to tau (not committed), tau 0, subnormal
    and zero confidences; exact values are asked for only where the approximations cannot decide."""
    from spot.runtime.step import FAST_CONFIDENCE_FLOOR, FAST_CONFIDENCE_MARGIN, certified_commits
    rng = np.random.default_rng(11)
    asked = Counter()
    for trial in range(3000):
        k = int(rng.integers(1, 9))
        exact = [rng.random(k), rng.random(k) ** 40, np.round(rng.random(k), 1),              # ties
                 np.full(k, 5e-324), np.where(rng.random(k) < 0.5, 0.0, 1e-310)][trial % 5]    # subnormal, zero
        tau = float(rng.choice([0.0, 0.5, 0.9, exact[int(rng.integers(k))] if trial % 3 else 0.2]))
        if tau >= 1:
            tau = 0.5
        err = rng.uniform(-1, 1, k) * FAST_CONFIDENCE_MARGIN
        err[rng.random(k) < 0.3] = rng.choice([-1, 1]) * FAST_CONFIDENCE_MARGIN        # at the bound
        approx = np.where(exact < FAST_CONFIDENCE_FLOOR, exact + rng.uniform(0, 1, k) * FAST_CONFIDENCE_FLOOR,
                          exact * (1 + err))

        def exact_at(idx):
            asked[len(idx) < k] += 1
            return exact[idx]
        for rule in (CommitRule(STATIC), CommitRule(THRESHOLD, tau)):
            got = certified_commits(approx, rule, exact_at)
            assert got.tolist() == select_commits(exact, rule).tolist(), (trial, rule, exact, approx)
    assert asked[True] > 0          # some decisions needed only part of the exact values

    def never(idx):
        raise AssertionError("a clear decision asked for exact values")
    clear = np.array([0.2, 0.95, 0.4, 0.97])
    assert certified_commits(clear, CommitRule(STATIC), never).tolist() == [3]
    assert certified_commits(clear, CommitRule(THRESHOLD, 0.9), never).tolist() == [1, 3]


@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.0])
def test_step_fn_equals_the_definition_with_the_c_library_exp(temperature):
    """step_fn decides from numpy's exp and certifies: the next state equals commit_samples of sample_positions'
    exact confidences, on rows with exact confidence ties (duplicated rows), subnormal tails, top-k / top-p
    filtering and the excluded mask id, under both rules."""
    from spot.runtime.step import commit_samples
    rng = np.random.default_rng(int(temperature * 10) + 3)
    b, v = 12, 300
    for trial in range(60):
        logits = (rng.normal(0, 1, (b, v)) * rng.choice([0.3, 3.0, 40.0])).astype(np.float32)
        logits[rng.integers(b)] = logits[rng.integers(b)]          # duplicated rows: equal confidences
        logits[rng.integers(b), rng.integers(v)] += 900.0           # a row whose other exponentials are 0
        state = np.where(rng.random(b) < 0.7, MASK, 5)
        if not (state == MASK).any():
            state[0] = MASK
        sampling = Sampling(temperature, top_k=int(rng.choice([0, 7])), top_p=float(rng.choice([1.0, 0.8])),
                            seed=trial, exclude_token=MASK)
        masked = np.flatnonzero(state == MASK)
        tokens, conf = sample_positions(logits, masked, sampling, block=1, step=trial % 5)
        tau_at_best = min(float(conf.max()), 0.99)                  # a confidence equal to tau: not committed
        for rule in (CommitRule(STATIC), CommitRule(THRESHOLD, 0.3), CommitRule(THRESHOLD, tau_at_best),
                     CommitRule(THRESHOLD, 0.0)):
            want = commit_samples(state, masked, tokens, conf, rule)
            got = step_fn(state, logits, MASK, rule, sampling, 1, trial % 5)
            np.testing.assert_array_equal(got, want)


def test_threshold_ignores_positions_that_are_not_masked():
    logits = logits_rows([0, 0, 9, 0], [0, 0, 0, 9], [9, 0, 0, 0], [0, 9, 0, 0])
    state = np.array([5, MASK, 6, MASK])
    out = step_fn(state, logits, MASK, CommitRule(THRESHOLD, 0.5), Sampling(), 0, 0)
    assert out.tolist() == [5, 3, 6, 1]
    done = np.array([5, 4, 6, 2])
    assert step_fn(done, logits, MASK, CommitRule(STATIC), Sampling(), 0, 0).tolist() == done.tolist()


def test_top_k_keeps_ties():
    z = np.array([[3.0, 2.0, 2.0, 1.0, 2.0]])
    kept = np.isfinite(filter_scaled_logits(z, top_k=2, top_p=1.0))
    assert kept.tolist() == [[True, True, True, False, True]]
    assert np.isfinite(filter_scaled_logits(z, top_k=1, top_p=1.0)).tolist() == [[True, False, False, False, False]]
    assert np.isfinite(filter_scaled_logits(z, top_k=0, top_p=1.0)).all()


def test_top_p_keeps_the_smallest_prefix_exceeding_p():
    z = np.log(np.array([[0.2, 0.5, 0.3]]))
    assert np.isfinite(filter_scaled_logits(z, 0, 0.45)).tolist() == [[False, True, False]]
    assert np.isfinite(filter_scaled_logits(z, 0, 0.75)).tolist() == [[False, True, True]]
    assert np.isfinite(filter_scaled_logits(z, 0, 0.85)).tolist() == [[True, True, True]]
    # equal values are ordered by token id: uniform over 4, p = 0.2 keeps id 0 only, p = 0.3 keeps ids 0 and 1
    flat = np.zeros((1, 4))
    assert np.isfinite(filter_scaled_logits(flat, 0, 0.2)).tolist() == [[True, False, False, False]]
    assert np.isfinite(filter_scaled_logits(flat, 0, 0.3)).tolist() == [[True, True, False, False]]
    # a prefix whose mass is exactly p does not exceed it: the token after it is kept too
    assert np.isfinite(filter_scaled_logits(flat, 0, 0.25)).tolist() == [[True, True, False, False]]
    z2 = np.array([[0.0, 1.0, 1.0, 0.0]])
    assert np.isfinite(filter_scaled_logits(z2, 0, 0.1)).tolist() == [[False, True, False, False]]


def test_temperature_zero_is_argmax_and_independent_of_seed():
    logits = logits_rows([0.0, 2.0, 1.0], [1.0, 0.0, 0.5])
    pos = np.array([0, 1])
    for seed in (0, 1, 12345):
        tokens, conf = sample_positions(logits, pos, Sampling(temperature=0.0, seed=seed), 3, 1)
        assert tokens.tolist() == [1, 0]
    z = logits.astype(np.float64)
    expect = np.exp(z[[0, 1], [1, 0]]) / np.exp(z).sum(-1)
    np.testing.assert_allclose(conf, expect, rtol=1e-15)


def test_positive_temperature_is_the_gumbel_argmax_with_the_step_noise():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(4, 50)).astype(np.float32)
    pos = np.array([0, 2, 3])
    t, seed, block, step = 0.7, 99, 5, 2
    tokens, conf = sample_positions(logits, pos, Sampling(temperature=t, seed=seed), block, step)
    z = logits[pos].astype(np.float64) / t
    expect = np.argmax(z + gumbel_rows(seed, block, step, pos, 50), axis=-1)
    assert tokens.tolist() == expect.tolist()
    p = np.exp(z - z.max(-1, keepdims=True))
    np.testing.assert_allclose(conf, p[np.arange(3), expect] / p.sum(-1), rtol=1e-14)
    # flat logits: the sample is the argmax of the noise alone; a different step gives fresh noise
    flat = np.zeros((1, 50), dtype=np.float32)
    one = np.array([0])
    for s in range(3):
        tok, _ = sample_positions(flat, one, Sampling(temperature=1.0, seed=seed), block, s)
        assert tok[0] == np.argmax(gumbel_rows(seed, block, s, one, 50)[0])
    draws = {int(sample_positions(flat, one, Sampling(temperature=1.0, seed=seed), block, s)[0][0]) for s in range(8)}
    assert len(draws) > 1


def test_confidence_uses_the_unfiltered_softmax():
    logits = logits_rows([2.0, 1.0, 0.0])
    tokens, conf = sample_positions(logits, np.array([0]), Sampling(temperature=1.0, top_k=1), 0, 0)
    assert tokens.tolist() == [0]                      # top-1 filtering leaves only id 0
    expect = np.exp(2.0) / (np.exp(2.0) + np.exp(1.0) + 1.0)
    assert conf[0] == pytest.approx(expect, rel=1e-12)  # not 1.0, the filtered distribution's probability
    tokens, conf = sample_positions(logits, np.array([0]), Sampling(temperature=2.0, top_p=0.01), 0, 0)
    z = np.array([1.0, 0.5, 0.0])
    assert tokens.tolist() == [0]
    assert conf[0] == pytest.approx(np.exp(1.0) / np.exp(z).sum(), rel=1e-12)


def test_the_mask_id_is_never_committed_even_when_it_is_the_argmax():
    """A random checkpoint whose head favours <|MASK|> must still finish every block (no endless re-masking):
    the mask id is excluded from the argmax while the confidence keeps the full softmax."""
    cfg = tiny_config(4)
    model = random_model(cfg, seed=1, scale=0.5)
    with torch.no_grad():
        model.lm_head.weight[cfg.mask_token_id] = model.lm_head.weight[3] * 4.0  # mask wins most argmaxes
    engine = TorchEngine(model)
    for temperature in (0.0, 1.0):
        gen = generate(engine, np.arange(1, 7), max_new_tokens=12, sampling=Sampling(temperature, seed=2))
        assert gen.stats.steps == gen.stats.blocks * 4 - 2          # one commit per step; 2 leftover prompt tokens
        assert cfg.mask_token_id not in gen.token_ids
    logits = np.zeros((1, 5), np.float32)
    logits[0, 4] = 3.0
    tokens, conf = sample_positions(logits, np.array([0]), Sampling(exclude_token=4), 0, 0)
    assert tokens[0] == 0 and conf[0] == pytest.approx(1.0 / (4.0 + np.exp(3.0)))
    for seed in range(20):   # sampled too: never the mask id, and the confidence is still the full softmax's
        tokens, conf = sample_positions(logits, np.array([0]), Sampling(1.0, seed=seed, exclude_token=4), 0, 0)
        assert tokens[0] != 4 and conf[0] == pytest.approx(1.0 / (4.0 + np.exp(3.0)))


def test_the_torch_engine_prefills_a_long_prompt_in_passes_of_64_blocks(monkeypatch):
    """One pass over a whole prompt held P^2 attention scores and P x V logits (911 MB at 4064 tokens on a tiny
    model); now passes of PREFILL_BLOCKS blocks, as the ORT engines chunk it: the same cache and the same tokens."""
    import spot.engines.torch_engine as te
    cfg = replace(tiny_config(4), max_position_embeddings=512)
    engine = TorchEngine(random_model(cfg, seed=9), 4)
    prompt = np.random.default_rng(3).integers(0, cfg.vocab_size - 1, 4 * 70 + 2)      # 70 blocks + 2 tokens
    passes = []
    real = engine._forward
    monkeypatch.setattr(engine, "_forward", lambda ids, start, bias: passes.append(ids.shape[1]) or real(ids, start,
                                                                                                       bias))
    engine.prefill(prompt[:280])
    assert passes == [256, 24] and engine.cached_len == 280
    chunked_k = engine._k.clone()
    monkeypatch.setattr(te, "PREFILL_BLOCKS", 1000)
    engine.prefill(prompt[:280])
    assert passes[-1] == 280
    assert torch.allclose(chunked_k, engine._k, atol=1e-5, rtol=1e-5)
    kw = dict(max_new_tokens=8, rule=CommitRule(STATIC), sampling=Sampling(1.0, seed=4))
    one_pass = generate(engine, prompt, **kw).token_ids
    monkeypatch.setattr(te, "PREFILL_BLOCKS", 64)
    assert generate(engine, prompt, **kw).token_ids == one_pass
