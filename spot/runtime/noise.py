"""Counter-based Gumbel noise: `gumbel(seed, block, step, position, token)`, a pure function (docs/noise.md).

Definition (bit-exact, shared by numpy, torch, C++ and the ONNX epilogue):
    mix32(x):  x ^= x >> 16; x *= 0x21F0AAAD; x ^= x >> 15; x *= 0x735A2D97; x ^= x >> 15   (uint32, wrapping)
    lane(K):   h = mix32(seed ^ K); h = mix32(h ^ block); h = mix32(h ^ step); h = mix32(h ^ position)
               return mix32(h ^ token)
    a = lane(0x9E3779B9), b = lane(0x7F4A7C15)
    k = (a >> 5) * 2**26 + (b >> 6)              # 53 random bits, 0 <= k < 2**53
    u = max(k, 0.5) * 2**-53                     # in (0, 1); every value exact in float64
    g = -log(-log(u))                            # float64, log = the C library's (glibc's) log
All five arguments are integers in [0, 2**32). No state: the value depends only on the arguments.
"""
from __future__ import annotations

import numpy as np

from spot.runtime import libm, native

MIX_MUL_1 = np.uint32(0x21F0AAAD)
MIX_MUL_2 = np.uint32(0x735A2D97)
LANE_A = 0x9E3779B9
LANE_B = 0x7F4A7C15
TWO_POW_M53 = 2.0 ** -53
U32_MAX = 0xFFFFFFFF


def mix32(x: np.ndarray) -> np.ndarray:
    """Chris Wellons' lowbias32 integer hash (a bijection on uint32); multiplication wraps mod 2**32."""
    return mix32_into(np.array(x, dtype=np.uint32))


def mix32_into(x: np.ndarray) -> np.ndarray:
    """mix32 computed in place in the uint32 array x (returned). Why: the noise of a step is K x V hashes, and
    allocating each intermediate costs as much as the arithmetic."""
    x = np.asarray(x, dtype=np.uint32)     # a fresh 0-d array when given a numpy scalar
    t = np.empty_like(x)
    with np.errstate(over="ignore"):
        for shift, mul in ((16, MIX_MUL_1), (15, MIX_MUL_2)):
            np.right_shift(x, np.uint32(shift), out=t)
            np.bitwise_xor(x, t, out=x)
            np.multiply(x, mul, out=x)
        np.right_shift(x, np.uint32(15), out=t)
        np.bitwise_xor(x, t, out=x)
    return x


def _u32(value, name: str) -> np.ndarray:
    arr = np.asarray(value)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"noise counter {name} must be integer, got {arr.dtype}")
    if arr.size and (arr.min() < 0 or arr.max() > U32_MAX):
        raise ValueError(f"noise counter {name} must be in [0, 2**32), got range [{arr.min()}, {arr.max()}]")
    return arr.astype(np.uint32)


def lane_prefix(lane: int, seed, block, step, position) -> np.ndarray:
    """The per-(seed, block, step, position) part of one lane; broadcasting over the arguments."""
    h = mix32_into(_u32(seed, "seed") ^ np.uint32(lane))
    h = mix32_into(h ^ _u32(block, "block"))
    h = mix32_into(h ^ _u32(step, "step"))
    return mix32_into(h ^ _u32(position, "position"))


