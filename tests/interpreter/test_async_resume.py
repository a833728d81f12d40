"""Issue 58: a stop of an asynchronous plan between checkpoint iterations, then `--resume`, ends as the
uninterrupted run -- the same metrics lines and the same final state, bit for bit. The stop used to drain
the deferred calls (and run the iteration whose calls ran ahead), a synchronisation point the uninterrupted
run does not have; now its checkpoint keeps what is in flight (`interpreter/in_flight.py`).

Here the stop comes through `Runner.run`'s `stop` (what `rose execute`'s signal handler answers, asked before
each iteration is submitted: a stop at a chosen iteration, deterministically), on the local backend, and
once through `rose execute` with a real SIGINT. The long pass (`tests/cli/test_async_signals.py`, with
`--hypothesis-profile=long`) sends real SIGINTs at random iterations, on the local backend and on Ray."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from interpreter.backends import LocalBackend
from interpreter.checkpoint import list_complete, load_checkpoint
from interpreter.runner import RunConfig, Runner
from interpreter.schedule import Schedule
from rose_dsl import load_workflow_text
from rose_dsl.transforms import Refused, apply
from tests.async_fakes import Generator

WF = """
rose: 1
name: async-resume
components:
  gen: {impl: "GEN", state: {weights: {max_staleness: BUDGET}}}
  learner: {impl: "tests.async_fakes:Learner", args: {report: true}, state: {weights: {max_staleness: BUDGET}}}
iteration:
  count: 8
  body:
    - {node: rollout, call: gen.generate, in: {it: iteration.i}, state: {weights: read}, out: [rollouts]}
    - {node: learn, call: learner.update, in: {rollouts: rollout.rollouts, it: iteration.i}, state: {weights: update}}
    - {node: publish, call: learner.get, state: {weights: read}, out: [w]}
    - {node: sync, call: gen.load, in: {w: publish.w, it: iteration.i}, state: {weights: refresh}}
"""
N = 8
TIMING = ("iteration_s", "env_steps_per_s", "tokens_per_s")


class NumpyGenerator(Generator):
    """Rollouts as a numpy array: a value in flight that a checkpoint (weights_only) cannot hold."""

    def generate(self, it: Any) -> dict[str, Any]:
        return {"rollouts": super().generate(it)["rollouts"].numpy()}


def _plan(requests: str, budget: int = 1, gen: str = "tests.async_fakes:Generator"):
    wf = load_workflow_text(WF.replace("BUDGET", str(budget)).replace("GEN", gen), "async-resume.yaml")
    for request in requests.split(","):
        plan = apply(wf, request)
        assert not isinstance(plan, Refused), plan
        wf = plan.workflow
    return wf


def _run(plan, out: Path | None, stop_before: int | None = None, every: int = 0, resume: bool = False,
         n: int = N) -> Runner:
    sch = Schedule(plan)
    be = LocalBackend(plan, ("tests.",), sch.program.loops_of)
    polls = iter(range(10 * N))  # asked once before each iteration is submitted, in order
    try:
        runner = Runner(plan, be, RunConfig(iterations=n, checkpoint_every=every, out_dir=out, resume=resume,
                                            tensorboard=False), sch)
        runner.run(stop=None if stop_before is None else (lambda: next(polls) >= stop_before))
        return runner
    finally:
        be.shutdown()


def comparable_lines(run: Path) -> list[dict[str, Any]]:
    """metrics.jsonl without what measures time (which no two runs share)."""
    return [{k: v for k, v in json.loads(line).items() if k not in TIMING and not k.startswith(("time/", "sm_activity"))}
            for line in (run / "metrics.jsonl").read_text().splitlines()]


def final_states(run: Path) -> dict[str, Any]:
    return load_checkpoint(list_complete(run / "checkpoints")[-1]).states


def assert_same_states(a: Any, b: Any, where: str = "") -> None:
    """Bit for bit: tensors equal in dtype, shape and every element; everything else equal."""
    assert type(a) is type(b), where
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            assert_same_states(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), where
    else:
        assert a == b, where


@pytest.mark.parametrize(("requests", "budget", "stop_before", "every"), [
    ("defer learn 1", 1, 3, 0),
    ("defer sync 1", 1, 5, 3),
    ("ahead rollout", 1, 4, 0),
    ("defer learn 2", 2, 4, 0),
    ("defer learn 1,defer sync 1", 2, 3, 4),
    ("ahead rollout,defer learn 1", 2, 6, 0),
])
def test_a_stop_between_checkpoints_resumes_to_the_uninterrupted_runs_lines_and_state(
        tmp_path, requests: str, budget: int, stop_before: int, every: int) -> None:
    plan = _plan(requests, budget)
    _run(plan, tmp_path / "whole", every=every)
    stopped = _run(plan, tmp_path / "parts", stop_before, every)
    ckpt = load_checkpoint(list_complete(tmp_path / "parts" / "checkpoints")[-1])
    assert ckpt.iteration == stop_before - 1 and ckpt.in_flight is not None and stopped.stop_drained is None
    assert "drained_at_stop" not in ckpt.meta
    resumed = _run(plan, tmp_path / "parts", every=every, resume=True)
    assert resumed.resumed is not None and resumed.resumed.drained_at_stop is None
    assert comparable_lines(tmp_path / "parts") == comparable_lines(tmp_path / "whole")
    assert_same_states(final_states(tmp_path / "parts"), final_states(tmp_path / "whole"))
    # (not vacuous: the staleness the plan allows shows in the lines the comparison covers)
    assert any(line.get("gen/lag", 0) > 0 for line in comparable_lines(tmp_path / "whole"))


def test_a_stop_at_a_checkpoint_iteration_keeps_nothing_in_flight(tmp_path) -> None:
    """Iteration 2 is a checkpoint iteration of `--checkpoint-every 3` (a barrier: drained, nothing ahead):
    a stop right after it has nothing in flight to keep, and the resume is exact as always."""
    plan = _plan("defer learn 1")
    _run(plan, tmp_path / "whole", every=3)
    _run(plan, tmp_path / "parts", 3, 3)
    assert load_checkpoint(list_complete(tmp_path / "parts" / "checkpoints")[-1]).in_flight is None
    _run(plan, tmp_path / "parts", every=3, resume=True)
    assert comparable_lines(tmp_path / "parts") == comparable_lines(tmp_path / "whole")
    assert_same_states(final_states(tmp_path / "parts"), final_states(tmp_path / "whole"))


def test_a_value_in_flight_a_checkpoint_cannot_hold_drains_the_stop_and_says_so(tmp_path) -> None:
    """The rollouts are numpy arrays, which `torch.load(weights_only=True)` would not load: the stop drains as
    it used to, its checkpoint records why, and a resume from it says it is not exact (and why)."""
    import io

    from rich.console import Console

    from rose_cli.report import resumed

    plan = _plan("defer learn 1", gen="tests.interpreter.test_async_resume:NumpyGenerator")
    stopped = _run(plan, tmp_path / "run", 3)
    ckpt = load_checkpoint(list_complete(tmp_path / "run" / "checkpoints")[-1])
    assert ckpt.in_flight is None and ckpt.iteration == 2
    assert "output 'rollouts' of iteration.rollout[2] is a numpy.ndarray" in ckpt.meta["drained_at_stop"]
    assert stopped.stop_drained == ckpt.meta["drained_at_stop"]
    again = _run(plan, tmp_path / "run", resume=True)
    assert again.resumed is not None
    buf = io.StringIO()
    resumed(Console(file=buf, width=400), again.resumed, N)
    assert "note: not exact -- the stop that took this checkpoint of an asynchronous plan could not keep what was " \
           "in flight (output 'rollouts' of iteration.rollout[2] is a numpy.ndarray" in buf.getvalue()
    assert [line["iteration"] for line in comparable_lines(tmp_path / "run")] == list(range(N))


def test_rose_execute_stopped_by_sigint_resumes_with_the_deferred_call_in_flight(tmp_path) -> None:
    """Through `rose execute` (in this process): a real SIGINT during iteration 3's first call stops the run
    after the iterations in flight; `--resume` names the deferred call still to come and ends as the
    uninterrupted run."""
    from rich.console import Console

    from rose_cli.run import ExecuteOptions, execute_workflow
    from rose_dsl.serialize import to_yaml

    def execute(at: int, run: Path, **opts: Any) -> tuple[int, str]:
        text = WF.replace("BUDGET", "1").replace("GEN", "tests.async_fakes:Generator").replace("""  body:
