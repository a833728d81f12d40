"""Spatial split and Merge (paper §4.3.1, Figure 9a).

`split_node` turns a batch-separable ExecutionNode into k groups over contiguous row ranges (`act@0`
with `rows: [0, 4]`, ...), followed by a MergeNode named like the original (`merge: act`), so every
consumer keeps reading `act.port` and sees the same values. `split_loop_body` does the same for every
item of a loop body at once -- the simulator-group pipelining of RLinf, derived: each group gets its
own carried values (`step.obs@0`), its own calls over its rows, and merges at the end of each
iteration for the unsplit consumers (the collects, later nodes). Each group keeps its iteration order;
groups touch disjoint rows of any per-row state (the component contract's `rows=`).
"""

from __future__ import annotations

from dataclasses import replace

from ..expr import Call, Expr, Int, IterRef, Ref, Slice
from ..ir import ExecutionNode, Item, LoopNode, MergeNode, Workflow, iter_items
from ..resolve import Binding, CarryIn, IterSelect, LoopIndex, NodePort, ParentInput, Resolver, expr_fields
from .common import (
    Refused,
    Rewritten,
    batch_dim,
    find,
    map_item_exprs,
    rename_head,
    replace_item,
    rewrite_expr,
    uses_by_id,
)

__all__ = ["row_groups", "split_node", "split_loop_body"]

Path = tuple[str, ...]


def row_groups(size: int, k: int, what: str) -> list[tuple[int, int]]:
    if k < 2:
        raise Refused(f"splitting {what} into {k} group(s) does nothing: k must be at least 2")
    if size < k:
        raise Refused(f"splitting {what} (batch {size}) into {k} groups would leave empty groups")
    if size % k:
        raise Refused(f"k={k} does not divide the batch of {what} ({size} rows)")
    step = size // k
    return [(g * step, (g + 1) * step) for g in range(k)]


def _batch_size(node: ExecutionNode, batch_size: int | None) -> int:
    size = node.batch_size if node.batch_size is not None else batch_size
    if size is None:
        raise Refused(f"the batch size of '{node.name}' is unknown: declare it (batch: {{dim: 0, size: ...}}) or pass it")
    return size


def _check_separable(node: ExecutionNode) -> None:
    if node.batch is None:
        raise Refused(f"'{node.name}' ({node.call}) is not batch-separable: it has no 'batch:' declaration, so its "
                      "rows may depend on each other")
    if node.batch != 0:
        raise Refused(f"'{node.name}' is separable along dim {node.batch}; rose splits dim 0 only")
    if node.rows is not None or node.split_of is not None:
        raise Refused(f"'{node.name}' is already a split group")


def _slice_input(resolver: Resolver, item: Item, key: str, expr: Expr, rows: tuple[int, int], what: str) -> Expr:
    bound = uses_by_id(resolver, item, key, expr)
    dim = batch_dim(resolver, expr, bound)
    if dim is None:
        return expr  # an integer: the same for every group
    if dim == "unknown":
        raise Refused(f"input {key} of {what} ('{_text(expr)}') comes from a value whose rows rose cannot tell "
                      "(its producer is not batch-separable)")
    if dim != 0:
        raise Refused(f"input {key} of {what} ('{_text(expr)}') has its batch on dim {dim}; rose slices dim 0 only")
    return Slice(expr.offset, expr, Int(0, rows[0]), Int(0, rows[1]))


def _text(e: Expr) -> str:
    from ..expr import unparse

    return unparse(e)


def _with_rows(item: Item, rows: tuple[int, int], group: int) -> Item:
    """Every call in a group's subtree works on the group's rows."""
    if isinstance(item, ExecutionNode):
        phases = tuple(_with_rows(p, rows, group) for p in item.phases) if item.phases else item.phases
        return replace(item, rows=rows, phases=phases)
    if isinstance(item, LoopNode):
        return replace(item, body=tuple(_with_rows(c, rows, group) for c in item.body))
    return item


def _repath(item: Item, old: Path, new: Path) -> Item:
    """Move a subtree from prefix `old` to prefix `new` (paths are identities)."""
    path = new + item.path[len(old):]
    if isinstance(item, ExecutionNode):
        phases = tuple(_repath(p, old, new) for p in item.phases) if item.phases else item.phases
        return replace(item, path=path, phases=phases, src=())
    if isinstance(item, LoopNode):
        return replace(item, path=path, body=tuple(_repath(c, old, new) for c in item.body), src=())
    return replace(item, path=path, src=())


