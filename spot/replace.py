"""Replacing an output folder whole (an export, a Triton model, a trained target) so that nothing spot did not write
is deleted and the previous folder is never lost, whenever the process is stopped (docs/decisions.md, "Replacing an
output folder").

  1. Before any work: the path is checked (spot.files.check_output_path, replaced=True), and an existing folder is
     replaced only with --overwrite and only when the writer proves it wrote everything there (`owned`: a manifest's
     file list and hashes, a marker's) — checked again just before the swap.
  2. The new folder is built beside it, in `.NAME.partial-PID` (beside()), removed on any failure.
  3. exchange(): one atomic step, renameat2(RENAME_EXCHANGE) on Linux (renamex_np(RENAME_SWAP) on macOS), puts the
     new folder at NAME and the old one at `.NAME.partial-PID`, which is then removed: NAME names a whole folder, the
     old or the new one, at every instant.
     Where the file system cannot exchange: NAME -> `.NAME.old-PID`, `.NAME.partial-PID` -> NAME, then the old one is
     removed. A process killed between the two renames leaves NAME absent and the old folder at `.NAME.old-PID`: the
     next run writing NAME puts it back first (recover_beside), and an `.old` folder is deleted only while NAME
     holds a folder again.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from spot.errors import SpotError
from spot.files import check_output_path, present, remove_tree

# errors of an exchange the file system or the kernel does not offer: the two renames are used instead
_NO_EXCHANGE = {errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP}
_AT_FDCWD, _RENAME_EXCHANGE, _RENAME_SWAP = -100, 2, 2


def beside(folder: Path, kind: str) -> Path:
    """This process's hidden folder next to `folder` while it is built ("partial") or moved aside ("old")."""
    return folder.parent / f".{folder.name}.{kind}-{os.getpid()}"


def owner_gone(left: Path) -> bool:
    """Whether the process that named `left` (beside(): the pid after the last "-") has ended."""
    pid = left.name.rsplit("-", 1)[-1]
    if not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except (PermissionError, OverflowError):      # another user's live process; not a pid
        return False
    return False


def interrupted_replacement(folder: Path) -> Path | None:
    """The previous `folder` a run killed in the middle of replacing it moved aside (the two-rename fallback), when
    `folder` is absent: recover_beside puts it back."""
    folder = Path(folder)
    if present(folder) or folder.name in ("", ".", ".."):
        return None
    left = [p for p in folder.parent.glob(f".{folder.name}.old-*") if owner_gone(p)]
    return max(left, key=lambda p: p.lstat().st_ctime) if left else None     # (the last one moved aside)


def recover_beside(folder: Path) -> None:
    """Finish what killed runs (SIGKILL, the OOM killer, power loss) left next to `folder`: the previous folder moved
    aside is put back where `folder` is absent, removed where a new one is in place; unfinished new folders are
    removed. Folders of live processes are left alone."""
    folder = Path(folder)
    aside = interrupted_replacement(folder)
    if aside is not None:
        try:
            os.rename(aside, folder)
        except OSError as e:
            raise SpotError(f"{folder} is absent and the previous one is at {aside} (a run was killed while it "
                            f"replaced it), and could not be put back: {e.strerror}",
                            f"rename {aside} to {folder}") from None
    for left in folder.parent.glob(f".{folder.name}.partial-*"):
        if owner_gone(left):
            remove_tree(left)
    for left in folder.parent.glob(f".{folder.name}.old-*"):
        if owner_gone(left) and present(folder):        # never the only copy
            remove_tree(left)


def exchange(a: Path, b: Path) -> bool:
    """Exchange the two existing paths `a` and `b` in one atomic step; False where the OS or the file system cannot
    (then nothing changed). OSError for a refusal (permissions, a busy folder)."""
    if sys.platform.startswith("linux"):
        call = "renameat2"
    elif sys.platform == "darwin":
        call = "renamex_np"
    else:       # pragma: no cover
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    function = getattr(libc, call, None)
    if function is None:        # glibc before 2.28
        return False
    a_name, b_name = os.fsencode(a), os.fsencode(b)
    if call == "renameat2":
        result = function(_AT_FDCWD, a_name, _AT_FDCWD, b_name, ctypes.c_uint(_RENAME_EXCHANGE))
    else:
        result = function(a_name, b_name, ctypes.c_uint(_RENAME_SWAP))
    if result == 0:
        return True
    code = ctypes.get_errno()
    if code in _NO_EXCHANGE:
        return False
    raise OSError(code, os.strerror(code), str(b))


