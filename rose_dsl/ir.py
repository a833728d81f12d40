"""The workflow IR: plain dataclasses with source positions, rooted at the iteration loop.

A Workflow holds Components (each owning StateObjects) and one LoopNode, `iteration`, whose body is
one RL iteration. Bodies are tuples of Items: ExecutionNodes (a call of a component method), LoopNodes
(a body repeated `count` times, with loop-carried values and collected outputs) and, in plans only,
MergeNodes (reassemble split groups). State accesses are *effects* on ExecutionNodes, as in JAX's
state effects; every ordering rose derives comes from effects and expression references.

IR objects are frozen; transformations build new ones with `dataclasses.replace`. A node's `path`
(`("iteration", "epoch", "step", "act")`) is its identity within the workflow. What only plans hold --
a split group's origin and rows, a temporal group's iterations, a deferred call -- sits in one record per
item, `plan` (`NodePlan`, `LoopPlan`), apart from the language's fields; a workflow as written has its
defaults.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any, TypeVar, Union

from .errors import SourcePos
from .expr import Expr
from .identity import StateKey

__all__ = [
    "Access", "StateObject", "StateEffect", "Component", "ExecutionNode", "LoopNode", "Carry",
    "MergeNode", "Item", "Workflow", "NOWHERE", "iter_items", "PlanFields", "NodePlan", "LoopPlan", "with_plan",
]

NOWHERE = SourcePos("<generated>", 0, 0)


class Access(StrEnum):
    """How a node touches a state object."""

    READ = "read"  # uses the current value
    UPDATE = "update"  # new value computed from the previous one
    REFRESH = "refresh"  # new value that does not depend on the previous one (reset, weight load)

    @property
    def writes(self) -> bool:
        return self is not Access.READ

    @property
    def reads_previous(self) -> bool:
        return self is not Access.REFRESH


@dataclass(frozen=True)
class StateObject:
    component: str
    name: str
    attr: str
    pos: SourcePos = field(default=NOWHERE, compare=False)
    # how many RL iterations old a read of it may be (`max_staleness:`): the budget an asynchronous plan's
    # `defer` is checked against (transforms/legality.py); 0: every read sees what the declared one sees
    max_staleness: int = 0

    @property
    def key(self) -> str:
        return f"{self.component}.{self.name}"

    @property
    def state_key(self) -> StateKey:
        return StateKey(self.component, self.name)


@dataclass(frozen=True)
class StateEffect:
    key: StateKey  # the state object touched: its component and name
    access: Access
    pos: SourcePos = field(default=NOWHERE, compare=False)

    @property
    def state(self) -> str:
        """The state object's spelling, `StateObject.key` (`sim.episode`): what analyses key by and messages show."""
        return str(self.key)


@dataclass(frozen=True)
class Component:
    name: str
    impl: str  # "package.module:Class"
    args: dict[str, Any]
    device: str  # "cpu" | "gpu"
    state: tuple[StateObject, ...] = ()
    gpu: int | None = None
    mps_quota: int | None = None  # percent of SMs (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE), plans set this
    # MPS client priority (CUDA_MPS_CLIENT_PRIORITY): 0 normal, 1 below normal -- the kernels of a process
    # at 1 wait for those of normal-priority processes; it takes no SMs away (plans set this too)
    mps_priority: int | None = None
    replicas: int = 1
    env: dict[str, str] = field(default_factory=dict)
    python_path: tuple[str, ...] = ()
    venv: str | None = None
    # plan-only: this component is a copy of `copy_of` (same impl, args and state objects), made by a
    # temporal split so that a group of iterations has its own state; not a data-parallel replica
    copy_of: str | None = None
    pos: SourcePos = field(default=NOWHERE, compare=False)
    # where the fields that choose code came from ("impl", "env.NAME", "python_path[0]", "venv"), so that
    # a refusal or a failed import points at the value, not at the component's key
    field_pos: dict[str, SourcePos] = field(default_factory=dict, compare=False, hash=False)

    def state_object(self, name: str) -> StateObject | None:
        return next((s for s in self.state if s.name == name), None)

    @property
    def mps_settings(self) -> tuple[int, int]:
        """How this process runs under MPS, as it binds: (quota percent, client priority) -- no quota is
        100%, no priority is normal (0). Both are fixed for a process's lifetime."""
        return self.mps_quota or 100, self.mps_priority or 0


