"""Document -> IR: params substituted, expressions parsed, nodes and loops built with positions.

This stage checks what is local to one field (an expression's syntax, a count's value, a state
object's owner). Cross-references (which node a `node.port` names, program order, cycles, phases'
effects) are checked by `resolve.py` on the finished IR, so that transformed plans get the same checks.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from .bulk import in_bulk
from .errors import Diagnostic, SourcePos, WorkflowError, did_you_mean, format_path, shown
from .expr import MAX_INT, BinOp, Expr, ExprSyntaxError, Int, Neg, Param, parse_expr, walk
from .identity import StateKey
from .ir import (
    Access,
    Carry,
    Component,
    ExecutionNode,
    Item,
    LoopNode,
    LoopPlan,
    MergeNode,
    NodePlan,
    StateEffect,
    StateObject,
    Workflow,
    iter_items,
)
from .loader import Document, FieldPositions, Path_
from .schema import check_schema, describe_value

__all__ = ["build_workflow", "eval_int", "substitute"]

MAX_COUNT = 10_000_000


@dataclass
class _Ctx:
    doc: Document
    params: dict[str, Any] = field(default_factory=dict)
    diags: list[Diagnostic] = field(default_factory=list)
    later: set[str] = field(default_factory=set)  # while params are read: those not defined yet

    def error(self, path: Path_, message: str, hint: str | None = None, *, key: bool = False,
              offset: int = 0) -> None:
        pos = self.doc.key_pos(path) if key else self.doc.pos(path).at(offset)
        self.diags.append(Diagnostic(pos, format_path(path), message, hint))

    def expression(self, path: Path_, text: Any) -> Expr | None:
        """A value expression of the body (`in:`, `until:`, a carry, a `collect:`): parsed, and every `${name}`
        in it a defined param. (It was checked only where params are evaluated when the file is read --
        counts, args --, so `in: {x: "iteration.i * ${k}"}` without `k` validated and raised KeyError when
        the graph was built; found by tests/cli/test_fuzz.py.)"""
        expr = self.parse(path, text)
        if expr is None:
            return None
        missing = [x for x in walk(expr) if isinstance(x, Param) and x.name not in self.params]
        for x in missing:
            self.error(path, f"undefined param '{x.name}'", did_you_mean(x.name, self.params) or
                       (f"defined params: {', '.join(sorted(self.params))}" if self.params else
                        "the workflow defines no params"), offset=x.offset)
        return None if missing else expr

    def parse(self, path: Path_, text: Any) -> Expr | None:
        if text is FAILED:  # a param refused where it is defined, read through `${name}`: said there
            return None
        if isinstance(text, float) and text.is_integer():  # `count: 2.0` (JSON Schema's integer): 2
            text = int(text)
        if isinstance(text, bool) or not isinstance(text, int | str):
            self.error(path, f"expected an integer or a `${{...}}` expression; found {describe_value(text)}")
            return None
        if isinstance(text, int):
            return Int(0, text)
        try:
            return parse_expr(text)
        except ExprSyntaxError as exc:
            shown = text if len(text) <= 120 else text[:100] + f"... ({len(text)} characters)"
            self.error(path, f"in expression {shown!r}: {exc.message}", offset=exc.offset)
            return None


class _ParamError(Exception):
    def __init__(self, offset: int, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.offset, self.message, self.hint = offset, message, hint


ParamError = _ParamError  # what `eval_int` raises, for the stages that evaluate static expressions too


class _Reported(_ParamError):
    """A use of a param whose own value was already refused (at the param): not reported again."""


class _FailedParam:
    """The value of a param whose `${...}` (or `--set` value) was refused where it is defined: its uses
    say nothing more (a cycle, `// 0` or `--set n=abc` gave one message per use of it as well)."""

    def __repr__(self) -> str:
        return "<refused above>"


FAILED = _FailedParam()


def eval_int(e: Expr, params: Mapping[str, Any]) -> int:
    """Evaluate integer arithmetic over params. Raises _ParamError for anything else."""
    match e:
        case Int(value=v):
            return v
        case Param(name=n):
            if n not in params:
                raise _ParamError(e.offset, f"undefined param '{n}'", did_you_mean(n, params) or
                                  (f"defined params: {', '.join(sorted(params))}" if params else "the workflow defines no params"))
            v = params[n]
            if v is FAILED:
                raise _Reported(e.offset, f"param '{n}' was refused where it is defined")
            if isinstance(v, bool) or not isinstance(v, int):
                raise _ParamError(e.offset, f"param '{n}' is {v!r}, not an integer")
            return v
        case Neg(operand=a):
            return -eval_int(a, params)
        case BinOp(op=op, left=a, right=b):
            x, y = eval_int(a, params), eval_int(b, params)
            if op in ("//", "%") and y == 0:
                raise _ParamError(e.offset, "division by zero")
            result = {"+": x + y, "-": x - y, "*": x * y, "//": x // y if y else 0, "%": x % y if y else 0}[op]
            if abs(result) > MAX_INT:
                raise _ParamError(e.offset, "integer overflow")
            return result
    raise _ParamError(e.offset, "expected integer arithmetic over ${params}")


def substitute(value: Any, path: Path_, ctx: _Ctx) -> Any:
    """Replace `${...}` in constructor args. A string that is exactly `${name}` takes the param's value
    and type; other strings holding `${` are integer expressions; everything else is literal."""
    if isinstance(value, dict):
        return {k: substitute(v, path + (k,), ctx) for k, v in value.items()}
    if isinstance(value, list):
        return [substitute(v, path + (i,), ctx) for i, v in enumerate(value)]
    if isinstance(value, str) and "${" in value:
        expr = ctx.parse(path, value)
        if expr is None:
            return value
        later = next((x for x in walk(expr) if isinstance(x, Param) and x.name in ctx.later), None)
        if later is not None:  # a param defined below the one that reads it, or itself (it was "undefined")
            what = ("refers to itself" if path == ("params", later.name) else "is defined after this one")
            ctx.error(path, f"param '{later.name}' {what}: a param may use only the params above it",
                      offset=later.offset)
            return value
        if isinstance(expr, Param):
            if expr.name in ctx.params:
                return ctx.params[expr.name]
            ctx.error(path, f"undefined param '{expr.name}'", did_you_mean(expr.name, ctx.params), offset=expr.offset)
            return value
        try:
            return eval_int(expr, ctx.params)
        except _Reported:
            return value
        except _ParamError as exc:
            ctx.error(path, exc.message, exc.hint, offset=exc.offset)
            return value
    return value


_KIND_NAMES = {"int": "a number", "float": "a number", "bool": "a boolean"}
_ACCEPTS = {"int": {"int", "float"}, "float": {"int", "float"}, "bool": {"bool"}}  # (an int param may be read as a float)


def _kind(value: Any) -> str | None:
    """A declared param's kind, where --set must keep it: numbers and booleans (a string may hold an
    expression or any text, so another kind given for it is the user's choice)."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    return None