def _remove_quietly(path: Path) -> None:
    """Remove the replaced folder; an interrupt now only leaves it, for the next run (recover_beside) to remove."""
    try:
        remove_tree(path)
    except (KeyboardInterrupt, SystemExit):
        pass


def swap_in_folder(new: Path, folder: Path) -> None:
    """Put the finished folder `new` in place of the existing `folder` (the module's step 3). SpotError when a rename
    is refused (an immutable or busy folder): `folder` is unchanged; `new` is the caller's."""
    try:
        exchanged = exchange(new, folder)
    except OSError as e:
        raise SpotError(f"could not put the new folder in place of {folder}: {e.strerror}",
                        f"{folder} is unchanged; check that it and its parent can be renamed") from None
    if exchanged:
        _remove_quietly(new)            # the old folder, now at the new one's name
        return
    aside = beside(folder, "old")
    remove_tree(aside)              # this process's own, from a replacement interrupted while it removed it
    try:
        os.rename(folder, aside)
        os.rename(new, folder)
    except BaseException as e:
        moved = present(aside)
        if moved and not present(folder):
            os.rename(aside, folder)        # the old one back
        elif moved and isinstance(e, OSError):      # another process put its folder there meanwhile: that one stays
            remove_tree(aside)              # the folder both were replacing, nobody's any more
            raise SpotError(f"another process replaced {folder} while this one was replacing it: {folder} now holds "
                            "that process's", "run again if this run's output is the one wanted") from None
        elif moved:                         # interrupted once the new one was in place
            _remove_quietly(aside)
        if isinstance(e, OSError):
            step = f"move the new folder to {folder}" if moved else f"move {folder} aside to put the new one in place"
            raise SpotError(f"could not {step}: {e.strerror}",
                            f"{folder} is unchanged; check that it and its parent can be renamed") from None
        raise
    _remove_quietly(aside)


def publish_folder(new: Path, folder: Path, owned: Callable[[Path], None]) -> None:
    """Rename the finished folder `new` to `folder`, or swap it in where `folder` exists and owned(folder) passes
    again (it may have changed during the work)."""
    if not present(folder):
        try:
            os.rename(new, folder)
            return
        except OSError as e:
            if not present(folder):
                raise SpotError(f"could not move the new folder to {folder}: {e.strerror}",
                                "check that its parent can be written") from None
    owned(folder)
    swap_in_folder(new, folder)


def replaceable(overwrite: bool, check: Callable[[Path], None], elsewhere: str) -> Callable[[Path], None]:
    """The check of an existing output folder (publish_folder's `owned`): refused without overwrite (the hint: pass
    --overwrite, or `elsewhere`), else check(folder), which refuses what spot cannot prove it wrote there."""
    def owned(folder: Path) -> None:
        if not overwrite:
            raise SpotError(f"{folder} already exists", f"pass --overwrite to replace it, or {elsewhere}")
        check(folder)
    return owned


def output_folder(path: str | Path, what: str) -> Path:
    """The folder an output replaced whole goes to, checked before any work (spot.files.check_output_path,
    replaced=True) — through a link, the folder it points to (the link stays) — with what killed runs left beside it
    recovered first (recover_beside: an absent folder may come back)."""
    path = check_output_path(path, what, folder=True, replaced=True)
    if path.is_symlink():
        path = Path(os.path.realpath(path))
    recover_beside(path)
    return path


@contextmanager
def building(folder: Path) -> Iterator[Path]:
    """The empty folder `.NAME.partial-PID` beside `folder` to build the new one in (what killed runs left there
    recovered first: recover_beside); removed when the block ends without publishing it, and when it raises or is
    interrupted."""
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    recover_beside(folder)
    partial = beside(folder, "partial")
    remove_tree(partial)
    partial.mkdir()
    try:
        yield partial
    except BaseException:
        remove_tree(partial)
        raise
    _remove_quietly(partial)        # (after an exchange: the old folder, if removing it was interrupted)
