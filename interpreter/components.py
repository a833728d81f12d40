"""Instantiating components and calling them by the component contract (docs/components.md).

Shared by the reference interpreter and the runtime backends: `impl` resolution under allowed module
prefixes (checking the resolved class, not the string), constructor arguments (`device`, `seed`),
the `rows=` slice of split groups (the contract's types: `contract.py`), and the output contract (a dict with exactly the declared outputs,
or the bare value of a single output).
"""

from __future__ import annotations

import copy
import importlib
import inspect
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from rose_dsl.errors import Diagnostic, did_you_mean
from rose_dsl.importcheck import DEFAULT_ALLOWED, module_allowed
from rose_dsl.ir import Component, ExecutionNode, Workflow
from rose_dsl.transforms.seeds import SEED_GET, SEED_PORT, SEED_SET

from . import contract

__all__ = ["ComponentError", "StartProblems", "ImplNotResolved", "ImplProblem", "CallProblems", "call_problems", "missing_methods", "resolve_impl", "construct", "instantiate", "invoke", "check_batch", "get_state", "set_state"]


class ComponentError(Exception):
    """A component misbehaved (import, construction, a method raising, a broken output contract)."""


def missing_methods(obj: Any, methods: Iterable[str]) -> dict[str, str | None]:
    """The methods of `methods` that `obj` (a constructed component) lacks, each with a did-you-mean from
    the ones it has."""
    lacking = sorted(m for m in set(methods) if not callable(getattr(obj, m, None)))
    if not lacking:
        return {}
    public = [n for n in dir(obj) if not n.startswith("_") and callable(getattr(obj, n, None))]
    return {m: did_you_mean(m, public) for m in lacking}


def call_problems(obj: Any, nodes: Iterable[ExecutionNode]) -> dict[str, Any]:
    """What would make a call of `nodes` on `obj` fail whatever its inputs -- a method it lacks
    (`missing`: method -> did-you-mean) and a row group of a stateful node whose method takes no `rows=`
    (`no_rows`: the methods, `invoke` refuses those) -- asked when a process has its component and its
    nodes, before any call. {} when there is nothing (plain values: it crosses process boundaries)."""
    nodes = list(nodes)
    missing = missing_methods(obj, {n.method for n in nodes if n.method not in (SEED_GET, SEED_SET)})
    no_rows = sorted({n.method for n in nodes if n.plan.rows is not None and n.effects and n.method not in missing
                      and not _takes_rows(type(obj), n.method)})
    return {"missing": missing, "no_rows": no_rows} if missing or no_rows else {}


class StartProblems(ComponentError):
    """What a component's process found when it started, before any call, that the user fixes in the
    workflow: `diagnostics` say where (the CLI prints them and exits 2); `closing` says what stopped."""

    component: str
    diagnostics: list[Diagnostic]
    closing: str


class ImplNotResolved(ComponentError):
    """A component's `impl:` does not import or resolve to an allowed class (`resolve_impl`'s reason)."""

    def __init__(self, component: Component, reason: str) -> None:
        super().__init__(f"component '{component.name}' ({component.impl}): {reason}")
        self.reason = reason


class ImplProblem(StartProblems):
    """`ImplNotResolved`, said at the component's `impl:` (the worker reports it through `info`: an
    exception raised in a Ray actor's constructor comes back as text only)."""

    def __init__(self, component: Component, reason: str) -> None:
        self.component = component.name
        self.diagnostics = [Diagnostic(component.field_pos.get("impl", component.pos), f"components.{component.name}.impl",
                                       reason, "`rose validate --import FILE` names what exists there")]
        self.closing = f"stopped before the first call: component '{component.name}' could not be started"
        super().__init__(f"component '{component.name}' ({component.impl}): {reason}")


class CallProblems(StartProblems):
    """Calls the workflow makes that its component cannot take (`call_problems`): found when the process
    has started, before the first call -- which would otherwise fail in the middle of an iteration, after
    other calls ran -- and said where the workflow names them (each `call:`, each `rows:`): the user's to
    fix, as `rose validate --import` says a missing method."""

    def __init__(self, component: Component, problems: Mapping[str, Any], nodes: Iterable[ExecutionNode]) -> None:
        missing: Mapping[str, str | None] = problems.get("missing", {})
        no_rows = set(problems.get("no_rows", ()))
        seen: set[Any] = set()
        found: list[Diagnostic] = []
        for node in nodes:
            if node.method in missing:
                pos = node.field_pos.get("call", node.pos)
                diag = Diagnostic(pos, ".".join(node.path) + ".call",
                                  f"class '{component.impl}' has no method '{node.method}'", missing[node.method])
            elif node.method in no_rows and node.plan.rows is not None and node.effects:
                pos = node.field_pos.get("rows", node.field_pos.get("call", node.pos))
                diag = Diagnostic(pos, ".".join(node.path) + ".rows",
                                  f"{node.call} runs on rows {node.plan.rows[0]}:{node.plan.rows[1]} and declares state "
                                  f"({', '.join(e.state for e in node.effects)}), but '{component.impl}.{node.method}' "
                                  "takes no `rows=` argument",
                                  "a method that touches per-row state and runs on a row group must take "
                                  "`rows: slice | None = None` (docs/components.md)")
            else:
                continue
            if pos not in seen:  # split groups and copies of one declared node share its position
                seen.add(pos)
                found.append(diag)
        self.component = component.name
        self.diagnostics = sorted(found, key=Diagnostic.sort_key)
        self.closing = (f"stopped before the first call: component '{component.name}' was started and cannot take "
                        f"{'this call' if len(found) == 1 else 'these calls'} (`rose validate --import FILE` finds a "
                        "missing method without starting anything)")
        what = [f"no method '{m}'" for m in missing] + [f"'{m}' takes no `rows=`" for m in sorted(no_rows)]
        super().__init__(f"component '{component.name}' ({component.impl}): " + "; ".join(what))


