"""The optimizer's time budget: one clock, one deadline, named shares of it, and one question -- does a
measurement of this cost still fit?

Why one object: every stage asks the same thing before it starts a measurement (the layouts before a
value's block, stage 1 before each turn of complete iterations, stage 2 before each probe, trial and
validation block), and each used to ask it in its own form (a share of `--budget-s` in the command, an
elapsed-seconds check in stage 1, deadlines on `time.perf_counter()` in stage 2). A `Budget` is
immutable: a stage gets its own by `share` (a named fraction of the whole, from the start or from now)
or `until` (an earlier deadline, e.g. stage 2's iteration count). The clock is injected, so tests run
the stages on a fake clock; the command uses the measuring session's clock (seconds since the command
started), on which stage 1's, the layouts' and stage 2's deadlines are all expressed.

The shares' values and why are in `Settings` (`stage1_share`, `layout_share`) and docs/optimizer.md.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

__all__ = ["Budget", "BlockCost"]

Clock = Callable[[], float]


@dataclass(frozen=True)
class Budget:
    """`deadline` on `clock` (None: no time limit); `total_s` the seconds this budget was given (for
    messages); `started` when the whole budget began, on `clock`; `shares` the named fractions of the
    whole that `share` hands out."""

    deadline: float | None = None
    clock: Clock = time.perf_counter
    total_s: float | None = None
    started: float = 0.0
    whole_s: float | None = None  # the whole budget's seconds (what a share is a fraction of)
    shares: Mapping[str, float] = field(default_factory=dict)

    @classmethod
    def of(cls, total_s: float | None, clock: Clock = time.perf_counter, started: float | None = None,
           shares: Mapping[str, float] | None = None) -> Budget:
        """`total_s` seconds from `started` (default: now) on `clock`; None: unlimited."""
        t0 = clock() if started is None else started
        return cls(None if total_s is None else t0 + total_s, clock, total_s, t0, total_s, dict(shares or {}))

    def now(self) -> float:
        return self.clock()

    @property
    def limited(self) -> bool:
        return self.deadline is not None

    def left(self) -> float | None:
        """Seconds until the deadline (negative once past it); None without one."""
        return None if self.deadline is None else self.deadline - self.clock()

    def spent(self) -> bool:
        """Past the deadline."""
        return self.deadline is not None and self.clock() > self.deadline

    def reached(self) -> bool:
        """At or past the deadline (nothing more may start, not even a free step)."""
        return self.deadline is not None and self.clock() >= self.deadline

    def fits(self, cost_s: float) -> bool:
        """Would a measurement expected to take `cost_s` seconds, started now, end by the deadline?"""
        return self.deadline is None or self.clock() + cost_s <= self.deadline

    def share(self, name: str, from_now: bool = False) -> Budget:
        """The named share of the whole budget, counted from its start (or from now): a budget of
        `fraction x whole` seconds. Unlimited stays unlimited."""
        if self.whole_s is None:
            return self
        seconds = self.shares[name] * self.whole_s
        start = self.clock() if from_now else self.started
        return replace(self, deadline=start + seconds, total_s=seconds)

    def whole(self) -> Budget:
        """The whole budget this share was cut from (itself when it is the whole, or unlimited)."""
        if self.whole_s is None:
            return self
        return replace(self, deadline=self.started + self.whole_s, total_s=self.whole_s)

    def until(self, deadline: float | None) -> Budget:
        """This budget, ending at `deadline` instead where that is earlier (None: unchanged)."""
        if deadline is None or (self.deadline is not None and self.deadline <= deadline):
            return self
        return replace(self, deadline=deadline)


@dataclass(frozen=True)
class BlockCost:
    """What a block of complete iterations costs: its iterations at `iteration_s` each, plus `overhead_s`
    (a process restart, the plan switch, a slow first iteration: the most seen so far)."""

    iteration_s: float
    overhead_s: float = 0.0

    def block(self, iterations: int) -> float:
        return iterations * self.iteration_s + self.overhead_s
