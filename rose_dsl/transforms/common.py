"""Helpers shared by the rewrites: refusals, editing an item tree immutably, rewriting references by
their bindings, batch-dimension inference, and mapping original invocations to rewritten ones."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..errors import SourcePos
from ..expr import BinOp, Call, Expr, Int, IterRef, Neg, Param, Record, Ref, Slice
from ..ir import ExecutionNode, Item, LoopNode, MergeNode, Workflow
from ..resolve import Binding, CarryIn, IterSelect, LoopIndex, NodePort, ParentInput, Resolver

__all__ = [
    "Refused", "Rewritten", "Locate", "find", "replace_item", "replace_body", "map_tree", "map_workflow", "rewrite_expr", "uses_by_id",
    "map_item_exprs", "map_refs", "rename_ref", "RefUse", "binding_target", "bindings_of", "ref_dim", "batch_dim", "identity_locate", "item_paths",
]

Path = tuple[str, ...]
# Where an invocation of the original workflow (path, loop indices) is computed in the rewritten one.
Locate = Callable[[Path, tuple[int, ...]], tuple[Path, tuple[int, ...]] | None]


class Refused(Exception):
    """A rewrite that would change what training computes, or that does not apply. `reason` names the
    dependency or the property that forbids it, after the position (`at`) of the item or field at fault
    in the workflow the rewrite was asked of -- items a rewrite copies keep their positions, so this
    is a line of the user's file even several rewrites later. `internal` marks a refusal caused by a bug in rose (the
    rewrite could not be built or checked): still a clean refusal, so that a search moves on."""

    def __init__(self, reason: str, *, internal: bool = False, at: SourcePos | None = None) -> None:
        if at is not None and at.line > 0:
            reason = f"{at}: {reason}"  # where, in the workflow the rewrite was asked of
        super().__init__(reason)
        self.reason = reason
        self.at = at if at is not None and at.line > 0 else None
        self.internal = internal  # True when rose failed (a bug), not the request


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


def map_tree(item: Item, fn: Callable[[Item], Item]) -> Item:
    """A copy of the item tree rebuilt bottom up (as fx's `Transformer`, ray.dag's `apply_recursive`):
    each item's children (loop body, phases) are mapped first, then `fn` gets the item holding them.
    Paths and expressions are the original ones until `fn` changes them, so bindings still resolve."""
    if isinstance(item, LoopNode):
        item = replace(item, body=tuple(map_tree(c, fn) for c in item.body))
    elif isinstance(item, ExecutionNode) and item.phases:
        item = replace(item, phases=tuple(map_tree(c, fn) for c in item.phases))
    return fn(item)


def map_workflow(wf: Workflow, fn: Callable[[Item], Item]) -> Workflow:
    """`map_tree` over the whole iteration."""
    root = map_tree(wf.root, fn)
    assert isinstance(root, LoopNode)
    return replace(wf, root=root)


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


@dataclass(frozen=True)
class RefUse:
    """One reference met by `map_refs`: `expr` has its inner part already mapped (bottom up, as ray.dag's
    `apply_recursive`), `original` is the reference as the workflow holds it, and `within` is the
    iteration selection whose inner part it sits in (None at the top): such a reference is evaluated in
    that loop's body, not where the field is, so it is not a value of this field. `whole` says the
    reference is the field's value or a record field of it, so that slicing the reference slices the
    value (inside `stack`, `cat` or a slice, it would not)."""

    expr: Expr
    original: Expr
    binding: Binding
    within: IterSelect | None = None
    whole: bool = True


RefFn = Callable[[RefUse], "Expr | None"]


def map_refs(expr: Expr, bound: Mapping[int, Binding], fn: RefFn, within: IterSelect | None = None,
             whole: bool = True) -> Expr:
    """A copy of `expr` where every reference (a Ref, or an IterRef after its inner part) is passed to
    `fn`; a returned expression replaces it, None keeps it."""
    def again(e: Expr, keeps_whole: bool = False) -> Expr:
        return map_refs(e, bound, fn, within, whole and keeps_whole)

    match expr:
        case Ref():
            b = bound.get(id(expr))
            new = fn(RefUse(expr, expr, b, within, whole)) if b is not None else None
            return expr if new is None else new
        case IterRef(inner=inner):
            b = bound.get(id(expr))
            mapped = map_refs(inner, bound, fn, b if isinstance(b, IterSelect) else within, whole)
            here = expr if mapped is inner else replace(expr, inner=mapped)
            new = fn(RefUse(here, expr, b, within, whole)) if b is not None else None
            return here if new is None else new
        case BinOp(left=a, right=b):
            return replace(expr, left=again(a), right=again(b))
        case Neg(operand=a):
            return replace(expr, operand=again(a))
        case Record(fields=fields):
            return replace(expr, fields=tuple((n, again(v, keeps_whole=True)) for n, v in fields))
        case Call(args=args):
            return replace(expr, args=tuple(again(a) for a in args))
        case Slice(target=t, start=s, stop=p):
            return replace(expr, target=again(t), start=None if s is None else again(s),
                           stop=None if p is None else again(p))
    return expr


def binding_target(b: Binding) -> Path:
    """The item a binding points into: the node, loop or (for a temporal family) first group."""
    match b:
        case NodePort(node=p) | ParentInput(node=p) | LoopIndex(loop=p) | CarryIn(loop=p) | IterSelect(loop=p):
            return p
    raise TypeError(f"unknown binding {b!r}")


def bindings_of(b: IterSelect) -> dict[int, Binding]:
    """The binding table of an iteration selection's inner part."""
    table: dict[int, Binding] = {}

    def add(uses) -> None:
        for u in uses:
            table[id(u.expr)] = u.binding
            if isinstance(u.binding, IterSelect):
                add(u.binding.inner)

    add(b.inner)
    return table