def split_node(wf: Workflow, path: Path, k: int, batch_size: int | None = None, *, force: bool = False) -> Rewritten:
    """`force` skips the separability check (only to show, in tests, what the check prevents)."""
    node = find(wf, path)
    if not isinstance(node, ExecutionNode):
        raise Refused(f"'{node.name}' is a loop: split its body (split_loop_body) or its iterations (temporal split)")
    if not force:
        _check_separable(node)
    groups = row_groups(_batch_size(node, batch_size), k, f"'{node.name}'")
    resolver = Resolver(wf)
    parent = path[:-1]
    items: list[Item] = []
    for g, rows in enumerate(groups):
        name = f"{node.name}@{g}"
        inputs = tuple((p, _slice_input(resolver, node, f"in.{p}", e, rows, f"'{node.name}'")) for p, e in node.inputs)
        group = replace(node, inputs=inputs, split_of=node.name, src=())
        group = _repath(group, path, parent + (name,))
        assert isinstance(group, ExecutionNode)
        if group.phases:
            group = replace(group, phases=tuple(map_phase_refs(p, node.name, name) for p in group.phases))
        items.append(_with_rows(group, rows, g))
    merge = MergeNode(path=path, sources=tuple(f"{node.name}@{g}" for g in range(k)),
                      ports=tuple((p, 0) for p in node.outputs))
    items.append(merge)
    new = replace_item(wf, path, items)

    def locate(p: Path, idx: tuple[int, ...]):
        if p[: len(path)] == path and len(p) > len(path):
            return None  # phases inside a split node exist once per group
        return p, idx

    return Rewritten(new, locate, f"split {'.'.join(path)} into {k} groups of rows {groups}")


def map_phase_refs(item: Item, old: str, new: str) -> Item:
    """Phases read their parent's inputs as `parent.port`; a group's phases read `parent@g.port`."""
    out = map_item_exprs(item, lambda key, e: rename_head(e, old, new))
    if isinstance(out, LoopNode):
        return replace(out, body=tuple(map_phase_refs(c, old, new) for c in out.body))
    if isinstance(out, ExecutionNode) and out.phases:
        return replace(out, phases=tuple(map_phase_refs(c, old, new) for c in out.phases))
    return out


