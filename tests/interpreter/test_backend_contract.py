"""The Backend interface as the runner uses it, with fake backends (no threads, no cluster, as Ray's
DAG tests mock actors): capabilities decide what the runner does, never hasattr; the factory's
fallback is explicit and printed."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

import interpreter.backends as backends
from interpreter.backends import (
    Backend,
    CallFailed,
    Capabilities,
    CompileError,
    LocalBackend,
    Overdue,
    Unsupported,
    WatchdogTimeout,
    make_backend,
)
from interpreter.components import instantiate, invoke
from interpreter.recipe import evaluate
from interpreter.runner import RunConfig, Runner
from interpreter.schedule import Schedule, Step
from interpreter.trace import InvocationRecord
from rose_dsl import load_workflow_text

CHAIN = """
rose: 1
name: chain
components:
  a: {impl: "tests.mocks:Sleeper", args: {seconds: 0}}
  b: {impl: "tests.mocks:Sleeper", args: {seconds: 0}}
iteration:
  count: 2
  body:
    - {node: wa, call: a.work, in: {x: iteration.i}, out: [y]}
    - {node: wb, call: b.work, in: {x: wa.y}, out: [y]}
"""


class FakeBackend(Backend):
    """Runs each call at submission, in this thread; handles are the values. Capabilities are given."""

    name = "fake"

    def __init__(self, wf, caps: Capabilities, fail: str | None = None, died: bool = False) -> None:
        self.caps, self.fail, self.died = caps, fail, died
        self.objs = instantiate(wf, ("tests.",))
        self.submitted: list[str] = []
        self.executed: list[int] = []
        self.restarted: list[list[str]] = []
        self.records: dict[str, list[InvocationRecord]] = {c: [] for c in wf.components}

    @property
    def capabilities(self) -> Capabilities:
        return self.caps

    def components(self) -> list[str]:
        return list(self.objs)

    def submit(self, step: Step, replica: int = 0) -> Sequence[Any]:
        self.submitted.append(step.label)
        if step.node.name == self.fail:
            raise CallFailed(step.label, step.node.component, "boom", died=self.died)
        inputs = {port: evaluate(r, list(step.handles)) for port, r in step.recipe}
        out = invoke(self.objs[step.node.component], step.node, inputs, step.label)
        self.records[step.node.component].append(InvocationRecord(0, ".".join(step.node.path), step.node.component,
                                                                  1, host_end_ns=2, status="ok"))
        return tuple(out[o] for o in step.node.outputs) or (None,)

    def result(self, handle: Any, timeout: float | None) -> Any:
        return handle

    def control(self, component: str, method: str, *args: Any, timeout: float | None = None) -> Any:
        if method == "pop_records":
            out, self.records[component] = self.records[component], []
            return out
        if method == "pop_metrics":
            return {}
        if method == "info":
            return {"pid": 1}
        raise AssertionError(method)

    def dump_stacks(self) -> dict[str, str]:
        return {"a": "File mocks.py, in work"}

    def shutdown(self) -> None:
        pass

    def execute_iteration(self, k: int, timeout: float | None) -> None:
        if not self.caps.compiled:
            return super().execute_iteration(k, timeout)
        self.executed.append(k)
        if self.fail == "overdue":
            raise Overdue(f"iteration.wb[{k}]", 0.25, "the node's timeout_s")
        return None

    def restart(self, names: Sequence[str]) -> None:
        if not self.caps.restartable:
            super().restart(names)
        self.restarted.append(list(names))


def _wf():
    return load_workflow_text(CHAIN, "chain.yaml")


def test_a_per_call_backend_gets_every_call_in_program_order_and_its_records_land_in_the_trace() -> None:
    wf = _wf()
    be = FakeBackend(wf, Capabilities())
    runner = Runner(wf, be, RunConfig(iterations=2, tensorboard=False))
    runner.run()
    assert be.submitted == ["iteration.wa[0]", "iteration.wb[0]", "iteration.wa[1]", "iteration.wb[1]"]
    assert [r.call_id for r in runner.trace.records()] == [1, 2, 3, 4]  # numbered by the trace


def test_a_compiled_backend_runs_whole_iterations() -> None:
    wf = _wf()
    be = FakeBackend(wf, Capabilities(compiled=True))
    Runner(wf, be, RunConfig(iterations=3, tensorboard=False)).run()
    assert be.executed == [0, 1, 2] and be.submitted == []


def test_an_overdue_call_fires_the_watchdog_with_stacks_and_marks_the_backend_stuck() -> None:
    wf = _wf()
    be = FakeBackend(wf, Capabilities(compiled=True), fail="overdue")
    with pytest.raises(WatchdogTimeout, match=r"iteration.wb\[0\] did not finish within 0.25 s \(the node's timeout_s\)") as info:
        Runner(wf, be, RunConfig(iterations=1, tensorboard=False)).run()
    assert info.value.stacks == {"a": "File mocks.py, in work"} and be.stuck


@pytest.mark.parametrize("restartable", [False, True])
def test_a_dead_process_is_restarted_only_by_a_restartable_backend(tmp_path, restartable) -> None:
    wf = _wf()
    be = FakeBackend(wf, Capabilities(restartable=restartable), fail="wb", died=True)
    runner = Runner(wf, be, RunConfig(iterations=1, out_dir=tmp_path, tensorboard=False))
    with pytest.raises(CallFailed) as info:
        runner.run()
    # without the capability the failure is the component's; with it, recovery was tried (and found
    # no checkpoint to restart from)
    assert ("no checkpoint to restart from" in str(info.value)) == restartable
    assert be.restarted == []


def test_operations_beyond_the_capabilities_are_refused_by_name() -> None:
    wf = _wf()
    be = FakeBackend(wf, Capabilities())
    with pytest.raises(Unsupported, match="fake backend does not compile"):
        be.execute_iteration(0, None)
    with pytest.raises(Unsupported, match="cannot restart"):
        be.restart(["a"])
    with pytest.raises(Unsupported, match="cannot move a component"):
        be.replace_actor("a", 50)
    assert be.dead_components() == [] and be.fault_domain(["b", "a"], True) == ["a", "b"]


def test_replicas_need_a_backend_that_declares_them() -> None:
    wf = load_workflow_text(CHAIN.replace('args: {seconds: 0}}\n  b:', 'args: {seconds: 0}, replicas: 2}\n  b:'), "r.yaml")
    with pytest.raises(ValueError, match="replicas: 2 needs"):
        Runner(wf, FakeBackend(wf, Capabilities()), RunConfig(iterations=1, tensorboard=False))
    with pytest.raises(ValueError, match="replicas: 2 needs --backend ray"):
        make_backend("local", wf, Schedule(wf), allowed=("tests.",))


class _UncompilableRay(FakeBackend):
    def __init__(self, wf, allowed, loops_of, **kwargs) -> None:
        super().__init__(wf, Capabilities(processes=True, restartable=True, replicas=True))
        self.kwargs = kwargs

    def compile(self, schedule: Schedule) -> None:
        raise CompileError("ValueError: a node the graph cannot hold")


def test_the_factory_says_when_it_falls_back_to_per_call_dispatch(monkeypatch) -> None:
    wf = _wf()
    monkeypatch.setattr(backends, "RayBackend", _UncompilableRay)
    said: list[str] = []
    be = make_backend("ray", wf, Schedule(wf), compiled=True, mps_env={"a": {"X": "1"}}, log=said.append)
    assert not be.capabilities.compiled and be.kwargs["mps_env"] == {"a": {"X": "1"}}
    assert said == ["warning: cannot compile the iteration into a Ray Compiled Graph (ValueError: a node the graph "
                    "cannot hold); dispatching call by call"]
    said.clear()
    make_backend("ray", wf, Schedule(wf), compiled=False, log=said.append)
    assert said == []
    with pytest.raises(ValueError, match="another workflow"):
        make_backend("local", wf, Schedule(_wf()))
    with pytest.raises(ValueError, match="unknown backend 'gpu'"):
        make_backend("gpu", wf, Schedule(wf))


def test_the_local_backend_declares_no_processes() -> None:
    wf = _wf()
    be = make_backend("local", wf, Schedule(wf), allowed=("tests.",))
    try:
        assert isinstance(be, LocalBackend) and be.capabilities == Capabilities()
        with pytest.raises(Unsupported):
            be.submit(next(iter(Schedule(wf).steps(0, lambda s: (None,))))[0], replica=1)
    finally:
        be.shutdown()


def test_gpu_workflows_default_to_the_ray_backend() -> None:
    from interpreter.backends import default_backend

    assert default_backend(_wf()) == "local"
    assert default_backend(load_workflow_text(CHAIN.replace('args: {seconds: 0}}\n  b:', 'args: {seconds: 0}, device: gpu}\n  b:'),
                                              "g.yaml")) == "ray"
    assert default_backend(load_workflow_text(CHAIN.replace('args: {seconds: 0}}\n  b:', 'args: {seconds: 0}, replicas: 2}\n  b:'),
                                              "r.yaml")) == "ray"
