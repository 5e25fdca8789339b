"""The sampling epilogue's contract (spot.export.epilogue_graph builds the graph): its file, inputs and outputs, the
shape of one call, and how a host runs it on host arrays.

One call takes one state's rows, P of the block's B positions (B, or runs of P fixed at export: `first_position`
says which), and returns only O(P x (D + 32)) values (written below for N states and P = B):

  inputs   logits [N,B,V] float32      the target's logits of N block states
           first_position [] int64     block position of the rows' first position (0 for whole blocks)
           node_steps [N] int64        commit step t_n of each state (docs/spec.md §3's step index)
           seed, block [] int64        noise counters, in [0, 2**32)
           temperature [] float64      T >= 0; T = 0 is argmax with confidence softmax(L)
           top_k [] int64              0 disables; top-p is host-only (check_sampling)
           exclude_token [] int64      a token never sampled (the mask id), -1 = none; kept in the softmax
  outputs  token [N,B] int64, confidence [N,B] float64        F's sample at step t_n, every position i
           future_tokens [N,D,B] int64, future_conf [N,D,B]   coupled samples of the same logits, steps t_n+1..t_n+D
           future_runner_up [N,D,B] int64, future_gap [N,D,B] float64   their runner-ups and score gaps
                                       (spot.runtime.step.top2_scaled: -1 / inf where no other token can be sampled)
           top_logprobs [N,B,32] float32, top_ids [N,B,32] int64  the 32 largest log softmax(L/T) (softmax(L) at
                                       T = 0), descending: the drafter's stale features (spot.runtime.stale);
                                       vocabularies under 32 pad with -1e4 and id -1 as stale.topk_logprobs does
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable, Protocol

import numpy as np

from spot.errors import SpotError
from spot.ortlib import load_onnxruntime

EPILOGUE_FILE = "epilogue.onnx"
DEFAULT_FUTURE_STEPS = 8          # = the default tree depth of `spot generate` / `spot bench`

INPUTS = ("logits", "node_steps", "seed", "block", "temperature", "top_k", "exclude_token", "first_position")
POSITION_INPUT = "first_position"
OUTPUTS = ("token", "confidence", "future_tokens", "future_conf", "top_logprobs", "top_ids", "future_runner_up",
           "future_gap")
FALLBACK_OUTPUT = "exact_fallback"  # [] bool, a diagnostic: the certificate failed and the exact noise ran

# The certified sampling every implementation of the epilogue runs (the ONNX graph, its torch twin
# spot.reference.noise_torch): rank with the backend's native noise, re-score the best CANDIDATES exactly, and
# certify that no other token can reach the top two.
CANDIDATES = 3                   # tokens per row re-scored with the exact noise (the certificate uses the next one)
# |native - exact| Gumbel value bound the certificate assumes: a backend log within 2**-40 relative of the C library's
# gives at most ~2**-38 (-log(u) is off by a relative 2**-40, shifting log(-log(u)) by 2**-40, plus the outer log's own
# 37 * 2**-40)
NATIVE_NOISE_MARGIN = 2.0 ** -30

# The sampling epilogue's peak memory in units of its float64 noise/score tensor N x (D+1) x B x V x 8 bytes:
# measured 8.99 (V 2048 and V 8192, N 1: the hosts' calls), 8.8 (V 2048, N 4), 9.3 (V 2048, N 16), D 8, B 32, on
# ORT CPU with the memory arena off (peak RSS); the GPU providers plan memory the same way but were not measured
EPILOGUE_PEAK_FACTOR = 9.5
EPILOGUE_CALL_BUDGET = 2 ** 30   # the default positions per epilogue call keep its peak under this


@dataclass(frozen=True)
class EpilogueCall:
    """One call of the sampling epilogue as the hosts make it: one state, `positions` of its B positions (all of
    them, or runs of that many), D = `future_steps`."""
    future_steps: int
    positions: int

    def peak_bytes(self, vocab: int) -> int:
        return int(EPILOGUE_PEAK_FACTOR * (self.future_steps + 1) * self.positions * vocab * 8)


def default_epilogue_positions(vocab: int, block_size: int, future_steps: int) -> int:
    """The most positions per call (a divisor of the block size, at least 1) whose peak stays under
    EPILOGUE_CALL_BUDGET: the whole block for small vocabularies, 8 of 32 at SDAR's (0.8 GiB at D 8)."""
    fits = [p for p in range(1, block_size + 1) if block_size % p == 0 and
            EpilogueCall(future_steps, p).peak_bytes(vocab) <= EPILOGUE_CALL_BUDGET]
    return max(fits, default=1)


# -- running it -------------------------------------------------------------------------------------------------
class SamplingParams(Protocol):
    """The sampling parameters the epilogue takes (spot.runtime.step.Sampling has them, checked): named here as what
    the contract reads, so that the folder's contract does not import the runtime."""
    temperature: float
    top_k: int
    top_p: float
    seed: int
    exclude_token: int


