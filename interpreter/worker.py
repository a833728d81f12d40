"""A component worker: one component object and the calls the schedule sends it, in order.

The same class runs in a thread (local backend) and as a Ray actor (ray backend). A call builds its
inputs from a recipe, invokes the component method, waits for the device when the process uses CUDA
(host return is not GPU readiness), records an invocation record on the shared clock, and returns
one value per output port.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rose_dsl.identity import ProcessId
from rose_dsl.ir import Component, ExecutionNode

from .components import (
    ComponentError,
    ImplNotResolved,
    call_problems,
    check_batch,
    construct,
    get_state,
    invoke,
    set_state,
)
from .metric_merge import merge_rule_problem
from .recipe import IterVar, Leaf, evaluate, resolve_k
from .trace import InvocationRecord
from .until_loops import keep_done_rows, live_inputs

__all__ = ["ComponentWorker", "CallFailed", "replica_name", "group_of"]


def group_of(node: ExecutionNode) -> int | None:
    """The split group a node runs in (its own or the enclosing group's: the plan's `group` field), None
    outside groups."""
    return node.plan.group


def replica_name(component: str, replica: int) -> str:
    """Data-parallel replica r of a component is the process `name#r` (replica 0 keeps the name)."""
    return component if replica == 0 else f"{component}#{replica}"


def replica_of(process: str) -> tuple[str, int]:
    """(component, replica) of a process `replica_name` named: the one place that reads the name back
    (a backend keys its processes by name; the IR knows components, not processes)."""
    pid = ProcessId.parse(process)
    return pid.plan_component, pid.replica


def component_of(process: str) -> str:
    """The component a process is a replica of (`policy#1` -> `policy`)."""
    return replica_of(process)[0]


class CallFailed(Exception):
    """A component call raised: carries the invocation label and the component's traceback text."""

    def __init__(self, label: str, component: str, message: str, detail: str = "", died: bool = False,
                 gpu_fatal: bool = False) -> None:
        super().__init__(f"{label} ({component}): {message}")
        self.label, self.component, self.message, self.detail = label, component, message, detail
        self.died = died  # the component's process is gone (not an exception inside a call)
        self.gpu_fatal = gpu_fatal  # alive, but its CUDA context is lost (and, under MPS, its GPU's other clients')

    def __reduce__(self):
        return (CallFailed, (self.label, self.component, self.message, self.detail, self.died, self.gpu_fatal))


# CUDA errors after which a process's context is unusable ("sticky"); under MPS the server also fails every
# client on that GPU and accepts new ones only after all of them exited (CUDA MPS docs, error containment)
FATAL_GPU_ERRORS = (
    "illegal memory access", "device-side assert", "unspecified launch failure", "misaligned address",
    "illegal instruction", "uncorrectable ECC", "hardware stack error", "MPS client has been terminated",
    "MPS server is not ready", "cudaErrorMps", "CUDA_ERROR_MPS",
)


def is_fatal_gpu_error(exc: BaseException) -> bool:
    text = f"{type(exc).__name__}: {exc}"
    return ("CUDA" in text or "cuda" in text or type(exc).__name__ == "AcceleratorError") and any(
        p in text for p in FATAL_GPU_ERRORS)


def _to_cpu(value: Any) -> Any:
    torch = _torch()
    if torch is not None and isinstance(value, torch.Tensor):
        return value.detach().cpu() if value.device.type != "cpu" else value
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_to_cpu(v) for v in value)
    return value


def _copy_tree(value: Any, device_ok: bool) -> Any:
    """A deep copy of a state value whose tensors are new tensors: on their device when `device_ok`,
    else in host memory."""
    torch = _torch()
    if torch is not None and isinstance(value, torch.Tensor):
        t = value.detach()
        return t.clone() if device_ok or t.device.type == "cpu" else t.to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: _copy_tree(v, device_ok) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_copy_tree(v, device_ok) for v in value)
    import copy

    return copy.deepcopy(value)


