"""`spot export` (`spot-export`), `spot verify`, `spot upgrade-export` and `spot build-engine`: make, check and
upgrade an exported folder, and build its TensorRT engine."""
from __future__ import annotations

import json
from pathlib import Path
import sys

import click

from spot.cli.shared import stderr_progress
from spot.errors import SpotError
from spot.files import check_output_path
from spot.app.models import verify_export


@click.command("export")
@click.argument("source")
@click.option("--checkpoint", type=click.Path(file_okay=False), default=None,
              help="Checkpoint folder of a preset (default: the Hugging Face cache, $HF_HOME/hub).")
@click.option("--out", type=click.Path(file_okay=False), default=None,
              help="Output folder (default: ./NAME-DTYPE-onnx). Written atomically.")
@click.option("--dtype", type=click.Choice(["fp32", "fp16", "bf16"]), default=None,
              help="Weight dtype. Default: fp16 (fp32 for `embedded`). bf16 is refused (no ORT CPU kernels).")
@click.option("--opset", type=int, default=17, show_default=True, help="ONNX opset: 17 or 18.")
@click.option("--max-nodes", type=int, default=64, show_default=True,
              help="Most candidate states per verify pass (recorded; the engine enforces it).")
@click.option("--max-context", type=int, default=None,
              help="Longest context in tokens (recorded; default: max_position_embeddings).")
@click.option("--block-size", type=int, default=None, help="Decoding block size (default: preset, else config).")
@click.option("--dry-run", is_flag=True, help="Build and check the graph of the real config without weights.")
@click.option("--no-validate", is_flag=True, help="Skip the comparison with the torch reference (not advised).")
@click.option("--validate-layers", type=click.IntRange(min=1), default=None,
              help="Validate the first K layers only (default: all up to 300M parameters, else 2).")
@click.option("--overwrite", is_flag=True, help="Replace an existing --out folder.")
@click.option("--weights", type=click.Choice(["fp", "int8", "int4"]), default="fp", show_default=True,
              help="Linear-layer weights: fp (= --dtype), int8 per channel or int4 in blocks (weight-only; embed, "
                   "lm_head stay in --dtype). int4 graphs are opset 21.")
@click.option("--int4-block", type=click.Choice(["32", "64", "128"]), default=None,
              help="Input features per int4 scale (--weights int4 only). Default: 128.")
@click.option("--ort-matmulnbits", is_flag=True,
              help="int4 as com.microsoft MatMulNBits: ONNX Runtime only (TensorRT cannot parse it).")
@click.option("--plan", "plan_device", default=None, metavar="DEVICE",
              help="Memory plan for orin-nano-8gb, orin-nx-16gb, agx-orin-32gb, agx-orin-64gb, <N>GB or host (this "
                   "machine, ONNX Runtime on its CPU): printed "
                   "(and nothing exported; exit status 1 when it does not fit) unless --out is given; with --out "
                   "the export must fit.")
@click.option("--engines", "plan_engines", type=click.IntRange(min=1), default=None,
              help="With --plan: engines decoding at once (spot serve --engines N): the weights once, a KV cache "
                   "and a pass's buffers each. Default: 1.")
@click.option("--plan-bench", type=click.Path(dir_okay=False), default=None,
              help="With --plan: a `spot bench` bench.json whose measured pass counts project SPOT's tokens/s on "
                   "the device against standard decoding (a roofline projection, not a measurement).")
@click.option("--passes-reduction", default=None, metavar="NODES=R,...",
              help="With --plan, without a bench.json: measured passes reductions by node budget (e.g. "
                   "16=1.9,64=2.3) for the same projection.")
@click.option("--epilogue-steps", type=int, default=None,
              help="Future steps D of the device sampling epilogue (epilogue.onnx, used on GPU paths; the deepest "
                   "SPOT tree it serves). Default: 8, or the block size if smaller. 0: no epilogue.")
@click.option("--epilogue-positions", type=int, default=None,
              help="Block positions per device-epilogue call (a divisor of the block size): its memory is "
                   "9.5 x (D+1) x P x V x 8 bytes. Default: the most that keep it under 1 GiB.")
