"""Calls run ahead (`ahead NODE`, rose_dsl/transforms/ahead.py): the next RL iteration's call of a node, and
of the nodes it reads from, run in this one -- the plan partial rollouts need (the next iteration's prompts
queued while this one decodes). Refused like `defer` where a read would be older than its budget; the
analysis proves the lag; the property test runs accepted plans on the pipelined runner and checks what the
components saw, and that the run leaves every state object as the synchronous run does (nothing runs ahead
across a barrier)."""

from __future__ import annotations

import json
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


@pytest.mark.e2e
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


@pytest.mark.e2e
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
def test_random_plans_stopped_at_any_iteration_resume_to_the_uninterrupted_run(doc, data, tmp_path_factory) -> None:
    """Random workflows and plans (`_draw_ahead_plan`), a stop asked before a random RL iteration p, random
    periodic checkpoints, in a run directory: the run ends after p iterations, its last checkpoint of
    iteration p - 1 with what was in flight (the deferred calls still to come, the calls run ahead); a
    `--resume` then sees, read for read, what the uninterrupted run of the plan saw and leaves every state
    object as it does (issue 58: the stop drained there, and every read after it saw newer values). Where
    the RL iteration carries values the stop drains instead, and its checkpoint says so."""
    from interpreter.checkpoint import list_complete, load_checkpoint

    iterations = 6
    _, plan, _, _ = _draw_ahead_plan(doc, data, iterations)
    p = data.draw(st.integers(1, iterations), label="stop asked before iteration")
    every = data.draw(st.sampled_from([0, 0, 1, 2, 4]), label="checkpoint_every")
    out = tmp_path_factory.mktemp("run")
    polls = iter(range(iterations + 1))  # the runner asks once before submitting each iteration, in order
    seen, left, lines = _stamps_of(plan, iterations, lambda: next(polls) >= p, every, out)
    whole_seen, whole_left, _ = _stamps_of(plan, iterations, checkpoint_every=every)  # (the same barriers)
    last = load_checkpoint(list_complete(out / "checkpoints")[-1])
    drained, ran = last.meta.get("drained_at_stop"), last.iteration + 1
    assert ran in ((p, p + 1) if drained else (p,)), (p, ran, drained)
    # the lines still waiting for deferred calls are kept with them, written by the resumed run
    assert lines == ran - sum(line["placed"] for line in (last.in_flight or {}).get("lines", ()))
    if ran == iterations:
        assert left == whole_left and seen == whole_seen
        return
    event(f"stopped with calls in flight: {last.in_flight is not None}; drained: {drained is not None}")
    more, left, _ = _stamps_of(plan, iterations, checkpoint_every=every, out_dir=out, resume=True)
    steps = [json.loads(x)["iteration"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(iterations)), steps  # every line once
    if drained is not None:
        return  # (not exact, and said so)
    assert not set(seen) & set(more)  # no call ran twice
    assert {**seen, **more} == whole_seen
    assert left == whole_left


def _run_fakes(wf, iterations: int, stop=None, checkpoint_every: int = 0, out_dir=None, resume: bool = False):
    """The `_text` workflow's fakes through the runner (with a run directory `out_dir`, if given; `resume`:
    continuing the run there): (results, every rollout's (iteration, weights stamp), the final states)."""
    from interpreter.backends import LocalBackend
    from interpreter.runner import RunConfig, Runner
    from interpreter.schedule import Schedule

    sch = Schedule(wf)
    be = LocalBackend(wf, ("tests.",), sch.program.loops_of)
    try:
        runner = Runner(wf, be, RunConfig(iterations=iterations, checkpoint_every=checkpoint_every,
                                          tensorboard=False, out_dir=out_dir, resume=resume), sch)
        results = runner.run(stop=stop)
        return results, list(be.workers["gen"].obj.seen), {c: be.control(c, "get_states") for c in be.components()}
    finally:
        be.shutdown()


@pytest.mark.parametrize("checkpoint_every", [0, 2, 3])
def test_a_stop_keeps_the_call_run_ahead_and_a_resume_ends_as_the_uninterrupted_run(checkpoint_every: int,
                                                                                     tmp_path) -> None:
    """`ahead generate` (budget 1): each rollout reads the weights one update older than declared, except
    right after a barrier, where the iteration's own rollout runs first. A stop asked before iteration 2 ends
    the run after iteration 1, whose place ran iteration 2's rollout ahead (unless iteration 1 was a
    checkpoint iteration: a barrier, nothing ahead): its checkpoint keeps that rollout's output, and the
    resumed run does not run it again -- every rollout reads what the uninterrupted run's read, and the
    run ends in its state. (The stop used to run iteration 2 too, without its own rollout ahead: a barrier
    the uninterrupted run does not have.)"""
    import uuid

    from interpreter.checkpoint import list_complete, load_checkpoint
    from tests.interpreter.test_async_plans import _text

    sleeps = {"gen": [0.0], "learner": [0.0], "scorer": [0.0]}
    wf = load_workflow_text(_text(1, [], sleeps, uuid.uuid4().hex, 8), "versions.yaml")
    plan = apply(wf, "ahead generate")
    assert not isinstance(plan, Refused), plan
    asked = iter([False, False, True])  # asked before submitting iterations 0, 1, 2 (then always True)
    results, seen, _ = _run_fakes(plan.workflow, 8, stop=lambda: next(asked, True), checkpoint_every=checkpoint_every,
                                  out_dir=tmp_path)
    assert [r.iteration for r in results] == [0, 1]
    last = load_checkpoint(list_complete(tmp_path / "checkpoints")[-1])
    assert last.iteration == 1 and (tmp_path / "export").is_dir()
    ahead = checkpoint_every != 2
    assert (last.in_flight is not None) == ahead
    assert [k for k, _ in seen] == [0, 1, 2][:3 if ahead else 2]  # no rollout of a later iteration ran
    _, more, states = _run_fakes(plan.workflow, 8, checkpoint_every=checkpoint_every, out_dir=tmp_path, resume=True)
    whole_results, whole, whole_states = _run_fakes(plan.workflow, 8, checkpoint_every=checkpoint_every)
    assert seen + more == whole
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(x["iteration"], x["gen/lag"]) for x in lines] == [(r.iteration, r.metrics["gen/lag"]) for r in whole_results]
    for comp, comp_states in whole_states.items():
        for name, value in comp_states.items():
            assert torch.equal(torch.as_tensor(states[comp][name]), torch.as_tensor(value)), (comp, name)
