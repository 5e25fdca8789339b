"""SDAR (Qwen3-architecture block-diffusion LM) in plain torch: the reference every export is checked against.

One forward serves prefill, block steps over N candidate states sharing a cached prefix, the store pass, training
and ONNX tracing:  forward(ids [N,S], positions [S], attn_bias [S, C+S], past_k/v [L,Hkv,C,D]) ->
logits [N,S,V], new_k/new_v [L,N,Hkv,S,D] (the K/V of the S new tokens only; the caller owns the cache).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch
from torch import nn

from spot.checkpoint import Checkpoint, write_safetensors
from spot.config import ModelConfig

NEG_INF = float("-inf")


def block_causal_bias(length: int, block_size: int, prefix: int = 0, dtype=torch.float32) -> torch.Tensor:
    """Additive mask [length, prefix+length] for tokens at absolute positions prefix..prefix+length-1 attending
    to positions 0..prefix+length-1: bidirectional inside a block, causal across blocks (blocks aligned at 0)."""
    q_block = (torch.arange(length) + prefix) // block_size
    k_block = torch.arange(prefix + length) // block_size
    allowed = k_block[None, :] <= q_block[:, None]
    return torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, NEG_INF)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """SDAR's kernel: x * rsqrt(mean(x^2) + eps) * w, computed in fp32, cast once at the end."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
    return y.to(x.dtype)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [S, head_dim] for absolute positions (rotate-half layout, as Hugging Face computes them)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        hd = cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_attention_heads * hd, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, cfg.num_key_value_heads * hd, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, cfg.num_key_value_heads * hd, bias=False)
        self.o_proj = nn.Linear(cfg.num_attention_heads * hd, cfg.hidden_size, bias=False)
        self.q_norm = nn.Parameter(torch.ones(hd))
        self.k_norm = nn.Parameter(torch.ones(hd))

    def forward(self, x, cos, sin, attn_bias, past_k, past_v):
        """x [N,S,H]; past_k/v [Hkv,C,D] shared by all N rows. Returns out [N,S,H], k, v [N,Hkv,S,D]."""
        cfg = self.cfg
        n, s, _ = x.shape
        hq, hkv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        q = rms_norm(self.q_proj(x).view(n, s, hq, hd), self.q_norm, cfg.rms_norm_eps).transpose(1, 2)
        k = rms_norm(self.k_proj(x).view(n, s, hkv, hd), self.k_norm, cfg.rms_norm_eps).transpose(1, 2)
        v = self.v_proj(x).view(n, s, hkv, hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        keys, values = k, v
        if past_k is not None and past_k.shape[1] > 0:
            keys = torch.cat([past_k.unsqueeze(0).expand(n, -1, -1, -1), k], dim=2)
            values = torch.cat([past_v.unsqueeze(0).expand(n, -1, -1, -1), v], dim=2)
        # GQA without copying K/V: group the query heads of each KV head; Q is scaled before the first MatMul.
        qg = (q * (1.0 / math.sqrt(hd))).reshape(n, hkv, cfg.kv_groups * s, hd)
        scores = torch.matmul(qg, keys.transpose(-1, -2)).view(n, hkv, cfg.kv_groups, s, -1) + attn_bias
        probs = torch.softmax(scores, dim=-1).view(n, hkv, cfg.kv_groups * s, -1)
        out = torch.matmul(probs, values).view(n, hq, s, hd).transpose(1, 2).reshape(n, s, hq * hd)
        return self.o_proj(out), k, v


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = nn.Parameter(torch.ones(cfg.hidden_size))
        self.post_attention_layernorm = nn.Parameter(torch.ones(cfg.hidden_size))

    def forward(self, x, cos, sin, attn_bias, past_k, past_v):
        eps = self.cfg.rms_norm_eps
        a, k, v = self.self_attn(rms_norm(x, self.input_layernorm, eps), cos, sin, attn_bias, past_k, past_v)
        x = x + a
        x = x + self.mlp(rms_norm(x, self.post_attention_layernorm, eps))
        return x, k, v


class SDARModel(nn.Module):
    """SDAR decoder with an untied LM head. Parameter names map 1:1 to the Hugging Face checkpoint's."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Layer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = nn.Parameter(torch.ones(cfg.hidden_size))
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward(self, ids, positions, attn_bias, past_k=None, past_v=None, return_hidden: bool = False):
        """ids [N,S] int64, positions [S] int64, attn_bias [S, C+S] float, past_k/v [L,Hkv,C,D] or None.
        Returns logits [N,S,V] (or final hidden [N,S,H] when return_hidden), new_k, new_v [L,N,Hkv,S,D]."""
        cos, sin = rope_cos_sin(positions, self.cfg.head_dim, self.cfg.rope_theta)
        x = self.embed_tokens(ids)
        # RoPE tables in the model dtype (as Hugging Face Qwen3 does): fp32 tables would promote fp16 q/k to fp32.
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
        ks, vs = [], []
        for i, layer in enumerate(self.layers):
            pk = None if past_k is None else past_k[i]
            pv = None if past_v is None else past_v[i]
            x, k, v = layer(x, cos, sin, attn_bias, pk, pv)
            ks.append(k)
            vs.append(v)
        x = rms_norm(x, self.norm, self.cfg.rms_norm_eps)
        out = x if return_hidden else self.lm_head(x)
        return out, torch.stack(ks), torch.stack(vs)

    # -- Hugging Face names <-> parameters ---------------------------------------------------------------------
    def hf_state(self) -> dict[str, torch.Tensor]:
        """Tensors under their Hugging Face checkpoint names."""
        out = {"model.embed_tokens.weight": self.embed_tokens.weight, "model.norm.weight": self.norm,
               "lm_head.weight": self.lm_head.weight}
        for i, layer in enumerate(self.layers):
            p = f"model.layers.{i}."
            a, m = layer.self_attn, layer.mlp
            out.update({p + "self_attn.q_proj.weight": a.q_proj.weight, p + "self_attn.k_proj.weight": a.k_proj.weight,
                        p + "self_attn.v_proj.weight": a.v_proj.weight, p + "self_attn.o_proj.weight": a.o_proj.weight,
                        p + "self_attn.q_norm.weight": a.q_norm, p + "self_attn.k_norm.weight": a.k_norm,
                        p + "mlp.gate_proj.weight": m.gate_proj.weight, p + "mlp.up_proj.weight": m.up_proj.weight,
                        p + "mlp.down_proj.weight": m.down_proj.weight,
                        p + "input_layernorm.weight": layer.input_layernorm,
                        p + "post_attention_layernorm.weight": layer.post_attention_layernorm})
        return out

    @staticmethod
    def from_checkpoint(ckpt: Checkpoint, dtype=torch.float32) -> "SDARModel":
        cfg = ckpt.config
        with torch.device("meta"):
            model = SDARModel(cfg)
        model = model.to_empty(device="cpu")
        with torch.no_grad():
            for name, param in model.hf_state().items():
                src = "model.embed_tokens.weight" if (name == "lm_head.weight" and cfg.tie_word_embeddings) else name
                param.copy_(torch.from_numpy(ckpt.tensor(src)))
        return model.to(dtype).eval()

    def save_pretrained(self, out_dir: str | Path, dtype: str = "F32", extra_config: dict | None = None) -> None:
        """Write a Hugging Face SDAR folder: config.json (model_type sdar) + model.safetensors."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        write_safetensors(out / "model.safetensors",
                          {k: v.detach().float().cpu().numpy() for k, v in self.hf_state().items()}, dtype)
        (out / "config.json").write_text(json.dumps(hf_config_dict(self.cfg, dtype, extra_config), indent=2))


