"""Legality analysis: data and state dependencies, loop kinds, policy versions.

Two views of the same facts:
  * `invocation_graph` runs the semantics (`semantics.IterationRunner`) symbolically over two RL
    iterations: every value is the set of invocations that produced it, every state access is recorded
    in program order. Its edges are exact, at invocation granularity (a consumer of `epoch[0].traj`
    depends on iteration 0 of `epoch` only), and they are what transformations must preserve.
  * `analyze` summarises them per item for people: loop kinds with the reason, item-level edges with
    the iteration relation and the reason, and which writer each state read sees (the policy-version
    rule: rollout of iteration k reads the weights synced at the end of k-1).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from .expr import IterRef, unparse, walk
from .ir import Access, ExecutionNode, Item, LoopNode, Workflow
from .resolve import Resolver, expr_fields
from .semantics import CallSite, Invocation, Program, enclosing_loops, run_sequential

__all__ = [
    "Dep", "DepSet", "DepOps", "InvocationGraph", "invocation_graph", "representative", "REPRESENTATIVE", "LoopKind", "ItemEdge", "Analysis", "analyze", "loop_kinds",
    "state_access_order",
]

Path = tuple[str, ...]


@dataclass(frozen=True)
class Dep:
    """Why `consumer` must run after `producer`. kind: 'data' or 'state'. For state deps `flow` is True
    when the consumer observes the producer's value (read/update after a write) and False when the order
    only protects an in-place object (a write after a read, a refresh after a write)."""

    kind: str
    detail: str
    flow: bool = True


@dataclass
class InvocationGraph:
    order: list[Invocation] = field(default_factory=list)  # program order of call invocations
    node: dict[Invocation, ExecutionNode] = field(default_factory=dict)
    deps: dict[Invocation, dict[Invocation, set[Dep]]] = field(default_factory=lambda: defaultdict(dict))
    accesses: dict[str, list[tuple[Invocation, Access]]] = field(default_factory=lambda: defaultdict(list))

    def producers(self, inv: Invocation) -> set[Invocation]:
        return set(self.deps.get(inv, {}))

    def edges(self) -> Iterable[tuple[Invocation, Invocation, Dep]]:
        for consumer, prods in self.deps.items():
            for producer, reasons in prods.items():
                for r in reasons:
                    yield producer, consumer, r


class _Deps(frozenset):
    """A symbolic value: the (invocation, port) pairs it was computed from."""


class _DepOps:
    @staticmethod
    def _u(values: Iterable[Any]) -> _Deps:
        out: set = set()
        for v in values:
            if isinstance(v, frozenset):
                out |= v
            elif isinstance(v, list):
                out |= _DepOps._u(v)
        return _Deps(out)

    def stack(self, values):
        return self._u(values)

    def cat(self, values, dim=0):
        return self._u(values)

    def record(self, fields):
        return self._u(fields.values())

    def slice(self, value, start, stop):
        return value

    def truth(self, value):
        return True  # unreached: dynamic loops are made static first (`representative`)


# Public names for the dependency interpretation of values, used by the reference interpreter to find
# which calls a call must wait for.
DepSet = _Deps
DepOps = _DepOps


class _DepTracker:
    """Records, for each call in program order, which calls its inputs came from and the state order.

    Per state object, with `reads` = read or update (both observe the current value) and `writes` =
    update or refresh:
      * read-after-write: a reading access follows the last write (the value flows);
      * write-after-read: a write follows every access that observed the value it replaces (an update
        observed the value before it, so a later write follows the update too);
      * write-after-write: a write whose value is *observed* -- read or updated before the next refresh,
        or still there at the end of the RL iteration (when checkpoints read it) -- follows every write
        since the last observation, so that none of them can land on top of it. A refresh that is
        overwritten unobserved may move freely among the writes around it.
    """

    ops = _DepOps()

    def __init__(self, graph: InvocationGraph) -> None:
        self.g = graph
        self._last_writer: dict[str, Invocation] = {}
        self._readers: dict[str, list[Invocation]] = defaultdict(list)
        self._unobserved_writes: dict[str, list[Invocation]] = defaultdict(list)
        self._pending: list[tuple[str, int, list[Invocation]]] = []

    def call(self, site: CallSite, inputs: dict[str, Any]) -> dict[str, Any]:
        g, node, inv = self.g, site.node, site.inv
        g.order.append(inv)
        g.node[inv] = node
        for port, value in inputs.items():
            for producer, out_port in (value if isinstance(value, frozenset) else ()):
                g.deps[inv].setdefault(producer, set()).add(Dep("data", f"in.{port} <- {producer.path[-1]}.{out_port}"))
        for eff in node.effects:
            s, acc = eff.state, eff.access
            g.accesses[s].append((inv, acc))
            writer = self._last_writer.get(s)
            if acc.reads_previous and writer is not None and writer != inv:
                self._add(inv, writer, Dep("state", f"{s}: {acc.value} after {self._mode(writer, s)}"))
            if acc.writes:
                for reader in self._readers[s]:
                    if reader != inv and not (acc.reads_previous and reader == writer):  # that one flows already
                        self._add(inv, reader, Dep("state", f"{s}: {acc.value} after {self._mode(reader, s)}", False))
                earlier = [w for w in self._unobserved_writes[s] if w != inv]
                if acc is Access.REFRESH:
                    self._pending.append((s, len(g.accesses[s]) - 1, earlier))
                self._last_writer[s] = inv
            if acc is Access.READ:
                self._readers[s].append(inv)
                self._unobserved_writes[s] = []
            elif acc is Access.UPDATE:
                self._readers[s] = [inv]
                self._unobserved_writes[s] = [inv]
            else:
                self._readers[s] = []
                self._unobserved_writes[s].append(inv)
        return {port: _Deps({(inv, port)}) for port in node.outputs}

    def finish(self) -> None:
        """Add the write-after-write edges of the refreshes whose value is observed."""
        for state, position, earlier in self._pending:
            seq = self.g.accesses[state]
            inv = seq[position][0]
            observed = True
            for later_inv, later in seq[position + 1:]:
                if later_inv.indices[0] != inv.indices[0] or later.reads_previous:
                    break  # the end of the RL iteration (a checkpoint) or a reader observes it
                if later is Access.REFRESH and _covers(self.g.node[later_inv].rows, self.g.node[inv].rows):
                    observed = False  # overwritten unobserved (a row group's refresh hides only its rows)
                    break
            if observed:
                for w in earlier:
                    self._add(inv, w, Dep("state", f"{state}: refresh after {self._mode(w, state)}", False))
        self._pending.clear()

    def _mode(self, inv: Invocation, state: str) -> str:
        return next(e.access.value for e in self.g.node[inv].effects if e.state == state)

    def _add(self, consumer: Invocation, producer: Invocation, dep: Dep) -> None:
        self.g.deps[consumer].setdefault(producer, set()).add(dep)


def _covers(a: tuple[int, int] | None, b: tuple[int, int] | None) -> bool:
    """Rows `a` include rows `b` (None: every row)."""
    return a is None or (b is not None and a[0] <= b[0] and b[1] <= a[1])


def _clamped(wf: Workflow, limit: int | None) -> Workflow:
    """The workflow with loop counts capped (keeping every iteration an expression names explicitly),
    so that an explanation of a long workflow stays small. The edges' *relations* are unchanged."""
    if limit is None:
        return wf
    needed: dict[str, int] = defaultdict(int)
    for item in wf.items():
        for _, e in expr_fields(item):
            for x in walk(e):
                if isinstance(x, IterRef) and x.index.kind == "int":
                    needed[x.loop] = max(needed[x.loop], x.index.value + 1)

    def clamp(item: Item) -> Item:
        if isinstance(item, LoopNode):
            body = tuple(clamp(c) for c in item.body)
            if item.path == wf.root.path or item.count is None or item.iterations is not None:
                return replace(item, body=body)
            return replace(item, body=body, count=min(item.count, max(limit, needed[item.name])))
        if isinstance(item, ExecutionNode) and item.phases:
            return replace(item, phases=tuple(clamp(c) for c in item.phases))
        return item

    return replace(wf, root=clamp(wf.root))  # type: ignore[arg-type]


