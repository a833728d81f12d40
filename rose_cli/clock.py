"""The clock `rose optimize` reads its time budget on, chosen in one place so that a test can replace it.

Why: how much of a `--budget-s` a search gets through depends on the machine's speed -- a loaded 2-core CI
machine fitted fewer layout iterations into a 60-s budget and a test failed (issue 42). Budget and
deadline logic is tested on a fake clock instead: in-process, by passing one (`FakeClock`); in a `rose`
subprocess, through the hidden environment variable `ROSE_FAKE_CLOCK=START[,TICK]` (seconds: the clock
reads START, and moves TICK seconds at every reading; TICK 0, the default, is a clock that stands still,
so no budget is ever spent). Only the budget is read on it; measured durations (iteration times) stay
real.

`budget_clock()` is the one place that reads the variable. Today the progress display's "budget left" is
on it; the optimizer's budget (`rose_dsl/optimizer`, being gathered into one `Budget` object) is to take
`budget_clock()` as its clock, replacing the `time.perf_counter()` calls of the search, the layout trials
and stage 2.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping

__all__ = ["CLOCK_ENV", "FakeClock", "budget_clock"]

CLOCK_ENV = "ROSE_FAKE_CLOCK"


class FakeClock:
    """A clock that moves only when told (`advance`) and by `tick` seconds at each reading."""

    def __init__(self, start: float = 0.0, tick: float = 0.0) -> None:
        self.now, self.tick = start, tick

    def __call__(self) -> float:
        now = self.now
        self.now += self.tick
        return now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def budget_clock(environ: Mapping[str, str] = os.environ) -> Callable[[], float]:
    """`time.perf_counter`, or the fake clock `ROSE_FAKE_CLOCK` describes (ValueError when malformed: a
    test's mistake, not a user's)."""
    spec = environ.get(CLOCK_ENV, "").strip()
    if not spec:
        return time.perf_counter
    start, _, tick = spec.partition(",")
    try:
        return FakeClock(float(start), float(tick or 0.0))
    except ValueError:
        raise ValueError(f"{CLOCK_ENV}={spec!r}: expected START[,TICK] in seconds") from None
