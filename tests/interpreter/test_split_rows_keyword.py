"""The `rows=` keyword of split groups (docs/components.md): only a method that touches per-row state takes
it. Found on the H200 (2026-12-03): `rose optimize` on llm_grpo_gpu split `reward.score`, a stateless method
without `rows`, and every trial failed with "got an unexpected keyword argument 'rows'"."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from interpreter.components import ComponentError, invoke
from rose_dsl import load_workflow_text
from rose_dsl.ir import ExecutionNode

WORKFLOW = """
rose: 1
name: rows-keyword
components:
  scorer: {impl: "tests.nowhere:Scorer"}
  sim: {impl: "tests.nowhere:Sim", state: [episode]}
iteration:
  count: 1
  body:
    - node: score
      call: scorer.score
      in: {x: iteration.i}
      out: [y]
    - node: step
      call: sim.step
      in: {x: score.y}
      state: {episode: update}
      out: [obs]
"""


class Scorer:
    def score(self, x: Any) -> dict[str, Any]:  # stateless: no rows
        return {"y": [v * 2 for v in x]}


class Sim:
    def step(self, x: Any) -> dict[str, Any]:  # touches state, yet no rows: a broken contract
        return {"obs": x}


class RowsSim:
    def __init__(self) -> None:
        self.seen: list[slice | None] = []

    def step(self, x: Any, rows: slice | None = None) -> dict[str, Any]:
        self.seen.append(rows)
        return {"obs": x}


def _node(name: str) -> ExecutionNode:
    wf = load_workflow_text(WORKFLOW, "rows.yaml")
    node = next(n for n in wf.items() if isinstance(n, ExecutionNode) and n.name == name)
    return replace(node, plan=replace(node.plan, rows=(2, 4)))


def test_a_stateless_method_without_rows_runs_on_its_sliced_inputs() -> None:
    assert invoke(Scorer(), _node("score"), {"x": [3, 4]}) == {"y": [6, 8]}


def test_a_method_that_takes_rows_gets_the_group_range() -> None:
    sim = RowsSim()
    invoke(sim, _node("step"), {"x": [1, 2]})
    assert sim.seen == [slice(2, 4)]


def test_a_stateful_method_without_rows_is_named_not_a_type_error() -> None:
    with pytest.raises(ComponentError, match=r"declares state \(sim.episode\), but takes no `rows=` argument"):
        invoke(Sim(), _node("step"), {"x": [1, 2]})


def test_before_any_call_the_started_component_says_which_row_groups_it_cannot_take() -> None:
    """User-error sweep (2026-12-05, BUG_8's remainder): `rows:` on a stateful node whose method takes no
    `rows=` failed at its first call, after others ran (exit 3). `call_problems` asks the started component
    (each backend, before the first call); `CallProblems` says it at the node's `rows:` (exit 2 in the CLI).
    A stateless method and one taking `rows=` are fine; a missing method is said at its `call:`."""
    from interpreter.components import CallProblems, call_problems

    nodes = [_node("score"), _node("step")]
    assert call_problems(Scorer(), nodes[:1]) == {}
    assert call_problems(RowsSim(), nodes[1:]) == {}
    problems = call_problems(Sim(), nodes[1:])
    assert problems == {"missing": {}, "no_rows": ["step"]}
    wf = load_workflow_text(WORKFLOW, "rows.yaml")
    exc = CallProblems(wf.components["sim"], problems, nodes[1:])
    (diag,) = exc.diagnostics
    assert diag.path == "iteration.step.rows" and "takes no `rows=` argument" in diag.message
    typo = call_problems(Sim(), [replace(nodes[1], method="stpe")])
    assert typo == {"missing": {"stpe": "did you mean 'step'?"}, "no_rows": []}
    (diag,) = CallProblems(wf.components["sim"], typo, [replace(nodes[1], method="stpe")]).diagnostics
    assert diag.path == "iteration.step.call" and diag.hint == "did you mean 'step'?"
