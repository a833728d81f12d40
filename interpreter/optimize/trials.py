"""The measuring side of `rose optimize`: complete iterations, captured inputs, local trials on state
snapshots and quota trials, on the real backends (implements the optimizer's `Measurer` protocol
structurally: this module imports nothing of the search, only the contract in `rose_dsl.measurement`).

Why complete-iteration trials are training: every plan the optimizer measures computes exactly what
the declared workflow computes, so running iteration k with one plan and k+1 with another keeps
training bit-identical; those iterations are kept (checkpointed at the end) and count as retained
progress. Local trials are not training: before each run of a comparison graph, the state of every
component it writes is restored from a snapshot (the checkpoint contract: `get_states`/`set_states`),
and again after the last one, so training continues from exactly where it was.

The plans run on one set of workers through `interpreter.optimize.executor.Executor` (the `Backend` interface
alone): any backend that declares `capabilities.plans` can be measured on.
"""

from __future__ import annotations

import copy
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from rose_dsl.identity import NodePath
from rose_dsl.ir import Component, ExecutionNode, Workflow
from rose_dsl.measurement import (
    FEED,
    PROBE,
    Books,
    Call,
    IterationRun,
    OutOfBudget,
    Window,
    call_identity,
    feed_component,
    probe_component,
    window,
)

from ..backend_base import Unsupported
from ..components import ComponentError
from ..cpu_activity import CpuActivity, lock_wait_probe, process_clock
from ..runner import IterationResult, RunConfig
from ..trace import InvocationRecord
from ..worker import CallFailed, component_of, state_bytes
from .executor import Executor

_T = TypeVar("_T")

__all__ = ["Feed", "Probe", "TrialSession", "TrialFailed", "state_bytes", "trial_components", "unsupported",
           "window_metrics"]


class TrialFailed(Exception):
    """A candidate plan's run failed (a component raised); the state it may have changed was restored."""

FEED_IMPL, PROBE_IMPL = "interpreter.optimize.trials:Feed", "interpreter.optimize.trials:Probe"


def trial_components() -> dict[str, Component]:
    """The components local trials add (`__feed__` replays inputs, `__probe__` captures them): start the
    workers with them, so that no process has to be restarted to add them later."""
    return {FEED: feed_component(FEED_IMPL), PROBE: probe_component(PROBE_IMPL)}


