"""Named SDAR checkpoints for `spot-export NAME`: where their weights live locally, and their public configs.

A preset resolves its folder from --checkpoint DIR, else the Hugging Face cache
($HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub)/models--JetLM--<name>/snapshots/<rev>.
The built-in configs (from the public config.json files) let `--dry-run` build the real graph with no download.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import spot.assets
from spot.assets import embedded_name, model_names
from spot.config import DEFAULT_MASK_TOKEN_ID, DEFAULT_STOP_IDS, ModelConfig, load_config
from spot.errors import SpotError

QWEN3_VOCAB = 151936


@dataclass(frozen=True)
class Preset:
    name: str
    repo: str                   # Hugging Face repo id
    block_size: int
    dims: tuple[int, int, int, int, int]   # hidden, layers, query heads, kv heads, intermediate

    def config(self) -> ModelConfig:
        hidden, layers, heads, kv, inter = self.dims
        return ModelConfig(vocab_size=QWEN3_VOCAB, hidden_size=hidden, intermediate_size=inter,
                           num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
                           head_dim=128, max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1e6,
                           block_size=self.block_size, mask_token_id=DEFAULT_MASK_TOKEN_ID,
                           stop_ids=DEFAULT_STOP_IDS)


_SIZES = {"1.7b": ("1.7B", (2048, 28, 16, 8, 6144)),
          "4b": ("4B", (2560, 36, 32, 8, 9728)),
          "8b": ("8B", (4096, 36, 32, 8, 12288))}


def _presets() -> dict[str, Preset]:
    out = {}
    for key, (size, dims) in _SIZES.items():
        out[f"sdar-{key}"] = Preset(f"sdar-{key}", f"JetLM/SDAR-{size}-Chat", 4, dims)
        for b in (16, 32):
            out[f"sdar-{key}-b{b}"] = Preset(f"sdar-{key}-b{b}", f"JetLM/SDAR-{size}-Chat-b{b}", b, dims)
    return out


PRESETS = _presets()
EMBEDDED = "embedded"      # the code model's older name (spot.assets.ALIASES)


def preset_names() -> list[str]:
    return [*model_names(), *PRESETS]


def hf_hub_dir() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]) / "hub"
    try:
        return Path.home() / ".cache" / "huggingface" / "hub"
    except RuntimeError:        # HOME unset and a user with no passwd entry
        raise SpotError("no home folder to hold the Hugging Face cache (HOME is unset)",
                        "set HF_HOME or HF_HUB_CACHE, or pass the checkpoint's folder") from None


def hf_snapshot(repo: str) -> tuple[Path | None, Path]:
    """(the snapshot folder of `repo` in the HF cache or None, the folder searched). refs/main wins, else the
    most recently modified snapshot holding a config.json."""
    base = hf_hub_dir() / ("models--" + repo.replace("/", "--"))
    snapshots = base / "snapshots"
    ref = base / "refs" / "main"
    if ref.is_file():
        pinned = snapshots / ref.read_text().strip()
        if (pinned / "config.json").is_file():
            return pinned, snapshots
    found = sorted((p for p in snapshots.glob("*") if (p / "config.json").is_file()),
                   key=lambda p: p.stat().st_mtime, reverse=True) if snapshots.is_dir() else []
    return (found[0] if found else None), snapshots


@dataclass(frozen=True)
class Source:
    """What to export: a checkpoint folder (None for a dry run of a preset with no local copy) and defaults."""

    checkpoint: Path | None
    preset: str | None
    block_size: int | None       # the preset's block size (overrides a config.json that lacks/misstates it)
    builtin_config: ModelConfig | None
    default_name: str

    def checkpoint_config(self) -> ModelConfig:
        """config.json of the checkpoint; for a preset, checked to be that preset's architecture (a preset given
        another model's --checkpoint would export under the preset's name)."""
        cfg = load_config(self.checkpoint)
        want = self.builtin_config
        if want is not None:
            fields = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                      "intermediate_size", "vocab_size")
            differ = [f"{f} {getattr(cfg, f)} (preset: {getattr(want, f)})" for f in fields
                      if getattr(cfg, f) != getattr(want, f)]
            if differ:
                raise SpotError(f"the checkpoint {self.checkpoint} is not {self.preset}: {', '.join(differ)}",
                                "use the preset of that checkpoint, or pass the folder itself as SOURCE")
        return cfg


def resolve_source(source: str, checkpoint: str | None = None, dry_run: bool = False) -> Source:
    """Turn `spot-export SOURCE [--checkpoint DIR]` into a checkpoint folder; SpotError saying where it looked."""
    key = source.lower()
    name = embedded_name(key)
    if name is not None:        # an embedded model (spot.assets): the package's folder, or --checkpoint's
        return Source(Path(checkpoint) if checkpoint else spot.assets.embedded_model_dir(name), name, None, None, name)
    if key in PRESETS:
        preset = PRESETS[key]
        if checkpoint:
            return Source(Path(checkpoint), key, preset.block_size, preset.config(), key)
        snap, searched = hf_snapshot(preset.repo)
        if snap is None and not dry_run:
            raise SpotError(f"no local weights for {key} ({preset.repo}): looked in {searched} "
                            f"({'exists, no snapshot with config.json' if searched.is_dir() else 'absent'})",
                            f"download them with `huggingface-cli download {preset.repo}` (HF_HOME moves the "
                            f"cache), or pass --checkpoint DIR with the checkpoint folder")
        return Source(snap, key, preset.block_size, preset.config(), key)
    path = Path(source)
    if not path.exists():
        raise SpotError(f"{source!r} is neither an existing folder nor a preset",
                        f"presets: {', '.join(preset_names())}")
    if checkpoint:
        raise SpotError("--checkpoint only applies to presets; pass the folder itself as SOURCE")
    return Source(path, None, None, None, path.resolve().name)
