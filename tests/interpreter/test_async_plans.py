"""Asynchronous plans (`defer:`) with a staleness budget (`max_staleness:`), checked on executions.

The rewrite is refused whenever a read would be older than its state object's budget (default 0, so on
every shipped workflow), the analysis proves the lag of each read, and the pipelined runner
(`interpreter/pipeline.py`) executes accepted plans with several RL iterations in flight. The property
test draws the workflow's shape, the budget, the deferral, checkpoints and every call's duration, runs
the plan on the local backend and checks, on what the components saw, that no read is older than its
budget, that the lag the analysis proves is the one observed, and that each metrics line is its own
iteration's.
"""

from __future__ import annotations

import itertools
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from interpreter.backends import LocalBackend
from interpreter.runner import RunConfig, Runner
from interpreter.schedule import Schedule
from rose_dsl import load_workflow, load_workflow_text
from rose_dsl.analysis import analyze
from rose_dsl.ir import ExecutionNode
from rose_dsl.semantics import Program
from rose_dsl.transforms import Refused, apply
from rose_dsl.transforms.legality import read_lags

ROOT = Path(__file__).resolve().parents[2]


def _text(budget: int, middle: list[str], sleeps: dict[str, list[float]], run: str, count: int = 4,
          wait: bool = False) -> str:
    """generate -> the `middle` calls (scorer or learner reads) -> update -> publish -> sync."""
    state = f"{{weights: {{max_staleness: {budget}}}}}" if budget else "[weights]"
    extra = "".join(f"""
    - node: mid{n}
      call: {comp}
      in: {{rollouts: generate.rollouts}}
      out: [score]""" if comp == "scorer.score" else f"""
    - node: mid{n}
      call: learner.get
      state: {{weights: read}}
      out: [w]""" for n, comp in enumerate(middle))
    return f"""
rose: 1
name: versions
components:
  gen:
    impl: "tests.async_fakes:Generator"
    args: {{sleeps: {sleeps['gen']}, run: "{run}"}}
    state: {state}
  learner:
    impl: "tests.async_fakes:Learner"
    args: {{sleeps: {sleeps['learner']}, run: "{run}", wait_for_next: {str(wait).lower()}}}
    state: [weights]
  scorer:
    impl: "tests.async_fakes:Scorer"
    args: {{sleeps: {sleeps['scorer']}}}
iteration:
  count: {count}
  body:
    - node: generate
      call: gen.generate
      in: {{it: iteration.i}}
      state: {{weights: read}}
      out: [rollouts]{extra}
    - node: update
      call: learner.update
      in: {{rollouts: generate.rollouts, it: iteration.i}}
      state: {{weights: update}}
    - node: publish
      call: learner.get
      state: {{weights: read}}
      out: [w]
    - node: sync
      call: gen.load
      in: {{w: publish.w, it: iteration.i}}
      state: {{weights: refresh}}
"""


def _run(wf, iterations: int, checkpoint_every: int = 0, out: Path | None = None):
    sch = Schedule(wf)
    be = LocalBackend(wf, ("tests.",), sch.program.loops_of)
    try:
        runner = Runner(wf, be, RunConfig(iterations=iterations, checkpoint_every=checkpoint_every, out_dir=out,
                                          tensorboard=False), sch)
        results = runner.run()
        return results, be.workers["gen"].obj, be.workers["learner"].obj, \
            {c: be.control(c, "get_states") for c in be.components()}
    finally:
        be.shutdown()


_SLEEPS = st.lists(st.sampled_from([0.0, 0.0, 0.001, 0.003, 0.008]), min_size=1, max_size=4)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(budget=st.integers(0, 3), k=st.integers(1, 3), middle=st.lists(st.sampled_from(["scorer.score", "learner.get"]),
                                                                      max_size=2),
       sleeps=st.fixed_dictionaries({"gen": _SLEEPS, "learner": _SLEEPS, "scorer": _SLEEPS}),
       iterations=st.integers(2, 6), every=st.sampled_from([0, 0, 2, 3]))
