"""A preallocated, fixed-capacity KV cache owned by the host loop (spot.engines.static_ort runs ORT over it).

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

import numpy as np

from spot.errors import SpotError
from spot.folder.manifest import past_feeds


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
            # torch: optional extra (spot[export])
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
            # torch: optional extra (spot[export])
            import torch
            return torch.from_numpy(out).to(self.k.device)
        return out


class PlannedCacheLimits:
    """The limits of an engine whose StaticKVCache (self.cache) is sized by a BucketPlan (self.plan): the plan's
    context and largest node bucket, and a cache sized up front for a request. Shared by StaticOrtEngine and
    TrtEngine; listed before Engine in their bases so these override Engine's defaults."""

    @property
    def max_context(self) -> int:
        return self.plan.max_context

    @property
    def max_nodes(self) -> int:
        return self.plan.nodes[-1]

    def reserve(self, total_tokens: int) -> None:
        """Size the cache for a request of `total_tokens` (prompt + new tokens, whole blocks) up front."""
        self.cache.ensure(self.plan.capacity_for(total_tokens))
