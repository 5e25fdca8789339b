"""`spot tune` on a busy machine: measured 1 node at 2.8 ms and 2 nodes at 60.9 ms, and recorded that curve. The
spread of its repeated measurements, and a pass growing far more than proportionally with its states, now say the
machine was busy (spot.runtime.tuning.Noise); the CLI then records nothing (tests/test_cli_e2e.py)."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spot.runtime.tuning import NOISE_LIMIT, Noise, busy_machine_note, latency_curve, latency_spreads, spread

timings = st.lists(st.floats(0.1, 1e4, allow_nan=False), min_size=1, max_size=9)


def test_spread_is_the_median_above_the_fastest():
    assert spread([2.0, 2.0, 2.0]) == 0.0
    assert spread([2.0, 3.0, 10.0]) == pytest.approx(0.5)
    assert spread([4.0]) == 0.0


@settings(max_examples=80, deadline=None)
@given(timings, st.floats(0.1, 10.0))
def test_spread_ignores_the_scale(times, scale):
    assert spread([t * scale for t in times]) == pytest.approx(spread(times), abs=1e-9)
    assert spread(times) >= 0.0


def test_the_busy_machines_curve_is_noise():
    """The reported case: every repeat of each size alike (no spread), but 2 states 22x the cost of 1."""
    samples = {1: [2.8] * 5, 2: [60.9] * 5, 4: [61.0] * 5}
    noise = Noise.of(latency_spreads(samples))
    assert not noise.quiet and noise.where == "latency from 1 to 2 nodes"
    assert noise.spread == pytest.approx(60.9 / 5.6 - 1)
    note = busy_machine_note(noise.to_dict())
    assert "latency from 1 to 2 nodes spread 988%" in note and f"more than {NOISE_LIMIT:.0%}" in note


@settings(max_examples=80, deadline=None)
@given(st.floats(0.5, 50.0), st.floats(0.0, 1.0), st.lists(st.floats(1.0, 1.0 + NOISE_LIMIT), min_size=5,
                                                           max_size=5))
def test_a_proportional_or_flat_curve_with_small_jitter_is_quiet(one, slope, jitter):
    """Compute-bound (N passes cost ~N) to memory-bound (flat), repeats within the limit: quiet."""
    samples = {n: [one * (1 + slope * (n - 1)) * j for j in sorted(jitter)] for n in (1, 2, 4, 8, 16)}
    assert Noise.of(latency_spreads(samples)).quiet


def test_repeats_that_spread_are_noise():
    samples = {1: [1.0, 1.0, 3.0, 3.0, 3.0], 2: [2.0] * 5}
    noise = Noise.of(latency_spreads(samples))
    assert not noise.quiet and noise.where == "latency of 1 node"


def test_the_curve_is_still_the_fastest_made_non_decreasing():
    assert latency_curve({1: [3.0, 2.0], 2: [1.5, 9.0], 4: [4.0]}) == {1: 1.5, 2: 1.5, 4: 4.0}


def test_nothing_repeated_is_quiet():
    assert Noise.of({}).to_dict() == {"largest_spread": 0.0, "where": "nothing repeated", "limit": NOISE_LIMIT,
                                      "quiet": True}


def test_the_tuner_reports_the_noise_of_its_curve_and_decodes(monkeypatch):
    """tune_budget measures the curve's samples and each candidate's repeated decodes, and says how noisy they
    were (here a curve like the busy machine's)."""
    import spot.app.bench_run as bench
    from test_spot import engine_for

    from spot.prompts import Prompt
    from spot.runtime.spot import TreeBudget
    monkeypatch.setattr(bench, "measure_latency_samples", lambda *a, **k: {1: [2.8] * 5, 2: [60.9] * 5})
    tuned = bench.tune_budget(engine_for(4, 3), [Prompt("p", [1, 2, 3, 4, 5])], 1.0, [TreeBudget(2, 1)],
                              decoder="tree", node_counts=(1, 2))
    assert tuned["latency_ms"] == {1: 2.8, 2: 60.9}
    assert tuned["noise"]["quiet"] is False and tuned["noise"]["where"] == "latency from 1 to 2 nodes"
    quiet = bench.tune_budget(engine_for(4, 3), [Prompt("p", [1, 2, 3, 4, 5])], 1.0, [TreeBudget(2, 1)],
                              decoder="tree", curve={1: 1.0, 2: 1.5})
    assert quiet["noise"]["where"] in ("decodes of standard", "decodes of tree 2x1")
