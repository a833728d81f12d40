"""hypothesis strategies: random *valid* workflows (as YAML documents), for round-trip, fuzzing and
the rewrite property suites. Every reference points at something visible and earlier, so the result
must validate; what varies is nesting, carries, collects, iteration selections and state patterns.

The generator is meant to reach every construct a rewrite must handle (each one was the cause of a
bug the suite missed before it was added here): loops that end on a condition (`until:` over a per-row
done flag, so that row groups would stop at other iterations than the whole batch), loops nested inside
loops whose every node is separable (the candidates of a loop-body split), collects that read the
loop's own carried value, records, selections by another loop's index (`l2[l3.i].x`) and selections
that reach into a nested loop (`l1[-1].l2[0].x`), nodes that declare their outputs' rows without being
separable (`separable: false`: their consumers may be split, they may not), and an agent's turns: a loop
that ends per row around one that ends per row, with a tool call on another component (`turn_workflows`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st

MODES = ("read", "update", "refresh")


@dataclass
class _Gen:
    draw: Any
    components: dict[str, list[str]]
    counter: int = 0
    max_depth: int = 3
    nodes: int = 0
    max_nodes: int = 14
    batch: int = 6
    behaviors: dict[str, dict[str, Any]] = field(default_factory=dict)
    all_separable: bool = False  # inside a loop whose every node is batch-separable
    # values whose length differs from one iteration of an enclosing loop to the next: the collect of a loop
    # that ends on a condition. Stacking them over iterations is ragged, so no `stack(l[*]...)` reads them
    # (CI, 2026-12-05: `stack(l2[*].l5.c)` with l5 an until loop -- the declared workflow itself failed)
    ragged: set[str] = field(default_factory=set)
    afters: bool = False  # give some items `after:` an earlier sibling (an ordering without a data dependency)

    def is_ragged(self, ref: str) -> bool:
        return any(ref == r or ref.endswith("." + r) for r in self.ragged)

    def fresh(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"


@dataclass
class _Loop:
    """An earlier loop visible from here: what its iterations may be selected by."""

    name: str
    count: int
    dynamic: bool
    inner: list[str]  # references valid at the end of its body


@dataclass
class _Scope:
    values: list[str] = field(default_factory=list)  # expressions usable as values here
    ints: list[str] = field(default_factory=list)  # loop indices
    loops: list[_Loop] = field(default_factory=list)  # earlier loops
    enclosing: list[tuple[str, int]] = field(default_factory=list)  # static enclosing loops: (name, count)

    def copy(self) -> _Scope:
        return _Scope(list(self.values), list(self.ints), list(self.loops), list(self.enclosing))


def _selections(g: _Gen, loop: _Loop, scope: _Scope, ref: str) -> list[str]:
    """Ways to read `ref` (valid at the end of `loop`'s body) from after the loop."""
    out = [f"{loop.name}[-1].{ref}"] + ([] if g.is_ragged(ref) else [f"stack({loop.name}[*].{ref})"])
    if not loop.dynamic:
        out.append(f"{loop.name}[0].{ref}")
        out += [f"{loop.name}[{m}.i].{ref}" for m, c in scope.enclosing if c <= loop.count]
    return out


def _value(g: _Gen, scope: _Scope) -> str | None:
    d = g.draw
    choices = scope.values + scope.ints
    for loop in scope.loops:
        if loop.inner:
            choices += _selections(g, loop, scope, d(st.sampled_from(loop.inner)))
    if not choices:
        return None
    first = d(st.sampled_from(choices))
    if scope.values and d(st.integers(0, 5)) == 0:  # a record
        return f"{{a: {first}, b: {d(st.sampled_from(scope.values))}}}"
    return first


def _node(g: _Gen, scope: _Scope, flag: bool = False) -> tuple[dict[str, Any], list[str]]:
    d = g.draw
    name = g.fresh("n")
    comp = d(st.sampled_from(sorted(g.components)))
    method = name  # one method per node: the mock's behaviour is the node's declaration
    outs = [f"o{i}" for i in range(d(st.integers(1 if flag else 0, 2)))]
    node: dict[str, Any] = {"node": name, "call": f"{comp}.{method}"}
    ins: dict[str, str] = {}
    for i in range(d(st.integers(0, 2))):
        v = _value(g, scope)
        if v is not None:
            ins[f"x{i}"] = v
    if ins:
        node["in"] = ins
    if outs:
        node["out"] = outs
    states = g.components[comp]
    if states:
        chosen = d(st.lists(st.sampled_from(states), unique=True, max_size=len(states)))
        if chosen:
            node["state"] = {s: d(st.sampled_from(MODES)) for s in chosen}
    separable = g.all_separable or d(st.integers(0, 3)) > 0
    if separable:
        node["batch"] = {"dim": 0, "size": g.batch}
    elif d(st.booleans()):  # its outputs' rows declared, the call not separable (a consumer may still be split)
        node["batch"] = {"dim": 0, "size": g.batch, "separable": False}
    behavior = {"state": dict(node.get("state", {})), "out": outs, "separable": separable}
    if flag:
        behavior["flags"] = [outs[0]]  # a 0/1 per-row 'done' flag, for an `until:`
    g.behaviors.setdefault(comp, {})[method] = behavior
    g.nodes += 1
    return node, [f"{name}.{o}" for o in outs]


def _body(g: _Gen, scope: _Scope, depth: int) -> tuple[list[dict[str, Any]], list[str], list[str]]:
    """Items of a body, the values they produce, and every reference valid at the end of the body."""
    d = g.draw
    items: list[dict[str, Any]] = []
    local = scope.copy()
    produced: list[str] = []
    ends: list[str] = []
    for _ in range(d(st.integers(1, 4 if depth == 1 else 3))):
        if g.nodes >= g.max_nodes:
            break
        if depth < g.max_depth and d(st.integers(0, 2)) == 0:
            earlier = [lp.count for lp in local.loops[len(scope.loops):] if not lp.dynamic]  # this body's loops
            item, outs, loop = _loop(g, local, depth, earlier[-1] if earlier else None)
            local.loops.append(loop)
            if loop.inner:  # reaching into a nested loop's iterations
                ref = d(st.sampled_from(loop.inner))
                ends += [f"{loop.name}[-1].{ref}"] + ([] if loop.dynamic else [f"{loop.name}[0].{ref}"])
        else:
            item, outs = _node(g, local)
        items.append(item)
        local.values += outs
        produced += outs
    if not items:
        item, outs = _node(g, local)
        items.append(item)
        produced += outs
    if g.afters:  # (after the items are drawn: the draws of workflows without `after:` stay as they were)
        for i in range(1, len(items)):
            if d(st.booleans()):
                loops = [x for x in items[:i] if "loop" in x]  # what split-time and fuse replace, mostly
                target = d(st.sampled_from(loops or items[:i]))
                items[i]["after"] = [target.get("node") or target["loop"]]
    return items, produced, produced + ends


def _loop(g: _Gen, scope: _Scope, depth: int, sibling_count: int | None = None) -> tuple[dict[str, Any], list[str], _Loop]:
    d = g.draw
    name = g.fresh("l")
    dynamic = d(st.integers(0, 4)) == 0
    count = d(st.sampled_from([2, 3, 4] if dynamic else [1, 2, 2, 2, 3]))  # a dynamic loop's most iterations
    if sibling_count is not None and not dynamic and d(st.booleans()):
        count = sibling_count  # matched sibling loops (epoch / update): what fusion and interleaving need
    inner_scope = scope.copy()
    inner_scope.ints.append(f"{name}.i")
    if not dynamic:
        inner_scope.enclosing.append((name, count))
    carry_init = d(st.sampled_from(scope.values)) if scope.values and d(st.booleans()) else None
    if carry_init is not None:
        inner_scope.values.append(f"{name}.v")
    outer_flag = g.all_separable
    g.all_separable = outer_flag or d(st.booleans())
    body, produced, ends = _body(g, inner_scope, depth + 1)
    loop: dict[str, Any] = {"loop": name, "count": count}
    if dynamic:  # ends when every row's flag is set (or after `count` iterations)
        flag_node, flag_outs = _node(g, _Scope(inner_scope.values + produced, list(inner_scope.ints)), flag=True)
        flag_node["in"] = {**flag_node.get("in", {}), "t": f"{name}.i"}  # rows finish at different iterations
        body.append(flag_node)
        loop["until"] = flag_outs[0]
    g.all_separable = outer_flag
    outs: list[str] = []
    if carry_init is not None and produced:
        loop["carry"] = {"v": {"init": carry_init, "next": d(st.sampled_from(produced))}}
        outs.append(f"{name}.v")
        if g.is_ragged(loop["carry"]["v"]["next"]) or g.is_ragged(carry_init):
            g.ragged.add(f"{name}.v")
    elif carry_init is not None:
        # no value to carry: drop the carry and every use of it
        body = _strip(body, f"{name}.v", carry_init)
    loop["body"] = body
    stackable = [r for r in produced if not g.is_ragged(r)]
    if stackable and d(st.booleans()):
        # the loop's own carried value, when it keeps one shape: its first and its next value are both a node's
        # output (a next that is an inner loop's collect is stacked, one dimension more: the long profile of
        # 2026-12-03 drew `next: l5.c` and the declared workflow itself failed to stack l2's values)
        keeps_shape = "carry" in loop and carry_init.startswith("n") and loop["carry"]["v"]["next"].startswith("n")
        own = [f"{name}.v"] if keeps_shape else []
        picked = d(st.sampled_from(stackable + own))
        loop["collect"] = {"c": f"stack({name}[*].{picked})"}
        outs.append(f"{name}.c")
        if dynamic:
            g.ragged.add(f"{name}.c")
    return loop, outs, _Loop(name, count, dynamic, ends)


def _strip(body: Any, ref: str, replacement: str) -> Any:
    if isinstance(body, dict):
        return {k: _strip(v, ref, replacement) for k, v in body.items()}
    if isinstance(body, list):
        return [_strip(v, ref, replacement) for v in body]
    if isinstance(body, str):
        return body.replace(ref, replacement)
    return body


@st.composite
def workflows(draw, max_nodes: int = 14, max_depth: int = 3, afters: bool = False) -> dict[str, Any]:
    """A random valid workflow document (a dict ready for yaml.safe_dump); `afters`: with `after:` orderings."""
    ncomp = draw(st.integers(1, 3))
    components = {f"c{i}": [f"s{j}" for j in range(draw(st.integers(0, 2)))] for i in range(ncomp)}
    g = _Gen(draw, components, max_depth=max_depth, max_nodes=max_nodes, afters=afters)
    body, _, _ = _body(g, _Scope(ints=["iteration.i"]), 1)
    return {
        "rose": 1,
        "name": "random",
        "params": {"seed": 0},
        "components": {c: {"impl": f"tests.mocks:Mock{c.upper()}", "state": s,
                           "args": {"name": c, "batch": g.batch, "behaviors": g.behaviors.get(c, {}), "states": s}}
                       for c, s in components.items()},
        "iteration": {"count": draw(st.integers(1, 3)), "body": body},
    }


@st.composite
def until_workflows(draw: Any) -> dict[str, Any]:
    """A loop that ends per row, with random per-row lengths, then a per-row consumer and a learner: what
    `split-chain l score K` splits into groups that each end on their own (the long-tail overlap). The rows
    finish after `lengths[r]` trips (drawn per row; `count + 1`: never, the bound ends it), the body is a chain
    of 1-3 separable calls that may read a state object, and the loop carries a value to its consumer."""
    d = draw
    batch = d(st.integers(2, 7))
    count = d(st.integers(1, 6))
    lengths = d(st.lists(st.integers(1, count + 1), min_size=batch, max_size=batch))
    size = {"dim": 0, "size": batch}
    reads = d(st.booleans())
    behaviors: dict[str, dict[str, Any]] = {"c0": {}, "c1": {}}
    body: list[dict[str, Any]] = []
    previous = "l.v"
    for n in range(d(st.integers(0, 2))):
        name = f"b{n}"
        body.append({"node": name, "call": f"c1.{name}", "in": {"x": previous}, "out": ["o0"], "batch": dict(size),
                     **({"state": {"s1": "read"}} if reads else {})})
        behaviors["c1"][name] = {"state": {"s1": "read"} if reads else {}, "out": ["o0"], "separable": True}
        previous = f"{name}.o0"
    body.append({"node": "f", "call": "c1.f", "in": {"x": previous, "t": "l.i"}, "out": ["o0", "o1"], "batch": dict(size)})
    behaviors["c1"]["f"] = {"state": {}, "out": ["o0", "o1"], "separable": True, "lengths": {"o0": lengths}}
    behaviors["c0"] = {"p": {"state": {}, "out": ["o0"], "separable": False},
                       "score": {"state": {}, "out": ["o0"], "separable": True},
                       "learn": {"state": {"s0": "update"}, "out": [], "separable": False}}
    loop: dict[str, Any] = {"loop": "l", "count": count, "until": "f.o0", "carry": {"v": {"init": "p.o0", "next": "f.o1"}},
                            "body": body}
    if d(st.booleans()):
        loop["collect"] = {"c": "stack(l[*].f.o1)"}
    return {"rose": 1, "name": "until", "params": {"seed": 0},
            "components": {c: {"impl": "tests.mocks:Mock", "state": [s],
                               "args": {"name": c, "batch": batch, "behaviors": behaviors[c], "states": [s]}}
                           for c, s in (("c0", "s0"), ("c1", "s1"))},
            "iteration": {"count": 1, "body": [
                {"node": "p", "call": "c0.p", "in": {"it": "iteration.i"}, "out": ["o0"], "batch": {**size, "separable": False}},
                loop,
                {"node": "score", "call": "c0.score", "in": {"x": "l.v"}, "out": ["o0"], "batch": dict(size)},
                {"node": "learn", "call": "c0.learn", "in": {"x": "score.o0"}, "state": {"s0": "update"}}]}}


@st.composite
def turn_workflows(draw: Any) -> dict[str, Any]:
    """An agent's turns: a loop that ends per row (`l`, a row ends when its tool call says so, after a random
    number of turns per row) around a loop that ends per row (`d`, a row's turn ends at its own length,
    drawn per row and shorter in later turns), then a tool call on the rows still in a turn (another
    component, so that one group's tool calls may run while another group decodes), a per-row consumer and
    a learner: what `split-chain l score K` splits into groups whose turns may be interleaved."""
    d = draw
    batch = d(st.integers(2, 6))
    turns, steps = d(st.integers(1, 4)), d(st.integers(1, 4))
    turn_lengths = d(st.lists(st.integers(1, turns + 1), min_size=batch, max_size=batch))
    decode_lengths = d(st.lists(st.integers(1, steps + 2), min_size=batch, max_size=batch))
    size = {"dim": 0, "size": batch}
    reads = d(st.booleans())
    behaviors: dict[str, dict[str, Any]] = {"c0": {}, "c1": {}, "c2": {}}
    inner: list[dict[str, Any]] = []
    previous = "d.v"
    if d(st.booleans()):
        inner.append({"node": "b0", "call": "c1.b0", "in": {"x": previous}, "out": ["o0"], "batch": dict(size),
                      **({"state": {"s1": "read"}} if reads else {})})
        behaviors["c1"]["b0"] = {"state": {"s1": "read"} if reads else {}, "out": ["o0"], "separable": True}
        previous = "b0.o0"
    inner.append({"node": "f", "call": "c1.f", "in": {"x": previous, "t": "d.i + l.i"}, "out": ["o0", "o1"],
                  "batch": dict(size)})
    behaviors["c1"]["f"] = {"state": {}, "out": ["o0", "o1"], "separable": True, "lengths": {"o0": decode_lengths}}
    decode: dict[str, Any] = {"loop": "d", "count": steps, "until": "f.o0",
                              "carry": {"v": {"init": "l.v", "next": "f.o1"}}, "body": inner}
    tool_in = d(st.sampled_from(["d.v", "d[-1].f.o1"]))
    outer: list[dict[str, Any]] = [decode, {"node": "tool", "call": "c2.tool", "in": {"x": tool_in, "t": "l.i"},
                                            "out": ["o0", "o1"], "batch": dict(size)}]
    behaviors["c2"]["tool"] = {"state": {}, "out": ["o0", "o1"], "separable": True, "lengths": {"o0": turn_lengths}}
    loop: dict[str, Any] = {"loop": "l", "count": turns, "until": "tool.o0",
                            "carry": {"v": {"init": "p.o0", "next": "tool.o1"}}, "body": outer}
    if d(st.booleans()):
        loop["collect"] = {"c": "stack(l[*].tool.o1)"}
    behaviors["c0"] = {"p": {"state": {}, "out": ["o0"], "separable": False},
                       "score": {"state": {}, "out": ["o0"], "separable": True},
                       "learn": {"state": {"s0": "update"}, "out": [], "separable": False}}
    return {"rose": 1, "name": "turns", "params": {"seed": 0},
            "components": {c: {"impl": "tests.mocks:Mock", "state": [s],
                               "args": {"name": c, "batch": batch, "behaviors": behaviors[c], "states": [s]}}
                           for c, s in (("c0", "s0"), ("c1", "s1"), ("c2", "s2"))},
            "iteration": {"count": 1, "body": [
                {"node": "p", "call": "c0.p", "in": {"it": "iteration.i"}, "out": ["o0"], "batch": {**size, "separable": False}},
                loop,
                {"node": "score", "call": "c0.score", "in": {"x": "l.v"}, "out": ["o0"], "batch": dict(size)},
                {"node": "learn", "call": "c0.learn", "in": {"x": "score.o0"}, "state": {"s0": "update"}}]}}