def state_bytes(value: Any, device_only: bool = False) -> int:
    """Bytes of the tensors (and numpy arrays) in a nested state value; `device_only`: of its GPU tensors."""
    torch = _torch()
    if torch is not None and isinstance(value, torch.Tensor):
        return 0 if device_only and value.device.type == "cpu" else value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(state_bytes(v, device_only) for v in value.values())
    if isinstance(value, list | tuple):
        return sum(state_bytes(v, device_only) for v in value)
    nbytes = getattr(value, "nbytes", 0)  # numpy arrays
    return 0 if device_only else int(nbytes) if isinstance(nbytes, int) else 0


def _torch() -> Any:
    """torch if this process imported it, else None: a process that never imported torch has no torch
    tensors and no CUDA work of torch's to wait for (and a worker does not import it for nothing)."""
    return sys.modules.get("torch")


_CUDA_SEEN = False  # CUDA, once initialised in a process, stays initialised: asked once per call otherwise


def _cuda_initialized() -> bool:
    global _CUDA_SEEN
    if not _CUDA_SEEN:
        torch = _torch()
        _CUDA_SEEN = torch is not None and torch.cuda.is_initialized()
    return _CUDA_SEEN


@dataclass(frozen=True)
class _NodeInfo:
    """What a worker needs about a node on every call, computed once at registration."""

    node: ExecutionNode
    name: str  # the dotted path, e.g. "iteration.epoch.step.act"
    loops: tuple[str, ...]  # the names of the loops around it, outermost (the RL iteration) first
    state: tuple[tuple[str, str], ...]  # (state object, access) pairs for the trace
    group: int | None  # the split group, when the node is one

    def label(self, indices: tuple[int, ...]) -> str:
        return self.name + "".join(f"[{i}]" for i in indices)


