"""Running and resuming (issue 12 items 7, 8): a corrupt newest checkpoint is rejected out loud, never a
step twice in metrics.jsonl or TensorBoard (resume and restart), one run per run directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from interpreter.backends import LocalBackend, RayBackend
from interpreter.checkpoint import load_checkpoint
from interpreter.rundir import RunDirInUse
from interpreter.runner import RunConfig, Runner
from interpreter.schedule import Schedule
from rose_dsl import load_workflow_text

from .clirun import plain_failure, rose

ACC = """rose: 1
name: acc
components:
  d: {impl: "tests.mocks:DiesOnce", args: {marker: "MARKER", at_call: AT}, state: [acc]}
iteration:
  count: 6
  body:
    - {node: w, call: d.work, in: {x: iteration.i}, out: [y], state: {acc: update}}
"""


def _workflow(tmp_path: Path, at_call: int = 10**6) -> Path:
    wf = tmp_path / "acc.yaml"
    wf.write_text(ACC.replace("MARKER", str(tmp_path / "died")).replace("AT", str(at_call)))
    return wf


def _execute(wf: Path, run: Path, *args: str):
    return rose("execute", str(wf), "--allow-module", "tests", "--out", str(run), "-q", *args)


def _metric_steps(run: Path) -> list[int]:
    return [json.loads(line)["iteration"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def _tensorboard_steps(run: Path, tag: str = "iteration_s") -> list[int]:
    """The steps TensorBoard shows (its own reader, which applies purge_step across event files)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tb"))
    acc.Reload()
    return [e.step for e in acc.Scalars(tag)]


