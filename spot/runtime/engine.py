"""The engine interface the decoders run on: prefill, block forward over N candidate states, store.

Inputs are checked once here (Polygraphy style: the base class validates, subclasses compute). An engine holds the
KV cache of one sequence: `prefill` starts it, `store` appends one finished block (SDAR's separate store pass), or a
block's first pass appends the block before it (`block_outputs(..., store=block)`: the fused store, docs/spec.md §1);
`block_logits` reads it.
"""
from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod

import numpy as np

from spot.config import ModelConfig, check_block_size
from spot.errors import SpotError, integer_arg
from spot.runtime.outputs import host_outputs


MAX_VERIFY_NODES = 4096


MAX_THREADS = 256      # intra-op threads per ONNX Runtime session (the C host's bound too)


def check_threads(threads) -> int | None:
    """An ONNX Runtime session's intra-op thread count: None or 0 (ORT's default) .. MAX_THREADS; SpotError
    otherwise (ORT starts them up front: 100000 exhausted memory)."""
    if threads is None:
        return None
    threads = integer_arg(threads, "threads")
    if not 0 <= threads <= MAX_THREADS:
        raise SpotError(f"threads must be in 0..{MAX_THREADS} (0: ONNX Runtime's default), got {threads}")
    return threads


def id_array(ids, what: str) -> np.ndarray:
    """np.asarray(ids); SpotError naming `what` when numpy cannot make an array of them (ragged lists)."""
    try:
        return np.asarray(ids)
    except (ValueError, TypeError, OverflowError):
        raise SpotError(f"{what}: expected an array of integer ids, got {ids!r:.60}") from None


