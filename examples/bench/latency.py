"""Latency-bound components for optimizer checks on the CPU: every call waits `fixed_ms + per_row_ms *
rows` (sleeping, or spinning with `spin=True` to be compute-bound) and computes a small deterministic
result, so that overlap shows up as wall-clock time on two cores and a plan can be checked to compute
bit for bit what the declared workflow computes.

Why these exist: the optimizer must find overlap on workflows it has never seen, and prove on the CPU
that it neither changes results nor picks slower (over-split) plans. A call whose cost is a fixed part
plus a per-row part is the shape that makes the group count matter: splitting into k groups divides the
per-row part but pays the fixed part k times.

Every per-row computation depends only on the row's own inputs, state and global row index, so the
methods honour the split-invariance contract (docs/components.md); metrics are accumulated per row and
reduced in a fixed order, so they are identical however the rows were grouped.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["Source", "Policy", "Sim", "Scorer", "Trainer", "Stage", "wait_ms"]

DTYPE = torch.float64


def wait_ms(fixed_ms: float, per_row_ms: float, rows: int, spin: bool | str = False) -> None:
    """Sleep (`spin` false), spin until a wall-clock deadline (`True`: busy, but done on time however the
    machine is loaded), or spin until the thread has used that much CPU time (`"cpu"`: a fixed amount of
    pure-Python work holding the GIL, as a real compute-bound call: two of them never overlap in one process)."""
    seconds = (fixed_ms + per_row_ms * rows) / 1e3
    if seconds <= 0:
        return
    if not spin:
        time.sleep(seconds)
        return
    clock = time.thread_time if spin == "cpu" else time.perf_counter
    end = clock() + seconds
    x = 0.0
    while clock() < end:  # burn the CPU: a compute-bound call
        x = math.sin(x + 1.0)


def _rows(rows: slice | None, n: int) -> range:
    return range(*(rows or slice(0, n)).indices(n))


def _wave(seed: int, *keys: float, rows: range, width: int) -> torch.Tensor:
    """A deterministic [len(rows), width] pattern of the global row index and the keys (no RNG state)."""
    r = torch.tensor(list(rows), dtype=DTYPE).unsqueeze(1)
    c = torch.arange(width, dtype=DTYPE).unsqueeze(0)
    phase = 0.37 * seed + sum(0.1 * (i + 1) * k for i, k in enumerate(keys))
    return torch.sin(0.013 * r * (c + 1.0) + 0.7 * c + phase)


class _Timed:
    def __init__(self, fixed_ms: float = 1.0, per_row_ms: float = 0.1, spin: bool | str = False) -> None:
        self.fixed_ms, self.per_row_ms = float(fixed_ms), float(per_row_ms)
        self.spin: bool | str = "cpu" if spin == "cpu" else bool(spin)

    def wait(self, rows: int) -> None:
        wait_ms(self.fixed_ms, self.per_row_ms, rows, self.spin)


class Source(_Timed):
    """`sample(it)`: the batch an iteration starts from (prompts, tasks): [num_envs, dim]."""

    def __init__(self, num_envs: int = 64, dim: int = 4, seed: int = 0, **timing: Any) -> None:
        super().__init__(**timing)
        self.num_envs, self.dim, self.seed = int(num_envs), int(dim), int(seed)

    def sample(self, it: int = 0, rows: slice | None = None) -> torch.Tensor:
        idx = _rows(rows, self.num_envs)
        self.wait(len(idx))
        return _wave(self.seed, it, rows=idx, width=self.dim)


class Policy(_Timed):
    """`act(obs, t)` -> action, value from the rollout weights (state `weights`, [dim, act_dim]);
    `load_weights(w)` refreshes them."""

    def __init__(self, num_envs: int = 64, dim: int = 4, act_dim: int = 2, seed: int = 0, **timing: Any) -> None:
        super().__init__(**timing)
        self.num_envs, self.dim, self.act_dim, self.seed = int(num_envs), int(dim), int(act_dim), int(seed)
        self.weights = _wave(seed, 1.0, rows=range(self.dim), width=self.act_dim) * 0.5

    def act(self, obs: torch.Tensor, t: int = 0, it: int = 0, rows: slice | None = None) -> dict[str, torch.Tensor]:
        idx = _rows(rows, self.num_envs)
        if obs.shape[0] != len(idx):
            raise ValueError(f"act: obs has {obs.shape[0]} rows, expected {len(idx)}")
        self.wait(len(idx))
        noise = 0.1 * _wave(self.seed, 2.0, t, it, rows=idx, width=self.act_dim)
        action = torch.tanh(obs.to(DTYPE) @ self.weights + noise)
        return {"action": action, "value": (obs.to(DTYPE) ** 2).sum(1) * 0.1}

    def load_weights(self, w: torch.Tensor) -> None:
        self.wait(0)
        self.weights = w.to(DTYPE).clone()


class Sim(_Timed):
    """`reset(it, ep)` -> obs refreshes the per-row `episode` state; `step(action)` -> obs, reward, done
    updates it. Metrics: mean reward per step and env steps."""

    def __init__(self, num_envs: int = 64, dim: int = 4, act_dim: int = 2, seed: int = 0, replica: int = 0,
                 **timing: Any) -> None:
        super().__init__(**timing)
        self.num_envs, self.dim, self.act_dim, self.seed = int(num_envs), int(dim), int(act_dim), int(seed)
        # as one of several simulator processes (replicas), this one's rows are the global rows
        # [row_offset, row_offset + num_envs): every pattern is keyed by the global row, so any number of
        # processes computes the same rollout
        self.row_offset = int(replica) * self.num_envs
        self.episode = torch.zeros(self.num_envs, self.dim, dtype=DTYPE)
        self._reward = torch.zeros(self.num_envs, dtype=DTYPE)  # per row: split-invariant metrics
        self._steps = torch.zeros(self.num_envs, dtype=DTYPE)
        self._mix = _wave(seed, 3.0, rows=range(self.act_dim), width=self.dim)

    def reset(self, it: int = 0, ep: int = 0, rows: slice | None = None) -> torch.Tensor:
        idx = _rows(rows, self.num_envs)
        self.wait(len(idx))
        sl = slice(idx.start, idx.stop)
        rows_global = range(self.row_offset + idx.start, self.row_offset + idx.stop)
        self.episode[sl] = _wave(self.seed, 4.0, it, ep, rows=rows_global, width=self.dim)
        return self.episode[sl].clone()

    def step(self, action: torch.Tensor, rows: slice | None = None) -> dict[str, torch.Tensor]:
        idx = _rows(rows, self.num_envs)
        if action.shape[0] != len(idx):
            raise ValueError(f"step: action has {action.shape[0]} rows, expected {len(idx)}")
        self.wait(len(idx))
        sl = slice(idx.start, idx.stop)
        state = torch.tanh(0.9 * self.episode[sl] + action.to(DTYPE) @ self._mix)
        self.episode[sl] = state
        reward = -(state ** 2).sum(1)
        self._reward[sl] += reward
        self._steps[sl] += 1
        return {"obs": state.clone(), "reward": reward, "done": torch.zeros(len(idx), dtype=DTYPE)}

    def pop_metrics(self) -> dict[str, float]:
        steps = float(self._steps.sum())
        out = {"env_steps": steps, "reward": float(self._reward.sum() / steps) if steps else 0.0}
        self._reward.zero_()
        self._steps.zero_()
        return out


class Scorer(_Timed):
    """`score(x)` -> a per-row score (a stateless reward model / verifier)."""

    def __init__(self, num_envs: int = 64, seed: int = 0, **timing: Any) -> None:
        super().__init__(**timing)
        self.num_envs, self.seed = int(num_envs), int(seed)

    def score(self, x: torch.Tensor, rows: slice | None = None) -> torch.Tensor:
        idx = _rows(rows, self.num_envs)
        self.wait(len(idx))
        return torch.cos(x.to(DTYPE).reshape(len(idx), -1).sum(1) + 0.1 * self.seed)


def _leaves(value: Any) -> list[torch.Tensor]:
    if isinstance(value, Mapping):
        return [t for k in sorted(value) for t in _leaves(value[k])]
    if isinstance(value, list | tuple):
        return [t for v in value for t in _leaves(v)]
    return [value] if isinstance(value, torch.Tensor) else []


class Trainer(_Timed):
    """`update(batch)` changes `weights` and `optimizer` (a momentum) from any record of tensors (a
    trajectory, scored samples); `get_weights()` returns the weights. Not batch-separable. Metric:
    `loss`. Its cost counts the rows of the batch's first leaf (time-major stacks count T x N)."""

    def __init__(self, dim: int = 4, act_dim: int = 2, lr: float = 0.05, seed: int = 0,
                 publish_ms: float | None = None, **timing: Any) -> None:
        super().__init__(**timing)
        self.lr, self.seed = float(lr), int(seed)
        self.publish_ms = self.fixed_ms if publish_ms is None else float(publish_ms)  # get_weights' wait
        self.weights = _wave(seed, 1.0, rows=range(int(dim)), width=int(act_dim)) * 0.5
        self.optimizer = torch.zeros_like(self.weights)
        self._losses: list[float] = []

    def update(self, batch: Any, mb: int = 0, env: Any = None) -> None:
        """`mb`: a minibatch index (a different step over the same batch). `env`: the simulator's part of
        the trajectory as a second input, when the simulator runs as several processes (a value from
        components of different replica counts travels port by port)."""
        leaves = _leaves(batch) + (_leaves(env) if env is not None else [])
        if not leaves:
            raise ValueError("update: the batch holds no tensors")
        first = leaves[0]
        self.wait(int(first.shape[0] * (first.shape[1] if first.ndim > 2 else 1)))
        signal = torch.stack([leaf.to(DTYPE).mean() for leaf in leaves]).sum() + 0.01 * mb
        grad = torch.tanh(self.weights + signal)
        self.optimizer = 0.9 * self.optimizer + grad
        self.weights = self.weights - self.lr * self.optimizer
        self._losses.append(float((grad ** 2).mean()))

    def get_weights(self) -> torch.Tensor:
        wait_ms(self.publish_ms, 0.0, 0, self.spin)
        return self.weights.clone()

    def pop_metrics(self) -> dict[str, float]:
        out = {"loss": sum(self._losses) / len(self._losses)} if self._losses else {}
        self._losses = []
        return out


