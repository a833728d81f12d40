"""A batched simulator over N Meta-World (v3) manipulation envs of one task, one env object per row.

This is the LIBERO-like case: CPU physics (MuJoCo 3.3.0, what `metaworld==3.1.1` pins) and, with
`image_size > 0`, camera images rendered by MuJoCo. It is interchangeable with `ReacherVecSim`: the
same calls, outputs, state object and split invariance, only obs_dim=39 and act_dim=4.

MT1 style: every row runs `task` with the goal visible in the observation (Meta-World's MT override
`partially_observable=False`), and every reset draws a new random goal/object placement. Meta-World's
own MT1 benchmark draws 50 fixed goals from the global `np.random`; here the draw is keyed instead,
so a row's future depends only on its own keys, never on how rows were batched:

* an explicit `reset(it, ep, rows)` seeds env r from (seed, it, ep, r // group_size, 0), so the
  `group_size` envs of a GRPO group start from the same goal and state;
* an automatic reset after `max_episode_steps` (or a numeric fault) seeds it from
  (seed, it, ep of the last explicit reset, r // group_size, n), n = episodes since that reset.

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

import math
import os
from typing import Any

import mujoco
import numpy as np
import torch

from .determinism import derive_seed, resolve_rows

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


class EnvFault(FloatingPointError):
    """An environment's physics went non-finite or unstable (raised with on_nan="stop")."""


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


