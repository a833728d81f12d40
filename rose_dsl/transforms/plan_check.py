"""A plan checked against its source workflow: every dependency of the source must hold in the plan.

A plan is a workflow file that anyone may edit by hand, so its rewrites are not trusted: the plan is
compared with the workflow it says it was made from (`plan: source:`), at invocation granularity, over
two RL iterations (like the legality oracle), with every exposed phase run:

* every call of the source runs in the plan, once -- or once per row group, the groups' rows
  partitioning the batch -- as the same component method (a copy of the component for a temporal
  group), with the same state effects, outputs and batch declaration;
* every data dependency of the source reaches each of the consumer's row groups from producer groups
  whose rows cover the consumer's, and the plan has no data dependency the source lacks (same ports);
* every state access sees the values of the same calls as in the source (per row group), and each RL
  iteration leaves the same calls' values: the runtime runs each component's calls in program order,
  so this is what its state accesses observe (a temporal split's copy of a component is a state object
  of its own, whose values no call of another copy sees);
* a temporal group's copy may be seeded from the original's state (`seeds.py`): a seed get reads state
  of a component, a seed set refreshes the same state objects of a copy of it from that get; its
  write counts as what the get read;
* loops that end on a condition are kept, with the same condition; merges take their groups in row
  order.

Plan invocations are traced to source ones through the plan's own annotations: a group is its
`split_of` (its iteration numbers are the source's), an item a rewrite moved names where it came from
(`moved_from`). Dependencies are tracked per row group; which rows a group reads is checked apart
(`_RowsOf`): every input of a row group, and a carried value's first and next values, hold the group's
rows where static slices and `cat`s say which (a slice bounded by a param, or of a stacked value, is not
followed). Not checked: the values components compute.

The recorded `plan: source:` is anyone's edit too: it is read relative to the plan (then the working
directory), and a file that is not a workflow is refused naming its path only, never its content.
"""

from __future__ import annotations

import os
import stat
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path as FilePath
from typing import Any

from ..analysis import (
    Dep,
    InvocationGraph,
    effect_key,
    invocation_graph,
    iterations_in_flight,
    read_lag,
    state_observations,
)
from ..errors import Diagnostic, SourcePos, WorkflowError
from ..expr import BinOp, Call, Expr, Int, IterRef, Neg, Param, Ref, Slice, unparse
from ..ir import (
    Access,
    Component,
    ExecutionNode,
    Item,
    LoopNode,
    MergeNode,
    StateObject,
    Workflow,
    iter_items,
)
from ..loader import load_text
from ..resolve import CarryIn, IterSelect, LoopIndex, NodePort, ParentInput, Resolver, binding_table
from ..semantics import Invocation, SemanticError, interleaved_run
from ..versions import over_budget_reads
from .ahead import ahead_without_producers
from .deferral import MAX_DEFER
from .legality import (
    describe_invocation,
    over_budget,
    staleness_budgets,
    values_of,
    version_refusal,
)
from .refs import RefUse, batch_dim, binding_target, map_field, rename_ref
from .seeds import SEED_GET, SEED_PORT, SEED_SET, is_seed, through_seeds
from .tree import source_paths

__all__ = ["PlanDifference", "plan_differences", "check_plan_source", "recorded_source"]

Path = tuple[str, ...]
Rows = tuple[int, int] | None
MAX_SHOWN = 12


@dataclass(frozen=True)
class PlanDifference:
    pos: SourcePos
    path: str  # the plan item, dotted
    message: str


def _rows(node: ExecutionNode) -> Rows:
    return node.plan.rows


def _overlap(a: Rows, b: Rows) -> bool:
    return a is None or b is None or (a[0] < b[1] and b[0] < a[1])


def _covers(parts: list[Rows], want: Rows, size: int | None) -> bool:
    if any(p is None for p in parts):
        return True
    lo, hi = want if want is not None else (0, size if size is not None else max((p[1] for p in parts if p), default=0))
    for a, b in sorted(p for p in parts if p is not None):
        if a > lo:
            return False
        lo = max(lo, b)
    return lo >= hi


def _key(dep: Dep) -> tuple[str, str]:
    """(consumer input, producer port) of a data dependency, whatever the producer is called."""
    return f"in.{dep.parts[0]}", dep.parts[2]


