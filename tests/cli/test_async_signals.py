"""The long stop-and-resume pass of asynchronous plans (issue 58), with `--hypothesis-profile=long`: a real
SIGINT at a random iteration of a `rose execute` of a random asynchronous plan (`defer`, `ahead`, both), on
the local backend and on Ray; then `--resume`. Every trial must end with
the metrics lines and final state of the uninterrupted run of the same plan and `--checkpoint-every`, bit
for bit (`tests/interpreter/test_async_resume.py` compares them the same way; CI runs that file's fixed
cases). `ROSE_ASYNC_SIGNAL_TRIALS` (default 20) trials per backend; the outcomes are printed. The runs are
in this process (Ray: one cluster, `ray_session`), signalled from a component's process at its call `at`;
`ROSE_ASYNC_SIGNAL_PROCESS=1` runs each in a `rose` process of its own (under load a Ray cluster per process
timed out starting)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import settings

from rose_dsl import load_workflow_text
from rose_dsl.serialize import to_yaml
from rose_dsl.transforms import Refused, apply
from tests.interpreter.test_async_resume import assert_same_states, comparable_lines, final_states

from .clirun import ROOT

N = 8
SOURCE = """
rose: 1
name: async-signals
components:
  d: {impl: "tests.cli.rundir_components:SignalAt", args: {at: AT, pidfile: "PIDFILE"}, state: [acc]}
  gen: {impl: "tests.async_fakes:Generator", state: {weights: {max_staleness: 2}}}
  learner: {impl: "tests.async_fakes:Learner", args: {report: true}, state: {weights: {max_staleness: 2}}}
iteration:
  count: 8
  body:
    - {node: kick, call: d.work, in: {x: iteration.i}, out: [y], state: {acc: update}}
    - {node: rollout, call: gen.generate, in: {it: iteration.i}, state: {weights: read}, out: [rollouts]}
    - {node: learn, call: learner.update, in: {rollouts: rollout.rollouts, it: iteration.i}, state: {weights: update}}
    - {node: publish, call: learner.get, state: {weights: read}, out: [w]}
    - {node: sync, call: gen.load, in: {w: publish.w, it: iteration.i}, state: {weights: refresh}}
"""
PLANS = ["defer learn 1", "defer sync 1", "ahead rollout", "defer learn 2", "ahead rollout,defer learn 1",
         "defer learn 1,defer sync 1"]


def _plan_file(path: Path, requests: str, at: int, pidfile: Path) -> Path:
    wf = load_workflow_text(SOURCE.replace("AT", str(at)).replace("PIDFILE", str(pidfile)), "async-signals.yaml")
    for request in requests.split(","):
        plan = apply(wf, request)
        assert not isinstance(plan, Refused), plan
        wf = plan.workflow
    path.write_text(to_yaml(wf))
    return path


def _rose(plan: Path, run: Path, backend: str, every: int, *more: str, pidfile: Path | None = None) -> tuple[int, str]:
    """`rose execute` of `plan` in this process (on Ray: the cluster `ray_session` started), where the SIGINT
    arrives as at a terminal; with `ROSE_ASYNC_SIGNAL_PROCESS=1`, in a `rose` process of its own (each
    starting its own Ray cluster: minutes on a loaded machine)."""
    if not os.environ.get("ROSE_ASYNC_SIGNAL_PROCESS"):
        return _in_process(plan, run, backend, every, "--resume" in more, pidfile)
    cmd = [sys.executable, "-m", "rose_cli", "execute", str(plan), "--allow-module", "tests", "--backend", backend,
           "-q", "--out", str(run), "--checkpoint-every", str(every), "--no-compiled", *more]
    proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    if pidfile is not None:  # rose's pid, for the component that signals it (read at its call `at`)
        pidfile.write_text(str(proc.pid))
    text, _ = proc.communicate(timeout=600)
    return proc.returncode, text


def _in_process(plan: Path, run: Path, backend: str, every: int, resume: bool, pidfile: Path | None) -> tuple[int, str]:
    import io

    from rich.console import Console

    from rose_cli.run import ExecuteOptions, execute_workflow
    from rose_dsl import load_workflow

    if pidfile is not None:
        pidfile.write_text(str(os.getpid()))
    buf = io.StringIO()
    console = Console(file=buf, width=400, highlight=False)
    opts = ExecuteOptions(out_dir=run, allowed=("tests.",), quiet=True, loggers=(), checkpoint_every=every,
                          resume=resume, backend=backend, compiled=False)
    return int(execute_workflow(load_workflow(plan), opts, console, console)), buf.getvalue()


@pytest.mark.slow
@pytest.mark.timeout(3600)  # (20 trials on Ray: about 20 minutes on the loaded 2-core machine)
@pytest.mark.parametrize("backend", ["local", "ray"])
def test_sigint_at_random_iterations_of_asynchronous_plans_resumes_exactly(tmp_path, request, backend: str) -> None:
    if settings.default.max_examples < 1000:
        pytest.skip("the long asynchronous stop pass runs with --hypothesis-profile=long")
    if backend == "ray" and not os.environ.get("ROSE_ASYNC_SIGNAL_PROCESS"):
        request.getfixturevalue("ray_session")
    rng = random.Random(int(os.environ.get("ROSE_SIGNAL_SEED", "58")))
    whole: dict[tuple[str, int], Path] = {}
    outcomes: dict[str, int] = {}
    for trial in range(int(os.environ.get("ROSE_ASYNC_SIGNAL_TRIALS", "20"))):
        requests, every, at = rng.choice(PLANS), rng.choice([0, 0, 3]), rng.randint(1, N - 1)
        if (requests, every) not in whole:  # the uninterrupted run of this plan
            ref = tmp_path / f"whole-{len(whole)}"
            code, text = _rose(_plan_file(tmp_path / "whole.yaml", requests, 0, tmp_path / "none"), ref, backend, every)
            assert code == 0, text
            whole[(requests, every)] = ref
        run, pidfile = tmp_path / f"run{trial}", tmp_path / f"pid{trial}"
        plan = _plan_file(tmp_path / f"plan{trial}.yaml", requests, at, pidfile)
        code, text = _rose(plan, run, backend, every, pidfile=pidfile)
        assert code == 130, f"{requests} every {every} at {at}: {text}"
        assert "Traceback" not in text and "internal error" not in text, text
        pidfile.unlink()
        kept = sorted((run / "checkpoints").glob("ckpt-*"))
        code, again = _rose(plan, run, backend, every, "--resume")
        assert code == 0, f"{requests} every {every} at {at}: {again}"
        assert "not exact" not in again, again
        lines, expected = comparable_lines(run), comparable_lines(whole[(requests, every)])
        exact = lines == expected
        try:
            assert_same_states(final_states(run), final_states(whole[(requests, every)]))
        except AssertionError:
            exact = False
        key = ("exact" if exact else "DIFFERS") + (", calls in flight kept" if "still in flight" in again else
                                                  ", nothing in flight (a checkpoint iteration)")
        outcomes[key] = outcomes.get(key, 0) + 1
        print(json.dumps({"trial": trial, "backend": backend, "plan": requests, "every": every, "at": at,
                          "stopped_after": int(kept[-1].name.removeprefix("ckpt-")) if kept else None,
                          "exact": exact}))
        assert exact, (requests, every, at, lines, expected)
    print(json.dumps({"backend": backend, **outcomes}, sort_keys=True))
