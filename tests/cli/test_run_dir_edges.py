"""The run directory at its edges (issue 59): links, a full disk, a kill while pruning, a lock left by a
killed holder. In-process (`execute_workflow` on the local backend) and with injected faults (an `OSError`
raised where a write happens), not a real full disk: each test takes well under a second."""

from __future__ import annotations

import errno
import io
import json
import os
from pathlib import Path

import pytest
import torch
from rich.console import Console

from interpreter import checkpoint as ckpt_mod
from interpreter import safe_io
from interpreter.checkpoint import CheckpointError, list_complete, save_checkpoint, save_component_checkpoint
from interpreter.rundir import LOCK, RunDirLock, rose_outputs
from rose_cli.run import ExecuteOptions, execute_workflow, resume_command
from rose_dsl import load_workflow_text

WF = """rose: 1
name: holds
components:
  d: {impl: "tests.cli.rundir_components:Holds", state: [acc]}
iteration:
  count: 3
  body:
    - {node: w, call: d.work, in: {x: iteration.i}, out: [y], state: {acc: update}}
"""


def _run(run: Path, **opts: object) -> tuple[int, str]:
    """`rose execute` of WF into `run`, in this process: (exit code, everything printed)."""
    wf = load_workflow_text(WF, "holds.yaml")
    text = io.StringIO()
    console = Console(file=text, width=400, highlight=False)
    code = execute_workflow(wf, ExecuteOptions(out_dir=run, allowed=("tests.",), quiet=True, loggers=(), **opts),  # type: ignore[arg-type]
                            console, console)
    return int(code), text.getvalue()


def _others(tmp_path: Path) -> Path:
    """Another run's directory, whose files a link will point at."""
    other = tmp_path / "other"
    assert _run(other)[0] == 0
    return other


