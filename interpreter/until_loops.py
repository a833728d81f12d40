"""Loops that end on a condition (`until:`), as the schedule runs them.

A static loop unrolls into calls before anything runs; a loop that ends on a condition cannot: after each
trip the driver needs the condition's value. So the schedule, while it submits an iteration's calls in
program order, stops after each trip of such a loop, fetches the values the condition reads (the only
wait for data the driver does), and decides (docs/language.md, `until`):

* a loop that ends **as a whole** (some call in its body declares no batch) runs trips until the
  condition holds for every row, at most `count`; `loop[*]` is the trips that ran;
* a loop that ends **per row** (`rose_dsl.until.whole_reason`: every call in its body declares `batch:`) keeps, per
  row, whether it is done (its flag held after some trip; it stays done). A trip after some rows are done
  gives each call only the rows not yet done (`recipe.Take` of every input, the rows as `rows=` to a
  method that takes them) and the call's worker puts the new rows into its previous full outputs
  (`values.hold`), so every value the driver hands on has all rows and a done row keeps its last values.
  The loop ends when every row is done or after `count` trips; either way it has `count` iterations seen
  from outside -- `loop[*]` is `count` values, and the trips not run are the last trip's values (every row
  was done by then) -- so its outputs have the same shape whatever its rows' lengths, and a split of its
  rows into groups that each end on their own gives the same values;
* a per-row loop inside a per-row loop (a decode loop inside an agent's turn loop) starts with the rows
  the outer loop has done already done, and a row done in the outer loop keeps, in every call inside it,
  that call's values of the outer loop's previous trip (`recipe.Put`): seen from outside, a done row's
  turn repeats its last turn whole, as in the flat case.

Nothing here touches data except the condition's value, which is small (one flag per row).
"""

from __future__ import annotations

from collections.abc import Callable, MutableMapping
from typing import Any

from rose_dsl.expr import Expr
from rose_dsl.expr import Record as ExprRecord
from rose_dsl.ir import ExecutionNode, LoopNode
from rose_dsl.semantics import CallSite, Frame, Invocation, Program
from rose_dsl.until import input_dims, whole_reason

from .recipe import HELD, LIVE_ROWS, Const, Put, Recipe, Record, Ref, Seq, Take, evaluate, lift, number_leaves

__all__ = ["UntilLoops", "ConditionError", "live_inputs", "keep_done_rows"]

Path = tuple[str, ...]


class ConditionError(ValueError):
    """A loop's condition gave a value that is not a done flag per row: a workflow mistake (the `until:` points
    at the wrong output) found when the value first exists. `diagnostics` say where (the CLI exits 2)."""

    def __init__(self, loop: LoopNode, message: str, hint: str) -> None:
        from rose_dsl.errors import Diagnostic, format_path

        super().__init__(message)
        where = format_path(loop.src + ("until",)) if loop.src else ".".join(loop.path) + ".until"
        self.diagnostics = [Diagnostic(loop.field_pos.get("until", loop.pos), where, message, hint)]


