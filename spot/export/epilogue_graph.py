"""The sampling epilogue as an ONNX graph: everything vocabulary-sized that F and the drafter need, on the device.

A verify pass yields logits [N,B,V] for N block states (~300 MB at 16 x 32 x 151936 in fp32). This graph, bound to
those logits, returns only O(N x P x (D + 32)) values: its inputs, outputs and calls are the folder contract of
spot.folder.epilogue.

Exactness: token/confidence equal `spot.runtime.step.sample_positions` (top-p = 1), the runner-ups and gaps
`spot.runtime.step.top2_scaled`, and the top-32 `spot.runtime.stale.topk_logprobs`, bit for bit on ONNX Runtime's
CPU provider (reference: numpy on x86-64 glibc with FMA, docs/noise.md), because every float64 operation is the one
numpy performs: the counter-based noise of spot.runtime.noise in uint32 integer ops (Mul, BitShift, BitwiseXor:
opset 18), glibc's log/exp and numpy's pairwise sum restated as plain IEEE operations (spot.exact_math), and
ArgMax/TopK with first-index ties. Confidences are given for every position; the host sets non-masked ones to -inf
(docs/spec.md §3) and only reads the positions it needs. Top-p needs a full sort and a cumulative sum over V per row:
not in the graph; `check_sampling` refuses it so a decoder with top-p < 1 keeps the numpy step function.

Cost: the noise for every (state, step, position, token) uses the backend's native float64 Log (a few dozen integer
and float ops per value); only CANDIDATES = 3 tokens per (state, step, position) are re-scored with the exact noise,
and a certificate (the exact runner-up beats the next native score by more than NATIVE_NOISE_MARGIN plus 2**-40
relative) proves no other token can reach the top two. When any row fails it (a near-tie: ~1e-9 of rows; tests build
one), an If node reruns the batch with the exact noise over the vocabulary and the `exact_fallback` output says so.
The softmax (exp over V, numpy's pairwise sum) is exact once per (state, position), not per step.
benchmarks/epilogue_cost.py: ~20x faster than the exact noise everywhere at V 2048, B 32, D 8 on ORT CPU.

Backends: ORT CPU (tested), ORT CUDA EP (same ops; float64 IEEE arithmetic is identical on the GPU, but the run
there is part of scripts/gpu_check.sh and has not been done on this project's CI). TensorRT has neither uint32
arithmetic nor float64: on a TensorRT deployment the target engine runs in TensorRT and this epilogue runs on the
same device buffers through ORT's CUDA EP or the torch twin (spot.reference.noise_torch.epilogue_torch, the same
certified sampling); see docs/gpu-path.md. `EpilogueSpec(exact=False)` uses the backend's Exp/Log/ReduceSum
everywhere instead (ulp-level differences in the confidences). Peak memory grows with N x (D+1) x B x V x 8 bytes
times a few live intermediates: the engines call it for one state at a time, the states the walk reads
(spot.runtime.outputs.DeferredOutputs); `run_epilogue(..., chunk=...)` chunks host arrays likewise.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from spot.errors import SpotError
from spot import exact_math as xm
from spot.folder.epilogue import (CANDIDATES, EPILOGUE_FILE, FALLBACK_OUTPUT, INPUTS, NATIVE_NOISE_MARGIN, OUTPUTS,
                                  EpilogueResult, check_positions, check_sampling, make_epilogue_session, run_epilogue)
from spot.runtime.noise import LANE_A, LANE_B, MIX_MUL_1, MIX_MUL_2, gumbel
from spot.runtime.stale import topk_logprobs
from spot.runtime.step import Sampling, confidence, scale_rows, step_gumbel, top2_scaled

OPSET = 18
TOP_K_LOGPROBS = 32              # = spot.runtime.stale.TOPK_FEATURES
PAD_LOGPROB = -1e4               # stale.topk_logprobs' padding below 32 tokens

try:  # onnx is needed to build graphs, not to use the numpy reference functions
    from onnx import TensorProto, checker, helper, numpy_helper
except ImportError:  # pragma: no cover - onnx is part of the export/test extras
    TensorProto = helper = numpy_helper = checker = None


def _need_onnx():
    if helper is None:
        raise SpotError("building the sampling epilogue needs the onnx package", "pip install 'spot-edge[export]'")


# -- the ONNX backend of spot.exact_math's Ops interface --------------------------------------------------
class OnnxOps:
    """Emits ONNX nodes; values are tensor names. Scalar constants are cached initializers."""

    def __init__(self, prefix: str = "ep"):
        _need_onnx()
        self.prefix = prefix
        self.nodes: list = []
        self.initializers: list = []
        self._count = 0
        self._consts: dict = {}

    def _name(self, hint: str) -> str:
        self._count += 1
        return f"{self.prefix}/{hint}_{self._count}"

    def child(self, prefix: str) -> "OnnxOps":
        """An emitter for a subgraph (If branch): own nodes, shared constants (outer-scope initializers)."""
        sub = OnnxOps(prefix)
        sub._consts, sub.initializers, sub._count = self._consts, self.initializers, self._count
        return sub

    def adopt(self, sub: "OnnxOps") -> None:
        """Continue numbering after a child's names, so that no name repeats across the graph."""
        self._count = max(self._count, sub._count)

    def op(self, op_type: str, *inputs: str, **attrs) -> str:
        out = self._name(op_type)
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], name=out, **attrs))
        return out

    def op_multi(self, op_type: str, inputs: list[str], n_out: int, **attrs) -> list[str]:
        outs = [self._name(f"{op_type}_out{j}") for j in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=outs[0], **attrs))
        return outs

    def const(self, value, dtype) -> str:
        arr = np.asarray(value, dtype=dtype)
        key = (arr.dtype.str, arr.shape, arr.tobytes()) if arr.size <= 16 else None
        if key is not None and key in self._consts:
            return self._consts[key]
        name = self._name("const")
        self.initializers.append(numpy_helper.from_array(arr, name))
        if key is not None:
            self._consts[key] = name
        return name

    # Ops interface
    def f(self, v):
        return self.const(v, np.float64)

    def i(self, v):
        return self.const(v, np.int64)

    def add(self, a, b):
        return self.op("Add", a, b)

    def sub(self, a, b):
        return self.op("Sub", a, b)

    def mul(self, a, b):
        return self.op("Mul", a, b)

    def abs(self, a):
        return self.op("Abs", a)

    def lt(self, a, b):
        return self.op("Less", a, b)

    def le(self, a, b):
        return self.op("LessOrEqual", a, b)

    def gt(self, a, b):
        return self.op("Greater", a, b)

    def ge(self, a, b):
        return self.op("GreaterOrEqual", a, b)

    def eq(self, a, b):
        return self.op("Equal", a, b)

    def ne(self, a, b):
        return self.op("Not", self.op("Equal", a, b))

    def and_(self, a, b):
        return self.op("And", a, b)

    def where(self, c, a, b):
        return self.op("Where", c, a, b)

    def to_int(self, x):
        return self.op("Cast", x, to=TensorProto.INT64)

    def to_float(self, x):
        return self.op("Cast", x, to=TensorProto.DOUBLE)

    def neg_int(self, x):
        return self.op("Sub", self.i(0), x)

    def clip_int(self, x, lo: int, hi: int):
        return self.op("Max", self.op("Min", x, self.i(hi)), self.i(lo))

    def divmod_const(self, x, d: int):
        r = self.op("Mod", x, self.i(d))            # fmod=0: the sign of the divisor, i.e. floor semantics
        return self.op("Div", self.op("Sub", x, r), self.i(d)), r

    def gather(self, table, idx):
        return self.op("Gather", self.const(np.asarray(table), np.float64), idx, axis=0)

    def exponent(self, x):
        """floor(log2 x) for positive normal x: a float estimate from Log, corrected exactly with powers of two."""
        est = self.to_int(self.op("Floor", self.mul(self.op("Log", x), self.f(1.0 / math.log(2.0)))))
        est = self.clip_int(est, xm.POW2_MIN, xm.POW2_MAX - 1)
        p = xm.pow2(self, est)
        down = self.op("Cast", self.lt(x, p), to=TensorProto.INT64)
        up = self.op("Cast", self.ge(x, self.mul(p, self.f(2.0))), to=TensorProto.INT64)
        return self.add(self.sub(est, down), up)

    def pad_zero_last(self, x):
        lead = self.op("Slice", self.op("Shape", x), self.i([0]), self.i([-1]))
        shape = self.op("Concat", lead, self.i([1]), axis=0)
        zeros = self.op("ConstantOfShape", shape, value=numpy_helper.from_array(np.zeros(1, np.float64)))
        return self.op("Concat", x, zeros, axis=-1)

    def take_last(self, x, idx):
        return self.op("Gather", x, self.const(np.asarray(idx), np.int64), axis=-1)

    def select(self, x, axis: int, index: int):
        return self.op("Gather", x, self.i(index), axis=axis)

    def concat_last(self, xs):
        return self.op("Concat", *xs, axis=-1)

    # uint32 helpers for the noise hash
    def u32(self, v):
        return self.const(v, np.uint32)

    def mix32(self, x):
        """spot.runtime.noise.mix32 (lowbias32) in uint32 ops; Mul wraps modulo 2**32."""
        x = self.op("BitwiseXor", x, self.op("BitShift", x, self.u32(16), direction="RIGHT"))
        x = self.op("Mul", x, self.u32(int(MIX_MUL_1)))
        x = self.op("BitwiseXor", x, self.op("BitShift", x, self.u32(15), direction="RIGHT"))
        x = self.op("Mul", x, self.u32(int(MIX_MUL_2)))
        return self.op("BitwiseXor", x, self.op("BitShift", x, self.u32(15), direction="RIGHT"))


