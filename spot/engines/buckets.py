"""Static shapes for GPU engines: prefix-capacity buckets and node-count buckets.

An engine with static shapes (a TensorRT optimisation profile, a captured CUDA graph, ORT's CUDA graph mode) runs one
shape per (node bucket, capacity bucket) pair. The host picks the smallest bucket that fits:
- capacity: the KV cache window C >= cached tokens; slots past the cached length are masked (spot.engines.kv_cache);
- nodes: N_bucket >= candidate states; the batch is padded by repeating the last state and the padded rows'
  outputs are dropped. The engine must be batch-invariant (docs/spec.md §4) for the real rows to be unaffected;
  tests/test_trt_and_buckets.py checks that bit for bit on ONNX Runtime CPU.
Standard decoding and SPOT pick buckets by the same rule from the same cached length, so a state's logits are
computed with the same shapes by both decoders whenever N falls in the same node bucket, and batch invariance covers
the rest.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from spot.errors import SpotError
from spot.folder.trt_profile import Profile


def pick_bucket(need: int, buckets: Sequence[int], what: str = "size") -> int:
    """The smallest bucket >= need (buckets ascending)."""
    if need < 0:
        raise ValueError(f"{what}: need must be >= 0, got {need}")
    for b in buckets:
        if b >= need:
            return int(b)
    raise SpotError(f"{what} {need} exceeds the largest bucket {buckets[-1] if buckets else 'none'}",
                    "rebuild the engine with larger buckets (`spot build-engine --max-context N --max-nodes N`)")


def capacity_buckets(max_context: int, block_size: int, smallest: int = 256) -> tuple[int, ...]:
    """Cache capacities: multiples of the block size doubling from `smallest` up to max_context (always included).
    The largest bucket is max_context rounded down to a whole number of blocks."""
    if block_size < 1 or max_context < block_size:
        raise SpotError(f"capacity buckets need max_context ({max_context}) >= block_size ({block_size}) >= 1")
    top = max_context // block_size * block_size
    cap = max(block_size, -(-smallest // block_size) * block_size)
    out = []
    while cap < top:
        out.append(cap)
        cap *= 2
    out.append(top)
    return tuple(out)


def node_buckets(max_nodes: int) -> tuple[int, ...]:
    """1, 2, 4, ... up to max_nodes (always included)."""
    if max_nodes < 1:
        raise SpotError(f"max_nodes must be >= 1, got {max_nodes}")
    out, n = [], 1
    while n < max_nodes:
        out.append(n)
        n *= 2
    out.append(max_nodes)
    return tuple(out)


def pad_nodes(states: np.ndarray, bucket: int) -> np.ndarray:
    """states [N,B] -> [bucket,B]: rows N..bucket-1 repeat the last state (a valid input whose outputs are dropped)."""
    n = states.shape[0]
    if not 1 <= n <= bucket:
        raise ValueError(f"cannot pad {n} states to a bucket of {bucket}")
    if n == bucket:
        return states
    return np.concatenate([states, np.repeat(states[-1:], bucket - n, axis=0)], axis=0)


def trt_shape_option(shapes: dict[str, tuple[int, ...]]) -> str:
    """ORT's trt_profile_{min,opt,max}_shapes format: "name:AxBxC,name2:..."."""
    return ",".join(f"{name}:{'x'.join(str(d) for d in shape)}" for name, shape in shapes.items())


