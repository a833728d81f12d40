"""The meaning of a workflow: one sequential pass over an RL iteration.

`IterationRunner` walks the IR in program order, evaluates every expression against the outputs of
earlier invocations and calls a `Backend` for each ExecutionNode invocation. The *same* walk serves
three interpretations, as JAX's interpreters share one jaxpr walk:
  * concrete values (the reference interpreter, `interpreter.reference`),
  * dependency tracking (`analysis.invocation_graph`: values are sets of producing invocations),
  * schedule building for the runtime.
So the dependency analysis cannot disagree with the semantics it claims to preserve.

An *invocation* is identified by the node's path and the iteration number of every loop around it
(the RL iteration included): `Invocation(("iteration", "epoch", "step", "act"), (k, 1, 7))`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from .expr import BinOp, Call, Expr, Int, IterRef, Neg, Param, Record, Ref, Slice
from .ir import ExecutionNode, Item, LoopNode, MergeNode, Workflow
from .resolve import Binding, CarryIn, IterSelect, LoopIndex, NodePort, ParentInput, Resolver

__all__ = ["Invocation", "Backend", "ValueOps", "IterationRunner", "SemanticError", "enclosing_loops"]

Path = tuple[str, ...]


@dataclass(frozen=True, order=True)
class Invocation:
    path: Path
    indices: tuple[int, ...]  # iteration number of each enclosing loop, outermost (the RL iteration) first

    def __str__(self) -> str:
        return ".".join(self.path) + "".join(f"[{i}]" for i in self.indices)


class SemanticError(Exception):
    """A fault found while running the semantics (wrong output names, a dynamic loop without bound)."""


class ValueOps(Protocol):
    """How values combine; concrete tensors in the reference interpreter, dependency sets in analysis."""

    def stack(self, values: Sequence[Any]) -> Any: ...
    def cat(self, values: Sequence[Any], dim: int = 0) -> Any: ...
    def record(self, fields: Mapping[str, Any]) -> Any: ...
    def slice(self, value: Any, start: int | None, stop: int | None) -> Any: ...
    def truth(self, value: Any) -> bool: ...


class Backend(Protocol):
    ops: ValueOps

    def call(self, node: ExecutionNode, inv: Invocation, inputs: dict[str, Any]) -> dict[str, Any]: ...


def enclosing_loops(path: Path, items: Mapping[Path, Item]) -> tuple[Path, ...]:
    """The loops around the item at `path`, outermost first (phased nodes are not loops)."""
    return tuple(path[:n] for n in range(1, len(path)) if isinstance(items.get(path[:n]), LoopNode))


@dataclass
class _Env:
    outputs: dict[tuple[Path, tuple[int, ...]], dict[str, Any]] = field(default_factory=dict)
    inputs: dict[tuple[Path, tuple[int, ...]], dict[str, Any]] = field(default_factory=dict)
    carries: dict[tuple[Path, tuple[int, ...]], dict[str, Any]] = field(default_factory=dict)
    ran: dict[tuple[Path, tuple[int, ...]], list[int]] = field(default_factory=dict)  # loop -> iterations run


class IterationRunner:
    """Runs RL iterations of a workflow in program order against a Backend."""

    def __init__(self, wf: Workflow, backend: Backend, max_dynamic: int = 100_000) -> None:
        self.wf = wf
        self.backend = backend
        self.ops = backend.ops
        self.resolver = Resolver(wf)
        self.items = self.resolver.items
        self.loops_of = {p: enclosing_loops(p, self.items) for p in self.items}
        self.max_dynamic = max_dynamic
        self._bindings: dict[tuple[Path, str], dict[int, Binding]] = {}
        self.carry: dict[str, Any] | None = None  # the iteration loop's own carries, between iterations

    # -- bindings ---------------------------------------------------------------------------
    def _bound(self, item: Item, key: str, expr: Expr) -> dict[int, Binding]:
        cache_key = (item.path, key)
        if cache_key not in self._bindings:
            table: dict[int, Binding] = {}

            def add(uses):
                for u in uses:
                    table[id(u.expr)] = u.binding
                    if isinstance(u.binding, IterSelect):
                        add(u.binding.inner)

            add(self.resolver.resolve_field(item, key, expr))
            self._bindings[cache_key] = table
        return self._bindings[cache_key]

    # -- evaluation -------------------------------------------------------------------------
    def _key(self, path: Path, ctx: Mapping[Path, int]) -> tuple[Path, tuple[int, ...]]:
        return path, tuple(ctx[loop] for loop in self.loops_of[path])

    def eval(self, expr: Expr, bound: Mapping[int, Binding], ctx: Mapping[Path, int], env: _Env) -> Any:
        match expr:
            case Int(value=v):
                return v
            case Param(name=n):
                return self.wf.params[n]
            case Neg(operand=a):
                return -self.eval(a, bound, ctx, env)
            case BinOp(op=op, left=a, right=b):
                x, y = self.eval(a, bound, ctx, env), self.eval(b, bound, ctx, env)
                return {"+": lambda: x + y, "-": lambda: x - y, "*": lambda: x * y,
                        "//": lambda: x // y, "%": lambda: x % y}[op]()
            case Ref() | IterRef():
                return self._binding(bound[id(expr)], expr, bound, ctx, env)
            case Record(fields=fields):
                return self.ops.record({name: self.eval(v, bound, ctx, env) for name, v in fields})
            case Call(fn=fn, args=args):
                values: list[Any] = []
                for a in args:
                    v = self.eval(a, bound, ctx, env)
                    values.extend(v if isinstance(a, IterRef) and a.index.kind == "all" else [v])
                return self.ops.stack(values) if fn == "stack" else self.ops.cat(values)
            case Slice(target=t, start=s, stop=p):
                start = None if s is None else self.eval(s, bound, ctx, env)
                stop = None if p is None else self.eval(p, bound, ctx, env)
                return self.ops.slice(self.eval(t, bound, ctx, env), start, stop)
        raise SemanticError(f"cannot evaluate {expr!r}")

    def _binding(self, b: Binding, expr: Expr, bound, ctx, env: _Env) -> Any:
        match b:
            case NodePort(node=node, port=port):
                return env.outputs[self._key(node, ctx)][port]
            case LoopIndex(loop=loop):
                return ctx[loop]
            case CarryIn(loop=loop, var=var):
                return env.carries[(loop, self._key(loop, ctx)[1] + (ctx[loop],))][var]
            case ParentInput(node=node, port=port):
                return env.inputs[self._key(node, ctx)][port]
            case IterSelect(loop=loop, index=ix, index_loop=index_loop):
                assert isinstance(expr, IterRef)
                ran = env.ran[self._key(loop, ctx)]
                if ix.kind == "all":
                    picks = list(ran)
                elif ix.kind == "last":
                    picks = [ran[-1]]
                elif ix.kind == "int":
                    picks = [ix.value]
                else:
                    assert index_loop is not None
                    picks = [ctx[index_loop]]
                results = []
                for j in picks:
                    if j not in ran:
                        raise SemanticError(f"iteration {j} of loop '{loop[-1]}' did not run (it ran {len(ran)})")
                    results.append(self.eval(expr.inner, bound, {**ctx, loop: j}, env))
                return results if ix.kind == "all" else results[0]
        raise SemanticError(f"unknown binding {b!r}")

    # -- execution --------------------------------------------------------------------------
    def run_iteration(self, k: int, on_item: Callable[[Item, Mapping[Path, int]], None] | None = None) -> _Env:
        """Run RL iteration `k` (the root loop's body once) and return its environment."""
        env = _Env()
        root = self.wf.root
        ctx = {root.path: k}
        if root.carries:
            if self.carry is None:
                self.carry = {c.name: self.eval(c.init, self._bound(root, f"carry.{c.name}.init", c.init), {}, env)
                              for c in root.carries}
            env.carries[(root.path, (k,))] = dict(self.carry)
        self._body(root.body, ctx, env, on_item)
        if root.carries:
            self.carry = {c.name: self.eval(c.next, self._bound(root, f"carry.{c.name}.next", c.next), ctx, env)
                          for c in root.carries}
        return env

    def _body(self, body: Sequence[Item], ctx: dict[Path, int], env: _Env, on_item) -> None:
        for item in body:
            if on_item is not None:
                on_item(item, ctx)
            if isinstance(item, ExecutionNode):
                self._node(item, ctx, env, on_item)
            elif isinstance(item, LoopNode):
                self._loop(item, ctx, env, on_item)
            elif isinstance(item, MergeNode):
                self._merge(item, ctx, env)

    def _inputs(self, node: ExecutionNode, ctx, env) -> dict[str, Any]:
        return {port: self.eval(e, self._bound(node, f"in.{port}", e), ctx, env) for port, e in node.inputs}

    def _node(self, node: ExecutionNode, ctx: dict[Path, int], env: _Env, on_item) -> None:
        key = self._key(node.path, ctx)
        inputs = self._inputs(node, ctx, env)
        if node.expand and node.phases:
            env.inputs[key] = inputs
            self._body(node.phases, ctx, env, on_item)
            outs: dict[str, Any] = {}
            for sub in node.phases:
                for port in sub.outputs:
                    if port in node.outputs:
                        outs[port] = env.outputs[self._key(sub.path, ctx)][port]
            env.outputs[key] = outs
            return
        result = self.backend.call(node, Invocation(node.path, key[1]), inputs)
        env.outputs[key] = result

    def _loop(self, loop: LoopNode, ctx: dict[Path, int], env: _Env, on_item) -> None:
        key = self._key(loop.path, ctx)
        current = {c.name: self.eval(c.init, self._bound(loop, f"carry.{c.name}.init", c.init), ctx, env)
                   for c in loop.carries}
        ran: list[int] = []
        env.ran[key] = ran
        indices = loop.indices() if not loop.dynamic else range(loop.count or self.max_dynamic)
        for j in indices:
            inner = {**ctx, loop.path: j}
            env.carries[(loop.path, key[1] + (j,))] = dict(current)
            self._body(loop.body, inner, env, on_item)
            ran.append(j)
            current = {c.name: self.eval(c.next, self._bound(loop, f"carry.{c.name}.next", c.next), inner, env)
                       for c in loop.carries}
            if loop.until is not None and self.ops.truth(
                    self.eval(loop.until, self._bound(loop, "until", loop.until), inner, env)):
                break
        else:
            if loop.dynamic and loop.count is None:
                raise SemanticError(f"dynamic loop '{loop.name}' did not end within {self.max_dynamic} iterations")
        outs = dict(current)
        for name, e in loop.collects:
            outs[name] = self.eval(e, self._bound(loop, f"collect.{name}", e), ctx, env)
        env.outputs[key] = outs

    def _merge(self, merge: MergeNode, ctx: dict[Path, int], env: _Env) -> None:
        parent = merge.path[:-1]
        outs = {}
        for port, dim in merge.ports:
            parts = [env.outputs[self._key(parent + (src,), ctx)][port] for src in merge.sources]
            outs[port] = self.ops.cat(parts, dim)
        env.outputs[self._key(merge.path, ctx)] = outs