# -- graph pieces ---------------------------------------------------------------------------------------------------
def _log(o: OnnxOps, x: str, exact: bool) -> str:
    return xm.glibc_log(o, x) if exact else o.op("Log", x)


def _lane(o: OnnxOps, lane_const: int, seed: str, block: str, step: str, position: str, token: str) -> str:
    """One hash word of spot.runtime.noise (uint32 tensors, numpy broadcasting between the counters)."""
    h = o.mix32(o.op("BitwiseXor", seed, o.u32(lane_const)))
    for counter in (block, step, position, token):
        h = o.mix32(o.op("BitwiseXor", h, counter))
    return h


def _gumbel_from_words(o: OnnxOps, a: str, b: str, exact: bool) -> str:
    hi = o.to_float(o.op("BitShift", a, o.u32(5), direction="RIGHT"))               # 27 bits
    lo = o.to_float(o.op("BitShift", b, o.u32(6), direction="RIGHT"))               # 26 bits
    k = o.add(o.mul(hi, o.f(2.0 ** 26)), lo)                                        # exact: < 2**53
    u = o.mul(o.op("Max", k, o.f(0.5)), o.f(2.0 ** -53))
    inner = _log(o, u, exact)
    return o.mul(_log(o, o.mul(inner, o.f(-1.0)), exact), o.f(-1.0))              # -log(-log(u)), exact negations


