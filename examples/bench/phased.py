"""Latency-bound components whose cost changes half-way through a run (a param schedule): from RL iteration
`at` on, a call waits `later_fixed_ms + later_per_row_ms * rows` instead of `fixed_ms + per_row_ms * rows`.
What they compute does not change, only how long they take -- the shape of a run whose phase times drift
(completions grow as a policy learns, episodes shorten), for `rose optimize --train --max-overhead`'s drift
test (`tests/optimizer/data/drift_chain.yaml`). The iteration comes in as an input (`it: iteration.i`), so every plan
of the workflow sees the same schedule however it groups the rows."""

from __future__ import annotations

from typing import Any

import torch

from .latency import Policy, Scorer, wait_ms

__all__ = ["PhasedPolicy", "PhasedScorer"]


class _Phased:
    fixed_ms: float
    per_row_ms: float
    spin: bool | str

    def _phase(self, at: int, later_fixed_ms: float, later_per_row_ms: float) -> None:
        self.at, self.later = int(at), (float(later_fixed_ms), float(later_per_row_ms))

    def wait_at(self, it: int, rows: int) -> None:
        fixed, per_row = self.later if it >= self.at else (self.fixed_ms, self.per_row_ms)
        wait_ms(fixed, per_row, rows, self.spin)


class PhasedPolicy(_Phased, Policy):
    """`latency.Policy` whose `act` costs the later timing from iteration `at` on."""

    def __init__(self, at: int = 0, later_fixed_ms: float = 0.0, later_per_row_ms: float = 0.0, **kw: Any) -> None:
        super().__init__(**kw)
        self._phase(at, later_fixed_ms, later_per_row_ms)
        self._it = 0

    def act(self, obs: torch.Tensor, t: int = 0, it: int = 0, rows: slice | None = None) -> dict[str, torch.Tensor]:
        self._it = int(it)
        return super().act(obs, t, it, rows)

    def wait(self, rows: int) -> None:
        self.wait_at(self._it, rows)


class PhasedScorer(_Phased, Scorer):
    """`latency.Scorer` whose `score` costs the later timing from iteration `at` on."""

    def __init__(self, at: int = 0, later_fixed_ms: float = 0.0, later_per_row_ms: float = 0.0, **kw: Any) -> None:
        super().__init__(**kw)
        self._phase(at, later_fixed_ms, later_per_row_ms)
        self._it = 0

    def score(self, x: torch.Tensor, it: int = 0, rows: slice | None = None) -> torch.Tensor:
        self._it = int(it)
        return super().score(x, rows)

    def wait(self, rows: int) -> None:
        self.wait_at(self._it, rows)
