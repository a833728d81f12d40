"""Predicting a plan's time before measuring it (beyond the paper; its error is reported, not hidden).

Three things measured on this machine make the model:
* a **row model** per structural node: a call on r rows takes `fixed + per_row * r` seconds, fitted on
  calls that ran alone (no other process's call overlapping most of them), over every row count seen
  (the profile's full batches, split groups measured in trials). One row count seen: the scaling is
  unknown, and a plan that calls the node on other row counts is *unpredictable* (it gets measured);
* a **contention factor** c(X, Y) per pair of component processes: while a call of X overlaps calls of
  Y it runs (1 + c) times slower -- calibrated from every overlapping call the session measured, so it
  includes MPS when MPS is on, the GIL on the local backend, two processes on two cores;
* the **dispatch latency**: how long after its inputs are ready (and its component is free) a call
  starts, the median over measured calls;
* the **trips** of each loop that ends on a condition (`profile.TripStats`: per run, and per row): a plan
  is simulated with each such loop as many trips long as measured -- a row group's copy as long as the
  expected slowest of its rows, which is what splitting a long-tailed loop gains.
A plan is predicted by simulating one iteration of its invocation graph: each component process runs
its calls in program order, a call starts when its producers are done plus the latency, and calls that
overlap slow each other by the contention factors (a fluid model: rates change as calls start and end).
An asynchronous plan (`defer`, `ahead`) is predicted in steady state (`CostModel.period`): several RL
iterations simulated end to end, iteration k+1's rollout beside iteration k's update wherever the plan's
dependencies allow, slowed by the same contention factors; the difference of two such runs is the period.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from ..analysis import invocation_graph, iterations_in_flight
from ..ir import ExecutionNode, Item, LoopNode, Workflow
from ..semantics import Invocation
from .profile import Call, IterationRun, TripStats, component_bases, item_sources, trip_stats

__all__ = ["RowModel", "CostModel", "Prediction", "overlaps", "simulate", "steady_state", "rows_of", "trips_at"]

SOLO = 0.1  # a call is "alone" when other processes' calls overlap less than this fraction of it


@dataclass(frozen=True)
class RowModel:
    fixed_s: float
    per_row_s: float
    rows_seen: tuple[int, ...]

    def at(self, rows: int | None, lower_bound: bool = False) -> float | None:
        """Seconds of a call on `rows` rows. With one row count seen the scaling is unknown: None, or with
        `lower_bound` the least a call can take if time grows with rows and a call has a cost of its own
        (`fixed + per_row * r`, both >= 0): `t(seen) * r / seen` below the rows seen, `t(seen)` above."""
        if rows is None or len(self.rows_seen) >= 2 or rows in self.rows_seen or not self.rows_seen:
            return self.fixed_s + self.per_row_s * (rows if rows is not None else (self.rows_seen or (0,))[-1])
        if lower_bound:
            seen = self.rows_seen[0]
            return self.fixed_s * min(1.0, rows / seen) if seen > 0 else self.fixed_s
        return None  # one row count seen: how the time scales with rows is not known yet


@dataclass(frozen=True)
class Prediction:
    seconds: float | None  # None: a node's time at the rows this plan needs is unknown
    unknown: tuple[str, ...] = ()  # the nodes (and row counts) that made it unpredictable
    busy: dict[str, float] = field(default_factory=dict)  # predicted seconds in calls per process
    timeline: dict[Invocation, tuple[float, float]] = field(default_factory=dict, repr=False)  # start, end


def overlaps(calls: Sequence[Call]) -> list[dict[str, float]]:
    """For each call, the fraction of it that each *other* process's calls overlapped."""
    order = sorted(range(len(calls)), key=lambda i: calls[i].start_ns)
    out: list[dict[str, float]] = [defaultdict(float) for _ in calls]
    active: list[int] = []
    for i in order:
        c = calls[i]
        active = [j for j in active if calls[j].end_ns > c.start_ns]
        for j in active:
            d = calls[j]
            if d.component == c.component:
                continue
            lo, hi = max(c.start_ns, d.start_ns), min(c.end_ns, d.end_ns)
            if hi > lo:
                out[i][d.component] += (hi - lo) / max(1, c.end_ns - c.start_ns)
                out[j][c.component] += (hi - lo) / max(1, d.end_ns - d.start_ns)
        active.append(i)
    return [dict(o) for o in out]


