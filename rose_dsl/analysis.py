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

import itertools
import threading
from collections import Counter, OrderedDict, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from .bulk import in_bulk
from .expr import IterRef, Ref, unparse, walk
from .identity import StateKey
from .ir import Access, ExecutionNode, Item, LoopNode, MergeNode, Workflow
from .resolve import Resolver, expr_fields
from .semantics import CallSite, Invocation, Program, ValueOps, enclosing_loops, run_sequential
from .until import REPRESENTATIVE, representative

__all__ = [
    "Dep", "Deps", "DepOps", "InvocationGraph", "invocation_graph", "clear_graph_cache", "representative",
    "REPRESENTATIVE", "LoopKind", "ItemEdge", "Analysis", "analyze", "loop_kinds", "state_access_order", "effect_key", "AfterOrder",
    "state_observations", "run_in", "read_lag", "read_lags", "writer_lags", "iterations_in_flight",
]

Path = tuple[str, ...]


class Dep(NamedTuple):
    """Why `consumer` must run after `producer`. kind: 'data', 'state' or 'after' (an `after:`, which observes nothing). For state deps `flow` is True
    when the consumer observes the producer's value (read/update after a write) and False when the order
    only protects an in-place object (a write after a read, a refresh after a write). A named tuple:
    graphs hold thousands, and the tracker interns them."""

    kind: str
    detail: str  # what a message shows: "in.PORT <- producer.port", "update: after rollout", "sim.episode: ..."
    flow: bool = True
    # what the detail says, as values (`_DepTracker._reason`): (consumer port, producer, producer port) of a
    # data dependency, (the item that has the `after:`, the sibling it names) of an `after` one
    parts: tuple[str, ...] = ()

    @property
    def input_field(self) -> str | None:
        """A data dependency's consumer field, `in.PORT`; None for a state or an `after:` one."""
        return f"in.{self.parts[0]}" if self.kind == "data" else None

    @property
    def produced(self) -> str | None:
        """A data dependency's producer and its port, `producer.port`; None for a state or an `after:` one."""
        return f"{self.parts[1]}.{self.parts[2]}" if self.kind == "data" else None


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


class Deps(frozenset):
    """A symbolic value: the (invocation, port) pairs it was computed from."""


def _union(values: Iterable[Any]) -> frozenset:
    sets = [v if isinstance(v, frozenset) else _union(v) for v in values if isinstance(v, frozenset | list)]
    return _NOTHING.union(*sets)  # a list: every iteration of a loop


_NOTHING = Deps()


class DepOps:
    """The dependency interpretation of values (`semantics.ValueOps`): whatever combines values
    depends on all of them; a slice depends on what it slices."""

    def stack(self, values: Sequence[Any]) -> Any:
        return _union(values)

    def cat(self, values: Sequence[Any], dim: int = 0) -> Any:
        return _union(values)

    def record(self, fields: Mapping[str, Any]) -> Any:
        return _union(fields.values())

    def slice(self, value: Any, start: int | None, stop: int | None) -> Any:
        return value

    def truth(self, value: Any) -> bool:
        return True  # unreached: dynamic loops are made static first (`representative`)


