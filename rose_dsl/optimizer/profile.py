"""What the optimizer knows about a run: invocation records reduced to plain values, and per-node
statistics (paper §4.3.2: D_v, the mean invocation time T(v), the time-weighted activity a_v).

Why a form of its own: the search is pure (no runtime import), is unit-tested on profiles recorded on
other machines (JSON files), and must not care whether a record came from a thread, a Ray actor or a
GPU. The runtime turns its invocation records into `Call`s, with each call's
activity already averaged over the call's own window: device-wide SM activity on a GPU, the busy
fraction of the call's component on the CPU.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from itertools import pairwise
from math import comb
from pathlib import Path
from typing import Any

from ..measurement import Call, IterationRun, component_bases, item_sources, legacy_identity

__all__ = ["Call", "IterationRun", "Profile", "NodeStats", "TripStats", "node_stats", "process_bases", "trip_stats",
           "item_sources", "component_bases"]


def process_bases(runs: Iterable[IterationRun]) -> dict[str, str]:
    """Each process seen in `runs` -> its base component, as its calls carry it (`Call.base`, from the plan's
    fields): for the search's per-process tables (the quota model's GPU map names processes only)."""
    return {c.component: c.base for run in runs for c in run.calls}


@dataclass(frozen=True)
class NodeStats:
    """Per structural node over the profiled iterations (paper §4.3.2)."""

    node: str
    component: str
    total_s: float  # D_v: invocation time per iteration
    mean_s: float  # T(v): mean invocation time
    calls_per_iteration: float
    activity: float | None  # a_v: time-weighted mean activity over the invocation windows
    rows: tuple[int, ...] = ()  # the row counts seen


@dataclass(frozen=True)
class Profile:
    """Complete iterations of one plan, as the ranking sees them."""

    runs: tuple[IterationRun, ...]
    activity_kind: str = "none"  # "sm" (GPU), "cpu" (busy fraction) or "none"
    description: str = ""

    @property
    def iteration_s(self) -> float:
        """T_iter: the median iteration time."""
        return statistics.median(r.seconds for r in self.runs) if self.runs else 0.0

    @property
    def calls(self) -> list[Call]:
        return [c for r in self.runs for c in r.calls]

    def to_json(self) -> dict[str, Any]:
        return {"activity_kind": self.activity_kind, "description": self.description,
                "runs": [{**{k: v for k, v in asdict(r).items() if k != "calls"},
                          "calls": [asdict(c) for c in r.calls]} for r in self.runs]}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Profile:
        runs = []
        for r in doc["runs"]:
            calls = tuple(_call_from_json(c) for c in r["calls"])
            runs.append(IterationRun(r["seconds"], calls, r.get("start_ns", 0), r.get("end_ns", 0),
                                     r.get("iteration", -1), dict(r.get("metrics") or {}),
                                     tuple(tuple(s) for s in r.get("activity_samples", ()))))
        return cls(tuple(runs), doc.get("activity_kind", "none"), doc.get("description", ""))

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_json()) + "\n")

    @classmethod
    def load(cls, path: Path) -> Profile:
        return cls.from_json(json.loads(Path(path).read_text()))


def _call_from_json(c: dict[str, Any]) -> Call:
    """A call as `Profile.to_json` wrote it; one written before `Call.source`/`Call.base` existed reads
    them from its names (`legacy_identity`)."""
    if "source" not in c:
        c = dict(zip(("source", "base"), legacy_identity(c["node"], c["component"]), strict=True)) | c
    return Call(**{**c, "indices": tuple(c["indices"])})


def node_stats(runs: Sequence[IterationRun] | Profile) -> dict[str, NodeStats]:
    """D_v, T(v) and a_v per structural node, over the given complete iterations."""
    runs = runs.runs if isinstance(runs, Profile) else runs
    by_node: dict[str, list[Call]] = defaultdict(list)
    for run in runs:
        for c in run.calls:
            by_node[c.source].append(c)
    n = max(1, len(runs))
    out: dict[str, NodeStats] = {}
    for node, calls in by_node.items():
        total = sum(c.seconds for c in calls)
        weighted = [(c.activity, c.seconds) for c in calls if c.activity is not None]
        weight = sum(s for _, s in weighted)
        activity = sum(a * s for a, s in weighted) / weight if weight > 0 else None
        comps = sorted({c.base for c in calls})
        out[node] = NodeStats(node=node, component="+".join(comps), total_s=total / n, mean_s=total / len(calls),
                              calls_per_iteration=len(calls) / n, activity=activity,
                              rows=tuple(sorted({c.rows for c in calls if c.rows is not None})))
    return out


def busy_by_component(calls: Iterable[Call]) -> dict[str, float]:
    """Seconds each component process spent in calls (a per-component busy summary for the report)."""
    out: dict[str, float] = defaultdict(float)
    for c in calls:
        out[c.component] += c.seconds
    return dict(out)


def runs_from_chrome_trace(doc: dict[str, Any] | list[dict[str, Any]]) -> tuple[list[IterationRun], dict[str, int | None]]:
    """A recorded `trace.json` (Chrome/Perfetto, as `rose execute` writes it) as iteration runs, and the
    GPU of each component process seen in it (None: a CPU process) -- to test the search on traces
    recorded on other machines."""
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    by_iteration: dict[int, list[Call]] = defaultdict(list)
    gpu_of: dict[str, int | None] = {}
    counters: list[tuple[int, float]] = []  # SM activity: a step function (percent, kept as a fraction)
    for e in events:
        if e.get("ph") == "C" and "SM activity" in str(e.get("name", "")):
            values = [v for v in (e.get("args") or {}).values() if isinstance(v, (int, float))]
            if values:
                counters.append((int(round(e["ts"] * 1000)), float(values[0]) / 100.0))
            continue
        if e.get("ph") != "X":
            continue
        args = e.get("args", {})
        loops = args.get("loops") or {}
        comp = args.get("component", e.get("cat", "?"))
        k = int(loops.get("iteration", 0))
        start = int(round(e["ts"] * 1000))
        # `source`/`base`: the runtime writes them from the plan's fields; a trace recorded before it did
        # reads them from the names (`legacy_identity`)
        source, base = legacy_identity(e["name"], comp) if "source" not in args else (args["source"], args["base"])
        call = Call(e["name"], comp, k, tuple(int(v) for v in loops.values()), start, start + int(round(e["dur"] * 1000)),
                    source=source, base=base)
        by_iteration[k].append(call)
        if args.get("gpu") is not None:
            gpu_of[comp] = int(args["gpu"])
        else:
            gpu_of.setdefault(comp, None)
    counters.sort()
    runs = []
    for k in sorted(by_iteration):
        calls = tuple(sorted(by_iteration[k], key=lambda c: c.start_ns))
        t0, t1 = calls[0].start_ns, max(c.end_ns for c in calls)
        samples = tuple((max(a, t0), min(b, t1), v) for (a, v), (b, _) in pairwise(counters)
                        if min(b, t1) > max(a, t0))
        runs.append(IterationRun((t1 - t0) / 1e9, calls, t0, t1, k, activity_samples=samples))
    return runs, gpu_of


@dataclass(frozen=True)
class TripStats:
    """What was measured of a loop that ends on a condition (docs/optimizer.md): the trips each run of it
    took, and how many trips each of its rows took -- read off the rows its first call computed at each trip
    (a loop that ends per row gives a call only the rows not done: the rows that drop out after trip t took
    t + 1 trips). A row group of the loop ends when its slowest row does, so a split into groups is as long
    as the expected longest of its rows (`group_trips`): with a long tail, much shorter than the whole loop
    for most groups."""

    loop: str  # structural path
    trips: tuple[int, ...]  # per run of the loop (per RL iteration, per row-group copy)
    row_trips: tuple[int, ...]  # per row of every run, pooled, sorted
    rows: int  # the rows of one run (the most seen)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.trips) if self.trips else 0.0

    @property
    def spread(self) -> float:
        """The coefficient of variation of the rows' trips (0: every row as long)."""
        if len(self.row_trips) < 2 or not statistics.fmean(self.row_trips):
            return 0.0
        return statistics.pstdev(self.row_trips) / statistics.fmean(self.row_trips)

    def group_trips(self, rows: int) -> float:
        """The expected trips of a group of `rows` rows drawn from the measured rows: the expected largest
        of `rows` values drawn without replacement from `row_trips` (a group ends with its slowest row)."""
        values, n = self.row_trips, len(self.row_trips)
        if not values:
            return self.mean
        m = max(1, min(rows, n))
        total = comb(n, m)
        return sum(v * (comb(j, m) - comb(j - 1, m)) for j, v in enumerate(values, start=1)) / total


