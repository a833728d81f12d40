"""Helpers shared by the rewrites: refusals, editing an item tree immutably, rewriting references by
their bindings, batch-dimension inference, and mapping original invocations to rewritten ones."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..expr import BinOp, Call, Expr, Int, IterRef, Neg, Param, Record, Ref, Slice
from ..ir import ExecutionNode, Item, LoopNode, MergeNode, Workflow
from ..resolve import Binding, CarryIn, IterSelect, LoopIndex, NodePort, ParentInput, Resolver

__all__ = [
    "Refused", "Rewritten", "Locate", "find", "replace_item", "replace_body", "rewrite_expr", "uses_by_id",
    "map_item_exprs", "batch_dim", "identity_locate", "item_paths", "rename_head",
]

Path = tuple[str, ...]
# Where an invocation of the original workflow (path, loop indices) is computed in the rewritten one.
Locate = Callable[[Path, tuple[int, ...]], tuple[Path, tuple[int, ...]] | None]


class Refused(Exception):
    """A rewrite that would change what training computes, or that does not apply. `reason` names the
    dependency or the property that forbids it."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Rewritten:
    workflow: Workflow
    locate: Locate
    description: str
    notes: tuple[str, ...] = field(default=())


def identity_locate(path: Path, indices: tuple[int, ...]) -> tuple[Path, tuple[int, ...]]:
    return path, indices


def find(wf: Workflow, path: Path) -> Item:
    item = wf.find(tuple(path))
    if item is None:
        raise Refused(f"no item '{'.'.join(path)}' in the workflow")
    return item


def item_paths(wf: Workflow) -> dict[str, list[Path]]:
    """name -> every path with that last component (to resolve short names on the command line)."""
    out: dict[str, list[Path]] = {}
    for item in wf.items():
        out.setdefault(item.name, []).append(item.path)
    return out


def replace_item(wf: Workflow, path: Path, new: Item | Sequence[Item]) -> Workflow:
    """Replace the item at `path` by one or several items (in its body), returning a new workflow."""
    news = [new] if not isinstance(new, Sequence) else list(new)

    def walk(item: Item) -> Item:
        if isinstance(item, LoopNode):
            body: list[Item] = []
            for child in item.body:
                if child.path == path:
                    body.extend(news)
                else:
                    body.append(walk(child))
            return replace(item, body=tuple(body))
        if isinstance(item, ExecutionNode) and item.phases:
            phases: list[Item] = []
            for child in item.phases:
                if child.path == path:
                    phases.extend(news)
                else:
                    phases.append(walk(child))
            return replace(item, phases=tuple(phases))
        return item

    if path == wf.root.path:
        assert len(news) == 1 and isinstance(news[0], LoopNode)
        return replace(wf, root=news[0])
    return replace(wf, root=walk(wf.root))  # type: ignore[arg-type]


def replace_body(wf: Workflow, parent: Path, body: Sequence[Item]) -> Workflow:
    item = find(wf, parent)
    if isinstance(item, LoopNode):
        return replace_item(wf, parent, replace(item, body=tuple(body)))
    assert isinstance(item, ExecutionNode)
    return replace_item(wf, parent, replace(item, phases=tuple(body)))


def uses_by_id(resolver: Resolver, item: Item, key: str, expr: Expr) -> dict[int, Binding]:
    table: dict[int, Binding] = {}

    def add(uses):
        for u in uses:
            table[id(u.expr)] = u.binding
            if isinstance(u.binding, IterSelect):
                add(u.binding.inner)

    add(resolver.resolve_field(item, key, expr))
    return table


def rewrite_expr(expr: Expr, bound: dict[int, Binding], fn: Callable[[Expr, Binding], Expr | None]) -> Expr:
    """A copy of `expr` where every reference for which `fn` returns an expression is replaced by it."""
    match expr:
        case Ref() | IterRef():
            b = bound.get(id(expr))
            if b is not None:
                new = fn(expr, b)
                if new is not None:
                    return new
            if isinstance(expr, IterRef):
                return replace(expr, inner=rewrite_expr(expr.inner, bound, fn))
            return expr
        case BinOp(left=a, right=b):
            return replace(expr, left=rewrite_expr(a, bound, fn), right=rewrite_expr(b, bound, fn))
        case Neg(operand=a):
            return replace(expr, operand=rewrite_expr(a, bound, fn))
        case Record(fields=fields):
            return replace(expr, fields=tuple((n, rewrite_expr(v, bound, fn)) for n, v in fields))
        case Call(args=args):
            return replace(expr, args=tuple(rewrite_expr(a, bound, fn) for a in args))
        case Slice(target=t, start=s, stop=p):
            return replace(expr, target=rewrite_expr(t, bound, fn),
                           start=None if s is None else rewrite_expr(s, bound, fn),
                           stop=None if p is None else rewrite_expr(p, bound, fn))
    return expr


