"""A fake `Measurer` for testing the search without a runtime: every call of component c on r rows
takes `fixed[c] + per_row[c] * r` seconds (a ground truth the search does not see), plans are "run" by
simulating that ground truth, and each measurement gets deterministic multiplicative noise."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from rose_dsl.analysis import iterations_in_flight
from rose_dsl.ir import ExecutionNode, Workflow
from rose_dsl.measurement import call_identity
from rose_dsl.optimizer.model import rows_of, simulate, steady_state
from rose_dsl.optimizer.profile import Call, IterationRun
from rose_dsl.optimizer.regions import LocalGraph
from rose_dsl.optimizer.search import OutOfBudget
from rose_dsl.semantics import Invocation


@dataclass
class GroundTruth:
    fixed: Mapping[str, float]  # component -> seconds per call
    per_row: Mapping[str, float] = field(default_factory=dict)  # component -> seconds per row
    activity: Mapping[str, float] = field(default_factory=dict)  # component -> activity of its calls
    contention: Mapping[tuple[str, str], float] = field(default_factory=dict)

    def cost(self, node: ExecutionNode) -> float:
        comp = node.component.split("@")[0]
        if comp.startswith("__"):
            return 0.0
        rows = rows_of(node) or 0
        return self.fixed.get(comp, 0.0) + self.per_row.get(comp, 0.0) * rows


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
