"""Name resolution and the cross-reference checks of a workflow (or plan) IR.

Scoping is lexical. A reference `a.b` at some point of a body looks, from the innermost body out, for
  * `a` = an enclosing loop: `b` is its index `i` or one of its carried values (the current value);
  * `a` = the node whose `phases` we are in: `b` is one of that node's inputs;
  * `a` = an item of the body that runs *before* this point: `b` is one of its outputs (a loop's outputs
    are its collects and the final values of its carries).
`loop[index].inner` selects iterations of an earlier loop; `inner` is resolved inside that loop's body
as if at the end of the body. Carry `next` and `until` are evaluated at the end of the body; carry
`init` just before the loop; `collect` just after it (and may select the loop's own iterations).

Every use of a name becomes a `Use(expr, binding)`; the analysis and the interpreters work from
bindings, never from strings.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Union

from .bulk import in_bulk
from .errors import Diagnostic, SourcePos, did_you_mean, format_path
from .expr import (
    BinOp,
    Call,
    Expr,
    Index,
    Int,
    IterRef,
    Neg,
    Param,
    Record,
    Ref,
    Slice,
    children,
    unparse,
    walk,
)
from .ir import Access, ExecutionNode, Item, LoopNode, MergeNode, Workflow, iter_items

__all__ = [
    "NodePort", "LoopIndex", "CarryIn", "ParentInput", "IterSelect", "Binding", "Use", "Scope", "Scopes", "Resolver",
    "ResolveError", "check_workflow", "check_reserved_names", "expr_fields", "BindingTables", "binding_table",
]

Path = tuple[str, ...]


@dataclass(frozen=True)
class NodePort:
    """Output `port` of item `node` (in the iteration of every loop enclosing both)."""

    node: Path
    port: str


@dataclass(frozen=True)
class LoopIndex:
    loop: Path


@dataclass(frozen=True)
class CarryIn:
    """The current value of a loop-carried variable, inside the loop's body."""

    loop: Path
    var: str


@dataclass(frozen=True)
class ParentInput:
    """Input `port` of the node whose phases contain the reference."""

    node: Path
    port: str


@dataclass(frozen=True)
class IterSelect:
    """`loop[index].inner`: `index_loop` is the loop whose current index selects (kind 'loop').
    When the loop was split in time, `family` lists its groups (each runs some of the iterations);
    `loop` and `inner` then refer to the first group."""

    loop: Path
    index: Index
    index_loop: Path | None
    inner: tuple[Use, ...]
    family: tuple[Path, ...] = ()


Binding = Union[NodePort, LoopIndex, CarryIn, ParentInput, IterSelect]  # noqa: UP007


@dataclass(frozen=True)
class Use:
    expr: Expr  # the Ref or IterRef
    binding: Binding


class ResolveError(Exception):
    def __init__(self, offset: int, message: str, hint: str | None = None, target: Path | None = None) -> None:
        super().__init__(message)
        self.offset, self.message, self.hint, self.target = offset, message, hint, target


@dataclass(frozen=True)
class Scope:
    """A body: a loop's body or a node's phases. `index` is the owner's position in the parent scope."""

    owner: LoopNode | ExecutionNode
    items: tuple[Item, ...]
    parent: Scope | None
    index: int

    @functools.cached_property
    def names(self) -> dict[str, int]:
        return {item.name: i for i, item in enumerate(self.items)}

    @functools.cached_property
    def groups(self) -> dict[str, list[tuple[int, LoopNode]]]:
        """Loop name -> the temporal split groups of that loop in this body, with their positions."""
        out: dict[str, list[tuple[int, LoopNode]]] = {}
        for i, it in enumerate(self.items):
            if isinstance(it, LoopNode) and it.plan.split_of is not None and it.plan.iterations is not None:
                out.setdefault(it.plan.split_of, []).append((i, it))
        return out


def expr_fields(item: Item) -> Iterator[tuple[str, Expr]]:
    """Every expression an item holds, keyed as in `field_pos` ("in.obs", "carry.x.next", ...)."""
    if isinstance(item, ExecutionNode):
        for port, e in item.inputs:
            yield f"in.{port}", e
    elif isinstance(item, LoopNode):
        for c in item.carries:
            yield f"carry.{c.name}.init", c.init
            yield f"carry.{c.name}.next", c.next
        if item.until is not None:
            yield "until", item.until
        for name, e in item.collects:
            yield f"collect.{name}", e


