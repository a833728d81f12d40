"""How much could any reordering give? The critical path of the declared iteration at measured durations.

Rewire, fusion and interleaving only change *when* calls run, never what they are or which process runs
them. With every call at its measured duration and unlimited overlap (a call starts as soon as every
producer it depends on -- data or state -- is done), one RL iteration cannot be shorter than its longest
dependency chain. The profiled iteration time over that length is therefore about the most such rewrites
can give. It does not bound the others: a spatial split changes the calls themselves (fewer rows each),
and a temporal split runs calls on copies of a component, which removes the state order between them.
It is an estimate, not a proof: calls measured while overlapping others may run faster alone (an MPS
quota can make them so). The report puts it next to the search's result
so that "nothing was faster" comes with its reason when the chain is the iteration (a training-bound
workload), and a large gap says the search left something on the table.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from ..analysis import invocation_graph
from ..ir import Workflow
from .profile import IterationRun

__all__ = ["critical_path", "reorder_bound"]


def critical_path(wf: Workflow, durations: Mapping[tuple[str, tuple[int, ...]], Sequence[float]]) -> dict[str, Any] | None:
    """The longest dependency chain of one RL iteration of `wf`, each invocation at the median of its
    `durations` (keyed by node path and loop indices below the RL iteration; a missing one counts 0 s).
    None when no invocation has a duration."""
    graph = invocation_graph(wf, iterations=1)
    finish: dict[Any, float] = {}
    before: dict[Any, Any] = {}
    matched = 0
    for inv in graph.order:  # program order is a topological order of the dependencies
        times = durations.get((".".join(inv.path), tuple(inv.indices[1:])))
        matched += bool(times)
        start, prev = 0.0, None
        for p in graph.producers(inv):
            if finish.get(p, 0.0) > start:
                start, prev = finish[p], p
        finish[inv] = start + (statistics.median(times) if times else 0.0)
        before[inv] = prev
    if not matched:
        return None
    last = max(finish, key=finish.__getitem__)
    chain, node = [], last
    while node is not None:
        chain.append(".".join(node.path[1:]) + "".join(f"[{i}]" for i in node.indices[1:]))
        node = before[node]
    return {"seconds": finish[last], "invocations": len(graph.order), "matched": matched, "chain": chain[::-1]}


def reorder_bound(wf: Workflow, runs: Sequence[IterationRun]) -> dict[str, Any] | None:
    """`critical_path` with the median measured duration of each invocation over `runs` (complete
    iterations of `wf`), and the iteration's median over it. None when the runs hold no calls of `wf`
    (e.g. measured on another graph)."""
    durations: dict[tuple[str, tuple[int, ...]], list[float]] = defaultdict(list)
    for run in runs:
        for c in run.calls:
            durations[(c.node, tuple(c.indices[1:]))].append(c.seconds)
    path = critical_path(wf, durations) if durations else None
    if path is None:
        return None
    iteration = statistics.median(r.seconds for r in runs)
    return {**path, "iteration_s": iteration, "speedup_bound": iteration / path["seconds"] if path["seconds"] else None}
