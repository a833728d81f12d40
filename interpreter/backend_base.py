"""The backend interface: what the runner and the optimizer may ask of any backend.

A backend takes the steps of an iteration in program order and returns, for each, one handle per
output port without waiting; a worker runs its calls in submission order and waits for the handles its
recipe needs. That is the whole scheduling rule -- each component runs its calls in program order,
calls of different components overlap as far as their data allow -- and it needs no central loop: the
futures (local) or ObjectRefs (Ray) carry the dependencies.

What a backend can do beyond that is *declared* in its `Capabilities` (the runner branches on them,
never on hasattr); an operation it lacks raises `Unsupported`. Tests implement `Backend` with fakes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rose_dsl.ir import Component, ExecutionNode, Workflow

from .schedule import Schedule, Step

__all__ = ["Backend", "Capabilities", "Unsupported", "CompileError", "WatchdogTimeout", "Overdue", "NODE_LIMIT",
           "nodes_by_component"]


class WatchdogTimeout(Exception):
    """A call did not finish in time: its node's `timeout_s`, or the run's call timeout (`limit` says which)."""

    def __init__(self, label: str, seconds: float, limit: str = "the run's call timeout") -> None:
        super().__init__(f"{label} did not finish within {seconds:g} s ({limit})")
        self.label, self.seconds, self.limit = label, seconds, limit
        self.stacks: dict[str, str] = {}  # the component processes' Python stacks when it fired


NODE_LIMIT = "the node's timeout_s"


class Overdue(TimeoutError):
    """Raised by a backend when a call ran past its limit: which call, and the limit it exceeded."""

    def __init__(self, label: str, seconds: float, limit: str = "the run's call timeout") -> None:
        super().__init__(f"{label} did not finish within {seconds:g} s ({limit})")
        self.label, self.seconds, self.limit = label, seconds, limit


class Unsupported(NotImplementedError):
    """The backend does not have the capability an operation needs (see `Capabilities`)."""


class CompileError(RuntimeError):
    """The iteration could not be compiled into one graph (the backend can still dispatch call by call)."""


@dataclass(frozen=True)
class Capabilities:
    """What a backend can do beyond submitting calls and answering control calls.

    compiled: an iteration runs as one compiled graph (`execute_iteration`), not call by call.
    processes: each component (replica) is an OS process of its own: MPS quotas apply per process, its
        stack is dumped by a signal, and a stuck call can be ended by killing the process.
    restartable: dead processes can be restarted (`restart`, `fault_domain`) and a component can move to
        a fresh process, e.g. under another MPS quota (`replace_actor`).
    replicas: data-parallel replicas of a component (one process each) are supported.
    compilable: `compile(schedule)` can make iterations run as one compiled graph.
    plans: the same component processes can run another plan of the workflow from the next iteration on
        (`load`) and take components the backend was not built with (`add_component`) -- what
        `rose optimize` needs to measure candidate plans on the workers that are training.
    pipelined: control calls can be queued behind the calls submitted so far and answered later
        (`control_later`): what lets an asynchronous plan keep several RL iterations in flight
        (`pipeline.py`) with each iteration's records and metrics its own.
    """

    compiled: bool = False
    processes: bool = False
    restartable: bool = False
    replicas: bool = False
    compilable: bool = False
    plans: bool = False
    pipelined: bool = False


class Backend(ABC):
    """Where component workers live. Handles are opaque; `result` waits for one.

    Control calls (`control(component, method)`) run on the component's worker after every call
    already submitted to it: `get_states` / `set_states` (checkpoints), `pop_records` (the invocation
    records since the last pop), `pop_metrics`, `info` (pid, SMs under the MPS quota), `overdue`.
    Failures reach the caller as CallFailed (the method raised, or the process is gone) or TimeoutError.
    """

    name: str = "?"
    stuck: bool = False  # set when a call never returned: shutdown must not wait for calls

    @property
    @abstractmethod
    def capabilities(self) -> Capabilities: ...

    @abstractmethod
    def components(self) -> list[str]:
        """The component processes (`name`, or `name#r` for replica r > 0)."""

    @abstractmethod
    def submit(self, step: Step, replica: int = 0) -> Sequence[Any]:
        """Send one call to replica `replica` of its component; one handle per output port, at once."""

    @abstractmethod
    def result(self, handle: Any, timeout: float | None) -> Any:
        """The value behind a handle; TimeoutError after `timeout` s; CallFailed if its call failed."""

    @abstractmethod
    def control(self, component: str, method: str, *args: Any, timeout: float | None = None) -> Any: ...

    def control_later(self, component: str, method: str, *args: Any) -> Callable[[float | None], Any]:
        """A control call queued now (after every call already submitted to the component) and answered
        later: a function that waits for the answer (with a timeout, as `control`); needs
        `capabilities.pipelined`."""
        raise Unsupported(f"the {self.name} backend answers control calls only at once")

    def put(self, value: Any) -> Any:
        """A handle to `value`, which calls take as if an earlier call had produced it (needs
        `capabilities.pipelined`): the values an asynchronous plan had in flight when it stopped, read after a
        resume by the calls still to come (`in_flight.py`)."""
        raise Unsupported(f"the {self.name} backend cannot take values in flight")

    @abstractmethod
    def dump_stacks(self) -> dict[str, str]:
        """The Python stacks of every component (for a watchdog report)."""

    @abstractmethod
    def shutdown(self) -> None: ...

    # -- capability-gated ---------------------------------------------------------------------
    def execute_iteration(self, k: int, timeout: float | None) -> None:
        """Run RL iteration k as one compiled graph (`capabilities.compiled`); raises `Overdue`."""
        raise Unsupported(f"the {self.name} backend does not compile iterations")

    def dead_components(self, timeout: float = 10.0) -> list[str]:
        """Component processes that do not answer (none, without processes)."""
        return []

    def fault_domain(self, names: Sequence[str], gpu_fatal: bool) -> list[str]:
        """The processes to restart along with these."""
        return sorted(names)

    def restart(self, names: Sequence[str]) -> None:
        raise Unsupported(f"the {self.name} backend cannot restart components")

    def replace_actor(self, name: str, quota: int | None, mps_env: dict[str, str] | None = None,
                      priority: int | None = None, keep: bool = False) -> dict[str, Any]:
        """Move a component to a fresh process (e.g. under another MPS quota or client priority; `priority`
        None keeps the component's), its declared state moved with it; the new process's `info`
        (`capabilities.restartable`). `keep`: the old process may stay alive, idle, to be moved back to
        (`actor_moves.py`)."""
        raise Unsupported(f"the {self.name} backend cannot move a component to a new process")

    def stop_parked(self, names: Any = None) -> None:
        """Stop the processes `replace_actor(keep=True)` left parked (of `names`; None: all). A backend
        that parks none has nothing to stop."""
        return None

    def replace_component(self, comp: Component) -> None:
        """Stop every process of `comp.name` and start `comp`'s instead -- another replica count or other
        constructor arguments (a layout: `rose optimize --layout`) -- with fresh state; the caller vouches
        that each iteration refreshes that state before anything reads it (`optimizer/layouts.py`). The
        other components keep their processes. Load a schedule afterwards (`load`): the nodes changed."""
        raise Unsupported(f"the {self.name} backend cannot change a component's processes")

    def compile(self, schedule: Schedule) -> None:
        """Compile `schedule`'s iteration into one graph (`capabilities.compilable`); afterwards
        `capabilities.compiled` holds. Raises CompileError when it cannot be compiled: the backend then
        dispatches call by call."""
        raise Unsupported(f"the {self.name} backend does not compile iterations")

    def load(self, schedule: Schedule) -> None:
        """Run `schedule`'s workflow from the next iteration on, on the same component processes
        (`capabilities.plans`): its nodes (and the loops around them) are registered with every worker
        of their component, replacing any registered under the same path, and a compiled iteration of
        the previous workflow is dropped (`compile` again to run compiled). Every component the
        workflow names must be running (`add_component`). Why: the optimizer switches between plans of
        one workflow while training, and a plan's nodes differ from the declared ones (split groups,
        rows, moved loops) while the components and their state stay the same."""
        raise Unsupported(f"the {self.name} backend cannot switch plans")

    def add_component(self, comp: Component) -> None:
        """Start the worker(s) of a component the backend was not built with (`capabilities.plans`):
        the optimizer's trial components, a temporal split's copy. Raises Unsupported for a component
        this backend cannot add now (the reason in the message)."""
        raise Unsupported(f"the {self.name} backend cannot add components")


def nodes_by_component(wf: Workflow) -> dict[str, dict[tuple[str, ...], ExecutionNode]]:
    """The execution nodes each component runs, by path (what its worker is told once)."""
    out: dict[str, dict[tuple[str, ...], ExecutionNode]] = {name: {} for name in wf.components}
    for item in wf.items():
        if isinstance(item, ExecutionNode):
            out[item.component][item.path] = item
    return out
