"""Temporal split (paper §4.3.1, Figure 9b): the iterations of a *free* loop in k separate graphs.

Iterations of a free loop share no carried value and start from refreshed state, so they can run in
separate groups (`epoch@0` runs iterations 0, 2, ...; `epoch@1` runs 1, 3, ...) that overlap in time.
A component whose state the loop writes gets a copy per group (`sim@0`, `copy_of: sim`, built from the
same impl and args): each group refreshes its own copy. The group that runs the loop's last iteration
keeps the original component, so after the loop the state is the one the last iteration left -- what
the declared workflow leaves. `loop[j]` references from outside follow iteration j to the group that
ran it. The pass runner checks the result keeps every dependency (`legality.check_order_preserved`: a
call on a copy must see the values it saw, which a copy can give only within its own group).

State of a copied component that the loop reads but does not write, and that is written elsewhere (a
`refresh` before the loop, an update after it), is what the copy must start from: the split seeds each
copy from the original before the groups (`seeds.py`: a get of the original's state objects and a set
of the copy's, plan calls both runtimes run).
"""

from __future__ import annotations

from dataclasses import replace

from ..analysis import loop_kinds, state_access_order
from ..expr import Expr, parse_expr
from ..identity import StateKey
from ..ir import (
    Access,
    Component,
    ExecutionNode,
    Item,
    LoopNode,
    NodePlan,
    StateEffect,
    StateObject,
    Workflow,
)
from ..resolve import Resolver
from .refs import RefUse, map_subtree, rename_ref, retarget_after
from .rewritten import Refused, Rewritten
from .seeds import SEED_GET, SEED_PORT, SEED_SET
from .tree import find, into_group, map_tree, repath, replace_item

__all__ = ["build_split_temporal"]

Path = tuple[str, ...]


def build_split_temporal(wf: Workflow, path: Path, k: int, blocks: bool = False, *, force: bool = False) -> Rewritten:
    """`force` skips the free-loop requirement (only to show, in tests, what the check prevents)."""
    loop = _splittable(wf, path, force)
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
    copied, seeded = _copied_components(wf, loop)
    resolver = Resolver(wf)
    components = dict(wf.components)
    members: list[Item] = []
    seeds = _seed_gets(wf, path, loop, seeded)
    for g, its in enumerate(groups):
        member = f"{loop.name}@{g}"
        copies = {} if g == owner else {c: _copy_name(wf.components[c], components) for c in copied}
        for c, copy in copies.items():
            orig = wf.components[c]
            components[copy] = replace(orig, name=copy, copy_of=orig.copy_of or c,
                                       state=tuple(StateObject(copy, s.name, s.attr, s.pos) for s in orig.state))
        # the loop's own index is the member's (`epoch.i` -> `epoch@0.i`, the same iteration number)
        body = [_on_copies(map_subtree(resolver, item, _renamer(path, member)), copies) for item in loop.body]
        group = replace(loop, body=tuple(body), plan=replace(loop.plan, iterations=its, split_of=loop.name))
        members.append(into_group(repath(group, path, path[:-1] + (member,)), g))
        seeds += [_seed_set(wf, path, loop, c, seeded[c], copy) for c, copy in copies.items() if c in seeded]
    new = replace_item(replace(wf, components=components), path, [*seeds, *members])
    new = retarget_after(new, {path: tuple(m.name for m in members)})  # `after: [loop]`: after every group
    member_of = {j: g for g, its in enumerate(groups) for j in its}
    depth = sum(isinstance(wf.find(path[:n]), LoopNode) for n in range(1, len(path)))  # this loop's index position

    def locate(p: Path, idx: tuple[int, ...]):
        if p[: len(path)] == path and len(p) > len(path):
            return path[:-1] + (f"{loop.name}@{member_of[idx[depth]]}",) + p[len(path):], idx
        return p, idx

    notes = tuple(f"'{c.name}' is a copy of '{c.copy_of}' for a group of '{loop.name}'"
                  for name, c in components.items() if name not in wf.components)
    notes += tuple(f"'{n.name}' {'reads' if n.method == SEED_GET else 'sets'} {', '.join(e.state for e in n.effects)}: "
                   "a copy starts from the original's state" for n in seeds)
    return Rewritten(new, locate, f"splitting the iterations of loop '{loop.name}' into {k} groups {groups}", notes)