@dataclass(frozen=True)
class BucketPlan:
    """The static shapes an engine serves: block steps and stores over capacity x node buckets, and chunked
    prefill (prefill_chunk tokens per pass, a multiple of the block size) and the fused store pass (2B tokens)
    against each capacity bucket."""

    block_size: int
    capacities: tuple[int, ...]
    nodes: tuple[int, ...]
    prefill_chunk: int

    def __post_init__(self):
        b = self.block_size
        if list(self.capacities) != sorted(set(self.capacities)) or any(c % b or c < b for c in self.capacities):
            raise SpotError(f"capacity buckets must be ascending multiples of the block size {b}, "
                            f"got {self.capacities}")
        if list(self.nodes) != sorted(set(self.nodes)) or self.nodes[0] < 1:
            raise SpotError(f"node buckets must be ascending and >= 1, got {self.nodes}")
        if self.prefill_chunk < b or self.prefill_chunk % b:
            raise SpotError(f"prefill_chunk must be a positive multiple of the block size {b}, "
                            f"got {self.prefill_chunk}")

    @staticmethod
    def default(max_context: int, block_size: int, max_nodes: int, smallest: int = 256,
                prefill_blocks: int = 4) -> "BucketPlan":
        caps = capacity_buckets(max_context, block_size, smallest)
        return BucketPlan(block_size, caps, node_buckets(max_nodes), block_size * prefill_blocks)

    @property
    def max_context(self) -> int:
        return self.capacities[-1]

    def capacity_for(self, tokens: int) -> int:
        """The smallest capacity bucket that holds `tokens` cached tokens (the cache length after a pass)."""
        if tokens > self.max_context:
            raise SpotError(f"context of {tokens} tokens exceeds the largest capacity bucket {self.max_context}",
                            "use a shorter prompt or fewer new tokens, or rebuild the engine with a larger "
                            "max_context (`spot build-engine --max-context N`)")
        return pick_bucket(max(tokens, 1), self.capacities, "cached tokens")

    def nodes_for(self, n: int) -> int:
        return pick_bucket(n, self.nodes, "candidate states")

    def static_shapes(self) -> list[tuple[int, int, int]]:
        """Every (N, S, C) the engine runs: block steps (N in node buckets, S = B), prefill chunks (N = 1)."""
        out = [(n, self.block_size, c) for c in self.capacities for n in self.nodes]
        out += [(1, s, c) for c in self.capacities for s in range(2 * self.block_size, self.longest_pass + 1,
                                                                  self.block_size)]
        return out

    @property
    def longest_pass(self) -> int:
        """Tokens of the longest one-state pass: a prefill chunk, or the fused store pass's two blocks."""
        return max(self.prefill_chunk, 2 * self.block_size)

    def trt_profiles(self, layers: int, kv_heads: int, head_dim: int) -> list[Profile]:
        """Per capacity bucket C (cache fixed at C): a block profile — N in 1..max node bucket, S = B — and a
        prefill profile — N = 1, S in 2B..longest_pass (prefill chunks and the fused store pass). Two profiles, not
        one spanning both, because TensorRT sizes a profile's memory for its max shapes in every dimension at once:
        one range would reserve N_max x prefill_chunk tokens of activations. Order: profile_index."""
        b, n_max, s_max, dims = self.block_size, self.nodes[-1], self.longest_pass, (layers, kv_heads, head_dim)
        profiles = []
        for c in self.capacities:
            profiles.append(Profile.spanning(f"C{c}", dims, (1, b, c), (n_max, b, c), (n_max, b, c)))
            profiles.append(Profile.spanning(f"C{c}-prefill", dims, (1, 2 * b, c), (1, s_max, c), (1, s_max, c)))
        return profiles

    def profile_index(self, capacity: int, tokens: int | None = None) -> int:
        """The profile of a pass of `tokens` tokens per state (default: one block) at a capacity bucket."""
        prefill = tokens is not None and tokens > self.block_size
        return self.capacities.index(capacity) * 2 + int(prefill)

    def to_dict(self) -> dict:
        return {"block_size": self.block_size, "capacities": list(self.capacities), "nodes": list(self.nodes),
                "prefill_chunk": self.prefill_chunk}

    @staticmethod
    def from_dict(d: dict) -> "BucketPlan":
        return BucketPlan(int(d["block_size"]), tuple(d["capacities"]), tuple(d["nodes"]), int(d["prefill_chunk"]))
