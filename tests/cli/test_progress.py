"""Progress a person reads (issue 42): `rose execute` shows `i/N` and a time estimate from the median
completed iteration in one line of at most 80 columns -- live on a terminal, a plain line every ~5% in a
log -- and `rose optimize` shows the budget left. No clock is read here: iteration times are given, the
budget's clock is a fake."""

from __future__ import annotations

import io
from types import SimpleNamespace

import pytest
from rich.console import Console
from typer.testing import CliRunner

from rose_cli.main import app
from rose_cli.progress import (
    WIDTH,
    IterationProgress,
    budget_note,
    duration,
    optimizer_progress,
    progress_line,
)


def _console(terminal: bool, width: int = 200) -> Console:
    return Console(file=io.StringIO(), force_terminal=terminal, width=width, highlight=False, soft_wrap=True)


def _result(k: int, seconds: float) -> SimpleNamespace:
    return SimpleNamespace(iteration=k, seconds=seconds, metrics={})


def test_the_estimate_is_the_median_completed_iteration_times_those_left() -> None:
    # a slow first iteration (start-up) does not skew it: the mean (4.33 s) would say 30s
    assert progress_line(3, 10, [10.0, 1.0, 2.0]) == "3/10  2.00 s/it  ETA 14s"
    assert progress_line(0, 10, []) == "0/10  ETA --"
    assert progress_line(10, 10, [0.25]) == "10/10  250 ms/it  ETA 0s"
    assert duration(187) == "3m07s" and duration(7500) == "2h05m" and duration(-3) == "0s"
    assert duration(3 * 86400 + 7200) == "3d02h" and duration(1e12) == ">999d"


def test_the_live_line_fits_80_columns_at_its_widest() -> None:
    progress = IterationProgress(_console(True), "a-workflow-name-much-longer-than-any-column", 1_000_000, False)
    for k in range(3):
        progress(_result(k, 3600.0 * 99))  # 99 hours an iteration: the longest estimate
    table = progress.progress.make_tasks_table(progress.progress.tasks)
    wide = _console(False)
    wide.print(table)
    lines = [line.rstrip() for line in wide.file.getvalue().splitlines() if line.strip()]  # type: ignore[attr-defined]
    assert len(lines) == 1 and len(lines[0]) <= WIDTH, lines
    assert "3/1000000" in lines[0] and "ETA" in lines[0] and lines[0].startswith("a-workflow-name")


def test_on_a_terminal_the_line_is_live_and_advances_with_each_iteration() -> None:
    progress = IterationProgress(_console(True), "wf", 10, False)
    assert progress.live
    progress(_result(0, 2.0))
    task = progress.progress.tasks[0]
    assert task.completed == 1 and task.fields["status"] == "1/10  2.00 s/it  ETA 18s"
    progress.resumed_at(5)
    assert progress.progress.tasks[0].completed == 5
    progress.resumed_at(40)  # a resume with a smaller -n than the run has done: nothing left, not "40/10"
    assert progress.progress.tasks[0].completed == 10 and progress.progress.tasks[0].fields["status"].startswith("10/10")


def test_in_a_log_it_prints_a_plain_line_every_twentieth_of_the_run() -> None:
    console = _console(False)
    progress = IterationProgress(console, "wf", 100, False, line_of=lambda r: f"it {r.iteration}")
    assert not progress.live
    with progress:
        for k in range(100):
            progress(_result(k, 1.0))
    text = console.file.getvalue()  # type: ignore[attr-defined]
    shown = [line for line in text.splitlines() if line.startswith("progress ")]
    assert len(shown) == 20 and shown[0] == "progress 5/100  1.00 s/it  ETA 1m35s" and shown[-1].startswith("progress 100/100")
    assert "\r" not in text and "it 99" in text
    assert all(len(line) <= WIDTH for line in shown)