def _corrupt(path: Path, how: str) -> None:
    data = bytearray(path.read_bytes())
    if how == "truncated":
        path.write_bytes(bytes(data[: len(data) // 2]))
    else:
        data[len(data) // 2] ^= 0x01  # same size: only the hash can tell
        path.write_bytes(bytes(data))


@pytest.mark.parametrize(("how", "reason"), [("truncated", "bytes, the marker says"),
                                              ("bit-flipped", "content hash mismatch")])
def test_a_corrupt_newest_checkpoint_is_rejected_out_loud_and_no_step_repeats(tmp_path, how, reason) -> None:
    wf, run = _workflow(tmp_path), tmp_path / "run"
    assert _execute(wf, run, "-n", "4", "--checkpoint-every", "1").returncode == 0
    _corrupt(run / "checkpoints" / "ckpt-000003" / "state" / "d.pt", how)
    proc = _execute(wf, run, "-n", "6", "--checkpoint-every", "1", "--resume")
    assert proc.returncode == 0, proc.stderr
    assert "checkpoint ckpt-000003 rejected: state/d.pt: " in proc.stderr and reason in proc.stderr
    assert "resuming from" in proc.stderr and "ckpt-000002 (iteration 2); continuing at iteration 3 of 6" in proc.stderr
    assert _metric_steps(run) == [0, 1, 2, 3, 4, 5]  # iteration 3 ran twice; it is logged once
    assert _tensorboard_steps(run) == [0, 1, 2, 3, 4, 5]
    final = load_checkpoint(run / "checkpoints" / "ckpt-000005").states["d"]["acc"]
    assert float(final["total"]) == float(sum(range(6)))  # the state an uninterrupted run ends with


def test_with_no_usable_checkpoint_each_rejection_is_listed(tmp_path) -> None:
    wf, run = _workflow(tmp_path), tmp_path / "run"
    assert _execute(wf, run, "-n", "3", "--checkpoint-every", "1").returncode == 0
    for k in range(3):
        _corrupt(run / "checkpoints" / f"ckpt-{k:06d}" / "state" / "d.pt", "bit-flipped")
    (run / "checkpoints" / "ckpt-000001" / "COMPLETE").unlink()
    text = plain_failure(_execute(wf, run, "-n", "6", "--resume"), code=5)
    assert "no usable checkpoint" in text and "3 found, each rejected:" in text
    assert "ckpt-000002: state/d.pt: content hash mismatch" in text
    assert "ckpt-000001: no COMPLETE marker" in text and "ckpt-000000: state/d.pt" in text
    assert _metric_steps(run) == [0, 1, 2]  # untouched


def test_an_existing_run_directory_is_refused_unless_resume_or_overwrite(tmp_path) -> None:
    wf, run = _workflow(tmp_path), tmp_path / "run"
    assert _execute(wf, run, "-n", "2").returncode == 0
    text = plain_failure(_execute(wf, run, "-n", "2"))
    assert "holds the outputs of an earlier run" in text and "--resume" in text and "--overwrite" in text
    assert _metric_steps(run) == [0, 1] and len(list((run / "tb").iterdir())) == 1  # nothing appended
    (run / "notes.txt").write_text("mine")
    proc = _execute(wf, run, "-n", "3", "--overwrite")
    assert proc.returncode == 0, proc.stderr
    assert _metric_steps(run) == [0, 1, 2] and len(list((run / "tb").iterdir())) == 1
    assert (run / "notes.txt").read_text() == "mine"  # only rose's own outputs are replaced


def test_the_runner_refuses_a_used_run_directory_too(tmp_path) -> None:
    wf = load_workflow_text(_workflow(tmp_path).read_text(), "acc.yaml")
    sch = Schedule(wf)
    be = LocalBackend(wf, ("tests.",), sch.program.loops_of)
    try:
        Runner(wf, be, RunConfig(iterations=1, out_dir=tmp_path / "run", tensorboard=False), sch).run()
        with pytest.raises(RunDirInUse, match="holds the outputs of an earlier run"):
            Runner(wf, be, RunConfig(iterations=1, out_dir=tmp_path / "run", tensorboard=False), sch)
    finally:
        be.shutdown()


@pytest.mark.e2e
def test_a_restart_from_a_checkpoint_logs_each_iteration_once(tmp_path, ray_session) -> None:
    """A component dies in iteration 3; the last checkpoint is of iteration 1, so iteration 2 (already
    logged) runs again: metrics.jsonl and TensorBoard keep one step 2, from the run that continued."""
    wf = load_workflow_text(_workflow(tmp_path, at_call=4).read_text(), "acc.yaml")
    sch = Schedule(wf)
    be = RayBackend(wf, ("tests.",), sch.program.loops_of)
    run = tmp_path / "run"
    try:
        runner = Runner(wf, be, RunConfig(iterations=5, out_dir=run, checkpoint_every=2), sch)
        results = runner.run()
        total = be.control("d", "get_states")["acc"]["total"]
    finally:
        be.shutdown()
    assert (tmp_path / "died").exists() and runner.recoveries[0]["from_checkpoint"] == 1
    assert [r.iteration for r in results] == [0, 1, 2, 3, 4]
    assert _metric_steps(run) == [0, 1, 2, 3, 4]
    assert _tensorboard_steps(run) == [0, 1, 2, 3, 4]
    assert torch.equal(total, torch.tensor([float(sum(range(5)))]))


def test_a_resume_with_another_workflow_is_refused(tmp_path) -> None:
    wf, run = _workflow(tmp_path), tmp_path / "run"
    assert _execute(wf, run, "-n", "2", "--checkpoint-every", "1").returncode == 0
    other = tmp_path / "other.yaml"
    other.write_text(wf.read_text().replace("name: acc", "name: other"))
    text = plain_failure(_execute(other, run, "-n", "4", "--resume"), code=5)
    assert "was written by workflow 'acc', not 'other'" in text and _metric_steps(run) == [0, 1]


# --- runs keep their work (issue 42) ------------------------------------------------------------------------
HOLDS = """rose: 1
name: holds
params: {rows: 2, seed: 0, iterations: 4}
components:
  d: {impl: "tests.cli.rundir_components:Holds", args: {inside: "INSIDE", go: "GO", hold_at: HOLD, rows: "${rows}"},
      state: [acc]}
iteration:
  count: "${iterations}"
  body:
    - {node: w, call: d.work, in: {x: iteration.i}, out: [y], state: {acc: update}}
"""


def _holds(tmp_path: Path, hold_at: int = 0) -> Path:
    wf = tmp_path / "holds.yaml"
    wf.write_text(HOLDS.replace("INSIDE", str(tmp_path / "inside")).replace("GO", str(tmp_path / "go"))
                  .replace("HOLD", str(hold_at)))
    return wf


def _total(path: Path) -> list[float]:
    return load_checkpoint(path).states["d"]["acc"]["total"].tolist()


def test_a_plain_run_keeps_a_checkpoint_and_an_export_loadable_without_rose(tmp_path) -> None:
    """The README's first command kept no model: no --checkpoint-every, no checkpoint (issue 42)."""
    import subprocess
    import sys

    wf, run = _holds(tmp_path), tmp_path / "run"
    proc = _execute(wf, run, "-n", "3")
    assert proc.returncode == 0, proc.stderr
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["ckpt-000002"]
    assert f"checkpoint: {run / 'checkpoints' / 'ckpt-000002'}; final state for use without rose in {run / 'export'}" \
        in proc.stdout
    assert _total(run / "checkpoints" / "ckpt-000002") == [3.0, 3.0]
    manifest = json.loads((run / "export" / "manifest.json").read_text())
    assert manifest["iteration"] == 2 and manifest["workflow"] == "holds"
    assert manifest["params"] == {"rows": 2, "seed": 0, "iterations": 4} and len(manifest["workflow_sha256"]) == 64
    assert manifest["components"]["d"]["file"] == "d.pt" and manifest["components"]["d"]["states"] == ["acc"]
    # loaded by a plain interpreter: torch alone, no rose module imported
    code = ("import sys, torch; s = torch.load(sys.argv[1], weights_only=True); "
            "assert not [m for m in sys.modules if m.split('.')[0] in ('interpreter', 'rose_dsl', 'rose_cli')]; "
            "print(s['acc']['total'].tolist())")
    loaded = subprocess.run([sys.executable, "-I", "-c", code, str(run / "export" / "d.pt")], capture_output=True,
                            text=True, cwd=tmp_path, timeout=120)
    assert loaded.returncode == 0 and loaded.stdout.strip() == "[3.0, 3.0]", loaded.stderr
    resumed = _execute(wf, run, "-n", "4", "--resume")  # and it is what --resume continues from
    assert resumed.returncode == 0, resumed.stderr
    assert "continuing at iteration 3 of 4" in resumed.stderr and _metric_steps(run) == [0, 1, 2, 3]
    assert json.loads((run / "export" / "manifest.json").read_text())["iteration"] == 3


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_the_first_signal_ends_the_iteration_in_flight_keeps_it_and_exits_128_plus_the_signal(tmp_path, sig) -> None:
    import os
    import signal
    import subprocess
    import sys
    import time

    from .clirun import ROOT

    wf, run = _holds(tmp_path, hold_at=3), tmp_path / "run"  # the third call is iteration 2's
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "rose_cli", "execute", str(wf), "--allow-module", "tests", "--out",
                             str(run), "-q"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240  # (a bound on start-up, not a measurement)
        while not (tmp_path / "inside").exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (tmp_path / "inside").exists(), proc.communicate()
        proc.send_signal(getattr(signal, sig))
        seen = []  # the note says the handler ran: only then may the held iteration end
        while not seen or "ending the iteration in progress" not in seen[-1]:
            seen.append(proc.stderr.readline())
            assert seen[-1], "".join(seen)
        (tmp_path / "go").write_text("go")
        stdout, stderr = proc.communicate(timeout=240)
        stderr = "".join(seen) + stderr
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + getattr(signal, sig), stdout + stderr
    assert "Traceback" not in stderr
    assert f"{sig}: ending the iteration in progress, then writing a checkpoint and stopping" in stderr
    assert f"stopped by {sig}; checkpoint: {run / 'checkpoints' / 'ckpt-000002'}; final state" in stderr
    assert "continue with: rose execute" in stderr and "--resume" in stderr
    assert _metric_steps(run) == [0, 1, 2] and _total(run / "checkpoints" / "ckpt-000002") == [3.0, 3.0]
    assert json.loads((run / "export" / "manifest.json").read_text())["iteration"] == 2
    done = _execute(wf, run, "--resume")
    assert done.returncode == 0, done.stderr
    assert _metric_steps(run) == [0, 1, 2, 3] and _total(run / "checkpoints" / "ckpt-000003") == [6.0, 6.0]


def test_no_message_points_at_a_flag_that_would_not_have_helped(tmp_path) -> None:
    """Without --resume the refusal said "continue it with --resume"; with it, "holds no checkpoints (was the
    run started with --checkpoint-every N?)": a circle (issue 42)."""
    wf, run = _holds(tmp_path), tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"iteration": 0}\n')  # a run killed before its first checkpoint
    text = plain_failure(_execute(wf, run, "-n", "2"))
    assert "--resume" not in text and "but no checkpoint to continue from" in text and "--overwrite" in text
    text = plain_failure(_execute(wf, run, "-n", "2", "--resume"))
    assert "holds no checkpoint to continue from" in text and "start it again with --overwrite" in text
    assert "was the run started with --checkpoint-every" not in text
    empty = tmp_path / "empty"
    assert "holds no run to continue; start one without --resume" in plain_failure(_execute(wf, empty, "--resume"))


@pytest.mark.e2e
def test_a_second_process_on_a_locked_run_directory_exits_2_naming_the_holder(tmp_path) -> None:
    """Two resumes of one directory at once were both accepted and mixed their checkpoints (issue 42)."""
    import os
    import socket

    from interpreter.rundir import RunDirLock

    wf, run = _holds(tmp_path), tmp_path / "run"
    assert _execute(wf, run, "-n", "2").returncode == 0
    with RunDirLock(run, "rose execute (the test)"):
        for args in (("-n", "3", "--resume"), ("-n", "2", "--overwrite"), ("-n", "2")):
            text = plain_failure(_execute(wf, run, *args))
            assert f"{run} is in use by another rose process (pid {os.getpid()} on host {socket.gethostname()}, " \
                   "`rose execute (the test)` since" in text, args
        optimize = rose("optimize", str(wf), "--allow-module", "tests", "-o", str(tmp_path / "plan.yaml"),
                        "--out", str(run), "--budget-s", "5")
        assert "is in use by another rose process" in plain_failure(optimize)
    assert _metric_steps(run) == [0, 1] and not (tmp_path / "plan.yaml").exists()
    assert _execute(wf, run, "-n", "3", "--resume").returncode == 0  # released: the next one runs


def test_a_lock_left_by_a_killed_process_is_taken_over_with_a_note(tmp_path) -> None:
    import signal
    import subprocess
    import sys

    from .clirun import ROOT

    wf, run = _holds(tmp_path), tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; sys.path.insert(0, sys.argv[1]); "
                               "from pathlib import Path; from interpreter.rundir import RunDirLock; "
                               "RunDirLock(Path(sys.argv[2]), 'rose execute').acquire(); print('held', flush=True); "
                               "time.sleep(600)", str(ROOT), str(run)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert f"(pid {holder.pid} on host" in plain_failure(_execute(wf, run, "-n", "1"))
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=60)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    proc = _execute(wf, run, "-n", "1")
    assert proc.returncode == 0, proc.stderr
    assert f"note: {run} was last locked by pid {holder.pid} on host" in proc.stderr
    assert "which ended without releasing it (killed?); taken over" in proc.stderr


def test_a_resume_with_changed_params_is_refused_with_the_difference_unless_allowed(tmp_path) -> None:
    """`--resume --set num_envs=32` on a 64-env run trained 32 envs on 64-row state, exit 0 (issue 42)."""
    wf, run = _holds(tmp_path), tmp_path / "run"
    assert _execute(wf, run, "-n", "2", "--set", "rows=3").returncode == 0
    text = plain_failure(_execute(wf, run, "-n", "3", "--resume", "--set", "rows=2", "--set", "seed=7"))
    assert f"--resume: the run in {run} was trained with other params than these:\n  rows: 3 -> 2\n  seed: 0 -> 7\n" in text
    assert "allow it with --allow-param-change rows,seed" in text and "-n N sets the total iterations" in text
    assert _metric_steps(run) == [0, 1]  # nothing ran
    text = plain_failure(_execute(wf, run, "-n", "3", "--resume", "--set", "rows=3", "--set", "iterations=9"))
    assert "  iterations: 4 -> 9\n" in text
    proc = _execute(wf, run, "--resume", "--set", "rows=3", "--set", "iterations=3", "--allow-param-change", "iterations")
    assert proc.returncode == 0, proc.stderr
    assert _metric_steps(run) == [0, 1, 2]
    manifest = json.loads((run / "export" / "manifest.json").read_text())
    assert manifest["params"]["iterations"] == 3  # the next resume compares with the values allowed
    assert "--allow-param-change applies to --resume" in plain_failure(
        _execute(wf, tmp_path / "new", "--allow-param-change", "rows"))


def test_overwrite_removes_only_what_rose_wrote(tmp_path) -> None:
    """--overwrite deleted a user's `checkpoints/my_model.bin` and `tb/notes` (issue 42)."""
    wf, run = _holds(tmp_path), tmp_path / "run"
    assert _execute(wf, run, "-n", "3", "--checkpoint-every", "1").returncode == 0
    (run / "checkpoints" / "my_model.bin").write_bytes(b"weights")
    (run / "tb" / "notes").write_text("mine")
    (run / "export" / "extra.pt").write_bytes(b"mine too")
    (run / "mine").mkdir()
    (run / "mine" / "metrics.jsonl").write_text("not rose's")
    proc = _execute(wf, run, "-n", "1", "--overwrite")
    assert proc.returncode == 0, proc.stderr
    assert (f"note: --overwrite removed only what rose wrote in {run}; it left checkpoints/my_model.bin, "
            "export/extra.pt, tb/notes") in proc.stderr
    assert (run / "checkpoints" / "my_model.bin").read_bytes() == b"weights" and (run / "tb" / "notes").read_text() == "mine"
    assert (run / "export" / "extra.pt").read_bytes() == b"mine too"
    assert (run / "mine" / "metrics.jsonl").read_text() == "not rose's"
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["ckpt-000000", "my_model.bin"]
    assert _metric_steps(run) == [0] and len([p for p in (run / "tb").iterdir() if p.name != "notes"]) == 1


@pytest.mark.parametrize("make", ["symlink to /dev/zero", "fifo"])
def test_a_resume_from_a_state_file_that_is_not_a_regular_file_exits_5_at_once(tmp_path, make) -> None:
    """A symlink to /dev/zero made --resume read without bound (MemoryError, exit 1); a FIFO hung it."""
    import os

    wf, run = _holds(tmp_path), tmp_path / "run"
    assert _execute(wf, run, "-n", "2").returncode == 0
    state = run / "checkpoints" / "ckpt-000001" / "state" / "d.pt"
    state.unlink()
    if make == "fifo":
        os.mkfifo(state)
    else:
        state.symlink_to("/dev/zero")
    text = plain_failure(_execute(wf, run, "-n", "3", "--resume"), code=5)
    what = "a FIFO" if make == "fifo" else "a symbolic link"
    assert f"ckpt-000001: state/d.pt: {what}; a checkpoint holds regular files only" in text
