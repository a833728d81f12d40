"""hypothesis strategies: random *valid* workflows (as YAML documents), for round-trip, fuzzing and
the rewrite property suites. Every reference points at something visible and earlier, so the result
must validate; what varies is nesting, carries, collects, iteration selections and state patterns."""

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

    def fresh(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"


@dataclass
class _Scope:
    values: list[str] = field(default_factory=list)  # expressions usable as values here
    ints: list[str] = field(default_factory=list)  # loop indices
    loops: list[tuple[str, list[str]]] = field(default_factory=list)  # earlier loops: (name, inner value refs)


def _node(g: _Gen, scope: _Scope) -> tuple[dict[str, Any], list[str]]:
    d = g.draw
    name = g.fresh("n")
    comp = d(st.sampled_from(sorted(g.components)))
    method = name  # one method per node: the mock's behaviour is the node's declaration
    outs = [f"o{i}" for i in range(d(st.integers(0, 2)))]
    node: dict[str, Any] = {"node": name, "call": f"{comp}.{method}"}
    ins: dict[str, str] = {}
    for i in range(d(st.integers(0, 2))):
        choices = scope.values + scope.ints
        for loop_name, inner in scope.loops:
            if inner:
                ins_ref = d(st.sampled_from(inner))
                choices += [f"{loop_name}[-1].{ins_ref}", f"{loop_name}[0].{ins_ref}", f"stack({loop_name}[*].{ins_ref})"]
        if choices:
            ins[f"x{i}"] = d(st.sampled_from(choices))
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
    g.behaviors.setdefault(comp, {})[method] = {"state": dict(node.get("state", {})), "out": outs, "separable": separable}
    g.nodes += 1
    return node, [f"{name}.{o}" for o in outs]


def _body(g: _Gen, scope: _Scope, depth: int) -> tuple[list[dict[str, Any]], list[str]]:
    d = g.draw
    items: list[dict[str, Any]] = []
    local = _Scope(list(scope.values), list(scope.ints), list(scope.loops))
    produced: list[str] = []
    for _ in range(d(st.integers(1, 4 if depth == 1 else 3))):
        if g.nodes >= g.max_nodes:
            break
        if depth < g.max_depth and d(st.integers(0, 2)) == 0:
            item, outs, inner = _loop(g, local, depth)
            local.loops.append((item["loop"], inner))
        else:
            item, outs = _node(g, local)
        items.append(item)
        local.values += outs
        produced += outs
    if not items:
        item, outs = _node(g, local)
        items.append(item)
        produced += outs
    return items, produced


def _loop(g: _Gen, scope: _Scope, depth: int) -> tuple[dict[str, Any], list[str], list[str]]:
    d = g.draw
    name = g.fresh("l")
    inner_scope = _Scope(list(scope.values), scope.ints + [f"{name}.i"], list(scope.loops))
    carry_init = d(st.sampled_from(scope.values)) if scope.values and d(st.booleans()) else None
    if carry_init is not None:
        inner_scope.values.append(f"{name}.v")
    outer_flag = g.all_separable
    g.all_separable = outer_flag or d(st.booleans())
    body, produced = _body(g, inner_scope, depth + 1)
    g.all_separable = outer_flag
    loop: dict[str, Any] = {"loop": name, "count": d(st.sampled_from([1, 2, 2, 3]))}
    outs: list[str] = []
    if carry_init is not None and produced:
        loop["carry"] = {"v": {"init": carry_init, "next": d(st.sampled_from(produced))}}
        outs.append(f"{name}.v")
    elif carry_init is not None:
        # no value to carry: drop the carry and every use of it
        body = _strip(body, f"{name}.v", carry_init)
    loop["body"] = body
    if produced and d(st.booleans()):
        loop["collect"] = {"c": f"stack({name}[*].{d(st.sampled_from(produced))})"}
        outs.append(f"{name}.c")
    return loop, outs, produced


def _strip(body: Any, ref: str, replacement: str) -> Any:
    if isinstance(body, dict):
        return {k: _strip(v, ref, replacement) for k, v in body.items()}
    if isinstance(body, list):
        return [_strip(v, ref, replacement) for v in body]
    if isinstance(body, str):
        return body.replace(ref, replacement)
    return body


@st.composite
def workflows(draw, max_nodes: int = 14, max_depth: int = 3) -> dict[str, Any]:
    """A random valid workflow document (a dict ready for yaml.safe_dump)."""
    ncomp = draw(st.integers(1, 3))
    components = {f"c{i}": [f"s{j}" for j in range(draw(st.integers(0, 2)))] for i in range(ncomp)}
    g = _Gen(draw, components, max_depth=max_depth, max_nodes=max_nodes)
    body, _ = _body(g, _Scope(ints=["iteration.i"]), 1)
    return {
        "rose": 1,
        "name": "random",
        "params": {"seed": 0},
        "components": {c: {"impl": f"tests.mocks:Mock{c.upper()}", "state": s,
                           "args": {"name": c, "batch": g.batch, "behaviors": g.behaviors.get(c, {}), "states": s}}
                       for c, s in components.items()},
        "iteration": {"count": draw(st.integers(1, 3)), "body": body},
    }
