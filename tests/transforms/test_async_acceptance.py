"""Issue 46 acceptance on workflows the rewrite was not written against (tests/dsl/fixtures/async_*.yaml):
which `defer` rewrites a declared budget allows, which it stops (with the read and its lag named), and
which K `defer NODE` picks and the optimizer tries when none is given."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from rose_dsl import load_workflow, load_workflow_text
from rose_dsl.analysis import read_lags
from rose_dsl.ir import Workflow
from rose_dsl.optimizer.candidates import asynchronous
from rose_dsl.transforms import Refused, apply, plan_differences

FIXTURES = Path(__file__).resolve().parents[1] / "dsl" / "fixtures"


def test_a_budget_on_one_generator_allows_its_sync_and_every_read_of_it_lags_one() -> None:
    wf = load_workflow(FIXTURES / "async_readers.yaml")
    plan = apply(wf, "defer sync 1")
    assert not isinstance(plan, Refused), plan
    lags = read_lags(plan.workflow)
    assert {n: lags[("gen.weights", ("iteration", n))] for n in ("rollout", "probe", "evaluate")} == \
        {"rollout": 1, "probe": 1, "evaluate": 1}
    assert lags[("gen2.weights", ("iteration", "rollout2"))] == 0
    assert plan_differences(wf, plan.workflow) == []


@pytest.mark.parametrize(("request_", "reason"), [
    ("defer sync2 1", "'gen2.weights' allows max_staleness 0"),  # the other generator has no budget
    ("defer sync 2", "a value 2 RL iterations old: 'gen.weights' allows max_staleness 1"),
    ("defer probe 1", "probe would see the value of sync instead"),  # a reader deferred sees a newer value
    ("defer evaluate 1", "evaluate would see the value of sync (next RL iteration) instead"),
    ("defer publish 1", "'publish' is deferred but its outputs are read"),
])
def test_a_budget_stops_the_rewrites_it_does_not_allow(request_: str, reason: str) -> None:
    refused = apply(load_workflow(FIXTURES / "async_readers.yaml"), request_)
    assert isinstance(refused, Refused)
    assert reason in refused.reason and refused.at is not None


def test_defer_without_k_takes_the_smallest_budget_it_writes() -> None:
    """Its sync writes gen.weights (budget 3) and gen.norm (budget 1): K = 3 would make the rollout's read
    of gen.norm 3 RL iterations old, so the default is 1 (before the fix: 3, and refused)."""
    wf = load_workflow(FIXTURES / "async_two_budgets.yaml")
    plan = apply(wf, "defer sync")
    assert not isinstance(plan, Refused), plan
    assert plan.description == "defer sync 1"
    refused = apply(wf, "defer sync 2")
    assert isinstance(refused, Refused) and "'gen.norm' allows max_staleness 1" in refused.reason
    assert [a.label for a in asynchronous(wf) if a.family == "defer"] == ["defer sync 1", "defer sync 2", "defer sync 3"]
    # and the reader of the budgeted state run ahead, alone and with the sync deferred by 1 (the budget allows 2)
    assert [a.label for a in asynchronous(wf) if a.family == "ahead"] == ["ahead rollout", "ahead rollout; defer sync 1"]


def _budgeted(wf: Workflow, component: str, budget: int) -> Workflow:
    """`wf` with every state object of `component` at `max_staleness: budget`."""
    comp = wf.components[component]
    return replace(wf, components={**wf.components, component: replace(
        comp, state=tuple(replace(s, max_staleness=budget) for s in comp.state))})


def test_a_budget_meant_as_unbounded_stops_at_the_run() -> None:
    """`max_staleness: 1000000` ("any staleness"): `defer sync` defers by at most the RL iteration count - 1
    and the optimizer tries no more (before the fix: K = 1000000, a check unrolling a million iterations,
    and a million candidates)."""
    wf = _budgeted(load_workflow(FIXTURES / "async_two_budgets.yaml"), "gen", 1_000_000)
    plan = apply(wf, "defer sync")
    assert not isinstance(plan, Refused), plan
    assert plan.description == f"defer sync {wf.root.count - 1}"
    assert [a.label for a in asynchronous(wf) if a.family == "defer"] == [f"defer sync {k}" for k in range(1, wf.root.count)]


INPLACE = """
rose: 1
name: async-inplace
components:
  learner: {impl: "tests.async_fakes:Learner", state: {weights: {max_staleness: 1}, opt: {max_staleness: BUDGET}}}
iteration:
  count: 4
  body:
    - {node: rollout, call: learner.get, state: {weights: read}, out: [w]}
    - {node: learn, call: learner.update, in: {rollouts: rollout.w, it: iteration.i}, state: {weights: update, opt: update}}
