"""The pass runner: every rewrite is built, then checked with the checks it needs -- always, whoever asks
(torch.fx's pass infrastructure: a pass with the properties it must ensure). No caller can forget
legality, and no failure escapes as anything but a `Refused`: a rewrite that cannot be built, a check
that fails, and a bug in rose alike (`Refused.internal` tells the last apart).

Each rewrite is a `Pass`: a pure `build` function (in `split.py`, `chain.py`, `temporal.py`,
`reorder.py`), which refuses what its preconditions forbid, and the `checks` run on its result:

| pass | checks after building |
| --- | --- |
| split, split-loop, split-chain, expand | well formed, writable as a plan, loops that end per row still do |
| split-time, rewire, interleave, fuse | the above, every dependency kept (`legality.check_order_preserved`) |
| defer | the above; a read of a state object with `max_staleness` may see an older value, within it |
| ahead | the same |

`apply(wf, request)` is the entry point for a search (the optimizer): it returns `Rewritten` or
`Refused`, never raises; `apply_request` raises `Refused`. Requests are the small language of `rose
rewrite --do "..."` (`REQUEST_HELP`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..identity import NodePath
from ..ir import ExecutionNode, LoopNode, Workflow
from .ahead import build_ahead
from .chain import build_split_chain
from .deferral import build_defer
from .legality import check_order_preserved, check_well_formed
from .reorder import (
    build_expand,
    build_fuse_loops,
    build_interleave,
    build_interleave_siblings,
    build_rewire,
    temporal_groups,
)
from .rewritten import Refused, Rewritten
from .split import build_split_loop_body, build_split_node
from .temporal import build_split_temporal
from .tree import item_paths

__all__ = [
    "Pass", "run", "apply", "apply_request", "parse_request", "resolve_name", "REQUEST_HELP", "PASSES",
    "split_node", "split_loop_body", "split_chain", "split_temporal", "rewire", "fuse_loops", "interleave", "expand",
    "defer", "ahead",
]

Path = tuple[str, ...]
Check = Callable[[Workflow, Rewritten], None]


def well_formed(orig: Workflow, result: Rewritten) -> None:
    check_well_formed(result.workflow, result.description)


def writable(orig: Workflow, result: Rewritten) -> None:
    """The result can be written as a plan file the schema accepts (names, fields)."""
    from ..loader import Document
    from ..schema import check_schema
    from ..serialize import to_document

    diags = check_schema(Document("<plan>", "", to_document(result.workflow)))
    if diags:
        d = diags[0]
        raise Refused(f"{result.description}: the plan would not be a valid workflow file ({d.path}: {d.message}); "
                      "a bug in rose, please report it", internal=True)


def order_kept(orig: Workflow, result: Rewritten) -> None:
    check_order_preserved(orig, result.workflow, result.locate, result.description)


def until_kept(orig: Workflow, result: Rewritten) -> None:
    """A loop that ends on a condition per row still does (`rose_dsl.until`): a split or an expansion inside
    its body (a merge, phases) would make it end as a whole -- every row running every trip until all are
    done -- and a done row would no longer keep its values."""
    from ..resolve import Resolver
    from ..until import whole_reason
    from .tree import source_paths

    dynamic = [i for i in result.workflow.items() if isinstance(i, LoopNode) and i.dynamic]
    if not dynamic:
        return
    sources, before, after = source_paths(result.workflow), Resolver(orig), Resolver(result.workflow)
    for loop in dynamic:
        # the loop as the workflow before this rewrite has it (a rewrite of a plan: it may itself be a copy,
        # `l1@0.l2`, which the source workflow names `l1.l2`)
        src = before.items.get(loop.path) or before.items.get(sources.get(loop.path, loop.path))
        if not isinstance(src, LoopNode) or whole_reason(before, src) is not None:
            continue
        why = whole_reason(after, loop)
        if why is not None:
            raise Refused(f"{result.description}: loop '{src.name}' ends on a condition per row, and would end as a "
                          f"whole ({why}): a done row would be computed again instead of keeping its values",
                          at=src.field_pos.get("until") or src.pos)


@dataclass(frozen=True)
class Pass:
    name: str  # the request's first word
    build: Callable[..., Rewritten]
    checks: tuple[Check, ...]


_SHAPE = (well_formed, writable, until_kept)
PASSES = {
    "split": Pass("split", build_split_node, _SHAPE),
    "split-loop": Pass("split-loop", build_split_loop_body, _SHAPE),
    "split-chain": Pass("split-chain", build_split_chain, _SHAPE),
    "split-time": Pass("split-time", build_split_temporal, (*_SHAPE, order_kept)),
    "rewire": Pass("rewire", build_rewire, (*_SHAPE, order_kept)),
    "fuse": Pass("fuse", build_fuse_loops, (*_SHAPE, order_kept)),
    "interleave": Pass("interleave", build_interleave, (*_SHAPE, order_kept)),
    "interleave-loops": Pass("interleave", build_interleave_siblings, (*_SHAPE, order_kept)),
    "expand": Pass("expand", build_expand, _SHAPE),
    "defer": Pass("defer", build_defer, (*_SHAPE, order_kept)),
    "ahead": Pass("ahead", build_ahead, (*_SHAPE, order_kept)),
}


def run(p: Pass, wf: Workflow, *args, **kwargs) -> Rewritten:
    """Build the rewrite and run every check it needs; any failure is a `Refused`."""
    try:
        result = p.build(wf, *args, **kwargs)
        for check in p.checks:
            check(wf, result)
        return result
    except Refused:
        raise
    except Exception as exc:  # a bug in a rewrite or a check: refused cleanly, named as a bug
        raise Refused(f"{p.name}: rose failed to build or check this rewrite ({type(exc).__name__}: {exc}); a bug in "
                      "rose, please report it", internal=True) from exc


# -- the checked rewrites, as functions -----------------------------------------------------------------

def split_node(wf: Workflow, path: Path, k: int, batch_size: int | None = None) -> Rewritten:
    """A batch-separable node split into k row groups and a merge (paper Figure 9a)."""
    return run(PASSES["split"], wf, path, k, batch_size)


def split_loop_body(wf: Workflow, path: Path, k: int, batch_size: int | None = None) -> Rewritten:
    """Every item of a loop body split into k row groups, each with its own carried values."""
    return run(PASSES["split-loop"], wf, path, k, batch_size)


def split_chain(wf: Workflow, paths: list[Path], k: int) -> Rewritten:
    """Consecutive separable sibling nodes split into the same k row groups, group g reading group g."""
    return run(PASSES["split-chain"], wf, paths, k)


def split_temporal(wf: Workflow, path: Path, k: int, blocks: bool = False) -> Rewritten:
    """The iterations of a free loop in k groups (round robin, or `blocks`) that may overlap (Figure 9b)."""
    return run(PASSES["split-time"], wf, path, k, blocks)


def rewire(wf: Workflow, path: Path, *, before: str | None = None, after: str | None = None) -> Rewritten:
    """An item moved right before or after a sibling."""
    return run(PASSES["rewire"], wf, path, before=before, after=after)


def fuse_loops(wf: Workflow, first: Path, second: Path) -> Rewritten:
    """Iteration j of `second` run at the end of iteration j of `first`."""
    return run(PASSES["fuse"], wf, first, second)


def interleave(wf: Workflow, loop: Path, stagger: int = 1) -> Rewritten:
    """The groups of a split loop body staggered: stage s of group g next to stage s-stagger of g+1."""
    return run(PASSES["interleave"], wf, loop, stagger)


def interleave_loops(wf: Workflow, loops: Sequence[Path]) -> Rewritten:
    """Consecutive independent sibling loops that take turns, one call each."""
    return run(PASSES["interleave-loops"], wf, loops)


def defer(wf: Workflow, path: Path, k: int | None = None) -> Rewritten:
    """A node's call of RL iteration i run in RL iteration i+k (an asynchronous plan; `deferral.py`)."""
    return run(PASSES["defer"], wf, path, k)


