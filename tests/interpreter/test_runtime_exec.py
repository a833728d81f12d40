"""The runtime executes what the semantics define: the local and Ray backends give the reference
interpreter's final state; independent components overlap in time; a rewritten plan runs to the same
result as its source on Ray; faults stop the run with the node path and iteration."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from interpreter.backends import CallFailed, LocalBackend, RayBackend, WatchdogTimeout
from interpreter.components import instantiate
from interpreter.reference import run_reference
from interpreter.runner import RunConfig, Runner
from interpreter.schedule import Schedule
from rose_dsl import load_workflow, load_workflow_text
from rose_dsl.transforms import apply_request, compose
from tests.transforms.harness import mockify

ROOT = Path(__file__).resolve().parents[2]
ALLOWED = ("tests.",)


def _ppo():
    wf = load_workflow(ROOT / "workflows" / "embodied_ppo.yaml", {"num_envs": 6, "steps": 3, "epochs": 2, "denoise_steps": 2})
    return mockify(wf, batch=6)


def _reference_states(wf, iterations=3):
    comps = instantiate(wf, ALLOWED)
    run_reference(wf, comps, range(iterations))
    return {n: {s.name: comps[n].get_state(s.name) for s in c.state} for n, c in wf.components.items()}


def _run(wf, backend_cls, iterations=3, compiled=False, **kw):
    sch = Schedule(wf)
    be = backend_cls(wf, ALLOWED, sch.program.loops_of, **kw)
    if compiled:
        be.compile(sch)
    try:
        runner = Runner(wf, be, RunConfig(iterations=iterations, tensorboard=False), sch)
        runner.run()
        states = {n: be.control(n, "get_states") for n in be.components()}
        return states, runner
    finally:
        be.shutdown()


def _assert_same(a, b):
    assert a.keys() == b.keys()
    for comp in a:
        for name in a[comp]:
            assert torch.equal(a[comp][name], b[comp][name]), (comp, name)


def test_local_backend_matches_reference() -> None:
    wf = _ppo()
    states, _ = _run(wf, LocalBackend)
    _assert_same(_reference_states(wf), states)


@pytest.mark.e2e
def test_ray_backend_matches_reference_and_plan_matches_source(ray_session) -> None:
    wf = _ppo()
    ref = _reference_states(wf)
    states, _ = _run(wf, RayBackend)
    _assert_same(ref, states)
    plan = apply_request(wf, "split step 2")
    plan = compose(plan, apply_request(plan.workflow, "interleave step"))
    plan = compose(plan, apply_request(plan.workflow, "fuse epoch update"))
    plan_states, _ = _run(plan.workflow, RayBackend)
    _assert_same(ref, plan_states)
    compiled_states, _ = _run(plan.workflow, RayBackend, compiled=True)
    _assert_same(ref, compiled_states)


SLEEPERS = """
rose: 1
name: two-sleepers
components:
  a: {impl: "tests.mocks:Sleeper", args: {seconds: 0.3}}
  b: {impl: "tests.mocks:Sleeper", args: {seconds: 0.3}}
iteration:
  count: 2
  body:
    - {node: wa, call: a.work, in: {x: iteration.i}, out: [y]}
    - {node: wb, call: b.work, in: {x: iteration.i}, out: [y]}
