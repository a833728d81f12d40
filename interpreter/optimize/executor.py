"""Running any plan of one workflow on one set of component workers: the `Executor` under `rose optimize`'s
trial session (`interpreter.optimize.trials.TrialSession`) and `rose compare`.

Why one set of workers for every plan: the plans the optimizer measures compute what the declared
workflow computes on the same component state, so they must run in the same processes -- switching a
plan is registering its nodes with the workers (and compiling its graph), never starting processes,
except for the components a plan adds (a temporal split's copies) or a layout replaces. Everything goes
through the `Backend` interface alone (`load`, `compile`, `add_component`, `replace_component`,
`replace_actor`, state through `control`): any backend that declares `capabilities.plans` can be
measured on.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from rose_dsl.ir import Component, Workflow

from ..backend_base import Backend, CompileError, Unsupported
from ..runner import IterationResult, RunConfig, Runner
from ..schedule import Schedule
from ..trace import InvocationRecord
from ..worker import CallFailed, component_of

__all__ = ["Executor", "BuildBackend"]


BuildBackend = Callable[[Workflow, Schedule], Backend]


class Executor:
    """Runs iteration k of any plan (or local graph) of one workflow on one set of component workers.

    The workers are one `Backend`, built once by `build(workflow, schedule)` (the caller's factory:
    `rose optimize` passes `rose_cli.run.build_backend`, tests `make_backend`) with the workflow's
    components plus `extra_components` (`rose optimize`: the trial components, `trials.trial_components`), and owned by the Executor
    (`close` shuts it down). Running another plan is `Backend.load` (its nodes registered with the same
    workers) and, when `compiled`, `Backend.compile`; a component a plan adds (a temporal split's copy)
    is `Backend.add_component`. Each plan gets a `Runner` of its own, which asks only the plan's
    component processes for records, metrics and state (an idle copy reports nothing into a plan that
    does not use it).
    """

    def __init__(self, wf: Workflow, build: BuildBackend, *, compiled: bool = False, call_timeout_s: float = 900.0,
                 sampler: Any = None, log: Callable[[str], None] = print,
                 extra_components: Mapping[str, Component] | None = None) -> None:
        self.call_timeout_s, self.sampler, self.log = call_timeout_s, sampler, log
        extra = {n: c for n, c in (extra_components or {}).items() if n not in wf.components}
        workers = replace(wf, components={**wf.components, **extra}) if extra else wf
        t = time.perf_counter()
        self.backend: Backend | None = build(workers, Schedule(workers))
        self.startup_s = time.perf_counter() - t
        caps = self.backend.capabilities
        if not caps.plans:
            name = self.backend.name
            self.close()
            raise ValueError(f"the {name} backend cannot switch plans between iterations, which rose optimize needs")
        self.compiled = compiled and caps.compilable
        self._runners: dict[int, tuple[Workflow, Runner]] = {}
        self._loaded: Workflow | None = None  # the plan the workers run now
        self._defs: dict[str, Component] = dict(workers.components)  # what each running component was started as
        self.loads = 0  # plan switches (each registers nodes, and recompiles when compiled)
        self.prepare_s = 0.0  # switching plans, compiling graphs, adding components

    @property
    def backend_name(self) -> str:
        return self._backend.name

    @property
    def _backend(self) -> Backend:
        if self.backend is None:
            raise RuntimeError("the executor is closed")
        return self.backend

    @property
    def processes(self) -> bool:
        """Each component is an OS process of its own (Ray), not a thread of this one."""
        return self._backend.capabilities.processes

    @property
    def switch_is_costly(self) -> bool:
        """Changing the plan between runs may compile a graph: a plan's first run does, and so does a plan
        whose graph left the backend's cache (the Ray backend keeps the last few, `GRAPH_CACHE`)."""
        return self.compiled

    def components(self) -> list[str]:
        return list(self._backend.components())

    def add_components(self, comps: Mapping[str, Component]) -> list[str]:
        """Start workers for the components a plan needs and the backend lacks (a temporal split's
        copies); Unsupported when the backend cannot add one (a GPU copy on Ray, whose GPU placement is
        fixed when the processes start)."""
        have = {component_of(c) for c in self.components()}
        added = []
        for name, comp in comps.items():
            if name not in have:
                self._backend.add_component(comp)
                self._defs[name] = comp
                added.append(name)
        return added

    def use_layout(self, wf: Workflow) -> list[str]:
        """Run `wf`'s components as `wf` defines them from now on: each one whose definition differs from
        the running one (another replica count or other args: a layout) gets fresh processes
        (`Backend.replace_component`), the others keep theirs and their state. The replaced ones, in
        order; the next `run` loads its plan afresh."""
        replaced = []
        for name, comp in wf.components.items():
            running = self._defs.get(name)
            if running is not None and (running.replicas, running.args) != (comp.replicas, comp.args):
                copies = sorted(n for n, c in self._defs.items() if c.copy_of == name)
                if copies:  # (layouts are tried before stage 1 starts any copy)
                    raise Unsupported(f"cannot change '{name}''s processes while its copies {', '.join(copies)} run")
                self._loaded = None
                try:
                    self._backend.replace_component(comp)
                except CallFailed:
                    self._backend.replace_component(running)  # the old processes back, then say why
                    raise
                self._defs[name] = comp
                replaced.append(name)
        return replaced

    def _runner(self, plan: Workflow) -> Runner:
        entry = self._runners.get(id(plan))
        if entry is None or entry[0] is not plan:
            config = RunConfig(iterations=1 << 30, out_dir=None, call_timeout_s=self.call_timeout_s, tensorboard=False)
            entry = (plan, Runner(plan, self._backend, config, Schedule(plan), None, self.sampler))
            self._runners[id(plan)] = entry
        return entry[1]

    def _load(self, plan: Workflow, runner: Runner) -> None:
        """Make the workers run `plan` (nothing to do when they already do)."""
        if self._loaded is plan:
            return
        backend = self._backend
        self._loaded = None  # (until loaded: a failure below leaves nothing half-believed)
        backend.load(runner.schedule)
        self.loads += 1
        # (a loop that ends on a condition, an asynchronous plan: call by call, the compiled graph of a
        # synchronous plan stays in the backend's cache)
        if self.compiled and not runner.schedule.dynamic and runner.schedule.depth == 1:
            try:
                backend.compile(runner.schedule)
            except CompileError as exc:  # per-call dispatch from now on, said plainly (as rose execute does)
                self.log(f"warning: cannot compile {plan.name} into a Ray Compiled Graph ({exc}); dispatching call "
                         "by call for the rest of the session")
                self.compiled = False
        self._loaded = plan

    def runner(self, plan: Workflow, config: RunConfig,
               on_iteration: Callable[[IterationResult], None] | None = None) -> Runner:
        """A `Runner` of `plan` on these workers with a run's own `config` (iterations, run directory,
        checkpoints) and the plan loaded (and compiled): training goes on in the processes, with the state
        they hold (`rose optimize --train`). The workers stay the executor's (`close` shuts them down)."""
        self.stop_parked()
        self.add_components(plan.components)
        runner = Runner(plan, self._backend, config, Schedule(plan), on_iteration, self.sampler)
        self._load(plan, runner)
        return runner

    def forget_loaded(self) -> None:
        """Another runner ran on the workers (`TrialSession.train_on`): the next plan is loaded again."""
        self._loaded = None

    def stop_parked(self) -> None:
        """Stop the processes a quota move left parked (`Backend.replace_actor(keep=True)`): they hold GPU
        memory that training after the optimizer has no use for."""
        self._backend.stop_parked()

    def run(self, plan: Workflow, k: int) -> tuple[float, int, int, dict[str, float], list[InvocationRecord]]:
        """Iteration k of `plan`: (seconds, start ns, end ns, metrics, invocation records)."""
        t = time.perf_counter()
        self.add_components(plan.components)
        runner = self._runner(plan)
        self._load(plan, runner)
        self.prepare_s += time.perf_counter() - t
        before = len(runner.trace)
        deferred = runner.schedule.depth > 1
        if deferred:  # an asynchronous plan, measured one drained iteration at a time (see `rose optimize`'s docs)
            runner.schedule.start_at(k)
        t0 = time.perf_counter_ns()
        result = runner.run_iteration(k, drain=deferred)
        t1 = time.perf_counter_ns()
        return result.seconds, t0, t1, result.metrics, runner.trace.records()[before:]

    def run_window(self, plan: Workflow, k: int, n: int) -> tuple[int, list[tuple[IterationResult, int]],
                                                                   list[InvocationRecord]]:
        """Iterations k..k+n-1 of an asynchronous plan (`defer:`) pipelined as `rose execute` runs them --
        up to `Schedule.depth` in flight, nothing drained between them -- and what is still deferred
        drained after the last one (so the next plan starts from the declared workflow's state): (start ns,
        each iteration's result with the ns its metrics line was written, the window's invocation records,
        the drain's included). Throughput over such a window is what an asynchronous plan gains; one
        drained iteration at a time (`run`) shows none of it."""
        from ..pipeline import run_pipelined

        t = time.perf_counter()
        self.add_components(plan.components)
        runner = self._runner(plan)
        self._load(plan, runner)
        self.prepare_s += time.perf_counter() - t
        before, done = len(runner.trace), len(runner.results)
        ends: dict[int, int] = {}
        runner.on_iteration = lambda r: ends.__setitem__(r.iteration, time.perf_counter_ns())
        runner.schedule.start_at(k)
        t0 = time.perf_counter_ns()
        try:
            run_pipelined(runner, k, None, end=k + n)
        finally:
            runner.on_iteration = None
        return t0, [(r, ends[r.iteration]) for r in runner.results[done:]], runner.trace.records()[before:]

    def metric_notes(self) -> dict[str, str]:
        """How each metric merged over several processes of a component was merged, over every plan run so
        far (`Runner.metric_notes`): what a plan's report names (per-copy snapshots, undeclared means)."""
        notes: dict[str, str] = {}
        for _, runner in self._runners.values():
            notes.update(runner.metric_notes)
        return notes

    def drain(self) -> None:
        """After a failed iteration: wait until every call still queued or running has ended (a control
        call runs after them on each worker) and forget their records and metrics; the plan is loaded
        (and compiled) afresh at the next run, as a graph a failure ran through may be unusable."""
        for comp in self.components():
            for what in ("pop_records", "pop_metrics"):
                try:
                    self._backend.control(comp, what)
                except (CallFailed, TimeoutError):  # a worker that failed its calls still answers; a dead one cannot
                    pass
        self._loaded = None

    def get_states(self, comp: str) -> dict[str, Any]:
        return self._backend.control(comp, "get_states")

    def control(self, comp: str, method: str, *args: Any) -> Any:
        """Ask a component's process (`Backend.control`), e.g. to write its state file of a checkpoint."""
        return self._backend.control(comp, method, *args)

    def keep_states(self, comps: Sequence[str]) -> int:
        """Each component copies its state and keeps the copy in its own process (`ComponentWorker.keep_states`:
        nothing crosses to the driver); the bytes kept in all."""
        return sum(int(self._backend.control(c, "keep_states")) for c in comps)

    def restore_kept(self, comps: Sequence[str], drop: bool = True) -> None:
        for c in comps:
            self._backend.control(c, "restore_kept", drop)

    def drop_kept(self, comps: Sequence[str]) -> None:
        for c in comps:
            self._backend.control(c, "drop_kept")

    def set_states(self, comp: str, states: Mapping[str, Any]) -> None:
        self._backend.control(comp, "set_states", dict(states))

    def pids(self) -> dict[str, int]:
        """The OS process of each component (only when components are processes of their own)."""
        if not self.processes:
            return {}
        return {c: int(self._backend.control(c, "info")["pid"]) for c in self.components()}

    def thread_ids(self) -> dict[str, int]:
        """The thread each component runs its calls on (components that are threads of this process)."""
        if self.processes:
            return {}
        return {c: int(self._backend.control(c, "info")["thread"]) for c in self.components()}

    def replace_quota(self, comp: str, quota: int | None, mps_env: dict[str, str] | None,
                      priority: int | None = None, keep: bool = False) -> dict[str, Any]:
        """Move a GPU component to a new process under another MPS quota (and client priority, when not
        None), its state moved with it (`Backend.replace_actor`: a restartable backend recompiles a compiled
        iteration around it); `keep`: the old process may be parked, to be moved back to."""
        if not self._backend.capabilities.restartable:
            raise Unsupported(f"quota trials need a backend with one process per component (the {self.backend_name} "
                              "backend cannot move a component to a new process)")
        return self._backend.replace_actor(comp, quota, mps_env, priority=priority, keep=keep)

    def close(self) -> None:
        if self.backend is not None:
            backend, self.backend = self.backend, None
            backend.shutdown()
