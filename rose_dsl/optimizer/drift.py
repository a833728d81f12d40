"""Optimizing the whole run (`rose optimize --train --max-overhead P`): when the running plan's iteration
times drift from what the search measured, and how much of the run the searches after the first may cost.
Pure: the rule, the overhead's books and a measurer wrapper that keeps them; the loop that trains, watches
and switches is the runtime's (the optimizer package's `continuous` module, beside its driver).

**The drift rule** (`DriftRule`). The search ends with the plan's measured iteration time, `expected` (the
before/after's median of the plan). Training then feeds every iteration's seconds to a `DriftMonitor`; the
first iteration after a switch of plans is left out (it carries the switch). Over the last `window`
iterations: m = their median, s = 1.4826 x the median absolute deviation of their logarithms (a robust
standard deviation of one iteration's log-time). The window *drifts* when |ln(m / expected)| exceeds
max(ln(1 + min_shift), z x s): a shift of more than `min_shift` (20%) that is also more than z (3) of the
window's own robust spreads. The monitor asks for a search when `confirm` (4) consecutive windows drift the
same way. Why a median over a window and a confirmation: one stall (a loaded machine, a garbage collection)
moves a mean and a single iteration, not a median of 12 four times running; why a floor on the shift: a
search costs seconds of measuring candidates that lose, which a 5% change will not pay back; why the
window's own spread: on a loaded machine (spreads of 100%) a 20% shift is noise. Measured on seeded
log-normal noise with 5% stalls that triple an iteration (tests/optimizer/test_drift.py): no false drift in
200 runs of 500 iterations at a per-iteration sigma of 0.2, 2 of 200 at 0.5; a 2x shift seen in 200 of 200
runs at sigma 0.2 (median 13 iterations after it), a 1.5x shift at sigma 0.05 within 14.

**The overhead** (`Overhead`). The first search has its own budget (`--budget-s`). Each search after it is
charged its *losing seconds*: its wall time minus the turns of the plan that was training when it started
(the incumbent: those iterations are the training the run would have done anyway) and minus the turns of
the plan it chose (training on the plan the run goes on with). What is left -- candidates that lost, local
trials and captures, plan set-up, switches -- is the overhead. A search may start only when the
allowance, `max_share x elapsed - spent`, holds at least the losing seconds the last search cost (`need`);
it then runs on a `Budget` of that allowance whose clock counts wall time minus the incumbent's turns
(`Ledger.clock`: an upper bound on its losing seconds so far, as the chosen plan is known only at the end).
So after every search `spent <= max_share x elapsed`, up to the one turn the search's own estimate let start
within its budget and that ran longer (a fake clock tests the bound: tests/optimizer/test_drift.py).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..ir import Workflow
from .budget import Budget
from .profile import IterationRun

__all__ = ["DriftRule", "DriftMonitor", "Drift", "Ledger", "Overhead", "MeteredMeasurer", "plan_label"]

Clock = Callable[[], float]


def plan_label(requests: Sequence[str]) -> str:
    """The label the search gives a plan's iterations: its rewrite requests, `; `-joined ("" is the declared
    graph)."""
    return "; ".join(requests)


@dataclass(frozen=True)
class Drift:
    """One window's evidence: its median and robust spread, the expected time, the shift (median / expected)
    and the threshold it was held to (a ratio), and whether it drifted."""

    median_s: float
    spread: float  # robust sd of ln(iteration time) over the window
    expected_s: float
    ratio: float
    threshold: float  # the ratio (>= 1) beyond which a shift drifts, either way
    drifted: bool

    def to_json(self) -> dict[str, Any]:
        return {"window_median_s": round(self.median_s, 6), "window_log_spread": round(self.spread, 4),
                "expected_s": round(self.expected_s, 6), "ratio": round(self.ratio, 4),
                "threshold_ratio": round(self.threshold, 4), "drifted": self.drifted}


@dataclass(frozen=True)
class DriftRule:
    """See the module's docstring: `window` iterations, a shift beyond max(`min_shift`, `z` robust spreads),
    `confirm` consecutive windows."""

    window: int = 12
    min_shift: float = 0.2
    z: float = 3.0
    confirm: int = 4

    def judge(self, expected_s: float, times: Sequence[float]) -> Drift | None:
        """The verdict on the last `window` of `times` (None until there are that many)."""
        if len(times) < self.window or expected_s <= 0:
            return None
        last = [max(t, 1e-9) for t in times[-self.window:]]
        med = statistics.median(last)
        logs = [math.log(t) for t in last]
        centre = statistics.median(logs)
        spread = 1.4826 * statistics.median(abs(x - centre) for x in logs)
        threshold = math.exp(max(math.log1p(self.min_shift), self.z * spread))
        ratio = med / expected_s
        return Drift(med, spread, expected_s, ratio, threshold, abs(math.log(ratio)) > math.log(threshold))


@dataclass
class DriftMonitor:
    """The running plan's iterations against `expected_s` (see `DriftRule`). `observe` each iteration's
    seconds; `drifted` once `confirm` consecutive windows drifted the same way (it stays so until `rebase`)."""

    rule: DriftRule
    expected_s: float
    skip: int = 1  # iterations left out at the start (the first after a switch carries it)
    times: list[float] = field(default_factory=list)
    streak: int = 0  # consecutive drifting windows, signed by direction
    last: Drift | None = None
    drifted: bool = False

    def observe(self, seconds: float) -> bool:
        if self.skip > 0:
            self.skip -= 1
            return self.drifted
        self.times.append(float(seconds))
        del self.times[:-self.rule.window]
        verdict = self.rule.judge(self.expected_s, self.times)
        if verdict is None:
            return self.drifted
        self.last = verdict
        if verdict.drifted:
            sign = 1 if verdict.ratio > 1 else -1
            self.streak = self.streak + sign if self.streak * sign > 0 else sign
        else:
            self.streak = 0
        if abs(self.streak) >= self.rule.confirm:
            self.drifted = True
        return self.drifted

    def rebase(self, expected_s: float, skip: int = 1) -> None:
        """A new expected time (a search measured the plan again, or chose another): start over."""
        self.expected_s, self.skip = float(expected_s), skip
        self.times, self.streak, self.last, self.drifted = [], 0, None, False


@dataclass
class Ledger:
    """One search's turns by plan label, on the measurer's clock: `incumbent` is the label of the plan that
    was training when it started. `clock()` is the search's overhead clock: seconds since `start` minus the
    incumbent's turns (what the `Budget` of a search after the first runs on)."""

    wall: Clock
    incumbent: str
    start: float = 0.0
    by_label: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.start = self.wall()

    def turn(self, label: str, seconds: float) -> None:
        self.by_label[label] = self.by_label.get(label, 0.0) + max(0.0, seconds)

    def wall_s(self) -> float:
        return self.wall() - self.start

    def clock(self) -> float:
        return self.wall_s() - self.by_label.get(self.incumbent, 0.0)

    def losing_s(self, chosen: str) -> float:
        """The search's losing seconds, once it chose `chosen` (see the module's docstring)."""
        kept = self.by_label.get(self.incumbent, 0.0) + (self.by_label.get(chosen, 0.0) if chosen != self.incumbent else 0.0)
        return max(0.0, self.wall_s() - kept)