"""


@pytest.mark.parametrize("backend", ["local", "ray", "ray-compiled"])
def test_independent_components_overlap_in_the_trace(backend, request) -> None:
    if backend != "local":
        request.getfixturevalue("ray_session")
    wf = load_workflow_text(SLEEPERS, "sleepers.yaml")
    cls = {"local": LocalBackend, "ray": RayBackend, "ray-compiled": RayBackend}[backend]
    _, runner = _run(wf, cls, iterations=2, compiled=backend == "ray-compiled")
    recs = runner.trace.records()
    for k in range(2):
        a = next(r for r in recs if r.node == "iteration.wa" and r.loop_indices[0][1] == k)
        b = next(r for r in recs if r.node == "iteration.wb" and r.loop_indices[0][1] == k)
        overlap = min(a.host_end_ns, b.host_end_ns) - max(a.host_start_ns, b.host_start_ns)
        shorter = min(a.duration_ns, b.duration_ns)
        assert overlap > 0.5 * shorter, f"iteration {k}: overlap {overlap / 1e9:.3f} s of {shorter / 1e9:.3f} s"
    assert {r.pid for r in recs if r.node == "iteration.wa"} != {r.pid for r in recs if r.node == "iteration.wb"} \
        or backend == "local"


def test_a_failing_call_is_reported_with_its_node_and_iteration() -> None:
    wf = load_workflow_text(SLEEPERS.replace("args: {seconds: 0.3}}\n  b:", "args: {seconds: 0.0, fail_at: 1}}\n  b:"), "f.yaml")
    with pytest.raises(CallFailed) as info:
        _run(wf, LocalBackend, iterations=2)
    assert "iteration.wa[1]" in str(info.value) and "planted failure at call 1" in str(info.value)


def _cli(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "rose_cli", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=300)


@pytest.mark.parametrize(("change", "expected", "code"), [
    ("args: {seconds: 0.0, fail_at: 0}", "iteration.wa[0] (a): RuntimeError: planted failure at call 0", 3),
    ("args: {seconds: 0.0, bad_output: true}", "error: iteration.wa[0] (a): a.work did not return y, z (returned wrong)", 3),
    ("args: {seconds: 0.0, nope: 1}", "constructing component 'a' (tests.mocks:Sleeper) failed", 3),
])
def test_cli_faults(tmp_path, change, expected, code) -> None:
    text = SLEEPERS.replace("args: {seconds: 0.3}}\n  b:", change + "}\n  b:")
    text = text.replace("call: a.work, in: {x: iteration.i}, out: [y]", "call: a.work, in: {x: iteration.i}, out: [y, z]")
    wf = tmp_path / "wf.yaml"
    wf.write_text(text)
    proc = _cli("execute", str(wf), "--allow-module", "tests", "-n", "2", "--out", str(tmp_path / "run"))
    assert proc.returncode == code, proc.stderr
    assert expected in proc.stderr
    assert proc.stderr.count("iteration.wa[0]") <= 1  # the failing invocation is named once
    assert (tmp_path / "run" / "metrics.jsonl").exists() or code == 3


def test_cli_gpu_component_without_gpu(tmp_path) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    wf = tmp_path / "wf.yaml"
    wf.write_text(SLEEPERS.replace('a: {impl: "tests.mocks:Sleeper"', 'a: {device: gpu, impl: "tests.mocks:Sleeper"'))
    proc = _cli("execute", str(wf), "--allow-module", "tests", "-n", "1")
    assert proc.returncode == 2 and "need a GPU (device: gpu)" in proc.stderr


def test_checkpoint_and_resume_continue_the_same_run(tmp_path) -> None:
    wf = _ppo()
    straight, _ = _run(wf, LocalBackend, iterations=4)
    sch = Schedule(wf)
    be = LocalBackend(wf, ALLOWED, sch.program.loops_of)
    Runner(wf, be, RunConfig(iterations=2, out_dir=tmp_path, checkpoint_every=1, tensorboard=False), sch).run()
    be.shutdown()
    sch = Schedule(wf)
    be = LocalBackend(wf, ALLOWED, sch.program.loops_of)
    runner = Runner(wf, be, RunConfig(iterations=4, out_dir=tmp_path, checkpoint_every=1, resume=True, tensorboard=False), sch)
    results = runner.run()
    resumed = {n: be.control(n, "get_states") for n in be.components()}
    be.shutdown()
    assert [r.iteration for r in results] == [2, 3]
    _assert_same(straight, resumed)


@pytest.mark.e2e
@pytest.mark.parametrize(("compiled", "keep"), [(False, False), (True, False), (True, True)])
def test_replacing_an_actor_keeps_its_state_and_applies_the_new_environment(ray_session, compiled, keep) -> None:
    """A quota change moves the component to a new process; training continues from the same state
    (a compiled graph is compiled again around the new process). With `keep` the old process is parked, and
    a move back to its settings hands the state back to it instead of starting a third process."""
    wf = _ppo()
    straight, _ = _run(wf, LocalBackend, iterations=4)
    sch = Schedule(wf)
    be = RayBackend(wf, ALLOWED, sch.program.loops_of)
    if compiled:
        be.compile(sch)
    try:
        runner = Runner(wf, be, RunConfig(iterations=4, tensorboard=False), sch)
        runner.run_iteration(0)
        runner.run_iteration(1)
        old_pid = be.control("sim", "info")["pid"]
        info = be.replace_actor("sim", 40, {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "40", "CUDA_MPS_CLIENT_PRIORITY": "1"},
                                priority=1, keep=keep)
        assert info["pid"] != old_pid and info["mps_quota"] == "40" and info["mps_priority"] == "1"
        assert (be.wf.components["sim"].mps_quota, be.wf.components["sim"].mps_priority) == (40, 1)
        assert be.capabilities.compiled == compiled
        assert (set(be.parked) == {"sim"} and be.parked["sim"].pid == old_pid) if keep else not be.parked
        runner.run_iteration(2)
        if keep:  # back to the settings it started under: the parked process, not a new one
            back = be.replace_actor("sim", None, {}, priority=0, keep=True)
            assert back["pid"] == old_pid and back["mps_quota"] is None and be.parked["sim"].pid == info["pid"]
            assert back["reused"] and not info["reused"]
        runner.run_iteration(3)
        states = {n: be.control(n, "get_states") for n in be.components()}
    finally:
        be.shutdown()
    _assert_same(straight, states)


FLAKY = """
rose: 1
name: flaky
components:
  f: {impl: "tests.mocks:Flaky", args: {failures: 2}}
