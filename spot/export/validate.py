"""Check an export against the torch reference (Optimum style): run ONNX Runtime CPU and
spot.reference.model.SDARModel on inputs of shapes used nowhere else (a prefill of 2 blocks, then a block step over
3 candidate states on that 2-block prefix) and compare logits and the new K/V. A mismatch fails the export.

Large models: above VALIDATE_FULL_PARAMS parameters the check runs the first `validate_layers` (default 2) layers
plus embedding, final norm and lm_head: a second graph built by the same code that points at the same bytes of the
exported data file (same offsets), so what is checked is the file that ships, without loading 8B twice.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from spot.checkpoint import Checkpoint
from spot.config import ModelConfig
from spot.errors import SpotError
from spot.export.graph import TargetGraph, build_target_graph
from spot.export.quantize import ORT_SESSION_CONFIG, DequantizedCheckpoint
from spot.export.target_file import TARGET_FILE, make_model
from spot.folder.manifest import NP_DTYPES, past_feeds
from spot.ortlib import load_onnxruntime

VALIDATE_FULL_PARAMS = 300_000_000
DEFAULT_PARTIAL_LAYERS = 2
# fp32: both sides compute in float32; differences come from summation order only.
# fp16: rounding of fp16 intermediates (each ~2^-11 relative) differs between MLAS and torch; the bound scales with
# the logits' magnitude: |d| <= 1e-2 * max(1, max|reference|) (measured ~1e-3 relative on random models).
TOLERANCE = {"fp32": 1e-4, "fp16": 1e-2}
VALIDATION_FILE = ".validate.onnx"


def tolerance(dtype: str, reference: np.ndarray, atol: float | None = None) -> float:
    if atol is not None:
        return atol
    if dtype == "fp32":
        return TOLERANCE["fp32"]
    return TOLERANCE[dtype] * max(1.0, float(np.abs(reference).max()))


def _bias_block_causal(length: int, block: int, dtype) -> np.ndarray:
    q = np.arange(length)[:, None] // block
    k = np.arange(length)[None, :] // block
    return np.where(k <= q, 0.0, -np.inf).astype(dtype)


def _ort_forward(session, ids, start, bias, past_k, past_v, stacked: bool = False):
    """One pass; past K/V [L,Hkv,C,D] fed per layer (format 2), or as the one stacked pair of format 1 graphs."""
    cache = {"past_k": past_k, "past_v": past_v} if stacked else past_feeds(past_k, past_v)
    feeds = {"input_ids": ids.astype(np.int64), "position_ids": np.arange(start, start + ids.shape[1]),
             "attn_bias": bias, **cache}
    return session.run(["logits", "new_k", "new_v"], feeds)


def _torch_forward(model, ids, start, bias, past_k, past_v):
    # torch: optional extra (spot[export])
    import torch
    with torch.inference_mode():
        logits, k, v = model(torch.from_numpy(ids), torch.arange(start, start + ids.shape[1]),
                             torch.from_numpy(bias), past_k, past_v)
    return logits.float().numpy(), k, v


def validation_cases(cfg, seed: int = 1234) -> tuple[np.ndarray, np.ndarray]:
    """(prefill ids [1, 2B], block states [3, B] with some masked positions)."""
    rng = np.random.default_rng(seed)
    b = cfg.block_size
    prefill = rng.integers(0, cfg.vocab_size, size=(1, 2 * b))
    states = rng.integers(0, cfg.vocab_size, size=(3, b))
    states[rng.random((3, b)) < 0.5] = cfg.mask_token_id
    return prefill.astype(np.int64), states.astype(np.int64)


CASE_NAMES = ("prefill N=1 S=2B C=0", "block step N=3 S=B C=2B")


def ort_cases(session, cfg, dtype: str, stacked: bool = False) -> list[tuple]:
    """The validation cases on an ORT session: [(logits, new_k, new_v)] for a prefill of 2 blocks, then a block
    step of 3 states on that prefix (the session's own K/V). stacked: a format 1 graph (one past_k / past_v)."""
    npd = NP_DTYPES[dtype]
    b = cfg.block_size
    prefill, states = validation_cases(cfg)
    L, hkv, hd = cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim
    empty = np.zeros((L, hkv, 0, hd), npd)
    first = _ort_forward(session, prefill, 0, _bias_block_causal(prefill.shape[1], b, npd), empty, empty, stacked)
    c = prefill.shape[1]
    second = _ort_forward(session, states, c, np.zeros((b, c + b), npd), first[1][:, 0], first[2][:, 0], stacked)
    return [first, second]


def max_differences(name: str, got, want, dtype: str, atol: float | None = None) -> dict:
    """max |got - want| of logits, K and V with the tolerance applied to each (want: the reference)."""
    diffs = [float(np.abs(np.asarray(g, np.float64) - np.asarray(w, np.float64)).max()) for g, w in zip(got, want)]
    # each against its own scale (fp16: relative): V can be ~10x larger than K
    tols = [tolerance(dtype, np.asarray(w, np.float64), atol) for w in want]
    return {"case": name, "max_abs_dlogits": diffs[0], "max_abs_dk": diffs[1], "max_abs_dv": diffs[2],
            "tol_logits": tols[0], "tol_k": tols[1], "tol_v": tols[2],
            "ok": all(d <= t for d, t in zip(diffs, tols))}


def compare_with_reference(session, model, cfg, dtype: str, atol: float | None = None) -> list[dict]:
    """Run both sides on the validation cases; return per-case max |ORT - torch| and the tolerance applied."""
    # torch: optional extra (spot[export])
    import torch
    tdt = torch.float32 if dtype == "fp32" else torch.float16
    b = cfg.block_size
    prefill, states = validation_cases(cfg)
    bias = _bias_block_causal(prefill.shape[1], b, NP_DTYPES[dtype])
    t_logits, t_k, t_v = _torch_forward(model, prefill, 0, bias, None, None)
    c = prefill.shape[1]
    step_bias = np.zeros((b, c + b), NP_DTYPES[dtype])
    t2 = _torch_forward(model, states, c, step_bias, t_k[:, 0].to(tdt), t_v[:, 0].to(tdt))
    reference = [(t_logits, t_k.float().numpy(), t_v.float().numpy()), (t2[0], t2[1].float().numpy(),
                                                                        t2[2].float().numpy())]
    return [max_differences(name, got, want, dtype, atol)
            for name, got, want in zip(CASE_NAMES, ort_cases(session, cfg, dtype), reference)]


def validate_export(folder, ckpt: Checkpoint, graph: TargetGraph, layout: dict, options, progress) -> dict:
    """Validate the exported folder (before publishing); SpotError with the numbers on a mismatch."""
    ort = load_onnxruntime()
    # torch: optional extra (spot[export])
    import torch

    # torch: optional extra (spot.reference.model imports it)
    from spot.reference.model import SDARModel

    cfg = ckpt.config
    total_layers = cfg.num_hidden_layers
    layers = options.validate_layers
    if layers is None:
        layers = total_layers if cfg.parameter_count() <= VALIDATE_FULL_PARAMS else DEFAULT_PARTIAL_LAYERS
    layers = max(1, min(int(layers), total_layers))
    path = folder / TARGET_FILE
    sub_cfg = cfg
    if layers < total_layers:
        sub_cfg = truncated(cfg, layers)
        sub = build_target_graph(sub_cfg, options.dtype, options.opset, getattr(options, "quant", None))
        path = folder / VALIDATION_FILE
        path.write_bytes(make_model(sub, layout).SerializeToString())   # same data file, same offsets
    progress(f"validating against the torch reference ({layers} of {total_layers} layers, {options.dtype})")
    try:
        so = ort.SessionOptions()
        reference = Checkpoint(ckpt.dir, sub_cfg)
        quant = getattr(options, "quant", None)
        if quant is not None and quant.quantized:
            # the reference computes with the quantized-then-dequantized weights the export ships, and ORT with the
            # session settings the engine uses (float32 activations in its fused MatMulNBits)
            reference = DequantizedCheckpoint(reference, quant, options.dtype)
            for key, value in ORT_SESSION_CONFIG.items():
                so.add_session_config_entry(key, value)
        session = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        tdt = torch.float32 if options.dtype == "fp32" else torch.float16
        model = SDARModel.from_checkpoint(reference, tdt)
        cases = compare_with_reference(session, model, sub_cfg, options.dtype, options.atol)
        del session, model
    finally:
        if path.name == VALIDATION_FILE:
            path.unlink(missing_ok=True)
    for c in cases:
        progress(f"  {c['case']}: max |dlogits| {c['max_abs_dlogits']:.3g} (tol {c['tol_logits']:.3g}), "
                 f"max |dK| {c['max_abs_dk']:.3g} (tol {c['tol_k']:.3g}), "
                 f"max |dV| {c['max_abs_dv']:.3g} (tol {c['tol_v']:.3g})")
    bad = [c for c in cases if not c["ok"]]
    if bad:
        c = bad[0]
        raise SpotError(f"validation failed: {c['case']}: max |ORT - torch| logits {c['max_abs_dlogits']:.4g} "
                        f"(tolerance {c['tol_logits']:.4g}), K {c['max_abs_dk']:.4g} (tolerance "
                        f"{c['tol_k']:.4g}), V {c['max_abs_dv']:.4g} (tolerance {c['tol_v']:.4g}); nothing was "
                        "written",
                        "this is an exporter bug for this checkpoint: please report it with these numbers")
    weights = "" if quant is None or not quant.quantized else f", dequantized {quant.weights} linear weights"
    return {"reference": f"spot.reference.model.SDARModel ({options.dtype}{weights}, torch {torch.__version__})",
            "runtime": f"onnxruntime {ort.__version__} CPUExecutionProvider",
            "layers": layers, "of_layers": total_layers, "cases": cases}


def truncated(cfg: ModelConfig, layers: int) -> ModelConfig:
    """The same model with only its first `layers` layers (validation of very large exports)."""
    return replace(cfg, num_hidden_layers=layers)