class ComponentWorker:
    def __init__(self, comp: Component, seed: int, device: str, allowed: Sequence[str], outputs_to_cpu: bool = False,
                 gpu_index: int | None = None, retries: int = 2, replica: int = 0, dist_init: str | None = None,
                 dist_backend: str = "gloo") -> None:
        self.comp = comp
        self.name = comp.name
        self.device = device
        self.gpu_index = gpu_index
        self.outputs_to_cpu = outputs_to_cpu
        if outputs_to_cpu:  # a process of its own (Ray): its values leave it through Ray's serializer
            from .tensor_transport import register

            register()
        # per compiled graph (its plan key): the call sites whose CUDA outputs go by IPC
        self._device_sites: dict[Hashable, frozenset[int]] = {}
        self._kept: dict[str, Any] | None = None  # a copy of the declared state (`keep_states`)
        self._records: list[tuple] = []  # raw, turned into InvocationRecords by pop_records (off the hot path)
        self.retries = retries
        self._k = 0  # the RL iteration being executed (compiled graphs pass it to the first call only)
        self.retried: list[str] = []  # what was retried (reported with the metrics)
        # the call running now: (node info, indices, label, start ns), read by `overdue`
        self.current: tuple[_NodeInfo, tuple[int, ...], str | None, int] | None = None
        self._stack_file = None
        if os.environ.get("ROSE_STACK_DIR"):  # a process of its own (Ray): dump stacks on SIGUSR1
            import faulthandler
            import signal

            path = os.path.join(os.environ["ROSE_STACK_DIR"], f"stack-{comp.name}-{os.getpid()}.txt")
            self._stack_file = open(path, "w")  # kept open for the handler
            faulthandler.register(signal.SIGUSR1, file=self._stack_file, all_threads=True, chain=False)
        self.nodes: dict[tuple[str, ...], _NodeInfo] = {}  # what `call_flat` runs: the loaded plan's nodes
        # each plan's own nodes, by the plan key its compiled graph passes (`call_compiled`): the backend keeps
        # several plans' graphs compiled at once, and two plans may run different nodes under one path
        self._plans: dict[Hashable, dict[tuple[str, ...], _NodeInfo]] = {}
        self.replica = replica
        self.process = replica_name(comp.name, replica)
        self.pid = os.getpid()
        if dist_init is not None:
            # a data-parallel replica: the component's replicas form one torch.distributed group
            import torch.distributed as dist

            dist.init_process_group(dist_backend, init_method=dist_init, rank=replica, world_size=comp.replicas)
        # an impl that does not resolve is the workflow's to fix: reported by `info` (a Ray actor's constructor
        # exception reaches the driver as text), raised there as `ImplProblem` at the `impl:`
        self.impl_problem: str | None = None
        try:
            self.obj = construct(comp, seed, device, allowed, replica)
        except ImplNotResolved as exc:
            self.obj, self.impl_problem = None, exc.reason

    def register_nodes(self, nodes: Mapping[tuple[str, ...], ExecutionNode],
                       loops: Mapping[tuple[str, ...], tuple[tuple[str, ...], ...]] | None = None,
                       plan: Hashable | None = None) -> int:
        """The nodes this worker will be asked to run, and the loops around each (sent once per plan);
        with `plan`, also kept as that plan's own nodes for its compiled graph."""
        loops = loops or {}
        infos = {path: _NodeInfo(node, ".".join(path), tuple(loop[-1] for loop in loops.get(path, ())),
                                 tuple((e.state, e.access.value) for e in node.effects), group_of(node))
                 for path, node in nodes.items()}
        self.nodes.update(infos)
        if plan is not None:
            self._plans[plan] = infos
        return len(self.nodes)

    def call_problems(self) -> dict[str, Any]:
        """What the registered nodes' calls would fail on whatever their inputs (`components.call_problems`)."""
        if self.obj is None:  # (no component: `impl_problem` says why)
            return {}
        return call_problems(self.obj, (info.node for info in self.nodes.values()))

    def use_plan(self, plan: Hashable) -> None:
        """Run `plan` (registered before) from now on. The CUDA IPC clones kept for the other plans' graphs
        go: their last iteration ended, so every reader has copied them."""
        from .tensor_transport import release_sites

        self.nodes.update(self._plans[plan])
        release_sites([p for p in self._plans if p != plan])

    def forget_plans(self, plans: Sequence[Hashable]) -> None:
        """These plans' graphs are torn down: drop their nodes, IPC sites and kept clones."""
        from .tensor_transport import release_sites

        for plan in plans:
            self._plans.pop(plan, None)
            self._device_sites.pop(plan, None)
        release_sites(list(plans))

    # -- calls ------------------------------------------------------------------------------
    def call_flat(self, label: str, path: tuple[str, ...], recipe: tuple, indices: tuple, after: tuple,
                  *leaves: Any) -> Any:
        """The Ray entry point: leaves arrive as top-level arguments, so Ray resolves them first; `after`
        holds ObjectRefs of calls to wait for without fetching their values (`after:` in the workflow)."""
        if after:
            import ray

            ray.wait(list(after), num_returns=len(after), fetch_local=False)
        if self._device_sites:
            from .tensor_transport import device_site

            device_site(None)
        values = self.call(self.nodes[path], label, indices, recipe, leaves)
        return values[0] if len(values) == 1 else values

    def device_inputs(self) -> list[str]:
        """The methods of this component that take tensors on its GPU (`rose_device_inputs` on its class):
        a producer on the same GPU may send them CUDA tensors by IPC instead of CPU copies."""
        return sorted(getattr(self.obj, "rose_device_inputs", ()))

    def set_device_sites(self, sites: Sequence[int], plan: Hashable | None = None) -> None:
        """The call sites of `plan`'s compiled graph (`call_compiled`'s `site`) whose CUDA outputs stay on the
        GPU and go to their readers by CUDA IPC (the backend's `tensor_transport.ipc_sites`); set after the
        graph is compiled, when it becomes the one that runs, so the clones kept for the other graphs go."""
        from .tensor_transport import release_sites

        release_sites([p for p in self._device_sites if p != plan])
        self._device_sites[plan] = frozenset(sites)

    def call_compiled(self, plan: Hashable, path: tuple[str, ...], recipe: tuple, indices: tuple,
                      ports: tuple[tuple[int, int], ...], site: int, k: int | None, *producers: Any) -> Any:
        """The Compiled Graph entry point: `producers` are the values of this call's producers (a call
        with one output returns that value, one with several the tuple of them); `ports` picks each leaf
        as (producer, port), port -1 for a producer's whole value. `indices` and the recipe hold the RL
        iteration symbolically; `k` is its value for this execution (given to a component's first call
        of the iteration; None for the later ones, which run after it in this process: a compiled graph
        runs an actor's calls in the order they were bound). `plan` names the graph's plan (its nodes,
        `register_nodes`); `site` numbers the call in that graph (see `set_device_sites`)."""
        sites = self._device_sites.get(plan)
        on_device = sites is not None and site in sites
        if sites:
            from .tensor_transport import device_site

            device_site((plan, site) if on_device else None)
        if k is None:
            k = self._k
        else:
            self._k = k
        info = self._plans[plan][path]
        concrete = tuple(i if type(i) is int else k if type(i) is IterVar else resolve_k(i, k) for i in indices)
        leaves = [producers[n] if p < 0 else producers[n][p] for n, p in ports]
        values = self.call(info, None, concrete, recipe, leaves, k, on_device)
        return values[0] if len(values) == 1 else values

    def call(self, info: _NodeInfo, label: str | None, indices: tuple[int, ...], recipe: tuple, leaves: Sequence[Any],
             k: int | None = None, on_device: bool = False) -> tuple[Any, ...]:
        """Run one call: build its inputs, invoke the method (retrying an idempotent node), wait for the
        device, record it. `label` (the invocation, `node[i][j]`, for messages) is built from `indices`
        when not given. `on_device`: the outputs leave by CUDA IPC (`set_device_sites`), not as CPU copies."""
        node = info.node
        start = time.perf_counter_ns()
        self.current = (info, indices, label, start)  # the label is built when a message needs it (~1 µs a call)
        try:
            inputs = {port: leaves[r.index] if type(r) is Leaf else evaluate(r, leaves, None, k) for port, r in recipe}
            # a call of a loop that ends per row, after some rows are done: its rows, and its previous full outputs
            live, held = live_inputs(recipe, inputs)
            attempt = 0
            while True:
                try:
                    outs = invoke(self.obj, node, inputs, label or (lambda: info.label(indices)), live, self.comp)
                    break
                except Exception as exc:  # retried only where the workflow allows it, else re-raised
                    attempt += 1
                    if not node.idempotent or attempt > self.retries or is_fatal_gpu_error(exc):
                        raise
                    label = label or info.label(indices)
                    self.retried.append(f"{label}: attempt {attempt} failed "
                                        f"({type(exc).__name__}: {exc}); retrying")
                    time.sleep(min(2.0, 0.05 * 2**attempt))
            if node.batch is not None:
                check_batch(node, outs, label or info.label(indices), None if live is None else len(live))
            if live is not None:  # the done rows keep the values of their last trip
                outs = keep_done_rows(node, outs, live, held)
            device_end = self._wait_device(outs)
        except ComponentError as exc:
            label = label or info.label(indices)
            self._record(info, indices, start, time.perf_counter_ns(), None, str(exc))
            # the contract checks name the invocation too; CallFailed names it once
            raise CallFailed(label, self.name, str(exc).removeprefix(f"{label}: ")) from None
        except Exception as exc:  # noqa: BLE001 - reported with the node path, not swallowed
            label = label or info.label(indices)
            self._record(info, indices, start, time.perf_counter_ns(), None, repr(exc))
            raise CallFailed(label, self.process, f"{type(exc).__name__}: {exc}",
                             traceback.format_exc(limit=8), gpu_fatal=is_fatal_gpu_error(exc)) from None
        finally:
            self.current = None
        self._record(info, indices, start, time.perf_counter_ns(), device_end, None, None if live is None else len(live))
        values = tuple(outs[o] for o in node.outputs)
        if self.outputs_to_cpu and not on_device and _cuda_initialized():
            values = tuple(_to_cpu(v) for v in values)  # (no CUDA in this process: no CUDA tensors either)
        return values if values else (None,)

    def overdue(self) -> tuple[str, float] | None:
        """The running call, when it has run longer than its node's `timeout_s`: (label, timeout)."""
        current = self.current
        if current is None:
            return None
        info, indices, label, start = current
        timeout = info.node.timeout_s
        if not timeout or time.perf_counter_ns() - start <= timeout * 1e9:
            return None
        return (label or info.label(indices), timeout)

    def _wait_device(self, outs: dict[str, Any]) -> int | None:
        """Block until the device work behind the outputs is done; return the host time it was.

        Why wait: host return is not GPU readiness (kernels run asynchronously), so a call's duration
        and its outputs' readiness both need the device done -- torch's CUDA work (when this process
        initialised CUDA) and JAX arrays (`block_until_ready`, when this process imported JAX)."""
        waited = False
        if _cuda_initialized():
            sys.modules["torch"].cuda.synchronize()
            waited = True
        if "jax" in sys.modules:
            for v in outs.values():
                ready = getattr(v, "block_until_ready", None)
                if callable(ready):
                    ready()
                    waited = True
        return time.perf_counter_ns() if waited else None

    def _record(self, info: _NodeInfo, indices: tuple[int, ...], start: int, end: int, device_end: int | None,
                error: str | None, rows: int | None = None) -> None:
        # a tuple on the hot path; pop_records builds the InvocationRecords (`rows`: the rows a call of a loop
        # that ends per row computed, once some were done)
        self._records.append((info, indices, start, end, device_end, error, rows))

    # -- control ----------------------------------------------------------------------------
    def pop_records(self) -> list[InvocationRecord]:
        """The invocation records of the calls since the last pop (call ids are given by the trace)."""
        raw, self._records = self._records, []
        out = []
        for info, indices, start, end, device_end, error, rows in raw:
            out.append(InvocationRecord(
                call_id=0, node=info.name, component=self.name, host_start_ns=start, host_end_ns=end,
                device_start_ns=start if device_end else None,
                device_end_ns=max(end, device_end) if device_end else None,
                loop_indices=tuple(zip(info.loops, indices, strict=False)), group=info.group, state=info.state,
                pid=self.pid, gpu=self.gpu_index, status="error" if error is not None else "ok", error=error,
                rows=rows))
        return out

    def pop_metrics(self) -> dict[str, float]:
        hook = getattr(self.obj, "pop_metrics", None)
        metrics = (hook() or {}) if callable(hook) else {}
        out = {k: float(v) for k, v in metrics.items() if isinstance(v, int | float)}
        if self.retried:
            out["rose_retries"] = float(len(self.retried))
            self.retried = []
        return out

    def get_states(self) -> dict[str, Any]:
        return {so.name: _to_cpu(get_state(self.obj, self.comp, so.name)) for so in self.comp.state}

    def gpu_memory(self) -> dict[str, Any]:
        """What this process holds of its GPU (torch's allocator, reserved bytes) and what the GPU has free
        (None: no CUDA here): whether it can be parked beside its replacement (`actor_moves.py`)."""
        torch = _torch()
        if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
            return {"reserved": 0, "free": None}
        free, _ = torch.cuda.mem_get_info()
        return {"reserved": int(torch.cuda.memory_reserved()), "free": int(free)}

    def park(self) -> None:
        """Idle beside the process that replaces it (`actor_moves.py`): its snapshots dropped, its allocator's
        cached blocks given back to the GPU; its own state stays, overwritten if it is moved back to."""
        self._kept = None
        torch = _torch()
        if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.empty_cache()

    def write_state_file(self, path: str, host: str) -> dict[str, Any]:
        """This component's state file of a checkpoint being written (`checkpoint.save_component_checkpoint`),
        written here: the state does not cross to the driver. {"elsewhere": ...} when this process is not on
        the driver's host `host` (the path is on the driver's file system), {"error": ...} when the state
        would not load as a checkpoint (nothing written)."""
        import socket
        from pathlib import Path

        if socket.gethostname() != host:
            return {"elsewhere": socket.gethostname()}
        try:
            from .checkpoint import CheckpointError, write_state_file
        except ImportError as exc:  # a process without torch (its own venv): the driver writes its file
            return {"elsewhere": f"{socket.gethostname()} ({exc})"}
        try:
            return write_state_file(Path(path), self.get_states(), self.name)
        except CheckpointError as exc:
            return {"error": str(exc)}

    def export_states(self) -> tuple[int, dict[str, Any]]:
        """`get_states` as two returns (Ray `num_returns=2`): its size in bytes, which the driver fetches to know
        the read succeeded, and the state, which it hands to another process by reference without fetching it
        (`RayBackend.replace_actor`)."""
        states = self.get_states()
        return state_bytes(states), states

    def set_states(self, states: dict[str, Any]) -> None:
        for name, value in states.items():
            set_state(self.obj, self.comp, name, value)

    # -- snapshots kept in this process (rose optimize's guards and local trials) -----------------
    def keep_states(self) -> int:
        """Copy this component's declared state and keep the copy here, in this process: on its GPU when
        twice its size is free there, else in host memory. Returns the bytes kept. Why not the driver: a
        360M-parameter trainer's state (4 GB with Adam) took 6.5 s to reach the driver on the H200, a copy
        on the GPU takes milliseconds."""
        states = {so.name: get_state(self.obj, self.comp, so.name) for so in self.comp.state}
        on_device = state_bytes(states, device_only=True)
        keep_on_device = False
        if on_device:
            import torch

            free, _ = torch.cuda.mem_get_info()
            keep_on_device = 2 * on_device + (1 << 30) < free
        self._kept = _copy_tree(states, keep_on_device)
        return state_bytes(self._kept)

    def restore_kept(self, drop: bool = True) -> None:
        """Put the kept copy back (`keep_states`); `drop=False` keeps it for another restore (the component
        is given a copy of it, as it may hold on to and change what `set_state` gets)."""
        if self._kept is None:
            raise RuntimeError(f"{self.process}: restore_kept without keep_states")
        self.set_states(self._kept if drop else _copy_tree(self._kept, True))
        if drop:
            self._kept = None

    def drop_kept(self) -> None:
        self._kept = None

    def info(self) -> dict[str, Any]:
        """What this process sees: its pid (and the thread that answers, the one a local backend runs the
        component's calls on) and, on a GPU, the SM count its MPS quota leaves it."""
        info: dict[str, Any] = {"pid": os.getpid(), "thread": threading.get_ident(), "component": self.name,
                                "process": self.process,
                                "mps_quota": os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"),
                                "mps_priority": os.environ.get("CUDA_MPS_CLIENT_PRIORITY"),
                                "visible_gpus": os.environ.get("CUDA_VISIBLE_DEVICES"), "gpu_slot": self.gpu_index,
                                "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
                                "call_problems": self.call_problems(), "impl_problem": self.impl_problem,
                                **self._metric_merge()}
        if _torch() is not None:
            info["torch_threads"] = _torch().get_num_threads()
        try:
            import torch

            if torch.cuda.is_available():
                info["sm_count"] = torch.cuda.get_device_properties(0).multi_processor_count
                info["gpu_name"] = torch.cuda.get_device_name(0)
        except (RuntimeError, AssertionError) as exc:  # a broken CUDA set-up is described here; calls fail with it
            info["cuda_error"] = repr(exc)
        return info

    def _metric_merge(self) -> dict[str, Any]:
        """The component's declared `metric_merge` (`interpreter/metric_merge.py`) and what is wrong with it."""
        declared = getattr(type(self.obj), "metric_merge", None) if self.obj is not None else None
        problem = None if declared is None else merge_rule_problem(declared)
        return {"metric_merge": {} if declared is None or problem else dict(declared),
                "metric_merge_problem": problem}

    def close(self) -> None:
        hook = getattr(self.obj, "close", None)
        if callable(hook):
            hook()
