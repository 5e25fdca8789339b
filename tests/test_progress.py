"""Long runs say how far they are and how long is left (spot.progress): `spot bench --limit 1` ran 31 minutes with
three lines of output, and `spot tune` 23 minutes with none between its budgets."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spot.progress import Progress, duration_text, estimate_left


def test_durations_read_as_a_person_writes_them():
    assert [duration_text(s) for s in (0, 44.6, 60, 200, 3599, 3600, 3900)] == [
        "0 s", "45 s", "1 min 00 s", "3 min 20 s", "59 min 59 s", "1 h 00 min", "1 h 05 min"]


def test_the_estimate_is_the_rate_so_far():
    assert estimate_left(10.0, 0, 5) is None
    assert estimate_left(10.0, 2, 6) == pytest.approx(20.0)
    assert estimate_left(10.0, 6, 6) == 0.0


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.0, 30.0), min_size=1, max_size=40), st.floats(1.0, 20.0))
def test_lines_come_at_most_every_few_seconds_and_always_at_the_end(gaps, every):
    clock, lines = FakeClock(), []
    progress = Progress(len(gaps), lines.append, every=every, clock=clock)
    printed_at = []
    for i, gap in enumerate(gaps):
        clock.now += gap
        before = len(lines)
        progress.step(f"unit {i}")
        if len(lines) > before:
            printed_at.append(clock.now)
    assert lines and lines[-1].startswith(f"[{len(gaps)}/{len(gaps)}] unit {len(gaps) - 1}: ")
    assert lines[-1].endswith("elapsed, done")
    assert all(b - a >= every for a, b in zip(printed_at, printed_at[1:-1]))     # the last line comes regardless
    assert all("left" in line for line in lines[:-1])


def test_a_line_says_done_elapsed_and_left():
    clock, lines = FakeClock(), []
    progress = Progress(4, lines.append, every=5.0, clock=clock)
    clock.now = 6.0
    progress.step("prompt 0 spot@16x8")
    assert lines == ["[1/4] prompt 0 spot@16x8: 6 s elapsed, about 18 s left"]
    Progress(4, None).step("nothing said without a say")


def test_bench_says_its_decodes_up_front_and_its_progress_with_the_time_left():
    """The number of decodes is said before the first (a run of an hour says so at once), then progress by decode,
    not only after a whole (prompt, seed, temperature) group of every row."""
    from test_spot import engine_for

    from spot.app.bench_run import BenchConfig, bench_size, run_bench
    from spot.prompts import Prompt
    from spot.runtime.spot import TreeBudget
    engine = engine_for(4, 3)
    lines = []
    cfg = BenchConfig(("standard", "tree"), (0.0, 1.0), (0,), (TreeBudget(4, 2),), 8,
                      independent_noise_ablation=False)
    assert bench_size(engine, 1, cfg).startswith("4 decodes: 1 prompt(s) x 1 seed(s) x 2 temperature(s) x 2 rows")
    assert bench_size(engine, 10, BenchConfig()).startswith(
        "360 decodes: 10 prompt(s) x 1 seed(s) x 3 temperature(s) x 12 rows")     # the defaults, as --help says
    run_bench(engine, [Prompt("p", np.arange(1, 6).tolist())], cfg, progress=lines.append)
    assert lines[-1].startswith("[4/4] prompt p seed 0 T=1 tree@4x2: ") and lines[-1].endswith("done")