def _chain(scope: Scope | None) -> Iterator[Scope]:
    """A scope and the scopes around it, innermost first."""
    while scope is not None:
        yield scope
        scope = scope.parent


class Scopes:
    """The bodies of a workflow, indexed: every item by path, the body holding it, the body it owns,
    and the loops around it. Built once per workflow in one walk."""

    def __init__(self, wf: Workflow) -> None:
        self.wf = wf
        self.items: dict[Path, Item] = {wf.root.path: wf.root}
        self.scope_of: dict[Path, tuple[Scope, int]] = {}  # item -> (scope containing it, position)
        self.body_scope: dict[Path, Scope] = {}  # loop or phased node -> the scope of its body
        self.loops_of: dict[Path, tuple[Path, ...]] = {wf.root.path: ()}  # item -> enclosing loops, outermost first
        root = Scope(wf.root, wf.root.body, None, 0)
        self.body_scope[wf.root.path] = root
        self._index(root, (wf.root.path,))

    def _index(self, scope: Scope, loops: tuple[Path, ...]) -> None:
        for i, item in enumerate(scope.items):
            self.items[item.path] = item
            self.scope_of[item.path] = (scope, i)
            self.loops_of[item.path] = loops
            if isinstance(item, LoopNode | ExecutionNode):
                inner = item.body if isinstance(item, LoopNode) else item.phases
                if inner:
                    sub = Scope(item, inner, scope, i)
                    self.body_scope[item.path] = sub
                    self._index(sub, loops + (item.path,) if isinstance(item, LoopNode) else loops)

    def site(self, item: Item, field: str) -> tuple[Scope, float, LoopNode | None]:
        """Where a field of an item is evaluated: (scope, position in it, the loop whose own iterations
        the field may select). `next` and `until` are at the end of the loop's body, `init` just before
        the loop, `collect` just after it; the root's init and collect before and after everything."""
        if isinstance(item, LoopNode) and (field.endswith(".next") or field == "until"):
            return self.body_scope[item.path], float(len(item.body)), None
        if item.path == self.wf.root.path:
            return self.body_scope[item.path], -1.0, self.wf.root
        scope, i = self.scope_of[item.path]
        if isinstance(item, LoopNode) and field.startswith("collect."):
            return scope, i + 0.5, item
        return scope, float(i), None

    def visible(self, scope: Scope) -> list[str]:
        """Every name a reference in `scope` could mean (for did-you-mean hints)."""
        names: list[str] = []
        s: Scope | None = scope
        while s is not None:
            names += [s.owner.name, *s.names]
            s = s.parent
        return names


