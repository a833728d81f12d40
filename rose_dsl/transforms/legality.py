"""The legality oracle of the rewrites: the rewritten workflow is well formed, every data producer still
runs before its consumer, and every state access sees the values of the same calls.

A reordering keeps every invocation and every reference; it only changes program order, which is
each component's execution order (and so the order of its state accesses). The runtime gives every
data dependency a future, so data edges need only their producer earlier; state is the component's
own object, changed in place in program order, so what matters is which write each access observes
(`analysis.state_observations`, row aware: a row group's write replaces its rows only) and which writes are left
at the end of an RL iteration (for the next one and checkpoints) -- exact, where keeping the order of
every two conflicting accesses would refuse legal moves (a write that is overwritten before anyone sees
it may move past the reads of other values). The check works on the invocation graphs of two
consecutive RL iterations, so a refusal names the exact invocations ("epoch[1].step[2].env ->
update[0].sgd") and where the consumer asks for the value in the original workflow (file:line:col).

A temporal split gives some groups their own copy of a component: a state object of its own, so calls
on a copy see only the copy's values -- a value that would have to flow from one copy to another makes
the split refused. A copy seeded from the original's state (`seeds.py`) sees, through its seed, what
the seed read of the original.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..analysis import (
    Dep,
    effect_key,
    invocation_graph,
    iterations_in_flight,
    read_lag,
    state_observations,
    writer_lags,
)
from ..errors import SourcePos
from ..ir import ExecutionNode, Item, Workflow
from ..resolve import check_workflow
from ..semantics import Invocation, enclosing_loops
from ..versions import ReadProof, chain_text, over_budget_reads
from .rewritten import Locate, Refused
from .seeds import seed_invocations, through_seeds

__all__ = ["check_well_formed", "check_order_preserved", "on_component", "describe_invocation", "dependency_pos",
           "over_budget", "values_of", "staleness_budgets", "check_version_lags", "version_refusal"]


def describe_invocation(inv: Invocation, items: Mapping[tuple[str, ...], Item]) -> str:
    """`epoch[1].step[2].act`: the path below the RL iteration with each loop's iteration number; the
    RL iteration itself is named only when it is not the first (`(next RL iteration)`)."""
    loops = enclosing_loops(inv.path, items)
    index = dict(zip(loops, inv.indices, strict=False))
    parts = [name + (f"[{index[inv.path[:n + 1]]}]" if inv.path[:n + 1] in index else "")
             for n, name in enumerate(inv.path) if n > 0]
    rl = inv.indices[0] if inv.indices else 0
    return ".".join(parts) + (" (next RL iteration)" if rl > 0 else "")


def dependency_pos(consumer: Invocation, dep: Dep, items: Mapping[tuple[str, ...], Item]) -> SourcePos | None:
    """Where the consumer of a dependency asks for it in its workflow: the input field of a data
    dependency, the `state:` field of a state one, the `after:` field of the item that orders it (the
    call's node or a loop around it: the reason starts with that item's name)."""
    node = items.get(consumer.path)
    if node is None:
        return None
    if dep.kind == "data":
        key = dep.input_field or "in"  # "in.obs"
        return node.field_pos.get(key) or node.field_pos.get("in") or node.pos
    if dep.kind == "after":
        name = dep.parts[0]  # the item with the `after:` (the detail "update: after rollout")
        owner = next((items[consumer.path[:n]] for n in range(len(consumer.path), 1, -1)
                      if consumer.path[n - 1] == name and consumer.path[:n] in items), node)
        return owner.field_pos.get("after") or owner.pos
    return node.field_pos.get("state") or node.pos


def check_well_formed(new: Workflow, what: str) -> None:
    diags = check_workflow(new)
    if diags:
        d = diags[0]
        raise Refused(f"{what} would break a data dependency: {d.path}: {d.message}", at=d.pos)


def check_order_preserved(orig: Workflow, new: Workflow, locate: Locate, what: str) -> None:
    """Refuse unless `new` keeps every dependency of `orig`: each data producer (and each item an `after:`
    names) still runs before its consumer, and each state access sees the values of the same calls (and
    the same calls' values are left at the end of each RL iteration). A temporal split's copies of a
    component are state objects of their own: a call on a copy sees the copy's values.

    Every edge is checked in one pass over positions; only the broken ones are sorted, to name the first
    (by consumer, then producer): an optimizer asks this thousands of times and refusals are the rare case."""
    check_well_formed(new, what)
    n = 1 + iterations_in_flight(new)  # a deferred call of iteration k reaches iteration k+defer: show it
    g0 = invocation_graph(orig, iterations=n)
    g1 = invocation_graph(new, iterations=n)
    position = {inv: i for i, inv in enumerate(g1.order)}
    items = {item.path: item for item in orig.items()}

    def image(inv: Invocation) -> Invocation:
        loc = locate(inv.path, inv.indices)
        if loc is None:
            raise Refused(f"{what}: {describe_invocation(inv, items)} has no counterpart (a bug in rose)", internal=True)
        return Invocation(*loc)

    moved: dict[Invocation, Invocation] = {}  # original invocation -> its image in the rewrite
    at: dict[Invocation, int] = {}  # original invocation -> the position of its image
    for inv in g0.order:
        img = moved[inv] = image(inv)
        where = position.get(img)
        if where is None:
            raise Refused(f"{what}: {describe_invocation(inv, items)} is not run by the rewritten workflow "
                          "(a bug in rose)", internal=True)
        at[inv] = where
    # a seed (`seeds.py`) stands for no call of the declared workflow: a split may add them
    calls, before = len(g1.order) - len(seed_invocations(g1)), len(g0.order) - len(seed_invocations(g0))
    if before != calls:
        raise Refused(f"{what}: it runs {calls} calls instead of {before} (a bug in rose)", internal=True)
    broken = [e for e in g0.edges() if e[2].kind != "state" and at[e[0]] > at[e[1]]]
    if broken:
        producer, consumer, dep = min(broken, key=lambda e: (str(e[1]), str(e[0])))
        raise Refused(_broken(what, producer, consumer, dep, items, f"{describe_invocation(consumer, items)} would run first"),
                      at=dependency_pos(consumer, dep, items))
    seen0, left0 = state_observations(g0)
    seen1, left1 = state_observations(g1)
    seen0, seen1 = through_seeds(g0, seen0), through_seeds(g1, seen1)

    def images(writers: frozenset[Invocation | None]) -> frozenset[Invocation | None]:
        return frozenset(None if w is None else moved[w] for w in writers)

    budgets = staleness_budgets(orig)
    # a budget bounds the lag against the declared workflow: what `orig` (a plan already asynchronous) lags
    # already is spent (`ahead submit` then `defer sync 1` reads the weights two updates old)
    spent = writer_lags(orig) if budgets and iterations_in_flight(orig) > 1 else {}

    def left_of(state: str, reader: Invocation) -> int:
        return budgets.get(state, 0) - spent.get((state, reader.path), 0)

    def seen_then(reader: Invocation, state: str, lag: int) -> frozenset[Invocation | None]:
        """What the declared workflow's read saw `lag` RL iterations earlier (the initial value before the first)."""
        k = reader.indices[0] - lag
        return images(seen0.get((reader._replace(indices=(k,) + reader.indices[1:]), state), frozenset({None}))
                      if k >= 0 else frozenset({None}))

    differ = []
    for (reader, state), writers in seen0.items():
        got = seen1.get((moved[reader], on_component(g0.node[reader], state, g1.node[moved[reader]].component)),
                        frozenset())
        if got == images(writers):
            continue
        lag = read_lag(got, lambda lag, r=reader, s=state: seen_then(r, s, lag), reader.indices[0] + 1)  # type: ignore[misc]
        if lag is not None and lag <= left_of(state, reader) and _access(g0.node[reader], state) == "read":
            continue  # an older value, within the state's budget (an asynchronous plan)
        differ.append((reader, state, got, lag))
    if differ:
        reader, state, got, lag = min(differ, key=lambda x: (at[x[0]], x[1]))
        node = g0.node[reader]
        raise Refused(f"{what} would break the state dependency {_writers(seen0[reader, state], items, 'initial value')} -> "
                      f"{describe_invocation(reader, items)} ('{state}': {_access(node, state)}): "
                      f"{describe_invocation(reader, items)} would see {values_of(got, {i.path: i for i in new.items()})} instead"
                      + (over_budget(state, lag + spent.get((state, reader.path), 0) if lag is not None else None,
                                     budgets.get(state, 0), _access(node, state)) if n > 2 or budgets else ""),
                      at=node.field_pos.get("state") or node.pos)
    # what an RL iteration leaves is what a checkpoint after it saves; a plan that runs calls ahead runs none
    # ahead across a checkpoint (or a stop, or the end), so only the last iteration's end is one it can have
    ahead = any(isinstance(i, ExecutionNode) and i.plan.ahead for i in new.root.body)
    for (k, state), writers in sorted(left0.items()):
        if ahead and k < n - 1:
            continue
        got = left1.get((k, state), frozenset())
        if got == images(writers):
            continue
        lag = read_lag(got, lambda lag, k=k, s=state: images(left0.get((k - lag, s), frozenset({None}))), k + 1)  # type: ignore[misc]
        if lag is None or lag > budgets.get(state, 0):
            writer = next((items[w.path] for w in sorted((w for w in writers if w is not None), key=str)), None)  # where to point
            raise Refused(f"{what} would change which value of '{state}' RL iteration {k} leaves for the next one and "
                          f"checkpoints: {values_of(got, {i.path: i for i in new.items()})} instead of {values_of(writers, items)}"
                          + (over_budget(state, lag, budgets.get(state, 0), "read") if n > 2 or budgets else ""),
                          at=None if writer is None else writer.field_pos.get("state") or writer.pos)
    check_version_lags(new, what)


def check_version_lags(wf: Workflow, what: str, budgets: Mapping[str, int] | None = None) -> None:
    """Refuse unless every read of `wf` (an asynchronous plan) derives from learner updates at most its state's
    `max_staleness` older than the synchronous run's (`versions.py`: the lag followed through syncs, relays,
    derived states and copies, which counting a state's own writes misses). `budgets`: by state key (default:
    `wf`'s own, a copy's being its original's)."""
    if iterations_in_flight(wf) == 1:
        return
    budgets = {k: s.max_staleness for k, s in wf.state_objects().items()} if budgets is None else budgets
    over = over_budget_reads(wf, budgets)
    if over:
        proof = over[0]
        node = next((i for i in wf.items() if i.path == proof.reader.path), None)
        raise Refused(version_refusal(what, proof, budgets.get(proof.state, 0)),
                      at=None if node is None else node.field_pos.get("state") or node.pos)


def version_refusal(what: str | None, proof: ReadProof, budget: int) -> str:
    """`defer sync2 1 would make act read 'actor.weights' 2 learner updates old: actor.weights <- sync2 <-
    relay.weights <- sync1 <- learner.params: lag 2 > max_staleness 1 (...)`; without `what`: `act would read ...`."""
    reader = ".".join(proof.reader.path[1:])
    s = "s" * (proof.lag != 1)
    subject = f"{what} would make {reader} read" if what else f"{reader} would read"
    return (f"{subject} '{proof.state}' {proof.lag} update{s} of '{proof.source}' old: "
            f"{chain_text(proof)}: lag {proof.lag} > max_staleness {budget} (in RL iteration {proof.reader.indices[0]} "
            f"it would read version {proof.got} of '{proof.source}', the synchronous workflow version {proof.declared}; "
            "a value's age is carried through every sync, relay and derived state"
            + ("; declare max_staleness on its state object to allow it)" if budget == 0 else ")"))


def staleness_budgets(wf: Workflow) -> dict[str, int]:
    """`max_staleness` of every state object that declares one (a temporal split's copies share their original's)."""
    return {s.key: s.max_staleness for s in wf.state_objects().values() if s.max_staleness}


def over_budget(state: str, lag: int | None, budget: int, access: str) -> str:
    """What a refusal adds when the value seen is an older one: how old, and what the budget allows."""
    if lag is None:
        return ""
    if access != "read":
        return f" (an older value, {lag} RL iteration{'s' * (lag > 1)} old, for an {access}: only reads may lag)"
    return (f" (a value {lag} RL iteration{'s' * (lag > 1)} old: '{state}' allows max_staleness {budget}"
            f"{'; declare max_staleness on its state object to allow it' if budget == 0 else ''})")


def on_component(node: ExecutionNode, state: str, component: str) -> str:
    """The state object `state` that `node` accesses, on another component (a temporal split's copy):
    `sim.episode` -> `sim@0.episode`; its key from the node's effect, not from its spelling."""
    return str(effect_key(node, state).on(component))

def _access(node: ExecutionNode, state: str) -> str:
    return next((e.access.value for e in node.effects if e.state == state), "?")


def _writers(writers: frozenset[Invocation | None], items: Mapping[tuple[str, ...], Item], none: str) -> str:
    names = sorted(none if w is None else describe_invocation(w, items) for w in writers)
    return " and ".join(names) if names else "no call"


def values_of(writers: frozenset[Invocation | None], items: Mapping[tuple[str, ...], Item]) -> str:
    """`the value of update[3].sgd`, `the initial value`: what a state access sees, in words."""
    if not writers:
        return "no value"
    parts = sorted("the initial value" if w is None else f"the value of {describe_invocation(w, items)}" for w in writers)
    return " and ".join(parts)


def _broken(what: str, producer: Invocation, consumer: Invocation, dep: Dep,
            items: Mapping[tuple[str, ...], Item], how: str) -> str:
    kind = {"data": "data dependency", "after": "ordering constraint"}.get(dep.kind, "state dependency")
    return (f"{what} would break the {kind} {describe_invocation(producer, items)} -> "
            f"{describe_invocation(consumer, items)} ({dep.detail}): {how}")
