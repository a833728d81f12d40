"""Rewire, Interleave, Expand and loop fusion: rewrites that change program order, not the work.

* `rewire` moves an item among its siblings (before or after another one).
* `fuse_loops` moves the body of a later loop into an earlier sibling loop with the same iterations --
  the paper's Rewire across loop levels (Figure 9b): PPO update j runs right after rollout epoch j's
  trajectories exist, overlapping rollout epoch j+1, instead of after all epochs.
* `interleave` staggers the groups of a split loop body so that stage s of group g is next to stage
  s-1 of group g+1 (policy(B) next to sim(A)), each group keeping its own order.
* `expand` runs a node's exposed phases instead of its entry (never both).
Each is checked by `legality.check_order_preserved`.
"""

from __future__ import annotations

from dataclasses import replace

from ..expr import Expr, IterRef
from ..ir import ExecutionNode, Item, LoopNode, MergeNode, Workflow
from ..resolve import CarryIn, IterSelect, Resolver
from .common import (
    RefUse,
    Refused,
    Rewritten,
    find,
    identity_locate,
    rename_ref,
    replace_body,
    unique_name,
)
from .legality import check_order_preserved, check_well_formed
from .plan_check import source_paths
from .split import _repath, _rewrite_outside, map_subtree

__all__ = ["rewire", "fuse_loops", "interleave", "expand"]

Path = tuple[str, ...]


def _siblings(wf: Workflow, path: Path) -> tuple[Item, tuple[Item, ...]]:
    parent = find(wf, path[:-1]) if len(path) > 1 else None
    if parent is None:
        raise Refused("the iteration loop itself cannot be moved")
    body = parent.body if isinstance(parent, LoopNode) else parent.phases
    assert body is not None
    return parent, body


def rewire(wf: Workflow, path: Path, *, before: str | None = None, after: str | None = None,
           check: bool = True) -> Rewritten:
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
    new_body = rest[:at] + [item] + rest[at:]
    new = replace_body(wf, parent.path, new_body)
    what = f"moving '{item.name}' {'before' if before else 'after'} '{anchor}'"
    if check:
        check_order_preserved(wf, new, identity_locate, what)
    return Rewritten(new, identity_locate, what)


def expand(wf: Workflow, path: Path, on: bool = True) -> Rewritten:
    node = find(wf, path)
    if not isinstance(node, ExecutionNode) or not node.phases:
        raise Refused(f"'{node.name}' exposes no phases", at=node.pos)
    parent, body = _siblings(wf, path)
    new = replace_body(wf, parent.path, [replace(i, expand=on) if i.path == path else i for i in body])
    check_well_formed(new, f"expanding '{node.name}'")

    def locate(p: Path, idx: tuple[int, ...]):
        return (p, idx) if on or p[: len(path)] != path or p == path else None

    return Rewritten(new, locate, f"{'run the phases of' if on else 'run the entry of'} {'.'.join(path)}")


