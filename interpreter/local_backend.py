"""The local backend: one thread per component in this process (tests, one GPU without MPS).

Threads cannot be killed or restarted, and they share the GIL: one component's Python work slows the
others' (`benchmarks/call_overhead.py` measures how much).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from rose_dsl.ir import Workflow

from .backend_base import Backend, Capabilities, Unsupported, nodes_by_component
from .schedule import Step
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
                dev = device if comp.device == "gpu" else "cpu"
                self.workers[name] = ComponentWorker(comp, wf.seed, dev, allowed)
                self.workers[name].register_nodes(nodes[name], loops_of)
                self.pools[name] = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"rose-{name}")
        except BaseException:  # not a suppression: stop the threads already started, then re-raise
            self.shutdown()
            raise

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities()

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

    def dump_stacks(self) -> dict[str, str]:
        """The current Python stack of every component thread."""
        import sys
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
            return handle.future.result(timeout)[handle.index]
        except FutureTimeout:
            raise TimeoutError from None

    def control(self, component: str, method: str, *args: Any, timeout: float | None = None) -> Any:
        # through the component's own thread: after every call already submitted to it
        future = self.pools[component].submit(getattr(self.workers[component], method), *args)
        try:
            return future.result(timeout)
        except FutureTimeout:
            raise TimeoutError(f"{method} of {component} did not answer within {timeout} s") from None
        except (CallFailed, TimeoutError):
            raise
        except Exception as exc:  # noqa: BLE001 - the component's own code raised: reported as its failure
            raise CallFailed(f"{method} of {component}", component, f"{type(exc).__name__}: {exc}") from None

    def shutdown(self) -> None:
        for pool in self.pools.values():
            pool.shutdown(wait=False, cancel_futures=True)
        for name, w in self.workers.items():
            try:
                w.close()
            except Exception as exc:  # noqa: BLE001 - teardown goes on; the failure is said, not raised
                import sys

                print(f"warning: closing component '{name}' failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        self._leave_process()