class Resolver(Scopes):
    """Resolution of a workflow's expressions to bindings, by the lexical rules of the module docstring:
    every `Ref` and `IterRef` of an expression becomes a `Use`, or a `ResolveError` says why not.
    `tables` keeps each field's resolution (`BindingTables`): ask it, not `resolve_field`, when a field
    is read more than once."""

    def __init__(self, wf: Workflow) -> None:
        super().__init__(wf)
        self.tables = BindingTables(self)

    def resolve_field(self, item: Item, field: str, expr: Expr) -> list[Use]:
        scope, pos, self_loop = self.site(item, field)
        return self.resolve(expr, scope, pos, self_loop)

    def resolve_in_body(self, expr: Expr, loop: Path) -> list[Use]:
        """Resolve `expr` as if at the end of `loop`'s body (the inner part of an iteration reference)."""
        body = self.body_scope[loop]
        return self.resolve(expr, body, float(len(body.items)))

    def resolve(self, expr: Expr, scope: Scope, pos: float, self_loop: LoopNode | None = None) -> list[Use]:
        uses: list[Use] = []
        for e in _names(expr):
            binding = self._ref(e, scope, pos) if isinstance(e, Ref) else self._iterref(e, scope, pos, self_loop)
            uses.append(Use(e, binding))
        return uses

    # -- a name: node.port, loop.i, loop.var, parent.input ---------------------------------------
    def _ref(self, e: Ref, scope: Scope, pos: float) -> Binding:
        """From the innermost body out: the body's owner (a loop or a phased node), else an item of the
        body that runs before `pos`."""
        s: Scope | None = scope
        while s is not None:
            if s.owner.name == e.head:
                return _owner_ref(e, s.owner)
            idx = s.names.get(e.head)
            if idx is not None:
                return _sibling_ref(e, s.items[idx], idx, pos)
            pos = float(s.index)
            s = s.parent
        raise ResolveError(e.offset, f"unknown name '{e.head}' in '{e.head}.{e.attr}'",
                           self._inside_a_loop(e, scope) or did_you_mean(e.head, self.visible(scope)))

    def _inside_a_loop(self, e: Ref, scope: Scope) -> str | None:
        """A hint when the name is an item of a loop whose body this scope cannot see (a collect that names
        a body node directly): how to read it through the loop."""
        for s in _chain(scope):
            for item in s.items:
                if isinstance(item, LoopNode) and any(inner.name == e.head for inner in item.body):
                    return (f"'{e.head}' runs inside loop '{item.name}': after it, read it through the loop, as "
                            f"{item.name}[*].{e.head}.{e.attr} (every iteration) or {item.name}[-1].{e.head}.{e.attr} "
                            "(the last)")
        return None

    # -- an iteration reference: loop[index].inner ------------------------------------------------
    def _iterref(self, e: IterRef, scope: Scope, pos: float, self_loop: LoopNode | None) -> Binding:
        found = self._find_loop(e, scope, pos, self_loop)
        family = tuple(m.path for m in found) if isinstance(found, tuple) else ()
        loop = found[0] if isinstance(found, tuple) else found
        index_loop = None
        if e.index.kind == "loop":
            b = self._ref(Ref(e.index.offset, e.index.loop, "i"), scope, pos)
            if not isinstance(b, LoopIndex):
                raise ResolveError(e.index.offset, f"'{e.index.loop}.i' is not the index of an enclosing loop")
            index_loop = b.loop
        elif e.index.kind == "int" and loop.count is not None and e.index.value >= loop.count and not family:
            raise ResolveError(e.index.offset, f"iteration {e.index.value} of loop '{loop.name}' does not exist "
                               f"(count {loop.count})")
        if loop.dynamic and e.index.kind in ("int", "loop"):
            raise ResolveError(e.index.offset, f"loop '{loop.name}' has a dynamic end: only [-1] or [*] may select its iterations")
        inner = self.resolve_in_body(e.inner, loop.path)
        for member in found[1:] if isinstance(found, tuple) else ():
            # every group of a loop split in time must give what is read through it (a hand-edited plan that
            # renamed one group's output passed here and failed evaluating, an internal error)
            try:
                self.resolve_in_body(e.inner, member.path)
            except ResolveError as exc:
                raise ResolveError(exc.offset, f"{exc.message}, in '{member.name}' (a part of the loop "
                                   f"'{e.loop}' split in time: each part must give what is read through it)",
                                   exc.hint, exc.target) from None
        return IterSelect(loop.path, e.index, index_loop, tuple(inner), family)

    def _find_loop(self, e: IterRef, scope: Scope, pos: float, self_loop: LoopNode | None) -> LoopNode | tuple[LoopNode, ...]:
        """The earlier loop `e` selects iterations of (or, for a loop split in time, its groups)."""
        if self_loop is not None and self_loop.name == e.loop:
            return self_loop
        s: Scope | None = scope
        while s is not None:
            if s.owner.name == e.loop:
                raise ResolveError(e.offset, f"'{e.loop}[...]' selects an iteration of the loop this expression is inside",
                                   f"inside '{e.loop}', use '{e.loop}.<carried value>' to pass values between iterations")
            idx = s.names.get(e.loop)
            if idx is not None:
                target = s.items[idx]
                if not isinstance(target, LoopNode):
                    raise ResolveError(e.offset, f"'{e.loop}' is a node, not a loop: '[...]' selects loop iterations")
                if idx >= pos:
                    raise ResolveError(e.offset, f"loop '{e.loop}' runs later in the same iteration", target=target.path)
                return target
            members = s.groups.get(e.loop)
            if members:
                if any(i >= pos for i, _ in members):
                    raise ResolveError(e.offset, f"loop '{e.loop}' runs later in the same iteration", target=members[0][1].path)
                return tuple(it for _, it in members)
            pos = float(s.index)
            s = s.parent
        raise ResolveError(e.offset, f"unknown loop '{e.loop}'", did_you_mean(e.loop, self.visible(scope)))


def _names(e: Expr) -> Iterator[Ref | IterRef]:
    """The references of an expression, in order (not those inside an iteration reference's inner
    part: that is resolved in the selected loop's body)."""
    match e:
        case Ref() | IterRef():
            yield e
        case _:
            for c in children(e):
                yield from _names(c)


