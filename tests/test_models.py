"""spot.app.models: --model NAME|FOLDER and --backend resolved to a folder and a backend, the folder checked first, its
drafter found, an export verified."""
import json
import shutil
from pathlib import Path

import pytest

import spot.assets
from spot.errors import SpotError
from spot.app.models import (check_model_folder, drafter_file, find_drafter, model_folder, open_model, resolve_backend,
                         verify_export)


def test_the_backend_follows_what_the_model_folder_is(tmp_path, monkeypatch, tiny_ckpt):
    export = tmp_path / "export"
    export.mkdir()
    (export / "manifest.json").write_text("{}")
    assert resolve_backend(None, str(export)) == "ort"
    assert resolve_backend(None, str(tiny_ckpt)) == "torch"
    assert resolve_backend("tensorrt", str(tiny_ckpt)) == "tensorrt"       # --backend wins
    # an embedded model (none given, or its name) runs on ONNX Runtime where it is installed, else on torch
    import importlib.util
    real = importlib.util.find_spec
    for name in (None, "code", "Arithmetic", "embedded"):
        assert resolve_backend(None, name) == "ort"
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "onnxruntime" else real(n, *a))
    assert resolve_backend(None, None) == "torch" and resolve_backend(None, "code") == "torch"


def test_a_folder_is_itself_and_a_name_is_the_embedded_checkpoint_on_torch(tiny_ckpt, monkeypatch):
    assert model_folder("torch", str(tiny_ckpt)) == str(tiny_ckpt)
    assert model_folder("ort", "./code") == "./code"          # a path, not the name
    monkeypatch.setattr(spot.assets, "embedded_model_dir", lambda name="code": Path(f"/embedded/{name}"))
    assert model_folder("torch", None) == Path("/embedded/code")
    assert model_folder("torch", "Arithmetic") == Path("/embedded/arithmetic")


def test_an_older_embedded_export_is_used_where_none_can_be_made(tmp_path, monkeypatch):
    """Without the export extra a cached export of another version still decodes, with one note saying so; with no
    export there at all the missing package is the error."""
    import spot.app.demo
    monkeypatch.setattr(spot.app.demo, "embedded_export_dir", lambda name: tmp_path / name)

    def no_torch(progress, name):
        progress("exporting")
        raise ModuleNotFoundError("No module named 'torch'", name="torch")
    monkeypatch.setattr(spot.app.demo, "exported_embedded", no_torch)
    with pytest.raises(ModuleNotFoundError):
        model_folder("ort", "code")
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "manifest.json").write_text("{}")
    said, notes = [], []
    assert model_folder("ort", "code", said.append, notes.append) == tmp_path / "code"
    assert said == ["exporting"] and len(notes) == 1
    assert notes[0].startswith(f"note: {tmp_path / 'code'} was exported from another version") and "torch" in notes[0]


def test_the_folder_is_checked_as_its_backend_reads_it(tmp_path, tiny_ckpt):
    check_model_folder("torch", tiny_ckpt)
    with pytest.raises(SpotError, match="config.json"):
        check_model_folder("torch", tmp_path)
    with pytest.raises(SpotError, match="manifest"):        # an export is checked by its manifest, not its config
        check_model_folder("ort", tiny_ckpt)


def test_the_drafter_is_the_one_given_else_the_one_beside_the_model(tmp_path, embedded_export):
    _, folder = embedded_export
    assert find_drafter(None, folder).path == folder / "drafter.onnx"
    assert find_drafter(str(folder), tmp_path).path == folder / "drafter.onnx"       # --drafter FOLDER
    with pytest.raises(SpotError, match=f"no drafter given and none found at {tmp_path / 'drafter.onnx'}") as e:
        find_drafter(None, tmp_path)
    assert "--drafter PATH" in e.value.hint
    # a server: the one named (loaded now), the one beside the model, or none (spot / spot-sets refused)
    assert drafter_file(None, folder) == folder / "drafter.onnx" and drafter_file(None, tmp_path) is None
    assert drafter_file(str(folder / "drafter.onnx"), tmp_path) == folder / "drafter.onnx"
    with pytest.raises(SpotError):
        drafter_file(str(tmp_path / "drafter.onnx"), folder)


def test_open_model_gives_the_engine_its_tokenizer_and_folder(embedded_export):
    _, folder = embedded_export
    engine, tokenizer, where = open_model("ort", str(folder), None, "cpu", "host", "host")
    assert Path(where) == folder and tokenizer is not None and engine.block_size > 0
    assert engine.placement["kv_cache"] == "host"


def test_verify_export_checks_the_files_and_the_drafter_pair(tmp_path, embedded_export):
    _, source = embedded_export
    folder = tmp_path / "copy"
    shutil.copytree(source, folder)
    files, total, drafter = verify_export(folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    assert files == len(manifest["files"]) and total == sum(r["bytes"] for r in manifest["files"].values())
    assert drafter is True
    descriptor = json.loads((folder / "drafter.json").read_text())
    (folder / "drafter.json").write_text(json.dumps({**descriptor, "block_size": descriptor["block_size"] * 2}))
    with pytest.raises(SpotError, match="block size") as e:
        verify_export(folder, quick=True)
    assert "train a drafter for this export" in e.value.hint
    for name in ("drafter.onnx", "drafter.json"):
        (folder / name).unlink()
    with pytest.raises(SpotError, match="was exported with a drafter, and drafter.onnx is missing"):
        verify_export(folder, quick=True)