REPRESENTATIVE = 2  # iterations through which a loop that ends on a condition is analysed


def representative(wf: Workflow) -> Workflow:
    """The workflow with every loop that ends on a condition run as a static loop of its first
    `REPRESENTATIVE` iterations (fewer if its `count` says so). How many iterations such a loop runs is
    known only at run time; two show every kind of edge it can have: into its first iteration, between
    consecutive iterations (carried values, state), and out of its last. Rewrites keep these loops whole,
    so nothing depends on the number."""
    if not any(isinstance(i, LoopNode) and i.dynamic for i in wf.items()):
        return wf

    def fix(item: Item) -> Item:
        if isinstance(item, LoopNode):
            body = tuple(fix(c) for c in item.body)
            if item.dynamic:
                return replace(item, body=body, until=None, count=min(item.count or REPRESENTATIVE, REPRESENTATIVE))
            return replace(item, body=body)
        if isinstance(item, ExecutionNode) and item.phases:
            return replace(item, phases=tuple(fix(c) for c in item.phases))
        return item

    return replace(wf, root=fix(wf.root))  # type: ignore[arg-type]


def invocation_graph(wf: Workflow, iterations: int = 2, count_limit: int | None = None,
                     expand_phases: bool = False) -> InvocationGraph:
    """Dependencies of every invocation over `iterations` consecutive RL iterations (0..n-1); a loop
    that ends on a condition is analysed through representative iterations (`representative`)."""
    wf = representative(_clamped(wf, count_limit))
    if expand_phases:
        wf = replace(wf, root=_expand_all(wf.root))
    graph = InvocationGraph()
    tracker = _DepTracker(graph)
    run_sequential(Program(wf), tracker, range(iterations))
    tracker.finish()
    return graph


