"""The meaning of a workflow: its call invocations in program order, and how every input is computed
from earlier calls' outputs.

`Program` compiles a workflow once (scopes, binding tables). `Program.unroll(k)` lists the *call
sites* of RL iteration k in program order: each ExecutionNode invocation (node path + the iteration
number of every enclosing loop) with its loop context. `Program.evaluate` computes an expression at a
call site *lazily* from the outputs of call invocations: carried values, loop collects, merges and
phase outputs are derived on demand, never stored as separate steps. Values are abstract (`ValueOps`),
so the same code gives three interpretations, as JAX's interpreters share one walk over a jaxpr:
  * concrete tensors (`run_sequential`, the reference interpreter, and the runtime backends),
  * dependency sets (`analysis.invocation_graph`: a value is the set of calls it was computed from),
  * any order the dependencies allow (`interpreter.reference`), since an input needs only its producers.

As in JAX's `eval_jaxpr`, the evaluator is one small function over rule tables: `_EXPR_RULES` says what
each kind of expression computes, `_BINDING_RULES` what each kind of resolved name reads (a call's
output, a loop index, a carried value, a parent's input, selected iterations of an earlier loop).
Derived values that many calls share -- a carry is a chain through every iteration, a collect reads
every iteration -- are memoised in the `Frame`, so evaluating all the calls of an iteration costs
time linear in their number (the optimizer evaluates thousands of candidate plans this way).

Loops with a dynamic end (`until`) are unrolled while running: `unroll` asks `until_reached` after
each iteration, so only an executor that runs in program order can drive them (they are kept whole).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from .expr import BinOp, Call, Expr, Int, IterRef, Neg, Param, Record, Ref, Slice
from .ir import ExecutionNode, Item, LoopNode, MergeNode, Workflow
from .resolve import Binding, CarryIn, IterSelect, LoopIndex, NodePort, ParentInput, Resolver

__all__ = ["Invocation", "CallSite", "ValueOps", "Frame", "Program", "SemanticError", "enclosing_loops",
           "interleaved_run", "run_sequential"]

Path = tuple[str, ...]
Ctx = Mapping[Path, int]  # the iteration of every enclosing loop, by loop path


class Invocation(NamedTuple):
    """One call of a node: its path and the iteration number of each enclosing loop, outermost (the RL
    iteration) first. A named tuple because analyses hash and compare millions of them."""

    path: Path
    indices: tuple[int, ...]

    def __str__(self) -> str:
        return ".".join(self.path) + "".join(f"[{i}]" for i in self.indices)


class CallSite(NamedTuple):
    """A call in program order: the invocation, its node, and the loop context its inputs are
    evaluated in (shared by the calls of one loop iteration; never mutated)."""

    inv: Invocation
    node: ExecutionNode
    ctx: Ctx

    @property
    def context(self) -> dict[Path, int]:
        return dict(self.ctx)


class SemanticError(Exception):
    """A fault found while evaluating (a dynamic loop without end, a missing output). `at`: the call whose
    output was asked for before it ran, for a missing output (a checker points at its item)."""

    def __init__(self, message: str, at: Invocation | None = None) -> None:
        super().__init__(message)
        self.at = at


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


Table = Mapping[int, Binding]  # id(Ref or IterRef) -> what it names, for one field (see resolve.BindingTables)


class Program:
    """A workflow compiled for evaluation: the items, each one's enclosing loops, binding tables."""

    def __init__(self, wf: Workflow) -> None:
        self.wf = wf
        self.resolver = Resolver(wf)
        self.items = self.resolver.items
        self.loops_of = self.resolver.loops_of
        self.tables = self.resolver.tables  # the workflow's one cache of binding tables
        self._inputs: dict[Path, tuple[tuple[str, Expr, Table], ...]] = {}
        self._indices: dict[Path, Sequence[int]] = {}
        self._until: dict[Path, Mapping[int, Any]] = {}  # `until:` tables: its own carried values after `next`

    def bound(self, item: Item, key: str, expr: Expr) -> Table:
        """The binding table of field `key` ("in.obs", "carry.x.next", ...) of `item`."""
        return self.tables.field(item, key, expr)

    def indices_of(self, path: Path, ctx: Ctx) -> tuple[int, ...]:
        return tuple(map(ctx.__getitem__, self.loops_of[path]))

    def iterations(self, loop: LoopNode) -> Sequence[int]:
        """The iterations a static loop runs: a `range` (constant-time membership) unless it is a
        temporal split group, which runs the increasing subset `loop.plan.iterations`."""
        its = self._indices.get(loop.path)
        if its is None:
            its = self._indices[loop.path] = loop.plan.iterations if loop.plan.iterations is not None else range(loop.count or 0)
        return its

    def ran(self, loop: LoopNode, ctx: Ctx, frame: Frame) -> Sequence[int]:
        """The iterations `loop` ran in context `ctx` (a dynamic loop: those recorded so far)."""
        if loop.dynamic:
            return frame.dynamic_ran.get((loop.path, self.indices_of(loop.path, ctx)), [])
        return self.iterations(loop)

    # -- program order ----------------------------------------------------------------------
    def unroll(self, k: int, until_reached: Callable[[LoopNode, dict[Path, int]], bool] | None = None,
               since: int = 0, ahead: bool = True) -> Iterator[CallSite]:
        """The call sites of RL iteration k, in program order. A deferred node (`defer: d`, an asynchronous
        plan) runs here its call of RL iteration k-d, if that iteration ran since the last drain (`since`:
        the first RL iteration after it; `drain` ran the earlier ones). A node run ahead (`ahead: 1`) runs
        here its call of RL iteration k+1 -- unless `ahead` is False: k ends before a barrier (a checkpoint,
        a stop, the end), which no call crosses -- and, in the first iteration after a barrier (k ==
        `since`), its own call of k first."""
        yield from _unroll_body(self, self.wf.root.body, {self.wf.root.path: k}, until_reached, since, ahead)

    @property
    def hoisted(self) -> tuple[ExecutionNode, ...]:
        """The nodes run ahead (`ahead:`), in program order: direct children of the RL iteration."""
        return tuple(i for i in self.wf.root.body if isinstance(i, ExecutionNode) and i.plan.ahead)

    @property
    def deferred(self) -> tuple[ExecutionNode, ...]:
        """The deferred nodes (`defer:`), in program order: direct children of the RL iteration."""
        return tuple(i for i in self.wf.root.body if isinstance(i, ExecutionNode) and i.plan.defer)

    @property
    def depth(self) -> int:
        """How many RL iterations an executor may have in flight at once, and keeps the outputs of: 1 + the
        largest `defer` + the largest `ahead` (a call run ahead produces the next iteration's outputs)."""
        return 1 + max((n.plan.defer for n in self.deferred), default=0) + max((n.plan.ahead for n in self.hoisted),
                                                                            default=0)

    def drain(self, k: int, since: int = 0) -> Iterator[CallSite]:
        """The deferred calls still pending after RL iteration k (those of iterations since `since` that
        `unroll` has not run yet), oldest iteration first, then in program order. They run at the end of
        a run and before a checkpoint, so that what is saved, and what a run leaves, is the state the
        declared workflow leaves; after a drain the next iterations start with nothing pending."""
        root = self.wf.root.path
        for origin in range(max(since, k + 2 - self.depth), k + 1):
            for node in self.deferred:
                if origin > k - node.plan.defer:
                    yield CallSite(Invocation(node.path, (origin,)), node, {root: origin})

    # -- evaluation -------------------------------------------------------------------------
    def inputs(self, site: CallSite, frame: Frame) -> dict[str, Any]:
        """The value of every input of a call."""
        plan = self._inputs.get(site.node.path)
        if plan is None:
            node = site.node
            plan = self._inputs[node.path] = tuple((port, e, self.bound(node, f"in.{port}", e)) for port, e in node.inputs)
        ctx = site.ctx
        return {port: self.evaluate(e, table, ctx, frame) for port, e, table in plan}

    def until(self, loop: LoopNode, ctx: Ctx, frame: Frame) -> bool:
        """Evaluate a dynamic loop's end condition after iteration ctx[loop]; record that it ran."""
        key = (loop.path, self.indices_of(loop.path, ctx))
        frame.dynamic_ran.setdefault(key, []).append(ctx[loop.path])
        return frame.ops.truth(self.condition(loop, ctx, frame))

    def condition(self, loop: LoopNode, ctx: Ctx, frame: Frame) -> Any:
        """The value of a dynamic loop's `until:` after iteration ctx[loop]: it reads that iteration's outputs
        and index and, being evaluated after the iteration's `next`, the loop's own carried values as they
        leave it (`until: decode.fin` with `fin: {next: gen.eos}` ends where `until: gen.eos` does; it
        read the value the iteration started with, one trip late)."""
        assert loop.until is not None
        table = self._until.get(loop.path)
        if table is None:
            table = self._until[loop.path] = {
                k: _CarryAfter(b.loop, b.var) if isinstance(b, CarryIn) and b.loop == loop.path else b
                for k, b in self.bound(loop, "until", loop.until).items()}
        return self.evaluate(loop.until, table, ctx, frame)

    def evaluate(self, expr: Expr, table: Table, ctx: Ctx, frame: Frame) -> Any:
        """The value of `expr` in context `ctx`; `table` resolves its names (see `bound`): a name reads
        what it is bound to, any other expression follows its rule."""
        b = table.get(id(expr))
        if b is not None:
            return self.read(b, expr, table, ctx, frame)  # type: ignore[arg-type]
        rule = _EXPR_RULES.get(type(expr))
        if rule is None:
            raise SemanticError(f"cannot evaluate {expr!r}")
        return rule(self, expr, table, ctx, frame)

    def read(self, b: Binding, expr: Ref | IterRef, table: Table, ctx: Ctx, frame: Frame) -> Any:
        """The value a resolved name stands for."""
        rule = _BINDING_RULES.get(type(b))
        if rule is None:
            raise SemanticError(f"unknown binding {b!r}")
        return rule(self, b, expr, table, ctx, frame)

    def output(self, path: Path, port: str, ctx: Ctx, frame: Frame) -> Any:
        """Output `port` of item `path` in the iterations `ctx` selects."""
        item = self.items[path]
        return _OUTPUT_RULES[type(item)](self, item, port, ctx, frame)

    def carry(self, loop_path: Path, var: str, ctx: Ctx, frame: Frame) -> Any:
        """The value of `loop.var` at the start of iteration ctx[loop]."""
        loop = self.items[loop_path]
        assert isinstance(loop, LoopNode)
        if loop_path == self.wf.root.path:
            return _root_carry(self, loop, var, ctx[loop_path], frame)
        return _carry(self, loop, var, ctx, frame)

    def end_iteration(self, k: int, frame: Frame) -> None:
        """Compute the RL-iteration carry for k+1 (if the root loop carries anything)."""
        root = self.wf.root
        if root.carries:
            ctx = {root.path: k}
            frame.root_carry[k + 1] = {c.name: _next(self, root, c.name, ctx, frame) for c in root.carries}