def _owner_ref(e: Ref, owner: LoopNode | ExecutionNode) -> Binding:
    """`loop.i` or `loop.var` inside the loop; `node.input` inside the node's phases."""
    if isinstance(owner, LoopNode):
        if e.attr == "i":
            return LoopIndex(owner.path)
        if owner.carry(e.attr) is not None:
            return CarryIn(owner.path, e.attr)
        known = ["i"] + [c.name for c in owner.carries]
        raise ResolveError(e.offset, f"loop '{owner.name}' has no index or carried value '{e.attr}'",
                           did_you_mean(e.attr, known) or f"inside the loop: {', '.join(f'{owner.name}.{k}' for k in known)}")
    if e.attr in dict(owner.inputs):
        return ParentInput(owner.path, e.attr)
    raise ResolveError(e.offset, f"node '{owner.name}' has no input '{e.attr}' for its phases",
                       did_you_mean(e.attr, dict(owner.inputs)))


def _sibling_ref(e: Ref, target: Item, idx: int, pos: float) -> Binding:
    """`item.port` of an item at position `idx` of the body, read from position `pos`."""
    if idx >= pos:
        raise ResolveError(e.offset, (f"'{e.head}' runs later in the same iteration" if idx > pos else
                                      f"'{e.head}' refers to itself"), target=target.path)
    outs = target.outputs
    if e.attr not in outs:
        what = "loop" if isinstance(target, LoopNode) else "node"
        raise ResolveError(e.offset, f"{what} '{e.head}' has no output '{e.attr}'",
                           did_you_mean(e.attr, outs) or (f"its outputs: {', '.join(outs)}" if outs else f"{what} '{e.head}' has no outputs"))
    return NodePort(target.path, e.attr)


def binding_table(uses: list[Use] | tuple[Use, ...]) -> dict[int, Binding]:
    """id(Ref or IterRef) -> its binding, for every name of a field, inner parts of iteration
    references included. Keyed by object identity: an expression is looked up by the node itself, so
    two equal references in different scopes keep their own bindings."""
    table: dict[int, Binding] = {}
    for u in _all_uses(uses):
        table[id(u.expr)] = u.binding
    return table


class BindingTables:
    """The binding tables of a workflow's fields, each resolved once: the one cache every reader of
    bindings goes through (the evaluator, the analysis, the rewrites; `Resolver.tables`). Evaluating
    every call of two RL iterations reads the same few fields thousands of times; resolving them each
    time was the cost.

    A table is kept per field together with the expression it was made for, and used only for that
    same expression object: a rewrite may ask about a rebuilt copy of an item (same path, new
    expressions), whose references are other objects, so a table keyed by the path alone would miss
    them -- and one keyed by `id(expr)` alone could be handed to a new expression that reuses a freed
    one's id."""

    def __init__(self, resolver: Resolver) -> None:
        self.resolver = resolver
        self._fields: dict[tuple[Path, str], tuple[Expr, dict[int, Binding]]] = {}
        self._bodies: dict[tuple[int, Path], tuple[Expr, dict[int, Binding]]] = {}

    def field(self, item: Item, key: str, expr: Expr) -> dict[int, Binding]:
        """The table of field `key` ("in.obs", "carry.x.next", ...) of `item`, whose expression is `expr`.
        Resolved where the resolver's workflow has an item at `item.path` (a rebuilt copy stands there).
        Raises ResolveError for a field that does not resolve."""
        hit = self._fields.get((item.path, key))
        if hit is not None and hit[0] is expr:
            return hit[1]
        site = self.resolver.items.get(item.path, item)
        table = binding_table(self.resolver.resolve_field(site, key, expr))
        self._fields[item.path, key] = (expr, table)
        return table

    def in_body(self, expr: Expr, loop: Path) -> dict[int, Binding]:
        """The table of `expr` resolved at the end of `loop`'s body (an iteration reference's inner part
        read in one group of a loop split in time)."""
        hit = self._bodies.get((id(expr), loop))
        if hit is not None and hit[0] is expr:
            return hit[1]
        table = binding_table(self.resolver.resolve_in_body(expr, loop))
        self._bodies[id(expr), loop] = (expr, table)
        return table


# -- checks -----------------------------------------------------------------------------------

def _kind(e: Expr, uses: dict[int, Binding]) -> str:
    """'int', 'value' or 'list' (every iteration of a loop, to be stacked or concatenated)."""
    match e:
        case Int():
            return "int"
        case Param():
            return "const"
        case Ref():
            return "int" if isinstance(uses.get(id(e)), LoopIndex) else "value"
        case IterRef(index=ix, inner=inner):
            k = _kind(inner, uses)
            return "list" if ix.kind == "all" else k
        case BinOp() | Neg():
            return "int"
        case Slice():
            return "value"
        case Record() | Call():
            return "value"
    return "value"