class MeteredMeasurer:
    """A `Measurer` that books each turn of complete iterations in a `Ledger`: a call for one plan (the search
    hands turns over one at a time) is booked whole, its switch and set-up included; a call for several
    plans books each plan's measured seconds, the rest of the call's wall time to none (overhead). Everything
    else is the wrapped measurer's."""

    def __init__(self, inner: Any, ledger: Ledger) -> None:
        self._inner, self.ledger = inner, ledger

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def complete(self, plans: Sequence[Workflow], rounds: int, warmup: int = 0, labels: Sequence[str] = (),
                 guard_first: bool = False) -> list[list[IterationRun]]:
        t0 = self.ledger.wall()
        try:
            out: list[list[IterationRun]] = self._inner.complete(plans, rounds, warmup, labels, guard_first=guard_first)
        finally:
            wall = self.ledger.wall() - t0
        names = list(labels) or ["" for _ in plans]
        if len(plans) == 1:
            self.ledger.turn(names[0], wall)
        else:
            for name, runs in zip(names, out, strict=False):
                self.ledger.turn(name, sum(r.seconds for r in runs))
        return out


@dataclass
class Overhead:
    """The run's overhead books: `max_share` of the run's elapsed time (on `clock`, counted from `started`)
    that searches after the first may spend on candidates that lose; `spent_s` what they spent; `need_s`
    what the next one is expected to cost (the last one's losing seconds; the first search's to begin with)."""

    max_share: float
    clock: Clock
    started: float = 0.0
    spent_s: float = 0.0
    need_s: float = 0.0
    searches: int = 0

    def elapsed(self) -> float:
        return self.clock() - self.started

    def allowance(self) -> float:
        return self.max_share * self.elapsed() - self.spent_s

    def may_search(self) -> bool:
        return self.max_share > 0 and self.allowance() >= max(self.need_s, 0.0) and self.allowance() > 0

    def budget(self, ledger: Ledger) -> Budget:
        """A search's budget: the allowance now, on the ledger's overhead clock."""
        return Budget.of(max(0.0, self.allowance()), clock=ledger.clock, started=ledger.clock())

    def charge(self, losing_s: float) -> None:
        self.spent_s += losing_s
        self.need_s = losing_s
        self.searches += 1

    def to_json(self) -> dict[str, Any]:
        elapsed = self.elapsed()
        return {"max_share": self.max_share, "spent_s": round(self.spent_s, 4), "elapsed_s": round(elapsed, 4),
                "share": round(self.spent_s / elapsed, 5) if elapsed > 0 else 0.0,
                "allowance_s": round(self.allowance(), 4), "need_s": round(self.need_s, 4), "searches": self.searches}
