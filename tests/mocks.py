"""Deterministic mock components for the semantics and rewrite property suites.

A mock's behaviour per method is given at construction (by the test's workflow generator): which
state objects it reads / updates / refreshes, whether it is batch-separable, and which outputs are
per-row 0/1 flags (`flags`, for loops that end `until:` every row is done; `lengths`: the flag of row r is set
from trip `lengths[r] - 1` on, given the trip as input `t`). Every value is a
float64 vector over the batch (the last dimension; stacked values are `[T, ..., B]`), so row r of an
output depends only on row r of the inputs and of the state for separable methods, and on all rows
for the others. Every state operation is logged.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import torch


def _const(*parts: str) -> float:
    h = hashlib.sha256("/".join(parts).encode()).digest()
    return (int.from_bytes(h[:4], "little") / 2**32) * 2.0 - 1.0


class Mock:
    def __init__(self, name: str = "mock", batch: int = 6, behaviors: Mapping[str, Mapping[str, Any]] | None = None,
                 states: list[str] | None = None) -> None:
        self.name = name
        self.batch = batch
        self.behaviors = dict(behaviors or {})
        self.log: list[tuple[str, str, str, tuple[float, ...]]] = []  # (method, state, mode, value seen)
        for s in states or []:
            setattr(self, s, torch.tensor([_const(name, s, str(r)) for r in range(batch)], dtype=torch.float64))

    def _reduce(self, value: Any, n: int) -> torch.Tensor:
        if isinstance(value, Mapping):
            total = torch.zeros(n, dtype=torch.float64)
            for k in sorted(value):
                total = total + self._reduce(value[k], n)
            return total
        if isinstance(value, torch.Tensor):
            v = value.to(torch.float64)
            if v.ndim == 0:
                return v.expand(n).clone()
            if v.shape[-1] != n:
                raise ValueError(f"{self.name}: value with batch {v.shape[-1]} where {n} rows were expected")
            return v.reshape(-1, n).sum(0) if v.ndim > 1 else v
        return torch.full((n,), float(value), dtype=torch.float64)

    def __getattr__(self, method: str):
        behaviors = self.__dict__.get("behaviors", {})
        if method not in behaviors:
            raise AttributeError(method)
        spec = behaviors[method]

        def call(rows: Any = None, **inputs: Any) -> dict[str, torch.Tensor]:
            # rows: a split group's slice, the indices of the rows not done in a loop that ends per row, or all
            idx = rows if rows is not None else slice(0, self.batch)
            positions = range(*idx.indices(self.batch)) if isinstance(idx, slice) else idx.tolist()
            n = len(positions)
            separable = spec.get("separable", False)  # if not, rows mix: a split changes the result
            mix = torch.full((n,), _const(self.name, method), dtype=torch.float64)
            for port in sorted(inputs):
                mix = mix + _const(method, port) * self._reduce(inputs[port], n)
            for state, mode in spec.get("state", {}).items():
                full = getattr(self, state)
                old = full[idx]
                if mode == "read":
                    mix = mix + 0.5 * old
                elif mode == "update":
                    new = torch.tanh(0.9 * old + 0.3 * (mix if separable else mix.cumsum(0)) + _const(method, state))
                    full[idx] = new
                    mix = mix + new
                else:  # refresh
                    new = torch.tanh(0.7 * (mix if separable else mix.flip(0)) + _const(method, state, "r"))
                    full[idx] = new
                    mix = mix - new
                self.log.append((method, state, mode, tuple(old.tolist())))
            outs = {}
            for j, port in enumerate(spec.get("out", [])):
                base = mix if separable else mix.cumsum(0)
                outs[port] = torch.tanh(base * (0.5 + 0.1 * j) + _const(method, port))
                if port in spec.get("lengths", {}):  # done after a per-row number of trips: t + 1 >= lengths[r]
                    length = torch.tensor([spec["lengths"][port][r] for r in positions], dtype=torch.float64)
                    outs[port] = (self._reduce(inputs["t"], n) + 1 >= length).to(torch.float64)
                elif port in spec.get("flags", ()):  # a per-row 'done' flag (0 or 1), for `until:`
                    # row r's flag depends on row r's value and on r itself (a global row: `rows` is the
                    # group's), so that rows finish at different iterations
                    offset = torch.tensor([_const(self.name, method, port, str(r)) for r in positions],
                                          dtype=torch.float64)
                    outs[port] = (outs[port] + offset > 0).to(torch.float64)
            return outs

        return call

    def get_state(self, name: str) -> torch.Tensor:
        return getattr(self, name).clone()

    def set_state(self, name: str, value: torch.Tensor) -> None:
        setattr(self, name, value.clone())


MockC0 = MockC1 = MockC2 = Mock


class Sleeper:
    """Sleeps, then returns its input plus one: for overlap and fault tests of the runtime."""

    def __init__(self, seconds: float = 0.2, fail_at: int = -1, bad_output: bool = False) -> None:
        self.seconds = seconds
        self.fail_at = fail_at
        self.bad_output = bad_output
        self.calls = 0
        self.count = torch.zeros(1)

    def work(self, x: Any = 0) -> dict[str, Any]:
        import time

        self.calls += 1
        if self.calls - 1 == self.fail_at:
            raise RuntimeError(f"planted failure at call {self.fail_at}")
        time.sleep(self.seconds)
        self.count = self.count + 1
        if self.bad_output:
            return {"wrong": 1}
        return {"y": torch.as_tensor(x) + 1}


class Flaky:
    """Fails its first `failures` calls, then works: for the retry policy of idempotent nodes."""

    def __init__(self, failures: int = 1) -> None:
        self.failures = failures
        self.calls = 0

    def work(self, x: Any = 0) -> dict[str, Any]:
        self.calls += 1
        if self.calls <= self.failures:
            raise ConnectionError(f"transient failure {self.calls}")
        return {"y": torch.as_tensor(x) + 1}


class DiesOnce:
    """Kills its own process (SIGKILL) at one call, once per `marker` file: a crashed component."""

    def __init__(self, marker: str, at_call: int = 3) -> None:
        self.marker = marker
        self.at_call = at_call
        self.calls = 0
        self.total = torch.zeros(1)

    def work(self, x: Any = 0) -> dict[str, Any]:
        import os
        import signal
        from pathlib import Path

        self.calls += 1
        if self.calls == self.at_call and not Path(self.marker).exists():
            Path(self.marker).write_text("died")
            os.kill(os.getpid(), signal.SIGKILL)
        self.total = self.total + torch.as_tensor(x, dtype=torch.float32)
        return {"y": self.total.clone()}

    def get_state(self, name: str) -> Any:
        return {"total": self.total.clone(), "calls": self.calls}

    def set_state(self, name: str, value: Any) -> None:
        self.total = value["total"].clone()
        self.calls = value["calls"]


class Segfaults:
    """Its process dies of SIGSEGV at its `at_call`-th call, every time it gets there (the count is its state, so a
    process restored from a checkpoint before that call dies again): a worker crashing in native code."""

    def __init__(self, at_call: int = 3) -> None:
        self.at_call = at_call
        self.calls = 0

    def work(self, x: Any = 0) -> dict[str, Any]:
        import os
        import signal

        self.calls += 1
        if self.calls == self.at_call:
            os.kill(os.getpid(), signal.SIGSEGV)  # (faulthandler, where enabled, prints the stack and dies of it too)
        return {"y": torch.as_tensor(x) + 1}

    def get_state(self, name: str) -> Any:
        return {"calls": self.calls}

    def set_state(self, name: str, value: Any) -> None:
        self.calls = value["calls"]


class WrongRows:
    """A batch-separable method that returns the wrong number of rows."""

    def __init__(self, n: int = 6) -> None:
        self.n = n

    def act(self, x: Any = 0) -> dict[str, Any]:
        return {"y": torch.zeros(self.n - 1)}


class DataShard:
    """Replica r's share of a global regression batch: rows [r*n, (r+1)*n) of n*replicas rows."""

    def __init__(self, n: int = 4, seed: int = 0, replica: int = 0, replicas: int = 1) -> None:
        self.n, self.seed, self.replica, self.replicas = n, seed, replica, replicas

    def batch(self, it: int) -> dict[str, Any]:
        g = torch.Generator().manual_seed(self.seed * 1000 + int(it))
        x = torch.randn(self.n * self.replicas, 3, generator=g, dtype=torch.float64)
        y = x @ torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64) + 0.1
        rows = slice(self.replica * self.n, (self.replica + 1) * self.n)
        return {"x": x[rows], "y": y[rows]}


