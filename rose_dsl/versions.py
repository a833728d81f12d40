"""Lag as version distance: which learner updates every value of a plan derives from, against the declared
run's, followed through the whole data flow.

Why: an asynchronous plan (`defer`, `ahead`) lets a read see an older value, within the read state's
`max_staleness`. Counting a state's own writes ("the read sees the write of RL iteration k-1-K") is not a
proof once a value travels: with a relay (learner -> `sync1` -> relay weights -> `sync2` -> actor weights)
deferring both syncs by 1 makes each state's writes only 1 iteration late, while the actor reads weights
2 updates old; a budget-1 relay that feeds a budget-0 actor leaves the actor's reads 1 update old. The docs
define lag by update version ("the weights of update k-1-K"), so that is what is proved here.

How: a new interpretation of the one lazy evaluator (`semantics.run_sequential`), as the dependency sets
of `analysis` are. A value is a *version vector*: for each *source* -- a state object some call `update`s
(the learner's parameters, an optimizer state, a replay buffer, a simulator's episode: a new value computed
from its previous one) -- the oldest and newest update it derives from (`Entry`; version v = the value left
by the updates of RL iteration v-1; 0: the initial value). A call's inputs and the state it reads merge
into what it computes (its outputs); a `refresh` stores that (a copy or a derived state: the relay carries
the learner's version, not one of its own); an `update` of S stores S's new version alone. That last rule is
the line between a value's age and off-policy data: rollouts from weights one update old make the learner's
update (or a simulator's step, or a buffer's insert) off-policy, which the budget of the weights they read
already allowed, and do not make the parameters (the episode, the buffer) it leaves older -- were they
counted, every budget-0 state an asynchronous rollout touches would lag. Split groups, copies and their seeds, merges, carried
values, `until` loops (at their representative trip counts) and calls run ahead or deferred are all the
evaluator's, so the proof follows them with no case of its own.

The plan and the same plan run synchronously (every `defer`/`ahead` removed: the declared run, since every
other rewrite keeps what each access sees, which the legality oracle checks exactly) are both run; a read
of state X in RL iteration k has lag L when, for some source, the plan's value is L versions behind the
declared one's (at its newest or its oldest end). The plan is legal when every read's lag is at most X's
`max_staleness` (0 where none is declared). Each entry remembers the chain its oldest version came through
(`actor.weights <- sync2 <- relay.weights <- sync1 <- learner.params`), which a refusal and `rose validate
--explain` print.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from .ir import Access, ExecutionNode, Workflow
from .semantics import CallSite, Invocation, Program, ValueOps, run_sequential
from .until import representative

__all__ = ["Entry", "ReadProof", "version_proof", "synchronous", "proof_iterations", "over_budget_reads", "chain_text"]

Path = tuple[str, ...]


class Entry(NamedTuple):
    """The versions of one source a value derives from: oldest, newest, and the chain of state objects and
    writers the oldest came through (the read state first, the source last)."""

    lo: int
    hi: int
    chain: tuple[str, ...]


Vector = Mapping[str, Entry]
_EMPTY: Vector = {}


def _merge(values: Sequence[Any]) -> Vector:
    """One vector from many: per source the oldest and newest version, with the oldest's chain."""
    out: dict[str, Entry] = {}
    todo = list(values)
    while todo:
        v = todo.pop()
        if isinstance(v, list | tuple):
            todo.extend(v)
            continue
        if not isinstance(v, Mapping):
            continue  # an integer: a loop index, a param
        for s, e in v.items():
            old = out.get(s)
            if old is None:
                out[s] = e
            elif e != old:
                lo = e if (e.lo, len(e.chain)) < (old.lo, len(old.chain)) else old
                out[s] = Entry(lo.lo, max(e.hi, old.hi), lo.chain)
    return out


class VersionOps:
    """The version interpretation of values (`semantics.ValueOps`): whatever combines values carries the
    versions of all of them; a slice those of what it slices."""

    def stack(self, values: Sequence[Any]) -> Any:
        return _merge(values)

    def cat(self, values: Sequence[Any], dim: int = 0) -> Any:
        return _merge(values)

    def record(self, fields: Mapping[str, Any]) -> Any:
        return _merge(list(fields.values()))

    def slice(self, value: Any, start: int | None, stop: int | None) -> Any:
        return value

    def truth(self, value: Any) -> bool:
        return True  # unreached: loops that end on a condition run at representative counts


