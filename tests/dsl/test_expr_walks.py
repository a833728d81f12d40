"""`children` and `map_expr` (rose_dsl/expr.py) are the one place that knows the shape of every
expression node (issue 43); every walk over expressions (`walk`, name resolution, the ref rewrites,
forwarding merge slices, region feeds) leaves the nodes it does not handle to them. These tests pin
that every node kind's sub-expressions are seen and rebuilt."""

from __future__ import annotations

from dataclasses import replace

import pytest

from rose_dsl.expr import Expr, Index, Int, Ref, children, map_expr, parse_expr, unparse, walk

TEXTS = [
    "a.x", "loop[-1].b.y", "loop[*].{b.y, z: c.w}", "stack(a.x, loop[loop.i].b.y)", "a.x[2:${n} * 4]",
    "a.x[:3]", "{u: a.x[1:], v: cat(b.y, c.z)}", "-(${n} + 2) // 3",
]


def _renamed(e: Expr) -> Expr:
    """Every reference's head upper-cased, through `map_expr` for every other node."""
    return replace(e, head=e.head.upper()) if isinstance(e, Ref) else map_expr(e, _renamed)


@pytest.mark.parametrize("text", TEXTS)
def test_map_expr_reaches_every_reference_and_keeps_the_rest(text: str) -> None:
    e = parse_expr(text)
    assert map_expr(e, lambda x: x) == e
    refs = [x for x in walk(e) if isinstance(x, Ref)]
    out = _renamed(e)
    assert [x.head for x in walk(out) if isinstance(x, Ref)] == [r.head.upper() for r in refs]
    assert unparse(out).lower() == unparse(e).lower()


def test_walk_is_pre_order_over_children() -> None:
    e = parse_expr("stack(a.x[1:b.n], loop[-1].{c.y})")
    assert [unparse(x) if not isinstance(x, Index) else "<index>" for x in walk(e)] == [
        "stack(a.x[1:b.n], loop[-1].{c.y})", "a.x[1:b.n]", "a.x", "1", "b.n", "loop[-1].{c.y}", "<index>",
        "{c.y}", "c.y"]


def test_children_of_each_node_kind() -> None:
    s = parse_expr("a.x[1:b.n]")
    assert [unparse(c) for c in children(s)] == ["a.x", "1", "b.n"]
    it = parse_expr("loop[-1].b.y")
    assert [type(c).__name__ for c in children(it)] == ["Index", "Ref"]
    assert children(parse_expr("a.x")) == ()


def test_map_expr_keeps_an_iteration_index_an_index() -> None:
    with pytest.raises(TypeError, match="index"):
        map_expr(parse_expr("loop[-1].b.y"), lambda x: Int(0, 1))