def _noise(o: OnnxOps, seed_u32: str, block_u32: str, steps_u32: str, positions: str, tokens_u32: str,
           exact: bool = True) -> str:
    """Gumbel noise float64 for steps_u32 [N, S] (uint32), positions [P, 1] (uint32: the rows' block positions) and
    tokens_u32: either every token ([V] -> noise [N, S, P, V]) or a few per row ([N, S, P, C] -> [N, S, P, C])."""
    steps = o.op("Unsqueeze", steps_u32, o.i([2, 3]))                               # [N,S,1,1]
    # the per-(step, position) prefix is computed on [N,S,B,1]; only the last mix runs over the tokens
    words = []
    for lane in (LANE_A, LANE_B):
        h = o.mix32(o.op("BitwiseXor", seed_u32, o.u32(lane)))
        h = o.mix32(o.op("BitwiseXor", h, block_u32))
        h = o.mix32(o.op("BitwiseXor", h, steps))
        h = o.mix32(o.op("BitwiseXor", h, positions))                               # [N,S,B,1]
        words.append(o.mix32(o.op("BitwiseXor", h, tokens_u32)))
    return _gumbel_from_words(o, words[0], words[1], exact)


def _all_tokens(o: OnnxOps, vocab: int) -> str:
    return o.u32(np.arange(vocab, dtype=np.uint32))                                # [V]


def _top2_dense(o: OnnxOps, scores: str, vocab: int) -> tuple[str, str, str]:
    """Winner, runner-up and gap over the last axis of scores [..., V] (spot.runtime.step.top2_scaled's semantics):
    tokens = argmax (first index on ties), runner-up = argmax without the winner, gap = their score difference;
    runner-up -1 and gap inf where no other token is finite (filtered or excluded)."""
    tokens = o.op("ArgMax", scores, axis=-1, keepdims=0, select_last_index=0)
    is_winner = o.eq(o.i(np.arange(vocab, dtype=np.int64)), o.op("Unsqueeze", tokens, o.i([-1])))
    rest = o.where(is_winner, o.f(-math.inf), scores)
    second = o.op("ArgMax", rest, axis=-1, keepdims=0, select_last_index=0)
    return tokens, *_runner_up_or_none(o, o.op("ReduceMax", scores, o.i([-1]), keepdims=0), second,
                                       o.op("ReduceMax", rest, o.i([-1]), keepdims=0))


def _runner_up_or_none(o: OnnxOps, best: str, second: str, best2: str) -> tuple[str, str]:
    """(runner-up, gap): -1 and inf where the runner-up's score best2 is -inf, else second and best - best2."""
    none = o.op("IsInf", best2, detect_positive=0)
    return o.where(none, o.i(-1), second), o.where(none, o.f(math.inf), o.sub(best, best2))


def _sampled_top2(o: OnnxOps, z_filtered: str, noise_args: tuple, vocab: int,
                  exact: bool) -> tuple[str, str, str]:
    """_top2_dense of z_filtered [N,1,P,V] + gumbel [N,S,P,V] (exact or native) -> tokens, runner-ups, gaps [N,S,P];
    noise_args: seed, block, steps, positions as _noise takes them."""
    g = _noise(o, *noise_args, _all_tokens(o, vocab), exact)
    return _top2_dense(o, o.add(z_filtered, g), vocab)


