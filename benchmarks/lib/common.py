"""What every benchmark records next to its figures: the machine, the package versions, robust statistics.

Why one module: results are only comparable when each JSON says where and with what it was measured
(GPU, driver, CPU count, torch/jax/ray/mujoco versions), and when every script summarises repeats the
same way (median and spread, never a single run).
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence
from typing import Any

PACKAGES = ("torch", "jax", "jaxlib", "mujoco", "mujoco-mjx", "metaworld", "gymnasium", "ray", "numpy",
            "nvidia-ml-py")


def versions(packages: Sequence[str] = PACKAGES) -> dict[str, str | None]:
    """Installed versions of `packages` (None where absent) and Python's."""
    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in packages:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def machine() -> dict[str, Any]:
    """Host and GPU description: CPU count, GPU names, driver, memory (nvidia-smi; none on CPU hosts)."""
    info: dict[str, Any] = {"host": platform.node(), "cpu_count": os.cpu_count(), "platform": platform.platform(),
                            "gpus": []}
    try:
        query = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                                "--format=csv,noheader"], capture_output=True, text=True, timeout=20, check=True)
    except (OSError, subprocess.SubprocessError):
        return info
    for line in query.stdout.strip().splitlines():
        name, driver, memory = (part.strip() for part in line.split(","))
        info["gpus"].append({"name": name, "driver": driver, "memory": memory})
    return info


def summary(values: Sequence[float]) -> dict[str, float | int | None]:
    """Median, spread (min, max, relative IQR-free spread (max-min)/median) and count of repeats."""
    vals = [float(v) for v in values]
    if not vals:
        return {"n": 0, "median": None, "min": None, "max": None, "spread": None}
    med = statistics.median(vals)
    return {"n": len(vals), "median": med, "min": min(vals), "max": max(vals),
            "spread": (max(vals) - min(vals)) / med if med else None}


def time_calls(fn: Callable[[], Any], reps: int, warmup: int = 2, cuda: bool = False) -> list[float]:
    """Milliseconds of each of `reps` calls of `fn` after `warmup` calls; CUDA events when `cuda`."""
    for _ in range(warmup):
        fn()
    if not cuda:
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return times
    import torch

    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for start, end in events:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return [start.elapsed_time(end) for start, end in events]


class Budget:
    """Wall-clock budget of one device call: sections ask before they start, so a run that would
    overrun skips what is left (and says so) instead of being killed with nothing written."""

    def __init__(self, seconds: float) -> None:
        self.t0, self.seconds = time.monotonic(), float(seconds)

    def left(self) -> float:
        return self.seconds - (time.monotonic() - self.t0)

    def elapsed(self) -> float:
        return time.monotonic() - self.t0
