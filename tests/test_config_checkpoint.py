"""config.json reading (SDAR defaults and refusals) and the safetensors checkpoint reader (layouts, dtypes, damage)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from spot.checkpoint import INDEX_NAME, Checkpoint, write_safetensors
from spot.config import DEFAULT_BLOCK_SIZE, DEFAULT_MASK_TOKEN_ID, ModelConfig, load_config
from spot.errors import SpotError

FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures"

TINY = ModelConfig(vocab_size=48, hidden_size=16, intermediate_size=24, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=4, max_position_embeddings=64, block_size=4, mask_token_id=47,
                   stop_ids=(46,))


def hf_config(cfg: ModelConfig = TINY, **overrides) -> dict:
    d = {"model_type": "sdar", "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
         "intermediate_size": cfg.intermediate_size, "num_hidden_layers": cfg.num_hidden_layers,
         "num_attention_heads": cfg.num_attention_heads, "num_key_value_heads": cfg.num_key_value_heads,
         "head_dim": cfg.head_dim, "max_position_embeddings": cfg.max_position_embeddings,
         "block_size": cfg.block_size, "mask_token_id": cfg.mask_token_id, "eos_token_id": list(cfg.stop_ids),
         "rms_norm_eps": 1e-6, "rope_theta": 1e6, "tie_word_embeddings": False}
    d.update(overrides)
    return {k: v for k, v in d.items() if v is not None}


def random_tensors(cfg: ModelConfig = TINY, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {name: rng.normal(size=shape).astype(np.float32) for name, shape in cfg.expected_tensor_shapes().items()}


def write_checkpoint(folder: Path, tensors: dict[str, np.ndarray], dtype: str = "F32", shards: int = 1,
                     config: dict | None = None) -> Path:
    """A Hugging Face folder: config.json + model.safetensors, or `shards` files + model.safetensors.index.json."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config or hf_config()))
    if shards == 1:
        write_safetensors(folder / "model.safetensors", tensors, dtype)
        return folder
    names = list(tensors)
    weight_map = {}
    for k in range(shards):
        shard = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n] for n in names[k::shards]}
        write_safetensors(folder / shard, part, dtype)
        weight_map.update({n: shard for n in part})
    (folder / INDEX_NAME).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return folder


def error_of(fn, *args) -> str:
    with pytest.raises(SpotError) as info:
        fn(*args)
    return info.value.message


# -- config ----------------------------------------------------------------------------------------------------------
def test_config_defaults_when_block_size_and_mask_id_are_absent(tmp_path):
    big = ModelConfig(vocab_size=151936, hidden_size=16, intermediate_size=24, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=4, max_position_embeddings=64)
    (tmp_path / "config.json").write_text(json.dumps(hf_config(big, block_size=None, mask_token_id=None,
                                                               eos_token_id=None)))
    cfg = load_config(tmp_path)
    assert cfg.block_size == DEFAULT_BLOCK_SIZE == 4
    assert cfg.mask_token_id == DEFAULT_MASK_TOKEN_ID == 151669
    assert cfg.stop_ids == (151645, 151643)


def test_generation_config_eos_list_gives_the_stop_ids(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(hf_config(eos_token_id=45)))
    assert load_config(tmp_path).stop_ids == (45,)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [46, 45]}))
    assert load_config(tmp_path).stop_ids == (46, 45)


@pytest.mark.parametrize("name,shape", [
    ("sdar-8b-chat", dict(hidden_size=4096, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                          head_dim=128, intermediate_size=12288)),
    ("sdar-4b-chat", dict(hidden_size=2560, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                          head_dim=128, intermediate_size=9728)),
])
def test_fixture_configs_and_index_names(name, shape):
    folder = FIXTURES / name
    if not folder.is_dir():
        pytest.skip(f"fixture {folder} is absent")
    cfg = load_config(folder)
    for key, value in shape.items():
        assert getattr(cfg, key) == value, key
    assert (cfg.vocab_size, cfg.max_position_embeddings, cfg.block_size, cfg.mask_token_id) == (151936, 32768, 4,
                                                                                                 151669)
    assert not cfg.tie_word_embeddings
    index = json.loads((folder / INDEX_NAME).read_text())
    # the index has names only: they must be exactly the tensors the config implies ...
    assert set(index["weight_map"]) == set(cfg.expected_tensor_shapes())
    # ... and the bf16 byte total must be exactly what the config's shapes imply
    assert index["metadata"]["total_size"] == 2 * cfg.parameter_count()