def ahead(wf: Workflow, path: Path, k: int = 1) -> Rewritten:
    """A node's call of RL iteration i+1, and those of the nodes it reads from, run in RL iteration i
    (partial rollouts; `ahead.py`)."""
    return run(PASSES["ahead"], wf, path, k)


def expand(wf: Workflow, path: Path, on: bool = True) -> Rewritten:
    """A node's exposed phases run instead of its entry (or, `on=False`, back)."""
    return run(PASSES["expand"], wf, path, on)


# -- requests ---------------------------------------------------------------------------------------

REQUEST_HELP = """rewrite requests (names are item names, or dotted paths (below) `iteration` when a name is ambiguous):
  split NAME K               split a batch-separable node, or every item of a loop body, into K row groups
  split-chain A B ... K      split consecutive separable sibling nodes into the same K row groups: group g of B
                             starts as soon as group g of A is done (a slice of a merge that is exactly one
                             group's rows reads that group; every split does this); a loop in the chain whose
                             calls are all separable is copied whole per group (a decode loop, then its scorer)
  split-time LOOP K          split the iterations of a free loop into K groups (round robin) that may overlap
  interleave LOOP [STAGGER]  stagger the groups of a split loop body; for a loop split in time: its groups
                             take turns, one call each
  interleave LOOP_A LOOP_B ...  consecutive independent sibling loops take turns, one call each (two rollouts
                             on two simulators that share the policy)
  fuse LOOP_A LOOP_B         run iteration j of LOOP_B right after iteration j of LOOP_A
  rewire NAME before|after SIBLING
  expand NODE                run the node's exposed phases instead of its entry
  defer NODE [K]             run the node's call of RL iteration i in iteration i+K (an asynchronous plan: the
                             weight sync, so that the next rollout overlaps this update); K defaults to the
                             smallest max_staleness > 0 of the states it writes (at most the RL iteration
                             count - 1); refused when a read would be older than its state object's
                             max_staleness (default 0)
  ahead NODE [1]             run the node's call of RL iteration i+1, and those of the nodes it reads from, in
                             iteration i (the next iteration's prompts submitted while this one decodes:
                             partial rollouts); refused like defer when a read would be too old"""


