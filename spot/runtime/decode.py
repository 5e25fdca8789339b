"""The block loop shared by every decoder, and standard decoding (docs/spec.md §1, §3).

`generate()` returns tokens and stats; printing happens in the CLI. A decoder is a `BlockDecoder`: given the engine
(cache holding the prefix) and the initial block state, it returns the finished block. Standard decoding applies F
once per target pass; SPOT (spot.runtime.spot) plugs in the same way.
"""
from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np

from spot.config import MAX_STOP_IDS
from spot.errors import SpotError, integer_arg
from spot.runtime.engine import Engine, id_array
from spot.runtime.noise import NoiseCache
from spot.runtime.stats import DecodeStats, EpilogueStats, timed
from spot.runtime.step import CommitRule, Sampling


# Where a finished block's K/V are cached (docs/spec.md §1): FUSED (the default) in the next block's first pass,
# which runs the finished block and the new state as 2B tokens (the last block is never stored); SEPARATE in a store
# pass of its own after each block, as SDAR's decoder counts passes (the comparison with its forward counts).
FUSED, SEPARATE = "fused", "separate"
STORE_MODES = (FUSED, SEPARATE)


def check_store_mode(mode) -> str:
    """SpotError unless `mode` is a store mode."""
    if not isinstance(mode, str) or mode not in STORE_MODES:
        raise SpotError(f"store mode must be one of {', '.join(STORE_MODES)}, got {mode!r}",
                        "fused: the next block's first pass stores a finished block (the default); separate: a "
                        "store pass per block, as SDAR counts (`store_mode`)")
    return mode


@dataclass
class PendingStore:
    """The finished block not yet cached (fused store mode): generate() leaves it here after each block, and the
    next block's first pass (state_pass) takes it and stores it in the same pass."""

    block: np.ndarray | None = None

    def take(self) -> np.ndarray | None:
        block, self.block = self.block, None
        return block


@dataclass(frozen=True)
class DecodeContext:
    """What a block decoder needs besides the engine and the state."""

    rule: CommitRule
    sampling: Sampling
    mask_id: int
    stats: DecodeStats
    noise: NoiseCache | None = None   # the target's Gumbel rows of the current block (T > 0), reused across passes
    # observer(block, step, state [B], outputs, next_state [B]) sees every standard step (traces, oracle);
    # outputs is the pass's spot.runtime.outputs entry (outputs.host_logits() [B,V] where the logits are on the host)
    observer: Callable | None = None
    pending: PendingStore = field(default_factory=PendingStore)    # the block the next state_pass stores (FUSED)


BlockDecoder = Callable[[Engine, np.ndarray, int, DecodeContext], np.ndarray]


def state_pass(engine: Engine, state: np.ndarray, step: int, block: int, ctx: DecodeContext):
    """One target pass over one block state [B] at commit step `step`: its outputs (spot.runtime.outputs). A
    block's first pass stores the finished block before it too where one is pending (fused store mode): counted as
    a "fused" pass, any other as a "block" pass. Every decoder's single-state passes come here."""
    store = ctx.pending.take()
    (out,) = engine.block_outputs(state[None], [step], ctx.sampling, block, ctx.noise, store)
    ctx.stats.passes["block" if store is None else "fused"] += 1
    return out


def standard_block(engine: Engine, state: np.ndarray, block: int, ctx: DecodeContext) -> np.ndarray:
    """Standard decoding of one block: one target pass per commit step."""
    step = 0
    while (state == ctx.mask_id).any():
        out, target_ms = timed(state_pass, engine, state, step, block, ctx)
        nxt, sample_ms = timed(out.next_state, state, ctx.mask_id, ctx.rule)
        ctx.stats.standard_record().add_step(target_ms, sample_ms)    # the tuner charges both
        if ctx.noise is not None:       # standard decoding never revisits a step
            ctx.noise.forget_before(step + 1)
        if ctx.observer is not None:
            ctx.observer(block, step, state, out, nxt)
        state = nxt
        step += 1
    ctx.stats.steps += step
    return state


@dataclass
class Generation:
    token_ids: list[int]          # generated ids after the prompt: at most max_new_tokens, cut before a stop id
    stopped: bool                 # a stop id ended the output (before max_new_tokens)
    stats: DecodeStats
    prompt_len: int = 0
    cancelled: bool = False       # the on_block callback ended generation before its last block
    # what the last block held past max_new_tokens (decoded only to finish it: not part of the output), cut before a
    # stop id
    overflow_ids: list[int] = field(default_factory=list)


