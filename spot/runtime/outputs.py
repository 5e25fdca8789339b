"""What one target pass gives the host loop, per block state: F's next state and the stale view a SPOT round
drafts from. Two sources behind one interface, so every decoder runs on either:

HostOutputs    the logits [B, V] reached the host (CPU engines): samples are computed lazily with numpy
               (spot.runtime.step / spot.runtime.stale), only where the walk or the drafter needs them.
SampledOutputs the sampling epilogue ran next to the target (spot.export.epilogue_graph, GPU paths): the host received
               O(B x (D + 32)) values per state — F's samples at the state's step, the coupled samples of the
               next D steps and their runner-ups, the top-32 log-probabilities — equal to the numpy ones bit for
               bit, never the logits.
DeferredOutputs a state's SampledOutputs, computed when first read: the logits stay on the device and the epilogue
               runs for the states the walk visits (the one a round drafts from among them): once per commit step,
               as in standard decoding, one state per call — its cost and peak memory do not grow with the tree.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from spot.errors import SpotError
from spot.runtime.noise import NoiseCache
from spot.runtime.stale import SampledStaleView, StaleView
from spot.runtime.step import CommitRule, Sampling, commit_samples, step_fn


@dataclass
class HostOutputs:
    """One state's logits on the host. logits [B, V] float32; step: the commit step F applies to this state."""

    logits: np.ndarray
    step: int
    sampling: Sampling
    block: int
    noise: NoiseCache | None = None    # the decode's noise cache (None: rows computed on each use)
    # raises: called on the first read when the logits hold NaN / inf. Checked then, not when the pass returns: a
    # walk reads ~3 of a 16-state verify pass's states (the check of all 16 cost ~0.1-0.4 ms of host time per pass)
    non_finite: Callable[[], None] | None = None

    def _read(self) -> np.ndarray:
        if self.non_finite is not None:
            if not np.isfinite(self.logits).all():
                self.non_finite()
            self.non_finite = None          # finite: not checked again
        return self.logits

    def next_state(self, state: np.ndarray, mask_id: int, rule: CommitRule) -> np.ndarray:
        return step_fn(state, self._read(), mask_id, rule, self.sampling, self.block, self.step, self.noise)

    def stale(self, masked: np.ndarray, independent_noise: bool = False) -> StaleView:
        return StaleView(self._read(), masked, self.sampling, self.block, independent_noise, self.noise)

    def host_logits(self) -> np.ndarray:
        return self._read()


@dataclass(frozen=True)
class SampledOutputs:
    """One state's epilogue results (spot.folder.epilogue.EpilogueResult row n).

    token [B] int64, confidence [B] float64: F's sample at `step` for every position;
    future_tokens [D, B] int64, future_conf [D, B] float64: coupled samples at steps step+1 .. step+D;
    top_logprobs [B, 32] float32: the drafter's stale features;
    future_runner_up [D, B] int64, future_gap [D, B] float64: the coupled samples' runner-ups and score gaps."""

    token: np.ndarray
    confidence: np.ndarray
    future_tokens: np.ndarray
    future_conf: np.ndarray
    top_logprobs: np.ndarray
    step: int
    future_runner_up: np.ndarray
    future_gap: np.ndarray

    def next_state(self, state: np.ndarray, mask_id: int, rule: CommitRule) -> np.ndarray:
        masked = np.flatnonzero(state == mask_id)
        if masked.size == 0:
            return state
        return commit_samples(state, masked, self.token[masked], self.confidence[masked], rule)

    def stale(self, masked: np.ndarray, independent_noise: bool = False) -> SampledStaleView:
        if independent_noise:
            raise SpotError("the independent-noise ablation needs the logits on the host",
                            "run it with the host sampler (`sampler=\"host\"`)")
        return SampledStaleView(self.future_tokens, self.future_conf, self.step + 1, masked, self.top_logprobs,
                                self.future_runner_up, self.future_gap)

    def host_logits(self) -> np.ndarray:
        raise SpotError("this decoder reads the full logits, but the engine samples on the device and returns "
                        "only the epilogue's outputs", "use the host sampler (`sampler=\"host\"`) for it")


class DeferredOutputs:
    """SampledOutputs made by `sample()` on first use (one epilogue call over this state's logits), which is then
    dropped: once sampled, nothing here holds the pass's device logits."""

    def __init__(self, sample: Callable[[], SampledOutputs]):
        self._sample: Callable[[], SampledOutputs] | None = sample
        self._outputs: SampledOutputs | None = None

    @property
    def sampled(self) -> bool:
        return self._outputs is not None

    def outputs(self) -> SampledOutputs:
        if self._outputs is None:
            self._outputs, self._sample = self._sample(), None
        return self._outputs

    def next_state(self, state: np.ndarray, mask_id: int, rule: CommitRule) -> np.ndarray:
        return self.outputs().next_state(state, mask_id, rule)

    def stale(self, masked: np.ndarray, independent_noise: bool = False) -> SampledStaleView:
        return self.outputs().stale(masked, independent_noise)

    def host_logits(self) -> np.ndarray:
        return SampledOutputs.host_logits(self)


def host_outputs(logits: np.ndarray, steps, sampling: Sampling, block: int, noise: NoiseCache | None = None,
                 non_finite: Callable[[], None] | None = None) -> list[HostOutputs]:
    """logits [N, B, V] of N states whose commit steps are steps [N] -> one HostOutputs per state. non_finite: what
    reading a state whose logits hold NaN / inf raises (checked on a state's first read, raised only then)."""
    return [HostOutputs(logits[i], int(s), sampling, block, noise, non_finite) for i, s in enumerate(steps)]


def sampled_outputs(result, steps) -> list[SampledOutputs]:
    """An EpilogueResult of N states (spot.folder.epilogue) whose node_steps were steps [N] -> one per state."""
    return [SampledOutputs(result.token[i], result.confidence[i], result.future_tokens[i], result.future_conf[i],
                           result.top_logprobs[i], int(s), result.future_runner_up[i], result.future_gap[i])
            for i, s in enumerate(steps)]