def _type_errors(e: Expr, uses: dict[int, Binding], top: str) -> Iterator[tuple[int, str, str | None]]:
    match e:
        case BinOp(left=a, right=b):
            for x in (a, b):
                if _kind(x, uses) in ("value", "list"):
                    yield x.offset, f"arithmetic applies to integers (params, loop indices); '{unparse(x)}' is a value", None
        case Neg(operand=a):
            if _kind(a, uses) in ("value", "list"):
                yield a.offset, "arithmetic applies to integers (params, loop indices)", None
        case Slice(target=t, start=s, stop=p):
            for bound in (s, p):
                if bound is not None and _kind(bound, uses) not in ("int", "const"):
                    yield bound.offset, "slice bounds must be integers", None
            if _kind(t, uses) in ("int", "const"):
                yield t.offset, "only a value (a tensor or record) can be sliced", None
        case Record(fields=fields):
            for _, v in fields:
                if _kind(v, uses) == "list":
                    yield v.offset, "'[*]' gives every iteration: wrap it in stack(...) or cat(...)", None
    if top and _kind(e, uses) == "list":
        yield e.offset, "'[*]' gives every iteration: wrap it in stack(...) or cat(...)", None


@in_bulk
def check_workflow(wf: Workflow) -> list[Diagnostic]:
    """Every cross-reference problem of the IR, positioned. [] means the workflow is well formed."""
    r = Resolver(wf)
    diags, forward, siblings = _check_expressions(r)
    diags += _check_forward(r, forward, siblings)
    diags += _check_scopes(r)
    diags += _check_phases(r)
    diags += _check_idempotent(r)
    diags += _check_deferred(r)
    diags += _check_ahead(r)
    return diags


def _check_ahead(r: Resolver) -> list[Diagnostic]:
    """`ahead:` (a call of the next RL iteration run in this one) on a node directly in the RL iteration body,
    not also deferred, in a workflow whose RL iteration carries nothing (the next iteration's carry is not
    known yet when its call runs ahead)."""
    diags, root = [], r.wf.root
    for item in r.items.values():
        if not isinstance(item, ExecutionNode) or not item.plan.ahead:
            continue
        where, path = item.field_pos.get("ahead", item.pos), format_path(item.src + ("ahead",))
        if item.path[:-1] != root.path or (item.plan.expand and item.phases):
            diags.append(Diagnostic(where, path, f"'ahead' is for a node directly in the RL iteration body "
                                                 f"('{item.name}' is not)"))
        elif item.plan.defer:
            diags.append(Diagnostic(where, path, f"'{item.name}' is both deferred and run ahead"))
        elif root.carries:
            diags.append(Diagnostic(where, path, "'ahead' in a workflow whose RL iteration carries values is not supported"))
    return diags


def _check_deferred(r: Resolver) -> list[Diagnostic]:
    """`defer:` (an asynchronous plan) on a node directly in the RL iteration body whose outputs nothing
    reads and that does not read what the RL iteration carries: its call runs RL iterations later, so
    nothing of its own iteration may wait for it, and a carry of its own iteration is gone by then."""
    deferred = [i for i in r.items.values() if isinstance(i, ExecutionNode) and i.plan.defer]
    if not deferred:
        return []
    diags, root, readers = [], r.wf.root, set()
    for item in r.items.values():
        if isinstance(item, MergeNode):  # a merge reads its groups' outputs in the same iteration
            readers |= {item.path[:-1] + (src,) for src in item.sources}
        for key, expr in expr_fields(item):
            try:
                readers |= {b.node for b in binding_table(r.resolve_field(item, key, expr)).values() if isinstance(b, NodePort)}
            except ResolveError:
                continue  # reported by _check_expressions
    for item in deferred:
        where = item.field_pos.get("defer", item.pos)
        if item.path[:-1] != root.path or (item.plan.expand and item.phases):
            diags.append(Diagnostic(where, format_path(item.src + ("defer",)),
                                    f"'defer' is for a node directly in the RL iteration body ('{item.name}' is not)"))
        elif item.path in readers:
            diags.append(Diagnostic(where, format_path(item.src + ("defer",)),
                                    f"'{item.name}' is deferred but its outputs are read: a deferred call runs "
                                    "RL iterations later"))
        elif root.carries:
            diags.append(Diagnostic(where, format_path(item.src + ("defer",)),
                                    "'defer' in a workflow whose RL iteration carries values is not supported"))
    return diags


