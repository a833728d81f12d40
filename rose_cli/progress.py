"""What a person watching a run sees while it runs: `rose execute`'s `i/N` with a time estimate, and
`rose optimize`'s budget left -- one line that fits 80 columns.

Two forms, chosen by where the output goes:

* a terminal: a live line (rich), redrawn in place, gone when the run ends;
* anything else (a CI log, `| tee`, a file): plain lines, one every ~5% of the run and at its end, so a
  log shows the progress without a line per redraw or carriage returns.

The estimate is the median of the iterations completed so far times those left: the median, not the mean,
because the first iteration of a run (start-up, compilation) and a checkpoint iteration are outliers that
would skew a mean for the rest of a short run. The lines are pure functions of what they show
(`progress_line`, `budget_note`), tested without a terminal or a clock.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, ProgressColumn, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.text import Text

__all__ = ["WIDTH", "duration", "progress_line", "budget_note", "IterationProgress", "BudgetLog", "optimizer_progress"]

WIDTH = 80  # the narrowest terminal a progress line must fit (the classic default)
NAME_WIDTH = 22  # the workflow's name is cut to this in the live line: the bar and the counts stay visible
BAR_WIDTH = 18
STATUS_WIDTH = WIDTH - NAME_WIDTH - BAR_WIDTH - 2  # what is left of the live line for `i/N ... ETA`
PLAIN_LINES = 20  # a non-terminal gets about this many progress lines per run (every ~5%)


def duration(seconds: float) -> str:
    """A duration as a person reads it at a glance: `48s`, `3m07s`, `2h05m`."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h" if s < 1000 * 86400 else ">999d"


def _per_iteration(seconds: float) -> str:
    return f"{seconds * 1e3:.0f} ms/it" if seconds < 1 else f"{seconds:.2f} s/it" if seconds < 100 else f"{duration(seconds)}/it"


def progress_line(done: int, total: int, seconds: Sequence[float], width: int = WIDTH) -> str:
    """`12/100  1.23 s/it  ETA 1m48s`: iterations done of all, the median completed iteration and the time
    the rest would take at it (`ETA --` before any iteration completed), cut to `width`."""
    parts = [f"{done}/{total}"]
    if seconds:
        median = statistics.median(seconds)
        parts += [_per_iteration(median), f"ETA {duration(median * max(0, total - done))}"]
    else:
        parts.append("ETA --")
    return "  ".join(parts)[:width]


def budget_note(deadline: float | None, now: float) -> str:
    """`budget left 1m23s` (or `budget spent`) for a deadline on the same clock as `now`; no budget: ''."""
    if deadline is None:
        return ""
    left = deadline - now
    return f"budget left {duration(left)}" if left > 0 else "budget spent"


class IterationProgress:
    """The progress of a training run's iterations (`rose execute`, `rose optimize --train`): enter it
    around the run and call it with each iteration's `IterationResult` (`on_iteration`); `resumed_at(k)`
    says iterations before k were done by an earlier run. It prints each iteration's metrics line unless
    quiet (`line_of`), and the `i/N` line: live on a terminal, every ~5% otherwise."""

    def __init__(self, out: Console, name: str, total: int, quiet: bool, completed: int = 0,
                 line_of: Callable[[Any], str] | None = None) -> None:
        self.out, self.total, self.quiet, self.line_of = out, total, quiet, line_of
        self.done = completed
        self.seconds: list[float] = []
        self.live = out.is_terminal and not quiet
        self._every = max(1, total // PLAIN_LINES)
        self.progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(bar_width=BAR_WIDTH),
                                 TextColumn("{task.fields[status]}"), console=out, transient=True,
                                 disable=not self.live)
        self.task = self.progress.add_task(_cut(name, NAME_WIDTH), total=total, completed=completed,
                                           status=progress_line(completed, total, ()))

    def __enter__(self) -> IterationProgress:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.__exit__(*exc)

    def resumed_at(self, k: int) -> None:
        """A resume starts at iteration k: done so far, at most the total (a run resumed with a smaller
        `-n` than it has done runs nothing, and read "40/14")."""
        self.done = min(k, self.total)
        self._show()

    def __call__(self, result: Any) -> None:
        self.done = result.iteration + 1
        self.seconds.append(result.seconds)
        if not self.quiet and self.line_of is not None:
            self.progress.console.print(self.line_of(result), markup=False)
        self._show()

    def _show(self) -> None:
        line = progress_line(self.done, self.total, self.seconds)
        if self.live:
            self.progress.update(self.task, completed=self.done, status=line[:STATUS_WIDTH])
        elif not self.quiet and (self.done % self._every == 0 or self.done >= self.total):
            self.out.print(f"progress {line}", markup=False)


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 1] + "…"


class BudgetColumn(ProgressColumn):
    """The budget left, read on the clock at every redraw (not only when the optimizer logs a line)."""

    def __init__(self, deadline: float | None, clock: Callable[[], float]) -> None:
        super().__init__()
        self.deadline, self.clock = deadline, clock

    def render(self, task: Any) -> Text:
        return Text(budget_note(self.deadline, self.clock()))


class BudgetLog:
    """`log(line)` of `optimizer_progress`: prints the optimizer's line (unless quiet) and shows it with the
    budget left -- live beside a spinner on a terminal (`progress`), appended to each line otherwise."""

    def __init__(self, out: Console, quiet: bool, deadline: float | None, clock: Callable[[], float]) -> None:
        self.quiet, self.deadline, self.clock = quiet, deadline, clock
        self.live = out.is_terminal and not quiet
        self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BudgetColumn(deadline, clock),
                                 TimeElapsedColumn(), console=out, transient=True, disable=not self.live)
        self.task = self.progress.add_task("starting the components", total=None)

    def __call__(self, msg: str) -> None:
        first = msg.splitlines()[0] if msg else msg
        self.progress.update(self.task, description=_cut(first, WIDTH - 32))
        if not self.quiet:
            note = "" if self.live else budget_note(self.deadline, self.clock())
            self.progress.console.print(f"{msg}  [{note}]" if note else msg, markup=False)


@contextmanager
def optimizer_progress(out: Console, quiet: bool, deadline: float | None = None,
                       clock: Callable[[], float] = time.perf_counter) -> Iterator[BudgetLog]:
    """`rose optimize`'s progress (`BudgetLog`), with `deadline` on `clock`'s scale (the optimizer's
    `time.perf_counter()`; a test's fake clock)."""
    log = BudgetLog(out, quiet, deadline, clock)
    with log.progress:
        yield log
