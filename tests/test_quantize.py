"""Weight-only int8 / int4 exports: quantizer error bound, int4 packing (golden), the ONNX file's weights, ORT runs,
SPOT == standard decoding on each quantized engine, the ORT-only MatMulNBits form, streaming."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from spot.checkpoint import Checkpoint
from spot.config import ModelConfig
from spot.engines.ort_engine import OrtEngine
from spot.errors import SpotError
from spot.export import quantize as quant_mod
from spot.export.export import export_checkpoint
from spot.export.target_file import DATA_FILE, TARGET_FILE
from spot.export.options import ExportOptions
from spot.export.presets import resolve_source
from spot.export.quantize import (QuantScheme, dequantize_rows, is_quantized_linear, pack_int4, pack_nbits_rows,
                                  quantize_rows, scales_for, unpack_int4)
from spot.reference.model import random_model
from spot.runtime.decode_plan import DecodeRequest, run_decoder
from spot.runtime.spot import TreeBudget
from spot.runtime.step import Sampling

# input dims 64 (hidden, heads*head_dim) and 128 (intermediate): int4 blocks of 32 and 64 divide both
TINY = ModelConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=16, max_position_embeddings=256, block_size=4,
                   mask_token_id=127, stop_ids=(126,))


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("qckpt") / "tiny-sdar"
    random_model(TINY, seed=11).save_pretrained(folder)
    return folder


def export(ckpt: Path, out: Path, **kw) -> Path:
    return export_checkpoint(resolve_source(str(ckpt)), out, ExportOptions(**{"dtype": "fp32", **kw}))


@pytest.fixture(scope="module")
def exports(ckpt, tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("qout")
    return {"int8": export(ckpt, base / "int8", weights="int8"),
            "int4": export(ckpt, base / "int4", weights="int4", int4_block=32),
            "nbits": export(ckpt, base / "nbits", weights="int4", int4_block=64, matmulnbits=True)}


# -- the quantizer ---------------------------------------------------------------------------------------------------
def test_int4_packing_golden():
    """Two values per byte, low nibble first, two's complement nibbles (ONNX's INT4 layout, TensorRT's too)."""
    values = np.array([1, -2, 7, -8, 0, 3, -1, -7], np.int8)
    packed = pack_int4(values)
    assert packed.tolist() == [0xE1, 0x87, 0x30, 0x9F]
    np.testing.assert_array_equal(unpack_int4(packed), values)
    # onnx reads our bytes back as the same values
    t = helper.make_tensor("t", onnx.TensorProto.INT4, [2, 4], packed.tobytes(), raw=True)
    np.testing.assert_array_equal(numpy_helper.to_array(t).astype(np.int8).reshape(-1), values)
    # MatMulNBits: q + 8 (its default zero point), low nibble first, per row and block
    nb = pack_nbits_rows(values.reshape(1, 8), 8)
    assert nb.shape == (1, 1, 4) and nb.reshape(-1).tolist() == [0x69, 0x0F, 0xB8, 0x17]


