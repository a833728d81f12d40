"""A batched simulator over N gymnasium MuJoCo `Reacher-v5` environments, one env object per row.

Why not gymnasium's vector env: its shared autoreset and RNG make a row's future depend on how the
rows were batched. Here every row is independent and every reset is seeded from explicit keys:

every reset is keyed by (seed, it, ep, global row // group_size, episodes since the last explicit
reset), so any row partition gives the same results (the stepping, keys, faults and end-of-episode
flags are `sim_base.EnvRowSim`'s).

State object `episode` (`get_state("episode")`): per-env MuJoCo integration state (time, qpos, qvel,
warm-start, ctrl, ... via `mj_getState`), step counters, return accumulators and the reset keys, all as
tensors (loadable with `torch.load(weights_only=True)`).

With `image_size > 0` every observation is a record `{"state": [n, 10], "image": [n, 3, H, W] uint8}`
rendered offscreen by MuJoCo (EGL by default; ~10 ms per frame on a CPU's software GL, far less on
a GPU), for `FlowPolicy(image=True)`.
"""

from __future__ import annotations

import os
from typing import Any

import gymnasium as gym
import mujoco
import numpy as np
import torch

from .sim_base import EnvFault, EnvRowSim

__all__ = ["EnvFault", "ReacherVecSim"]

_FAULT_WARNINGS = (
    mujoco.mjtWarning.mjWARN_BADQPOS,
    mujoco.mjtWarning.mjWARN_BADQVEL,
    mujoco.mjtWarning.mjWARN_BADQACC,
    mujoco.mjtWarning.mjWARN_BADCTRL,
)
_STATE_SPEC = mujoco.mjtState.mjSTATE_INTEGRATION


class ReacherVecSim(EnvRowSim):
    """`num_envs` Reacher-v5 envs stepped with action chunks of `chunk` actions.

    `on_nan="reset"` resets an env whose action/observation/reward goes non-finite, whose MuJoCo
    step raises, or which MuJoCo flags unstable (it then silently resets the data itself), counting
    it in the `env_faults` metric and reporting `fault=1` (and `done=1`) for that row; `on_nan="stop"`
    raises `EnvFault` naming the env.

    Reacher-v5 never terminates: episodes are truncated at `max_episode_steps`. `terminate_within=d`
    makes reaching the target a terminal state (the fingertip within distance d of it: `terminated=1`,
    the episode ends there) -- a task that terminates, for the trainers' bootstrapping rules.
    """

    seed_tag = "reacher"
    stat_metric = "episode_dist_return"

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
        terminate_within: float | None = None,
    ) -> None:
        self._init_sim(num_envs, chunk, seed, group_size, on_nan, max_episode_steps, replica, replicas)
        self.image_size = int(image_size)
        self.terminate_within = None if terminate_within is None else float(terminate_within)
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
        self.last_obs = np.zeros((self.num_envs, self.obs_dim), dtype=np.float64)  # what `resume` returns
        self._init_rows()
        self.reset(it=-1, ep=-1)  # a valid initial state even if a step comes first

    @property
    def ep_dist(self) -> np.ndarray:
        """The distance part of each row's running return (the per-episode statistic)."""
        return self.ep_stat

    # -- the EnvRowSim hooks ----------------------------------------------------------------------
    def _reset_env(self, r: int, key: int) -> np.ndarray:
        obs, _ = self.envs[r].reset(seed=key % (2**63))
        self.last_obs[r] = obs
        return obs

    def _env_step(self, r: int, action: np.ndarray) -> tuple[np.ndarray, float, float, bool]:
        obs, reward, _, _, info = self.envs[r].step(action)
        dist = float(info["reward_dist"])  # minus the fingertip's distance to the target
        terminated = self.terminate_within is not None and -dist < self.terminate_within
        return obs, float(reward), dist, terminated

    def _unstable(self, r: int) -> int:
        warnings = self.envs[r].data.warning
        return sum(int(warnings[w].number) for w in _FAULT_WARNINGS)

    def _render_into(self, images: np.ndarray | None, i: int, r: int) -> None:
        if images is not None:
            images[i] = self.envs[r].render().transpose(2, 0, 1)

    def _accepted(self, r: int, obs: np.ndarray) -> None:
        self.last_obs[r] = obs

    def _resume_obs(self, r: int) -> np.ndarray:
        """The observation the last reset or step returned: Reacher-v5's fingertip position is the one of
        the step's start (MuJoCo's kinematics run before the integration), so recomputing it would give
        another value -- and an `mj_forward` here would change the solver's warm start, and the physics."""
        return self.last_obs[r].copy()

    def _current_obs(self, r: int) -> np.ndarray:
        """Observation of row r's current state (only used to bootstrap a faulted first sub-step)."""
        env = self.envs[r]
        mujoco.mj_forward(env.model, env.data)
        obs = env._get_obs()
        return obs if np.all(np.isfinite(obs)) else np.zeros(self.obs_dim)

    def close(self) -> None:
        """Release the envs (and their GL contexts when rendering)."""
        for env in self.envs:
            env.close()
        self.envs = []

    # -- state ----------------------------------------------------------------------------------
    def get_state(self, name: str) -> dict[str, torch.Tensor]:
        self._check_name(name)
        physics = np.empty((self.num_envs, self._state_size), dtype=np.float64)
        for r, env in enumerate(self.envs):
            mujoco.mj_getState(env.model, env.data, physics[r], _STATE_SPEC)
        arrays = {"physics": physics, "last_obs": self.last_obs, **self._counters("ep_dist")}
        return {k: torch.from_numpy(v.copy()) for k, v in arrays.items()}

    def set_state(self, name: str, value: dict[str, torch.Tensor]) -> None:
        self._check_name(name)
        physics = value["physics"].to(torch.float64).numpy()
        if physics.shape != (self.num_envs, self._state_size):
            raise ValueError(f"episode state physics has shape {physics.shape}, expected "
                             f"({self.num_envs}, {self._state_size})")
        for r, env in enumerate(self.envs):
            mujoco.mj_setState(env.model, env.data, np.ascontiguousarray(physics[r]), _STATE_SPEC)
            mujoco.mj_forward(env.model, env.data)
        if "last_obs" in value:  # (a state saved before `resume` existed has none: recompute it)
            self.last_obs = value["last_obs"].numpy().astype(np.float64).copy()
        else:
            self.last_obs = np.stack([self._current_obs(r) for r in range(self.num_envs)])
        self._set_counters(value, "ep_dist")
