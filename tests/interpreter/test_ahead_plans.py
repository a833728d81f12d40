"""Calls run ahead (`ahead NODE`, rose_dsl/transforms/ahead.py): the next RL iteration's call of a node, and
of the nodes it reads from, run in this one -- the plan partial rollouts need (the next iteration's prompts
queued while this one decodes). Refused like `defer` where a read would be older than its budget; the
analysis proves the lag; the property test runs accepted plans on the pipelined runner and checks what the
components saw, and that the run leaves every state object as the synchronous run does (nothing runs ahead
across a barrier)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from rose_dsl import load_workflow, load_workflow_text
from rose_dsl.analysis import read_lags
from rose_dsl.ir import ExecutionNode
from rose_dsl.semantics import Program
from rose_dsl.transforms import Refused, apply
from tests.examples.test_async_learns import _train
from tests.interpreter.test_async_plans import _nodes, _stamped, _stamps_of, assert_reads_within_budget
from tests.strategies import workflows

ROOT = Path(__file__).resolve().parents[2]
LONGTAIL = ROOT / "workflows" / "llm_grpo_longtail.yaml"


def test_running_submit_ahead_needs_the_budget_and_takes_its_producer_along() -> None:
    wf = load_workflow(LONGTAIL, {"iterations": 6})
    refused = apply(wf, "ahead submit")
    assert isinstance(refused, Refused)
    assert "submit (next RL iteration) would see" in refused.reason and "allows max_staleness 0" in refused.reason
    plan = apply(load_workflow(LONGTAIL, {"iterations": 6, "stale": 1}), "ahead submit")
    assert not isinstance(plan, Refused), plan
    assert plan.description == "ahead sample submit"  # `submit` reads `sample`'s prompts of its own iteration
    ahead = {i.name for i in plan.workflow.root.body if isinstance(i, ExecutionNode) and i.plan.ahead}
    assert ahead == {"sample", "submit"} and Program(plan.workflow).depth == 2
    lags = read_lags(plan.workflow)
    assert lags[("generator.weights", ("iteration", "submit"))] == 1
    assert lags[("generator.weights", ("iteration", "generate"))] == 0
    # with the sync deferred too, the submit's read is two updates old: budget 1 refuses, budget 2 allows
    assert isinstance(apply(plan.workflow, "defer sync 1"), Refused)
    both = apply(apply(load_workflow(LONGTAIL, {"iterations": 6, "stale": 2}), "ahead submit").workflow, "defer sync 1")
    assert not isinstance(both, Refused), both
    assert read_lags(both.workflow)[("generator.weights", ("iteration", "submit"))] == 2


@pytest.mark.parametrize(("request_", "message"), [
    ("ahead submit 2", "only K = 1"),
    ("ahead step", "not a node directly in the RL iteration body"),
])
def test_what_ahead_does_not_support_is_refused_by_name(request_: str, message: str) -> None:
    wf = load_workflow(LONGTAIL, {"iterations": 6, "stale": 1})
    refused = apply(wf, request_)
    assert isinstance(refused, Refused) and message in refused.reason, refused


def test_a_prefetch_that_reads_no_budgeted_state_is_legal_at_budget_zero() -> None:
    """`ahead sample` alone: the next iteration's prompts drawn early compute what the declared workflow
    computes (the cursor advances in the same order), so no budget is needed."""
    plan = apply(load_workflow(LONGTAIL, {"iterations": 6}), "ahead sample")
    assert not isinstance(plan, Refused), plan
    assert not any(read_lags(plan.workflow).values())


def test_partial_rollouts_as_a_plan_learn_within_the_budget() -> None:
    """The shipped CPU long-tail workflow with `--set stale=1` and `ahead submit`: the next iteration's
    prompts decode beside this one's and cross its weight sync (completions of two versions), no sample is
    more than 1 update old (the learner raises beyond: `max_staleness: "${stale}"`), and the reward rises
    (first and last 10 iterations' means). Seeded and deterministic on a CPU."""
    torch.set_num_threads(1)
    iterations = 100  # (the declared workflow, seed 0: 0.052 -> 0.138 first/last 10; this plan 0.063 -> 0.177)
    wf = load_workflow(LONGTAIL, {"seed": 0, "iterations": iterations, "stale": 1})
    plan = apply(wf, "ahead submit")
    assert not isinstance(plan, Refused), plan
    metrics = _train(plan.workflow, iterations)
    assert max(m["learner/staleness_max"] for m in metrics) == 1
    assert sum(m.get("learner/mixed_version_samples", 0.0) for m in metrics) > 0
    rewards = [m["reward/mean_reward"] for m in metrics]
    first, last = sum(rewards[:10]) / 10, sum(rewards[-10:]) / 10
    assert last > first + 0.05, (first, last, rewards)


def _draw_ahead_plan(doc: dict, data: Any, iterations: int) -> tuple[Any, Any, tuple[str, str], int]:
    """A random workflow on `Stamper`s with a random budget on a random state object (mostly one something
    reads), a random top-level node run ahead (mostly a reader of that state) and sometimes a deferral too,
    random call durations: (workflow, accepted plan, budgeted (component, state), budget); hypothesis
    `assume`s away a refused `ahead`."""
    states = [(c, s) for c, comp in doc["components"].items() for s in comp["state"]]
    tops = [i["node"] for i in doc["iteration"]["body"] if "node" in i]
    assume(states and tops)
    budget = data.draw(st.sampled_from([0, 1, 1, 2]), label="budget")
    read = {(n["call"].split(".")[0], s) for n in _nodes(doc["iteration"]["body"]) for s, m in n.get("state", {}).items()
            if m == "read"}
    comp, state = data.draw(st.sampled_from(sorted(read) if read and data.draw(st.integers(0, 3)) else states),
                            label="budgeted")
    readers = [i["node"] for i in doc["iteration"]["body"] if "node" in i and i["call"].startswith(f"{comp}.")
               and i.get("state", {}).get(state) == "read"]  # mostly a reader of that state: what a budget is for
    name = data.draw(st.sampled_from(readers) if readers and data.draw(st.integers(0, 3)) else st.sampled_from(tops),
                     label="ahead")
    defer = data.draw(st.sampled_from([None, *tops]), label="deferred")
    sleeps = data.draw(st.lists(st.sampled_from([0.0, 0.0, 0.001, 0.004]), min_size=1, max_size=3), label="sleeps")
    doc = _stamped(doc, sleeps, iterations)
    doc["components"][comp]["state"] = {s: ({"max_staleness": budget} if s == state else None)
                                        for s in doc["components"][comp]["state"]}
    wf = load_workflow_text(yaml.safe_dump(doc), "random.yaml")
    plan = apply(wf, f"ahead {name}")
    assume(not isinstance(plan, Refused))
    if defer is not None:
        both = apply(plan.workflow, f"defer {defer} 1")
        if not isinstance(both, Refused):
            plan = both
            event("run ahead and deferred")
    return wf, plan.workflow, (comp, state), budget


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(doc=workflows(max_nodes=8, max_depth=2), data=st.data())
def test_random_workflows_run_ahead_within_budget_read_no_older_values_on_executions(doc, data) -> None:
    """Random workflows and plans (`_draw_ahead_plan`): when the oracle accepts the plan, its execution on the
    pipelined runner has every read see what the synchronous execution's same read saw L RL iterations
    earlier, L = 0 for updates and unbudgeted state objects and L <= max_staleness (and <= the lag the
    analysis proves) otherwise; and the run leaves every state object as the synchronous one."""
    iterations = 4
    wf, plan, budgeted, budget = _draw_ahead_plan(doc, data, iterations)
    assert_reads_within_budget(wf, plan, budgeted, budget, iterations)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(doc=workflows(max_nodes=8, max_depth=2), data=st.data())
def test_random_plans_stopped_before_any_iteration_keep_the_last_one_they_ran(doc, data, tmp_path_factory) -> None:
    """Random workflows and plans (`_draw_ahead_plan`), a stop asked before a random RL iteration p, random
    periodic checkpoints, in a run directory: the run ends after p iterations, or p + 1 when iteration p - 1
    ran p's calls ahead (they must not be lost); its last checkpoint is of the last iteration it ran; and
    it leaves every state object as the synchronous workflow does after as many iterations (what is
    deferred drained, nothing run ahead past the stop). A stop after a run-ahead iteration used to end
    without that checkpoint."""
    from interpreter.checkpoint import list_complete

    iterations = 6
    wf, plan, _, _ = _draw_ahead_plan(doc, data, iterations)
    p = data.draw(st.integers(1, iterations), label="stop asked before iteration")
    every = data.draw(st.sampled_from([0, 0, 1, 2, 4]), label="checkpoint_every")
    out = tmp_path_factory.mktemp("run")
    polls = iter(range(iterations + 1))  # the runner asks once before submitting each iteration, in order
    _, left, ran = _stamps_of(plan, iterations, lambda: next(polls) >= p, every, out)
    assert ran in (min(p, iterations), min(p + 1, iterations)), (p, ran)
    event("the iteration run ahead ran after the stop" if ran == p + 1 else "stopped at once")
    assert list_complete(out / "checkpoints")[-1].name == f"ckpt-{ran - 1:06d}"
    assert left == _stamps_of(wf, ran)[1]


def _run_fakes(wf, iterations: int, stop=None, checkpoint_every: int = 0, out_dir=None):
    """The `_text` workflow's fakes through the runner (with a run directory `out_dir`, if given): (results,
    every rollout's (iteration, weights stamp), the final states)."""
    from interpreter.backends import LocalBackend
    from interpreter.runner import RunConfig, Runner
    from interpreter.schedule import Schedule

    sch = Schedule(wf)
    be = LocalBackend(wf, ("tests.",), sch.program.loops_of)
    try:
        runner = Runner(wf, be, RunConfig(iterations=iterations, checkpoint_every=checkpoint_every,
                                          tensorboard=False, out_dir=out_dir), sch)
        results = runner.run(stop=stop)
        return results, list(be.workers["gen"].obj.seen), {c: be.control(c, "get_states") for c in be.components()}
    finally:
        be.shutdown()


@pytest.mark.parametrize(("checkpoint_every", "ran"), [(0, 3), (2, 2), (3, 3)])
def test_a_stop_finishes_the_iteration_whose_call_ran_ahead_and_leaves_the_declared_state(checkpoint_every: int,
                                                                                          ran: int, tmp_path) -> None:
    """`ahead generate` (budget 1): each rollout reads the weights one update older than declared, except
    right after a barrier, where the iteration's own rollout runs first. A stop asked before iteration 2
    still runs iteration 2 when iteration 1 ran its rollout ahead; after a checkpoint at iteration 1 (a
    barrier: nothing ran ahead) it does not. No rollout of a later iteration runs, and the states left are
    the synchronous run's after as many iterations, saved: the run directory's last checkpoint and its
    export are of the last iteration that ran (a stop that let a run-ahead iteration finish kept none)."""
    import uuid

    from interpreter.checkpoint import list_complete
    from tests.interpreter.test_async_plans import _text

    sleeps = {"gen": [0.0], "learner": [0.0], "scorer": [0.0]}
    wf = load_workflow_text(_text(1, [], sleeps, uuid.uuid4().hex, 8), "versions.yaml")
    plan = apply(wf, "ahead generate")
    assert not isinstance(plan, Refused), plan
    asked = iter([False, False, True])  # asked before submitting iterations 0, 1, 2 (then always True)
    results, seen, states = _run_fakes(plan.workflow, 8, stop=lambda: next(asked, True), checkpoint_every=checkpoint_every,
                                       out_dir=tmp_path)
    assert [r.iteration for r in results] == list(range(ran))
    assert list_complete(tmp_path / "checkpoints")[-1].name == f"ckpt-{ran - 1:06d}"
    assert (tmp_path / "export").is_dir()
    assert [k for k, _ in seen] == list(range(ran))  # no rollout of a later iteration ran
    assert [(k - 1) - stamp for k, stamp in seen] == [0, 1, 1][:ran]  # rollout k read update k-2, not k-1
    _, _, sync_states = _run_fakes(wf, ran)
    for comp, comp_states in sync_states.items():
        for name, value in comp_states.items():
            assert torch.equal(torch.as_tensor(states[comp][name]), torch.as_tensor(value)), (comp, name)
