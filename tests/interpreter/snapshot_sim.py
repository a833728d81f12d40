"""A simulator with a snapshot metric (a running mean over every step it ever ran, never reset by
`pop_metrics`): the kind of metric no merge of temporal copies can reproduce. `SnapshotSim` declares it;
`UndeclaredSnapshotSim` does not."""

from __future__ import annotations

from typing import Any

from examples.bench.latency import Sim


class UndeclaredSnapshotSim(Sim):
    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self._all_reward, self._all_steps = 0.0, 0

    def step(self, action: Any, rows: slice | None = None) -> dict[str, Any]:
        out = super().step(action, rows)
        self._all_reward += float(out["reward"].sum())
        self._all_steps += int(out["reward"].shape[0])
        return out

    def pop_metrics(self) -> dict[str, float]:
        out = super().pop_metrics()
        out["reward_so_far"] = self._all_reward / max(1, self._all_steps)
        return out


class SnapshotSim(UndeclaredSnapshotSim):
    metric_merge = {"reward_so_far": "copies", "env_steps": "sum", "reward": "mean"}


class BadDeclarationSim(UndeclaredSnapshotSim):
    metric_merge = {"reward_so_far": "average"}
