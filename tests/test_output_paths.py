"""Outputs never lose data (issue 39): every output path is checked before any work (spot.files.check_output_path),
a folder is replaced recoverably at every instant (spot.replace), only what spot provably wrote is deleted (an
export's manifest, a Triton model's marker, a training report, a drafter.json, a bench.json)."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from contextlib import contextmanager
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spot.cli import main
from spot.errors import SpotError
from spot.export.export import export_checkpoint
from spot.export.options import ExportOptions
from spot.export.presets import resolve_source
from spot.files import check_output_path, write_text_atomic
from spot.folder.manifest import load_manifest

FEW = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def export(checkpoint: Path, out, **kw) -> Path:
    return export_checkpoint(resolve_source(str(checkpoint)), out, ExportOptions(dtype="fp32", validate=False, **kw))


def run(*args: str):
    return CliRunner().invoke(main, list(args))


def snapshot(root: Path) -> dict[str, bytes | str]:
    """Every entry below `root`: a file's bytes, a link's target, a folder's mark (links not followed)."""
    found = {}
    for top, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(top) / name
            rel = str(path.relative_to(root))
            found[rel] = os.readlink(path) if path.is_symlink() else "<dir>" if path.is_dir() else path.read_bytes()
    return found


def hidden_beside(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.parent.iterdir() if p.name.startswith(f".{folder.name}."))


# -- the replacement protocol: recoverable at every instant ---------------------------------------------------------
def killed_child(kill, exchanges: bool, midway: bool, work) -> tuple[int, bool]:
    """Run work() in a child process that dies without any cleanup (os._exit, as SIGKILL or a power loss would)
    just before the file system step of the replacement — an exchange, a rename, a removal (midway: one file of it
    removed first) — for which kill(step number, its arguments) is true, with the OS's atomic exchange or without
    it. Returns (the child's pid, whether work() finished)."""
    from spot import replace as replace_mod
    pid = os.fork()
    if pid == 0:        # pragma: no cover - the child
        try:
            done = [0]

            def counted(operation, removal=False):
                def step_then(*args, **kwargs):
                    if kill(done[0], args):
                        if removal and midway:
                            files = [Path(t) / f for t, _, fs in os.walk(args[0]) for f in fs]
                            if files:
                                files[0].unlink()
                        os._exit(9)
                    done[0] += 1
                    return operation(*args, **kwargs)
                return step_then
            replace_mod.exchange = counted(replace_mod.exchange if exchanges else lambda a, b: False)
            os.rename = counted(os.rename)
            replace_mod.remove_tree = counted(replace_mod.remove_tree, removal=True)
            work()
        except BaseException:
            os._exit(1)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    return pid, os.waitstatus_to_exitcode(status) == 0


def renaming_the_new_one_in(step: int, args: tuple) -> bool:
    """The rename window: the old folder is aside, the new one not yet in place."""
    return len(args) == 2 and ".partial-" in Path(args[0]).name and not os.path.lexists(args[1])


def write_tree(folder: Path, files: dict[str, bytes]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)


contents = st.dictionaries(st.text("abcxyz._-", min_size=1, max_size=8).filter(lambda n: n not in (".", "..")),
                           st.binary(max_size=64), min_size=1, max_size=4)


@FEW
@given(old=contents, new=contents, step=st.integers(0, 8), exchanges=st.booleans(), midway=st.booleans())
def test_a_replacement_killed_at_any_step_keeps_the_old_folder_or_the_new_one(tmp_path_factory, old, new, step,
                                                                              exchanges, midway):
    """The rename window: killed after `out` was moved aside and before the new one was renamed in, a run left `out`
    absent and the old folder only under a hidden name, which the next run deleted. Now, killed at any step (with
    renameat2's exchange or with the two renames), `out` holds the old folder or the new one whole, or is absent
    with the old one at .out.old-PID; the next run (recover_beside) puts that back and never deletes it."""
    from spot.replace import building, publish_folder, recover_beside
    root = tmp_path_factory.mktemp("swap")
    out = root / "out"
    old, new = {**old, "who": b"old"}, {**new, "who": b"new"}        # (the snapshots of the two folders)
    write_tree(out, old)

    def replace_it():
        with building(out) as tmp:
            write_tree(tmp, new)
            publish_folder(tmp, out, lambda folder: None)
    pid, finished = killed_child(lambda done, args: done == step, exchanges, midway, replace_it)
    state = snapshot(out) if os.path.lexists(out) else None
    if state is not None:
        assert state in (old, new)
    else:
        assert snapshot(root / f".out.old-{pid}") == old
    recover_beside(out)                 # what the next run writing `out` does first
    assert snapshot(out) == (new if finished else old if state is None else state)
    assert hidden_beside(out) == []