# -- program order --------------------------------------------------------------------------------

def _unroll_body(p: Program, body: Sequence[Item], ctx: dict[Path, int], until_reached, since: int = 0,
                 ahead: bool = True) -> Iterator[CallSite]:
    n = 0
    while n < len(body):
        item, n = body[n], n + 1
        turns = interleaved_run(body, n - 1)
        if len(turns) > 1:
            n += len(turns) - 1
            yield from _round_robin([_unroll_body(p, [m], ctx, until_reached) for m in turns])
            continue
        if isinstance(item, ExecutionNode):
            if item.plan.defer:  # a direct child of the RL iteration (checked by `resolve`): its call of k - defer
                origin = ctx[p.wf.root.path] - item.plan.defer
                if origin >= since:
                    yield CallSite(Invocation(item.path, (origin,)), item, {p.wf.root.path: origin})
            elif item.plan.ahead:  # likewise: its call of k + 1 (and, after a barrier, its own first)
                k = ctx[p.wf.root.path]
                for origin in ([k] if k == since else []) + ([k + 1] if ahead else []):
                    yield CallSite(Invocation(item.path, (origin,)), item, {p.wf.root.path: origin})
            elif item.plan.expand and item.phases:
                yield from _unroll_body(p, item.phases, ctx, until_reached)
            else:
                yield CallSite(Invocation(item.path, p.indices_of(item.path, ctx)), item, ctx)
        elif isinstance(item, LoopNode):
            if not item.dynamic:
                for j in p.iterations(item):
                    yield from _unroll_body(p, item.body, {**ctx, item.path: j}, until_reached)
            else:
                yield from _unroll_dynamic(p, item, ctx, until_reached)


