"""One training batch of the block-diffusion objective, whichever corpus it came from."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Batch:
    x0: np.ndarray                    # int64 [N, L]: clean tokens, L a multiple of the block size
    eligible: np.ndarray | None       # bool [N, L]: the positions that may be masked and are scored (None: all)
    weight: np.ndarray | None = None  # float32 [N, L]: each position's weight in the loss when scored (None: all 1)
