"""The Ray backend: one process (actor) per component and data-parallel replica.

GPU actors get their MPS quota and the component's own environment (`env`, `python_path`, `venv`)
through the actor's runtime environment, and a placement-group bundle per GPU slot. Calls go either
one by one (`submit`: Ray resolves each call's input ObjectRefs, so data moves producer -> consumer) or,
after `compile`, as one Ray Compiled Graph per RL iteration: every call bound once, in program order,
with the iteration number as the graph's input, so an iteration is one `execute(k)` with no per-call
scheduling by the driver or by Ray's scheduler.

The graphs of the last few plans stay compiled (`GRAPH_CACHE`): `rose optimize` alternates plans every
iteration to compare them, and compiling a graph cost it seconds per switch on the H200 (104 s for 16
switches on Meta-World, 2026-12-03). Each graph runs its own execution loop in every actor it uses, on a
thread of Ray's `_ray_system` concurrency group, which the actors get one more thread of than there are
cached graphs (with Ray's default of one thread, a second graph's compilation waits forever for the
first graph's loop). Only one graph executes at a time: the driver waits for each iteration.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rose_dsl.ir import Component, ExecutionNode, Workflow

from .backend_base import (
    NODE_LIMIT,
    Backend,
    Capabilities,
    CompileError,
    Overdue,
    Unsupported,
    nodes_by_component,
)
from .procs import pid_alive
from .schedule import Schedule, Step, replicated
from .worker import CallFailed, ComponentWorker, replica_name

__all__ = ["RayBackend", "GpuPlacement", "GRAPH_CACHE"]

PROJECT_ROOT = str(Path(__file__).resolve().parent.parent)
GRAPH_CACHE = 4  # compiled graphs kept per backend (the reference and up to three candidates of a comparison)


@dataclass
class _Graph:
    """A plan's compiled iteration and what the backend knows about its call sites."""

    schedule: Schedule  # (held: its id is the plan's key while the graph lives)
    dag: Any
    site_of: dict[int, tuple[int, str]]  # id(graph node) -> (site, producing process)
    readers: dict[int, list[tuple[str, str]]]  # site -> (process, method) of each reading call
    to_driver: set[int]  # sites whose values the driver reads
    poll_s: float | None  # how often to look for overdue calls while an iteration runs


def _free_tcp() -> str:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def _wants_process_group(comp: Component, allowed: Sequence[str]) -> bool:
    from .components import wants_process_group

    return wants_process_group(comp, allowed)


@dataclass(frozen=True)
class GpuPlacement:
    """Which GPU slot each GPU process runs on: replica r of a component on slot `gpu + r` (`gpu`
    defaults to 0). All components on the same slots is the colocated mode; components on disjoint
    slots (e.g. the simulator on `gpu: 0`, policy and trainer on `gpu: ${replicas}`) the disaggregated
    one. Slots are the bundles of one placement group, i.e. distinct physical GPUs."""

    slot_of: dict[str, int]  # process name (`name#r`) -> slot

    @classmethod
    def of(cls, wf: Workflow) -> GpuPlacement:
        return cls({replica_name(name, r): (comp.gpu or 0) + r
                    for name, comp in wf.components.items() if comp.device == "gpu"
                    for r in range(comp.replicas)})

    @property
    def slots(self) -> int:
        return max(self.slot_of.values(), default=-1) + 1

    def slot(self, component: str, replica: int) -> int | None:
        return self.slot_of.get(replica_name(component, replica))

    def share(self, slot: int) -> float:
        return 1.0 / sum(1 for s in self.slot_of.values() if s == slot)

    def distinct(self, component: str) -> bool:
        """Do the component's replicas run on distinct GPUs (what NCCL requires)?"""
        mine = [s for p, s in self.slot_of.items() if p.partition("#")[0] == component]
        return len(set(mine)) == len(mine)

    def describe(self) -> str:
        by_slot: dict[int, list[str]] = {}
        for process, slot in sorted(self.slot_of.items(), key=lambda kv: kv[1]):
            by_slot.setdefault(slot, []).append(process)
        return "; ".join(f"GPU {s}: {', '.join(ps)}" for s, ps in by_slot.items())


