"""A batched simulator over N gymnasium MuJoCo `Reacher-v5` environments, one env object per row.

Why not gymnasium's vector env: its shared autoreset and RNG make a row's future depend on how the
rows were batched. Here every row is independent and every reset is seeded from explicit keys:

* an explicit `reset(it, ep, rows)` seeds env r from (seed, it, ep, r // group_size, 0), so the
  `group_size` envs of a GRPO group start from the same state;
* an automatic reset after an episode ends (truncation at `max_episode_steps`, or a numeric fault)
  seeds it from (seed, it, ep of the last explicit reset, r // group_size, n) where n counts the
  episodes since that reset -- per-row state, so any row partition gives the same results.

State object `episode` (`get_state("episode")`): per-env MuJoCo integration state (time, qpos, qvel,
warm-start, ctrl, ... via `mj_getState`), step counters, return accumulators and the reset keys, all as
tensors (loadable with `torch.load(weights_only=True)`).

With `image_size > 0` every observation is a record `{"state": [n, 10], "image": [n, 3, H, W] uint8}`
rendered offscreen by MuJoCo (EGL by default; ~10 ms per frame on a CPU's software GL, far less on
a GPU), for `FlowPolicy(image=True)`.
"""

from __future__ import annotations

import math
import os
from typing import Any

import gymnasium as gym
import mujoco
import numpy as np
import torch

from .determinism import derive_seed, resolve_rows

_FAULT_WARNINGS = (
    mujoco.mjtWarning.mjWARN_BADQPOS,
    mujoco.mjtWarning.mjWARN_BADQVEL,
    mujoco.mjtWarning.mjWARN_BADQACC,
    mujoco.mjtWarning.mjWARN_BADCTRL,
)
_STATE_SPEC = mujoco.mjtState.mjSTATE_INTEGRATION


class EnvFault(FloatingPointError):
    """An environment's physics went non-finite or unstable (raised with on_nan="stop")."""


