"""The TensorRT shape profile an exported folder's manifest records (graphs.target.tensorrt_profile): the ranges of
the target graph's input shapes ONNX Runtime's TensorRT execution provider builds its engine for. Part of the folder's
contract: spot-export and spot upgrade-export write it, the engines (spot.engines.ort_sessions, StaticOrtEngine,
BucketPlan) and the C++ host read it."""
from __future__ import annotations

from dataclasses import dataclass

from spot.errors import SpotError
from spot.folder.manifest import past_input_names


def target_input_shapes(layers: int, kv_heads: int, head_dim: int, nodes: int, tokens: int,
                        cached: int) -> dict[str, tuple[int, ...]]:
    """The target graph's input shapes (spot.export.graph) for one pass of `nodes` states of `tokens` tokens against
    `cached` cached tokens: input_ids [N,S], position_ids [S], attn_bias [S,C+S], past_k_<l>/past_v_<l> [Hkv,C,D]
    per layer."""
    kv = (kv_heads, cached, head_dim)
    return {"input_ids": (nodes, tokens), "position_ids": (tokens,), "attn_bias": (tokens, cached + tokens),
            **{name: kv for pair in past_input_names(layers) for name in pair}}


@dataclass(frozen=True)
class Profile:
    """One TensorRT optimisation profile: input name -> (min, opt, max) shapes."""

    name: str
    shapes: dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]

    @staticmethod
    def spanning(name: str, dims: tuple[int, int, int], lo: tuple[int, int, int], opt: tuple[int, int, int],
                 hi: tuple[int, int, int]) -> "Profile":
        """The profile whose min / opt / max are the target's input shapes at the passes lo, opt, hi, each given as
        (nodes, tokens, cached); dims = (layers, kv_heads, head_dim)."""
        ends = [target_input_shapes(*dims, *pass_) for pass_ in (lo, opt, hi)]
        return Profile(name, {k: (ends[0][k], ends[1][k], ends[2][k]) for k in ends[0]})

    def to_dict(self) -> dict:
        """{"min" | "opt" | "max": {input: [dims]}} (the manifest's record)."""
        return {end: {k: list(v[i]) for k, v in self.shapes.items()} for i, end in enumerate(("min", "opt", "max"))}

    @staticmethod
    def from_dict(name: str, d: dict) -> "Profile":
        try:
            inputs = list(d["min"])
            shapes = {k: tuple(tuple(int(x) for x in d[end][k]) for end in ("min", "opt", "max")) for k in inputs}
        except (KeyError, TypeError, ValueError) as e:
            raise SpotError(f"the TensorRT profile {name} is malformed ({type(e).__name__}: {e}): expected "
                            "{\"min\"|\"opt\"|\"max\": {input: [dims]}}") from None
        return Profile(name, shapes)


def dynamic_trt_profile(cfg, max_nodes: int, max_context: int) -> Profile:
    """The one profile ONNX Runtime's TensorRT execution provider serves the dynamic-shape engines with (OrtEngine,
    the C++ host; spot-export records it in the manifest): N in 1..max_nodes states of one block (S = B), or the
    fused store pass (N = 1, S = 2B: a finished block and the next block's first state), against
    0..max_context - B cached tokens (cfg: a ModelConfig).

    ORT's TensorRT EP builds an engine for the shapes it has seen and builds again when a shape leaves that range
    (the cache grows by a block at every store): explicit ranges make it one build. It runs on its first profile
    only, and TensorRT sizes a profile's memory for its max shapes in every dimension at once, so S reaches two
    blocks and no further: a range over prefill chunks too would reserve N_max x chunk tokens of activations; S up to
    2B reserves N_max x 2B (spot.export.memory_plan counts it). On this provider the hosts therefore prefill one
    block per pass."""
    b = cfg.block_size
    top = max_context - b
    if top < 0 or max_nodes < 1:
        raise SpotError(f"no TensorRT profile for max_context {max_context} and max_nodes {max_nodes}: expected "
                        f"max_context >= the block size {b} and max_nodes >= 1")
    return block_trt_profile("dynamic", cfg, (min(16, max_nodes), max_nodes), (0, top // 2 // b * b, top))


def block_trt_profile(name: str, cfg, nodes: tuple[int, int], cached: tuple[int, int, int]) -> Profile:
    """One profile for ORT's TensorRT EP over passes of one block (S = B, opt) up to the fused store pass's two
    (S = 2B): 1..nodes[1] states (opt nodes[0]) against `cached` = (min, opt, max) cached tokens —
    dynamic_trt_profile, and StaticOrtEngine over its plan's capacity buckets."""
    b, dims = cfg.block_size, (cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim)
    return Profile.spanning(name, dims, (1, b, cached[0]), (nodes[0], b, cached[1]), (nodes[1], 2 * b, cached[2]))
