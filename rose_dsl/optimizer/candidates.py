"""Candidate search (paper §4.3.2): for a target node v, the rewrites that could let other work w
overlap v's windows, in the paper's order, as rewrite requests.

Why requests (`"split step 2"`, `"interleave step"`) and not graph surgery of its own: every candidate
goes through the same transformations and legality checks as `rose rewrite --do`, so a plan the
optimizer writes is one a person could have written, and an illegal candidate is a refusal with a
reason (reported), never a wrong plan.

Order for v whose parent P is a loop: split + interleave inside P -- a temporal split of P or of a free
ancestor loop (nearest first), then a spatial split of P's body with interleave -- then, in P's parent
body, the other movable loops (fuse / rewire), splittable downstream consumers, and nodes that can be
rewired next to P. For v in the iteration body or in a node's phases: repositioning v, then its
siblings. The split group count is a searched parameter. `sweep` adds, beyond the paper, every
configuration of the hand-written sweep (group pipelining with 2/4/8 groups, loop fusion, temporal
splits), so the search never misses what a user could reach by hand; `group_turns` the row-group copies of
a loop that ends per row taking turns (a multi-turn agent's decode beside another group's tool calls).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from ..analysis import loop_kinds
from ..ir import Component, ExecutionNode, Item, LoopNode, MergeNode, Workflow
from ..transforms import Refused, apply, temporal_groups
from ..transforms.ahead import budgeted_readers
from ..transforms.deferral import budgeted_writers
from ..transforms.split import check_separable, check_splittable_loop
from ..transforms.tree import own_group
from .profile import item_sources

__all__ = ["Alternative", "Feasible", "Infeasible", "alternatives", "sweep", "asynchronous", "check", "find_structural",
           "request_name", "memory_estimate", "temporal_copies", "DEFAULT_GROUPS", "TURNS", "group_turns"]

Path = tuple[str, ...]
DEFAULT_GROUPS = (2, 4, 8)
SWEEP = "(sweep)"  # the pseudo-target of the hand-written sweep's configurations
TURNS = "group-turns"  # the family of `group_turns`: a loop's row-group copies taking turns, consumers after them


@dataclass(frozen=True)
class Alternative:
    """A transformation phi(v, w): rewrite requests that let `partners` overlap the `target`."""

    requests: tuple[str, ...]
    family: str  # temporal-split | split-interleave | fuse | rewire | split-consumer | split-node | split-chain | take-turns | group-turns | defer | ahead
    target: str  # structural node path (`iteration.epoch.step.act`) or SWEEP
    partners: tuple[str, ...] = ()  # structural nodes whose work would overlap the target's
    groups: int | None = None  # k of a split
    split_nodes: tuple[str, ...] = ()  # structural nodes whose calls the split divides into k groups
    note: str = ""

    @property
    def label(self) -> str:
        return "; ".join(self.requests)


@dataclass(frozen=True)
class Feasible:
    alt: Alternative
    workflow: Workflow  # G with the requests applied
    descriptions: tuple[str, ...] = field(default=())  # what each rewrite did


@dataclass(frozen=True)
class Infeasible:
    alt: Alternative
    reason: str


def _spath(wf: Workflow, path: Path) -> str:
    """The structural node of the item at `path` (`item_sources`: split groups stand for their node)."""
    return item_sources(wf)[tuple(path)]


def find_structural(wf: Workflow, node: str) -> Item | None:
    """The item of `wf` whose structural path is `node` (the first group of a split node)."""
    sources = item_sources(wf)
    for item in wf.items():
        if sources[item.path] == node and not isinstance(item, MergeNode):
            return item
    return None


def request_name(wf: Workflow, path: Path) -> str:
    """How a rewrite request names the item at `path`: its path below `iteration`, or its bare name
    when that is what the request parser needs to resolve it (a top-level item)."""
    return ".".join(path[1:])


def _parent(wf: Workflow, path: Path) -> Item | None:
    return wf.find(path[:-1]) if len(path) > 1 else None


def _body(item: Item | None) -> tuple[Item, ...]:
    if isinstance(item, LoopNode):
        return item.body
    if isinstance(item, ExecutionNode) and item.phases and item.plan.expand:
        return item.phases
    return ()


def _calls(item: Item) -> list[ExecutionNode]:
    """The ExecutionNodes that run inside `item` (a node's phases only when it runs them expanded)."""
    if isinstance(item, ExecutionNode):
        return [c for p in item.phases for c in _calls(p)] if item.phases and item.plan.expand else [item]
    if isinstance(item, LoopNode):
        return [c for child in item.body for c in _calls(child)]
    return []


def _runs(wf: Workflow, path: Path) -> bool:
    """Does the item at `path` run (it is not inside the phases of a node that runs its entry)?"""
    for n in range(1, len(path)):
        owner = wf.find(path[:n])
        if isinstance(owner, ExecutionNode) and not owner.plan.expand:
            return False
    return True


def _batch(loop: LoopNode) -> int | None:
    sizes = {n.batch_size for n in _calls(loop) if n.batch is not None and n.batch_size is not None}
    return sizes.pop() if len(sizes) == 1 else None


def _divisors(size: int | None, groups: Sequence[int]) -> list[int]:
    """The group counts a batch of `size` rows can be split into (uneven groups allowed: 101 rows in 2)."""
    return [k for k in groups if size is not None and 1 < k <= size]


def _base(wf: Workflow, component: str) -> str:
    """The component as the source workflow names it: a temporal split's copy is its `copy_of`."""
    comp = wf.components.get(component)
    return comp.copy_of if comp is not None and comp.copy_of else component


def _partners(wf: Workflow, item: Item, component: str) -> tuple[str, ...]:
    return tuple(dict.fromkeys(_spath(wf, n.path) for n in _calls(item) if _base(wf, n.component) != component))


def _spatial(wf: Workflow, loop: LoopNode, target: str, groups: Sequence[int], component: str) -> list[Alternative]:
    """Per group count: row groups of the loop's body, pipelined. A loop inside a temporal group (`epoch@0.step`)
    is split in every group of that temporal split at once first (the groups run the same iterations' work, so a
    split that pays in one pays in each, and one group alone gains nothing while the other is its bottleneck),
    then in its own group alone."""
    name = request_name(wf, loop.path)
    nodes = tuple(dict.fromkeys(_spath(wf, n.path) for n in _calls(loop)))
    everywhere = [request_name(wf, p) for p in _in_every_temporal_group(wf, loop.path)]
    partners = _partners(wf, loop, component)
    out = []
    for k in _divisors(_batch(loop), groups):
        if len(everywhere) > 1:
            out.append(Alternative(tuple(r for n in everywhere for r in (f"split {n} {k}", f"interleave {n}")),
                                   "split-interleave", target, partners, k, nodes,
                                   f"pipeline {k} row groups of loop '{loop.name}' in each of the temporal groups "
                                   f"({', '.join(everywhere)})"))
        out.append(Alternative((f"split {name} {k}", f"interleave {name}"), "split-interleave", target, partners, k, nodes,
                               f"pipeline {k} row groups of loop '{loop.name}' (stage of one group next to another's)"))
    return out


def _in_every_temporal_group(wf: Workflow, path: Path) -> list[Path]:
    """The paths of the item at `path` in every temporal group of the nearest split in time around it
    (`epoch@0.step` -> `epoch@0.step`, `epoch@1.step`), or just `path`."""
    for n in range(len(path) - 1, 1, -1):
        group = wf.find(path[:n])
        if isinstance(group, LoopNode) and group.plan.split_of is not None and group.plan.iterations is not None:
            paths = [g.path + path[n:] for g in temporal_groups(wf, path[:n - 1] + (group.plan.split_of,))]
            return paths if len(paths) > 1 and all(wf.find(p) is not None for p in paths) else [path]
    return [path]


def _temporal(wf: Workflow, loop: LoopNode, target: str, groups: Sequence[int], component: str) -> list[Alternative]:
    """Per group count: the groups taking turns on the components they share (split + interleave, the
    paper's order; without the turns a shared policy serves one group's calls all before the other's),
    then the groups one after the other (a user's hand-written temporal split). A loop of at most
    max(groups) iterations also gets one group per iteration: 3 epochs in 2 groups leave one group two
    epochs long (unseen sweep: `split-time epoch 3; interleave epoch` 1.76x where 2 gave 1.42x)."""
    name = request_name(wf, loop.path)
    n = len(loop.indices())
    partners = _partners(wf, loop, component)
    out = []
    for k in sorted({k for k in groups if 1 < k <= n} | ({n} if 1 < n <= max(groups, default=0) else set())):
        if 1 < k <= n:
            out += [Alternative((f"split-time {name} {k}", f"interleave {name}"), "temporal-split", target, partners, k,
                                (), f"run the iterations of free loop '{loop.name}' as {k} independent groups taking "
                                    "turns on the components they share"),
                    Alternative((f"split-time {name} {k}",), "temporal-split", target, partners, k, (),
                                f"run the iterations of free loop '{loop.name}' as {k} independent groups")]
    return out


def alternatives(wf: Workflow, target: str, groups: Sequence[int] = DEFAULT_GROUPS) -> list[Alternative]:
    """The candidate transformations for target node `target` (a structural path), in the paper's order
    (not yet checked for legality: `check` does that)."""
    item = find_structural(wf, target)
    if item is None or not isinstance(item, ExecutionNode):
        return []
    comp = _base(wf, item.component)
    kinds = loop_kinds(wf)
    parent = _parent(wf, item.path)
    out: list[Alternative] = []
    if isinstance(parent, LoopNode) and parent.path != wf.root.path:
        # split + interleave inside the parent: temporal first (free loops, nearest first), then spatial
        for n in range(len(parent.path), 1, -1):
            loop = wf.find(parent.path[:n])
            if isinstance(loop, LoopNode) and kinds.get(loop.path) and kinds[loop.path].kind == "free":
                out += _temporal(wf, loop, target, groups, comp)
        if not parent.dynamic:  # (a loop that ends on a condition is split as copies per row group: the chain)
            out += _spatial(wf, parent, target, groups, comp)
        out += _around(wf, parent, target, groups, comp)
        out += _chain(wf, parent, target, groups)  # the loop copied per row group, pipelined with its consumers
        for n in range(len(parent.path), 1, -1):  # the copies of it (or of a loop around it) taking turns
            loop = wf.find(parent.path[:n])
            if isinstance(loop, LoopNode):
                out += group_turns(wf, loop, target, groups)
    elif isinstance(parent, LoopNode):  # a node of the iteration body
        out += _reposition(wf, item, target)
        if item.batch is not None and item.separable:
            out += _split_node(wf, item, target, groups, comp)
        out += _around(wf, item, target, groups, comp, consumers=False)
    elif isinstance(parent, ExecutionNode):  # a phase: reposition among the phases, then the parent's siblings
        out += _reposition(wf, item, target)
        grand = _parent(wf, parent.path)
        if grand is not None:
            out += _reposition(wf, parent, target)
    return _dedupe(out)


def _reposition(wf: Workflow, item: Item, target: str) -> list[Alternative]:
    """Rewire `item` before/after each sibling, nearest first (only moves that change the order)."""
    body = _body(_parent(wf, item.path))
    names = [i.name for i in body]
    at = names.index(item.name)
    out = []
    for dist in range(1, len(names)):
        for j in (at - dist, at + dist):
            if 0 <= j < len(names):
                where = "before" if j < at else "after"
                out.append(Alternative((f"rewire {request_name(wf, item.path)} {where} {names[j]}",), "rewire", target,
                                       tuple(_spath(wf, n.path) for n in _calls(body[j])), note=f"move '{item.name}' {where} '{names[j]}'"))
    return out


def _split_node(wf: Workflow, node: ExecutionNode, target: str, groups: Sequence[int], comp: str) -> list[Alternative]:
    out = []
    name = request_name(wf, node.path)
    for k in _divisors(node.batch_size, groups):
        out.append(Alternative((f"split {name} {k}",), "split-node", target, (), k, (_spath(wf, node.path),),
                               f"split '{node.name}' into {k} row groups"))
    return out + _chain(wf, node, target, groups)


def _take_turns(wf: Workflow, body: Sequence[Item], i: int, j: int, target: str) -> list[Alternative]:
    """Sibling loops body[i] < body[j] that share a component take turns, one call each (`interleave A B`),
    the items between them moved before the first (each `rewire X before A`, their order kept): two
    rollouts on two simulators that share the policy, which otherwise runs all of the first loop's calls
    before the second's (a CPU sweep of unseen workflows: 1.49x). So do loops on different
    components where one ends on a condition (`_waits`): the driver waits for its condition after each
    trip, so the other loop's calls are sent only once it ended. The rewrites' checks refuse it where the
    loops depend on each other or the moves break a dependency."""
    a, b = body[i], body[j]
    if not (isinstance(a, LoopNode) and isinstance(b, LoopNode)) \
            or a.temporal_group or b.temporal_group or a.plan.interleaved or b.plan.interleaved:
        return []
    shared = _components(wf, a) & _components(wf, b)
    if not shared and not (_waits(a) or _waits(b)):
        return []
    a_name = request_name(wf, a.path)
    moves = tuple(f"rewire {request_name(wf, x.path)} before {a.name}" for x in body[i + 1:j])
    why = f"on {', '.join(sorted(shared))}" if shared else "instead of one waiting for the other's condition"
    return [Alternative((*moves, f"interleave {a_name} {request_name(wf, b.path)}"), "take-turns", target,
                        tuple(_spath(wf, n.path) for n in _calls(b)),
                        note=f"loops '{a.name}' and '{b.name}' take turns {why}")]


def _waits(item: Item) -> bool:
    """A loop that ends on a condition, or holds one: the driver fetches the condition after each of its
    trips before it sends anything after the loop."""
    return isinstance(item, LoopNode) and (item.until is not None or any(_waits(x) for x in item.body))


def _components(wf: Workflow, item: Item) -> set[str]:
    return {_base(wf, n.component) for n in _calls(item)}


def _rows_of(wf: Workflow, item: Item) -> int | None:
    """The batch size of an item a chain can split into row groups: a node separable along dim 0, or a
    static loop every call of which is (copied whole per group); None for anything else."""
    try:  # the split's own checks decide (one definition of "separable")
        if isinstance(item, ExecutionNode):
            check_separable(item)
            return item.batch_size
        if isinstance(item, LoopNode) and item.path != wf.root.path:
            return check_splittable_loop(wf, item.path)
    except Refused:
        return None
    return None


def _chain(wf: Workflow, first: Item, target: str, groups: Sequence[int]) -> list[Alternative]:
    """`first` and the consecutive siblings after it that share its row groups, pipelined in k groups: group
    g of each item starts when group g of the one before is done (a loop in it is copied whole per group).
    The chain ends before an item whose components are all among the previous item's, or hold all of them
    (`reset -> step` on the simulator and policy): group g of it could not run beside group g + 1 of the
    one before, so the split would only pay each call's fixed cost k times."""
    size = _rows_of(wf, first)
    if size is None:
        return []
    body = _body(_parent(wf, first.path))
    at = [i.name for i in body].index(first.name)
    chain = [first]
    for nxt in body[at + 1:]:
        before, now = _components(wf, chain[-1]), _components(wf, nxt)
        if _rows_of(wf, nxt) != size or before <= now or now <= before:
            break
        chain.append(nxt)
    if len(chain) < 2:
        return []
    parts = [request_name(wf, i.path) for i in chain]
    names = [i.name for i in chain]
    split = tuple(dict.fromkeys(_spath(wf, n.path) for i in chain for n in _calls(i)))
    later = tuple(dict.fromkeys(_spath(wf, n.path) for i in chain[1:] for n in _calls(i)))
    return [Alternative((f"split-chain {' '.join(parts)} {k}",), "split-chain", target, later, k, split,
                        f"pipeline the chain {' -> '.join(names)} in {k} row groups")
            for k in _divisors(size, groups)]


def group_turns(wf: Workflow, loop: LoopNode, target: str, groups: Sequence[int]) -> list[Alternative]:
    """Beyond the paper (issue 62): a loop whose trips alternate between components -- a multi-turn agent's
    decode on the policy, then its tool calls on a worker pool -- copied whole per row group with its consumer
    (`split-chain turn finish k`), the consumer's groups moved after the last copy (`rewire finish@g after
    turn@(k-1)`, last group first so they keep their order), and the copies taking turns (`interleave turn@0
    ... turn@(k-1)`): group g's tool calls run while group g + 1 decodes, trip after trip. A chain alone runs
    the copies one after the other (the consumer of group g beside the loop of group g + 1); taking turns is
    what overlaps the loop's own phases, which on the agent workload are most of the iteration.

    Proposed only where it can help and the body split cannot: the loop ends on a condition or holds one
    (a static loop's body is split and interleaved by `_spatial`, the same overlap), its calls run on at
    least two components (on one, the copies' trips would only queue on it), and the next sibling is a
    consumer of its rows (a loop that ends on a condition is split per row group only in a chain). The
    rewrites' checks refuse it where a row's trips depend on another row's, or the moves break a dependency."""
    if loop.path == wf.root.path or not _waits(loop) or loop.plan.interleaved or loop.temporal_group \
            or any(own_group(item) is not None for n in range(2, len(loop.path) + 1)
                   if (item := wf.find(loop.path[:n])) is not None) \
            or len(_components(wf, loop)) < 2:
        return []
    size = _rows_of(wf, loop)
    body = _body(_parent(wf, loop.path))
    at = [i.name for i in body].index(loop.name)
    consumer = body[at + 1] if at + 1 < len(body) else None
    if size is None or consumer is None or isinstance(consumer, MergeNode) or _rows_of(wf, consumer) != size:
        return []
    prefix = ".".join(loop.path[1:-1]) + ("." if len(loop.path) > 2 else "")
    name, cname = request_name(wf, loop.path), request_name(wf, consumer.path)
    split = tuple(dict.fromkeys(_spath(wf, n.path) for i in (loop, consumer) for n in _calls(i)))
    out = []
    for k in _divisors(size, groups):
        moves = tuple(f"rewire {cname}@{g} after {loop.name}@{k - 1}" for g in range(k - 2, -1, -1))
        turns = "interleave " + " ".join(f"{prefix}{loop.name}@{g}" for g in range(k))
        out.append(Alternative((f"split-chain {name} {cname} {k}", *moves, turns), TURNS, target,
                               _partners(wf, loop, ""), k, split,
                               f"{k} row-group copies of loop '{loop.name}' taking turns, '{consumer.name}' after them"))
    return out


def _around(wf: Workflow, anchor: Item, target: str, groups: Sequence[int], comp: str, consumers: bool = True) -> list[Alternative]:
    """In the anchor's parent body: other movable loops, splittable downstream consumers, and nodes that
    could be rewired next to the anchor."""
    body = _body(_parent(wf, anchor.path))
    names = [i.name for i in body]
    at = names.index(anchor.name)
    a_name = request_name(wf, anchor.path)
    loops, splits, rewires = [], [], []
    for j, other in enumerate(body):
        if j == at or isinstance(other, MergeNode):
            continue
        o_name = request_name(wf, other.path)
        partners = tuple(_spath(wf, n.path) for n in _calls(other))
        if isinstance(other, LoopNode):
            if isinstance(anchor, LoopNode):
                loops += _take_turns(wf, body, min(at, j), max(at, j), target)
                first, second = (a_name, o_name) if j > at else (o_name, a_name)
                loops.append(Alternative((f"fuse {first} {second}",), "fuse", target, partners,
                                         note=f"run iteration j of '{(other if j > at else anchor).name}' right after iteration j of "
                                              f"'{(anchor if j > at else other).name}'"))
            where = "before" if j > at else "after"
            loops.append(Alternative((f"rewire {o_name} {where} {anchor.name}",), "rewire", target, partners,
                                     note=f"move loop '{other.name}' {where} '{anchor.name}'"))
        elif isinstance(other, ExecutionNode):
            if consumers and j > at and other.batch is not None and other.separable:
                for k in _divisors(other.batch_size, groups):
                    splits.append(Alternative((f"split {o_name} {k}",), "split-consumer", target, partners, k,
                                              (_spath(wf, other.path),), f"split consumer '{other.name}' into {k} row groups"))
            where = "before" if j > at else "after"
            rewires.append(Alternative((f"rewire {o_name} {where} {anchor.name}",), "rewire", target, partners,
                                       note=f"move '{other.name}' {where} '{anchor.name}'"))
    return loops + splits + rewires


def _in_group(path: Path, groups: set[Path]) -> bool:
    """Whether the item at `path` is a split group or inside one (`groups`: the groups' paths)."""
    return any(path[:n] in groups for n in range(1, len(path) + 1))


def sweep(wf: Workflow, groups: Sequence[int] = DEFAULT_GROUPS) -> list[Alternative]:
    """Beyond the paper: every configuration of the hand-written sweep that applies to `wf` -- group
    pipelining of every separable loop with each group count, temporal splits of free loops, fusion of
    consecutive sibling loops (training overlapped with the next rollout epoch), chains of separable
    nodes (when the rewrites support it)."""
    kinds = loop_kinds(wf)
    out: list[Alternative] = []
    grouped = {i.path for i in wf.items() if own_group(i) is not None}
    for item in wf.items():
        if not isinstance(item, LoopNode) or item.path == wf.root.path or item.dynamic or _in_group(item.path, grouped):
            continue
        if not _runs(wf, item.path):  # inside phases that are not run: a rewrite there changes nothing that runs
            continue
        calls = _calls(item)
        if calls and all(n.batch == 0 and n.separable for n in calls):
            out += _spatial(wf, item, SWEEP, groups, "")
        if kinds[item.path].kind == "free":
            out += _temporal(wf, item, SWEEP, groups, "")
    for item in wf.items():
        body = _body(item)
        for first in range(len(body)):
            for second in range(first + 1, len(body)):
                out += _take_turns(wf, body, first, second, SWEEP)
        for a, b in zip(body, body[1:], strict=False):
            if isinstance(a, LoopNode) and isinstance(b, LoopNode) and a.indices() == b.indices():
                out.append(Alternative((f"fuse {request_name(wf, a.path)} {request_name(wf, b.path)}",), "fuse", SWEEP,
                                       tuple(_spath(wf, n.path) for n in _calls(b)),
                                       note=f"run iteration j of '{b.name}' right after iteration j of '{a.name}'"))
            if not isinstance(a, MergeNode):
                out += _chain(wf, a, SWEEP, groups)
            if isinstance(a, LoopNode):
                out += group_turns(wf, a, SWEEP, groups)
    out += asynchronous(wf)
    return _dedupe(out)


def asynchronous(wf: Workflow) -> list[Alternative]:
    """Beyond the paper (issue 46): the asynchronous plans the workflow's staleness budgets allow -- each
    writer of a state object with `max_staleness` B > 0 deferred by 1..B RL iterations (`defer`), so that
    the next rollout overlaps this update. None when no state object declares a budget: then every plan
    computes what the declared workflow computes, and synchronous plans stay candidates either way. K stays
    below the RL iteration count, as `defer`'s default does: a call deferred longer only runs after the run,
    and a budget meant as "any staleness" (`max_staleness: 1000000`) would make a million candidates."""
    out = []
    writers = budgeted_writers(wf)
    for path, budget in writers:
        for k in range(1, min(budget, (wf.root.count or budget + 1) - 1) + 1):
            out.append(Alternative((f"defer {request_name(wf, path)} {k}",), "defer", SWEEP,
                                   note=f"reads of the state '{path[-1]}' writes may be {k} RL iteration(s) old"))
    # and each reader of such a state run one RL iteration ahead (partial rollouts: the next iteration's
    # prompts queued while this one decodes), alone and, where the budget leaves room, with a deferral
    for path in budgeted_readers(wf):
        ahead = f"ahead {request_name(wf, path)}"
        out.append(Alternative((ahead,), "ahead", SWEEP, note=f"'{path[-1]}' of the next RL iteration runs in this one"))
        out += [Alternative((ahead, f"defer {request_name(wf, w)} 1"), "ahead", SWEEP,
                            note=f"'{path[-1]}' run ahead and '{w[-1]}' deferred") for w, budget in writers if budget >= 2]
    return out


def _dedupe(alts: Iterable[Alternative]) -> list[Alternative]:
    seen: set[tuple[str, ...]] = set()
    out = []
    for a in alts:
        if a.requests not in seen:
            seen.add(a.requests)
            out.append(a)
    return out


MemoryCheck = Callable[[Workflow], str | None]


def check(wf: Workflow, alt: Alternative, memory: MemoryCheck | None = None) -> Feasible | Infeasible:
    """Apply the alternative's requests to `wf`; infeasible when a rewrite is refused (the legality
    oracle names the dependency), when it changes nothing, or when the memory estimate does not fit."""
    current = wf
    done = []
    for request in alt.requests:
        result = apply(current, request)  # the pass runner: built and checked, never raises
        if isinstance(result, Refused):  # a bug in a rewrite is refused too (`internal`): said, and the search goes on
            return Infeasible(alt, f"{request}: {'internal error in the rewrite: ' if result.internal else ''}{result.reason}")
        current = result.workflow
        done.append(result.description)
    if current == wf:
        return Infeasible(alt, "changes nothing")
    if memory is not None:
        problem = memory(current)
        if problem:
            return Infeasible(alt, problem)
    return Feasible(alt, current, tuple(done))


def memory_estimate(component_bytes: Mapping[str, int], limits: Mapping[str, int],
                    original: Iterable[str] = ()) -> MemoryCheck:
    """A memory check from the measured state size of each component: the processes a plan adds (the
    copies a temporal split makes, each the size of its original) must fit the memory available on
    their device kind (`cpu`, `gpu`). `component_bytes` may fetch sizes lazily: only copied components
    are asked for."""
    have = set(original)

    def fits(plan: Workflow) -> str | None:
        added: dict[str, int] = {}
        for name, comp in plan.components.items():
            if name in have or not have and comp.copy_of is None:
                continue
            size = component_bytes.get(comp.copy_of or name, 0)
            added[comp.device] = added.get(comp.device, 0) + size
        for device, total in added.items():
            limit = limits.get(device)
            if limit is not None and total > limit:
                return (f"memory estimate: the {device} processes this plan adds need {total / 2**30:.2f} GiB, more than "
                        f"the {limit / 2**30:.2f} GiB available")
        return None

    return fits


def temporal_copies(wf: Workflow, k: int = 2) -> dict[str, Component]:
    """The component copies a temporal split into `k` groups of each free loop would add (so that a
    runtime can start them with the others: a GPU process cannot join the GPUs' placement later)."""
    kinds = loop_kinds(wf)
    out: dict[str, Component] = {}
    for item in wf.items():
        if not isinstance(item, LoopNode) or item.path == wf.root.path or kinds[item.path].kind != "free":
            continue
        result = check(wf, Alternative((f"split-time {request_name(wf, item.path)} {k}",), "temporal-split", SWEEP))
        if isinstance(result, Feasible):
            out.update({n: c for n, c in result.workflow.components.items() if n not in wf.components})
    return out