@dataclass(frozen=True)
class PlanFields:
    """What the rewrites record on an item, apart from the language's own fields: a workflow as written
    has the defaults, a plan file writes the others (`split_of:`, `group:`, ...). The identity of a split
    group lives here, never in its name (`act@1` is a name; `split_of="act"`, `group=1` say what it is)."""

    split_of: str | None = None  # the name of the item this group was split from
    # the group (row group or iteration group) this item runs in: its own number when it is a group
    # (`split_of` set), else the innermost enclosing group's; None outside groups
    group: int | None = None
    # the path this item had in the source workflow when a rewrite moved it elsewhere (a loop fusion moves
    # `update.sgd` into `epoch`); groups and their contents are traced through `split_of`
    moved_from: tuple[str, ...] | None = None


@dataclass(frozen=True)
class NodePlan(PlanFields):
    """A call's plan-only fields."""

    expand: bool = False  # run `phases` instead of the entry
    rows: tuple[int, int] | None = None  # this split group's global batch rows
    # the call of RL iteration i runs at this node's place in RL iteration i+defer (inputs from iteration
    # i); what is pending runs at the end and before a checkpoint (semantics.Program.unroll)
    defer: int = 0
    # the call of RL iteration i+ahead runs at this node's place in RL iteration i (its inputs those of
    # iteration i+ahead, produced by calls run ahead too); none is run ahead across a barrier (a checkpoint,
    # a stop, the end): the iteration after one runs its own calls first (semantics.Program.unroll)
    ahead: int = 0


@dataclass(frozen=True)
class LoopPlan(PlanFields):
    """A loop's plan-only fields."""

    iterations: tuple[int, ...] | None = None  # the iterations this temporal group runs
    # consecutive sibling loops with the flag -- the temporal groups of one split, or loops that are not
    # temporal groups -- run their calls in turn (one call of each, round robin) instead of one after the
    # other (`interleave LOOP` of a split-time loop, `interleave LOOP_A LOOP_B` of siblings)
    interleaved: bool = False


@dataclass(frozen=True)
class ExecutionNode:
    """A call of one component method: inputs are expressions, outputs are named ports."""

    path: tuple[str, ...]
    component: str
    method: str
    inputs: tuple[tuple[str, Expr], ...] = ()
    outputs: tuple[str, ...] = ()
    effects: tuple[StateEffect, ...] = ()
    batch: int | None = None  # the batch dimension of every input/output tensor (separable along it unless `separable`)
    batch_size: int | None = None  # rows along `batch`, when declared (needed to split)
    # False: the outputs hold the batch along `batch` (a consumer can be split by rows) but the call itself
    # cannot be split (`batch: {dim, size, separable: false}`: a prompt sampler advancing a cursor)
    separable: bool = True
    phases: tuple[Item, ...] | None = None  # an exposed internal graph with the same effect
    after: tuple[str, ...] = ()  # run after these earlier siblings, in the same iterations of the loops around both
    idempotent: bool = False
    timeout_s: float | None = None
    # with replicas: this node's replicas may each take a shard of inputs from fewer producer replicas
    # along this dimension (not a separable split: the component's replicas must act as one, e.g. a
    # trainer that all-reduces its gradients)
    shard: int | None = None
    plan: NodePlan = field(default_factory=NodePlan)  # what rewrites set (`NodePlan`); the defaults as written
    pos: SourcePos = field(default=NOWHERE, compare=False)
    # Where each field came from ("in.obs" -> position) and the item's path in the YAML document
    # (("iteration", "body", 0)); empty for items a transformation generated.
    field_pos: dict[str, SourcePos] = field(default_factory=dict, compare=False, hash=False)
    src: tuple[str | int, ...] = field(default=(), compare=False, hash=False)

    @property
    def name(self) -> str:
        return self.path[-1]

    @property
    def call(self) -> str:
        return f"{self.component}.{self.method}"

    def input(self, port: str) -> Expr | None:
        return dict(self.inputs).get(port)


@dataclass(frozen=True)
class Carry:
    """A loop-carried value: `init` is evaluated before the first iteration (outside the body),
    `next` at the end of each iteration (inside it); `loop.var` reads the current value."""

    name: str
    init: Expr
    next: Expr
    pos: SourcePos = field(default=NOWHERE, compare=False)


