"""Spatial split and Merge (paper §4.3.1, Figure 9a).

`build_split_node` turns a batch-separable ExecutionNode into k groups over contiguous row ranges
(`act@0` with `rows: [0, 4]`, `group: 0`, ...), followed by a MergeNode named like the original (`merge:
act`), so every consumer keeps reading `act.port` and sees the same values. `build_split_loop_body` does
the same for every item of a loop body at once -- the simulator-group pipelining of RLinf, derived: each
group gets its own carried values (`step.obs@0`), its own calls over its rows, and merges at the end of
each iteration for the unsplit consumers (the collects, later nodes). Each group keeps its iteration
order; groups touch disjoint rows of any per-row state (the component contract's `rows=`).
`build_split_loop_rows` copies a whole loop per row group instead (`decode@0` runs every iteration on
its rows, then `decode@1`), so that a consumer split into the same groups starts on group 0 while group
1 is still in the loop (`split-chain` over a token-by-token decode loop and its reward model).

What makes a split legal is checked while building it (the pass runner, `passes.py`, adds the checks of
the result): every split node is batch-separable along dim 0, every value a group reads from outside
has its batch on dim 0 (so the group can take its rows), and no loop that ends on a condition is
copied into groups unless each copy may end on its own rows (`_check_until_rows`: a loop that ends per
row, on one call's per-row flag, writing no state) -- the long-tail overlap: a decode loop's group 0 ends
and its reward starts while group 1 still generates.
"""

from __future__ import annotations

from dataclasses import replace

from ..errors import SourcePos
from ..expr import Call, Expr, Int, Ref, Slice, unparse
from ..ir import Carry, ExecutionNode, Item, LoopNode, MergeNode, Workflow, iter_items, with_plan
from ..resolve import CarryIn, IterSelect, LoopIndex, NodePort, Resolver, expr_fields
from .forward import forward_merge_slices
from .refs import (
    RefFn,
    RefUse,
    batch_dim,
    binding_target,
    map_field,
    map_outside,
    map_subtree,
    port_dim,
    ref_dim,
    rename_ref,
)
from .rewritten import Refused, Rewritten
from .tree import find, into_group, repath, replace_item

__all__ = ["row_groups", "check_separable", "build_split_node", "build_split_loop_body", "build_split_loop_rows",
           "check_splittable_loop"]

Path = tuple[str, ...]
Rows = tuple[int, int]


def row_groups(size: int, k: int, what: str, at: SourcePos | None = None) -> list[Rows]:
    """k consecutive row groups covering [0, size): as equal as they can be, the first `size % k` one row
    larger (101 rows in 2: 51 and 50). A batch k does not divide is split too: each group's calls take
    their own rows, and the merge concatenates the groups in row order whatever their sizes -- a prime
    batch was otherwise never split (a CPU sweep of unseen workflows: 101 envs 1.00x, 102 envs
    1.32x)."""
    if k < 2:
        raise Refused(f"splitting {what} into {k} group(s) does nothing: k must be at least 2")
    if size < k:
        raise Refused(f"splitting {what} (batch {size}) into {k} groups would leave empty groups", at=at)
    base, extra = divmod(size, k)
    bounds = [g * base + min(g, extra) for g in range(k + 1)]
    return [(bounds[g], bounds[g + 1]) for g in range(k)]


def check_separable(node: ExecutionNode) -> None:
    if node.batch is None:
        raise Refused(f"'{node.name}' ({node.call}) is not batch-separable: it has no 'batch:' declaration, so its "
                      "rows may depend on each other", at=node.pos)
    if not node.separable:
        raise Refused(f"'{node.name}' ({node.call}) declares the rows of its outputs but is not batch-separable "
                      "(separable: false): its calls cannot be split, only its consumers", at=_batch_pos(node))
    if node.batch != 0:
        raise Refused(f"'{node.name}' is separable along dim {node.batch}; rose splits dim 0 only", at=_batch_pos(node))
    if node.plan.split_of is not None or node.plan.rows is not None:
        raise Refused(f"'{node.name}' is already a split group (or inside one: it works on rows {node.plan.rows})", at=node.pos)


def _batch_pos(node: ExecutionNode) -> SourcePos:
    return node.field_pos.get("batch") or node.pos


