"""Export an ExecutionTrace and SM-activity samples as Chrome/Perfetto trace-event JSON.

Why this format: ``trace.json`` opens in ui.perfetto.dev and chrome://tracing with no rose code, and a
person can see at once where the GPU idles while which component runs (paper Fig. 12).

Mapping:

* one *process* track per component process (``pid`` = the worker's OS pid), named by its components;
* inside it, one *thread* lane per component, plus extra lanes when invocations overlap without
  nesting (split groups running concurrently): the trace-event format needs events on one thread to
  nest properly, so overlapping ones go to the next lane where they do;
* ``"X"`` complete events named by node path, lasting host start -> max(host end, device end), with
  loop indices, split group, state accesses, input/output refs in ``args``, and -- given the plan's
  ``identity`` (``rose_dsl.measurement.call_identity``) -- the call's structural node and base component
  (``source``, ``base``), so that a reader of the trace never parses them out of names;
* a counter track (``"C"`` events) per GPU for SM activity in percent, on a synthetic pid;
* ``"M"`` metadata events naming processes and threads.

Timestamps are microseconds (floats) relative to a common origin: the earliest record or sample.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from interpreter.gpu_activity import ActivitySample
from interpreter.trace import ExecutionTrace, InvocationRecord

__all__ = ["GPU_PID_BASE", "read_chrome_trace", "to_chrome_trace", "validate_trace_events",
           "write_chrome_trace"]

GPU_PID_BASE = 1 << 30  # synthetic pids for GPU counter tracks, far above real pids
_PHASES_NEED_DUR = {"X"}


def _us(t_ns: int, origin_ns: int) -> float:
    return (t_ns - origin_ns) / 1000.0


def _assign_lanes(records: Sequence[InvocationRecord]) -> dict[int, int]:
    """call_id -> lane index so that events in one lane are disjoint or properly nested."""
    lanes: list[list[int]] = []  # per lane, a stack of end times of open events
    out: dict[int, int] = {}
    for r in sorted(records, key=lambda r: (r.host_start_ns, -(r.end_ns or 0), r.call_id)):
        start, end = r.host_start_ns, r.end_ns or r.host_start_ns
        for i, stack in enumerate(lanes):
            while stack and stack[-1] <= start:
                stack.pop()
            if not stack or end <= stack[-1]:
                stack.append(end)
                out[r.call_id] = i
                break
        else:
            lanes.append([end])
            out[r.call_id] = len(lanes) - 1
    return out


def _args(r: InvocationRecord, identity: Mapping[str, tuple[str, str]]) -> dict[str, Any]:
    a: dict[str, Any] = {"call_id": r.call_id, "component": r.component}
    if r.node in identity:
        a["source"], a["base"] = identity[r.node]
    if r.parent is not None:
        a["parent"] = r.parent
    if r.loop_indices:
        a["loops"] = {name: idx for name, idx in r.loop_indices}
    if r.group is not None:
        a["group"] = r.group
    if r.state:
        a["state"] = {obj: mode for obj, mode in r.state}
    if r.inputs:
        a["inputs"] = list(r.inputs)
    if r.outputs:
        a["outputs"] = list(r.outputs)
    if r.gpu is not None:
        a["gpu"] = r.gpu
    if r.host_end_ns is not None:
        a["host_dur_us"] = (r.host_end_ns - r.host_start_ns) / 1000.0
    if r.device_start_ns is not None and r.device_end_ns is not None:
        a["device_dur_us"] = (r.device_end_ns - r.device_start_ns) / 1000.0
    if r.status != "ok":
        a["status"] = r.status
    if r.error:
        a["error"] = r.error
    return a


def to_chrome_trace(trace: ExecutionTrace | Iterable[InvocationRecord],
                    activity: Mapping[int, Sequence[ActivitySample]] | None = None,
                    *, origin_ns: int | None = None, metadata: dict[str, Any] | None = None,
                    identity: Mapping[str, tuple[str, str]] | None = None) -> dict[str, Any]:
    """Build the trace-event document (a dict; ``json.dump`` it or use :func:`write_chrome_trace`).

    ``activity`` maps GPU index -> its samples; ``identity`` each call node -> (structural node, base
    component), from the plan's fields.  Invocations still running are left out and counted in
    ``otherData.incomplete``.
    """
    records = trace.records() if isinstance(trace, ExecutionTrace) else list(trace)
    done = [r for r in records if r.end_ns is not None]
    activity = {g: list(s) for g, s in (activity or {}).items()}
    if origin_ns is None:
        starts = [r.host_start_ns for r in done] + [s[0].t_start_ns for s in activity.values() if s]
        origin_ns = min(starts) if starts else 0

    events: list[dict[str, Any]] = []
    by_pid: dict[int, list[InvocationRecord]] = {}
    for r in done:
        by_pid.setdefault(r.pid if r.pid is not None else 0, []).append(r)
    processes = (metadata or {}).get("processes", {})  # pid -> what the process saw (SMs under its MPS quota)
    for pid, recs in sorted(by_pid.items()):
        comps = list(dict.fromkeys(r.component for r in recs))
        seen = processes.get(pid) or processes.get(str(pid)) or {}
        extra = f", {seen['sm_count']} SMs" if seen.get("sm_count") else ""
        extra += f", MPS {seen['mps_quota']}%" if seen.get("mps_quota") else ""
        extra += ", MPS priority below normal" if str(seen.get("mps_priority") or "0") != "0" else ""
        events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                       "args": {"name": f"{', '.join(comps)} (pid {pid}{extra})"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
                       "args": {"sort_index": min(r.host_start_ns for r in recs) - origin_ns}})
        tid_base = 1
        for comp in comps:
            crecs = [r for r in recs if r.component == comp]
            lanes = _assign_lanes(crecs)
            for lane in range(max(lanes.values()) + 1):
                events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid_base + lane,
                               "args": {"name": comp if lane == 0 else f"{comp} #{lane + 1}"}})
            for r in crecs:
                events.append({
                    "ph": "X", "name": r.node, "cat": comp, "pid": pid, "tid": tid_base + lanes[r.call_id],
                    "ts": _us(r.host_start_ns, origin_ns), "dur": r.duration_ns / 1000.0,  # type: ignore[operator]
                    "args": _args(r, identity or {}),
                })
            tid_base += max(lanes.values()) + 1

    for gpu, samples in sorted(activity.items()):
        pid = GPU_PID_BASE + gpu
        events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                       "args": {"name": f"GPU {gpu} SM activity"}})
        prev_end = None
        for s in samples:
            if prev_end is not None and s.t_start_ns > prev_end:  # a gap: show "no data" as a drop
                events.append({"ph": "C", "name": "SM activity %", "pid": pid, "tid": 0,
                               "ts": _us(prev_end, origin_ns), "args": {"sm": 0.0}})
            events.append({"ph": "C", "name": "SM activity %", "pid": pid, "tid": 0,
                           "ts": _us(s.t_start_ns, origin_ns), "args": {"sm": round(100.0 * s.value, 3)}})
            prev_end = s.t_end_ns
        if prev_end is not None:
            events.append({"ph": "C", "name": "SM activity %", "pid": pid, "tid": 0,
                           "ts": _us(prev_end, origin_ns), "args": {"sm": 0.0}})

    other = {"origin_ns": origin_ns, "clock": "perf_counter_ns", "incomplete": len(records) - len(done)}
    other.update(metadata or {})
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": other}


def write_chrome_trace(path: str | os.PathLike[str], trace: ExecutionTrace | Iterable[InvocationRecord],
                       activity: Mapping[int, Sequence[ActivitySample]] | None = None,
                       **kwargs: Any) -> Path:
    """Write ``trace.json`` (temp file + rename, so a viewer never sees half a file)."""
    path = Path(path)
    doc = to_chrome_trace(trace, activity, **kwargs)
    from interpreter.safe_io import write_atomic

    return write_atomic(path, json.dumps(doc, separators=(",", ":")))  # (never through a link, no temp left)


def read_chrome_trace(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Load a trace document and check it (raises ``ValueError`` listing the problems)."""
    doc = json.loads(Path(path).read_text())
    problems = validate_trace_events(doc)
    if problems:
        raise ValueError(f"{path}: not a valid trace-event file: " + "; ".join(problems[:5]))
    return doc