def _loop_or_split_in_time(wf: Workflow, name: str) -> Path:
    """`resolve_name`, or the path a loop split in time had (its groups `name@g` are in its place)."""
    try:
        return resolve_name(wf, name)
    except Refused:
        if "." in name:  # a dotted path: the split loop's own place
            path = (NodePath.parse(name) if name.startswith("iteration.") else NodePath.below_iteration(name)).parts
            if temporal_groups(wf, path):
                return path
            raise
        found = {i.path[:-1] + (name,) for i in wf.items()
                 if isinstance(i, LoopNode) and i.temporal_group and i.plan.split_of == name}
        if len(found) == 1:
            return found.pop()
        if len(found) > 1:
            raise Refused(f"loops split in time named '{name}' are in several places "
                          f"({', '.join(sorted('.'.join(p[1:]) for p in found))}): give the path") from None
        raise


def resolve_name(wf: Workflow, name: str) -> Path:
    """An item named by its name, by its dotted path below `iteration`, or by its full dotted path."""
    if name.startswith("iteration.") and wf.find(NodePath.parse(name).parts) is not None:
        return NodePath.parse(name).parts
    if "." in name:
        path = NodePath.below_iteration(name).parts
        if wf.find(path) is None:
            raise Refused(f"no item '{name}' (a path below 'iteration')")
        return path
    paths = item_paths(wf).get(name, [])
    if not paths:
        from ..errors import did_you_mean

        hint = did_you_mean(name, item_paths(wf))
        raise Refused(f"no item named '{name}'" + (f"; {hint}" if hint else ""))
    if len(paths) > 1:
        options = ", ".join(".".join(p[1:]) for p in paths)
        raise Refused(f"'{name}' is ambiguous ({options}): give its path")
    return paths[0]


def _int(text: str, what: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise Refused(f"{what} must be an integer, not {text!r}") from None


def parse_request(wf: Workflow, request: str) -> tuple[Pass, tuple, dict]:
    """The pass a request names and its arguments (names resolved against `wf`)."""
    words = request.split()
    if not words:
        raise Refused("empty rewrite request")
    op, args = words[0], words[1:]
    if op == "split" and len(args) == 2:
        path = resolve_name(wf, args[0])
        name = "split-loop" if isinstance(wf.find(path), LoopNode) else "split"
        return PASSES[name], (path, _int(args[1], "K")), {}
    if op == "split-chain" and len(args) >= 3:
        return PASSES[op], ([resolve_name(wf, a) for a in args[:-1]], _int(args[-1], "K")), {}
    if op == "split-time" and len(args) == 2:
        return PASSES[op], (resolve_name(wf, args[0]), _int(args[1], "K")), {}
    if op == "interleave" and (len(args) > 2 or (len(args) == 2 and not args[1].lstrip("-").isdigit())):
        return PASSES["interleave-loops"], ([resolve_name(wf, a) for a in args],), {}
    if op == "interleave" and len(args) in (1, 2):
        return PASSES[op], (_loop_or_split_in_time(wf, args[0]), _int(args[1], "STAGGER") if len(args) == 2 else 1), {}
    if op == "fuse" and len(args) == 2:
        return PASSES[op], (resolve_name(wf, args[0]), resolve_name(wf, args[1])), {}
    if op == "rewire" and len(args) == 3 and args[1] in ("before", "after"):
        return PASSES[op], (resolve_name(wf, args[0]),), {args[1]: args[2]}
    if op == "defer" and len(args) in (1, 2):
        return PASSES[op], (resolve_name(wf, args[0]), _int(args[1], "K") if len(args) == 2 else None), {}
    if op == "ahead" and len(args) in (1, 2):
        return PASSES[op], (resolve_name(wf, args[0]), _int(args[1], "K") if len(args) == 2 else 1), {}
    if op == "expand" and len(args) == 1:
        path = resolve_name(wf, args[0])
        if not isinstance(wf.find(path), ExecutionNode):
            raise Refused(f"'{args[0]}' is not a node")
        return PASSES[op], (path,), {}
    raise Refused(f"cannot read rewrite request {request!r}\n{REQUEST_HELP}")


def apply_request(wf: Workflow, request: str) -> Rewritten:
    """Apply one request, checked; raises `Refused`."""
    try:
        p, args, kwargs = parse_request(wf, request)
    except Refused:
        raise
    except Exception as exc:  # a bug reading a request: refused cleanly
        raise Refused(f"{request}: rose failed to read this request ({type(exc).__name__}: {exc}); a bug in rose, "
                      "please report it", internal=True) from exc
    return run(p, wf, *args, **kwargs)


def apply(wf: Workflow, request: str) -> Rewritten | Refused:
    """Apply one request, checked: the rewrite, or why not. Never raises (for a search)."""
    try:
        return apply_request(wf, request)
    except Refused as exc:
        return exc
