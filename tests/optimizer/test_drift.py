"""`rose optimize --train --max-overhead P` on fakes: the drift rule on seeded noise (`optimizer.drift`), and the
whole loop (`interpreter.optimize.continuous.train_continuously`) on a fake measuring session whose ground truth
changes half-way, on its fake clock -- which plan the run ends on, the events it writes, and the overhead bound.
No wall clock anywhere: the real CPU run is tests/optimizer/test_continuous.py (slow)."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from interpreter.optimize.continuous import ContinuousOptions, Start, train_continuously
from interpreter.runner import IterationResult
from rose_dsl import load_workflow
from rose_dsl.ir import Workflow
from rose_dsl.optimizer import Settings, optimize_graph
from rose_dsl.optimizer.budget import Budget
from rose_dsl.optimizer.drift import DriftMonitor, DriftRule, Ledger, MeteredMeasurer, Overhead, plan_label

from .fake_session import FakeSession
from .fakes import GroundTruth

DRIFT_WF = Path(__file__).parent / "data" / "drift_chain.yaml"


# --- the rule ------------------------------------------------------------------------------------------
def _first_drift(rule: DriftRule, sigma: float, shift: float, n: int, seed: int, at: int | None = None,
                 stall: float = 0.05) -> int | None:
    """The iteration at which the monitor first asks for a search (None: never), on log-normal noise of
    `sigma` with `stall` of the iterations three times as long, the true time 1 s and `shift` s from `at`."""
    rng = random.Random(seed)
    monitor = DriftMonitor(rule, 1.0, skip=0)
    for i in range(n):
        base = shift if at is not None and i >= at else 1.0
        if monitor.observe(base * math.exp(rng.gauss(0.0, sigma)) * (3.0 if rng.random() < stall else 1.0)):
            return i
    return None


@pytest.mark.parametrize("sigma, runs, most", [(0.05, 30, 0), (0.2, 60, 0), (0.5, 60, 2)])
def test_noise_alone_rarely_drifts(sigma: float, runs: int, most: int) -> None:
    """No real change, stalls included: at a per-iteration sigma of 0.05 and 0.2 no run of 400 iterations
    drifts; on a machine as loaded as sigma 0.5 (spreads of 100% and more) at most 2 of 60 do (measured:
    2 of 200 runs of 500; a false drift costs one search, within the overhead bound)."""
    false = sum(_first_drift(DriftRule(), sigma, 1.0, 400, seed) is not None for seed in range(runs))
    assert false <= most, false


@pytest.mark.parametrize("sigma, shift, within", [(0.05, 1.5, 16), (0.05, 0.5, 16), (0.2, 2.0, 60)])
def test_a_real_shift_is_seen_soon(sigma: float, shift: float, within: int) -> None:
    """A shift of the plan's time (up or down) is seen in every run: on a quiet machine within a window
    and its confirmations (12 + 4), on a noisier one later (the median needs most of the window moved)."""
    for seed in range(25):
        at = _first_drift(DriftRule(), sigma, shift, 300, seed, at=100)
        assert at is not None and 100 <= at < 100 + within, (seed, at)


def test_small_shifts_and_the_first_iteration_after_a_switch_are_not_drift() -> None:
    """A 10% change is below the rule's floor (20%); the first iteration after a switch is left out, so a
    slow one cannot start a window."""
    monitor = DriftMonitor(DriftRule(), 1.0)
    assert not any(monitor.observe(1.1) for _ in range(200))
    monitor.rebase(1.0, skip=1)
    assert not monitor.observe(50.0) and monitor.times == []
    assert monitor.rule.judge(1.0, [1.0] * 11) is None  # (no verdict before a whole window)
    verdict = monitor.rule.judge(1.0, [2.0] * 12)
    assert verdict is not None and verdict.drifted and verdict.ratio == pytest.approx(2.0)
    # the window's own spread raises the bar: a 30% shift in a window as spread as a loaded machine's is noise
    spread = [1.3 * x for x in (0.5, 2.0, 0.6, 1.8, 0.7, 1.6, 0.8, 1.5, 0.9, 1.4, 1.0, 1.3)]
    verdict = monitor.rule.judge(1.0, spread)
    assert verdict is not None and not verdict.drifted and verdict.threshold > 1.3


# --- the overhead's books on a fake clock ---------------------------------------------------------------
class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class _Turns:
    """A measurer whose every turn takes `seconds[label]` on the clock."""

    def __init__(self, clock: _Clock, seconds: dict[str, float]) -> None:
        self.clock, self.seconds = clock, seconds

    def complete(self, plans: Sequence[Any], rounds: int, warmup: int = 0, labels: Sequence[str] = (),
                 guard_first: bool = False) -> list[list[Any]]:
        self.clock.t += sum(self.seconds[label] for label in labels) * (rounds + warmup)
        return [[] for _ in plans]

    def local(self, seconds: float) -> None:  # a local trial: overhead whoever wins
        self.clock.t += seconds


def test_losing_seconds_are_the_search_less_the_incumbents_and_the_chosen_plans_turns() -> None:
    """The accounting, explicit: a search's wall time minus the turns of the plan that was training when it
    started and of the plan it chose; the overhead clock (what its budget runs on) leaves out only the
    incumbent's turns, as the winner is known at the end."""
    clock = _Clock()
    clock.t = 100.0
    inner = _Turns(clock, {"": 1.0, "a": 2.0, "b": 3.0})
    ledger = Ledger(clock, incumbent="")
    m = MeteredMeasurer(inner, ledger)
    m.complete([None], 1, labels=[""])  # the incumbent (the declared graph): 1 s
    m.complete([None], 1, labels=["a"])  # a loser: 2 s
    m.complete([None], 1, labels=["b"])  # the winner: 3 s
    m.local(0.5)  # a local trial: 0.5 s
    assert ledger.wall_s() == pytest.approx(6.5) and ledger.clock() == pytest.approx(5.5)
    assert ledger.losing_s("b") == pytest.approx(2.5)  # a's turn and the local trial
    assert ledger.losing_s("") == pytest.approx(5.5)  # kept the incumbent: every other turn lost


