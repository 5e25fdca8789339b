"""The models shipped inside the package (each built by `spot train-target`, with its drafter), by name.

- `code`: a small SDAR target trained on the Python standard library (`embedded` is its older name);
- `arithmetic`: a small SDAR target trained on generated grade-school word problems in GSM8K's format.

A name is accepted wherever a model is named (`--model`, `spot-export NAME`, `spot bench`, the C++ examples
through the exported folder `spot demo` caches). A name wins over a folder of the same name in the current
directory; write `./code` for such a folder.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from spot.errors import SpotError


@dataclass(frozen=True)
class EmbeddedModel:
    name: str
    folder: str                   # under spot/assets/
    about: str                    # what it was trained on, in a few words
    demo_temperature: float       # spot demo's defaults: greedy where the model is right greedily (arithmetic);
    demo_budget: tuple[int, int]  # sampled where greedy text loops (code); the budget its bench favours;
    demo_new_tokens: int          # room for a whole solution (it stops at its end) / a few blocks of code


MODELS = {
    "arithmetic": EmbeddedModel("arithmetic", "arithmetic", "grade-school word problems in GSM8K's format", 0.0,
                                (64, 16), 160),
    "code": EmbeddedModel("code", "embedded", "the Python standard library's sources", 0.7, (16, 8), 64),
}
DEFAULT_MODEL = "code"
EMBEDDED_MODELS = tuple(MODELS)
ALIASES = {"embedded": "code"}


def embedded_name(text) -> str | None:
    """The canonical embedded model name `text` names (case-insensitive, aliases resolved), else None."""
    if not isinstance(text, str):
        return None
    key = text.strip().lower()
    key = ALIASES.get(key, key)
    return key if key in EMBEDDED_MODELS else None


def model_names() -> list[str]:
    """Every name that resolves to an embedded model, aliases included (for help texts and hints)."""
    return [*EMBEDDED_MODELS, *ALIASES]


def model_folder_path(name: str) -> Path:
    """Where the embedded model `name` (a canonical name) lives in the package, built or not (train-target's
    default output)."""
    return Path(__file__).parent / MODELS[name].folder


def embedded_model_dir(name: str = DEFAULT_MODEL) -> Path:
    """The folder of the embedded checkpoint `name`; SpotError if the name is unknown or the model not built."""
    canonical = embedded_name(name)
    if canonical is None:
        raise SpotError(f"no embedded model is named {name!r}, expected one of {', '.join(model_names())}",
                        "pass --model DIR with an SDAR checkpoint or exported folder instead")
    folder = model_folder_path(canonical)
    if not (folder / "config.json").is_file():
        raise SpotError(f"the embedded model {canonical!r} is not built yet ({folder} has no config.json)",
                        f"build it with `spot train-target --corpus {canonical}`, or pass --model DIR with an SDAR "
                        "checkpoint folder")
    return folder
