"""What an export is asked for (spot-export's options) and the checks of those options against the model's config,
apart from the exporter so that the memory plan and upgrade-export read them without it."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from spot.config import ModelConfig, check_block_size
from spot.errors import SpotError
from spot.export.graph import check_dtype, check_opset
from spot.export.presets import Source
from spot.export.quantize import QuantScheme
from spot.folder.epilogue import DEFAULT_FUTURE_STEPS, EpilogueCall, check_positions, default_epilogue_positions
from spot.folder.manifest import MAX_NODES

# Progress lines; one starting with "\r" updates the line before (a progress bar: spot.cli.shared.stderr_progress
# rewrites it in place on a terminal), and "\r" alone ends the bar.
Progress = Callable[[str], None]


def quiet(_: str) -> None:
    """The Progress of a caller that wants no lines."""
    pass


@dataclass(frozen=True)
class ExportOptions:
    dtype: str = "fp16"
    opset: int = 17
    max_nodes: int = 64
    max_context: int | None = None     # default: the model's max_position_embeddings
    block_size: int | None = None      # default: the preset's, else config.json's
    validate: bool = True
    validate_layers: int | None = None  # default: all layers up to VALIDATE_FULL_PARAMS, else 2
    atol: float | None = None          # default: the dtype's tolerance (spot.export.validate)
    overwrite: bool = False
    weights: str = "fp"                # fp (= dtype) | int8 | int4: weight-only quantization of the linear layers
    int4_block: int = 128              # input features per int4 scale: 32 | 64 | 128
    matmulnbits: bool = False          # int4 as com.microsoft MatMulNBits (ONNX Runtime only)
    plan: str | None = None            # device whose memory plan is checked and recorded (spot.export.memory_plan)
    plan_engines: int = 1              # engines the plan counts (spot serve --engines): the weights once, a KV
                                       # cache and a pass's buffers each
    epilogue_steps: int | None = None  # D of the sampling epilogue graph (GPU paths); 0 = none; default:
                                       # DEFAULT_FUTURE_STEPS, or the block size when smaller
    epilogue_positions: int | None = None  # block positions per epilogue call (memory); default:
                                           # spot.folder.epilogue.default_epilogue_positions

    def epilogue_depth(self, block_size: int) -> int:
        return min(DEFAULT_FUTURE_STEPS, block_size) if self.epilogue_steps is None else self.epilogue_steps

    def epilogue_call(self, cfg: ModelConfig) -> EpilogueCall | None:
        """How the hosts will call the export's epilogue (None: it has none)."""
        d = self.epilogue_depth(cfg.block_size)
        if d == 0:
            return None
        p = self.epilogue_positions or default_epilogue_positions(cfg.vocab_size, cfg.block_size, d)
        return EpilogueCall(d, p)

    @property
    def quant(self) -> QuantScheme:
        return QuantScheme(self.weights, self.int4_block, self.matmulnbits)


# -- configuration -------------------------------------------------------------------------------------------------
def effective_config(cfg: ModelConfig, source: Source, options: ExportOptions, progress: Progress) -> ModelConfig:
    """The config the export records: block size from --block-size, else the preset, else config.json."""
    block = options.block_size if options.block_size is not None else source.block_size or cfg.block_size
    if source.block_size and options.block_size is None and cfg.block_size != source.block_size:
        progress(f"note: preset {source.preset} decodes blocks of {source.block_size}; config.json says "
                 f"{cfg.block_size}, using {source.block_size}")
    check_block_size(block, cfg.max_position_embeddings)
    return cfg.with_block_size(block)


def check_options(cfg: ModelConfig, options: ExportOptions) -> int:
    """Validate dtype/opset/max-nodes/max-context; return the max context."""
    check_dtype(options.dtype)
    check_opset(options.opset)
    if not 1 <= options.max_nodes <= MAX_NODES:
        raise SpotError(f"--max-nodes must be in 1..{MAX_NODES}, got {options.max_nodes}",
                        "it bounds the candidate states of one verify pass (TensorRT optimization profiles)")
    ctx = cfg.max_position_embeddings if options.max_context is None else options.max_context
    if not (cfg.block_size <= ctx <= cfg.max_position_embeddings) or ctx % cfg.block_size:
        raise SpotError(f"--max-context must be a multiple of the block size {cfg.block_size} in "
                        f"{cfg.block_size}..{cfg.max_position_embeddings}, got {ctx}")
    if not 0 <= options.epilogue_depth(cfg.block_size) <= cfg.block_size:
        raise SpotError(f"--epilogue-steps must be in 0..{cfg.block_size} (the block size), got "
                        f"{options.epilogue_steps}", "it is the deepest SPOT tree the device sampler serves; 0 = none")
    if options.epilogue_positions is not None:
        check_positions(options.epilogue_positions, cfg.block_size, "--epilogue-positions",
                        "it is how many of a state's positions one epilogue call samples (memory)")
    return ctx
