"""`after:` is an ordering dependency everywhere it matters -- validation, the analysis (and so every
rewrite's legality check), the reference interpreter's random orders and all three runtime dispatchers
-- and `priority`, which nothing could honour in a runtime where each component runs its calls in
program order, is gone from the format."""

from __future__ import annotations

import pytest

from interpreter.backends import LocalBackend, RayBackend
from interpreter.components import instantiate
from interpreter.reference import run_reference
from interpreter.runner import RunConfig, Runner
from interpreter.schedule import Schedule
from rose_dsl import WorkflowError, load_workflow_text
from rose_dsl.analysis import invocation_graph
from rose_dsl.transforms import Refused, fuse_loops, rewire

# `late` (component b) reads nothing from loop `s` (component a): only `after: [s]` orders them
AFTER = """
rose: 1
name: after
components:
  a: {impl: "tests.mocks:Sleeper", args: {seconds: 0.3}}
  b: {impl: "tests.mocks:Sleeper", args: {seconds: 0.01}}
iteration:
  count: 2
  body:
    - loop: s
      count: 2
      body:
        - {node: slow, call: a.work, in: {x: iteration.i}, out: [y]}
    - {node: late, call: b.work, in: {x: iteration.i}, out: [y]AFTER}
"""


def _wf(after: str = ", after: [s]", seconds: float = 0.3):
    text = AFTER.replace("AFTER", after)
    if seconds != 0.3:
        text = text.replace("args: {seconds: 0.3}", f"args: {{seconds: {seconds}}}")
    return load_workflow_text(text, "after.yaml")


def test_after_must_name_an_earlier_sibling() -> None:
    text = AFTER.replace("AFTER", "").replace("        - {node: slow, call: a.work, in: {x: iteration.i}, out: [y]}",
                                              "        - {node: slow, call: a.work, in: {x: iteration.i}, out: [y], "
                                              "after: [ghost]}")
    text = text.replace("    - loop: s\n", "    - loop: s\n      after: [late]\n")
    with pytest.raises(WorkflowError) as info:
        load_workflow_text(text, "after.yaml")
    message = str(info.value)
    assert "after.yaml:11:14: iteration.body[0].after: 'after: late' names a sibling that runs later" in message
    assert "'after: ghost' names no item of this body" in message


@pytest.mark.parametrize("field", ["priority: 2", "after: [a]"])
def test_priority_and_an_after_on_a_merge_are_not_in_the_format(field) -> None:
    body = "    - {node: x, call: a.work, out: [y]}\n" if field.startswith("priority") else ""
    item = "{node: z, call: a.work, out: [y], " + field + "}" if field.startswith("priority") else \
        "{merge: z, from: [a, b], ports: {y: 0}, " + field + "}"
    text = f"""
rose: 1
name: fields
components:
  a: {{impl: "tests.mocks:Sleeper"}}
iteration:
  body:
{body}    - {item}
"""
    with pytest.raises(WorkflowError, match=field.split(":")[0]):
        load_workflow_text(text, "fields.yaml")


def test_after_is_a_dependency_of_every_call_inside_on_every_call_inside_its_target() -> None:
    g = invocation_graph(_wf())
    after = {(p, c) for p, c, dep in g.edges() if dep.kind == "after"}
    want = {(f"iteration.s.slow[{k}][{j}]", f"iteration.late[{k}]") for k in range(2) for j in range(2)}
    assert {(str(p), str(c)) for p, c in after} == want  # same RL iteration only
    assert all(dep.detail == "late: after s" and not dep.flow for _, _, dep in g.edges() if dep.kind == "after")
    assert not [e for e in invocation_graph(_wf("")).edges() if e[2].kind == "after"]


def test_a_rewrite_that_breaks_an_after_is_refused() -> None:
    with pytest.raises(Refused, match="'after: s' names a sibling that runs later"):
        rewire(_wf(), ("iteration", "late"), before="s")
    rewire(_wf(""), ("iteration", "late"), before="s")  # legal without it
    # fusing the loops would run t's iteration 0 before s's iteration 1: the analysis' edge refuses it
    text = AFTER.replace("AFTER", "").replace(
        "    - {node: late, call: b.work, in: {x: iteration.i}, out: [y]}",
        "    - loop: t\n      count: 2\n      AFTER\n      body:\n"
        "        - {node: late, call: b.work, in: {x: iteration.i}, out: [y]}")
    with pytest.raises(Refused, match=r"would break the ordering constraint s\[1\]\.slow -> t\[0\]\.late "
                                      r"\(t: after s\): t\[0\]\.late would run first"):
        fuse_loops(load_workflow_text(text.replace("AFTER", "after: [s]"), "t.yaml"), ("iteration", "s"),
                   ("iteration", "t"))
    fuse_loops(load_workflow_text(text.replace("      AFTER\n", ""), "t.yaml"), ("iteration", "s"), ("iteration", "t"))


def test_random_orders_of_the_reference_interpreter_respect_after() -> None:
    # (the reference interpreter runs one call at a time in the order its seed draws: the calls' sleep
    # decides nothing here, so `slow` does not sleep -- 60 runs of two 0.3-s calls were 36 s of waiting)
    wf = _wf(seconds=0.0)
    for seed in range(30):
        run = run_reference(wf, instantiate(wf, ("tests.",)), range(1), order="random", seed=seed)
        where = {str(inv): i for i, inv in enumerate(run.order)}
        assert where["iteration.late[0]"] > max(where["iteration.s.slow[0][0]"], where["iteration.s.slow[0][1]"])
    free = _wf("", seconds=0.0)
    orders = {tuple(map(str, run_reference(free, instantiate(free, ("tests.",)), range(1), order="random",
                                           seed=seed).order)) for seed in range(30)}
    assert any(o[0] == "iteration.late[0]" for o in orders)  # without it, `late` may go first


@pytest.mark.e2e
@pytest.mark.parametrize("backend", ["local", "ray", "ray-compiled"])
def test_the_runtime_starts_a_call_only_after_what_it_is_after(backend, request) -> None:
    if backend != "local":
        request.getfixturevalue("ray_session")
    wf = _wf()
    sch = Schedule(wf)
    be = (LocalBackend if backend == "local" else RayBackend)(wf, ("tests.",), sch.program.loops_of)
    if backend == "ray-compiled":
        be.compile(sch)
    try:
        runner = Runner(wf, be, RunConfig(iterations=2, tensorboard=False), sch)
        runner.run()
    finally:
        be.shutdown()
    recs = runner.trace.records()
    for k in range(2):
        slow_end = max(r.host_end_ns for r in recs if r.node == "iteration.s.slow" and r.loop_indices[0][1] == k)
        late = next(r for r in recs if r.node == "iteration.late" and r.loop_indices[0][1] == k)
        assert late.host_start_ns >= slow_end, f"iteration {k}: late started {(slow_end - late.host_start_ns) / 1e6:.0f} ms early"
