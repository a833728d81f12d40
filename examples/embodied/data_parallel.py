"""Data-parallel replicas of the embodied components: global rows and the trainer's collectives.

With `replicas: R` in the workflow, rose runs the iteration once per replica, each on its own
processes, and passes every replica-aware class its `replica` index and `R`. Replica r's simulator and
policy own the global env rows `[r * n, (r + 1) * n)` of an `R * n`-env batch, so resets and noise are
keyed by global rows and the R replicas together roll out exactly what one process with `R * n` envs
would. The trainer replicas then train as one trainer on the concatenated batch would:

* minibatches are slices of one permutation of the *global* `T x (R * n)` rows; each replica takes the
  rows of each minibatch it holds and sums their per-row losses, divided by the global minibatch size;
* gradients are summed over the replicas (all-reduce) before clipping and the optimizer step, so the
  replicas stay identical;
* advantage normalization and the observation statistics use global moments.

Equal up to floating-point summation order, which is what the tests check.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ReplicaRows:
    """Where a replica's `local` env rows sit in the global batch of `local * replicas` rows."""

    local: int
    replica: int = 0
    replicas: int = 1

    def __post_init__(self) -> None:
        if self.replicas < 1 or not 0 <= self.replica < self.replicas:
            raise ValueError(f"replica {self.replica} of {self.replicas} is out of range")

    @property
    def total(self) -> int:
        return self.local * self.replicas

    @property
    def offset(self) -> int:
        return self.local * self.replica

    def to_global(self, selected: range) -> range:
        """Local rows (a contiguous range inside this replica) -> the same rows' global indices."""
        return range(self.offset + selected.start, self.offset + selected.stop)


def is_distributed(replicas: int) -> bool:
    import torch.distributed as dist

    return replicas > 1 and dist.is_available() and dist.is_initialized()


def local_minibatch(global_rows: torch.Tensor, rows: ReplicaRows) -> torch.Tensor:
    """This replica's part of a minibatch given as global flat indices `t * total + g` of a `[T, total]`
    batch, as flat indices `t * local + (g - offset)` into its own `[T, local]` rows (order kept)."""
    t, g = global_rows // rows.total, global_rows % rows.total
    mine = (g >= rows.offset) & (g < rows.offset + rows.local)
    return t[mine] * rows.local + (g[mine] - rows.offset)


def _staged(x: torch.Tensor) -> torch.Tensor:
    """gloo (replicas sharing a GPU, or CPU replicas) communicates host tensors."""
    import torch.distributed as dist

    return x.cpu() if dist.get_backend() == "gloo" else x


def all_reduce_sum(tensors: list[torch.Tensor]) -> None:
    """Sum tensors in place over the process group, as one flat buffer (one collective)."""
    import torch.distributed as dist

    if not tensors:
        return
    flat = _staged(torch.cat([t.reshape(-1) for t in tensors]))
    dist.all_reduce(flat)
    offset = 0
    for t in tensors:
        t.copy_(flat[offset : offset + t.numel()].view_as(t))
        offset += t.numel()


def global_mean_std(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and unbiased std of the concatenation of every replica's `x` (two passes, like `x.std()`)."""
    count_sum = torch.stack([torch.tensor(float(x.numel()), dtype=torch.float64, device=x.device),
                             x.double().sum()])
    all_reduce_sum([count_sum])
    count, mean = count_sum[0], count_sum[1] / count_sum[0]
    squares = ((x.double() - mean) ** 2).sum().reshape(1)
    all_reduce_sum([squares])
    std = (squares[0] / (count - 1)).sqrt()
    return mean.to(x.dtype), std.to(x.dtype)


def all_gather_rows(x: torch.Tensor) -> torch.Tensor:
    """Every replica's rows of `x` (equal shapes), concatenated in replica order."""
    import torch.distributed as dist

    x = _staged(x.contiguous())
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, x)
    return torch.cat(parts)
