"""Temporal splits whose copies are seeded from the original's state (issue 42), in the shapes the
property generator rarely draws: state the loop reads that is written after it (seen by the next RL
iteration's loop), several such state objects, its groups interleaved, a split
nested in a split loop (a copy of a copy seeded from the group's copy), an outer split over a loop
whose body already holds seeds. Each plan passes the check against its source and computes what the
declared workflow computes, bit for bit, in program order and in random legal orders; the same plan
without its seeds does not."""

from __future__ import annotations

from dataclasses import replace

import pytest

from rose_dsl import load_workflow_text
from rose_dsl.transforms import apply_request, compose
from rose_dsl.transforms.plan_check import plan_differences
from rose_dsl.transforms.seeds import is_seed
from rose_dsl.transforms.tree import map_tree

from .harness import assert_preserved, differences, execute


def _mock(name: str, states: list[str], behaviors: dict[str, str]) -> str:
    beh = ", ".join(f"{m}: {{{b}, out: [o0], separable: true}}" for m, b in behaviors.items())
    return (f'  {name}: {{impl: "tests.mocks:Mock", state: {states}, args: {{name: {name}, batch: 6, '
            f"states: {states}, behaviors: {{{beh}}}}}}}\n")


B = "batch: {dim: 0, size: 6}"
C0 = _mock("c0", ["s0", "s1", "s2"], {"n1": "state: {s0: update}", "n3": "state: {s1: refresh}",
                                      "n4": "state: {s0: read, s2: read, s1: update}", "n6": "state: {s2: update}",
                                      "n7": "state: {}", "n8": "state: {}"})
C1 = _mock("c1", ["acc"], {"n5": "state: {acc: update}"})
LOOP = f"""\
    - loop: l2
      count: 4
      body:
        - {{node: n3, call: c0.n3, in: {{t: l2.i}}, state: {{s1: refresh}}, out: [o0], {B}}}
        - {{node: n4, call: c0.n4, in: {{x: n3.o0}}, state: {{s0: read, s2: read, s1: update}}, out: [o0], {B}}}
"""
AFTER = f"""\
    - {{node: n5, call: c1.n5, in: {{a: "l2[0].n4.o0", b: "l2[1].n4.o0"}}, state: {{acc: update}}, out: [o0], {B}}}
    - {{node: n6, call: c0.n6, in: {{a: "l2[2].n4.o0"}}, state: {{s2: update}}, out: [o0], {B}}}
"""
FLAT = ("rose: 1\nname: seeded\ncomponents:\n" + C0 + C1 + "iteration:\n  count: 3\n  body:\n"
        + f"    - {{node: n1, call: c0.n1, state: {{s0: update}}, out: [o0], {B}}}\n" + LOOP + AFTER)
NESTED = ("rose: 1\nname: seeded\ncomponents:\n" + C0 + C1 + "iteration:\n  count: 2\n  body:\n"
          + f"    - {{node: n1, call: c0.n1, state: {{s0: update}}, out: [o0], {B}}}\n"
          + "    - loop: l0\n      count: 2\n      body:\n"
          + f"        - {{node: n7, call: c0.n7, in: {{t: l0.i}}, out: [o0], {B}}}\n"
          + "\n".join("    " + line for line in LOOP.splitlines()) + "\n"
          + f"        - {{node: n8, call: c0.n8, in: {{a: \"l2[0].n4.o0\", b: \"l2[3].n4.o0\"}}, out: [o0], {B}}}\n"
          + f"    - {{node: n5, call: c1.n5, in: {{a: \"l0[0].n8.o0\", b: \"l0[1].n8.o0\"}}, state: {{acc: update}}, "
            f"out: [o0], {B}}}\n"
          + f"    - {{node: n6, call: c0.n6, state: {{s2: update}}, out: [o0], {B}}}\n")


def _unseeded(wf):
    def drop(item):
        body = getattr(item, "body", None)
        return replace(item, body=tuple(i for i in body if not is_seed(i))) if body is not None else item

    return map_tree(wf.root, drop)


CASES = [
    (FLAT, ("split-time l2 2",)),
    (FLAT, ("split-time l2 3",)),
    (FLAT, ("split-time l2 4",)),
    (FLAT, ("split-time l2 3", "interleave l2")),
    (NESTED, ("split-time l0.l2 2",)),
    (NESTED, ("split-time l0.l2 2", "split-time l0 2")),
    (NESTED, ("split-time l0 2", "split-time l0@0.l2 2", "split-time l0@1.l2 2")),
]


@pytest.mark.parametrize(("text", "requests"), CASES, ids=[" ; ".join(r) for _, r in CASES])
def test_a_seeded_split_computes_what_the_declared_workflow_computes(text: str, requests: tuple[str, ...]) -> None:
    wf = load_workflow_text(text, "wf.yaml")
    result = None
    for request in requests:
        step = apply_request(result.workflow if result else wf, request)
        result = step if result is None else compose(result, step)
    assert result is not None
    plan = result.workflow
    assert any(is_seed(i) for i in plan.items()), "the case must exercise seeding"
    assert plan_differences(wf, plan) == []
    assert_preserved(wf, result)
    unseeded = replace(plan, root=_unseeded(plan))
    assert plan_differences(wf, unseeded) != []
    ref_run, ref_comps = execute(wf, "program")
    run, comps = execute(unseeded, "program")
    assert differences(wf, ref_run, ref_comps, unseeded, run, comps, result.locate) != []