def _batch_size(node: ExecutionNode, batch_size: int | None) -> int:
    size = node.batch_size if node.batch_size is not None else batch_size
    if size is None:
        raise Refused(f"the batch size of '{node.name}' is unknown: declare it (batch: {{dim: 0, size: ...}}) or pass it",
                      at=_batch_pos(node))
    return size


def _check_no_dynamic_loop(item: Item, region: str) -> None:
    """A loop that ends on a condition, copied into row groups, would end on each group's rows' condition
    instead of on all rows': the groups could run other numbers of iterations than the declared loop."""
    for inner in iter_items(item):
        if isinstance(inner, LoopNode) and inner.dynamic:
            raise Refused(f"loop '{inner.name}' inside {region} ends on a condition (until): split into row groups, "
                          "each group would stop on its own rows' condition instead of when all rows are done",
                          at=inner.field_pos.get("until") or inner.pos)


def _slice_input(resolver: Resolver, item: Item, key: str, expr: Expr, rows: Rows, what: str) -> Expr:
    """A value read by a group (a node's input, a carry's first value): the group's rows of it."""
    dim = batch_dim(resolver, expr, resolver.tables.field(item, key, expr))
    at = item.field_pos.get(key) or item.pos
    if dim is None:
        return expr  # an integer: the same for every group
    if dim == "unknown":
        raise Refused(f"input {key} of {what} ('{unparse(expr)}') comes from a value whose rows rose cannot tell "
                      "(a producer that is not batch-separable, or values combined by an expression such as cat; "
                      "a split loop and its consumer split together: split-chain)", at=at)
    if dim != 0:
        raise Refused(f"input {key} of {what} ('{unparse(expr)}') has its batch on dim {dim}; rose slices dim 0 only", at=at)
    return _rows_of(expr, rows)


def _rows_of(expr: Expr, rows: Rows) -> Expr:
    return Slice(expr.offset, expr, Int(0, rows[0]), Int(0, rows[1]))


# -- one node -----------------------------------------------------------------------------------------

def build_split_node(wf: Workflow, path: Path, k: int, batch_size: int | None = None, *, force: bool = False) -> Rewritten:
    """`force` skips the separability check (only to show, in tests, what the check prevents)."""
    node = find(wf, path)
    if not isinstance(node, ExecutionNode):
        raise Refused(f"'{node.name}' is a loop: split its body (split_loop_body) or its iterations (temporal split)")
    if not force:
        check_separable(node)
    _check_no_dynamic_loop(node, f"the phases of '{node.name}'")
    groups = row_groups(_batch_size(node, batch_size), k, f"'{node.name}'", _batch_pos(node))
    resolver = Resolver(wf)
    items: list[Item] = []
    for g, rows in enumerate(groups):
        name = f"{node.name}@{g}"
        # the phases read the node's inputs as `node.port`: a group's phases read `node@g.port`
        group = map_subtree(resolver, node, _renaming({path: name}))
        assert isinstance(group, ExecutionNode)
        inputs = tuple((p, _slice_input(resolver, node, f"in.{p}", e, rows, f"'{node.name}'")) for p, e in node.inputs)
        group = replace(group, inputs=inputs, plan=replace(group.plan, split_of=node.name))
        items.append(into_group(repath(group, path, path[:-1] + (name,)), g, rows))
    items.append(MergeNode(path=path, sources=tuple(f"{node.name}@{g}" for g in range(k)),
                           ports=tuple((p, 0) for p in node.outputs)))
    new = forward_merge_slices(replace_item(wf, path, items))

    def locate(p: Path, idx: tuple[int, ...]):
        if p[: len(path)] == path and len(p) > len(path):
            return None  # phases inside a split node exist once per group
        return p, idx

    return Rewritten(new, locate, f"split {'.'.join(path)} into {k} groups of rows {groups}")


def _renaming(names: dict[Path, str]) -> RefFn:
    def fn(use: RefUse) -> Expr:
        return rename_ref(use, names)

    return fn


# -- the body of a loop -------------------------------------------------------------------------------