def _snapshot(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def _temps(run: Path) -> list[str]:
    return sorted(str(p.relative_to(run)) for p in run.rglob("*") if ".tmp" in p.name or p.name.startswith(".trash"))


# --- links --------------------------------------------------------------------------------------------------------
def test_a_symlinked_out_is_refused_unless_follow_links(tmp_path) -> None:
    """A symlinked --out pointing at another run was written through without --overwrite (issue 59)."""
    other = _others(tmp_path)
    before = _snapshot(other)
    link = tmp_path / "link"
    link.symlink_to(other)
    code, text = _run(link)
    assert code == 2 and f"--out {link} is a symbolic link (to {other})" in text and "--follow-links" in text
    assert _snapshot(other) == before
    code, text = _run(link, resume=True, follow_links=True, iterations=4)  # said, it is the run there
    assert code == 0, text
    assert [json.loads(x)["iteration"] for x in (other / "metrics.jsonl").read_text().splitlines()] == [0, 1, 2, 3]


@pytest.mark.parametrize("command", ["optimize", "compare"])
def test_optimize_and_compare_refuse_a_symlinked_out_unless_follow_links(tmp_path, command) -> None:
    """`rose optimize --out LINK` was refused with no way to say yes: --follow-links is theirs too, and the
    command optimize prints to continue the run names it (issue 59). In this process, local backend."""
    from typer.testing import CliRunner

    from rose_cli.main import app

    wf = tmp_path / "wf.yaml"
    wf.write_text(WF.replace("count: 3", "count: 40"))  # (enough iterations for optimize's reference profile)
    target, link = tmp_path / "target", tmp_path / "link"
    target.mkdir()
    link.symlink_to(target)
    args = {"optimize": ["optimize", str(wf), "-o", str(tmp_path / "plan.yaml"), "--rounds", "1"],
            "compare": ["compare", str(wf), "--rounds", "1", "--warmup", "0"]}[command]
    args += ["--backend", "local", "-q", "--allow-module", "tests.", "--out", str(link)]
    refused = CliRunner().invoke(app, args)
    assert refused.exit_code == 2 and f"--out {link} is a symbolic link (to {target})" in refused.output
    assert "--follow-links" in refused.output and list(target.iterdir()) == [], refused.output
    done = CliRunner().invoke(app, [*args, "--follow-links"])
    assert done.exit_code == 0, done.output
    assert (target / "metrics.jsonl").is_file() and link.is_symlink()
    if command == "optimize":
        assert f"--out {link} --follow-links --resume" in done.output, done.output
    # the general form of the command to continue (the command line is not `rose execute`'s)
    assert resume_command(link).endswith(f"--out {link} --follow-links --resume")
    assert resume_command(target).endswith(f"--out {target} --resume")


@pytest.mark.parametrize("option", ["--report", "--runs"])
def test_a_symlinked_report_or_runs_directory_is_refused_unless_follow_links(tmp_path, option) -> None:
    """`rose optimize --report LINK --overwrite` removed an earlier report's files where LINK points, and `rose compare
    --runs LINK --overwrite` its rounds, then wrote through it (found by tests/cli/test_fuzz.py): refused before any
    work as a linked --out is. Whether --follow-links gets past the check is asked with the start stopped."""
    from unittest import mock

    from typer.testing import CliRunner

    from rose_cli.main import app

    wf = tmp_path / "wf.yaml"
    wf.write_text(WF.replace("count: 3", "count: 40"))
    target, link = tmp_path / "target", tmp_path / "link"
    target.mkdir()
    (target / "report.md").write_text("an earlier report\n")
    (target / "declared").mkdir()
    link.symlink_to(target)
    command = ["optimize", str(wf), "-o", str(tmp_path / "plan.yaml")] if option == "--report" else ["compare", str(wf)]
    args = [*command, "--backend", "local", "-q", "--allow-module", "tests.", option, str(link), "--overwrite"]
    refused = CliRunner().invoke(app, args)
    assert refused.exit_code == 2 and f"{option} {link} is a symbolic link (to {target})" in refused.output, \
        refused.output
    assert "--follow-links" in refused.output and sorted(p.name for p in target.iterdir()) == ["declared", "report.md"]

    class Started(Exception):
        pass

    with mock.patch("rose_cli.run.gpu_session", side_effect=Started):
        taken = CliRunner().invoke(app, [*args, "--follow-links"])
    assert isinstance(taken.exception, Started), taken.output


@pytest.mark.parametrize("name", ["metrics.jsonl", "nodes.json", "trace.jsonl", "export", "checkpoints", "tb", LOCK])
def test_a_link_inside_the_run_directory_is_never_written_through(tmp_path, name) -> None:
    other = _others(tmp_path)
    before = _snapshot(other)
    run = tmp_path / "run"
    run.mkdir()
    target = other / (name if name != LOCK else "metrics.jsonl")
    (run / name).symlink_to(target)
    code, text = _run(run)
    assert code == 2, text
    assert f"{name} is a symbolic link" in text, text
    assert "Traceback" not in text and _snapshot(other) == before


def test_a_link_made_during_the_run_is_refused_at_the_write(tmp_path) -> None:
    """The start-up check races with a link made later: the writes themselves never follow one."""
    victim = tmp_path / "victim"
    victim.write_text("mine")
    run = tmp_path / "run"
    run.mkdir()
    (run / "nodes.json").symlink_to(victim)
    safe_io.write_atomic(run / "nodes.json", "{}")  # a rename replaces the link...
    assert victim.read_text() == "mine" and not (run / "nodes.json").is_symlink()
    (run / "recoveries.jsonl").symlink_to(victim)
    with pytest.raises(safe_io.OutputError, match="a symbolic link"):  # ...an append refuses it
        safe_io.open_new(run / "recoveries.jsonl", "a")
    (run / "export").symlink_to(tmp_path)
    with pytest.raises(safe_io.OutputError, match="a symbolic link"):
        safe_io.real_dir(run / "export")
    assert victim.read_text() == "mine"


def test_a_users_file_named_like_a_checkpoint_is_never_moved(tmp_path) -> None:
    """A user's `ckpt-000001` was renamed to `.old-ckpt-000001-PID` (issue 59)."""
    ckpts = tmp_path / "checkpoints"
    ckpts.mkdir()
    (ckpts / "ckpt-000001").write_text("my notes")
    with pytest.raises(CheckpointError, match="not a checkpoint rose wrote"):
        save_checkpoint(ckpts, 1, {"d": {"acc": torch.ones(1)}})
    assert (ckpts / "ckpt-000001").read_text() == "my notes" and sorted(os.listdir(ckpts)) == ["ckpt-000001"]
    mine, theirs = rose_outputs(tmp_path)  # and --overwrite leaves it
    assert ckpts / "ckpt-000001" in theirs and ckpts / "ckpt-000001" not in mine
    save_checkpoint(ckpts, 2, {"d": {"acc": torch.ones(1)}})
    save_checkpoint(ckpts, 2, {"d": {"acc": torch.zeros(1)}})  # rose's own checkpoint of an iteration is replaced
    assert [p.name for p in list_complete(ckpts)] == ["ckpt-000002"]


# --- a full disk ---------------------------------------------------------------------------------------------------
def _disk_full_at(monkeypatch, module, name: str, when) -> None:
    """`module.name` (a write) raises ENOSPC when `when(path)` holds."""
    real = getattr(module, name)

    def write(path, *args, **kwargs):
        if when(Path(path)):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(module, name, write)


def test_a_full_disk_during_a_checkpoint_exits_5_keeping_the_last_one(tmp_path, monkeypatch) -> None:
    """Exit 3 ("write_state_file of learner (?)" on Ray) or 1 before (issue 59); now 5, saying what is kept."""
    run = tmp_path / "run"
    _disk_full_at(monkeypatch, ckpt_mod, "_write_file", lambda p: "000002" in str(p))
    code, text = _run(run, checkpoint_every=1)
    assert code == 5, text
    assert "checkpoint of iteration 2 not written" in text and "no space left on the device" in text
    assert f"the last complete checkpoint, {run / 'checkpoints' / 'ckpt-000001'}, is kept" in text
    assert "Traceback" not in text and _temps(run) == []
    monkeypatch.undo()  # space again: the run continues
    code, text = _run(run, resume=True)
    assert code == 0 and "continuing at iteration 2" in text, text


def test_a_component_process_that_cannot_write_its_state_file_is_named(tmp_path, monkeypatch) -> None:
    """The process holding a component's state writes its file (`write_state_file`); its failure says which
    component (on Ray it was `(?)`), as the error the worker returns."""
    _disk_full_at(monkeypatch, ckpt_mod, "_write_file", lambda p: p.name == "learner.pt")
    with pytest.raises(CheckpointError, match="state file of component learner: .*no space left"):
        ckpt_mod.write_state_file(tmp_path / "learner.pt", {"w": torch.ones(1)}, "learner")

    def control(comp, method, path, host):  # what ComponentWorker.write_state_file answers on that error
        try:
            return ckpt_mod.write_state_file(Path(path), {"w": torch.ones(1)}, comp)
        except CheckpointError as exc:
            return {"error": str(exc)}

    with pytest.raises(CheckpointError, match="iteration 0 not written: state file of component learner"):
        save_component_checkpoint(tmp_path / "c", 0, ["learner"], control)
    assert os.listdir(tmp_path / "c") == []


def test_a_ray_control_call_that_raised_names_its_component() -> None:
    """`write_state_file of learner (?)` (issue 59): a control call's failure on Ray named no component."""
    from types import SimpleNamespace

    from interpreter.ray_backend import RayBackend
    from interpreter.worker import CallFailed

    class RayError(Exception):
        pass

    class RayTaskError(RayError):
        pass

    errors = SimpleNamespace(RayError=RayError, RayTaskError=RayTaskError, GetTimeoutError=TimeoutError,
                             RayActorError=type("RayActorError", (RayError,), {}))

    def get(ref, timeout=None):
        raise RayTaskError("OSError: [Errno 28] No space left on device")

    be = RayBackend.__new__(RayBackend)
    be.ray = SimpleNamespace(exceptions=errors, get=get)
    be.actors = {"learner": SimpleNamespace(write_state_file=SimpleNamespace(remote=lambda *a: "ref"))}
    with pytest.raises(CallFailed) as failed:
        be.control("learner", "write_state_file", "/x", "host")
    assert failed.value.component == "learner" and "(?)" not in str(failed.value)


def test_a_full_disk_at_the_end_of_a_run_exits_5_and_leaves_no_temporary(tmp_path, monkeypatch) -> None:
    """Exit 1 ("internal error ... Errno 28"), `.trace.jsonl.tmp-PID` left, nodes.json missing (issue 59)."""
    run = tmp_path / "run"
    _disk_full_at(monkeypatch, safe_io, "open_new", lambda p: p.name.startswith(".trace.jsonl.tmp"))
    code, text = _run(run)
    assert code == 5, text
    assert f"{run / 'trace.jsonl'}: no space left on the device" in text and "ckpt-000002" in text
    assert "Traceback" not in text and "internal error" not in text
    assert _temps(run) == [] and (run / "nodes.json").is_file()
    monkeypatch.undo()
    assert _run(run, overwrite=True)[0] == 0 and (run / "trace.jsonl").is_file()


def test_a_full_disk_writing_the_export_keeps_the_checkpoint(tmp_path, monkeypatch) -> None:
    run = tmp_path / "run"
    _disk_full_at(monkeypatch, ckpt_mod, "open_new", lambda p: p.name.startswith(".manifest.json.tmp"))
    code, text = _run(run)
    assert code == 5 and "export not written" in text and f"the checkpoint {run / 'checkpoints' / 'ckpt-000002'} is kept" in text
    assert _temps(run) == []


# --- a first try's rough spots ------------------------------------------------------------------------------------
def test_trace_off_writes_no_trace_and_no_out_is_said_at_the_start(tmp_path) -> None:
    """The trace had no switch; without --out, only a Ctrl-C said that nothing was kept (issue 59)."""
    run = tmp_path / "run"
    code, text = _run(run, trace=False)
    assert code == 0, text
    assert (run / "nodes.json").is_file() and not (run / "trace.json").exists() and not (run / "trace.jsonl").exists()
    code, text = _run(None)  # type: ignore[arg-type]
    assert code == 0 and text.startswith("note: no --out: nothing of this run is kept"), text


# --- a kill while pruning, a lock left by a killed holder -------------------------------------------------------------
def test_a_kill_while_pruning_never_leaves_a_partial_checkpoint(tmp_path, monkeypatch) -> None:
    """A kill while pruning left `ckpt-000020` without meta.json, never removed (issue 59): pruning renames
    a checkpoint to a hidden name first, and the next save removes what a killed pruner left."""
    for i in range(3):
        save_checkpoint(tmp_path, i, {"d": {"acc": torch.ones(1)}}, keep_last=3)

    def killed(path, *args, **kwargs):  # the deletion stops half-way, as a SIGKILL would stop it
        (Path(path) / "meta.json").unlink()
        raise KeyboardInterrupt

    monkeypatch.setattr(ckpt_mod.shutil, "rmtree", killed)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(tmp_path, 3, {"d": {"acc": torch.ones(1)}}, keep_last=3)
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("ckpt-")) == [
        "ckpt-000001", "ckpt-000002", "ckpt-000003"]  # whole ones only, under rose's names
    monkeypatch.setattr(ckpt_mod, "_pid_alive", lambda pid: False)  # (the pruner is dead)
    (tmp_path / "ckpt-000000").mkdir()  # and a partial one an older rose left
    (tmp_path / "ckpt-000000" / "state").mkdir()
    save_checkpoint(tmp_path, 4, {"d": {"acc": torch.ones(1)}}, keep_last=3)
    assert sorted(os.listdir(tmp_path)) == ["ckpt-000002", "ckpt-000003", "ckpt-000004"]


