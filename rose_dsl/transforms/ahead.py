"""Calls run ahead (`ahead NODE`): the next RL iteration's call of a node -- and of the nodes it reads from --
run in this one, at their place.

The plan partial rollouts need. An LLM GRPO iteration samples prompts, submits them to the generator and
collects their completions; the long tail of completion lengths leaves decode slots idle while the last
completions finish. Run `sample` and `submit` ahead, and iteration i+1's prompts are queued while
iteration i decodes: they take the slots the tail leaves, are unfinished at the weight sync, and continue
under the new weights (the generator's `partial_rollouts`, per-token versions). The submit's read of the
weights is then one RL iteration old -- the lag the oracle proves and the state object's `max_staleness`
must allow, as for `defer`.

Why a field and not a rotated body (as `defer`'s module says for its own): the tree, every name and every
checkpoint stay those of the declared workflow. Nothing is run ahead across a barrier -- a checkpoint, a
stop, the end of a run: the iteration before one runs its own calls only, and the iteration after it runs
its own calls of the nodes run ahead first (`semantics.Program.unroll`) -- so a checkpoint holds the state
the declared workflow would, and a resume needs nothing carried.

K is 1: a call two iterations ahead would read the weights two updates old for one more iteration's worth
of queued work, and the runtime's barrier rule would need the next barrier two iterations out.
"""

from __future__ import annotations

from dataclasses import replace

from ..analysis import invocation_graph
from ..ir import ExecutionNode, Workflow
from ..semantics import Invocation
from .rewritten import Refused, Rewritten, identity_locate
from .tree import find, replace_body

__all__ = ["build_ahead", "budgeted_readers", "ahead_without_producers"]

Path = tuple[str, ...]


def build_ahead(wf: Workflow, path: Path, k: int = 1) -> Rewritten:
    """The node at `path` (directly in the RL iteration body) and every node it reads from in its own
    RL iteration, transitively, run one RL iteration ahead. The state they read is checked by the oracle
    (`legality.check_order_preserved`): a read may see an older value only within its `max_staleness`."""
    node = find(wf, path)
    if not isinstance(node, ExecutionNode) or path[:-1] != wf.root.path:
        raise Refused(f"ahead: '{path[-1]}' is not a node directly in the RL iteration body", at=node.pos)
    if k != 1:
        raise Refused(f"ahead: only K = 1 is supported, not {k}", at=node.pos)
    hoisted = _with_producers(wf, path)
    items = {i.path: i for i in wf.root.body}
    for p in sorted(hoisted):
        item = items.get(p)
        if not isinstance(item, ExecutionNode):
            raise Refused(f"ahead: '{path[-1]}' reads '{p[-1]}' of its own RL iteration, which is not a node "
                          "directly in the RL iteration body: it cannot run ahead with it", at=node.pos)
        if item.plan.defer or item.plan.ahead:
            raise Refused(f"ahead: '{p[-1]}' is already {'deferred' if item.plan.defer else 'run ahead'}", at=node.pos)
    body = [replace(i, plan=replace(i.plan, ahead=1)) if isinstance(i, ExecutionNode) and i.path in hoisted else i
            for i in wf.root.body]
    names = " ".join(i.name for i in wf.root.body if i.path in hoisted)
    return Rewritten(replace_body(wf, wf.root.path, body), identity_locate, f"ahead {names}")


def _with_producers(wf: Workflow, path: Path) -> set[Path]:
    """`path` and the items of the RL iteration body whose outputs it reads in the same RL iteration,
    transitively (data and `after:` dependencies of one iteration's invocation graph)."""
    g = invocation_graph(wf, iterations=1)
    top = {i.path for i in wf.root.body}
    out, todo = {path}, [Invocation(path, (0,))]
    while todo:
        for producer, deps in g.deps.get(todo.pop(), {}).items():
            if not any(d.kind != "state" for d in deps):
                continue
            owner = next((p for p in top if producer.path[: len(p)] == p), None)
            if owner is not None and owner not in out:
                out.add(owner)
                todo += [inv for inv in g.order if inv.path[: len(owner)] == owner]
    return out


def ahead_without_producers(wf: Workflow) -> list[tuple[ExecutionNode, str]]:
    """(node, producer name) for each node run ahead that reads, in its own RL iteration, a node that is not
    run ahead: a plan `build_ahead` could not have written (a hand edit), since a call of iteration i+1 at
    its place in iteration i has no value of i+1 to read. Producers are those of the plan with every node
    back in place (what they read does not depend on where calls run)."""
    ahead = [i for i in wf.root.body if isinstance(i, ExecutionNode) and i.plan.ahead]
    if not ahead:
        return []
    in_place = [replace(i, plan=replace(i.plan, ahead=0, defer=0)) if isinstance(i, ExecutionNode) else i
                for i in wf.root.body]
    flat = replace_body(wf, wf.root.path, in_place)
    items = {i.path: i for i in wf.root.body}
    out = []
    for node in ahead:
        for p in sorted(_with_producers(flat, node.path) - {node.path}):
            item = items.get(p)
            if not (isinstance(item, ExecutionNode) and item.plan.ahead):
                out.append((node, p[-1]))
    return out


def budgeted_readers(wf: Workflow) -> list[Path]:
    """The nodes directly in the RL iteration body that read a state object with a budget > 0 and are not
    run ahead or deferred yet: the calls worth running ahead (the optimizer's candidates; `ahead` takes the
    nodes they read from along). Empty when no state object declares `max_staleness`."""
    objects = wf.state_objects()
    return [item.path for item in wf.root.body
            if isinstance(item, ExecutionNode) and not (item.plan.ahead or item.plan.defer)
            and any(e.state in objects and objects[e.state].max_staleness > 0 and not e.access.writes
                    for e in item.effects)]