_Forward = tuple[Item, str, ResolveError]  # a reference to something that runs later


def _check_expressions(r: Resolver) -> tuple[list[Diagnostic], list[_Forward], dict[int, dict[Path, set[Path]]]]:
    """Resolve and type-check every expression. Returns the problems, the forward references (told
    apart from cycles once every reference is known) and, per body, which sibling each item reads."""
    diags: list[Diagnostic] = []
    forward: list[_Forward] = []
    siblings: dict[int, dict[Path, set[Path]]] = {}  # id(scope) -> item -> the siblings it reads
    for path, item in r.items.items():
        for key, expr in expr_fields(item):
            try:
                uses = r.resolve_field(item, key, expr)
            except ResolveError as exc:
                if exc.target is not None:
                    forward.append((item, key, exc))
                else:
                    diags.append(Diagnostic(_field_pos(item, key, exc.offset), _where(item, key),
                                            f"in '{unparse(expr)}': {exc.message}", exc.hint))
                continue
            bound = binding_table(uses)
            diags += _type_diagnostics(item, key, expr, bound)
            diags += _slice_diagnostics(item, key, expr, r.wf.params, bound, r.items)
            if path != r.wf.root.path:
                scope = r.scope_of[path][0]
                for u in uses:
                    if isinstance(u.binding, NodePort) and r.scope_of.get(u.binding.node, (None,))[0] is scope:
                        siblings.setdefault(id(scope), {}).setdefault(path, set()).add(u.binding.node)
    return diags, forward, siblings


def _slice_diagnostics(item: Item, key: str, expr: Expr, params: dict[str, Any],
                       bound: Mapping[int, Binding] | None = None, items: Mapping[Path, Item] | None = None) -> list[Diagnostic]:
    """Row slices whose bounds are static (integers and params): a bound that does not evaluate (`// 0`),
    a stop before its start (no rows; a negative bound counts from the end), and -- for a slice of a
    node's output whose batch is dim 0 with a declared size -- a start or stop past that size (Python's
    slicing would silently take fewer rows). They passed validation and failed inside a component, or ran
    on other rows than written (user-error sweep)."""
    from .build import ParamError, eval_int

    out = []
    for x in walk(expr):
        if not isinstance(x, Slice):
            continue
        bounds: list[int | None] = []
        for b in (x.start, x.stop):
            if b is None or not all(isinstance(y, Int | Param | BinOp | Neg) for y in walk(b)):
                bounds.append(None)
                continue
            try:
                bounds.append(eval_int(b, params))
            except ParamError as exc:
                out.append(Diagnostic(_field_pos(item, key, exc.offset), _where(item, key),
                                      f"in '{unparse(expr)}': a slice bound: {exc.message}", exc.hint))
                bounds.append(None)
        start, stop = bounds
        if start is not None and stop is not None and 0 <= stop < start:  # (a negative bound counts from the end)
            out.append(Diagnostic(_field_pos(item, key, x.offset), _where(item, key),
                                  f"in '{unparse(expr)}': rows {start}:{stop} are no rows (the stop is before the "
                                  "start)"))
            continue
        producer = _declared_rows(x.target, bound, items)
        if producer is not None:
            name, size = producer
            past = [b for b in (start, stop) if b is not None and b > size]
            if past:
                out.append(Diagnostic(_field_pos(item, key, x.offset), _where(item, key),
                                      f"in '{unparse(expr)}': row {past[0]} is past the {size} rows '{name}' declares "
                                      f"(batch: {{dim: 0, size: {size}}})",
                                      f"rows of '{name}' are 0 to {size}; a negative bound counts from the end"))
    return out


def _declared_rows(target: Expr, bound: Mapping[int, Binding] | None,
                   items: Mapping[Path, Item] | None) -> tuple[str, int] | None:
    """(node name, rows) when `target` is a node's output whose batch is dim 0 with a declared size."""
    if bound is None or items is None or not isinstance(target, Ref):
        return None
    b = bound.get(id(target))
    node = items.get(b.node) if isinstance(b, NodePort) else None
    if isinstance(node, ExecutionNode) and node.batch == 0 and node.batch_size is not None:
        return node.name, node.batch_size
    return None


