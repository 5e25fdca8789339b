"""Writing output files whole or not at all: a temporary file in the destination folder, then a rename."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path


def publish(tmp: str | Path, path: str | Path) -> None:
    """Rename a finished temporary file to `path`, readable as a file created there would be: mkstemp makes 0600
    files, an output is shared (0666 less the umask)."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    os.replace(tmp, path)


def write_text_atomic(path: str | Path, text: str) -> None:
    """`text` at `path` (its folder created), or nothing there when writing fails."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        publish(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