class DPRegressor:
    """Least squares by SGD; with replicas > 1 the gradient is averaged over the process group, so every
    replica ends with the weights one process gets from the concatenated batch."""

    data_parallel_group = True  # rose sets up torch.distributed over the replicas

    def __init__(self, lr: float = 0.1, replica: int = 0, replicas: int = 1) -> None:
        self.lr, self.replicas = lr, replicas
        self.w = torch.zeros(3, dtype=torch.float64)

    def update(self, x: torch.Tensor, y: torch.Tensor) -> None:
        grad = 2 * x.T @ (x @ self.w - y) / x.shape[0]
        if self.replicas > 1:
            import torch.distributed as dist

            dist.all_reduce(grad)
            grad /= self.replicas
        self.w = self.w - self.lr * grad

    def get_state(self, name: str) -> torch.Tensor:
        return self.w.clone()

    def set_state(self, name: str, value: torch.Tensor) -> None:
        self.w = value.clone()


class GpuFaultOnce(DiesOnce):
    """Raises CUDA's sticky 'illegal memory access' error at one call, once per `marker` file: what a
    kernel fault looks like to a component (its process lives on, its CUDA context does not)."""

    def work(self, x: Any = 0) -> dict[str, Any]:
        from pathlib import Path

        self.calls += 1
        if self.calls == self.at_call and not Path(self.marker).exists():
            Path(self.marker).write_text("faulted")
            raise RuntimeError("CUDA error: an illegal memory access was encountered\n"
                               "CUDA kernel errors might be asynchronously reported at some other API call")
        self.total = self.total + torch.as_tensor(x, dtype=torch.float32)
        return {"y": self.total.clone()}