def map_item_exprs(item: Item, fn: Callable[[str, Expr], Expr]) -> Item:
    """A copy of one item (not its children) with every expression field passed through fn(key, expr)."""
    if isinstance(item, ExecutionNode):
        return replace(item, inputs=tuple((p, fn(f"in.{p}", e)) for p, e in item.inputs))
    if isinstance(item, LoopNode):
        carries = tuple(replace(c, init=fn(f"carry.{c.name}.init", c.init), next=fn(f"carry.{c.name}.next", c.next))
                        for c in item.carries)
        until = fn("until", item.until) if item.until is not None else None
        collects = tuple((n, fn(f"collect.{n}", e)) for n, e in item.collects)
        return replace(item, carries=carries, until=until, collects=collects)
    return item


def rename_head(expr: Expr, old: str, new: str) -> Expr:
    """Rename references whose head (or IterRef loop) is `old` -- used for phases reading `parent.port`."""
    match expr:
        case Ref(head=h) if h == old:
            return replace(expr, head=new)
        case IterRef(loop=lp, inner=inner):
            return replace(expr, loop=new if lp == old else lp, inner=rename_head(inner, old, new))
        case BinOp(left=a, right=b):
            return replace(expr, left=rename_head(a, old, new), right=rename_head(b, old, new))
        case Neg(operand=a):
            return replace(expr, operand=rename_head(a, old, new))
        case Record(fields=fields):
            return replace(expr, fields=tuple((n, rename_head(v, old, new)) for n, v in fields))
        case Call(args=args):
            return replace(expr, args=tuple(rename_head(a, old, new) for a in args))
        case Slice(target=t, start=s, stop=p):
            return replace(expr, target=rename_head(t, old, new), start=None if s is None else rename_head(s, old, new),
                           stop=None if p is None else rename_head(p, old, new))
    return expr


def batch_dim(resolver: Resolver, expr: Expr, bound: dict[int, Binding], depth: int = 0) -> int | None | str:
    """Which dimension of the value of `expr` is the batch: an int, None for integers (broadcast to
    every group), or 'unknown' (a value whose rows rose cannot tell, e.g. from a non-separable node)."""
    if depth > 50:
        return "unknown"
    match expr:
        case Int() | BinOp() | Neg():
            return None
        case Param():
            return None
        case Ref() | IterRef():
            b = bound.get(id(expr))
            return _binding_dim(resolver, expr, b, bound, depth)
        case Slice(target=t):
            return batch_dim(resolver, t, bound, depth + 1)
        case Record(fields=fields):
            dims = {batch_dim(resolver, v, bound, depth + 1) for _, v in fields}
            dims.discard(None)
            return dims.pop() if len(dims) == 1 else ("unknown" if dims else None)
        case Call(fn=fn, args=args):
            dims = {batch_dim(resolver, a, bound, depth + 1) for a in args}
            if len(dims) != 1:
                return "unknown"
            d = dims.pop()
            if d is None or d == "unknown":
                return "unknown"
            return d + 1 if fn == "stack" else ("unknown" if d == 0 else d)
    return "unknown"


def _binding_dim(resolver: Resolver, expr: Expr, b: Binding | None, bound, depth: int) -> int | None | str:
    match b:
        case LoopIndex():
            return None
        case NodePort(node=node, port=port):
            item = resolver.items[node]
            if isinstance(item, ExecutionNode):
                return item.batch if item.batch is not None else "unknown"
            if isinstance(item, MergeNode):
                return dict(item.ports)[port]
            assert isinstance(item, LoopNode)
            c = item.carry(port)
            if c is not None:
                return _carry_dim(resolver, item, c, depth)
            e = dict(item.collects)[port]
            return _field_dim(resolver, item, f"collect.{port}", e, depth)
        case CarryIn(loop=loop, var=var):
            item = resolver.items[loop]
            assert isinstance(item, LoopNode)
            c = item.carry(var)
            assert c is not None
            return _carry_dim(resolver, item, c, depth)
        case ParentInput(node=node, port=port):
            parent = resolver.items[node]
            assert isinstance(parent, ExecutionNode)
            return _field_dim(resolver, parent, f"in.{port}", dict(parent.inputs)[port], depth)
        case IterSelect(index=ix):
            assert isinstance(expr, IterRef)
            inner = batch_dim(resolver, expr.inner, bound, depth + 1)
            if ix.kind == "all" or inner is None or inner == "unknown":
                return inner
            return inner
    return "unknown"


def _carry_dim(resolver: Resolver, loop: LoopNode, c: Any, depth: int) -> int | None | str:
    """A carried value has a batch dimension only if its first value and every next one agree on it."""
    first = _field_dim(resolver, loop, f"carry.{c.name}.init", c.init, depth)
    later = _field_dim(resolver, loop, f"carry.{c.name}.next", c.next, depth)
    return first if first == later else "unknown"


def _field_dim(resolver: Resolver, item: Item, key: str, expr: Expr, depth: int) -> int | None | str:
    return batch_dim(resolver, expr, uses_by_id(resolver, item, key, expr), depth + 1)


def unique_name(name: str, taken: set[str]) -> str:
    if name not in taken:
        return name
    n = 2
    while f"{name}_{n}" in taken:
        n += 1
    return f"{name}_{n}"