class Engine(ABC):
    """Subclasses implement `_prefill`, `_block_logits`, `_store`, `_store_and_logits`, `_reset`; callers use the
    public methods."""

    name = "engine"
    # the device sampling epilogue's work so far: states sampled and seconds inside its calls (generate() reports
    # the decode's share; the walk's and sampling's times include those seconds)
    epilogue_states, epilogue_seconds = 0, 0.0
    # seconds inside the target's passes (prefill, block_logits, block_outputs, store) so far: a decode's wall time
    # minus these is its host work (the budget tuner charges it to each decoder)
    pass_seconds = 0.0

    def __init__(self, config: ModelConfig, block_size: int | None = None):
        self.config = config
        # every engine, every command: one check (spot-export makes the same), and 0 is refused, not the default
        self.block_size = int(config.block_size) if block_size is None else integer_arg(block_size, "block_size")
        check_block_size(self.block_size, config.max_position_embeddings)
        self.cached_len = 0
        # held by generate() for a whole request: the engine has ONE KV cache, and a second request (another
        # thread, or a decode started inside on_block) would reset it under the first
        self.request_lock = threading.Lock()
        self.request_thread: int | None = None      # the thread whose request holds it (set by generate())
        self.in_callback = False     # generate() is inside its on_block: the request's own thread, not its passes

    # -- lifetime ----------------------------------------------------------------------------------------------
    closed = False

    def close(self) -> None:
        """Release the engine's sessions, KV cache and mapped weights now rather than when the last reference to it
        goes (an embedder switching models); later passes raise SpotError. Refused while a request decodes."""
        if not self.request_lock.acquire(blocking=False):        # (held from before request_thread is set)
            if self.closed:         # another close() holds it: closing twice is no error
                return
            raise SpotError("this engine is decoding a request", "close it after the request returns")
        try:
            if not self.closed:
                self.closed = True      # first: a concurrent close() finds it and returns
                self._release()
        finally:
            self.request_lock.release()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _release(self) -> None:
        """Drop what holds the engine's resources (subclasses: their sessions and caches)."""

    # -- public, checked -------------------------------------------------------------------------------------
    def prefill(self, ids: np.ndarray) -> None:
        """Reset the cache and store the K/V of `ids` [P] (P a multiple of the block size, block-causal mask)."""
        self._check_caller()
        ids = self._check_ids(ids, "prefill ids")
        if ids.ndim != 1 or ids.shape[0] % self.block_size:
            raise SpotError(f"prefill ids: got shape {ids.shape}, expected [P] with P a multiple of "
                            f"{self.block_size}")
        self._reset()
        self.cached_len = 0
        if ids.shape[0]:
            t0 = time.perf_counter()
            self._prefill(ids)
            self.pass_seconds += time.perf_counter() - t0
            self.cached_len = ids.shape[0]

    def block_logits(self, states: np.ndarray) -> np.ndarray:
        """Logits [N, B, V] float32 of N candidate states [N, B] of the block after the cache; stores nothing."""
        self._check_caller()
        states = self._check_states(states)
        t0 = time.perf_counter()
        try:
            return self._checked_logits(states)
        finally:
            self.pass_seconds += time.perf_counter() - t0

    def block_outputs(self, states: np.ndarray, steps, sampling, block: int, noise=None, store=None) -> list:
        """One target pass over N states [N, B] whose commit steps are steps [N]: per state, what the host loop
        reads (spot.runtime.outputs). Host engines hand over the logits (sampled with the decode's NoiseCache
        `noise` when given); an engine that samples on the device overrides `_block_outputs` and returns the
        epilogue's small outputs instead.

        store: a finished block [B] not yet cached, right before the states' block (the fused store, docs/spec.md
        §1): the pass runs it and the one state (N = 1) as 2B tokens with the block-causal mask, appends its K/V to
        the cache and returns the state's outputs — the block's store and the next block's first pass in one."""
        self._check_caller()
        states = self._check_states(states)
        if store is not None:
            store = self._check_store(store, "block_outputs store")
            if states.shape[0] != 1:
                raise SpotError(f"block_outputs with store: got {states.shape[0]} states, expected 1 (a block's "
                                "first pass)")
            self._check_room(2 * self.block_size)
        steps = id_array(steps, "steps")
        if steps.dtype.kind not in "iu":
            raise SpotError(f"steps: got dtype {steps.dtype}, expected integer commit steps")
        steps = steps.astype(np.int64).reshape(-1)
        if steps.shape[0] != states.shape[0]:
            raise SpotError(f"steps: got {steps.shape[0]} values, expected one per state ({states.shape[0]})")
        t0 = time.perf_counter()
        try:
            outputs = self._block_outputs(states, steps, sampling, block, noise, store)
        finally:
            self.pass_seconds += time.perf_counter() - t0
        if store is not None:
            self.cached_len += self.block_size
        return outputs

    @property
    def placement(self) -> dict[str, str]:
        """Where this engine runs what (reported by `spot generate --json`); engines with choices override it."""
        return {}

    @property
    def sampler_depth(self) -> int | None:
        """How many future steps of coupled samples a pass provides: None = any (the logits are on the host)."""
        return None

    def store(self, state: np.ndarray) -> None:
        """Append the K/V of a finished block state [B] to the cache."""
        self._check_caller()
        state = self._check_store(state, "store state")
        self._check_room(self.block_size)
        t0 = time.perf_counter()
        self._store(state)
        self.pass_seconds += time.perf_counter() - t0
        self.cached_len += self.block_size

    # -- checks ------------------------------------------------------------------------------------------------
    def _check_caller(self) -> None:
        """While a request decodes, its decoder alone may run passes: a prefill or store from another thread, or
        from the request's own on_block, would change the cache under it and its tokens with it. A closed engine
        runs none."""
        if self.closed:
            raise SpotError("this engine is closed", "open the model again")
        owner = self.request_thread
        if owner is not None and owner != threading.get_ident():
            raise SpotError("this engine is decoding a request on another thread (one request at a time per engine: "
                            "it holds one KV cache)", "open one engine per thread")
        if self.in_callback:
            raise SpotError("on_block ran a pass of the engine whose request called it (one request at a time per "
                            "engine: a prefill or store there changes the request's cache and tokens)",
                            "decode with another engine inside on_block")

    def _check_ids(self, ids, what: str) -> np.ndarray:
        ids = id_array(ids, what)
        if ids.dtype.kind not in "iu":
            raise SpotError(f"{what}: got dtype {ids.dtype}, expected integer token ids")
        ids = ids.astype(np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= self.config.vocab_size):
            bad = ids[(ids < 0) | (ids >= self.config.vocab_size)][0]
            raise SpotError(f"{what}: token id {bad} is outside the vocabulary [0, {self.config.vocab_size})",
                            "the ids do not belong to this model's tokenizer")
        return ids

    def _check_store(self, state, what: str) -> np.ndarray:
        """A finished block [B] to append to the cache (store, or block_outputs' fused store)."""
        state = self._check_ids(state, what)
        if state.shape != (self.block_size,):
            raise SpotError(f"{what}: got shape {state.shape}, expected [{self.block_size}]")
        return state

    def _check_states(self, states) -> np.ndarray:
        states = self._check_ids(states, "block states")
        if states.ndim != 2 or states.shape[1] != self.block_size or states.shape[0] < 1:
            raise SpotError(f"block states: got shape {states.shape}, expected [N>=1, {self.block_size}]")
        self._check_room(self.block_size)
        return states

    def _shaped_logits(self, states: np.ndarray) -> np.ndarray:
        logits = self._block_logits(states)
        expected = (states.shape[0], self.block_size, self.config.vocab_size)
        if logits.shape != expected:
            raise RuntimeError(f"{self.name} returned logits of shape {logits.shape}, expected {expected}")
        return logits

    def _checked_logits(self, states: np.ndarray) -> np.ndarray:
        logits = self._shaped_logits(states)
        if not np.isfinite(logits).all():
            self._non_finite()
        return logits

    def _non_finite(self):
        raise SpotError(f"the {self.name} engine produced non-finite logits (NaN or inf) for the block at "
                        f"position {self.cached_len}",
                        "the weights or the export are broken, or fp16 overflowed: try an fp32 export "
                        "(`spot-export --dtype fp32`)")

    def _check_room(self, n: int) -> None:
        if self.cached_len + n > self.max_context:
            raise SpotError(f"context of {self.cached_len + n} tokens exceeds the engine's limit of "
                            f"{self.max_context}", "use a shorter prompt or fewer new tokens")

    @property
    def max_context(self) -> int:
        return self.config.max_position_embeddings

    @property
    def max_nodes(self) -> int:
        """The most candidate states one verify pass takes (an export's max_nodes; spot-export's --max-nodes limit
        for engines without one: beyond it, building the tree alone takes seconds)."""
        return MAX_VERIFY_NODES

    # -- implementation ----------------------------------------------------------------------------------------
    @abstractmethod
    def _reset(self) -> None: ...

    @abstractmethod
    def _prefill(self, ids: np.ndarray) -> None: ...

    @abstractmethod
    def _block_logits(self, states: np.ndarray) -> np.ndarray: ...

    def _block_outputs(self, states: np.ndarray, steps: np.ndarray, sampling, block: int, noise,
                       store: np.ndarray | None = None) -> list:
        # non-finite logits fail when a state's outputs are READ: a verify pass also runs candidates the walk never
        # reaches, and standard decoding (which never runs them) must not fail where SPOT does not
        logits = self._shaped_logits(states) if store is None else self._shaped_fused_logits(store, states[0])
        return host_outputs(logits, steps, sampling, block, noise, self._non_finite)

    def _shaped_fused_logits(self, store: np.ndarray, state: np.ndarray) -> np.ndarray:
        logits = self._store_and_logits(store, state)
        expected = (1, self.block_size, self.config.vocab_size)
        if logits.shape != expected:
            raise RuntimeError(f"{self.name} returned fused-pass logits of shape {logits.shape}, expected {expected}")
        return logits

    @abstractmethod
    def _store(self, state: np.ndarray) -> None: ...

    @abstractmethod
    def _store_and_logits(self, store: np.ndarray, state: np.ndarray) -> np.ndarray:
        """The fused pass: [store, state] as 2B tokens at positions cached_len.. with the block-causal mask; append
        the first B tokens' K/V to the cache, return the state's logits [1, B, V] (the last B rows)."""
