"""Writing output files whole or not at all: a temporary file in the destination folder, then a rename; and checking
an output path before the work that fills it."""
from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, TypeVar

from spot.errors import SpotError

T = TypeVar("T")
TEMP_PREFIX = ".spot-"      # short: a legal 255-byte name must not grow past the limit as its temporary

try:
    import fcntl
except ImportError:       # pragma: no cover - Windows: no lock (concurrent runs are not coordinated there)
    fcntl = None


def plain_file_name(name: str) -> bool:
    """True for the name of a file in a folder itself: no separator, not "", "." or ".." (a name a descriptor gives
    must never lead out of its folder, nor hold a NUL, which would cut it wherever it reaches C)."""
    return Path(name).name == name and name not in ("", ".", "..") and "\0" not in name


def spot_cache() -> Path:
    """$SPOT_CACHE, else ~/.cache/spot: exports of the embedded model, engine caches, tuned budgets."""
    if os.environ.get("SPOT_CACHE"):
        return Path(os.environ["SPOT_CACHE"])
    try:
        return Path.home() / ".cache" / "spot"
    except RuntimeError:        # HOME unset and a user with no passwd entry
        raise SpotError("no home folder to hold the spot cache (HOME is unset)",
                        "set SPOT_CACHE (or HOME) to a writable folder") from None


def present(path: str | Path) -> bool:
    """Whether anything (a folder, a file, a link, even a dangling one) is at `path`."""
    path = Path(path)
    return path.exists() or path.is_symlink()


def remove_tree(path: Path) -> None:
    """A folder with its contents, or a link (rmtree refuses links, silently with ignore_errors)."""
    if path.is_symlink() or path.is_file():
        path.unlink(missing_ok=True)
    else:
        shutil.rmtree(path, ignore_errors=True)


def folder_bytes(folder: Path) -> int:
    """The bytes of the files directly in `folder` (links not followed)."""
    return sum(f.stat().st_size for f in Path(folder).iterdir() if f.is_file() and not f.is_symlink())


def folder_identity(folder: str | Path) -> tuple[int, int] | None:
    """(device, inode) of what the path names now, None when absent: a folder replaced by rename, or a link
    re-pointed, names another one."""
    try:
        st = os.stat(folder)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def opened_whole(folder: str | Path, open_folder: Callable[[], T]) -> T:
    """open_folder(), run again once when `folder` named another folder by the end of it (replaced by rename, the way
    docs/deployment.md recommends, or a link re-pointed): what it read may mix both folders' files — a manifest with
    the other's graphs — which reads as a damaged folder, or passes unchecked."""
    for attempt in (0, 1):
        before = folder_identity(folder)
        try:
            opened = open_folder()
        except SpotError:
            if attempt == 0 and folder_identity(folder) != before:
                continue
            raise
        if attempt == 0 and folder_identity(folder) != before:
            continue
        return opened
    raise AssertionError("unreachable")


def publish(tmp: str | Path, path: str | Path) -> None:
    """Rename a finished temporary file to `path`, readable as a file created there would be: mkstemp makes 0600
    files, an output is shared (0666 less the umask)."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    os.replace(tmp, path)


@contextmanager
def exclusive_lock(path: str | Path, waiting: Callable[[], None] | None = None) -> Iterator[None]:
    """Hold an exclusive lock on the file `path` (created; it stays) for the block: concurrent processes that share
    a cache take turns at a read-modify-write or a first-time build. Released when the block ends or the process
    dies. waiting(): called once when another process holds it (say why this one waits)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as lock:
        if fcntl is not None:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if waiting is not None:
                    waiting()
                fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@contextmanager
def atomic_output(path: str | Path, suffix: str = "") -> Iterator[Path]:
    """A temporary path in `path`'s folder (created) to write; renamed to `path` when the block ends normally,
    removed when it raises or is interrupted. suffix: for writers that choose the format by extension (.npz, .png)."""
    path = Path(os.path.realpath(path)) if Path(path).is_symlink() else Path(path)   # write through a link
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=TEMP_PREFIX, suffix=suffix)
    os.close(fd)
    try:
        yield Path(tmp)
        publish(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text_atomic(path: str | Path, text: str) -> None:
    """`text` at `path` (its folder created), or nothing there when writing fails."""
    with atomic_output(path) as tmp:
        tmp.write_text(text)


def refuse_dangling_link(path: str | Path, what: str) -> Path:
    """SpotError when `path` is a symbolic link to nothing (writing through it fails, after the work)."""
    path = Path(path)
    if path.is_symlink() and not path.exists():
        raise SpotError(f"{what} {path} is a link to {os.readlink(path)}, which does not exist",
                        "remove the link or point it at an existing place, or choose another path")
    return path


def check_output_path(path: str | Path, what: str, folder: bool = False, replaced: bool = False) -> Path:
    """Refuse now, not after the work, an output path that cannot be written: "" (which would name the current
    folder), a link to nothing, a name too long, a folder where a file goes (or a file where a folder goes,
    folder=True), a file where the path needs a folder (`a-file/sub`), a place where no file can be created (probed
    in the nearest existing folder: nothing is left behind). replaced: a folder swapped in whole by rename
    (spot.replace), which needs a name of its own: not ".", "..", the current folder or a folder holding it.
    Returns the path."""
    if str(path) == "":
        raise SpotError(f"{what} is empty (\"\"), expected a {'folder' if folder else 'file'} name",
                        f"name the output, e.g. {what} {'NAME' if folder else 'out.json'}")
    path = Path(path)
    if replaced:
        check_own_name(path, what)
    try:
        existing = next(p for p in path.absolute().parents if p.exists())
        limit = os.pathconf(existing, "PC_NAME_MAX")
        if len(path.name.encode()) > limit:
            raise SpotError(f"{what} {path}: the name has {len(path.name.encode())} bytes, this file system allows "
                            f"{limit}", "choose a shorter name")
        for step in [*reversed(path.absolute().parents), path]:
            refuse_dangling_link(step, what if step == path else f"{what} {path}: the folder")
            if step != path and step.exists() and not step.is_dir():
                raise SpotError(f"{what} {path}: {step} is a file, expected a folder (the path goes through it)",
                                f"choose a path whose folders are folders, or move {step} away")
        if folder and path.exists() and not path.is_dir():
            raise SpotError(f"{what} {path} is a file, expected a folder", "choose another path")
        if not folder and path.is_dir():
            raise SpotError(f"{what} {path} is a folder, expected a file name", "add a file name to the path")
        where = path if folder and path.is_dir() else path.parent if path.parent.is_dir() else existing
        fd, probe = tempfile.mkstemp(dir=where, prefix=TEMP_PREFIX)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise SpotError(f"cannot write {what} {path}: {e.strerror or e}",
                        "choose a path in a folder you can write to") from None
    return path


def check_own_name(path: Path, what: str) -> None:
    """SpotError unless `path` names a folder that can be renamed into place: not the current folder (".", "",
    "sub/..") nor one holding it (".." or "/"), where a rename would move the folder the shell is in."""
    here = Path(os.path.realpath(os.getcwd()))
    real = Path(os.path.realpath(path))
    if real == here:
        raise SpotError(f"{what} {path} is the current folder: the output folder is built beside it and renamed "
                        "into its place, which the folder a shell is in cannot be",
                        f"name it from its parent: cd .. and pass {what} {real.name}, or name a new folder")
    if real in here.parents:
        raise SpotError(f"{what} {path} is {real}, which holds the current folder: replacing it would move the "
                        "folder a shell is in", f"name a new folder, e.g. {what} NAME")