def uniform_from_words(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Two uint32 words -> float64 uniform in (0, 1) with 53 random bits."""
    k = np.asarray(a >> np.uint32(5)).astype(np.uint64)
    np.left_shift(k, np.uint64(26), out=k)
    np.bitwise_or(k, (b >> np.uint32(6)).astype(np.uint64), out=k)
    u = k.astype(np.float64)
    np.maximum(u, 0.5, out=u)
    np.multiply(u, TWO_POW_M53, out=u)
    return u


def uniform(seed, block, step, position, token) -> np.ndarray:
    """u(seed, block, step, position, token) in (0, 1), broadcasting over all five integer arguments."""
    return uniform_from_prefixes(lane_prefix(LANE_A, seed, block, step, position),
                                 lane_prefix(LANE_B, seed, block, step, position), token)


def uniform_from_prefixes(prefix_a: np.ndarray, prefix_b: np.ndarray, token) -> np.ndarray:
    """u from the two lanes' per-(seed, block, step, position) prefixes and the token, broadcasting."""
    tok = _u32(token, "token")
    return uniform_from_words(mix32_into(prefix_a ^ tok), mix32_into(prefix_b ^ tok))


def gumbel_from_uniform(u: np.ndarray) -> np.ndarray:
    """-log(-log(u)) in place, with the definition's log (the C library's, spot.runtime.libm)."""
    g = libm.log(u)
    np.negative(g, out=g)
    libm.log(g, out=g)
    return np.negative(g, out=g)


def gumbel(seed, block, step, position, token) -> np.ndarray:
    """Standard Gumbel(0, 1) noise as float64, broadcasting over all five integer arguments."""
    return gumbel_from_uniform(uniform(seed, block, step, position, token))


def mix32_scalar(x: int) -> int:
    """mix32 of one Python int in [0, 2**32): the same function without array overhead (row_prefixes hashes three
    scalar counters per lane for every step a round samples)."""
    x ^= x >> 16
    x = (x * 0x21F0AAAD) & U32_MAX
    x ^= x >> 15
    x = (x * 0x735A2D97) & U32_MAX
    return x ^ (x >> 15)


def row_prefixes(seed: int, block: int, step: int, positions) -> tuple[np.ndarray, np.ndarray]:
    """The two lanes' prefixes [K] uint32 of (seed, block, step) at `positions` [K] (= lane_prefix's)."""
    for name, value in (("seed", seed), ("block", block), ("step", step)):
        if not 0 <= int(value) <= U32_MAX:
            raise ValueError(f"noise counter {name} must be in [0, 2**32), got {value}")
    pos = _u32(np.asarray(positions).reshape(-1), "position")
    prefixes = []
    for lane in (LANE_A, LANE_B):
        h = mix32_scalar(mix32_scalar(mix32_scalar(int(seed) ^ lane) ^ int(block)) ^ int(step))
        prefixes.append(mix32_into(pos ^ np.uint32(h)))
    return prefixes[0], prefixes[1]


def rows_from_prefixes(prefix_a: np.ndarray, prefix_b: np.ndarray, vocab_size: int) -> np.ndarray:
    """[K, vocab_size] float64: the noise of every token for the rows whose lane prefixes are prefix_a, prefix_b [K]."""
    vocab = np.arange(vocab_size, dtype=np.uint32)[None, :]
    return gumbel_from_uniform(uniform_from_prefixes(prefix_a[:, None], prefix_b[:, None], vocab))


def gumbel_rows(seed: int, block: int, step: int, positions: np.ndarray, vocab_size: int) -> np.ndarray:
    """Noise for every token at the given block positions: shape [len(positions), vocab_size], float64."""
    return rows_from_prefixes(*row_prefixes(seed, block, step, positions), vocab_size)


BIN_BITS = 10      # a uniform's top 10 bits = its lane-A word's (k = (a >> 5) * 2**26 + (b >> 6)). 10: the bound
                   # table (8 kB) stays in cache between target passes; a 16-bit one (512 kB) made the candidate
                   # pass ~4x slower in standard decoding (116-130 vs 33-41 us) to keep 18.3 instead of 19.5 per row


class NoiseBins:
    """The noise of K positions at one (seed, block, step), as sampling reads it (spot.runtime.gumbel_max): bins
    [K, V] uint16, every token's lane-A word's top BIN_BITS bits (which bound its Gumbel value), and the two lanes'
    prefixes prefix_a, prefix_b [K] uint32, from which exact values are computed where they are needed."""

    def __init__(self, bins: np.ndarray, prefix_a: np.ndarray, prefix_b: np.ndarray):
        self.bins, self.prefix_a, self.prefix_b = bins, prefix_a, prefix_b

    def exact_at(self, rows: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        """[M] float64: the definition's noise of the (row, token) pairs rows [M], tokens [M]."""
        if native.sampling is None:
            return gumbel_from_uniform(uniform_from_prefixes(self.prefix_a[rows], self.prefix_b[rows], tokens))
        out = np.empty(len(tokens))
        native.sampling.gumbel_at_into(self.prefix_a[rows], self.prefix_b[rows],
                                       np.ascontiguousarray(tokens, np.int64), out)
        return out

    def exact_rows(self, rows: np.ndarray) -> np.ndarray:
        """[M, V] float64: the definition's rows (the rare rows candidate sampling cannot certify)."""
        return rows_from_prefixes(self.prefix_a[rows], self.prefix_b[rows], self.bins.shape[-1])


def noise_bins(seed: int, block: int, step: int, positions: np.ndarray, vocab_size: int) -> NoiseBins:
    """NoiseBins of (seed, block, step) at `positions` [K]."""
    prefix_a, prefix_b = row_prefixes(seed, block, step, positions)
    if native.sampling is None:
        words = mix32_into(prefix_a[:, None] ^ np.arange(vocab_size, dtype=np.uint32)[None, :])
        return NoiseBins((words >> np.uint32(32 - BIN_BITS)).astype(np.uint16), prefix_a, prefix_b)
    bins = np.empty((prefix_a.size, vocab_size), np.uint16)
    native.sampling.bins_into(prefix_a, vocab_size, BIN_BITS, bins)
    return NoiseBins(bins, prefix_a, prefix_b)


class NoiseCache:
    """The NoiseBins of the current block, computed once per (step, position) and reused.

    A SPOT round samples the stale logits at steps m+1..m+D and the walk samples each accepted node at its own
    step; consecutive rounds overlap in those steps, and gumbel(seed, block, step, position, .) never changes.
    Per step, one array row per position up to the largest asked for (np.empty: pages of rows never computed are
    never touched, so memory is what was asked for); callers drop steps they have passed with forget_before."""

    def __init__(self, seed: int, vocab_size: int):
        self.seed, self.vocab_size = seed, vocab_size
        self.block = -1
        self.steps: dict[int, tuple[np.ndarray, ...]] = {}   # step -> (have [P] bool, bins [P, V], prefix_a, prefix_b)

    def rows(self, block: int, step: int, positions: np.ndarray) -> NoiseBins:
        """noise_bins(seed, block, step, positions, V), from the cache where possible."""
        if block != self.block:
            self.block, self.steps = block, {}
        pos = np.asarray(positions, dtype=np.int64).reshape(-1)
        entry = self.steps.get(step)
        if entry is None or (pos.size and entry[0].size <= pos.max()):
            entry = self.steps[step] = self._grown(entry, int(pos.max()) + 1 if pos.size else 0)
        have, bins, prefix_a, prefix_b = entry
        missing = np.unique(pos[~have[pos]])
        if missing.size:
            fresh = noise_bins(self.seed, block, step, missing, self.vocab_size)
            bins[missing], prefix_a[missing], prefix_b[missing] = fresh.bins, fresh.prefix_a, fresh.prefix_b
            have[missing] = True
        return NoiseBins(bins[pos], prefix_a[pos], prefix_b[pos])

    def _grown(self, entry: tuple[np.ndarray, ...] | None, size: int) -> tuple[np.ndarray, ...]:
        """A step's arrays with room for positions < size, keeping what entry held."""
        grown = (np.zeros(size, bool), np.empty((size, self.vocab_size), np.uint16), np.empty(size, np.uint32),
                 np.empty(size, np.uint32))
        if entry is not None:
            for new, old in zip(grown, entry):
                new[:old.shape[0]] = old
        return grown

    def forget_before(self, step: int) -> None:
        for s in [s for s in self.steps if s < step]:
            del self.steps[s]