""", """  body:
    - {node: kick, call: d.work, in: {x: iteration.i}, out: [y], state: {acc: update}}
""").replace("components:", f"""components:
  d: {{impl: "tests.cli.rundir_components:SignalAt", args: {{at: {at}, pidfile: "{tmp_path / 'pid'}"}}, state: [acc]}}""")
        plan = apply(load_workflow_text(text, "kick.yaml"), "defer learn 1")
        assert not isinstance(plan, Refused), plan
        wf = load_workflow_text(to_yaml(plan.workflow), "plan.yaml")
        buf = io.StringIO()
        console = Console(file=buf, width=400, highlight=False)
        code = execute_workflow(wf, ExecuteOptions(out_dir=run, allowed=("tests.",), quiet=True, loggers=(), **opts),
                                console, console)
        return int(code), buf.getvalue()

    import io
    import os

    (tmp_path / "pid").write_text(str(os.getpid()))
    assert execute(0, tmp_path / "whole")[0] == 0
    code, text = execute(4, tmp_path / "parts")
    assert code == 130, text
    (tmp_path / "pid").unlink()
    code, text = execute(4, tmp_path / "parts", resume=True)
    assert code == 0, text
    assert "with the deferred call still in flight there (iteration.learn[" in text and "not exact" not in text, text
    assert comparable_lines(tmp_path / "parts") == comparable_lines(tmp_path / "whole")
    assert_same_states(final_states(tmp_path / "parts"), final_states(tmp_path / "whole"))


def test_a_resume_with_no_iteration_left_runs_what_the_stop_kept_in_flight(tmp_path) -> None:
    """A stop after iteration 3 of 8 kept learn[3] in flight; `--resume -n 4` has no iteration left to run:
    it still runs learn[3] and writes line 3, ending as an uninterrupted 4-iteration run ends."""
    plan = _plan("defer learn 1")
    _run(plan, tmp_path / "parts", 4)
    _run(plan, tmp_path / "whole", n=4)
    _run(plan, tmp_path / "parts", resume=True, n=4)
    assert comparable_lines(tmp_path / "parts") == comparable_lines(tmp_path / "whole")
    assert_same_states(final_states(tmp_path / "parts"), final_states(tmp_path / "whole"))
