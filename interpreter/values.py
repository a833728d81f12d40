"""Concrete values for the semantics: tensors and records (dicts of tensors), combined with torch.

`stack` puts the iterations on a new leading dimension (time-major, `[T, ...]`); `cat` and `slice` work
on a given dimension (the batch is dim 0 unless a merge says otherwise). Records are combined leaf by
leaf, so a collected trajectory `stack(step[*].{obs, reward})` is `{"obs": [T, N, ...], "reward": [T, N]}`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

__all__ = ["TorchOps", "hold", "row_flags"]


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

    def take(self, value: Any, index: Any, dim: int) -> Any:
        """The rows `index` (row numbers) along `dim` of every tensor in a value (a loop that ends per row
        gives a call only its rows not yet done); integers and tensors without that dimension pass."""
        if isinstance(value, Mapping):
            return {k: self.take(v, index, dim) for k, v in value.items()}
        if isinstance(value, torch.Tensor) and value.dim() > dim:
            return value.index_select(dim, torch.as_tensor(index, dtype=torch.long, device=value.device))
        return value

    def put(self, target: Any, source: Any, index: Any, dim: int) -> Any:
        """`target` with the rows `index` along `dim` of every tensor replaced by those rows of `source`."""
        rows = torch.as_tensor(index, dtype=torch.long)
        return hold(target, self.take(source, index, dim), rows, dim)

    def truth(self, value: Any) -> bool:
        if isinstance(value, torch.Tensor):
            return bool(value.all())
        return bool(value)


def hold(previous: Any, live: Any, index: torch.Tensor, dim: int) -> Any:
    """A call's full output after a trip that computed only rows `index`: the previous trip's full value
    with those rows replaced by the new ones, so a finished row keeps its last values (a new tensor: the
    previous trip's value may still be read)."""
    if isinstance(previous, Mapping):
        return {k: hold(previous[k], live[k], index, dim) for k in previous}
    if not isinstance(previous, torch.Tensor) or previous.dim() <= dim:
        return live
    out = previous.clone()
    out.index_copy_(dim, index.to(out.device), live.to(out.dtype))
    return out


def row_flags(value: Any) -> torch.Tensor:
    """A loop condition's value as one done flag per row (a [N] bool tensor): the flag tensor's dim 0 is the
    rows, every other dimension must hold for the row; a scalar is one flag for every row."""
    t = _as_tensor(value)
    if t.dim() == 0:
        return t.reshape(1).bool()
    return t.reshape(t.shape[0], -1).bool().all(dim=1)