@click.option("--tensorrt", "tensorrt_mode", type=click.Choice(["auto", "yes", "no"]), default="auto",
              show_default=True,
              help="Also build the TensorRT engine (spot build-engine's defaults, into its cache): auto = when "
                   "TensorRT and a CUDA GPU are here (engines are specific to the GPU and TensorRT version).")
@click.option("--quiet", is_flag=True, help="No progress lines.")
def export(source, checkpoint, out, dtype, opset, max_nodes, max_context, block_size, dry_run, no_validate,
           validate_layers, overwrite, weights, int4_block, ort_matmulnbits, plan_device, plan_engines, plan_bench,
           passes_reduction, epilogue_steps, epilogue_positions, tensorrt_mode, quiet):
    """Export an SDAR checkpoint to an ONNX folder (SOURCE: a checkpoint folder, an embedded model: arithmetic,
    code, or a preset: sdar-1.7b, sdar-4b, sdar-8b and their -b16 / -b32 variants).

    \b
    Examples:
      spot-export sdar-8b --checkpoint /path/to/SDAR-8B-Chat --out sdar-8b-fp16-onnx
      spot-export sdar-8b-b32 --weights int4 --plan orin-nx-16gb --max-nodes 16
      spot-export sdar-8b-b32 --weights int4 --plan orin-nx-16gb --max-nodes 16 --engines 2
      spot-export sdar-8b-b32 --weights int4 --plan orin-nx-16gb --passes-reduction 16=1.9,64=2.3
      spot-export arithmetic --out arithmetic-fp32-onnx
    """
    # the command's modules load when it runs: `import spot.cli` stays fast
    from spot.export.export import ExportOptions, dry_run as run_dry_run, export_checkpoint
    from spot.export.presets import resolve_source
    from spot.export.quantize import DEFAULT_INT4_BLOCK

    plan_only = plan_device is not None and out is None
    if (plan_bench or passes_reduction) and not plan_only:
        raise SpotError("--plan-bench and --passes-reduction project a memory plan's pass times: they need --plan "
                        "DEVICE (and no --out)")
    if plan_engines is not None and plan_device is None:
        raise SpotError("--engines sizes a memory plan: it needs --plan DEVICE",
                        "e.g. --plan orin-nx-16gb --engines 2")
    resolved = resolve_source(source, checkpoint, dry_run or plan_only)
    # the command's modules load when it runs: `import spot.cli` stays fast
    from spot.assets import EMBEDDED_MODELS
    dtype = dtype or ("fp32" if resolved.preset in EMBEDDED_MODELS else "fp16")
    if int4_block is not None and weights != "int4":
        raise SpotError(f"--int4-block applies to --weights int4, got --weights {weights}",
                        "add --weights int4, or leave out --int4-block")
    options = ExportOptions(dtype=dtype, opset=opset, max_nodes=max_nodes, max_context=max_context,
                            block_size=block_size, validate=not no_validate, validate_layers=validate_layers,
                            overwrite=overwrite, weights=weights, int4_block=int(int4_block or DEFAULT_INT4_BLOCK),
                            matmulnbits=ort_matmulnbits, plan=plan_device, plan_engines=plan_engines or 1,
                            epilogue_steps=epilogue_steps,
                            epilogue_positions=epilogue_positions)
    options.quant.check()
    progress = stderr_progress(quiet)
    if plan_only:
        # the command's modules load when it runs: `import spot.cli` stays fast
        from spot.export.memory_plan import plan_source, render
        from spot.export.roofline import counts_from_bench, counts_from_reductions
        plan, cfg = plan_source(resolved, options, progress)
        counts = counts_from_bench(plan_bench) if plan_bench else []
        if passes_reduction:
            counts += counts_from_reductions(passes_reduction, cfg.block_size, max_nodes)
        click.echo(render(plan, cfg.block_size, counts))
        if not plan.fits:        # for scripts: 0 fits, 1 does not fit, 2 an error (e.g. the weights alone)
            sys.exit(1)
        return
    if dry_run:
        click.echo(json.dumps(run_dry_run(resolved, options, progress)))
        return
    # the command's modules load when it runs: `import spot.cli` stays fast
    from spot.engines.tensorrt_engine import build_after_export, check_before_export
    check_before_export(tensorrt_mode, ort_matmulnbits)
    tag = dtype if weights == "fp" else weights
    folder = export_checkpoint(resolved, out if out is not None else Path(f"{resolved.default_name}-{tag}-onnx"),
                               options, progress)
    build_after_export(folder, tensorrt_mode, progress)


