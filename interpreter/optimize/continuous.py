"""`rose optimize --train --max-overhead P`: the search goes on for the whole training run. The second half of
the driver (`driver.py` runs the first search and hands over; this module trains on from there), and like
it the only runtime code that uses the search (`rose_dsl.optimizer`: the drift rule, the overhead's books,
the search itself).

The loop, top to bottom: train the plan decided so far in the optimizer's processes (`train_on`, segment by
segment), feeding every iteration's seconds to the drift monitor (`optimizer.drift.DriftMonitor`, the rule in
its docstring and docs/optimizer.md); when the running plan's iterations drift from what the search measured
and the overhead allowance holds what a search is expected to lose, the segment ends at the iteration
boundary -- with a checkpoint of that iteration, as every segment's end -- and the search runs again from the
declared workflow, on the same processes, re-reading the profile, on a budget of the allowance
(`optimizer.drift.Overhead`); training then goes on with what it chose. A plan computes what the declared
workflow computes, so switching between iterations keeps the training the declared workflow's.

Every drift, search and switch is an event line in metrics.jsonl (`{"iteration": k, "event": ...}` after
iteration k, with its evidence: the window's times against the expected, the plans old and new, their
measured times and the decision rule's verdict, the overhead's books), and `optimize_state.json` in the run
directory holds the search's state (the current plan's requests, the expected time, the overhead's books);
the plan file (`-o`) is rewritten at every switch. `rose optimize ... --resume` (`driver._resume`) reads both
back and goes on from the last checkpoint with that state (`Start.resume`); `rose execute FILE --plan PLAN
--out RUN --resume` continues the training alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from rose_dsl.ir import Workflow
from rose_dsl.optimizer import (
    DriftMonitor,
    DriftRule,
    Ledger,
    Log,
    MeteredMeasurer,
    OutOfBudget,
    Overhead,
    Settings,
    Stage1Result,
    Stop,
    optimize_graph,
    plan_label,
)

from ..runner import IterationResult
from .run_state import STATE_FILE, read_state, write_state

__all__ = ["ContinuousOptions", "ContinuousRecord", "Start", "train_continuously", "keep_optimizing", "read_state",
           "STATE_FILE"]

class TrainingSession(Protocol):
    """What the loop asks of the measuring session (`trials.TrialSession`) besides the search's `Measurer`."""

    k: int
    out_dir: Path | None

    def elapsed(self) -> float: ...

    def event(self, line: dict[str, Any]) -> None: ...

    def write_metrics(self) -> None: ...

    def finish(self, plan_label: str) -> Path | None: ...

    def train_on(self, plan: Workflow, iterations: int, checkpoint_every: int = 0,
                 on_iteration: Callable[[IterationResult], None] | None = None,
                 stop: Callable[[], Any] | None = None, resume: bool = False) -> list[IterationResult]: ...


@dataclass(frozen=True)
class Start:
    """Where the loop starts: the plan and its requests, its expected iteration time, the overhead's books
    (`spent_s`, `need_s`, `searches`), and whether the processes are fresh and the run directory's last
    checkpoint must be loaded first (`resume`: `rose optimize --resume`, from `optimize_state.json`)."""

    plan: Workflow
    requests: tuple[str, ...]
    expected_s: float
    need_s: float = 0.0
    spent_s: float = 0.0
    searches: int = 0
    resume: bool = False


@dataclass(frozen=True)
class ContinuousOptions:
    """`max_overhead`: the share of the run's elapsed time searches after the first may spend on candidates
    that lose; `iterations`: the workflow's last + 1; `min_left`: a search starts only with at least this many
    iterations left (it needs about what the first used); `no_search`: why no search may run (the plan holds
    stage 2's MPS settings, which a search of the graph would drop), or None."""

    max_overhead: float
    iterations: int
    checkpoint_every: int = 0
    rule: DriftRule = field(default_factory=DriftRule)
    min_left: int = 0
    no_search: str | None = None


@dataclass
class ContinuousRecord:
    """What the loop did: the plan it ended on, its requests, the events it wrote (in order)."""

    plan: Workflow
    requests: tuple[str, ...]
    events: list[dict[str, Any]] = field(default_factory=list)
    overhead: dict[str, Any] = field(default_factory=dict)
    min_left: int = 0  # (kept in the state: a resumed run's searches need as many iterations left)