def test_fixture_8b_stop_ids_from_generation_config():
    folder = FIXTURES / "sdar-8b-chat"
    if not folder.is_dir():
        pytest.skip(f"fixture {folder} is absent")
    assert load_config(folder).stop_ids == (151645, 151643)


def test_a_chat_checkpoint_without_generation_config_also_stops_at_im_end(tmp_path):
    """SDAR-4B-Chat's folder has no generation_config.json and config.json says eos 151643 (<|endoftext|>) only:
    the chat turn's end <|im_end|> (151645, docs/spec.md §1) is a stop id too. Other vocabularies keep config's eos."""
    folder = FIXTURES / "sdar-4b-chat"
    if folder.is_dir():
        assert not (folder / "generation_config.json").exists()
        assert load_config(folder).stop_ids == (151643, 151645)
    (tmp_path / "config.json").write_text(json.dumps(hf_config(eos_token_id=151643, vocab_size=151936)))
    assert load_config(tmp_path).stop_ids == (151643, 151645)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 151643}))   # the model's own word
    assert load_config(tmp_path).stop_ids == (151643,)


def test_sdar_moe_is_refused_by_name(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(hf_config(model_type="sdar_moe", num_experts=128)))
    msg = error_of(load_config, tmp_path)
    assert "sdar_moe" in msg and "not supported" in msg


def test_unknown_model_type(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(hf_config(model_type="llama")))
    msg = error_of(load_config, tmp_path)
    assert "'llama'" in msg and "sdar" in msg


def test_missing_folder_and_missing_config(tmp_path):
    assert "does not exist" in error_of(load_config, tmp_path / "nope")
    assert "no config.json" in error_of(load_config, tmp_path)
    assert "does not exist" in error_of(Checkpoint, tmp_path / "nope")
    (tmp_path / "weights.bin").write_bytes(b"x")
    assert "is a file, expected a model folder" in error_of(load_config, tmp_path / "weights.bin")


def test_invalid_config_json(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    assert "not valid JSON" in error_of(load_config, tmp_path)
    (tmp_path / "config.json").write_text("[1, 2]")
    assert "is a JSON list, expected an object" in error_of(load_config, tmp_path)


@pytest.mark.parametrize("eos", ["abc", [151645, None], 1.5, True, [], [-1]])
def test_a_malformed_eos_token_id_is_named(tmp_path, eos):
    """eos_token_id (generation_config.json, else config.json) of the wrong type: one error naming file and value
    (a string was read character by character, a float or null raised TypeError)."""
    (tmp_path / "config.json").write_text(json.dumps(hf_config()))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
    assert "generation_config.json: eos_token_id is" in error_of(load_config, tmp_path)
    (tmp_path / "generation_config.json").unlink()
    (tmp_path / "config.json").write_text(json.dumps({**hf_config(), "eos_token_id": eos}))
    assert "config.json: eos_token_id is" in error_of(load_config, tmp_path)


@pytest.mark.parametrize("key, value, words", [
    ("num_hidden_layers", "two", "num_hidden_layers is 'two', expected an integer in 1..1024"),
    ("num_key_value_heads", "2", "num_key_value_heads is '2'"),
    ("hidden_size", 2.5, "hidden_size is 2.5"),
    ("vocab_size", True, "vocab_size is True"),
    ("intermediate_size", 0, "intermediate_size is 0"),
    ("mask_token_id", -1, "mask_token_id is -1, expected an integer in 0..16777215"),
    ("rope_theta", "1e6", "rope_theta is '1e6', expected a number > 0"),
    ("rms_norm_eps", float("nan"), "rms_norm_eps is nan"),
    # bounded before anything is sized by them, and integers written as integers (both hosts read 2048.0 alike)
    ("num_hidden_layers", 1_000_000_000, "num_hidden_layers is 1000000000, expected an integer in 1..1024"),
    ("num_hidden_layers", -3, "num_hidden_layers is -3, expected an integer in 1..1024"),
    ("vocab_size", 2048.5, "vocab_size is 2048.5, expected an integer in 1..16777216"),
    ("vocab_size", 2048.0, "vocab_size is 2048.0, expected an integer"),
    ("max_position_embeddings", 2**40, "max_position_embeddings is 1099511627776, expected an integer in 1..16777216"),
    ("head_dim", 7, "head_dim is 7, expected an even integer"),
    ("tie_word_embeddings", "yes", "tie_word_embeddings is 'yes', expected true or false"),
])
def test_config_values_of_the_wrong_type_are_named(tmp_path, key, value, words):
    """A config.json value of the wrong type or range: one SpotError naming the key and the value (it was a
    ValueError / TypeError traceback, or for a huge number an allocation without end)."""
    (tmp_path / "config.json").write_text(json.dumps(hf_config(**{key: value})))
    assert words in error_of(load_config, tmp_path)


# -- checkpoint ------------------------------------------------------------------------------------------------------
def test_missing_weights(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(hf_config()))
    assert "neither model.safetensors nor" in error_of(Checkpoint, tmp_path)


def test_corrupt_safetensors(tmp_path):
    folder = write_checkpoint(tmp_path / "m", random_tensors())
    (folder / "model.safetensors").write_bytes(b"\x07\x00\x00\x00\x00\x00\x00\x00not json at all")
    assert "not a valid safetensors file" in error_of(Checkpoint, folder)
    (folder / "model.safetensors").write_bytes(b"abc")
    assert "not a valid safetensors file" in error_of(Checkpoint, folder)


def test_truncated_safetensors(tmp_path):
    folder = write_checkpoint(tmp_path / "m", random_tensors())
    path = folder / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 100])
    msg = error_of(Checkpoint, folder)
    assert "truncated" in msg and "model.safetensors" in msg


