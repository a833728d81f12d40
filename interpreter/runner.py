"""`rose execute`: RL iterations on a backend, with metrics, traces, checkpoints and resume.

Per iteration: submit every call in program order (the backend returns handles at once), wait for
them in program order (so the first failure reported is the root cause, not a consumer of it),
collect the workers' invocation records and metrics, write a metrics line, and checkpoint every N
iterations. A run with a directory keeps its work: a checkpoint of its last iteration when it ends or is
asked to stop (`stop`, a signal), and an export of that state loadable without rose (`export/`).
Everything is flushed on every exit path.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rose_dsl.identity import NodePath
from rose_dsl.ir import Workflow
from rose_dsl.measurement import call_identity

from .backend_base import NODE_LIMIT, Backend, Overdue, WatchdogTimeout
from .checkpoint import (
    Checkpoint,
    CheckpointError,
    Rejected,
    export_checkpoint,
    find_resumable,
    save_component_checkpoint,
)
from .metric_merge import _name_base, merge_metrics
from .rundir import MetricsLog, check_run_dir
from .safe_io import open_new, write_atomic
from .schedule import ReplicaSet, Schedule, replicated
from .trace import ExecutionTrace, InvocationRecord
from .worker import CallFailed, component_of

__all__ = ["RunConfig", "Runner", "IterationResult", "Resumed", "ParamsChanged", "param_changes", "recorded_params",
           "workflow_sha256"]


@dataclass
class RunConfig:
    iterations: int
    out_dir: Path | None = None
    checkpoint_every: int = 0
    resume: bool = False
    call_timeout_s: float = 900.0
    tensorboard: bool = True
    loggers: tuple[str, ...] = ()  # trackers besides TensorBoard: "mlflow", "wandb" (loggers.py)
    max_restarts: int = 2  # a component process that dies is restarted this often, then the run stops
    allow_param_change: tuple[str, ...] = ()  # params a resume may change (`--allow-param-change`)
    export: bool = True  # at the end, the final state into `export/` (loadable without rose)
    trace: bool = True  # at the end, trace.json and trace.jsonl (`--trace off`: not; nodes.json is written)


class ParamsChanged(Exception):
    """`--resume` with params other than the run's checkpoint was written with; the message lists them."""


def recorded_params(wf: Workflow) -> dict[str, Any]:
    """The params a checkpoint records (those JSON holds), to compare at a resume."""
    out = {}
    for name, value in wf.params.items():
        try:
            out[name] = json.loads(json.dumps(value, allow_nan=False))
        except (TypeError, ValueError):
            continue
    return out


def param_changes(recorded: Mapping[str, Any], current: Mapping[str, Any],
                  allowed: tuple[str, ...] = ()) -> list[tuple[str, Any, Any]]:
    """(param, old, new) for each param that differs between a checkpoint's record and now, except
    `allowed`; a param only one side has shows `None` on the other."""
    return [(name, recorded.get(name), current.get(name)) for name in sorted({*recorded, *current})
            if name not in allowed and (name not in recorded or name not in current or recorded[name] != current[name])]


def check_params(meta: Mapping[str, Any], wf: Workflow, allowed: tuple[str, ...], where: Path) -> None:
    """Refuse (ParamsChanged) to resume the run whose checkpoint `meta` recorded other params: its
    components' state was made with those (64 environments' rows trained as 32)."""
    recorded = meta.get("params")
    if not isinstance(recorded, dict):  # (written by `rose optimize`, or before params were recorded)
        return
    changed = param_changes(recorded, recorded_params(wf), allowed)
    if not changed:
        return
    rows = "".join(f"\n  {name}: {_shown(old, name in recorded)} -> {_shown(new, name in wf.params)}"
                   for name, old, new in changed)
    names = ",".join(name for name, _, _ in changed)
    raise ParamsChanged(f"--resume: the run in {where} was trained with other params than these:{rows}\n"
                        "its state was made with the old values; resume without changing them, or, where the state "
                        f"can take the change, allow it with --allow-param-change {names} (to train longer, -n N "
                        "sets the total iterations without changing a param)")


