"""SDAR model configuration read from a Hugging Face `config.json`, with SDAR's defaults and quirks."""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from spot.descriptors import read_json
from spot.errors import SpotError

DEFAULT_BLOCK_SIZE = 4          # SDAR's default when config.json has no block_size (docs/spec.md §1)
DEFAULT_MASK_TOKEN_ID = 151669  # <|MASK|> of the Qwen3 vocabulary
DEFAULT_STOP_IDS = (151645, 151643)  # <|im_end|>, <|endoftext|> of the chat models
SUPPORTED_MODEL_TYPES = ("sdar",)


@dataclass(frozen=True)
class ModelConfig:
    """The architecture facts the runtime, the reference model and the exporter need."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1e6
    block_size: int = DEFAULT_BLOCK_SIZE
    mask_token_id: int = DEFAULT_MASK_TOKEN_ID
    stop_ids: tuple[int, ...] = field(default=DEFAULT_STOP_IDS)
    tie_word_embeddings: bool = False
    torch_dtype: str = "bfloat16"
    model_type: str = "sdar"

    def __post_init__(self):
        checks = [
            (self.vocab_size > 0, f"vocab_size must be positive, got {self.vocab_size}"),
            (self.num_attention_heads % max(self.num_key_value_heads, 1) == 0,
             f"num_attention_heads ({self.num_attention_heads}) must be a multiple of num_key_value_heads "
             f"({self.num_key_value_heads})"),
            (self.head_dim % 2 == 0, f"head_dim must be even for rotate-half RoPE, got {self.head_dim}"),
            (0 <= self.mask_token_id < self.vocab_size,
             f"mask_token_id {self.mask_token_id} is outside the vocabulary (size {self.vocab_size})"),
            (self.block_size >= 1, f"block_size must be >= 1, got {self.block_size}"),
        ]
        for ok, msg in checks:
            if not ok:
                raise SpotError(f"invalid model config: {msg}", "check config.json of the checkpoint")

    @property
    def kv_groups(self) -> int:
        return self.num_attention_heads // self.num_key_value_heads

    def with_block_size(self, block_size: int) -> "ModelConfig":
        check_block_size(block_size, self.max_position_embeddings)
        return ModelConfig(**{**asdict(self), "block_size": block_size})

    def to_dict(self) -> dict:
        d = asdict(self)
        d["stop_ids"] = list(self.stop_ids)
        return d

    @staticmethod
    def from_dict(d: dict) -> "ModelConfig":
        d = dict(d)
        d["stop_ids"] = tuple(d.get("stop_ids", DEFAULT_STOP_IDS))
        return ModelConfig(**d)

    def expected_tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """Tensor name -> shape of a standard Qwen3/SDAR checkpoint with this config."""
        h, i, hd = self.hidden_size, self.intermediate_size, self.head_dim
        shapes: dict[str, tuple[int, ...]] = {
            "model.embed_tokens.weight": (self.vocab_size, h),
            "model.norm.weight": (h,),
        }
        if not self.tie_word_embeddings:
            shapes["lm_head.weight"] = (self.vocab_size, h)
        for layer in range(self.num_hidden_layers):
            p = f"model.layers.{layer}."
            shapes.update({
                p + "self_attn.q_proj.weight": (self.num_attention_heads * hd, h),
                p + "self_attn.k_proj.weight": (self.num_key_value_heads * hd, h),
                p + "self_attn.v_proj.weight": (self.num_key_value_heads * hd, h),
                p + "self_attn.o_proj.weight": (h, self.num_attention_heads * hd),
                p + "self_attn.q_norm.weight": (hd,),
                p + "self_attn.k_norm.weight": (hd,),
                p + "mlp.gate_proj.weight": (i, h),
                p + "mlp.up_proj.weight": (i, h),
                p + "mlp.down_proj.weight": (h, i),
                p + "input_layernorm.weight": (h,),
                p + "post_attention_layernorm.weight": (h,),
            })
        return shapes

    def parameter_count(self) -> int:
        total = 0
        for shape in self.expected_tensor_shapes().values():
            n = 1
            for s in shape:
                n *= s
            total += n
        return total


def check_block_size(block_size: int, max_positions: int | None = None) -> None:
    if not isinstance(block_size, int) or block_size < 1 or block_size > 256:
        raise SpotError(f"block size must be an integer in 1..256, got {block_size!r}",
                        "SDAR checkpoints are trained for 4, 8, 16, 32 or 64")
    if max_positions is not None and max_positions % block_size != 0:
        raise SpotError(f"block size {block_size} does not divide max_position_embeddings {max_positions}",
                        "use a power of two such as 4, 8, 16 or 32")


def _stop_ids_from(model_dir: Path, raw: dict) -> tuple[int, ...]:
    """generation_config.json's eos_token_id (int or list) wins; else config's eos; else the chat defaults.

    A Qwen-vocabulary checkpoint without generation_config.json (SDAR-4B-Chat's training folder: config.json says
    eos 151643 only) also stops on the other chat stop id of docs/spec.md §1: without `<|im_end|>` a chat reply runs
    past the end of its turn to max_new_tokens."""
    gen = model_dir / "generation_config.json"
    eos, source = None, gen
    if gen.is_file():
        gen_cfg = read_json(gen, "restore the file from the checkpoint")
        eos = gen_cfg.get("eos_token_id") if isinstance(gen_cfg, dict) else None
    if eos is None:
        eos, source = raw.get("eos_token_id"), model_dir / "config.json"
    if eos is None:
        return DEFAULT_STOP_IDS
    ids = [eos] if not isinstance(eos, list) else eos
    if not ids or any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in ids):
        raise SpotError(f"{source}: eos_token_id is {eos!r}, expected a token id or a list of token ids",
                        "restore the file from the checkpoint")
    if source.name == "config.json" and set(ids) <= set(DEFAULT_STOP_IDS):
        ids = [*ids, *(i for i in DEFAULT_STOP_IDS if i not in ids)]
    return tuple(ids)


def load_config(model_dir: str | Path) -> ModelConfig:
    """Read `config.json` of an SDAR checkpoint folder; refuse other model types by name."""
    model_dir = Path(model_dir)
    if not model_dir.exists():
        from spot.assets import model_names
        raise SpotError(f"model folder {model_dir} does not exist",
                        "pass the folder that holds config.json, or an embedded model's name "
                        f"({', '.join(model_names())})")
    if not model_dir.is_dir():
        raise SpotError(f"{model_dir} is a file, expected a model folder", "pass the folder that holds config.json "
                        "(and the *.safetensors files, or an export's manifest.json)")
    path = model_dir / "config.json"
    if not path.is_file():
        raise SpotError(f"{model_dir} has no config.json: not a Hugging Face checkpoint folder",
                        "pass the folder that holds config.json and the *.safetensors files")
    raw = read_json(path, "restore the file from the checkpoint")
    if not isinstance(raw, dict):
        raise SpotError(f"{path} is a JSON {type(raw).__name__}, expected an object of model settings",
                        "restore config.json from the checkpoint")
    model_type = raw.get("model_type")
    if model_type == "sdar_moe":
        raise SpotError("model_type 'sdar_moe' (SDAR-30B-A3B, mixture of experts) is not supported",
                        "use a dense SDAR checkpoint: SDAR-1.7B/4B/8B-Chat")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise SpotError(f"unknown model_type {model_type!r} in {path}, expected 'sdar'",
                        "spot runs SDAR block-diffusion checkpoints (JetLM/SDAR-*)")
    required = ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"]
    missing = [k for k in required if k not in raw]
    if missing:
        raise SpotError(f"{path} lacks {', '.join(missing)}", "restore config.json from the checkpoint")
    if raw.get("hidden_act", "silu") != "silu":
        raise SpotError(f"hidden_act {raw['hidden_act']!r} is not supported, expected 'silu'")
    if raw.get("attention_bias", False):
        raise SpotError("attention_bias=true is not supported: SDAR has no attention biases")
    if raw.get("rope_scaling"):
        raise SpotError(f"rope_scaling {raw['rope_scaling']!r} is not supported, expected null")
    def integer(key: str, default=None, minimum: int = 1) -> int:
        """raw[key] as an int (a JSON integer; null or absent: default), else SpotError naming key and value."""
        value = raw.get(key)
        if value is None:
            value = default
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value) or value < minimum:
            raise SpotError(f"{path}: {key} is {raw.get(key)!r}, expected an integer >= {minimum}",
                            "restore config.json from the checkpoint")
        return int(value)

    def number(key: str, default: float) -> float:
        value = raw.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise SpotError(f"{path}: {key} is {value!r}, expected a positive number",
                            "restore config.json from the checkpoint")
        return float(value)

    n_heads = integer("num_attention_heads")
    hidden = integer("hidden_size")
    head_dim = integer("head_dim", hidden // n_heads)
    block_size = integer("block_size", DEFAULT_BLOCK_SIZE)
    cfg = ModelConfig(
        vocab_size=integer("vocab_size"),
        hidden_size=hidden,
        intermediate_size=integer("intermediate_size"),
        num_hidden_layers=integer("num_hidden_layers"),
        num_attention_heads=n_heads,
        num_key_value_heads=integer("num_key_value_heads", n_heads),
        head_dim=head_dim,
        max_position_embeddings=integer("max_position_embeddings", 32768),
        rms_norm_eps=number("rms_norm_eps", 1e-6),
        rope_theta=number("rope_theta", 1e6),
        block_size=block_size,
        mask_token_id=integer("mask_token_id", DEFAULT_MASK_TOKEN_ID, minimum=0),
        stop_ids=_stop_ids_from(model_dir, raw),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        torch_dtype=str(raw.get("torch_dtype", "bfloat16")),
    )
    check_block_size(cfg.block_size)
    return cfg


TRAINING_CORPUS_KEY = "spot_training_corpus"     # config.json key `spot train-target` writes


def training_corpus(model_dir: str | Path) -> str:
    """The corpus a model's training prompts come from (`spot traces --corpus-prompts`, the tuner): the
    `spot_training_corpus` key `spot train-target` writes into config.json ("code" or "arithmetic"); "code" (the
    Python standard library, which any tokenizer can encode) for every other checkpoint or export."""
    try:
        raw = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "code"
    corpus = raw.get(TRAINING_CORPUS_KEY) if isinstance(raw, dict) else None
    return corpus if corpus in ("code", "arithmetic") else "code"