def test_the_note_on_a_lock_left_by_a_killed_holder_does_not_contradict_itself(tmp_path) -> None:
    """"pid N has ended, and a process it started still holds the lock, which ended without releasing it;
    taken over" (issue 59): the lock is free when it is taken over, so nobody holds it."""
    dead = 2**22 + 12345  # (above pid_max's default: no such process)
    (tmp_path / LOCK).write_text(json.dumps({"pid": dead, "host": os.uname().nodename, "command": "rose execute",
                                             "since": "then"}))
    lock = RunDirLock(tmp_path).acquire()
    try:
        assert lock.note is not None and "still holds" not in lock.note
        assert f"last locked by pid {dead} on host" in lock.note and "ended without releasing it" in lock.note
    finally:
        lock.release()


# --- the fault-injection pass: every write of a run fails in turn ---------------------------------------------------
def _failing_writes(monkeypatch, fail_at: int | None, err: int) -> list[str]:
    """Every file a run opens for writing (`safe_io.open_new`, wherever it is imported) is recorded; the
    `fail_at`-th raises OSError(err)."""
    from interpreter import rundir

    opened: list[str] = []
    real = safe_io.open_new

    def open_new(path, *args, **kwargs):
        opened.append(Path(path).name)
        if fail_at is not None and len(opened) == fail_at:
            raise safe_io.OutputError(safe_io.describe_os_error(Path(path), OSError(err, os.strerror(err))))
        return real(path, *args, **kwargs)

    for module in (safe_io, ckpt_mod, rundir):
        monkeypatch.setattr(module, "open_new", open_new)
    return opened


