"""Execution backends: where component workers live and how calls reach them.

* `LocalBackend` (`local_backend.py`): one thread per component in this process (tests, one GPU
  without MPS).
* `RayBackend` (`ray_backend.py`): one process (actor) per component and replica; GPU actors get their
  MPS quota and the component's own environment through the actor's runtime environment. Compiled
  (`RayBackend.compile`), an iteration is one Ray Compiled Graph execution.

Both implement `Backend` (`backend_base.py`) and declare what they can do in `Capabilities`.
`make_backend` builds one from the `rose execute` options, with an explicit, printed fallback when
compiling fails.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from rose_dsl.importcheck import DEFAULT_ALLOWED
from rose_dsl.ir import Workflow

from .backend_base import Backend, Capabilities, CompileError, Overdue, Unsupported, WatchdogTimeout
from .local_backend import LocalBackend
from .ray_backend import RayBackend
from .schedule import Schedule
from .worker import CallFailed, group_of

__all__ = [
    "Backend", "Capabilities", "Unsupported", "CompileError", "CallFailed", "WatchdogTimeout", "Overdue",
    "LocalBackend", "RayBackend", "make_backend", "default_backend", "group_of",
]


def default_backend(wf: Workflow) -> str:
    """The backend `rose execute` uses when none is named: Ray for a workflow with GPU components or
    data-parallel replicas, the local backend otherwise.

    Why not threads for GPU work: the local backend's components share one process -- one GIL and one
    CUDA context -- so a GPU component's kernel launches wait behind the other components' Python, and
    every call's device sync serialises them; measured on the H200 (issue 13), `policy.act` of
    `embodied_ppo_gpu.yaml` took 41.5 ms on the local backend against 24.4 ms called directly and 32.1 ms
    on Ray (`benchmarks/call_overhead.py` breaks the difference down)."""
    needs_processes = any(c.device == "gpu" or c.replicas > 1 for c in wf.components.values())
    return "ray" if needs_processes else "local"


def make_backend(kind: str, wf: Workflow, schedule: Schedule, *, compiled: bool = True, address: str | None = None,
                 mps_env: Mapping[str, Mapping[str, str]] | None = None, device: str = "cpu",
                 allowed: Sequence[str] = DEFAULT_ALLOWED, log: Callable[[str], None] = print) -> Backend:
    """The backend `rose execute --backend KIND` runs on, ready for `Runner`.

    kind: "local" (threads of this process) or "ray" (one process per component and replica).
    compiled: on Ray, compile each iteration into a Ray Compiled Graph; if that fails, the backend
        dispatches call by call on the same processes and `log` is told why (the fallback is never
        silent). Ignored by the local backend.
    address: an existing Ray cluster to join (None: start one for this run).
    mps_env: per component, the MPS client environment of its GPU processes (from `MpsDaemon.client_env`).
    device: the device GPU components are built on ("cuda" or "cpu").
    allowed: module prefixes components may be imported from.
    Raises ValueError for a workflow the backend cannot run (replicas on the local backend), and
    CallFailed when a component cannot be started.
    """
    if schedule.workflow is not wf:
        raise ValueError("make_backend: the schedule was built for another workflow")
    if kind == "local":
        most = max((c.replicas for c in wf.components.values()), default=1)
        if most > 1:
            raise ValueError(f"replicas: {most} needs --backend ray (one process per replica)")
        return LocalBackend(wf, allowed, schedule.program.loops_of, device)
    if kind != "ray":
        raise ValueError(f"unknown backend {kind!r} (local or ray)")
    be = RayBackend(wf, allowed, schedule.program.loops_of, address=address,
                    mps_env={k: dict(v) for k, v in (mps_env or {}).items()})
    # (a loop that ends on a condition, or an asynchronous plan's iterations in flight together: call by call)
    if compiled and not schedule.dynamic and schedule.depth == 1:
        try:
            be.compile(schedule)
        except CompileError as exc:
            log(f"warning: cannot compile the iteration into a Ray Compiled Graph ({exc}); dispatching call by call")
    return be
