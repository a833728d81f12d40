"""No orphans when the driver dies: a tiny watcher process that outlives `rose execute` by a moment.

Started by the Ray backend after its cluster is up. It polls the driver's pid; when the driver is gone
(a normal exit included) it kills every process whose command line names this run's Ray session
directory (raylet, GCS, agents, component workers), then exits. Run as
`python -m interpreter.reaper DRIVER_PID SESSION_DIR`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from interpreter.procs import pid_alive

__all__ = ["start_reaper", "session_processes"]


def session_processes(session_dir: str) -> list[int]:
    """Pids of processes whose command line or environment mentions the Ray session directory."""
    name = Path(session_dir).name
    pids = []
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            blob = (entry / "cmdline").read_bytes() + b"\0" + (entry / "environ").read_bytes()
        except OSError:
            continue
        if name.encode() in blob:
            pids.append(int(entry.name))
    return pids


def main() -> None:
    driver, session = int(sys.argv[1]), sys.argv[2]
    os.setsid()  # not in the driver's process group: a Ctrl-C or group kill of the driver leaves us to clean up
    while pid_alive(driver):
        time.sleep(0.5)
    time.sleep(1.0)  # a clean shutdown may still be stopping things itself
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = session_processes(session)
        for pid in pids:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        if not pids:
            break
        time.sleep(1.0)


def start_reaper(session_dir: str) -> subprocess.Popen | None:
    if not session_dir or not Path("/proc").exists():
        return None
    return subprocess.Popen([sys.executable, "-m", "interpreter.reaper", str(os.getpid()), session_dir],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            cwd=str(Path(__file__).resolve().parent.parent), start_new_session=True)


if __name__ == "__main__":
    main()