@dataclass(frozen=True)
class LoopNode:
    path: tuple[str, ...]
    body: tuple[Item, ...]
    count: int | None  # None for a dynamic (`until`) loop
    until: Expr | None = None
    carries: tuple[Carry, ...] = ()
    collects: tuple[tuple[str, Expr], ...] = ()  # evaluated after the last iteration
    after: tuple[str, ...] = ()  # run after these earlier siblings, in the same iterations of the loops around both
    plan: LoopPlan = field(default_factory=LoopPlan)  # what rewrites set (`LoopPlan`); the defaults as written
    pos: SourcePos = field(default=NOWHERE, compare=False)
    # Where each field came from ("in.obs" -> position) and the item's path in the YAML document
    # (("iteration", "body", 0)); empty for items a transformation generated.
    field_pos: dict[str, SourcePos] = field(default_factory=dict, compare=False, hash=False)
    src: tuple[str | int, ...] = field(default=(), compare=False, hash=False)

    @property
    def name(self) -> str:
        return self.path[-1]

    @property
    def outputs(self) -> tuple[str, ...]:
        """What `loop.x` names after the loop: collected outputs and final carried values."""
        return tuple(n for n, _ in self.collects) + tuple(c.name for c in self.carries)

    @property
    def dynamic(self) -> bool:
        return self.until is not None

    @property
    def temporal_group(self) -> bool:
        """A group of a loop split in time (`split-time`): it runs a subset of the loop's iterations."""
        return self.plan.split_of is not None and self.plan.iterations is not None

    def carry(self, name: str) -> Carry | None:
        return next((c for c in self.carries if c.name == name), None)

    def indices(self) -> tuple[int, ...]:
        """The iteration numbers this loop runs (a temporal split group runs a subset)."""
        if self.plan.iterations is not None:
            return self.plan.iterations
        return tuple(range(self.count or 0))


@dataclass(frozen=True)
class MergeNode:
    """Plan-only: reassembles the outputs of split groups, in their order, as the outputs of the
    original node, so that consumers keep referring to `original.port`."""

    path: tuple[str, ...]
    sources: tuple[str, ...]  # sibling group names, in batch order
    ports: tuple[tuple[str, int], ...]  # (port, concatenation dim)
    after: tuple[str, ...] = ()  # always empty (not in the format): a merge runs no call; rewrites copy items generically
    pos: SourcePos = field(default=NOWHERE, compare=False)
    # Where each field came from ("in.obs" -> position) and the item's path in the YAML document
    # (("iteration", "body", 0)); empty for items a transformation generated.
    field_pos: dict[str, SourcePos] = field(default_factory=dict, compare=False, hash=False)
    src: tuple[str | int, ...] = field(default=(), compare=False, hash=False)

    @property
    def name(self) -> str:
        return self.path[-1]

    @property
    def outputs(self) -> tuple[str, ...]:
        return tuple(p for p, _ in self.ports)


Item = Union[ExecutionNode, LoopNode, MergeNode]  # noqa: UP007 - a runtime alias


@dataclass(frozen=True)
class Workflow:
    name: str
    version: int
    params: dict[str, Any]
    components: dict[str, Component]
    root: LoopNode  # path ("iteration",)
    file: str = field(default="<string>", compare=False)
    seed: int = 0
    # a plan's metadata (`plan:` in the file: its source workflow, the rewrites that made it), None for a
    # workflow; not part of what the workflow computes
    plan: dict[str, Any] | None = field(default=None, compare=False, hash=False)

    def state_objects(self) -> dict[str, StateObject]:
        return {s.key: s for c in self.components.values() for s in c.state}

    def items(self) -> Iterator[Item]:
        """Every item, pre-order, phases included."""
        return iter_items(self.root)

    def find(self, path: tuple[str, ...]) -> Item | None:
        for item in self.items():
            if item.path == tuple(path):
                return item
        return None


_Planned = TypeVar("_Planned", bound=Union[ExecutionNode, LoopNode])  # noqa: UP007 - a runtime value


def with_plan(item: _Planned, **changes: Any) -> _Planned:
    """`item` with some of its plan-only fields (`PlanFields`) changed -- for an item that may be either
    kind, where `replace(item, plan=replace(item.plan, ...))` does not type-check over the union."""
    if isinstance(item, ExecutionNode):
        return replace(item, plan=replace(item.plan, **changes))
    return replace(item, plan=replace(item.plan, **changes))


def iter_items(item: Item) -> Iterator[Item]:
    yield item
    if isinstance(item, LoopNode):
        for child in item.body:
            yield from iter_items(child)
    elif isinstance(item, ExecutionNode) and item.phases:
        for child in item.phases:
            yield from iter_items(child)
