"""Write tests/data/noise_vectors.json: test vectors of spot.runtime.noise (docs/noise.md).

Run once after a deliberate change of the noise definition (which changes every seeded output):
    python scripts/make_noise_vectors.py [--out FILE]
Each vector: the five counters -> the two hash words a, b, the 53-bit integer k, u and g as float.hex() strings.
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

from spot.runtime.noise import LANE_A, LANE_B, U32_MAX, lane_prefix, mix32, uniform_from_words

OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "noise_vectors.json"


def counters() -> list[tuple[int, int, int, int, int]]:
    m = U32_MAX
    fixed = [(0, 0, 0, 0, 0), (m, m, m, m, m), (0, 0, 0, 0, m), (m, 0, 0, 0, 0), (0, m, 0, 0, 0), (0, 0, m, 0, 0),
             (0, 0, 0, m, 0), (1, 2, 3, 4, 5), (42, 7, 0, 31, 151935), (42, 7, 1, 31, 151935),
             (0, 0, 0, 0, 151669), (2**31, 2**31 - 1, 2**16, 2**15, 2**31)]
    rng = np.random.default_rng(20240601)
    typical = [(int(rng.integers(0, 4)), int(rng.integers(0, 64)), int(rng.integers(0, 32)),
                int(rng.integers(0, 32)), int(rng.integers(0, 151936))) for _ in range(24)]
    wide = [tuple(int(v) for v in rng.integers(0, 2**32, 5, dtype=np.uint64)) for _ in range(20)]
    # a few whose second log, log(-log(u)), takes glibc's near-1 polynomial path (-log(u) in [0.9375, 1.0647))
    near = []
    for token in range(100000):
        u = uniform_from_words(*(mix32(lane_prefix(lane, 5, 1, 2, 3) ^ np.uint32(token)) for lane in (LANE_A, LANE_B)))
        if 0.9375 <= -np.log(u) < 1.0 + 0x109 / 2**12 and len(near) < 4:
            near.append((5, 1, 2, 3, token))
    return fixed + typical + wide + near


def vector(seed: int, block: int, step: int, position: int, token: int) -> dict:
    tok = np.uint32(token)
    a = mix32(lane_prefix(LANE_A, seed, block, step, position) ^ tok)
    b = mix32(lane_prefix(LANE_B, seed, block, step, position) ^ tok)
    k = (int(a) >> 5) * 2**26 + (int(b) >> 6)
    u = float(uniform_from_words(np.asarray(a), np.asarray(b)))
    g = -math.log(-math.log(u))          # the C library's log, as the definition says (not numpy's SIMD one)
    return {"seed": seed, "block": block, "step": step, "position": position, "token": token,
            "a": int(a), "b": int(b), "k": k, "u": u.hex(), "g": g.hex()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])     # --help prints, writes nothing
    ap.add_argument("--out", type=Path, default=OUT, help=f"default: {OUT}")
    out = ap.parse_args().out
    vectors = [vector(*c) for c in counters()]
    doc = {"definition": "spot.runtime.noise (docs/noise.md); u and g as Python float.hex()",
           "generator": "scripts/make_noise_vectors.py", "vectors": vectors}
    out.parent.mkdir(parents=True, exist_ok=True)
    lines = ",\n".join("  " + json.dumps(v) for v in vectors)      # one vector per line
    head = json.dumps({k: v for k, v in doc.items() if k != "vectors"})[:-1]
    out.write_text(f'{head}, "vectors": [\n{lines}\n]}}\n')
    print(f"wrote {len(vectors)} vectors to {out}")


if __name__ == "__main__":
    main()
