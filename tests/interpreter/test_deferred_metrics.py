"""Issue 58: a deferred node's metrics land on its own iteration's line. Under `defer learn 1`, learn(k)
runs in iteration k+1's place; its metrics went to line k+1 (learn(k-1)'s to line k), and at every drain
(a checkpoint) two learns' metrics met in one pop and one was lost (10 of 30 at `--checkpoint-every 3`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from interpreter.backends import LocalBackend
from interpreter.runner import RunConfig, Runner
from interpreter.schedule import Schedule
from rose_dsl import load_workflow_text
from rose_dsl.transforms import Refused, apply

INPLACE = """
rose: 1
name: deferred-metrics
components:
  gen: {impl: "tests.async_fakes:Generator", state: {weights: {max_staleness: 1}}}
  learner: {impl: "tests.async_fakes:Learner", args: {report: true}, state: {weights: {max_staleness: 1}}}
iteration:
  count: 7
  body:
    - {node: rollout, call: gen.generate, in: {it: iteration.i}, state: {weights: read}, out: [rollouts]}
    - {node: learn, call: learner.update, in: {rollouts: rollout.rollouts, it: iteration.i}, state: {weights: update}}
    - {node: publish, call: learner.get, state: {weights: read}, out: [w]}
    - {node: sync, call: gen.load, in: {w: publish.w, it: iteration.i}, state: {weights: refresh}}
"""


@pytest.mark.parametrize(("request_", "every"), [("defer learn 1", 0), ("defer learn 1", 3), ("ahead rollout", 3),
                                                 ("defer sync 1", 2)])
def test_each_metrics_line_holds_its_own_iterations_calls(tmp_path: Path, request_: str, every: int) -> None:
    wf = load_workflow_text(INPLACE, "m.yaml")
    plan = apply(wf, request_)
    assert not isinstance(plan, Refused), plan
    sch = Schedule(plan.workflow)
    be = LocalBackend(plan.workflow, ("tests.",), sch.program.loops_of)
    try:
        results = Runner(plan.workflow, be, RunConfig(iterations=7, checkpoint_every=every, out_dir=tmp_path / "run",
                                                      tensorboard=False), sch).run()
    finally:
        be.shutdown()
    assert [r.iteration for r in results] == list(range(7))
    assert [r.metrics.get("learner/update_it") for r in results] == [float(k) for k in range(7)]
    assert [r.metrics.get("gen/rollout_it") for r in results] == [float(k) for k in range(7)]


def test_a_resume_says_what_was_in_flight_and_is_not_exact_only_where_a_stop_drained(tmp_path: Path) -> None:
    """A stop between checkpoints keeps what it has in flight: `--resume` names the deferred calls still to
    come. Where a stop could not keep them it drained, a synchronisation point the uninterrupted run does not
    have: `--resume` from it says so and why; from any other checkpoint it says nothing of the kind."""
    import io

    from rich.console import Console

    from interpreter.runner import Resumed
    from rose_cli.report import resumed

    def said(iteration: int, **kw) -> str:
        buf = io.StringIO()
        resumed(Console(file=buf, width=400), Resumed(tmp_path / "ckpt", iteration, **kw), 10)
        return buf.getvalue()

    assert "continuing at iteration 5 of 10, with the deferred call still in flight there (iteration.learn[4]) run " \
           "in its own place" in said(4, in_flight=("iteration.learn[4]",))
    assert "note: not exact -- the stop that took this checkpoint of an asynchronous plan could not keep what was " \
           "in flight (the RL iteration carries values), so it ran its deferred calls there: from iteration 5 on" \
           in said(4, drained_at_stop="the RL iteration carries values")
    assert "not exact" not in said(4) and "in flight" not in said(4)
    assert "not exact" not in said(9, drained_at_stop="x")  # the end: nothing left to run