def _certified_top2(o: OnnxOps, z_filtered: str, noise_args: tuple, vocab: int,
                    margin: float) -> tuple[str, str, str, str]:
    """The exact winner and runner-up without the exact noise over V: rank every token by the backend's native Log
    noise, re-score the best CANDIDATES exactly, and certify that no other token can reach the top two.

    The native scores are within `margin` (+ a relative 2**-40) of the exact ones (any float64 log within 2**-40
    relative error: ~4000 ulp), so when the exact runner-up among the candidates beats the next native score by
    more than that, the candidates hold the exact top two (ties to the smallest id among the candidates; a tie with
    a non-candidate fails the certificate). Returns (tokens, runner-ups, gaps [N,S,B] as _top2_dense, certified []
    bool: every row passed)."""
    g_native = _noise(o, *noise_args, _all_tokens(o, vocab), exact=False)
    scores = o.add(z_filtered, g_native)                                             # [N,S,B,V]
    n_cand = min(CANDIDATES, vocab)
    n_top = min(CANDIDATES + 1, vocab)
    top_vals, top_ids = o.op_multi("TopK", [scores, o.i([n_top])], 2, axis=-1, largest=1, sorted=1)
    cand = o.op("Slice", top_ids, o.i([0]), o.i([n_cand]), o.i([-1]))               # [N,S,B,C]
    g_exact = _noise(o, *noise_args, o.op("Cast", cand, to=TensorProto.UINT32), exact=True)
    # z_filtered at the candidates: [N,1,B,V] -> gather along V with the candidates laid out [N,B,S*C]
    z_rows = o.op("Squeeze", z_filtered, o.i([1]))                                  # [N,B,V]
    cand_nbs = o.op("Transpose", cand, perm=[0, 2, 1, 3])                            # [N,B,S,C]
    flat = o.op("Reshape", cand_nbs, o.i([0, 0, -1]))
    z_cand = o.op("Reshape", o.op("GatherElements", z_rows, flat, axis=-1), o.op("Shape", cand_nbs))
    exact_scores = o.add(o.op("Transpose", z_cand, perm=[0, 2, 1, 3]), g_exact)      # [N,S,B,C]
    # winner: the best exact score, smallest id on ties; runner-up: the same among the other candidates
    big = o.i(np.iinfo(np.int64).max)
    best = o.op("ReduceMax", exact_scores, o.i([-1]), keepdims=1)
    tokens = o.op("ReduceMin", o.where(o.eq(exact_scores, best), cand, big), o.i([-1]), keepdims=0)
    others = o.op("Not", o.eq(cand, o.op("Unsqueeze", tokens, o.i([-1]))))
    rest = o.where(others, exact_scores, o.f(-math.inf))
    best2 = o.op("ReduceMax", rest, o.i([-1]), keepdims=1)
    second = o.op("ReduceMin", o.where(o.and_(others, o.eq(rest, best2)), cand, big), o.i([-1]), keepdims=0)
    best2 = o.op("Squeeze", best2, o.i([-1]))
    second, gap = _runner_up_or_none(o, o.op("Squeeze", best, o.i([-1])), second, best2)
    if n_top == n_cand:                          # every token is a candidate: nothing to certify
        return tokens, second, gap, o.const(True, np.bool_)
    following = o.op("Squeeze", o.op("Slice", top_vals, o.i([n_cand]), o.i([n_top]), o.i([-1])), o.i([-1]))
    bound = o.add(following, o.add(o.f(margin), o.mul(o.abs(following), o.f(2.0 ** -40))))
    # every other token filtered (-inf natively, so exactly): the candidates hold whatever top two there is
    ok = o.op("Or", o.gt(best2, bound), o.op("IsInf", following, detect_positive=0))   # [N,S,B]; NaN fails
    certified = o.op("Cast", o.op("ReduceMin", o.op("Cast", ok, to=TensorProto.INT32), keepdims=0),
                     to=TensorProto.BOOL)                                            # an empty batch passes
    return tokens, second, gap, certified


def _softmax_parts(o: OnnxOps, z: str, vocab: int, exact: bool = True) -> tuple[str, str, str]:
    """zmax [...,1], e = exp(z - zmax) [...,V], S = sum(e) [...] (numpy's order when exact)."""
    zmax = o.op("ReduceMax", z, o.i([-1]), keepdims=1)
    if not exact:
        e = o.op("Exp", o.sub(z, zmax))
        return zmax, e, o.op("ReduceSum", e, o.i([-1]), keepdims=0)
    e = xm.glibc_exp(o, o.sub(z, zmax))
    return zmax, e, xm.pairwise_sum(o, e, vocab)


def _value_info(name: str, elem_type, shape):
    return helper.make_tensor_value_info(name, elem_type, shape)


BRANCH_OUTPUTS = (("tokens", "INT64"), ("runner_up", "INT64"), ("gap", "DOUBLE"))