def validate_trace_events(doc: Any) -> list[str]:
    """Problems with a trace-event document (empty list: well-formed).

    Checks the JSON-object form: ``traceEvents`` a list of objects each with a known ``ph``, a string
    ``name``, integer ``pid``/``tid``, numeric ``ts`` (except metadata), ``dur >= 0`` on ``X``, numeric
    counter ``args`` on ``C``, and proper nesting of ``X`` events sharing a thread.
    """
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        return ["top level must be an object with a traceEvents list"]
    problems: list[str] = []
    per_thread: dict[tuple[int, int], list[tuple[float, float, str]]] = {}
    for i, e in enumerate(doc["traceEvents"]):
        where = f"event {i}"
        if not isinstance(e, dict):
            problems.append(f"{where}: not an object")
            continue
        ph = e.get("ph")
        if ph not in ("X", "C", "M", "B", "E", "i", "I"):
            problems.append(f"{where}: unknown ph {ph!r}")
            continue
        if not isinstance(e.get("name"), str):
            problems.append(f"{where}: name must be a string")
        for k in ("pid", "tid"):
            if not isinstance(e.get(k), int) or isinstance(e.get(k), bool):
                problems.append(f"{where}: {k} must be an integer")
        if ph != "M" and not isinstance(e.get("ts"), int | float):
            problems.append(f"{where}: ts must be a number")
        if ph in _PHASES_NEED_DUR:
            dur = e.get("dur")
            if not isinstance(dur, int | float) or dur < 0:
                problems.append(f"{where}: X event needs dur >= 0")
            elif isinstance(e.get("ts"), int | float):
                per_thread.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + dur, e["name"]))
        if ph == "C":
            args = e.get("args")
            if not isinstance(args, dict) or not args or not all(
                    isinstance(v, int | float) for v in args.values()):
                problems.append(f"{where}: C event needs numeric args")
        if ph == "M" and not isinstance(e.get("args"), dict):
            problems.append(f"{where}: M event needs args")
    eps = 1e-3  # µs: float rounding of ns timestamps
    for (pid, tid), spans in per_thread.items():
        stack: list[tuple[float, float, str]] = []
        for s, t, name in sorted(spans, key=lambda x: (x[0], -x[1])):
            while stack and stack[-1][1] <= s + eps:
                stack.pop()
            if stack and t > stack[-1][1] + eps:
                problems.append(f"pid {pid} tid {tid}: {name!r} overlaps {stack[-1][2]!r} without nesting")
            stack.append((s, t, name))
    return problems