def resolve_impl(impl: str, allowed: Iterable[str] = DEFAULT_ALLOWED) -> type:
    module_name, _, qual = impl.partition(":")
    reason = module_allowed(module_name, tuple(allowed))
    if reason:
        raise ComponentError(reason)
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # a user module may raise anything on import: one ComponentError says what
        how = ("; the example components are not installed with rose: `rose init DIR --workflow NAME` writes a "
               "workflow and the components it imports into DIR" if isinstance(exc, ModuleNotFoundError)
               and exc.name == "examples" else "")
        raise ComponentError(f"cannot import '{module_name}': {type(exc).__name__}: {exc}{how}") from exc
    obj: Any = module
    for part in qual.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise ComponentError(f"module '{module_name}' has no '{qual}'")
    if not inspect.isclass(obj):
        raise ComponentError(f"'{impl}' is not a class")
    if not (obj.__module__ == module_name or obj.__module__.startswith(module_name.split(".")[0] + ".")):
        raise ComponentError(f"'{impl}' resolves to '{obj.__module__}.{obj.__qualname__}', outside '{module_name}'")
    reason = module_allowed(obj.__module__, tuple(allowed))
    if reason:
        raise ComponentError(reason)
    return obj


def wants_process_group(comp: Component, allowed: Iterable[str] = DEFAULT_ALLOWED) -> bool:
    """Does the class ask for a torch.distributed group over its replicas (`data_parallel_group = True`,
    e.g. a trainer that all-reduces gradients)? Then rose initialises one before constructing it.

    Only classes that communicate ask: a replica in a group cannot be restarted alone, while a
    replica-aware simulator or rollout policy (which only needs its replica index) can."""
    return contract.wants_process_group(resolve_impl(comp.impl, allowed))


def construct(comp: Component, seed: int, device: str = "cpu", allowed: Iterable[str] = DEFAULT_ALLOWED,
              replica: int = 0) -> Any:
    try:
        cls = resolve_impl(comp.impl, allowed)
    except ComponentError as exc:  # say which component, as a construction failure does
        raise ImplNotResolved(comp, str(exc)) from None
    context = contract.ConstructionContext(device=device, seed=seed, replica=replica, replicas=comp.replicas)
    kwargs = context.kwargs(cls, comp.args)
    try:
        return cls(**kwargs)
    except Exception as exc:  # a user constructor may raise anything: one ComponentError says what
        raise ComponentError(f"constructing component '{comp.name}' ({comp.impl}) failed: {type(exc).__name__}: {exc}") from exc


def instantiate(wf: Workflow, allowed: Iterable[str] = DEFAULT_ALLOWED, device: str = "cpu") -> dict[str, Any]:
    return {name: construct(c, wf.seed, device, allowed) for name, c in wf.components.items()}


_TAKES_ROWS: dict[tuple[type, str], bool] = {}


