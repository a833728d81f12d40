"""Moving a component to another process of its own, its declared state with it, for the Ray backend
(`RayBackend` mixes this in): the way to change an MPS quota or client priority, both fixed for a
process's lifetime.

Why parking: stage 2's trials move one process back and forth -- its quota q0, a trial's q*, q0 again
for the validation's reference -- and each fresh process costs 10.9-13.5 s on an H100 (the MJX policy:
Python, its CUDA context, the model built). So with `keep`, the process a move leaves is
parked -- alive, idle, its allocator's cache emptied -- and a later move back to its settings hands the
state to it instead of starting another (the state hand-over, both ways by reference through Ray's
object store, a few seconds for a 4-GB state). The reference is then the very process stage 1 measured.

At most one parked process per GPU slot: each placement-group bundle keeps room for one process beyond
the workflow's (`GpuPlacement.share`), which the new process takes while the one it replaces is still
alive. And only when the GPU has room for both: the old process keeps its tensors, so it is parked only
when the GPU's free memory covers what it reserves twice over plus a margin (the new process will want
about as much), else stopped as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import replace as dc_replace
from typing import TYPE_CHECKING, Any

from rose_dsl.ir import Component, Workflow

from .worker import replica_of

__all__ = ["ActorMoves", "Parked"]

PARK_MARGIN_BYTES = 2 << 30  # GPU memory left free beyond two copies of the parked process's


@dataclass
class Parked:
    """A process kept alive beside its replacement: the settings it was started under and its handle."""

    comp: Component
    mps_env: dict[str, str]
    actor: Any
    pid: int

    def runs_as(self, comp: Component, mps_env: dict[str, str]) -> bool:
        return (self.comp.mps_settings, self.comp.venv, self.mps_env) == (comp.mps_settings, comp.venv, mps_env)


class ActorMoves:
    """`replace_actor` with parking. Uses the backend's `actors`, `pids`, `wf`, `mps_env`, `placement`,
    `_launch`, `_await_ready`, `_kill`, `_teardown_dag`, `compile`, `control`, `_failure`."""

    ray: Any
    actors: dict[str, Any]
    pids: dict[str, int]
    mps_env: dict[str, dict[str, str]]
    parked: dict[str, Parked]
    wf: Workflow
    placement: Any  # GpuPlacement
    _schedule: Any
    _nodes_by_comp: dict[str, Any]
    _loops: dict[Any, Any]
    _plan_key: int | None

    if TYPE_CHECKING:  # the backend's own (RayBackend)
        @property
        def dag(self) -> Any: ...
        def _launch(self, comp: Component, replica: int = 0) -> Any: ...
        def _await_ready(self, name: str) -> None: ...
        def _kill(self, name: str) -> None: ...
        def _teardown_dag(self) -> None: ...
        def _failure(self, exc: BaseException, label: str) -> BaseException: ...
        def compile(self, schedule: Any) -> None: ...
        def control(self, component: str, method: str, *args: Any, timeout: float | None = 600) -> Any: ...

    def replace_actor(self, name: str, quota: int | None, mps_env: dict[str, str] | None = None,
                      priority: int | None = None, keep: bool = False) -> dict[str, Any]:
        """Move a component to a new process (e.g. under another MPS quota or client priority, both fixed
        for a process's lifetime; `priority` None keeps the component's): its declared state is read from
        the old process, which is stopped -- or, with `keep`, parked (see the module) -- and the new one
        starts from that state: no training progress is lost. A process parked under exactly these
        settings is the new one when there is one. Returns the new process's info (`reused`: it was a parked
        one). The state goes from process to process through Ray's object store, by reference: the driver
        fetches only its size, to know the read succeeded before the old process is stopped (a 4-GB GPU
        state on the H200: 6.9 s through the driver, 5.1 s by reference; a whole replace_actor 11.4 s;
        `benchmarks/state_transfer.py`)."""
        base, r = replica_of(name)
        size, states = self.actors[name].export_states.options(num_returns=2).remote()
        try:
            self.ray.get(size, timeout=600)
        except self.ray.exceptions.RayError as exc:
            raise self._failure(exc, f"get_states of {name}") from None
        before = Parked(self.wf.components[base], dict(self.mps_env.get(base, {})), self.actors[name],
                        self.pids.get(name, -1))
        comp = dc_replace(self.wf.components[base], mps_quota=quota)
        if priority is not None:
            comp = dc_replace(comp, mps_priority=priority)
        # (a later restart starts the component under this quota and priority too)
        self.wf = dc_replace(self.wf, components={**self.wf.components, base: comp})
        if mps_env is not None:
            self.mps_env[base] = mps_env
        schedule = self._schedule if self.dag is not None else None
        self._teardown_dag()
        waiting = self.parked.pop(name, None)
        reuse = waiting if waiting is not None and waiting.runs_as(comp, self.mps_env.get(base, {})) else None
        if waiting is not None and reuse is None:
            self._stop(waiting)
        park = keep and self._room_to_park(name)
        if park and reuse is None:  # the new process takes the bundle's spare room: no other parked process
            slot = self.placement.slot_of.get(name)
            for other in [p for p in self.parked if self.placement.slot_of.get(p) == slot]:
                self._stop(self.parked.pop(other))
        try:
            if park:
                self.control(name, "park")
                self.parked[name] = before
        except Exception:  # noqa: BLE001 - it cannot idle (it died?): stopped, as without `keep`
            park = False
        if not park:
            self._kill(name)
        if reuse is not None:
            self.actors[name], self.pids[name] = reuse.actor, reuse.pid
            reuse.actor.register_nodes.remote(self._nodes_by_comp[base], self._loops, self._plan_key)
        else:
            self.actors[name] = self._launch(comp, r)
            self._await_ready(name)
        try:
            self.control(name, "set_states", states)
        except Exception:  # a parked process that died meanwhile: a fresh one takes its place
            if reuse is None:
                raise
            self.actors[name] = self._launch(comp, r)
            self._await_ready(name)
            self.control(name, "set_states", states)
        if schedule is not None:
            self.compile(schedule)
        info: dict[str, Any] = self.control(name, "info")
        self.pids[name] = int(info["pid"])
        info["reused"] = reuse is not None and info["pid"] == reuse.pid  # a parked process took the state
        return info

    def _room_to_park(self, name: str) -> bool:
        """Is there GPU memory for the process `name` runs in now beside its replacement (`park` empties
        its allocator's cache first, so this errs on the safe side)? A process without GPU memory: yes."""
        try:
            memory = self.control(name, "gpu_memory")
        except Exception:  # noqa: BLE001 - cannot tell: stop it as before
            return False
        reserved, free = int(memory.get("reserved", 0)), memory.get("free")
        return reserved == 0 or (free is not None and free >= 2 * reserved + PARK_MARGIN_BYTES)

    def _stop(self, parked: Parked) -> None:
        try:
            self.ray.kill(parked.actor)
        except (ValueError, self.ray.exceptions.RayError):  # gone already
            pass

    def stop_parked(self, names: Any = None) -> None:
        """Stop the parked processes (of `names`; None: all): a restart, a layout switch, the shutdown."""
        for name in [n for n in self.parked if names is None or n in names]:
            self._stop(self.parked.pop(name))