@dataclass
class EpilogueResult:
    """The epilogue's outputs for N states' rows at P positions (P = B: whole blocks)."""
    token: np.ndarray            # [N,P] int64
    confidence: np.ndarray       # [N,P] float64
    future_tokens: np.ndarray    # [N,D,P] int64
    future_conf: np.ndarray      # [N,D,P] float64
    top_logprobs: np.ndarray     # [N,P,32] float32
    top_ids: np.ndarray          # [N,P,32] int64 (-1 in the padding of vocabularies under 32)
    # the runner-up coupled samples of steps t_n+1 .. t_n+D (spot.runtime.step.top2_scaled): [N,D,B] int64 (-1 where
    # none) and the score gaps to the winners [N,D,B] float64 (inf there)
    future_runner_up: np.ndarray
    future_gap: np.ndarray

    @staticmethod
    def concat(parts: list["EpilogueResult"], along: str = "nodes") -> "EpilogueResult":
        """Join results of consecutive node ranges (along="nodes") or position runs (along="positions")."""
        def axis(f):
            return 0 if along == "nodes" else 2 if f.startswith("future_") else 1
        return EpilogueResult(*(np.concatenate([getattr(p, f) for p in parts], axis=axis(f)) for f in OUTPUTS))


def check_positions(positions: int, block_size: int, what: str, hint: str = "") -> None:
    """SpotError unless `positions` (a state's positions per epilogue call, named `what` in the message) divides the
    block size: a state's rows run in equal runs."""
    if not (1 <= positions <= block_size and block_size % positions == 0):
        raise SpotError(f"{what} must divide the block size {block_size}, got {positions}", hint)


def join_runs(block_size: int, positions: int, run: Callable[[int], EpilogueResult]) -> EpilogueResult:
    """run(first) for each run of `positions` positions from 0 to the block size, joined along the positions (one
    run: returned as it is)."""
    parts = [run(first) for first in range(0, block_size, positions)]
    return parts[0] if len(parts) == 1 else EpilogueResult.concat(parts, along="positions")


def check_sampling(sampling: SamplingParams) -> None:
    """The epilogue implements temperature, seed and top-k; top-p stays on the host (numpy step function)."""
    if sampling.top_p < 1.0:
        raise SpotError(f"the device sampling epilogue does not implement top-p (got `top_p={sampling.top_p}`)",
                        "leave out `top_p` (1), or sample on the host: `sampler=\"host\"`")


def epilogue_feeds(logits: np.ndarray, node_steps, sampling: SamplingParams, block: int,
                   first_position: int = 0) -> dict:
    """Every input of the epilogue as host arrays: logits [N,P,V] float32 (positions first_position ..
    first_position + P - 1 of each state) plus epilogue_scalars."""
    return {"logits": np.ascontiguousarray(logits, dtype=np.float32),
            **epilogue_scalars(node_steps, sampling, block), POSITION_INPUT: np.array(first_position, np.int64)}


def epilogue_scalars(node_steps, sampling: SamplingParams, block: int) -> dict:
    """The inputs besides the logits (which an engine may bind on the device) and first_position (an engine's
    position runs): node_steps [N] and the scalars."""
    check_sampling(sampling)
    steps = np.asarray(node_steps, dtype=np.int64).reshape(-1)
    if steps.size and (steps.min() < 0 or steps.max() > 0xFFFFFFFF):
        raise SpotError(f"node steps must be in [0, 2**32), got range [{steps.min()}, {steps.max()}]")
    if not 0 <= block <= 0xFFFFFFFF:
        raise SpotError(f"block index must be in [0, 2**32), got {block}")
    return {"node_steps": steps,
            "seed": np.array(sampling.seed, np.int64), "block": np.array(block, np.int64),
            "temperature": np.array(sampling.temperature, np.float64), "top_k": np.array(sampling.top_k, np.int64),
            "exclude_token": np.array(sampling.exclude_token, np.int64)}


def graph_positions(session) -> int | None:
    """The positions per call an epilogue session takes (its logits' static dim 1); None where it is dynamic."""
    dim = next(i for i in session.get_inputs() if i.name == "logits").shape[1]
    return dim if isinstance(dim, int) else None


def make_epilogue_session(model_or_path, providers=None, threads: int | None = None):
    ort = load_onnxruntime()
    so = ort.SessionOptions()
    so.log_severity_level = 3
    if threads:
        so.intra_op_num_threads = int(threads)
    src = model_or_path.SerializeToString() if hasattr(model_or_path, "SerializeToString") else str(model_or_path)
    return ort.InferenceSession(src, so, providers=providers or ["CPUExecutionProvider"])


def run_epilogue(session, logits: np.ndarray, node_steps, sampling: SamplingParams, block: int,
                 chunk: int | None = None) -> EpilogueResult:
    """Run the epilogue on host arrays logits [N,B,V] (tests, CPU): `chunk` nodes per call at most, in runs of the
    positions the graph takes (graph_positions)."""
    n, b = logits.shape[:2]
    epilogue_scalars(node_steps, sampling, block)      # the counters' ranges, before any run
    chunk, positions = chunk or n, graph_positions(session) or b
    takes = {i.name for i in session.get_inputs()}

    def run(s: int, first: int) -> EpilogueResult:
        feeds = epilogue_feeds(logits[s:s + chunk, first:first + positions], np.asarray(node_steps)[s:s + chunk],
                               sampling, block, first)
        return EpilogueResult(*session.run(list(OUTPUTS), {k: v for k, v in feeds.items() if k in takes}))
    parts = [join_runs(b, positions, partial(run, s)) for s in range(0, n, chunk)]
    return parts[0] if len(parts) == 1 else EpilogueResult.concat(parts)