class MetaWorldVecSim:
    """`num_envs` Meta-World envs of `task` stepped with action chunks of `chunk` actions.

    `on_nan="reset"` resets an env whose action/observation/reward goes non-finite, whose MuJoCo
    step raises, or which MuJoCo flags unstable, counting it in `env_faults` and reporting `done=1`
    for that row; `on_nan="stop"` raises `EnvFault` naming the env. `camera` names a camera of
    Meta-World's scene ("corner", "corner2", "corner3", "topview", "gripperPOV", ...); its corner
    cameras come out of gymnasium's renderer upside down, so `flip=True` turns frames upright.
    With several rendering sims in one process, `close()` the ones you drop (a garbage-collected
    sim's GL contexts can blank the next sim's frames under OSMesa).
    """

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
        if on_nan not in ("reset", "stop"):
            raise ValueError(f"on_nan must be 'reset' or 'stop', got {on_nan!r}")
        if num_envs < 1 or chunk < 1 or group_size < 1 or max_episode_steps < 1:
            raise ValueError("num_envs, chunk, group_size and max_episode_steps must be >= 1")
        if num_envs % group_size:
            raise ValueError(f"num_envs={num_envs} must be a multiple of group_size={group_size}")
        self.num_envs, self.chunk, self.seed, self.task = int(num_envs), int(chunk), int(seed), task
        self.group_size, self.on_nan, self.max_episode_steps = int(group_size), on_nan, int(max_episode_steps)
        self.image_size, self.flip = int(image_size), bool(flip)
        # several simulator processes (replicas): this one's envs are the global rows
        # [row_offset, row_offset + num_envs), and every key uses the global row
        if not 0 <= int(replica) < int(replicas):
            raise ValueError(f"replica {replica} of {replicas} is out of range")
        self.row_offset = int(replica) * self.num_envs
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
        self.steps = np.zeros(n, dtype=np.int64)  # env steps in the current episode
        self.ep_return = np.zeros(n, dtype=np.float64)
        self.ep_success = np.zeros(n, dtype=np.float64)  # 1 once info["success"] was seen this episode
        self.origin = np.zeros((n, 2), dtype=np.int64)  # (it, ep) of the last explicit reset
        self.count = np.zeros(n, dtype=np.int64)  # episodes since that reset
        self._finished: list[tuple[float, float]] = []  # (return, success) of finished episodes
        self._faults = 0
        self._env_steps = 0
        self.reset(it=-1, ep=-1)  # a valid initial state even if a step comes first

    # -- resets ---------------------------------------------------------------------------------
    def _reset_row(self, r: int) -> np.ndarray:
        """Reset env r with a goal drawn from its keys (origin, group, episode count)."""
        it, ep = (int(v) for v in self.origin[r])
        env = self.envs[r]
        env.np_random = np.random.default_rng(
            derive_seed("metaworld", self.seed, it, ep, (self.row_offset + r) // self.group_size, int(self.count[r])))
        env.seeded_rand_vec, env._freeze_rand_vec = True, False  # draw from env.np_random ...
        obs, _ = env.reset()
        env._freeze_rand_vec = True  # ... then keep that layout (what set_state replays)
        self.rand_vec[r] = env._last_rand_vec
        self.steps[r], self.ep_return[r], self.ep_success[r] = 0, 0.0, 0.0
        self.last_obs[r] = obs
        return obs

    def reset(self, it: int, ep: int, rows: slice | None = None) -> dict[str, Any]:
        """Refresh the episodes of `rows` (global row slice; None = all): obs `[n, 39]` float32."""
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
        """One env step of row r: (obs, reward, success) or a string describing the fault."""
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
        return obs, float(reward), float(info["success"])

    def step(self, action: torch.Tensor, rows: slice | None = None) -> dict[str, Any]:
        """Execute the action chunk `[n, chunk, 4]` (xyz hand delta, gripper) of each row in turn.

        Returns obs `[n, 39]` (after an automatic reset for rows whose episode ended), reward `[n]`
        (sum over the executed sub-steps), done `[n]` (1.0 if the episode ended during the chunk; the
        rest of that chunk is dropped) and final_obs `[n, 39]` (the ended episode's last observation,
        equal to obs for rows that did not end), which a trainer bootstraps truncations from.
        """
        selected = resolve_rows(rows, self.num_envs)
        act = action.detach().to("cpu", torch.float64).numpy()
        if act.shape != (len(selected), self.chunk, self.act_dim):
            raise ValueError(f"MetaWorldVecSim.step: action shape {tuple(act.shape)} != "
                             f"({len(selected)}, {self.chunk}, {self.act_dim}) for rows={rows}")
        obs_out = np.empty((len(selected), self.obs_dim), dtype=np.float64)
        final_out = np.empty_like(obs_out)
        reward_out = np.zeros(len(selected), dtype=np.float64)
        done_out = np.zeros(len(selected), dtype=np.float64)
        images, final_images = self._image_buffer(len(selected)), self._image_buffer(len(selected))
        for i, r in enumerate(selected):
            for j in range(self.chunk):
                result = self._substep(r, act[i, j])
                if isinstance(result, str):
                    if self.on_nan == "stop":
                        raise EnvFault(f"MetaWorldVecSim: env {r} ({self.task}) faulted at episode step "
                                       f"{self.steps[r]}: {result}")
                    self._render_into(final_images, i, r)
                    self._faults += 1
                    final_out[i] = self.last_obs[r]
                    self._end_episode(r, record=False)
                    done_out[i] = 1.0
                    break
                obs, reward, success = result
                self.last_obs[r] = obs
                reward_out[i] += reward
                self.ep_return[r] += reward
                self.ep_success[r] = max(self.ep_success[r], success)
                self.steps[r] += 1
                self._env_steps += 1
                if self.steps[r] >= self.max_episode_steps:
                    self._render_into(final_images, i, r)
                    final_out[i] = obs
                    self._end_episode(r, record=True)
                    done_out[i] = 1.0
                    break
            self._render_into(images, i, r)
            obs_out[i] = self.last_obs[r]
            if not done_out[i]:
                final_out[i] = obs_out[i]
                if images is not None and final_images is not None:
                    final_images[i] = images[i]
        return {
            "obs": self._obs(obs_out, images),
            "reward": torch.from_numpy(reward_out).float(),
            "done": torch.from_numpy(done_out).float(),
            "final_obs": self._obs(final_out, final_images),
        }

    def _end_episode(self, r: int, record: bool) -> None:
        if record:
            self._finished.append((float(self.ep_return[r]), float(self.ep_success[r])))
        self.count[r] += 1
        self._reset_row(r)

    # -- camera ---------------------------------------------------------------------------------
    def _image_buffer(self, n: int) -> np.ndarray | None:
        return np.zeros((n, 3, self.image_size, self.image_size), dtype=np.uint8) if self.image_size else None

    def _render_into(self, images: np.ndarray | None, i: int, r: int) -> None:
        if images is not None:
            env = self.envs[r]
            # Every env owns a GL context and gymnasium makes it current only when it is created.
            viewer = env.mujoco_renderer._get_viewer("rgb_array")
            viewer.make_context_current()
            frame = env.render()
            _release_egl(viewer.opengl_context)
            images[i] = (frame[::-1] if self.flip else frame).transpose(2, 0, 1)

    @staticmethod
    def _obs(state: np.ndarray, images: np.ndarray | None) -> Any:
        tensor = torch.from_numpy(state).float()
        return tensor if images is None else {"state": tensor, "image": torch.from_numpy(images)}

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
                  "steps": self.steps, "ep_return": self.ep_return, "ep_success": self.ep_success,
                  "origin": self.origin, "count": self.count}
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
        self.steps = value["steps"].numpy().astype(np.int64).copy()
        self.ep_return = value["ep_return"].numpy().astype(np.float64).copy()
        self.ep_success = value["ep_success"].numpy().astype(np.float64).copy()
        self.origin = value["origin"].numpy().astype(np.int64).copy()
        self.count = value["count"].numpy().astype(np.int64).copy()
        for r, env in enumerate(self.envs):
            env.curr_path_length = int(self.steps[r])

    @property
    def episode(self) -> dict[str, torch.Tensor]:
        return self.get_state("episode")

    @episode.setter
    def episode(self, value: dict[str, torch.Tensor]) -> None:
        self.set_state("episode", value)

    @staticmethod
    def _check_name(name: str) -> None:
        if name != "episode":
            raise KeyError(f"MetaWorldVecSim has no state object {name!r} (it owns 'episode')")

    # -- metrics --------------------------------------------------------------------------------
    def pop_metrics(self) -> dict[str, float]:
        """Mean return and success rate of the episodes finished since the last call (fsum: independent
        of the order in which row groups finished), their count, env faults and env steps."""
        metrics: dict[str, float] = {"episodes": float(len(self._finished)), "env_faults": float(self._faults),
                                     "env_steps": float(self._env_steps)}
        if self._finished:
            metrics["episode_return"] = math.fsum(f[0] for f in self._finished) / len(self._finished)
            metrics["success_rate"] = math.fsum(f[1] for f in self._finished) / len(self._finished)
        self._finished, self._faults, self._env_steps = [], 0, 0
        return metrics