def build_split_loop_body(wf: Workflow, path: Path, k: int, batch_size: int | None = None) -> Rewritten:
    """Every item of a loop body split into k row groups (each with its own carried values), merged at
    the end of each iteration for the readers outside the groups."""
    loop = find(wf, path)
    if isinstance(loop, LoopNode) and loop.dynamic:
        raise Refused(f"loop '{loop.name}' ends on a condition (until): split inside its body, the condition would "
                      "read the merge of every group's rows, so no group could end before the others; copy the whole "
                      f"loop per row group instead (split-chain {loop.name} CONSUMER K)", at=loop.field_pos.get("until"))
    loop, size = _splittable_loop(wf, path, batch_size)
    groups = row_groups(size, k, f"loop '{loop.name}'", loop.pos)
    resolver = Resolver(wf)
    _check_carries(resolver, loop)
    body: list[Item] = []
    carries: list[Carry] = []
    for g, rows in enumerate(groups):
        refs = _group_refs(resolver, loop, g, rows)
        body += [_group_item(resolver, loop, item, g, rows, refs) for item in loop.body]
        carries += [_group_carry(resolver, loop, c, g, rows, refs) for c in loop.carries]
    body += [MergeNode(path=item.path, sources=tuple(f"{item.name}@{g}" for g in range(k)),
                       ports=tuple((p, _output_dim(resolver, item, p)) for p in item.outputs))
             for item in loop.body if item.outputs]
    merged = _merged_carries(loop, k)
    collects = tuple((n, map_field(resolver, loop, f"collect.{n}", e, merged)) for n, e in loop.collects)
    new = replace_item(wf, path, replace(loop, body=tuple(body), carries=tuple(carries), collects=collects))
    new = forward_merge_slices(map_outside(new, resolver, path, merged))
    outputs = {item.name for item in loop.body if item.outputs}

    def locate(p: Path, idx: tuple[int, ...]):
        if p[: len(path)] == path and len(p) > len(path):
            if len(p) > len(path) + 1 or p[len(path)] not in outputs:
                return None  # nested items, and items with no outputs, exist once per group
        return p, idx

    return Rewritten(new, locate, f"split the body of loop {'.'.join(path)} into {k} groups of rows {groups}")


def check_splittable_loop(wf: Workflow, path: Path) -> int:
    """The batch size of the loop at `path` when every call in it can be split into row groups (its body,
    or the whole loop in copies); raises Refused saying why not."""
    return _splittable_loop(wf, path, None)[1]


def _splittable_loop(wf: Workflow, path: Path, batch_size: int | None) -> tuple[LoopNode, int]:
    """The loop at `path` and its batch size, or a refusal saying why its body cannot be split."""
    loop = find(wf, path)
    if not isinstance(loop, LoopNode) or path == wf.root.path:
        raise Refused(f"'{loop.name}' is not a loop inside the iteration")
    if loop.dynamic:
        _check_until_rows(wf, loop)
    if loop.plan.split_of is not None:
        raise Refused(f"loop '{loop.name}' is already a split group", at=loop.pos)
    sizes = set()
    for item in iter_items(loop):
        if item is loop:
            continue
        if isinstance(item, MergeNode) or item.plan.split_of is not None:
            raise Refused(f"loop '{loop.name}' already contains split groups ('{item.name}')", at=item.pos)
        if isinstance(item, ExecutionNode):
            check_separable(item)
            if item.batch_size is not None:
                sizes.add(item.batch_size)
    # a loop inside one that ends per row ends per row itself (`whole_reason`): copied with it, each copy
    # starts with its group's rows and ends on them, as the declared one does on all rows
    _check_no_dynamic_loop(replace(loop, until=None, body=() if loop.dynamic else loop.body), f"loop '{loop.name}'")
    if batch_size is not None:
        sizes.add(batch_size)
    if len(sizes) != 1:
        raise Refused(f"the batch size of loop '{loop.name}' is " + ("unknown: declare batch sizes or pass one" if not sizes
                      else f"ambiguous: its nodes declare {sorted(sizes)}"), at=loop.pos)
    return loop, sizes.pop()