def test_shard_missing_from_folder(tmp_path):
    folder = write_checkpoint(tmp_path / "m", random_tensors(), shards=3)
    assert len(Checkpoint(folder).tensors) == len(TINY.expected_tensor_shapes())
    (folder / "model-00002-of-00003.safetensors").unlink()
    msg = error_of(Checkpoint, folder)
    assert "model-00002-of-00003.safetensors" in msg and "missing" in msg


def test_index_naming_a_tensor_its_shard_lacks(tmp_path):
    folder = write_checkpoint(tmp_path / "m", random_tensors(), shards=2)
    index = json.loads((folder / INDEX_NAME).read_text())
    index["weight_map"]["model.layers.9.mlp.up_proj.weight"] = "model-00001-of-00002.safetensors"
    (folder / INDEX_NAME).write_text(json.dumps(index))
    assert "model.layers.9.mlp.up_proj.weight" in error_of(Checkpoint, folder)


def rewrite_header(path: Path, edit) -> None:
    """Replace a safetensors file's header by edit(header) (the data bytes stay)."""
    data = path.read_bytes()
    hlen = int.from_bytes(data[:8], "little")
    header = edit(json.loads(data[8:8 + hlen]))
    hbytes = json.dumps(header).encode() if not isinstance(header, bytes) else header
    hbytes += b" " * (-len(hbytes) % 8)
    path.write_bytes(len(hbytes).to_bytes(8, "little") + hbytes + data[8 + hlen:])


@pytest.mark.parametrize("index, says", [
    ([], "got a JSON list"), ({"weight_map": None}, "got NoneType"), ({"weight_map": ["a"]}, "got list"),
    ({"weight_map": {"model.norm.weight": 3}}, "non-string shards"),
    ({"weight_map": {"model.norm.weight": "../outside/x.safetensors"}}, "expected a file name in its own folder"),
])
def test_index_of_the_wrong_shape_is_named(tmp_path, index, says):
    """An index that parses as JSON but is not {tensor: shard file name}: one error naming it (Checkpoint and the
    dry run's index reader alike)."""
    from spot.export.export import _index_names
    folder = write_checkpoint(tmp_path / "m", random_tensors(), shards=2)
    (folder / INDEX_NAME).write_text(json.dumps(index))
    for fn in (Checkpoint, _index_names):
        msg = error_of(fn, folder)
        assert INDEX_NAME in msg and "not a valid safetensors index" in msg or "own folder" in msg, msg
        assert says in msg, msg


@pytest.mark.parametrize("edit, says", [
    (lambda h: [1, 2, 3], "header is a JSON list, expected an object"),
    (lambda h: {**h, "model.norm.weight": {**h["model.norm.weight"], "shape": "16"}}, "malformed header entry"),
    (lambda h: {**h, "model.norm.weight": {**h["model.norm.weight"], "data_offsets": [-8, 56]}},
     "expected 0 <= start <= end"),
    (lambda h: {**h, "model.norm.weight": {**h["model.norm.weight"], "dtype": "F8_E4M3"}},
     "dtype F8_E4M3, expected one of"),
])
def test_safetensors_headers_that_are_not_a_valid_layout(tmp_path, edit, says):
    folder = write_checkpoint(tmp_path / "m", random_tensors())
    rewrite_header(folder / "model.safetensors", edit)
    assert says in error_of(Checkpoint, folder)


