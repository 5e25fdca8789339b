"""The torch twin of spot.runtime.noise and of the sampling epilogue (CPU or CUDA tensors).

torch has no uint32 arithmetic: the hash runs on int64 tensors holding values in [0, 2**32), every product split into
16-bit limbs so nothing overflows int64, results masked with & 0xFFFFFFFF. The float64 part (log, exp, sums) uses
spot.exact_math through `TorchOps`, so it equals numpy's glibc results bit for bit (torch.log/exp use SLEEF or
CUDA's libdevice, which differ by an ulp now and then). On CUDA the same IEEE float64 operations run as separate
kernels (eager mode, no fusion), so results are expected to be identical there too; scripts/gpu_check.sh checks it.

`epilogue_torch` is what a TensorRT deployment uses after the target engine: it reads the engine's logits buffer
(a CUDA tensor) in place and returns the O(N x B x (D + 32)) outputs of spot.export.epilogue_graph.
"""
from __future__ import annotations

import math

import torch

from spot import exact_math as xm
from spot.folder.epilogue import CANDIDATES, NATIVE_NOISE_MARGIN
from spot.runtime.noise import LANE_A, LANE_B, MIX_MUL_1, MIX_MUL_2

MASK32 = 0xFFFFFFFF


def mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2**32 for int64 x in [0, 2**32) and a constant c, without int64 overflow."""
    lo, hi = x & 0xFFFF, x >> 16
    return (lo * c + (((hi * (c & 0xFFFF)) & 0xFFFF) << 16)) & MASK32


def mix32(x: torch.Tensor) -> torch.Tensor:
    x = x ^ (x >> 16)
    x = mul32(x, int(MIX_MUL_1))
    x = x ^ (x >> 15)
    x = mul32(x, int(MIX_MUL_2))
    return x ^ (x >> 15)


def _u32(value, device) -> torch.Tensor:
    t = torch.as_tensor(value, dtype=torch.int64, device=device)
    if t.numel() and (int(t.min()) < 0 or int(t.max()) > MASK32):
        raise ValueError(f"noise counters must be in [0, 2**32), got range [{int(t.min())}, {int(t.max())}]")
    return t


def words(seed, block, step, position, token, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """The two hash words a, b (int64 tensors in [0, 2**32)), broadcasting over the five counters."""
    args = [_u32(v, device) for v in (seed, block, step, position, token)]
    out = []
    for lane in (LANE_A, LANE_B):
        h = mix32(args[0] ^ lane)
        for v in args[1:]:
            h = mix32(h ^ v)
        out.append(h)
    return out[0], out[1]


def uniform(seed, block, step, position, token, device=None) -> torch.Tensor:
    a, b = words(seed, block, step, position, token, device)
    k = ((a >> 5) << 26) | (b >> 6)                      # < 2**53: exact in float64
    return torch.clamp(k.to(torch.float64), min=0.5) * (2.0 ** -53)


def gumbel(seed, block, step, position, token, device=None) -> torch.Tensor:
    """Gumbel noise equal to spot.runtime.noise.gumbel bit for bit (float64)."""
    u = uniform(seed, block, step, position, token, device)
    return -xm.glibc_log(TORCH, -xm.glibc_log(TORCH, u))


# -- exact_math backend ---------------------------------------------------------------------------------------------
class TorchOps:
    """spot.exact_math's Ops on torch float64/int64 tensors. Scalars stay Python numbers (exact)."""

    @staticmethod
    def f(v):
        return float(v)

    @staticmethod
    def i(v):
        return int(v)

    # Python operators: a float scalar meets a float64 tensor as a float64 (exact), an int meets int64.
    @staticmethod
    def add(a, b):
        return a + b

    @staticmethod
    def sub(a, b):
        return a - b

    @staticmethod
    def mul(a, b):
        return a * b

    @staticmethod
    def abs(x):
        return torch.abs(x)

    @staticmethod
    def lt(a, b):
        return torch.lt(a, b) if isinstance(a, torch.Tensor) else torch.gt(b, a)

    @staticmethod
    def le(a, b):
        return torch.le(a, b) if isinstance(a, torch.Tensor) else torch.ge(b, a)

    @staticmethod
    def gt(a, b):
        return torch.gt(a, b) if isinstance(a, torch.Tensor) else torch.lt(b, a)

    @staticmethod
    def ge(a, b):
        return torch.ge(a, b) if isinstance(a, torch.Tensor) else torch.le(b, a)

    @staticmethod
    def eq(a, b):
        return torch.eq(a, b)

    @staticmethod
    def ne(a, b):
        return torch.ne(a, b)

    and_ = staticmethod(torch.logical_and)

    @staticmethod
    def where(c, a, b):
        like = c
        a = a if isinstance(a, torch.Tensor) else torch.tensor(a, dtype=torch.float64 if isinstance(a, float)
                                                               else torch.int64, device=like.device)
        b = b if isinstance(b, torch.Tensor) else torch.tensor(b, dtype=a.dtype, device=like.device)
        return torch.where(c, a, b)

    @staticmethod
    def to_int(x):
        return x.to(torch.int64)

    @staticmethod
    def to_float(x):
        return x.to(torch.float64)

    @staticmethod
    def neg_int(x):
        return -x

    @staticmethod
    def clip_int(x, lo, hi):
        return torch.clamp(x, lo, hi)

    @staticmethod
    def divmod_const(x, d):
        r = torch.remainder(x, d)                        # sign of the divisor: floor semantics
        return torch.div(x - r, d, rounding_mode="floor"), r

    _tables: dict = {}

    @classmethod
    def gather(cls, table, idx):
        key = (id(table), str(idx.device))          # the tables are module constants: copy each once per device
        if key not in cls._tables:
            cls._tables[key] = (table, torch.as_tensor(table, dtype=torch.float64, device=idx.device))
        return cls._tables[key][1][idx]

    @staticmethod
    def exponent(x):
        _, e = torch.frexp(x)
        return e.to(torch.int64) - 1

    @staticmethod
    def pad_zero_last(x):
        return torch.nn.functional.pad(x, (0, 1))

    @staticmethod
    def take_last(x, idx):
        return x[..., torch.as_tensor(idx, dtype=torch.int64, device=x.device)]

    @staticmethod
    def select(x, axis, index):
        return x.select(axis, index)

    @staticmethod
    def concat_last(xs):
        return torch.cat(xs, dim=-1)


