"""Execution backends: where component workers live and how calls reach them.

Both backends take the steps of an iteration in program order and return, for each, one handle per
output port without waiting; a worker runs its calls in submission order and waits for the handles
its recipe needs. That is the whole scheduling rule -- each component runs its calls in program
order, calls of different components overlap as far as their data allow -- and it needs no central
loop: the futures (local) or ObjectRefs (Ray) carry the dependencies.

* `LocalBackend`: one thread per component in this process (tests, one GPU without MPS).
* `RayBackend`: one actor per component; GPU actors get their MPS quota and the component's own
  environment through the actor's runtime environment.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rose_dsl.ir import Component, ExecutionNode, Workflow

from .procs import pid_alive
from .schedule import Step, replicated
from .worker import CallFailed, ComponentWorker, replica_name

__all__ = ["Backend", "LocalBackend", "RayBackend", "RayCompiledBackend", "CallFailed", "WatchdogTimeout", "group_of"]

PROJECT_ROOT = str(Path(__file__).resolve().parent.parent)


class WatchdogTimeout(Exception):
    def __init__(self, label: str, seconds: float) -> None:
        super().__init__(f"{label} did not finish within {seconds:.0f} s")
        self.label, self.seconds = label, seconds


def _free_tcp() -> str:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def _wants_process_group(comp: Component, allowed: Sequence[str]) -> bool:
    from .components import wants_process_group

    return wants_process_group(comp, allowed)


def group_of(node: ExecutionNode) -> int | None:
    return node.group  # the split group the call runs in (its own or the enclosing one's), a plan's field


def _loop_indices(step: Step, loops_of) -> tuple:
    return tuple((loop[-1], i) for loop, i in zip(loops_of[step.node.path], step.inv.indices, strict=False))


class Backend:
    name = "?"

    def submit(self, step: Step) -> Sequence[Any]: ...
    def result(self, handle: Any, timeout: float | None) -> Any: ...
    def control(self, component: str, method: str, *args: Any, timeout: float | None = None) -> Any: ...
    def components(self) -> list[str]: ...
    def shutdown(self) -> None: ...


class _Port:
    __slots__ = ("future", "index")

    def __init__(self, future: Future, index: int) -> None:
        self.future, self.index = future, index


class LocalBackend(Backend):
    name = "local"

    def __init__(self, wf: Workflow, allowed: Sequence[str], loops_of, device: str = "cpu") -> None:
        self.workers: dict[str, ComponentWorker] = {}
        self.pools: dict[str, ThreadPoolExecutor] = {}
        self.loops_of = loops_of
        if device == "cpu":
            # the components run in parallel threads of one process: one intra-op thread each keeps them
            # from fighting over the cores (and keeps CPU results independent of the core count)
            import torch

            torch.set_num_threads(1)
        try:
            for name, comp in wf.components.items():
                dev = device if comp.device == "gpu" else "cpu"
                self.workers[name] = ComponentWorker(comp, wf.seed, dev, allowed)
                self.pools[name] = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"rose-{name}")
        except BaseException:
            self.shutdown()
            raise

    def components(self) -> list[str]:
        return list(self.workers)

    def submit(self, step: Step) -> Sequence[Any]:
        worker = self.workers[step.node.component]
        indices = _loop_indices(step, self.loops_of)
        group = group_of(step.node)

        def run() -> tuple[Any, ...]:
            leaves = [h.future.result()[h.index] for h in step.handles]
            return worker.call(step.label, step.node, step.recipe, leaves, group, indices)

        fut = self.pools[step.node.component].submit(run)
        return tuple(_Port(fut, i) for i in range(max(1, len(step.node.outputs))))

    def dump_stacks(self) -> dict[str, str]:
        """The current Python stack of every component thread (for a watchdog report)."""
        import sys as _sys
        import threading
        import traceback as _tb

        frames = _sys._current_frames()
        out = {}
        for t in threading.enumerate():
            if t.name.startswith("rose-") and t.ident in frames:
                comp = t.name[len("rose-"):].rsplit("_", 1)[0]
                out[comp] = "".join(_tb.format_stack(frames[t.ident]))
        return out

    def result(self, handle: _Port, timeout: float | None) -> Any:
        from concurrent.futures import TimeoutError as FutTimeout

        try:
            return handle.future.result(timeout)[handle.index]
        except FutTimeout:
            raise TimeoutError from None

    def control(self, component: str, method: str, *args: Any, timeout: float | None = None) -> Any:
        # through the component's own thread: after every call already submitted to it
        return self.pools[component].submit(getattr(self.workers[component], method), *args).result(timeout)

    def shutdown(self) -> None:
        for pool in self.pools.values():
            pool.shutdown(wait=False, cancel_futures=True)
        for w in self.workers.values():
            try:
                w.close()
            except Exception:  # noqa: BLE001 - best effort at teardown
                pass


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
    name = "ray"

    def __init__(self, wf: Workflow, allowed: Sequence[str], loops_of, address: str | None = None,
                 mps_env: dict[str, dict[str, str]] | None = None, gpus: int | None = None,
                 start_timeout_s: float = 300.0, gpu_device: str = "cuda") -> None:
        import ray

        self.ray = ray
        self.loops_of = loops_of
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
                except Exception:  # noqa: BLE001 - no session dir known: no reaper
                    session = ""
                self._reaper = start_reaper(session)
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
        self._worker_cls = ray.remote(ComponentWorker)
        self._nodes_by_comp: dict[str, dict] = {name: {} for name in wf.components}
        for item in wf.items():
            if isinstance(item, ExecutionNode):
                self._nodes_by_comp[item.component][item.path] = item
        self._loops = {p: tuple(v) for p, v in loops_of.items()}
        self._has_gpu = bool(ray.cluster_resources().get("GPU", 0))
        self.gpu_device = gpu_device  # "cpu" lets tests place processes on a cluster's logical GPUs
        self.placement = GpuPlacement.of(wf)
        self._placement_group = self._reserve_gpus() if self._has_gpu and self.placement.slots else None
        self.replicas = max((c.replicas for c in wf.components.values()), default=1)
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
        except Exception as exc:  # noqa: BLE001
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
        actor = self._worker_cls.options(**options).remote(comp, self.wf.seed, device, self.allowed, True,
                                                           slot, 2, replica, dist_init, dist_backend)
        actor.register_nodes.remote(self._nodes_by_comp[comp.name], self._loops)
        return actor

    def _await_ready(self, name: str) -> None:
        try:
            info = self.ray.get(self.actors[name].info.remote(), timeout=self.start_timeout_s)
        except Exception as exc:
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
        """Components whose process does not answer."""
        dead = []
        for name, actor in self.actors.items():
            try:
                self.ray.get(actor.info.remote(), timeout=timeout)
            except Exception:  # noqa: BLE001 - any failure to answer counts
                dead.append(name)
        return dead

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
        for name in names:
            try:
                self.ray.kill(self.actors[name])
            except Exception:  # noqa: BLE001
                pass
        self._wait_gone([self.pids[n] for n in names if n in self.pids])
        for name in names:
            base, _, r = name.partition("#")
            self.actors[name] = self._launch(self.wf.components[base], int(r or 0))
        for name in names:
            self._await_ready(name)

    @staticmethod
    def _wait_gone(pids: Sequence[int], timeout: float = 30.0) -> None:
        """Wait (bounded) until these processes have exited."""
        import time as _time

        deadline = _time.monotonic() + timeout
        while any(pid_alive(p) for p in pids) and _time.monotonic() < deadline:
            _time.sleep(0.05)

    def replace_actor(self, name: str, quota: int | None, mps_env: dict[str, str] | None = None) -> dict[str, Any]:
        """Move a component to a new process (e.g. under another MPS quota, which is fixed for a process's
        lifetime): its declared state is read from the old actor, the old one is stopped, and the new one
        starts from that state -- no training progress is lost. Returns the new process's info."""
        from dataclasses import replace as dc_replace

        states = self.control(name, "get_states")
        comp = dc_replace(self.wf.components[name], mps_quota=quota)
        if mps_env is not None:
            self.mps_env[name] = mps_env
        self.ray.kill(self.actors[name])
        self.actors[name] = self._launch(comp)
        self._await_ready(name)
        self.control(name, "set_states", states)
        return self.control(name, "info")

    def _env(self, comp: Component, mps: dict[str, str]) -> dict[str, str]:
        env = {k: str(v) for k, v in comp.env.items()}
        env.update(mps)
        env["ROSE_STACK_DIR"] = self.stack_dir
        paths = [*comp.python_path, PROJECT_ROOT, *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]]
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
        env.setdefault("PYTHONUNBUFFERED", "1")
        env.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast off (required on the multi-GPU hosts)
        return env

    def components(self) -> list[str]:
        return list(self.actors)

    def submit(self, step: Step, replica: int = 0) -> Sequence[Any]:
        n = max(1, len(step.node.outputs))
        actor = self.actors[replica_name(step.node.component, replica)]
        refs = actor.call_flat.options(num_returns=n).remote(
            step.label, step.node.path, step.recipe, group_of(step.node), _loop_indices(step, self.loops_of), *step.handles)
        return (refs,) if n == 1 else tuple(refs)

    def result(self, handle: Any, timeout: float | None) -> Any:
        try:
            return self.ray.get(handle, timeout=timeout)
        except Exception as exc:  # noqa: BLE001 - translated into rose's own failures
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
        return self.ray.get(getattr(self.actors[component], method).remote(*args), timeout=timeout)

    def shutdown(self) -> None:
        for actor in self.actors.values():
            try:
                self.ray.kill(actor)
            except Exception:  # noqa: BLE001
                pass
        self.actors = {}
        if self._placement_group is not None:  # give the GPUs back (a cluster may host further runs)
            from ray.util.placement_group import remove_placement_group

            try:
                remove_placement_group(self._placement_group)
            except Exception:  # noqa: BLE001
                pass
            self._placement_group = None
        if self.started_cluster and self.ray.is_initialized():
            self.ray.shutdown()


