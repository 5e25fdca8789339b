"""Progress of a long run (spot bench, spot tune): how many of its decodes are done, the time spent and an estimate
of the time left, at most one line every few seconds, so that a run of an hour says so early and never looks hung."""
from __future__ import annotations

import time
from typing import Callable


def estimate_left(elapsed: float, done: int, total: int) -> float | None:
    """Seconds left at the rate so far (None before the first unit is done)."""
    if done <= 0:
        return None
    return elapsed / done * max(total - done, 0)


def duration_text(seconds: float) -> str:
    """`45 s`, `3 min 20 s`, `1 h 05 min`: a duration as a person reads it."""
    s = max(int(round(seconds)), 0)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


class Progress:
    """Counts `total` units of work; `step(what)` after each says `[done/total] what: X elapsed, about Y left` when
    `every` seconds have passed since the last line, and always after the last unit."""

    def __init__(self, total: int, say: Callable[[str], None] | None, every: float = 10.0,
                 clock: Callable[[], float] = time.monotonic):
        self.total, self.say, self.every, self.clock = total, say, every, clock
        self.done = 0
        self.start = self.last = clock()

    def step(self, what: str) -> None:
        self.done += 1
        now = self.clock()
        if self.say is None or (now - self.last < self.every and self.done < self.total):
            return
        self.last = now
        elapsed = now - self.start
        left = estimate_left(elapsed, self.done, self.total)
        tail = "done" if self.done >= self.total else f"about {duration_text(left)} left"
        self.say(f"[{self.done}/{self.total}] {what}: {duration_text(elapsed)} elapsed, {tail}")