def _shown(value: Any, present: bool) -> str:
    return json.dumps(value) if present else "(not set)"


def workflow_sha256(wf: Workflow) -> str:
    """A hash of what the run computes: the workflow as resolved (params substituted), in rose's canonical
    YAML (`serialize.to_yaml`); the file's bytes when it cannot be written so."""
    from rose_dsl.serialize import to_yaml

    try:
        text = to_yaml(wf).encode()
    except Exception:  # noqa: BLE001 - a hash for the record only; any failure falls back to the file
        try:
            text = Path(wf.file).read_bytes()
        except (OSError, TypeError):
            text = wf.name.encode()
    return hashlib.sha256(text).hexdigest()


@dataclass(frozen=True)
class Resumed:
    """Where a run continues from: the checkpoint used and every newer one rejected (with why)."""

    checkpoint: Path
    iteration: int  # the checkpoint's iteration; the run continues at iteration + 1
    rejected: tuple[Rejected, ...] = ()
    in_flight: tuple[str, ...] = ()  # an asynchronous plan's deferred calls still to come (kept by a stop)
    drained_at_stop: str | None = None  # a stop of an asynchronous plan drained there (not exact): why


@dataclass
class IterationResult:
    iteration: int
    seconds: float
    metrics: dict[str, float] = field(default_factory=dict)


def _structural(wf: Workflow) -> dict[str, str]:
    """`iteration.epoch@1.step.act@0` -> `iteration.epoch.step.act`: a split group is its node."""
    from rose_dsl.transforms import source_paths

    return {".".join(p): ".".join(s) for p, s in source_paths(wf).items()}


def _rows_per_call(wf: Workflow) -> dict[str, int]:
    """Each node's batch rows per call (a row group's own rows; 1 for a node without a batch)."""
    from rose_dsl.ir import ExecutionNode

    return {".".join(n.path): (n.plan.rows[1] - n.plan.rows[0]) if n.plan.rows else (n.batch_size or 1)
            for n in wf.items() if isinstance(n, ExecutionNode)}


def _as_gpu_activity(sampler: Any) -> Any:
    """One `ActivitySampler` (one GPU) or a `GpuActivity` (several): always a `GpuActivity`."""
    from .gpu_activity import ActivitySampler, GpuActivity

    if isinstance(sampler, ActivitySampler):
        return GpuActivity({sampler.gpu_index: sampler})
    return sampler


def merge_replica_metrics(per_process: dict[str, dict[str, float]], work: Mapping[str, int] | None = None,
                          declared: Mapping[str, Mapping[str, str]] | None = None) -> dict[str, float]:
    """`{process: {metric: value}}` -> `{"component/metric": value}`, replicas (`name#r`) and temporal-split
    copies (`name@g`) folded into their component by each metric's rule (`interpreter/metric_merge.py`):
    undeclared counts summed, everything else the mean over the processes that reported it, weighted by the
    work each did (`work`, per process, this iteration: the batch rows of its calls) when that differs. Why
    weighted: a process's mean is over its own rows, and the temporal groups of an odd count are uneven -- 3
    epochs split in 2 run 2 and 1 on the copies, and their plain mean (m_A + m_B) / 2 is not the declared
    (2 m_A + m_B) / 3. Rows, not calls: a copy whose steps are split in row groups runs twice the calls on
    half the rows each."""
    return merge_metrics(per_process, work, declared).values