def _check_until_rows(wf: Workflow, loop: LoopNode) -> None:
    """A loop that ends on a condition may be copied per row group only where each copy, ending when its own
    rows are done, gives what the declared loop gives those rows: the loop ends per row (a done row's values
    are final whatever the other rows do; `rose_dsl.until`), its condition is one call's per-row output (a
    condition that combines rows could end a group on another group's rows), and no call in it writes state
    (each copy runs its own number of iterations: the state would see other calls than the declared loop's)."""
    from ..until import whole_reason

    at = loop.field_pos.get("until") or loop.pos
    why = whole_reason(Resolver(wf), loop)
    if why is not None:
        raise Refused(f"loop '{loop.name}' ends on a condition as a whole ({why}): split into row groups, each group "
                      "would stop on its own rows' condition instead of when all rows are done", at=at)
    resolver = Resolver(wf)
    until = loop.until
    assert until is not None
    b = resolver.tables.field(loop, "until", until).get(id(until))
    node = resolver.items.get(b.node) if isinstance(b, NodePort) else None
    if not (isinstance(until, Ref) and isinstance(node, ExecutionNode) and node.path[:-1] == loop.path):
        raise Refused(f"the condition of loop '{loop.name}' ('{unparse(until)}') is not one output of a call in its "
                      "body: it may read all rows, so a row group could not end on its own rows", at=at)
    for item in iter_items(loop):
        writes = [e.state for e in getattr(item, "effects", ()) if e.access.value != "read"]
        if writes:
            raise Refused(f"'{item.name}' in loop '{loop.name}' writes state ({', '.join(writes)}) inside a loop that "
                          "ends on a condition: split into row groups, each group runs its own number of iterations, "
                          "so the state would see other calls than the declared loop's", at=item.pos)


def _check_carries(resolver: Resolver, loop: LoopNode) -> None:
    for c in loop.carries:
        dims = {batch_dim(resolver, c.init, resolver.tables.field(loop, f"carry.{c.name}.init", c.init)),
                batch_dim(resolver, c.next, resolver.tables.field(loop, f"carry.{c.name}.next", c.next))}
        if len(dims) > 1:
            raise Refused(f"carried value '{c.name}' of loop '{loop.name}' does not keep its batch dimension "
                          f"(init and next give {sorted(map(str, dims))}): its groups could not be merged", at=c.pos)
        dim = dims.pop()
        if dim not in (0, None):
            raise Refused(f"carried value '{c.name}' of loop '{loop.name}' has its batch on dim {dim}; rose slices dim 0 only",
                          at=c.pos)


def _group_item(resolver: Resolver, loop: LoopNode, item: Item, g: int, rows: Rows, refs: RefFn) -> Item:
    """Group g's copy of one item of the body: its own name, references and rows."""
    copy = map_subtree(resolver, item, refs)
    assert isinstance(copy, ExecutionNode | LoopNode)  # a body holding merges is refused
    copy = replace(with_plan(copy, split_of=item.name), after=tuple(f"{a}@{g}" for a in item.after))
    return into_group(repath(copy, item.path, loop.path + (f"{item.name}@{g}",)), g, rows)


def _group_carry(resolver: Resolver, loop: LoopNode, c: Carry, g: int, rows: Rows, refs: RefFn) -> Carry:
    """Group g's own carried value: its rows of the first value, its copy of the next."""
    init = _slice_input(resolver, loop, f"carry.{c.name}.init", c.init, rows, f"loop '{loop.name}'")
    nxt = map_field(resolver, loop, f"carry.{c.name}.next", c.next, refs)
    return replace(c, name=f"{c.name}@{g}", init=init, next=nxt)


def _under(path: Path, prefix: Path) -> bool:
    return path[: len(prefix)] == prefix


def _group_refs(resolver: Resolver, loop: LoopNode, g: int, rows: Rows,
                renamed: tuple[dict[Path, str], dict[tuple[Path, str], str]] | None = None) -> RefFn:
    """How group g's copy of the body reads: the body's items and the loop's carried values are the
    group's own (`act@g`, `step.obs@g`); a value from outside the loop is read as the group's rows.
    `renamed` (item names, carried-value names) replaces the body's renaming (a copy of the whole loop
    renames the loop itself: `decode@g.i`, `decode@g[*]`)."""
    names, carries = renamed or ({item.path: f"{item.name}@{g}" for item in loop.body},
                                 {(loop.path, c.name): f"{c.name}@{g}" for c in loop.carries})

    def fn(use: RefUse) -> Expr:
        new = rename_ref(use, names, carries)
        if _under(binding_target(use.binding), loop.path) or isinstance(use.binding, LoopIndex):
            return new
        if use.within is not None and not _under(binding_target(use.within), loop.path):
            return new  # inside a selection of an outside loop's iterations: that selection is sliced as a whole
        dim = ref_dim(resolver, use.original, use.binding)
        if dim is None:
            return new  # an integer: the same for every group
        if dim != 0 or use.within is not None or not use.whole:
            why = ("no known batch dimension" if dim == "unknown" else f"its batch on dim {dim}" if dim != 0
                   else "its rows selected inside an iteration reference" if use.within is not None
                   else "its rows combined by stack, cat or a slice")
            raise Refused(f"'{unparse(use.original)}' read inside loop '{loop.name}' has {why}; rose cannot give each "
                          "group its rows")
        return _rows_of(new, rows)

    return fn


