"""The contract between the optimizer's search (`rose_dsl.optimizer`) and the runtime that measures for
it (`interpreter`): what a measurement is and what the runtime is asked to run. Neither side's logic.

Why a module of its own: the search is pure and imports no runtime module; the runtime implements the
search's protocols (`optimizer.records.Measurer`, `optimizer.stage2.QuotaMeasurer`, ...) structurally
and imports nothing of the search. What both must agree on lives here, in the language package both may
import: the records of a measured iteration (`Call`, `IterationRun`), the exception that says the
training iterations are spent (`OutOfBudget`), the names and IR of the two trial components that local
trials add (`FEED` replays captured inputs, `PROBE` captures them; the runtime says which classes
implement them), and the books of what the optimizer spent (`Books`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from .identity import NodePath, ProcessId
from .ir import Component, ExecutionNode, Item, LoopNode, StateObject, Workflow

__all__ = ["Books", "Call", "IterationRun", "OutOfBudget", "Window", "window", "WINDOW_MEASURED", "FEED", "PROBE",
           "feed_component", "probe_component", "call_identity", "item_sources", "component_bases", "legacy_identity"]


def legacy_identity(node: str, component: str) -> tuple[str, str]:
    """(structural node, base component) read from the names, for a record written without `Call.source`
    and `Call.base`: a profile JSON or a Chrome trace recorded before those fields existed. The names'
    `@`/`#` are the rewrites' naming convention, not identity -- a workflow may name its own node `act@1`
    -- so nothing else reads them (`item_sources`, `component_bases`)."""
    source = ".".join(part.split("@")[0] for part in node.split("."))
    return source, ProcessId.parse(component).component


def item_sources(plan: Workflow) -> dict[tuple[str, ...], str]:
    """Each item of `plan` (by executed path) -> its structural node: its path in the source workflow with
    every split group standing for the item it was split from (`split_of`), at every level of the path. What
    the search keys a node's measurements by, so that a split group's calls count as its node's."""
    out: dict[tuple[str, ...], str] = {}

    def visit(item: Item, source: tuple[str, ...]) -> None:
        own = item.plan.split_of if isinstance(item, ExecutionNode | LoopNode) and item.plan.split_of else item.name
        here = (*source, own)
        out[item.path] = ".".join(here)
        kids = item.body if isinstance(item, LoopNode) else item.phases if isinstance(item, ExecutionNode) else None
        for child in kids or ():
            visit(child, here)

    visit(plan.root, ())
    return out


def component_bases(plan: Workflow) -> dict[str, str]:
    """Each component of `plan` -> the component of the source workflow it stands for: a temporal-split
    copy is its `copy_of`, any other component itself (a data-parallel replica's processes run its
    component, so a process's base is its component's)."""
    return {name: comp.copy_of or name for name, comp in plan.components.items()}


def call_identity(plan: Workflow) -> dict[str, tuple[str, str]]:
    """Each call node of `plan` (by executed path) -> (its structural node, its component as the source
    workflow names it), from the IR's fields (`item_sources`, `component_bases`): what `Call.source` and
    `Call.base` hold, so that no reader of a measurement parses a name."""
    sources, bases = item_sources(plan), component_bases(plan)
    return {".".join(item.path): (sources[item.path], bases.get(item.component, item.component))
            for item in plan.items() if isinstance(item, ExecutionNode)}