def fuse_loops(wf: Workflow, first: Path, second: Path, *, check: bool = True) -> Rewritten:
    """Run iteration j of `second` at the end of iteration j of `first` (same iteration numbers)."""
    a, b = find(wf, first), find(wf, second)
    if not isinstance(a, LoopNode) or not isinstance(b, LoopNode):
        raise Refused("both items must be loops")
    if first[:-1] != second[:-1]:
        raise Refused(f"'{a.name}' and '{b.name}' are not siblings")
    parent, body = _siblings(wf, first)
    names = [i.name for i in body]
    if names.index(a.name) > names.index(b.name):
        raise Refused(f"'{a.name}' runs after '{b.name}': fuse the earlier loop first", at=a.pos)
    if a.dynamic or b.dynamic:
        dyn = a if a.dynamic else b
        raise Refused(f"loop '{dyn.name}' ends on a condition (until): its iterations are known only as it runs, so "
                      "they cannot be paired with another loop's", at=dyn.field_pos.get("until") or dyn.pos)
    if a.indices() != b.indices():
        raise Refused(f"'{a.name}' and '{b.name}' run different iterations ({len(a.indices())} vs {len(b.indices())})",
                      at=b.field_pos.get("count") or b.pos)
    if b.carries or b.collects:
        raise Refused(f"'{b.name}' has carried values or collected outputs; fusing it would change them", at=b.pos)
    resolver = Resolver(wf)
    # a name taken in a's body gets a suffix; the groups of a split item and their merge keep one base name
    taken = {i.name for i in a.body} | {i.split_of for i in a.body if getattr(i, "split_of", None)}
    bases: dict[str, str] = {}
    renames: dict[str, str] = {}
    for item in b.body:
        base = getattr(item, "split_of", None) or item.name
        if base not in bases:
            bases[base] = unique_name(base, taken)
            taken.add(bases[base])
        renames[item.name] = bases[base] + item.name[len(base):]
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
                raise Refused(f"'{b.name}' reads '{_text(use.original)}' ({_which(ix, a.name)}): fused, "
                              f"{b.name}[0] would run inside {a.name}[0], before {later} has computed it")
            case CarryIn(loop=lp) if lp == second:
                raise Refused("unreachable: carries were refused")
        return rename_ref(use, names)

    origin = source_paths(wf)
    moved = []
    for item in b.body:
        m = map_subtree(resolver, item, fn)
        if not isinstance(m, MergeNode):
            m = replace(m, moved_from=origin[item.path])  # where a plan check finds it in the source
        m = _repath(m, item.path, first + (renames[item.name],))
        m = replace(m, after=tuple(renames.get(x, x) for x in m.after))
        if isinstance(m, MergeNode):
            m = replace(m, sources=tuple(renames[x] for x in m.sources))
        elif m.split_of is not None and item.name != m.split_of:
            m = replace(m, split_of=bases[item.split_of])
        moved.append(m)
    fused = replace(a, body=a.body + tuple(moved))
    new_body = [fused if i.path == first else i for i in body if i.path != second]
    new = replace_body(wf, parent.path, new_body)
    # later items reading `second[j].X` now read `first[j].X'`
    new = _rewrite_outside(new, wf, resolver, second, lambda use: rename_ref(use, names))

    def locate(p: Path, idx: tuple[int, ...]):
        if p[: len(second)] == second and len(p) > len(second):
            return first + (renames[p[len(second)]],) + p[len(second) + 1:], idx
        return p, idx

    what = f"fusing loop '{b.name}' into loop '{a.name}'"
    if check:
        check_order_preserved(wf, new, locate, what)
    return Rewritten(new, locate, what)


def _which(ix, loop: str) -> str:
    return {"int": f"iteration {ix.value} of '{loop}'", "last": f"the last iteration of '{loop}'",
            "all": f"every iteration of '{loop}'", "loop": f"iteration '{ix.loop}.i' of '{loop}'"}[ix.kind]


def _text(e: Expr) -> str:
    from ..expr import unparse

    return unparse(e)


def interleave(wf: Workflow, loop_path: Path, stagger: int = 1, *, check: bool = True) -> Rewritten:
    """Order a split loop body by (stage + group * stagger): stage s of group g next to stage s-stagger
    of group g+1, so that different components work on different groups at the same time."""
    loop = find(wf, loop_path)
    if not isinstance(loop, LoopNode):
        raise Refused(f"'{loop.name}' is not a loop")
    groups = [i for i in loop.body if not isinstance(i, MergeNode)]
    merges = [i for i in loop.body if isinstance(i, MergeNode)]
    if not groups or any(i.split_of is None or "@" not in i.name for i in groups):
        raise Refused(f"the body of '{loop.name}' is not split into groups: split it first", at=loop.pos)
    stages: list[str] = []
    for i in groups:
        if i.split_of not in stages:
            stages.append(i.split_of)  # type: ignore[arg-type]
    if stagger < 1:
        raise Refused("stagger must be at least 1")

    def key(i: Item) -> tuple[int, int]:
        g = int(i.name.rsplit("@", 1)[1])
        return (stages.index(i.split_of) + g * stagger, g)  # type: ignore[arg-type]

    new_body = sorted(groups, key=key) + merges
    new = replace_body(wf, loop_path, new_body)
    what = f"interleaving the groups of '{loop.name}' with stagger {stagger}"
    if check:
        check_order_preserved(wf, new, identity_locate, what)
    return Rewritten(new, identity_locate, what)