def interleaved_run(body: Sequence[Item], n: int) -> list[LoopNode]:
    """The loops that start at body[n] and run in turn (`interleaved`), or []: the temporal groups of one
    split, or consecutive sibling loops that are not temporal groups (`interleave LOOP_A LOOP_B`). Groups
    of one split are independent (the split is legal only for a free loop, and a component whose state the
    loop writes has a copy per group), so any interleaving of their calls keeps each group's own order and
    every dependency; sibling loops were checked to be independent by the rewrite (the order check), and
    a hand-written plan by `rose validate`'s check against its source. Loops that end on a condition inside
    the groups take turns too: each group's stream asks `until_reached` after its own trips, so the driver
    waits for one group's condition while the calls of the others, already submitted, run (a group whose
    loop ended drops out of the turns)."""
    first = body[n]
    if not (isinstance(first, LoopNode) and first.plan.interleaved):
        return []
    run: list[LoopNode] = []
    for item in body[n:]:
        if not (isinstance(item, LoopNode) and item.plan.interleaved and item.temporal_group == first.temporal_group
                and item.plan.split_of == first.plan.split_of):
            break
        run.append(item)
    return run


def _round_robin(streams: list[Iterator[CallSite]]) -> Iterator[CallSite]:
    """One call of each stream in turn until all are done."""
    live = list(streams)
    while live:
        for s in list(live):
            site = next(s, None)
            if site is None:
                live.remove(s)
            else:
                yield site


