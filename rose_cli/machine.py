"""What a result file says about the machine it was measured on (`rose optimize`'s report and `rose compare
--json`): a figure without its host, card and versions cannot be compared with another."""

from __future__ import annotations

import os
import platform
from typing import Any

__all__ = ["machine_info"]


def machine_info(backend: str) -> dict[str, Any]:
    """Host, platform, Python, CPUs, the backend, and where importable torch (with the GPU) and Ray."""
    info: dict[str, Any] = {"host": platform.node(), "platform": platform.platform(), "python": platform.python_version(),
                            "cpus": os.cpu_count(), "backend": backend}
    try:
        import torch

        info["torch"] = torch.__version__
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
            info["gpu_count"] = torch.cuda.device_count()
    except Exception:  # noqa: BLE001 - descriptive only
        pass
    if backend == "ray":
        try:
            import ray

            info["ray"] = ray.__version__
        except ImportError:
            pass
    return info