class Stage:
    """One component for every stage of the chain-pipelining benchmark (benchmarks/chain_pipelining.py,
    tests/transforms/test_chain.py): `generate` -> `score` -> `learn`, each call sleeping a fixed time plus
    a time per row (`time.sleep` frees the GIL, as a call waiting on a device or a remote server does),
    then computing a deterministic row-wise function -- so splitting it into row groups gives
    bit-identical results, and only the overlap of groups changes the wall time."""

    def __init__(self, rows: int = 128, fixed_ms: float = 5.0, per_row_ms: float = 1.0, width: int = 4, seed: int = 0) -> None:
        self.rows, self.fixed, self.per_row, self.width, self.seed = rows, fixed_ms / 1e3, per_row_ms / 1e3, width, seed
        self.w = torch.zeros(width, dtype=DTYPE)  # the learner's state

    def _wait(self, n: int) -> None:
        time.sleep(self.fixed + self.per_row * n)

    def generate(self, it: Any, rows: slice | None = None) -> dict[str, torch.Tensor]:
        """Row r of iteration `it` depends only on (seed, it, r)."""
        idx = _rows(rows, self.rows)
        self._wait(len(idx))
        base = torch.tensor([[(self.seed * 7919 + int(it) * 131 + r * 17 + c) % 97 for c in range(self.width)]
                             for r in idx], dtype=DTYPE)
        return {"tokens": torch.sin(base + self.w)}

    def score(self, tokens: torch.Tensor, rows: slice | None = None) -> dict[str, torch.Tensor]:
        self._wait(tokens.shape[0])
        return {"reward": torch.tanh(tokens).sum(1)}

    def learn(self, tokens: torch.Tensor, reward: torch.Tensor) -> dict[str, torch.Tensor]:
        self._wait(0)
        self.w = self.w + 1e-3 * (tokens * reward[:, None]).mean(0)
        return {"loss": -reward.mean()}