def _unusable_number(value: Any) -> str | None:
    """Why a param's number cannot be used (None: it can). NaN and infinity pass every comparison a
    component makes (`fixed_ms: .nan` validated, then slept for nothing or forever); an integer past
    MAX_INT is past every count and index rose takes, and past what Python turns into text."""
    if isinstance(value, float) and not math.isfinite(value):
        return f"{value} is not a finite number: a param holds a finite one (write a large number for 'no limit')"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INT:
        return f"{shown(value)} is too large (at most {MAX_INT})"
    return None


def _params(ctx: _Ctx, raw: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    params: dict[str, Any] = {}
    names = list(raw)
    for i, (name, value) in enumerate(raw.items()):
        ctx.later = set(names[i:])  # (this param and those below it: what it may not read)
        if name in overrides:
            params[name] = overrides[name]
            kind = _kind(value)
            if kind is not None and _kind(overrides[name]) not in _ACCEPTS[kind]:
                # a number (or boolean) param given another kind by --set: refused here, at the command line,
                # not left to a component's constructor (fourth unseen sweep: `--set pi_fixed=fast` passed
                # validate and failed at construction with exit 3, naming neither --set nor the param)
                params[name] = FAILED
                ctx.diags.append(Diagnostic(
                    SourcePos("<command line>", 0, 0), f"params.{name}",
                    f"--set {name}={shown(overrides[name])} is not {_KIND_NAMES[kind]}: the workflow declares "
                    f"{name}: {shown(value)}"))
            elif not isinstance(overrides[name], bool | int | float | str):
                # a list, a mapping or null, which the schema refuses in the file's `params:`; a param declared as
                # text took it from --set (`--set task='- 1'` validated; found by tests/cli/test_fuzz.py)
                params[name] = FAILED
                ctx.diags.append(Diagnostic(
                    SourcePos("<command line>", 0, 0), f"params.{name}",
                    f"--set {name}={shown(overrides[name])} is not a param's value: a param holds a number, a string "
                    f"or a boolean (the workflow declares {name}: {shown(value)}); quote text that YAML reads "
                    f"otherwise (--set {name}=\"'...'\")"))
            elif (why := _unusable_number(overrides[name])) is not None:
                params[name] = FAILED
                ctx.diags.append(Diagnostic(SourcePos("<command line>", 0, 0), f"params.{name}",
                                            f"--set {name}: {why}"))
            continue
        if (why := _unusable_number(value)) is not None:
            ctx.error(("params", name), why)
            params[name] = FAILED
            continue
        if isinstance(value, str) and "${" in value:
            ctx.params = params  # a param may use the params defined before it
            before = len(ctx.diags)
            params[name] = substitute(value, ("params", name), ctx)
            if len(ctx.diags) > before:  # refused here: its uses say nothing more
                params[name] = FAILED
        else:
            params[name] = value
    ctx.later = set()
    for name, value in overrides.items():
        if name not in raw:
            ctx.diags.append(Diagnostic(SourcePos("<command line>", 0, 0), f"params.{name}",
                                        f"--set names an undefined param '{name}'", did_you_mean(name, raw)))
        params.setdefault(name, value)
    return params


def _count(ctx: _Ctx, path: Path_, raw: Any) -> int | None:
    if isinstance(raw, bool):
        ctx.error(path, "a count must be an integer, found a boolean")
        return None
    expr = ctx.parse(path, raw)
    if expr is None:
        return None
    bad = next((x for x in walk(expr) if not isinstance(x, Int | Param | BinOp | Neg)), None)
    if bad is not None:
        ctx.error(path, "a count must be static: integer arithmetic over ${params}", offset=bad.offset,
                  hint="for a loop that ends on a condition, use 'until:'")
        return None
    try:
        value = eval_int(expr, ctx.params)
    except _Reported:
        return None
    except _ParamError as exc:
        ctx.error(path, exc.message, exc.hint, offset=exc.offset)
        return None
    if value < 0:
        ctx.error(path, f"a count must not be negative; found {value}" + (f" (from {raw!r})" if isinstance(raw, str) else ""))
        return None
    if value > MAX_COUNT:
        ctx.error(path, f"count {value} is larger than {MAX_COUNT}")
        return None
    return value


def _static_int(ctx: _Ctx, path: Path_, raw: Any, minimum: int, maximum: int | None = None) -> int | None:
    """`replicas:` / `gpu:` / `mps_quota:` / `mps_priority:` / a state object's `max_staleness:`: an integer or static
    integer arithmetic over ${params} (`"${replicas}"`); literal integers were range-checked by the schema
    against their own bounds, and are held to a count's here as one through a param is (a literal
    `max_staleness: 1000000000` passed where `"${stale}"` of the same value was refused, issue 59)."""
    if raw is None or isinstance(raw, bool):
        return raw
    if isinstance(raw, int):
        if raw > MAX_COUNT:
            ctx.error(path, f"count {raw} is larger than {MAX_COUNT}")
            return None
        return raw
    value = _count(ctx, path, raw)
    if value is not None and (value < minimum or (maximum is not None and value > maximum)):
        bounds = f"between {minimum} and {maximum}" if maximum is not None else f"at least {minimum}"
        ctx.error(path, f"must be {bounds}; found {value} (from {raw!r})")
        return None
    return value


def _component(ctx: _Ctx, name: str, raw: Mapping[str, Any]) -> Component:
    path: Path_ = ("components", name)
    decl = raw.get("state", [])
    state: list[StateObject] = []
    if isinstance(decl, list):
        state = [StateObject(name, s, s, ctx.doc.pos(path + ("state", i))) for i, s in enumerate(decl)]
    elif isinstance(decl, dict):
        for s, spec in decl.items():
            attr = str((spec or {}).get("attr", s))
            budget = _static_int(ctx, path + ("state", s, "max_staleness"), (spec or {}).get("max_staleness"), 0)
            state.append(StateObject(name, s, attr, ctx.doc.key_pos(path + ("state", s)), max_staleness=budget or 0))
    env = {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in (raw.get("env") or {}).items()}
    fpos = {k: ctx.doc.pos(path + (k,)) for k in ("impl", "venv") if k in raw}
    fpos.update({f"env.{k}": ctx.doc.key_pos(path + ("env", k)) for k in env})
    fpos.update({f"python_path[{i}]": ctx.doc.pos(path + ("python_path", i)) for i in range(len(raw.get("python_path", ())))})
    if isinstance(raw.get("args"), dict):  # (a refused code reference is said at its value)
        fpos.update({f"args.{k}": ctx.doc.pos(path + ("args", k)) for k in raw["args"]})
    return Component(
        name=name, impl=raw["impl"], args=substitute(raw.get("args") or {}, path + ("args",), ctx),
        device=raw.get("device", "cpu"), state=tuple(state), gpu=_static_int(ctx, path + ("gpu",), raw.get("gpu"), 0),
        mps_quota=_static_int(ctx, path + ("mps_quota",), raw.get("mps_quota"), 1, 100),
        mps_priority=_static_int(ctx, path + ("mps_priority",), raw.get("mps_priority"), 0, 1), replicas=_static_int(ctx, path + ("replicas",), raw.get("replicas", 1), 1) or 1,
        env=env, python_path=tuple(raw.get("python_path", ())),
        venv=raw.get("venv"), copy_of=raw.get("copy_of"), pos=ctx.doc.key_pos(path), field_pos=fpos,
    )


_NODE_FIELDS = ("call", "in", "out", "state", "batch", "phases", "after", "rows", "defer", "ahead")
_LOOP_FIELDS = ("count", "until", "carry", "collect", "after", "iterations", "interleave")
_MERGE_FIELDS = ("from", "ports")
_ACCESS = {a.value: a for a in Access}  # the schema allows only these


class _ItemBuilder:
    def __init__(self, ctx: _Ctx, components: Mapping[str, Component]) -> None:
        self.ctx = ctx
        self.components = components

    def body(self, raw: list, path: Path_, parent: tuple[str, ...]) -> tuple[Item, ...]:
        return tuple(x for x in (self.item(r, path + (i,), parent) for i, r in enumerate(raw)) if x is not None)

    def item(self, raw: Mapping[str, Any], path: Path_, parent: tuple[str, ...]) -> Item | None:
        if "node" in raw:
            return self.node(raw, path, parent)
        if "loop" in raw:
            return self.loop(raw, path, parent, raw["loop"])
        return self.merge(raw, path, parent)

    def _fpos(self, path: Path_, raw: Mapping[str, Any], keys: tuple[str, ...]) -> FieldPositions:
        """Where each field (and each entry of a mapping field: "in.obs") is, for later diagnostics."""
        pos = self.ctx.doc.pos_tuple
        out = {}
        for k in keys:
            if k in raw:
                at = path + (k,)
                out[k] = pos(at)
                if isinstance(raw[k], dict):
                    for sub in raw[k]:
                        out[f"{k}.{sub}"] = pos(at + (sub,))
        return FieldPositions(self.ctx.doc.file, out)

    def node(self, raw: Mapping[str, Any], path: Path_, parent: tuple[str, ...]) -> ExecutionNode | None:
        ctx = self.ctx
        comp_name, method = raw["call"].split(".", 1)
        me = parent + (raw["node"],)
        comp = self.components.get(comp_name)
        if comp is None:
            ctx.error(path + ("call",), f"unknown component '{comp_name}'",
                      did_you_mean(comp_name, self.components) or f"components: {', '.join(self.components)}")
        inputs = []
        for port, text in (raw.get("in") or {}).items():
            expr = ctx.expression(path + ("in", port), text)
            if expr is not None:
                inputs.append((port, expr))
        effects = []
        for sname, mode in (raw.get("state") or {}).items():
            owner, _, short = sname.rpartition(".")
            owner = owner or comp_name
            spath = path + ("state", sname)
            if comp is not None and owner != comp_name:
                ctx.error(spath, f"node '{raw['node']}' calls component '{comp_name}' but accesses state "
                          f"'{sname}' of component '{owner}'", "a node may only access the state of the component it calls",
                          key=True)
                continue
            if comp is not None and comp.state_object(short) is None:
                owners = [c.name for c in self.components.values() if c.state_object(short)]
                hint = (f"'{short}' is owned by {', '.join(owners)}" if owners else
                        did_you_mean(short, [s.name for s in comp.state]) or
                        f"declare it under components.{comp_name}.state")
                ctx.error(spath, f"component '{comp_name}' does not own a state object '{short}'", hint, key=True)
                continue
            effects.append(StateEffect(StateKey(owner, short), _ACCESS[mode], ctx.doc.key_pos(spath)))
        phases = self.body(raw["phases"], path + ("phases",), me) if raw.get("phases") else None
        batch, batch_size, separable = raw.get("batch"), None, True
        if isinstance(batch, dict):
            batch, size_raw, separable = batch["dim"], batch.get("size"), bool(batch.get("separable", True))
            if size_raw is not None:
                batch_size = _count(ctx, path + ("batch", "size"), size_raw)
                if batch_size == 0:
                    ctx.error(path + ("batch", "size"), "a batch size must be at least 1")
        rows = None
        if raw.get("rows"):
            start, stop = (_count(ctx, path + ("rows", i), r) for i, r in enumerate(raw["rows"]))
            rows = (start, stop) if start is not None and stop is not None else None
        if rows is not None and rows[0] >= rows[1]:
            ctx.error(path + ("rows",), f"an empty row range [{rows[0]}, {rows[1]})")
        return ExecutionNode(
            path=me, component=comp_name, method=method, inputs=tuple(inputs), outputs=tuple(raw.get("out") or ()),
            effects=tuple(effects), batch=batch, batch_size=batch_size, separable=separable, phases=phases,
            after=tuple(raw.get("after") or ()), idempotent=bool(raw.get("idempotent", False)),
            timeout_s=raw.get("timeout_s"), shard=raw.get("shard"),
            plan=NodePlan(split_of=raw.get("split_of"), group=raw.get("group"), moved_from=_moved_from(raw),
                          expand=bool(raw.get("expand", False)), rows=rows, defer=int(raw.get("defer", 0)),
                          ahead=int(raw.get("ahead", 0))),
            pos=ctx.doc.pos(path + ("node",)),
            field_pos=self._fpos(path, raw, _NODE_FIELDS), src=path,
        )

    def loop(self, raw: Mapping[str, Any], path: Path_, parent: tuple[str, ...], name: str) -> LoopNode:
        ctx = self.ctx
        me = parent + (name,)
        count = _count(ctx, path + ("count",), raw["count"]) if "count" in raw else None
        until = ctx.expression(path + ("until",), raw["until"]) if "until" in raw else None
        iterations = tuple(raw["iterations"]) if raw.get("iterations") else None
        if iterations is not None and count is None and until is None:
            count = max(iterations) + 1
        if iterations is not None and count is not None and max(iterations) >= count:
            ctx.error(path + ("iterations",), f"iteration {max(iterations)} is outside the loop's count {count}")
        if iterations is not None and list(iterations) != sorted(set(iterations)):
            ctx.error(path + ("iterations",), "a temporal group's iterations must be increasing and distinct")
        if until is not None and "count" not in raw and iterations is None:
            ctx.error(path + ("until",), f"loop '{name}' ends on a condition (until) but has no bound: a loop that "
                      "ends on a condition needs `count:` beside `until:`, the most iterations it may run",
                      f"add `count: N` to loop '{name}' (e.g. the episode length, or the most tokens to generate)")
        carries = []
        for var, spec in (raw.get("carry") or {}).items():
            cpath = path + ("carry", var)
            if "next" not in spec:
                ctx.error(cpath, f"loop-carried value '{var}' has no 'next'",
                          "say which value of the body becomes the next iteration's "
                          f"'{name}.{var}' (next: node.port), or make it a plain input")
                continue
            init, nxt = ctx.expression(cpath + ("init",), spec["init"]), ctx.expression(cpath + ("next",), spec["next"])
            if init is not None and nxt is not None:
                carries.append(Carry(var, init, nxt, ctx.doc.key_pos(cpath)))
        collects = []
        for out_name, text in (raw.get("collect") or {}).items():
            expr = ctx.expression(path + ("collect", out_name), text)
            if expr is not None:
                collects.append((out_name, expr))
        collected = _first_collect(raw)
        if count == 0 and collected and iterations is None:  # (a temporal group's count is its source's)
            ctx.error(path + ("count",), f"loop '{name}' runs 0 times" + (f" (from {raw['count']!r})" if isinstance(raw.get("count"), str)
                      else "") + f", so what {'it' if collected[0] == name else f'its loop {collected[0]!r}'} collects "
                      f"('{collected[1]}') would be empty: a consumer of it would train on nothing",
                      "give it at least one iteration, or drop the loop")
        clash = {c.name for c in carries} & {n for n, _ in collects}
        for n in sorted(clash):
            ctx.error(path + ("collect", n), f"'{n}' is both a carried value and a collected output of loop '{name}'", key=True)
        fpos = self._fpos(path, raw, _LOOP_FIELDS)
        for var in raw.get("carry") or {}:
            for sub in ("init", "next"):
                if sub in (raw["carry"][var] or {}):
                    fpos[f"carry.{var}.{sub}"] = ctx.doc.pos(path + ("carry", var, sub))
        return LoopNode(
            path=me, body=self.body(raw["body"], path + ("body",), me), count=count, until=until,
            carries=tuple(carries), collects=tuple(collects), after=tuple(raw.get("after") or ()),
            plan=LoopPlan(split_of=raw.get("split_of"), group=raw.get("group"), moved_from=_moved_from(raw),
                          iterations=iterations, interleaved=bool(raw.get("interleave", False))),
            pos=ctx.doc.pos(path + ("loop",)) if "loop" in raw else ctx.doc.pos(path), field_pos=fpos, src=path,
        )

    def merge(self, raw: Mapping[str, Any], path: Path_, parent: tuple[str, ...]) -> MergeNode:
        return MergeNode(
            path=parent + (raw["merge"],), sources=tuple(raw["from"]), ports=tuple(raw["ports"].items()),
            pos=self.ctx.doc.pos(path + ("merge",)), field_pos=self._fpos(path, raw, _MERGE_FIELDS), src=path,
        )


@in_bulk
def build_workflow(doc: Document, overrides: Mapping[str, Any] | None = None) -> Workflow:
    """Schema-check and build the IR. Raises WorkflowError with every problem found.

    Cross-reference checks are in `resolve.check_workflow`; `rose_dsl.load_workflow` runs both.
    """
    diags = check_schema(doc)
    if diags:
        raise WorkflowError(diags, doc.text)
    data = doc.data
    ctx = _Ctx(doc)
    ctx.params = _params(ctx, data.get("params") or {}, overrides or {})
    components = {name: _component(ctx, name, raw) for name, raw in data["components"].items()}
    it = data["iteration"]
    root_raw = {"loop": "iteration", "count": it.get("count", 1), "body": it["body"]}
    if "carry" in it:
        root_raw["carry"] = it["carry"]
    builder = _ItemBuilder(ctx, components)
    # The iteration loop's fields live under `iteration`, not under a `loop:` item.
    root = builder.loop(root_raw, ("iteration",), (), "iteration")
    if ctx.diags:
        raise WorkflowError(ctx.diags, doc.text)
    root = _inherit_groups(root)
    seed = ctx.params.get("seed", 0)
    return Workflow(name=data["name"], version=data["rose"], params=ctx.params, components=components, root=root,
                    file=doc.file, seed=seed if isinstance(seed, int) and not isinstance(seed, bool) else 0,
                    plan=dict(data["plan"]) if isinstance(data.get("plan"), dict) else None)


def _inherit_groups(root: LoopNode) -> LoopNode:
    """A plan writes `group:` on group items only; the items inside a group run in it too."""
    if not any(not isinstance(i, MergeNode) and i.plan.group is not None for i in iter_items(root)):
        return root

    def walk(item: Item, group: int | None) -> Item:
        if isinstance(item, MergeNode):
            return item
        own = item.plan.group if item.plan.group is not None else group
        if isinstance(item, LoopNode):
            return replace(item, plan=replace(item.plan, group=own), body=tuple(walk(c, own) for c in item.body))
        return replace(item, plan=replace(item.plan, group=own),
                       phases=tuple(walk(c, own) for c in item.phases) if item.phases else item.phases)

    out = walk(root, None)
    assert isinstance(out, LoopNode)
    return out


def _moved_from(raw: Mapping[str, Any]) -> tuple[str, ...] | None:
    """`moved_from: update.sgd` (a path below the iteration) -> ("iteration", "update", "sgd")."""
    text = raw.get("moved_from")
    return ("iteration",) + tuple(text.split(".")) if text else None


def _first_collect(raw: Any) -> tuple[str, str] | None:
    """(loop, output) of the first `collect` of this raw loop or of a loop anywhere in its body: a loop that
    runs 0 times leaves every one of them empty (x4 of the unseen sweep: `episodes=0` around
    a step loop that collects trained on nothing, loss NaN, exit 0)."""
    if not isinstance(raw, dict):
        return None
    if raw.get("collect"):
        return str(raw.get("loop")), str(next(iter(raw["collect"])))
    for item in raw.get("body") or []:
        found = _first_collect(item) if isinstance(item, dict) and "loop" in item else None
        if found:
            return found
    return None
