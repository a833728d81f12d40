"""`rose execute`: RL iterations on a backend, with metrics, traces, checkpoints and resume.

Per iteration: submit every call in program order (the backend returns handles at once), wait for
them in program order (so the first failure reported is the root cause, not a consumer of it),
collect the workers' invocation records and metrics, write a metrics line, and checkpoint every N
iterations. Everything is flushed on every exit path.
"""

from __future__ import annotations

import json
import math
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rose_dsl.ir import Workflow

from .backends import Backend, CallFailed, WatchdogTimeout
from .checkpoint import CheckpointError, latest_complete, load_checkpoint, save_checkpoint
from .schedule import ReplicaSet, Schedule, replicated
from .trace import ExecutionTrace, InvocationRecord

__all__ = ["RunConfig", "Runner", "IterationResult"]


@dataclass
class RunConfig:
    iterations: int
    out_dir: Path | None = None
    checkpoint_every: int = 0
    resume: bool = False
    call_timeout_s: float = 900.0
    tensorboard: bool = True
    max_restarts: int = 2  # a component process that dies is restarted this often, then the run stops


@dataclass
class IterationResult:
    iteration: int
    seconds: float
    metrics: dict[str, float] = field(default_factory=dict)


def _structural(wf: Workflow) -> dict[str, str]:
    """`iteration.epoch@1.step.act@0` -> `iteration.epoch.step.act`: a split group is its node."""
    from rose_dsl.transforms import source_paths

    return {".".join(p): ".".join(s) for p, s in source_paths(wf).items()}



def _as_gpu_activity(sampler: Any) -> Any:
    """One `ActivitySampler` (one GPU) or a `GpuActivity` (several): always a `GpuActivity`."""
    from .gpu_activity import ActivitySampler, GpuActivity

    if isinstance(sampler, ActivitySampler):
        return GpuActivity({sampler.gpu_index: sampler})
    return sampler


# metrics that add up over data-parallel replicas (the rest are averaged)
ADDITIVE_METRICS = ("env_steps", "tokens", "episodes", "env_faults", "errors", "retries")


def merge_replica_metrics(per_process: dict[str, dict[str, float]]) -> dict[str, float]:
    """`{process: {metric: value}}` -> `{"component/metric": value}`, replicas (`name#r`) folded into
    their component: counts summed, everything else the mean over the replicas that reported it."""
    values: dict[str, list[float]] = {}
    for process, metrics in per_process.items():
        comp = process.partition("#")[0]
        for name, value in metrics.items():
            values.setdefault(f"{comp}/{name}", []).append(float(value))
    return {key: sum(vs) if key.rsplit("/", 1)[-1].endswith(ADDITIVE_METRICS) else sum(vs) / len(vs)
            for key, vs in values.items()}