def test_an_export_killed_in_the_rename_window_is_restored_by_the_next_run(tiny_ckpt, tmp_path):
    """The named case on the exporter itself, without an atomic exchange: killed between its two renames, the next
    spot-export puts the older export back (and refuses to replace it without --overwrite) instead of deleting it."""
    out = export(tiny_ckpt, tmp_path / "out")
    before = snapshot(out)
    pid, finished = killed_child(renaming_the_new_one_in, False, False, lambda: export(tiny_ckpt, out, overwrite=True))
    assert not finished and not os.path.lexists(out) and snapshot(tmp_path / f".out.old-{pid}") == before
    with pytest.raises(SpotError, match="a run replacing it was killed") as said:     # a reader meanwhile: told
        load_manifest(out)
    assert f"rename {tmp_path / f'.out.old-{pid}'} to {out}" in said.value.hint
    with pytest.raises(SpotError, match="already exists"):
        export(tiny_ckpt, out)
    assert snapshot(out) == before and load_manifest(out, "full") and hidden_beside(out) == []


def test_a_run_killed_during_the_exchange_window_of_triton_repo_and_upgrade_is_recovered(tiny_onnx, tmp_path):
    """The same protocol in every writer that replaces a folder: spot triton-repo's model folder, spot
    upgrade-export's folder."""
    from spot.replace import recover_beside
    from spot.export.upgrade import upgrade_export
    from spot.triton.repo import TritonRepoOptions, write_triton_repo
    repo = tmp_path / "repo"
    write_triton_repo(tiny_onnx, repo, TritonRepoOptions())
    before = snapshot(repo / "spot")
    _, finished = killed_child(renaming_the_new_one_in, False, False,
                               lambda: write_triton_repo(tiny_onnx, repo, TritonRepoOptions(overwrite=True)))
    assert not finished and not os.path.lexists(repo / "spot")
    with pytest.raises(SpotError, match="already exists"):
        write_triton_repo(tiny_onnx, repo, TritonRepoOptions())
    assert snapshot(repo / "spot") == before
    write_triton_repo(tiny_onnx, repo, TritonRepoOptions(overwrite=True, instances=2))
    assert "count: 2" in (repo / "spot" / "config.pbtxt").read_text() and hidden_beside(repo / "spot") == []
    folder = tmp_path / "upgraded"
    shutil.copytree(tiny_onnx, folder)
    before = snapshot(folder)
    _, finished = killed_child(renaming_the_new_one_in, False, False,
                               lambda: upgrade_export(folder, 2, progress=lambda _: None))
    assert not finished and not os.path.lexists(folder)
    recover_beside(folder)
    assert snapshot(folder) == before
    manifest, changed = upgrade_export(folder, 2, progress=lambda _: None)
    assert changed and manifest.graphs.epilogue.future_steps == 2 and load_manifest(folder, "full")


# -- output paths: checked before any work --------------------------------------------------------------------------
@contextmanager
def scratch_cwd(root: Path):
    """`root/top/dir` as the current folder, `root/top` laid out with what output paths meet: a file, a folder with
    a user's file, a link to each, a link to nothing (the paths' ".." stay inside `root`)."""
    top = root / "top"
    (top / "dir").mkdir(parents=True)
    (top / "dir" / "notes.txt").write_text("the user's")
    (top / "a-file").write_text("the user's")
    (top / "link-dir").symlink_to(top / "dir")
    (top / "link-file").symlink_to(top / "a-file")
    (top / "dangling").symlink_to(top / "nowhere")
    before = os.getcwd()
    os.chdir(top / "dir")
    try:
        yield
    finally:
        os.chdir(before)


