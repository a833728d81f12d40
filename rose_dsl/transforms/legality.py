"""The legality oracle of reordering rewrites (Rewire, Interleave, loop fusion).

A reordering keeps every invocation and every reference; it only changes program order, which is
each component's execution order (and so the order of its state accesses). It is legal iff the
rewritten workflow is well formed and every dependency of the original -- data, and state conflicts
(read/update/refresh after a write, a write after a read) -- still runs producer before consumer. The
check works on the invocation graphs of two consecutive RL iterations, so a refusal names the exact
dependency and invocations it would break.
"""

from __future__ import annotations

from ..analysis import invocation_graph
from ..ir import Workflow
from ..resolve import check_workflow
from ..semantics import Invocation
from .common import Locate, Refused

__all__ = ["check_well_formed", "check_order_preserved"]


def check_well_formed(new: Workflow, what: str) -> None:
    diags = check_workflow(new)
    if diags:
        d = diags[0]
        raise Refused(f"{what} would break a data dependency: {d.path}: {d.message}")


def check_order_preserved(orig: Workflow, new: Workflow, locate: Locate, what: str) -> None:
    check_well_formed(new, what)
    g0 = invocation_graph(orig, iterations=2)
    g1 = invocation_graph(new, iterations=2)
    position = {inv: i for i, inv in enumerate(g1.order)}

    def image(inv: Invocation) -> Invocation:
        loc = locate(inv.path, inv.indices)
        if loc is None:
            raise Refused(f"{what}: internal error: {inv} has no counterpart")
        return Invocation(*loc)

    moved: dict[Invocation, int] = {}  # original invocation -> position of its image in the rewrite
    for inv in g0.order:
        at = position.get(image(inv))
        if at is None:
            raise Refused(f"{what}: internal error: {inv} is not run by the rewritten workflow")
        moved[inv] = at
    if len(g0.order) != len(g1.order):
        raise Refused(f"{what}: internal error: it runs {len(g1.order)} calls instead of {len(g0.order)}")
    broken = [e for e in g0.edges() if moved[e[0]] > moved[e[1]]]
    if broken:  # name the first by consumer, then producer (sorting only the broken ones: refusals are rare)
        producer, consumer, dep = min(broken, key=lambda e: (str(e[1]), str(e[0])))
        kind = {"data": "data dependency", "after": "ordering constraint"}.get(dep.kind, "state dependency")
        raise Refused(f"{what} would run {image(consumer)} before {image(producer)}, breaking the {kind} {dep.detail}")
