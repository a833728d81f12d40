"""A component that breaks the split contract on purpose: `score` is declared batch-separable but takes
no `rows=` keyword, so any plan that splits it fails at run time (like a real contract bug)."""

from __future__ import annotations

import torch


class NoRows:
    """Breaks the component contract when split: `score` changes per-row state (`seen`, a count per row)
    but takes no `rows=`, so a group's call cannot tell which rows it has (docs/components.md)."""

    def __init__(self, num_envs: int = 8) -> None:
        self.num_envs = num_envs
        self.seen = torch.zeros(num_envs)

    def score(self, x: torch.Tensor) -> torch.Tensor:
        self.seen += 1
        return torch.cos(x.to(torch.float64).reshape(x.shape[0], -1).sum(1))

    def get_state(self, name: str) -> torch.Tensor:
        return self.seen.clone()

    def set_state(self, name: str, value: torch.Tensor) -> None:
        self.seen = value.clone()


class Sink:
    """A probe for the property suite: records what it is given (like `interpreter.optimize.trials.Probe`)."""

    def __init__(self) -> None:
        self.captured: dict[int, dict] = {}

    def capture(self, probe_id: int, **values) -> None:
        self.captured.setdefault(probe_id, values)

    def get_state(self, name: str):
        return torch.zeros(1)
