"""Interleaved A/B runs of the language library: this checkout against a git revision, on one machine.

Why a helper: a performance claim is only worth something against a baseline measured at the same time
on the same (shared, noisy) machine. `checkout` extracts `rose_dsl/` and `schema/` of a revision into a
temporary directory; `run_child` runs a benchmark's child mode with that directory (or this checkout)
first on `sys.path`, in a fresh process, and returns the JSON it prints. The caller alternates the
variants round by round (A, B, A, B, ...), so that a slow minute hurts both alike, and reports medians
and spread (`spread`).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import tarfile
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

__all__ = ["ROOT", "checkout", "run_child", "spread", "machine", "versions", "git_rev"]


def git_rev(rev: str = "HEAD") -> str:
    out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", rev], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def checkout(rev: str) -> Path:
    """The language library of `rev` (rose_dsl/ and schema/) in a new temporary directory."""
    dest = Path(tempfile.mkdtemp(prefix=f"rose-{git_rev(rev)}-"))
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", rev, "rose_dsl", "schema"],
                             capture_output=True, check=True).stdout
    with tempfile.TemporaryFile() as f:
        f.write(archive)
        f.seek(0)
        with tarfile.open(fileobj=f) as tar:
            tar.extractall(dest, filter="data")
    return dest


def run_child(script: Path, root: Path, args: list[str], timeout: float = 900) -> Any:
    """Run `script --child --root ROOT ARGS` in a fresh interpreter; its last stdout line is JSON."""
    env = dict(os.environ, PYTHONPATH=str(root), PYTHONHASHSEED="0")
    proc = subprocess.run([sys.executable, str(script), "--child", "--root", str(root), *args], capture_output=True,
                          text=True, env=env, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{script.name} child (root {root}) failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def spread(samples: list[float]) -> dict[str, float]:
    """Median and spread of a list of timings (seconds)."""
    s = sorted(samples)
    q = statistics.quantiles(s, n=4) if len(s) >= 2 else [s[0]] * 3
    return {"median": statistics.median(s), "min": s[0], "max": s[-1], "q1": q[0], "q3": q[2], "n": len(s)}


def machine() -> dict[str, Any]:
    return {"platform": platform.platform(), "python": platform.python_version(),
            "implementation": platform.python_implementation(), "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count()}


def versions() -> dict[str, str]:
    out = {"rose": git_rev()}
    for dist in ("PyYAML", "lark", "jsonschema", "fastjsonschema"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "absent"
    import yaml

    out["libyaml"] = "yes" if getattr(yaml, "__with_libyaml__", False) else "no"
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "rose_dsl", "schema"], capture_output=True,
                           text=True).stdout.strip()
    if dirty:
        out["rose"] += "+uncommitted"
    return out
