"""The static per-iteration schedule: every call of an RL iteration in program order, each with a
*recipe* for its inputs.

A recipe (`interpreter.recipe`) is a small tree that says how to build a call's inputs from earlier
calls' outputs; its leaves stand for backend handles (futures, Ray ObjectRefs, compiled-graph nodes).
The driver computes recipes with the semantics' lazy evaluator (`rose_dsl.semantics.Program`) and never
touches the data; the worker that runs the call evaluates the recipe with the resolved leaves.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from rose_dsl.analysis import AfterOrder
from rose_dsl.ir import ExecutionNode, LoopNode, Workflow
from rose_dsl.semantics import CallSite, Frame, Invocation, Program

from .recipe import Cat, Leaf, Part, Recipe, RecipeOps, Ref, leaves_of, lift, map_leaves, number_leaves

__all__ = ["Pending", "ReplicaSet", "Step", "Schedule", "for_replica", "replicated", "check_replica_edges"]


@dataclass(frozen=True)
class Step:
    """One call: where it runs, what it calls, and how its inputs are built (`recipe`: one recipe per
    input port, whose `Leaf(i)` stands for the value behind `handles[i]`). `after` holds handles of
    calls that must finish first although no input comes from them (an `after:` in the workflow)."""

    inv: Invocation
    node: ExecutionNode
    recipe: tuple[tuple[str, Recipe], ...]
    handles: tuple[Any, ...]
    after: tuple[Any, ...] = ()

    @property
    def label(self) -> str:
        return str(self.inv)


@dataclass(frozen=True)
class ReplicaSet:
    """The handles of one output port on every data-parallel replica of its component (replica order)."""

    handles: tuple[Any, ...]
    component: str


def for_replica(step: Step, replica: int, replicas: int) -> Step:
    """Step `step` (whose handles are `ReplicaSet`s) as replica `replica` of `replicas` runs it.

    Per input port: values from a component with the same replica count come from the same replica.
    With fewer producer replicas (R_c = m R_p, the hybrid placement: e.g. 2 rollout replicas feeding 4
    trainer replicas), replica j builds the port from producer replica j // m and takes shard j % m of
    it along the node's `shard:` dimension. With more (R_p = m R_c), replica j concatenates the port as
    built from producer replicas j m ... j m + m - 1 along `shard:`, or, for a node without `shard:`,
    takes replica j m's -- the data-parallel contract: a replicated component's replicas hold the same
    value (e.g. weights after an all-reduced step). A port may not mix replica counts.
    """
    leaves: list[Any] = []
    where = f"{step.label} ({step.node.component}, {replicas} replica{'s' if replicas > 1 else ''})"

    def remap(recipe: Recipe, pick: int) -> Recipe:
        def one(leaf: Leaf | Ref) -> Recipe:
            assert isinstance(leaf, Leaf)
            h = step.handles[leaf.index]
            leaves.append(h.handles[pick] if isinstance(h, ReplicaSet) else h)
            return Leaf(len(leaves) - 1)

        return map_leaves(recipe, one)

    ports = []
    for port, recipe in step.recipe:
        sets = [h for h in (step.handles[leaf.index] for leaf in leaves_of(recipe) if isinstance(leaf, Leaf))
                if isinstance(h, ReplicaSet)]
        counts = {len(h.handles) for h in sets}
        if len(counts) > 1:
            raise ValueError(f"{where}: input '{port}' mixes values from components with different replica counts "
                             f"({', '.join(sorted({f'{h.component}: {len(h.handles)}' for h in sets}))})")
        have, dim = (counts.pop() if counts else replicas), step.node.shard
        source = next((h.component for h in sets), "?")
        if have == replicas:
            ports.append((port, remap(recipe, replica)))
        elif replicas % have == 0:
            m = replicas // have
            if dim is None:
                raise ValueError(f"{where} takes '{port}' from '{source}' ({have} replicas): declare `shard: DIM` on "
                                 f"'{step.node.name}' so that each of its replicas takes a shard")
            ports.append((port, Part(remap(recipe, replica // m), dim, replica % m, m)))
        elif have % replicas == 0:
            m = have // replicas
            group = range(replica * m, (replica + 1) * m)
            ports.append((port, remap(recipe, group[0]) if dim is None
                          else Cat(tuple(remap(recipe, g) for g in group), dim)))
        else:
            pos = step.node.field_pos.get(f"in.{port}", step.node.pos)  # where the user fixes it
            raise ValueError(f"{pos}: {where} takes '{port}' from '{source}' ({have} replicas): one replica count "
                             "must divide the other")
    after = tuple(x for h in step.after for x in (h.handles if isinstance(h, ReplicaSet) else (h,)))  # every replica
    return Step(step.inv, step.node, tuple(ports), tuple(leaves), after)


@dataclass
class Pending:
    """What an asynchronous plan's schedule holds between two RL iterations besides the program: the first RL
    iteration since the last drain (its deferred calls, and later ones', are still to come), the iteration
    whose steps ran the next one's calls ahead, the handles of the calls whose outputs later calls may still
    read (the last `depth` iterations'), and the trips loops that end on a condition ran in those
    iterations (a deferred call reads its own iteration's). `Schedule.pending` / `Schedule.resume`: what a
    stop keeps in its checkpoint (`in_flight.py`)."""

    since: int
    ran_ahead: int | None
    kept: dict[Invocation, tuple[Any, ...]]
    ran: dict[tuple[tuple[str, ...], tuple[int, ...]], list[int]]


class Schedule:
    """A workflow compiled for execution: call sites per iteration and their input recipes."""

    def __init__(self, wf: Workflow) -> None:
        self.program = Program(wf)
        self.workflow = wf
        # loops that end on a condition: an iteration holding one is scheduled while it runs (`steps`' fetch)
        self.dynamic = tuple(i for i in wf.items() if isinstance(i, LoopNode) and i.dynamic)
        self.trips: dict[tuple[str, ...], int] = {}  # trips each such loop ran in the last iteration scheduled
        # values the iteration loop carries (as recipes; with replicas their leaves are `ReplicaSet`s)
        self._root_carry: dict[int, dict[str, Any]] = {}
        # an asynchronous plan (`defer:`): the first RL iteration since the last drain, and the handles of
        # the iterations whose deferred calls are still to come (they read those iterations' outputs)
        self.depth = self.program.depth
        self._since = 0
        self._kept: dict[Invocation, tuple[Any, ...]] = {}
        # the last RL iteration k whose steps ran calls of k + 1 ahead (None: the last one ran none): k + 1
        # must then run before any barrier, or its calls run ahead would be lost (`pipeline.run_pipelined`)
        self.ran_ahead: int | None = None
        # the trips each loop that ends on a condition ran, kept for later iterations' deferred calls (keyed
        # by loop instance, whose indices start with the RL iteration's)
        self._ran: dict[tuple[tuple[str, ...], tuple[int, ...]], list[int]] = {}

    def sites(self, k: int, ahead: bool = True) -> list[CallSite]:
        return list(self.program.unroll(k, since=self._since, ahead=ahead))

    def start_at(self, k: int) -> None:
        """The next RL iteration is k with nothing deferred pending (a resume from a checkpoint, which was
        taken after a drain; a recovery; a plan loaded mid-run)."""
        self._since = k
        self._kept.clear()
        self._ran.clear()
        self.ran_ahead = None

    def pending(self) -> Pending | None:
        """What is in flight after the last iteration scheduled, or None when that cannot be taken out: the RL
        iteration carries values (recipes over handles, not values)."""
        if self._root_carry:
            return None
        return Pending(self._since, self.ran_ahead, dict(self._kept), {key: list(v) for key, v in self._ran.items()})

    def resume(self, k: int, pending: Pending) -> None:
        """The next RL iteration is k, with `pending` in flight (what `pending()` gave after iteration k - 1,
        its handles replaced by the backend's handles to the same values)."""
        self.start_at(k)
        self._since, self.ran_ahead = pending.since, pending.ran_ahead
        self._kept = dict(pending.kept)
        self._ran = {key: list(v) for key, v in pending.ran.items()}

    def steps(self, k: Any, submit: Callable[[Step], Sequence[Any]],
              fetch: Callable[[Any], Any] | None = None, ahead: bool = True) -> list[tuple[Step, Sequence[Any]]]:
        """Build every step of iteration k in program order and `submit` it; `submit` returns one handle
        per output port (in `node.outputs` order), which later recipes then refer to (data-parallel
        replicas: see `replicated`). A workflow with loops that end on a condition needs `fetch` (a
        handle's value, waiting for it): after each trip of such a loop the condition's producers are
        fetched to decide on the next (`until_loops.UntilLoops`). A deferred node submits its call of
        iteration k - defer; a node run ahead its call of k + 1, unless `ahead` is False (k ends before a
        barrier: `Program.unroll`)."""
        if self.depth > 1 and not isinstance(k, int):
            raise ValueError("an asynchronous plan (defer:, ahead:) runs without a compiled graph: its calls read "
                             "values of other RL iterations")
        since = self._since
        out = self._submit(lambda reached: self.program.unroll(k, reached, since=since, ahead=ahead), k, submit, fetch)
        self.ran_ahead = k if ahead and self.program.hoisted else None
        if self.depth > 1:  # keep what later iterations' deferred calls read
            self._kept = {inv: h for inv, h in self._kept.items() if inv.indices[0] >= k + 2 - self.depth}
        return out

    def drain(self, k: int, submit: Callable[[Step], Sequence[Any]]) -> list[tuple[Step, Sequence[Any]]]:
        """Submit the deferred calls still pending after iteration k (before a checkpoint, at the end of a
        run): afterwards the state is the one the declared workflow leaves, and iteration k+1 starts with
        nothing pending (`semantics.Program.drain`)."""
        if self.depth == 1:
            return []
        pending = list(self.program.drain(k, self._since))
        out = self._submit(lambda reached: pending, None, submit)
        self.start_at(k + 1)
        return out

    def _submit(self, sites: Callable[[Any], Iterable[CallSite]], k: Any, submit: Callable[[Step], Sequence[Any]],
                fetch: Callable[[Any], Any] | None = None) -> list[tuple[Step, Sequence[Any]]]:
        """Submit the call sites `sites(reached)` gives (`reached`: the `until:` loops' end test, or None);
        `k` the RL iteration they make up, None for a drain's deferred calls (direct children of the RL
        iteration: never inside a loop)."""
        handles: dict[Invocation, tuple[Any, ...]] = self._kept if self.depth > 1 else {}
        component: dict[Invocation, str] = {}
        ports = {p: {port: i for i, port in enumerate(item.outputs)} for p, item in self.program.items.items()
                 if isinstance(item, ExecutionNode)}
        frame = Frame(lambda inv, port: Ref(handles[inv][ports[inv.path][port]]), RecipeOps(),
                      root_carry=self._root_carry)
        frame.dynamic_ran.update(self._ran)  # a deferred call reads its own iteration's loops as they ran
        order = AfterOrder(self.program.items)
        until = None
        if self.dynamic and k is not None:
            if fetch is None:
                raise ValueError(f"loop '{self.dynamic[0].name}' ends on a condition: scheduling it needs the values "
                                 "its condition reads (fetch)")
            from .until_loops import UntilLoops

            until = UntilLoops(self.program, frame, handles, component, fetch, k)
        out = []
        for site in sites(until.reached if until is not None else None):
            raw = self.program.inputs(site, frame)
            lifted = [(port, lift(value)) for port, value in raw.items()]
            recipe, leaves = number_leaves(until.narrow(site, lifted) if until is not None else lifted)
            # an `after:` waits for the last such call on each other component (a component runs its
            # calls in order, so that one finishing means its earlier ones did; its own are earlier still)
            last = {component[inv]: inv for inv, _ in order.visit(site)}
            after = tuple(handles[inv][0] for comp, inv in last.items() if comp != site.node.component)
            step = Step(site.inv, site.node, recipe, leaves, after)
            result = submit(step)
            handles[site.inv] = tuple(result)
            component[site.inv] = site.node.component
            out.append((step, result))
        if k is not None:
            self.program.end_iteration(k, frame)
            self._root_carry = {j: v for j, v in frame.root_carry.items() if j > k}
            if self.depth > 1:
                self._ran = {key: ran for key, ran in frame.dynamic_ran.items()
                             if key[1] and key[1][0] >= k + 2 - self.depth}
        if until is not None:
            self.trips = dict(until.trips)
        return out


def replicated(submit: Callable[[Step, int], Sequence[Any]], wf: Workflow) -> Callable[[Step], tuple[ReplicaSet, ...]]:
    """A `Schedule.steps` submit function for data-parallel replicas: each step is submitted once per
    replica of its component (`for_replica`), and each output port becomes a `ReplicaSet` (so values
    carried to the next iteration stay per replica too)."""
    replicas_of = {c.name: c.replicas for c in wf.components.values()}

    def lifted(step: Step) -> tuple[ReplicaSet, ...]:
        n = replicas_of[step.node.component]
        per = [submit(for_replica(step, r, n), r) for r in range(n)]
        return tuple(ReplicaSet(tuple(p[i] for p in per), step.node.component)
                     for i in range(max(1, len(step.node.outputs))))

    return lifted


def check_replica_edges(wf: Workflow) -> None:
    """Raise ValueError naming the first call whose inputs cannot be mapped between replica counts
    (two RL iterations, so values carried from one iteration to the next are checked too)."""
    schedule = Schedule(wf)
    submit = replicated(lambda step, r: (None,) * max(1, len(step.node.outputs)), wf)
    for k in range(2):
        schedule.steps(k, submit)