def trip_stats(runs: Sequence[IterationRun] | Profile, loops: Sequence[tuple[str, str]]) -> dict[str, TripStats]:
    """Per loop that ends on a condition -- (structural path, structural path of its first call) pairs --
    the trips and per-row trips measured in `runs`. A run of a loop is one RL iteration of one copy of it
    (a split group's copy `decode@1` is a run of its own, told apart by the call's own node path)."""
    runs = runs.runs if isinstance(runs, Profile) else runs
    out: dict[str, TripStats] = {}
    for loop, first in loops:
        per_run: dict[tuple, dict[int, int | None]] = defaultdict(dict)
        for run in runs:
            for c in run.calls:
                if c.source == first and c.indices:
                    per_run[(run.iteration, c.node, c.indices[:-1])][c.indices[-1]] = c.rows
        if not per_run:
            continue
        trips, row_trips, most = [], [], 0
        for live in per_run.values():
            trips.append(max(live) + 1)
            counts = [live.get(t) for t in range(max(live) + 1)]
            full = counts[0] if counts[0] is not None else 0
            most = max(most, full)
            row_trips += _rows_ended(counts, full)
        out[loop] = TripStats(loop, tuple(trips), tuple(sorted(row_trips)), most)
    return out


def _rows_ended(counts: Sequence[int | None], full: int) -> list[int]:
    """Per row, the trip count, from the rows computed at each trip (None: every row, as declared)."""
    live = [full if c is None else c for c in counts] + [0]
    return [t + 1 for t in range(len(counts)) for _ in range(max(0, live[t] - live[t + 1]))]