def _splittable(wf: Workflow, path: Path, force: bool) -> LoopNode:
    loop = find(wf, path)
    if not isinstance(loop, LoopNode) or path == wf.root.path:
        raise Refused(f"'{loop.name}' is not a loop inside the iteration")
    if loop.dynamic:
        raise Refused(f"loop '{loop.name}' ends on a condition (until): how many iterations it runs is known only "
                      "as it runs, so its iterations are kept whole", at=loop.field_pos.get("until"))
    if loop.plan.iterations is not None or loop.plan.split_of is not None:
        raise Refused(f"loop '{loop.name}' is already a split group", at=loop.pos)
    kind = loop_kinds(wf)[path]
    if kind.kind != "free" and not force:
        raise Refused(f"loop '{loop.name}' is dependent ({'; '.join(kind.reasons)}): its iterations must run in order, "
                      "so they cannot be split into independent groups", at=loop.pos)
    if loop.collects and not force:
        raise Refused(f"loop '{loop.name}' has collected outputs; read its iterations as '{loop.name}[j]...' instead",
                      at=loop.field_pos.get("collect") or loop.pos)
    return loop


def _copied_components(wf: Workflow, loop: LoopNode) -> tuple[list[str], dict[str, list[str]]]:
    """The components whose state the loop writes (each non-owner group gets a copy), and per such
    component the state objects the loop reads but does not write while something else writes them:
    the copies are seeded with the original's values of those (`seeds.py`)."""
    accesses = state_access_order(loop.body)
    written = {s for s, a, _ in accesses if a.writes}
    copied = sorted({s.component for s in written})
    everywhere = {s for s, a, _ in state_access_order(wf.root.body) if a.writes}
    seeded: dict[str, list[str]] = {}
    for s, _, _ in accesses:
        comp, name = s.component, s.name
        if comp in copied and s not in written and s in everywhere and name not in seeded.get(comp, []):
            seeded.setdefault(comp, []).append(name)
    return copied, {c: sorted(names) for c, names in seeded.items()}


def _seed_name(wf: Workflow, path: Path, loop: LoopNode, component: str) -> Path:
    """`seed_epoch_sim_0`: a name no sibling of the loop has (refused where one has: a user's own item)."""
    name = f"seed_{loop.name}_{component}".replace("@", "_")
    parent = wf.find(path[:-1])
    siblings = {c.name for c in getattr(parent, "body", ())}
    if name in siblings:
        raise Refused(f"loop '{loop.name}' needs a seeding call named '{name}', which another item already is",
                      at=loop.pos)
    return path[:-1] + (name,)


def _seed_gets(wf: Workflow, path: Path, loop: LoopNode, seeded: dict[str, list[str]]) -> list[ExecutionNode]:
    """One call per seeded component: read its state objects that its copies start from."""
    return [ExecutionNode(_seed_name(wf, path, loop, c), c, SEED_GET, outputs=(SEED_PORT,),
                          effects=tuple(StateEffect(StateKey(c, s), Access.READ) for s in names),
                          plan=NodePlan(group=loop.plan.group))
            for c, names in seeded.items()]


def _seed_set(wf: Workflow, path: Path, loop: LoopNode, original: str, names: list[str], copy: str) -> ExecutionNode:
    """The copy's state objects set (refreshed) from the original's, which its seed get reads just before."""
    get = _seed_name(wf, path, loop, original)[-1]
    return ExecutionNode(_seed_name(wf, path, loop, copy), copy, SEED_SET,
                         inputs=((SEED_PORT, parse_expr(f"{get}.{SEED_PORT}")),),
                         effects=tuple(StateEffect(StateKey(copy, s), Access.REFRESH) for s in names),
                         plan=NodePlan(group=loop.plan.group))


def _renamer(path: Path, member: str):
    def fn(use: RefUse) -> Expr | None:
        return rename_ref(use, {path: member})

    return fn


def _on_copies(item: Item, copies: dict[str, str]) -> Item:
    """Every call of a copied component calls the group's copy (and touches its state)."""
    def fn(it: Item) -> Item:
        if isinstance(it, ExecutionNode) and it.component in copies:
            new = copies[it.component]
            return replace(it, component=new, effects=tuple(
                replace(e, key=e.key.on(new)) for e in it.effects))
        return it

    return map_tree(item, fn) if copies else item


def _copy_name(comp: Component, taken: dict[str, Component]) -> str:
    """A fresh name for one more copy of a component: `sim@1`, numbered over every copy of the original
    (a copy of a copy is named after the original: nested splits never nest names, `c0@0@0`)."""
    root = comp.copy_of or comp.name
    n = 0
    while f"{root}@{n}" in taken:
        n += 1
    return f"{root}@{n}"
