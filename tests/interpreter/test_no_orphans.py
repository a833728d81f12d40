"""The driver killed (SIGKILL) in the middle of a Ray run leaves no Ray or component process behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from interpreter.reaper import _identity, session_processes

ROOT = Path(__file__).resolve().parents[2]

LONG = """
rose: 1
name: long
components:
  a: {impl: "tests.mocks:Sleeper", args: {seconds: 0.5}}
  b: {impl: "tests.mocks:Sleeper", args: {seconds: 0.5}}
iteration:
  count: 1000
  body:
    - {node: wa, call: a.work, in: {x: iteration.i}, out: [y]}
    - {node: wb, call: b.work, in: {x: iteration.i}, out: [y]}
"""


def _sessions() -> set[str]:
    base = Path("/tmp/ray")
    return {p.name for p in base.glob("session_2*")} if base.exists() else set()


@pytest.mark.exclusive
def test_killing_the_driver_leaves_no_processes(tmp_path) -> None:
    pytest.importorskip("ray")
    wf = tmp_path / "long.yaml"
    wf.write_text(LONG)
    before = _sessions()
    proc = subprocess.Popen([sys.executable, "-m", "rose_cli", "execute", str(wf), "--allow-module", "tests",
                             "--backend", "ray", "-q", "--out", str(tmp_path / "run")], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.time() + 180
    while time.time() < deadline and not (tmp_path / "run" / "metrics.jsonl").exists():
        time.sleep(0.5)
    new = _sessions() - before
    assert new, "the run did not start a Ray session"
    session = f"/tmp/ray/{sorted(new)[-1]}"
    time.sleep(1.0)
    running = {pid: _identity(pid) for pid in session_processes(session)}
    assert running, "no process of the session found while running"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()

    def left() -> list[int]:  # what ran before (same pid and start time: pids are reused) or matches now
        return sorted({p for p, ident in running.items() if ident and _identity(p) == ident} | set(session_processes(session)))

    deadline = time.time() + 60
    while time.time() < deadline and left():
        time.sleep(1.0)
    assert left() == []
