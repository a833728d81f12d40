"""Synthetic components for runtime checks and dispatch benchmarks (not RL): a GPU matmul load whose
SM demand is known, and a no-op echo whose cost is pure dispatch."""

from __future__ import annotations

from typing import Any

import torch


class MatmulLoad:
    """`work` runs `iters` bf16 matmuls of size n x n on the device (a compute-bound phase)."""

    def __init__(self, n: int = 4096, iters: int = 20, device: str = "cpu", seed: int = 0) -> None:
        self.device = torch.device(device)
        g = torch.Generator().manual_seed(seed)
        dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        self.a = torch.randn(n, n, generator=g).to(self.device, dtype)
        self.b = torch.randn(n, n, generator=g).to(self.device, dtype)
        self.iters = iters
        self.calls = 0

    def work(self, x: Any = 0) -> dict[str, Any]:
        c = self.a
        for _ in range(self.iters):
            c = torch.tanh(c @ self.b)
        self.calls += 1
        return {"y": c[:4, :4].float().sum().cpu()}

    def pop_metrics(self) -> dict[str, float]:
        out, self.calls = {"calls": float(self.calls)}, 0
        return out


class Echo:
    """Returns its input: the cost of a call through rose is the dispatch overhead."""

    def __init__(self, device: str = "cpu") -> None:
        self.device = device

    def f(self, x: Any = 0) -> Any:
        return x
