"""The local backend: one thread per component in this process (tests, one GPU without MPS).

Threads cannot be killed or restarted, and they share the GIL: one component's Python work slows the
others' (`benchmarks/call_overhead.py` measures how much).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from rose_dsl.ir import Component, Workflow

from .backend_base import Backend, Capabilities, Unsupported, nodes_by_component
from .components import CallProblems, ImplProblem
from .schedule import Schedule, Step
from .shared_process import enter_shared_process
from .worker import CallFailed, ComponentWorker

__all__ = ["LocalBackend"]


class _Port:
    __slots__ = ("future", "index")

    def __init__(self, future: Future, index: int) -> None:
        self.future, self.index = future, index


class LocalBackend(Backend):
    """One thread per component in this process. Threads cannot be killed or restarted, and share the
    GIL: a component's Python work slows the others' (measured in `benchmarks/call_overhead.py`)."""

    name = "local"

    def __init__(self, wf: Workflow, allowed: Sequence[str], loops_of: Mapping[tuple[str, ...], Any],
                 device: str = "cpu") -> None:
        self.workers: dict[str, ComponentWorker] = {}
        self.pools: dict[str, ThreadPoolExecutor] = {}
        self.seed, self.device, self.allowed = wf.seed, device, tuple(allowed)
        if device == "cpu":
            # the components run in parallel threads of one process: one intra-op thread each keeps them
            # from fighting over the cores (and keeps CPU results independent of the core count)
            import torch

            torch.set_num_threads(1)
        # the components' env and python_path apply to this one process (venv cannot): shared_process.py
        self._leave_process = enter_shared_process(wf)
        nodes = nodes_by_component(wf)
        try:
            for name, comp in wf.components.items():
                self._start(comp)
                unresolved = self.workers[name].impl_problem
                if unresolved is not None:
                    raise ImplProblem(comp, unresolved)
                self.workers[name].register_nodes(nodes[name], loops_of)
                problems = self.workers[name].call_problems()
                if problems:  # before any call, said where the workflow names them
                    raise CallProblems(comp, problems, nodes[name].values())
        except BaseException:  # not a suppression: stop the threads already started, then re-raise
            self.shutdown()
            raise

    def _start(self, comp: Component) -> None:
        dev = self.device if comp.device == "gpu" else "cpu"
        self.workers[comp.name] = ComponentWorker(comp, self.seed, dev, self.allowed)
        self.pools[comp.name] = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"rose-{comp.name}")

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(plans=True, pipelined=True)

    def load(self, schedule: Schedule) -> None:
        nodes = nodes_by_component(schedule.workflow)
        loops = schedule.program.loops_of
        for name in schedule.workflow.components:
            if name not in self.workers:
                raise ValueError(f"load: component '{name}' is not running (add_component first)")
        for name, by_path in nodes.items():
            self.control(name, "register_nodes", by_path, loops)  # on its thread, after its queued calls

    def add_component(self, comp: Component) -> None:
        """A new thread. Its process fields must already hold in this shared process (a temporal split's
        copy shares its original's): they were applied when the backend started."""
        if comp.name in self.workers:
            raise ValueError(f"component '{comp.name}' is already running")
        unmet = ([f"venv {comp.venv}"] if comp.venv else []) + \
            [f"env {k}={v}" for k, v in comp.env.items() if os.environ.get(k) != v] + \
            [f"python_path {p}" for p in comp.python_path if os.path.abspath(p) not in sys.path]
        if unmet:
            raise Unsupported(f"component '{comp.name}' needs {', '.join(unmet)}, which the local backend's shared "
                              "process did not start with")
        self._start(comp)

    def components(self) -> list[str]:
        return list(self.workers)

    def submit(self, step: Step, replica: int = 0) -> Sequence[Any]:
        if replica:
            raise Unsupported("the local backend runs no data-parallel replicas")
        worker = self.workers[step.node.component]
        info = worker.nodes[step.node.path]
        label, indices, recipe, handles, after = step.label, step.inv.indices, step.recipe, step.handles, step.after

        def run() -> tuple[Any, ...]:
            for h in after:
                h.future.result()
            leaves = [h.future.result()[h.index] for h in handles]
            return worker.call(info, label, indices, recipe, leaves)

        fut = self.pools[step.node.component].submit(run)
        return tuple(_Port(fut, i) for i in range(max(1, len(step.node.outputs))))

    def put(self, value: Any) -> _Port:
        done: Future = Future()
        done.set_result((value,))
        return _Port(done, 0)

    def dump_stacks(self) -> dict[str, str]:
        """The current Python stack of every component thread."""
        import threading
        import traceback

        frames = sys._current_frames()
        out = {}
        for t in threading.enumerate():
            if t.name.startswith("rose-") and t.ident in frames:
                comp = t.name[len("rose-"):].rsplit("_", 1)[0]
                out[comp] = "".join(traceback.format_stack(frames[t.ident]))
        return out

    def result(self, handle: _Port, timeout: float | None) -> Any:
        try:
            return _waited(handle.future, timeout)[handle.index]
        except FutureTimeout:
            raise TimeoutError from None

    def control(self, component: str, method: str, *args: Any, timeout: float | None = None) -> Any:
        # through the component's own thread: after every call already submitted to it
        return self.control_later(component, method, *args)(timeout)

    def control_later(self, component: str, method: str, *args: Any) -> Callable[[float | None], Any]:
        """Queued on the component's thread now, after every call already submitted to it."""
        future = self.pools[component].submit(getattr(self.workers[component], method), *args)

        def answer(timeout: float | None) -> Any:
            try:
                return _waited(future, timeout)
            except FutureTimeout:
                raise TimeoutError(f"{method} of {component} did not answer within {timeout} s") from None
            except (CallFailed, TimeoutError):
                raise
            except Exception as exc:  # noqa: BLE001 - the component's own code raised: reported as its failure
                raise CallFailed(f"{method} of {component}", component, f"{type(exc).__name__}: {exc}") from None

        return answer

    def shutdown(self) -> None:
        for pool in self.pools.values():
            pool.shutdown(wait=False, cancel_futures=True)
        for name, w in self.workers.items():
            try:
                w.close()
            except Exception as exc:  # noqa: BLE001 - teardown goes on; the failure is said, not raised
                print(f"warning: closing component '{name}' failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        self._leave_process()


WAIT_SLICE_S = 0.2


def _waited(future: Future[Any], timeout: float | None) -> Any:
    """`future.result(timeout)`, waited for in slices of `WAIT_SLICE_S`: a signal that reaches the main thread
    just before it blocks on the future's lock has its handler run at the end of the slice, not when the
    call ends (issue 59: a second Ctrl-C was ignored for 39 s, as long as the call in flight took)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            raise FutureTimeout
        try:
            return future.result(WAIT_SLICE_S if left is None else min(WAIT_SLICE_S, left))
        except FutureTimeout:
            if future.done():  # (ended just now, or raised its own TimeoutError: its result or exception)
                return future.result()