class Runner:
    def __init__(self, wf: Workflow, backend: Backend, config: RunConfig, schedule: Schedule | None = None,
                 on_iteration: Callable[[IterationResult], None] | None = None, sampler: Any = None) -> None:
        self.wf = wf
        self.backend = backend
        self.config = config
        self.schedule = schedule or Schedule(wf)
        self.on_iteration = on_iteration
        self.sampler = _as_gpu_activity(sampler)
        self.trace = ExecutionTrace(meta={"workflow": wf.name})
        self.results: list[IterationResult] = []
        self.recoveries: list[dict[str, Any]] = []
        self.on_recovery: Callable[[dict[str, Any]], None] | None = None  # told of each restart
        self._stuck = False  # the watchdog fired: components may not answer
        self.processes: dict[int, dict[str, Any]] = {}  # pid -> the process's own view (SM count, quota)
        self._metrics_file = None
        self._tb = None
        out = config.out_dir
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            self._metrics_file = (out / "metrics.jsonl").open("a")
            if config.tensorboard:
                try:
                    from torch.utils.tensorboard import SummaryWriter

                    self._tb = SummaryWriter(str(out / "tb"))
                except Exception:  # noqa: BLE001 - TensorBoard is optional output
                    self._tb = None

    # -- resume -----------------------------------------------------------------------------
    def describe_processes(self) -> None:
        """Ask every component process what it sees (pid, SMs under its MPS quota) for the trace."""
        for comp in self.backend.components():
            try:
                info = self.backend.control(comp, "info", timeout=60)
            except Exception:  # noqa: BLE001 - descriptive only
                continue
            self.processes[info["pid"]] = info

    def _gpu_of(self, pid: int | None) -> int | None:
        """The NVML index of the GPU a component process runs on, when one GPU is visible to it and
        sampled (several GPUs); None: charge the mean over the sampled GPUs."""
        if self.sampler is None or len(self.sampler.per_gpu) < 2:
            return None
        visible = str((self.processes.get(pid) or {}).get("visible_gpus") or "")
        first = visible.split(",")[0].strip()
        return int(first) if first.isdigit() and "," not in visible and int(first) in self.sampler.per_gpu else None

    def restore(self) -> int:
        """Load the latest complete checkpoint into the workers; return the first iteration to run."""
        if not self.config.resume:
            return 0
        if self.config.out_dir is None:
            raise CheckpointError("--resume needs --out (the run directory holding checkpoints)")
        ckpt_dir = self.config.out_dir / "checkpoints"
        path = latest_complete(ckpt_dir, verify=True)
        if path is None:
            raise CheckpointError(f"no complete checkpoint under {ckpt_dir} to resume from")
        ckpt = load_checkpoint(path)
        for comp, states in ckpt.states.items():
            if comp in self.backend.components() and states:
                self.backend.control(comp, "set_states", states)
        return ckpt.iteration + 1

    def checkpoint(self, k: int) -> Path | None:
        if self.config.out_dir is None:
            return None
        states = {c: self.backend.control(c, "get_states") for c in self.backend.components()}
        return save_checkpoint(self.config.out_dir / "checkpoints", k, states,
                               meta={"workflow": self.wf.name, "params": {p: v for p, v in self.wf.params.items()
                                                                         if isinstance(v, int | float | str | bool)}})

    # -- iterations -------------------------------------------------------------------------
    def run_iteration(self, k: int) -> IterationResult:
        t0 = time.perf_counter_ns()
        if hasattr(self.backend, "execute_iteration"):
            try:
                try:
                    self.backend.execute_iteration(k, self.config.call_timeout_s)
                except TimeoutError:
                    raise self._watchdog(f"iteration {k}") from None
            finally:
                self._collect_records()
            return self._finish(k, t0, time.perf_counter_ns())
        replicas = getattr(self.backend, "replicas", 1)
        if replicas == 1:
            submitted = self.schedule.steps(k, self.backend.submit)
        else:  # data parallel: every call once per replica of its component, each on its own process
            submitted = self.schedule.steps(k, replicated(lambda step, r: self.backend.submit(step, replica=r), self.wf))
        deadline = time.monotonic() + self.config.call_timeout_s
        try:
            for step, handles in submitted:
                first = handles[0]
                for handle in first.handles if isinstance(first, ReplicaSet) else (first,):
                    remaining = max(0.0, deadline - time.monotonic())
                    try:
                        self.backend.result(handle, timeout=remaining)
                    except TimeoutError:
                        raise self._watchdog(step.label) from None
        finally:
            self._collect_records()
        return self._finish(k, t0, time.perf_counter_ns())

    def _finish(self, k: int, t0: int, t1: int) -> IterationResult:
        seconds = (t1 - t0) / 1e9
        metrics: dict[str, float] = {"iteration_s": seconds}
        per_process = {comp: self.backend.control(comp, "pop_metrics") for comp in self.backend.components()}
        metrics.update(merge_replica_metrics(per_process))
        steps = sum(v for n, v in metrics.items() if n.endswith("/env_steps"))
        if steps:
            metrics["env_steps_per_s"] = steps / seconds
        tokens = sum(v for n, v in metrics.items() if n.endswith("/tokens"))
        if tokens:
            metrics["tokens_per_s"] = tokens / seconds
        for node, ns in self._time_by_node(t0, t1).items():
            metrics[f"time/{node}"] = ns / 1e9
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

    def _watchdog(self, label: str) -> WatchdogTimeout:
        """The watchdog fired: dump every component's stack (to stacks.txt in the run directory)."""
        self._stuck = True
        exc = WatchdogTimeout(label, self.config.call_timeout_s)
        dump = getattr(self.backend, "dump_stacks", None)
        stacks = dump() if callable(dump) else {}
        exc.stacks = stacks  # type: ignore[attr-defined]
        if self.config.out_dir is not None and stacks:
            text = "\n".join(f"== {comp}\n{stack}" for comp, stack in stacks.items())
            (self.config.out_dir / "stacks.txt").write_text(text)
        return exc

    def _collect_records(self) -> None:
        # best effort and bounded: a stuck component (the watchdog fired) must not hold up the report
        timeout = 5.0 if self._stuck else 120.0
        for comp in self.backend.components():
            try:
                records = self.backend.control(comp, "pop_records", timeout=timeout)
            except Exception:  # noqa: BLE001 - a dead or stuck process has no records; the failure is reported elsewhere
                continue
            for r in records:
                end = max(r["host_end_ns"], r["device_end_ns"] or 0)
                self.trace.append(InvocationRecord(
                    call_id=self.trace.new_call_id(), node=r["node"], component=r["component"],
                    host_start_ns=r["host_start_ns"], host_end_ns=r["host_end_ns"],
                    device_start_ns=r["host_start_ns"] if r["device_end_ns"] else None,
                    device_end_ns=end if r["device_end_ns"] else None,
                    loop_indices=tuple(tuple(x) for x in r["loop_indices"]), group=r["group"],
                    state=tuple(tuple(x) for x in r["state"]), pid=r["pid"], gpu=r["gpu"], status=r["status"],
                    error=r["error"]))

    def _time_by_node(self, t0: int, t1: int) -> dict[str, int]:
        """Busy time per top-level item of the iteration (rollout, training, sync...), groups merged."""
        out: dict[str, int] = defaultdict(int)
        structural = _structural(self.wf)
        for r in self.trace.records():
            if r.host_start_ns >= t0 and (r.end_ns or 0) <= t1 and r.duration_ns:
                node = structural.get(r.node, r.node)
                top = node.split(".")[1] if "." in node else node
                out[top] += r.duration_ns
        return dict(out)

    def _log(self, result: IterationResult) -> None:
        line = {"iteration": result.iteration, **{k: (None if isinstance(v, float) and math.isnan(v) else v)
                                                    for k, v in result.metrics.items()}}
        if self._metrics_file is not None:
            self._metrics_file.write(json.dumps(line) + "\n")
            self._metrics_file.flush()
        if self._tb is not None:
            for name, value in result.metrics.items():
                self._tb.add_scalar(name, value, result.iteration)
        if self.on_iteration is not None:
            self.on_iteration(result)

    def run(self) -> list[IterationResult]:
        self.describe_processes()
        k = self.restore()
        restarts = 0
        try:
            while k < self.config.iterations:
                try:
                    self.run_iteration(k)
                except CallFailed as exc:
                    if not (exc.died or exc.gpu_fatal) or not hasattr(self.backend, "restart"):
                        raise
                    restarts += 1
                    if restarts > self.config.max_restarts:
                        raise CallFailed(exc.label, exc.component, f"{exc.message}; gave up after "
                                         f"{self.config.max_restarts} restart(s)", died=True) from None
                    k = self._recover(exc, restarts)
                    continue
                every = self.config.checkpoint_every
                if every and ((k + 1) % every == 0 or k + 1 == self.config.iterations):
                    self.checkpoint(k)
                k += 1
        finally:
            self.close()
        return self.results

    def _recover(self, exc: CallFailed, attempt: int) -> int:
        """Restart dead component processes and put every component back at the last checkpoint, so that
        no component is ahead of the others; return the iteration to continue from."""
        ckpt_dir = self.config.out_dir / "checkpoints" if self.config.out_dir else None
        path = latest_complete(ckpt_dir, verify=True) if ckpt_dir else None
        if path is None:
            raise CallFailed(exc.label, exc.component, f"{exc.message}; no checkpoint to restart from "
                             "(use --checkpoint-every)", died=True) from None
        time.sleep(min(30.0, 0.5 * 2 ** (attempt - 1)))  # back off before starting processes again
        broken = set(self.backend.dead_components())
        if exc.gpu_fatal:  # alive but its CUDA context is gone
            broken.add(exc.component)
        domain = getattr(self.backend, "fault_domain", None)
        restart = domain(sorted(broken), exc.gpu_fatal) if callable(domain) else sorted(broken)
        self.backend.restart(restart)
        ckpt = load_checkpoint(path)
        for comp, states in ckpt.states.items():
            if comp in self.backend.components() and states:
                self.backend.control(comp, "set_states", states)
        recovery = {"failed": str(exc), "restarted": restart, "from_checkpoint": ckpt.iteration,
                    "gpu_fatal": exc.gpu_fatal, "attempt": attempt}
        self.recoveries.append(recovery)
        if self.config.out_dir is not None:  # the run directory keeps a record of every recovery
            with (self.config.out_dir / "recoveries.jsonl").open("a") as f:
                f.write(json.dumps(recovery) + "\n")
        if self.on_recovery is not None:
            self.on_recovery(recovery)
        self.results = [r for r in self.results if r.iteration <= ckpt.iteration]
        return ckpt.iteration + 1

    def node_summary(self) -> list[dict[str, Any]]:
        """Per structural node (split groups merged): invocations, mean and total duration, and the
        time-weighted mean SM activity over its invocations when a sampler ran (paper §4.3.2's D_v, a_v)."""
        by_node: dict[str, list[InvocationRecord]] = defaultdict(list)
        structural = _structural(self.wf)
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
        if self._metrics_file is not None:
            self._metrics_file.flush()
            self._metrics_file.close()
            self._metrics_file = None
        if self._tb is not None:
            self._tb.flush()
            self._tb.close()
            self._tb = None
        if self.config.out_dir is not None and len(self.trace):
            from .chrome_trace import write_chrome_trace

            self.trace.dump_jsonl(self.config.out_dir / "trace.jsonl")
            activity = self.sampler.samples_by_gpu() if self.sampler is not None else None
            write_chrome_trace(self.config.out_dir / "trace.json", self.trace, activity,
                               metadata={"processes": self.processes})
            (self.config.out_dir / "nodes.json").write_text(json.dumps(self.node_summary(), indent=1) + "\n")