def test_each_write_of_a_run_failing_in_turn_is_exit_5_with_no_temporary_and_a_run_that_continues(
        tmp_path, monkeypatch) -> None:
    """Each file a run writes, made to fail (a full disk; with --hypothesis-profile=long also read-only and
    permission denied): exit 5 naming the file, never an internal error, no temporary left, and the run
    then continues (--resume from the checkpoint kept, or --overwrite) to the end."""
    from hypothesis import settings

    opened = _failing_writes(monkeypatch, None, 0)
    assert _run(tmp_path / "clean", checkpoint_every=1, iterations=2)[0] == 0
    points = len(opened)
    monkeypatch.undo()
    assert points >= 10, opened  # metrics, 2 checkpoints of 3 files, the export's 2, nodes, both traces
    errs = (errno.ENOSPC, errno.EROFS, errno.EACCES) if settings.default.max_examples >= 1000 else (errno.ENOSPC,)
    for err in errs:
        for at in range(1, points + 1):
            run = tmp_path / f"run-{err}-{at}"
            names = _failing_writes(monkeypatch, at, err)
            code, text = _run(run, checkpoint_every=1, iterations=2)
            monkeypatch.undo()
            assert code == 5, (names[at - 1], text)
            why = safe_io.describe_os_error(Path("f"), OSError(err, os.strerror(err))).split(": ", 1)[1].split(" (")[0]
            assert f"{names[at - 1]}: {why}" in text and "Traceback" not in text, text
            assert _temps(run) == [], (names[at - 1], _temps(run))
            assert list_complete(run / "checkpoints") == sorted((run / "checkpoints").glob("ckpt-*"))
            again = {"resume": True} if list_complete(run / "checkpoints") else {"overwrite": True}
            code, text = _run(run, checkpoint_every=1, iterations=2, **again)
            assert code == 0, (names[at - 1], text)