class RayBackend(Backend):
    """Component processes on Ray; per-call dispatch, or one compiled graph per iteration after `compile`."""

    def __init__(self, wf: Workflow, allowed: Sequence[str], loops_of, address: str | None = None,
                 mps_env: dict[str, dict[str, str]] | None = None, gpus: int | None = None,
                 start_timeout_s: float = 300.0, gpu_device: str = "cuda") -> None:
        import ray

        self.ray = ray
        # compiled iterations by plan key (id of the schedule), least recently used first; `_current` is the
        # one `execute_iteration` runs (set before the actors start: a failed start shuts down)
        self._graphs: dict[int, _Graph] = {}
        self._current: _Graph | None = None
        self._site_of: dict[int, tuple[int, str]] = {}
        self._readers: dict[int, list[tuple[str, str]]] = {}
        self._to_driver: set[int] = set()
        self._schedule: Schedule | None = None
        self._plan_key: int | None = None  # the loaded schedule's key (its nodes are registered under it)
        self._poll_s: float | None = None  # how often to look for overdue calls while a compiled iteration runs
        self.started_cluster = False
        self._reaper = None
        if not ray.is_initialized():
            kwargs: dict[str, Any] = {"include_dashboard": False, "logging_level": "ERROR", "log_to_driver": True}
            if address:
                kwargs["address"] = address
            else:
                kwargs["num_cpus"] = max(2, len(wf.components) + 1)
                if gpus is not None:
                    kwargs["num_gpus"] = gpus
            ray.init(**kwargs)
            self.started_cluster = not address
            if self.started_cluster:
                from .reaper import start_reaper

                try:
                    session = ray._private.worker.global_worker.node.get_session_dir_path()
                except (AttributeError, RuntimeError, OSError):  # a private Ray API: no session dir known, no reaper
                    session = ""
                self._reaper = start_reaper(session)
        from .tensor_transport import register

        register()  # the driver sends and receives tensors too (states, snapshots, metrics)
        self.wf = wf
        self.allowed = list(allowed)
        self.mps_env = dict(mps_env or {})
        import tempfile

        self.stack_dir = tempfile.mkdtemp(prefix="rose-stacks-")
        self.stuck = False  # set when the watchdog fired: shutdown does not wait for calls
        self.pids: dict[str, int] = {}
        self.start_timeout_s = start_timeout_s
        self.actors: dict[str, Any] = {}
        self._placement_group: Any = None
        # (concurrency groups can only be given here, not per actor in `.options`)
        self._worker_cls = ray.remote(concurrency_groups={"_ray_system": GRAPH_CACHE + 1})(  # type: ignore[call-overload]
            ComponentWorker)
        self._nodes_by_comp = nodes_by_component(wf)
        self._loops = {p: tuple(v) for p, v in loops_of.items()}
        self._has_gpu = bool(ray.cluster_resources().get("GPU", 0))
        self.gpu_device = gpu_device  # "cpu" lets tests place processes on a cluster's logical GPUs
        self.placement = GpuPlacement.of(wf)
        self._placement_group = self._reserve_gpus() if self._has_gpu and self.placement.slots else None
        self._dist: dict[str, tuple[str, str]] = {}
        for name, comp in wf.components.items():
            if comp.replicas > 1 and _wants_process_group(comp, self.allowed):
                on_gpu = comp.device == "gpu" and self._has_gpu and self.gpu_device != "cpu"
                # NCCL needs one GPU per rank; replicas sharing a GPU talk through gloo
                self._dist[name] = (_free_tcp(), "nccl" if on_gpu and self.placement.distinct(name) else "gloo")
            for r in range(comp.replicas):
                self.actors[replica_name(name, r)] = self._launch(comp, r)
        # construction errors surface here, named by component
        for name in list(self.actors):
            self._await_ready(name)

    def _reserve_gpus(self) -> Any:
        """One placement-group bundle per GPU slot the workflow uses (`gpu:` + replica), so a replica's
        processes land on the GPU the workflow gave them; the bundle's processes share that GPU."""
        from ray.util.placement_group import placement_group

        have = int(self.ray.cluster_resources().get("GPU", 0))
        if self.placement.slots > have:
            raise CallFailed("placing components", "?", f"the workflow places processes on {self.placement.slots} "
                             f"GPUs ({self.placement.describe()}) but the Ray cluster has {have}")
        group = placement_group([{"GPU": 1.0}] * self.placement.slots, strategy="PACK")
        try:
            self.ray.get(group.ready(), timeout=self.start_timeout_s)
        except self.ray.exceptions.RayError as exc:  # (a timeout too)
            raise CallFailed("placing components", "?", f"could not reserve {self.placement.slots} GPUs: "
                             f"{_unwrap(exc)}") from None
        return group

    def _launch(self, comp: Component, replica: int = 0) -> Any:
        env = self._env(comp, self.mps_env.get(comp.name, {}))
        options: dict[str, Any] = {"num_cpus": 0, "max_concurrency": 1, "max_restarts": 0,
                                   "runtime_env": {"env_vars": env}}
        if comp.venv:
            options["runtime_env"]["py_executable"] = str(Path(comp.venv) / "bin" / "python")
        slot = self.placement.slot(comp.name, replica)
        if slot is not None and self._placement_group is not None:
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

            options["num_gpus"] = self.placement.share(slot)  # the processes on one GPU split it
            options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                placement_group=self._placement_group, placement_group_bundle_index=slot)
        device = self.gpu_device if slot is not None and self._has_gpu else "cpu"
        dist_init, dist_backend = self._dist.get(comp.name, (None, "gloo"))
        actor: Any = self._worker_cls.options(**options).remote(comp, self.wf.seed, device, self.allowed, True,
                                                           slot, 2, replica, dist_init, dist_backend)
        actor.register_nodes.remote(self._nodes_by_comp[comp.name], self._loops, self._plan_key)
        return actor

    def _await_ready(self, name: str) -> None:
        try:
            info = self.ray.get(self.actors[name].info.remote(), timeout=self.start_timeout_s)
        except self.ray.exceptions.RayError as exc:  # the constructor raised, the process died, or a timeout
            self.shutdown()
            raise CallFailed(f"starting component '{name}'", name, _unwrap(exc)) from None
        self.pids[name] = info["pid"]

    def dump_stacks(self) -> dict[str, str]:
        """Ask every component process for its Python stacks (SIGUSR1 -> faulthandler) and read them."""
        import signal
        import time as _time

        files = {}
        for name, pid in self.pids.items():
            path = Path(self.stack_dir) / f"stack-{name}-{pid}.txt"
            try:
                os.kill(pid, signal.SIGUSR1)
                files[name] = path
            except OSError:
                continue
        _time.sleep(0.5)
        return {name: path.read_text() for name, path in files.items() if path.exists()}

    def dead_components(self, timeout: float = 10.0) -> list[str]:
        """Components whose process does not answer within `timeout` -- asked all at once, so that the
        answer takes at most `timeout` however many are dead (one by one, six dead processes took a
        minute: Ray's own services killed under a run, 2026-12-02)."""
        refs: dict[str, Any] = {}
        dead = []
        for name, actor in self.actors.items():
            try:
                refs[name] = actor.info.remote()
            except self.ray.exceptions.RayError:
                dead.append(name)
        ready, _ = self.ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout) if refs else ([], [])
        answered = set(ready)
        for name, ref in refs.items():
            if ref not in answered:
                dead.append(name)  # no answer in time
                continue
            try:
                self.ray.get(ref, timeout=0)
            except self.ray.exceptions.RayError:  # the process is gone
                dead.append(name)
        return sorted(dead, key=list(self.actors).index)

    def fault_domain(self, names: Sequence[str], gpu_fatal: bool) -> list[str]:
        """The processes to restart with these: after a fatal GPU error in an MPS client, every MPS
        client on the same GPU (the server fails them all, and admits new clients only once all have
        exited); otherwise just these."""
        out = set(names)
        if gpu_fatal:
            under_mps = {p for p in self.placement.slot_of if self.mps_env.get(p.partition("#")[0])}
            for name in names:
                slot = self.placement.slot_of.get(name)
                if name in under_mps and slot is not None:
                    out |= {p for p in under_mps if self.placement.slot_of[p] == slot}
        return sorted(out)

    def restart(self, names: Sequence[str]) -> None:
        """Start fresh processes for these components (their state is restored by the caller). All are
        stopped before any starts: an MPS server recovering from a fatal error waits for that."""
        for name in names:
            base, _, r = name.partition("#")
            comp = self.wf.components[base]
            if comp.replicas > 1 and _wants_process_group(comp, self.allowed):
                raise CallFailed(f"restarting '{name}'", name, "a data-parallel replica cannot rejoin its process "
                                 "group alone; restart the run with --resume", died=True)
        schedule = self._schedule if self.dag is not None else None
        self._teardown_dag()  # a compiled graph holds channels to every actor: compiled again below
        for name in names:
            self._kill(name)
        self._wait_gone([self.pids[n] for n in names if n in self.pids])
        for name in names:
            base, _, r = name.partition("#")
            self.actors[name] = self._launch(self.wf.components[base], int(r or 0))
        for name in names:
            self._await_ready(name)
        if schedule is not None:
            self.compile(schedule)

    def _kill(self, name: str) -> None:
        try:
            self.ray.kill(self.actors[name])
        except (KeyError, ValueError, self.ray.exceptions.RayError):  # gone already
            pass

    @staticmethod
    def _wait_gone(pids: Sequence[int], timeout: float = 30.0) -> None:
        """Wait (bounded) until these processes have exited."""
        import time as _time

        deadline = _time.monotonic() + timeout
        while any(pid_alive(p) for p in pids) and _time.monotonic() < deadline:
            _time.sleep(0.05)

    def load(self, schedule: Schedule) -> None:
        """Register `schedule`'s nodes with every actor under the plan's key (one round trip each, in
        parallel), or, when its graph is still compiled, just make it the plan the actors run. The
        previous plan's compiled graph stops being the one that runs (`compile` makes this plan's)."""
        wf = schedule.workflow
        missing = [name for name in wf.components if replica_name(name, 0) not in self.actors]
        if missing:
            raise ValueError(f"load: component(s) {', '.join(missing)} not running (add_component first)")
        self._current = None
        self._schedule = schedule
        key = self._plan_key = id(schedule)
        self._loops = {p: tuple(v) for p, v in schedule.program.loops_of.items()}
        self._nodes_by_comp = {**{name: {} for name in self._nodes_by_comp}, **nodes_by_component(wf)}
        if key in self._graphs:
            refs = [actor.use_plan.remote(key) for actor in self.actors.values()]
        else:
            refs = [actor.register_nodes.remote(self._nodes_by_comp[name.partition("#")[0]], self._loops, key)
                    for name, actor in self.actors.items()]
        try:
            self.ray.get(refs, timeout=self.start_timeout_s)
        except self.ray.exceptions.RayError as exc:
            raise self._failure(exc, "registering a plan's nodes") from None

    def add_component(self, comp: Component) -> None:
        """Start the processes of a component the workflow did not have (the optimizer's trial components,
        a temporal split's copy). GPU slots are reserved at start, so a GPU component cannot be added to
        a cluster with GPUs (Unsupported): start the backend with it instead."""
        if comp.device == "gpu" and self._placement_group is not None:
            raise Unsupported(f"cannot add GPU component '{comp.name}' after the GPUs were placed (GPU placement "
                              "is fixed when the processes start)")
        if replica_name(comp.name, 0) in self.actors:
            raise ValueError(f"component '{comp.name}' is already running")
        from dataclasses import replace as dc_replace

        self.wf = dc_replace(self.wf, components={**self.wf.components, comp.name: comp})
        self._nodes_by_comp.setdefault(comp.name, {})
        names = [replica_name(comp.name, r) for r in range(comp.replicas)]
        for r, name in enumerate(names):
            self.actors[name] = self._launch(comp, r)
        for name in names:
            self._await_ready(name)

    def replace_actor(self, name: str, quota: int | None, mps_env: dict[str, str] | None = None) -> dict[str, Any]:
        """Move a component to a new process (e.g. under another MPS quota, which is fixed for a process's
        lifetime): its declared state is read from the old actor, the old one is stopped, and the new one
        starts from that state -- no training progress is lost. Returns the new process's info. The state
        goes from process to process through Ray's object store, by reference: the driver fetches only its
        size, to know the read succeeded before the old process is stopped (a 4-GB GPU state on the H200: 6.9 s
        through the driver, 5.1 s by reference; a whole replace_actor 11.4 s; `benchmarks/state_transfer.py`)."""
        from dataclasses import replace as dc_replace

        base, _, r = name.partition("#")
        size, states = self.actors[name].export_states.options(num_returns=2).remote()
        try:
            self.ray.get(size, timeout=600)
        except self.ray.exceptions.RayError as exc:
            raise self._failure(exc, f"get_states of {name}") from None
        comp = dc_replace(self.wf.components[base], mps_quota=quota)
        # (a later restart starts the component under this quota too)
        self.wf = dc_replace(self.wf, components={**self.wf.components, base: comp})
        if mps_env is not None:
            self.mps_env[base] = mps_env
        schedule = self._schedule if self.dag is not None else None
        self._teardown_dag()
        self._kill(name)
        self.actors[name] = self._launch(comp, int(r or 0))
        self._await_ready(name)
        self.control(name, "set_states", states)
        if schedule is not None:
            self.compile(schedule)
        return self.control(name, "info")

    def replace_component(self, comp: Component) -> None:
        """A layout switch: `comp.name`'s processes stopped, `comp`'s (its replica count, its args) started
        fresh. A start that fails stops the new processes and raises CallFailed, leaving the backend
        running without that component (the caller puts the old definition back)."""
        from dataclasses import replace as dc_replace

        old = self.wf.components[comp.name]
        for c in (old, comp):
            if c.device == "gpu" and self._placement_group is not None:
                raise Unsupported(f"cannot change GPU component '{c.name}''s processes (GPU placement is fixed when "
                                  "the processes start)")
            if c.replicas > 1 and _wants_process_group(c, self.allowed):
                raise Unsupported(f"'{c.name}''s replicas form a torch.distributed group, which is fixed when the "
                                  "processes start")
        self._teardown_dag()
        self._schedule = self._plan_key = None
        names = [n for n in self.actors if n.partition("#")[0] == comp.name]
        for name in names:
            self._kill(name)
        self._wait_gone([self.pids.pop(n) for n in names if n in self.pids])
        for name in names:
            del self.actors[name]
        self.wf = dc_replace(self.wf, components={**self.wf.components, comp.name: comp})
        new = [replica_name(comp.name, r) for r in range(comp.replicas)]
        for r, name in enumerate(new):
            self.actors[name] = self._launch(comp, r)
        for name in new:
            try:
                info = self.ray.get(self.actors[name].info.remote(), timeout=self.start_timeout_s)
            except self.ray.exceptions.RayError as exc:  # a constructor raised, a process died, a timeout
                for other in new:
                    self._kill(other)
                    self.actors.pop(other, None)
                    self.pids.pop(other, None)
                raise CallFailed(f"starting component '{name}'", name, _unwrap(exc)) from None
            self.pids[name] = info["pid"]

    def _env(self, comp: Component, mps: dict[str, str]) -> dict[str, str]:
        env = {k: str(v) for k, v in comp.env.items()}
        env.update(mps)
        env["ROSE_STACK_DIR"] = self.stack_dir
        paths = [*comp.python_path, PROJECT_ROOT, *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]]
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
        env.setdefault("PYTHONUNBUFFERED", "1")
        env.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast off (required on the multi-GPU hosts)
        return env

    @property
    def dag(self) -> Any:
        """The compiled graph `execute_iteration` runs (None: calls are dispatched one by one)."""
        return self._current.dag if self._current is not None else None

    @property
    def name(self) -> str:  # type: ignore[override]
        return "ray-compiled" if self.dag is not None else "ray"

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(compiled=self.dag is not None, processes=True, restartable=True, replicas=True,
                            compilable=True, plans=True)

    def components(self) -> list[str]:
        return list(self.actors)

    def submit(self, step: Step, replica: int = 0) -> Sequence[Any]:
        n = max(1, len(step.node.outputs))
        actor = self.actors[replica_name(step.node.component, replica)]
        # `after` handles travel inside a tuple, so Ray does not fetch their values (the worker waits for them)
        refs = actor.call_flat.options(num_returns=n).remote(step.label, step.node.path, step.recipe,
                                                             step.inv.indices, step.after, *step.handles)
        return (refs,) if n == 1 else tuple(refs)

    def result(self, handle: Any, timeout: float | None) -> Any:
        try:
            return self.ray.get(handle, timeout=timeout)
        except self.ray.exceptions.RayError as exc:
            raise self._failure(exc, "a call") from None

    def _failure(self, exc: BaseException, label: str) -> BaseException:
        """A Ray error as rose sees it: a timeout, a component's call failure, or a dead process."""
        errors = self.ray.exceptions
        if isinstance(exc, errors.GetTimeoutError | getattr(errors, "RayChannelTimeoutError", errors.GetTimeoutError)):
            return TimeoutError()
        if isinstance(exc, errors.RayActorError):
            who = ", ".join(self.dead_components()) or "?"
            return CallFailed(label, who, f"the process of component {who} died: {_unwrap(exc)}", died=True)
        if isinstance(exc, errors.RayTaskError):
            cause = getattr(exc, "cause", None)
            return cause if isinstance(cause, CallFailed) else CallFailed(label, "?", _unwrap(exc))
        return exc

    def control(self, component: str, method: str, *args: Any, timeout: float | None = 600) -> Any:
        try:
            return self.ray.get(getattr(self.actors[component], method).remote(*args), timeout=timeout)
        except self.ray.exceptions.RayError as exc:
            raise self._failure(exc, f"{method} of {component}") from None

    # -- compiled iterations ----------------------------------------------------------------
    def compile(self, schedule: Schedule) -> None:
        """Compile the RL iteration of `schedule` (the loaded one) into one Ray Compiled Graph, its number
        the graph's input, or take its graph from the cache when it was compiled before. Raises
        CompileError (then the backend still dispatches call by call)."""
        key = id(schedule)
        if self._schedule is not schedule:  # (compile without load: the nodes are the ones the actors have)
            self._schedule, self._plan_key = schedule, key
            nodes = nodes_by_component(schedule.workflow)
            loops = {p: tuple(v) for p, v in schedule.program.loops_of.items()}
            self.ray.get([a.register_nodes.remote(nodes.get(n.partition("#")[0], {}), loops, key)
                          for n, a in self.actors.items()], timeout=self.start_timeout_s)
        graph = self._graphs.pop(key, None)
        if graph is None:
            while len(self._graphs) >= GRAPH_CACHE:  # the least recently used goes (its loop holds a thread)
                self._drop_graph(next(iter(self._graphs)))
            try:
                dag = self._build_dag(schedule)
            except Exception as exc:  # noqa: BLE001 - Ray raises many kinds here; each means "not compiled", said once
                raise CompileError(f"{type(exc).__name__}: {exc}") from exc
            limits = [n.timeout_s for n in schedule.workflow.items() if isinstance(n, ExecutionNode) and n.timeout_s]
            # a node's timeout_s is watched by asking the workers for an overdue call, ten times per limit
            poll_s = min(1.0, max(0.02, min(limits) / 10)) if limits else None
            graph = _Graph(schedule, dag, self._site_of, self._readers, self._to_driver, poll_s)
        self._graphs[key] = graph  # (most recently used last)
        self._current = graph
        self._site_of, self._readers, self._to_driver = graph.site_of, graph.readers, graph.to_driver
        self._poll_s = graph.poll_s
        self._set_device_sites(key)

    def _build_dag(self, schedule: Schedule) -> Any:
        """One DAG node per call, bound in program order. A compiled graph runs each actor's calls in
        the order they were bound (Ray's rule: an edge from each compute to the actor's next), so a
        component still runs its calls in program order with no ordering inputs. Two exceptions: a call
        whose outputs nobody reads (yet) hands them to its component's next call, so that the graph's
        outputs are one call per component instead of every call without consumers; and a call without
        data inputs takes its component's previous call as one (Ray wants every node to lead back to the
        graph's input; a component's first call reads the input itself)."""
        from ray.dag import InputNode, MultiOutputNode

        from .recipe import K

        plan = id(schedule)
        last_on: dict[str, Any] = {}
        consumed: set[int] = set()
        nodes: list[Any] = []
        # who reads each call's value (for CUDA IPC between processes on one GPU: `_set_device_sites`)
        self._site_of = {}  # id(graph node) -> (site, producing process)
        self._readers = {}  # site -> (process, method) of each reading call
        with InputNode() as inp:
            def bind(step: Step, replica: int = 0) -> Sequence[Any]:
                unique: list[Any] = []
                index: dict[int, int] = {}
                ports = []
                for h in step.handles:
                    key = id(h.node)
                    if key not in index:
                        index[key] = len(unique)
                        unique.append(h.node)
                    ports.append((index[key], -1 if h.whole else h.index))
                    consumed.add(key)
                comp = replica_name(step.node.component, replica)
                previous = last_on.get(comp)
                # an `after:` is an input nobody reads (it carries the earlier call's outputs to this process)
                tokens = list({id(h.node): h.node for h in step.after if id(h.node) not in index}.values())
                # (a call without inputs also needs one: every graph node must lead back to the graph's input)
                if previous is not None and (id(previous) not in consumed or not (unique or tokens)):
                    tokens += [] if any(t is previous for t in tokens) else [previous]
                consumed.update(id(t) for t in tokens)
                # only a component's first call reads the iteration number from the graph's input; its
                # later calls (in order, in the same process) reuse it -- one reader of the input per actor
                k_arg = inp if previous is None else None
                site = len(nodes)
                node = self.actors[comp].call_compiled.bind(plan, step.node.path, step.recipe, step.inv.indices,
                                                            tuple(ports), site, k_arg, *unique, *tokens)
                method = step.node.call.partition(".")[2]
                for read in (*unique, *tokens):  # a token is deserialised by its reader too
                    self._readers.setdefault(self._site_of[id(read)][0], []).append((comp, method))
                self._site_of[id(node)] = (site, comp)
                last_on[comp] = node
                nodes.append(node)
                whole = len(step.node.outputs) <= 1  # such a call returns its value, not a 1-tuple (cheaper)
                return tuple(_CGPort(node, i, whole) for i in range(max(1, len(step.node.outputs))))

            replicas = max((c.replicas for c in self.wf.components.values()), default=1)
            schedule.steps(K, bind if replicas == 1 else replicated(bind, self.wf))
            leaves = [n for n in nodes if id(n) not in consumed]
            self._to_driver = {self._site_of[id(n)][0] for n in leaves}
            out = MultiOutputNode(leaves)
        return out.experimental_compile()

    def _set_device_sites(self, plan: int) -> None:
        """Tell each GPU process which of its calls in `plan`'s compiled graph send their CUDA tensors by
        IPC (`device_site_plan`). Every GPU process is told (an empty set too): it is also how a process
        learns that this graph runs now, so the clones it kept for the other graphs' readers can go."""
        if self._placement_group is None or self.gpu_device == "cpu" or not self.placement.slot_of:
            return
        slot = {p: self.placement.slot_of.get(p) for p in self.actors}
        if os.environ.get("ROSE_CUDA_IPC", "1") == "0":  # off: every value leaves its process through the host
            slot = {p: None for p in slot}
        names = sorted({r for reads in self._readers.values() for r, _ in reads if slot.get(r) is not None})
        device_inputs = dict(zip(names, (set(m) for m in self.ray.get(
            [self.actors[n].device_inputs.remote() for n in names], timeout=self.start_timeout_s)), strict=True))
        sites = self.device_site_plan(slot, device_inputs)
        self.ray.get([self.actors[p].set_device_sites.remote(sorted(sites.get(p, ())), plan)
                      for p in self.actors if self.placement.slot_of.get(p) is not None], timeout=self.start_timeout_s)

    def device_site_plan(self, slot: Mapping[str, int | None], device_inputs: Mapping[str, set[str]]) -> dict[str, set[int]]:
        """The compiled graph's call sites (per producing process) whose CUDA tensors may go by IPC, given
        each process's GPU slot and the methods of each that take device tensors: `tensor_transport.ipc_sites`
        over who reads each call's value in the graph (a token input counts: Ray deserialises it too)."""
        from .tensor_transport import ipc_sites

        producer = {site: proc for site, proc in self._site_of.values()}
        return ipc_sites(producer, self._readers, self._to_driver, slot, device_inputs)

    def execute_iteration(self, k: int, timeout: float | None) -> None:
        """Run RL iteration k; Overdue when a call outlives its node's `timeout_s` or the iteration `timeout`."""
        if self.dag is None:
            raise CompileError("execute_iteration before compile")
        ref = self.dag.execute(k)
        if self._poll_s is None:
            self._wait_iteration(ref, k, timeout)
            return
        import threading

        failure: list[BaseException] = []
        done = threading.Event()

        def wait() -> None:
            try:
                self._wait_iteration(ref, k, timeout)
            except BaseException as exc:  # noqa: BLE001 - handed to the driver thread, raised there
                failure.append(exc)
            finally:
                done.set()

        threading.Thread(target=wait, name="rose-iteration", daemon=True).start()
        while not done.wait(self._poll_s):
            late = self._overdue()
            if late is not None:
                raise Overdue(*late, NODE_LIMIT)
        if failure:
            raise failure[0]

    def _wait_iteration(self, ref: Any, k: int, timeout: float | None) -> None:
        try:
            self.ray.get(ref, timeout=timeout)
        except self.ray.exceptions.RayError as exc:
            failure = self._failure(exc, f"iteration {k}")
            raise (Overdue(f"iteration {k}", timeout or 0.0) if isinstance(failure, TimeoutError) else failure) from None

    def _overdue(self) -> tuple[str, float] | None:
        """A call running past its node's timeout_s on any component, as (label, limit). A compiled graph
        runs calls on its own thread of each actor, so the actor still answers this meanwhile."""
        refs = [actor.overdue.remote() for actor in self.actors.values()]
        ready, _ = self.ray.wait(refs, num_returns=len(refs), timeout=self._poll_s)
        for ref in ready:
            try:
                late = self.ray.get(ref)
            except self.ray.exceptions.RayError:  # a dead process is reported by the iteration itself
                continue
            if late is not None:
                return late
        return None

    def _teardown_dag(self) -> None:
        """Tear down every compiled graph (they hold channels to every actor they use: a process that is
        replaced or restarted invalidates them)."""
        if not self._graphs:
            return
        if self.stuck:  # a call never returned: its actor's loop would hold the teardown forever
            for name in list(self.actors):
                self._kill(name)
        for graph in self._graphs.values():
            _bounded(graph.dag.teardown, 30.0)
        self._graphs.clear()
        self._current = None

    def _drop_graph(self, key: int) -> None:
        """Tear down one cached graph and tell the actors to forget its plan (nodes, IPC sites, clones)."""
        graph = self._graphs.pop(key)
        if graph is self._current:
            self._current = None
        _bounded(graph.dag.teardown, 30.0)
        for actor in self.actors.values():
            try:
                actor.forget_plans.remote([key])
            except self.ray.exceptions.RayError:  # a dead process forgets by itself
                pass

    def shutdown(self) -> None:
        self._teardown_dag()
        for name in list(self.actors):
            self._kill(name)
        self.actors = {}
        if self._placement_group is not None:  # give the GPUs back (a cluster may host further runs)
            from ray.util.placement_group import remove_placement_group

            try:
                remove_placement_group(self._placement_group)
            except self.ray.exceptions.RayError as exc:
                import sys

                print(f"warning: could not release the GPU placement group: {_unwrap(exc)}", file=sys.stderr)
            self._placement_group = None
        if self.started_cluster and self.ray.is_initialized():
            self.ray.shutdown()
        # the processes' stack files (`dump_stacks` returns their text): one directory per backend piled up in
        # /tmp otherwise (743 after a day of test runs)
        shutil.rmtree(self.stack_dir, ignore_errors=True)


def _bounded(fn: Any, seconds: float) -> None:
    """Run a teardown step, giving up on it (it runs on in a daemon thread) after `seconds`."""
    import threading

    def run() -> None:
        try:
            fn()
        except Exception:  # noqa: BLE001 - a teardown after the run's outcome is decided (e.g. of a graph whose actors
            pass  # were killed after a watchdog, which raises): its failure must not replace that outcome

    t = threading.Thread(target=run, name="rose-teardown", daemon=True)
    t.start()
    t.join(seconds)


def _unwrap(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[-1] if text else type(exc).__name__



class _CGPort:
    """Output `index` of a compiled-graph node (`whole`: the node's value is that one output)."""

    __slots__ = ("node", "index", "whole")

    def __init__(self, node: Any, index: int, whole: bool) -> None:
        self.node, self.index, self.whole = node, index, whole