class CostModel:
    """The row models, contention factors and dispatch latency of one session (see the module doc)."""

    def __init__(self) -> None:
        # node -> (rows, seconds, overlapped fraction, process, {other process: fraction})
        self.points: dict[str, list[tuple[int | None, float, float, str, dict[str, float]]]] = defaultdict(list)
        self.pairs: dict[tuple[str, str], list[float]] = defaultdict(list)
        self.gaps: list[float] = []
        self.rows: dict[str, RowModel] = {}
        self.contention: dict[tuple[str, str], float] = {}
        self.latency_s = 0.0
        self.base: dict[str, str] = {}  # each process measured -> its base component (`Call.base`)
        # loops that end on a condition: their measured trips (`profile.TripStats`), from the runs observed
        self.trips: dict[str, TripStats] = {}
        self._trip_runs: list[IterationRun] = []
        self._trip_loops: dict[str, str] = {}  # loop -> its first call (structural paths)

    # -- learning ---------------------------------------------------------------------------------
    def observe(self, runs: Iterable[IterationRun], wf: Workflow | None = None) -> None:
        """Add the calls of measured runs; `wf` (the plan they ran) lets the dispatch latency be measured."""
        runs = list(runs)
        for run in runs:
            fractions = overlaps(run.calls)
            for c, frac in zip(run.calls, fractions, strict=True):
                if c.component.startswith("__"):
                    continue
                self.base[c.component] = c.base
                self.points[c.source].append((c.rows, c.seconds, sum(frac.values()), c.component, frac))
            if wf is not None:
                self.gaps += _gaps(run.calls, wf)
        self._observe_trips(runs, wf)
        self._fit()

    def _observe_trips(self, runs: Sequence[IterationRun], wf: Workflow | None) -> None:
        """Keep the runs of plans holding loops that end on a condition, and their trip statistics."""
        if wf is None or not any(isinstance(i, LoopNode) and i.dynamic and i.body for i in wf.items()):
            return
        sources = item_sources(wf)
        loops = {sources[i.path]: sources[i.body[0].path]
                 for i in wf.items() if isinstance(i, LoopNode) and i.dynamic and i.body}
        self._trip_loops.update(loops)
        self._trip_runs += runs
        self.trips = trip_stats(self._trip_runs, sorted(self._trip_loops.items()))

    def _fit(self) -> None:
        self.rows = {}
        for node, pts in self.points.items():
            solo = [(r, s) for r, s, ov, *_ in pts if ov < SOLO] or [(r, s) for r, s, *_ in pts]
            by_rows: dict[int | None, list[float]] = defaultdict(list)
            for r, s in solo:
                by_rows[r].append(s)
            med = {r: statistics.median(v) for r, v in by_rows.items()}
            self.rows[node] = _fit_line(med)
        pairs: dict[tuple[str, str], list[float]] = defaultdict(list)
        for node, pts in self.points.items():
            model = self.rows[node]
            for r, s, ov, comp, frac in pts:
                if ov < 0.5 or not frac:
                    continue
                other, share = max(frac.items(), key=lambda kv: kv[1])
                alone = model.at(r)
                if alone and alone > 0 and share >= 0.5:
                    pairs[(self.base.get(comp, comp), self.base.get(other, other))].append(max(0.0, (s / alone - 1.0) / min(1.0, ov)))
        self.contention = {k: min(3.0, statistics.median(v)) for k, v in pairs.items() if len(v) >= 3}
        self.latency_s = statistics.median(self.gaps) if self.gaps else 0.0

    # -- predicting -------------------------------------------------------------------------------
    def duration(self, node: ExecutionNode, source: str, lower_bound: bool = False) -> float | None:
        """Seconds of a call of `node`, whose structural node is `source` (`item_sources` of its plan)."""
        model = self.rows.get(source)
        if model is None:
            return None
        return model.at(_rows(node), lower_bound)

    def with_trips(self, wf: Workflow) -> Workflow:
        """`wf` with every loop that ends on a condition made a static loop of the trips measured for it
        (`trips_at`: a row group's copy as long as its slowest row), so the simulation runs as many trips as
        the plan would; a loop not measured yet is left to the analysis' representative count."""
        if not self.trips or not any(isinstance(i, LoopNode) and i.dynamic for i in wf.items()):
            return wf

        sources = item_sources(wf)

        def fix(item: Item) -> Item:
            if isinstance(item, LoopNode):
                body = tuple(fix(c) for c in item.body)
                n = trips_at(self.trips.get(sources[item.path]), item) if item.dynamic else None
                return replace(item, body=body, until=None, count=n) if n is not None else replace(item, body=body)
            return item

        return replace(wf, root=fix(wf.root))  # type: ignore[arg-type]

    def period(self, wf: Workflow, lower_bound: bool = False) -> Prediction:
        """Seconds per RL iteration of `wf` in steady state. A synchronous plan runs its iterations one after
        another (`predict`); an asynchronous one (`defer`, `ahead`: several RL iterations in flight) overlaps
        iteration k+1's rollout with iteration k's update as far as the plan's data and state accesses allow,
        with the contention its calls' overlap implies: `steady_state` over the simulated invocation graph
        of several iterations, so the fill and the drain cancel out. `lower_bound`: as `predict`'s."""
        depth = iterations_in_flight(wf)
        if depth <= 1:
            return self.predict(wf, lower_bound=lower_bound)
        return steady_state(lambda n: self.predict(wf, lower_bound=lower_bound, iterations=n), depth)

    def predict(self, wf: Workflow, free: Sequence[str] = (), lower_bound: bool = False,
                iterations: int = 1) -> Prediction:
        """Simulate one iteration of `wf` (or `iterations` consecutive ones, end to end); components in
        `free` (e.g. the feed of a local graph) cost 0.

        With `lower_bound`, a node seen at one row count only is taken at the least it can cost at the rows
        this plan gives it (`RowModel.at`) instead of making the plan unpredictable: the prediction is then
        an optimistic one, and `unknown` names the nodes it assumed. A plan predicted clearly slower even
        so is clearly slower (where calls overlap little; a fluid simulation is not strictly monotone)."""
        g = invocation_graph(self.with_trips(wf), iterations=iterations)
        sources = item_sources(wf)
        dur: dict[Invocation, float] = {}
        unknown: list[str] = []
        broken = False  # a node with no duration, even as a lower bound
        for inv in g.order:
            node = g.node[inv]
            if node.component in free or node.component.startswith("__"):
                dur[inv] = 0.0
                continue
            d = self.duration(node, sources[node.path])
            if d is None:
                unknown.append(f"{sources[node.path]} at {_rows(node)} rows")
                d = self.duration(node, sources[node.path], lower_bound=True) if lower_bound else None
                if d is None:
                    broken = True
                    continue
            dur[inv] = d
        if broken:
            return Prediction(None, tuple(dict.fromkeys(unknown)))
        comp = {inv: g.node[inv].component for inv in g.order}
        deps = {inv: [p for p in g.producers(inv) if p in dur] for inv in g.order}
        p = _simulate(g.order, comp, deps, dur, self.contention, self.latency_s, component_bases(wf))
        return replace(p, unknown=tuple(dict.fromkeys(unknown))) if unknown and p.seconds is not None else p


