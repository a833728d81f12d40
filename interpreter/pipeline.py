"""Pipelined RL iterations: an asynchronous plan's next iteration is submitted before this one ends.

An asynchronous plan (`defer:`, rose_dsl/transforms/deferral.py) cuts the dependency of iteration k+1's
rollout on iteration k's update; with a barrier between RL iterations nothing would overlap anyway. Here
the runner keeps up to `Schedule.depth` (1 + the largest `defer`) iterations in flight: it submits
iteration k+1's calls while iteration k's still run. That is safe for the same reason a single
iteration is: each component runs its calls in submission (= program) order and every data dependency is
a future, so submitting earlier only lets calls start as soon as their data allow.

What stays per iteration, in order: right after an iteration's calls, each component's `pop_records`
and `pop_metrics` are queued too (`Backend.control_later`), so they run after that iteration's calls
and before the next one's -- the metrics line of iteration k holds iteration k's calls only. A call that
runs in another iteration's place (deferred, or run ahead) has its component's `pop_metrics` queued right
before it (what that component did so far goes to the iteration in whose place it runs) and right after
it (its own metrics go to its own iteration): under `defer learn 1` learn(k) runs in k+1's place and its
metrics land on line k, which is written once they are in -- D iterations later (the largest `defer`), or
at a drain, which completes every line up to it, so none is lost there (issue 58). Its `iteration_s`,
`time/NODE` and `trips/...` stay those of the iteration's place: the time from the end of iteration k-1
(or k's submission, if later) to the end of k, in steady state the wall time per iteration, so that
throughputs add up to the run's wall time.

Barriers: before a checkpoint and at the end nothing later is submitted, and the deferred calls still
pending are drained first (`Schedule.drain`), so a checkpoint holds the state the declared workflow leaves
and a resume starts with nothing pending. A plan that runs calls ahead (`ahead:`) runs none in the iteration
before a barrier. When `stop()` asks, no later iteration is submitted and those in flight end; with a run
directory the checkpoint of the last one keeps what is still in flight (`in_flight.py`: the deferred calls'
inputs, the outputs of calls run ahead, the lines still waiting), so that `--resume` goes on as the
uninterrupted run; without one, or where that cannot be kept, the stop drains (and first runs the iteration
whose calls ran ahead, `Schedule.ran_ahead`), and the checkpoint says so. On a failure the exception goes up
at once (the calls in flight are abandoned); a dead process is recovered by `Runner._run_pipelined` from
the last checkpoint, with what it kept in flight, as a synchronous run recovers. A backend that cannot queue
control calls (`control_later` is None) runs one iteration at a time: the same calls, no overlap.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from .backend_base import Backend, Overdue
from .schedule import Schedule

__all__ = ["run_pipelined", "Runner"]


class _Limits(Protocol):
    """The part of the run's `RunConfig` a pipelined run reads."""

    @property
    def iterations(self) -> int: ...
    @property
    def checkpoint_every(self) -> int: ...
    @property
    def out_dir(self) -> Path | None: ...
    @property
    def call_timeout_s(self) -> float: ...


class Runner(Protocol):
    """What `run_pipelined` drives: `runner.Runner`, described here so that the import goes one way (the
    runner imports this module, never the reverse: issue 43's import cycles)."""

    backend: Backend
    schedule: Schedule

    stop_drained: str | None

    @property
    def config(self) -> _Limits: ...
    def component_processes(self) -> list[str]: ...
    def checkpoint(self, k: int, in_flight: dict[str, Any] | None = None,
                   drained_at_stop: str | None = None) -> Path | None: ...
    def _submit(self, k: int, drain: bool = False, started: float | None = None,
                wrap: Callable[..., Any] | None = None) -> list[tuple[Any, Any]]: ...
    def _wait(self, submitted: list[tuple[Any, Any]], started: float) -> None: ...
    def _finish(self, k: int, t0: int, t1: int, popped: Mapping[str, Callable[..., Any]] | None = None) -> Any: ...
    def _watchdog(self, late: Overdue) -> Exception: ...
    def _collect_records(self, failed: bool = False, popped: Mapping[str, Callable[..., Any]] | None = None) -> None: ...


@dataclass
class _Flight:
    """One RL iteration in flight: its calls, its queued pops, when it was submitted, whether it ends in a drain."""

    k: int
    submitted: list[tuple[Any, Any]]
    records: dict[str, Callable[..., Any]] | None
    metrics: dict[str, Callable[..., Any]] | None
    displaced: list[tuple[int, dict[str, Callable[..., Any]]]]  # (the iteration they belong to, pops): see `_Lines`
    started: float  # time.monotonic(), for the watchdog
    t_submit: int  # perf_counter_ns
    barrier: bool
    trips: dict[tuple[str, ...], int]  # the trips its loops that end on a condition ran (decided at submission)