def _branch(o: OnnxOps, name: str, values, d: int, p: int, fallback: str | None = None):
    """An If branch returning tokens, runner-ups [N, D+1, P] int64 and gaps [N, D+1, P] float64 (values, in that
    order), and the fallback flag [] bool when given."""
    outputs = []
    for (role, elem), value in zip(BRANCH_OUTPUTS, values):
        out = f"{name}/{role}"
        o.nodes.append(helper.make_node("Identity", [value], [out]))
        outputs.append(_value_info(out, getattr(TensorProto, elem), ["N", d + 1, p]))
    if fallback is not None:
        o.nodes.append(helper.make_node("Identity", [fallback], [f"{name}/fallback"]))
        outputs.append(_value_info(f"{name}/fallback", TensorProto.BOOL, []))
    return helper.make_graph(o.nodes, name, [], outputs)


def _if(o: OnnxOps, cond: str, then_branch, else_branch, extra: tuple = ()) -> list[str]:
    """An If node with BRANCH_OUTPUTS (+ extra output names) -> the output names."""
    outs = [o._name(f"If_{role}") for role, _ in BRANCH_OUTPUTS] + list(extra)
    o.nodes.append(helper.make_node("If", [cond], outs, name=outs[0], then_branch=then_branch,
                                    else_branch=else_branch))
    return outs


@dataclass(frozen=True)
class EpilogueSpec:
    """Build-time constants of one epilogue graph."""

    vocab_size: int
    block_size: int
    future_steps: int               # D
    positions: int | None = None    # P: a state's positions per call (a run from first_position); None: the block
    top_k_logprobs: int = TOP_K_LOGPROBS
    exact: bool = True              # False: the backend's own Exp/Log/ReduceSum (faster, ulp-level differences)
    noise_margin: float = NATIVE_NOISE_MARGIN   # the certificate's bound (tests set inf to force the fallback)

    def __post_init__(self):
        if self.top_k_logprobs != TOP_K_LOGPROBS:
            raise SpotError(f"the drafter reads {TOP_K_LOGPROBS} log-probabilities, got top_k_logprobs="
                            f"{self.top_k_logprobs}")
        if self.vocab_size < 1 or self.block_size < 1:
            raise SpotError(f"epilogue needs vocab_size >= 1 and block_size >= 1, got {self.vocab_size}, "
                            f"{self.block_size}")
        if self.positions is not None:
            check_positions(self.positions, self.block_size, "epilogue positions per call")
        if self.future_steps < 0:
            raise SpotError(f"future_steps (D) must be >= 0, got {self.future_steps}")
        if not self.noise_margin > 0:
            raise SpotError(f"noise_margin must be > 0, got {self.noise_margin}")

    @property
    def k(self) -> int:
        return min(self.top_k_logprobs, self.vocab_size)