def split_loop_body(wf: Workflow, path: Path, k: int, batch_size: int | None = None) -> Rewritten:
    loop = find(wf, path)
    if not isinstance(loop, LoopNode) or path == wf.root.path:
        raise Refused(f"'{loop.name}' is not a loop inside the iteration")
    if loop.dynamic:
        raise Refused(f"loop '{loop.name}' ends on a condition; its iterations are kept whole")
    if "@" in loop.name:
        raise Refused(f"loop '{loop.name}' is already a split group")
    sizes = set()
    for item in iter_items(loop):
        if item is loop:
            continue
        if isinstance(item, MergeNode) or (isinstance(item, ExecutionNode) and (item.rows or item.split_of)) or \
                (isinstance(item, LoopNode) and (item.split_of or item.iterations is not None)):
            raise Refused(f"loop '{loop.name}' already contains split groups ('{item.name}')")
        if isinstance(item, ExecutionNode):
            _check_separable(item)
            if item.batch_size is not None:
                sizes.add(item.batch_size)
    if batch_size is not None:
        sizes.add(batch_size)
    if len(sizes) != 1:
        raise Refused(f"the batch size of loop '{loop.name}' is " + ("unknown: declare batch sizes or pass one" if not sizes
                      else f"ambiguous: its nodes declare {sorted(sizes)}"))
    groups = row_groups(sizes.pop(), k, f"loop '{loop.name}'")
    resolver = Resolver(wf)
    top_names = {item.name for item in loop.body}
    carries = {c.name for c in loop.carries}
    for c in loop.carries:
        dims = {batch_dim(resolver, c.init, uses_by_id(resolver, loop, f"carry.{c.name}.init", c.init)),
                batch_dim(resolver, c.next, uses_by_id(resolver, loop, f"carry.{c.name}.next", c.next))}
        if len(dims) > 1:
            raise Refused(f"carried value '{c.name}' of loop '{loop.name}' does not keep its batch dimension "
                          f"(init and next give {sorted(map(str, dims))}): its groups could not be merged")
        dim = dims.pop()
        if dim not in (0, None):
            raise Refused(f"carried value '{c.name}' of loop '{loop.name}' has its batch on dim {dim}; rose slices dim 0 only")
    inside = path  # items whose path starts with this are inside the loop

    def target(b: Binding) -> Path | None:
        match b:
            case NodePort(node=p) | ParentInput(node=p):
                return p
            case CarryIn(loop=p) | IterSelect(loop=p) | LoopIndex(loop=p):
                return p
        return None

    def group_fn(g: int, rows: tuple[int, int]):
        def fn(expr: Expr, b: Binding) -> Expr | None:
            tgt = target(b)
            if isinstance(b, CarryIn) and b.loop == path:
                return Ref(expr.offset, loop.name, f"{b.var}@{g}")
            if tgt is not None and tgt[: len(inside)] == inside and len(tgt) > len(inside):
                # inside the split body: top-level items are now this group's copies
                if tgt[len(inside)] not in top_names or len(tgt) > len(inside) + 1 and not isinstance(b, NodePort | IterSelect):
                    return None
                if isinstance(expr, Ref) and expr.head == tgt[len(inside)]:
                    return replace(expr, head=f"{expr.head}@{g}")
                if isinstance(expr, IterRef) and expr.loop == tgt[len(inside)]:
                    return replace(expr, loop=f"{expr.loop}@{g}")
                return None
            if tgt is not None and tgt[: len(inside)] == inside:
                return None  # the loop's own index
            # a value from outside the loop: this group's rows of it
            dim = batch_dim(resolver, expr, {id(expr): b})
            if dim is None:
                return None
            if dim != 0:
                raise Refused(f"'{_text(expr)}' read inside loop '{loop.name}' has "
                              f"{'no known batch dimension' if dim == 'unknown' else f'its batch on dim {dim}'}; "
                              "rose cannot give each group its rows")
            return Slice(expr.offset, expr, Int(0, rows[0]), Int(0, rows[1]))
        return fn

    def rewrite_subtree(item: Item, fn) -> Item:
        def per_field(key: str, e: Expr) -> Expr:
            return rewrite_expr(e, uses_by_id(resolver, item, key, e), fn)

        out = map_item_exprs(item, per_field)
        if isinstance(out, LoopNode):
            return replace(out, body=tuple(rewrite_subtree(c, fn) for c in out.body))
        if isinstance(out, ExecutionNode) and out.phases:
            return replace(out, phases=tuple(rewrite_subtree(c, fn) for c in out.phases))
        return out

    body: list[Item] = []
    new_carries = []
    for g, rows in enumerate(groups):
        fn = group_fn(g, rows)
        for item in loop.body:
            moved = rewrite_subtree(item, fn)
            moved = replace(moved, split_of=item.name) if not isinstance(moved, MergeNode) else moved
            moved = _repath(moved, item.path, path + (f"{item.name}@{g}",))
            if isinstance(moved, ExecutionNode) and moved.phases:
                moved = replace(moved, phases=tuple(map_phase_refs(p, item.name, f"{item.name}@{g}") for p in moved.phases))
            moved = replace(moved, after=tuple(f"{a}@{g}" for a in moved.after))
            body.append(_with_rows(moved, rows, g))
        for c in loop.carries:
            init = _slice_input(resolver, loop, f"carry.{c.name}.init", c.init, rows, f"loop '{loop.name}'")
            nxt = rewrite_expr(c.next, uses_by_id(resolver, loop, f"carry.{c.name}.next", c.next), fn)
            new_carries.append(replace(c, name=f"{c.name}@{g}", init=init, next=nxt))
    for item in loop.body:
        if item.outputs and not isinstance(item, MergeNode):
            dims = tuple((p, _output_dim(resolver, item, p)) for p in item.outputs)
            body.append(MergeNode(path=item.path, sources=tuple(f"{item.name}@{g}" for g in range(k)), ports=dims))

    # Outside the groups (collects, consumers after the loop) a split carry is the concatenation of its groups.
    def merged_carry(expr: Expr, b: Binding) -> Expr | None:
        if isinstance(b, CarryIn | NodePort) and (b.loop if isinstance(b, CarryIn) else b.node) == path:
            var = b.var if isinstance(b, CarryIn) else b.port
            if var in carries:
                return Call(expr.offset, "cat", tuple(Ref(expr.offset, loop.name, f"{var}@{g}") for g in range(k)))
        return None

    collects = tuple((n, rewrite_expr(e, uses_by_id(resolver, loop, f"collect.{n}", e), merged_carry)) for n, e in loop.collects)
    new_loop = replace(loop, body=tuple(body), carries=tuple(new_carries), collects=collects)
    new = replace_item(wf, path, new_loop)
    new = _rewrite_outside(new, wf, resolver, path, merged_carry)

    merged = {item.name for item in loop.body if item.outputs}

    def locate(p: Path, idx: tuple[int, ...]):
        if p[: len(path)] == path and len(p) > len(path):
            if len(p) > len(path) + 1 or p[len(path)] not in merged:
                return None  # nested items, and items with no outputs, exist once per group
        return p, idx

    return Rewritten(new, locate, f"split the body of loop {'.'.join(path)} into {k} groups of rows {groups}")


def _output_dim(resolver: Resolver, item: Item, port: str) -> int:
    if isinstance(item, ExecutionNode):
        return 0
    assert isinstance(item, LoopNode)
    expr = dict(item.collects).get(port)
    key = f"collect.{port}"
    if expr is None:
        c = item.carry(port)
        assert c is not None
        expr, key = c.init, f"carry.{port}.init"
    dim = batch_dim(resolver, expr, uses_by_id(resolver, item, key, expr))
    if not isinstance(dim, int):
        raise Refused(f"output '{port}' of nested loop '{item.name}' has no known batch dimension; it cannot be merged")
    return dim


def _rewrite_outside(new: Workflow, old: Workflow, resolver: Resolver, loop_path: Path, fn) -> Workflow:
    """Apply `fn` to the expressions of items outside the loop that read its (split) carries."""
    for item in old.items():
        if item.path[: len(loop_path)] == loop_path:
            continue
        fields = dict(expr_fields(item))
        if not fields:
            continue
        changed = {}
        for key, e in fields.items():
            e2 = rewrite_expr(e, uses_by_id(resolver, item, key, e), fn)
            if e2 != e:
                changed[key] = e2
        if changed:
            current = new.find(item.path)
            assert current is not None
            updated = map_item_exprs(current, lambda key, e, ch=changed: ch.get(key, e))
            new = replace_item(new, item.path, updated)
    return new