def test_overlapping_tensors_are_refused(tmp_path):
    """Two tensors over the same bytes (both sizes right): the safetensors library refuses it, and so does spot —
    else one tensor silently reads another's weights."""
    folder = write_checkpoint(tmp_path / "m", random_tensors())

    def overlap(h):
        a, b = h["model.layers.0.input_layernorm.weight"], h["model.layers.1.input_layernorm.weight"]
        b["data_offsets"] = list(a["data_offsets"])
        return h
    rewrite_header(folder / "model.safetensors", overlap)
    msg = error_of(Checkpoint, folder)
    assert "overlap" in msg and "input_layernorm.weight" in msg


@pytest.mark.parametrize("dtype", ["I32", "F64", "U8"])
def test_a_weight_stored_as_another_dtype_is_refused(tmp_path, dtype):
    """The right shape in an integer or float64 layout: refused naming the tensor (it used to be cast to float32
    and decoded), while a buffer of such a dtype that the model does not read is allowed."""
    name = "model.layers.0.mlp.gate_proj.weight"
    itemsize = {"F32": 4, "I32": 4, "F64": 8, "U8": 1, "I64": 8}
    tensors = {n: (a, "F32") for n, a in random_tensors().items()} | {"extra.position_ids": (np.zeros(2), "I64")}
    tensors[name] = (tensors[name][0], dtype)
    header, blobs, offset = {}, [], 0
    for n, (arr, dt) in tensors.items():      # zeros of the right size: only the layout matters here
        size = arr.size * itemsize[dt]
        header[n] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [offset, offset + size]}
        blobs.append(bytes(size))
        offset += size
    folder = write_checkpoint(tmp_path / "m", random_tensors())
    hbytes = json.dumps(header).encode()
    hbytes += b" " * (-len(hbytes) % 8)
    (folder / "model.safetensors").write_bytes(len(hbytes).to_bytes(8, "little") + hbytes + b"".join(blobs))
    msg = error_of(Checkpoint, folder)
    assert name in msg and f"stored as {dtype}" in msg and "BF16, F16, F32" in msg


def test_each_tensor_comes_from_the_shard_the_index_names(tmp_path):
    """A tensor present in two shards is read from the one the index names (as transformers), not from whichever
    shard was read last."""
    tensors = random_tensors()
    folder = write_checkpoint(tmp_path / "m", tensors, shards=2)
    weight_map = json.loads((folder / INDEX_NAME).read_text())["weight_map"]
    name = "model.norm.weight"
    home = weight_map[name]
    other = next(s for s in set(weight_map.values()) if s != home)
    others = {n: tensors[n] for n, s in weight_map.items() if s == other}
    write_safetensors(folder / other, {**others, name: np.full_like(tensors[name], 7.0)}, "F32")
    assert np.array_equal(Checkpoint(folder).tensor(name), tensors[name])


def test_model_safetensors_wins_over_an_index(tmp_path):
    """With both model.safetensors and an index, transformers loads the single file: so does spot."""
    tensors = random_tensors(seed=1)
    folder = write_checkpoint(tmp_path / "m", random_tensors(seed=2), shards=2)
    write_safetensors(folder / "model.safetensors", tensors, "F32")
    ckpt = Checkpoint(folder)
    assert {i.file.name for i in ckpt.tensors.values()} == {"model.safetensors"}
    assert np.array_equal(ckpt.tensor("model.norm.weight"), tensors["model.norm.weight"])


def test_broken_links_are_named(tmp_path):
    """A Hugging Face cache snapshot links to blobs; an incomplete download leaves links to nothing."""
    folder = write_checkpoint(tmp_path / "m", random_tensors())
    (folder / "model.safetensors").unlink()
    (folder / "model.safetensors").symlink_to(tmp_path / "blobs" / "abc")
    assert "is a broken link" in error_of(Checkpoint, folder)
    sharded = write_checkpoint(tmp_path / "s", random_tensors(), shards=2)
    (sharded / "model-00002-of-00002.safetensors").unlink()
    (sharded / "model-00002-of-00002.safetensors").symlink_to(tmp_path / "blobs" / "def")
    assert "1 of them broken links" in error_of(Checkpoint, sharded)


