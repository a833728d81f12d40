"""The item tree, edited immutably: one bottom-up tree map (torch.fx's `Transformer`, ray.dag's
`apply_recursive`) that every rewrite builds on, and the small edits made of it.

Items are frozen; a rewrite builds a new tree. `map_tree` rebuilds an item's children (loop body,
phases) first and then hands the item, holding its new children, to a function -- paths and
expressions stay the original objects until that function changes them, so the original workflow's
binding tables still resolve them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from ..expr import Expr
from ..ir import ExecutionNode, Item, LoopNode, MergeNode, Workflow, with_plan
from .rewritten import Refused

__all__ = [
    "find", "item_paths", "children", "with_children", "map_tree", "map_workflow", "replace_item", "replace_body",
    "map_item_exprs", "repath", "into_group", "base_name", "own_group", "source_paths", "unique_name", "one_body",
]

Path = tuple[str, ...]


def find(wf: Workflow, path: Path) -> Item:
    item = wf.find(tuple(path))
    if item is None:
        raise Refused(f"no item '{'.'.join(path)}' in the workflow")
    return item


def one_body(wf: Workflow, paths: Sequence[Path], what: str) -> Path:
    """The body `paths` share, else refused at the first item that is elsewhere, naming both bodies (a
    chain of a loop's consumer and a node inside the loop was refused with no position or names)."""
    parent = tuple(paths[0][:-1])
    stray = next((tuple(p) for p in paths if tuple(p[:-1]) != parent), None)
    if stray is not None:
        raise Refused(f"{what} must be siblings (in one body): '{stray[-1]}' is in '{'.'.join(stray[:-1])}', "
                      f"'{paths[0][-1]}' in '{'.'.join(parent)}'", at=find(wf, stray).pos)
    return parent


def item_paths(wf: Workflow) -> dict[str, list[Path]]:
    """name -> every path with that last component (to resolve short names on the command line)."""
    out: dict[str, list[Path]] = {}
    for item in wf.items():
        out.setdefault(item.name, []).append(item.path)
    return out


def children(item: Item) -> tuple[Item, ...]:
    """A loop's body or a node's phases (an item's own graph)."""
    if isinstance(item, LoopNode):
        return item.body
    if isinstance(item, ExecutionNode) and item.phases:
        return item.phases
    return ()


def with_children(item: Item, items: Sequence[Item]) -> Item:
    if isinstance(item, LoopNode):
        return replace(item, body=tuple(items))
    assert isinstance(item, ExecutionNode)
    return replace(item, phases=tuple(items))


def map_tree(item: Item, fn: Callable[[Item], Item]) -> Item:
    """The tree under `item` rebuilt bottom up: children first, then `fn` of the item holding them."""
    kids = children(item)
    if kids:
        item = with_children(item, [map_tree(c, fn) for c in kids])
    return fn(item)


def map_workflow(wf: Workflow, fn: Callable[[Item], Item]) -> Workflow:
    """`map_tree` over the whole iteration."""
    root = map_tree(wf.root, fn)
    assert isinstance(root, LoopNode)
    return replace(wf, root=root)


def replace_item(wf: Workflow, path: Path, new: Item | Sequence[Item]) -> Workflow:
    """The workflow with the item at `path` replaced by one or several items (in its parent's body)."""
    news = [new] if not isinstance(new, Sequence) else list(new)
    if path == wf.root.path:
        assert len(news) == 1 and isinstance(news[0], LoopNode)
        return replace(wf, root=news[0])
    parent = path[:-1]

    def fn(item: Item) -> Item:
        if item.path != parent:
            return item
        return with_children(item, [n for c in children(item) for n in (news if c.path == path else [c])])

    return map_workflow(wf, fn)


def replace_body(wf: Workflow, parent: Path, body: Sequence[Item]) -> Workflow:
    return replace_item(wf, parent, with_children(find(wf, parent), body))


def map_item_exprs(item: Item, fn: Callable[[str, Expr], Expr]) -> Item:
    """A copy of one item (not its children) with every expression field passed through fn(key, expr);
    keys as in `resolve.expr_fields` ("in.obs", "carry.x.next", "until", "collect.traj")."""
    if isinstance(item, ExecutionNode):
        return replace(item, inputs=tuple((p, fn(f"in.{p}", e)) for p, e in item.inputs))
    if isinstance(item, LoopNode):
        carries = tuple(replace(c, init=fn(f"carry.{c.name}.init", c.init), next=fn(f"carry.{c.name}.next", c.next))
                        for c in item.carries)
        until = fn("until", item.until) if item.until is not None else None
        collects = tuple((n, fn(f"collect.{n}", e)) for n, e in item.collects)
        return replace(item, carries=carries, until=until, collects=collects)
    return item


def repath(item: Item, old: Path, new: Path) -> Item:
    """The subtree moved from prefix `old` to prefix `new` (paths are identities; the document path
    `src` no longer applies, positions stay: refusals still point at the user's file)."""
    return map_tree(item, lambda it: replace(it, path=new + it.path[len(old):], src=()))


def into_group(item: Item, group: int, rows: tuple[int, int] | None = None) -> Item:
    """The subtree made group `group`'s: every item in it runs in the group, except groups split
    earlier inside it (they and their items keep their own number); with `rows`, every call works on
    those batch rows."""
    def walk(it: Item, g: int | None) -> Item:
        if isinstance(it, MergeNode):
            return it
        if it is not item and it.plan.split_of is not None:
            g = it.plan.group  # an inner group: the innermost group is the one an item runs in
        if rows is not None and isinstance(it, ExecutionNode):
            it = replace(it, plan=replace(it.plan, rows=rows))
        it = with_plan(it, group=g)
        kids = children(it)
        return with_children(it, [walk(c, g) for c in kids]) if kids else it

    return walk(item, group)


def base_name(item: Item) -> str:
    """What a group stands for (`act@1` -> `act`); any other item is itself."""
    split_of = item.plan.split_of if isinstance(item, ExecutionNode | LoopNode) else None
    return split_of or item.name


def own_group(item: Item) -> int | None:
    """The group number of a group (`act@1` -> 1, from its `group` field, not its name); None for an
    item that is not itself a group (a merge, an unsplit item, an item inside a group)."""
    if isinstance(item, ExecutionNode | LoopNode) and item.plan.split_of is not None:
        return item.plan.group
    return None


def source_paths(wf: Workflow) -> dict[Path, Path]:
    """Every item's path in the workflow it was rewritten from: groups are their `split_of`, moved items
    their `moved_from`. An unrewritten workflow maps every path to itself."""
    out: dict[Path, Path] = {wf.root.path: wf.root.path}

    def walk(item: Item, src: Path) -> None:
        for child in children(item):
            moved = child.plan.moved_from if isinstance(child, ExecutionNode | LoopNode) else None
            mine = moved if moved else src + (base_name(child),)
            out[child.path] = mine
            walk(child, mine)

    walk(wf.root, wf.root.path)
    return out


def unique_name(name: str, taken: set[str]) -> str:
    if name not in taken:
        return name
    n = 2
    while f"{name}_{n}" in taken:
        n += 1
    return f"{name}_{n}"