def rename_ref(use: RefUse, names: Mapping[Path, str], carries: Mapping[tuple[Path, str], str] | None = None) -> Expr:
    """`use.expr` with the names it uses changed where they name a renamed item: `names` maps an item's
    path to its new name, `carries` a (loop path, carried value) to the value's new name. Renaming by
    binding, never by spelling, so an inner item that happens to share a name is left alone."""
    e, b = use.expr, use.binding
    match b:
        case NodePort(node=p) | LoopIndex(loop=p) | ParentInput(node=p):
            if p in names and isinstance(e, Ref):
                return replace(e, head=names[p])
        case CarryIn(loop=p, var=v):
            assert isinstance(e, Ref)
            return replace(e, head=names.get(p, e.head), attr=(carries or {}).get((p, v), v))
        case IterSelect(loop=p, index_loop=q, family=family):
            assert isinstance(e, IterRef)
            loop = e.loop
            if family:
                if family[0] in names:  # a renamed temporal family keeps its group numbers
                    loop = names[family[0]].rsplit("@", 1)[0]
            elif p in names:
                loop = names[p]
            index = replace(e.index, loop=names[q]) if q is not None and q in names else e.index
            return replace(e, loop=loop, index=index)
    return e


def rewrite_expr(expr: Expr, bound: Mapping[int, Binding], fn: Callable[[Expr, Binding], Expr | None]) -> Expr:
    """`map_refs` for a function of (reference, binding) that applies at any nesting."""
    return map_refs(expr, bound, lambda u: fn(u.expr, u.binding))


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


def ref_dim(resolver: Resolver, expr: Expr, b: Binding) -> int | None | str:
    """`batch_dim` of one reference (as the workflow holds it) with its binding."""
    table: dict[int, Binding] = {id(expr): b}
    if isinstance(b, IterSelect):
        table.update(bindings_of(b))
    return batch_dim(resolver, expr, table)


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

