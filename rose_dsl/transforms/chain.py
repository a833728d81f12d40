"""Pipelining a chain of batch-separable nodes without a loop (issue 15): group g of a consumer starts
as soon as group g of its producer is done.

Splitting `generate` and then `score` into row groups makes `score@0` read `generate.tokens[0:64]`: a
slice of the merge of generate's groups, which waits for every group. But rows [0, 64) of the merge are
exactly what `generate@0` computed, so the slice is the same value as `generate@0.tokens`.
`forward_merge_slices` makes that simplification everywhere (a slice that is exactly one group's rows
becomes that group's output; one that spans several whole groups, their concatenation; one inside a
group, a slice of that group's output; and through a loop's carried value, whose next is such a merge,
one carry per group): a pure
rewrite of expressions, values unchanged, dependencies only fewer. Every split runs it, so the order of
the splits does not matter; `split_chain` splits consecutive separable siblings into the same row
groups as one request; a loop in the chain is copied whole per group.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..identity import SplitGroup
from ..ir import ExecutionNode, LoopNode, MergeNode, Workflow
from .forward import forward_merge_slices
from .rewritten import Refused, Rewritten, compose
from .split import build_split_loop_rows, build_split_node, check_separable, check_splittable_loop
from .tree import children, find, one_body, replace_body

__all__ = ["forward_merge_slices", "build_split_chain"]

Path = tuple[str, ...]


def build_split_chain(wf: Workflow, paths: Sequence[Path], k: int) -> Rewritten:
    """Split consecutive batch-separable siblings into the same k row groups, as one region: group g of
    each reads group g of the one before (through `forward_merge_slices`), so the groups pipeline. A loop
    in the chain (a token-by-token decode loop before its reward model) is copied whole per group
    (`build_split_loop_rows`): group 0 runs all its iterations, then group 1 while group 0's consumer runs."""
    if len(paths) < 2:
        raise Refused("a chain needs at least two nodes")
    parent = one_body(wf, paths, "the nodes of a chain")
    body = [i.name for i in children(find(wf, parent))]
    order = [body.index(p[-1]) if p[-1] in body else -1 for p in paths]
    if order != sorted(order) or len(set(order)) != len(order):
        raise Refused(f"the chain must name its nodes in program order ({', '.join(n for n in body if n in {p[-1] for p in paths})})")
    sizes: dict[str, int | None] = {}
    ancestors = [find(wf, parent[:n]) for n in range(len(parent), 1, -1)]
    part = next((a for a in ancestors if isinstance(a, LoopNode) and a.plan.iterations is not None), None)
    for p in paths:
        item = find(wf, p)
        if isinstance(item, LoopNode) and part is not None:
            # the part's collects and later items select the loop's iterations (`l4[...]`), which a chain split
            # turns into row groups and a merge: not expressible yet (found by the property suite)
            raise Refused(f"split-chain: loop '{item.name}' is inside '{part.name}', a part of a loop split in time; "
                          "chain-split it before the split in time", at=item.pos)
        if isinstance(item, LoopNode):
            sizes[item.name] = check_splittable_loop(wf, p)
        elif isinstance(item, ExecutionNode):
            check_separable(item)
            sizes[item.name] = item.batch_size
        else:
            raise Refused(f"'{item.name}' is a merge: a chain splits nodes and loops", at=item.pos)
    if len(set(sizes.values())) != 1:
        raise Refused(f"the nodes of a chain must have one batch size to share row groups ({sizes})")
    result = None
    for p in paths:
        current = result.workflow if result is not None else wf
        step = (build_split_loop_rows(current, p, k) if isinstance(find(current, p), LoopNode)
                else build_split_node(current, p, k))
        result = step if result is None else compose(result, step)
    assert result is not None
    names = ", ".join(p[-1] for p in paths)
    out = result.workflow
    if any(isinstance(find(wf, p), LoopNode) and find(wf, p).dynamic for p in paths):  # type: ignore[union-attr]
        out = _groups_in_turn(out, parent, [p[-1] for p in paths], k)
    return Rewritten(out, result.locate, f"split the chain {names} into {k} row groups each")


def _groups_in_turn(wf: Workflow, parent: Path, names: Sequence[str], k: int) -> Workflow:
    """The chain's groups in group order (`decode@0, score@0, decode@1, score@1`, then the merges) when it
    holds a loop that ends on a condition: the driver decides such a loop's trips as it runs them, so it
    submits the calls after it only once it has ended -- in item order, group 0's consumer would wait for
    group 1's loop to end, and the long-tail overlap (score group 0 while group 1 still generates) would be
    lost. Each group reads only its own groups (`forward_merge_slices`), so the order keeps every dependency
    (the pass runner checks the result)."""
    body = list(children(find(wf, parent)))
    groups = {(s.split_of, s.group): item for item in body
              if (s := SplitGroup.of(item)) is not None and s.split_of in names}  # by the IR's fields, not `n@g`
    merges = {item.name: item for item in body if isinstance(item, MergeNode) and item.name in names}
    ordered = [groups[(n, g)] for g in range(k) for n in names] + [merges[n] for n in names if n in merges]
    region = {id(item) for item in ordered}
    at = min(i for i, item in enumerate(body) if id(item) in region)
    rest = [item for item in body if id(item) not in region]
    return replace_body(wf, parent, rest[:at] + ordered + rest[at:])
