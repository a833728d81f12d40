"""The asynchronous plan: a weight sync deferred by K RL iterations (`defer NODE K`).

The sync of RL iteration i (the call that writes the state object the rollout reads: the generator's
weight load) runs at its place in RL iteration i+K, its inputs still those of iteration i. The rollout
of iteration i+1 then no longer waits for iteration i's update, so a runtime that submits the next
iteration before this one has finished (`interpreter/pipeline.py`) overlaps them -- the pipelined RL
iteration of verl's, AReaL's and slime's asynchronous modes, with the rollout reading the weights of
update i-K.

Why a `defer:` field on the node and not a rotated body (the sync moved to the top of the next
iteration with the weights carried across): the tree, every name and every checkpoint stay those of
the declared workflow; the first K iterations simply have nothing deferred yet, and what is pending runs
before a checkpoint and at the end (`semantics.Program.drain`), so a checkpoint holds the state the
declared workflow would hold and a resume needs no carried value.

The build is pure; legality is the oracle's (`legality.check_order_preserved`): every data dependency and
every state dependency kept, except reads of a state object that declares `max_staleness`, which may
see the value the declared read saw up to that many RL iterations earlier -- the lag the oracle proves
on the invocation graphs and refuses, with the read and its lag, beyond the budget.
"""

from __future__ import annotations

from dataclasses import replace

from ..ir import ExecutionNode, Workflow
from .rewritten import Refused, Rewritten, identity_locate
from .tree import find, replace_body

__all__ = ["build_defer", "budgeted_writers", "MAX_DEFER"]

Path = tuple[str, ...]
MAX_DEFER = 64  # the largest K: the check unrolls 1 + K RL iterations and the runtime keeps 1 + K in flight


def build_defer(wf: Workflow, path: Path, k: int | None = None) -> Rewritten:
    """The node at `path` (directly in the RL iteration body) deferred by `k` RL iterations. Default: the
    smallest `max_staleness` > 0 of the state objects it writes (a larger one would make the reads of the
    other object older than its budget allows), at most the RL iteration count - 1: a call deferred longer
    would run only after the last iteration, and the check unrolls 1 + K iterations, so a budget meant as
    "any staleness" (`max_staleness: 1000000`) taken as K would hang it (and at most `MAX_DEFER`)."""
    node = find(wf, path)
    if not isinstance(node, ExecutionNode) or path[:-1] != wf.root.path:
        raise Refused(f"defer: '{path[-1]}' is not a node directly in the RL iteration body", at=node.pos)
    count = wf.root.count
    if k is None:
        k = min((budget for _, budget in _written_budgets(wf, node) if budget > 0), default=1)
        k = max(1, min(k, count - 1, MAX_DEFER)) if count is not None else min(k, MAX_DEFER)
    if k < 1:
        raise Refused(f"defer: K must be at least 1, not {k}", at=node.pos)
    if count is not None and k >= count:
        raise Refused(f"defer: K {k} is not below the RL iteration count {count}: the call of RL iteration 0 "
                      f"would run only after the last one; give K at most {count - 1}", at=node.pos)
    if k > MAX_DEFER:
        raise Refused(f"defer: K {k} is more than rose checks and keeps in flight; give K at most {MAX_DEFER}",
                      at=node.pos)
    written = _written_budgets(wf, node)
    most = max((s.max_staleness for s in wf.state_objects().values()), default=0)
    if written and k > most:  # (the plan check's bound before it unrolls, `PlanCheck.defer_bounds`: the two agree)
        state, budget = min(written, key=lambda w: w[1])
        raise Refused(f"defer: what '{node.name}' writes would be read, or left, as a value {k} RL iteration"
                      f"{'s' * (k != 1)} old: '{state}' allows max_staleness {budget}, and no state allows {k}",
                      at=node.pos)
    if node.plan.defer:
        raise Refused(f"defer: '{node.name}' is already deferred ({node.plan.defer})", at=node.pos)
    body = [replace(node, plan=replace(node.plan, defer=k)) if i.path == path else i for i in wf.root.body]
    return Rewritten(replace_body(wf, wf.root.path, body), identity_locate, f"defer {node.name} {k}")


def _written_budgets(wf: Workflow, node: ExecutionNode) -> list[tuple[str, int]]:
    objects = wf.state_objects()
    return [(e.state, objects[e.state].max_staleness) for e in node.effects
            if e.access.writes and e.state in objects]


def budgeted_writers(wf: Workflow) -> list[tuple[Path, int]]:
    """The nodes directly in the RL iteration body that write a state object with a budget > 0, each with
    that budget: the deferrals worth trying (the optimizer's asynchronous candidates). Empty when no state
    object declares `max_staleness`: then no plan may read an older value, and none is tried."""
    out = []
    for item in wf.root.body:
        if isinstance(item, ExecutionNode) and not item.plan.defer:
            budget = max((b for _, b in _written_budgets(wf, item)), default=0)
            if budget > 0:
                out.append((item.path, budget))
    return out
