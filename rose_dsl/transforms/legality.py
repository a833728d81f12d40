"""The legality oracle of the rewrites: the rewritten workflow is well formed, and every dependency of
the original still runs producer before consumer.

A reordering keeps every invocation and every reference; it only changes program order, which is
each component's execution order (and so the order of its state accesses). It is legal iff the
rewritten workflow is well formed and every dependency of the original -- data, and state conflicts
(read/update/refresh after a write, a write after a read) -- still runs producer before consumer. The
check works on the invocation graphs of two consecutive RL iterations, so a refusal names the exact
dependency and invocations it would break ("epoch[1].step[2].env -> update[0].sgd"), and where the
consumer reads it in the original workflow (file:line:col).

A temporal split gives some groups their own copy of a component: an in-place order between two calls
that now touch different copies is gone with the shared object, and is not required; a value that
would flow from one copy to the other is (it would not arrive).
"""

from __future__ import annotations

from collections.abc import Mapping

from ..analysis import Dep, invocation_graph
from ..errors import SourcePos
from ..ir import ExecutionNode, Item, Workflow
from ..resolve import check_workflow
from ..semantics import Invocation, enclosing_loops
from .rewritten import Locate, Refused

__all__ = ["check_well_formed", "check_order_preserved", "describe_invocation", "dependency_pos"]


def describe_invocation(inv: Invocation, items: Mapping[tuple[str, ...], Item]) -> str:
    """`epoch[1].step[2].act`: the path below the RL iteration with each loop's iteration number; the
    RL iteration itself is named only when it is not the first (`(next RL iteration)`)."""
    loops = enclosing_loops(inv.path, items)
    index = dict(zip(loops, inv.indices, strict=False))
    parts = [name + (f"[{index[inv.path[:n + 1]]}]" if inv.path[:n + 1] in index else "")
             for n, name in enumerate(inv.path) if n > 0]
    rl = inv.indices[0] if inv.indices else 0
    return ".".join(parts) + (" (next RL iteration)" if rl > 0 else "")


def dependency_pos(node: ExecutionNode, dep: Dep) -> SourcePos:
    """Where the consumer of a dependency asks for it in its workflow: the input field of a data
    dependency, the `state:` field of a state one."""
    if dep.kind == "data":
        key = dep.detail.split(" <- ", 1)[0]  # "in.obs"
        return node.field_pos.get(key) or node.field_pos.get("in") or node.pos
    return node.field_pos.get("state") or node.pos


def check_well_formed(new: Workflow, what: str) -> None:
    diags = check_workflow(new)
    if diags:
        d = diags[0]
        raise Refused(f"{what} would break a data dependency: {d.path}: {d.message}", at=d.pos)


def check_order_preserved(orig: Workflow, new: Workflow, locate: Locate, what: str, *,
                          copies: bool = False) -> None:
    """Refuse unless every dependency of `orig` runs producer before consumer in `new`. With `copies`,
    the order between calls on different copies of a component (a temporal split) is not required,
    unless a value flows between them."""
    check_well_formed(new, what)
    g0 = invocation_graph(orig, iterations=2)
    g1 = invocation_graph(new, iterations=2)
    position = {inv: i for i, inv in enumerate(g1.order)}
    items = {item.path: item for item in orig.items()}

    def image(inv: Invocation) -> Invocation:
        loc = locate(inv.path, inv.indices)
        if loc is None:
            raise Refused(f"{what}: {describe_invocation(inv, items)} has no counterpart (a bug in rose)", internal=True)
        return Invocation(*loc)

    for inv in g0.order:
        if image(inv) not in position:
            raise Refused(f"{what}: {describe_invocation(inv, items)} is not run by the rewritten workflow "
                          "(a bug in rose)", internal=True)
    if len(g0.order) != len(g1.order):
        raise Refused(f"{what}: it runs {len(g1.order)} calls instead of {len(g0.order)} (a bug in rose)", internal=True)
    for producer, consumer, dep in sorted(g0.edges(), key=lambda e: (str(e[1]), str(e[0]))):
        a, b = image(producer), image(consumer)
        if copies and dep.kind == "state" and g1.node[a].component != g1.node[b].component:
            if not dep.flow:
                continue  # an in-place order on an object the two calls no longer share
            raise Refused(_broken(what, producer, consumer, dep, items, "would read it from another copy of the "
                                  f"component ('{g1.node[b].component}' instead of '{g1.node[a].component}')"),
                          at=dependency_pos(g0.node[consumer], dep))
        if position[a] > position[b]:
            raise Refused(_broken(what, producer, consumer, dep, items,
                                  f"{describe_invocation(consumer, items)} would run first"),
                          at=dependency_pos(g0.node[consumer], dep))


def _broken(what: str, producer: Invocation, consumer: Invocation, dep: Dep,
            items: Mapping[tuple[str, ...], Item], how: str) -> str:
    kind = "data dependency" if dep.kind == "data" else "state dependency"
    return (f"{what} would break the {kind} {describe_invocation(producer, items)} -> "
            f"{describe_invocation(consumer, items)} ({dep.detail}): {how}")