NAMES = ("a-file", "dir", "new", "link-dir", "link-file", "dangling", "notes.txt")
paths = st.tuples(st.sampled_from(["", ".", "..", "../.."]), st.lists(st.sampled_from(NAMES), max_size=3),
                  st.booleans()).map(lambda t: (t[0], t[1], t[2]))


def path_text(lead: str, names: list[str], absolute: bool, root: Path) -> str:
    text = "/".join([p for p in [lead, *names] if p])
    return str(root / "top" / "dir" / text) if absolute and text else text


def must_refuse(text: str, kind: str) -> str | None:
    """The words a refusal of `text` must hold, for the cases the issue names, whatever else is refused."""
    if text == "":
        return "is empty"
    here = Path(os.getcwd())
    real = Path(os.path.realpath(text))
    if kind == "replaced" and (real == here or real in here.parents):
        return "the current folder"
    parts = Path(text).parts
    for i in range(1, len(parts)):
        prefix = Path(*parts[:i])
        if prefix.is_symlink() and not prefix.exists():
            return "which does not exist"
        if prefix.exists() and not prefix.is_dir():
            return "is a file, expected a folder (the path goes through it)"
    return None


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shape=paths, kind=st.sampled_from(["file", "folder", "replaced"]))
def test_an_output_path_is_refused_before_any_work_or_can_be_written(tmp_path_factory, shape, kind):
    """Random output paths — "", ".", "..", through a file, through a link to nothing, existing files and folders
    with a user's file, links: the shared check refuses (a SpotError naming the problem, nothing written) or the
    output can then be written there (a file atomically, a folder written into, a folder replaced whole)."""
    from spot.replace import building, output_folder, publish_folder
    root = tmp_path_factory.mktemp("paths")
    with scratch_cwd(root):
        text = path_text(*shape, root)
        before = snapshot(root)
        expected = must_refuse(text, kind)
        try:
            check_output_path(text, "--out", folder=kind != "file", replaced=kind == "replaced")
        except SpotError as e:
            assert snapshot(root) == before, "a refusal wrote something"
            assert expected is None or expected in e.message, (text, kind, e.message)
            assert "another spot process" not in str(e)
            return
        assert expected is None, (text, kind, expected)
        if kind == "file":
            write_text_atomic(text, "out")
            assert Path(text).read_text() == "out"
        elif kind == "folder":
            Path(text).mkdir(parents=True, exist_ok=True)
            write_text_atomic(Path(text) / "out.json", "out")
        else:
            out = output_folder(text, "--out")
            with building(out) as tmp:
                (tmp / "out.json").write_text("out")
                publish_folder(tmp, out, lambda folder: None)
            assert (out / "out.json").read_text() == "out" and hidden_beside(out) == []


@pytest.mark.parametrize("out, words", [
    ("", "--out is empty"),
    (".", "is the current folder"),
    ("a-file/sub", "a-file is a file, expected a folder (the path goes through it)"),
    ("dangling/sub", "is a link to"),
])
def test_spot_export_refuses_a_bad_out_before_any_work(tiny_ckpt, tmp_path, monkeypatch, out, words):
    """--out "" wrote ./NAME-fp32-onnx into the current folder, --out . --overwrite (in an empty folder) failed only
    after a whole export, --out a-file/sub after the model loaded with the hint "another spot process?": each is
    refused before the checkpoint is read, naming the problem."""
    import spot.export.export as export_mod
    (tmp_path / "a-file").write_text("the user's")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    monkeypatch.chdir(tmp_path / "empty" if out == "." else tmp_path)
    monkeypatch.setattr(export_mod, "Checkpoint", lambda *a: pytest.fail("the export started"))
    before = snapshot(tmp_path)
    r = run("export", str(tiny_ckpt), "--out", out, "--overwrite", "--quiet")
    assert r.exit_code == 2 and "error: --out" in r.stderr and words in r.stderr, r.output
    assert "another spot process" not in r.stderr and snapshot(tmp_path) == before