def train_continuously(wf: Workflow, start: Start, session: TrainingSession, settings: Settings,
                       opts: ContinuousOptions, log: Log, stop: Stop,
                       on_switch: Callable[[Stage1Result], None] | None = None,
                       on_iteration: Callable[[IterationResult], None] | None = None) -> ContinuousRecord:
    """Train `start.plan` (the first search's, or a resumed run's) to `opts.iterations`, searching again on
    drift (see the module's docstring); `on_switch(result)` after a search chose another plan (the command
    writes the plan file)."""
    rec = ContinuousRecord(start.plan, tuple(start.requests), min_left=opts.min_left)
    monitor = DriftMonitor(opts.rule, start.expected_s, skip=1)
    overhead = Overhead(opts.max_overhead, session.elapsed, 0.0, spent_s=start.spent_s, need_s=start.need_s,
                        searches=start.searches)
    said: list[bool] = [False]  # the drift of this segment has its event line
    seen: list[int] = [session.k - 1]  # the last iteration trained (a segment's runner counts them)

    def emit(kind: str, **evidence: Any) -> None:
        line = {"iteration": max(session.k - 1, seen[0]), "event": kind, "plan": plan_label(rec.requests), **evidence,
                "overhead": overhead.to_json()}
        session.event(line)
        rec.events.append(line)
        _save_state(session, rec, monitor, overhead)

    def left() -> int:
        return opts.iterations - max(session.k, seen[0] + 1)  # (a segment's runner counts its own iterations)

    def why_not() -> str | None:
        if opts.no_search:
            return opts.no_search
        if left() < opts.min_left:
            return f"{left()} iterations are left and a search needs about {opts.min_left}"
        if not overhead.may_search():
            return (f"the overhead allowance ({overhead.allowance():.2f} s of {opts.max_overhead:.1%} of "
                    f"{overhead.elapsed():.1f} s, {overhead.spent_s:.2f} s spent) is less than a search is "
                    f"expected to lose ({overhead.need_s:.2f} s)")
        return None

    def observed(res: IterationResult) -> None:
        seen[0] = res.iteration
        if monitor.observe(res.seconds) and not said[0]:
            said[0] = True
            reason = why_not()
            assert monitor.last is not None
            emit("drift", window=monitor.last.to_json(), times_s=[round(t, 6) for t in monitor.times],
                 verdict="search again" if reason is None else f"no search now: {reason}")
            log(f"drift: the plan's iterations take {monitor.last.ratio:.2f}x what was measured "
                f"({monitor.last.median_s:.3f} s against {monitor.last.expected_s:.3f} s)"
                + ("" if reason is None else f"; no search now: {reason}"))
            if reason is not None and (opts.no_search or left() < opts.min_left):
                monitor.rebase(monitor.last.median_s, skip=0)  # never possible: watch the new level instead
                said[0] = False
        if on_iteration is not None:
            on_iteration(res)

    def halt() -> bool:
        return bool(stop()) or (monitor.drifted and why_not() is None)

    _save_state(session, rec, monitor, overhead)
    checkpointed = -1  # the session's k when a segment's runner last checkpointed (at its end)
    resume = start.resume
    while (resume or session.k < opts.iterations) and not stop():
        session.train_on(rec.plan, opts.iterations, opts.checkpoint_every, observed, halt, resume=resume)
        checkpointed, resume = session.k, False
        if stop() or session.k >= opts.iterations or not monitor.drifted:
            break
        _search_again(wf, session, settings, log, stop, rec, monitor, overhead, emit, on_switch)
        said[0] = False
    if session.k != checkpointed:  # a search trained the last iterations (or was stopped): keep them
        session.finish(plan_label(rec.requests))
    session.write_metrics()
    rec.overhead = overhead.to_json()
    _save_state(session, rec, monitor, overhead)
    return rec