def _group_rows(loop: LoopNode) -> int | None:
    """The rows one run of a loop computes: a row-group copy's rows, else its calls' batch size."""
    sizes = {_rows(n) for n in loop.body if isinstance(n, ExecutionNode)} - {None}
    return sizes.pop() if len(sizes) == 1 else None


def trips_at(stats: TripStats | None, loop: LoopNode) -> int | None:
    """The trips to predict for one run of a loop that ends on a condition: its slowest row's expected
    trips among the rows it computes (`TripStats.group_trips`; all rows: the measured mean), at most
    its bound. None: nothing measured (the analysis' representative count stands)."""
    if stats is None or not stats.trips:
        return None
    rows = _group_rows(loop)
    expected = stats.group_trips(rows) if rows is not None and rows < stats.rows else stats.mean
    return max(1, min(loop.count or 1, round(expected)))


STEADY_EXTRA = 2  # iterations simulated beyond the fill, whose difference is the steady-state period


def steady_state(simulate_n: Callable[[int], Prediction], depth: int) -> Prediction:
    """The steady-state seconds per iteration of a plan with `depth` RL iterations in flight, from simulations of
    n consecutive iterations (`simulate_n(n)`): (T(depth + STEADY_EXTRA) - T(depth)) / STEADY_EXTRA, so the
    pipeline's fill and drain, which both runs hold, cancel out. None when either simulation cannot say."""
    a, b = simulate_n(depth), simulate_n(depth + STEADY_EXTRA)
    if a.seconds is None or b.seconds is None:
        return Prediction(None, a.unknown or b.unknown)
    busy = {p: (b.busy.get(p, 0.0) - a.busy.get(p, 0.0)) / STEADY_EXTRA for p in b.busy}
    return Prediction(max(0.0, b.seconds - a.seconds) / STEADY_EXTRA, b.unknown, busy)


def simulate(wf: Workflow, cost: Callable[[ExecutionNode], float], contention: Mapping[tuple[str, str], float] | None = None,
             latency_s: float = 0.0, iterations: int = 1) -> Prediction:
    """`iterations` consecutive iterations of `wf` (end to end) with the given per-call cost (e.g. a known
    ground truth, in tests)."""
    g = invocation_graph(wf, iterations=iterations)
    dur = {inv: cost(g.node[inv]) for inv in g.order}
    comp = {inv: g.node[inv].component for inv in g.order}
    deps = {inv: list(g.producers(inv)) for inv in g.order}
    return _simulate(g.order, comp, deps, dur, contention or {}, latency_s, component_bases(wf))


