"""Reading one row group's output instead of a slice of the merge of all groups (issue 15), the rewrite
every split runs; see `chain` for why. Its own module so that `split` (which runs it after each split)
and `chain` (which builds chains from `split`'s pieces) import it without importing each other.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace

from ..expr import Call, Expr, Int, Ref, Slice, map_expr
from ..ir import Carry, ExecutionNode, Item, LoopNode, MergeNode, Workflow
from ..resolve import Binding, CarryIn, NodePort, Resolver
from .tree import map_item_exprs, map_workflow, own_group

__all__ = ["forward_merge_slices"]

Path = tuple[str, ...]
Rows = tuple[int, int]


def _group_rows(resolver: Resolver, merge: MergeNode) -> list[tuple[str, Rows]] | None:
    """The merge's sources with the rows each holds, when they are row groups in order from row 0."""
    out = []
    lo = 0
    for name in merge.sources:
        src = resolver.items.get(merge.path[:-1] + (name,))
        rows = _rows(src) if src is not None else None
        if rows is None or rows[0] != lo:
            return None
        out.append((name, rows))
        lo = rows[1]
    return out


def _rows(item: Item) -> Rows | None:
    """The rows of a group: a split node's `rows`, or the one row range every call in a split loop body
    group works on."""
    if isinstance(item, ExecutionNode):
        return item.plan.rows
    if isinstance(item, LoopNode):
        found = {r for x in item.body for r in [_rows(x)]}
        return found.pop() if len(found) == 1 else None
    return None


def _bound(e: Expr | None) -> int | None:
    return e.value if isinstance(e, Int) else None


def _map_row_slices(expr: Expr, on_slice: Callable[[Slice, Ref], Expr | None]) -> Expr:
    """`expr` with every slice of a plain reference (`x.port[a:b]`) replaced by what `on_slice(slice, ref)`
    gives (None: kept, its parts walked), everything else rebuilt around it."""
    def again(e: Expr) -> Expr:
        return _map_row_slices(e, on_slice)

    match expr:
        case Slice(target=Ref() as ref):
            found = on_slice(expr, ref)
            return found if found is not None else replace(expr, target=again(expr.target))
    return map_expr(expr, again)


def _forward(expr: Expr, bound: Mapping[int, Binding], groups: Mapping[Path, list[tuple[str, Rows]]],
             dims: Mapping[tuple[Path, str], int]) -> Expr:
    def group_of(expr: Slice, ref: Ref) -> Expr | None:
        b = bound.get(id(ref))
        if not (isinstance(b, NodePort) and b.node in groups and dims.get((b.node, b.port)) == 0):
            return None
        parts = groups[b.node]
        lo = _bound(expr.start) if expr.start is not None else 0
        hi = _bound(expr.stop) if expr.stop is not None else parts[-1][1][1]
        chosen = [name for name, (a, z) in parts if lo is not None and hi is not None and lo <= a and z <= hi]
        covered = [(a, z) for name, (a, z) in parts if name in chosen]
        if chosen and covered[0][0] == lo and covered[-1][1] == hi:
            refs = tuple(Ref(ref.offset, name, ref.attr) for name in chosen)
            return refs[0] if len(refs) == 1 else Call(ref.offset, "cat", refs)
        if lo is not None and hi is not None:
            inside = [(name, a) for name, (a, z) in parts if a <= lo and hi <= z]
            if inside:  # rows of one group: that group's output, sliced relative to its first row
                name, a = inside[0]
                return Slice(expr.offset, Ref(ref.offset, name, ref.attr), Int(0, lo - a), Int(0, hi - a))
        return None

    return _map_row_slices(expr, group_of)


def _merge_groups(resolver: Resolver) -> tuple[dict[Path, list[tuple[str, Rows]]], dict[tuple[Path, str], int]]:
    """Every merge of row groups in order (path -> its groups and their rows), and each merge port's dim."""
    groups = {}
    dims: dict[tuple[Path, str], int] = {}
    for path, item in resolver.items.items():
        if isinstance(item, MergeNode):
            rows = _group_rows(resolver, item)
            if rows is not None:
                groups[path] = rows
                dims.update(((path, port), dim) for port, dim in item.ports)
    return groups, dims


