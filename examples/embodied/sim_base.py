"""What the batched simulators share (issue 13): argument checks, global rows of replicas, keyed resets,
chunked stepping with automatic resets, fault handling, the end-of-episode flags and the metrics.

Why one base: the simulator contract is subtle -- a row's future may depend only on its own keys (split
invariance), an ended episode must say *why* it ended, and a numeric fault must neither go unnoticed
nor stop training silently -- and three copies of it (Reacher, Meta-World, MJX) had started to drift.

End-of-episode flags (per row, 0/1 floats, one chunk = one call):

* ``terminated`` -- the task reached a terminal state: the return after it is 0 and a trainer must not
  bootstrap (no value of the next observation);
* ``truncated`` -- the episode was cut at ``max_episode_steps``: a trainer bootstraps from
  ``final_obs`` (the observation the episode ended in, before the automatic reset);
* ``fault`` -- the physics went non-finite or unstable and the env was reset (``on_nan="reset"``); like
  a truncation it is not a terminal state, so a trainer bootstraps from the last good observation;
* ``done`` -- any of the three (the rest of the chunk is dropped; ``obs`` is the reset's observation).

Episodes across rollouts: `reset(it, ep)` refreshes a rollout's episodes (`state: {episode: refresh}`);
`resume()` instead returns the observation of each row's episode in progress (`state: {episode: read}`),
so that a workflow's rollouts continue the episodes the previous one left -- across the weight sync between
them. Such an episode is *partial* at the sync: its later steps are drawn by the new weights, and each
step's sample records the policy version that drew it (`FlowPolicy.act`'s `version`), which the trainer
checks against its budget (issue 46). `resume` has no side effect: resume then step is step.

`SimBase` holds the contract's plumbing for any simulator; `EnvRowSim` adds the per-row stepping loop of
the simulators that hold one environment object per row (gymnasium Reacher, Meta-World). The MJX
simulator steps all rows in one JAX program and uses `SimBase` only.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np
import torch

from .determinism import derive_seed, resolve_rows

DONE_KEYS = ("done", "terminated", "truncated", "fault")


class EnvFault(FloatingPointError):
    """An environment's physics went non-finite or unstable (raised with on_nan="stop")."""


class SimBase:
    """Arguments, replica rows, the `episode` state object's name, and the metrics of finished episodes.

    Subclasses name one extra per-episode statistic (`stat_metric`: e.g. the distance part of the return,
    or the success rate) recorded with each finished episode's return.
    """

    stat_metric: ClassVar[str] = "episode_stat"

    def _init_sim(self, num_envs: int, chunk: int, seed: int, group_size: int, on_nan: str,
                  max_episode_steps: int, replica: int = 0, replicas: int = 1) -> None:
        if on_nan not in ("reset", "stop"):
            raise ValueError(f"on_nan must be 'reset' or 'stop', got {on_nan!r}")
        if min(num_envs, chunk, group_size, max_episode_steps) < 1:
            raise ValueError("num_envs, chunk, group_size and max_episode_steps must be >= 1")
        if num_envs % group_size:
            raise ValueError(f"num_envs={num_envs} must be a multiple of group_size={group_size}")
        if not 0 <= int(replica) < int(replicas):
            raise ValueError(f"replica {replica} of {replicas} is out of range")
        self.num_envs, self.chunk, self.seed, self.group_size = int(num_envs), int(chunk), int(seed), int(group_size)
        self.on_nan, self.max_episode_steps = on_nan, int(max_episode_steps)
        # several simulator processes (replicas): this one's envs are the global rows
        # [row_offset, row_offset + num_envs); every key uses the global row
        self.row_offset = int(replica) * self.num_envs
        self._finished: list[tuple[float, float]] = []  # (return, statistic) of finished episodes
        self._faults = 0
        self._env_steps = 0
        self._resumed = 0  # episodes in progress that a `resume` continued (partial episodes)

    # -- the state object's name ------------------------------------------------------------------
    def _check_name(self, name: str) -> None:
        if name != "episode":
            raise KeyError(f"{type(self).__name__} has no state object {name!r} (it owns 'episode')")

    def get_state(self, name: str) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def set_state(self, name: str, value: dict[str, torch.Tensor]) -> None:
        raise NotImplementedError

    @property
    def episode(self) -> dict[str, torch.Tensor]:
        return self.get_state("episode")

    @episode.setter
    def episode(self, value: dict[str, torch.Tensor]) -> None:
        self.set_state("episode", value)

    # -- metrics -----------------------------------------------------------------------------------
    def pop_metrics(self) -> dict[str, float]:
        """Mean return (and the statistic) of the episodes finished since the last call (fsum: independent
        of the order in which row groups finished), their count, env faults and env steps (rose derives
        env-steps/s from `env_steps`)."""
        metrics = {"episodes": float(len(self._finished)), "env_faults": float(self._faults),
                   "env_steps": float(self._env_steps)}
        if self._finished:
            metrics["episode_return"] = math.fsum(f[0] for f in self._finished) / len(self._finished)
            metrics[self.stat_metric] = math.fsum(f[1] for f in self._finished) / len(self._finished)
        if self._resumed:
            metrics["episodes_resumed"] = float(self._resumed)
        self._finished, self._faults, self._env_steps, self._resumed = [], 0, 0, 0
        return metrics


