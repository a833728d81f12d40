"""The meaning of a workflow: its call invocations in program order, and how every input is computed
from earlier calls' outputs.

`Program` compiles a workflow once (scopes, bindings). `Program.unroll(k)` lists the *call sites* of RL
iteration k in program order: each ExecutionNode invocation (node path + the iteration number of every
enclosing loop) with its loop context. `Program.evaluate` computes an expression at a call site
*lazily* from the outputs of call invocations: carried values, loop collects, merges and phase outputs
are derived on demand, never stored as separate steps. Values are abstract (`ValueOps`), so the same
code gives three interpretations, as JAX's interpreters share one walk over a jaxpr:
  * concrete tensors (`run_sequential`, the reference interpreter, and the runtime backends),
  * dependency sets (`analysis.invocation_graph`: a value is the set of calls it was computed from),
  * any order the dependencies allow (`interpreter.reference`), since an input needs only its producers.

Loops with a dynamic end (`until`) are unrolled while running: `unroll` asks `until_reached` after
each iteration, so only an executor that runs in program order can drive them (they are kept whole).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from .expr import BinOp, Call, Expr, Int, IterRef, Neg, Param, Record, Ref, Slice
from .ir import ExecutionNode, Item, LoopNode, MergeNode, Workflow
from .resolve import Binding, CarryIn, IterSelect, LoopIndex, NodePort, ParentInput, Resolver

__all__ = ["Invocation", "CallSite", "ValueOps", "Program", "SemanticError", "enclosing_loops", "run_sequential"]

Path = tuple[str, ...]
Ctx = Mapping[Path, int]


@dataclass(frozen=True, order=True)
class Invocation:
    path: Path
    indices: tuple[int, ...]  # iteration number of each enclosing loop, outermost (the RL iteration) first

    def __str__(self) -> str:
        return ".".join(self.path) + "".join(f"[{i}]" for i in self.indices)


@dataclass(frozen=True)
class CallSite:
    inv: Invocation
    node: ExecutionNode
    ctx: tuple[tuple[Path, int], ...]  # (loop path, iteration) for every enclosing loop

    @property
    def context(self) -> dict[Path, int]:
        return dict(self.ctx)


class SemanticError(Exception):
    """A fault found while evaluating (a dynamic loop without end, a missing output)."""


class ValueOps(Protocol):
    """How values combine: tensors in the interpreters, dependency sets in the analysis."""

    def stack(self, values: Sequence[Any]) -> Any: ...
    def cat(self, values: Sequence[Any], dim: int = 0) -> Any: ...
    def record(self, fields: Mapping[str, Any]) -> Any: ...
    def slice(self, value: Any, start: int | None, stop: int | None) -> Any: ...
    def truth(self, value: Any) -> bool: ...


def enclosing_loops(path: Path, items: Mapping[Path, Item]) -> tuple[Path, ...]:
    """The loops around the item at `path`, outermost first (phased nodes are not loops)."""
    return tuple(path[:n] for n in range(1, len(path)) if isinstance(items.get(path[:n]), LoopNode))


Lookup = Callable[[Invocation, str], Any]


@dataclass
class Frame:
    """What evaluation needs besides the program: call outputs, the iterations dynamic loops ran, the
    RL-iteration carry, and a memo of derived values (carries are chains: memoised, they cost O(1))."""

    lookup: Lookup
    ops: ValueOps
    dynamic_ran: dict[tuple[Path, tuple[int, ...]], list[int]] = field(default_factory=dict)
    root_carry: dict[int, dict[str, Any]] = field(default_factory=dict)  # RL iteration -> carried values
    memo: dict[tuple, Any] = field(default_factory=dict)


class Program:
    """A workflow compiled for evaluation."""

    def __init__(self, wf: Workflow) -> None:
        self.wf = wf
        self.resolver = Resolver(wf)
        self.items = self.resolver.items
        self.loops_of = {p: enclosing_loops(p, self.items) for p in self.items}

    # -- bindings ---------------------------------------------------------------------------
    def bound(self, item: Item, key: str, expr: Expr) -> Mapping[int, Binding]:
        return self.resolver.bindings(item, key, expr)

    def indices_of(self, path: Path, ctx: Ctx) -> tuple[int, ...]:
        return tuple(ctx[loop] for loop in self.loops_of[path])

    def ran(self, loop: LoopNode, ctx: Ctx, frame: Frame) -> Sequence[int]:
        if loop.dynamic:
            return frame.dynamic_ran.get((loop.path, self.indices_of(loop.path, ctx)), [])
        return loop.indices()

    # -- program order ----------------------------------------------------------------------
    def unroll(self, k: int, until_reached: Callable[[LoopNode, dict[Path, int]], bool] | None = None) -> Iterator[CallSite]:
        """The call sites of RL iteration k, in program order."""
        yield from self._unroll_body(self.wf.root.body, {self.wf.root.path: k}, until_reached)

    def _unroll_body(self, body: Sequence[Item], ctx: dict[Path, int], until_reached) -> Iterator[CallSite]:
        for item in body:
            if isinstance(item, ExecutionNode):
                if item.expand and item.phases:
                    yield from self._unroll_body(item.phases, ctx, until_reached)
                else:
                    inv = Invocation(item.path, self.indices_of(item.path, ctx))
                    yield CallSite(inv, item, tuple(ctx.items()))
            elif isinstance(item, LoopNode):
                if not item.dynamic:
                    for j in item.indices():
                        yield from self._unroll_body(item.body, {**ctx, item.path: j}, until_reached)
                    continue
                if until_reached is None:
                    raise SemanticError(f"loop '{item.name}' ends on a condition: only an in-order executor can run it")
                limit = item.count if item.count is not None else 1_000_000
                for j in range(limit):
                    inner = {**ctx, item.path: j}
                    yield from self._unroll_body(item.body, inner, until_reached)
                    if until_reached(item, inner):
                        break
                else:
                    if item.count is None:
                        raise SemanticError(f"loop '{item.name}' did not end within {limit} iterations")

    # -- evaluation -------------------------------------------------------------------------
    def inputs(self, site: CallSite, frame: Frame) -> dict[str, Any]:
        ctx = site.context
        return {port: self.evaluate(e, self.bound(site.node, f"in.{port}", e), ctx, frame) for port, e in site.node.inputs}

    def until(self, loop: LoopNode, ctx: Ctx, frame: Frame) -> bool:
        """Evaluate a dynamic loop's end condition after iteration ctx[loop]; record that it ran."""
        key = (loop.path, self.indices_of(loop.path, ctx))
        frame.dynamic_ran.setdefault(key, []).append(ctx[loop.path])
        assert loop.until is not None
        return frame.ops.truth(self.evaluate(loop.until, self.bound(loop, "until", loop.until), ctx, frame))

    def evaluate(self, expr: Expr, bound: Mapping[int, Binding], ctx: Ctx, frame: Frame) -> Any:
        match expr:
            case Int(value=v):
                return v
            case Param(name=n):
                return self.wf.params[n]
            case Neg(operand=a):
                return -self.evaluate(a, bound, ctx, frame)
            case BinOp(op=op, left=a, right=b):
                x, y = self.evaluate(a, bound, ctx, frame), self.evaluate(b, bound, ctx, frame)
                if op == "+":
                    return x + y
                if op == "-":
                    return x - y
                if op == "*":
                    return x * y
                return x // y if op == "//" else x % y
            case Ref() | IterRef():
                return self._binding(bound[id(expr)], expr, bound, ctx, frame)
            case Record(fields=fields):
                return frame.ops.record({name: self.evaluate(v, bound, ctx, frame) for name, v in fields})
            case Call(fn=fn, args=args):
                values: list[Any] = []
                for a in args:
                    v = self.evaluate(a, bound, ctx, frame)
                    values.extend(v if isinstance(a, IterRef) and a.index.kind == "all" else [v])
                return frame.ops.stack(values) if fn == "stack" else frame.ops.cat(values)
            case Slice(target=t, start=s, stop=p):
                start = None if s is None else self.evaluate(s, bound, ctx, frame)
                stop = None if p is None else self.evaluate(p, bound, ctx, frame)
                return frame.ops.slice(self.evaluate(t, bound, ctx, frame), start, stop)
        raise SemanticError(f"cannot evaluate {expr!r}")

    def _binding(self, b: Binding, expr: Expr, bound, ctx: Ctx, frame: Frame) -> Any:
        match b:
            case NodePort(node=node, port=port):
                return self.output(node, port, ctx, frame)
            case LoopIndex(loop=loop):
                return ctx[loop]
            case CarryIn(loop=loop, var=var):
                return self.carry(loop, var, ctx, frame)
            case ParentInput(node=node, port=port):
                parent = self.items[node]
                assert isinstance(parent, ExecutionNode)
                e = dict(parent.inputs)[port]
                return self.evaluate(e, self.bound(parent, f"in.{port}", e), ctx, frame)
            case IterSelect(family=family) if family:
                assert isinstance(expr, IterRef)
                return self._family(b, expr, ctx, frame)
            case IterSelect(loop=loop_path, index=ix, index_loop=index_loop):
                assert isinstance(expr, IterRef)
                loop = self.items[loop_path]
                assert isinstance(loop, LoopNode)
                ran = self.ran(loop, ctx, frame)
                if ix.kind == "all":
                    picks = list(ran)
                elif ix.kind == "last":
                    picks = [ran[-1]] if ran else []
                elif ix.kind == "int":
                    picks = [ix.value]
                else:
                    assert index_loop is not None
                    picks = [ctx[index_loop]]
                for j in picks:
                    if j not in ran:
                        raise SemanticError(f"iteration {j} of loop '{loop.name}' did not run (it ran {len(ran)})")
                if not picks and ix.kind != "all":
                    raise SemanticError(f"loop '{loop.name}' ran no iteration")
                results = [self.evaluate(expr.inner, bound, {**ctx, loop_path: j}, frame) for j in picks]
                return results if ix.kind == "all" else results[0]
        raise SemanticError(f"unknown binding {b!r}")

    def _family(self, b: IterSelect, expr: IterRef, ctx: Ctx, frame: Frame) -> Any:
        """An iteration reference to a loop split in time: each iteration is in one group's body."""
        owner: dict[int, Path] = {}
        for member in b.family:
            loop = self.items[member]
            assert isinstance(loop, LoopNode)
            for j in self.ran(loop, ctx, frame):
                owner[j] = member
        ran = sorted(owner)
        ix = b.index
        if ix.kind == "all":
            picks = ran
        elif ix.kind == "last":
            picks = ran[-1:]
        elif ix.kind == "int":
            picks = [ix.value]
        else:
            assert b.index_loop is not None
            picks = [ctx[b.index_loop]]
        results = []
        for j in picks:
            if j not in owner:
                raise SemanticError(f"iteration {j} of loop '{expr.loop}' did not run")
            member = owner[j]
            table = self.resolver.body_bindings(expr.inner, member)
            results.append(self.evaluate(expr.inner, table, {**ctx, member: j}, frame))
        return results if ix.kind == "all" else results[0]

    def output(self, path: Path, port: str, ctx: Ctx, frame: Frame) -> Any:
        """Output `port` of item `path` in the iterations `ctx` selects."""
        item = self.items[path]
        if isinstance(item, ExecutionNode):
            if item.expand and item.phases:
                producer = [sub for sub in item.phases if port in sub.outputs][-1]
                return self.output(producer.path, port, ctx, frame)
            return frame.lookup(Invocation(path, self.indices_of(path, ctx)), port)
        if isinstance(item, MergeNode):
            parent = path[:-1]
            dim = dict(item.ports)[port]
            return frame.ops.cat([self.output(parent + (src,), port, ctx, frame) for src in item.sources], dim)
        assert isinstance(item, LoopNode)
        key = ("out", path, port, self.indices_of(path, ctx))
        if key in frame.memo:
            return frame.memo[key]
        collect = dict(item.collects).get(port)
        if collect is not None:
            value = self.evaluate(collect, self.bound(item, f"collect.{port}", collect), ctx, frame)
        else:  # the final value of a carry
            ran = self.ran(item, ctx, frame)
            if ran:
                value = self._next(item, port, {**ctx, item.path: ran[-1]}, frame)
            else:
                c = item.carry(port)
                assert c is not None
                value = self.evaluate(c.init, self.bound(item, f"carry.{port}.init", c.init), ctx, frame)
        frame.memo[key] = value
        return value

    def _next(self, loop: LoopNode, var: str, ctx: Ctx, frame: Frame) -> Any:
        c = loop.carry(var)
        assert c is not None
        return self.evaluate(c.next, self.bound(loop, f"carry.{var}.next", c.next), ctx, frame)

    def carry(self, loop_path: Path, var: str, ctx: Ctx, frame: Frame) -> Any:
        """The value of `loop.var` at the start of iteration ctx[loop]."""
        loop = self.items[loop_path]
        assert isinstance(loop, LoopNode)
        j = ctx[loop_path]
        if loop_path == self.wf.root.path:
            if j not in frame.root_carry:
                if j != 0:
                    raise SemanticError(f"the value carried into RL iteration {j} is not known")
                frame.root_carry[0] = {c.name: self.evaluate(c.init, self.bound(loop, f"carry.{c.name}.init", c.init), {}, frame)
                                       for c in loop.carries}
            return frame.root_carry[j][var]
        key = ("carry", loop_path, var, self.indices_of(loop_path, ctx), j)
        if key in frame.memo:
            return frame.memo[key]
        order = list(loop.indices()) if not loop.dynamic else list(range(j + 1))
        pos = order.index(j)
        outer = {p: i for p, i in ctx.items() if p != loop_path}
        if pos == 0:
            c = loop.carry(var)
            assert c is not None
            value = self.evaluate(c.init, self.bound(loop, f"carry.{var}.init", c.init), outer, frame)
        else:
            value = self._next(loop, var, {**outer, loop_path: order[pos - 1]}, frame)
        frame.memo[key] = value
        return value

    def end_iteration(self, k: int, frame: Frame) -> None:
        """Compute the RL-iteration carry for k+1 (if the root loop carries anything)."""
        root = self.wf.root
        if root.carries:
            ctx = {root.path: k}
            frame.root_carry[k + 1] = {c.name: self._next(root, c.name, ctx, frame) for c in root.carries}


class CallBackend(Protocol):
    ops: ValueOps

    def call(self, site: CallSite, inputs: dict[str, Any]) -> dict[str, Any]: ...


def run_sequential(program: Program, backend: CallBackend, iterations: Sequence[int],
                   on_iteration: Callable[[int, dict[Invocation, dict[str, Any]]], None] | None = None) -> Frame:
    """Run RL iterations in program order (the reference semantics). Returns the last frame."""
    outputs: dict[Invocation, dict[str, Any]] = {}

    def lookup(inv: Invocation, port: str) -> Any:
        try:
            return outputs[inv][port]
        except KeyError:
            raise SemanticError(f"{inv} has not produced '{port}'") from None

    frame = Frame(lookup, backend.ops)
    for k in iterations:
        outputs.clear()
        frame.memo.clear()
        for site in program.unroll(k, lambda loop, ctx: program.until(loop, ctx, frame)):
            outputs[site.inv] = backend.call(site, program.inputs(site, frame))
        program.end_iteration(k, frame)
        if on_iteration is not None:
            on_iteration(k, outputs)
    return frame