def _unroll_dynamic(p: Program, loop: LoopNode, ctx: dict[Path, int], until_reached) -> Iterator[CallSite]:
    if until_reached is None:
        raise SemanticError(f"loop '{loop.name}' ends on a condition: only an in-order executor can run it")
    limit = loop.count if loop.count is not None else 1_000_000
    for j in range(limit):
        inner = {**ctx, loop.path: j}
        yield from _unroll_body(p, loop.body, inner, until_reached)
        if until_reached(loop, inner):
            return
    if loop.count is None:
        raise SemanticError(f"loop '{loop.name}' did not end within {limit} iterations")


# -- what each kind of expression computes ------------------------------------------------------

def _arith(x: Any, op: str, y: Any) -> Any:
    if op == "+":
        return x + y
    if op == "-":
        return x - y
    if op == "*":
        return x * y
    return x // y if op == "//" else x % y


def _call(p: Program, e: Call, table: Table, ctx: Ctx, frame: Frame) -> Any:
    values: list[Any] = []
    for a in e.args:
        v = p.evaluate(a, table, ctx, frame)
        if isinstance(a, IterRef) and a.index.kind == "all":
            values.extend(v)  # every iteration of a loop: one value each
        else:
            values.append(v)
    return frame.ops.stack(values) if e.fn == "stack" else frame.ops.cat(values)


def _slice(p: Program, e: Slice, table: Table, ctx: Ctx, frame: Frame) -> Any:
    start = None if e.start is None else p.evaluate(e.start, table, ctx, frame)
    stop = None if e.stop is None else p.evaluate(e.stop, table, ctx, frame)
    return frame.ops.slice(p.evaluate(e.target, table, ctx, frame), start, stop)


_EXPR_RULES: dict[type, Callable[..., Any]] = {
    Int: lambda p, e, table, ctx, frame: e.value,
    Param: lambda p, e, table, ctx, frame: p.wf.params[e.name],
    Neg: lambda p, e, table, ctx, frame: -p.evaluate(e.operand, table, ctx, frame),
    BinOp: lambda p, e, table, ctx, frame: _arith(p.evaluate(e.left, table, ctx, frame), e.op,
                                                  p.evaluate(e.right, table, ctx, frame)),
    Record: lambda p, e, table, ctx, frame: frame.ops.record({n: p.evaluate(v, table, ctx, frame) for n, v in e.fields}),
    Call: _call,
    Slice: _slice,
}


# -- what each kind of resolved name reads ------------------------------------------------------

def _parent_input(p: Program, b: ParentInput, expr: Expr, table: Table, ctx: Ctx, frame: Frame) -> Any:
    parent = p.items[b.node]
    assert isinstance(parent, ExecutionNode)
    e = dict(parent.inputs)[b.port]
    return p.evaluate(e, p.bound(parent, f"in.{b.port}", e), ctx, frame)


def _picks(b: IterSelect, ran: Sequence[int], ctx: Ctx) -> Sequence[int]:
    """The iterations an iteration reference selects among those that ran."""
    kind = b.index.kind
    if kind == "all":
        return ran
    if kind == "last":
        return ran[-1:]
    if kind == "int":
        return [b.index.value]
    assert b.index_loop is not None
    return [ctx[b.index_loop]]


