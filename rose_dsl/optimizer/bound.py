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
from ..ir import LoopNode, Workflow
from .profile import IterationRun, item_sources
from .quota import merge_intervals

__all__ = ["critical_path", "reorder_bound", "call_floats", "local_saving_bound"]


def _call_key(inv: Any) -> tuple[str, tuple[int, ...]]:
    """An invocation as a measured call names it: node path, loop indices below the RL iteration."""
    return ".".join(inv.path), tuple(inv.indices[1:])


def critical_path(wf: Workflow, durations: Mapping[tuple[str, tuple[int, ...]], Sequence[float]]) -> dict[str, Any] | None:
    """The longest dependency chain of one RL iteration of `wf`, each invocation at the median of its
    `durations` (keyed by node path and loop indices below the RL iteration; a missing one counts 0 s).
    None when no invocation has a duration."""
    graph = invocation_graph(wf, iterations=1)
    finish: dict[Any, float] = {}
    before: dict[Any, Any] = {}
    matched = 0
    for inv in graph.order:  # program order is a topological order of the dependencies
        times = durations.get(_call_key(inv))
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


def call_floats(wf: Workflow, run: IterationRun) -> dict[tuple[str, tuple[int, ...]], float] | None:
    """Each call's total float in one measured run of `wf`: how much later it could have ended without the
    run ending later, given the calls that waited for it -- its consumers in the dependency graph (data and
    state) and the next call on its own process -- at their measured times (the critical-path method's
    backward pass over the schedule the run shows). 0 s: the call is on the critical path. Keyed by node
    path and every loop index, the RL iteration's first. None when fewer than half of the run's calls
    are invocations of `wf` (another graph).

    A run of an asynchronous plan is a window of pipelined RL iterations (`measurement.window`): its calls
    belong to several, and the update of iteration k runs beside the rollout of k + 1. The dependencies
    are then those of the unrolled graph over the iterations the window holds (deferred calls under their
    own iteration's number, as the runtime records them), so a call's waiters may be of the next
    iteration. Calls of the window's last iteration whose waiters come after it show more float than they
    have: an edge effect of a window a few iterations long.

    Why stage 2 needs it: of two processes sharing the GPU, the one to give SMs away is the one whose
    calls can wait. Comparing when two branches end says that only when both meet at one consumer; two
    temporal groups each feeding its own update do not (the first H200 trace of the interleaved rollout
    named the critical group's simulator as the one with slack)."""
    numbered = [c.indices[0] for c in run.calls if c.indices]
    if not numbered:
        return None
    first = min(numbered)
    graph = invocation_graph(wf, iterations=max(numbered) - first + 1)
    key_of = {inv: (".".join(inv.path), (first + inv.indices[0], *inv.indices[1:])) for inv in graph.order}
    calls = {(c.node, tuple(c.indices)): c for c in run.calls}
    if 2 * sum(k in calls for k in key_of.values()) < len(calls):
        return None
    waiting: dict[tuple[str, tuple[int, ...]], list[tuple[str, tuple[int, ...]]]] = defaultdict(list)
    for inv in graph.order:
        for producer in graph.producers(inv):
            if key_of[producer] in calls and key_of[inv] in calls:
                waiting[key_of[producer]].append(key_of[inv])
    on_process: dict[str, list[tuple[str, tuple[int, ...]]]] = defaultdict(list)
    for key, c in calls.items():
        on_process[c.component].append(key)
    for keys in on_process.values():
        keys.sort(key=lambda k: calls[k].start_ns)
        for a, b in zip(keys, keys[1:], strict=False):
            waiting[a].append(b)
    # a call starts some time after the last call it waited for ends (dispatch): that lag is part of
    # every edge into it, not slack of the calls it waited for
    last_ready: dict[tuple[str, tuple[int, ...]], int] = {}
    for key, ws in waiting.items():
        for w in ws:
            last_ready[w] = max(last_ready.get(w, 0), calls[key].end_ns)
    lag = {w: max(0, calls[w].start_ns - t) for w, t in last_ready.items()}
    end = max(c.end_ns for c in calls.values())
    latest_start: dict[tuple[str, tuple[int, ...]], int] = {}
    floats: dict[tuple[str, tuple[int, ...]], float] = {}
    # a call's waiters started after it ended, so descending start times visit them first
    for key in sorted(calls, key=lambda k: calls[k].start_ns, reverse=True):
        c = calls[key]
        latest_finish = min((latest_start[w] - lag[w] for w in waiting.get(key, ()) if w in latest_start), default=end)
        floats[key] = max(0.0, (latest_finish - c.end_ns) / 1e9)
        latest_start[key] = latest_finish - (c.end_ns - c.start_ns)
    return floats


def local_saving_bound(wf: Workflow, region: tuple[str, ...], runs: Sequence[IterationRun]) -> tuple[float, str] | None:
    """At most how many seconds per RL iteration a change *inside* `region` can save, and the process that
    bounds it: for each run of the region in each measured iteration (`runs`, complete iterations of `wf`),
    its span minus the busy time of its busiest process there, summed over the region's runs in an
    iteration; the median over iterations. None when no call under `region` was measured.

    Why it holds: a local alternative (a spatial split, interleaving, a rewire inside the region) keeps
    the region's calls on the processes that ran them and only cuts them into smaller calls or reorders
    them, so each process still does all of its work there -- the region cannot end sooner than its
    busiest process's busy time. That assumes k smaller calls take at least as long together as the one
    they replace, true of every component measured here (a fixed cost per call; launch-bound simulators
    take about as long for half the rows). Temporal splits, which run calls on copies of a process, change
    the iteration's own body and are never local. An estimate, like `reorder_bound`: a change that
    lessens contention with calls outside the region is not in it.

    What it is for: after complete trials found a winner, a local alternative that cannot combine with it
    matters only if it could save more than the winner does; when this bound says it cannot, its trial
    (pure overhead: state snapshots, not training) is not run. H200, MJX: the spatial split
    of the rollout could save at most ~1.9 s/iteration (the simulator is busy 2.7 s of each 3.7-s epoch)
    against the temporal split's measured 1.97 s, and its trial and capture took 64 s."""
    prefix = item_sources(wf).get(tuple(region))
    if prefix is None:  # no such region: nothing under it was measured
        return None
    loops = sum(isinstance(wf.find(region[:n]), LoopNode) for n in range(1, len(region) + 1))
    per_iteration: list[float] = []
    bounding: dict[str, float] = defaultdict(float)  # busy seconds of each run's busiest process
    for run in runs:
        instances: dict[tuple[int, ...], dict[str, list[tuple[int, int]]]] = defaultdict(lambda: defaultdict(list))
        for c in run.calls:
            if c.source == prefix or c.source.startswith(prefix + "."):
                instances[tuple(c.indices[:loops])][c.component].append((c.start_ns, c.end_ns))
        if not instances:
            continue
        saving = 0.0
        for by_process in instances.values():
            busy = {p: sum(b - a for a, b in merge_intervals(ss)) / 1e9 for p, ss in by_process.items()}
            top = max(busy, key=busy.__getitem__)
            bounding[top] += busy[top]
            span = max(e for ss in by_process.values() for _, e in ss) - min(a for ss in by_process.values() for a, _ in ss)
            saving += max(0.0, span / 1e9 - busy[top])
        per_iteration.append(saving)
    if not per_iteration:
        return None
    return statistics.median(per_iteration), max(bounding, key=bounding.__getitem__)