def _expand_all(item: Item) -> Any:
    if isinstance(item, LoopNode):
        return replace(item, body=tuple(_expand_all(c) for c in item.body))
    if isinstance(item, ExecutionNode) and item.phases:
        return replace(item, expand=True, phases=tuple(_expand_all(c) for c in item.phases))
    return item


# -- loop kinds ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class LoopKind:
    path: Path
    kind: str  # "free" | "dependent"
    reasons: tuple[str, ...]


def state_access_order(items: Sequence[Item]) -> list[tuple[str, Access, Path]]:
    """State accesses of one pass over a body, in program order (nested loops: one iteration)."""
    out: list[tuple[str, Access, Path]] = []
    for item in items:
        if isinstance(item, ExecutionNode):
            if item.expand and item.phases:
                out += state_access_order(item.phases)
            else:
                out += [(e.state, e.access, item.path) for e in item.effects]
        elif isinstance(item, LoopNode):
            out += state_access_order(item.body)
    return out


_PAST = {Access.READ: "read", Access.UPDATE: "updated", Access.REFRESH: "refreshed"}


def _loop_kind(loop: LoopNode) -> LoopKind:
    reasons: list[str] = []
    if loop.dynamic:
        reasons.append(f"ends on a condition (until {unparse(loop.until)}; analysed through its first "  # type: ignore[arg-type]
                       f"{REPRESENTATIVE} iterations, which show every edge kind it has)")
    for c in loop.carries:
        reasons.append(f"carries '{c.name}'")
    accesses = state_access_order(loop.body)
    free_notes = []
    for state in dict.fromkeys(s for s, _, _ in accesses):
        seq = [(a, p) for s, a, p in accesses if s == state]
        writers = [p for a, p in seq if a.writes]
        if not writers:
            continue
        first, first_at = seq[0]
        if first is Access.REFRESH:
            free_notes.append(f"'{state}' refreshed by {first_at[-1]} at the start")
        else:
            reasons.append(f"'{state}' {_PAST[first]} by {first_at[-1]}, written by {writers[-1][-1]}")
    if reasons:
        return LoopKind(loop.path, "dependent", tuple(reasons))
    if not free_notes:
        free_notes.append("iterations share no carried value and no written state")
    return LoopKind(loop.path, "free", tuple(free_notes))


def loop_kinds(wf: Workflow) -> dict[Path, LoopKind]:
    return {item.path: _loop_kind(item) for item in wf.items() if isinstance(item, LoopNode)}


# -- the summary --------------------------------------------------------------------------------

@dataclass(frozen=True)
class ItemEdge:
    producer: Path
    consumer: Path
    kind: str  # data | state
    relation: str  # "same iteration", "previous iteration of step", "iteration update.i of epoch", ...
    detail: str
    flow: bool = True


@dataclass
class Analysis:
    workflow: Workflow
    loops: dict[Path, LoopKind]
    edges: list[ItemEdge]
    versions: list[str]  # the policy-version rule, one line per (state, reader)
    accessors: dict[str, list[tuple[Path, Access]]]


