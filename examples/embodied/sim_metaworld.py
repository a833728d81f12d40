"""A batched simulator over N Meta-World (v3) manipulation envs of one task, one env object per row.

This is the LIBERO-like case: CPU physics (MuJoCo 3.3.0, what `metaworld==3.1.1` pins) and, with
`image_size > 0`, camera images rendered by MuJoCo. It is interchangeable with `ReacherVecSim`: the
same calls, outputs, state object and split invariance, only obs_dim=39 and act_dim=4.

MT1 style: every row runs `task` with the goal visible in the observation (Meta-World's MT override
`partially_observable=False`), and every reset draws a new random goal/object placement. Meta-World's
own MT1 benchmark draws 50 fixed goals from the global `np.random`; here the draw is keyed instead,
so a row's future depends only on its own keys, never on how rows were batched:

* an explicit `reset(it, ep, rows)` seeds env r from (seed, it, ep, global r // group_size, 0), so the
  `group_size` envs of a GRPO group start from the same goal and state;
* an automatic reset after `max_episode_steps` (or a numeric fault) seeds it from
  (seed, it, ep of the last explicit reset, global r // group_size, n), n = episodes since that reset
  (the stepping, keys, faults and end-of-episode flags are `sim_base.EnvRowSim`'s).

State object `episode`: MuJoCo's integration state (`mj_getState`: time, qpos, qvel, act, warm start,
ctrl, mocap pose, ...) plus the task's random vector `rand_vec` (goal and object placement). Meta-World
keeps task layout partly outside `mjData` (the goal site in `mjModel`, moved bodies, `_target_pos`,
`init_tcp`, ...), all derived from `rand_vec` in `reset_model`; restoring therefore replays the reset
with the saved `rand_vec` frozen and then overwrites the physics, so a restored env continues bit for
bit (tested). Per-row counters, accumulators, the previous observation (Meta-World stacks it into
the next one) and the reset keys complete the state; everything is a tensor.

Episodes never terminate (Meta-World has no terminal states); they are truncated at
`max_episode_steps` and `success_rate` counts an episode as solved if `info["success"]` was 1 at any
step (Meta-World's evaluation convention).

Rendering (`image_size > 0`): through gymnasium's offscreen renderer, which reads `MUJOCO_GL` when the
first frame is drawn. `gl=None` keeps the environment's value or defaults to "egl" (headless, needs
a GPU/EGL device); on a CPU-only machine pass `gl="osmesa"` (Debian: `apt-get install libosmesa6`).
One process can use only one backend.
"""

from __future__ import annotations

import os
from typing import Any

import mujoco
import numpy as np
import torch

from .sim_base import EnvFault, EnvRowSim

__all__ = ["EnvFault", "MetaWorldVecSim"]

try:  # optional dependency: `pip install metaworld==3.1.1` (pins mujoco==3.3.0)
    from metaworld.env_dict import ALL_V3_ENVIRONMENTS, ML1_ARGS_KWARGS
except ImportError as exc:  # pragma: no cover - exercised only without metaworld
    ALL_V3_ENVIRONMENTS, ML1_ARGS_KWARGS = None, None
    _IMPORT_ERROR: ImportError | None = exc
else:
    _IMPORT_ERROR = None

_FAULT_WARNINGS = (
    mujoco.mjtWarning.mjWARN_BADQPOS,
    mujoco.mjtWarning.mjWARN_BADQVEL,
    mujoco.mjtWarning.mjWARN_BADQACC,
    mujoco.mjtWarning.mjWARN_BADCTRL,
)
_STATE_SPEC = mujoco.mjtState.mjSTATE_INTEGRATION
_PREV = 18  # Meta-World observations are [current 18, previous 18, goal 3]


def _release_egl(context: Any) -> None:
    """Leave no EGL context current in this thread: an EGL context is current in one thread at a time,
    and a Ray actor may construct the sim in one thread and call it from another (EGL_BAD_ACCESS)."""
    if type(context).__module__ != "mujoco.egl":
        return
    import mujoco.egl
    from OpenGL import EGL

    EGL.eglMakeCurrent(mujoco.egl.EGL_DISPLAY, EGL.EGL_NO_SURFACE, EGL.EGL_NO_SURFACE, EGL.EGL_NO_CONTEXT)


