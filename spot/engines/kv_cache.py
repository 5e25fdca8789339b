"""A preallocated, fixed-capacity KV cache owned by the host loop, and an ORT engine that runs with static shapes.

The target graph (spot.export.graph) takes each layer's cache past_k_<l>/past_v_<l> [Hkv,C,D] and an additive mask
attn_bias [S,C+S]. The cache is one contiguous buffer [L,Hkv,Cap,D] of C = capacity slots allocated up front; each
layer's [Hkv,Cap,D] is a contiguous view of it, handed to the graph in place (a stable device address, as TensorRT
bindings and CUDA graphs need, and no copy); slots at or past the filled length are masked with -inf, so they get
softmax weight exactly 0. The graph returns the new tokens' K/V and the host writes them in place at
[length, length+S). The capacity is a bucket (spot.engines.buckets): chosen up front with `reserve(total)` when the
request's length is known, otherwise grown to the next bucket when the context outgrows it (one copy; the growth
points depend only on the cached length, so every decoder sees the same shapes).
Compared with the dynamic path (C = length) the masked slots change only the reduction lengths inside softmax and
MatMul, hence float rounding: logits agree within ~1e-6 in fp32 (tests/test_trt_and_buckets.py).

Works on numpy arrays (CPU, ORT) and torch tensors (CUDA device buffers for TensorRT / ORT IOBinding).
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from spot.engines.buckets import BucketPlan, block_trt_profile, pad_nodes
from spot.errors import SpotError
from spot.export.manifest import past_feeds
from spot.runtime.engine import Engine


def _is_torch(x) -> bool:
    return type(x).__module__.startswith("torch")


class StaticKVCache:
    """K and V [L,Hkv,Cap,D] allocated once, filled to `length`. `like` chooses the array type: None for numpy, or
    a torch tensor whose device is used."""

    def __init__(self, layers: int, kv_heads: int, capacity: int, head_dim: int, dtype=np.float32, like=None):
        if min(layers, kv_heads, capacity, head_dim) < 1:
            raise SpotError(f"KV cache dims must be >= 1, got L={layers} Hkv={kv_heads} Cap={capacity} D={head_dim}")
        self._dtype, self._like = dtype, like
        self.k, self.v = self._alloc((layers, kv_heads, capacity, head_dim))
        self.length = 0

    def _alloc(self, shape):
        if self._like is not None and _is_torch(self._like):
            import torch
            return (torch.zeros(shape, dtype=self._dtype, device=self._like.device),
                    torch.zeros(shape, dtype=self._dtype, device=self._like.device))
        return np.zeros(shape, dtype=self._dtype), np.zeros(shape, dtype=self._dtype)

    @property
    def capacity(self) -> int:
        return self.k.shape[2]

    @property
    def nbytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size() if _is_torch(self.k) else 2 * self.k.nbytes

    def reset(self) -> None:
        """Forget the contents (no clearing needed: slots past `length` are always masked)."""
        self.length = 0

    def ensure(self, capacity: int) -> bool:
        """Grow to `capacity` slots if smaller (a new buffer; the filled slots are copied). True if it grew."""
        if capacity <= self.capacity:
            return False
        k, v = self._alloc((self.k.shape[0], self.k.shape[1], capacity, self.k.shape[3]))
        k[:, :, :self.length] = self.k[:, :, :self.length]
        v[:, :, :self.length] = self.v[:, :, :self.length]
        self.k, self.v = k, v
        return True

    def feeds(self) -> dict:
        """The graph's cache inputs: every layer's K and V [Hkv,Cap,D], views of the buffers (no copy)."""
        return past_feeds(self.k, self.v)

    def append(self, new_k, new_v) -> None:
        """Write K/V [L,Hkv,S,D] of S new tokens at [length, length+S)."""
        s = new_k.shape[2]
        if tuple(new_k.shape) != (self.k.shape[0], self.k.shape[1], s, self.k.shape[3]) or new_v.shape != new_k.shape:
            raise ValueError(f"new K/V: got shapes {tuple(new_k.shape)} / {tuple(new_v.shape)}, expected "
                             f"[{self.k.shape[0]},{self.k.shape[1]},S,{self.k.shape[3]}]")
        if self.length + s > self.capacity:
            raise SpotError(f"KV cache full: {self.length} + {s} tokens exceed its capacity {self.capacity}",
                            "reserve a larger capacity bucket before the pass")
        self.k[:, :, self.length:self.length + s] = new_k
        self.v[:, :, self.length:self.length + s] = new_v
        self.length += s

    def bias(self, new: int, block_size: int, dtype=np.float32):
        """Additive mask [new, Cap+new] for `new` tokens at absolute positions length..length+new-1 against the
        whole cache followed by the new tokens: 0 = attend, -inf = masked. Filled slots are visible, unused slots
        masked, the new tokens see each other block-causally (blocks aligned at position 0)."""
        blocks = (self.length + np.arange(new)) // block_size
        out = np.zeros((new, self.capacity + new), dtype)        # in `dtype` directly: no float64 temporary
        out[:, self.length:self.capacity] = -np.inf                 # unused slots
        out[:, self.capacity:][blocks[None, :] > blocks[:, None]] = -np.inf
        if _is_torch(self.k):
            import torch
            return torch.from_numpy(out).to(self.k.device)
        return out


class StaticOrtEngine(Engine):
    """The exported target graph on ONNX Runtime with static shapes: a StaticKVCache window of a capacity bucket,
    node counts padded to node buckets, prefill in chunks of `plan.prefill_chunk` tokens. Same results as
    OrtEngine up to float rounding (different reduction lengths); batch-invariant across node buckets."""

    name = "ort-static"

    def __init__(self, model_dir: str | Path, plan: BucketPlan | None = None, device: str = "cpu",
                 threads: int | None = None):
        from spot.engines.ort_engine import target_session
        from spot.export.manifest import NP_DTYPES
        from spot.export.manifest import load_manifest
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
        if device == "trt":    # ORT's TensorRT EP: one profile over the plan, passes of one block (dynamic_trt_profile)
            self.plan = replace(self.plan, prefill_chunk=self.block_size)
            caps, n = self.plan.capacities, self.plan.nodes[-1]
            profile = block_trt_profile("static", cfg.with_block_size(self.block_size), (n, n),
                                        (caps[0], caps[len(caps) // 2], caps[-1]))
        self.session = target_session(self.exported, device, threads, profile)
        self.cache = StaticKVCache(cfg.num_hidden_layers, cfg.num_key_value_heads, self.plan.capacities[0],
                                   cfg.head_dim, self.dtype)
        self.last_shapes: tuple[int, int, int] | None = None     # (N, S, C) of the last pass, for tests/benchmarks

    @property
    def max_context(self) -> int:
        return self.plan.max_context

    @property
    def max_nodes(self) -> int:
        return self.plan.nodes[-1]

    def reserve(self, total_tokens: int) -> None:
        """Size the cache for a request of `total_tokens` (prompt + new tokens, whole blocks) up front."""
        self.cache.ensure(self.plan.capacity_for(total_tokens))

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