class _VersionRun:
    """The backend of one run: each component's state as a version vector, in program order; what each
    reading access saw."""

    ops: ValueOps = VersionOps()

    def __init__(self, sources: frozenset[str]) -> None:
        self.sources = sources
        self.state: dict[str, Vector] = {}
        self.seen: dict[tuple[Invocation, str], Vector] = {}  # (reader, state) -> the state's vector it read

    def value(self, state: str) -> Vector:
        got = self.state.get(state)
        if got is None:
            return {state: Entry(0, 0, (state,))} if state in self.sources else _EMPTY
        return got

    def call(self, site: CallSite, inputs: dict[str, Any]) -> dict[str, Any]:
        node, inv = site.node, site.inv
        parts: list[Any] = list(inputs.values())
        for e in node.effects:
            if e.access.reads_previous:
                current = self.value(e.state)
                if e.access is Access.READ:
                    self.seen[(inv, e.state)] = current
                parts.append(current)
        given = _merge(parts)
        version = inv.indices[0] + 1
        written: dict[str, Vector] = {}
        updated = {e.state for e in node.effects if e.access is Access.UPDATE}
        derived = {s: x for s, x in given.items() if s not in updated}
        for s in updated:
            derived[s] = Entry(version, version, (s,))
        for e in node.effects:
            if not e.access.writes:
                continue
            new: Vector = {e.state: derived[e.state]} if e.access is Access.UPDATE else {
                s: Entry(x.lo, x.hi, (e.state, node.name) + x.chain) for s, x in derived.items()}
            if node.plan.rows is not None:  # a row group replaces its rows only
                new = _merge([self.state.get(e.state, _EMPTY), new])
            written[e.state] = new
        self.state.update(written)
        return {port: derived for port in node.outputs}


@dataclass(frozen=True)
class ReadProof:
    """A read's lag: the largest over the sources its value derives from, with the source and chain that
    give it; `declared`/`got` are that source's versions (newest or oldest end, whichever lags more)."""

    reader: Invocation
    state: str
    lag: int
    source: str = ""
    declared: int = 0
    got: int = 0
    chain: tuple[str, ...] = ()


def synchronous(wf: Workflow) -> Workflow:
    """`wf` with every `defer` and `ahead` removed: the run whose versions a plan's reads are measured against."""
    return replace(wf, root=replace(wf.root, body=tuple(
        replace(i, plan=replace(i.plan, defer=0, ahead=0)) if isinstance(i, ExecutionNode) else i for i in wf.root.body)))


def proof_iterations(wf: Workflow) -> int:
    """How many RL iterations the proof runs: a lag builds up along a chain of deferred and ahead calls, each
    adding at most its own offset, so 2 + their sum show the largest one."""
    nodes = [i for i in wf.root.body if isinstance(i, ExecutionNode)]
    return 2 + sum(i.plan.defer + i.plan.ahead for i in nodes)


def _run(wf: Workflow, iterations: int, sources: frozenset[str]) -> dict[tuple[Invocation, str], Vector]:
    backend = _VersionRun(sources)
    run_sequential(Program(representative(wf)), backend, range(iterations))
    return backend.seen


def version_proof(wf: Workflow, iterations: int | None = None) -> dict[tuple[Invocation, str], ReadProof]:
    """Per read (reading call, state object) of `wf`, in every RL iteration the proof runs: its lag in versions
    against `wf` run synchronously. {} for a synchronous workflow."""
    if not any(isinstance(i, ExecutionNode) and (i.plan.defer or i.plan.ahead) for i in wf.root.body):
        return {}
    n = proof_iterations(wf) if iterations is None else iterations
    sources = frozenset(e.state for i in wf.items() if isinstance(i, ExecutionNode)
                        for e in i.effects if e.access is Access.UPDATE)
    declared = _run(synchronous(wf), n, sources)
    planned = _run(wf, n, sources)
    out: dict[tuple[Invocation, str], ReadProof] = {}
    for key, got in planned.items():
        want = declared.get(key)
        if want is None:
            continue  # (a read the declared run has not: the legality oracle names it)
        best = ReadProof(key[0], key[1], 0)
        for s in want.keys() | got.keys():
            d = want.get(s) or Entry(0, 0, (s,))
            p = got.get(s) or Entry(0, 0, (f"{key[1]} (its initial value)",))
            lag, at_d, at_p = max((d.hi - p.hi, d.hi, p.hi), (d.lo - p.lo, d.lo, p.lo))
            if lag > best.lag:
                best = ReadProof(key[0], key[1], lag, s, at_d, at_p, p.chain)
        out[key] = best
    return out


def chain_text(proof: ReadProof) -> str:
    """`actor.weights <- sync2 <- relay.weights <- sync1 <- learner.params`."""
    return " <- ".join(proof.chain) if proof.chain else proof.state


def over_budget_reads(wf: Workflow, budgets: Mapping[str, int]) -> list[ReadProof]:
    """The reads of `wf` whose lag exceeds the budget of the state they read (`budgets`: by state key; a copy
    `sim@0.x` has its original's; none: 0), the largest lag first, then program order."""
    bad = [p for p in version_proof(wf).values() if p.lag > budgets.get(p.state, 0)]
    return sorted(bad, key=lambda p: (-p.lag, -p.reader.indices[0], p.reader.indices, p.reader.path, p.state))