def _type_diagnostics(item: Item, key: str, expr: Expr, bound: dict[int, Binding]) -> list[Diagnostic]:
    if type(expr) is Ref:
        return []  # most inputs: a reference alone is always well typed
    out = []
    collect = key.startswith("collect")
    for x in walk(expr):
        for off, msg, hint in _type_errors(x, bound, "top" if x is expr and not collect else ""):
            out.append(Diagnostic(_field_pos(item, key, off), _where(item, key), f"in '{unparse(expr)}': {msg}", hint))
    if isinstance(item, LoopNode) and collect and _kind(expr, bound) == "list":
        out.append(Diagnostic(_field_pos(item, key), _where(item, key),
                              "'[*]' gives every iteration: wrap it in stack(...) or cat(...)"))
    return out


def _check_forward(r: Resolver, forward: list[_Forward], siblings: dict[int, dict[Path, set[Path]]]) -> list[Diagnostic]:
    """A reference to an item that runs later: reported as the cycle among siblings if there is one
    (`act -> env -> act`), else as "runs later"."""
    diags = []
    for item, key, exc in forward:
        pos = _field_pos(item, key, exc.offset)
        scope = r.scope_of[item.path][0] if item.path in r.scope_of else None
        cycle = _cycle(item.path, exc.target, siblings.get(id(scope), {})) if scope is not None and exc.target else None
        if cycle:
            names = " -> ".join(p[-1] for p in cycle)
            diags.append(Diagnostic(pos, _where(item, key), f"cyclic data dependency: {names}",
                                    "a value cannot depend on itself within one iteration; carry it across iterations with a loop 'carry'"))
        else:
            diags.append(Diagnostic(pos, _where(item, key), f"in '{unparse(dict(expr_fields(item))[key])}': {exc.message}",
                                    "an item may only read items that run before it; move it earlier or reorder the body"))
    return diags


def _field_pos(item: Item, key: str, offset: int = 0) -> SourcePos:
    return (item.field_pos.get(key) or item.pos).at(offset)


def _where(item: Item, key: str) -> str:
    return format_path(item.src + tuple(key.split("."))) if item.src else ".".join(item.path) + "." + key


def _check_idempotent(r: Resolver) -> list[Diagnostic]:
    """A call may be retried only if running it twice is the same as running it once: no state update."""
    diags = []
    for item in r.items.values():
        if isinstance(item, ExecutionNode) and item.idempotent:
            for eff in item.effects:
                if eff.access is Access.UPDATE:
                    where = format_path(item.src + ("idempotent",)) if item.src else ".".join(item.path)
                    diags.append(Diagnostic(item.field_pos.get("state", item.pos), where,
                                            f"node '{item.name}' is declared idempotent but updates '{eff.state}': "
                                            "a retry would apply the update twice",
                                            "only calls that read or refresh state may be retried"))
    return diags


def _all_uses(uses: list[Use] | tuple[Use, ...]) -> Iterator[Use]:
    for u in uses:
        yield u
        if isinstance(u.binding, IterSelect):
            yield from _all_uses(u.binding.inner)


def _cycle(start: Path, target: Path, edges: dict[Path, set[Path]]) -> list[Path] | None:
    """A path target -> ... -> start through sibling references, closed into a cycle, if one exists."""
    stack, seen = [(target, [start, target])], {target}
    while stack:
        node, trail = stack.pop()
        for nxt in edges.get(node, ()):
            if nxt == start:
                return trail + [start]
            if nxt not in seen:
                seen.add(nxt)
                stack.append((nxt, trail + [nxt]))
    return None


def check_reserved_names(wf: Workflow) -> list[Diagnostic]:
    """A name ending in `@N` is the rewrites' spelling of a split group or a component copy, so only a plan
    (a file with `plan:`; the loader asks this of every file it loads, the rewrites of nothing) may hold one: in a workflow, `act@0` would collide with the first group of a split
    of `act`, and a split of `act@1` would need the name `act@1@0`. (Identity never comes from the names:
    `rose_dsl.measurement`; this keeps the names free for the rewrites.)"""
    if wf.plan is not None or any(c.copy_of for c in wf.components.values()) or any(
            isinstance(i, ExecutionNode | LoopNode) and i.plan != type(i.plan)() for i in wf.items()):
        return []  # a plan: `plan:`, or fields only the rewrites write (a plan file edited by hand)
    diags = []
    for c in wf.components.values():
        if "@" in c.name:
            diags.append(Diagnostic(c.pos, f"components.{c.name}", _RESERVED.format(c.name),
                                    f"rename it, e.g. '{c.name.replace('@', '_')}'"))
    for item in wf.items():
        if "@" in item.name and item.path != wf.root.path:
            key = ("node",) if isinstance(item, ExecutionNode) else ("loop",) if isinstance(item, LoopNode) else ()
            diags.append(Diagnostic(item.pos, format_path(item.src + key) if item.src else ".".join(item.path),
                                    _RESERVED.format(item.name), f"rename it, e.g. '{item.name.replace('@', '_')}'"))
    return diags