def _search_again(wf: Workflow, session: TrainingSession, settings: Settings, log: Log, stop: Stop,
                  rec: ContinuousRecord, monitor: DriftMonitor, overhead: Overhead,
                  emit: Callable[..., None], on_switch: Callable[[Stage1Result], None] | None) -> None:
    """One search after the first, from the declared workflow, on the allowance; the switch (or not)."""
    old = plan_label(rec.requests)
    ledger = Ledger(session.elapsed, incumbent=old)
    budget = overhead.budget(ledger)
    emit("search", reason="drift", budget_s=round(budget.total_s or 0.0, 4))
    log(f"searching again (overhead allowance {budget.total_s or 0.0:.1f} s)")
    found: Stage1Result | None = None
    why = ""
    try:
        found = optimize_graph(wf, MeteredMeasurer(session, ledger), settings, lambda m: log(f"  {m}"), stop, budget=budget)
    except OutOfBudget as exc:  # not even the reference profile fitted: training goes on as it was
        why = str(exc)
    new = plan_label(found.requests) if found is not None else old
    # a search cut short that kept nothing returns the declared graph by default, not as a decision: the
    # running plan stays
    defaulted = found is not None and new != old and not new and (found.cut_short or bool(stop()))
    switch = found is not None and new != old and not defaulted
    losing = ledger.losing_s(new if switch else old)
    overhead.charge(losing)
    measured = {"search_s": round(ledger.wall_s(), 4), "losing_s": round(losing, 4),
                "turns_s": {k or "(declared)": round(v, 4) for k, v in ledger.by_label.items()}}
    assert monitor.last is not None
    if found is None:
        emit("keep", verdict=f"the search measured nothing: {why}", **measured)
        monitor.rebase(monitor.last.median_s)
        return
    verdict = found.verdict
    evidence = {**measured, "declared_s": round(found.baseline.median, 6), "new_s": round(found.final.median, 6),
                "validated": found.validated, "stopped": found.stopped,
                "rule": None if verdict is None else {"outcome": str(verdict.outcome), "ratio": round(verdict.ratio, 4),
                                                       "n": verdict.n, "reason": verdict.reason}}
    if defaulted:
        emit("keep", **evidence, verdict="the search was cut short before it kept anything; the running plan stays "
                                         "(the declared graph is only the search's default)")
        monitor.rebase(monitor.last.median_s)
        return
    if switch:
        emit("switch", old=old, new=new, **evidence,
             verdict=f"the search chose {new or 'the declared graph'} over the running {old or 'declared graph'}")
        log(f"switch: {old or 'the declared graph'} -> {new or 'the declared graph'} "
            f"({found.final.median:.3f} s per iteration measured)")
        rec.plan, rec.requests = found.plan, tuple(found.requests)
        if on_switch is not None:
            on_switch(found)
        _save_state(session, rec, monitor, overhead)
    else:
        rec.plan = found.plan
        emit("keep", **evidence, verdict="the search chose the running plan again")
    monitor.rebase(found.final.median)


def _save_state(session: TrainingSession, rec: ContinuousRecord, monitor: DriftMonitor, overhead: Overhead) -> None:
    """`optimize_state.json`: what a resumed run needs of the search (the current plan, the expected time, the
    overhead spent)."""
    if session.out_dir is None:
        return
    state = {"iteration": session.k, "plan_requests": list(rec.requests), "expected_s": monitor.expected_s,
             "overhead": overhead.to_json(), "events": len(rec.events), "min_left": rec.min_left}
    write_state(session.out_dir, state)


def keep_optimizing(outcome: Any, opts: Any, log: Log, checkpoint_every: int = 0,
                    on_iteration: Callable[[IterationResult], None] | None = None) -> ContinuousRecord:
    """`rose optimize --train --max-overhead P` after the first search (`driver.optimize`'s `Outcome`, its
    `OptimizeOptions`) or on `--resume` (the `Outcome` holds the state read back): train on to the workflow's
    last iteration, searching again on drift; every switch rewrites the plan file."""
    from .driver import mps_changes, write_plan

    wf, session = outcome.workflow, outcome.session
    assert outcome.settings is not None  # (the driver keeps them for --max-overhead)
    if outcome.resumed is not None:
        state = outcome.resumed
        ov = state["overhead"]
        start = Start(outcome.plan, tuple(state["plan_requests"]), float(state["expected_s"]),
                      need_s=float(ov.get("need_s", 0.0)), spent_s=float(ov["spent_s"]),
                      searches=int(ov.get("searches", 0)), resume=True)
        min_left = int(state.get("min_left", 0))
    else:
        result = outcome.result
        assert result is not None
        start = Start(result.plan, tuple(result.requests), result.final.median, need_s=outcome.first_losing_s)
        min_left = session.k
    moved = mps_changes(wf, outcome.plan)
    no_search = (f"the plan holds stage 2's MPS settings ({'; '.join(moved)}), which a search of the graph "
                 "would drop") if moved else None

    def switched(found: Stage1Result) -> None:
        write_plan(found.plan, opts.output, opts.file, found, None)

    copts = ContinuousOptions(max_overhead=opts.max_overhead, iterations=wf.root.count or 1,
                              checkpoint_every=checkpoint_every, min_left=min_left, no_search=no_search)
    return train_continuously(wf, start, session, outcome.settings, copts, log, outcome.stop, on_switch=switched,
                              on_iteration=on_iteration)