@pytest.mark.parametrize("command", [
    ["triton-repo", "{export}", "--out", "{out}"],
    ["train-target", "--out", "{out}", "--steps", "1"],
    ["build-engine", "{export}", "--out", "{out}"],
    ["traces", "--model", "{export}", "--backend", "ort", "--prompts", "{prompts}", "--out", "{out}"],
    ["bench", "--model", "{export}", "--backend", "ort", "--report", "{out}"],
])
@pytest.mark.parametrize("out, words", [("", "is empty"), ("a-file/sub", "a-file is a file, expected a folder")])
def test_every_writer_refuses_a_bad_output_path_before_the_work(tiny_onnx, tmp_path, monkeypatch, command, out, words):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a-file").write_text("the user's")
    prompts = tiny_onnx.parent / "prompts.jsonl"
    prompts.write_text('{"ids": [1, 2, 3]}\n')
    args = [a.format(export=tiny_onnx, out=out, prompts=prompts) for a in command]
    if command[0] == "train-target":
        import spot.training.target as target
        monkeypatch.setattr(target, "build_data", lambda *a: pytest.fail("the training started"))
    r = run(*args)
    assert r.exit_code == 2 and words in r.stderr and "Traceback" not in r.output, r.output
    assert "another spot process" not in r.stderr and sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


# -- deleting only what spot provably wrote --------------------------------------------------------------------------
USER_FILES = ("generation_config.json", "chat_template.jinja", ".stamp", ".spot-notes", "manifest.json.tmp",
              "drafter.json", "drafter.onnx", "notes.txt")


@FEW
@given(added=st.dictionaries(st.sampled_from(USER_FILES), st.binary(min_size=1, max_size=16), max_size=3),
       edited=st.sets(st.sampled_from(["config.json", "tokenizer.json", "tokenizer_config.json", "kv_append.onnx"]),
                      max_size=2))
def test_overwrite_replaces_an_export_only_when_every_file_is_vouched_for(tiny_onnx, tmp_path_factory, added, edited):
    """--overwrite deleted files by name: a user's generation_config.json or chat_template.jinja (added so that --chat
    works), .stamp, .spot-*. Now a file is spot's only when the manifest lists it with the hash it still has (a
    drafter pair: when its drafter.json vouches for it): anything added or edited is refused, left in place."""
    from spot.folder.replaceable import check_replaceable
    out = tmp_path_factory.mktemp("exp") / "out"
    shutil.copytree(tiny_onnx, out)
    for name, data in added.items():
        (out / name).write_bytes(data)
    for name in edited:
        (out / name).write_bytes((out / name).read_bytes() + b" ")
    before = snapshot(out)
    if not added and not edited:
        check_replaceable(out)
        return
    with pytest.raises(SpotError, match="holds what spot did not write") as e:
        check_replaceable(out)
    assert all(name in e.value.message for name in sorted({*added, *edited})[:3]) and snapshot(out) == before


def test_overwrite_keeps_the_users_files_and_replaces_a_vouched_export(tiny_ckpt, tmp_path):
    """End to end: a chat_template.jinja the user added beside an export stops --overwrite (before the export, the
    file kept); once it is gone the export, with a drafter pair spot wrote, is replaced."""
    out = export(tiny_ckpt, tmp_path / "out")
    (out / "chat_template.jinja").write_text("{{ the user's template }}")
    r = run("export", str(tiny_ckpt), "--out", str(out), "--overwrite", "--quiet", "--no-validate", "--dtype", "fp32")
    assert r.exit_code == 2 and "chat_template.jinja" in r.stderr and "hint: --overwrite replaces only" in r.stderr
    assert (out / "chat_template.jinja").read_text() == "{{ the user's template }}"
    (out / "chat_template.jinja").unlink()
    (out / "drafter.onnx").write_bytes(b"a drafter")
    (out / "drafter.json").write_text(json.dumps({"format": "spot-drafter", "format_version": 1,
                                                  "onnx_sha256": hashlib.sha256(b"a drafter").hexdigest()}))
    assert export(tiny_ckpt, out, overwrite=True) == out and not (out / "drafter.onnx").exists()