iteration:
  count: 2
  body:
    - {node: w, call: f.work, in: {x: iteration.i}, out: [y], idempotent: IDEM}
"""


def test_idempotent_calls_are_retried_and_others_are_not() -> None:
    wf = load_workflow_text(FLAKY.replace("IDEM", "true"), "flaky.yaml")
    states, runner = _run(wf, LocalBackend, iterations=2)
    assert [r.metrics.get("f/rose_retries") for r in runner.results] == [2.0, None]
    wf = load_workflow_text(FLAKY.replace("IDEM", "false"), "flaky.yaml")
    with pytest.raises(CallFailed, match="transient failure 1"):
        _run(wf, LocalBackend, iterations=2)


def test_an_idempotent_update_is_refused() -> None:
    from rose_dsl import WorkflowError

    text = SLEEPERS.replace('{node: wa, call: a.work, in: {x: iteration.i}, out: [y]}',
                            '{node: wa, call: a.work, in: {x: iteration.i}, out: [y], idempotent: true, state: {count: update}}')
    text = text.replace('a: {impl: "tests.mocks:Sleeper", args: {seconds: 0.3}}',
                        'a: {impl: "tests.mocks:Sleeper", args: {seconds: 0.3}, state: [count]}')
    with pytest.raises(WorkflowError, match="a retry would apply the update twice"):
        load_workflow_text(text, "idem.yaml")


DYING = """
rose: 1
name: dying
components:
  d: {impl: "tests.mocks:DiesOnce", args: {marker: "MARKER", at_call: 3}, state: [acc]}
  e: {impl: "tests.mocks:Sleeper", args: {seconds: 0.0}}
iteration:
  count: 5
  body:
    - {node: w, call: d.work, in: {x: iteration.i}, out: [y], state: {acc: update}}
    - {node: v, call: e.work, in: {x: w.y}, out: [y]}