class Feed:
    """Replays the values that enter a comparison graph from outside (state `values`)."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}

    def get(self) -> dict[str, Any]:
        return copy.deepcopy(self.values)  # a fresh copy per run: a consumer may change its inputs in place


class Probe:
    """Captures the first values it is called with for each probe id (state `captured`)."""

    def __init__(self) -> None:
        self.captured: dict[int, dict[str, Any]] = {}

    def capture(self, probe_id: int, **values: Any) -> None:
        if probe_id not in self.captured:
            self.captured[probe_id] = {k: _detached(v) for k, v in values.items()}


def _detached(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        return {k: _detached(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_detached(v) for v in value)
    return copy.deepcopy(value)




class _StateSizes(Mapping[str, int]):
    """Bytes of each component's state, fetched when first asked for (a 360M-parameter trainer's state is
    gigabytes: only the components the memory estimate needs are read)."""

    def __init__(self, executor: Executor) -> None:
        self._executor = executor
        self._sizes: dict[str, int] = {}

    def __getitem__(self, comp: str) -> int:
        if comp not in self._sizes:
            if comp not in self._executor.components():
                raise KeyError(comp)
            self._sizes[comp] = state_bytes(self._executor.get_states(comp))
        return self._sizes[comp]

    def __iter__(self):
        return iter(self._executor.components())

    def __len__(self) -> int:
        return len(self._executor.components())


def unsupported(wf: Workflow) -> str | None:
    """Why a session cannot optimize `wf` (None: it can), known before anything starts."""
    if wf.root.carries:
        return ("the iteration loop carries values from one RL iteration to the next; the optimizer switches plans "
                "between iterations and cannot carry them across plans yet")
    return None


class TrialSession:
    """Implements the optimizer's `Measurer` on an `Executor`, keeping the books: training iterations
    (retained), local trials, captures, and the time of each."""

    feed_impl, probe_impl = FEED_IMPL, PROBE_IMPL  # (the trial components' classes, for the search's graphs)
    # what loses a layout block's trial rather than the run: a call that failed, a component not addable
    trial_errors: tuple[type[Exception], ...] = (CallFailed, Unsupported)

    def __init__(self, wf: Workflow, executor: Executor, *, out_dir: Path | None = None, gpu_sampler: Any = None,
                 log: Callable[[str], None] = print, memory_limits: Mapping[str, int] | None = None,
                 started: float | None = None) -> None:
        problem = unsupported(wf)
        if problem:
            raise ValueError(problem)
        self.wf, self.executor, self.out_dir, self.log = wf, executor, out_dir, log
        self.gpu = gpu_sampler
        self.activity_kind = "sm" if gpu_sampler is not None else "cpu"
        self.cpu = CpuActivity({}) if gpu_sampler is None else None
        self.k = 0
        self.limit = wf.root.count
        # `elapsed` counts from here: the command's start when given (`time.perf_counter()`), so that stage 1's
        # share of the budget and stage 2's deadline are on one clock (the processes' start-up counts in both)
        self.started = time.perf_counter() if started is None else started
        self.books = Books()
        self.retained: list[dict[str, Any]] = []  # one line per training iteration (metrics.jsonl)
        self._proven: set[int] = set()  # plans (by id) that completed an iteration
        self._last_plan: Workflow | None = None  # the plan of the last complete iteration
        self.last_failures: dict[int, str] = {}  # the last complete()/local() call: plan index -> why it failed
        # work that must end before the next measurement and may run beside training until then (`join_pending`)
        self.pending: list[Callable[[], None]] = []
        executor.add_components({FEED: feed_component(FEED_IMPL)})
        self._watch_cpu()
        self.component_bytes = _StateSizes(executor)
        self.memory_limits = dict(memory_limits) if memory_limits is not None else _memory_limits(
            any(c.device == "gpu" for c in wf.components.values()))

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def placement(self, plan: Workflow) -> str | None:
        """On Ray, GPU processes are placed when the session starts: a plan needing another GPU process
        (a temporal split's copy of a GPU component that was not started with the session) cannot run."""
        if not self.executor.processes:  # threads: any component can be added
            return None
        have = {component_of(c) for c in self.executor.components()}
        missing = sorted(n for n, c in plan.components.items() if c.device == "gpu" and n not in have)
        if missing:
            return (f"needs GPU process(es) {', '.join(missing)} that were not started with the session "
                    "(GPU placement is fixed at start; only the copies of a split in two groups are started)")
        return None

    def sync_books(self) -> Books:
        """The books with the executor's set-up costs (start, plan preparation, restarts)."""
        self.books.startup_s, self.books.prepare_s = self.executor.startup_s, self.executor.prepare_s
        self.books.plan_loads = self.executor.loads
        return self.books

    def _watch_cpu(self) -> None:
        if self.cpu is None:
            return
        new = [c for c in self.executor.components() if c not in self.cpu.readers]
        if not new:
            return
        if self.executor.processes:
            pids = self.executor.pids()
            for comp in new:  # (Ray runs an actor's calls on its main thread: tid = pid)
                self.cpu.add(comp, process_clock(pids[comp]), lock_wait_probe(pids[comp], pids[comp]))
        else:
            threads = self.executor.thread_ids()
            for comp in new:  # threads of this process: a GIL-bound call reads busy, not idle
                self.cpu.add_thread(comp, threads[comp])

    # -- turning records into calls ---------------------------------------------------------------
    def _calls(self, plan: Workflow, records: Sequence[InvocationRecord]) -> tuple[Call, ...]:
        out = []
        identity = call_identity(plan)
        for r in records:
            end = r.end_ns
            if end is None or r.status != "ok":
                continue
            node = plan.find(NodePath.parse(r.node).parts)
            source, base = identity.get(r.node, ("", ""))
            rows = None
            if isinstance(node, ExecutionNode) and node.batch is not None:
                rows = r.rows if r.rows is not None else node.plan.rows[1] - node.plan.rows[0] if node.plan.rows else node.batch_size
            indices = tuple(i for _, i in r.loop_indices)
            out.append(Call(r.node, r.component, indices[0] if indices else 0, indices, r.host_start_ns, end, rows,
                            self._activity(r.component, r.host_start_ns, end), source, base))
        return tuple(out)

    def _samples(self, t0: int, t1: int) -> tuple[tuple[int, int, float], ...]:
        """The first sampled GPU's SM-activity samples during [t0, t1) (for the timeline picture)."""
        if self.gpu is None:
            return ()
        by_gpu = self.gpu.samples_by_gpu()
        samples = by_gpu[min(by_gpu)] if by_gpu else []
        return tuple((s.t_start_ns, s.t_end_ns, s.value) for s in samples if s.t_end_ns > t0 and s.t_start_ns < t1)

    def _activity(self, comp: str, start: int, end: int) -> float | None:
        if self.gpu is not None:
            return self.gpu.mean_activity([(start, end)])
        if self.cpu is not None:
            return self.cpu.busy(comp, start, end)
        return None

    # -- complete iterations (training) -----------------------------------------------------------
    def _written(self, plan: Workflow) -> list[str]:
        """The workers' components whose state an iteration of `plan` writes."""
        comps = {n.component for n in plan.items() if isinstance(n, ExecutionNode) and any(e.access.writes for e in n.effects)}
        return sorted(c for c in comps if c in self.executor.components())

    def _guarded(self, run: Callable[[], _T], kept: Sequence[str] | None, drop: bool = True) -> _T:
        """`run()` (a plan's iteration or window); if it fails and the components `kept` keep a copy of their
        state from before it (`Executor.keep_states`), put that state back (after every call still in flight
        has ended; `drop`: the copies go) and raise TrialFailed: the trial is lost, not the training."""
        try:
            return run()
        except (CallFailed, ComponentError, Unsupported) as exc:  # (Unsupported: a component it needs cannot be added)
            if kept is None:
                raise
            self.executor.drain()
            self.executor.restore_kept(kept, drop)
            raise TrialFailed(str(exc).splitlines()[0]) from None

    def _keep(self, plan: Workflow) -> list[str]:
        """Before a plan's first run: each component it writes keeps a copy of its state (`_guarded`)."""
        t = time.perf_counter()
        kept = self._written(plan)
        self.executor.keep_states(kept)
        dt = time.perf_counter() - t
        self.books.snapshot_s += dt
        self.books.guard_snapshots += 1  # (local trials' snapshots are inside local_s)
        self.books.guard_snapshot_s += dt
        return kept

    def _iteration(self, plan: Workflow, label: str, guard: bool = False) -> IterationRun:
        if self.limit is not None and self.k >= self.limit:
            raise OutOfBudget(f"the workflow's {self.limit} iterations are all trained")
        kept = self._keep(plan) if guard else None  # a plan that has never run: keep what a failure would lose
        seconds, t0, t1, metrics, records = self._guarded(lambda: self.executor.run(plan, self.k), kept)
        if kept:
            self.executor.drop_kept(kept)
        self._proven.add(id(plan))
        self._last_plan = plan
        self._watch_cpu()
        if self.cpu is not None:
            self.cpu.poll()
        run = IterationRun(seconds, self._calls(plan, records), t0, t1, self.k, metrics, self._samples(t0, t1))
        self.retained.append({"iteration": self.k, "plan": label, **metrics})
        if self.k == 0:  # (start-up costs of its own; what ran beside it, e.g. the self-check: the report says)
            self.books.first_iteration_s = seconds
        self.k += 1
        self.books.complete_iterations += 1
        self.books.complete_s += seconds
        return run

    def _measure(self, plan: Workflow, label: str, guard: bool = False) -> IterationRun:
        """One measurement of `plan`: one iteration, or a window of pipelined ones for an asynchronous
        plan (`measurement.window`), whose gain a drained iteration cannot show. `guard`: a window of a plan
        that has never run is guarded as a first iteration is (`_guarded`)."""
        win = window(plan)
        return self._iteration(plan, label) if win.iterations == 1 else self._window(plan, label, win, guard)

    def _window(self, plan: Workflow, label: str, win: Window, guard: bool = False) -> IterationRun:
        """`win.iterations` training iterations of an asynchronous plan in flight together
        (`Executor.run_window`), timed as one run from the end of the fill iterations to the end of the
        measured ones: seconds per iteration = that time / `win.measured` (the inverse of the throughput),
        metrics over the measured iterations (`window_metrics`). Every iteration is training, kept -- unless
        the window of a plan never run (`guard`) fails: then none of them is, and the state is put back."""
        if self.limit is not None and self.k + win.iterations > self.limit:
            raise OutOfBudget(f"the workflow's {self.limit} iterations leave {self.limit - self.k}, and a window of "
                              f"the asynchronous plan trains {win.iterations}")
        kept = self._keep(plan) if guard else None
        t0, done, records = self._guarded(lambda: self.executor.run_window(plan, self.k, win.iterations), kept)
        if kept:
            self.executor.drop_kept(kept)
        self._proven.add(id(plan))
        self._last_plan = plan
        self._watch_cpu()
        if self.cpu is not None:
            self.cpu.poll()
        for result, _ in done:
            self.retained.append({"iteration": result.iteration, "plan": label, **result.metrics})
            if result.iteration == 0:
                self.books.first_iteration_s = result.seconds
            self.books.complete_iterations += 1
            self.books.complete_s += result.seconds
        self.k += len(done)
        start = done[win.fill - 1][1] if win.fill else t0
        measured = done[win.fill:win.fill + win.measured]
        end = measured[-1][1]
        seconds = (end - start) / 1e9 / win.measured
        calls = self._calls(plan, [r for r in records if r.end_ns is not None and r.end_ns > start
                                   and r.host_start_ns < end])
        metrics = window_metrics([r.metrics for r, _ in measured], seconds * win.measured)
        return IterationRun(seconds, calls, start, end, measured[0][0].iteration, metrics, self._samples(start, end))

    def join_pending(self) -> None:
        """Run (once) what `pending` holds: joins of work started beside the processes' start-up that would
        disturb a measurement -- the quota self-check's GEMMs on the GPU (`CheckPrefetch`). Called right
        before the first timed iteration or local trial, so that the warm-up iterations (training, not
        timed) run beside it instead of after it."""
        while self.pending:
            self.pending.pop(0)()

    def complete(self, plans: Sequence[Workflow], rounds: int, warmup: int = 0,
                 labels: Sequence[str] = (), before: Callable[[int], None] | None = None,
                 guard_first: bool = False) -> list[list[IterationRun]]:
        """`rounds` iterations of each plan, interleaved A B A B (reversed every other round, so a drift
        in time hits both alike); `warmup` iterations of the first plan first, not returned. `labels`
        name the plans (their rewrite requests) in the run's metrics lines. `before(i)` runs before each
        turn of plan i (e.g. moving a component under the plan's MPS quota: `rose compare`). A plan's
        first iteration ever is guarded (a failure loses the trial, not the training) unless it is the
        first plan, the reference -- or with `guard_first` (a layout trial's plan, alone in the call)."""
        labels = list(labels) or ["" for _ in plans]
        self.last_failures = {}
        if warmup and before is not None:
            before(0)
        for _ in range(warmup):
            self._iteration(plans[0], labels[0])
        out: list[list[IterationRun]] = [[] for _ in plans]
        for r in range(rounds):
            order = list(range(len(plans)))
            if r % 2:
                order.reverse()
            for i in order:
                if i in self.last_failures:
                    continue
                new = id(plans[i]) not in self._proven
                try:
                    if before is not None:
                        before(i)
                    guard = new and (i > 0 or guard_first)
                    windowed = window(plans[i]).iterations > 1
                    if not windowed and (new or self._last_plan is not plans[i]):
                        # The first iteration of a plan, and the first after a switch from another, are
                        # training (kept), not measurements: a plan's first carries its start-up (processes
                        # for new copies, programs compiled and CUDA graphs captured for new batch sizes),
                        # and one right after a switch ran up to 3x its steady time on the CPU (the previous
                        # plan's compiled graph still winding down). Timed, they made the reference of an
                        # interleaved comparison slower than the candidates and gave slower plans a benefit.
                        # An asynchronous plan's window needs no such iteration, first or after a switch: its
                        # fill iterations are untimed already and carry the start-up, and the window itself is
                        # guarded when new (H100, long-tail LLM: ~14 s a turn saved of a pair of ~70 s, where
                        # the decision rule's fifth pair did not fit 420 s)
                        self._iteration(plans[i], labels[i], guard=guard)
                    self.join_pending()
                    out[i].append(self._measure(plans[i], labels[i], guard=guard and windowed))
                except TrialFailed as exc:  # the plan fails: its trial is lost, training goes on with the others
                    self.last_failures[i] = str(exc)
                    self._last_plan = None  # the workers had switched to it
                    self.log(f"  trial failed ({labels[i] or 'plan'}): {exc}")
        return out

    def use_layout(self, wf: Workflow) -> list[str]:
        """Train `wf` -- the workflow with other layout knob values (`optimizer/layouts.py`) -- from the
        next iteration on: the components it defines differently get fresh processes
        (`Executor.use_layout`), and the plans measured from now on are `wf`'s. Booked as `layout_s`."""
        t = time.perf_counter()
        replaced = self.executor.use_layout(wf)
        self.wf = wf
        if replaced:
            self._last_plan = None  # the next iteration is the new processes' first: training, not timed
            self.component_bytes = _StateSizes(self.executor)
            self.books.layout_switches += 1
        self.books.layout_s += time.perf_counter() - t
        return replaced

    def replace_quota(self, comp: str, quota: int | None, mps_env: dict[str, str] | None,
                      priority: int | None = None) -> dict[str, Any]:
        """Move a GPU component to a new process under another MPS quota -- and client priority, when not
        None (`Executor.replace_quota`). The
        next complete iteration is training, not a measurement: the new process compiles its programs,
        captures its CUDA graphs and fills its allocator on its first calls (timed, that start-up was
        charged to the quota being tried)."""
        # the process left is parked where the GPU has room (`actor_moves.py`): stage 2 moves back to it
        out = self.executor.replace_quota(comp, quota, mps_env, priority=priority, keep=True)
        self._last_plan = None
        self.books.quota_moves = self.books.quota_moves + 1
        self.books.quota_moves_to_parked = self.books.quota_moves_to_parked + int(bool(out.get("reused")))
        return out

    def capture(self, probe_wf: Workflow) -> dict[int, dict[str, Any]]:
        """One training iteration of the current graph with probes; the values they captured."""
        t = time.perf_counter()
        self.executor.add_components(probe_wf.components)
        self._iteration(probe_wf, "probes")
        captured = self.executor.get_states(PROBE).get("captured", {})
        self.executor.set_states(PROBE, {"captured": {}})
        self.books.captures += 1
        self.books.capture_s += time.perf_counter() - t
        return captured

    # -- local trials (not training) --------------------------------------------------------------
    def local(self, graphs: Sequence[Any], repeats: int, captured: Mapping[int, Any], probe_id: int,
              give_up: Callable[[Sequence[float], Sequence[float]], str | None] | None = None) -> list[list[IterationRun]]:
        """Interleaved runs of local graphs (the search's `LocalGraph`s: `workflow`, `writes`) on the
        captured inputs, state restored before each; a graph for which `give_up(graphs[0]'s seconds,
        its own)` says so gets no more runs (the search's rule)."""
        self.join_pending()
        t = time.perf_counter()
        self.executor.set_states(FEED, {"values": captured.get(probe_id, {})})
        writes = sorted({c for g in graphs for c in g.writes})
        self.executor.keep_states(writes)
        self.books.snapshot_s += time.perf_counter() - t
        out: list[list[IterationRun]] = [[] for _ in graphs]
        # one untimed run of each graph first (r = -1): its start-up (new copies, compiled programs, captured
        # graphs for new batch sizes) is not what the graph costs per run
        order = [(r, i) for i in range(len(graphs)) for r in range(-1, repeats)] if self.executor.switch_is_costly else \
            [(r, i) for r in range(-1, repeats) for i in range(len(graphs))]
        self.last_failures = {}
        try:
            abandoned: set[int] = set()
            for r, i in order:
                if i in self.last_failures or i in abandoned:
                    continue
                self.executor.restore_kept(writes, drop=False)
                try:
                    seconds, t0, t1, _, records = self._guarded(partial(self.executor.run, graphs[i].workflow, 0), writes,
                                                                 drop=False)
                except TrialFailed as exc:
                    self.last_failures[i] = str(exc)
                    self.log(f"  local trial failed: {exc}")
                    continue
                self._watch_cpu()
                if self.cpu is not None:
                    self.cpu.poll()
                self.books.local_runs += 1
                if r >= 0:
                    out[i].append(IterationRun(seconds, self._calls(graphs[i].workflow, records), t0, t1))
                    if i > 0 and len(out[i]) < repeats and give_up is not None and give_up(
                            [x.seconds for x in out[0]], [x.seconds for x in out[i]]):
                        abandoned.add(i)  # clearly slower: its other repeats would only cost time
                        self.books.local_abandoned += repeats - len(out[i])
        finally:
            self.executor.restore_kept(writes)
            self._last_plan = None  # the workers ran other graphs: the next complete iteration follows a switch
        self.books.local_s += time.perf_counter() - t
        return out

    # -- the end ----------------------------------------------------------------------------------
    def event(self, line: dict[str, Any]) -> None:
        """An event line for metrics.jsonl (`rose optimize --max-overhead`'s drifts, searches and switches),
        written at once after the lines before it (a training segment's runner writes its own as they come): it
        carries the iteration it follows."""
        self.retained.append(line)
        self._write_metrics()

    def write_metrics(self) -> None:
        """Append the lines kept so far (iterations, events) to the run's metrics.jsonl."""
        self._write_metrics()

    def _write_metrics(self) -> None:
        if self.out_dir is None:
            return
        self.out_dir.mkdir(parents=True, exist_ok=True)
        with (self.out_dir / "metrics.jsonl").open("a") as f:
            for line in self.retained:
                f.write(json.dumps(line) + "\n")
        self.retained = []

    def finish(self, plan_label: str) -> Path | None:
        """Write the trained iterations' metrics and a checkpoint to the run directory, so that training
        continues from here (`rose execute FILE --plan PLAN --out RUN --resume`)."""
        if self.out_dir is None or self.k == 0:
            return None
        from ..checkpoint import save_component_checkpoint

        self._write_metrics()
        return save_component_checkpoint(self.out_dir / "checkpoints", self.k - 1, list(self.wf.components),
                                         self.executor.control,
                                         meta={"workflow": self.wf.name, "written_by": "rose optimize", "plan": plan_label})

    def train_on(self, plan: Workflow, iterations: int, checkpoint_every: int = 0,
                 on_iteration: Callable[[IterationResult], None] | None = None,
                 stop: Callable[[], Any] | None = None, resume: bool = False) -> list[IterationResult]:
        """Go on training `plan` in these processes, with the state they hold, from iteration `self.k` to
        `iterations` (`rose optimize --train`): what `rose execute FILE --plan PLAN --resume` does after
        `finish`, without its second start-up and without the hand-over checkpoint (each tens of seconds on
        an H100: docs/optimizer.md). The run directory gets `rose execute`'s outputs: metrics.jsonl (the optimizer's
        iterations, then these), checkpoints every `checkpoint_every` iterations and the trace of these
        iterations; a component process that dies is restarted from the last checkpoint as in `rose
        execute`. `stop()` ends it after the iteration in progress, with a checkpoint (`Runner.run`). The
        processes must run under `plan`'s MPS settings already (`quota_trials.settle`). `resume`: the
        processes are fresh; start from the run directory's last checkpoint, loaded into them (`rose optimize
        --resume`)."""
        self._write_metrics()
        config = RunConfig(iterations=iterations, out_dir=self.out_dir, checkpoint_every=checkpoint_every,
                           # (the run directory is this command's own, checked when it started; a recovery
                           # resumes from its checkpoints as `rose execute --resume` does)
                           resume=self.out_dir is not None, call_timeout_s=self.executor.call_timeout_s)
        runner = self.executor.runner(plan, config, on_iteration)
        try:
            results = runner.run(start=None if resume else self.k, stop=stop)
        finally:
            # the workers ran this runner's plan: a measurement after it loads its plan again and trains
            # through the switch first (`rose optimize --max-overhead` searches again after a segment)
            self._last_plan = None
            self.executor.forget_loaded()
        if results:
            self.k = results[-1].iteration + 1
        elif resume and runner.resumed is not None:
            self.k = runner.resumed.iteration + 1
        return results

    def close(self) -> None:
        if self.cpu is not None:
            self.cpu.close()
        self.executor.close()


def window_metrics(lines: Sequence[Mapping[str, float]], seconds: float) -> dict[str, float]:
    """The metrics of a window's measured iterations as one run of `seconds`: a throughput (`*_per_s`)
    is what they did in all over `seconds` (each line's rate times its `iteration_s` is what that
    iteration did), `iteration_s` the seconds per iteration, anything else the mean over the lines;
    `window/iterations` says how many they were."""
    out: dict[str, float] = {}
    for key in sorted({k for line in lines for k in line}):
        vals = [(float(line[key]), float(line.get("iteration_s", 0.0))) for line in lines if line.get(key) is not None]
        if key.endswith("_per_s"):
            out[key] = sum(v * s for v, s in vals) / seconds if seconds > 0 else 0.0
        else:
            out[key] = sum(v for v, _ in vals) / len(vals)
    out["iteration_s"] = seconds / max(1, len(lines))
    out["window/iterations"] = float(len(lines))
    return out


def _memory_limits(gpu: bool) -> dict[str, int]:
    """Bytes the processes a plan adds may use: half the free host memory, and 80% of the free memory of
    the GPU when the workflow has GPU components (and CUDA is there)."""
    limits = {"cpu": int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") * 0.5)}
    if gpu:
        try:
            import torch

            free, _ = torch.cuda.mem_get_info()
            limits["gpu"] = int(free * 0.8)
        except Exception:  # noqa: BLE001 - no CUDA here: no GPU limit
            pass
    return limits