def test_quiet_prints_nothing() -> None:
    console = _console(False)
    progress = IterationProgress(console, "wf", 4, True, line_of=lambda r: "metrics")
    with progress:
        for k in range(4):
            progress(_result(k, 1.0))
    assert console.file.getvalue() == ""  # type: ignore[attr-defined]


class FakeClock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_the_optimizer_shows_the_budget_left_on_its_clock() -> None:
    assert budget_note(None, 5.0) == "" and budget_note(100.0, 17.0) == "budget left 1m23s"
    assert budget_note(100.0, 100.5) == "budget spent"
    clock = FakeClock(1000.0)
    console = _console(False)
    with optimizer_progress(console, False, deadline=1100.0, clock=clock) as log:
        log("stage 1 round 1: 3 targets")
        clock.now = 1090.0
        log("stage 2")
    lines = console.file.getvalue().splitlines()  # type: ignore[attr-defined]
    assert lines == ["stage 1 round 1: 3 targets  [budget left 1m40s]", "stage 2  [budget left 10s]"]
    console = _console(False)
    with optimizer_progress(console, False, clock=clock) as log:  # no --budget-s: the lines as they are
        log("stage 2")
    assert console.file.getvalue().splitlines() == ["stage 2"]  # type: ignore[attr-defined]


def _line(progress) -> str:
    wide = _console(False)
    wide.print(progress.make_tasks_table(progress.tasks))
    (line,) = [x.rstrip() for x in wide.file.getvalue().splitlines() if x.strip()]  # type: ignore[attr-defined]
    return line


def test_on_a_terminal_the_budget_left_is_beside_the_spinner_and_counts_down_between_lines() -> None:
    clock = FakeClock(0.0)
    with optimizer_progress(_console(True), False, deadline=60.0, clock=clock) as log:
        assert log.live and "budget left 1m00s" in _line(log.progress)
        clock.now = 15.0
        log("measuring 4 plans")
        line = _line(log.progress)
        assert "measuring 4 plans" in line and "budget left 45s" in line and len(line) <= WIDTH, line
        clock.now = 50.0  # no new line from the optimizer: the redraw reads the clock
        assert "budget left 10s" in _line(log.progress)


TINY = """rose: 1
name: tiny
components:
  a: {impl: "tests.mocks:Sleeper", args: {seconds: 0.0}}
iteration:
  count: 4
  body:
    - {node: w, call: a.work, in: {x: iteration.i}, out: [y]}
"""


def test_rose_execute_prints_progress_lines_in_a_log(tmp_path) -> None:
    wf = tmp_path / "wf.yaml"
    wf.write_text(TINY)
    result = CliRunner().invoke(app, ["execute", str(wf), "--allow-module", "tests", "--backend", "local"])
    assert result.exit_code == 0, result.output
    assert "progress 1/4" in result.output and "progress 4/4" in result.output and "ETA 0s" in result.output


def test_the_budget_clock_is_chosen_in_one_place(monkeypatch) -> None:
    """`rose_cli.clock.budget_clock`: the real clock, or for a test the fake one `ROSE_FAKE_CLOCK` describes
    (in a subprocess too); `rose optimize`'s budget-left display reads it."""
    import time

    from rose_cli.clock import CLOCK_ENV, budget_clock
    from rose_cli.run import progress_log

    assert budget_clock({}) is time.perf_counter
    clock = budget_clock({CLOCK_ENV: "100,2.5"})
    assert [clock(), clock(), clock()] == [100.0, 102.5, 105.0]
    still = budget_clock({CLOCK_ENV: "7"})
    assert still() == still() == 7.0
    with pytest.raises(ValueError, match="START"):
        budget_clock({CLOCK_ENV: "soon"})
    monkeypatch.setenv(CLOCK_ENV, "1000")
    console = _console(False)
    with progress_log(console, False, deadline=1042.0) as log:
        log("stage 1")
    assert console.file.getvalue().splitlines() == ["stage 1  [budget left 42s]"]  # type: ignore[attr-defined]