def build_epilogue(spec: EpilogueSpec):
    """The epilogue ModelProto (opset 18). N is dynamic; V, D, K and P — the positions of a state per call: the
    block's B, or runs of P from `first_position` (less memory) — are fixed at build time (static shapes let ONNX
    Runtime plan its memory: a dynamic P raised the peak 1.7x)."""
    _need_onnx()
    o = OnnxOps("ep")
    v, d, k, p = spec.vocab_size, spec.future_steps, spec.k, spec.positions or spec.block_size
    rows = o.op("Cast", "logits", to=TensorProto.DOUBLE)                            # [N,P,V]
    positions = o.op("Cast", o.add("first_position", o.i(np.arange(p, dtype=np.int64).reshape(p, 1))),
                     to=TensorProto.UINT32)                                         # [P,1]
    t_pos = o.gt("temperature", o.f(0.0))
    z = o.where(t_pos, o.op("Div", rows, "temperature"), rows)
    zmax, e, total = _softmax_parts(o, z, v, spec.exact)                                        # e [N,B,V], total [N,B]

    # top-k filter of z/T for sampling (numpy: filtered iff z < k-th largest value; ties kept)
    kk = o.clip_int("top_k", 1, v)
    kth_vals, _ = o.op_multi("TopK", [z, o.op("Reshape", kk, o.i([1]))], 2, axis=-1, largest=1, sorted=1)
    kth = o.op("Gather", kth_vals, o.sub(kk, o.i(1)), axis=-1)                      # [N,B]
    filtering = o.and_(o.gt("top_k", o.i(0)), o.lt("top_k", o.i(v)))
    drop = o.and_(filtering, o.lt(z, o.op("Unsqueeze", kth, o.i([-1]))))
    # the excluded token (the mask id; -1 = none) never wins an argmax but stays in the softmax
    excluded = o.eq(o.i(np.arange(v, dtype=np.int64)), "exclude_token")                   # [V]
    z_filtered = o.where(o.op("Or", drop, excluded), o.f(-math.inf), z)
    z_greedy = o.where(excluded, o.f(-math.inf), z)

    steps = o.add(o.op("Unsqueeze", "node_steps", o.i([1])), o.i(np.arange(d + 1, dtype=np.int64)))  # [N,D+1]
    # then-branch (T > 0): winner and runner-up of the perturbed, filtered scaled logits at each of the D+1 steps
    ob = o.child("ep_sample")
    noise_args = (ob.op("Cast", "seed", to=TensorProto.UINT32), ob.op("Cast", "block", to=TensorProto.UINT32),
                  ob.op("Cast", steps, to=TensorProto.UINT32), positions)
    z_rows = ob.op("Unsqueeze", z_filtered, ob.i([1]))                               # [N,1,B,V]
    if spec.exact:
        *fast, certified = _certified_top2(ob, z_rows, noise_args, v, spec.noise_margin)
        # a row the certificate cannot settle (a near-tie, ~1e-9 of rows) reruns the whole batch with exact noise
        of, oe_ = ob.child("ep_fast"), ob.child("ep_exact")
        exact_top2 = _sampled_top2(oe_, z_rows, noise_args, v, exact=True)
        ob.adopt(of)
        ob.adopt(oe_)
        sampled = _if(ob, certified, _branch(of, "certified", fast, d, p), _branch(oe_, "exact", exact_top2, d, p))
        fallback = ob.op("Not", certified)
    else:
        sampled = _sampled_top2(ob, z_rows, noise_args, v, exact=False)
        fallback = ob.const(False, np.bool_)
    o.adopt(ob)
    # else-branch (T = 0): winner and runner-up of the logits, the same at every step
    og = o.child("ep_greedy")
    shape = og.op("Concat", og.op("Shape", "node_steps"), og.i([d + 1, p]), axis=0)
    greedy = [og.op("Expand", og.op("Unsqueeze", x, og.i([1])), shape) for x in _top2_dense(og, z_greedy, v)]
    o.adopt(og)
    tokens, runner_up, gap, _ = _if(o, t_pos, _branch(ob, "sample", sampled, d, p, fallback),
                                    _branch(og, "greedy", greedy, d, p, og.const(False, np.bool_)),
                                    extra=(FALLBACK_OUTPUT,))

    # confidence: e[x] / sum(e), as numpy's take_along_axis(e, x) / e.sum(-1)
    tok_nbs = o.op("Transpose", tokens, perm=[0, 2, 1])                             # [N,B,D+1]
    conf = o.op("Div", o.op("GatherElements", e, tok_nbs, axis=-1), o.op("Unsqueeze", total, o.i([-1])))
    conf = o.op("Transpose", conf, perm=[0, 2, 1])                                  # [N,D+1,B]
    o.nodes.append(helper.make_node("Gather", [tokens, o.i(0)], ["token"], axis=1))
    o.nodes.append(helper.make_node("Gather", [conf, o.i(0)], ["confidence"], axis=1))
    future = o.i(np.arange(1, d + 1, dtype=np.int64))
    o.nodes.append(helper.make_node("Gather", [tokens, future], ["future_tokens"], axis=1))
    o.nodes.append(helper.make_node("Gather", [conf, future], ["future_conf"], axis=1))
    o.nodes.append(helper.make_node("Gather", [runner_up, future], ["future_runner_up"], axis=1))
    o.nodes.append(helper.make_node("Gather", [gap, future], ["future_gap"], axis=1))

    # top-32 log softmax(z): (z_top - max) - log(sum exp(z - max)), sharing the confidence's sum
    top_vals, top_ids = o.op_multi("TopK", [z, o.i([k])], 2, axis=-1, largest=1, sorted=1)
    log_total = o.op("Unsqueeze", _log(o, total, spec.exact), o.i([-1]))
    logp = o.op("Cast", o.sub(o.sub(top_vals, zmax), log_total), to=TensorProto.FLOAT)
    if k < TOP_K_LOGPROBS:                                   # tiny vocabularies: pad as stale.topk_logprobs
        pad_shape = o.op("Concat", o.op("Slice", o.op("Shape", logp), o.i([0]), o.i([-1])),
                         o.i([TOP_K_LOGPROBS - k]), axis=0)
        pad_lp = o.op("ConstantOfShape", pad_shape, value=numpy_helper.from_array(np.array([PAD_LOGPROB], np.float32)))
        pad_id = o.op("ConstantOfShape", pad_shape, value=numpy_helper.from_array(np.array([-1], np.int64)))
        logp, top_ids = o.concat_last([logp, pad_lp]), o.concat_last([top_ids, pad_id])
    o.nodes.append(helper.make_node("Identity", [logp], ["top_logprobs"]))
    o.nodes.append(helper.make_node("Identity", [top_ids], ["top_ids"]))

    inputs = [_value_info("logits", TensorProto.FLOAT, ["N", p, v]),
              _value_info("node_steps", TensorProto.INT64, ["N"]),
              _value_info("seed", TensorProto.INT64, []), _value_info("block", TensorProto.INT64, []),
              _value_info("temperature", TensorProto.DOUBLE, []), _value_info("top_k", TensorProto.INT64, []),
              _value_info("exclude_token", TensorProto.INT64, []),
              _value_info("first_position", TensorProto.INT64, [])]
    outputs = [_value_info("token", TensorProto.INT64, ["N", p]),
               _value_info("confidence", TensorProto.DOUBLE, ["N", p]),
               _value_info("future_tokens", TensorProto.INT64, ["N", d, p]),
               _value_info("future_conf", TensorProto.DOUBLE, ["N", d, p]),
               _value_info("top_logprobs", TensorProto.FLOAT, ["N", p, TOP_K_LOGPROBS]),
               _value_info("top_ids", TensorProto.INT64, ["N", p, TOP_K_LOGPROBS]),
               _value_info("future_runner_up", TensorProto.INT64, ["N", d, p]),
               _value_info("future_gap", TensorProto.DOUBLE, ["N", d, p]),
               _value_info(FALLBACK_OUTPUT, TensorProto.BOOL, [])]
    graph = helper.make_graph(o.nodes, "spot_sampling_epilogue", inputs, outputs, initializer=o.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="spot-edge", doc_string=__doc__.split("\n")[0])
    model.ir_version = 8          # ORT >= 1.14 and TensorRT 10's parser accept IR 8 at opset 18
    checker.check_model(model)
    return model