class AfterOrder:
    """What `after:` adds to program order: an item with `after: [s]` runs every call inside it after
    every call inside its earlier sibling `s`, in the same iterations of the loops around both (a merge
    stands for the groups it merges). Feed it the call sites in program order (`visit`); it answers
    with the earlier calls each one must follow. The analysis, the runtime's schedule and the
    reference interpreter all ask this one place."""

    def __init__(self, items: Mapping[Path, Item]) -> None:
        def expand(path: Path) -> list[Path]:
            item = items.get(path)
            if isinstance(item, MergeNode):
                return [p for src in item.sources for p in expand(path[:-1] + (src,))]
            return [path]

        self._after = {path: tuple((name, target) for name in item.after for target in expand(path[:-1] + (name,)))
                       for path, item in items.items() if item.after}
        self._targets = {target for pairs in self._after.values() for _, target in pairs}
        self._inside: dict[tuple[Path, tuple], list[Invocation]] = defaultdict(list)

    def visit(self, site: CallSite) -> list[tuple[Invocation, tuple[str, str]]]:
        """Record a call and return the earlier calls it must follow, each with the reason: the item that
        says `after:` (the call's node or a loop around it) and the sibling it names."""
        if not self._after:
            return []
        out: list[tuple[Invocation, tuple[str, str]]] = []
        path = site.inv.path
        for n in range(2, len(path) + 1):  # the items around the call, and the call's node
            prefix = path[:n]
            outer = tuple(i for loop, i in site.ctx.items() if len(loop) < n)  # the iterations of the loops around it
            for name, target in self._after.get(prefix, ()):
                out.extend((inv, (prefix[-1], name)) for inv in self._inside.get((target, outer), ()))
            if prefix in self._targets:
                self._inside[(prefix, outer)].append(site.inv)
        return out


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
        overwritten unobserved may move freely among the writes around it; a split group's refresh
        (a node with `rows`) overwrites only its rows, so it hides nothing.

    Costs are linear in calls plus edges: a `Dep` is made once per distinct reason (interned), and a
    refresh remembers only where its run of unobserved writes ends, not a copy of it.
    """

    ops: ValueOps = DepOps()

    def __init__(self, graph: InvocationGraph, items: Mapping[Path, Item]) -> None:
        self.g = graph
        self._order = AfterOrder(items)
        self._last_writer: dict[str, tuple[Invocation, str]] = {}  # state -> (call, its access mode)
        self._readers: dict[str, list[tuple[Invocation, str]]] = defaultdict(list)  # since the last write
        self._unobserved_writes: dict[str, list[tuple[Invocation, str]]] = defaultdict(list)
        # a refresh to check at the end: (state, its position in accesses[state], the unobserved writes
        # before it = the first `n` of that list)
        self._pending: list[tuple[str, int, list[tuple[Invocation, str]], int]] = []
        self._reasons: dict[tuple, Dep] = {}
        self._effects: dict[Path, tuple[tuple[str, Access, str], ...]] = {}

    def call(self, site: CallSite, inputs: dict[str, Any]) -> dict[str, Any]:
        g, node, inv = self.g, site.node, site.inv
        g.order.append(inv)
        g.node[inv] = node
        reasons, deps = self._reasons, None
        for port, value in inputs.items():
            if not isinstance(value, frozenset):
                continue  # an integer (a loop index, a param)
            for producer, out_port in value:
                if deps is None:
                    deps = g.deps[inv]
                key = ("data", port, producer.path[-1], out_port)
                self._add_to(deps, producer, reasons.get(key) or self._reason(key))
        for earlier, reason in self._order.visit(site):
            self._add(inv, earlier, self._reason(("after", *reason)))
        effects = self._effects.get(node.path)
        if effects is None:  # access modes as plain strings: Enum properties cost a Python call each
            effects = self._effects[node.path] = tuple((e.state, e.access, e.access.value) for e in node.effects)
        for state, access, mode in effects:
            self._access(inv, state, access, mode)
        return {port: Deps(((inv, port),)) for port in node.outputs}

    def _access(self, inv: Invocation, s: str, access: Access, mode: str) -> None:
        seq = self.g.accesses[s]
        seq.append((inv, access))
        last = self._last_writer.get(s)
        reads_previous = mode != "refresh"
        if reads_previous and last is not None and last[0] != inv:
            self._add(inv, last[0], self._reason(("state", s, mode, last[1], True)))
        if mode != "read":  # a write
            for reader, reader_mode in self._readers[s]:
                if reader != inv and not (reads_previous and last is not None and reader == last[0]):  # that one flows already
                    self._add(inv, reader, self._reason(("state", s, mode, reader_mode, False)))
            if mode == "refresh":
                unobserved = self._unobserved_writes[s]
                self._pending.append((s, len(seq) - 1, unobserved, len(unobserved)))
            self._last_writer[s] = (inv, mode)
        if mode == "read":
            self._readers[s].append((inv, mode))
            self._unobserved_writes[s] = []
        elif mode == "update":
            self._readers[s] = [(inv, mode)]
            self._unobserved_writes[s] = [(inv, mode)]
        else:
            self._readers[s] = []
            self._unobserved_writes[s].append((inv, mode))

    def finish(self) -> None:
        """Add the write-after-write edges of the refreshes whose value is observed."""
        for state, position, unobserved, n in self._pending:
            seq = self.g.accesses[state]
            inv = seq[position][0]
            # observed unless a later refresh in the same RL iteration overwrites all of its rows before
            # anything reads them (a reader observes it; at the end of the RL iteration a checkpoint does;
            # a row group's refresh hides only its own rows). Walked by index, stopping at the first
            # reader: the walk is as long as the run of unread refreshes, never a copy of the rest.
            rows = self.g.node[inv].plan.rows
            observed = True
            for at in range(position + 1, len(seq)):
                later_inv, later = seq[at]
                if later_inv.indices[0] != inv.indices[0] or later is not Access.REFRESH:
                    break  # the end of the RL iteration (a checkpoint) or a reader observes it
                if _covers(self.g.node[later_inv].plan.rows, rows):
                    observed = False  # overwritten unobserved
                    break
            if observed:
                for w, w_mode in unobserved[:n]:
                    if w != inv:
                        self._add(inv, w, self._reason(("state", state, "refresh", w_mode, False)))
        self._pending.clear()

    def _reason(self, key: tuple) -> Dep:
        """The `Dep` for a reason, made once: ("data", port, producer, its port), ("after", the item that
        says it, the sibling it names) or ("state", state, access, the other call's access, flow)."""
        dep = self._reasons.get(key)
        if dep is None:
            if key[0] == "data":
                _, port, producer, out_port = key
                dep = Dep("data", f"in.{port} <- {producer}.{out_port}", True, (port, producer, out_port))
            elif key[0] == "after":
                _, owner, name = key
                dep = Dep("after", f"{owner}: after {name}", False, (owner, name))
            else:
                _, state, access, mode, flow = key
                dep = Dep("state", f"{state}: {access} after {mode}", flow)
            self._reasons[key] = dep
        return dep

    def _add(self, consumer: Invocation, producer: Invocation, dep: Dep) -> None:
        self._add_to(self.g.deps[consumer], producer, dep)

    @staticmethod
    def _add_to(deps: dict[Invocation, set[Dep]], producer: Invocation, dep: Dep) -> None:
        why = deps.get(producer)
        if why is None:
            deps[producer] = {dep}
        else:
            why.add(dep)


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
            if type(e) is Ref:
                continue  # most inputs: no iteration reference inside
            for x in walk(e):
                if isinstance(x, IterRef) and x.index.kind == "int":
                    needed[x.loop] = max(needed[x.loop], x.index.value + 1)

    def clamp(item: Item) -> Item:
        if isinstance(item, LoopNode):
            body = tuple(clamp(c) for c in item.body)
            if item.path == wf.root.path or item.count is None or item.plan.iterations is not None:
                return replace(item, body=body)
            return replace(item, body=body, count=min(item.count, max(limit, needed[item.name])))
        if isinstance(item, ExecutionNode) and item.phases:
            return replace(item, phases=tuple(clamp(c) for c in item.phases))
        return item

    return replace(wf, root=clamp(wf.root))  # type: ignore[arg-type]


_RECENT: OrderedDict[tuple, tuple[Workflow, InvocationGraph]] = OrderedDict()  # see invocation_graph
_RECENT_KEPT = 4
_RECENT_LOCK = threading.Lock()


def invocation_graph(wf: Workflow, iterations: int = 2, count_limit: int | None = None,
                     expand_phases: bool = False, edges: bool = True) -> InvocationGraph:
    """Dependencies of every invocation over `iterations` consecutive RL iterations (0..n-1); a loop
    that ends on a condition is analysed through representative iterations (`representative`).

    With `edges=False` only program order and the state accesses are recorded (what the policy-version
    lines need): no input is evaluated, which is most of the cost.

    The last few graphs are kept, by workflow identity: an optimizer checks thousands of candidate
    rewrites of one plan, each against the graph of that same plan. A graph may thus be shared between
    callers: treat it as read-only (`clear_graph_cache` drops them)."""
    key = (id(wf), iterations, count_limit, expand_phases, edges)
    with _RECENT_LOCK:
        hit = _RECENT.get(key)
        if hit is not None and hit[0] is wf:  # the entry holds `wf`, so its id cannot have been reused
            _RECENT.move_to_end(key)
            return hit[1]
    graph = _invocation_graph(wf, iterations, count_limit, expand_phases, edges)
    with _RECENT_LOCK:
        _RECENT[key] = (wf, graph)
        while len(_RECENT) > _RECENT_KEPT:
            _RECENT.popitem(last=False)
    return graph


def clear_graph_cache() -> None:
    """Forget the graphs `invocation_graph` keeps (benchmarks time the cold path this way)."""
    with _RECENT_LOCK:
        _RECENT.clear()


@in_bulk
def _invocation_graph(wf: Workflow, iterations: int, count_limit: int | None, expand_phases: bool,
                      edges: bool) -> InvocationGraph:
    wf = representative(_clamped(wf, count_limit))
    if expand_phases:
        wf = replace(wf, root=_expand_all(wf.root))
    graph = InvocationGraph()
    program = Program(wf)
    if not edges:
        for k in range(iterations):
            sites = program.unroll(k, _one_iteration, 0, k < iterations - 1)  # as the dependency run: truth() is
            # always True; and the last iteration runs nothing ahead, as before the end of a run
            if k == iterations - 1 and program.depth > 1:  # and what is still deferred, at the end
                sites = itertools.chain(sites, program.drain(k))
            for site in sites:
                graph.order.append(site.inv)
                graph.node[site.inv] = site.node
                for eff in site.node.effects:
                    graph.accesses[eff.state].append((site.inv, eff.access))
        return graph
    tracker = _DepTracker(graph, program.items)
    run_sequential(program, tracker, range(iterations))
    tracker.finish()
    return graph


def _one_iteration(loop: LoopNode, ctx: Mapping[Path, int]) -> bool:
    return True


def _expand_all(item: Item) -> Any:
    if isinstance(item, LoopNode):
        return replace(item, body=tuple(_expand_all(c) for c in item.body))
    if isinstance(item, ExecutionNode) and item.phases:
        return replace(item, plan=replace(item.plan, expand=True), phases=tuple(_expand_all(c) for c in item.phases))
    return item


# -- loop kinds ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class LoopKind:
    path: Path
    kind: str  # "free" | "dependent"
    reasons: tuple[str, ...]


def effect_key(node: ExecutionNode, state: str) -> StateKey:
    """The key of the state object `state` (an analysis's spelling, `StateEffect.state`) that `node` accesses."""
    return next(e.key for e in node.effects if e.state == state)


def state_access_order(items: Sequence[Item]) -> list[tuple[StateKey, Access, Path]]:
    """State accesses of one pass over a body, in program order (nested loops: one iteration)."""
    out: list[tuple[StateKey, Access, Path]] = []
    for item in items:
        if isinstance(item, ExecutionNode):
            if item.plan.expand and item.phases:
                out += state_access_order(item.phases)
            else:
                out += [(e.key, e.access, item.path) for e in item.effects]
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
        g = invocation_graph(clamped, iterations=2, edges=explain)
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
    versions += _lag_lines(wf)
    return Analysis(wf, kinds, edges, versions, dict(accessors))


# -- state flow: which write each state access observes (the legality check's oracle and the lags that
# asynchronous plans and `max_staleness` prove); here, below the rewrites, because `analyze` reports the lags


_ALL = 1 << 62  # "every row": the end of a state object no row group bounds


def state_observations(g: InvocationGraph) -> tuple[dict[tuple[Invocation, str], frozenset[Invocation | None]],
                                                     dict[tuple[int, str], frozenset[Invocation | None]]]:
    """Which calls' values each state access sees, and which are left at the end of each RL iteration.

    Per state object, in program order (the order its component runs its calls): a `read` or `update`
    sees the last write of each of its rows (None: the value before the first iteration); a write
    replaces its rows (a row group's write only its own rows). Two workflows whose accesses see the same
    writes, and leave the same, compute the same state from the same inputs -- the exact condition a
    reordering must keep, where an order between every two conflicting accesses is a conservative one.
    """
    seen: dict[tuple[Invocation, str], frozenset[Invocation | None]] = {}
    left: dict[tuple[int, str], frozenset[Invocation | None]] = {}
    slots = run_in(g)
    last = max((slots.get(inv, inv.indices[0]) for inv in g.order), default=-1)
    for state, seq in g.accesses.items():
        # every row: up to the end of the row groups that touch this state (their batch), if any do
        end = max((r[1] for r in (g.node[inv].plan.rows for inv, _ in seq) if r is not None), default=_ALL)
        segments: list[tuple[int, int, Invocation | None]] = [(0, end, None)]
        k: int | None = None
        for inv, acc in seq:
            slot = slots.get(inv, inv.indices[0])
            if k is not None and slot != k:
                left[(k, state)] = frozenset(w for _, _, w in segments)
            # an RL iteration that touches the state not at all (a plan whose only access is deferred out of
            # it) leaves what the one before it left: the initial value before the first access
            for idle in range(0 if k is None else k + 1, slot):
                left[(idle, state)] = frozenset(w for _, _, w in segments)
            k = slot
            lo, hi = g.node[inv].plan.rows or (0, end)
            if acc.reads_previous:
                seen[(inv, state)] = frozenset(w for a, b, w in segments if a < hi and lo < b)
            if acc.writes:
                kept = [(a, min(b, lo), w) for a, b, w in segments if a < lo]
                kept += [(max(a, hi), b, w) for a, b, w in segments if b > hi]
                segments = sorted(kept + [(lo, hi, inv)], key=lambda x: x[0])
        # and the RL iterations after its last access leave what that one left (a plan whose last iteration's
        # access ran in the one before: a call run ahead)
        for idle in range(0 if k is None else k, last + 1):
            left[(idle, state)] = frozenset(w for _, _, w in segments)
    return seen, left


def run_in(g: InvocationGraph) -> dict[Invocation, int]:
    """The RL iteration in whose place each call runs, where it is not its own: a deferred call (`defer:`)
    of iteration k runs in a later one (in program order, after every call of an iteration comes the next);
    a call run ahead (`ahead: a`) of iteration k in iteration k-a, except the first iteration's own."""
    slots: dict[Invocation, int] = {}
    k = 0
    for inv in g.order:
        ahead = g.node[inv].plan.ahead
        if ahead:
            place = max(k, inv.indices[0] - ahead)
            if place != inv.indices[0]:
                slots[inv] = place
        elif inv.indices[0] > k:
            k = inv.indices[0]
        elif inv.indices[0] < k:
            slots[inv] = k
    return slots


def read_lags(wf: Workflow) -> dict[tuple[str, tuple[str, ...]], int]:
    """Per (state object, reading node): the largest lag, in RL iterations, this workflow's reads prove
    against the same workflow run synchronously (its `defer:`s and `ahead:`s removed) -- 0 for a synchronous
    plan: the larger of how much older the write it sees is (`writer_lags`) and how many learner updates
    older the value is, followed through every sync, relay and derived state (`versions.version_proof`).
    A read that sees another value than any older one of the declared read is not listed (the legality
    check refuses such plans)."""
    from .versions import version_proof

    out = writer_lags(wf)
    for (reader, state), proof in version_proof(wf).items():
        key = (state, reader.path)
        if key in out and proof.lag > out[key]:
            out[key] = proof.lag
    return out


def writer_lags(wf: Workflow) -> dict[tuple[str, tuple[str, ...]], int]:
    """Per (state object, reading node): how many RL iterations older than the synchronous run's the write
    each read sees is, counting that state's own writes (what the legality oracle's per-state check spends;
    a value's age through relays is `read_lags`')."""
    depth = iterations_in_flight(wf)
    sync = replace(wf, root=replace(wf.root, body=tuple(
        replace(i, plan=replace(i.plan, defer=0, ahead=0)) if isinstance(i, ExecutionNode) else i for i in wf.root.body)))
    seen0, _ = state_observations(invocation_graph(sync, iterations=1 + depth))
    seen1, _ = state_observations(invocation_graph(wf, iterations=1 + depth))
    out: dict[tuple[str, tuple[str, ...]], int] = {}
    for (reader, state), got in seen1.items():
        def then(lag: int, r: Invocation = reader, s: str = state) -> frozenset[Invocation | None]:
            k = r.indices[0] - lag
            return seen0.get((r._replace(indices=(k,) + r.indices[1:]), s), frozenset()) if k >= 0 else frozenset({None})

        lag = 0 if got == seen0.get((reader, state)) else read_lag(got, then, reader.indices[0] + 1)
        if lag is not None:
            out[(state, reader.path)] = max(lag, out.get((state, reader.path), 0))
    return out


def iterations_in_flight(wf: Workflow) -> int:
    """1 + the largest `defer` + the largest `ahead` of a workflow: how many RL iterations an asynchronous
    plan overlaps (`semantics.Program.depth`)."""
    nodes = [i for i in wf.root.body if isinstance(i, ExecutionNode)]
    return 1 + max((i.plan.defer for i in nodes), default=0) + max((i.plan.ahead for i in nodes), default=0)


def read_lag(got: frozenset[Invocation | None], then: Callable[[int], frozenset[Invocation | None]],
             most: int) -> int | None:
    """The smallest lag L in 1..most such that `got` is what the declared read saw L RL iterations earlier
    (`then(L)`); None if none is (the value is not an older one of the same read: another write)."""
    return next((lag for lag in range(1, most + 1) if then(lag) == got), None)


def _lag_lines(wf: Workflow) -> list[str]:
    """Per read of a state object with `max_staleness`, or of an asynchronous plan (`defer:`): the lag it
    proves -- how many RL iterations older than the declared read's value the value it sees can be -- and,
    where the value's learner updates give it, the chain they came through (`versions.py`)."""
    budgets = {s.key: s.max_staleness for s in wf.state_objects().values()}
    deferred = any(isinstance(i, ExecutionNode) and (i.plan.defer or i.plan.ahead) for i in wf.root.body)
    if not deferred and not any(budgets.values()):
        return []
    from .versions import chain_text, version_proof

    lines = []
    lags = read_lags(wf)
    chains: dict[tuple[str, Path], tuple[int, str]] = {}  # the chain of each read's largest version lag
    for (inv, state), proof in version_proof(wf).items():
        if proof.lag and proof.lag >= chains.get((state, inv.path), (0, ""))[0]:  # the latest: a steady one
            chains[(state, inv.path)] = (proof.lag, chain_text(proof))
    short = Counter(r[-1] for r in {reader for _, reader in lags})  # a name two readers share (a split's groups): its path
    for (state, reader), lag in sorted(lags.items()):
        node = next((i for i in wf.items() if i.path == reader), None)
        reads = isinstance(node, ExecutionNode) and any(e.state == state and e.access is Access.READ for e in node.effects)
        name = reader[-1] if short[reader[-1]] == 1 else ".".join(reader[1:])
        if reads and (lag or budgets.get(state)):
            lines.append(f"{state}: '{name}' reads a value at most {lag} RL iteration{'s' * (lag != 1)} older than "
                         f"the synchronous workflow's (lag {lag}, max_staleness {budgets.get(state, 0)})"
                         + (f": {chains[(state, reader)][1]}" if lag and chains.get((state, reader), (0, ""))[0] == lag else ""))
    return lines


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
