"""A fake `Measurer` for testing the search without a runtime: every call of component c on r rows
takes `fixed[c] + per_row[c] * r` seconds (a ground truth the search does not see), plans are "run" by
simulating that ground truth, and each measurement gets deterministic multiplicative noise."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from rose_dsl.analysis import invocation_graph, iterations_in_flight
from rose_dsl.ir import ExecutionNode, LoopNode, Workflow
from rose_dsl.measurement import call_identity, window
from rose_dsl.optimizer.model import _simulate, rows_of, simulate, steady_state
from rose_dsl.optimizer.profile import Call, IterationRun, component_bases
from rose_dsl.optimizer.regions import LocalGraph
from rose_dsl.optimizer.search import OutOfBudget
from rose_dsl.semantics import Invocation


@dataclass
class GroundTruth:
    fixed: Mapping[str, float]  # component -> seconds per call
    per_row: Mapping[str, float] = field(default_factory=dict)  # component -> seconds per row
    activity: Mapping[str, float] = field(default_factory=dict)  # component -> activity of its calls
    contention: Mapping[tuple[str, str], float] = field(default_factory=dict)
    per_call: Mapping[str, float] = field(default_factory=dict)  # "component.method" -> seconds per call, added

    def cost(self, node: ExecutionNode) -> float:
        comp = node.component.split("@")[0]
        if comp.startswith("__"):
            return 0.0
        rows = rows_of(node) or 0
        return (self.fixed.get(comp, 0.0) + self.per_row.get(comp, 0.0) * rows
                + self.per_call.get(f"{comp}.{node.method}", 0.0))


class FakeMeasurer:
    activity_kind = "cpu"
    feed_impl, probe_impl = "tests.optimizer.fakes:Feed", "tests.optimizer.fakes:Probe"  # (never run)

    def __init__(self, truth: GroundTruth, noise: float = 0.01, seed: int = 0, iterations: int | None = None,
                 seconds_per_step: float = 0.0) -> None:
        self.truth, self.noise = truth, noise
        self.rng = random.Random(seed)
        self.k = 0
        self.limit = iterations
        self.clock = 0.0
        self.component_bytes: dict[str, int] = {}
        self.memory_limits: dict[str, int] = {}
        self.log: list[tuple[str, str]] = []  # (kind, plan name or region)
        self.seconds_per_step = seconds_per_step
        self.last_failures: dict[int, str] = {}

    def elapsed(self) -> float:
        return self.clock

    def _run(self, wf: Workflow, iteration: int) -> IterationRun:
        pred = simulate(wf, self.truth.cost, self.truth.contention)
        depth = iterations_in_flight(wf)
        if depth > 1:  # an asynchronous plan's iteration: its steady-state period (iterations overlap)
            period = steady_state(lambda n: simulate(wf, self.truth.cost, self.truth.contention, iterations=n), depth)
            pred = replace(pred, seconds=period.seconds)
        factor = 1.0 + self.rng.uniform(-self.noise, self.noise)
        calls = []
        base = int(self.clock * 1e9)
        identity = call_identity(wf)  # what the runtime fills a call's identity from
        for inv, (s, e) in pred.timeline.items():
            node = wf.find(inv.path)
            assert isinstance(node, ExecutionNode)
            if node.component.startswith("__"):
                continue
            calls.append(Call(".".join(inv.path), node.component, iteration, (iteration,) + inv.indices[1:],
                              base + int(s * factor * 1e9), base + int(e * factor * 1e9), rows_of(node),
                              self.truth.activity.get(node.component.split("@")[0], 0.1),
                              *identity[".".join(inv.path)]))
        seconds = pred.seconds * factor
        self.clock += seconds + self.seconds_per_step
        return IterationRun(seconds, tuple(calls), base, base + int(seconds * 1e9), iteration)

    def complete(self, plans: Sequence[Workflow], rounds: int, warmup: int = 0,
                 labels: Sequence[str] = (), guard_first: bool = False) -> list[list[IterationRun]]:
        out: list[list[IterationRun]] = [[] for _ in plans]
        for _ in range(warmup):
            self._step(plans[0])
        for _ in range(rounds):
            for i, p in enumerate(plans):
                out[i].append(self._step(p))
        return out

    def _step(self, plan: Workflow) -> IterationRun:
        if self.limit is not None and self.k >= self.limit:
            raise OutOfBudget(f"the workflow's {self.limit} iterations are all trained")
        self.log.append(("complete", plan.name))
        run = self._run(plan, self.k)
        self.k += 1
        return run

    def capture(self, probe_wf: Workflow) -> Any:
        self.log.append(("capture", probe_wf.name))
        self._step(probe_wf)
        return {}

    def local(self, graphs: Sequence[LocalGraph], repeats: int, captured: Any, probe_id: int,
              give_up: Any = None) -> list[list[IterationRun]]:
        out: list[list[IterationRun]] = [[] for _ in graphs]
        abandoned: set[int] = set()
        for _ in range(repeats):
            for i, g in enumerate(graphs):
                if i in abandoned:
                    continue
                self.log.append(("local", ".".join(g.region)))
                out[i].append(self._run(g.workflow, 0))
                if i > 0 and len(out[i]) < repeats and give_up is not None and give_up(
                        [x.seconds for x in out[0]], [x.seconds for x in out[i]]):
                    abandoned.add(i)
        return out


def invocation_key(path: str, indices: tuple[int, ...]) -> Invocation:
    return Invocation(tuple(path.split(".")), indices)


class RowTripsMeasurer(FakeMeasurer):
    """A `FakeMeasurer` whose loops that end per row (`until:`) run as the runtime runs them: row r of such a
    loop takes `row_trips[r]` trips, a copy of the loop (a row group) as many as its slowest row, and each trip
    calls the loop's nodes on the rows still active -- costed, and reported in `Call.rows`, on those rows. So
    the profile shows the loop's nodes at several row counts, and the cost model can predict a row group's
    calls, as on a real multi-turn agent (later turns act on the prompts still running). Only loops of the
    iteration body are supported (the tests' shapes)."""

    def __init__(self, truth: GroundTruth, row_trips: Sequence[int], noise: float = 0.01, seed: int = 0,
                 iterations: int | None = None) -> None:
        super().__init__(truth, noise, seed, iterations)
        self.row_trips = tuple(row_trips)

    def _rows(self, node: ExecutionNode) -> tuple[int, int]:
        if node.plan.rows is not None:
            return node.plan.rows
        return 0, node.batch_size or len(self.row_trips)

    def _static(self, wf: Workflow) -> Workflow:
        """`wf` with each top-level loop that ends per row made static: as many trips as its slowest row."""
        body = []
        for item in wf.root.body:
            if isinstance(item, LoopNode) and item.until is not None:
                first = next(n for n in item.body if isinstance(n, ExecutionNode))
                lo, hi = self._rows(first)
                item = replace(item, until=None, count=max(self.row_trips[lo:hi]))
            body.append(item)
        return replace(wf, root=replace(wf.root, body=tuple(body)))

    def _active(self, wf: Workflow, inv: Invocation) -> int | None:
        """The rows a call computes: its rows still active at its trip, in a loop that ends per row."""
        node = wf.find(inv.path)
        assert isinstance(node, ExecutionNode)
        loop = wf.find(inv.path[:2])
        if not (isinstance(loop, LoopNode) and loop.until is not None and len(inv.path) == 3):
            return rows_of(node)
        lo, hi = self._rows(node)
        return sum(1 for r in range(lo, hi) if self.row_trips[r] > inv.indices[1])

    def _run(self, wf: Workflow, iteration: int) -> IterationRun:
        static = self._static(wf)
        g = invocation_graph(static, iterations=1)
        rows = {inv: self._active(wf, inv) for inv in g.order}
        truth = self.truth

        def cost(inv: Invocation) -> float:
            comp = g.node[inv].component.split("@")[0]
            return 0.0 if comp.startswith("__") else truth.fixed.get(comp, 0.0) + truth.per_row.get(comp, 0.0) * (rows[inv] or 0)

        pred = _simulate(g.order, {inv: g.node[inv].component for inv in g.order},
                         {inv: list(g.producers(inv)) for inv in g.order}, {inv: cost(inv) for inv in g.order},
                         truth.contention, 0.0, component_bases(wf))
        assert pred.seconds is not None
        factor = 1.0 + self.rng.uniform(-self.noise, self.noise)
        base = int(self.clock * 1e9)
        identity = call_identity(wf)
        calls = []
        for inv, (s, e) in pred.timeline.items():
            node = g.node[inv]
            if node.component.startswith("__"):
                continue
            calls.append(Call(".".join(inv.path), node.component, iteration, (iteration,) + inv.indices[1:],
                              base + int(s * factor * 1e9), base + int(e * factor * 1e9), rows[inv],
                              truth.activity.get(node.component.split("@")[0], 0.1), *identity[".".join(inv.path)]))
        seconds = pred.seconds * factor
        self.clock += seconds
        return IterationRun(seconds, tuple(calls), base, base + int(seconds * 1e9), iteration)


class TurnCostMeasurer(FakeMeasurer):
    """A `FakeMeasurer` whose turns cost what the runtime's measuring session spends on them
    (`interpreter/optimize/trials.py`), not only their timed iteration: the processes' start-up before the
    first (`startup_s` on the clock); a synchronous plan's first iteration ever, and its first after a switch
    from another, trained untimed; an asynchronous plan measured as a window (`measurement.window`)
    whose fill iteration runs at the drained iteration's time and whose measured and tail iterations at its
    steady-state period, plus `drain_s`. The budget estimates of the search meet the costs they estimate."""

    def __init__(self, truth: GroundTruth, startup_s: float = 0.0, drain_s: float = 0.0, **kw: Any) -> None:
        super().__init__(truth, **kw)
        self.clock = startup_s
        self.drain_s = drain_s
        self.seen: set[int] = set()
        self.last: Workflow | None = None

    def _drained(self, plan: Workflow) -> float:
        return simulate(plan, self.truth.cost, self.truth.contention).seconds or 0.0

    def _step(self, plan: Workflow) -> IterationRun:
        win = window(plan)
        if win.iterations == 1 and (id(plan) not in self.seen or self.last is not plan):
            self.clock += self._drained(plan)  # trained, untimed
            self.k += 1
        self.seen.add(id(plan))
        self.last = plan
        if win.iterations == 1:
            return super()._step(plan)
        self.clock += win.fill * self._drained(plan)
        run = super()._step(plan)  # one measured iteration at the period stands for the window's
        self.clock += (win.measured - 1 + win.tail) * run.seconds + self.drain_s
        self.k += win.iterations - 1
        return run
