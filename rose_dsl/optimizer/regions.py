"""Comparison graphs for local trials (paper §4.3.3, Appendix A "Local validation").

An alternative changes some items of the graph; the lowest common ancestor (LCA) of everything the
alternatives of one target change is their *comparison graph*: the unchanged graph c0 and each
alternative are timed on the LCA's internal graph alone, with the same inputs and the same state.

Why these pieces:
* `changed_regions` finds where two workflows differ (a body whose item names or order changed, or an
  item whose own fields changed), so the comparison graph is as small as the change allows.
* `local_graph` turns the LCA into a runnable workflow: a `__feed__` node replays every value that
  enters the region from outside (inputs of other nodes, outer loops' indices and carried values), and a
  loop region runs a window of its iterations. Outside the LCA the alternatives equal the current graph,
  so the same captured values feed c0 and every alternative.
* `probe_workflow` inserts a `__probe__` node right before each region, in the current graph, whose
  inputs are exactly those external values: running one real iteration of it captures them. It adds a
  call that only reads values, so the iteration computes what the graph computes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace

from ..expr import Call, Expr, Int, IterRef, Ref, map_expr, parse_expr, unparse
from ..expr import children as subexprs
from ..ir import ExecutionNode, Item, LoopNode, Workflow
from ..measurement import FEED, PROBE, feed_component, probe_component
from ..resolve import (
    Binding,
    CarryIn,
    IterSelect,
    LoopIndex,
    NodePort,
    ParentInput,
    Resolver,
    check_workflow,
)
from ..transforms.tree import children, map_item_exprs, map_tree, repath, replace_item

__all__ = ["changed_regions", "common_ancestor", "LocalGraph", "local_graphs", "probe_workflow",
           "FEED", "PROBE", "Probe", "feed_component", "probe_component"]

Path = tuple[str, ...]


# -- where two workflows differ -------------------------------------------------------------------

def _shell(item: Item) -> Item:
    """The item without its children (to compare its own fields)."""
    if isinstance(item, LoopNode):
        return replace(item, body=())
    if isinstance(item, ExecutionNode) and item.phases:
        return replace(item, phases=())
    return item


def changed_regions(old: Workflow, new: Workflow) -> set[Path]:
    """The paths of the bodies in which `new` differs from `old`: a body whose item names or order
    changed, or that holds an item whose own fields (inputs, carries, rows...) changed."""
    regions: set[Path] = set()

    def walk(o: Item, n: Item) -> None:
        oc, nc = children(o), children(n)
        if [c.name for c in oc] != [c.name for c in nc]:
            regions.add(o.path)
            return
        for a, b in zip(oc, nc, strict=True):
            if _shell(a) != _shell(b):
                regions.add(o.path)
            else:
                walk(a, b)

    if _shell(old.root) != _shell(new.root):
        regions.add(old.root.path)
    walk(old.root, new.root)
    return regions


def common_ancestor(paths: Sequence[Path]) -> Path:
    """The longest common prefix of the paths (the lowest common ancestor of the items)."""
    if not paths:
        return ()
    first = paths[0]
    n = len(first)
    for p in paths[1:]:
        n = min(n, len(p))
        for i in range(n):
            if p[i] != first[i]:
                n = i
                break
    return first[:n]


# -- making a region runnable ------------------------------------------------------------------------

@dataclass(frozen=True)
class LocalGraph:
    """A region of a workflow as a workflow of its own: `__feed__` replays `externals` (feed port ->
    expression in the current graph's scope at the region), then the region runs `window` iterations."""

    region: Path
    workflow: Workflow
    externals: tuple[tuple[str, str], ...]  # (feed port, expression text)
    window: int | None  # iterations of a loop region that run (None: the node region runs once)
    writes: tuple[str, ...] = field(default=())  # components whose state the graph writes (snapshot them)


def _within(path: Path, region: Path) -> bool:
    return path[: len(region)] == region


def _is_external(b: Binding, region: Path) -> bool | None:
    """True: the value comes from outside the region; False: from inside; None: it depends on an index
    of the region (a value the region selects per iteration from outside: it cannot be replayed)."""
    match b:
        case NodePort(node=p) | ParentInput(node=p) | CarryIn(loop=p) | LoopIndex(loop=p):
            return not _within(p, region)
        case IterSelect(loop=p, index_loop=il):
            if _within(p, region):
                return False
            return None if il is not None and _within(il, region) else True
    return True


class _Unreplayable(Exception):
    pass


def _externalize(expr: Expr, bound: Mapping[int, Binding], region: Path, port: Callable[[str], str]) -> Expr:
    """`expr` with every maximal part whose value comes from outside the region replaced by a feed port."""

    def refs(e: Expr) -> Iterator[Expr]:
        match e:
            case Ref() | IterRef():
                yield e
            case _:
                for c in subexprs(e):
                    yield from refs(c)

    def external(e: Expr) -> bool:
        flags = [_is_external(bound[id(r)], region) for r in refs(e) if id(r) in bound]
        if any(f is None for f in flags):
            raise _Unreplayable(unparse(e))
        return bool(flags) and all(flags)

    def walk(e: Expr) -> Expr:
        match e:
            case Ref() | IterRef():
                b = bound.get(id(e))
                if b is not None and _is_external(b, region) is None:
                    raise _Unreplayable(unparse(e))
                return Ref(e.offset, FEED, port(unparse(e))) if b is not None and _is_external(b, region) else e
            case Call():  # `stack(loop[*]...)` from outside is one value, not a list of them
                if external(e):
                    return Ref(e.offset, FEED, port(unparse(e)))
        return map_expr(e, walk)

    return walk(expr)


def _rewrite_item(item: Item, resolver: Resolver, region: Path, port: Callable[[str], str]) -> Item:
    """`item` and everything below it with the values from outside the region read from feed ports."""
    def fields(it: Item) -> Item:
        return map_item_exprs(it, lambda key, e: _externalize(e, resolver.tables.field(it, key, e), region, port))

    return map_tree(item, fields)


def _windowed(item: Item, window: int | None) -> Item:
    if not isinstance(item, LoopNode) or window is None or item.dynamic:
        return item
    if item.plan.iterations is not None:
        return replace(item, plan=replace(item.plan, iterations=item.plan.iterations[:window]))
    return replace(item, count=min(item.count or 0, window))


def _writers(item: Item) -> set[str]:
    out = set()
    for it in _walk(item):
        if isinstance(it, ExecutionNode) and any(e.access.writes for e in it.effects):
            out.add(it.component)
    return out


def _walk(item: Item) -> Iterator[Item]:
    yield item
    for c in children(item):
        yield from _walk(c)


def _local(wf: Workflow, region: Path, window: int | None, ports: dict[str, str], feed_impl: str) -> LocalGraph | str:
    item = wf.find(region)
    if item is None:
        return f"no item {'.'.join(region)}"
    if region == wf.root.path:
        return "the comparison graph is the whole iteration"
    resolver = Resolver(wf)
    used: dict[str, str] = {}

    def port(text: str) -> str:
        if text not in ports:
            ports[text] = f"v{len(ports)}"
        used[ports[text]] = text
        return ports[text]

    try:
        body_item = _rewrite_item(item, resolver, region, port)
    except _Unreplayable as exc:
        return f"'{exc.args[0]}' selects outside values by an index of the region: its inputs cannot be replayed"
    root_path = wf.root.path
    local = repath(_windowed(replace(body_item, after=()), window), region, root_path + (region[-1],))
    feed = ExecutionNode(path=root_path + (FEED,), component=FEED, method="get", outputs=tuple(sorted(used, key=_port_key)))
    root = replace(wf.root, body=(feed, local), count=1, carries=(), collects=(), until=None)
    comps = dict(wf.components)
    comps[FEED] = feed_component(feed_impl)
    local_wf = replace(wf, name=f"{wf.name}:{'.'.join(region[1:])}", root=root, components=comps)
    diags = check_workflow(local_wf)
    if diags:
        return f"the region does not stand alone ({diags[0].path}: {diags[0].message})"
    externals = tuple(sorted(((p, used[p]) for p in used), key=lambda pt: _port_key(pt[0])))
    return LocalGraph(region, local_wf, externals, window if isinstance(item, LoopNode) else None,
                      tuple(sorted(_writers(item))))


def _port_key(port: str) -> int:
    return int(port[1:])


def local_graphs(current: Workflow, others: Sequence[Workflow], region: Path, window: int | None,
                 feed_impl: str) -> tuple[LocalGraph | str, list[LocalGraph | str]]:
    """The comparison graph of `region` in the current workflow (c0) and in each alternative, sharing
    feed port names (so one capture feeds them all). A string says why a graph cannot be built."""
    ports: dict[str, str] = {}
    c0 = _local(current, region, window, ports, feed_impl)
    return c0, [_local(wf, region, window, ports, feed_impl) for wf in others]


# -- capturing the inputs in a real iteration --------------------------------------------------------

@dataclass(frozen=True)
class Probe:
    """Capture `externals` (feed port -> expression) just before the item at `region`."""

    id: int  # passed to the probe component's `capture(probe_id, **values)`
    region: Path
    externals: tuple[tuple[str, str], ...]


def probe_workflow(wf: Workflow, probes: Sequence[Probe], probe_impl: str) -> Workflow | str:
    """`wf` with a `__probe__` node inserted right before each probed region; its inputs are the
    values the region takes from outside, and `probe_id` says which probe it is (one component serves
    all). A string says why (e.g. a region inside a node's phases, where a probe cannot stand)."""
    out = wf
    for probe in probes:
        parent = out.find(probe.region[:-1])
        if not isinstance(parent, LoopNode):
            return f"region {'.'.join(probe.region)} is not in a loop body"
        inputs = [("probe_id", Int(0, probe.id))] + [(port, parse_expr(text)) for port, text in probe.externals]
        node = ExecutionNode(path=probe.region[:-1] + (f"__probe_{probe.id}",), component=PROBE, method="capture",
                             inputs=tuple(inputs), outputs=())
        names = [i.name for i in parent.body]
        at = names.index(probe.region[-1])
        body = parent.body[:at] + (node,) + parent.body[at:]
        out = replace_item(out, parent.path, replace(parent, body=body))
    comps = dict(out.components)
    comps[PROBE] = probe_component(probe_impl)
    out = replace(out, components=comps)
    diags = check_workflow(out)
    if diags:
        return f"the probes do not fit ({diags[0].path}: {diags[0].message})"
    return out


def external_texts(graphs: Sequence[LocalGraph]) -> tuple[tuple[str, str], ...]:
    """The union of the graphs' externals (ports are shared by construction)."""
    merged: dict[str, str] = {}
    for g in graphs:
        merged.update(dict(g.externals))
    return tuple(sorted(merged.items(), key=lambda pt: _port_key(pt[0])))

