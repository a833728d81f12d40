"""A component worker: one component object and the calls the schedule sends it, in order.

The same class runs in a thread (local backend) and as a Ray actor (ray backend). A call builds its
inputs from a recipe, invokes the component method, waits for the device when the process uses CUDA
(host return is not GPU readiness), records an invocation record on the shared clock, and returns
one value per output port.
"""

from __future__ import annotations

import os
import time
import traceback
from collections.abc import Sequence
from typing import Any

from rose_dsl.ir import Component, ExecutionNode

from .components import ComponentError, check_batch, construct, get_state, invoke, set_state
from .iteration_var import resolve_k
from .schedule import evaluate_recipe

__all__ = ["ComponentWorker", "CallFailed", "replica_name"]


def replica_name(component: str, replica: int) -> str:
    """Data-parallel replica r of a component is the process `name#r` (replica 0 keeps the name)."""
    return component if replica == 0 else f"{component}#{replica}"


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
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().cpu() if value.device.type != "cpu" else value
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_to_cpu(v) for v in value)
    return value


def _loop_names(path: tuple[str, ...], indices: tuple, loops: dict) -> list[tuple[str, Any]]:
    return [(loop[-1], i) for loop, i in zip(loops.get(path, ()), indices, strict=False)]


class ComponentWorker:
    def __init__(self, comp: Component, seed: int, device: str, allowed: Sequence[str], outputs_to_cpu: bool = False,
                 gpu_index: int | None = None, retries: int = 2, replica: int = 0, dist_init: str | None = None,
                 dist_backend: str = "gloo") -> None:
        self.comp = comp
        self.name = comp.name
        self.device = device
        self.gpu_index = gpu_index
        self.outputs_to_cpu = outputs_to_cpu
        self.records: list[dict[str, Any]] = []
        self.retries = retries
        self._k = 0  # the RL iteration being executed (compiled graphs pass it to the first call only)
        self.retried: list[str] = []  # what was retried (reported with the metrics)
        self._stack_file = None
        if os.environ.get("ROSE_STACK_DIR"):  # a process of its own (Ray): dump stacks on SIGUSR1
            import faulthandler
            import signal

            path = os.path.join(os.environ["ROSE_STACK_DIR"], f"stack-{comp.name}-{os.getpid()}.txt")
            self._stack_file = open(path, "w")  # noqa: SIM115 - kept open for the handler
            faulthandler.register(signal.SIGUSR1, file=self._stack_file, all_threads=True, chain=False)
        self.nodes: dict[tuple[str, ...], ExecutionNode] = {}
        self.loops: dict[tuple[str, ...], tuple[tuple[str, ...], ...]] = {}
        self.replica = replica
        self.process = replica_name(comp.name, replica)
        if dist_init is not None:
            # a data-parallel replica: the component's replicas form one torch.distributed group
            import torch.distributed as dist

            dist.init_process_group(dist_backend, init_method=dist_init, rank=replica, world_size=comp.replicas)
        self.obj = construct(comp, seed, device, allowed, replica)

    def register_nodes(self, nodes: dict[tuple[str, ...], ExecutionNode],
                       loops: dict[tuple[str, ...], tuple[tuple[str, ...], ...]] | None = None) -> int:
        """The nodes this worker will be asked to run, and the loops around each (sent once)."""
        self.nodes.update(nodes)
        self.loops.update(loops or {})
        return len(self.nodes)

    def call_flat(self, label: str, path: tuple[str, ...], recipe: tuple, group: int | None, loop_indices: tuple,
                  *leaves: Any) -> Any:
        """The Ray entry point: leaves arrive as top-level arguments, so Ray resolves them first."""
        values = self.call(label, self.nodes[path], recipe, leaves, group, loop_indices)
        return values[0] if len(values) == 1 else values

    # -- calls ------------------------------------------------------------------------------
    def call_compiled(self, path: tuple[str, ...], recipe: tuple, group: int | None, indices: tuple,
                      ports: tuple[tuple[int, int], ...], tokens: int, k: int | None, *values: Any) -> tuple[Any, ...]:
        """The Compiled Graph entry point: `values` are this call's ordering tokens followed by the whole
        outputs of its producers; `ports` picks each leaf as (producer, port). `indices` and the recipe
        hold the RL iteration symbolically; `k` is its value for this execution (given to a component's
        first call of the iteration; None for the later ones, which run after it in this process)."""
        if k is None:
            k = self._k
        else:
            self._k = k
        producers = values[tokens:]
        leaves = [producers[n][p] for n, p in ports]
        concrete = tuple(resolve_k(i, k) for i in indices)
        label = ".".join(path) + "".join(f"[{i}]" for i in concrete)
        loop_indices = tuple((name, resolve_k(i, k)) for name, i in _loop_names(path, concrete, self.loops))
        return self.call(label, self.nodes[path], recipe, leaves, group, loop_indices, k)

    def call(self, label: str, node: ExecutionNode, recipe: tuple, leaves: Sequence[Any], group: int | None,
             loop_indices: tuple, k: int | None = None) -> tuple[Any, ...]:
        start = time.perf_counter_ns()
        try:
            inputs = {port: evaluate_recipe(r, leaves, None, k) for port, r in recipe}
            attempt = 0
            while True:
                try:
                    outs = invoke(self.obj, node, inputs, label)
                    break
                except Exception as exc:  # noqa: BLE001 - retried only where the workflow allows it
                    attempt += 1
                    if not node.idempotent or attempt > self.retries or is_fatal_gpu_error(exc):
                        raise
                    self.retried.append(f"{label}: attempt {attempt} failed ({type(exc).__name__}: {exc}); retrying")
                    time.sleep(min(2.0, 0.05 * 2**attempt))
            check_batch(node, outs, label)
            device_end = self._wait_device(outs)
        except ComponentError as exc:
            self._record(label, node, start, time.perf_counter_ns(), None, group, loop_indices, "error", str(exc))
            # the contract checks name the invocation too; CallFailed names it once
            raise CallFailed(label, self.name, str(exc).removeprefix(f"{label}: ")) from None
        except Exception as exc:  # noqa: BLE001 - reported with the node path, not swallowed
            self._record(label, node, start, time.perf_counter_ns(), None, group, loop_indices, "error", repr(exc))
            raise CallFailed(label, self.process, f"{type(exc).__name__}: {exc}", traceback.format_exc(limit=8),
                             gpu_fatal=is_fatal_gpu_error(exc)) from None
        end = time.perf_counter_ns()
        self._record(label, node, start, end, device_end, group, loop_indices, "ok", None)
        values = tuple(outs[o] for o in node.outputs)
        if self.outputs_to_cpu:
            values = tuple(_to_cpu(v) for v in values)
        return values if values else (None,)

    def _wait_device(self, outs: dict[str, Any]) -> int | None:
        """Block until the device work behind the outputs is done; return the host time it was."""
        waited = False
        try:
            import torch

            if torch.cuda.is_available() and torch.cuda.is_initialized():
                torch.cuda.synchronize()
                waited = True
        except Exception:  # noqa: BLE001 - no CUDA in this process
            pass
        for v in outs.values():
            ready = getattr(v, "block_until_ready", None)  # JAX arrays
            if callable(ready):
                ready()
                waited = True
        return time.perf_counter_ns() if waited else None

    def _record(self, label, node, start, end, device_end, group, loop_indices, status, error) -> None:
        self.records.append({
            "node": ".".join(node.path), "label": label, "component": self.name, "host_start_ns": start,
            "host_end_ns": end, "device_end_ns": device_end, "group": group, "loop_indices": loop_indices,
            "state": tuple((e.state, e.access.value) for e in node.effects), "pid": os.getpid(),
            "gpu": self.gpu_index, "status": status, "error": error,
        })

    # -- control ----------------------------------------------------------------------------
    def pop_records(self) -> list[dict[str, Any]]:
        out, self.records = self.records, []
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

    def set_states(self, states: dict[str, Any]) -> None:
        for name, value in states.items():
            set_state(self.obj, self.comp, name, value)

    def info(self) -> dict[str, Any]:
        """What this process sees: its pid and, on a GPU, the SM count its MPS quota leaves it."""
        info: dict[str, Any] = {"pid": os.getpid(), "component": self.name, "process": self.process,
                                "mps_quota": os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"),
                                "visible_gpus": os.environ.get("CUDA_VISIBLE_DEVICES"), "gpu_slot": self.gpu_index}
        try:
            import torch

            if torch.cuda.is_available():
                info["sm_count"] = torch.cuda.get_device_properties(0).multi_processor_count
                info["gpu_name"] = torch.cuda.get_device_name(0)
        except Exception as exc:  # noqa: BLE001
            info["cuda_error"] = repr(exc)
        return info

    def close(self) -> None:
        hook = getattr(self.obj, "close", None)
        if callable(hook):
            hook()
