"""The static per-iteration schedule: every call of an RL iteration in program order, each with a
*recipe* for its inputs.

A recipe is a small tree (stack / cat / record / slice over leaves) that says how to build the call's
inputs from earlier calls' outputs; its leaves are backend handles (futures, Ray ObjectRefs). The
driver computes recipes with the semantics' lazy evaluator (`rose_dsl.semantics.Program`) and never
touches the data; the worker that runs the call evaluates the recipe with the resolved leaves. So
data moves producer -> consumer directly, and a value is freed when the last recipe holding it is done.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rose_dsl.ir import ExecutionNode, Workflow
from rose_dsl.semantics import CallSite, Frame, Invocation, Program

from .iteration_var import KExpr, resolve_k
from .values import TorchOps

__all__ = ["Leaf", "RecipeOps", "ReplicaSet", "Step", "Schedule", "evaluate_recipe", "for_replica", "replicated", "check_replica_edges"]


@dataclass(frozen=True)
class Leaf:
    """A placeholder for the i-th handle passed along with the recipe."""

    index: int


class RecipeOps:
    """ValueOps that build recipe trees instead of values."""

    def stack(self, values: Sequence[Any]) -> Any:
        return ("stack", tuple(values))

    def cat(self, values: Sequence[Any], dim: int = 0) -> Any:
        return ("cat", tuple(values), dim)

    def record(self, fields: Mapping[str, Any]) -> Any:
        return ("record", tuple(fields.items()))

    def slice(self, value: Any, start: int | None, stop: int | None) -> Any:
        return ("slice", value, start, stop)

    def truth(self, value: Any) -> bool:
        raise RuntimeError("a loop with a dynamic end cannot be scheduled statically")


@dataclass(frozen=True)
class Step:
    """One call: where it runs, what it calls, and how its inputs are built."""

    inv: Invocation
    node: ExecutionNode
    recipe: tuple[tuple[str, Any], ...]  # (port, recipe) with Leaf placeholders
    handles: tuple[Any, ...]  # the backend handles the Leaf placeholders stand for

    @property
    def label(self) -> str:
        return str(self.inv)


class _Handle:
    """A lookup result during scheduling: an (opaque) backend handle for one output port."""

    __slots__ = ("handle",)

    def __init__(self, handle: Any) -> None:
        self.handle = handle


def _flatten(recipe: Any, handles: list[Any], seen: dict[int, int]) -> Any:
    if isinstance(recipe, KExpr):
        return ("k", recipe)
    if isinstance(recipe, _Handle):
        key = id(recipe.handle)
        if key not in seen:
            seen[key] = len(handles)
            handles.append(recipe.handle)
        return Leaf(seen[key])
    if isinstance(recipe, tuple) and recipe and recipe[0] in ("stack", "cat", "record", "slice"):
        tag = recipe[0]
        if tag == "stack":
            return ("stack", tuple(_flatten(v, handles, seen) for v in recipe[1]))
        if tag == "cat":
            return ("cat", tuple(_flatten(v, handles, seen) for v in recipe[1]), recipe[2])
        if tag == "record":
            return ("record", tuple((k, _flatten(v, handles, seen)) for k, v in recipe[1]))
        return ("slice", _flatten(recipe[1], handles, seen), recipe[2], recipe[3])
    if isinstance(recipe, list):
        return ("list", tuple(_flatten(v, handles, seen) for v in recipe))
    return ("const", recipe)


def evaluate_recipe(recipe: Any, leaves: Sequence[Any], ops: Any = None, k: int | None = None) -> Any:
    """Build a value from a recipe and the resolved leaf values (runs in the worker). `k` is the RL
    iteration when the recipe was compiled for a symbolic one."""
    ops = ops or _TORCH
    if isinstance(recipe, Leaf):
        return leaves[recipe.index]
    tag = recipe[0]
    if tag == "const":
        return recipe[1]
    if tag == "k":
        assert k is not None, "a compiled recipe needs the iteration number"
        return resolve_k(recipe[1], k)
    if tag == "stack":
        return ops.stack([evaluate_recipe(v, leaves, ops, k) for v in recipe[1]])
    if tag == "cat":
        return ops.cat([evaluate_recipe(v, leaves, ops, k) for v in recipe[1]], recipe[2])
    if tag == "record":
        return ops.record({name: evaluate_recipe(v, leaves, ops, k) for name, v in recipe[1]})
    if tag == "slice":
        start, stop = resolve_k(recipe[2], k) if k is not None else recipe[2], resolve_k(recipe[3], k) if k is not None else recipe[3]
        return ops.slice(evaluate_recipe(recipe[1], leaves, ops, k), start, stop)
    if tag == "list":
        return [evaluate_recipe(v, leaves, ops, k) for v in recipe[1]]
    if tag == "part":
        return ops.part(evaluate_recipe(recipe[1], leaves, ops, k), recipe[2], recipe[3], recipe[4])
    raise ValueError(f"unknown recipe {tag!r}")


_TORCH = TorchOps()


@dataclass(frozen=True)
class ReplicaSet:
    """The handles of one output port on every data-parallel replica of its component (replica order)."""

    handles: tuple[Any, ...]
    component: str


def for_replica(step: Step, replica: int, replicas: int) -> Step:
    """Step `step` (whose handles are `ReplicaSet`s) as replica `replica` of `replicas` runs it.

    Per input port: values from a component with the same replica count come from the same replica.
    With fewer producer replicas (R_c = m R_p, the hybrid placement: e.g. 2 rollout replicas feeding 4
    trainer replicas), replica j builds the port from producer replica j // m and takes shard j % m of
    it along the node's `shard:` dimension. With more (R_p = m R_c), replica j concatenates the port as
    built from producer replicas j m ... j m + m - 1 along `shard:`, or, for a node without `shard:`,
    takes replica j m's -- the data-parallel contract: a replicated component's replicas hold the same
    value (e.g. weights after an all-reduced step). A port may not mix replica counts.
    """
    leaves: list[Any] = []
    where = f"{step.label} ({step.node.component}, {replicas} replica{'s' if replicas > 1 else ''})"

    def remap(recipe: Any, pick: int) -> Any:
        if isinstance(recipe, Leaf):
            h = step.handles[recipe.index]
            leaves.append(h.handles[pick] if isinstance(h, ReplicaSet) else h)
            return Leaf(len(leaves) - 1)
        if not isinstance(recipe, tuple) or not recipe:
            return recipe
        tag = recipe[0]
        if tag in ("stack", "list"):
            return (tag, tuple(remap(v, pick) for v in recipe[1]))
        if tag == "cat":
            return ("cat", tuple(remap(v, pick) for v in recipe[1]), recipe[2])
        if tag == "record":
            return ("record", tuple((k, remap(v, pick)) for k, v in recipe[1]))
        if tag == "slice":
            return ("slice", remap(recipe[1], pick), recipe[2], recipe[3])
        return recipe  # const, k

    ports = []
    for port, recipe in step.recipe:
        sets = [step.handles[i] for i in _leaf_indices(recipe) if isinstance(step.handles[i], ReplicaSet)]
        counts = {len(h.handles) for h in sets}
        if len(counts) > 1:
            raise ValueError(f"{where}: input '{port}' mixes values from components with different replica counts "
                             f"({', '.join(sorted({f'{h.component}: {len(h.handles)}' for h in sets}))})")
        have, dim = (counts.pop() if counts else replicas), step.node.shard
        source = next((h.component for h in sets), "?")
        if have == replicas:
            ports.append((port, remap(recipe, replica)))
        elif replicas % have == 0:
            m = replicas // have
            if dim is None:
                raise ValueError(f"{where} takes '{port}' from '{source}' ({have} replicas): declare `shard: DIM` on "
                                 f"'{step.node.name}' so that each of its replicas takes a shard")
            ports.append((port, ("part", remap(recipe, replica // m), dim, replica % m, m)))
        elif have % replicas == 0:
            m = have // replicas
            group = range(replica * m, (replica + 1) * m)
            ports.append((port, remap(recipe, group[0]) if dim is None
                          else ("cat", tuple(remap(recipe, g) for g in group), dim)))
        else:
            raise ValueError(f"{where} takes '{port}' from '{source}' ({have} replicas): one replica count must "
                             "divide the other")
    return Step(step.inv, step.node, tuple(ports), tuple(leaves))


def _leaf_indices(recipe: Any) -> list[int]:
    if isinstance(recipe, Leaf):
        return [recipe.index]
    if not isinstance(recipe, tuple) or not recipe:
        return []
    tag = recipe[0]
    if tag in ("stack", "list", "cat"):
        return [i for v in recipe[1] for i in _leaf_indices(v)]
    if tag == "record":
        return [i for _, v in recipe[1] for i in _leaf_indices(v)]
    if tag == "slice":
        return _leaf_indices(recipe[1])
    return []


class Schedule:
    """A workflow compiled for execution: call sites per iteration and their input recipes."""

    def __init__(self, wf: Workflow) -> None:
        self.program = Program(wf)
        self.workflow = wf
        dynamic = [i for i in wf.items() if getattr(i, "until", None) is not None]
        if dynamic:
            raise ValueError(f"loop '{dynamic[0].name}' ends on a condition; the runtime schedules static loops only")
        # values the iteration loop carries (as recipes; with replicas their leaves are `ReplicaSet`s)
        self._root_carry: dict[int, dict[str, Any]] = {}

    def sites(self, k: int) -> list[CallSite]:
        return list(self.program.unroll(k))

    def steps(self, k: Any, submit: Callable[[Step], Sequence[Any]]) -> list[tuple[Step, Sequence[Any]]]:
        """Build every step of iteration k in program order and `submit` it; `submit` returns one handle
        per output port (in `node.outputs` order), which later recipes then refer to (data-parallel
        replicas: see `replicated`)."""
        handles: dict[Invocation, dict[str, Any]] = {}
        frame = Frame(lambda inv, port: _Handle(handles[inv][port]), RecipeOps(), root_carry=self._root_carry)
        out = []
        for site in self.sites(k):
            raw = self.program.inputs(site, frame)
            leaves: list[Any] = []
            seen: dict[int, int] = {}
            recipe = tuple((port, _flatten(value, leaves, seen)) for port, value in raw.items())
            step = Step(site.inv, site.node, recipe, tuple(leaves))
            result = submit(step)
            handles[site.inv] = dict(zip(site.node.outputs, result, strict=False))
            out.append((step, result))
        self.program.end_iteration(k, frame)
        self._root_carry = {j: v for j, v in frame.root_carry.items() if j > k}
        return out


def replicated(submit: Callable[[Step, int], Sequence[Any]], wf: Workflow) -> Callable[[Step], tuple[ReplicaSet, ...]]:
    """A `Schedule.steps` submit function for data-parallel replicas: each step is submitted once per
    replica of its component (`for_replica`), and each output port becomes a `ReplicaSet` (so values
    carried to the next iteration stay per replica too)."""
    replicas_of = {c.name: c.replicas for c in wf.components.values()}

    def lifted(step: Step) -> tuple[ReplicaSet, ...]:
        n = replicas_of[step.node.component]
        per = [submit(for_replica(step, r, n), r) for r in range(n)]
        return tuple(ReplicaSet(tuple(p[i] for p in per), step.node.component)
                     for i in range(max(1, len(step.node.outputs))))

    return lifted


def check_replica_edges(wf: Workflow) -> None:
    """Raise ValueError naming the first call whose inputs cannot be mapped between replica counts
    (two RL iterations, so values carried from one iteration to the next are checked too)."""
    schedule = Schedule(wf)
    submit = replicated(lambda step, r: (None,) * max(1, len(step.node.outputs)), wf)
    for k in range(2):
        schedule.steps(k, submit)