class _Checker:
    def __init__(self, source: Workflow, plan: Workflow) -> None:
        self.source, self.plan = source, plan
        self.src_items = {i.path: i for i in source.items()}
        self.plan_items = {i.path: i for i in plan.items()}
        self.origin = source_paths(plan)
        self.out: list[PlanDifference] = []
        self._resolver: Resolver | None = None

    def differ(self, item: Item | None, message: str, field: str | None = None, at: SourcePos | None = None) -> None:
        """A difference at `item` (at its `field`'s position when it has one: the value to fix), or `at`."""
        pos = item.pos if item is not None else at or SourcePos(self.plan.file, 0, 0)
        if item is not None and field is not None:
            pos = item.field_pos.get(field, pos)
        path = ".".join(item.path[1:]) if item is not None else "<plan>"
        self.out.append(PlanDifference(pos, path + (f".{field}" if item is not None and field else ""), message))

    def run(self) -> list[PlanDifference]:
        self.items()
        if not self.out:
            self.ahead()
        if not self.out:
            self.defer_bounds()
        if self.out:
            return self.out  # the calls do not correspond: comparing dependencies would only repeat it
        n = 1 + iterations_in_flight(self.plan)  # a deferred call of iteration k runs in k+defer: show it
        g0 = invocation_graph(self.source, iterations=n, expand_phases=True)
        try:
            g1 = invocation_graph(self.plan, iterations=n, expand_phases=True)
        except SemanticError as exc:  # e.g. loops made to take turns (`interleave: true`) that depend on each other
            item = self.plan_items.get(exc.at.path) if exc.at is not None else None
            self.differ(item, f"in the plan's program order a call reads a value before its producer runs ({exc}): "
                              "the runtime could not run it")
            return self.out
        self.turns_of_dynamic_loops()
        if self.out:
            return self.out
        images = self.calls(g0, g1)
        if not self.out:
            self.data(g0, g1, images)
            self.state(g0, g1, images)
        if not self.out:
            self.versions()
        if not self.out:
            self.rows()
        return self.out

    def versions(self) -> None:
        """Every read of an asynchronous plan derives from learner updates at most its state's budget older
        than the synchronous run's, followed through syncs, relays and derived states (`versions.py`): each
        state's own writes may lag within budget while a value two syncs away lags their sum."""
        budgets = {k: self.source_budget(obj) for k, obj in self.plan.state_objects().items()}
        for proof in over_budget_reads(self.plan, budgets)[:1]:
            self.differ(self.plan_items.get(proof.reader.path),
                        version_refusal(None, proof, budgets.get(proof.state, 0)),
                        "state")

    def source_budget(self, state: StateObject) -> int:
        """The source's `max_staleness` of a plan state object (a copy's: its original's)."""
        original = str(state.state_key.on(self.component_of(state.component)))
        obj = self.source.state_objects().get(original)
        return obj.max_staleness if obj is not None else 0

    def defer_bounds(self) -> None:
        """A `defer: K` larger than every budget of the source can never be legal (each read of what the node
        writes, or the value an RL iteration leaves of it, would be K RL iterations old), nor one not below the
        RL iteration count, nor one past `MAX_DEFER`: refused here, before the check unrolls 1 + K RL
        iterations (a hand edit to `defer: 10000` took minutes)."""
        most = max((s.max_staleness for s in self.source.state_objects().values()), default=0)
        count = self.plan.root.count
        for item in self.plan.root.body:
            k = item.plan.defer if isinstance(item, ExecutionNode) else 0
            if not k:
                continue
            its = f"{k} RL iteration{'s' * (k != 1)}"
            # (a node that writes no state may be deferred where nothing reads it: the full check decides it, as
            # the rewrite's legality oracle does; the bounds below still keep its unrolling small)
            if k > most and isinstance(item, ExecutionNode) and any(e.access.writes for e in item.effects):
                self.differ(item, f"'{item.name}' is deferred by {its}, more than any state's budget allows (the "
                                  f"largest max_staleness is {most}): what it writes would be read, or left, {its} "
                                  f"old; give `defer:` at most {most}"
                                  + (" (or none: the source allows no staleness)" if most == 0 else ""), "defer")
            elif count is not None and k >= count:
                self.differ(item, f"'{item.name}' is deferred by {k} RL iterations, not below the RL iteration count "
                                  f"{count}: its call of RL iteration 0 would run only after the last one; give "
                                  f"`defer:` at most {count - 1}", "defer")
            elif k > MAX_DEFER:
                self.differ(item, f"'{item.name}' is deferred by {k} RL iterations: rose checks and runs at most "
                                  f"{MAX_DEFER} in flight; give `defer:` at most {MAX_DEFER}", "defer")

    def ahead(self) -> None:
        """A node run ahead reads only nodes run ahead in its own RL iteration (`ahead.py`): otherwise its
        call of iteration i+1 would read a value iteration i+1 has not produced where it runs."""
        for node, producer in ahead_without_producers(self.plan):
            self.differ(node, f"'{node.name}' runs ahead (`ahead: 1`) but reads '{producer}' of its own RL iteration, "
                              f"which does not: a node runs ahead only with the nodes it reads from (`rose rewrite "
                              f"SOURCE --do \"ahead {node.name}\"` marks them all)", "ahead")

    # -- loops that end on a condition, taking turns --------------------------------------------------
    def turns_of_dynamic_loops(self) -> None:
        """Loops that take turns (`interleave: true`) where one of them is or holds a loop that ends on a
        condition must not depend on each other at all: the dependency check compares the plan with its
        source at representative trip counts (`analysis.representative`), but which loop's call comes last --
        the last write of a state both use -- depends on the trips each runs (a hand edit of two such loops
        that both refresh one state passed the check and left the other loop's value in it)."""
        from .reorder import check_independent
        from .rewritten import Refused

        bodies = [self.plan.root, *(i for i in self.plan.items() if isinstance(i, LoopNode))]
        for parent in bodies:
            body, n = list(parent.body), 0
            while n < len(body):
                run = interleaved_run(body, n)
                n += max(1, len(run))
                if len(run) < 2 or not any(isinstance(i, LoopNode) and i.dynamic for lp in run for i in iter_items(lp)):
                    continue
                try:
                    check_independent(self.plan, [lp.path for lp in run])
                except Refused as exc:
                    self.differ(run[0], f"{exc.reason} -- and a loop among them ends on a condition, so which call "
                                        "runs last depends on the trips each runs", "interleave")

    # -- rows -------------------------------------------------------------------------------------
    def rows(self) -> None:
        """Each row group reads its own rows: an input of a group, and a carried value's first and next
        values, hold the rows the group declares (`_RowsOf`). The dependency check tracks row groups, not
        which rows a slice takes: a hand edit of `reset.obs[32:64]` to `[0:32]` kept every dependency and
        trained the second group on the first group's rows (issue 42)."""
        rows_of = _RowsOf(self.resolver())
        for item in self.plan_items.values():
            if isinstance(item, ExecutionNode) and item.plan.rows is not None:
                for port, e in item.inputs:
                    got = rows_of.field(item, f"in.{port}", e)
                    if isinstance(got, tuple) and got != (item.plan.rows,):
                        self.differ(item, f"row group {list(item.plan.rows)} of '{item.plan.split_of or item.name}' reads "
                                          f"rows {_shown_rows(got)} through its input '{port}' ({unparse(e)})",
                                    f"in.{port}")
                        return  # (one cause: what reads this group's value reads the same rows)
            elif isinstance(item, LoopNode):
                for c in item.carries:
                    first = rows_of.field(item, f"carry.{c.name}.init", c.init)
                    later = rows_of.field(item, f"carry.{c.name}.next", c.next)
                    if isinstance(first, tuple) and isinstance(later, tuple) and first != later:
                        self.differ(item, f"carried value '{c.name}' starts with rows {_shown_rows(first)} "
                                          f"({unparse(c.init)}) and goes on with rows {_shown_rows(later)} "
                                          f"({unparse(c.next)})", f"carry.{c.name}")
                        return

    # -- items ------------------------------------------------------------------------------------
    def component_of(self, name: str) -> str:
        comp = self.plan.components.get(name)
        return comp.copy_of if comp is not None and comp.copy_of else name

    def budgets(self, name: str, comp: Component, original: Component) -> None:
        """The staleness budgets are the source's: the check holds a plan's reads to them, so a plan that
        declares another (a hand edit) would show one budget and be checked against another."""
        for obj in comp.state:
            theirs = original.state_object(obj.name)
            if theirs is not None and obj.max_staleness != theirs.max_staleness:
                self.differ(None, f"state '{name}.{obj.name}' declares max_staleness {obj.max_staleness}, the "
                                  f"source's {theirs.max_staleness}: a budget is the source's (change it there, "
                                  "then rewrite)", at=comp.field_pos.get("state", comp.pos))

    def items(self) -> None:
        for name, comp in self.plan.components.items():
            original = self.source.components.get(self.component_of(name))
            if original is None:
                self.differ(None, f"component '{name}' is not in the source")
            elif (comp.impl, comp.args, [s.name for s in comp.state]) != (original.impl, original.args,
                                                                          [s.name for s in original.state]):
                self.differ(None, f"component '{name}' is not built as the source's '{original.name}' "
                                  "(impl, args or state differ; a plan keeps the args its source had when it "
                                  "was written: a --set that changes them needs the plan written again with it)",
                            at=comp.pos)
            else:
                self.budgets(name, comp, original)
        for path, item in self.plan_items.items():
            if path == self.plan.root.path:
                continue
            if is_seed(item):
                assert isinstance(item, ExecutionNode)
                self.seed(item)
                continue
            src = self.src_items.get(self.origin[path])
            where = ".".join(self.origin[path][1:])
            if isinstance(item, MergeNode):
                self.merge(item)
                continue
            if src is None or type(src) is not type(item):
                self.differ(item, f"has no counterpart in the source (it stands for '{where}')")
            elif isinstance(item, ExecutionNode):
                assert isinstance(src, ExecutionNode)
                self.node(item, src)
            else:
                assert isinstance(src, LoopNode) and isinstance(item, LoopNode)
                self.loop(item, src)

    def node(self, item: ExecutionNode, src: ExecutionNode) -> None:
        comp = self.component_of(item.component)
        effects = {(e.key.name, e.access) for e in item.effects}
        src_effects = {(e.key.name, e.access) for e in src.effects}
        if (comp, item.method) != (src.component, src.method):
            self.differ(item, f"calls {item.call} where the source's '{src.name}' calls {src.call}")
        if effects != src_effects:
            show = ", ".join(f"{s}: {a.value}" for s, a in sorted(src_effects)) or "none"
            self.differ(item, f"its state accesses differ from the source's '{src.name}' ({show})")
        if set(item.outputs) != set(src.outputs) or (item.batch, item.batch_size, item.separable) != (
                src.batch, src.batch_size, src.separable):
            self.differ(item, f"its outputs or batch declaration differ from the source's '{src.name}'")
        if item.plan.rows is not None and (src.batch != 0 or not src.separable):
            self.differ(item, f"is a row group of '{src.name}', which is not declared batch-separable (dim 0)")

    def seed(self, item: ExecutionNode) -> None:
        """A seed get only reads; a seed set only refreshes state objects of a copy of a component (the
        values it sets are checked as state: they count as what its get read)."""
        if item.method == SEED_GET:
            ok = item.outputs == (SEED_PORT,) and not item.inputs and all(e.access is Access.READ for e in item.effects)
        else:
            ok = (self.plan.components.get(item.component) is not None
                  and self.plan.components[item.component].copy_of is not None and not item.outputs
                  and [p for p, _ in item.inputs] == [SEED_PORT]
                  and all(e.access is Access.REFRESH for e in item.effects))
        if not ok or item.plan.rows is not None:
            self.differ(item, f"is not a seed of a temporal group's copy ({SEED_GET}: reads, output '{SEED_PORT}'; "
                              f"{SEED_SET}: on a copy, refreshes, input '{SEED_PORT}')")

    def loop(self, item: LoopNode, src: LoopNode) -> None:
        if item.dynamic != src.dynamic or (item.dynamic and self.as_source(item) != _text(src.until)):
            self.differ(item, f"ends {'on ' + unparse(item.until) if item.until else 'after a count'} where the "
                              f"source's '{src.name}' ends {'on ' + unparse(src.until) if src.until else 'after a count'}")
        if item.dynamic and item.count != src.count:
            self.differ(item, f"runs at most {item.count} iterations where the source's '{src.name}' runs {src.count}")

    def as_source(self, loop: LoopNode) -> str:
        """A plan loop's end condition written with the source's names (each reference renamed to the
        item it stands for), to compare with the source loop's."""
        assert loop.until is not None
        resolver = self.resolver()

        def fn(use: RefUse) -> Expr:
            target = binding_target(use.binding)
            return rename_ref(use, {target: self.origin[target][-1]}) if target in self.origin else use.expr

        return unparse(map_field(resolver, loop, "until", loop.until, fn))

    def resolver(self) -> Resolver:
        if self._resolver is None:
            self._resolver = Resolver(self.plan)
        return self._resolver

    def merge(self, item: MergeNode) -> None:
        parent = item.path[:-1]
        rows = []
        for name in item.sources:
            group = self.plan_items.get(parent + (name,))
            rows.append(_first_rows(group) if group is not None else None)
        if all(r is not None for r in rows) and rows != sorted(rows):  # type: ignore[type-var]
            self.differ(item, f"merges its groups out of row order ({', '.join(item.sources)})")

    # -- calls ------------------------------------------------------------------------------------
    def calls(self, g0: InvocationGraph, g1: InvocationGraph) -> dict[Invocation, list[Invocation]]:
        images: dict[Invocation, list[Invocation]] = defaultdict(list)
        for q in g1.order:
            if is_seed(g1.node[q]):
                continue
            s = Invocation(self.origin[q.path], q.indices)
            if s not in g0.node:
                self.differ(g1.node[q], f"runs {describe_invocation(q, self.plan_items)}, which stands for no call "
                                        f"of the source ({describe_invocation(s, self.src_items)})")
                continue
            images[s].append(q)
        # invocations the plan does not run, one message per source node (a plan cut short misses every
        # invocation of the nodes after the cut: twelve messages of one kind said less than one per node)
        missing: dict[tuple[str, ...], list[Invocation]] = defaultdict(list)
        unpartitioned: dict[tuple[str, ...], list[tuple[Invocation, list[Invocation]]]] = defaultdict(list)
        for s in g0.order:
            qs = images.get(s, [])
            node = g0.node[s]
            if not qs:
                missing[node.path].append(s)
            elif not _partition([g1.node[q].plan.rows for q in qs], node.batch_size):
                unpartitioned[node.path].append((s, qs))
        # one message per source node whose groups do not partition its rows, at the `rows:` of the group
        # that breaks the partition (a hand edit of one group's rows gave one message per invocation, at the
        # first group's line)
        for calls in unpartitioned.values():
            if len(self.out) >= MAX_SHOWN:
                break
            (s, qs), more = calls[0], len(calls) - 1
            shown = ", ".join(f"{describe_invocation(q, self.plan_items)} rows {g1.node[q].plan.rows}" for q in qs)
            culprit = _breaking_group([g1.node[q] for q in qs], g0.node[s].batch_size)
            self.differ(culprit, f"the source's {describe_invocation(s, self.src_items)} runs as {shown}: not once, nor as "
                                 f"row groups that partition its batch of {g0.node[s].batch_size}"
                        + (f" (and so {more} more call{'s' if more > 1 else ''} of it)" if more else ""),
                        "rows" if culprit.plan.rows is not None else None)
        for invocations in missing.values():
            if len(self.out) >= MAX_SHOWN:
                break
            first, more = invocations[0], len(invocations) - 1
            self.differ(g0.node[first], f"the source's {describe_invocation(first, self.src_items)} is not run by the "
                                        "plan" + (f", nor {more} more call{'s' if more > 1 else ''} of it" if more else ""))
        return images

    # -- dependencies -------------------------------------------------------------------------------
    def data(self, g0: InvocationGraph, g1: InvocationGraph, images: dict[Invocation, list[Invocation]]) -> None:
        src_edges = {(p, c, _key(d)) for p, c, d in g0.edges() if d.kind == "data"}
        plan_edges: dict[tuple[Invocation, tuple[str, str]], list[Invocation]] = defaultdict(list)
        for p, c, d in g1.edges():
            if d.kind != "data" or is_seed(g1.node[c]):
                continue
            key = _key(d)
            sp, sc = Invocation(self.origin[p.path], p.indices), Invocation(self.origin[c.path], c.indices)
            plan_edges[(c, key)].append(p)
            if (sp, sc, key) not in src_edges:
                self.differ(g1.node[c], f"{describe_invocation(c, self.plan_items)} reads {d.produced} "
                                        f"of {describe_invocation(p, self.plan_items)} ({d.detail}), which the "
                                        "source's call does not")
                return
        for sp, sc, key in sorted(src_edges, key=str):
            for qc in images[sc]:
                got = [p for p in plan_edges.get((qc, key), []) if Invocation(self.origin[p.path], p.indices) == sp]
                want = g1.node[qc].plan.rows
                if not got or not _covers([g1.node[p].plan.rows for p in got], want, g0.node[sp].batch_size):
                    self.differ(g1.node[qc], f"{describe_invocation(qc, self.plan_items)} does not read "
                                             f"{key[1]} of the source's {describe_invocation(sp, self.src_items)} "
                                             f"({key[0]}){'' if not got else ' for all of its rows'}")
                    return

    def state(self, g0: InvocationGraph, g1: InvocationGraph, images: dict[Invocation, list[Invocation]]) -> None:
        """Each state access of the plan sees the values of the calls the source's access sees (per row
        group: a group's access, the writes of its rows), and each RL iteration leaves the same calls'
        values (`analysis.state_observations`)."""
        seen0, left0 = state_observations(g0)
        seen1, left1 = state_observations(g1)
        seen1 = through_seeds(g1, seen1)

        def source(writers: frozenset[Invocation | None]) -> frozenset[Invocation | None]:
            return frozenset(None if w is None else Invocation(self.origin[w.path], w.indices) for w in writers)

        budgets = staleness_budgets(self.source)

        def then(s: Invocation, original: str, lag: int) -> frozenset[Invocation | None]:
            k = s.indices[0] - lag  # what the source's read saw `lag` RL iterations earlier
            return seen0.get((s._replace(indices=(k,) + s.indices[1:]), original), frozenset()) if k >= 0 else frozenset({None})

        for (q, state), writers in seen1.items():
            s = Invocation(self.origin[q.path], q.indices)
            key = effect_key(g1.node[q], state)
            original = str(key.on(self.component_of(key.component)))
            want = seen0.get((s, original), frozenset())
            if source(writers) != want:
                node = g1.node[q]
                lag = read_lag(source(writers), lambda lag, s=s, o=original: then(s, o, lag), s.indices[0] + 1)  # type: ignore[misc]
                access = next((e.access.value for e in node.effects if e.state == state and e.access is not Access.READ),
                              "read")
                if lag is not None and lag <= budgets.get(original, 0) and access == "read":
                    continue  # an asynchronous plan's read: an older value, within the budget
                self.differ(node, f"{describe_invocation(q, self.plan_items)} would see {values_of(writers, self.plan_items)} "
                                  f"of '{state}', where the source's call sees {values_of(want, self.src_items)}"
                                  + over_budget(original, lag, budgets.get(original, 0), access))
                return
        # a plan that runs calls ahead runs none ahead across a checkpoint: only the last iteration's end is one
        last = max((k for k, _ in left0), default=0) if any(n.plan.ahead for n in self.plan.root.body
                                                            if isinstance(n, ExecutionNode)) else None
        for (k, state), writers in left0.items():
            if last is not None and k < last:
                continue
            got = source(left1.get((k, state), frozenset()))
            lag = None if got == writers else read_lag(got, lambda lag, k=k, s=state: left0.get((k - lag, s), frozenset({None})), k + 1)  # type: ignore[misc]
            if got != writers and (lag is None or lag > budgets.get(state, 0)):
                self.differ(None, f"RL iteration {k} would leave {values_of(got, self.src_items)} of '{state}', where "
                                  f"the source leaves {values_of(writers, self.src_items)}")
                return