def _make_env(task: str, image_size: int, camera: str) -> Any:
    """One Meta-World env of `task`, set up as MT1 does (task kwargs, goal in the observation)."""
    render: dict[str, Any] = {}
    if image_size:
        render = {"render_mode": "rgb_array", "camera_name": camera, "width": image_size, "height": image_size}
    env = ALL_V3_ENVIRONMENTS[task](**render)
    kwargs = {k: v for k, v in ML1_ARGS_KWARGS[task]["kwargs"].items() if k != "task_id"}
    env._set_task_inner(**kwargs)
    env._set_task_called = True
    env._partially_observable = False
    env.__dict__.pop("sawyer_observation_space", None)  # a cached_property sized for the old setting
    return env


class MetaWorldVecSim(EnvRowSim):
    """`num_envs` Meta-World envs of `task` stepped with action chunks of `chunk` actions.

    `on_nan="reset"` resets an env whose action/observation/reward goes non-finite, whose MuJoCo
    step raises, or which MuJoCo flags unstable, counting it in `env_faults` and reporting `fault=1`
    (and `done=1`) for that row; `on_nan="stop"` raises `EnvFault` naming the env. `camera` names a
    camera of Meta-World's scene ("corner", "corner2", "corner3", "topview", "gripperPOV", ...); its
    corner cameras come out of gymnasium's renderer upside down, so `flip=True` turns frames upright.
    With several rendering sims in one process, `close()` the ones you drop (a garbage-collected
    sim's GL contexts can blank the next sim's frames under OSMesa). Several simulator processes
    (`replicas`) each own `num_envs` rows of the global batch and key them by global row.
    """

    seed_tag = "metaworld"
    stat_metric = "success_rate"
    stat_reduce = "max"  # an episode is solved if info["success"] was 1 at any step

    def __init__(
        self,
        num_envs: int,
        chunk: int,
        task: str = "reach-v3",
        seed: int = 0,
        group_size: int = 1,
        max_episode_steps: int = 100,
        image_size: int = 0,
        on_nan: str = "reset",
        camera: str = "corner2",
        gl: str | None = None,
        flip: bool = True,
        replica: int = 0,
        replicas: int = 1,
    ) -> None:
        if ALL_V3_ENVIRONMENTS is None:
            raise ImportError("MetaWorldVecSim needs `pip install metaworld==3.1.1`") from _IMPORT_ERROR
        if task not in ALL_V3_ENVIRONMENTS:
            raise ValueError(f"unknown Meta-World task {task!r}; one of {sorted(ALL_V3_ENVIRONMENTS)}")
        self._init_sim(num_envs, chunk, seed, group_size, on_nan, max_episode_steps, replica, replicas)
        self.task, self.image_size, self.flip = task, int(image_size), bool(flip)
        if self.image_size:
            if gl is not None:
                os.environ["MUJOCO_GL"] = gl
            os.environ.setdefault("MUJOCO_GL", "egl")
        self.envs = [_make_env(task, self.image_size, camera) for _ in range(self.num_envs)]
        for env in self.envs:  # Meta-World refuses steps past its own 500-step limit
            env.max_path_length = max(env.max_path_length, self.max_episode_steps)
        env0 = self.envs[0]
        self.act_low = env0.action_space.low.astype(np.float64)
        self.act_high = env0.action_space.high.astype(np.float64)
        self.act_dim = int(env0.action_space.shape[0])
        self.obs_dim = int(env0.sawyer_observation_space.shape[0])
        self._state_size = mujoco.mj_stateSize(env0.model, _STATE_SPEC)
        self._rand_size = int(env0._random_reset_space.low.size)
        n = self.num_envs
        self.rand_vec = np.zeros((n, self._rand_size), dtype=np.float64)  # task layout of each env
        self.last_obs = np.zeros((n, self.obs_dim), dtype=np.float64)
        self._init_rows()
        self.reset(it=-1, ep=-1)  # a valid initial state even if a step comes first

    @property
    def ep_success(self) -> np.ndarray:
        """1 for rows whose current episode has seen info["success"] (the per-episode statistic)."""
        return self.ep_stat

    # -- the EnvRowSim hooks ----------------------------------------------------------------------
    def _reset_env(self, r: int, key: int) -> np.ndarray:
        """Reset env r with a goal drawn from its key."""
        env = self.envs[r]
        env.np_random = np.random.default_rng(key)
        env.seeded_rand_vec, env._freeze_rand_vec = True, False  # draw from env.np_random ...
        obs, _ = env.reset()
        env._freeze_rand_vec = True  # ... then keep that layout (what set_state replays)
        self.rand_vec[r] = env._last_rand_vec
        self.last_obs[r] = obs
        return obs

    def _env_step(self, r: int, action: np.ndarray) -> tuple[np.ndarray, float, float, bool]:
        obs, reward, _, _, info = self.envs[r].step(action)
        return obs, float(reward), float(info["success"]), False  # Meta-World has no terminal states

    def _unstable(self, r: int) -> int:
        warnings = self.envs[r].data.warning
        return sum(int(warnings[w].number) for w in _FAULT_WARNINGS)

    def _accepted(self, r: int, obs: np.ndarray) -> None:
        self.last_obs[r] = obs  # Meta-World stacks it into the next observation; part of the state

    def _current_obs(self, r: int) -> np.ndarray:
        return self.last_obs[r].copy()

    def _describe(self, r: int) -> str:
        return f"env {r} ({self.task})"

    # -- camera ---------------------------------------------------------------------------------
    def _render_into(self, images: np.ndarray | None, i: int, r: int) -> None:
        if images is not None:
            env = self.envs[r]
            # Every env owns a GL context and gymnasium makes it current only when it is created.
            viewer = env.mujoco_renderer._get_viewer("rgb_array")
            viewer.make_context_current()
            frame = env.render()
            _release_egl(viewer.opengl_context)
            images[i] = (frame[::-1] if self.flip else frame).transpose(2, 0, 1)

    def close(self) -> None:
        """Release the envs (and their GL contexts when rendering)."""
        for env in self.envs:
            env.close()
        self.envs = []

    # -- state ----------------------------------------------------------------------------------
    def get_state(self, name: str) -> dict[str, torch.Tensor]:
        self._check_name(name)
        physics = np.empty((self.num_envs, self._state_size), dtype=np.float64)
        prev = np.empty((self.num_envs, _PREV), dtype=np.float64)
        for r, env in enumerate(self.envs):
            mujoco.mj_getState(env.model, env.data, physics[r], _STATE_SPEC)
            prev[r] = env._prev_obs
        arrays = {"physics": physics, "prev_obs": prev, "rand_vec": self.rand_vec, "last_obs": self.last_obs,
                  **self._counters("ep_success")}
        return {k: torch.from_numpy(v.copy()) for k, v in arrays.items()}

    def set_state(self, name: str, value: dict[str, torch.Tensor]) -> None:
        self._check_name(name)
        physics = value["physics"].to(torch.float64).numpy()
        if physics.shape != (self.num_envs, self._state_size):
            raise ValueError(f"episode state physics has shape {tuple(physics.shape)}, expected "
                             f"({self.num_envs}, {self._state_size})")
        self.rand_vec = value["rand_vec"].numpy().astype(np.float64).copy()
        prev = value["prev_obs"].numpy().astype(np.float64)
        for r, env in enumerate(self.envs):
            env._last_rand_vec, env._freeze_rand_vec = self.rand_vec[r].copy(), True
            env.reset()  # re-derives the task layout (model sites/bodies, targets) from rand_vec
            saved = np.ascontiguousarray(physics[r])
            mujoco.mj_setState(env.model, env.data, saved, _STATE_SPEC)
            mujoco.mj_forward(env.model, env.data)  # positions/sites for observations and rendering
            mujoco.mj_setState(env.model, env.data, saved, _STATE_SPEC)  # forward rewrote the warm start
            env._prev_obs = prev[r].copy()
        self.last_obs = value["last_obs"].numpy().astype(np.float64).copy()
        self._set_counters(value, "ep_success")
        for r, env in enumerate(self.envs):
            env.curr_path_length = int(self.steps[r])
