"""The Backend interface as the runner uses it, with fake backends (no threads, no cluster, as Ray's
DAG tests mock actors): capabilities decide what the runner does, never hasattr; the factory's
fallback is explicit and printed."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
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
        assert isinstance(be, LocalBackend) and be.capabilities == Capabilities(plans=True, pipelined=True)
        with pytest.raises(Unsupported):
            be.submit(next(iter(Schedule(wf).steps(0, lambda s: (None,))))[0], replica=1)
        # a thread can be added, but not one that needs process fields this shared process lacks
        plan = load_workflow_text(WITH_C, "plan.yaml")
        with pytest.raises(Unsupported, match=r"'c' needs env ROSE_TEST_UNSET=1, which the local backend's shared"):
            be.add_component(replace(plan.components["c"], env={"ROSE_TEST_UNSET": "1"}))
        be.add_component(plan.components["c"])
        be.load(Schedule(plan))
        runner = Runner(plan, be, RunConfig(iterations=1, tensorboard=False))
        runner.run_iteration(0)
        assert [r.node for r in runner.trace.records()] == ["iteration.wa", "iteration.wb", "iteration.wc"]
    finally:
        be.shutdown()


def test_gpu_workflows_default_to_the_ray_backend() -> None:
    from interpreter.backends import default_backend

    assert default_backend(_wf()) == "local"
    assert default_backend(load_workflow_text(CHAIN.replace('args: {seconds: 0}}\n  b:', 'args: {seconds: 0}, device: gpu}\n  b:'),
                                              "g.yaml")) == "ray"
    assert default_backend(load_workflow_text(CHAIN.replace('args: {seconds: 0}}\n  b:', 'args: {seconds: 0}, replicas: 2}\n  b:'),
                                              "r.yaml")) == "ray"


# --- what the optimizer needs: switching plans on the same workers (`capabilities.plans`) ----------------
WITH_C = CHAIN.replace("iteration:", '  c: {impl: "tests.mocks:Sleeper", args: {seconds: 0}}\niteration:') + \
    "    - {node: wc, call: c.work, in: {x: wb.y}, out: [y]}\n"


class PlanFake(FakeBackend):
    """A backend that can switch plans and compile them (as the Ray backend declares): `load` drops a
    compiled iteration, `compile` keeps the schedule and runs its steps at `execute_iteration`, components
    can be added (a GPU one cannot: Unsupported, as on Ray after the GPUs were placed). Every process
    reports a metric, so a runner that asks processes outside its plan would show it."""

    def __init__(self, wf, compile_fails: bool = False) -> None:
        super().__init__(wf, Capabilities(compilable=True, plans=True))
        self.compile_fails = compile_fails
        self.graph: Schedule | None = None
        self.loads: list[str] = []
        self.added: list[str] = []
        self.states: dict[str, dict[str, Any]] = {c: {} for c in wf.components}

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(compiled=self.graph is not None, compilable=True, plans=True)

    def load(self, schedule: Schedule) -> None:
        missing = set(schedule.workflow.components) - set(self.objs)
        assert not missing, f"load before add_component: {missing}"
        self.loads.append(",".join(n.name for n in schedule.workflow.items() if hasattr(n, "component")))
        self.graph = None

    def compile(self, schedule: Schedule) -> None:
        if self.compile_fails:
            raise CompileError("ValueError: a node the graph cannot hold")
        self.graph = schedule

    def execute_iteration(self, k: int, timeout: float | None) -> None:
        assert self.graph is not None
        self.executed.append(k)
        n = len(self.submitted)
        self.graph.steps(k, lambda step: FakeBackend.submit(self, step))
        del self.submitted[n:]  # (run as one graph: nothing was submitted call by call)

    def add_component(self, comp) -> None:
        if comp.device == "gpu":
            raise Unsupported(f"cannot add GPU component '{comp.name}' after the GPUs were placed")
        self.objs.update(instantiate(replace(_wf(), components={comp.name: comp}), ("tests.",)))
        self.records[comp.name], self.states[comp.name] = [], {}
        self.added.append(comp.name)

    def control(self, component: str, method: str, *args: Any, timeout: float | None = None) -> Any:
        if method == "pop_metrics":
            return {"x": 1.0}
        if method == "get_states":
            return dict(self.states[component])
        if method == "set_states":
            self.states[component] = dict(args[0])
            return None
        if method == "info":
            return {"pid": 1, "thread": 0}
        return super().control(component, method, *args, timeout=timeout)


def _executor(wf, backend: PlanFake, compiled: bool = True, said: list[str] | None = None):
    from interpreter.optimize.executor import Executor

    return Executor(wf, lambda w, s: backend, compiled=compiled, extra_components={},
                    log=(said if said is not None else []).append)


def test_the_optimizer_switches_plans_through_load_compile_and_add_component() -> None:
    wf, plan = _wf(), load_workflow_text(WITH_C, "plan.yaml")
    be = PlanFake(wf)
    ex = _executor(wf, be)
    ex.run(wf, 0)
    ex.run(wf, 1)  # the same plan: nothing to load
    assert be.loads == ["wa,wb"] and be.executed == [0, 1] and be.submitted == []
    _, _, _, metrics, records = ex.run(plan, 2)  # a component the workers lack: added, then the plan loaded
    assert be.added == ["c"] and be.loads == ["wa,wb", "wa,wb,wc"] and be.executed == [0, 1, 2]
    assert [r.node for r in records] == ["iteration.wa", "iteration.wb", "iteration.wc"]
    assert metrics["c/x"] == 1.0
    # back to the declared plan: loaded again, and the idle `c` reports nothing into its iteration
    _, _, _, metrics, _ = ex.run(wf, 3)
    assert be.loads[-1] == "wa,wb" and "c/x" not in metrics and metrics["a/x"] == metrics["b/x"] == 1.0
    ex.set_states("a", {"w": 1})
    assert ex.get_states("a") == {"w": 1} and ex.thread_ids() == {"a": 0, "b": 0, "c": 0} and ex.pids() == {}


def test_a_plan_that_cannot_compile_is_run_call_by_call_and_said_once() -> None:
    wf, plan = _wf(), load_workflow_text(WITH_C, "plan.yaml")
    be, said = PlanFake(wf, compile_fails=True), []
    ex = _executor(wf, be, said=said)
    ex.run(wf, 0)
    ex.run(plan, 1)
    assert be.executed == [] and be.submitted == ["iteration.wa[0]", "iteration.wb[0]", "iteration.wa[1]",
                                                  "iteration.wb[1]", "iteration.wc[1]"]
    assert len(said) == 1 and said[0].startswith("warning: cannot compile chain into a Ray Compiled Graph "
                                                 "(ValueError: a node the graph cannot hold)")


def test_a_backend_without_plans_is_refused_and_a_component_it_cannot_add_is_said() -> None:
    from interpreter.optimize.executor import Executor

    wf = _wf()
    closed: list[bool] = []
    be = FakeBackend(wf, Capabilities(processes=True))
    be.shutdown = lambda: closed.append(True)  # type: ignore[method-assign]
    with pytest.raises(ValueError, match="the fake backend cannot switch plans"):
        Executor(wf, lambda w, s: be, extra_components={})
    assert closed == [True]  # the Executor owns what it built, failed or not
    gpu = load_workflow_text(WITH_C.replace('args: {seconds: 0}}\niteration', 'args: {seconds: 0}, device: gpu}\niteration'),
                             "g.yaml")
    ex = _executor(wf, PlanFake(wf))
    with pytest.raises(Unsupported, match="cannot add GPU component 'c'"):
        ex.run(gpu, 0)