class ReacherVecSim:
    """`num_envs` Reacher-v5 envs stepped with action chunks of `chunk` actions.

    `on_nan="reset"` resets an env whose action/observation/reward goes non-finite, whose MuJoCo
    step raises, or which MuJoCo flags unstable (it then silently resets the data itself), counting
    it in the `env_faults` metric and reporting `done=1` for that row; `on_nan="stop"` raises
    `EnvFault` naming the env.
    """

    def __init__(
        self,
        num_envs: int,
        chunk: int,
        seed: int = 0,
        group_size: int = 1,
        on_nan: str = "reset",
        max_episode_steps: int = 50,
        env_id: str = "Reacher-v5",
        image_size: int = 0,
        replica: int = 0,
        replicas: int = 1,
    ) -> None:
        if on_nan not in ("reset", "stop"):
            raise ValueError(f"on_nan must be 'reset' or 'stop', got {on_nan!r}")
        if num_envs < 1 or chunk < 1 or group_size < 1:
            raise ValueError("num_envs, chunk and group_size must be >= 1")
        if num_envs % group_size:
            raise ValueError(f"num_envs={num_envs} must be a multiple of group_size={group_size}")
        self.num_envs, self.chunk, self.seed = int(num_envs), int(chunk), int(seed)
        self.group_size, self.on_nan, self.max_episode_steps = int(group_size), on_nan, int(max_episode_steps)
        self.image_size = int(image_size)
        # data parallel: this replica's envs are the global rows [row_offset, row_offset + num_envs)
        self.row_offset = int(replica) * self.num_envs
        if not 0 <= int(replica) < int(replicas):
            raise ValueError(f"replica {replica} of {replicas} is out of range")
        render: dict[str, Any] = {}
        if self.image_size:
            os.environ.setdefault("MUJOCO_GL", "egl")  # headless offscreen rendering
            render = {"render_mode": "rgb_array", "width": self.image_size, "height": self.image_size}
        self.envs = [gym.make(env_id, **render).unwrapped for _ in range(self.num_envs)]
        space = self.envs[0].action_space
        self.act_low, self.act_high = space.low.astype(np.float64), space.high.astype(np.float64)
        self.act_dim = int(space.shape[0])
        self.obs_dim = int(self.envs[0].observation_space.shape[0])
        self._state_size = mujoco.mj_stateSize(self.envs[0].model, _STATE_SPEC)
        self.steps = np.zeros(self.num_envs, dtype=np.int64)  # env steps in the current episode
        self.ep_return = np.zeros(self.num_envs, dtype=np.float64)
        self.ep_dist = np.zeros(self.num_envs, dtype=np.float64)  # the distance part of the return
        self.origin = np.zeros((self.num_envs, 2), dtype=np.int64)  # (it, ep) of the last explicit reset
        self.count = np.zeros(self.num_envs, dtype=np.int64)  # episodes since that reset
        self._finished: list[tuple[float, float]] = []  # (return, distance part) of finished episodes
        self._faults = 0
        self._env_steps = 0
        self.reset(it=-1, ep=-1)  # a valid initial state even if a step comes first

    # -- resets ---------------------------------------------------------------------------------
    def _reset_row(self, r: int) -> np.ndarray:
        """Reset env r from its keys (origin, group, episode count); returns the observation."""
        it, ep = (int(v) for v in self.origin[r])
        group = (self.row_offset + r) // self.group_size  # by global row: replicas reset as one batch would
        seed = derive_seed("reacher", self.seed, it, ep, group, int(self.count[r]))
        obs, _ = self.envs[r].reset(seed=seed % (2**63))
        self.steps[r] = 0
        self.ep_return[r] = 0.0
        self.ep_dist[r] = 0.0
        return obs

    def reset(self, it: int, ep: int, rows: slice | None = None) -> dict[str, torch.Tensor]:
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

    # -- stepping -------------------------------------------------------------------------------
    def _fault_count(self, r: int) -> int:
        warnings = self.envs[r].data.warning
        return sum(int(warnings[w].number) for w in _FAULT_WARNINGS)

    def _substep(self, r: int, action: np.ndarray) -> tuple[np.ndarray, float, float] | str:
        """One env step of row r; returns (obs, reward, distance reward) or a string describing the fault."""
        if not np.all(np.isfinite(action)):
            return f"non-finite action {action.tolist()}"
        before = self._fault_count(r)
        try:
            obs, reward, _, _, info = self.envs[r].step(np.clip(action, self.act_low, self.act_high))
        except Exception as exc:  # MuJoCo errors surface as generic exceptions
            return f"MuJoCo raised {type(exc).__name__}: {exc}"
        if self._fault_count(r) != before:
            return "MuJoCo flagged the physics unstable (bad qpos/qvel/qacc/ctrl)"
        if not (np.all(np.isfinite(obs)) and math.isfinite(reward)):
            return "non-finite observation or reward"
        return obs, float(reward), float(info["reward_dist"])

    def step(self, action: torch.Tensor, rows: slice | None = None) -> dict[str, torch.Tensor]:
        """Execute the action chunk `[n, chunk, act_dim]` of each row in turn.

        Returns obs `[n, obs_dim]` (after an automatic reset for rows whose episode ended),
        reward `[n]` (sum over the executed sub-steps), done `[n]` (1.0 if the episode ended during
        the chunk; the rest of that chunk is dropped) and final_obs `[n, obs_dim]` (the last
        observation of the ended episode -- equal to obs for rows that did not end -- which a
        trainer bootstraps truncated episodes from).
        """
        selected = resolve_rows(rows, self.num_envs)
        act = action.detach().to("cpu", torch.float64).numpy()
        if act.shape != (len(selected), self.chunk, self.act_dim):
            raise ValueError(
                f"ReacherVecSim.step: action shape {tuple(act.shape)} != "
                f"({len(selected)}, {self.chunk}, {self.act_dim}) for rows={rows}"
            )
        obs_out = np.empty((len(selected), self.obs_dim), dtype=np.float64)
        final_out = np.empty_like(obs_out)
        reward_out = np.zeros(len(selected), dtype=np.float64)
        done_out = np.zeros(len(selected), dtype=np.float64)
        images, final_images = self._image_buffer(len(selected)), self._image_buffer(len(selected))
        for i, r in enumerate(selected):
            obs = None
            for j in range(self.chunk):
                result = self._substep(r, act[i, j])
                if isinstance(result, str):
                    if self.on_nan == "stop":
                        raise EnvFault(f"ReacherVecSim: env {r} faulted at episode step {self.steps[r]}: {result}")
                    self._render_into(final_images, i, r)
                    self._faults += 1
                    last = obs if obs is not None else self._current_obs(r)
                    final_out[i], obs = last, self._end_episode(r, record=False)
                    done_out[i] = 1.0
                    break
                obs, reward, dist = result
                reward_out[i] += reward
                self.ep_return[r] += reward
                self.ep_dist[r] += dist
                self.steps[r] += 1
                self._env_steps += 1
                if self.steps[r] >= self.max_episode_steps:
                    self._render_into(final_images, i, r)
                    final_out[i], obs = obs, self._end_episode(r, record=True)
                    done_out[i] = 1.0
                    break
            self._render_into(images, i, r)
            if not done_out[i]:
                final_out[i] = obs
                if images is not None and final_images is not None:
                    final_images[i] = images[i]
            obs_out[i] = obs
        return {
            "obs": self._obs(obs_out, images),
            "reward": torch.from_numpy(reward_out).float(),
            "done": torch.from_numpy(done_out).float(),
            "final_obs": self._obs(final_out, final_images),
        }

    # -- camera ---------------------------------------------------------------------------------
    def _image_buffer(self, n: int) -> np.ndarray | None:
        return np.zeros((n, 3, self.image_size, self.image_size), dtype=np.uint8) if self.image_size else None

    def _render_into(self, images: np.ndarray | None, i: int, r: int) -> None:
        if images is not None:
            images[i] = self.envs[r].render().transpose(2, 0, 1)

    def _obs(self, state: np.ndarray, images: np.ndarray | None) -> Any:
        tensor = torch.from_numpy(state).float()
        return tensor if images is None else {"state": tensor, "image": torch.from_numpy(images)}

    def close(self) -> None:
        """Release the envs (and their GL contexts when rendering)."""
        for env in self.envs:
            env.close()
        self.envs = []

    def _end_episode(self, r: int, record: bool) -> np.ndarray:
        if record:
            self._finished.append((float(self.ep_return[r]), float(self.ep_dist[r])))
        self.count[r] += 1
        return self._reset_row(r)

    def _current_obs(self, r: int) -> np.ndarray:
        """Observation of row r's current state (only used to bootstrap a faulted first sub-step)."""
        env = self.envs[r]
        mujoco.mj_forward(env.model, env.data)
        obs = env._get_obs()
        return obs if np.all(np.isfinite(obs)) else np.zeros(self.obs_dim)

    # -- state ----------------------------------------------------------------------------------
    def get_state(self, name: str) -> dict[str, torch.Tensor]:
        self._check_name(name)
        physics = np.empty((self.num_envs, self._state_size), dtype=np.float64)
        for r, env in enumerate(self.envs):
            mujoco.mj_getState(env.model, env.data, physics[r], _STATE_SPEC)
        return {
            "physics": torch.from_numpy(physics),
            "steps": torch.from_numpy(self.steps.copy()),
            "ep_return": torch.from_numpy(self.ep_return.copy()),
            "ep_dist": torch.from_numpy(self.ep_dist.copy()),
            "origin": torch.from_numpy(self.origin.copy()),
            "count": torch.from_numpy(self.count.copy()),
        }

    def set_state(self, name: str, value: dict[str, torch.Tensor]) -> None:
        self._check_name(name)
        physics = value["physics"].to(torch.float64).numpy()
        if physics.shape != (self.num_envs, self._state_size):
            raise ValueError(f"episode state physics has shape {physics.shape}, expected "
                             f"({self.num_envs}, {self._state_size})")
        for r, env in enumerate(self.envs):
            mujoco.mj_setState(env.model, env.data, np.ascontiguousarray(physics[r]), _STATE_SPEC)
            mujoco.mj_forward(env.model, env.data)
        self.steps = value["steps"].numpy().astype(np.int64).copy()
        self.ep_return = value["ep_return"].numpy().astype(np.float64).copy()
        self.ep_dist = value["ep_dist"].numpy().astype(np.float64).copy()
        self.origin = value["origin"].numpy().astype(np.int64).copy()
        self.count = value["count"].numpy().astype(np.int64).copy()

    @property
    def episode(self) -> dict[str, torch.Tensor]:
        return self.get_state("episode")

    @episode.setter
    def episode(self, value: dict[str, torch.Tensor]) -> None:
        self.set_state("episode", value)

    @staticmethod
    def _check_name(name: str) -> None:
        if name != "episode":
            raise KeyError(f"ReacherVecSim has no state object {name!r} (it owns 'episode')")

    # -- metrics --------------------------------------------------------------------------------
    def pop_metrics(self) -> dict[str, float]:
        """Mean return (and its distance-to-target part) of the episodes finished since the last call
        (fsum: independent of the order in which row groups finished), their count, env faults and
        env steps."""
        metrics: dict[str, Any] = {"episodes": float(len(self._finished)), "env_faults": float(self._faults),
                                   "env_steps": float(self._env_steps)}
        if self._finished:
            metrics["episode_return"] = math.fsum(f[0] for f in self._finished) / len(self._finished)
            metrics["episode_dist_return"] = math.fsum(f[1] for f in self._finished) / len(self._finished)
        self._finished, self._faults, self._env_steps = [], 0, 0
        return metrics
