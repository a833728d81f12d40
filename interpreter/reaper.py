"""No orphans when the driver dies: a tiny watcher process that outlives `rose execute` by a moment.

Started by the Ray backend after its cluster is up. It polls the driver's pid; when the driver is gone
(a normal exit included) it kills every process whose command line names this run's Ray session
directory (raylet, GCS, agents, component workers) or descends from one, then exits; or, for an MPS
daemon the run started, quits that daemon if the run could not (SIGKILL). Run as
`python -m interpreter.reaper DRIVER_PID --session SESSION_DIR` or `... --mps BINARY PIPE_DIR ROOT`.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from interpreter.procs import pid_alive

__all__ = ["start_reaper", "start_mps_reaper", "session_processes"]


def _stat(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name (field 3 onwards), or None."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None


def _identity(pid: int) -> str | None:
    """The process's start time: a pid and its start time name one process (pids are reused)."""
    fields = _stat(pid)
    return fields[19] if fields and len(fields) > 19 else None


def session_processes(session_dir: str) -> list[int]:
    """Pids of processes whose command line or environment mentions the Ray session directory, and
    their descendants (Ray's agents rename themselves, `ray::DashboardAgent`, and keep no trace of it)."""
    name = Path(session_dir).name.encode()
    me = os.getpid()
    matched: set[int] = set()
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        pid = int(entry.name)
        fields = _stat(pid)
        if fields and len(fields) > 1 and fields[1].isdigit():
            children.setdefault(int(fields[1]), []).append(pid)
        try:
            blob = (entry / "cmdline").read_bytes() + b"\0" + (entry / "environ").read_bytes()
        except OSError:
            continue
        if name in blob:
            matched.add(pid)
    found, todo = set(matched), list(matched)
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found and child != me:
                found.add(child)
                todo.append(child)
    return sorted(found)


def _kill_all(known: dict[int, str | None], current: Callable[[], list[int]]) -> None:
    """SIGTERM, then SIGKILL, every process still alive that we saw (same pid and start time) or that
    `current()` finds now."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = {p for p, ident in known.items() if ident is not None and _identity(p) == ident}
        pids.update(current())
        for pid in pids:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        if not pids:
            return
        time.sleep(1.0)


def _quit_mps(binary: str, pipe_dir: str, root: str) -> None:
    """Stop an MPS control daemon this run owned, unless the run already did (it removes `root`)."""
    if not Path(root).exists():
        return
    env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=pipe_dir, CUDA_MPS_LOG_DIRECTORY=str(Path(root) / "log"))
    try:
        subprocess.run([binary], input="quit\n", env=env, capture_output=True, text=True, timeout=10)
    except (subprocess.TimeoutExpired, OSError):
        pass
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline and any(Path(pipe_dir).glob("control*")):
        time.sleep(0.1)
    shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    driver, what = int(sys.argv[1]), sys.argv[2]
    try:  # not in the driver's process group: a Ctrl-C or group kill of the driver leaves us to clean up
        os.setsid()
    except PermissionError:  # already a session leader (started with start_new_session)
        pass
    known: dict[int, str | None] = {}
    polls = 0
    while pid_alive(driver):
        if what == "--session" and polls % 4 == 0:  # remember who belongs to the session while it is intact
            for pid in session_processes(sys.argv[3]):
                known.setdefault(pid, _identity(pid))
        polls += 1
        time.sleep(0.5)
    time.sleep(1.0)  # a clean shutdown may still be stopping things itself
    if what == "--session":
        _kill_all(known, lambda: session_processes(sys.argv[3]))
    elif what == "--mps":
        _quit_mps(sys.argv[3], sys.argv[4], sys.argv[5])


def start_reaper(session_dir: str) -> subprocess.Popen | None:
    """Watch this process; when it is gone, kill the Ray session's processes."""
    if not session_dir or not Path("/proc").exists():
        return None
    return _spawn(["--session", session_dir])


def start_mps_reaper(binary: str, pipe_dir: str, root: str) -> subprocess.Popen | None:
    """Watch this process; when it is gone without having stopped its MPS daemon, stop it."""
    if not Path("/proc").exists():
        return None
    return _spawn(["--mps", binary, pipe_dir, root])


def _spawn(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "interpreter.reaper", str(os.getpid()), *args],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            cwd=str(Path(__file__).resolve().parent.parent), start_new_session=True)


if __name__ == "__main__":
    main()
