"""Issue 58: a read's lag is the version distance of the learner updates its value derives from, followed
through syncs and relays (`rose_dsl/versions.py`), not the count of its own state's writes.

The two shapes accepted unsoundly before (`tests/dsl/fixtures/async_relay_*.yaml`): a chain of two budget-1
syncs with both deferred (or the actor run ahead and the first sync deferred), and a budget-1 relay feeding
a budget-0 actor. Each is refused by the rewrite and by the plan check, naming the read and the chain; the
proof of an accepted plan is what a run on the local backend measures (the actor logs the learner update
its weights come from: `tests.async_fakes`)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from interpreter.backends import LocalBackend
from interpreter.runner import RunConfig, Runner
from interpreter.schedule import Schedule
from rose_dsl import load_workflow
from rose_dsl.analysis import analyze, read_lags
from rose_dsl.ir import ExecutionNode, Workflow
from rose_dsl.transforms import Refused, apply, plan_differences
from rose_dsl.versions import version_proof

FIXTURES = Path(__file__).resolve().parents[1] / "dsl" / "fixtures"
CHAIN = "actor.weights <- sync2 <- relay.weights <- sync1 <- learner.weights"


def _plan(wf: Workflow, *requests: str) -> Workflow | Refused:
    for r in requests:
        got = apply(wf, r)
        if isinstance(got, Refused):
            return got
        wf = got.workflow
    return wf


def _forced(wf: Workflow, **defers: int) -> Workflow:
    """`wf` with `defer:` set by hand on the named nodes (no check): what a hand-edited plan runs."""
    body = tuple(replace(i, plan=replace(i.plan, defer=defers[i.name])) if isinstance(i, ExecutionNode)
                 and i.name in defers else i for i in wf.root.body)
    return replace(wf, root=replace(wf.root, body=body))


@pytest.mark.parametrize("requests", [("defer sync1 1", "defer sync2 1"), ("defer sync2 1", "defer sync1 1"),
                                      ("ahead act", "defer sync1 1"), ("defer sync1 1", "ahead act")])
def test_two_budget_one_syncs_in_a_chain_may_not_both_lag(requests: tuple[str, ...]) -> None:
    wf = load_workflow(FIXTURES / "async_relay_chain.yaml")
    assert not isinstance(_plan(wf, requests[0]), Refused)  # each alone is legal
    refused = _plan(wf, *requests)
    assert isinstance(refused, Refused)
    assert f"would make act read 'actor.weights' 2 updates of 'learner.weights' old: {CHAIN}: lag 2 > " \
           "max_staleness 1" in refused.reason
    assert refused.at is not None and refused.at.line == 14  # the actor's read


def test_a_budget_one_relay_feeding_a_budget_zero_actor_is_refused() -> None:
    refused = _plan(load_workflow(FIXTURES / "async_relay_budget0.yaml"), "defer sync1 1")
    assert isinstance(refused, Refused)
    assert f"act read 'actor.weights' 1 update of 'learner.weights' old: {CHAIN}: lag 1 > max_staleness 0" \
           in refused.reason


def test_the_proof_counts_the_relay_and_explain_prints_the_chain() -> None:
    wf = load_workflow(FIXTURES / "async_relay_chain.yaml")
    plan = _plan(wf, "defer sync1 1")
    assert isinstance(plan, Workflow)
    lags = read_lags(plan)
    # actor.weights's own writes are not late (sync2 runs in place); its value is one update old
    assert lags[("actor.weights", ("iteration", "act"))] == 1
    assert lags[("relay.weights", ("iteration", "forward"))] == 1
    line = next(v for v in analyze(plan).versions if v.startswith("actor.weights: 'act' reads a value"))
    assert "(lag 1, max_staleness 1)" in line and CHAIN in line


def test_a_hand_written_plan_deferring_both_syncs_is_refused_by_the_plan_check() -> None:
    wf = load_workflow(FIXTURES / "async_relay_chain.yaml")
    diffs = plan_differences(wf, _forced(wf, sync1=1, sync2=1))
    assert [d.path for d in diffs] == ["act.state"]
    assert diffs[0].message.startswith(f"act would read 'actor.weights' 2 updates of 'learner.weights' old: {CHAIN}")
    assert diffs[0].pos.line == 14
    assert plan_differences(wf, _forced(wf, sync1=1)) == []


def _measured(wf: Workflow, iterations: int) -> list[int]:
    """Per RL iteration, how many learner updates older than the synchronous run's the actor's weights are."""
    sch = Schedule(wf)
    be = LocalBackend(wf, ("tests.",), sch.program.loops_of)
    try:
        Runner(wf, be, RunConfig(iterations=iterations, tensorboard=False), sch).run()
        return [(it - 1) - stamp for it, stamp in be.workers["actor"].obj.seen]
    finally:
        be.shutdown()


@pytest.mark.parametrize(("defers", "lag"), [({"sync1": 1}, 1), ({"sync2": 1}, 1), ({"sync1": 1, "sync2": 1}, 2)])
def test_the_run_measures_the_lag_the_proof_gives(defers: dict[str, int], lag: int) -> None:
    """Executed on the local backend (the last one forced past the check), the actor reads weights exactly as
    old as proved -- before the fix the proof said 1 where the run read 2 (versions 0 0 0 1 2 3)."""
    plan = _forced(load_workflow(FIXTURES / "async_relay_chain.yaml"), **defers)
    proof = {inv.indices[0]: p.lag for (inv, state), p in version_proof(plan).items() if state == "actor.weights"}
    measured = _measured(plan, 6)
    assert max(proof.values()) == max(measured) == lag
    assert [measured[k] for k in sorted(proof)] == [proof[k] for k in sorted(proof)]  # iteration by iteration


def test_the_optimizer_report_states_the_actor_lag_through_the_relay() -> None:
    """Its staleness section listed only the relay (lag 1) where the actor read weights 2 updates old."""
    from rose_dsl.optimizer.report import staleness

    wf = load_workflow(FIXTURES / "async_relay_chain.yaml", {"actor_stale": 2})
    plan = _plan(wf, "ahead act", "defer sync1 1")
    assert isinstance(plan, Workflow)
    assert staleness(plan) == {"actor.weights": {"lag": 2, "max_staleness": 2},
                               "relay.weights": {"lag": 1, "max_staleness": 1}}
    assert max(_measured(plan, 6)) == 2