UNKNOWN = "unknown"
# the rows of the source's batch (dim 0) a plan value holds, in order: contiguous ranges; None: all rows, or
# a value without rows; UNKNOWN: rose cannot tell
RowsValue = tuple[tuple[int, int], ...] | None | str


def _ranges(parts: list[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """Ranges in order, adjacent ones joined (`[0:2]` then `[2:4]` is `[0:4]`)."""
    out: list[tuple[int, int]] = []
    for a, b in parts:
        if a >= b:
            continue
        if out and out[-1][1] == a:
            out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return tuple(out)


def _take(ranges: tuple[tuple[int, int], ...], start: int, stop: int | None) -> RowsValue:
    """Rows `start:stop` of a value holding `ranges` (in order)."""
    taken, at = [], 0
    for a, b in ranges:
        n = b - a
        lo, hi = max(start - at, 0), n if stop is None else min(stop - at, n)
        if lo < hi:
            taken.append((a + lo, a + hi))
        at += n
    return _ranges(taken)


def _shown_rows(rows: RowsValue) -> str:
    return " and ".join(f"[{a}, {b}]" for a, b in rows) if isinstance(rows, tuple) and rows else "none"


class _RowsOf:
    """Which rows of the source's batch (dim 0) a plan value holds, from the `rows:` of the row groups
    that produce it and the static slices and `cat`s between them; UNKNOWN where rose cannot tell (a
    slice of a stacked value, bounds from params, a record)."""

    def __init__(self, resolver: Resolver) -> None:
        self.resolver = resolver
        self.carries: dict[tuple[Path, str], RowsValue] = {}

    def field(self, item: Item, key: str, expr: Expr) -> RowsValue:
        return self.value(expr, self.resolver.tables.field(item, key, expr), 0)

    def value(self, expr: Expr, bound: dict[int, Any], depth: int) -> RowsValue:
        if depth > 50:
            return UNKNOWN
        match expr:
            case Ref() | IterRef():
                return self.binding(expr, bound.get(id(expr)), bound, depth)
            case Slice(target=t, start=a, stop=b):
                base = self.value(t, bound, depth + 1)
                if base == UNKNOWN or not (isinstance(a, Int | None) and isinstance(b, Int | None)):
                    return UNKNOWN
                if batch_dim(self.resolver, t, bound) != 0:
                    return UNKNOWN  # the slice takes iterations of a stacked value, or a value without rows
                if base is None:  # all rows of the batch: the slice's bounds are rows
                    return UNKNOWN if b is None else _ranges([(a.value if a is not None else 0, b.value)])
                assert isinstance(base, tuple)
                return _take(base, a.value if a is not None else 0, b.value if b is not None else None)
            case Call(fn="cat", args=args):
                parts = [self.value(x, bound, depth + 1) for x in args]
                if not all(isinstance(p, tuple) for p in parts):
                    return UNKNOWN
                return _ranges([r for p in parts if isinstance(p, tuple) for r in p])
            case Int() | BinOp() | Neg() | Param():
                return None
        return UNKNOWN

    def binding(self, expr: Expr, b: Any, bound: dict[int, Any], depth: int) -> RowsValue:
        items = self.resolver.items
        match b:
            case LoopIndex():
                return None
            case NodePort(node=node, port=port):
                item = items[node]
                if isinstance(item, ExecutionNode):
                    return None if item.plan.rows is None else (item.plan.rows,)
                if isinstance(item, MergeNode):
                    return None
                assert isinstance(item, LoopNode)
                c = item.carry(port)
                return self.carry(item, c) if c is not None else UNKNOWN
            case CarryIn(loop=loop, var=var):
                item = items[loop]
                assert isinstance(item, LoopNode)
                c = item.carry(var)
                return self.carry(item, c) if c is not None else UNKNOWN
            case ParentInput(node=node, port=port):
                parent = items[node]
                assert isinstance(parent, ExecutionNode)
                return self.field(parent, f"in.{port}", dict(parent.inputs)[port])
            case IterSelect(inner=inner):
                assert isinstance(expr, IterRef)
                return self.value(expr.inner, {**bound, **binding_table(inner)}, depth + 1)
        return UNKNOWN

    def carry(self, loop: LoopNode, c: Any) -> RowsValue:
        """A carried value's rows: its first value's (its next values' are checked against them)."""
        key = (loop.path, c.name)
        if key not in self.carries:
            self.carries[key] = UNKNOWN  # (while working it out: a carried value that reads itself)
            self.carries[key] = self.field(loop, f"carry.{c.name}.init", c.init)
        return self.carries[key]


def _text(e: Expr | None) -> str:
    return unparse(e) if e is not None else ""


def _first_rows(item: Item) -> tuple[int, int] | None:
    for x in (item, *(getattr(item, "body", None) or ())):
        if isinstance(x, ExecutionNode) and x.plan.rows is not None:
            return x.plan.rows
    return None


def _breaking_group(groups: list[ExecutionNode], size: int | None) -> ExecutionNode:
    """The first row group, in row order, that leaves a gap, overlaps the one before it or runs past the
    batch (the first group when none of that applies: then a group without rows is the fault)."""
    ordered = sorted((g for g in groups if g.plan.rows is not None), key=lambda g: g.plan.rows or (0, 0))
    lo = 0
    for g in ordered:
        a, b = g.plan.rows or (0, 0)
        if a != lo or (size is not None and b > size):
            return g
        lo = b
    return ordered[-1] if ordered and size is not None and lo != size else groups[0]


def _partition(parts: list[Rows], size: int | None) -> bool:
    if len(parts) == 1:
        return parts[0] is None or (size is not None and parts[0] == (0, size))
    if any(p is None for p in parts):
        return False
    ordered = sorted(parts)  # type: ignore[type-var]
    lo = 0
    for a, b in ordered:  # type: ignore[misc]
        if a != lo:
            return False
        lo = b
    return size is None or lo == size


def plan_differences(source: Workflow, plan: Workflow) -> list[PlanDifference]:
    """How `plan` fails to keep the dependencies of `source` ([] when it keeps them all)."""
    return _Checker(source, plan).run()


def first_plan_construct(wf: Workflow) -> tuple[SourcePos, str, str] | None:
    """Where `wf` first uses a construct only plans have -- a component copy, a split group, a loop group
    or interleaved loops, a group number, an item a rewrite moved, a node's phases expanded, a seeding call
    of a copy (`_rose_get_states`/`_rose_set_states`) -- with its
    field path and what it is; None for a workflow a person may write (row slices, `rows:`, and `merge:`
    items are that: the hand-pipelined workflows use them)."""
    for name, comp in wf.components.items():
        if comp.copy_of is not None:
            return (comp.field_pos.get("copy_of", comp.pos), f"components.{name}.copy_of",
                    f"component '{name}' is a copy of '{comp.copy_of}'")
    for item in wf.items():
        if isinstance(item, MergeNode):
            continue
        where = ".".join(item.path)
        fields = {"split_of": item.plan.split_of is not None, "moved_from": item.plan.moved_from is not None,
                  "group": item.plan.group is not None,
                  "iterations": isinstance(item, LoopNode) and item.plan.iterations is not None,
                  "interleave": isinstance(item, LoopNode) and item.plan.interleaved,
                  "expand": isinstance(item, ExecutionNode) and item.plan.expand,
                  "call": is_seed(item)}  # a temporal split's seeding of a copy (`seeds.py`)
        key = next((k for k, present in fields.items() if present), None)
        if key is not None:
            what = f"calls {item.call}" if key == "call" else f"has `{key}:`"  # type: ignore[union-attr]
            return (item.field_pos.get(key, item.pos), f"{where}.{key}", f"'{where}' {what}, which rose writes only into plans")
    return None


def check_plan_source(plan: Workflow, source_file: str | FilePath | None = None,
                      source_sets: Mapping[str, Any] | None = None) -> dict[str, tuple[Any, Any]]:
    """If `plan` is a plan (it has `plan: source:`), load its source workflow -- `source_file` if given
    (e.g. the workflow `rose execute FILE --plan PLAN` names), else the recorded path, relative to the
    working directory or to the plan's own directory -- and raise WorkflowError, positioned in the plan,
    unless the plan is of that workflow (its name, and no param the source does not define) and keeps
    every dependency of it. Returns the params whose value in the plan differs from the source file's
    ({name: (plan's, source's)}): a plan written with `--set episodes=1` runs one episode however the
    source reads, which `rose execute SOURCE --plan PLAN` says (unseen sweep).

    A plan may not raise its source's budgets: each state's `max_staleness` in the plan's params must be at
    most the source's as it runs (its file's params, with `source_sets`, the `--set`s the command gives the
    source), or the plan is refused like a hand edit of `max_staleness`. A file that defers or runs calls
    ahead without a `plan: source:` is proved against its own budgets (the same file run synchronously)."""
    from .. import load_workflow

    meta = plan.plan or {}
    recorded = meta.get("source")
    if source_file is None and not recorded:
        construct = first_plan_construct(plan)
        if construct is not None:  # a plan that lost its `plan:` block (a truncated copy) is no workflow
            pos, path, what = construct
            text = FilePath(plan.file).read_text() if FilePath(plan.file).is_file() else None
            raise WorkflowError([Diagnostic(
                pos, path, f"{what}: a plan-only construct in a file without a `plan: source:` block, so it "
                "cannot be checked against the workflow it was made from (a plan cut short loses that block, "
                "which rose writes near its top)",
                f"give its source: rose execute SOURCE --plan {plan.file}")], text)
        _check_own_budgets(plan)
        return {}
    here = FilePath(plan.file).parent
    # the recorded path is relative to the plan's directory (rose writes it so); then to the working directory,
    # where plans written to stdout, or by rose before issue 42, recorded it
    candidates = [FilePath(source_file)] if source_file is not None else [here / str(recorded), FilePath(str(recorded))]
    candidates = list(dict.fromkeys(candidates))  # an absolute path is one place, not two
    found = next((c for c in candidates if c.is_file()), None)
    text = FilePath(plan.file).read_text() if FilePath(plan.file).is_file() else None
    at_source = _key_pos(plan.file, text, ("plan", "source")) if source_file is None else None
    if found is None:
        raise WorkflowError([Diagnostic(at_source or SourcePos(str(source_file), 0, 0), "plan.source",
                                        f"the plan's source workflow '{recorded}' is not found (looked in "
                                        f"{', '.join(str(c) for c in candidates)}): the plan cannot be checked",
                                        "run it from the directory it was written in, or give the source: "
                                        "rose execute SOURCE --plan PLAN")], text)
    declared = _load_source(found, at_source, text)
    if plan.name != declared.name:
        if source_file is None:  # the recorded source itself is of another workflow (the plan was edited)
            raise WorkflowError([Diagnostic(
                _key_pos(plan.file, text, ("plan", "source")), "plan.source",
                f"names {found}, whose workflow is '{declared.name}', but this plan is of workflow '{plan.name}'",
                f"give the plan its own source: rose execute SOURCE --plan {plan.file}")], text)
        made_from = f" from {recorded}" if recorded else ""
        raise WorkflowError([Diagnostic(
            _key_pos(plan.file, text, ("name",)), "name",
            f"the plan was made{made_from} (workflow '{plan.name}'), not from {found} (workflow '{declared.name}')",
            f"give it its own source: rose execute {recorded} --plan {plan.file}" if recorded else
            "give the workflow the plan was made from")], text)
    foreign = [name for name in plan.params if name not in declared.params]
    if foreign:
        raise WorkflowError([Diagnostic(_key_pos(plan.file, text, ("params",)), f"params.{name}",
                                        f"the plan sets param '{name}', which its source {found} does not define")
                             for name in foreign], text)
    source = load_workflow(found, plan.params)
    _check_budgets_not_raised(plan, source, load_workflow(found, dict(source_sets)) if source_sets else declared,
                              found, text)
    diffs = plan_differences(source, plan)
    if diffs:
        # each difference is shown with the line of the file it names (the plan's or the source's)
        texts = {str(found): found.read_text(), **({plan.file: text} if text is not None else {})}
        raise WorkflowError([Diagnostic(d.pos, d.path, f"the plan differs from its source {found}: {d.message}")
                             for d in diffs[:MAX_SHOWN]], text, texts)
    return {name: (value, declared.params[name]) for name, value in plan.params.items()
            if declared.params[name] != value}


def _check_own_budgets(wf: Workflow) -> None:
    """A file that defers or runs calls ahead (`defer:`, `ahead:`) and records no source is checked against
    itself run synchronously: every read within its own `max_staleness` (`rose validate` said "valid ... (lag
    1, max_staleness 0)" of one, and `rose execute` ran it with stale reads)."""
    if not any(isinstance(i, ExecutionNode) and (i.plan.defer or i.plan.ahead) for i in wf.root.body):
        return
    from ..versions import synchronous

    diffs = plan_differences(synchronous(wf), wf)
    if diffs:
        text = FilePath(wf.file).read_text() if FilePath(wf.file).is_file() else None
        raise WorkflowError([Diagnostic(d.pos, d.path, "the file defers or runs calls ahead and records no `plan: "
                                        f"source:`, so it is proved against its own budgets: {d.message}",
                                        "keep every read within its state's max_staleness (a plan rose writes is "
                                        "checked so: rose rewrite SOURCE --do \"defer NODE K\")")
                             for d in diffs[:MAX_SHOWN]], text)


def _check_budgets_not_raised(plan: Workflow, source: Workflow, as_run: Workflow, found: FilePath,
                              text: str | None) -> None:
    """One rule for budgets in plans: a plan may not raise its source's. `source` is the source loaded with the
    plan's params, `as_run` with the params it runs with; a budget that the plan's params raise (`--set
    stale=1` when the plan was written, `params: stale: 5` by hand) is refused at the plan's param, as a hand
    edit of `max_staleness` is."""
    theirs = as_run.state_objects()
    raised = [(key, obj.max_staleness, theirs[key].max_staleness) for key, obj in sorted(source.state_objects().items())
              if key in theirs and obj.max_staleness > theirs[key].max_staleness]
    if not raised:
        return
    changed = [name for name, value in plan.params.items() if as_run.params.get(name) != value]
    at = _key_pos(plan.file, text, ("params", changed[0])) if changed else SourcePos(plan.file, 1, 1)
    sets = " ".join(f"--set {n}={plan.params[n]}" for n in changed)
    key, mine, allowed = raised[0]
    raise WorkflowError([Diagnostic(
        at, f"params.{changed[0]}" if changed else "params",
        f"the plan raises the budget of its source {found}: '{key}' has max_staleness {mine} in the plan and "
        f"{allowed} in the source as it runs (the plan's params: {', '.join(f'{n}={plan.params[n]!r}' for n in changed) or 'none'}); "
        "a plan may not raise its source's budget",
        "re-derive the plan from a source whose budget allows it: declare the budget in the source (its "
        "max_staleness, or its param's default) and rewrite it"
        + (f", or run the source with the plan's params: rose execute {found} {sets} --plan {plan.file}" if sets else ""))],
        text)


WORKFLOW_SUFFIXES = (".yaml", ".yml")


def _load_source(found: FilePath, at_source: SourcePos | None, text: str | None) -> Workflow:
    """The source workflow a plan records (`at_source`: where the plan says so; None: the command line
    named it, and its problems are shown as `rose validate` shows them). A recorded path is anyone's
    edit: a file that is not a workflow is refused without a word of its content (`source:
    /proc/self/environ` printed the environment in the error's excerpt; a secrets file, its lines)."""
    from .. import load_workflow

    if at_source is None:
        return load_workflow(found)

    def refuse(why: str) -> WorkflowError:
        return WorkflowError([Diagnostic(at_source, "plan.source", f"names {found}, which {why}: a plan's source "
                                         "is the workflow file it was made from",
                                         f"check it with `rose validate {found}`, or give the source: rose execute "
                                         "SOURCE --plan PLAN")], text)

    try:
        regular = stat.S_ISREG(os.stat(found).st_mode)
    except OSError as exc:
        raise refuse(f"cannot be read ({exc.strerror})") from None
    if not regular or found.suffix.lower() not in WORKFLOW_SUFFIXES or found.resolve().parts[1:2] in (
            ("proc",), ("sys",), ("dev",)):
        raise refuse(f"is not a workflow file ({'/'.join(WORKFLOW_SUFFIXES)})")
    try:
        return load_workflow(found)
    except WorkflowError as exc:
        n = len(exc.diagnostics)
        raise refuse(f"is not a valid workflow ({n} problem{'s' if n != 1 else ''})") from None


def recorded_source(source: str | FilePath, plan_file: str | FilePath | None) -> str:
    """The `plan: source:` a plan written to `plan_file` records: the path relative to the plan's directory,
    so that the plan is checked against it from any working directory (None: the plan goes to stdout, the
    path as given)."""
    if plan_file is None:
        return str(source)
    return os.path.relpath(FilePath(source).resolve(), FilePath(plan_file).resolve().parent)


def _key_pos(file: str, text: str | None, path: tuple[str, ...]) -> SourcePos:
    """Where a key of a plan file is (the loader's position of it; 1:1 without the file)."""
    if text is None:
        return SourcePos(file, 1, 1)
    return load_text(text, file).key_pos(path)
