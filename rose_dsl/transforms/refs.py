"""References, rewritten by what they are bound to: one expression map (`map_refs`) with renaming
(`rename_ref`), and the batch dimension of a value (`batch_dim`), which says how a row group reads it.

Every decision works from bindings (the resolver's one cached table, `Resolver.bindings`), never from
how a name is spelled: a reference to `step` means the loop `step` it resolves to, so an inner item that
happens to share a name is left alone.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from ..expr import BinOp, Call, Expr, Int, IterRef, Neg, Param, Record, Ref, Slice, map_expr
from ..ir import Carry, ExecutionNode, Item, LoopNode, MergeNode, Workflow
from ..resolve import (
    Binding,
    CarryIn,
    IterSelect,
    LoopIndex,
    NodePort,
    ParentInput,
    Resolver,
    binding_table,
    expr_fields,
)
from .rewritten import Refused
from .tree import map_item_exprs, map_tree, map_workflow

__all__ = ["RefUse", "RefFn", "map_refs", "rename_ref", "binding_target", "map_field", "map_subtree", "map_outside",
           "retarget_after",
           "batch_dim", "ref_dim", "port_dim", "Dim"]

Path = tuple[str, ...]
Dim = int | None | str  # a batch dimension, None for an integer (the same for every row), or "unknown"


@dataclass(frozen=True)
class RefUse:
    """One reference met by `map_refs`: `expr` has its inner part already mapped (bottom up), `original`
    is the reference as the workflow holds it, and `within` is the iteration selection whose inner part
    it sits in (None at the top): such a reference is evaluated in that loop's body, not where the
    field is, so it is not a value of this field. `whole` says the reference is the field's value or a
    record field of it, so that slicing the reference slices the value (inside `stack`, `cat` or a
    slice, it would not)."""

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
        case Record(fields=fields):  # a record field is the whole value a reference gives
            return replace(expr, fields=tuple((n, again(v, keeps_whole=True)) for n, v in fields))
    return map_expr(expr, again)


def rename_ref(use: RefUse, names: Mapping[Path, str], carries: Mapping[tuple[Path, str], str] | None = None,
               families: Mapping[str, str] | None = None) -> Expr:
    """`use.expr` with the names it uses changed where they name a renamed item: `names` maps an item's
    path to its new name, `carries` a (loop path, carried value) to the value's new name, `families` the
    name a temporal split's groups stand for to a new one."""
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
            loop = (families or {}).get(e.loop, e.loop) if family else names.get(p, e.loop)
            index = replace(e.index, loop=names[q]) if q is not None and q in names else e.index
            return replace(e, loop=loop, index=index)
    return e


def binding_target(b: Binding) -> Path:
    """The item a binding points into: the node, loop or (for a temporal family) first group."""
    match b:
        case NodePort(node=p) | ParentInput(node=p) | LoopIndex(loop=p) | CarryIn(loop=p) | IterSelect(loop=p):
            return p
    raise TypeError(f"unknown binding {b!r}")


def map_field(resolver: Resolver, item: Item, key: str, expr: Expr, fn: RefFn) -> Expr:
    """One expression field of `item` (in the workflow `resolver` holds) with each reference passed
    through `fn`; a refusal raised by `fn` is placed at the field."""
    try:
        return map_refs(expr, resolver.tables.field(item, key, expr), fn)
    except Refused as exc:
        if exc.at is not None or exc.internal:
            raise
        raise Refused(exc.reason, at=item.field_pos.get(key) or item.pos) from None


def map_subtree(resolver: Resolver, item: Item, fn: RefFn) -> Item:
    """`item` and every item below it with each reference passed through `fn`."""
    return map_tree(item, lambda it: map_item_exprs(it, lambda key, e: map_field(resolver, it, key, e, fn)))


def map_outside(new: Workflow, resolver: Resolver, region: Path, fn: RefFn) -> Workflow:
    """`fn` applied to the references of every item of `new` outside `region` (a rewritten item): they
    are the original workflow's unchanged objects, so `resolver`'s bindings (of the original) apply."""
    def outside(item: Item) -> Item:
        original = resolver.items.get(item.path)
        if item.path[: len(region)] == region or original is None:
            return item  # inside the region, or made by the rewrite
        fields = [e for _, e in expr_fields(item)]
        if not fields or [id(e) for e in fields] != [id(e) for _, e in expr_fields(original)]:
            return item  # no references, or already rewritten
        return map_item_exprs(item, lambda key, e: map_field(resolver, item, key, e, fn))

    return map_workflow(new, outside)


def retarget_after(wf: Workflow, targets: Mapping[Path, tuple[str, ...]]) -> Workflow:
    """`after:` entries rewritten by what they name: an entry bound to an item a rewrite replaced (its path,
    a key of `targets`) names what stands for it now, e.g. `after: [epoch]` -> `after: [epoch@0, epoch@1]`
    once `epoch` is split in time, `after: [update]` -> `after: [epoch]` once `update` is fused into
    `epoch`. An entry binds to the sibling of that name (`resolve._check_scopes`): the item's parent path
    plus the name, never the name alone (an inner item of the same name is another item). Left as it was,
    the entry named nothing and the rewrite was refused as breaking a dependency."""
    if not targets:
        return wf

    def fn(item: Item) -> Item:
        if not item.after:
            return item
        parent = item.path[:-1]
        names = tuple(new for name in item.after for new in targets.get(parent + (name,), (name,)))
        return item if names == item.after else replace(item, after=tuple(dict.fromkeys(names)))

    return map_workflow(wf, fn)


