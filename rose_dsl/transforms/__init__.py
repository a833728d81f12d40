"""Graph transformations (paper §4.3.1): pure functions `Workflow -> Rewritten` that refuse, with the
dependency or property that forbids it, any rewrite that would change what training computes.

Public API (what `rose rewrite` and the optimizer build on; every function here runs the checks its
rewrite needs, and every failure is a `Refused`):

| rewrite | function | request (`apply`) |
| --- | --- | --- |
| Split (spatial) + Merge | `split_node`, `split_loop_body` | `split NAME K` |
| chain pipelining | `split_chain` (and `forward_merge_slices`, which every split runs) | `split-chain A B ... K` |
| Split (temporal) | `split_temporal` | `split-time LOOP K` |
| Rewire | `rewire` (among siblings), `fuse_loops` (across loop levels) | `rewire`, `fuse` |
| Interleave | `interleave`, `interleave_loops` (sibling loops) | `interleave LOOP [STAGGER]`, `interleave LOOP_A LOOP_B ...` |
| run exposed phases | `expand` | `expand NODE` |

* `apply(wf, request) -> Rewritten | Refused` never raises: the entry point for a search.
  `apply_request` raises `Refused`. `compose(first, second)` chains two results.
* `Rewritten`: the new `workflow`, `locate(path, indices)` (where an original call runs in it, None for
  calls that run once per group), a `description`, `notes`.
* `Refused`: `reason` (leading with file:line:col of what forbids it, in the user's file), `at`, and
  `internal` (True when rose failed, a bug: a search should skip it and report it).
* `plan_differences(source, plan)` / `check_plan_source(plan)`: a plan (possibly edited by hand) checked
  against its source workflow. `source_paths(wf)`: each item's path in the workflow it was rewritten
  from (a group is the item it was split from), e.g. to report a plan's times per source node.

Layout: `rewritten.py` (results), `tree.py` (the item tree map), `refs.py` (the expression map with
renaming, batch dimensions), `split.py`, `chain.py`, `temporal.py`, `reorder.py` (the rewrites, as
unchecked `build_*` functions), `legality.py` (the order oracle), `plan_check.py`, `passes.py` (the
runner and the request language).
"""

from __future__ import annotations

from .forward import forward_merge_slices
from .passes import (
    REQUEST_HELP,
    apply,
    apply_request,
    expand,
    fuse_loops,
    interleave,
    interleave_loops,
    resolve_name,
    rewire,
    split_chain,
    split_loop_body,
    split_node,
    split_temporal,
)
from .plan_check import check_plan_source, plan_differences
from .reorder import temporal_groups
from .rewritten import Refused, Rewritten, compose
from .tree import source_paths

__all__ = [
    "Refused", "Rewritten", "compose", "apply", "apply_request", "resolve_name", "REQUEST_HELP",
    "split_node", "split_loop_body", "split_chain", "forward_merge_slices", "split_temporal", "rewire", "fuse_loops",
    "interleave", "interleave_loops", "expand", "plan_differences", "check_plan_source", "source_paths", "temporal_groups",
]