class UntilLoops:
    """The state of the loops that end on a condition in one RL iteration being scheduled: `reached` is the
    semantics' `until_reached` (called after each trip), `narrow` adds the rows to a call of a trip after
    some rows are done. `handles`/`component` are the schedule's: ended per-row loops alias their trips
    not run to their last trip there."""

    def __init__(self, program: Program, frame: Frame, handles: MutableMapping[Invocation, tuple[Any, ...]],
                 component: MutableMapping[Invocation, str], fetch: Callable[[Any], Any], k: Any) -> None:
        self.program, self.frame, self.handles, self.component = program, frame, handles, component
        self.fetch, self.k = fetch, k
        self.done: dict[tuple[Path, tuple[int, ...]], Any] = {}  # per loop instance: a [N] bool tensor
        self.trips: dict[Path, int] = {}  # trips run by each loop's last instance (for the trace, tests)
        self._dims: dict[int, int | None | str] = {}  # per input expression of a body call: the dimension of its rows
        self._per_row: dict[Path, bool] = {}
        self.aliases: dict[Invocation, Invocation] = {}  # a trip not run -> the last trip run (per-row loops)

    def condition(self, loop: LoopNode, ctx: dict[Path, int]) -> Any:
        """The value of the loop's condition after trip ctx[loop]: its producers' values fetched."""
        raw = self.program.condition(loop, ctx, self.frame)
        ((_, recipe),), handles = number_leaves([("until", lift(raw))])
        return evaluate(recipe, [self.fetch(h) for h in handles], None, self.k)

    def reached(self, loop: LoopNode, ctx: dict[Path, int]) -> bool:
        """Whether the loop ends after trip ctx[loop] (the semantics asks after every trip)."""
        from .values import TorchOps, row_flags

        key = (loop.path, self.program.indices_of(loop.path, ctx))
        j = ctx[loop.path]
        value = self.condition(loop, ctx)
        _check_flags(loop, value)
        self.trips[loop.path] = j + 1
        if not self.per_row(loop):
            self.frame.dynamic_ran.setdefault(key, []).append(j)
            return TorchOps().truth(value)
        _check_rows(loop, value)
        flags = row_flags(value)
        _check_row_count(loop, flags.shape[0])
        before = self.done.get(key)
        if before is None:  # a loop inside a per-row loop: the rows done there are done here from the start
            before = self._done_around(loop.path, key[1])
        if before is not None and before.shape != flags.shape:
            raise ConditionError(loop, f"the condition of loop '{loop.name}' gave {flags.shape[0]} row flag(s) after "
                                 f"trip {j}, {before.shape[0]} before", "it must give one flag per row of the loop's "
                                 "batch, every trip (a call in the body that returns a different row count?)")
        done = flags if before is None else before | flags
        self.done[key] = done
        if j + 1 < (loop.count or 0) and not bool(done.all()):
            return False
        self._end(loop, key, j)
        return True

    def _end(self, loop: LoopNode, key: tuple[Path, tuple[int, ...]], last: int) -> None:
        """A per-row loop ended after trip `last`: seen from outside it ran `count` iterations, those not run
        being the last trip's values (every call inside it, a per-row loop's inside it included)."""
        count = loop.count or 0
        self.frame.dynamic_ran[key] = list(range(count))
        prefix = key[1]
        for path, suffixes in _calls_inside(loop):
            for rest in suffixes:
                ran = Invocation(path, prefix + (last,) + rest)
                for j in range(last + 1, count):
                    alias = Invocation(path, prefix + (j,) + rest)
                    self.handles[alias] = self.handles[ran]
                    self.component[alias] = self.component[ran]
                    self.aliases[alias] = ran
        for inner, suffixes in _loops_inside(loop):
            for rest in suffixes:
                ran_key = prefix + (last,) + rest
                for j in range(last + 1, count):
                    self.frame.dynamic_ran[(inner, prefix + (j,) + rest)] = self.frame.dynamic_ran[(inner, ran_key)]
        self.done.pop(key, None)

    def _per_row_around(self, path: Path) -> list[LoopNode]:
        """The per-row loops around the item at `path`, innermost first (up to the first that is not one)."""
        out = []
        at = path[:-1]
        while isinstance(loop := self.program.items.get(at), LoopNode) and loop.dynamic and self.per_row(loop):
            out.append(loop)
            at = at[:-1]
        return out

    def _done_around(self, path: Path, indices: tuple[int, ...]) -> Any:
        """The rows done in the per-row loops around the item at `path` (of the instance `indices` names: the
        indices of the loops around that item), or None when it is in none or none has ended a row yet."""
        for loop in self._per_row_around(path):
            done = self.done.get((loop.path, indices[:len(loop.path) - 1]))
            if done is not None:
                return done
        return None

    def narrow(self, site: CallSite, ports: list[tuple[str, Recipe]]) -> list[tuple[str, Recipe]]:
        """A call's inputs (recipes over handles), given only the rows not yet done when it runs in a trip of a
        per-row loop after some rows are done, with those rows and the outputs its done rows keep: its
        previous trip's, or, for rows done in an enclosing per-row loop, its call of that loop's previous trip
        (a row done in a turn loop keeps every value of its last turn, those of the decode loop inside it too)."""
        node = site.node
        idx = site.inv.indices
        done = self._done_around(node.path, idx)
        if done is None or not bool(done.any()):
            return ports
        assert isinstance(node, ExecutionNode)
        rows = tuple(done.logical_not().nonzero().flatten().tolist())
        dim = node.batch or 0
        held: list[Recipe] | None = None
        for loop in self._per_row_around(node.path):  # innermost first: an enclosing loop's rows overwrite
            at = len(loop.path) - 1
            own = self.done.get((loop.path, idx[:at]))
            if own is None or idx[at] == 0 or not bool(own.any()):
                continue
            previous = self.handles[Invocation(node.path, idx[:at] + (idx[at] - 1,) + idx[at + 1:])]
            refs = [Ref(h) for h in previous[:len(node.outputs)]]
            if held is None:
                held = list(refs)
            else:
                kept = tuple(own.nonzero().flatten().tolist())
                held = [Put(h, r, kept, dim) for h, r in zip(held, refs, strict=True)]
        assert held is not None, "a done row was made done by a trip before this one"
        inputs = dict(node.inputs)
        taken = [(port, self._take(node, f"in.{port}", inputs[port], r, rows)) for port, r in ports]
        return taken + [(LIVE_ROWS, Const(rows)), (HELD, Seq(tuple(held)))]

    def _take(self, node: ExecutionNode, key: str, expr: Expr, recipe: Recipe, rows: tuple[int, ...]) -> Recipe:
        """The rows of one input (a record field by field): along the dimension the analysis says holds the
        loop's rows (`rose_dsl.until.input_dims`; none for an integer, the same for every row)."""
        if isinstance(expr, ExprRecord) and isinstance(recipe, Const) and isinstance(recipe.value, dict):
            recipe = Record(tuple((name, lift(v)) for name, v in recipe.value.items()))  # (a concrete record)
        if isinstance(expr, ExprRecord) and isinstance(recipe, Record):
            fields = dict(expr.fields)
            return Record(tuple((name, self._take(node, key, fields[name], r, rows)) for name, r in recipe.fields))
        if id(expr) not in self._dims:
            port = key.removeprefix("in.")
            self._dims.update(input_dims(self.program.resolver, node, port, dict(node.inputs)[port]))
        dim = self._dims[id(expr)]
        assert not isinstance(dim, str), "a loop whose inputs' rows are unknown ends as a whole"
        return recipe if dim is None else Take(recipe, rows, dim)

    def per_row(self, loop: LoopNode) -> bool:
        if loop.path not in self._per_row:
            self._per_row[loop.path] = whole_reason(self.program.resolver, loop) is None
        return self._per_row[loop.path]