"""


@pytest.mark.e2e
@pytest.mark.parametrize("backend", ["ray", "ray-compiled"])
def test_a_killed_component_is_restarted_from_the_last_checkpoint(tmp_path, backend, ray_session) -> None:
    """SIGKILL inside a call: the run reports it, restarts the process, restores every component from
    the last checkpoint and finishes with the state an uninterrupted run has."""
    wf = load_workflow_text(DYING.replace("MARKER", str(tmp_path / "died")), "dying.yaml")
    sch = Schedule(wf)
    be = RayBackend(wf, ALLOWED, sch.program.loops_of)
    if backend != "ray":
        be.compile(sch)
    try:
        runner = Runner(wf, be, RunConfig(iterations=5, out_dir=tmp_path / "run", checkpoint_every=1, tensorboard=False), sch)
        results = runner.run()
        state = be.control("d", "get_states")["acc"]
    finally:
        be.shutdown()
    assert (tmp_path / "died").exists() and len(runner.recoveries) == 1
    assert runner.recoveries[0]["restarted"] == ["d"] and runner.recoveries[0]["from_checkpoint"] == 1
    assert [r.iteration for r in results] == [0, 1, 2, 3, 4]
    assert float(state["total"]) == float(sum(range(5)))


def test_a_worker_that_dies_of_sigsegv_mid_run_ends_with_exit_3_not_a_hang(tmp_path, ray_session) -> None:
    """Issue 59's second Ctrl-C once ended in rc -11 (a Ray worker's segfault; not reproduced, docs/reliability.md).
    What rose does when a component's Ray worker dies of SIGSEGV mid-run: it restarts the process from the last
    checkpoint (`max_restarts`) and, when it dies there again, stops: `CallFailed` naming the node, the component and
    the restarts given up, which `rose execute` reports as exit 3 with no traceback -- never a hang, never exit 0.
    (The call that found the death may be the one after the crash, a control call: the component is what it names.)"""
    import io

    from rich.console import Console

    from rose_cli.run import ExecuteOptions, guarded
    from rose_dsl.cli import ExitCode

    wf = load_workflow_text(DYING.replace('"tests.mocks:DiesOnce", args: {marker: "MARKER", at_call: 3}, state: [acc]',
                                          '"tests.mocks:Segfaults", args: {at_call: 3}, state: [acc]'), "segv.yaml")
    sch = Schedule(wf)
    be = RayBackend(wf, ALLOWED, sch.program.loops_of)
    try:
        runner = Runner(wf, be, RunConfig(iterations=5, out_dir=tmp_path / "run", checkpoint_every=1, tensorboard=False,
                                          max_restarts=1), sch)
        with pytest.raises(CallFailed) as failed:
            runner.run()
    finally:
        be.shutdown()
    assert failed.value.died and "gave up after 1 restart(s)" in str(failed.value), failed.value
    assert [r["restarted"] for r in runner.recoveries] == [["d"]] and runner.recoveries[0]["from_checkpoint"] == 1
    console = Console(file=io.StringIO(), width=300)

    def body(teardown: object, ctx: object) -> None:
        raise failed.value

    assert guarded(body, ExecuteOptions(backend="ray"), console) == ExitCode.COMPONENT
    said = console.file.getvalue()  # type: ignore[attr-defined]
    assert "the process of component d died" in said and "gave up after 1 restart(s)" in said, said
    assert "Traceback" not in said


@pytest.mark.e2e
@pytest.mark.parametrize("backend", ["local", "ray", "ray-compiled"])
def test_a_hanging_call_fires_the_watchdog_with_stacks(tmp_path, backend, request) -> None:
    """`rose execute` with a call stuck past --call-timeout: exit 4 with the stuck process's stack. The local
    backend's run is the command's own process; the Ray ones run in this process (typer's runner) on the
    worker's Ray cluster (a process of its own started Ray again: 5-18 s on the 2-core machine)."""
    wf = tmp_path / "wf.yaml"
    wf.write_text(SLEEPERS.replace("args: {seconds: 0.3}}\n  b:", "args: {seconds: 600}}\n  b:"))  # never returns within the test
    # the stuck call is 600 s and _cli's timeout 300 s: a run that waited for it fails here, with no wall-clock
    # bound for a loaded machine to miss
    args = ["execute", str(wf), "--allow-module", "tests", "-n", "2", "--call-timeout", "3", "--backend",
            backend.partition("-")[0], "--compiled" if backend == "ray-compiled" else "--no-compiled",
            "--out", str(tmp_path / "run")]
    if backend == "local":
        proc = _cli(*args)
        code, stderr = proc.returncode, proc.stderr
    else:
        from typer.testing import CliRunner

        from rose_cli.main import app

        request.getfixturevalue("ray_session")
        r = CliRunner().invoke(app, args)
        code, stderr = r.exit_code, r.stderr
    assert code == 4, stderr
    assert "raise --call-timeout" in stderr and "stack of a" in stderr
    assert "mocks.py" in stderr and "work" in stderr  # the stuck frame: Sleeper.work
    assert "mocks.py" in (tmp_path / "run" / "stacks.txt").read_text()


SLOW_NODE = """
rose: 1
name: slow-node
components:
  a: {impl: "tests.mocks:Sleeper", args: {seconds: 0.05}}
  b: {impl: "tests.mocks:Sleeper", args: {seconds: 4}}
iteration:
  count: 1
  body:
    - {node: quick, call: a.work, in: {x: iteration.i}, out: [y], timeout_s: 30}
    - {node: slow, call: b.work, in: {x: quick.y}, out: [y], timeout_s: 0.5}
"""


@pytest.mark.parametrize("backend", ["local", "ray", "ray-compiled"])
def test_a_node_timeout_fires_the_watchdog_for_that_node(backend, request) -> None:
    """`timeout_s` of a node bounds each of its calls (the run's call timeout is 900 s here)."""
    if backend != "local":
        request.getfixturevalue("ray_session")
    wf = load_workflow_text(SLOW_NODE, "slow.yaml")
    sch = Schedule(wf)
    be = (LocalBackend if backend == "local" else RayBackend)(wf, ALLOWED, sch.program.loops_of)
    if backend == "ray-compiled":
        be.compile(sch)
    try:
        # (the node's 0.5-s limit, not the run's 900 s, ended the wait: the message says which; no wall-clock
        # bound, which a loaded machine could miss)
        with pytest.raises(WatchdogTimeout, match=r"iteration.slow\[0\] did not finish within 0.5 s \(the node's timeout_s\)"):
            Runner(wf, be, RunConfig(iterations=1, tensorboard=False), sch).run()
    finally:
        be.shutdown()