def forward_merge_slices(wf: Workflow) -> Workflow:
    """Every `merge.port[a:b]` (dim-0 merge) whose rows are exactly whole groups reads those groups
    instead: `generate.tokens[0:64]` -> `generate@0.tokens`. The same values; fewer dependencies. Then the
    same through a loop's carried value (`_carry_per_group`)."""
    resolver = Resolver(wf)
    groups, dims = _merge_groups(resolver)
    if not groups:
        return wf

    def fn(item: Item) -> Item:
        return map_item_exprs(item, lambda key, e: _forward(e, resolver.tables.field(item, key, e), groups, dims))

    return _carry_per_group(map_workflow(wf, fn))


def _carry_per_group(wf: Workflow) -> Workflow:
    """A loop's carried value whose next is a dim-0 merge of row groups (`obs: {init: reset.obs, next:
    env.obs}` after `env` was split), read in the body as exactly one group's rows (`step.obs[0:32]`), gets
    a carry of that group's own (`obs@0: {init: reset.obs[0:32], next: env@0.obs}`), which the read then
    takes: the same value in every iteration (the first: the init's rows; then group 0's output, which is
    those rows of the merge), but group 0 of step k+1 now waits for group 0 of step k only, not for the
    merge of every group. Without it a chain split inside a loop whose body cannot be split whole (a node
    that is not separable reads the merge) overlapped its groups within a step and never across steps: a
    CPU sweep's online-learner loop ran 1.09x where the per-group carry runs 1.42x. The
    original carry stays for any other reader (the non-separable node, the value after the loop)."""
    resolver = Resolver(wf)
    groups, dims = _merge_groups(resolver)
    if not groups:
        return wf
    new_carries: dict[Path, dict[str, tuple[str, Expr, Expr]]] = {}  # loop -> new carry -> (old, init, next)
    reads: dict[tuple[Path, str, int, int], str] = {}  # (loop, carry, rows) -> the group carry that holds them
    for path, loop in resolver.items.items():
        if not isinstance(loop, LoopNode) or loop.dynamic:
            continue
        for c in loop.carries:
            if not isinstance(c.next, Ref):
                continue
            b = resolver.tables.field(loop, f"carry.{c.name}.next", c.next).get(id(c.next))
            if not (isinstance(b, NodePort) and b.node in groups and dims.get((b.node, b.port)) == 0
                    and b.node[:-1] == path):  # the merge is in this loop's own body
                continue
            taken = {x.name for x in loop.carries}
            for name, (lo, hi) in groups[b.node]:
                g = own_group(resolver.items[b.node[:-1] + (name,)])
                group_carry = None if g is None else f"{c.name}@{g}"
                if group_carry is None or group_carry in taken:
                    continue
                init = Slice(c.init.offset, c.init, Int(0, lo), Int(0, hi))
                new_carries.setdefault(path, {})[group_carry] = (c.name, init, Ref(c.next.offset, name, c.next.attr))
                reads[(path, c.name, lo, hi)] = group_carry
    if not reads:
        return wf
    used: set[tuple[Path, str]] = set()

    def take(expr: Expr, bound: Mapping[int, Binding]) -> Expr:
        def group_carry(expr: Slice, ref: Ref) -> Expr | None:
            b = bound.get(id(ref))
            lo = _bound(expr.start) if expr.start is not None else 0
            hi = _bound(expr.stop) if expr.stop is not None else None
            if not isinstance(b, CarryIn) or lo is None or hi is None:
                return None
            hit = reads.get((b.loop, b.var, lo, hi))
            if hit is None:
                return None
            used.add((b.loop, hit))
            return Ref(ref.offset, ref.head, hit)

        return _map_row_slices(expr, group_carry)

    def fn(item: Item) -> Item:
        return map_item_exprs(item, lambda key, e: take(e, resolver.tables.field(item, key, e)))

    out = map_workflow(wf, fn)
    if not used:
        return wf

    def add(item: Item) -> Item:
        if not isinstance(item, LoopNode):
            return item
        pos = {c.name: c.pos for c in item.carries}
        extra = [Carry(name, init, nxt, pos[old]) for name, (old, init, nxt) in new_carries.get(item.path, {}).items()
                 if (item.path, name) in used]
        return replace(item, carries=(*item.carries, *extra)) if extra else item

    return map_workflow(out, add)