def test_an_accepted_deferral_never_reads_older_than_the_budget_on_executions(budget, k, middle, sleeps, iterations,
                                                                              every, tmp_path_factory) -> None:
    wf = load_workflow_text(_text(budget, middle, sleeps, uuid.uuid4().hex, iterations), "versions.yaml")
    plan = apply(wf, f"defer sync {k}")
    if k > budget:
        assert isinstance(plan, Refused)
        assert f"allows max_staleness {budget}" in plan.reason and "'gen.weights'" in plan.reason
        return
    assert not isinstance(plan, Refused), plan
    proven = read_lags(plan.workflow)[("gen.weights", ("iteration", "generate"))]
    out = tmp_path_factory.mktemp("run") if every else None
    results, gen, learner, states = _run(plan.workflow, iterations, every, out)
    lags = [(it - 1) - stamp for it, stamp in gen.seen]
    assert [it for it, _ in gen.seen] == list(range(iterations))
    assert max(lags) <= budget and max(lags) <= proven
    # the lag the analysis proves is observed, unless a drain (checkpoint) came before it could build up
    if not every and iterations > k + 1:
        assert max(lags) == proven == k
    # each metrics line is its own iteration's rollout, in order
    assert [r.iteration for r in results] == list(range(iterations))
    assert [r.metrics["gen/rollout_it"] for r in results] == [float(i) for i in range(iterations)]
    # what the run leaves is the declared workflow's state: the last update synced
    assert states["gen"]["weights"].item() == states["learner"]["weights"].item() == iterations - 1


def test_the_pipelined_runner_overlaps_the_next_rollout_with_this_update() -> None:
    """Each update waits (bounded) until the next rollout has started: only iterations in flight together
    let it see that -- a synchronous plan runs each update before the next rollout."""
    sleeps = {"gen": [0.0], "learner": [0.0], "scorer": [0.0]}
    wf = load_workflow_text(_text(1, [], sleeps, uuid.uuid4().hex, 4, wait=True), "versions.yaml")
    plan = apply(wf, "defer sync 1")
    assert not isinstance(plan, Refused), plan
    assert Schedule(plan.workflow).depth == 2
    _, gen, learner, _ = _run(plan.workflow, 4)
    assert learner.overlapped == [True, True, True, False]  # the last has no next rollout
    assert [(it - 1) - stamp for it, stamp in gen.seen] == [0, 1, 1, 1]


def test_the_analysis_reports_each_reads_lag_and_validate_accepts_the_plan() -> None:
    sleeps = {"gen": [0.0], "learner": [0.0], "scorer": [0.0]}
    wf = load_workflow_text(_text(2, ["learner.get"], sleeps, "x"), "versions.yaml")
    assert any("lag 0, max_staleness 2" in line for line in analyze(wf).versions)
    plan = apply(wf, "defer sync 2")
    assert not isinstance(plan, Refused), plan
    lines = analyze(plan.workflow).versions
    assert "gen.weights: 'generate' reads a value at most 2 RL iterations older than the synchronous workflow's " \
           "(lag 2, max_staleness 2)" in lines
    # the learner's own reads keep lag 0: only the budgeted state may lag
    assert read_lags(plan.workflow)[("learner.weights", ("iteration", "mid0"))] == 0
    from rose_dsl.transforms import plan_differences

    assert plan_differences(wf, plan.workflow) == []


def test_a_deferral_that_only_a_budget_on_another_state_would_allow_is_refused() -> None:
    """Deferring the update makes the learner's own reads older: `learner.weights` has no budget."""
    sleeps = {"gen": [0.0], "learner": [0.0], "scorer": [0.0]}
    wf = load_workflow_text(_text(3, [], sleeps, "x"), "versions.yaml")
    refused = apply(wf, "defer update 1")
    assert isinstance(refused, Refused)
    assert "'learner.weights' allows max_staleness 0" in refused.reason


def _state_writers(wf) -> list[str]:
    return [i.name for i in wf.root.body if isinstance(i, ExecutionNode) and any(e.access.writes for e in i.effects)]


@pytest.mark.parametrize("path", sorted((ROOT / "workflows").glob("*.yaml")), ids=lambda p: p.name)
def test_budget_zero_every_shipped_workflow_has_no_asynchronous_plan(path: Path) -> None:
    """No state object of a shipped workflow declares a budget, so every deferral is refused and every plan
    rose runs computes what the declared workflow computes (the runtime path is the synchronous one)."""
    wf = load_workflow(path)
    assert all(s.max_staleness == 0 for s in wf.state_objects().values())
    assert Program(wf).depth == 1
    for name, k in itertools.product(_state_writers(wf), (1, 2)):
        assert isinstance(apply(wf, f"defer {name} {k}"), Refused), (path.name, name, k)
