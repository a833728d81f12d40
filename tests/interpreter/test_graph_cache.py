"""The Ray backend keeps the compiled graphs of the last few plans (`ray_backend.GRAPH_CACHE`): switching
back to a plan does not compile it again, each graph runs its own plan's nodes (two plans here run
different methods under the same node path), the least recently used graph goes when the cache is full,
and a restarted process drops them all. Checked against the local backend running the same sequence of
plans: the state a plan updates must come out bit for bit the same."""

from __future__ import annotations

import pytest
import torch

from interpreter import ray_backend as ray_backend_module
from interpreter.local_backend import LocalBackend
from interpreter.optimize.executor import Executor
from interpreter.ray_backend import GRAPH_CACHE, RayBackend
from interpreter.schedule import Schedule
from rose_dsl import load_workflow_text

ray = pytest.importorskip("ray")

METHODS = [f"m{i}" for i in range(GRAPH_CACHE + 2)]
BEHAVIORS = ", ".join(f"{m}: {{out: [y]}}" for m in METHODS)


def _plan(method: str):
    """A plan of one workflow: `wa` calls `a.<method>` (the same node path in every plan, another method)."""
    return load_workflow_text(f"""
rose: 1
name: cache-{method}
components:
  a: {{impl: "tests.mocks:Mock", args: {{name: a, batch: 4, behaviors: {{{BEHAVIORS}}}}}}}
  b: {{impl: "tests.mocks:Mock", state: [w], args: {{name: b, batch: 4, states: [w],
       behaviors: {{u: {{out: [z], state: {{w: update}}}}}}}}}}
iteration:
  count: 1000
  body:
    - {{node: wa, call: a.{method}, in: {{x: iteration.i}}, out: [y]}}
    - {{node: wb, call: b.u, in: {{y: wa.y}}, out: [z], state: {{w: update}}}}
""", f"{method}.yaml")


def _run(sequence: list[int], ray_backend: bool, on_ray=None) -> torch.Tensor:
    """Run plan `sequence[k]` at iteration k on one set of workers; b's state `w` afterwards."""
    plans = [_plan(m) for m in METHODS]
    base = plans[0]
    built: list[RayBackend] = []

    def build(wf, sch: Schedule):
        if not ray_backend:
            return LocalBackend(wf, ("tests.",), sch.program.loops_of)
        be = RayBackend(wf, ("tests.",), sch.program.loops_of)
        built.append(be)
        return be

    ex = Executor(base, build, compiled=ray_backend, extra_components={}, log=lambda s: None)
    try:
        for k, i in enumerate(sequence):
            ex.run(plans[i], k)
        if on_ray is not None:
            on_ray(ex, built[0], plans)
        return ex.get_states("b")["w"]
    finally:
        ex.close()


def test_switching_back_to_a_cached_plan_does_not_compile_it_again(ray_session, monkeypatch) -> None:
    sequence = [0, 1, 0, 1, 1, 0, 1, 0]
    builds: list[str] = []

    def check(ex: Executor, be: RayBackend, plans) -> None:
        assert ex.loads == 7 and len(be._graphs) == 2  # every switch loaded; two graphs compiled in all

    original = ray_backend_module.compile_iteration

    def counting(schedule, wf, actors):
        builds.append(schedule.workflow.name)
        return original(schedule, wf, actors)

    monkeypatch.setattr(ray_backend_module, "compile_iteration", counting)
    on_ray = _run(sequence, True, check)
    assert builds == ["cache-m0", "cache-m1"]
    assert torch.equal(on_ray, _run(sequence, False))


def test_the_least_recently_used_graph_goes_when_the_cache_is_full(ray_session) -> None:
    # every plan once (the first is evicted by the last), then the first again: compiled anew
    sequence = [*range(GRAPH_CACHE + 1), 0, GRAPH_CACHE]

    def check(ex: Executor, be: RayBackend, plans) -> None:
        assert len(be._graphs) == GRAPH_CACHE
        cached = {g.schedule.workflow.name for g in be._graphs.values()}
        assert cached == {f"cache-m{i}" for i in (0, *range(2, GRAPH_CACHE + 1))}  # m1 was the least recent
        # a restarted process invalidates every graph: the current one is compiled again, the rest dropped
        be.restart(["a"])
        assert len(be._graphs) == 1 and be.dag is not None
        ex.run(plans[1], len(sequence))
        ex.run(plans[0], len(sequence) + 1)

    on_ray = _run(sequence, True, check)
    assert torch.equal(on_ray, _run([*sequence, 1, 0], False))