class EnvRowSim(SimBase):
    """One environment object per row, stepped row by row with action chunks.

    Keys: an explicit `reset(it, ep, rows)` seeds env r from (tag, seed, it, ep, global r // group_size,
    0), so the `group_size` envs of a GRPO group start alike; an automatic reset after an episode ends
    seeds it from (..., it and ep of the last explicit reset, ..., n), n = episodes since that reset --
    per-row state, so any row partition (and any number of replicas) gives the same results.

    Subclasses provide `_reset_env` (reset one env from a key), `_env_step` (one env step: observation,
    reward, the statistic's per-step value, terminated), `_unstable` (MuJoCo's instability warnings so
    far), and optionally `_current_obs`, `_render_into`, `image_size`; `stat_reduce` says how the
    statistic accumulates over an episode ("sum" or "max").
    """

    seed_tag: ClassVar[str] = "sim"
    stat_reduce: ClassVar[str] = "sum"
    image_size: int = 0
    obs_dim: int
    act_dim: int
    act_low: np.ndarray
    act_high: np.ndarray

    def _init_rows(self) -> None:
        n = self.num_envs
        self.steps = np.zeros(n, dtype=np.int64)  # env steps in the current episode
        self.ep_return = np.zeros(n, dtype=np.float64)
        self.ep_stat = np.zeros(n, dtype=np.float64)
        self.origin = np.zeros((n, 2), dtype=np.int64)  # (it, ep) of the last explicit reset
        self.count = np.zeros(n, dtype=np.int64)  # episodes since that reset

    # -- hooks ---------------------------------------------------------------------------------------
    def _reset_env(self, r: int, key: int) -> np.ndarray:
        raise NotImplementedError

    def _env_step(self, r: int, action: np.ndarray) -> tuple[np.ndarray, float, float, bool]:
        raise NotImplementedError

    def _unstable(self, r: int) -> int:
        return 0

    def _accepted(self, r: int, obs: np.ndarray) -> None:
        """Called with each sub-step's observation once it passed the fault checks."""

    def _current_obs(self, r: int) -> np.ndarray:
        raise NotImplementedError

    def _render_into(self, images: np.ndarray | None, i: int, r: int) -> None:
        return None

    # -- resets ----------------------------------------------------------------------------------------
    def _reset_row(self, r: int) -> np.ndarray:
        """Reset env r from its keys (origin, group, episode count); returns the observation."""
        it, ep = (int(v) for v in self.origin[r])
        key = derive_seed(self.seed_tag, self.seed, it, ep, (self.row_offset + r) // self.group_size, int(self.count[r]))
        self.steps[r], self.ep_return[r], self.ep_stat[r] = 0, 0.0, 0.0
        return self._reset_env(r, key)

    def reset(self, it: int, ep: int, rows: slice | None = None) -> dict[str, Any]:
        """Refresh the episodes of `rows` (global row slice; None = all): obs `[n, obs_dim]` float32."""
        selected = resolve_rows(rows, self.num_envs)
        out = np.empty((len(selected), self.obs_dim), dtype=np.float64)
        images = self._image_buffer(len(selected))
        for i, r in enumerate(selected):
            self.origin[r] = (int(it), int(ep))
            self.count[r] = 0
            out[i] = self._reset_row(r)
            self._render_into(images, i, r)
        return {"obs": self._obs(out, images)}

    def resume(self, rows: slice | None = None) -> dict[str, Any]:
        """The observation of the episode in progress in each of `rows` (global row slice; None = all), which
        the next `step` continues (see the module docstring). The constructor's reset started each row's first
        episode, and a step that ends an episode starts the next. Rows mid-episode count in the
        `episodes_resumed` metric."""
        selected = resolve_rows(rows, self.num_envs)
        out = np.empty((len(selected), self.obs_dim), dtype=np.float64)
        images = self._image_buffer(len(selected))
        for i, r in enumerate(selected):
            out[i] = self._resume_obs(r)
            self._render_into(images, i, r)
            self._resumed += int(self.steps[r] > 0)
        return {"obs": self._obs(out, images)}

    def _resume_obs(self, r: int) -> np.ndarray:
        """Row r's observation as the last reset or step returned it (no physics call: see `resume`)."""
        return self._current_obs(r)

    def _end_episode(self, r: int, record: bool) -> np.ndarray:
        if record:
            self._finished.append((float(self.ep_return[r]), float(self.ep_stat[r])))
        self.count[r] += 1
        return self._reset_row(r)

    # -- stepping --------------------------------------------------------------------------------------
    def _substep(self, r: int, action: np.ndarray) -> tuple[np.ndarray, float, float, bool] | str:
        """One env step of row r, or a string describing the fault."""
        if not np.all(np.isfinite(action)):
            return f"non-finite action {action.tolist()}"
        before = self._unstable(r)
        try:
            obs, reward, stat, terminated = self._env_step(r, np.clip(action, self.act_low, self.act_high))
        except Exception as exc:  # noqa: BLE001 - MuJoCo errors surface as generic exceptions; reported as a fault
            return f"MuJoCo raised {type(exc).__name__}: {exc}"
        if self._unstable(r) != before:
            return "MuJoCo flagged the physics unstable (bad qpos/qvel/qacc/ctrl)"
        if not (np.all(np.isfinite(obs)) and math.isfinite(reward)):
            return "non-finite observation or reward"
        return obs, float(reward), float(stat), bool(terminated)

    def _describe(self, r: int) -> str:
        return f"env {r}"

    def step(self, action: torch.Tensor, rows: slice | None = None) -> dict[str, Any]:
        """Execute the action chunk `[n, chunk, act_dim]` of each row in turn.

        Returns obs `[n, obs_dim]` (after an automatic reset for rows whose episode ended), reward `[n]`
        (sum over the executed sub-steps), the end-of-episode flags `done`, `terminated`, `truncated`,
        `fault` `[n]` (see the module docstring; the rest of an ended episode's chunk is dropped) and
        final_obs `[n, obs_dim]` (the observation the ended episode ended in -- for a fault, the last good
        one -- equal to obs for rows that did not end), which a trainer bootstraps non-terminal ends from.
        """
        selected = resolve_rows(rows, self.num_envs)
        act = action.detach().to("cpu", torch.float64).numpy()
        if act.shape != (len(selected), self.chunk, self.act_dim):
            raise ValueError(f"{type(self).__name__}.step: action shape {tuple(act.shape)} != "
                             f"({len(selected)}, {self.chunk}, {self.act_dim}) for rows={rows}")
        n = len(selected)
        obs_out = np.empty((n, self.obs_dim), dtype=np.float64)
        final_out = np.empty_like(obs_out)
        reward_out = np.zeros(n, dtype=np.float64)
        flags = {k: np.zeros(n, dtype=np.float64) for k in DONE_KEYS}
        images, final_images = self._image_buffer(n), self._image_buffer(n)
        for i, r in enumerate(selected):
            obs = self._step_row(i, r, act[i], reward_out, final_out, flags, final_images)
            self._render_into(images, i, r)
            if not flags["done"][i]:
                final_out[i] = obs
                if images is not None and final_images is not None:
                    final_images[i] = images[i]
            obs_out[i] = obs
        return {"obs": self._obs(obs_out, images), "reward": torch.from_numpy(reward_out).float(),
                **{k: torch.from_numpy(v).float() for k, v in flags.items()},
                "final_obs": self._obs(final_out, final_images)}

    def _step_row(self, i: int, r: int, actions: np.ndarray, reward_out: np.ndarray, final_out: np.ndarray,
                  flags: dict[str, np.ndarray], final_images: np.ndarray | None) -> np.ndarray:
        """Row r's chunk: sub-steps until the chunk or the episode ends; returns the row's observation."""
        obs: np.ndarray | None = None
        for j in range(self.chunk):
            result = self._substep(r, actions[j])
            if isinstance(result, str):
                if self.on_nan == "stop":
                    raise EnvFault(f"{type(self).__name__}: {self._describe(r)} faulted at episode step "
                                   f"{self.steps[r]}: {result}")
                self._render_into(final_images, i, r)
                self._faults += 1
                final_out[i] = obs if obs is not None else self._current_obs(r)
                flags["fault"][i] = flags["done"][i] = 1.0
                return self._end_episode(r, record=False)
            obs, reward, stat, terminated = result
            self._accepted(r, obs)
            reward_out[i] += reward
            self.ep_return[r] += reward
            self.ep_stat[r] = self.ep_stat[r] + stat if self.stat_reduce == "sum" else max(self.ep_stat[r], stat)
            self.steps[r] += 1
            self._env_steps += 1
            truncated = self.steps[r] >= self.max_episode_steps
            if terminated or truncated:
                self._render_into(final_images, i, r)
                final_out[i] = obs
                flags["terminated" if terminated else "truncated"][i] = flags["done"][i] = 1.0
                return self._end_episode(r, record=True)
        assert obs is not None  # chunk >= 1
        return obs

    # -- observations ----------------------------------------------------------------------------------
    def _image_buffer(self, n: int) -> np.ndarray | None:
        return np.zeros((n, 3, self.image_size, self.image_size), dtype=np.uint8) if self.image_size else None

    @staticmethod
    def _obs(state: np.ndarray, images: np.ndarray | None) -> Any:
        tensor = torch.from_numpy(state).float()
        return tensor if images is None else {"state": tensor, "image": torch.from_numpy(images)}

    # -- the counters' part of the episode state ---------------------------------------------------------
    def _counters(self, stat_key: str) -> dict[str, np.ndarray]:
        return {"steps": self.steps, "ep_return": self.ep_return, stat_key: self.ep_stat, "origin": self.origin,
                "count": self.count}

    def _set_counters(self, value: dict[str, torch.Tensor], stat_key: str) -> None:
        self.steps = value["steps"].numpy().astype(np.int64).copy()
        self.ep_return = value["ep_return"].numpy().astype(np.float64).copy()
        self.ep_stat = value[stat_key].numpy().astype(np.float64).copy()
        self.origin = value["origin"].numpy().astype(np.int64).copy()
        self.count = value["count"].numpy().astype(np.int64).copy()