@click.command("verify")
@click.argument("folder", type=click.Path())
@click.option("--quick", is_flag=True, help="Sizes + sampled hashes of large files instead of full sha256.")
def verify(folder, quick):
    """Check every file of an exported folder against its manifest (full sha256 by default).

    \b
    Example:
      spot verify sdar-8b-fp16-onnx
    """
    files, total, drafter = verify_export(folder, quick)
    drafter_note = "; the drafter matches its drafter.json and this model" if drafter else ""
    click.echo(f"ok: {folder}: {files} files, {total / 2**20:.1f} MiB match the manifest{drafter_note}")


@click.command("upgrade-export")
@click.argument("folder", type=click.Path(file_okay=False))
@click.option("--epilogue-steps", type=int, default=None,
              help="Future steps D of the new sampling epilogue (default: the folder's, none if it has none; for "
                   "a folder from before epilogues spot-export's default; 0 removes it).")
@click.option("--epilogue-positions", type=int, default=None,
              help="Block positions per epilogue call (default: the folder's own, unless --epilogue-steps "
                   "changes D; else the most that keep a call under 1 GiB).")
@click.option("--quiet", is_flag=True, help="No progress lines.")
def upgrade_export_cmd(folder, epilogue_steps, epilogue_positions, quiet):
    """Rewrite an exported folder's sampling epilogue and kv_append graphs and its TensorRT shape profile (for
    --device trt) for this version, keeping its weights (no re-export): hard links into a sibling folder, the new
    graphs checked, then swapped in by renames.

    \b
    Example:
      spot upgrade-export sdar-8b-fp16-onnx --epilogue-positions 2
    """
    # the command's modules load when it runs: `import spot.cli` stays fast
    from spot.export.upgrade import upgrade_export
    progress = stderr_progress(quiet)
    manifest, changed = upgrade_export(folder, epilogue_steps, epilogue_positions, progress)
    epi = manifest.graphs.epilogue
    current = "" if changed else " (already current, nothing changed)"
    graphs = f"epilogue D {epi.future_steps}, {epi.positions_per_call} positions per call" if epi else "no epilogue"
    click.echo(f"ok: {folder}{current}: {graphs}, kv_append, TensorRT profile")


@click.command("build-engine")
@click.argument("folder", type=click.Path(file_okay=False))
@click.option("--out", type=click.Path(file_okay=False), default=None,
              help="Folder for the engine. Default: the engine cache ($SPOT_CACHE/tensorrt, ~/.cache/spot/tensorrt).")
@click.option("--max-nodes", type=int, default=None,
              help="Largest node bucket (verify pass). Default: 16, or the export's max_nodes if smaller.")
@click.option("--max-context", type=int, default=None, help="Largest KV capacity bucket. Default: the export's.")
@click.option("--smallest-capacity", type=int, default=256, show_default=True, help="Smallest KV capacity bucket.")
@click.option("--workspace-gib", type=float, default=4.0, show_default=True, help="TensorRT workspace limit.")
@click.option("--fp16-flag", is_flag=True, help="TensorRT 10 only: FP16 kernels for an fp32 export (weak typing).")
def build_engine_cmd(folder, out, max_nodes, max_context, smallest_capacity, workspace_gib, fp16_flag):
    """Build a TensorRT engine for an exported FOLDER (block and prefill profiles per KV-capacity bucket, timing
    cache).

    \b
    Example:
      spot build-engine sdar-8b-fp16-onnx --max-nodes 16 --max-context 8192
    """
    # the command's modules load when it runs: `import spot.cli` stays fast
    from spot.engines.tensorrt_engine import BuildOptions, build_engine
    if out is not None:
        check_output_path(out, "--out", folder=True)      # before a build of minutes, not after it
    opts = BuildOptions(max_nodes=max_nodes, max_context=max_context, smallest_capacity=smallest_capacity,
                        workspace_gib=workspace_gib, fp16_flag=fp16_flag)
    build_engine(folder, opts, out, progress=click.echo)