def _bounded(fn: Any, seconds: float) -> None:
    """Run a teardown step, giving up on it (it runs on in a daemon thread) after `seconds`."""
    import threading

    def run() -> None:
        try:
            fn()
        except Exception:  # noqa: BLE001 - best effort at teardown
            pass

    t = threading.Thread(target=run, name="rose-teardown", daemon=True)
    t.start()
    t.join(seconds)


def _unwrap(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[-1] if text else type(exc).__name__



class _CGPort:
    __slots__ = ("node", "index")

    def __init__(self, node: Any, index: int) -> None:
        self.node, self.index = node, index


class RayCompiledBackend(RayBackend):
    """The Ray backend with the iteration compiled once into a Ray Compiled Graph: one DAG node per
    call, bound in program order, with the previous call of the same component as an ordering input
    (each component still runs its calls in program order), the RL iteration number as the DAG input.
    Each iteration is then one `execute(k)`: no per-call scheduling by the driver or Ray's scheduler."""

    name = "ray-compiled"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.dag = None  # before the actors start: a failed start calls shutdown()
        self._schedule: Any = None
        self.steps: list[Step] = []
        super().__init__(*args, **kwargs)

    def compile(self, schedule: Any) -> None:
        from ray.dag import InputNode, MultiOutputNode

        from .iteration_var import K

        self._schedule = schedule
        self.steps = []
        last_on: dict[str, Any] = {}
        consumed: set[int] = set()
        nodes: list[Any] = []
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
                    ports.append((index[key], h.index))
                    consumed.add(key)
                comp = replica_name(step.node.component, replica)
                # order after this component's previous call, unless a data input already does
                tokens = [last_on[comp]] if comp in last_on and id(last_on[comp]) not in index else []
                # only a component's first call reads the iteration number from the DAG input; its later
                # calls (in order, in the same process) reuse it -- one reader of the input per actor
                k_arg = inp if comp not in last_on else None
                for t in tokens:
                    consumed.add(id(t))
                node = self.actors[comp].call_compiled.bind(
                    step.node.path, step.recipe, group_of(step.node), step.inv.indices, tuple(ports), len(tokens),
                    k_arg, *tokens, *unique)
                last_on[comp] = node
                nodes.append(node)
                self.steps.append(step)
                return tuple(_CGPort(node, i) for i in range(max(1, len(step.node.outputs))))

            if self.replicas == 1:
                schedule.steps(K, bind)
            else:  # every call once per replica of its component
                schedule.steps(K, replicated(bind, self.wf))
            sinks = [n for n in nodes if id(n) not in consumed]
            out = MultiOutputNode(sinks)
        self.dag = out.experimental_compile()

    def restart(self, names: Sequence[str]) -> None:
        """Compiled graphs hold channels to every actor: tear down, restart, compile again."""
        if self.dag is not None:
            try:
                self.dag.teardown()
            except Exception:  # noqa: BLE001
                pass
            self.dag = None
        super().restart(names)
        if self._schedule is not None:
            self.compile(self._schedule)

    def execute_iteration(self, k: int, timeout: float | None) -> None:
        assert self.dag is not None
        try:
            self.ray.get(self.dag.execute(k), timeout=timeout)
        except Exception as exc:  # noqa: BLE001 - translated into rose's own failures
            raise self._failure(exc, f"iteration {k}") from None

    def shutdown(self) -> None:
        if self.dag is not None:
            if self.stuck:  # a call never returned: its actor's loop would hold the teardown forever
                for actor in self.actors.values():
                    try:
                        self.ray.kill(actor)
                    except Exception:  # noqa: BLE001
                        pass
            _bounded(self.dag.teardown, 30.0)
            self.dag = None
        super().shutdown()
