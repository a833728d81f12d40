"""Rewire, Interleave, Expand and loop fusion: rewrites that change program order, not the work.

* `build_rewire` moves an item among its siblings (before or after another one).
* `build_fuse_loops` moves the body of a later loop into an earlier sibling loop with the same
  iterations -- the paper's Rewire across loop levels (Figure 9b): PPO update j runs right after rollout
  epoch j's trajectories exist, overlapping rollout epoch j+1, instead of after all epochs.
* `build_interleave` staggers the groups of a split loop body so that stage s of group g is next to
  stage s-1 of group g+1 (policy(B) next to sim(A)), each group keeping its own order; for a loop split
  in time it makes the temporal groups take turns, one call each (`LoopPlan.interleaved`): without it a
  component the groups share (the policy) runs all of group 0's calls before group 1's, so the groups'
  simulators (copies, in processes of their own) never step at the same time.
* `build_interleave_siblings` makes consecutive sibling loops take turns the same way, one call each
  (`interleave LOOP_A LOOP_B`): two rollouts on two simulators that share the policy, which otherwise
  runs all of the first loop's calls before the second's. Legal where no call of one loop depends on a
  call of the other (the order check finds any that does).
* `build_expand` runs a node's exposed phases instead of its entry (never both).
The pass runner checks each with `legality.check_order_preserved`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from ..expr import Expr, Index, IterRef, unparse
from ..ir import ExecutionNode, Item, LoopNode, MergeNode, Workflow, with_plan
from ..resolve import CarryIn, IterSelect, NodePort, Resolver
from .refs import RefUse, map_outside, map_subtree, rename_ref, retarget_after
from .rewritten import Refused, Rewritten, identity_locate
from .tree import (
    base_name,
    children,
    find,
    into_group,
    one_body,
    own_group,
    repath,
    replace_body,
    source_paths,
    unique_name,
)

__all__ = ["build_rewire", "build_fuse_loops", "build_interleave", "build_interleave_siblings", "build_expand",
           "temporal_groups", "check_independent"]

Path = tuple[str, ...]


def _siblings(wf: Workflow, path: Path) -> tuple[Item, tuple[Item, ...]]:
    if len(path) <= 1:
        raise Refused("the iteration loop itself cannot be moved")
    parent = find(wf, path[:-1])
    return parent, children(parent)


def build_rewire(wf: Workflow, path: Path, *, before: str | None = None, after: str | None = None) -> Rewritten:
    """Move the item at `path` right before or right after a sibling."""
    item = find(wf, path)
    parent, body = _siblings(wf, path)
    names = [i.name for i in body]
    anchor = before or after
    if anchor is None or (before and after):
        raise Refused("say where to move it: before=<sibling> or after=<sibling>")
    if anchor not in names:
        raise Refused(f"'{anchor}' is not a sibling of '{item.name}' (siblings: {', '.join(names)})", at=item.pos)
    if anchor == item.name:
        raise Refused(f"'{item.name}' cannot move relative to itself")
    rest = [i for i in body if i.name != item.name]
    at = [i.name for i in rest].index(anchor) + (0 if before else 1)
    new = replace_body(wf, parent.path, rest[:at] + [item] + rest[at:])
    return Rewritten(new, identity_locate, f"moving '{item.name}' {'before' if before else 'after'} '{anchor}'")


def build_expand(wf: Workflow, path: Path, on: bool = True) -> Rewritten:
    node = find(wf, path)
    if not isinstance(node, ExecutionNode) or not node.phases:
        raise Refused(f"'{node.name}' exposes no phases", at=node.pos)
    parent, body = _siblings(wf, path)
    new = replace_body(wf, parent.path, [replace(node, plan=replace(node.plan, expand=on)) if i.path == path else i
                                         for i in body])

    def locate(p: Path, idx: tuple[int, ...]):
        return (p, idx) if on or p[: len(path)] != path or p == path else None

    return Rewritten(new, locate, f"{'run the phases of' if on else 'run the entry of'} {'.'.join(path)}")


def build_fuse_loops(wf: Workflow, first: Path, second: Path) -> Rewritten:
    """Run iteration j of `second` at the end of iteration j of `first` (same iteration numbers)."""
    a, b = _fusable(wf, first, second)
    resolver = Resolver(wf)
    renames, bases = _fused_names(a, b)
    # b's items become items of a's body (renamed where a name is taken); b's index is a's index
    names = {second + (n,): new for n, new in renames.items()} | {second: a.name}

    def fn(use: RefUse) -> Expr | None:
        match use.binding:
            case IterSelect(loop=lp, index=ix, index_loop=il) if lp == first:
                if ix.kind == "loop" and il == second:
                    assert isinstance(use.expr, IterRef)
                    return use.expr.inner  # iteration update.i of epoch, inside the fused body = this iteration
                j = a.indices()[-1] if ix.kind in ("all", "last") else ix.value if ix.kind == "int" else None
                later = f"{a.name}[{j}]" if j is not None and j > 0 else f"a later iteration of '{a.name}'"
                raise Refused(f"'{b.name}' reads '{unparse(use.original)}' ({_which(ix, a.name)}): fused, "
                              f"{b.name}[0] would run inside {a.name}[0], before {later} has computed it")
            case NodePort(node=node, port=port) if node == first:
                # what the loop leaves after its last iteration (a carried value's last `next`, a collect):
                # inside the fused body it would name this iteration's carried-in value, or be unbound
                raise Refused(f"'{b.name}' reads '{unparse(use.original)}' (what '{a.name}' leaves after its last "
                              f"iteration: its {port!r}): fused, {b.name}[0] would run inside {a.name}[0], before "
                              f"'{a.name}' has finished")
            case CarryIn(loop=lp) if lp == second:
                raise Refused("unreachable: carries were refused", internal=True)
        return rename_ref(use, names, families=bases)

    origin = source_paths(wf)
    moved = []
    for item in b.body:
        m = repath(map_subtree(resolver, item, fn), item.path, first + (renames[item.name],))
        m = replace(m, after=tuple(renames.get(x, x) for x in m.after))
        if isinstance(m, MergeNode):
            m = replace(m, sources=tuple(renames[x] for x in m.sources))
        else:
            # where a plan check finds it in the source; a moved group stands for its renamed base
            m = with_plan(m, moved_from=origin[item.path],
                          split_of=bases[m.plan.split_of] if m.plan.split_of is not None else None)
            if m.plan.group is None and a.plan.group is not None:
                m = into_group(m, a.plan.group)  # moved into a group: it runs in that group
        moved.append(m)
    parent, body = _siblings(wf, first)
    fused = replace(a, body=a.body + tuple(moved))
    new = replace_body(wf, parent.path, [fused if i.path == first else i for i in body if i.path != second])
    # later items reading `second[j].X` now read `first[j].X'`; `after: [second]` is after the fused loop
    new = map_outside(new, resolver, second, lambda use: rename_ref(use, names, families=bases))
    new = retarget_after(new, {second: (a.name,)})

    def locate(p: Path, idx: tuple[int, ...]):
        if p[: len(second)] == second and len(p) > len(second):
            return first + (renames[p[len(second)]],) + p[len(second) + 1:], idx
        return p, idx

    return Rewritten(new, locate, f"fusing loop '{b.name}' into loop '{a.name}'")


def _fusable(wf: Workflow, first: Path, second: Path) -> tuple[LoopNode, LoopNode]:
    a, b = find(wf, first), find(wf, second)
    if not isinstance(a, LoopNode) or not isinstance(b, LoopNode):
        raise Refused("both items must be loops")
    if first == second:  # (it was refused as a broken dependency on a scratch loop, `step_2`)
        raise Refused(f"a loop cannot be fused with itself: name two sibling loops, e.g. fuse {a.name} LATER_LOOP",
                      at=a.pos)
    if first[:-1] != second[:-1]:
        raise Refused(f"'{a.name}' and '{b.name}' are not siblings")
    names = [i.name for i in _siblings(wf, first)[1]]
    if names.index(a.name) > names.index(b.name):
        raise Refused(f"'{a.name}' runs after '{b.name}': fuse the earlier loop first", at=a.pos)
    if a.dynamic or b.dynamic:
        dyn = a if a.dynamic else b
        raise Refused(f"loop '{dyn.name}' ends on a condition (until): its iterations are known only as it runs, so "
                      "they cannot be paired with another loop's", at=dyn.field_pos.get("until") or dyn.pos)
    if a.indices() != b.indices():
        ia, ib = a.indices(), b.indices()
        what = f"{len(ia)} vs {len(ib)}" if len(ia) != len(ib) else f"indices {_span(ia)} vs {_span(ib)}"
        raise Refused(f"'{a.name}' and '{b.name}' run different iterations ({what})",
                      at=b.field_pos.get("count") or b.pos)
    if b.carries or b.collects:
        raise Refused(f"'{b.name}' has carried values or collected outputs; fusing it would change them", at=b.pos)
    return a, b


def _fused_names(a: LoopNode, b: LoopNode) -> tuple[dict[str, str], dict[str, str]]:
    """The names b's items take in a's body: a name taken there gets a suffix, and the groups of a split
    item and their merge keep one base (`n1@0` -> `n1_2@0`, `n1` -> `n1_2`). Returns (item renames,
    base renames)."""
    taken = {i.name for i in a.body} | {base_name(i) for i in a.body}
    bases: dict[str, str] = {}
    renames: dict[str, str] = {}
    for item in b.body:
        base = base_name(item)
        if base not in bases:
            bases[base] = unique_name(base, taken)
            taken.add(bases[base])
        group = own_group(item)
        renames[item.name] = bases[base] if group is None else f"{bases[base]}@{group}"
    return renames, bases


def _which(ix: Index, loop: str) -> str:
    return {"int": f"iteration {ix.value} of '{loop}'", "last": f"the last iteration of '{loop}'",
            "all": f"every iteration of '{loop}'", "loop": f"iteration '{ix.loop}.i' of '{loop}'"}[ix.kind]


def build_interleave(wf: Workflow, loop_path: Path, stagger: int = 1) -> Rewritten:
    """Order a split loop body by (stage + group * stagger): stage s of group g next to stage s-stagger
    of group g+1, so that different components work on different groups at the same time. A loop split
    in time (`loop_path` names the split loop, whose groups `name@g` are its siblings): the groups take
    turns, one call each."""
    if wf.find(loop_path) is None and temporal_groups(wf, loop_path):
        return _interleave_temporal(wf, loop_path, stagger)
    loop = find(wf, loop_path)
    if not isinstance(loop, LoopNode):
        raise Refused(f"'{loop.name}' is not a loop")
    groups = [i for i in loop.body if not isinstance(i, MergeNode)]
    merges = [i for i in loop.body if isinstance(i, MergeNode)]
    if not groups or any(i.plan.split_of is None or i.plan.group is None for i in groups):
        raise Refused(f"the body of '{loop.name}' is not split into groups: split it first", at=loop.pos)
    if stagger < 1:
        raise Refused("stagger must be at least 1")
    stages = list(dict.fromkeys(base_name(i) for i in groups))

    def key(i: Item) -> tuple[int, int]:
        assert isinstance(i, ExecutionNode | LoopNode) and i.plan.group is not None
        return (stages.index(base_name(i)) + i.plan.group * stagger, i.plan.group)

    new = replace_body(wf, loop_path, [*sorted(groups, key=key), *merges])
    return Rewritten(new, identity_locate, f"interleaving the groups of '{loop.name}' with stagger {stagger}")


def build_interleave_siblings(wf: Workflow, paths: Sequence[Path]) -> Rewritten:
    """Consecutive sibling loops that take turns, one call each (round robin, each keeping its own order),
    instead of one loop after the other: `LoopPlan.interleaved` on loops that are not temporal groups.
    Only the order changes; the pass runner's order check refuses it where one loop reads a value of the
    other or their state accesses would observe other writes."""
    if len(paths) < 2:
        raise Refused("interleaving loops needs at least two sibling loops (or one loop split in time)")
    parent = one_body(wf, paths, "the loops to interleave")
    body = list(children(find(wf, parent)))
    names = [i.name for i in body]
    for p in paths:
        item = find(wf, p)
        if not isinstance(item, LoopNode):
            raise Refused(f"'{item.name}' is not a loop: only loops take turns", at=item.pos)
        if item.temporal_group:
            raise Refused(f"'{item.name}' is a temporal group: interleave its split loop ('interleave {item.plan.split_of}')",
                          at=item.pos)
        if item.plan.interleaved:
            raise Refused(f"loop '{item.name}' already takes turns with its neighbours", at=item.pos)
    at = sorted(names.index(p[-1]) for p in paths)
    if at != list(range(at[0], at[0] + len(at))):
        between = [n for n in names[at[0]:at[-1] + 1] if n not in {p[-1] for p in paths}]
        raise Refused(f"the loops to interleave must be next to each other; {', '.join(repr(n) for n in between)} "
                      f"{'is' if len(between) == 1 else 'are'} between them (rewire it before or after them first)")
    check_independent(wf, [tuple(p) for p in paths])
    neighbours = [body[j] for j in (at[0] - 1, at[-1] + 1) if 0 <= j < len(body)]
    if any(isinstance(n, LoopNode) and n.plan.interleaved and not n.temporal_group for n in neighbours):
        raise Refused("a loop next to these already takes turns with its own neighbours: interleave them all in one request")
    chosen = {p[-1] for p in paths}
    new = replace_body(wf, parent, [replace(i, plan=replace(i.plan, interleaved=True))
                                    if isinstance(i, LoopNode) and i.name in chosen else i for i in body])
    order = [names[j] for j in at]
    return Rewritten(new, identity_locate, f"interleaving loops {', '.join(order)}: one call of each in turn")


def check_independent(wf: Workflow, loops: Sequence[Path]) -> None:
    """No call inside one of `loops` depends on a call inside another, in one RL iteration (a value, a state
    access, an `after:`): then any interleaving of their calls that keeps each loop's own order keeps every
    dependency. Checked before the order check, which would meet the value of a call not yet run."""
    from ..analysis import invocation_graph
    from .legality import describe_invocation

    def owner(path: Path) -> Path | None:
        return next((lp for lp in loops if path[:len(lp)] == lp), None)

    g = invocation_graph(wf, iterations=1)
    items = {i.path: i for i in wf.items()}
    for producer, consumer, dep in g.edges():
        a, b = owner(producer.path), owner(consumer.path)
        if a is not None and b is not None and a != b:
            raise Refused(f"'{b[-1]}' depends on '{a[-1]}': {describe_invocation(consumer, items)} needs "
                          f"{describe_invocation(producer, items)} ({dep.kind}: {dep.detail}), so the two loops "
                          "cannot take turns", at=items[consumer.path].pos)


def temporal_groups(wf: Workflow, loop_path: Path) -> list[LoopNode]:
    """The temporal groups (`split-time`) of the loop once at `loop_path`, siblings in its parent."""
    parent = wf.find(loop_path[:-1]) if len(loop_path) > 1 else None
    if parent is None:
        return []
    return [i for i in children(parent) if isinstance(i, LoopNode) and i.temporal_group and i.plan.split_of == loop_path[-1]]


def _interleave_temporal(wf: Workflow, loop_path: Path, stagger: int) -> Rewritten:
    groups = temporal_groups(wf, loop_path)
    name = loop_path[-1]
    if stagger != 1:
        raise Refused(f"the temporal groups of '{name}' take turns one call each: a stagger ({stagger}) does not "
                      "apply to them", at=groups[0].pos)
    if all(g.plan.interleaved for g in groups):
        raise Refused(f"the temporal groups of '{name}' already take turns", at=groups[0].pos)
    parent = loop_path[:-1]
    body = [replace(i, plan=replace(i.plan, interleaved=True)) if isinstance(i, LoopNode) and i in groups else i
            for i in children(find(wf, parent))]
    new = replace_body(wf, parent, body)
    return Rewritten(new, identity_locate,
                     f"interleaving the temporal groups of '{name}' ({', '.join(g.name for g in groups)}): one call each in turn")


def _span(indices: Sequence[int]) -> str:
    """Loop indices for a message: '0..3' when consecutive, else the list."""
    xs = list(indices)
    if xs and xs == list(range(xs[0], xs[0] + len(xs))):
        return str(xs[0]) if len(xs) == 1 else f"{xs[0]}..{xs[-1]}"
    return str(xs)
