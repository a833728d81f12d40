"""Seeding a temporal split's copy from the original's state (paper §4.3.1: the copies of a split start
from the original's state).

A copy of a component for a group of a split loop (`sim@0`, `copy_of: sim`) is built by the component's
constructor. When the loop reads state of that component that it does not write but something else does
(a `refresh` before the loop, an `update` after it that the next RL iteration's loop reads), the copy
must start from the original's value. The split puts, before its groups, one pair of plan calls per
copy: `seed_sim` (`call: sim._rose_get_states`: reads those state objects of the original, output
`states`) and `seed_sim@0` (`call: sim@0._rose_set_states`: refreshes the same state objects of the
copy from `seed_sim.states`). They are ordinary calls to both runtimes and the reference interpreter
(the component worker answers the two reserved methods itself, `interpreter.components.invoke`), run
in each component's program order like any other, so the copy's first call of each iteration of the
enclosing loops sees the original's value as of the split loop's start. The legality oracle and the
plan check count a seed's write as the value its read saw (`through_seeds`): what a call on the copy
sees is then compared with what the declared call saw, with no special case elsewhere.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..analysis import InvocationGraph, effect_key
from ..ir import ExecutionNode, Item
from ..semantics import Invocation

__all__ = ["SEED_GET", "SEED_SET", "SEED_PORT", "is_seed", "seed_invocations", "through_seeds"]

SEED_GET = "_rose_get_states"  # reserved method: returns {state name: value} of the node's declared reads
SEED_SET = "_rose_set_states"  # reserved method: sets the node's declared state objects from `states`
SEED_PORT = "states"

Seen = dict[tuple[Invocation, str], frozenset[Invocation | None]]


def is_seed(item: Item | None) -> bool:
    return isinstance(item, ExecutionNode) and item.method in (SEED_GET, SEED_SET)


def seed_invocations(g: InvocationGraph) -> set[Invocation]:
    return {inv for inv in g.order if is_seed(g.node[inv])}


def through_seeds(g: InvocationGraph, seen: Mapping[tuple[Invocation, str], frozenset[Invocation | None]]) -> Seen:
    """`seen` (`analysis.state_observations`) without the seeds' own accesses, each write of a seed set
    replaced by what the seed get it reads from saw of the same state object (a copy of a copy: followed
    on). A seed set that reads no seed get, or a state object its get did not read, stands for no value:
    what reads it differs from any declared read."""
    source: dict[Invocation, Invocation] = {}
    for p, c, dep in g.edges():
        if dep.kind == "data" and g.node[c].method == SEED_SET and g.node[p].method == SEED_GET:
            source[c] = p

    def resolve(w: Invocation | None, suffix: str, depth: int = 0) -> frozenset[Invocation | None]:
        if w is None or not is_seed(g.node[w]):
            return frozenset({w})
        get = source.get(w)
        if get is None or depth > len(source):
            return frozenset()
        got = seen.get((get, f"{g.node[get].component}.{suffix}"), frozenset())
        return frozenset().union(*(resolve(x, suffix, depth + 1) for x in got))

    out: Seen = {}
    for (reader, state), writers in seen.items():
        if is_seed(g.node[reader]):
            continue
        suffix = effect_key(g.node[reader], state).name
        out[(reader, state)] = frozenset().union(*(resolve(w, suffix) for w in writers))
    return out
