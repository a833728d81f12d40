"""`interleave LOOP_A LOOP_B`: consecutive sibling loops take turns, one call each, instead of one loop after
the other -- two rollouts on two simulators that share the policy (a CPU sweep of unseen workflows,
2026-12-05: the policy ran all of the first loop's calls before the second's; taking turns, 1.49x,
bit-identical). Only program order changes; a loop that reads a value of the other, or whose state
accesses would see other writes, is refused with the dependency."""

from __future__ import annotations

import pytest

from rose_dsl import load_workflow_text
from rose_dsl.semantics import Program
from rose_dsl.transforms import Refused, apply_request, compose
from rose_dsl.transforms.passes import REQUEST_HELP

from .harness import assert_preserved

TWO_ROLLOUTS = """
rose: 1
name: two-rollouts
components:
  pol: {impl: "tests.mocks:Mock", args: {name: pol, batch: 8, behaviors: {
          act: {state: {}, out: [action], separable: true}}}}
  cart: {impl: "tests.mocks:Mock", state: [ep], args: {name: cart, batch: 8, states: [ep], behaviors: {
          reset: {state: {ep: refresh}, out: [obs], separable: true},
          step: {state: {ep: update}, out: [obs], separable: true}}}}
  arm: {impl: "tests.mocks:Mock", state: [ep], args: {name: arm, batch: 8, states: [ep], behaviors: {
          reset: {state: {ep: refresh}, out: [obs], separable: true},
          step: {state: {ep: update}, out: [obs], separable: true}}}}
  learner: {impl: "tests.mocks:Mock", state: [w], args: {name: learner, batch: 8, states: [w], behaviors: {
          learn: {state: {w: update}, out: [loss], separable: false}}}}
iteration:
  count: 2
  body:
    - {node: reset_a, call: cart.reset, in: {it: iteration.i}, state: {ep: refresh}, out: [obs], batch: {dim: 0, size: 8}}
    - loop: la
      count: 3
      carry: {o: {init: reset_a.obs, next: step_a.obs}}
      body:
        - {node: act_a, call: pol.act, in: {obs: la.o}, out: [action], batch: {dim: 0, size: 8}}
        - {node: step_a, call: cart.step, in: {action: act_a.action}, state: {ep: update}, out: [obs], batch: {dim: 0, size: 8}}
      collect: {traj: "stack(la[*].{step_a.obs})"}
    - {node: reset_b, call: arm.reset, in: {it: iteration.i}, state: {ep: refresh}, out: [obs], batch: {dim: 0, size: 8}}
    - loop: lb
      count: 2
      carry: {o: {init: reset_b.obs, next: step_b.obs}}
      body:
        - {node: act_b, call: pol.act, in: {obs: lb.o}, out: [action], batch: {dim: 0, size: 8}}
        - {node: step_b, call: arm.step, in: {action: act_b.action}, state: {ep: update}, out: [obs], batch: {dim: 0, size: 8}}
      collect: {traj: "stack(lb[*].{step_b.obs})"}
    - {node: fit, call: learner.learn, in: {tokens: la.traj, reward: lb.traj}, state: {w: update}, out: [loss]}
"""


def _wf(text: str = TWO_ROLLOUTS):
    return load_workflow_text(text, "two.yaml")


def _apply(wf, *requests):
    result = apply_request(wf, requests[0])
    for r in requests[1:]:
        result = compose(result, apply_request(result.workflow, r))
    return result


def _policy_order(wf) -> list[str]:
    return [s.node.name for s in Program(wf).unroll(0) if s.node.component == "pol"]


def test_two_rollouts_take_turns_on_the_policy_and_compute_the_same() -> None:
    wf = _wf()
    assert _policy_order(wf) == ["act_a"] * 3 + ["act_b"] * 2
    result = _apply(wf, "rewire reset_b before la", "interleave la lb")
    assert _policy_order(result.workflow) == ["act_a", "act_b", "act_a", "act_b", "act_a"]  # 3 and 2: the rest after
    assert [i.plan.interleaved for i in result.workflow.root.body if i.name in ("la", "lb")] == [True, True]
    assert_preserved(wf, result)
    assert "interleave LOOP_A LOOP_B" in REQUEST_HELP


def test_loops_with_things_between_them_or_that_are_not_loops_are_refused() -> None:
    wf = _wf()
    with pytest.raises(Refused, match="'reset_b' is between them"):
        apply_request(wf, "interleave la lb")
    with pytest.raises(Refused, match="'fit' is not a loop"):
        apply_request(wf, "interleave lb fit")


def test_a_loop_that_reads_the_other_is_refused_with_the_dependency() -> None:
    """lb's first observation is la's last: taking turns would run act_b before la has ended."""
    text = TWO_ROLLOUTS.replace("carry: {o: {init: reset_b.obs, next: step_b.obs}}",
                                "carry: {o: {init: la.o, next: step_b.obs}}")
    wf = _wf(text)
    with pytest.raises(Refused) as info:
        _apply(wf, "rewire reset_b before la", "interleave la lb")
    assert "'lb' depends on 'la'" in info.value.reason and "lb[0].act_b" in info.value.reason, info.value.reason
    assert not info.value.internal


def test_loops_that_write_the_same_state_are_refused() -> None:
    """Both rollouts step the same simulator: taking turns would interleave their episodes' updates."""
    text = TWO_ROLLOUTS.replace("call: arm.step", "call: cart.step").replace("init: reset_b.obs", "init: reset_a.obs")
    text = "\n".join(line for line in text.splitlines() if "node: reset_b" not in line) + "\n"
    with pytest.raises(Refused) as info:
        apply_request(_wf(text), "interleave la lb")
    assert "'lb' depends on 'la'" in info.value.reason and "state" in info.value.reason and not info.value.internal
