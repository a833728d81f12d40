"""A temporal split whose copies start from the original's state (issue 42): the loop reads state of a
component it writes that was set before the loop, so the split seeds each copy (`seeds.py`); the plan
computes bit for bit what the declared workflow computes on the local and Ray backends, and the same
plan without its seeds computes something else (which is why the split used to be refused)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from interpreter.backends import LocalBackend, RayBackend
from interpreter.runner import RunConfig, Runner
from interpreter.schedule import Schedule
from rose_dsl import load_workflow_text
from rose_dsl.transforms import apply_request
from rose_dsl.transforms.plan_check import plan_differences
from rose_dsl.transforms.seeds import SEED_GET, SEED_SET, is_seed

ALLOWED = ("tests.",)


def _mock(name: str, states: list[str], behaviors: str) -> str:
    return (f'  {name}: {{impl: "tests.mocks:Mock", state: {states}, args: {{name: {name}, batch: 6, '
            f"states: {states}, behaviors: {{{behaviors}}}}}}}\n")


SEP = "out: [o0], separable: true"
WORKFLOW = ("rose: 1\nname: seeded\ncomponents:\n"
            + _mock("c0", ["s0", "s1"], f"n1: {{state: {{s0: update}}, {SEP}}}, n3: {{state: {{s1: refresh}}, {SEP}}}, "
                                        f"n4: {{state: {{s0: read, s1: update}}, {SEP}}}")
            + _mock("c1", ["acc"], f"n5: {{state: {{acc: update}}, {SEP}}}")
            + """\
iteration:
  count: 3
  body:
    - {node: n1, call: c0.n1, state: {s0: update}, out: [o0], batch: {dim: 0, size: 6}}
    - loop: l2
      count: 3
      body:
        - {node: n3, call: c0.n3, in: {t: l2.i}, state: {s1: refresh}, out: [o0], batch: {dim: 0, size: 6}}
        - {node: n4, call: c0.n4, in: {x: n3.o0}, state: {s0: read, s1: update}, out: [o0], batch: {dim: 0, size: 6}}
    - {node: n5, call: c1.n5, in: {a: "l2[0].n4.o0", b: "l2[1].n4.o0"}, state: {acc: update}, out: [o0],
       batch: {dim: 0, size: 6}}
""")


def _declared():
    return load_workflow_text(WORKFLOW, "seeded.yaml")


def _run(wf, backend_cls, compiled: bool = False) -> dict[str, dict[str, torch.Tensor]]:
    """The declared components' state after 3 RL iterations."""
    sch = Schedule(wf)
    be = backend_cls(wf, ALLOWED, sch.program.loops_of)
    if compiled:
        be.compile(sch)
    try:
        Runner(wf, be, RunConfig(iterations=3, tensorboard=False), sch).run()
        return {n: be.control(n, "get_states") for n in ("c0", "c1")}
    finally:
        be.shutdown()


def _same(a, b) -> bool:
    return all(torch.equal(a[c][s], b[c][s]) for c in a for s in a[c])


def _unseeded(plan):
    return replace(plan, root=replace(plan.root, body=tuple(i for i in plan.root.body if not is_seed(i))))


def test_split_time_seeds_each_copy_from_the_original() -> None:
    plan = apply_request(_declared(), "split-time l2 3").workflow
    seeds = [i for i in plan.root.body if is_seed(i)]
    assert [(s.component, s.method, [e.state for e in s.effects]) for s in seeds] == [
        ("c0", SEED_GET, ["c0.s0"]), ("c0@0", SEED_SET, ["c0@0.s0"]), ("c0@1", SEED_SET, ["c0@1.s0"])]
    assert plan_differences(_declared(), plan) == []
    # the plan check refuses the same plan without its seeds: the copies would see their constructor's s0
    assert "would see the initial value of 'c0@0.s0'" in plan_differences(_declared(), _unseeded(plan))[0].message


def test_seeded_plan_computes_what_the_declared_workflow_computes_local() -> None:
    declared = _declared()
    plan = apply_request(declared, "split-time l2 3").workflow
    want = _run(declared, LocalBackend)
    assert _same(want, _run(plan, LocalBackend))
    assert not _same(want, _run(_unseeded(plan), LocalBackend))  # the seeds are what makes it equal


@pytest.mark.parametrize("compiled", [False, True], ids=["per-call", "compiled-graph"])
def test_seeded_plan_computes_what_the_declared_workflow_computes_ray(ray_session, compiled: bool) -> None:
    declared = _declared()
    plan = apply_request(declared, "split-time l2 2").workflow
    assert _same(_run(declared, LocalBackend), _run(plan, RayBackend, compiled))


def test_a_hand_edited_seed_is_checked_like_any_state_access() -> None:
    """A plan is anyone's edit: a seed set fed by another node's output, a seed that sets a component that
    is not a copy, and a seeding call in a file that is not a plan are each refused."""
    from rose_dsl.expr import parse_expr
    from rose_dsl.transforms.plan_check import first_plan_construct

    declared = _declared()
    plan = apply_request(declared, "split-time l2 3").workflow

    def edited(name: str, **fields):
        body = tuple(replace(i, **fields) if i.name == name else i for i in plan.root.body)
        return replace(plan, root=replace(plan.root, body=body))

    fed_by_n1 = edited("seed_l2_c0_0", inputs=(("states", parse_expr("n1.o0")),))
    assert "would see no value of 'c0@0.s0'" in plan_differences(declared, fed_by_n1)[0].message
    on_the_original = edited("seed_l2_c0_0", component="c0", effects=plan.find(("iteration", "seed_l2_c0")).effects)
    assert "is not a seed of a temporal group's copy" in plan_differences(declared, on_the_original)[0].message
    not_a_plan = replace(declared, root=replace(declared.root, body=(plan.find(("iteration", "seed_l2_c0")),)
                                                + declared.root.body))
    assert "calls c0._rose_get_states, which rose writes only into plans" in first_plan_construct(not_a_plan)[2]