def _calls_inside(loop: LoopNode) -> list[tuple[Path, list[tuple[int, ...]]]]:
    """Every call inside a per-row loop's body with the indices of the loops between it and the loop
    (a per-row loop's body holds calls and per-row loops, each of `count` iterations seen from outside)."""
    out: list[tuple[Path, list[tuple[int, ...]]]] = []
    for item in loop.body:
        if isinstance(item, LoopNode):
            out += [(path, [(j,) + rest for j in range(item.count or 0) for rest in suffixes])
                    for path, suffixes in _calls_inside(item)]
        else:
            out.append((item.path, [()]))
    return out


def _loops_inside(loop: LoopNode) -> list[tuple[Path, list[tuple[int, ...]]]]:
    """Likewise every loop inside it, with the indices between (its own excluded)."""
    out: list[tuple[Path, list[tuple[int, ...]]]] = []
    for item in loop.body:
        if isinstance(item, LoopNode):
            out.append((item.path, [()]))
            out += [(path, [(j,) + rest for j in range(item.count or 0) for rest in suffixes])
                    for path, suffixes in _loops_inside(item)]
    return out


def _check_flags(loop: LoopNode, value: Any) -> None:
    """A condition is a done flag: bool, or 0/1 values of any real dtype (a mask; many environments return
    `done` as a float). Anything else is refused: the truth of a log-prob or a token id (nonzero) ending a
    loop is almost always a condition pointed at the wrong output."""
    import torch

    try:
        t = torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError):
        t = None
    if t is not None and (t.dtype == torch.bool or (not t.dtype.is_complex and bool(((t == 0) | (t == 1)).all()))):
        return
    found = f"a value of type {type(value).__name__}" if t is None else f"values other than 0 and 1 ({t.dtype})"
    raise ConditionError(loop, f"the condition of loop '{loop.name}' gave {found}, not a done flag",
                         "point `until:` at an output that is a flag -- bool or 0/1 values, one per row of the "
                         "loop's batch or one for all rows -- e.g. a comparison computed in the body")