def _merged_carries(loop: LoopNode, k: int) -> RefFn:
    """How the split loop is read from outside its groups (its collects, later items): a carried value is
    the concatenation of its groups' values; the body's items are their merges."""
    carried = {c.name for c in loop.carries}

    def fn(use: RefUse) -> Expr | None:
        b = use.binding
        if isinstance(b, IterSelect) and _under(b.loop, loop.path) and len(b.loop) > len(loop.path):
            raise Refused(f"'{unparse(use.original)}' selects iterations of loop '{b.loop[-1]}' inside loop "
                          f"'{loop.name}' from outside it: split into row groups, those iterations run once per group")
        var = b.var if isinstance(b, CarryIn) and b.loop == loop.path else \
            b.port if isinstance(b, NodePort) and b.node == loop.path else None
        if var in carried:
            return Call(use.expr.offset, "cat", tuple(Ref(use.expr.offset, loop.name, f"{var}@{g}") for g in range(k)))
        return None

    return fn


def _output_dim(resolver: Resolver, item: Item, port: str) -> int:
    """The dimension a merge concatenates an output of the body's groups along."""
    if isinstance(item, ExecutionNode):
        return 0
    assert isinstance(item, LoopNode)
    dim = port_dim(resolver, item, port)
    if not isinstance(dim, int):
        key = f"collect.{port}" if port in dict(item.collects) else f"carry.{port}.init"
        raise Refused(f"output '{port}' of nested loop '{item.name}' has no known batch dimension (a carried value "
                      "must keep one from its first value on); it cannot be merged", at=item.field_pos.get(key) or item.pos)
    return dim


# -- a whole loop, copied per row group ---------------------------------------------------------------

def build_split_loop_rows(wf: Workflow, path: Path, k: int, batch_size: int | None = None) -> Rewritten:
    """The loop at `path` as k copies, each running every iteration on its rows (`decode@0` on [0, 32),
    then `decode@1`), followed by a merge named like the loop for the readers outside it. The copies are
    independent (disjoint rows of every input, carried value and per-row state), so each keeps the
    declared iteration order on its rows and the merge gives the declared outputs."""
    loop, size = _splittable_loop(wf, path, batch_size)
    groups = row_groups(size, k, f"loop '{loop.name}'", loop.pos)
    resolver = Resolver(wf)
    _check_carries(resolver, loop)
    _check_not_selected_from_outside(resolver, loop)
    items: list[Item] = []
    for g, rows in enumerate(groups):
        name = f"{loop.name}@{g}"
        copy = map_subtree(resolver, loop, _group_refs(resolver, loop, g, rows, ({path: name}, {})))
        assert isinstance(copy, LoopNode)
        copy = replace(copy, plan=replace(copy.plan, split_of=loop.name))
        items.append(into_group(repath(copy, path, path[:-1] + (name,)), g, rows))
    items.append(MergeNode(path=path, sources=tuple(f"{loop.name}@{g}" for g in range(k)),
                           ports=tuple((p, _output_dim(resolver, loop, p)) for p in loop.outputs)))
    new = forward_merge_slices(replace_item(wf, path, items))

    def locate(p: Path, idx: tuple[int, ...]):
        if p[: len(path)] == path and len(p) > len(path):
            return None  # the loop's items exist once per copy
        return p, idx

    return Rewritten(new, locate, f"split loop {'.'.join(path)} into {k} copies over rows {groups}")


def _check_not_selected_from_outside(resolver: Resolver, loop: LoopNode) -> None:
    """A reader outside the loop that selects its iterations (`epoch[update.i].step.traj`) would select
    them from one copy's rows: the merge holds only the loop's outputs."""
    for item in resolver.items.values():
        if _under(item.path, loop.path):
            continue
        for key, expr in expr_fields(item):
            for b in resolver.tables.field(item, key, expr).values():
                if isinstance(b, IterSelect) and _under(b.loop, loop.path):
                    raise Refused(f"'{item.name}' selects iterations of loop '{b.loop[-1]}' from outside loop "
                                  f"'{loop.name}' ({key}): copied per row group, those iterations run once per copy",
                                  at=item.field_pos.get(key) or item.pos)