def test_a_search_starts_only_within_the_allowance_and_its_budget_is_what_is_left() -> None:
    clock = _Clock()
    ov = Overhead(0.05, clock, started=0.0, need_s=4.0)
    clock.t = 60.0  # 5% of 60 s = 3 s < 4 s
    assert not ov.may_search() and ov.allowance() == pytest.approx(3.0)
    clock.t = 100.0
    assert ov.may_search()
    ledger = Ledger(clock, incumbent="p")
    budget = ov.budget(ledger)
    assert budget.total_s == pytest.approx(5.0) and budget.fits(5.0) and not budget.fits(5.01)
    clock.t += 3.0  # three seconds of candidates: the budget's clock moved three
    assert budget.left() == pytest.approx(2.0)
    ov.charge(ledger.losing_s("p"))
    assert ov.spent_s == pytest.approx(3.0) and ov.need_s == pytest.approx(3.0)
    assert ov.allowance() == pytest.approx(0.05 * 103.0 - 3.0)
    assert not Overhead(0.0, clock).may_search()  # (0: off)
    assert isinstance(budget, Budget)


# --- the whole loop on a fake session whose truth changes half-way --------------------------------------
def _truth(wf: Workflow, later: bool) -> GroundTruth:
    """Seconds per call and per row of each component before (or from) the drift workflow's `at`."""
    fixed, per_row = {}, {}
    for name, comp in wf.components.items():
        a = comp.args
        fixed[name] = float(a.get("later_fixed_ms" if later and "at" in a else "fixed_ms", 0.0)) / 1000
        per_row[name] = float(a.get("later_per_row_ms" if later and "at" in a else "per_row_ms", 0.0)) / 1000
    return GroundTruth(fixed=fixed, per_row=per_row)


class DriftingSession(FakeSession):
    """A `FakeSession` that trains too (`train_on`, iteration by iteration on the fake clock) and whose ground
    truth is the workflow's later timing from iteration `at` on (local trials included: they run now)."""

    def __init__(self, wf: Workflow, at: int, seed: int = 0) -> None:
        super().__init__(wf, None, seed=seed)
        self.early, self.late, self.at = _truth(wf, False), _truth(wf, True), at
        self.events: list[dict[str, Any]] = []
        self.resumes: list[bool] = []

    def _run(self, wf: Workflow, iteration: int) -> Any:
        self.truth = self.late if self.k >= self.at else self.early
        return super()._run(wf, iteration)

    def event(self, line: dict[str, Any]) -> None:
        self.events.append(line)

    def write_metrics(self) -> None:
        pass

    def train_on(self, plan: Workflow, iterations: int, checkpoint_every: int = 0,
                 on_iteration: Callable[[IterationResult], None] | None = None,
                 stop: Callable[[], Any] | None = None, resume: bool = False) -> list[IterationResult]:
        self.resumes.append(resume)
        out = []
        while self.k < iterations and not (stop is not None and stop()):
            run = self._step(plan)
            out.append(IterationResult(run.iteration, run.seconds, {}))
            if on_iteration is not None:
                on_iteration(out[-1])
        return out


def _run_drift(share: float, at: int = 120, iterations: int = 300, seed: int = 0,
               need_s: float | None = None) -> tuple[DriftingSession, Any, Any]:
    wf = load_workflow(str(DRIFT_WF))
    session = DriftingSession(wf, at=at, seed=seed)
    settings = Settings(budget_s=20.0)
    ledger = Ledger(session.elapsed, incumbent="")
    first = optimize_graph(wf, MeteredMeasurer(session, ledger), settings, log=lambda m: None)
    losing = ledger.losing_s(plan_label(first.requests)) if need_s is None else need_s
    opts = ContinuousOptions(max_overhead=share, iterations=iterations, min_left=session.k)
    start = Start(first.plan, tuple(first.requests), first.final.median, need_s=losing)
    rec = train_continuously(wf, start, session, settings, opts, lambda m: None, lambda: None)
    return session, first, rec