def _select(p: Program, b: IterSelect, expr: IterRef, table: Table, ctx: Ctx, frame: Frame) -> Any:
    """`loop[index].inner`: `inner` evaluated in the selected iteration(s) of an earlier loop (or, for
    a loop split in time, of the group that ran each iteration)."""
    if b.family:
        return _select_family(p, b, expr, ctx, frame)
    loop = p.items[b.loop]
    assert isinstance(loop, LoopNode)
    ran = p.ran(loop, ctx, frame)
    picks = _picks(b, ran, ctx)
    if b.index.kind != "all":
        if not picks:
            raise SemanticError(f"loop '{loop.name}' ran no iteration")
        if picks[0] not in ran:
            raise SemanticError(f"iteration {picks[0]} of loop '{loop.name}' did not run (it ran {len(ran)})")
        return p.evaluate(expr.inner, table, {**ctx, b.loop: picks[0]}, frame)
    return [p.evaluate(expr.inner, table, {**ctx, b.loop: j}, frame) for j in picks]


def _select_family(p: Program, b: IterSelect, expr: IterRef, ctx: Ctx, frame: Frame) -> Any:
    owner: dict[int, Path] = {}
    for member in b.family:
        loop = p.items[member]
        assert isinstance(loop, LoopNode)
        for j in p.ran(loop, ctx, frame):
            owner[j] = member
    results = []
    for j in _picks(b, sorted(owner), ctx):
        if j not in owner:
            raise SemanticError(f"iteration {j} of loop '{expr.loop}' did not run")
        member = owner[j]
        table = p.tables.in_body(expr.inner, member)
        results.append(p.evaluate(expr.inner, table, {**ctx, member: j}, frame))
    return results if b.index.kind == "all" else results[0]


@dataclass(frozen=True)
class _CarryAfter:
    """A loop's carried value as iteration ctx[loop] leaves it (its `next`): what the loop's `until:` reads."""

    loop: Path
    var: str


_BINDING_RULES: dict[type, Callable[..., Any]] = {
    NodePort: lambda p, b, expr, table, ctx, frame: p.output(b.node, b.port, ctx, frame),
    LoopIndex: lambda p, b, expr, table, ctx, frame: ctx[b.loop],
    CarryIn: lambda p, b, expr, table, ctx, frame: p.carry(b.loop, b.var, ctx, frame),
    _CarryAfter: lambda p, b, expr, table, ctx, frame: p.carry(b.loop, b.var, {**ctx, b.loop: ctx[b.loop] + 1}, frame),
    ParentInput: _parent_input,
    IterSelect: _select,
}


# -- what each kind of item outputs ---------------------------------------------------------------

def _call_output(p: Program, item: ExecutionNode, port: str, ctx: Ctx, frame: Frame) -> Any:
    """A call's output; a node running its phases gives the last phase item's output of that name."""
    if item.plan.expand and item.phases:
        producer = [sub for sub in item.phases if port in sub.outputs][-1]
        return p.output(producer.path, port, ctx, frame)
    return frame.lookup(Invocation(item.path, p.indices_of(item.path, ctx)), port)


def _merge_output(p: Program, item: MergeNode, port: str, ctx: Ctx, frame: Frame) -> Any:
    """The split groups' outputs, concatenated along the port's dimension."""
    parent = item.path[:-1]
    dim = dict(item.ports)[port]
    return frame.ops.cat([p.output(parent + (src,), port, ctx, frame) for src in item.sources], dim)


def _loop_output(p: Program, loop: LoopNode, port: str, ctx: Ctx, frame: Frame) -> Any:
    """A collect, or the final value of a carry (its init if the loop ran no iteration); memoised."""
    key = ("out", loop.path, port, p.indices_of(loop.path, ctx))
    if key in frame.memo:
        return frame.memo[key]
    collect = dict(loop.collects).get(port)
    if collect is not None:
        value = p.evaluate(collect, p.bound(loop, f"collect.{port}", collect), ctx, frame)
    else:
        ran = p.ran(loop, ctx, frame)
        value = _next(p, loop, port, {**ctx, loop.path: ran[-1]}, frame) if ran else _init(p, loop, port, ctx, frame)
    frame.memo[key] = value
    return value