def run_pipelined(runner: Runner, k: int, stop: Callable[[], Any] | None, end: int | None = None,
                  restored: tuple[Any, Any] | None = None) -> None:
    """Iterations k.. up to `config.iterations` with up to `schedule.depth` in flight (see the module).
    `end`: stop before iteration `end`, the pending deferred calls drained after the last iteration's
    metrics, not inside its time: a measurement window (`Executor.run_window`). `restored`: the metrics
    lines a resumed stop's checkpoint kept unfinished (`in_flight.restore`)."""
    queued = runner.backend.capabilities.pipelined
    depth = runner.schedule.depth if queued else 1
    inflight: deque[_Flight] = deque()
    lines = _Lines(runner) if queued and (runner.schedule.program.deferred or runner.schedule.program.hoisted) else None
    if lines is not None and restored is not None:
        lines.got, lines.place = restored
    if restored is not None and k >= runner.config.iterations:  # a resume with no iteration left: the end
        _drain(runner, k - 1, lines)
        return
    # a stop keeps what is in flight in its checkpoint (`in_flight.py`) where there is one to keep it in
    keeps = lines is not None and runner.config.out_dir is not None and runner.schedule.pending() is not None
    last_done, stopping, asked = time.perf_counter_ns(), False, False
    while True:
        while k < runner.config.iterations and len(inflight) < depth and not (inflight and inflight[-1].barrier):
            if end is not None and k >= end:
                stopping = True
                break
            asked = asked or (stop is not None and stop())
            if asked:  # (when what is in flight cannot be kept and k's calls run ahead began, k runs, last)
                stopping = True
                if keeps or runner.schedule.ran_ahead != k - 1:
                    break
            inflight.append(_submit(runner, k, queued, last=asked or (end is not None and k + 1 >= end), lines=lines))
            k += 1
        if not inflight:
            break
        flight = inflight.popleft()
        _wait(runner, flight)
        done = time.perf_counter_ns()
        runner._collect_records(popped=flight.records)
        if lines is None:
            runner.schedule.trips = flight.trips  # (the next iteration's submission has replaced them)
            runner._finish(flight.k, max(flight.t_submit, last_done), done, popped=flight.metrics)
        else:
            lines.done(flight, max(flight.t_submit, last_done), done)
        last_done = done
        if _checkpoint_due(runner, flight.k):
            runner.checkpoint(flight.k)
        if stopping and not inflight:
            if not (asked and keeps and _keep_in_flight(runner, flight.k, lines)):
                why = (runner.stop_drained or _not_kept(runner, lines)) if asked else None
                _drain_and_save(runner, flight.k, lines, asked and runner.schedule.ran_ahead == flight.k, why)
            break


def _checkpoint_due(runner: Runner, k: int) -> bool:
    """Every `checkpoint_every` iterations, and always after the last one: a run keeps its work (and its
    `export/`) whether or not it checkpoints on the way, as a synchronous run does (`Runner.run`)."""
    every = runner.config.checkpoint_every
    return (bool(every) and (k + 1) % every == 0) or k + 1 == runner.config.iterations


def _submit(runner: Runner, k: int, queued: bool, last: bool = False, lines: _Lines | None = None) -> _Flight:
    """Iteration k in flight. A barrier (a checkpoint, the end) drains what is deferred and runs nothing
    ahead; so does the `last` iteration of a stop or a window when the plan runs calls ahead, since no call
    may run ahead into an iteration that will not run."""
    barrier = _checkpoint_due(runner, k) or k + 1 == runner.config.iterations or \
        (last and bool(runner.schedule.program.hoisted))
    started, t_submit = time.monotonic(), time.perf_counter_ns()
    displaced: list[tuple[int, dict[str, Callable[..., Any]]]] = []
    if lines is None:
        submitted = runner._submit(k, drain=barrier)
    else:
        submitted = runner._submit(k, drain=barrier, wrap=lines.wrap(k, displaced))
    records = metrics = None
    if queued:  # after this iteration's calls, before the next one's, on every component
        records = {c: runner.backend.control_later(c, "pop_records") for c in runner.component_processes()}
        metrics = {c: runner.backend.control_later(c, "pop_metrics") for c in runner.component_processes()}
    return _Flight(k, submitted, records, metrics, displaced, started, t_submit, barrier, dict(runner.schedule.trips))