_RESERVED = ("'{}': a name ending in '@N' is kept for the copies the rewrites make (a plan's split groups and "
             "component copies); a workflow may not use one")


def _check_scopes(r: Resolver) -> list[Diagnostic]:
    diags = []
    for scope in r.body_scope.values():
        seen: dict[str, Item] = {}
        for i, item in enumerate(scope.items):
            if item.name in seen:
                diags.append(Diagnostic(item.pos, format_path(item.src) if item.src else ".".join(item.path),
                                        f"duplicate name '{item.name}' in this body",
                                        related=((seen[item.name].pos, "first defined here"),)))
            seen.setdefault(item.name, item)
            if item.name == scope.owner.name:
                diags.append(Diagnostic(item.pos, format_path(item.src), f"'{item.name}' has the name of the "
                                        f"{'loop' if isinstance(scope.owner, LoopNode) else 'node'} it is inside"))
            for name in item.after:
                j = scope.names.get(name)
                if j is None:
                    diags.append(Diagnostic(item.field_pos.get("after", item.pos), format_path(item.src + ("after",)),
                                            f"'after: {name}' names no item of this body", did_you_mean(name, scope.names)))
                elif j == i:
                    diags.append(Diagnostic(item.field_pos.get("after", item.pos), format_path(item.src + ("after",)),
                                            f"'{item.name}' cannot run after itself"))
                elif j > i:  # program order runs it first: the constraint could never hold
                    diags.append(Diagnostic(item.field_pos.get("after", item.pos), format_path(item.src + ("after",)),
                                            f"'after: {name}' names a sibling that runs later; move '{item.name}' "
                                            f"below it (rewire) instead"))
            if isinstance(item, MergeNode):
                for name in item.sources:
                    j = scope.names.get(name)
                    if j is None or j >= i:
                        diags.append(Diagnostic(item.field_pos.get("from", item.pos), format_path(item.src + ("from",)),
                                                f"merge source '{name}' is not an earlier item of this body",
                                                did_you_mean(name, scope.names)))
                    elif not set(dict(item.ports)) <= set(scope.items[j].outputs):
                        missing = sorted(set(dict(item.ports)) - set(scope.items[j].outputs))
                        diags.append(Diagnostic(item.field_pos.get("ports", item.pos), format_path(item.src + ("ports",)),
                                                f"merge source '{name}' has no output {', '.join(map(repr, missing))}"))
    return diags


def _check_phases(r: Resolver) -> list[Diagnostic]:
    diags = []
    for path, item in r.items.items():
        if not isinstance(item, ExecutionNode) or not item.phases:
            continue
        where = format_path(item.src + ("phases",)) if item.src else ".".join(path)
        pos = item.field_pos.get("phases", item.pos)
        parent = {e.state: e.access for e in item.effects}
        first: dict[str, Access] = {}
        writes: set[str] = set()
        for sub in item.phases:
            for node in _exec_nodes(sub):
                for eff in node.effects:
                    first.setdefault(eff.state, eff.access)
                    if eff.access.writes:
                        writes.add(eff.state)
        for state in sorted(set(parent) | set(first)):
            if state not in first:
                diags.append(Diagnostic(pos, where, f"node '{item.name}' declares '{state}: {parent[state].value}' but its phases never access it"))
            elif state not in parent:
                diags.append(Diagnostic(pos, where, f"the phases of '{item.name}' access '{state}', which '{item.name}' does not declare",
                                        "phases must have the same effects as the node"))
            elif (parent[state] is Access.READ) != (state not in writes) or (
                    (parent[state] is Access.REFRESH) != (first[state] is Access.REFRESH)):
                diags.append(Diagnostic(pos, where, f"the phases of '{item.name}' access '{state}' differently "
                                        f"from the node's '{parent[state].value}'", "phases must have the same effects as the node"))
        produced = {o for sub in item.phases for o in sub.outputs}
        for out in item.outputs:
            if out not in produced:
                diags.append(Diagnostic(pos, where, f"no phase of '{item.name}' produces its output '{out}'",
                                        "the last phase item with an output of that name provides it"))
    return diags


def _exec_nodes(item: Item) -> Iterator[ExecutionNode]:
    for x in iter_items(item):
        if isinstance(x, ExecutionNode):
            yield x
