"""A temporal split inside a group of another temporal split copies the copies' component: the copy is
named after the original (`c0@1`), never `c0@0@0` (which the schema refuses, so the plan could not be
read back). Found by the property suite (`test_accepted_rewrites_preserve_results_in_any_legal_order`)."""

from __future__ import annotations

import pytest

from rose_dsl import load_workflow_text
from rose_dsl.serialize import to_yaml
from rose_dsl.transforms import apply_request

NESTED = """
rose: 1
name: nested
components:
  c0: {impl: "tests.mocks:Sleeper", args: {seconds: 0}, state: [count]}
iteration:
  count: 1
  body:
    - loop: l1
      count: 2
      body:
        - loop: l2
          count: 2
          body:
            - {node: n3, call: c0.work, state: {count: refresh}}
"""


@pytest.mark.parametrize("group", ["l1@0", "l1@1"])
def test_a_copy_of_a_copy_is_named_after_the_original_and_the_plan_reads_back(group: str) -> None:
    wf = load_workflow_text(NESTED, "nested.yaml")
    once = apply_request(wf, "split-time l1 2").workflow
    twice = apply_request(once, f"split-time {group}.l2 2").workflow
    assert sorted(twice.components) == ["c0", "c0@0", "c0@1"]
    assert {c.copy_of for n, c in twice.components.items() if n != "c0"} == {"c0"}
    assert load_workflow_text(to_yaml(twice), "plan.yaml") == twice
