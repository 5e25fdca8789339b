"""Tiny real-format checkpoints shared by the CLI tests (a random SDAR folder, a BPE tokenizer, a chat template),
and the drafter folders shared by the Python and C++ drafter tests."""
from __future__ import annotations

import json

import onnx
import torch

from spot.config import ModelConfig
from spot.descriptors import sha256_file
from spot.engines.torch_engine import TorchEngine
from spot.reference.model import random_model

CFG = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=8, max_position_embeddings=64, block_size=4, mask_token_id=63,
                  stop_ids=(62,))
LINES = ["the cat sat on the mat", "a dog ate the hat", "hello world of tiny models", "the end of the story"]
def manifest_json(folder) -> dict:
    """An exported folder's manifest.json as JSON (for a test to edit it as a user, or an older spot, would)."""
    return json.loads((folder / "manifest.json").read_text())


def write_manifest_json(folder, manifest: dict) -> None:
    """Write an edited manifest.json as spot writes it (indent 2, a final newline)."""
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")


TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }} {{ m['content'] }}<|im_end|>{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant{% endif %}")


def save_tiny_model(folder, seed: int = 4):
    model = random_model(CFG, seed=seed, scale=1.0)
    with torch.no_grad():
        model.lm_head.weight[CFG.mask_token_id] = 0.0   # greedy never writes the mask id (as a trained SDAR)
    model.save_pretrained(folder)
    return folder


def save_tiny_tokenizer(folder):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(LINES, trainers.BpeTrainer(vocab_size=56, special_tokens=["[UNK]", "<|im_start|>",
                                                                                       "<|im_end|>"]))
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": TEMPLATE}))


def renamed_input_drafter(drafter_dir, out, old: str = "masked", new: str = "mask_bits"):
    """A copy of a drafter folder whose graph input `old` is called `new` (its manifest's sha256 updated)."""
    graph = onnx.load(str(drafter_dir / "drafter.onnx"))
    for value in graph.graph.input:
        if value.name == old:
            value.name = new
    for node in graph.graph.node:
        node.input[:] = [new if n == old else n for n in node.input]
    out.mkdir(exist_ok=True)
    onnx.save(graph, str(out / "drafter.onnx"))
    manifest = json.loads((drafter_dir / "drafter.json").read_text())
    (out / "drafter.json").write_text(json.dumps({**manifest, "onnx_sha256": sha256_file(out / "drafter.onnx")}))
    return out


RUNNER_UPS = ("future_runner_up", "future_gap")


def older_epilogue_copy(folder, out, outputs=RUNNER_UPS, whole_blocks: bool = True):
    """A copy of an exported folder whose epilogue is what older spot-exports wrote: without `outputs` (before
    runner-ups: future_runner_up and future_gap) and, with whole_blocks, taking whole blocks with no first_position
    input (before position runs: the input becomes a constant 0, positions_per_call leaves the manifest); the
    manifest re-hashed."""
    import shutil

    import numpy as np
    from onnx import numpy_helper

    from spot.folder.manifest import add_files, load_manifest
    from spot.folder.manifest_record import ABSENT
    shutil.copytree(folder, out)
    model = onnx.load(str(out / "epilogue.onnx"))
    kept = [o for o in model.graph.output if o.name not in outputs]
    del model.graph.output[:]
    model.graph.output.extend(kept)
    manifest = load_manifest(out, verify="none").manifest
    if whole_blocks:
        kept = [i for i in model.graph.input if i.name != "first_position"]
        del model.graph.input[:]
        model.graph.input.extend(kept)
        model.graph.initializer.append(numpy_helper.from_array(np.array(0, "int64"), "first_position"))
        entry = manifest.graphs.epilogue.set(positions_per_call=ABSENT)
        manifest = manifest.set(graphs=manifest.graphs.with_graph("epilogue", entry))
    onnx.save(model, str(out / "epilogue.onnx"))
    add_files(out, manifest, ["epilogue.onnx"]).write(out)
    return out


def nan_weights_copy(folder, out):
    """A copy of an exported folder whose final norm weight is NaN (all-ones float32 bits), its manifest re-hashed:
    every logit is NaN."""
    import shutil

    from spot.folder.manifest import add_files, load_manifest
    shutil.copytree(folder, out)
    graph = onnx.load(str(out / "target.onnx"), load_external_data=False)
    (norm,) = [t for t in graph.graph.initializer if t.name == "model.norm.weight"]
    where = {e.key: e.value for e in norm.external_data}
    with open(out / where["location"], "r+b") as f:
        f.seek(int(where["offset"]))
        f.write(b"\xff" * int(where["length"]))
    add_files(out, load_manifest(out, verify="none").manifest, ["target.onnx.data"]).write(out)
    return out


def without_kv_append(folder):
    """Remove kv_append.onnx from an exported folder and its manifest (as format 1 folders were written)."""
    from spot.folder.manifest import load_manifest
    manifest = load_manifest(folder, verify="none", upgradable=True).manifest
    manifest = manifest.set(graphs=manifest.graphs.without("kv_append"),
                       files={k: v for k, v in manifest.files.items() if k != "kv_append.onnx"})
    (folder / "kv_append.onnx").unlink()
    manifest.write(folder)
    return folder


def make_format1(folder):
    """Turn an exported folder into what a format 1 spot-export wrote: its target graph with the cached prefix in one
    stacked input broadcast over the states (spot.export.graph.BROADCAST, the same weights at the same offsets), no
    kv_append graph (that format's append took the whole cache), format_version 1; the manifest re-hashed."""
    from spot.export.target_file import TARGET_FILE, make_model, plan_layout
    from spot.export.graph import BROADCAST
    from spot.folder.manifest import add_files, load_manifest
    from spot.export.upgrade import declared_target
    exported = load_manifest(without_kv_append(folder), verify="none", upgradable=True)
    manifest, cfg = exported.manifest, exported.config
    graph = declared_target(manifest, cfg, BROADCAST)
    (folder / TARGET_FILE).write_bytes(make_model(graph, plan_layout(graph.weights)[0]).SerializeToString())
    target = manifest.graphs.target
    past = {"dtype": "float32" if manifest.dtype == "fp32" else "float16",
            "shape": [cfg.num_hidden_layers, cfg.num_key_value_heads, "C", cfg.head_dim]}
    inputs = [i for i in target.inputs if not i["name"].startswith("past_")]
    target = target.set(inputs=inputs + [{"name": "past_k", **past}, {"name": "past_v", **past}])
    if target.tensorrt_profile:       # format 1's profile named the stacked cache
        target = target.set(tensorrt_profile={
            end: {**{k: v for k, v in shapes.items() if not k.startswith("past_")},
                  **{name: [cfg.num_hidden_layers, *shapes["past_k_0"]] for name in ("past_k", "past_v")}}
            for end, shapes in target.tensorrt_profile.items()})
    manifest = manifest.set(format_version=1, graphs=manifest.graphs.with_graph("target", target))
    add_files(folder, manifest, [TARGET_FILE]).write(folder)
    return folder


def train_encoder_drafter(traces, out, settings) -> dict:
    """`train_drafter` into `out`, its graph then replaced by a model trained without weight selection, so that it is
    the whole encoder (selection keeps step 0 on tiny traces: the baseline graph, which has tests of its own).
    Returns the drafter.json written."""
    import numpy as np

    from spot.training.drafter import random_inputs, train_drafter, train_order_model, write_drafter
    manifest = train_drafter(traces, out, settings, log=lambda _: None)
    model, _ = train_order_model(traces, np.arange(traces.n_traces), settings, log=lambda _: None)
    assert not model.heads_are_zero()
    written = write_drafter(model, out, manifest, random_inputs(4, traces.block_size))
    assert written["graph"] == "encoder"
    return written


# manifest edits the graphs contradict: (field, value, "graph file: the input or output that shows it")
# (format 2: a third layer's past_k_2 is missing from the 2-layer target graph)
CONTRADICTIONS = [("num_hidden_layers", 3, "target.onnx: past_k_2"),
                  ("num_key_value_heads", 1, "target.onnx: past_k_0"), ("head_dim", 4, "target.onnx: past_k_0"),
                  ("vocab_size", 512, "target.onnx: logits"),
                  ("dtype", "fp16", "target.onnx: attn_bias"), ("future_steps", 2, "epilogue.onnx: future_tokens")]


def contradicting_copy(folder, out, field: str, value):
    """A copy of an exported folder whose manifest has `field` (the dtype, the epilogue's future_steps or a model.*
    field) edited to `value`, its graphs unchanged."""
    import shutil
    shutil.copytree(folder, out)
    manifest = json.loads((out / "manifest.json").read_text())
    if field == "dtype":
        manifest["dtype"] = value
    elif field == "future_steps":
        manifest["graphs"]["epilogue"]["future_steps"] = value
    else:
        manifest["model"][field] = value
    (out / "manifest.json").write_text(json.dumps(manifest))
    return out


PEAKED_MASK = 63


def peaked_engine(block_size: int = 4, seed: int = 0) -> TorchEngine:
    """A tiny random target whose distributions are peaked (head x3): several confident positions per step, so trees
    are accepted at depth (the exactness, registry and replay tests)."""
    cfg = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=512,
                      block_size=block_size, mask_token_id=PEAKED_MASK, stop_ids=(62,))
    model = random_model(cfg, seed, scale=1.0)
    with torch.no_grad():
        model.lm_head.weight.mul_(3.0)
    return TorchEngine(model)
