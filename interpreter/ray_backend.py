"""The Ray backend: one process (actor) per component and data-parallel replica.

GPU actors get their MPS quota and the component's own environment (`env`, `python_path`, `venv`)
through the actor's runtime environment, and a placement-group bundle per GPU slot. Calls go either
one by one (`submit`: Ray resolves each call's input ObjectRefs, so data moves producer -> consumer) or,
after `compile`, as one Ray Compiled Graph per RL iteration: every call bound once, in program order,
with the iteration number as the graph's input, so an iteration is one `execute(k)` with no per-call
scheduling by the driver or by Ray's scheduler (`compiled_graph.py` builds it; GPU slots: `placement.py`).

The graphs of the last few plans stay compiled (`GRAPH_CACHE`): `rose optimize` alternates plans every
iteration to compare them, and compiling a graph cost it seconds per switch on the H200 (104 s for 16
switches on Meta-World). Each graph runs its own execution loop in every actor it uses, on a
thread of Ray's `_ray_system` concurrency group, which the actors get one more thread of than there are
cached graphs (with Ray's default of one thread, a second graph's compilation waits forever for the
first graph's loop). Only one graph executes at a time: the driver waits for each iteration.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rose_dsl.ir import Component, Workflow

from .actor_moves import ActorMoves, Parked
from .backend_base import (
    NODE_LIMIT,
    Backend,
    Capabilities,
    CompileError,
    Overdue,
    Unsupported,
    nodes_by_component,
)
from .compiled_graph import CompiledIteration, compile_iteration
from .components import CallProblems, ImplProblem
from .placement import GpuPlacement
from .procs import pid_alive
from .schedule import Schedule, Step
from .worker import CallFailed, ComponentWorker, component_of, replica_name, replica_of

__all__ = ["RayBackend", "GpuPlacement", "GRAPH_CACHE"]

PROJECT_ROOT = str(Path(__file__).resolve().parent.parent)
GRAPH_CACHE = 4  # compiled graphs kept per backend (the reference and up to three candidates of a comparison)


def _free_tcp() -> str:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def _wants_process_group(comp: Component, allowed: Sequence[str]) -> bool:
    from .components import wants_process_group

    return wants_process_group(comp, allowed)


class RayBackend(ActorMoves, Backend):
    """Component processes on Ray; per-call dispatch, or one compiled graph per iteration after `compile`."""

    def __init__(self, wf: Workflow, allowed: Sequence[str], loops_of, address: str | None = None,
                 mps_env: dict[str, dict[str, str]] | None = None, gpus: int | None = None,
                 start_timeout_s: float = 300.0, gpu_device: str = "cuda") -> None:
        import ray

        self.ray = ray
        # compiled iterations by plan key (id of the schedule), least recently used first; `_current` is the
        # one `execute_iteration` runs (set before the actors start: a failed start shuts down)
        self._graphs: dict[int, CompiledIteration] = {}
        self._current: CompiledIteration | None = None
        self._schedule: Schedule | None = None
        self._plan_key: int | None = None  # the loaded schedule's key (its nodes are registered under it)
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
        self.parked: dict[str, Parked] = {}  # processes a move left alive beside their replacement (actor_moves.py)
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
        base = component_of(name)
        if info.get("impl_problem"):  # its impl: did not resolve (the constructor was not reached)
            self.shutdown()
            raise ImplProblem(self.wf.components[base], info["impl_problem"])
        if info.get("call_problems"):  # calls of its nodes it cannot take (a missing method...): before any call
            self.shutdown()
            raise CallProblems(self.wf.components[base], info["call_problems"],
                               self._nodes_by_comp.get(base, {}).values())

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
        minute: Ray's own services killed under a run)."""
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
            under_mps = {p for p in self.placement.slot_of if self.mps_env.get(component_of(p))}
            for name in names:
                slot = self.placement.slot_of.get(name)
                if name in under_mps and slot is not None:
                    out |= {p for p in under_mps if self.placement.slot_of[p] == slot}
        return sorted(out)

    def restart(self, names: Sequence[str]) -> None:
        """Start fresh processes for these components (their state is restored by the caller). All are
        stopped before any starts: an MPS server recovering from a fatal error waits for that."""
        for name in names:
            comp = self.wf.components[component_of(name)]
            if comp.replicas > 1 and _wants_process_group(comp, self.allowed):
                raise CallFailed(f"restarting '{name}'", name, "a data-parallel replica cannot rejoin its process "
                                 "group alone; restart the run with --resume", died=True)
        schedule = self._schedule if self.dag is not None else None
        self._teardown_dag()  # a compiled graph holds channels to every actor: compiled again below
        self.stop_parked(names)  # (a fatal GPU error ended them too, or will have to)
        for name in names:
            self._kill(name)
        self._wait_gone([self.pids[n] for n in names if n in self.pids])
        for name in names:
            base, r = replica_of(name)
            self.actors[name] = self._launch(self.wf.components[base], r)
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
            refs = [actor.register_nodes.remote(self._nodes_by_comp[component_of(name)], self._loops, key)
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
        names = [n for n in self.actors if component_of(n) == comp.name]
        self.stop_parked(names)
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
    def compiled(self) -> CompiledIteration | None:
        """The compiled iteration `execute_iteration` runs, with what is known of its call sites (None:
        calls are dispatched one by one)."""
        return self._current

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
                            compilable=True, plans=True, pipelined=self.dag is None)

    def components(self) -> list[str]:
        return list(self.actors)

    def submit(self, step: Step, replica: int = 0) -> Sequence[Any]:
        n = max(1, len(step.node.outputs))
        actor = self.actors[replica_name(step.node.component, replica)]
        # `after` handles travel inside a tuple, so Ray does not fetch their values (the worker waits for them)
        refs = actor.call_flat.options(num_returns=n).remote(step.label, step.node.path, step.recipe,
                                                             step.inv.indices, step.after, *step.handles)
        return (refs,) if n == 1 else tuple(refs)

    def put(self, value: Any) -> Any:
        return self.ray.put(value)

    def result(self, handle: Any, timeout: float | None) -> Any:
        try:
            return self.ray.get(handle, timeout=timeout)
        except self.ray.exceptions.RayError as exc:
            raise self._failure(exc, "a call") from None

    def _failure(self, exc: BaseException, label: str, component: str | None = None) -> BaseException:
        """A Ray error as rose sees it: a timeout, a component's call failure, or a dead process. `component`:
        the one asked, where a control call knows it (it was shown as `(?)`, issue 59)."""
        errors = self.ray.exceptions
        if isinstance(exc, errors.GetTimeoutError | getattr(errors, "RayChannelTimeoutError", errors.GetTimeoutError)):
            return TimeoutError()
        if isinstance(exc, errors.RayActorError):
            who = ", ".join(self.dead_components()) or component or "?"
            return CallFailed(label, who, f"the process of component {who} died: {_unwrap(exc)}", died=True)
        if isinstance(exc, errors.RayTaskError):
            cause = getattr(exc, "cause", None)
            return cause if isinstance(cause, CallFailed) else CallFailed(label, component or "?", _unwrap(exc))
        return exc

    def control(self, component: str, method: str, *args: Any, timeout: float | None = 600) -> Any:
        try:
            return self.ray.get(getattr(self.actors[component], method).remote(*args), timeout=timeout)
        except self.ray.exceptions.RayError as exc:
            raise self._failure(exc, f"{method} of {component}", component) from None

    def control_later(self, component: str, method: str, *args: Any) -> Callable[[float | None], Any]:
        """Queued now: an actor runs one caller's tasks in the order they were submitted (max_concurrency 1)."""
        ref = getattr(self.actors[component], method).remote(*args)

        def answer(timeout: float | None) -> Any:
            try:
                return self.ray.get(ref, timeout=timeout)
            except self.ray.exceptions.RayError as exc:
                raise self._failure(exc, f"{method} of {component}", component) from None

        return answer

    # -- compiled iterations ----------------------------------------------------------------
    def compile(self, schedule: Schedule) -> None:
        """Compile the RL iteration of `schedule` (the loaded one) into one Ray Compiled Graph, its number
        the graph's input, or take its graph from the cache when it was compiled before. Raises
        CompileError (then the backend still dispatches call by call)."""
        if schedule.dynamic:
            raise CompileError(f"loop '{schedule.dynamic[0].name}' ends on a condition: its trips are decided as the "
                               "iteration runs, so the iteration is dispatched call by call")
        key = id(schedule)
        if self._schedule is not schedule:  # (compile without load: the nodes are the ones the actors have)
            self._schedule, self._plan_key = schedule, key
            nodes = nodes_by_component(schedule.workflow)
            loops = {p: tuple(v) for p, v in schedule.program.loops_of.items()}
            self.ray.get([a.register_nodes.remote(nodes.get(component_of(n), {}), loops, key)
                          for n, a in self.actors.items()], timeout=self.start_timeout_s)
        graph = self._graphs.pop(key, None)
        if graph is None:
            while len(self._graphs) >= GRAPH_CACHE:  # the least recently used goes (its loop holds a thread)
                self._drop_graph(next(iter(self._graphs)))
            try:
                graph = compile_iteration(schedule, self.wf, self.actors)
            except Exception as exc:  # Ray raises many kinds here; each means "not compiled", said once
                raise CompileError(f"{type(exc).__name__}: {exc}") from exc
        self._graphs[key] = graph  # (most recently used last)
        self._current = graph
        self._set_device_sites(key)

    def _set_device_sites(self, plan: int) -> None:
        """Tell each GPU process which of its calls in `plan`'s compiled graph send their CUDA tensors by
        IPC (`CompiledIteration.device_sites`). Every GPU process is told (an empty set too): it is also how a process
        learns that this graph runs now, so the clones it kept for the other graphs' readers can go."""
        graph = self._current
        if graph is None or self._placement_group is None or self.gpu_device == "cpu" or not self.placement.slot_of:
            return
        slot = {p: self.placement.slot_of.get(p) for p in self.actors}
        if os.environ.get("ROSE_CUDA_IPC", "1") == "0":  # off: every value leaves its process through the host
            slot = {p: None for p in slot}
        names = graph.device_readers(slot)
        device_inputs = dict(zip(names, (set(m) for m in self.ray.get(
            [self.actors[n].device_inputs.remote() for n in names], timeout=self.start_timeout_s)), strict=True))
        sites = graph.device_sites(slot, device_inputs)
        self.ray.get([self.actors[p].set_device_sites.remote(sorted(sites.get(p, ())), plan)
                      for p in self.actors if self.placement.slot_of.get(p) is not None], timeout=self.start_timeout_s)

    def execute_iteration(self, k: int, timeout: float | None) -> None:
        """Run RL iteration k; Overdue when a call outlives its node's `timeout_s` or the iteration `timeout`."""
        graph = self._current
        if graph is None:
            raise CompileError("execute_iteration before compile")
        ref = graph.dag.execute(k)
        if graph.poll_s is None:
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
        while not done.wait(graph.poll_s):
            late = self._overdue(graph.poll_s)
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

    def _overdue(self, poll_s: float) -> tuple[str, float] | None:
        """A call running past its node's timeout_s on any component, as (label, limit). A compiled graph
        runs calls on its own thread of each actor, so the actor still answers this meanwhile."""
        refs = [actor.overdue.remote() for actor in self.actors.values()]
        ready, _ = self.ray.wait(refs, num_returns=len(refs), timeout=poll_s)
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
            graph.teardown()
        self._graphs.clear()
        self._current = None

    def _drop_graph(self, key: int) -> None:
        """Tear down one cached graph and tell the actors to forget its plan (nodes, IPC sites, clones)."""
        graph = self._graphs.pop(key)
        if graph is self._current:
            self._current = None
        graph.teardown()
        for actor in self.actors.values():
            try:
                actor.forget_plans.remote([key])
            except self.ray.exceptions.RayError:  # a dead process forgets by itself
                pass

    def shutdown(self) -> None:
        self._teardown_dag()
        self.stop_parked()
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


def _unwrap(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[-1] if text else type(exc).__name__