def rows_of(node: ExecutionNode) -> int | None:
    """The rows a call of `node` processes: its group's rows, its batch size, or None (not separable)."""
    return _rows(node)


def _rows(node: ExecutionNode) -> int | None:
    if node.plan.rows is not None:
        return node.plan.rows[1] - node.plan.rows[0]
    return node.batch_size if node.batch is not None else None


def _fit_line(points: Mapping[int | None, float]) -> RowModel:
    known = sorted((r, s) for r, s in points.items() if r is not None)
    if len(known) < 2:
        s = next(iter(points.values()))
        return RowModel(s, 0.0, tuple(r for r, _ in known))
    n = len(known)
    mx = sum(r for r, _ in known) / n
    my = sum(s for _, s in known) / n
    var = sum((r - mx) ** 2 for r, _ in known)
    slope = max(0.0, sum((r - mx) * (s - my) for r, s in known) / var) if var else 0.0
    fixed = max(0.0, my - slope * mx)
    return RowModel(fixed, slope, tuple(r for r, _ in known))


def _gaps(calls: Sequence[Call], wf: Workflow) -> list[float]:
    """How long each call waited after it could have started (inputs ready, its process free)."""
    try:
        g = invocation_graph(wf, iterations=1)
    except Exception:  # noqa: BLE001 - a plan the analysis cannot unroll: no latency from it
        return []
    by_inv = {Invocation(c.path, (0,) + tuple(c.indices[1:])): c for c in calls}
    last_end: dict[str, int] = {}
    out = []
    for c in sorted(calls, key=lambda c: c.start_ns):
        inv = Invocation(c.path, (0,) + tuple(c.indices[1:]))
        ends = [by_inv[p].end_ns for p in g.producers(inv) if p in by_inv]
        ready = max([*ends, last_end.get(c.component, 0)])
        if ready and c.start_ns >= ready:
            out.append((c.start_ns - ready) / 1e9)
        last_end[c.component] = c.end_ns
    return out


def _simulate(order: Sequence[Invocation], comp: Mapping[Invocation, str], deps: Mapping[Invocation, list[Invocation]],
              dur: Mapping[Invocation, float], contention: Mapping[tuple[str, str], float], latency: float,
              base: Mapping[str, str]) -> Prediction:
    """A fluid simulation: each process runs its calls in program order; a running call's rate is
    1 / (1 + sum of c(X, Y) over the other processes Y with a call running), X and Y the processes' base
    components (`base`: a temporal copy contends as its original)."""
    queues: dict[str, list[Invocation]] = defaultdict(list)
    for inv in order:
        queues[comp[inv]].append(inv)
    head = {p: 0 for p in queues}
    free_at = {p: 0.0 for p in queues}
    done: dict[Invocation, float] = {}
    started: dict[Invocation, float] = {}
    running: dict[Invocation, float] = {}  # remaining solo seconds
    busy: dict[str, float] = defaultdict(float)
    t = 0.0
    total = len(order)
    while len(done) < total:
        starts = []
        for p, q in queues.items():
            if head[p] >= len(q) or any(comp[r] == p for r in running):
                continue
            inv = q[head[p]]
            if all(d in done for d in deps[inv]):
                ready = max([free_at[p]] + [done[d] + latency for d in deps[inv]])
                starts.append((ready, p, inv))
        for ready, p, inv in starts:
            if ready <= t + 1e-12:
                running[inv] = dur[inv]
                started[inv] = t
                head[p] += 1
                busy[p] += dur[inv]
        rates = {}
        for inv in running:
            me = base.get(comp[inv], comp[inv])
            slow = sum(contention.get((me, base.get(comp[o], comp[o])), 0.0) for o in running
                       if o != inv and comp[o] != comp[inv])
            rates[inv] = 1.0 / (1.0 + slow)
        next_start = min((r for r, _, inv in starts if inv not in running and r > t + 1e-12), default=None)
        next_end = min((rem / rates[i] for i, rem in running.items()), default=None)
        if next_end is None and next_start is None:
            return Prediction(None, ("a call never becomes ready (a cycle in the plan?)",))
        step = min(x for x in (next_end, None if next_start is None else next_start - t) if x is not None)
        t += step
        for inv in list(running):
            running[inv] -= rates[inv] * step
            if running[inv] <= 1e-12:
                del running[inv]
                done[inv] = t
                free_at[comp[inv]] = t
    return Prediction(t, (), dict(busy), {inv: (started[inv], done[inv]) for inv in done})