def build_noise_graph(vocab_size: int, block_size: int, steps: int, exact: bool = True):
    """A test/diagnostic graph: gumbel [N, steps, B, V] float64 for node_steps [N] + 0..steps-1."""
    _need_onnx()
    o = OnnxOps("noise")
    st = o.add(o.op("Unsqueeze", "node_steps", o.i([1])), o.i(np.arange(steps, dtype=np.int64)))
    positions = o.u32(np.arange(block_size, dtype=np.uint32).reshape(block_size, 1))   # [B,1]
    g = _noise(o, o.op("Cast", "seed", to=TensorProto.UINT32), o.op("Cast", "block", to=TensorProto.UINT32),
               o.op("Cast", st, to=TensorProto.UINT32), positions, _all_tokens(o, vocab_size), exact)
    o.nodes.append(helper.make_node("Identity", [g], ["gumbel"]))
    inputs = [_value_info("node_steps", TensorProto.INT64, ["N"]), _value_info("seed", TensorProto.INT64, []),
              _value_info("block", TensorProto.INT64, [])]
    outputs = [_value_info("gumbel", TensorProto.DOUBLE, ["N", steps, block_size, vocab_size])]
    graph = helper.make_graph(o.nodes, "spot_noise", inputs, outputs, initializer=o.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="spot-edge")
    model.ir_version = 8
    checker.check_model(model)
    return model


def build_counter_noise_graph(exact: bool = True):
    """A test graph over arbitrary counters: seed, block, step, position, token [M] int64 in [0, 2**32) ->
    a, b [M] (the hash words, uint32), g [M] float64 (the noise); checked against tests/data/noise_vectors.json."""
    _need_onnx()
    o = OnnxOps("counters")
    names = ("seed", "block", "step", "position", "token")
    u32 = [o.op("Cast", n, to=TensorProto.UINT32) for n in names]
    a, b = _lane(o, LANE_A, *u32), _lane(o, LANE_B, *u32)
    g = _gumbel_from_words(o, a, b, exact)
    for src, dst in ((a, "a"), (b, "b"), (g, "g")):
        o.nodes.append(helper.make_node("Identity", [src], [dst]))
    inputs = [_value_info(n, TensorProto.INT64, ["M"]) for n in names]
    outputs = [_value_info("a", TensorProto.UINT32, ["M"]), _value_info("b", TensorProto.UINT32, ["M"]),
               _value_info("g", TensorProto.DOUBLE, ["M"])]
    graph = helper.make_graph(o.nodes, "spot_counter_noise", inputs, outputs, initializer=o.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="spot-edge")
    model.ir_version = 8
    checker.check_model(model)
    return model


def declared_output_shapes(model) -> dict[str, list]:
    """Output name -> declared shape (ints for static dims, strings for symbolic ones)."""
    out = {}
    for vi in model.graph.output:
        dims = vi.type.tensor_type.shape.dim
        out[vi.name] = [dm.dim_value if dm.HasField("dim_value") else dm.dim_param for dm in dims]
    return out


