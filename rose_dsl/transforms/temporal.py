"""Temporal split (paper §4.3.1, Figure 9b): the iterations of a *free* loop in k separate graphs.

Iterations of a free loop share no carried value and start from refreshed state, so they can run in
separate groups (`epoch@0` runs iterations 0, 2, ...; `epoch@1` runs 1, 3, ...) that overlap in time.
A component whose state the loop writes is replicated per group (`sim@0` is a copy of `sim`, built
from the same impl and args): each group refreshes its own copy. The group that runs the loop's last
iteration keeps the original component, so after the loop the state is the one the last iteration
left -- what the declared workflow leaves. `loop[j]` references from outside follow iteration j to the
group that ran it.
"""

from __future__ import annotations

from dataclasses import replace

from ..analysis import loop_kinds, state_access_order
from ..expr import Expr, Ref
from ..ir import Component, ExecutionNode, Item, LoopNode, StateEffect, StateObject, Workflow
from ..resolve import Binding, LoopIndex, Resolver
from .common import Refused, Rewritten, find, map_item_exprs, replace_item, rewrite_expr, uses_by_id
from .legality import check_order_preserved
from .split import _repath

__all__ = ["split_temporal"]

Path = tuple[str, ...]


def split_temporal(wf: Workflow, path: Path, k: int, blocks: bool = False, *, check: bool = True,
                   force: bool = False) -> Rewritten:
    """`force` skips the free-loop requirement (only to show, in tests, what the check prevents)."""
    loop = find(wf, path)
    if not isinstance(loop, LoopNode) or path == wf.root.path:
        raise Refused(f"'{loop.name}' is not a loop inside the iteration")
    if loop.dynamic:
        raise Refused(f"loop '{loop.name}' ends on a condition (until): how many iterations it runs is known only "
                      "as it runs, so its iterations are kept whole", at=loop.field_pos.get("until"))
    if loop.iterations is not None or loop.split_of is not None or "@" in loop.name:
        raise Refused(f"loop '{loop.name}' is already a split group", at=loop.pos)
    kind = loop_kinds(wf)[path]
    if kind.kind != "free" and not force:
        raise Refused(f"loop '{loop.name}' is dependent ({'; '.join(kind.reasons)}): its iterations must run in order, "
                      "so they cannot be split into independent groups", at=loop.pos)
    if loop.collects and not force:
        raise Refused(f"loop '{loop.name}' has collected outputs; read its iterations as '{loop.name}[j]...' instead",
                      at=loop.field_pos.get("collect") or loop.pos)
    indices = list(loop.indices())
    if k < 2:
        raise Refused(f"splitting loop '{loop.name}' into {k} group(s) does nothing: k must be at least 2")
    if k > len(indices):
        raise Refused(f"loop '{loop.name}' runs {len(indices)} iterations: {k} groups would leave some empty",
                      at=loop.field_pos.get("count") or loop.pos)
    if blocks:
        size = -(-len(indices) // k)
        groups = [tuple(indices[g * size:(g + 1) * size]) for g in range(k)]
    else:
        groups = [tuple(indices[g::k]) for g in range(k)]
    owner = next(g for g, its in enumerate(groups) if indices[-1] in its)

    # components whose state the loop writes get one copy per (non-owner) group
    accesses = state_access_order(loop.body)
    written = {s for s, a, _ in accesses if a.writes}
    replicated = sorted({s.split(".", 1)[0] for s in written})
    everywhere = {s for s, a, _ in state_access_order(wf.root.body) if a.writes}
    for s, _, reader in accesses:
        comp = s.split(".", 1)[0]
        if comp in replicated and s not in written and s in everywhere:
            node = wf.find(reader)
            raise Refused(f"'{s}' is read by '{reader[-1]}' inside loop '{loop.name}' and written elsewhere: a copy of "
                          f"'{comp}' for another group would not see its value",
                          at=(node.field_pos.get("state") or node.pos) if node is not None else None)
    resolver = Resolver(wf)

    def rename_index(member: str):
        def fn(expr: Expr, b: Binding) -> Expr | None:
            if isinstance(b, LoopIndex) and b.loop == path and isinstance(expr, Ref):
                return Ref(expr.offset, member, "i")
            return None
        return fn

    def copy_for(item: Item, fn, comp_names: dict[str, str]) -> Item:
        out = map_item_exprs(item, lambda key, e: rewrite_expr(e, uses_by_id(resolver, item, key, e), fn))
        if isinstance(out, ExecutionNode):
            if out.component in comp_names:
                new = comp_names[out.component]
                out = replace(out, component=new, effects=tuple(
                    StateEffect(f"{new}.{e.state.split('.', 1)[1]}", e.access, e.pos) for e in out.effects))
            if out.phases:
                out = replace(out, phases=tuple(copy_for(c, fn, comp_names) for c in out.phases))
        elif isinstance(out, LoopNode):
            out = replace(out, body=tuple(copy_for(c, fn, comp_names) for c in out.body))
        return out

    members: list[LoopNode] = []
    components = dict(wf.components)
    for g, its in enumerate(groups):
        member = f"{loop.name}@{g}"
        names = {} if g == owner else {c: _copy_name(wf.components[c], components) for c in replicated}
        for c, copy in names.items():
            orig = wf.components[c]
            components[copy] = replace(orig, name=copy, replica_of=orig.replica_of or c,
                                       state=tuple(StateObject(copy, s.name, s.attr, s.pos) for s in orig.state))
        body = tuple(copy_for(item, rename_index(member), names) for item in loop.body)
        group = replace(loop, body=body, iterations=its, split_of=loop.name, src=())
        members.append(_repath(group, path, path[:-1] + (member,)))  # type: ignore[arg-type]
    new = replace_item(replace(wf, components=components), path, members)
    member_of = {j: g for g, its in enumerate(groups) for j in its}
    depth = _loop_depth(wf, path)  # the position of this loop's index in an invocation's indices

    def locate(p: Path, idx: tuple[int, ...]):
        if p[: len(path)] == path and len(p) > len(path):
            j = idx[depth]
            return path[:-1] + (f"{loop.name}@{member_of[j]}",) + p[len(path):], idx
        return p, idx

    what = f"splitting the iterations of loop '{loop.name}' into {k} groups {groups}"
    if check:
        check_order_preserved(wf, new, locate, what, copies=True)
    notes = tuple(f"'{c.name}' is a copy of '{c.replica_of}' for a group of '{loop.name}'"
                  for name, c in components.items() if name not in wf.components)
    return Rewritten(new, locate, what, notes)


def _copy_name(comp: Component, taken: dict[str, Component]) -> str:
    """A fresh name for one more copy of a component: `sim@1`, numbered over every copy of the original
    (a copy of a copy is named after the original: nested splits never nest names, `c0@0@0`)."""
    root = comp.replica_of or comp.name
    n = 0
    while f"{root}@{n}" in taken:
        n += 1
    return f"{root}@{n}"


def _loop_depth(wf: Workflow, path: Path) -> int:
    """How many loops enclose `path`'s body items before `path` itself (its index position)."""
    depth = 0
    for n in range(1, len(path)):
        if isinstance(wf.find(path[:n]), LoopNode):
            depth += 1
    return depth
