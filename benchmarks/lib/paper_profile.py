"""Figures from one `rose execute` run directory, for the paper table (issue 14).

Everything comes from the run's own outputs -- `metrics.jsonl` (per-iteration seconds and counts) and the
Chrome trace `trace.json` (every call with its loop indices, and the SM-activity counter) -- so a figure
can always be traced back to a file a person can open in Perfetto.

* throughput: the workload's count (env steps, tokens) over the seconds of complete iterations;
* SM activity: the time-weighted mean of the device-wide counter over each measured iteration's window,
  and the fraction of that time below 50% (the paper's "low-activity" share);
* shape: the interaction loop's share of the iteration (the summed spans of its instances), the policy
  call's duration;
* a lower bound for the iteration: the critical path of the workflow's invocation graph with the
  measured durations and unlimited overlap (every call starts when its producers are done), and the
  total GPU work at full activity (the integral of SM activity over the iteration: the time the GPU
  would need if its work ran at 100%).
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LOW_ACTIVITY = 0.5


@dataclass(frozen=True)
class Call:
    """One invocation from the trace (seconds on the trace's clock)."""

    node: str  # as traced: `iteration.epoch.step.act@1`
    component: str
    start: float
    end: float
    loops: tuple[tuple[str, int], ...]
    source: str = ""  # the structural node as the runtime wrote it from the plan's fields (`args.source`)

    @property
    def structural(self) -> str:
        """The node with split groups standing for their node: `iteration.epoch.step.act`. A trace recorded
        before the runtime wrote `args.source` gives it from the name (`@` suffixes dropped)."""
        return self.source or ".".join(part.split("@")[0] for part in self.node.split("."))

    @property
    def iteration(self) -> int:
        return dict(self.loops).get("iteration", -1)


@dataclass(frozen=True)
class RunData:
    metrics: list[dict[str, Any]]
    calls: list[Call]
    activity: list[list[tuple[float, float]]]  # per GPU track: (time s, activity 0..1), a step function


def load_run(run_dir: Path) -> RunData:
    """The metrics lines and the trace of a run directory (missing files give empty lists)."""
    metrics_path, trace_path = run_dir / "metrics.jsonl", run_dir / "trace.json"
    metrics = [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()] \
        if metrics_path.exists() else []
    calls: list[Call] = []
    tracks: dict[int, list[tuple[float, float]]] = defaultdict(list)
    if trace_path.exists():
        doc = json.loads(trace_path.read_text())
        for e in doc["traceEvents"] if isinstance(doc, dict) else doc:
            if e.get("ph") == "X":
                args = e.get("args", {})
                loops = tuple((k, int(v)) for k, v in (args.get("loops") or {}).items())
                calls.append(Call(e["name"], e.get("cat", ""), e["ts"] / 1e6, (e["ts"] + e["dur"]) / 1e6, loops,
                                  args.get("source", "")))
            elif e.get("ph") == "C":
                tracks[e["pid"]].append((e["ts"] / 1e6, float(next(iter(e["args"].values()))) / 100.0))
    return RunData(metrics, calls, [sorted(v) for _, v in sorted(tracks.items())])


def iteration_window(run: RunData, k: int) -> tuple[float, float] | None:
    """[first call start, last call end] of RL iteration k on the trace's clock."""
    calls = [c for c in run.calls if c.iteration == k]
    return (min(c.start for c in calls), max(c.end for c in calls)) if calls else None


def activity_over(track: list[tuple[float, float]], t0: float, t1: float) -> tuple[float, float, float]:
    """(integral of activity in seconds, covered seconds, seconds below LOW_ACTIVITY) over [t0, t1]."""
    integral = covered = below = 0.0
    for (ta, va), (tb, _) in zip(track, track[1:], strict=False):
        lo, hi = max(ta, t0), min(tb, t1)
        if hi > lo:
            integral += va * (hi - lo)
            covered += hi - lo
            below += (hi - lo) if va < LOW_ACTIVITY else 0.0
    return integral, covered, below


def _work(metrics: dict[str, Any], metric: str) -> float:
    return sum(float(v) for k, v in metrics.items() if k.endswith("/" + metric) and v is not None)


def run_figures(run: RunData, warmup: int, work_metric: str, loop: tuple[str, ...] | None, policy_node: str
                ) -> dict[str, Any]:
    """Per measured iteration (index >= warmup): seconds, work, SM activity; the run's throughput and shape."""
    rows = [m for m in run.metrics if int(m["iteration"]) >= warmup]
    seconds = [float(m["iteration_s"]) for m in rows]
    work = [_work(m, work_metric) for m in rows]
    out: dict[str, Any] = {"iterations": [int(m["iteration"]) for m in rows], "iteration_s": seconds, "work": work,
                           "throughput": sum(work) / sum(seconds) if seconds and sum(seconds) > 0 else None}
    integral = covered = below = window_s = 0.0
    loop_share = []
    gpu_work = []
    for m in rows:
        k = int(m["iteration"])
        window = iteration_window(run, k)
        if window is None:
            continue
        t0, t1 = window
        window_s += t1 - t0
        per_gpu = [activity_over(track, t0, t1) for track in run.activity]
        if per_gpu:
            i = statistics.mean(p[0] for p in per_gpu)
            integral, covered, below = integral + i, covered + statistics.mean(p[1] for p in per_gpu), \
                below + statistics.mean(p[2] for p in per_gpu)
            gpu_work.append(i)
        if loop:
            loop_share.append(_loop_span(run, k, loop) / (t1 - t0) if t1 > t0 else None)
    out["sm_activity"] = integral / covered if covered else None
    out["frac_below_50"] = below / covered if covered else None
    out["gpu_work_s"] = gpu_work
    out["loop_share"] = loop_share
    policy = [c.end - c.start for c in run.calls if c.iteration >= warmup
              and c.structural.split(".")[-1] == policy_node]
    out["policy_call_s"] = statistics.median(policy) if policy else None
    return out


def _loop_span(run: RunData, k: int, loop: tuple[str, ...]) -> float:
    """Wall time RL iteration k spends in instances of `loop` (e.g. every epoch's step loop): the span of
    each instance's calls (keyed by the indices of the loops enclosing it), summed."""
    prefix = ".".join(loop) + "."
    spans: dict[tuple[int, ...], list[float]] = {}
    depth = len(loop) - 1  # indices of the loops enclosing the instance (the RL iteration included)
    for c in run.calls:
        if c.iteration == k and c.structural.startswith(prefix):
            key = tuple(v for _, v in c.loops[:depth])
            lo_hi = spans.setdefault(key, [c.start, c.end])
            lo_hi[0], lo_hi[1] = min(lo_hi[0], c.start), max(lo_hi[1], c.end)
    return sum(hi - lo for lo, hi in spans.values())


def critical_path(run: RunData, workflow: Path, overrides: dict[str, Any], warmup: int) -> dict[str, Any] | None:
    """The longest dependency chain of one RL iteration with the run's median duration of each invocation
    and unlimited overlap (a call starts as soon as every producer it depends on is done): the optimizer's
    own computation (`rose_dsl.optimizer.bound.critical_path`) on this run's trace."""
    from rose_dsl import load_workflow
    from rose_dsl.optimizer.bound import critical_path as chain_of

    durations: dict[tuple[str, tuple[int, ...]], list[float]] = defaultdict(list)
    for c in run.calls:
        if c.iteration >= warmup:
            durations[(c.node, tuple(v for _, v in c.loops[1:]))].append(c.end - c.start)
    found = chain_of(load_workflow(workflow, overrides), durations)
    if found is None:
        return None
    path = found["chain"]
    return {"seconds": found["seconds"], "invocations": found["invocations"],
            "unmatched": found["invocations"] - found["matched"],
            "path": path[:40] + (["..."] if len(path) > 40 else [])}