TORCH = TorchOps()


# -- the epilogue on torch tensors -------------------------------------------------------------------------------
def top2_dense(scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Winner, runner-up and gap over the last axis of scores [..., V] as spot.runtime.step.top2_scaled: first
    maxima on ties; runner-up -1 and gap inf where no other token is finite."""
    tokens = torch.argmax(scores, dim=-1)                                          # first maximum on ties
    rest = scores.scatter(-1, tokens[..., None], -math.inf)
    best = torch.gather(scores, -1, tokens[..., None])[..., 0]
    return (tokens, *_runner_up_or_none(best, torch.argmax(rest, dim=-1), rest.amax(dim=-1)))


def _runner_up_or_none(best, second, best2) -> tuple[torch.Tensor, torch.Tensor]:
    none = torch.isneginf(best2)
    return torch.where(none, -1, second), torch.where(none, math.inf, best - best2)


def certified_top2(zf: torch.Tensor, steps: torch.Tensor, seed: int, block: int,
                   first_position: int = 0) -> tuple[torch.Tensor, ...]:
    """Winner, runner-up and gap [N,S,P] of zf[n,p,v] + gumbel(seed, block, steps[n,s], first_position + p, v),
    exactly, the way the ONNX epilogue does it (spot.export.epilogue_graph._certified_top2): rank with torch.log's noise,
    re-score the best CANDIDATES with the exact noise, and fall back to the exact noise over V when a row is not
    certified."""
    dev = zf.device
    n, b, v = zf.shape
    counters = (steps[:, :, None, None], first_position + torch.arange(b, device=dev)[None, None, :, None])
    u = uniform(seed, block, *counters, torch.arange(v, device=dev)[None, None, None, :], device=dev)
    scores = zf[:, None] + -torch.log(-torch.log(u))                               # [N,S,B,V]
    top = torch.topk(scores, min(CANDIDATES + 1, v), dim=-1)
    cand = top.indices[..., :CANDIDATES]
    exact = torch.gather(zf[:, None].expand(scores.shape), -1, cand) + gumbel(seed, block, *counters, cand, device=dev)
    big = torch.iinfo(torch.int64).max
    best = exact.amax(dim=-1, keepdim=True)
    tokens = torch.where(exact == best, cand, big).amin(dim=-1)
    others = cand != tokens[..., None]
    rest = torch.where(others, exact, -math.inf)
    best2 = rest.amax(dim=-1, keepdim=True)
    second = torch.where(others & (rest == best2), cand, big).amin(dim=-1)
    second, gap = _runner_up_or_none(best[..., 0], second, best2[..., 0])
    if v > CANDIDATES:
        following = top.values[..., CANDIDATES]
        bound = following + (NATIVE_NOISE_MARGIN + following.abs() * 2.0 ** -40)
        # a row with no finite score (top-k kept only the excluded mask id) ties over all V: the spec's smallest id
        no_token = torch.isneginf(best[..., 0])
        if not bool(((best2[..., 0] > bound) | (torch.isneginf(following) & ~no_token)).all()):
            # a near-tie, or no token at all: the exact noise over the whole vocabulary
            g = gumbel(seed, block, *counters, torch.arange(v, device=dev)[None, None, None, :], device=dev)
            return top2_dense(zf[:, None] + g)
    return tokens, second, gap


def epilogue_torch(logits: torch.Tensor, node_steps, seed: int, block: int, temperature: float, top_k: int,
                   future_steps: int, exclude_token: int = -1, k: int = 32,
                   first_position: int = 0) -> dict[str, torch.Tensor]:
    """spot.export.epilogue_graph's outputs from logits [N,P,V] float32 (any device; the rows of positions first_position
    .. first_position + P - 1): token [N,P], confidence [N,P], future_tokens/future_conf/future_runner_up/future_gap
    [N,D,P], top_logprobs [N,P,32] float32, top_ids [N,P,32]. exclude_token (the mask id; -1 = none) never wins an
    argmax but stays in the softmax. Top-p is host-only."""
    if not (math.isfinite(temperature) and temperature >= 0):
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature}")
    dev = logits.device
    n, b, v = logits.shape
    rows = logits.to(torch.float64)
    z = rows / temperature if temperature > 0 else rows
    zmax = z.amax(dim=-1, keepdim=True)
    e = xm.glibc_exp(TORCH, z - zmax)
    total = xm.pairwise_sum(TORCH, e, v)
    steps = torch.as_tensor(node_steps, dtype=torch.int64, device=dev)[:, None] + torch.arange(
        future_steps + 1, device=dev)                                              # [N,D+1]
    excluded = torch.arange(v, device=dev) == exclude_token
    if temperature > 0:
        zf = z
        if 0 < top_k < v:
            kth = torch.topk(z, top_k, dim=-1).values[..., top_k - 1:top_k]
            zf = torch.where(z < kth, -math.inf, z)
        sampled = certified_top2(torch.where(excluded, -math.inf, zf), steps, seed, block, first_position)
    else:
        sampled = [x[:, None].expand(n, future_steps + 1, b) for x in top2_dense(torch.where(excluded, -math.inf, z))]
    tokens, runner_up, gap = sampled
    conf = torch.gather(e, -1, tokens.transpose(1, 2).contiguous()) / total[..., None]   # [N,B,D+1]
    conf = conf.transpose(1, 2)
    # the 32 largest log softmax(z) (the drafter's features), ids by value descending then id ascending
    kk = min(k, v)
    order = torch.sort(z, dim=-1, descending=True, stable=True).indices[..., :kk]
    logp = ((torch.gather(z, -1, order) - zmax) - xm.glibc_log(TORCH, total)[..., None]).to(torch.float32)
    if kk < k:                                           # tiny vocabularies: pad as spot.runtime.stale does
        logp = torch.nn.functional.pad(logp, (0, k - kk), value=-1e4)
        order = torch.nn.functional.pad(order, (0, k - kk), value=-1)
    return {"token": tokens[:, 0].contiguous(), "confidence": conf[:, 0].contiguous(),
            "future_tokens": tokens[:, 1:].contiguous(), "future_conf": conf[:, 1:].contiguous(),
            "top_logprobs": logp, "top_ids": order,
            "future_runner_up": runner_up[:, 1:].contiguous(), "future_gap": gap[:, 1:].contiguous()}
