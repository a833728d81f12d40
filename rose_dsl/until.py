"""How a loop that ends on a condition (`until:`) ends: per row, or as a whole (docs/language.md).

Per row, a call after some rows are done is given only the rows not done, so rose must know which
dimension of each of its inputs holds the rows, and which rows each call computes: every item of the
body is a call that declares `batch:` (separable, no phases run in its place) or a loop that itself ends
on a condition per row (a turn loop around a decode loop: a row done in the outer loop is done in the
inner one from its start), and the analysis tells the batch dimension of every input
(`transforms.refs.batch_dim`: a number, or none for an integer). A loop that fails one of these ends as a
whole: every row runs every iteration until all rows are done. The runtime, the reference interpreter,
`rose validate`'s note and the rewrites all ask here.
"""

from __future__ import annotations

from dataclasses import replace

from .expr import Expr
from .expr import Record as ExprRecord
from .ir import ExecutionNode, Item, LoopNode, Workflow
from .resolve import Resolver

__all__ = ["whole_reason", "input_dims"]


def whole_reason(resolver: Resolver, loop: LoopNode) -> str | None:
    """None when the dynamic loop ends per row, else why it ends as a whole (a clause for a message)."""
    for item in loop.body:
        if isinstance(item, LoopNode):
            if not item.dynamic:
                return f"its body holds loop '{item.name}', which does not end on a condition"
            inner = whole_reason(resolver, item)
            if inner is not None:
                return f"its body holds loop '{item.name}', which ends as a whole ({inner})"
            continue
        if not isinstance(item, ExecutionNode):
            return f"its body holds merge '{item.name}' of row groups split inside it"
        if item.batch is None:
            return f"'{item.name}' declares no batch:"
        if not item.separable:
            return f"'{item.name}' is not separable"
        if item.plan.expand and item.phases:
            return f"'{item.name}' runs its phases"
        for port, expr in item.inputs:
            if any(d == "unknown" for d in input_dims(resolver, item, port, expr).values()):
                return f"rose cannot tell the rows of input '{port}' of '{item.name}'"
    return None


def input_dims(resolver: Resolver, node: ExecutionNode, port: str, expr: Expr) -> dict[int, int | None | str]:
    """The batch dimension of each part of an input that is taken on its own (a record's fields, else the
    whole value), by id of its expression: a number, None (an integer), or 'unknown'."""
    from .transforms.refs import batch_dim

    table = resolver.tables.field(node, f"in.{port}", expr)
    out: dict[int, int | None | str] = {}

    def visit(e: Expr) -> None:
        if isinstance(e, ExprRecord):
            for _, v in e.fields:
                visit(v)
        else:
            out[id(e)] = batch_dim(resolver, e, table)

    visit(expr)
    return out


REPRESENTATIVE = 2  # iterations through which a loop that ends on a condition is analysed


def representative(wf: Workflow) -> Workflow:
    """The workflow with every loop that ends on a condition run as a static loop of its first
    `REPRESENTATIVE` iterations (fewer if its `count` says so). How many iterations such a loop runs is
    known only at run time; two show every kind of edge it can have: into its first iteration, between
    consecutive iterations (carried values, state), and out of its last. Rewrites keep these loops whole,
    so nothing depends on the number."""
    if not any(isinstance(i, LoopNode) and i.dynamic for i in wf.items()):
        return wf

    def fix(item: Item) -> Item:
        if isinstance(item, LoopNode):
            body = tuple(fix(c) for c in item.body)
            if item.dynamic:
                return replace(item, body=body, until=None, count=min(item.count or REPRESENTATIVE, REPRESENTATIVE))
            return replace(item, body=body)
        if isinstance(item, ExecutionNode) and item.phases:
            return replace(item, phases=tuple(fix(c) for c in item.phases))
        return item

    return replace(wf, root=fix(wf.root))  # type: ignore[arg-type]