def test_tensor_missing(tmp_path):
    tensors = random_tensors()
    del tensors["model.layers.1.self_attn.k_norm.weight"]
    folder = write_checkpoint(tmp_path / "m", tensors)
    msg = error_of(Checkpoint, folder)
    assert "lacks 1 tensor" in msg and "model.layers.1.self_attn.k_norm.weight" in msg


def test_tensor_of_the_wrong_shape(tmp_path):
    tensors = random_tensors()
    tensors["model.layers.0.mlp.down_proj.weight"] = np.zeros((16, 25), np.float32)
    msg = error_of(Checkpoint, write_checkpoint(tmp_path / "m", tensors))
    assert "model.layers.0.mlp.down_proj.weight" in msg and "[16, 25]" in msg and "[16, 24]" in msg


def test_checkpoint_of_a_different_config(tmp_path):
    """Weights of a 2-layer model under a config that says 3 layers."""
    folder = write_checkpoint(tmp_path / "m", random_tensors(), config=hf_config(num_hidden_layers=3))
    assert "model.layers.2." in error_of(Checkpoint, folder)


@pytest.mark.parametrize("dtype", ["F32", "F16", "BF16"])
@pytest.mark.parametrize("shards", [1, 2])
def test_dtype_round_trip(tmp_path, dtype, shards):
    torch = pytest.importorskip("torch")
    tensors = random_tensors(seed=3)
    tensors["model.norm.weight"][:4] = [1.0, -0.0, 65504.0, 1e-8]   # exact, signed zero, fp16 max, tiny
    ckpt = Checkpoint(write_checkpoint(tmp_path / "m", tensors, dtype, shards))
    assert ckpt.storage_dtype == dtype
    to_dtype = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}[dtype]
    for name, arr in tensors.items():
        got = ckpt.tensor(name)
        assert got.dtype == np.float32 and got.shape == arr.shape
        # what torch's own (round-to-nearest-even) conversion gives, bit for bit
        want = torch.from_numpy(arr).to(to_dtype).float().numpy()
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), name


def test_non_finite_tensor(tmp_path):
    tensors = random_tensors()
    tensors["model.layers.1.mlp.gate_proj.weight"][3, 5] = np.nan
    tensors["model.layers.0.input_layernorm.weight"][0] = np.inf
    ckpt = Checkpoint(write_checkpoint(tmp_path / "m", tensors, "BF16"))
    assert "non-finite" in error_of(ckpt.tensor, "model.layers.1.mlp.gate_proj.weight")
    assert "non-finite" in error_of(ckpt.tensor, "model.layers.0.input_layernorm.weight")
    assert np.isfinite(ckpt.tensor("model.norm.weight")).all()


def test_a_failed_streamed_write_leaves_no_temporary_and_the_cache_needs_no_home(tmp_path, monkeypatch):
    """A failing write_safetensors_stream (ENOSPC, a bad chunk) left its multi-GB .tmp behind; spot_cache()
    looked the home folder up even with SPOT_CACHE set (a traceback without HOME / passwd entry) and read an
    empty SPOT_CACHE as the current folder; remove_tree silently kept a file."""
    from spot.checkpoint import write_safetensors_stream
    from spot.files import remove_tree, spot_cache

    def chunks(name):
        yield np.zeros(4, np.float32)
        raise OSError(28, "No space left on device")
    with pytest.raises(OSError, match="No space left"):
        write_safetensors_stream(tmp_path / "model.safetensors", {"w": (8,)}, "F32", chunks)
    assert list(tmp_path.iterdir()) == []

    def no_home():
        raise RuntimeError("Could not determine home directory.")
    monkeypatch.setattr(Path, "home", staticmethod(no_home))
    monkeypatch.setenv("SPOT_CACHE", str(tmp_path / "c"))
    assert spot_cache() == tmp_path / "c"
    for unset in (lambda: monkeypatch.setenv("SPOT_CACHE", ""), lambda: monkeypatch.delenv("SPOT_CACHE")):
        unset()
        with pytest.raises(SpotError, match="no home folder to hold the spot cache"):
            spot_cache()
    from spot.export.presets import hf_hub_dir          # a preset's checkpoint is looked for in the HF cache
    for name in ("HF_HUB_CACHE", "HF_HOME"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(SpotError, match="no home folder to hold the Hugging Face cache"):
        hf_hub_dir()
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    assert hf_hub_dir() == tmp_path / "hf" / "hub"
    (tmp_path / "f").write_text("x")
    remove_tree(tmp_path / "f")
    assert not (tmp_path / "f").exists()