@dataclass(frozen=True)
class Call:
    """One invocation as measured: times in ns on the clock shared with the activity sampler."""

    node: str  # executed path, `iteration.epoch.step.act@0`
    component: str  # the process that ran it (`sim`, `sim@1`, `policy#1`)
    iteration: int
    indices: tuple[int, ...]  # every enclosing loop's iteration, outermost (the RL iteration) first
    start_ns: int
    end_ns: int
    rows: int | None = None  # rows along the batch dimension, when the node is batch-separable
    activity: float | None = None  # mean activity over [start, end) (SM activity or CPU busy fraction)
    # identity from the plan's IR (`call_identity`): the node in the source workflow (split groups are their
    # node) and the component as the source workflow names it (a copy is its original, a replica its
    # component). Left out (a call of an unrewritten workflow, made by hand in a test): the call's own node
    # and process, never a parse of them (a reader of an old file uses `legacy_identity`)
    source: str = ""
    base: str = ""

    def __post_init__(self) -> None:
        if not self.source:
            object.__setattr__(self, "source", self.node)
        if not self.base:
            object.__setattr__(self, "base", self.component)

    @property
    def path(self) -> tuple[str, ...]:
        """The executed path as the IR spells it (`Item.path`), read from the record's text (`node`: what
        traces and profile JSON hold)."""
        return NodePath.parse(self.node).parts

    @property
    def seconds(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9


@dataclass(frozen=True)
class IterationRun:
    """One executed iteration (complete, or one run of a local graph): wall time and its calls."""

    seconds: float
    calls: tuple[Call, ...] = ()
    start_ns: int = 0
    end_ns: int = 0
    iteration: int = -1  # the RL iteration (complete runs); -1 for local runs
    metrics: dict[str, float] = field(default_factory=dict, compare=False)
    # device-wide SM activity samples (start ns, end ns, value) during the run, on a GPU
    activity_samples: tuple[tuple[int, int, float], ...] = field(default=(), compare=False)


WINDOW_MEASURED = 3  # measured iterations per window of an asynchronous plan (its reason: docs/optimizer.md, asynchronous plans)


@dataclass(frozen=True)
class Window:
    """How one measurement of a plan runs: `fill` iterations first (training, not timed: an asynchronous
    plan's pipeline filling up, nothing to overlap the first with), then `measured` consecutive ones timed
    together as throughput (iterations / their seconds), then `tail` more (training, not timed: the last
    iteration of a window has no next one beside it, so it runs faster than in a long run, and what is
    still deferred is drained after it). A synchronous plan: one iteration, timed alone."""

    fill: int = 0
    measured: int = 1
    tail: int = 0

    @property
    def iterations(self) -> int:
        return self.fill + self.measured + self.tail


def window(plan: Workflow) -> Window:
    """The measurement window of `plan`: a plan that defers a call by K RL iterations (`defer: K`, an
    asynchronous plan; and one more for calls run ahead, `ahead: 1`) runs K fill iterations, `WINDOW_MEASURED` measured ones and one tail iteration
    pipelined, without a drain between them; any other plan one iteration."""
    nodes = [i for i in plan.root.body if isinstance(i, ExecutionNode)]
    fill = max((i.plan.defer for i in nodes), default=0) + max((i.plan.ahead for i in nodes), default=0)
    return Window(fill, WINDOW_MEASURED, 1) if fill else Window()


class OutOfBudget(Exception):
    """The time budget or the workflow's iterations are spent: stop with what is validated."""


FEED = "__feed__"  # the component (and node) that replays captured inputs in a local graph
PROBE = "__probe__"  # the component whose nodes capture them during a real iteration


def feed_component(impl: str) -> Component:
    """The `FEED` component, implemented by `impl` (the runtime's class, `module:Class`)."""
    return Component(name=FEED, impl=impl, args={}, device="cpu", state=(StateObject(FEED, "values", "values"),))


def probe_component(impl: str) -> Component:
    """The `PROBE` component, implemented by `impl` (the runtime's class, `module:Class`)."""
    return Component(name=PROBE, impl=impl, args={}, device="cpu", state=(StateObject(PROBE, "captured", "captured"),))


@dataclass
class Books:
    """What the optimizer spent, row by row (counts and seconds), written by the runtime's measuring session,
    by the search's stages and by the command, read by the report. Typed: a misspelt row is an error, not a
    zero in the report."""

    complete_iterations: int = 0  # training iterations (retained), and their seconds
    complete_s: float = 0.0
    first_iteration_s: float = 0.0  # the first one's (start-up costs of its own)
    local_runs: int = 0  # runs of local trials on snapshots (not training), with their snapshots
    local_s: float = 0.0
    local_abandoned: int = 0  # repeats not run: the alternative was clearly slower
    captures: int = 0  # probe iterations that captured a region's inputs
    capture_s: float = 0.0
    snapshot_s: float = 0.0  # state copies kept before trials (local trials' and guards')
    guard_snapshots: int = 0  # copies kept before a plan's first iteration ever (lost if it fails)
    guard_snapshot_s: float = 0.0
    quota_trials: int = 0  # stage 2's measurements, and its time no other row books (`stage2._book_stage2`)
    quota_s: float = 0.0
    quota_moves: int = 0  # processes moved under other MPS settings, how many to a parked process
    quota_moves_to_parked: int = 0
    quota_checks: int = 0  # quota levels self-checked, and the time of the checks (once per machine)
    quota_check_s: float = 0.0
    quota_check_prefetch_s: float = 0.0  # the check started with the processes: its wall time
    quota_check_prefetch_levels: int = 0
    quota_check_beside_training_s: float = 0.0  # of it, beside the first (untimed) training iteration
    layout_switches: int = 0  # layout trials' process switches
    layout_s: float = 0.0
    startup_s: float = 0.0  # the processes' start-up, and what ran before and around it
    setup_s: float = 0.0
    prepare_s: float = 0.0  # plan switches (the executor's preparation) and how many plans were loaded
    plan_loads: int = 0
    checkpoint_s: float | None = None  # the hand-over checkpoint (None: none was written)
    settle_s: float | None = None  # `--train`: moving processes to the plan's settings (None: no --train)
    settled: int = 0

    def to_json(self) -> dict[str, Any]:
        """The rows, without those that did not happen (None)."""
        return {k: v for k, v in asdict(self).items() if v is not None}
