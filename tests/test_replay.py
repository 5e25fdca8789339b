"""Replaying recorded standard decoding (spot.training.replay) gives the tree decoders' exact target passes."""
from __future__ import annotations

import numpy as np
import pytest

from spot.runtime.decode_plan import DecodeRequest, run_decoder
from spot.runtime.registry import TREE_BRANCH, decoder as decoder_entry
from spot.runtime.proposers import ConfidenceOrderProposer, OracleProposer, OrderOracleProposer
from spot.runtime.spot import TreeBudget
from spot.runtime.step import Sampling
from spot.training.replay import record_standard, replay_passes
from tinymodels import PEAKED_MASK, peaked_engine as engine_for

MASK = PEAKED_MASK



def proposer_for(name: str, rec):
    return {"chain": lambda: ConfidenceOrderProposer(branch=1),
            "tree": lambda: ConfidenceOrderProposer(branch=TREE_BRANCH),
            "oracle": lambda: OracleProposer(rec.trajectories()),
            "order-oracle": lambda: OrderOracleProposer(rec.trajectories())}[name]()


@pytest.mark.parametrize("block_size,temperature", [(8, 0.0), (8, 1.0), (16, 0.5)])
def test_replayed_passes_equal_the_decoders(block_size, temperature):
    engine = engine_for(block_size, 1)
    rng = np.random.default_rng(block_size)
    for prompt_len in (0, 9):
        prompt = rng.integers(0, 60, size=prompt_len)
        for budget in (TreeBudget(1, 4), TreeBudget(6, 3), TreeBudget(12, 6)):
            req = DecodeRequest(24, sampling=Sampling(temperature, seed=3), budget=budget)
            rec = record_standard(engine, prompt, req)
            assert rec.standard_passes == run_decoder("standard", engine, prompt, req).stats.target_passes
            for name in ("chain", "tree", "oracle", "order-oracle"):
                got = run_decoder(name, engine, prompt, req).stats.target_passes
                assert replay_passes(rec, proposer_for(name, rec), decoder_entry(name).verified_budget(budget, engine)) == got, \
                    (name, budget, prompt_len)
