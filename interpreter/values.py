"""Concrete values for the semantics: tensors and records (dicts of tensors), combined with torch.

`stack` puts the iterations on a new leading dimension (time-major, `[T, ...]`); `cat` and `slice` work
on a given dimension (the batch is dim 0 unless a merge says otherwise). Records are combined leaf by
leaf, so a collected trajectory `stack(step[*].{obs, reward})` is `{"obs": [T, N, ...], "reward": [T, N]}`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

__all__ = ["TorchOps"]


def _leafwise(fn, values: Sequence[Any]) -> Any:
    first = values[0]
    if isinstance(first, Mapping):
        return {k: _leafwise(fn, [v[k] for v in values]) for k in first}
    return fn(values)


def _as_tensor(v: Any) -> torch.Tensor:
    return v if isinstance(v, torch.Tensor) else torch.as_tensor(v)


class TorchOps:
    def stack(self, values: Sequence[Any]) -> Any:
        if not values:
            return torch.empty(0)
        return _leafwise(lambda vs: torch.stack([_as_tensor(v) for v in vs]), list(values))

    def cat(self, values: Sequence[Any], dim: int = 0) -> Any:
        if not values:
            return torch.empty(0)
        return _leafwise(lambda vs: torch.cat([_as_tensor(v) for v in vs], dim=dim), list(values))

    def record(self, fields: Mapping[str, Any]) -> Any:
        return dict(fields)

    def slice(self, value: Any, start: int | None, stop: int | None) -> Any:
        if isinstance(value, Mapping):
            return {k: self.slice(v, start, stop) for k, v in value.items()}
        if isinstance(value, int | float):  # an integer field of a record (a loop index): the same for every row
            return value
        return value[start:stop]

    def part(self, value: Any, dim: int, index: int, parts: int) -> Any:
        """Shard `index` of `parts` equal shards along `dim` (a data-parallel replica's share)."""
        if isinstance(value, Mapping):
            return {k: self.part(v, dim, index, parts) for k, v in value.items()}
        t = _as_tensor(value)
        if t.shape[dim] % parts:
            raise ValueError(f"cannot shard {t.shape[dim]} rows along dim {dim} into {parts} equal parts")
        return t.tensor_split(parts, dim=dim)[index]

    def truth(self, value: Any) -> bool:
        if isinstance(value, torch.Tensor):
            return bool(value.all())
        return bool(value)
