"""The measuring side of `rose optimize`: complete iterations, captured inputs, local trials on state
snapshots and quota trials, on the real backends (implements `rose_dsl.optimizer.search.Measurer`).

Why complete-iteration trials are training: every plan the optimizer measures computes exactly what
the declared workflow computes, so running iteration k with one plan and k+1 with another keeps
training bit-identical; those iterations are kept (checkpointed at the end) and count as retained
progress. Local trials are not training: before each run of a comparison graph, the state of every
component it writes is restored from a snapshot (the checkpoint contract: `get_states`/`set_states`),
and again after the last one, so training continues from exactly where it was.

`Executor` is the one place that knows how to run an arbitrary plan's iteration on the backends of
`interpreter.backends` (register its nodes, recompile a Ray Compiled Graph, add components such as
the trial's `__feed__`); when the backends get a common protocol, only this class changes.
"""

from __future__ import annotations

import copy
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

from rose_dsl.ir import Component, ExecutionNode, Workflow
from rose_dsl.optimizer.profile import Call, IterationRun
from rose_dsl.optimizer.regions import FEED, PROBE, LocalGraph, feed_component, probe_component
from rose_dsl.optimizer.search import OutOfBudget

from .backends import Backend, CallFailed, LocalBackend, RayBackend, RayCompiledBackend
from .components import ComponentError
from .cpu_activity import CpuActivity, process_clock, thread_clock
from .runner import RunConfig, Runner
from .schedule import Schedule
from .trace import InvocationRecord
from .worker import ComponentWorker

__all__ = ["Feed", "Probe", "Executor", "TrialSession", "TrialFailed", "state_bytes", "trial_components"]


class TrialFailed(Exception):
    """A candidate plan's run failed (a component raised); the state it may have changed was restored."""

FEED_IMPL, PROBE_IMPL = "interpreter.trials:Feed", "interpreter.trials:Probe"


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