def hf_config_dict(cfg: ModelConfig, dtype: str = "F32", extra: dict | None = None) -> dict:
    """config.json contents in SDAR's own format."""
    torch_dtype = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}[dtype]
    d = {"architectures": ["SDARForCausalLM"], "model_type": "sdar", "attention_bias": False,
         "hidden_act": "silu", "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
         "intermediate_size": cfg.intermediate_size, "num_hidden_layers": cfg.num_hidden_layers,
         "num_attention_heads": cfg.num_attention_heads, "num_key_value_heads": cfg.num_key_value_heads,
         "head_dim": cfg.head_dim, "max_position_embeddings": cfg.max_position_embeddings,
         "rms_norm_eps": cfg.rms_norm_eps, "rope_theta": cfg.rope_theta, "rope_scaling": None,
         "block_size": cfg.block_size, "mask_token_id": cfg.mask_token_id,
         "eos_token_id": list(cfg.stop_ids) if len(cfg.stop_ids) > 1 else cfg.stop_ids[0],
         "tie_word_embeddings": cfg.tie_word_embeddings, "torch_dtype": torch_dtype}
    d.update(extra or {})
    return d


def random_model(cfg: ModelConfig, seed: int = 0, scale: float = 0.02) -> SDARModel:
    """A model with random weights (tests): normal(0, scale) matrices, norms near 1."""
    gen = torch.Generator().manual_seed(seed)
    model = SDARModel(cfg)
    with torch.no_grad():
        for name, p in model.hf_state().items():
            if p.ndim == 1:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * scale)
    return model.eval()


def to_numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().float().cpu().numpy()
