"""Process helpers shared by checkpoints, MPS control and the reaper."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["pid_alive"]


def pid_alive(pid: int) -> bool:
    """True for a live process; a zombie (exited, not yet reaped by its parent) is dead."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc: trust kill(0)
    return stat.rpartition(")")[2].split()[:1] != ["Z"]