def check_engine(engine) -> None:
    """SpotError unless `engine` is an Engine (None, or a folder path, was an AttributeError mid-call)."""
    if not isinstance(engine, Engine):
        raise SpotError(f"engine must be an engine, got {engine!r:.60} ({type(engine).__name__})",
                        "engine = spot.engines.factory.open_engine(\"ort\", folder)")


def stop_id_tuple(stop_ids) -> tuple[int, ...] | None:
    """A request's stop ids as a tuple of ints (None: the model's); SpotError when they are not a sequence of ints."""
    if stop_ids is None:
        return None
    if isinstance(stop_ids, (str, bytes)) or not hasattr(stop_ids, "__iter__"):
        raise SpotError(f"stop_ids must be a sequence of token ids, got {stop_ids!r}")
    ids = tuple(integer_arg(i, "a stop id") for i in itertools.islice(stop_ids, MAX_STOP_IDS + 1))
    if len(ids) > MAX_STOP_IDS:     # as a manifest's stop_ids and the C API's SPOT_MAX_STOP_IDS
        raise SpotError(f"stop_ids name more than {MAX_STOP_IDS} token ids", "pass the few ids that end a reply")
    return ids


def check_max_new_tokens(max_new_tokens: int) -> None:
    """SpotError unless max_new_tokens is an integer >= 1 (DecodeRequest when it is built, check_request before
    decoding)."""
    if integer_arg(max_new_tokens, "max_new_tokens") < 1:
        raise SpotError(f"max_new_tokens must be >= 1, got {max_new_tokens}",
                        "e.g. `max_new_tokens=64`")


