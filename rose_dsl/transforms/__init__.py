"""Graph transformations (paper §4.3.1): pure functions `Workflow -> Rewritten` that refuse, with the
dependency or property that forbids it, any rewrite that would change what training computes.

| rewrite | function |
| --- | --- |
| Split (spatial) + Merge | `split_node`, `split_loop_body` |
| Rewire | `rewire` (among siblings), `fuse_loops` (across loop levels) |
| Interleave | `interleave` |
| run exposed phases | `expand` |

`apply_request` parses the small command language of `rose rewrite --do "..."`.
"""

from __future__ import annotations

from ..ir import ExecutionNode, LoopNode, Workflow
from .chain import forward_merge_slices, split_chain
from .common import Refused, Rewritten, item_paths
from .legality import check_well_formed
from .reorder import expand, fuse_loops, interleave, rewire
from .split import split_loop_body, split_node
from .temporal import split_temporal

__all__ = ["Refused", "Rewritten", "split_node", "split_loop_body", "split_chain", "forward_merge_slices", "split_temporal",
           "rewire", "fuse_loops", "interleave", "expand",
           "apply_request", "compose", "REQUEST_HELP"]

REQUEST_HELP = """rewrite requests (names are item names, or dotted paths (below) `iteration` when a name is ambiguous):
  split NAME K               split a batch-separable node, or every item of a loop body, into K row groups
  split-chain A B ... K      split consecutive separable sibling nodes into the same K row groups: group g of B
                             starts as soon as group g of A is done (a slice of a merge that is exactly one
                             group's rows reads that group; every split does this)
  split-time LOOP K          split the iterations of a free loop into K groups (round robin) that may overlap
  interleave LOOP [STAGGER]  stagger the groups of a split loop body
  fuse LOOP_A LOOP_B         run iteration j of LOOP_B right after iteration j of LOOP_A
  rewire NAME before|after SIBLING
  expand NODE                run the node's exposed phases instead of its entry"""


def resolve_name(wf: Workflow, name: str) -> tuple[str, ...]:
    """An item named by its name, by its dotted path below `iteration`, or by its full dotted path."""
    if name.startswith("iteration.") and wf.find(tuple(name.split("."))) is not None:
        return tuple(name.split("."))
    if "." in name:
        path = ("iteration",) + tuple(name.split("."))
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


def apply_request(wf: Workflow, request: str) -> Rewritten:
    """Apply one request and check its result; every failure is a `Refused` (a rose bug included, said
    as such), so that no request ever ends in an internal error."""
    try:
        result = _dispatch(wf, request)
        check_plan_document(result.workflow, request)
    except Refused:
        raise
    except Exception as exc:  # noqa: BLE001 - a bug in a rewrite: refused cleanly, named as a bug
        raise Refused(f"{request}: rose failed to construct this rewrite ({type(exc).__name__}: {exc}); "
                      "a bug in rose, please report it", internal=True) from exc
    return result


def check_plan_document(new: Workflow, what: str) -> None:
    """The rewritten workflow is well formed and can be written as a plan the schema accepts."""
    from ..loader import Document
    from ..schema import check_schema
    from ..serialize import to_document

    check_well_formed(new, what)
    diags = check_schema(Document("<plan>", "", to_document(new)))
    if diags:
        d = diags[0]
        raise Refused(f"{what}: the plan would not be a valid workflow file ({d.path}: {d.message}); "
                      "a bug in rose, please report it", internal=True)


def _dispatch(wf: Workflow, request: str) -> Rewritten:
    words = request.split()
    if not words:
        raise Refused("empty rewrite request")
    op, args = words[0], words[1:]
    if op == "split" and len(args) == 2:
        path = resolve_name(wf, args[0])
        k = _int(args[1], "K")
        item = wf.find(path)
        if isinstance(item, LoopNode):
            return split_loop_body(wf, path, k)
        return split_node(wf, path, k)
    if op == "split-chain" and len(args) >= 3:
        return split_chain(wf, [resolve_name(wf, a) for a in args[:-1]], _int(args[-1], "K"))
    if op == "split-time" and len(args) == 2:
        return split_temporal(wf, resolve_name(wf, args[0]), _int(args[1], "K"))
    if op == "interleave" and len(args) in (1, 2):
        return interleave(wf, resolve_name(wf, args[0]), _int(args[1], "STAGGER") if len(args) == 2 else 1)
    if op == "fuse" and len(args) == 2:
        return fuse_loops(wf, resolve_name(wf, args[0]), resolve_name(wf, args[1]))
    if op == "rewire" and len(args) == 3 and args[1] in ("before", "after"):
        path = resolve_name(wf, args[0])
        return rewire(wf, path, **{args[1]: args[2]})
    if op == "expand" and len(args) == 1:
        path = resolve_name(wf, args[0])
        if not isinstance(wf.find(path), ExecutionNode):
            raise Refused(f"'{args[0]}' is not a node")
        return expand(wf, path)
    raise Refused(f"cannot read rewrite request {request!r}\n{REQUEST_HELP}")


def compose(first: Rewritten, second: Rewritten) -> Rewritten:
    def locate(path, idx):
        loc = first.locate(path, idx)
        return None if loc is None else second.locate(*loc)

    return Rewritten(second.workflow, locate, f"{first.description}; {second.description}")