"""


def test_a_deferred_update_is_checked_on_the_state_it_alone_touches() -> None:
    """No separate generator: the rollout reads the learner's own weights and `learn` updates them and an
    optimizer state nothing reads. Deferring `learn` leaves RL iteration 0 without any access to `opt`:
    what it leaves is then the initial value, 1 RL iteration old -- within opt's budget 1 (before the fix:
    'no value', refused whatever the budget), and refused at learn's line with budget 0."""
    plan = apply(load_workflow_text(INPLACE.replace("BUDGET", "1"), "inplace.yaml"), "defer learn 1")
    assert not isinstance(plan, Refused), plan
    assert read_lags(plan.workflow)[("learner.weights", ("iteration", "rollout"))] == 1
    refused = apply(load_workflow_text(INPLACE.replace("BUDGET", "0"), "inplace.yaml"), "defer learn 1")
    assert isinstance(refused, Refused)
    assert "'learner.opt' RL iteration 0 leaves" in refused.reason and "the initial value instead" in refused.reason
    assert refused.at is not None and refused.at.line == 10


def test_explain_names_each_split_group_s_read_of_a_budgeted_state() -> None:
    """`split-time epoch 2` after `defer sync 1` on the PPO shape: both groups' `act` read the policy's
    weights 1 RL iteration late, and `rose validate --explain` names each by its path (before: two
    identical lines "'act' reads ...")."""
    from rose_dsl.analysis import analyze

    wf = _budgeted(load_workflow(FIXTURES / "ppo.yaml"), "policy", 1)
    plan = apply(wf, "defer sync 1")
    assert not isinstance(plan, Refused), plan
    plan = apply(plan.workflow, "split-time epoch 2")
    assert not isinstance(plan, Refused), plan
    lines = [line for line in analyze(plan.workflow).versions if "older than" in line]
    assert [line.split("'")[1] for line in lines] == ["epoch@0.step.act", "epoch@1.step.act"]
    assert all("(lag 1, max_staleness 1)" in line for line in lines)


def test_a_plan_that_declares_another_budget_than_its_source_is_refused_at_the_component() -> None:
    """A hand-edited plan lowering `max_staleness` to 0 under `defer sync 1` was accepted (the check holds
    reads to the source's budget) and `--explain` then printed "lag 1, max_staleness 0"; raising it was
    refused only by its consequences. Either is now named as the difference, at the component's line."""
    wf = load_workflow(FIXTURES / "async_readers.yaml")
    plan = apply(wf, "defer sync 1")
    assert not isinstance(plan, Refused), plan
    gen = plan.workflow.components["gen"]
    edited = replace(plan.workflow, components={**plan.workflow.components, "gen": replace(
        gen, state=tuple(replace(s, max_staleness=0) for s in gen.state))})
    diffs = plan_differences(wf, edited)
    assert [d.message for d in diffs] == [
        "state 'gen.weights' declares max_staleness 0, the source's 1: a budget is the source's (change it there, "
        "then rewrite)"]
    assert diffs[0].pos.line == gen.pos.line > 0


PARAM_BUDGET = """
rose: 1
name: async-param-budget
params: {stale: 0}
components:
  gen: {impl: "tests.async_fakes:Generator", state: {weights: {max_staleness: "${stale}"}}}
  learner: {impl: "tests.async_fakes:Learner", state: [weights]}
iteration:
  count: 4
  body:
    - {node: rollout, call: gen.generate, in: {it: iteration.i}, state: {weights: read}, out: [rollouts]}
    - {node: update, call: learner.update, in: {rollouts: rollout.rollouts, it: iteration.i}, state: {weights: update}}
    - {node: publish, call: learner.get, state: {weights: read}, out: [w]}
    - {node: sync, call: gen.load, in: {w: publish.w, it: iteration.i}, state: {weights: refresh}}
"""


def test_a_budget_is_a_param_a_run_sets() -> None:
    """`max_staleness: "${stale}"`: the declared default (0) refuses the deferral, `--set stale=1` allows
    it, and a value below 0 is an error at the budget's own line, like any other count over ${params}."""
    from rose_dsl.errors import WorkflowError

    assert isinstance(apply(load_workflow_text(PARAM_BUDGET, "p.yaml"), "defer sync 1"), Refused)
    wf = load_workflow_text(PARAM_BUDGET, "p.yaml", {"stale": 1})
    assert wf.components["gen"].state[0].max_staleness == 1
    assert not isinstance(apply(wf, "defer sync 1"), Refused)
    with pytest.raises(WorkflowError) as err:
        load_workflow_text(PARAM_BUDGET, "p.yaml", {"stale": -1})
    (diag,) = err.value.diagnostics
    assert diag.path == "components.gen.state.weights.max_staleness" and "negative" in diag.message
    assert diag.pos.line == 6


def test_an_explicit_k_past_the_run_is_refused_at_once() -> None:
    """`defer sync 100000` on a 4-iteration run with an unbounded budget: refused with the largest K that
    means something (before the fix: the check unrolled 100001 RL iterations and the command hung)."""
    wf = load_workflow_text(PARAM_BUDGET, "p.yaml", {"stale": 1_000_000})
    refused = apply(wf, "defer sync 100000")
    assert isinstance(refused, Refused) and "at most 3" in refused.reason and refused.at is not None
    assert not isinstance(apply(wf, "defer sync 3"), Refused)