def check_request(engine: Engine, prompt_ids: np.ndarray, max_new_tokens: int) -> np.ndarray:
    if isinstance(prompt_ids, (str, bytes)) or not hasattr(prompt_ids, "__len__"):
        raise SpotError(f"prompt ids must be a list or array of token ids, got a {type(prompt_ids).__name__}",
                        "pass list(...) of the ids")
    cfg = engine.config
    if isinstance(prompt_ids, (list, tuple)):     # Python ints first: 2**70 is out of range, not "dtype object"
        bad = next((i for i in prompt_ids if isinstance(i, int) and not isinstance(i, bool)
                    and not 0 <= i < cfg.vocab_size), None)
        if bad is not None:
            raise SpotError(f"prompt token id {bad} is outside the vocabulary [0, {cfg.vocab_size})",
                            "the ids do not belong to this model's tokenizer")
    prompt = id_array(prompt_ids, "prompt ids")
    # an empty prompt (np.asarray([]) is float64) decodes from an empty context, as in the C++ host
    if prompt.ndim != 1 or (prompt.size and prompt.dtype.kind not in "iu"):
        raise SpotError(f"prompt ids must be a 1-D list of integers, got shape {prompt.shape} dtype {prompt.dtype}")
    if prompt.size and (prompt.min() < 0 or prompt.max() >= cfg.vocab_size):     # before any cast: uint64 too
        bad = prompt[(prompt < 0) | (prompt >= cfg.vocab_size)][0]
        raise SpotError(f"prompt token id {bad} is outside the vocabulary [0, {cfg.vocab_size})",
                        "the ids do not belong to this model's tokenizer")
    prompt = prompt.astype(np.int64)
    if (prompt == cfg.mask_token_id).any():
        raise SpotError(f"the prompt contains the mask token id {cfg.mask_token_id}",
                        "remove <|MASK|> from the prompt: it marks undecided positions")
    check_max_new_tokens(max_new_tokens)
    b = engine.block_size
    total = -(-(prompt.size + max_new_tokens) // b) * b
    if total > engine.max_context:
        raise SpotError(f"prompt ({prompt.size} tokens) + max_new_tokens ({max_new_tokens}) needs {total} positions, "
                        f"more than the model's limit of {engine.max_context}",
                        "shorten the prompt or ask for fewer new tokens")
    return prompt


def generate(engine: Engine, prompt_ids, *, max_new_tokens: int, rule: CommitRule = CommitRule(),
             sampling: Sampling = Sampling(), stop_ids=None, block_decoder: BlockDecoder = standard_block,
             stats: DecodeStats | None = None, observer: Callable | None = None,
             on_block: Callable[[list[int]], bool | None] | None = None, store_mode: str = FUSED) -> Generation:
    """Decode block by block up to the block boundary covering prompt + max_new_tokens (docs/spec.md §1), and return
    at most max_new_tokens of it: the rest of the last block is Generation.overflow_ids.

    Prefill stores the complete prompt blocks; the P mod B leftover prompt tokens open the first decoded block.
    After each finished block: its K/V are cached (store_mode FUSED: by the next block's first pass; SEPARATE: by a
    store pass now), then generation stops if the block's generated part holds a stop id.
    on_block (streaming): called after each finished block with the ids it adds to the output (cut before a stop
    id and at max_new_tokens), so the calls' ids joined are token_ids; a true return ends generation after that
    block (cancelled).
    """
    check_engine(engine)
    check_store_mode(store_mode)
    if not engine.request_lock.acquire(blocking=False):
        raise SpotError("this engine is already decoding a request (one request at a time per engine: it holds one "
                        "KV cache)", "open one engine per thread, and do not decode with the same engine inside "
                        "on_block")
    engine.request_thread = threading.get_ident()
    try:
        return _generate(engine, prompt_ids, max_new_tokens, rule, sampling, stop_ids, block_decoder, stats,
                         observer, on_block, store_mode)
    finally:
        engine.request_thread = None
        engine.request_lock.release()


def _call_back(engine: Engine, on_block: Callable[[list[int]], bool | None], new: list[int]) -> bool | None:
    """on_block(new), with the engine's passes refused meanwhile (Engine._check_caller)."""
    engine.in_callback = True
    try:
        return on_block(new)
    finally:
        engine.in_callback = False


def _generate(engine: Engine, prompt_ids, max_new_tokens: int, rule: CommitRule, sampling: Sampling, stop_ids,
              block_decoder: BlockDecoder, stats: DecodeStats | None, observer: Callable | None,
              on_block: Callable[[list[int]], bool | None] | None, store_mode: str) -> Generation:
    t0 = time.perf_counter()
    prompt = check_request(engine, prompt_ids, max_new_tokens)
    cfg, b = engine.config, engine.block_size
    stop_ids = stop_id_tuple(stop_ids)
    stop = set(cfg.stop_ids if stop_ids is None else stop_ids)
    outside = sorted(i for i in stop if not 0 <= i < cfg.vocab_size) if stop_ids is not None else []
    if outside:     # (a request's; the config's are the model's own: an odd one there just never matches)
        raise SpotError(f"stop id {outside[0]} is outside the vocabulary [0, {cfg.vocab_size})",
                        "the ids do not belong to this model's tokenizer")
    stats = stats or DecodeStats()
    sampling = replace(sampling, exclude_token=cfg.mask_token_id)   # never commit the mask id itself
    noise = NoiseCache(sampling.seed, cfg.vocab_size) if sampling.temperature > 0 else None
    ctx = DecodeContext(rule, sampling, cfg.mask_token_id, stats, noise, observer)
    epilogue_before = engine.epilogue_states, engine.epilogue_seconds
    p = prompt.size
    n_blocks = -(-(p + max_new_tokens) // b)
    first = p // b
    engine.prefill(prompt[: first * b])
    if first:
        stats.passes["prefill"] += 1
    generated: list[int] = []
    overflow: list[int] = []
    stopped = cancelled = False
    for block in range(first, n_blocks):
        state = np.full(b, cfg.mask_token_id, dtype=np.int64)
        lead = prompt[block * b:]
        state[: lead.size] = lead
        state = block_decoder(engine, state, block, ctx)
        if ctx.pending.block is not None:      # a decoder that ran no pass stored nothing: the cache needs it now
            engine.store(ctx.pending.take())
            stats.passes["store"] += 1
        if store_mode == SEPARATE:
            engine.store(state)
            stats.passes["store"] += 1
        else:
            ctx.pending.block = state
        stats.blocks += 1
        block_ids = state[lead.size:].tolist()
        room = max_new_tokens - len(generated)      # only the last block holds more than the room left
        new = cut_before_stop(block_ids[:room], stop)
        stopped = len(new) < len(block_ids[:room])
        if not stopped:
            overflow = cut_before_stop(block_ids[room:], stop)
        generated.extend(new)
        if on_block is not None and _call_back(engine, on_block, new) and not stopped and block < n_blocks - 1:
            cancelled = True
        if stopped or cancelled:
            break
    if engine.sampler_depth is not None:     # the device sampler: the states its epilogue sampled, and its time
        stats.epilogue = EpilogueStats(engine.epilogue_states - epilogue_before[0],
                                       1e3 * (engine.epilogue_seconds - epilogue_before[1]))
    stats.seconds = time.perf_counter() - t0
    return Generation(generated, stopped, stats, p, cancelled, overflow)


def cut_before_stop(ids: list[int], stop: set[int]) -> list[int]:
    """`ids` up to (not including) the first stop id."""
    return next((ids[:i] for i, t in enumerate(ids) if t in stop), ids)
