"""The exported target on ONNX Runtime with static shapes, over a StaticKVCache (spot.engines.kv_cache): capacity
buckets for the cache, node buckets for the verify pass, prefill in fixed chunks (spot.engines.buckets)."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from spot.engines.buckets import BucketPlan, pad_nodes
from spot.folder.trt_profile import block_trt_profile
from spot.engines.kv_cache import PlannedCacheLimits, StaticKVCache
from spot.engines.ort_sessions import target_session
from spot.errors import SpotError
from spot.folder.manifest import NP_DTYPES, load_manifest
from spot.runtime.engine import Engine


class StaticOrtEngine(PlannedCacheLimits, Engine):
    """The exported target graph on ONNX Runtime with static shapes: a StaticKVCache window of a capacity bucket,
    node counts padded to node buckets, prefill in chunks of `plan.prefill_chunk` tokens. Same results as
    OrtEngine up to float rounding (different reduction lengths); batch-invariant across node buckets."""

    name = "ort-static"

    def __init__(self, model_dir: str | Path, plan: BucketPlan | None = None, device: str = "cpu",
                 threads: int | None = None):
        self.exported = load_manifest(model_dir)
        cfg = self.exported.config
        super().__init__(cfg, self.exported.block_size)
        max_ctx = min(self.exported.max_context, cfg.max_position_embeddings)
        self.plan = plan or BucketPlan.default(max_ctx, self.block_size, self.exported.max_nodes)
        if self.plan.block_size != self.block_size:
            raise SpotError(f"bucket plan block size {self.plan.block_size} != the export's {self.block_size}")
        if self.plan.nodes[-1] > self.exported.max_nodes:
            raise SpotError(f"largest node bucket {self.plan.nodes[-1]} exceeds the export's max_nodes "
                            f"{self.exported.max_nodes}")
        self.dtype = np.dtype(NP_DTYPES[self.exported.dtype])
        profile = None
        if device == "trt":    # ORT's TensorRT EP: one profile over the plan, passes of one or two blocks
            # (dynamic_trt_profile)
            self.plan = replace(self.plan, prefill_chunk=self.block_size)
            caps, n = self.plan.capacities, self.plan.nodes[-1]
            profile = block_trt_profile("static", cfg.with_block_size(self.block_size), (n, n),
                                        (caps[0], caps[len(caps) // 2], caps[-1]))
        self._attach(target_session(self.exported, device, threads, profile))

    def _attach(self, session) -> None:
        cfg = self.config
        self.session = session
        self.cache = StaticKVCache(cfg.num_hidden_layers, cfg.num_key_value_heads, self.plan.capacities[0],
                                   cfg.head_dim, self.dtype)
        self.last_shapes: tuple[int, int, int] | None = None     # (N, S, C) of the last pass, for tests/benchmarks

    def sibling(self) -> "StaticOrtEngine":
        """Another engine over this one's session and bucket plan, with its own KV cache: the weights once (ONNX
        Runtime's run is thread-safe: the two may decode at the same time, one request each)."""
        other = type(self).__new__(type(self))
        other.exported, other.plan, other.dtype = self.exported, self.plan, self.dtype
        Engine.__init__(other, self.config, self.block_size)
        other._attach(self.session)
        return other

    def _run(self, outputs: list[str], ids: np.ndarray) -> list[np.ndarray]:
        n, s = ids.shape
        self.cache.ensure(self.plan.capacity_for(self.cache.length + s))   # room for the new tokens too
        feeds = {"input_ids": np.ascontiguousarray(ids, dtype=np.int64),
                 "position_ids": np.arange(self.cache.length, self.cache.length + s, dtype=np.int64),
                 "attn_bias": self.cache.bias(s, self.block_size, self.dtype), **self.cache.feeds()}
        self.last_shapes = (n, s, self.cache.capacity)
        return self.session.run(outputs, feeds)

    def _release(self) -> None:
        self.session = self.cache = None

    def _reset(self) -> None:
        self.cache.reset()

    def _prefill(self, ids: np.ndarray) -> None:
        for start in range(0, ids.shape[0], self.plan.prefill_chunk):
            chunk = ids[start:start + self.plan.prefill_chunk]
            new_k, new_v = self._run(["new_k", "new_v"], chunk[None])
            self.cache.append(new_k[:, 0], new_v[:, 0])

    def _block_logits(self, states: np.ndarray) -> np.ndarray:
        n = states.shape[0]
        (logits,) = self._run(["logits"], pad_nodes(states, self.plan.nodes_for(n)))
        return logits[:n]

    def _store(self, state: np.ndarray) -> None:
        new_k, new_v = self._run(["new_k", "new_v"], state[None])
        self.cache.append(new_k[:, 0], new_v[:, 0])

    def _store_and_logits(self, store: np.ndarray, state: np.ndarray) -> np.ndarray:
        """The fused pass: 2B tokens, block-causal (StaticKVCache.bias), the first block's K/V cached."""
        b = self.block_size
        logits, new_k, new_v = self._run(["logits", "new_k", "new_v"], np.concatenate([store, state])[None])
        self.cache.append(new_k[:, 0, :, :b], new_v[:, 0, :, :b])
        return logits[:, b:]