def batch_dim(resolver: Resolver, expr: Expr, bound: Mapping[int, Binding], depth: int = 0) -> Dim:
    """Which dimension of the value of `expr` is the batch: an int, None for integers (broadcast to
    every group), or 'unknown' (a value whose rows rose cannot tell, e.g. from a non-separable node)."""
    dim = _dim(resolver, expr, bound, depth, {})
    return "unknown" if dim == _PENDING else dim


# Carried values whose rows depend on each other across nested loops (an inner refinement loop that starts
# from the outer loop's carried value and hands its own back): each carried value is checked under the
# hypothesis that it keeps the dimension of its first value (`Assumed`: what is assumed so far); one still
# being worked out when it is met again through references alone is PENDING -- its own check, further out,
# decides. Met inside a record or a call, it makes the value unknown (no guess survives a reshaping).
_PENDING = "pending"
Assumed = Mapping[tuple[Path, str], Dim]


def _dim(resolver: Resolver, expr: Expr, bound: Mapping[int, Binding], depth: int, assume: Assumed) -> Dim:
    if depth > 50:
        return "unknown"
    match expr:
        case Int() | BinOp() | Neg() | Param():
            return None
        case Ref() | IterRef():
            return _binding_dim(resolver, expr, bound.get(id(expr)), bound, depth, assume)
        case Slice(target=t):
            return _dim(resolver, t, bound, depth + 1, assume)
        case Record(fields=fields):
            dims = {_dim(resolver, v, bound, depth + 1, assume) for _, v in fields}
            dims.discard(None)
            if _PENDING in dims:
                return "unknown"
            return dims.pop() if len(dims) == 1 else ("unknown" if dims else None)
        case Call(fn=fn, args=args):
            dims = {_dim(resolver, a, bound, depth + 1, assume) for a in args}
            if len(dims) != 1:
                return "unknown"
            d = dims.pop()
            if not isinstance(d, int):
                return "unknown"
            return d + 1 if fn == "stack" else ("unknown" if d == 0 else d)
    return "unknown"


def ref_dim(resolver: Resolver, expr: Expr, b: Binding) -> Dim:
    """`batch_dim` of one reference (as the workflow holds it) with its binding."""
    table: dict[int, Binding] = {id(expr): b}
    if isinstance(b, IterSelect):
        table.update(binding_table(b.inner))
    return batch_dim(resolver, expr, table)


def port_dim(resolver: Resolver, item: Item, port: str) -> Dim:
    """`batch_dim` of an item's output (a loop's collect or final carried value)."""
    dim = _binding_dim(resolver, Ref(0, item.name, port), NodePort(item.path, port), {}, 0, {})
    return "unknown" if dim == _PENDING else dim


def _binding_dim(resolver: Resolver, expr: Expr, b: Binding | None, bound: Mapping[int, Binding], depth: int,
                 assume: Assumed) -> Dim:
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
                return _carry_dim(resolver, item, c, depth, assume)
            return _field_dim(resolver, item, f"collect.{port}", dict(item.collects)[port], depth, assume)
        case CarryIn(loop=loop, var=var):
            item = resolver.items[loop]
            assert isinstance(item, LoopNode)
            c = item.carry(var)
            assert c is not None
            return _carry_dim(resolver, item, c, depth, assume)
        case ParentInput(node=node, port=port):
            parent = resolver.items[node]
            assert isinstance(parent, ExecutionNode)
            return _field_dim(resolver, parent, f"in.{port}", dict(parent.inputs)[port], depth, assume)
        case IterSelect():
            assert isinstance(expr, IterRef)
            return _dim(resolver, expr.inner, bound, depth + 1, assume)  # one iteration, or each of them
    return "unknown"


def _carry_dim(resolver: Resolver, loop: LoopNode, c: Carry, depth: int, assume: Assumed) -> Dim:
    """A carried value has a batch dimension only if its first value and every next one agree on it: the
    next value is worked out assuming the carried value has its first value's dimension."""
    key = (loop.path, c.name)
    if key in assume:
        return assume[key]
    first = _field_dim(resolver, loop, f"carry.{c.name}.init", c.init, depth, {**assume, key: _PENDING})
    if first == _PENDING or first == "unknown":
        return first
    later = _field_dim(resolver, loop, f"carry.{c.name}.next", c.next, depth, {**assume, key: first})
    if later == _PENDING:  # the next value is an outer carried value still being worked out: its check decides
        return first
    return first if later == first else "unknown"


def _field_dim(resolver: Resolver, item: Item, key: str, expr: Expr, depth: int, assume: Assumed) -> Dim:
    return _dim(resolver, expr, resolver.tables.field(item, key, expr), depth + 1, assume)
