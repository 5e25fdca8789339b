"""Files shipped inside the package: the embedded demo model (built by `spot train-target`)."""
from __future__ import annotations

from pathlib import Path

from spot.errors import SpotError


def embedded_model_dir() -> Path:
    """The folder of the small SDAR checkpoint shipped with the package; SpotError if it was not built yet."""
    folder = Path(__file__).parent / "embedded"
    if not (folder / "config.json").is_file():
        raise SpotError(f"the embedded model is not built yet ({folder} has no config.json)",
                        "build it with `spot train-target`, or pass --model DIR with an SDAR checkpoint folder")
    return folder