class _Lines:
    """The metrics lines of an asynchronous plan, each written once every call of its iteration has reported
    (see the module): the pops of each iteration, gathered as flights end, and each iteration's place (its
    time window and trips)."""

    def __init__(self, runner: Runner) -> None:
        self.runner = runner
        self.later = max((n.plan.defer for n in runner.schedule.program.deferred), default=0)
        self.got: dict[int, dict[str, dict[str, Any]]] = {}  # iteration -> process -> its metrics so far
        self.place: dict[int, tuple[int, int, dict[tuple[str, ...], int]]] = {}  # iteration -> (t0, t1, trips)

    def wrap(self, k: int, into: list[tuple[int, dict[str, Callable[..., Any]]]]) -> Callable[..., Any]:
        """A submit wrapper for iteration k's place: around a call of another iteration, its component's
        `pop_metrics` are queued before (for k) and after (for the call's own iteration)."""
        from .worker import component_of

        backend = self.runner.backend

        def wrapping(submit: Callable[..., Any]) -> Callable[..., Any]:
            def submit_step(step: Any) -> Any:
                origin = step.inv.indices[0]
                if origin == k:
                    return submit(step)
                procs = [c for c in self.runner.component_processes() if component_of(c) == step.node.component]
                into.append((k, {c: backend.control_later(c, "pop_metrics") for c in procs}))
                result = submit(step)
                into.append((origin, {c: backend.control_later(c, "pop_metrics") for c in procs}))
                return result
            return submit_step
        return wrapping

    def add(self, pops: Sequence[tuple[int, Mapping[str, Callable[..., Any]]]]) -> None:
        for origin, per_process in pops:
            mine = self.got.setdefault(origin, {})
            for proc, pop in per_process.items():
                mine[proc] = {**mine.get(proc, {}), **(pop(None) or {})}

    def done(self, flight: _Flight, t0: int, t1: int) -> None:
        """Flight k ended: gather its pops; write every line now complete (all up to k after a drain)."""
        self.add(flight.displaced)
        self.add([(flight.k, flight.metrics or {})])
        self.place[flight.k] = (t0, t1, flight.trips)
        self.flush(flight.k if flight.barrier else flight.k - self.later)

    def flush(self, upto: int) -> None:
        """Write the lines of every iteration up to `upto` whose place has ended, in order."""
        for j in sorted(j for j in self.place if j <= upto):
            t0, t1, trips = self.place.pop(j)
            got = self.got.pop(j, {})
            self.runner.schedule.trips = trips
            self.runner._finish(j, t0, t1, popped={c: (lambda _timeout, v=got.get(c, {}): v)
                                                   for c in self.runner.component_processes()})


def _wait(runner: Runner, flight: _Flight) -> None:
    try:
        runner._wait(flight.submitted, flight.started)
    except Overdue as late:
        raise runner._watchdog(late) from None


def _keep_in_flight(runner: Runner, k: int, lines: _Lines | None) -> bool:
    """A stop between checkpoint iterations, after iteration k: checkpoint k with what is in flight
    (`in_flight.py`), nothing drained, so that a resume continues as the uninterrupted run; the lines still
    waiting for deferred calls are written by the resumed run. False (nothing saved) when there is nothing to
    keep (k ended at a barrier, or the run) or it cannot be kept (`runner.stop_drained` says why)."""
    from .in_flight import capture

    if lines is None or k + 1 >= runner.config.iterations or _checkpoint_due(runner, k):
        return False
    kept = capture(runner.schedule, runner.backend, lines.got, lines.place, runner.config.call_timeout_s)
    if isinstance(kept, str):
        runner.stop_drained = kept
        return False
    runner.checkpoint(k, in_flight=kept)
    return True


def _not_kept(runner: Runner, lines: _Lines | None) -> str:
    """Why a stop could not keep what is in flight (`_keep_in_flight`), before trying."""
    if lines is None:
        return f"the {runner.backend.name} backend runs one iteration at a time"
    return "the RL iteration carries values from one iteration to the next"


def _drain_and_save(runner: Runner, k: int, lines: _Lines | None = None, last: bool = False,
                    why: str | None = None) -> None:
    """The end of a window, or a stop whose in-flight values cannot be kept: run what is still deferred,
    then save iteration k (as `Runner.run` does for a stop), so that the checkpoint holds the declared
    workflow's state. The drained calls' metrics go to their own iterations' lines, written then. `last`:
    iteration k ran k + 1's calls ahead; k + 1 runs first (a barrier: nothing ahead, what is deferred drained).
    `why`: a stop's, why it drained (the checkpoint says so, and so does a resume from it: not exact)."""
    if last and k + 1 < runner.config.iterations:
        queued = runner.backend.capabilities.pipelined
        flight = _submit(runner, k + 1, queued, last=True, lines=lines)
        _wait(runner, flight)
        done = time.perf_counter_ns()
        runner._collect_records(popped=flight.records)
        if lines is None:
            runner.schedule.trips = flight.trips
            runner._finish(flight.k, flight.t_submit, done, popped=flight.metrics)
        else:
            lines.done(flight, flight.t_submit, done)
        runner.checkpoint(k + 1, drained_at_stop=why)
        return
    if k + 1 < runner.config.iterations and not _checkpoint_due(runner, k):
        _drain(runner, k, lines, why)
    elif lines is not None:
        lines.flush(k)


def _drain(runner: Runner, k: int, lines: _Lines | None, why: str | None = None) -> None:
    """Run the deferred calls still pending after iteration k, complete their lines, and save k."""
    displaced: list[tuple[int, dict[str, Callable[..., Any]]]] = []
    submit = runner.backend.submit if lines is None else lines.wrap(k + 1, displaced)(runner.backend.submit)
    pending = runner.schedule.drain(k, submit)
    runner._wait(pending, time.monotonic())
    runner._collect_records()
    if lines is not None:
        lines.add(displaced)
        lines.flush(k)
    if runner.config.out_dir is not None:
        runner.checkpoint(k, drained_at_stop=why)