def _check_rows(loop: LoopNode, value: Any) -> None:
    """A loop that ends per row needs a flag per row: a value without a row dimension (one flag for all rows)
    would end it as a whole, and a split of it into row groups (`split-chain`, which trusts an output of a
    call that declares `batch:` to hold its rows) would end each group on its own rows' flag instead --
    another result, silently. So it stops the run at the `until:` (exit 2), like a condition that is not a flag."""
    import torch

    if torch.as_tensor(value).dim() > 0:
        return
    raise ConditionError(loop, f"the condition of loop '{loop.name}' gave one flag for all rows (a value without a "
                         "row dimension), but the loop ends per row (every call in its body declares batch:)",
                         "give one flag per row of the loop's batch (the loop then ends when every row is done, and "
                         "a done row is no longer computed); one flag for all rows is for a loop that ends as a "
                         "whole (some call in its body declares no batch:)")


def _check_row_count(loop: LoopNode, flags: int) -> None:
    """A loop that ends per row needs one flag for each row of its batch (the rows its calls declare): fewer
    flags (`gen.eos[0:2]`) froze the rows without one while they were not done, more handed the calls rows
    they do not have -- a wrong result, or a component's IndexError blamed on the component."""
    for item in loop.body:
        if not isinstance(item, ExecutionNode) or item.batch is None:
            continue
        rows = item.plan.rows[1] - item.plan.rows[0] if item.plan.rows else item.batch_size
        if rows is None or rows == flags:
            continue
        raise ConditionError(loop, f"the condition of loop '{loop.name}' gave {flags} row flag(s), but the loop ends "
                             f"per row and its call '{item.name}' has {rows} rows (batch: size)",
                             "give one flag per row of the loop's batch: an output of a call in the body, e.g. "
                             "`until: STEP.done`, not a slice or concatenation of one")


def live_inputs(recipe: Any, inputs: dict[str, Any]) -> tuple[Any, Any]:
    """Take the rows and the held outputs `narrow` added out of a call's evaluated inputs: (rows as a
    LongTensor, previous full outputs), or (None, None) for a call that computes every row."""
    if not recipe or recipe[-1][0] != HELD:
        return None, None
    import torch

    return torch.as_tensor(inputs.pop(LIVE_ROWS), dtype=torch.long), inputs.pop(HELD)


def keep_done_rows(node: ExecutionNode, outs: dict[str, Any], live: Any, held: Any) -> dict[str, Any]:
    """A narrowed call's outputs as full values: the previous trip's with the computed rows replaced."""
    from .values import hold

    return {o: hold(held[n], outs[o], live, node.batch or 0) for n, o in enumerate(node.outputs)}

