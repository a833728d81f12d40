"""Components whose `metric_merge` declarations `rose validate --import` checks (tests/cli/test_import_check.py)."""

from __future__ import annotations

from typing import Any


class _Worker:
    def __init__(self, seconds: float = 0.0) -> None:
        self.seconds = seconds
        self.calls = 0

    def work(self, x: Any) -> dict[str, Any]:
        self.calls += 1
        return {"y": x}


class Counted(_Worker):
    """Reports literal names: `env_steps` and `reward`."""

    metric_merge = {"env_steps": "sum", "reward": "mean"}

    def pop_metrics(self) -> dict[str, float]:
        out = {"env_steps": float(self.calls)}
        out["reward"] = 1.0
        self.calls = 0
        return out


class WithSnapshot(Counted):
    """Adds a snapshot to its base's metrics (`super().pop_metrics()`)."""

    metric_merge = {"reward_so_far": "copies", "env_steps": "sum", "*": "mean"}

    def pop_metrics(self) -> dict[str, float]:
        return {**super().pop_metrics(), "reward_so_far": 0.5}


class Misnamed(Counted):
    metric_merge = {"rewrd": "mean"}


class UnknownRule(Counted):
    metric_merge = {"reward": "average"}


class NotADict(Counted):
    metric_merge = ["reward"]  # type: ignore[assignment]


class NoMetrics(_Worker):
    metric_merge = {"reward": "mean"}


class ComputedNames(_Worker):
    """Names computed at run time: whether a declared one is reported cannot be read from the source."""

    metric_merge = {"loss_7": "mean"}

    def pop_metrics(self) -> dict[str, float]:
        return {f"loss_{i}": 0.0 for i in range(8)}