def state_bytes(value: Any) -> int:
    """Bytes of the tensors in a (nested) state value."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(state_bytes(v) for v in value.values())
    if isinstance(value, list | tuple):
        return sum(state_bytes(v) for v in value)
    return 0


class Executor:
    """Runs iteration k of any plan (or local graph) on one set of component workers."""

    def __init__(self, wf: Workflow, kind: str = "local", *, compiled: bool = True, allowed: Sequence[str] = (),
                 address: str | None = None, mps_env: Mapping[str, dict[str, str]] | None = None,
                 device: str = "cpu", call_timeout_s: float = 900.0, sampler: Any = None,
                 log: Callable[[str], None] = print, extra_components: Mapping[str, Component] | None = None) -> None:
        if kind not in ("local", "ray"):
            raise ValueError(f"backend must be 'local' or 'ray', not {kind!r}")
        # the trial components (`Feed`, `Probe`) live here: always allowed
        self.kind, self.compiled = kind, compiled and kind == "ray"
        self.allowed = tuple(dict.fromkeys((*allowed, "interpreter.trials")))
        self.address, self.mps_env, self.device = address, dict(mps_env or {}), device
        self.call_timeout_s, self.sampler, self.log = call_timeout_s, sampler, log
        self.wf = wf
        self.backend: Any = None
        self._runners: dict[int, tuple[Workflow, Runner]] = {}
        self._registered: set[int] = set()
        self._compiled_for: int | None = None
        self.rebuilds = 0
        self.prepare_s = 0.0  # registering plans' nodes, compiling graphs, adding components
        t = time.perf_counter()
        extra = {n: c for n, c in (extra_components if extra_components is not None else trial_components()).items()
                 if n not in wf.components}
        self._start(replace(wf, components={**wf.components, **extra}) if extra else wf)
        self.startup_s = time.perf_counter() - t

    @property
    def switch_is_costly(self) -> bool:
        """Changing the plan between runs recompiles a Ray Compiled Graph."""
        return self.compiled

    def _start(self, wf: Workflow) -> None:
        loops = Schedule(wf).program.loops_of
        if self.kind == "local":
            self.backend = LocalBackend(wf, self.allowed, loops, self.device)
        else:
            cls = RayCompiledBackend if self.compiled else RayBackend
            self.backend = cls(wf, self.allowed, loops, address=self.address, mps_env=self.mps_env)
        self.wf = wf
        self._runners.clear()
        self._registered.clear()
        self._compiled_for = None

    def components(self) -> list[str]:
        return list(self.backend.components())

    def add_components(self, comps: Mapping[str, Component]) -> list[str]:
        """Make workers for components a plan needs and the workers lack (a temporal split's copies).
        Local: new threads. Ray: new actors; a GPU component, whose GPU placement is fixed when the
        processes start, by restarting them all with the union of components, every state moved over."""
        missing = {n: c for n, c in comps.items() if n not in self.backend.components()}
        if not missing:
            return []
        if self.kind == "local":
            for name, comp in missing.items():
                dev = self.device if comp.device == "gpu" else "cpu"
                self.backend.workers[name] = ComponentWorker(comp, self.wf.seed, dev, self.allowed)
                self.backend.pools[name] = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"rose-{name}")
            self.wf = replace(self.wf, components={**self.wf.components, **missing})
            return list(missing)
        if self.compiled and self.backend.dag is not None:  # it holds channels to the actors it was built on
            self.backend.dag.teardown()
            self.backend.dag = None
        self._compiled_for = None
        self._registered.clear()
        if not any(c.device == "gpu" for c in missing.values()):
            for comp in missing.values():
                self.backend.add_component(comp)
            self.wf = replace(self.wf, components={**self.wf.components, **missing})
            return list(missing)
        self.log(f"restarting the component processes to add {', '.join(missing)} (GPU placement is fixed at start)")
        states = {c: self.get_states(c) for c in self.components()}
        self.backend.shutdown()
        self.rebuilds += 1
        self._start(replace(self.wf, components={**self.wf.components, **missing}))
        for c, st in states.items():
            if st:
                self.set_states(c, st)
        return list(missing)

    def _runner(self, plan: Workflow) -> Runner:
        entry = self._runners.get(id(plan))
        if entry is None or entry[0] is not plan:
            config = RunConfig(iterations=1 << 30, out_dir=None, call_timeout_s=self.call_timeout_s, tensorboard=False)
            view = cast(Backend, _PlanView(self.backend, plan, lambda: self.compiled))  # duck-typed: delegates
            entry = (plan, Runner(plan, view, config, Schedule(plan), None, self.sampler))
            self._runners[id(plan)] = entry
        return entry[1]

    def _prepare(self, plan: Workflow, runner: Runner) -> None:
        loops = runner.schedule.program.loops_of
        self.backend.loops_of = loops
        if self.kind == "local" or id(plan) in self._registered and (not self.compiled or self._compiled_for == id(plan)):
            return
        if id(plan) not in self._registered:
            import ray

            nodes: dict[str, dict] = {}
            for item in plan.items():
                if isinstance(item, ExecutionNode):
                    nodes.setdefault(item.component, {})[item.path] = item
            loops_t = {p: tuple(v) for p, v in loops.items()}
            refs = [actor.register_nodes.remote(nodes.get(name.partition("#")[0], {}), loops_t)
                    for name, actor in self.backend.actors.items()]
            ray.get(refs, timeout=120)
            self._registered.add(id(plan))
        if self.compiled and self._compiled_for != id(plan):
            if self.backend.dag is not None:
                self.backend.dag.teardown()
                self.backend.dag = None
            try:
                self.backend.compile(runner.schedule)
            except Exception as exc:  # noqa: BLE001 - fall back to per-call dispatch, said plainly (as rose execute)
                self.log(f"warning: cannot compile {plan.name} into a Ray Compiled Graph ({type(exc).__name__}: "
                         f"{exc}); dispatching call by call for the rest of the session")
                self.backend.dag = None
                self.compiled = False
                return
            self._compiled_for = id(plan)

    def run(self, plan: Workflow, k: int) -> tuple[float, int, int, dict[str, float], list[InvocationRecord]]:
        """Iteration k of `plan`: (seconds, start ns, end ns, metrics, invocation records)."""
        t = time.perf_counter()
        self.add_components(plan.components)
        runner = self._runner(plan)
        self._prepare(plan, runner)
        self.prepare_s += time.perf_counter() - t
        before = len(runner.trace)
        t0 = time.perf_counter_ns()
        result = runner.run_iteration(k)
        t1 = time.perf_counter_ns()
        return result.seconds, t0, t1, result.metrics, runner.trace.records()[before:]

    def drain(self) -> None:
        """After a failed iteration: wait until every call still queued or running has ended (a control
        call runs after them on each worker), forget their records and metrics, and drop a compiled graph
        that a failure may have left unusable."""
        for comp in self.components():
            for what in ("pop_records", "pop_metrics"):
                try:
                    self.backend.control(comp, what)
                except Exception:  # noqa: BLE001 - a worker that failed its calls still answers; a dead one cannot
                    pass
        if self.compiled and getattr(self.backend, "dag", None) is not None:
            try:
                self.backend.dag.teardown()
            except Exception:  # noqa: BLE001 - a broken graph: it is rebuilt at the next run anyway
                pass
            self.backend.dag = None
        self._compiled_for = None

    def get_states(self, comp: str) -> dict[str, Any]:
        return self.backend.control(comp, "get_states")

    def set_states(self, comp: str, states: Mapping[str, Any]) -> None:
        self.backend.control(comp, "set_states", dict(states))

    def pids(self) -> dict[str, int]:
        return dict(getattr(self.backend, "pids", {}))

    def replace_quota(self, comp: str, quota: int | None, mps_env: dict[str, str] | None) -> dict[str, Any]:
        """Move a GPU component to a new process under another MPS quota, state moved (Ray only)."""
        if self.kind != "ray":
            raise ValueError("quota trials need the Ray backend (one process per component)")
        if self.compiled and self.backend.dag is not None:
            self.backend.dag.teardown()
            self.backend.dag = None
        self._compiled_for = None
        self._registered.clear()
        info = self.backend.replace_actor(comp, quota, mps_env)
        self.wf = replace(self.wf, components={**self.wf.components,
                                               comp: replace(self.wf.components[comp], mps_quota=quota)})
        return info

    def close(self) -> None:
        if self.backend is not None:
            self.backend.shutdown()
            self.backend = None


class _PlanView:
    """The backend as one plan sees it: only the plan's component processes are asked for records and
    metrics (the workers hold every component the session needed; an idle temporal-split copy must not
    report zeros into a plan that does not use it)."""

    def __init__(self, backend: Any, plan: Workflow, compiled: Callable[[], bool]) -> None:
        self._backend = backend
        self._names = set(plan.components)
        self._compiled = compiled

    def components(self) -> list[str]:
        return [c for c in self._backend.components() if c.partition("#")[0] in self._names]

    def __getattr__(self, name: str) -> Any:
        if name == "execute_iteration" and not self._compiled():  # per-call dispatch (compiling failed)
            raise AttributeError(name)
        return getattr(self._backend, name)


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


class TrialSession:
    """Implements the optimizer's `Measurer` on an `Executor`, keeping the books: training iterations
    (retained), local trials, captures, and the time of each."""

    def __init__(self, wf: Workflow, executor: Executor, *, out_dir: Path | None = None, gpu_sampler: Any = None,
                 log: Callable[[str], None] = print, memory_limits: Mapping[str, int] | None = None) -> None:
        if wf.root.carries:
            raise ValueError("the iteration loop carries values from one RL iteration to the next; the optimizer "
                             "switches plans between iterations and cannot carry them across plans yet")
        self.wf, self.executor, self.out_dir, self.log = wf, executor, out_dir, log
        self.gpu = gpu_sampler
        self.activity_kind = "sm" if gpu_sampler is not None else "cpu"
        self.cpu = CpuActivity({}) if gpu_sampler is None else None
        self.k = 0
        self.limit = wf.root.count
        self.started = time.perf_counter()
        self.books: dict[str, float] = {"complete_iterations": 0, "complete_s": 0.0, "local_runs": 0, "local_s": 0.0,
                                        "captures": 0, "capture_s": 0.0, "snapshot_s": 0.0, "quota_trials": 0,
                                        "quota_s": 0.0}
        self.retained: list[dict[str, Any]] = []  # one line per training iteration (metrics.jsonl)
        self._proven: set[int] = set()  # plans (by id) that completed an iteration
        self.last_failures: dict[int, str] = {}  # the last complete()/local() call: plan index -> why it failed
        executor.add_components({FEED: feed_component(FEED_IMPL)})
        self._watch_cpu()
        self.component_bytes = _StateSizes(executor)
        self.memory_limits = dict(memory_limits) if memory_limits is not None else _memory_limits(executor.device)

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def placement(self, plan: Workflow) -> str | None:
        """On Ray, GPU processes are placed when the session starts: a plan needing another GPU process
        (a temporal split's copy of a GPU component that was not started with the session) cannot run."""
        if self.executor.kind != "ray":
            return None
        have = {c.partition("#")[0] for c in self.executor.components()}
        missing = sorted(n for n, c in plan.components.items() if c.device == "gpu" and n not in have)
        if missing:
            return (f"needs GPU process(es) {', '.join(missing)} that were not started with the session "
                    "(GPU placement is fixed at start; only the copies of a split in two groups are started)")
        return None

    def sync_books(self) -> dict[str, float]:
        """The books with the executor's set-up costs (start, plan preparation, restarts)."""
        self.books.update(startup_s=self.executor.startup_s, prepare_s=self.executor.prepare_s,
                          restarts=float(self.executor.rebuilds))
        return self.books

    def _watch_cpu(self) -> None:
        if self.cpu is None:
            return
        pids = self.executor.pids()
        for comp in self.executor.components():
            if comp in self.cpu.readers:
                continue
            reader = process_clock(pids[comp]) if comp in pids else thread_clock(f"rose-{comp}_")
            self.cpu.add(comp, reader)

    # -- turning records into calls ---------------------------------------------------------------
    def _calls(self, plan: Workflow, records: Sequence[InvocationRecord]) -> tuple[Call, ...]:
        out = []
        for r in records:
            end = r.end_ns
            if end is None or r.status != "ok":
                continue
            node = plan.find(tuple(r.node.split(".")))
            rows = None
            if isinstance(node, ExecutionNode) and node.batch is not None:
                rows = node.rows[1] - node.rows[0] if node.rows else node.batch_size
            indices = tuple(i for _, i in r.loop_indices)
            out.append(Call(r.node, r.component, indices[0] if indices else 0, indices, r.host_start_ns, end, rows,
                            self._activity(r.component, r.host_start_ns, end)))
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

    def _guarded(self, plan: Workflow, k: int, snap: dict[str, Any] | None) -> tuple[float, int, int, dict[str, float], list]:
        """Run a plan's iteration; if it fails and `snap` holds the state before it, put that state back
        (after every call still in flight has ended) and raise TrialFailed: the trial is lost, not the
        training."""
        try:
            return self.executor.run(plan, k)
        except (CallFailed, ComponentError) as exc:
            if snap is None:
                raise
            self.executor.drain()
            for c, s in snap.items():
                self.executor.set_states(c, s)
            raise TrialFailed(str(exc).splitlines()[0]) from None

    def _iteration(self, plan: Workflow, label: str, guard: bool = False) -> IterationRun:
        if self.limit is not None and self.k >= self.limit:
            raise OutOfBudget(f"the workflow's {self.limit} iterations are all trained")
        snap = None
        if guard:  # a plan that has never run: keep what training would lose if it fails
            t = time.perf_counter()
            snap = {c: self.executor.get_states(c) for c in self._written(plan)}
            self.books["snapshot_s"] += time.perf_counter() - t
        seconds, t0, t1, metrics, records = self._guarded(plan, self.k, snap)
        self._proven.add(id(plan))
        self._watch_cpu()
        if self.cpu is not None:
            self.cpu.poll()
        run = IterationRun(seconds, self._calls(plan, records), t0, t1, self.k, metrics, self._samples(t0, t1))
        self.retained.append({"iteration": self.k, "plan": label, **metrics})
        self.k += 1
        self.books["complete_iterations"] += 1
        self.books["complete_s"] += seconds
        return run

    def complete(self, plans: Sequence[Workflow], rounds: int, warmup: int = 0,
                 labels: Sequence[str] = ()) -> list[list[IterationRun]]:
        """`rounds` iterations of each plan, interleaved A B A B (reversed every other round, so a drift
        in time hits both alike); `warmup` iterations of the first plan first, not returned. `labels`
        name the plans (their rewrite requests) in the run's metrics lines."""
        labels = list(labels) or ["" for _ in plans]
        self.last_failures = {}
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
                    out[i].append(self._iteration(plans[i], labels[i], guard=new and i > 0))
                except TrialFailed as exc:  # the plan fails: its trial is lost, training goes on with the others
                    self.last_failures[i] = str(exc)
                    self.log(f"  trial failed ({labels[i] or 'plan'}): {exc}")
        return out

    def capture(self, probe_wf: Workflow) -> dict[int, dict[str, Any]]:
        """One training iteration of the current graph with probes; the values they captured."""
        t = time.perf_counter()
        self.executor.add_components(probe_wf.components)
        self._iteration(probe_wf, "probes")
        captured = self.executor.get_states(PROBE).get("captured", {})
        self.executor.set_states(PROBE, {"captured": {}})
        self.books["captures"] += 1
        self.books["capture_s"] += time.perf_counter() - t
        return captured

    # -- local trials (not training) --------------------------------------------------------------
    def local(self, graphs: Sequence[LocalGraph], repeats: int, captured: Mapping[int, Any], probe_id: int) -> list[list[IterationRun]]:
        t = time.perf_counter()
        self.executor.set_states(FEED, {"values": captured.get(probe_id, {})})
        writes = sorted({c for g in graphs for c in g.writes})
        snap = {c: self.executor.get_states(c) for c in writes}
        self.books["snapshot_s"] += time.perf_counter() - t
        out: list[list[IterationRun]] = [[] for _ in graphs]
        order = [(r, i) for i in range(len(graphs)) for r in range(repeats)] if self.executor.switch_is_costly else \
            [(r, i) for r in range(repeats) for i in range(len(graphs))]
        self.last_failures = {}
        try:
            for _, i in order:
                if i in self.last_failures:
                    continue
                for c, s in snap.items():
                    self.executor.set_states(c, s)
                try:
                    seconds, t0, t1, _, records = self._guarded(graphs[i].workflow, 0, snap)
                except TrialFailed as exc:
                    self.last_failures[i] = str(exc)
                    self.log(f"  local trial failed: {exc}")
                    continue
                self._watch_cpu()
                if self.cpu is not None:
                    self.cpu.poll()
                out[i].append(IterationRun(seconds, self._calls(graphs[i].workflow, records), t0, t1))
                self.books["local_runs"] += 1
        finally:
            for c, s in snap.items():
                self.executor.set_states(c, s)
        self.books["local_s"] += time.perf_counter() - t
        return out

    # -- the end ----------------------------------------------------------------------------------
    def finish(self, plan_label: str) -> Path | None:
        """Write the trained iterations' metrics and a checkpoint to the run directory, so that training
        continues from here (`rose execute FILE --plan PLAN --out RUN --resume`)."""
        if self.out_dir is None or self.k == 0:
            return None
        from .checkpoint import save_checkpoint

        self.out_dir.mkdir(parents=True, exist_ok=True)
        with (self.out_dir / "metrics.jsonl").open("a") as f:
            for line in self.retained:
                f.write(json.dumps(line) + "\n")
        states = {c: self.executor.get_states(c) for c in self.wf.components}
        return save_checkpoint(self.out_dir / "checkpoints", self.k - 1, states,
                               meta={"workflow": self.wf.name, "written_by": "rose optimize", "plan": plan_label})

    def close(self) -> None:
        if self.cpu is not None:
            self.cpu.close()
        self.executor.close()


def _memory_limits(device: str) -> dict[str, int]:
    limits = {"cpu": int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") * 0.5)}
    if device != "cpu":
        try:
            import torch

            free, _ = torch.cuda.mem_get_info()
            limits["gpu"] = int(free * 0.8)
        except Exception:  # noqa: BLE001 - no CUDA here: no GPU limit
            pass
    return limits
