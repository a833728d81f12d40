"""A latency-bound pipeline stage for the chain-pipelining benchmark and tests: each call waits a fixed
time plus a time per row (`time.sleep`, which frees the GIL, as a call waiting on a device or a remote
server does), then computes a deterministic row-wise function -- so splitting it into row groups gives
bit-identical results, and only the overlap of groups changes the wall time."""

from __future__ import annotations

import time
from typing import Any

import torch


class Stage:
    def __init__(self, rows: int = 128, fixed_ms: float = 5.0, per_row_ms: float = 1.0, width: int = 4, seed: int = 0) -> None:
        self.rows, self.fixed, self.per_row, self.width, self.seed = rows, fixed_ms / 1e3, per_row_ms / 1e3, width, seed
        self.w = torch.zeros(width, dtype=torch.float64)  # the learner's state

    def _wait(self, n: int) -> None:
        time.sleep(self.fixed + self.per_row * n)

    def generate(self, it: Any, rows: slice | None = None) -> dict[str, torch.Tensor]:
        """Row r of iteration `it` depends only on (seed, it, r)."""
        idx = range(*(rows or slice(0, self.rows)).indices(self.rows))
        self._wait(len(idx))
        base = torch.tensor([[(self.seed * 7919 + int(it) * 131 + r * 17 + c) % 97 for c in range(self.width)]
                             for r in idx], dtype=torch.float64)
        return {"tokens": torch.sin(base + self.w)}

    def score(self, tokens: torch.Tensor, rows: slice | None = None) -> dict[str, torch.Tensor]:
        self._wait(tokens.shape[0])
        return {"reward": torch.tanh(tokens).sum(1)}

    def learn(self, tokens: torch.Tensor, reward: torch.Tensor) -> dict[str, torch.Tensor]:
        self._wait(0)
        self.w = self.w + 1e-3 * (tokens * reward[:, None]).mean(0)
        return {"loss": -reward.mean()}