def test_triton_repo_overwrites_only_its_own_model_folder(tiny_onnx, tmp_path):
    """--overwrite replaced the whole repository, every other model in it with it. Now it writes REPO/NAME beside
    the repository's other entries and replaces only a model folder its marker vouches for, unchanged."""
    repo = tmp_path / "repo"
    (repo / "other" / "1").mkdir(parents=True)
    (repo / "other" / "config.pbtxt").write_text('name: "other"')
    (repo / "README").write_text("the user's")
    others = {k: v for k, v in snapshot(repo).items()}
    assert run("triton-repo", str(tiny_onnx), "--out", str(repo)).exit_code == 0
    assert run("triton-repo", str(tiny_onnx), "--out", str(repo), "--name", "second").exit_code == 0
    assert run("triton-repo", str(tiny_onnx), "--out", str(repo), "--overwrite", "--instances", "2").exit_code == 0
    after = snapshot(repo)
    assert {k: after[k] for k in others} == others and "count: 2" in (repo / "spot" / "config.pbtxt").read_text()
    assert (repo / "second" / "config.pbtxt").is_file() and hidden_beside(repo / "spot") == []
    for damage, where in [(lambda m: (m / "config.pbtxt").write_text("tuned by hand"), "config.pbtxt"),
                          (lambda m: (m / "2").mkdir(), "2"),
                          (lambda m: (m / "1" / "export" / "notes.txt").write_text("x"), "notes.txt"),
                          (lambda m: (m / ".spot-triton-model").unlink(), "not a model folder spot triton-repo")]:
        model = repo / "second"
        damage(model)
        before = snapshot(model)
        r = run("triton-repo", str(tiny_onnx), "--out", str(repo), "--name", "second", "--overwrite")
        assert r.exit_code == 2 and where in r.stderr, r.output
        assert snapshot(model) == before
        shutil.rmtree(model)
        assert run("triton-repo", str(tiny_onnx), "--out", str(repo), "--name", "second").exit_code == 0
    r = run("triton-repo", str(tiny_onnx), "--out", str(repo), "--name", "other", "--overwrite")
    assert r.exit_code == 2 and "not a model folder spot triton-repo wrote" in r.stderr
    assert {k: snapshot(repo)[k] for k in others} == others


def test_triton_repo_copies_only_the_exports_own_files(tiny_onnx, tmp_path):
    """A note the user keeps in the exported folder is not copied into the repository (where --overwrite would
    then have to delete it)."""
    folder = tmp_path / "export"
    shutil.copytree(tiny_onnx, folder)
    (folder / "notes.txt").write_text("the user's")
    assert run("triton-repo", str(folder), "--out", str(tmp_path / "repo")).exit_code == 0
    assert not (tmp_path / "repo" / "spot" / "1" / "export" / "notes.txt").exists()
    assert load_manifest(tmp_path / "repo" / "spot" / "1" / "export", "full")


def test_train_target_replaces_only_files_its_report_vouches_for(tmp_path, monkeypatch):
    """--out an SDAR checkpoint (or any folder holding a config.json) lost that config.json and the weights at the
    end of the training. Now the files a training replaces must be listed with their sha256 in the folder's
    training_report.json (or be the package's shipped model): refused before the training otherwise."""
    import spot.training.target as target
    from spot.training.target import check_target_replaceable
    tiny_ckpt = tmp_path / "SDAR-checkpoint"
    tiny_ckpt.mkdir()
    (tiny_ckpt / "config.json").write_text('{"model_type": "sdar"}')
    monkeypatch.setattr(target, "build_data", lambda *a: pytest.fail("the training started"))
    r = run("train-target", "--out", str(tiny_ckpt), "--steps", "1")
    assert r.exit_code == 2 and "config.json" in r.stderr and "training_report.json" in r.stderr, r.output
    assert (tiny_ckpt / "config.json").read_text() == '{"model_type": "sdar"}'
    mine = tmp_path / "trained"
    mine.mkdir()
    (mine / "config.json").write_text("{}")
    (mine / "model.safetensors").write_bytes(b"w")
    (mine / "notes.txt").write_text("carried over, never replaced")
    report = {"files": {"config.json": hashlib.sha256(b"{}").hexdigest(),
                        "model.safetensors": hashlib.sha256(b"w").hexdigest()}}
    (mine / "training_report.json").write_text(json.dumps(report))
    check_target_replaceable(mine)
    (mine / "config.json").write_text('{"edited": true}')
    with pytest.raises(SpotError, match=r"holds what spot did not write .*config\.json"):
        check_target_replaceable(mine)
    from spot.assets import model_folder_path
    check_target_replaceable(model_folder_path("code"))      # the package's own, shipped before reports listed files