def _relation(pairs: list[tuple[Invocation, Invocation]], loops: Mapping[Path, tuple[Path, ...]],
              counts: Mapping[Path, int], dynamic: frozenset[Path] = frozenset()) -> str:
    """Describe how a producer's loop iterations relate to its consumer's, over every edge of a group:
    `same iteration`, `previous iteration of step`, `epoch = update.i`, `every step`, `epoch 0`, and,
    when one iteration of a loop of the consumer's alone depends, `into step 0`. The iterations of a loop
    that ends on a condition are representative: `first step`, never `step 0`."""
    p0, c0 = pairs[0]
    pl, cl = loops[p0.path], loops[c0.path]
    parts = []
    for n, loop in enumerate(pl):
        name = "RL iteration" if n == 0 else loop[-1]
        shared = n < len(cl) and cl[n] == loop
        diffs = {p.indices[n] - c.indices[n] for p, c in pairs} if shared else set()
        if shared and diffs == {0}:
            continue
        if shared and diffs == {-1}:
            parts.append("previous RL iteration" if n == 0 else f"previous iteration of {name}")
            continue
        values = sorted({p.indices[n] for p, _ in pairs})
        match = next((m for m in range(len(cl)) if (not shared or m != n) and
                      all(p.indices[n] == c.indices[m] for p, c in pairs)), None)
        if match is not None and len(values) > 1:
            parts.append(f"{name} = {cl[match][-1]}.i")
        elif len(values) == 1 and n > 0 and values[0] == counts.get(loop, -1) - 1 and values[0] > 0:
            parts.append(f"last {name}")
        elif len(values) == 1 and loop in dynamic:
            parts.append(f"first {name}" if values[0] == 0 else f"a later {name}")
        elif len(values) == 1:
            parts.append(f"{name} {values[0]}")
        else:
            parts.append(f"every {name}")
    for m, loop in enumerate(cl):  # the consumer's own loops: say when only one of their iterations depends
        values = sorted({c.indices[m] for _, c in pairs})
        if loop in pl or m == 0 or len(values) != 1 or counts.get(loop, 0) < 2:
            continue
        v, name = values[0], loop[-1]
        which = (f"last {name}" if v == counts[loop] - 1 else f"first {name}" if v == 0 and loop in dynamic
                 else f"{name} {v}")
        parts.append(f"into {which}")
    return ", ".join(parts) if parts else "same iteration"


def analyze(wf: Workflow, explain: bool = False, count_limit: int = 3) -> Analysis:
    """Loop kinds, accessors and the policy-version rule; with `explain`, also item-level edges."""
    kinds = loop_kinds(wf)
    accessors: dict[str, list[tuple[Path, Access]]] = defaultdict(list)
    for item in wf.items():
        if isinstance(item, ExecutionNode):
            for e in item.effects:
                accessors[e.state].append((item.path, e.access))
    edges: list[ItemEdge] = []
    versions: list[str] = []
    if True:  # the policy-version lines need the invocation graph even without --explain
        # without --explain only the version lines need the graph: one iteration of each loop shows them
        clamped = representative(_clamped(wf, count_limit if explain else 1))
        dynamic = frozenset(i.path for i in wf.items() if isinstance(i, LoopNode) and i.dynamic)
        counts = {i.path: len(i.indices()) for i in clamped.items() if isinstance(i, LoopNode)}
        g = invocation_graph(clamped, iterations=2)
        items = Resolver(clamped).items
        loops = {p: enclosing_loops(p, items) for p in {i.path for i in g.order}}
        if explain:
            grouped: dict[tuple, list[tuple[Invocation, Invocation]]] = defaultdict(list)
            for p, c, dep in g.edges():
                if c.indices[0] != 1:
                    continue  # describe the second RL iteration: it has a predecessor
                cross = p.indices[0] != c.indices[0]
                grouped[(p.path, c.path, dep.kind, dep.detail, dep.flow, cross)].append((p, c))
            for (pp, cp, kind, detail, flow, _), pairs in sorted(grouped.items()):
                edges.append(ItemEdge(pp, cp, kind, _relation(pairs, loops, counts, dynamic), detail, flow))
        versions = _versions(g)
    return Analysis(wf, kinds, edges, versions, dict(accessors))


def _versions(g: InvocationGraph) -> list[str]:
    """For each state read in RL iteration k whose value was written in iteration k-1: who wrote it."""
    lines: dict[tuple[str, Path], str] = {}
    for state, seq in g.accesses.items():
        writer: Invocation | None = None
        for inv, acc in seq:
            if inv.indices[0] == 1 and acc.reads_previous and writer is not None and writer.indices[0] == 0:
                key = (state, inv.path)
                if key not in lines:
                    lines[key] = (f"{state}: '{inv.path[-1]}' of RL iteration k {'reads' if acc is Access.READ else 'updates'} "
                                  f"the value written by '{writer.path[-1]}' ({g.node[writer].call}) of iteration k-1")
            if acc.writes:
                writer = inv
    return list(lines.values())