def save_epilogue(spec: EpilogueSpec, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(build_epilogue(spec), str(path))
    return path




def write_epilogue(folder: str | Path, vocab_size: int, block_size: int, future_steps: int,
                   exact: bool = True, positions: int | None = None) -> tuple[str, dict]:
    """Save epilogue.onnx into `folder`; returns (file name, its manifest["graphs"]["epilogue"] entry). positions:
    how many of a state's positions one call takes (default: all B; fewer need less memory)."""
    spec = EpilogueSpec(vocab_size, block_size, future_steps, positions, exact=exact)
    model = build_epilogue(spec)
    tmp = Path(folder) / (EPILOGUE_FILE + ".tmp")
    tmp.write_bytes(model.SerializeToString())
    tmp.replace(Path(folder) / EPILOGUE_FILE)
    return EPILOGUE_FILE, {"file": EPILOGUE_FILE, "opset": OPSET, "future_steps": future_steps, "exact": exact,
                           "positions_per_call": positions or block_size, "inputs": list(INPUTS),
                           "outputs": declared_output_shapes(model)}


def validate_epilogue(folder: str | Path, vocab_size: int, block_size: int, future_steps: int,
                      max_values: int = 2_000_000) -> dict:
    """Run the saved epilogue on random logits of 2 states and require bit identity with the numpy runtime
    (reference_epilogue); a graph taking runs of positions is run run by run and joined, as the engines do. Only
    where numpy is the reference platform (x86-64 glibc with FMA, docs/noise.md), and only up to max_values logits x
    steps (the exact float64 emulation is slow on a CPU)."""
    n = 2
    if not xm.reference_platform():
        return {"checked": False, "why": "the bit-exact reference is numpy on x86-64 glibc >= 2.28 with FMA"}
    if n * block_size * vocab_size * (future_steps + 1) > max_values:
        return {"checked": False, "why": f"vocabulary x block x steps too large to check on the CPU at export "
                                         f"(> {max_values} values); tests/test_epilogue.py checks the same graph"}
    session = make_epilogue_session(str(Path(folder) / EPILOGUE_FILE))
    logits = (np.random.default_rng(7).standard_normal((n, block_size, vocab_size)) * 4).astype(np.float32)
    checked = []
    for sampling in (Sampling(0.0, exclude_token=vocab_size - 1), Sampling(1.0, seed=11, exclude_token=vocab_size - 1)):
        got = run_epilogue(session, logits, [0, 3], sampling, 1)
        want = reference_epilogue(logits, [0, 3], sampling, 1, future_steps)
        bad = [name for name in OUTPUTS if not np.array_equal(getattr(got, name), getattr(want, name))]
        if bad:
            raise RuntimeError(f"the sampling epilogue differs from the numpy runtime at temperature "
                               f"{sampling.temperature} in {', '.join(bad)}: it must be bit-identical")
        checked.append(sampling.temperature)
    return {"checked": True, "temperatures": checked, "states": n}


# -- the numpy reference (what the graph must equal) ---------------------------------------------------------------
def top_logprobs(logits: np.ndarray, temperature: float, k: int = TOP_K_LOGPROBS) -> tuple[np.ndarray, np.ndarray]:
    """logits [..., V] float32 -> (log-probabilities [..., 32] float32, ids [..., 32] int64): the values are
    spot.runtime.stale.topk_logprobs (the drafter's features); ids in the same order (value descending, id
    ascending), -1 in the padding."""
    z = np.asarray(logits).astype(np.float64)
    if temperature > 0:
        z = z / temperature
    k = min(k, z.shape[-1])
    ids = np.argsort(-z, axis=-1, kind="stable")[..., :k].astype(np.int64)
    if k < TOP_K_LOGPROBS:
        ids = np.concatenate([ids, np.full(ids.shape[:-1] + (TOP_K_LOGPROBS - k,), -1, np.int64)], axis=-1)
    return topk_logprobs(np.asarray(logits), temperature), ids


def reference_epilogue(logits: np.ndarray, node_steps, sampling: Sampling, block: int, future_steps: int,
                       k: int = TOP_K_LOGPROBS, first_position: int = 0) -> EpilogueResult:
    """The epilogue computed with the runtime's own sampling (spot.runtime.step: scale_rows, then top2_scaled, whose
    winners are sample_positions'), one node and step at a time; logits [N,P,V] are the rows of positions
    first_position .. first_position + P - 1."""
    check_sampling(sampling)
    n, p, v = logits.shape
    steps = np.asarray(node_steps, dtype=np.int64)
    shape = (n, future_steps + 1, p)
    tok, second = np.zeros(shape, np.int64), np.zeros(shape, np.int64)
    conf, gap = np.zeros(shape, np.float64), np.zeros(shape, np.float64)
    for j in range(n):
        rows = scale_rows(logits[j], np.arange(p), sampling)
        for s in range(future_steps + 1):
            g = step_gumbel(sampling, block, int(steps[j]) + s, first_position + np.arange(p), v)
            tok[j, s], second[j, s], gap[j, s] = top2_scaled(rows, g)
            conf[j, s] = confidence(rows, tok[j, s])
    lp, ids = top_logprobs(logits, sampling.temperature, k)
    return EpilogueResult(tok[:, 0], conf[:, 0], tok[:, 1:], conf[:, 1:], lp, ids, second[:, 1:], gap[:, 1:])


def reference_noise(node_steps, seed: int, block: int, steps: int, block_size: int, vocab: int) -> np.ndarray:
    """gumbel [N, steps, B, V] from spot.runtime.noise (the graph built by build_noise_graph must equal it)."""
    st = np.asarray(node_steps, np.int64)[:, None] + np.arange(steps)
    return gumbel(seed, block, st[:, :, None, None], np.arange(block_size)[None, None, :, None],
                  np.arange(vocab, dtype=np.uint32)[None, None, None, :])