def test_the_run_ends_on_the_plan_best_for_its_second_half_and_says_why() -> None:
    """Before `at` the declared graph is fastest (splits pay a 30-ms call K times); after it a split chain is
    ~1.6x faster. The first search keeps the declared graph; the drift is seen, the search runs again within
    the overhead and training ends on the split chain; the drift, the search and the switch are events with
    their evidence; the overhead stays within its share of the run's elapsed time at every event."""
    session, first, rec = _run_drift(0.5)
    assert first.requests == () or not any("split" in r for r in first.requests), first.requests
    assert any(r.startswith("split-chain generate score") for r in rec.requests), rec.requests
    kinds = [e["event"] for e in rec.events]
    assert "drift" in kinds and "search" in kinds and "switch" in kinds, kinds
    switch = next(e for e in rec.events if e["event"] == "switch")
    assert switch["old"] == "" and switch["new"] == plan_label(rec.requests)
    assert switch["declared_s"] / switch["new_s"] >= 1.4, switch  # the evidence: measured times
    drift = next(e for e in rec.events if e["event"] == "drift")
    assert drift["iteration"] >= 120 and drift["window"]["ratio"] > 1.5, drift
    for e in rec.events:
        ov = e["overhead"]
        assert ov["spent_s"] <= ov["max_share"] * ov["elapsed_s"] + 1e-9, e
    assert session.k == 300 and session.events == rec.events


@pytest.mark.parametrize("share", [0.02])
def test_the_overhead_bound_holds_and_a_small_allowance_waits(share: float) -> None:
    """With a small share the allowance does not hold what a search is expected to lose until the run is long
    enough (the drift event says so, and the search starts later or never); whatever happens, the losing
    seconds stay within `share` of the elapsed time."""
    session, _, rec = _run_drift(share)
    drift = next(e for e in rec.events if e["event"] == "drift")
    assert drift["verdict"].startswith("no search now: the overhead allowance"), drift
    ov = rec.overhead
    assert ov["spent_s"] <= share * ov["elapsed_s"] + 1e-9, ov
    for e in rec.events:
        assert e["overhead"]["spent_s"] <= share * e["overhead"]["elapsed_s"] + 1e-9, e


@pytest.mark.parametrize("share", [0.2])
def test_a_search_cut_by_its_allowance_stays_within_it(share: float) -> None:
    """A search that starts on a small allowance (the last search is taken to have lost 0.5 s) runs on a
    budget of that allowance and stops when the next turn would not fit: its losing seconds stay within
    the budget it was given (up to a turn the estimate let start), and still end on the split chain here --
    the race measures the largest predicted gain first."""
    _, _, rec = _run_drift(share, need_s=0.5)
    search = next(e for e in rec.events if e["event"] == "search")
    done = next(e for e in rec.events if e["event"] in ("switch", "keep"))
    assert search["budget_s"] < 5.0 and done["stopped"].startswith("the time budget"), (search, done)
    assert done["losing_s"] <= search["budget_s"] + 0.45, (search, done)  # (a phase-2 turn: two 0.22-s iterations)
    assert any(r.startswith("split-chain generate score") for r in rec.requests), rec.requests
    for e in rec.events:
        assert e["overhead"]["spent_s"] <= share * e["overhead"]["elapsed_s"] + 0.45, e


def test_a_resumed_run_starts_from_its_checkpoint_with_the_overhead_it_had_spent() -> None:
    """`--resume`: the first segment loads the last checkpoint (`train_on(resume=True)`, once), and the
    overhead's books go on from the state read back (spent seconds, searches), so the bound counts the whole
    run, not the part since the resume."""
    wf = load_workflow(str(DRIFT_WF))
    session = DriftingSession(wf, at=120)
    session.clock = 40.0  # (the run's elapsed time goes on from the state's)
    start = Start(wf, (), 0.067, need_s=2.0, spent_s=3.0, searches=1, resume=True)
    opts = ContinuousOptions(max_overhead=0.3, iterations=300, min_left=60)
    rec = train_continuously(wf, start, session, Settings(budget_s=20.0), opts, lambda m: None, lambda: None)
    assert session.resumes[0] is True and not any(session.resumes[1:]), session.resumes
    assert rec.overhead["searches"] >= 2 and rec.overhead["spent_s"] >= 3.0, rec.overhead
    assert any(r.startswith("split-chain generate score") for r in rec.requests), rec.requests
    for e in rec.events:
        assert e["overhead"]["spent_s"] <= 0.3 * e["overhead"]["elapsed_s"] + 0.45, e