class Runner:
    def __init__(self, wf: Workflow, backend: Backend, config: RunConfig, schedule: Schedule | None = None,
                 on_iteration: Callable[[IterationResult], None] | None = None, sampler: Any = None) -> None:
        self.wf = wf
        self.backend = backend
        self.config = config
        self.schedule = schedule or Schedule(wf)
        self._structural = _structural(wf)  # a call's node -> the source node (split groups merged)
        self._replicas = max((c.replicas for c in wf.components.values()), default=1)
        if self._replicas > 1 and not backend.capabilities.replicas:
            raise ValueError(f"replicas: {self._replicas} needs a backend with one process per replica (--backend ray)")
        if self._replicas > 1 and self.schedule.dynamic:
            raise ValueError(f"loop '{self.schedule.dynamic[0].name}' ends on a condition (until): such a loop runs "
                             "with one process per component (no replicas) for now")
        self.on_iteration = on_iteration
        self.sampler = _as_gpu_activity(sampler)
        self.trace = ExecutionTrace(meta={"workflow": wf.name})
        self.results: list[IterationResult] = []
        self.recoveries: list[dict[str, Any]] = []
        self.on_recovery: Callable[[dict[str, Any]], None] | None = None  # told of each restart
        self._stuck = False  # the watchdog fired: components may not answer
        self._fresh: list[InvocationRecord] = []
        self._work: dict[str, int] = {}  # this iteration's batch rows per process: weights of merged means
        self._rows = _rows_per_call(wf)
        self.processes: dict[int, dict[str, Any]] = {}  # pid -> the process's own view (SM count, quota)
        self._rules: dict[str, Mapping[str, str]] = {}  # component -> its declared metric_merge
        self.metric_notes: dict[str, str] = {}  # metric merged over several processes -> how (for reports)
        self.resumed: Resumed | None = None
        self.last_checkpoint: Path | None = None  # the newest checkpoint of this run (written or resumed from)
        self.exported: Path | None = None  # `export/`, once written
        self._sha256: str | None = None  # workflow_sha256(wf), when first needed
        self.on_resume: Callable[[Resumed], None] | None = None  # told which checkpoint a resume uses
        # an asynchronous plan: what the checkpoint continued from had in flight (`in_flight.py`), and why a
        # stop of this run could not keep what it had (it drained instead)
        self.in_flight: dict[str, Any] | None = None
        self.stop_drained: str | None = None
        self.outputs: MetricsLog | None = None  # metrics.jsonl + TensorBoard (opened at the first iteration)
        if config.out_dir is not None and not config.resume:
            check_run_dir(config.out_dir, resume=False, overwrite=False)  # never two runs in one directory

    def component_processes(self) -> list[str]:
        """The backend's component processes that this workflow's components run on. Usually all of them;
        a backend that also hosts other components (the optimizer's: trial components, the copies other
        plans need) must not have those report records, metrics or state into this run."""
        return [c for c in self.backend.components() if component_of(c) in self.wf.components]

    # -- resume -----------------------------------------------------------------------------
    def describe_processes(self) -> None:
        """Ask every component process what it sees (pid, SMs under its MPS quota) for the trace."""
        for comp in self.component_processes():
            try:
                info = self.backend.control(comp, "info", timeout=60)
            except (CallFailed, TimeoutError):  # descriptive only: a failing process is reported by its calls
                continue
            self.processes[info["pid"]] = info

    def _bases(self, processes: Iterable[str]) -> dict[str, str]:
        """Each process's component as the source workflow names it, from the plan: a replica's component,
        a temporal-split copy's `copy_of` (a process of a component this plan does not know: its name)."""
        out = {}
        for process in processes:
            spec = self.wf.components.get(component_of(process))
            out[process] = (spec.copy_of or spec.name) if spec is not None else _name_base(process)
        return out

    def _metric_rules(self, per_process: Mapping[str, Mapping[str, float]]) -> dict[str, Mapping[str, str]]:
        """Each component's declared `metric_merge`, asked once per component and only when several of its
        processes report metrics (the one case where a rule matters)."""
        counts: dict[str, int] = defaultdict(int)
        bases = self._bases(per_process)
        for process, values in per_process.items():
            if values:
                counts[bases[process]] += 1
        for comp in (c for c, n in counts.items() if n > 1 and c not in self._rules):
            try:
                info = self.backend.control(comp, "info", timeout=60)
            except (CallFailed, TimeoutError):
                info = {}
            self._rules[comp] = dict((info or {}).get("metric_merge") or {})
            if (info or {}).get("metric_merge_problem"):
                self.metric_notes[comp] = f"{info['metric_merge_problem']} (ignored: the default rules apply)"
        return self._rules

    def _gpu_of(self, pid: int | None) -> int | None:
        """The NVML index of the GPU a component process runs on, when one GPU is visible to it and
        sampled (several GPUs); None: charge the mean over the sampled GPUs."""
        if self.sampler is None or len(self.sampler.per_gpu) < 2 or pid is None:
            return None
        visible = str((self.processes.get(pid) or {}).get("visible_gpus") or "")
        first = visible.split(",")[0].strip()
        return int(first) if first.isdigit() and "," not in visible and int(first) in self.sampler.per_gpu else None

    def _last_checkpoint(self) -> tuple[Checkpoint, tuple[Rejected, ...]]:
        """The newest checkpoint that verifies, and the newer ones rejected; CheckpointError (saying how
        many were found and why each was rejected) when none is usable."""
        if self.config.out_dir is None:
            raise CheckpointError("--resume needs --out (the run directory holding checkpoints)")
        ckpt_dir = self.config.out_dir / "checkpoints"
        ckpt, rejected = find_resumable(ckpt_dir)
        if ckpt is None:
            why = "".join(f"\n  {r.path.name}: {r.reason}" for r in rejected)
            raise CheckpointError(f"no usable checkpoint under {ckpt_dir}: {len(rejected)} found" +
                                  (f", each rejected:{why}" if rejected else ""))
        return ckpt, tuple(rejected)

    def _load_states(self, ckpt: Checkpoint) -> None:
        for comp, states in ckpt.states.items():
            if comp in self.component_processes() and states:
                self.backend.control(comp, "set_states", states)

    def restore(self) -> int:
        """Load the newest usable checkpoint into the workers (saying which, and which newer ones were
        rejected and why); return the first iteration to run."""
        if not self.config.resume:
            return 0
        ckpt, rejected = self._last_checkpoint()
        written_by = ckpt.meta.get("workflow")
        if written_by is not None and written_by != self.wf.name:  # another run's state: never mix them
            raise CheckpointError(f"{ckpt.path} was written by workflow '{written_by}', not '{self.wf.name}'; "
                                  "resume with the workflow (or plan) that wrote it")
        assert self.config.out_dir is not None  # (_last_checkpoint refuses a run without one)
        check_params(ckpt.meta, self.wf, self.config.allow_param_change, self.config.out_dir)
        self.in_flight = self._in_flight_of(ckpt)
        pending: tuple[str, ...] = ()
        if self.in_flight is not None:
            from .in_flight import pending_calls

            pending = tuple(pending_calls(self.in_flight, self.schedule, ckpt.iteration))
        drained = ckpt.meta.get("drained_at_stop")
        self.resumed = Resumed(ckpt.path, ckpt.iteration, rejected, pending, drained if isinstance(drained, str) else None)
        self.last_checkpoint = ckpt.path
        if self.on_resume is not None:
            self.on_resume(self.resumed)
        self._load_states(ckpt)
        return ckpt.iteration + 1

    def _in_flight_of(self, ckpt: Checkpoint) -> dict[str, Any] | None:
        """What the checkpoint kept in flight, for this run's schedule (an asynchronous plan's stop): None
        when it kept none; refused when this schedule could not continue it (a synchronous plan)."""
        if ckpt.in_flight is None:
            return None
        if self.schedule.depth == 1:
            raise CheckpointError(f"{ckpt.path} was taken by a stop of an asynchronous plan, with calls still in "
                                  "flight; resume with the plan that wrote it")
        return ckpt.in_flight

    def _first_line(self, k: int) -> int:
        """The first metrics line a run continuing at iteration k writes: the oldest line a stop's checkpoint
        kept unfinished (its deferred calls still to come), else k's."""
        lines = [line["iteration"] for line in (self.in_flight or {}).get("lines", ())]
        return min([k, *lines])

    def _open_outputs(self, start: int) -> None:
        if self.config.out_dir is not None and self.outputs is None:
            self.outputs = MetricsLog(self.config.out_dir, start, self.config.tensorboard, self.config.loggers,
                                      self.wf.name, recorded_params(self.wf))

    @property
    def workflow_sha256(self) -> str:
        if self._sha256 is None:
            self._sha256 = workflow_sha256(self.wf)
        return self._sha256

    def checkpoint(self, k: int, in_flight: dict[str, Any] | None = None,
                   drained_at_stop: str | None = None) -> Path | None:
        """Save every component's state after iteration k. `in_flight`: what an asynchronous plan stopped
        here has in flight (`in_flight.py`); `drained_at_stop`: why such a stop drained instead."""
        if self.config.out_dir is None:
            return None
        meta: dict[str, Any] = {"workflow": self.wf.name, "workflow_sha256": self.workflow_sha256,
                                "params": recorded_params(self.wf)}
        if drained_at_stop is not None:
            meta["drained_at_stop"] = drained_at_stop
        self.last_checkpoint = save_component_checkpoint(
            self.config.out_dir / "checkpoints", k, self.component_processes(), self.backend.control, meta=meta,
            in_flight=in_flight)
        return self.last_checkpoint

    def export(self) -> Path | None:
        """The last checkpoint's state into `export/` (`checkpoint.export_checkpoint`), with the manifest
        naming the workflow, its hash, the params and each component's state names."""
        if self.config.out_dir is None or self.last_checkpoint is None or not self.config.export:
            return None
        states = {c: {"states": [st.name for st in comp.state]} for c, comp in self.wf.components.items()}
        self.exported = export_checkpoint(self.last_checkpoint, self.config.out_dir / "export", {
            "workflow": self.wf.name, "workflow_file": str(self.wf.file), "workflow_sha256": self.workflow_sha256,
            "params": recorded_params(self.wf), "states": states})
        return self.exported

    # -- iterations -------------------------------------------------------------------------
    def run_iteration(self, k: int, drain: bool = False) -> IterationResult:
        """Iteration k alone; `drain`: with the deferred calls still pending after it (an asynchronous plan)."""
        t0 = time.perf_counter_ns()
        failed = True
        try:
            if self.backend.capabilities.compiled:
                self.backend.execute_iteration(k, self.config.call_timeout_s)
            else:
                self._dispatch(k, drain)
            failed = False
        except Overdue as late:
            raise self._watchdog(late) from None
        finally:
            self._collect_records(failed)
        return self._finish(k, t0, time.perf_counter_ns())

    def _dispatch(self, k: int, drain: bool = False) -> None:
        started = time.monotonic()
        self._wait(self._submit(k, drain, started), started)

    def _submit(self, k: int, drain: bool = False, started: float | None = None,
                wrap: Callable[[Callable[..., Sequence[Any]]], Callable[..., Sequence[Any]]] | None = None
                ) -> list[tuple[Any, Any]]:
        """Submit every call of iteration k (and, with `drain`, the deferred calls still pending after it).
        A loop that ends on a condition (`until:`) fetches its condition's producers after each trip, within
        the iteration's watchdog (`started`: when the iteration's wait began). `wrap`: what submits each step
        (the pipeline's, which pops a deferred call's metrics around it: `pipeline.py`)."""
        deadline = (time.monotonic() if started is None else started) + self.config.call_timeout_s

        def fetch(handle: Any) -> Any:
            try:
                return self.backend.result(handle, timeout=max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                raise Overdue("the condition of a loop that ends on one", self.config.call_timeout_s) from None

        submit: Callable[..., Sequence[Any]]
        if self._replicas == 1:  # (before a drain -- a barrier -- nothing runs ahead: `Program.unroll`)
            submit = self.backend.submit if wrap is None else wrap(self.backend.submit)
            submitted = self.schedule.steps(k, submit, fetch, ahead=not drain)
        else:  # data parallel: every call once per replica of its component, each on its own process
            submit = replicated(self.backend.submit, self.wf)
            submit = submit if wrap is None else wrap(submit)
            submitted = self.schedule.steps(k, submit, ahead=not drain)
        return submitted + self.schedule.drain(k, submit) if drain else submitted

    def _wait(self, submitted: list[tuple[Any, Any]], started: float) -> None:
        """Wait for submitted calls in program order.

        The watchdog: no call may finish later than `call_timeout_s` after the iteration started, and a
        node's `timeout_s` bounds each of its calls, counted from when the wait for it begins. That is
        never early: every call the waited one depends on -- its data producers and its component's
        previous call -- is earlier in program order, hence finished, so the waited call is running
        (or starting) by then."""
        deadline = started + self.config.call_timeout_s
        for step, handles in submitted:
            first = handles[0]
            own = step.node.timeout_s
            for handle in first.handles if isinstance(first, ReplicaSet) else (first,):
                remaining = max(0.0, deadline - time.monotonic())
                limit = own if own is not None and own < remaining else None
                try:
                    self.backend.result(handle, timeout=remaining if limit is None else limit)
                except TimeoutError:
                    raise (Overdue(step.label, self.config.call_timeout_s) if limit is None
                           else Overdue(step.label, limit, NODE_LIMIT)) from None

    def _finish(self, k: int, t0: int, t1: int, popped: Mapping[str, Callable[..., Any]] | None = None) -> IterationResult:
        """The iteration's metrics line; `popped`: each process's `pop_metrics` queued right after the
        iteration's calls (a pipelined run, `pipeline.py`), else asked now."""
        seconds = (t1 - t0) / 1e9
        metrics: dict[str, float] = {"iteration_s": seconds}
        per_process = {comp: popped[comp](None) if popped is not None else self.backend.control(comp, "pop_metrics")
                       for comp in self.component_processes()}
        merged = merge_metrics(per_process, self._work, self._metric_rules(per_process), self._bases(per_process))
        metrics.update(merged.values)
        self.metric_notes.update(merged.notes)
        steps = sum(v for n, v in metrics.items() if n.endswith("/env_steps"))
        if steps:
            metrics["env_steps_per_s"] = steps / seconds
        tokens = sum(v for n, v in metrics.items() if n.endswith("/tokens"))
        if tokens:
            metrics["tokens_per_s"] = tokens / seconds
        for node, ns in self._time_by_node(t0, t1).items():
            metrics[f"time/{node}"] = ns / 1e9
        for loop, trips in self.schedule.trips.items():  # loops that end on a condition: the trips they ran
            metrics[f"trips/{'.'.join(loop[1:])}"] = float(trips)
        if self.sampler is not None:
            act = self.sampler.mean_activity([(t0, t1)])
            if act is not None:
                metrics["sm_activity"] = act  # the mean over the sampled GPUs
            if len(self.sampler.per_gpu) > 1:
                for gpu in self.sampler.per_gpu:
                    one = self.sampler.mean_activity([(t0, t1)], gpu=gpu)
                    if one is not None:
                        metrics[f"sm_activity/gpu{gpu}"] = one
        result = IterationResult(k, seconds, metrics)
        self.results.append(result)
        self._log(result)
        return result

    def _watchdog(self, late: Overdue) -> WatchdogTimeout:
        """The watchdog fired: dump every component's stack (to stacks.txt in the run directory)."""
        self._stuck = True
        self.backend.stuck = True  # its shutdown must not wait for the stuck call
        exc = WatchdogTimeout(late.label, late.seconds, late.limit)
        stacks = self.backend.dump_stacks()
        exc.stacks = stacks
        if self.config.out_dir is not None and stacks:
            text = "\n".join(f"== {comp}\n{stack}" for comp, stack in stacks.items())
            write_atomic(self.config.out_dir / "stacks.txt", text)
        return exc

    def _collect_records(self, failed: bool = False, popped: Mapping[str, Callable[..., Any]] | None = None) -> None:
        # best effort and bounded: a stuck component (the watchdog fired) or a failed iteration (whose
        # processes, or Ray's own services, may be gone: each ask then waits its whole timeout) must not
        # hold up the report
        self._fresh = []  # this iteration's records (the trace keeps them all)
        self._work = {}  # this iteration's batch rows per process (a process that did not answer: none)
        timeout = 1.0 if self._stuck else 5.0 if failed else 120.0  # (idle components answer at once)
        for comp in self.component_processes():
            try:
                records = (popped[comp](timeout) if popped is not None
                           else self.backend.control(comp, "pop_records", timeout=timeout))
            except (CallFailed, TimeoutError):  # a dead or stuck process has no records; its failure is reported elsewhere
                continue
            self._fresh.extend(self.trace.add(r) for r in records)
            self._work[comp] = sum(self._rows.get(r.node, 1) for r in records)

    def _time_by_node(self, t0: int, t1: int) -> dict[str, int]:
        """Busy time per top-level item of the iteration (rollout, training, sync...), groups merged.
        (From this iteration's records: a scan of the whole trace every iteration grew with the run.)"""
        out: dict[str, int] = defaultdict(int)
        structural = self._structural
        for r in self._fresh:
            if r.host_start_ns >= t0 and (r.end_ns or 0) <= t1 and r.duration_ns:
                node = structural.get(r.node, r.node)
                top = NodePath.parse(node).top
                out[top] += r.duration_ns
        return dict(out)

    def _log(self, result: IterationResult) -> None:
        self._open_outputs(result.iteration)
        if self.outputs is not None:
            self.outputs.log(result.iteration, result.metrics)
        if self.on_iteration is not None:
            self.on_iteration(result)

    def run(self, start: int | None = None, stop: Callable[[], Any] | None = None) -> list[IterationResult]:
        """Iterations up to `config.iterations`: from the last checkpoint (`config.resume`), from 0, or from
        `start` with the state already in the workers (`rose optimize --train`: its processes trained
        iterations 0..start-1). `stop()` true ends the run after the iteration in progress. With a run
        directory the run keeps its work whichever way it ends but a failure: a checkpoint of its last
        complete iteration (besides every `checkpoint_every`), then the export of that state."""
        self.describe_processes()
        k = self.restore() if start is None else start
        self._open_outputs(self._first_line(k))
        if self.schedule.depth > 1:  # an asynchronous plan: iterations overlap (pipeline.py)
            try:
                self._run_pipelined(k, stop)  # (it checkpoints the last complete iteration, drained)
                self.export()
            finally:
                self.close()
            return self.results
        restarts, saved = 0, (k - 1 if self.resumed is not None else -1)
        try:
            while k < self.config.iterations and not (stop is not None and stop()):
                try:
                    self.run_iteration(k)
                except CallFailed as exc:
                    restarts += 1
                    k = self._recover(self._restartable(exc, restarts), restarts)
                    saved = k - 1  # (the checkpoint it restarted from)
                    continue
                every = self.config.checkpoint_every
                if every and (k + 1) % every == 0:
                    self.checkpoint(k)
                    saved = k
                k += 1
            if k > 0 and saved != k - 1:  # the end, or a stop: the last complete iteration is kept
                self.checkpoint(k - 1)
            self.export()
        finally:
            self.close()
        return self.results

    def _run_pipelined(self, k: int, stop: Callable[[], Any] | None) -> None:
        """An asynchronous plan's iterations from k, pipelined (`pipeline.py`); a process that dies is
        recovered as in a synchronous run: the iterations in flight are abandoned, every component goes back
        to the last checkpoint -- taken after a drain, so nothing deferred is pending there -- and the
        pipeline starts again from the iteration after it."""
        from .pipeline import run_pipelined

        restarts = 0
        while True:
            self.schedule.start_at(k)
            restored = None
            if self.in_flight is not None:  # a stop's checkpoint: continue with what it had in flight
                from .in_flight import restore

                restored = restore(self.in_flight, self.schedule, self.backend, k)
            try:
                run_pipelined(self, k, stop, restored=restored)
                return
            except CallFailed as exc:
                restarts += 1
                k = self._recover(self._restartable(exc, restarts), restarts)

    def _restartable(self, exc: CallFailed, restarts: int) -> CallFailed:
        """`exc` when a restart may recover from it (a dead process or a lost GPU context, on a backend that
        can restart, within `max_restarts`); else raise it (or say the run gave up)."""
        if not (exc.died or exc.gpu_fatal) or not self.backend.capabilities.restartable:
            raise exc
        if restarts > self.config.max_restarts:
            raise CallFailed(exc.label, exc.component, f"{exc.message}; gave up after "
                             f"{self.config.max_restarts} restart(s)", died=True) from None
        return exc

    def _recover(self, exc: CallFailed, attempt: int) -> int:
        """Restart dead component processes and put every component back at the last checkpoint, so that
        no component is ahead of the others; return the iteration to continue from."""
        try:
            ckpt, rejected = self._last_checkpoint()
        except CheckpointError as none:
            raise CallFailed(exc.label, exc.component, f"{exc.message}; no checkpoint to restart from "
                             f"(use --checkpoint-every): {none}", died=True) from None
        time.sleep(min(30.0, 0.5 * 2 ** (attempt - 1)))  # back off before starting processes again
        broken = set(self.backend.dead_components())
        if exc.gpu_fatal:  # alive but its CUDA context is gone
            broken.add(exc.component)
        restart = self.backend.fault_domain(sorted(broken), exc.gpu_fatal)
        self.backend.restart(restart)
        self._load_states(ckpt)
        self.in_flight = self._in_flight_of(ckpt)
        recovery = {"failed": str(exc), "restarted": restart, "from_checkpoint": ckpt.iteration,
                    "gpu_fatal": exc.gpu_fatal, "attempt": attempt,
                    "rejected": [f"{r.path.name}: {r.reason}" for r in rejected]}
        self.recoveries.append(recovery)
        if self.config.out_dir is not None:  # the run directory keeps a record of every recovery
            with open_new(self.config.out_dir / "recoveries.jsonl", "a") as f:
                f.write(json.dumps(recovery) + "\n")
        if self.on_recovery is not None:
            self.on_recovery(recovery)
        first = self._first_line(ckpt.iteration + 1)
        self.results = [r for r in self.results if r.iteration < first]
        if self.outputs is not None:  # the iterations after the checkpoint run again: log each once
            self.outputs.rewind(first)
        return ckpt.iteration + 1

    def node_summary(self) -> list[dict[str, Any]]:
        """Per structural node (split groups merged): invocations, mean and total duration, and the
        time-weighted mean SM activity over its invocations when a sampler ran (paper §4.3.2's D_v, a_v)."""
        by_node: dict[str, list[InvocationRecord]] = defaultdict(list)
        structural = self._structural
        for r in self.trace.records():
            if r.duration_ns:
                by_node[structural.get(r.node, r.node)].append(r)
        iterations = max(1, len(self.results))
        rows = []
        for node, recs in by_node.items():
            total = sum(r.duration_ns or 0 for r in recs)
            row: dict[str, Any] = {"node": node, "invocations": len(recs), "mean_s": total / len(recs) / 1e9,
                                   "per_iteration_s": total / iterations / 1e9}
            if self.sampler is not None:  # each invocation is charged with the activity of its process's GPU
                gpus = {self._gpu_of(r.pid) for r in recs}
                gpu = gpus.pop() if len(gpus) == 1 else None
                row["sm_activity"] = self.sampler.mean_activity([r.interval for r in recs if r.interval], gpu=gpu)
            rows.append(row)
        return sorted(rows, key=lambda r: -r["per_iteration_s"])

    def close(self) -> None:
        if self.outputs is not None:
            self.outputs.close()
        if self.config.out_dir is not None and len(self.trace):
            from .chrome_trace import write_chrome_trace

            # the small summary first: a full disk then costs the trace only (safe_io: an OutputError, exit 5)
            write_atomic(self.config.out_dir / "nodes.json", json.dumps(self.node_summary(), indent=1) + "\n")
            if not self.config.trace:
                return
            self.trace.dump_jsonl(self.config.out_dir / "trace.jsonl")
            activity = self.sampler.samples_by_gpu() if self.sampler is not None else None
            write_chrome_trace(self.config.out_dir / "trace.json", self.trace, activity,
                               metadata={"processes": self.processes}, identity=call_identity(self.wf))