def _takes_rows(cls: type, name: str) -> bool:
    """Whether method `name` of `cls` accepts the `rows=` keyword (a `rows` parameter or `**kwargs`); cached."""
    key = (cls, name)
    if key not in _TAKES_ROWS:
        try:
            params = list(inspect.signature(getattr(cls, name)).parameters.values())
        except (TypeError, ValueError, AttributeError):  # no signature to read: pass it, as before
            _TAKES_ROWS[key] = True
        else:
            _TAKES_ROWS[key] = any(p.name == "rows" or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
    return _TAKES_ROWS[key]


def invoke(obj: Any, node: ExecutionNode, inputs: Mapping[str, Any], where: str | Callable[[], str] = "",
           live: Any = None, comp: Component | None = None) -> dict[str, Any]:
    """Call `node.method` on `obj` and check the result against the node's declared outputs. `where`
    names the invocation in messages (or builds that name: only a failing call needs it). `live`: the
    rows (a LongTensor, of the loop's batch) this call of a loop that ends per row computes, the others
    being done; a method that takes `rows=` gets them as global rows (offset by a split group's start).
    `comp`: the component's definition, for the seeding calls of a temporal split (`seed_call`)."""
    def label() -> str:
        return (where() if callable(where) else where) or ".".join(node.path)

    if node.method in (SEED_GET, SEED_SET):
        return seed_call(obj, node, inputs, comp)
    method = getattr(obj, node.method, None)
    if method is None or not callable(method):
        raise ComponentError(f"{label()}: component '{node.component}' has no method '{node.method}'")
    kwargs = dict(inputs)
    if live is not None:
        if _takes_rows(type(obj), node.method):
            kwargs["rows"] = live + node.plan.rows[0] if node.plan.rows else live
        elif node.effects:
            raise ComponentError(
                f"{label()}: {node.call} runs in a loop that ends per row, on the rows not yet done, and declares "
                f"state ({', '.join(e.state for e in node.effects)}), but takes no `rows=` argument: such a method "
                "must take `rows` (the indices of the rows it computes; docs/components.md)")
    elif node.plan.rows is not None:
        if _takes_rows(type(obj), node.method):
            kwargs["rows"] = slice(*node.plan.rows)
        elif node.effects:
            raise ComponentError(
                f"{label()}: {node.call} runs on rows {node.plan.rows[0]}:{node.plan.rows[1]} of a split group and declares "
                f"state ({', '.join(e.state for e in node.effects)}), but takes no `rows=` argument: a split "
                "method that touches per-row state must take `rows: slice | None = None` (docs/components.md)")
        # else: no state, inputs already sliced -- the call needs nothing more (docs/components.md: only
        # a method touching per-row state takes `rows=`)
    result = method(**kwargs)
    outs = node.outputs
    if not outs:
        return {}
    if len(outs) == 1 and not (isinstance(result, Mapping) and set(result) == {outs[0]}):
        return {outs[0]: result}
    if not isinstance(result, Mapping):
        raise ComponentError(f"{label()}: {node.call} returned {type(result).__name__}; expected a dict with "
                             f"{', '.join(outs)}")
    missing = [o for o in outs if o not in result]
    if missing:
        raise ComponentError(f"{label()}: {node.call} did not return {', '.join(missing)} (returned {', '.join(map(str, result))})")
    return {o: result[o] for o in outs}


def seed_call(obj: Any, node: ExecutionNode, inputs: Mapping[str, Any], comp: Component | None) -> dict[str, Any]:
    """A temporal split's seeding call (`rose_dsl.transforms.seeds`), answered here for every backend:
    the get returns copies of the state objects the node reads (`get_state`), the set sets those the
    node refreshes from them (`set_state`: the copy gets its own copy of each value)."""
    if comp is None:
        raise ComponentError(f"{node.call}: a seeding call needs its component's definition (a bug in rose)")
    names = [e.key.name for e in node.effects]
    if node.method == SEED_GET:
        # a copy, always: the original may change its value in place while the copy's group reads it
        take = copy.deepcopy if isinstance(obj, contract.Stateful) else (lambda v: v)  # else get_state copied
        return {SEED_PORT: {n: take(get_state(obj, comp, n)) for n in names}}
    states = inputs[SEED_PORT]
    lacking = [n for n in names if n not in states]
    if lacking:
        raise ComponentError(f"{node.call}: the seed holds no {', '.join(lacking)}")
    for n in names:
        set_state(obj, comp, n, states[n])
    return {}


def check_batch(node: ExecutionNode, outputs: Mapping[str, Any], label: str, live: int | None = None) -> None:
    """A batch-separable node with a declared batch size must return that many rows (its group's rows, or
    the `live` rows a call of a loop that ends per row computed)."""
    if node.batch is None or (node.batch_size is None and live is None):
        return
    rows = live if live is not None else node.plan.rows[1] - node.plan.rows[0] if node.plan.rows else node.batch_size
    for port, value in outputs.items():
        for leaf_name, leaf in _leaves(port, value):
            shape = getattr(leaf, "shape", None)
            if shape is None or len(shape) <= node.batch:
                continue
            if shape[node.batch] != rows:
                # where the batch is declared, for the user to fix it (the component cannot be asked its rows
                # before it runs, so `rose validate` passes it)
                pos = node.field_pos.get("batch") or node.pos
                where = f" ({pos})" if pos.line else ""
                raise ComponentError(f"{label}: output '{leaf_name}' of {node.call} has {shape[node.batch]} rows along "
                                     f"dim {node.batch}; the node declares a batch of {rows}{where}")


def _leaves(name: str, value: Any):
    if isinstance(value, Mapping):
        for k, v in value.items():
            yield from _leaves(f"{name}.{k}", v)
    else:
        yield name, value


def get_state(obj: Any, comp: Component, name: str) -> Any:
    if isinstance(obj, contract.Stateful):
        return obj.get_state(name)
    so = comp.state_object(name)
    return copy.deepcopy(getattr(obj, so.attr if so else name))


def set_state(obj: Any, comp: Component, name: str, value: Any) -> None:
    if isinstance(obj, contract.Stateful):
        obj.set_state(name, value)
        return
    so = comp.state_object(name)
    setattr(obj, so.attr if so else name, copy.deepcopy(value))
