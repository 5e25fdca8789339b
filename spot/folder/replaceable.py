"""What in an exported folder spot wrote, and so may delete when it replaces the folder (spot-export --overwrite, the
demo's cache, a Triton model's copy): the manifest, the files it lists with the hashes they still have, and a
drafter pair its drafter.json vouches for — never a file because of its name."""
from __future__ import annotations

from pathlib import Path
from typing import Mapping

from spot.descriptors import read_json
from spot.errors import SpotError
from spot.folder.manifest import DRAFTER_FILES, FILE_RECORDS, FORMAT, MANIFEST_NAME, file_change
from spot.folder.manifest_record import FileRecord, file_records
from spot.owned import drafter_pair_vouched, refuse_unproven, some
from spot.schema import checked

REPLACE_HINT = ("`overwrite` replaces only an earlier spot export: move those out of {out}, or choose another "
                "`out`")


def check_replaceable(out: Path, what: str = "`out`") -> None:
    """SpotError unless `out` is a folder --overwrite may replace: empty, or an export holding only what spot wrote
    there (sort_export). A folder of the user's files (--out ~/projects by mistake) or a file the user added or
    edited (a chat_template.jinja for --chat) was deleted with the old export."""
    if not out.is_dir():
        raise SpotError(f"{what} {out} is a file, expected a folder", "choose another `out`")
    names = sorted(p.name for p in out.iterdir())
    if not names:
        return
    hint = REPLACE_HINT.format(out=out)
    if MANIFEST_NAME not in names:
        raise SpotError(f"{what} {out} is not a spot export (no {MANIFEST_NAME}; it holds {some(names)})", hint)
    manifest = read_json(out / MANIFEST_NAME, hint)       # (any format_version: an older export is spot's too)
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or "files" not in manifest:
        raise SpotError(f"{what} {out}: {MANIFEST_NAME} is not a spot export's manifest (format {FORMAT!r} with "
                        "files)", hint)
    files = file_records(checked(manifest["files"], FILE_RECORDS, f"{out / MANIFEST_NAME}: files", hint))
    refuse_unproven(out, what, sort_export(out, files)[1], hint)


def sort_export(out: Path, files: Mapping[str, FileRecord]) -> tuple[list[str], list[str]]:
    """The names in the exported folder `out` that spot wrote — the manifest, the files it lists (`files`: its
    manifest's) with the hashes they still have, a drafter pair its drafter.json vouches for — and the others (a
    listed file that changed: with how)."""
    drafter_vouched = drafter_pair_vouched(out)
    spots, unproven = [], []
    for name in sorted(p.name for p in out.iterdir()):
        path = out / name
        if name == MANIFEST_NAME or name in DRAFTER_FILES and drafter_vouched:
            spots.append(name)
        elif path.is_dir() and not path.is_symlink() or name not in files:
            unproven.append(name)
        elif (change := file_change(path, files[name])) is not None:
            unproven.append(f"{name} ({change})")
        else:
            spots.append(name)
    return spots, unproven
