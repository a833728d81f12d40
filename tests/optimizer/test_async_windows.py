"""An asynchronous plan's turn in a block of complete trials is a window of pipelined iterations
(`rose_dsl.measurement.window`): the search's budget estimate counts every iteration of it, and what the
turn cost beyond them is learned as a switch or set-up -- not the window's unmeasured iterations, which
made every later turn look several iterations dearer. On a fake measurer (simulated time)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from rose_dsl import load_workflow_text
from rose_dsl.ir import Workflow
from rose_dsl.measurement import IterationRun, Window, window
from rose_dsl.optimizer.search import Settings, _Search
from rose_dsl.transforms import Refused, apply

from .fakes import FakeMeasurer, GroundTruth

WF = """
rose: 1
name: versions
components:
  gen: {impl: "tests.async_fakes:Generator", state: {weights: {max_staleness: 1}}}
  learner: {impl: "tests.async_fakes:Learner", state: [weights]}
iteration:
  count: 1000
  body:
    - {node: generate, call: gen.generate, in: {it: iteration.i}, state: {weights: read}, out: [rollouts]}
    - {node: update, call: learner.update, in: {rollouts: generate.rollouts, it: iteration.i}, state: {weights: update}}
    - {node: publish, call: learner.get, state: {weights: read}, out: [w]}
    - {node: sync, call: gen.load, in: {w: publish.w, it: iteration.i}, state: {weights: refresh}}
"""
TRUTH = GroundTruth(fixed={"gen": 0.02, "learner": 0.03}, per_row={}, activity={})


class Windowed(FakeMeasurer):
    """Runs a plan's whole window per turn (as `TrialSession` does) and returns its measured iteration."""

    def complete(self, plans: Sequence[Workflow], rounds: int, warmup: int = 0, labels: Sequence[str] = (),
                 guard_first: bool = False) -> list[list[IterationRun]]:
        out: list[list[IterationRun]] = [[] for _ in plans]
        for _ in range(warmup):
            self._step(plans[0])
        for _ in range(rounds):
            for i, plan in enumerate(plans):
                win = window(plan)
                runs = [self._step(plan) for _ in range(win.iterations)]
                out[i].append(runs[win.fill])
        return out


@pytest.fixture(scope="module")
def plans() -> tuple[Workflow, Workflow]:
    wf = load_workflow_text(WF, "versions.yaml")
    plan = apply(wf, "defer sync 1")
    assert not isinstance(plan, Refused), plan
    return wf, plan.workflow


def test_the_window_of_an_asynchronous_plan(plans) -> None:
    wf, plan = plans
    assert window(wf) == Window(0, 1, 0) and window(wf).iterations == 1
    assert window(plan) == Window(1, 3, 1) and window(plan).iterations == 5


def test_a_turn_is_estimated_and_learned_over_its_whole_window(plans) -> None:
    wf, plan = plans
    m = Windowed(TRUTH, noise=0.0)
    search = _Search(wf, m, Settings(), log=lambda msg: None)
    search.complete([wf], 2)  # the reference: seen, an iteration's time known
    search.iteration_s = it = m.clock / 2
    assert search._turn_s(wf) == pytest.approx(it)
    new_turn = search._turn_s(plan)  # a new plan after a switch: its window and a set-up (no untimed iteration)
    assert new_turn == pytest.approx(5 * it + it)
    search.complete([plan], 1)
    # its window was all its turn cost (the fake has no switch or set-up): nothing more is learned
    assert search.setup_s is not None and search.setup_s <= it / 2, (search.setup_s, it)


def test_the_cost_model_predicts_a_deferral_in_steady_state(plans) -> None:
    """A deferral changes how many RL iterations run in flight: the model predicts it in steady state, the
    next generate beside this update (`CostModel.period`), so its gain ranks it among the candidates (it was
    left unpredicted and measured after every predicted candidate; on the H100 it was then cut for the
    budget). Ground truth: generate 0.02 s, update/publish 0.03 s each, sync 0.02 s; declared 0.10 s an
    iteration, deferred sync: the learner's 0.06 s bound it."""
    wf, plan = plans
    m = Windowed(TRUTH, noise=0.0)
    search = _Search(wf, m, Settings(), log=lambda msg: None)
    search.complete([wf, plan], 2)  # what the model learns durations from
    assert search.predict(plan, wf, 1.0) == pytest.approx(0.6, rel=0.02)
    assert search.predict(wf, plan, 0.6) == pytest.approx(1.0, rel=0.02)
    assert search.predict(plan, plan, 1.0) == pytest.approx(1.0)


def test_a_window_needs_no_untimed_iteration_of_its_own(plans) -> None:
    """A synchronous plan's first iteration, and its first after a switch, are training, not a measurement
    (they run slow); an asynchronous plan's window already starts with untimed fill iterations, so neither its
    first turn (guarded as a whole) nor a switch back to it adds one (`TrialSession.complete`). Counted in training iterations on the local backend."""
    from interpreter.optimize.executor import Executor
    from interpreter.optimize.trials import TrialSession
    from rose_cli.run import ExecuteOptions, Gpu, build_backend

    wf, plan = plans
    opts = ExecuteOptions(backend="local", out_dir=None, allowed=("tests.",))
    executor = Executor(wf, lambda w, s: build_backend(w, s, opts, Gpu(), _Quiet()), log=lambda m: None)
    session = TrialSession(wf, executor, log=lambda m: None)
    try:
        session.complete([wf, plan], 3)
        win = window(plan).iterations
        # round 1: wf's first (untimed) + 1, the plan's window (guarded, its fill untimed: no first iteration of
        # its own); round 2 (reversed): the plan's window (no switch), wf's switch (untimed) + 1; round 3: wf
        # again (no switch) + 1, the plan's window alone
        assert session.k == (2 + win) + (win + 2) + (1 + win)
    finally:
        session.close()
        executor.close()


class _Quiet:
    def print(self, *args, **kwargs) -> None:
        pass