@pytest.mark.parametrize("weights,block", [("int8", 0), ("int4", 32), ("int4", 128)])
@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_error_bound_per_channel_and_block(weights, block, dtype):
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((24, 256)) * rng.uniform(1e-3, 1, (24, 1))).astype(np.float32)
    w[3] = 0.0                       # all-zero channel: scale 1, q 0
    w[5] *= 1e-6                     # tiny channel: fp16 scales go subnormal
    w[7, 0] = 40.0                   # an outlier only widens its own channel/block
    q, s = quantize_rows(w, weights, block, dtype)
    qmax = quant_mod.QMAX[weights]
    assert q.dtype == np.int8 and np.abs(q).max() <= qmax
    assert s.dtype == {"fp32": np.float32, "fp16": np.float16}[dtype]
    assert s.shape == ((24,) if weights == "int8" else (24, 256 // block)) and (s > 0).all()
    err = np.abs(w.astype(np.float64) - dequantize_rows(q, s, block))
    half = np.repeat(s.astype(np.float64).reshape(24, -1), 256 // s.reshape(24, -1).shape[1], axis=1) / 2
    assert (err <= half).all(), float((err - half).max())
    assert (q[3] == 0).all() and np.abs(q).max(axis=1)[[0, 1, 2, 4]].min() == qmax   # full range is used


def test_scales_round_up_in_fp16():
    amax = np.array([1.0, 3.3333333, 1e-9, 0.0], np.float32)
    s = scales_for(amax, 7, "fp16")
    assert s.dtype == np.float16 and (s.astype(np.float32) >= amax / 7).all() and s[3] == 1
    with pytest.raises(SpotError, match="a weight group has values beyond what fp16 holds once quantized"):
        scales_for(np.array([1e6], np.float32), 7, "fp16")


def test_scheme_checks():
    with pytest.raises(SpotError, match="--ort-matmulnbits needs --weights int4"):
        QuantScheme("int8", matmulnbits=True).check()
    with pytest.raises(SpotError, match="--int4-block must be one of"):
        QuantScheme("int4", 48).check()
    odd = ModelConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
                      mask_token_id=127)
    with pytest.raises(SpotError, match="does not divide the model's intermediate_size 96") as e:
        QuantScheme("int4", 64).check_config(odd)
    assert "--int4-block 32" in e.value.hint
    assert QuantScheme("int4").graph_opset(17, "fp32") == 21 and QuantScheme("int8").graph_opset(18, "fp32") == 18
    assert QuantScheme("int8").graph_opset(17, "fp16") == 19
    assert QuantScheme("int4", matmulnbits=True).graph_opset(17, "fp16") == 17


# -- the exported files ----------------------------------------------------------------------------------------------
def _initializers(folder: Path) -> dict[str, np.ndarray]:
    model = onnx.load(str(folder / TARGET_FILE))          # with the external data
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_dequantized_weights_in_file_match_the_quantizer(exports, ckpt, kind):
    """The ONNX file's q/scale reproduce the quantizer's reference exactly and the checkpoint within scale/2."""
    folder, block = exports[kind], (0 if kind == "int8" else 32)
    inits = _initializers(folder)
    c = Checkpoint(ckpt)
    names = [n for n in TINY.expected_tensor_shapes() if is_quantized_linear(n)]
    assert len(names) == 7 * TINY.num_hidden_layers
    for name in names:
        w = c.tensor(name)                                      # [out, in]
        q_file = inits[f"{name}.{kind}"].astype(np.int8).T      # stored [in, out]
        s_file = inits[f"{name}.scale"]
        s_file = s_file if kind == "int8" else s_file.T         # [out] / [out, in/block]
        q_ref, s_ref = quantize_rows(w, kind, block, "fp32")
        np.testing.assert_array_equal(q_file, q_ref)
        np.testing.assert_array_equal(s_file, s_ref)
        deq = dequantize_rows(q_file, s_file, block)
        per = s_file.astype(np.float64).reshape(w.shape[0], -1)
        half = np.repeat(per, w.shape[1] // per.shape[1], axis=1) / 2
        assert (np.abs(w - deq) <= half).all(), name
        assert name not in inits                                # no fp copy of a quantized weight ships
    np.testing.assert_array_equal(inits["model.embed_tokens.weight"], c.tensor("model.embed_tokens.weight"))
    np.testing.assert_array_equal(inits["lm_head.weight"], c.tensor("lm_head.weight").T)


def test_graph_forms_and_manifest(exports):
    for kind, folder in exports.items():
        model = onnx.load(str(folder / TARGET_FILE), load_external_data=False)
        m = json.loads((folder / "manifest.json").read_text())
        ops = {(n.domain or "", n.op_type) for n in model.graph.node}
        imports = {o.domain: o.version for o in model.opset_import}
        assert m["weights"]["quantized"] and m["opset"] == imports[""]
        assert m["ort_session_config"] == {"session.qdq_matmulnbits_accuracy_level": "1"}
        assert all(c["ok"] and c["max_abs_dlogits"] < 1e-4 for c in m["validation"]["cases"])
        assert "dequantized" in m["validation"]["reference"]
        assert m["memory"]["weight_bytes"] == m["files"][DATA_FILE]["bytes"] - _padding(folder)
        if kind == "nbits":
            assert m["ort_only"] is True and m["graphs"]["target"]["ort_only"] is True
            assert imports == {"": 17, "com.microsoft": 1} and ("com.microsoft", "MatMulNBits") in ops
            assert ("", "DequantizeLinear") not in ops and m["weights"]["block_size"] == 64
            continue
        assert m["ort_only"] is False and ("", "DequantizeLinear") in ops and imports == {"": m["opset"]}
        dqs = [n for n in model.graph.node if n.op_type == "DequantizeLinear"]
        assert len(dqs) == 7 * TINY.num_hidden_layers and len(dqs[0].input) == 2     # no zero point
        attrs = {a.name: helper.get_attribute_value(a) for a in dqs[0].attribute}
        if kind == "int8":
            assert m["opset"] == 17 and attrs == {"axis": 1} and m["weights"]["block_size"] is None
        else:
            assert m["opset"] == 21 and model.ir_version == 10 and attrs == {"axis": 0, "block_size": 32}
            assert m["weights"]["int4_packing"] == "two values per byte, low nibble first"


def _padding(folder: Path) -> int:
    """Bytes of alignment padding in the data file (the manifest's weight_bytes counts tensor bytes only)."""
    model = onnx.load(str(folder / TARGET_FILE), load_external_data=False)
    lengths = sum(int({e.key: e.value for e in t.external_data}["length"]) for t in model.graph.initializer
                  if t.data_location == onnx.TensorProto.EXTERNAL)
    return (folder / DATA_FILE).stat().st_size - lengths


def test_int4_weights_are_about_a_quarter_of_fp32(exports, ckpt, tmp_path):
    fp32 = export(ckpt, tmp_path / "fp32", validate=False)
    sizes = {k: json.loads((f / "manifest.json").read_text())["memory"]["weight_bytes"] for k, f in exports.items()}
    full = json.loads((fp32 / "manifest.json").read_text())["memory"]["weight_bytes"]
    linear = sum(int(np.prod(s)) for n, s in TINY.expected_tensor_shapes().items() if is_quantized_linear(n))
    assert full - sizes["int8"] == linear * 3 - 4 * sum(
        s[0] for n, s in TINY.expected_tensor_shapes().items() if is_quantized_linear(n))
    assert sizes["int4"] == full - linear * 4 + linear // 2 + 4 * linear // 32


def test_streamed_chunks_give_identical_bytes(ckpt, exports, tmp_path, monkeypatch):
    """Two source rows per chunk: every int4 column slab and scale slab goes through the chunked pwrite path."""
    monkeypatch.setattr(quant_mod, "CHUNK_ELEMS", 1)
    for kind, kw in (("int4", dict(weights="int4", int4_block=32)),
                     ("nbits", dict(weights="int4", int4_block=64, matmulnbits=True))):
        out = export(ckpt, tmp_path / kind, validate=False, **kw)
        assert (out / DATA_FILE).read_bytes() == (exports[kind] / DATA_FILE).read_bytes()


@pytest.mark.parametrize("weights,opset", [("int4", 21), ("int8", 19)])
def test_fp16_quantized_exports_validate(ckpt, tmp_path, weights, opset):
    """fp16 scales: int4 is opset 21 anyway; int8 needs 19, the first DequantizeLinear taking float16 scales (at the
    requested 17 the graph failed onnx.checker with a traceback — SDAR-8B's int8 route)."""
    out = export(ckpt, tmp_path / f"f16-{weights}", dtype="fp16", weights=weights, int4_block=32)
    m = json.loads((out / "manifest.json").read_text())
    assert m["dtype"] == "fp16" and m["weights"]["scale_dtype"] == "fp16" and m["opset"] == opset
    assert all(c["ok"] for c in m["validation"]["cases"])
    inits = _initializers(out)
    assert inits["model.layers.0.mlp.down_proj.weight.scale"].dtype == np.float16


def test_block_that_does_not_divide_is_a_clear_error(ckpt, tmp_path):
    with pytest.raises(SpotError, match="--int4-block 128 does not divide the model's hidden_size 64"):
        export(ckpt, tmp_path / "bad", weights="int4", int4_block=128)
    assert not (tmp_path / "bad").exists()


# -- running them ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["int8", "int4", "nbits"])
def test_spot_equals_standard_on_quantized_engines(exports, kind):
    """SPOT's verify passes lay many states on the batch axis; its output must equal standard decoding's."""
    engine = OrtEngine(exports[kind])
    rng = np.random.default_rng(3)
    for temperature in (0.0, 1.0):
        for seed in (0, 1):
            prompt = rng.integers(0, 120, size=int(rng.integers(3, 9))).tolist()
            req = DecodeRequest(max_new_tokens=16, sampling=Sampling(temperature, seed=seed),
                                budget=TreeBudget(8, 4))
            std = run_decoder("standard", engine, prompt, req)
            tree = run_decoder("tree", engine, prompt, req)
            assert tree.token_ids == std.token_ids, (kind, temperature, seed)
            assert tree.stats.target_passes <= std.stats.target_passes


@pytest.mark.parametrize("kind", ["int8", "int4", "nbits"])
def test_state_logits_do_not_depend_on_the_batch(exports, kind):
    """Batch invariance of the quantized MatMuls: a state's logits alone == inside a batch of 8 (bit for bit)."""
    engine = OrtEngine(exports[kind])
    engine.prefill(np.arange(1, 9))
    rng = np.random.default_rng(0)
    states = rng.integers(0, 120, size=(8, TINY.block_size))
    together = engine.block_logits(states)
    for i in (0, 5):
        np.testing.assert_array_equal(engine.block_logits(states[i:i + 1])[0], together[i])


def test_dry_run_of_sdar_8b_int4_passes_the_checker():
    """The full-size opset-21 graph (INT4 initializers, blocked DequantizeLinear) passes onnx.checker with strict
    shape inference, and its weights are the 6.07 GB of docs/quantization.md."""
    from spot.export.export import dry_run
    fixture = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "sdar-8b-chat"
    if not (fixture / "config.json").is_file():
        pytest.skip("fixture sdar-8b-chat absent")
    report = dry_run(resolve_source("sdar-8b", str(fixture), dry_run=True), ExportOptions(weights="int4"))
    assert report["opset"] == 21 and report["weight_precision"] == "int4" and report["index_checked"]
    assert 6.0e9 < report["weight_bytes"] < 6.1e9


@pytest.mark.parametrize("weights, block", [("int8", 0), ("int4", 32)])
def test_weights_beyond_the_fp16_range_are_named_before_the_graph_overflows(weights, block):
    """An fp16 int8 / int4 export of a weight above 65504 built a graph whose q * scale overflowed to inf: validation
    then failed with NaN logits and called it an exporter bug. Now the tensor is named, as the fp16 path does."""
    from spot.export.quantize import quantize_rows
    w = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    w[1, 3] = 1e5               # the scale (1e5 / 7 or / 127) fits fp16; the weight rebuilt from it does not
    for big in (1e5, 65470.0):      # 65470 < 65504, but the rounded-up scale x qmax is not
        w[1, 3] = big
        with pytest.raises(SpotError, match="tensor up_proj has values beyond what fp16 holds once quantized") as e:
            quantize_rows(w, weights, block, "fp16", "tensor up_proj")
        assert "--dtype fp32" in e.value.hint
        quantize_rows(w, weights, block, "fp32", "tensor up_proj")       # fp32 scales hold it
    w[1, 3] = 60000.0
    q, s = quantize_rows(w, weights, block, "fp16", "tensor up_proj")
    assert np.isfinite(s.astype(np.float16) * np.float16(127 if weights == "int8" else 7)).all()
