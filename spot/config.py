"""SDAR model configuration read from a Hugging Face `config.json`, with SDAR's defaults and quirks."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from spot.descriptors import read_json
from spot.errors import SpotError
from spot.schema import Boolean, Integer, ListOf, Mismatch, Number, Record, Text, checked, rule, shown

DEFAULT_BLOCK_SIZE = 4          # SDAR's default when config.json has no block_size (docs/spec.md §1)
DEFAULT_MASK_TOKEN_ID = 151669  # <|MASK|> of the Qwen3 vocabulary
DEFAULT_STOP_IDS = (151645, 151643)  # <|im_end|>, <|endoftext|> of the chat models
SUPPORTED_MODEL_TYPES = ("sdar",)

# Bounds of a model's numbers wherever they are read (config.json, an export's manifest.json "model", a drafter's
# "target"): far beyond any SDAR checkpoint (the largest: vocabulary 151936, 48 layers, hidden size 4096) and checked
# before anything is sized by them: "num_hidden_layers": 1000000000 made both hosts allocate without end. The C++
# host's are the same (cpp/src/bounds.h); docs/exported-folder.md lists them.
MAX_VOCAB = 1 << 24
MAX_HIDDEN = 1 << 16
MAX_INTERMEDIATE = 1 << 18
MAX_LAYERS = 1024
MAX_HEADS = 1024
MAX_HEAD_DIM = 1024
MAX_POSITIONS = 1 << 24
MAX_BLOCK_SIZE = 256
MAX_STOP_IDS = 1024

TOKEN_ID = Integer(0, MAX_VOCAB - 1)
MODEL_FIELDS = {
    "vocab_size": Integer(1, MAX_VOCAB),
    "hidden_size": Integer(1, MAX_HIDDEN),
    "intermediate_size": Integer(1, MAX_INTERMEDIATE),
    "num_hidden_layers": Integer(1, MAX_LAYERS),
    "num_attention_heads": Integer(1, MAX_HEADS),
    "num_key_value_heads": Integer(1, MAX_HEADS),
    "head_dim": Integer(1, MAX_HEAD_DIM),
    "max_position_embeddings": Integer(1, MAX_POSITIONS),
    "rms_norm_eps": Number(0, lo_open=True),
    "rope_theta": Number(0, lo_open=True),
    "block_size": Integer(1, MAX_BLOCK_SIZE),
    "mask_token_id": TOKEN_ID,
    "stop_ids": ListOf(TOKEN_ID, MAX_STOP_IDS),
    "tie_word_embeddings": Boolean(),
    "torch_dtype": Text(),
    "model_type": Text(SUPPORTED_MODEL_TYPES),
}
MODEL_REQUIRED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                  "num_key_value_heads", "head_dim", "max_position_embeddings")
# an export's manifest "model" (ModelConfig.to_dict): every key known, the first eight present
MODEL_SECTION = Record(MODEL_FIELDS, MODEL_REQUIRED, others=None, what="an object of model facts")


def check_model_rules(facts: dict) -> None:
    """The rules across a model's fields (facts: each field checked by MODEL_FIELDS, defaults filled in); Mismatch
    naming the field that breaks one."""
    heads, kv = facts["num_attention_heads"], facts["num_key_value_heads"]
    rule(heads % kv == 0, "num_key_value_heads", kv, f"a divisor of num_attention_heads ({heads})")
    rule(facts["head_dim"] % 2 == 0, "head_dim", facts["head_dim"], "an even integer (rotate-half RoPE)")
    rule(facts["mask_token_id"] < facts["vocab_size"], "mask_token_id", facts["mask_token_id"],
         f"an id inside the vocabulary, 0..{facts['vocab_size'] - 1}")


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
        facts = {**asdict(self), "stop_ids": list(self.stop_ids)}
        try:
            MODEL_SECTION.check(facts)
            check_model_rules(facts)
        except Mismatch as e:
            raise SpotError(e.message("invalid model config"), "check config.json of the checkpoint") from None

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
    def from_dict(d: dict, what: str = "model config", remedy: str = "check config.json of the checkpoint"
                  ) -> "ModelConfig":
        """The config of a manifest's "model" object (to_dict's), checked field by field (MODEL_SECTION) and across
        fields; SpotError naming `what` and the field otherwise."""
        checked(d, MODEL_SECTION, what, remedy)
        d = {**d, "stop_ids": tuple(d.get("stop_ids", DEFAULT_STOP_IDS))}
        try:
            check_model_rules({"block_size": DEFAULT_BLOCK_SIZE, "mask_token_id": DEFAULT_MASK_TOKEN_ID, **d})
        except Mismatch as e:
            raise SpotError(e.message(what), remedy) from None
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
    if not isinstance(block_size, int) or block_size < 1 or block_size > MAX_BLOCK_SIZE:
        raise SpotError(f"block size must be an integer in 1..{MAX_BLOCK_SIZE}, got {block_size!r}",
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
    try:
        MODEL_FIELDS["stop_ids"].check(ids)
    except Mismatch:
        ids = []
    if not ids:
        raise SpotError(f"{source}: eos_token_id is {shown(eos)}, expected a token id or a list of at most "
                        f"{MAX_STOP_IDS} token ids (each in 0..{MAX_VOCAB - 1})",
                        "restore the file from the checkpoint")
    if source.name == "config.json" and set(ids) <= set(DEFAULT_STOP_IDS):
        ids = [*ids, *(i for i in DEFAULT_STOP_IDS if i not in ids)]
    return tuple(ids)


def load_config(model_dir: str | Path) -> ModelConfig:
    """Read `config.json` of an SDAR checkpoint folder; refuse other model types by name."""
    model_dir = Path(model_dir)
    if not model_dir.exists():
        # start-up: spot.cli loads this module, not the embedded models' table
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
    remedy = "restore config.json from the checkpoint"

    def value(key: str, default=None):
        """raw[key] (null or absent: default), checked by MODEL_FIELDS[key]; SpotError naming key and value."""
        got = raw.get(key)
        try:
            return MODEL_FIELDS[key].check(default if got is None else got)
        except Mismatch as e:
            raise SpotError(f"{path}: {key} is {shown(got)}, expected {e.expected}", remedy) from None

    n_heads, hidden = value("num_attention_heads"), value("hidden_size")
    facts = {
        "vocab_size": value("vocab_size"),
        "hidden_size": hidden,
        "intermediate_size": value("intermediate_size"),
        "num_hidden_layers": value("num_hidden_layers"),
        "num_attention_heads": n_heads,
        "num_key_value_heads": value("num_key_value_heads", n_heads),
        "head_dim": value("head_dim", hidden // n_heads),
        "max_position_embeddings": value("max_position_embeddings", 32768),
        "rms_norm_eps": float(value("rms_norm_eps", 1e-6)),
        "rope_theta": float(value("rope_theta", 1e6)),
        "block_size": value("block_size", DEFAULT_BLOCK_SIZE),
        "mask_token_id": value("mask_token_id", DEFAULT_MASK_TOKEN_ID),
        "stop_ids": list(_stop_ids_from(model_dir, raw)),
        "tie_word_embeddings": value("tie_word_embeddings", False),
        "torch_dtype": value("torch_dtype", "bfloat16"),
    }
    cfg = ModelConfig.from_dict(facts, str(path), remedy)
    check_block_size(cfg.block_size)
    return cfg


TRAINING_CORPUS_KEY = "spot_training_corpus"     # config.json key `spot train-target` writes


def training_corpus(model_dir: str | Path) -> str:
    """The corpus a model's training prompts come from (`spot traces --corpus-prompts`, the tuner): the
    `spot_training_corpus` key `spot train-target` writes into config.json ("code" or "arithmetic"); "code" (the
    Python standard library, which any tokenizer can encode) for every other checkpoint or export."""
    try:
        raw = read_json(Path(model_dir) / "config.json", "")
    except (OSError, SpotError):
        return "code"
    corpus = raw.get(TRAINING_CORPUS_KEY) if isinstance(raw, dict) else None
    return corpus if corpus in ("code", "arithmetic") else "code"
