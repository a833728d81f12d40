"""Running `rose` the way a user does: a fresh interpreter, `python -m rose_cli`, this source tree."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def rose(*args: str, cwd: Path = ROOT, env: dict[str, str] | None = None, module: str = "rose_cli",
         timeout: float = 300) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
                **(env or {})}
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, cwd=cwd,
                          env=full_env, timeout=timeout)


def plain_failure(proc: subprocess.CompletedProcess[str], code: int = 2) -> str:
    """The failure's output, after checking it is the expected exit and neither a traceback nor a bug."""
    text = proc.stdout + proc.stderr
    assert proc.returncode == code, text
    assert "Traceback" not in text and "internal error" not in text, text
    return text