_OUTPUT_RULES: dict[type, Callable[..., Any]] = {ExecutionNode: _call_output, MergeNode: _merge_output, LoopNode: _loop_output}


# -- carried values -------------------------------------------------------------------------------

def _carry(p: Program, loop: LoopNode, var: str, ctx: Ctx, frame: Frame) -> Any:
    """`init` before the loop's first iteration, else `next` at the end of the iteration before (in
    the iterations it runs); memoised, so a chain of N iterations costs N evaluations in all."""
    j = ctx[loop.path]
    key = ("carry", loop.path, var, p.indices_of(loop.path, ctx), j)
    if key in frame.memo:
        return frame.memo[key]
    outer = {path: i for path, i in ctx.items() if path != loop.path}
    before = _previous_iteration(loop, j)
    if before is None:
        value = _init(p, loop, var, outer, frame)
    else:
        outer[loop.path] = before
        value = _next(p, loop, var, outer, frame)
    frame.memo[key] = value
    return value


def _previous_iteration(loop: LoopNode, j: int) -> int | None:
    """The iteration of `loop` that runs before j (a temporal group runs only some), or None."""
    if loop.dynamic or loop.plan.iterations is None:
        return j - 1 if j > 0 else None
    order = loop.plan.iterations  # increasing (checked when the plan is built)
    pos = bisect_left(order, j)
    if pos == len(order) or order[pos] != j:
        raise SemanticError(f"loop '{loop.name}' does not run iteration {j}")
    return order[pos - 1] if pos > 0 else None


def _root_carry(p: Program, root: LoopNode, var: str, k: int, frame: Frame) -> Any:
    """What the RL-iteration loop carries into iteration k (from `end_iteration` of k-1)."""
    if k not in frame.root_carry:
        if k != 0:
            raise SemanticError(f"the value carried into RL iteration {k} is not known")
        frame.root_carry[0] = {c.name: _init(p, root, c.name, {}, frame) for c in root.carries}
    return frame.root_carry[k][var]


def _init(p: Program, loop: LoopNode, var: str, ctx: Ctx, frame: Frame) -> Any:
    c = loop.carry(var)
    assert c is not None
    return p.evaluate(c.init, p.bound(loop, f"carry.{var}.init", c.init), ctx, frame)


def _next(p: Program, loop: LoopNode, var: str, ctx: Ctx, frame: Frame) -> Any:
    c = loop.carry(var)
    assert c is not None
    return p.evaluate(c.next, p.bound(loop, f"carry.{var}.next", c.next), ctx, frame)


class CallBackend(Protocol):
    ops: ValueOps

    def call(self, site: CallSite, inputs: dict[str, Any]) -> dict[str, Any]: ...


def run_sequential(program: Program, backend: CallBackend, iterations: Sequence[int],
                   on_iteration: Callable[[int, dict[Invocation, dict[str, Any]]], None] | None = None) -> Frame:
    """Run RL iterations in program order (the reference semantics). Returns the last frame."""
    outputs: dict[Invocation, dict[str, Any]] = {}  # this RL iteration's calls
    kept: dict[Invocation, dict[str, Any]] = {}  # earlier ones' that a deferred call may still read

    def lookup(inv: Invocation, port: str) -> Any:
        try:
            return (outputs[inv] if inv in outputs else kept[inv])[port]
        except KeyError:
            raise SemanticError(f"{inv} has not produced '{port}'", at=inv) from None

    frame = Frame(lookup, backend.ops)
    depth, since = program.depth, (iterations[0] if len(iterations) else 0)
    for k in iterations:
        if depth > 1:  # a deferred call of RL iteration k-d reads that iteration's outputs
            kept.update(outputs)
            for inv in [inv for inv in kept if inv.indices[0] <= k - depth]:
                del kept[inv]
        outputs = {}
        frame.memo.clear()
        for site in program.unroll(k, lambda loop, ctx: program.until(loop, ctx, frame), since, k != iterations[-1]):
            outputs[site.inv] = backend.call(site, program.inputs(site, frame))
        if depth > 1 and k == iterations[-1]:  # what is still deferred runs at the end of the run
            for site in program.drain(k, since):
                outputs[site.inv] = backend.call(site, program.inputs(site, frame))
        program.end_iteration(k, frame)
        if on_iteration is not None:
            on_iteration(k, outputs)
    return frame
