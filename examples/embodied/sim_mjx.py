"""A batched 2-link planar reach task on MJX (MuJoCo's JAX backend): the GPU-physics counterpart of
`sim_reacher.ReacherVecSim`, with the same calls, outputs and 10-dim observation, so the same
`FlowPolicy` / `PPOTrainer` configs run against either.

Environment: it needs mujoco>=3.17 + mujoco-mjx + jax, which conflict with the project's pinned
mujoco 3.3.0, so it runs in its own import path (the workflow component's `python_path:`; see
`workflows/embodied_ppo_mjx.yaml` and `benchmarks/mjx_env.sh`). JAX preallocates 75% of GPU memory
by default; the module sets `XLA_PYTHON_CLIENT_PREALLOCATE=false` (if unset) before importing JAX,
because the policy and trainer processes share the GPU.

Physics: the arm of gymnasium's Reacher (two 0.1 m links, gear-200 motors, armature/damping 1,
RK4 at dt=0.01, `frame_skip`=2 per env step), written here without the target joints: the target is
per-env data. One env step = `frame_skip` x `mjx.step` then `mjx.kinematics`, so the fingertip in the
observation belongs to the new state. The task: obs = cos q, sin q, target xy, qdot, fingertip -
target (xy); reward = -|fingertip - target| - |clip(a)|^2; episodes truncated at 50 steps.

Split invariance (docs/components.md) holds bit for bit on the CPU because
* randomness is keyed, never stateful: env r's reset draws from the threefry key
  derive_seed(seed, it, ep, r // group_size) folded with n, the episodes since that explicit reset;
* the row-wise math runs at a fixed shape aligned to global rows: rows are stepped in blocks of
  `row_block` rows starting at multiples of `row_block` (storage is padded to a whole number of
  blocks; rows of a block outside the call are computed but not written back). XLA may vectorize a
  program differently for another batch size, so the same shape is what makes the bits the same; it
  also means one compilation (~20 s on a CPU) per (row_block, chunk, frame_skip), shared by all
  instances (the model is a jit argument, not a closure).
  On CUDA blocking is off by default (`row_block="auto"`): the contract promises bit-identity on the
  CPU only, and a group then costs only its own rows.

State object `episode`: the MuJoCo integration state of every env as `mjx.get_state(...,
mjSTATE_INTEGRATION)` rows (time, qpos, qvel, warm start, ctrl, ...) plus targets, step counters,
return accumulators, episode counters and reset keys -- all torch CPU tensors. The batched mjx.Data
exists only inside the compiled programs, rebuilt from that state with `mjx.set_state`: its other
~80 arrays are derived ones that `mjx.step` recomputes, so keeping only the integration state keeps
snapshots, row gathers and write-backs small, and a restored state continues bit for bit.
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
from typing import Any

import numpy as np
import torch

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # must precede the first JAX import

import jax
import jax.numpy as jnp
import mujoco

with contextlib.redirect_stdout(io.StringIO()):  # MJX prints to stdout when its optional Warp backend is absent
    from mujoco import mjx

from .determinism import derive_seed, resolve_rows
from .sim_base import EnvFault, SimBase

__all__ = ["EnvFault", "ReacherMjxSim"]

# iterations/ls_iterations: MJX's solver loops until a tolerance that float32 rarely meets, so the
# defaults (100/50) ran ~2.3x slower; Newton converges within a few iterations on this 2-dof arm.
_XML = """
<mujoco model="planar_reacher">
  <compiler angle="radian" inertiafromgeom="true"/>
  <option timestep="0.01" integrator="RK4" iterations="4" ls_iterations="8"><flag contact="disable"/></option>
  <default><joint armature="1" damping="1"/><geom contype="0" conaffinity="0"/></default>
  <worldbody>
    <body name="upper" pos="0 0 .01">
      <joint name="shoulder" type="hinge" axis="0 0 1"/>
      <geom type="capsule" fromto="0 0 0 .1 0 0" size=".01"/>
      <body name="lower" pos=".1 0 0">
        <joint name="elbow" type="hinge" axis="0 0 1" limited="true" range="-3 3"/>
        <geom type="capsule" fromto="0 0 0 .1 0 0" size=".01"/>
        <body name="fingertip" pos=".11 0 0"><geom type="sphere" size=".01"/></body>
      </body>
    </body>
  </worldbody>
  <actuator>
    <motor joint="shoulder" gear="200" ctrllimited="true" ctrlrange="-1 1"/>
    <motor joint="elbow" gear="200" ctrllimited="true" ctrlrange="-1 1"/>
  </actuator>
</mujoco>
"""
_MODEL = mujoco.MjModel.from_xml_string(_XML)
_TIP = _MODEL.body("fingertip").id
_SPEC = mujoco.mjtState.mjSTATE_INTEGRATION
OBS_DIM, ACT_DIM = 10, 2
_MAXVAL = 1e10  # MuJoCo's mjMAXVAL: mj_checkPos/Vel/Acc call a state beyond it diverged
_CPU_BLOCK = 64

Row = dict[str, jax.Array]


# -- per-row physics (vmapped; m and d0 are shared, unbatched) ----------------------------------
def _observe(d: mjx.Data, target: jax.Array) -> jax.Array:
    """Reacher-v5's 10-dim observation of a kinematics-consistent `d`."""
    q = d.qpos
    return jnp.concatenate([jnp.cos(q), jnp.sin(q), target, d.qvel, d.xpos[_TIP, :2] - target])


def _fresh(m: mjx.Model, d0: mjx.Data, key: jax.Array, count: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Reset state for episode `count` of a row with reset key `key` (uint32[2]): Reacher-v5's
    distribution (joints +-0.1 rad, speeds +-0.005, target uniform in the 0.2 m disc)."""
    k = jax.random.fold_in(jax.random.wrap_key_data(key, impl="threefry2x32"), count)
    kq, kv, kr, ka = jax.random.split(k, 4)
    qpos = jax.random.uniform(kq, (2,), jnp.float32, -0.1, 0.1)
    qvel = jax.random.uniform(kv, (2,), jnp.float32, -0.005, 0.005)
    radius = 0.2 * jnp.sqrt(jax.random.uniform(kr, (), jnp.float32))
    angle = 2 * jnp.pi * jax.random.uniform(ka, (), jnp.float32)
    target = radius * jnp.stack([jnp.cos(angle), jnp.sin(angle)])
    d = mjx.kinematics(m, d0.replace(qpos=qpos, qvel=qvel))
    return mjx.get_state(m, d, _SPEC), target, _observe(d, target)


def _reset_row(m: mjx.Model, d0: mjx.Data, row: Row, key: jax.Array) -> tuple[Row, jax.Array]:
    physics, target, obs = _fresh(m, d0, key, jnp.int32(0))
    zero = jnp.zeros((), jnp.float32)
    return dict(physics=physics, target=target, steps=jnp.int32(0), ep_return=zero, ep_dist=zero,
                count=jnp.int32(0), key=key, obs=obs), obs


def _chunk_row(m: mjx.Model, d0: mjx.Data, row: Row, actions: jax.Array, max_steps: jax.Array,
               frame_skip: int) -> tuple[Row, dict[str, jax.Array]]:
    """Execute one row's action chunk `[chunk, 2]` in turn; a sub-step after the episode ended
    (truncation or fault) is masked out, and the ended episode is reset after the chunk."""
    def sub(carry: dict[str, jax.Array], a: jax.Array) -> tuple[dict[str, jax.Array], None]:
        c = dict(carry)
        finite_a = jnp.all(jnp.isfinite(a))
        a = jnp.where(finite_a, jnp.clip(a, -1.0, 1.0), 0.0)
        d = mjx.set_state(m, d0, c["physics"], _SPEC).replace(ctrl=a)
        d = jax.lax.fori_loop(0, frame_skip, lambda _, x: mjx.step(m, x), d)
        d = mjx.kinematics(m, d)
        physics, obs = mjx.get_state(m, d, _SPEC), _observe(d, row["target"])
        dist = -jnp.linalg.norm(obs[8:])
        reward = dist - jnp.sum(a * a)
        sane = jnp.all(jnp.isfinite(physics) & (jnp.abs(physics) < _MAXVAL)) & jnp.all(jnp.isfinite(obs))
        ok = c["alive"] & finite_a & sane & jnp.isfinite(reward)
        fault = c["alive"] & ~ok
        c["physics"] = jnp.where(ok, physics, c["physics"])
        c["steps"] = c["steps"] + ok
        c["executed"] = c["executed"] + ok
        c["reward"] = c["reward"] + jnp.where(ok, reward, 0.0)
        c["ep_return"] = c["ep_return"] + jnp.where(ok, reward, 0.0)
        c["ep_dist"] = c["ep_dist"] + jnp.where(ok, dist, 0.0)
        truncated = ok & (c["steps"] >= max_steps)
        c["final_obs"] = jnp.where(truncated, obs, jnp.where(fault, c["last_obs"], c["final_obs"]))
        c["last_obs"] = jnp.where(ok, obs, c["last_obs"])
        c["fault"] = c["fault"] | fault
        c["recorded"] = c["recorded"] | truncated
        c["alive"] = ok & ~truncated
        return c, None

    start_obs = _observe(mjx.kinematics(m, mjx.set_state(m, d0, row["physics"], _SPEC)), row["target"])
    start_obs = jnp.where(jnp.all(jnp.isfinite(start_obs)), start_obs, 0.0)
    f32, false = jnp.zeros((), jnp.float32), jnp.zeros((), bool)
    init = dict(physics=row["physics"], steps=row["steps"], ep_return=row["ep_return"], ep_dist=row["ep_dist"],
                alive=jnp.ones((), bool), executed=jnp.int32(0), reward=f32, final_obs=start_obs,
                last_obs=start_obs, fault=false, recorded=false)
    c, _ = jax.lax.scan(sub, init, actions)
    ended = ~c["alive"]
    count = row["count"] + ended
    physics, target, obs = _fresh(m, d0, row["key"], count)
    pick = lambda new, old: jnp.where(ended, new, old)  # noqa: E731
    new_row = dict(physics=pick(physics, c["physics"]), target=pick(target, row["target"]),
                   steps=pick(jnp.int32(0), c["steps"]), ep_return=pick(f32, c["ep_return"]),
                   ep_dist=pick(f32, c["ep_dist"]), count=count, key=row["key"], obs=pick(obs, c["last_obs"]))
    out = dict(obs=new_row["obs"], final_obs=pick(c["final_obs"], c["last_obs"]), reward=c["reward"],
               done=ended.astype(jnp.float32), recorded=c["recorded"], ep_return=c["ep_return"],
               ep_dist=c["ep_dist"], fault=c["fault"], fault_step=c["steps"], executed=c["executed"])
    return new_row, out


# -- block programs: one fixed-shape block of rows [lo, lo + B) of the full state ---------------------
def _block_apply(row_fn: Any, state: Row, lo: jax.Array, mask: jax.Array, per_row: jax.Array) -> tuple[Row, Any]:
    size = per_row.shape[0]
    block = {k: jax.lax.dynamic_slice_in_dim(v, lo, size) for k, v in state.items()}
    new, out = jax.vmap(row_fn)(block, per_row)
    keep = {k: jnp.where(mask.reshape((size,) + (1,) * (v.ndim - 1)), v, block[k]) for k, v in new.items()}
    return {k: jax.lax.dynamic_update_slice_in_dim(state[k], keep[k], lo, 0) for k in state}, out


@jax.jit
def _reset_block(m: mjx.Model, d0: mjx.Data, state: Row, lo: jax.Array, mask: jax.Array,
                 keys: jax.Array) -> tuple[Row, jax.Array]:
    return _block_apply(lambda row, key: _reset_row(m, d0, row, key), state, lo, mask, keys)


@functools.partial(jax.jit, static_argnames=("frame_skip",))
def _step_block(m: mjx.Model, d0: mjx.Data, state: Row, lo: jax.Array, mask: jax.Array, actions: jax.Array,
                max_steps: jax.Array, frame_skip: int) -> tuple[Row, dict[str, jax.Array]]:
    return _block_apply(lambda row, a: _chunk_row(m, d0, row, a, max_steps, frame_skip), state, lo, mask, actions)


@jax.jit
def _observe_rows(m: mjx.Model, d0: mjx.Data, physics: jax.Array, target: jax.Array) -> jax.Array:
    """Each row's observation recomputed from its saved physics (for a state saved before the episode state
    held the observation); it can differ from what the step returned in the last bit."""
    return jax.vmap(lambda p, t: _observe(mjx.kinematics(m, mjx.set_state(m, d0, p, _SPEC)), t))(physics, target)


def _jax_device(device: str) -> jax.Device:
    """The JAX device for rose's torch device string ("cpu", "cuda", "cuda:1"; "gpu" accepted)."""
    kind, _, index = device.partition(":")
    if kind == "cpu":
        return jax.devices("cpu")[0]
    if kind not in ("cuda", "gpu"):
        raise ValueError(f"ReacherMjxSim: unknown device {device!r} (expected cpu, cuda or cuda:N)")
    try:
        gpus = jax.devices("gpu")
    except RuntimeError as exc:
        raise RuntimeError(f"ReacherMjxSim: device={device!r} but this JAX has no GPU backend "
                           f"(jax {jax.__version__}, devices {jax.devices()}); install jax with CUDA") from exc
    if int(index or 0) >= len(gpus):
        raise ValueError(f"ReacherMjxSim: device={device!r} but JAX sees {len(gpus)} GPU(s): {gpus}")
    return gpus[int(index or 0)]


def _torch(x: jax.Array | np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.array(x))  # a host copy: jax buffers are read-only


class ReacherMjxSim(SimBase):
    """`num_envs` planar reachers on MJX stepped with action chunks of `chunk` actions.

    `on_nan="reset"` resets an env whose action, observation, reward or physics state goes
    non-finite (or beyond MuJoCo's 1e10 sanity bound), counts it in the `env_faults` metric and
    reports `fault=1` (and `done=1`) for it; `on_nan="stop"` raises `EnvFault` naming the env and leaves
    the state as it was before the call. `row_block`: see the module docstring ("auto": 64 on the CPU,
    off on GPU). The reach task never terminates: episodes are truncated at `max_episode_steps`.
    """

    stat_metric = "episode_dist_return"

    def __init__(self, num_envs: int, chunk: int, seed: int = 0, group_size: int = 1, max_episode_steps: int = 50,
                 device: str = "cpu", on_nan: str = "reset", frame_skip: int = 2,
                 row_block: int | str | None = "auto") -> None:
        self._init_sim(num_envs, chunk, seed, group_size, on_nan, max_episode_steps)
        if frame_skip < 1:
            raise ValueError(f"frame_skip must be >= 1, got {frame_skip}")
        self.frame_skip = int(frame_skip)
        self.obs_dim, self.act_dim = OBS_DIM, ACT_DIM
        self.device = _jax_device(device)
        if row_block == "auto":
            row_block = min(_CPU_BLOCK, self.num_envs) if self.device.platform == "cpu" else None
        self.row_block: int | None = None if row_block is None else int(row_block)
        if self.row_block is not None and self.row_block < 1:
            raise ValueError(f"row_block must be >= 1, None or 'auto', got {row_block!r}")
        padded = self.num_envs if self.row_block is None else -(-self.num_envs // self.row_block) * self.row_block
        put = self._put
        self._m = mjx.put_model(_MODEL, device=self.device, impl="jax")
        self._d0 = mjx.make_data(self._m, device=self.device, impl="jax")
        width = int(mjx.get_state(self._m, self._d0, _SPEC).shape[0])
        self._state: Row = {
            "physics": put(np.zeros((padded, width), np.float32)), "target": put(np.zeros((padded, 2), np.float32)),
            "steps": put(np.zeros(padded, np.int32)), "ep_return": put(np.zeros(padded, np.float32)),
            "ep_dist": put(np.zeros(padded, np.float32)), "count": put(np.zeros(padded, np.int32)),
            "key": put(np.zeros((padded, 2), np.uint32)),
            "obs": put(np.zeros((padded, OBS_DIM), np.float32)),  # what the last reset or step returned (`resume`)
        }
        self._max_steps = put(np.int32(self.max_episode_steps))
        self._reset_rows(range(padded), -1, -1)  # a valid state (padding rows too) even if a step comes first

    # -- blocks ---------------------------------------------------------------------------------
    def _put(self, x: np.ndarray | np.generic) -> jax.Array:
        return jax.device_put(x, self.device)

    def _blocks(self, selected: range) -> list[tuple[int, int]]:
        """(lo, size) of the fixed-shape programs covering `selected` (one exact block if unblocked)."""
        if self.row_block is None:
            return [(selected.start, len(selected))] if len(selected) else []
        b = self.row_block
        return [(lo, b) for lo in range(selected.start // b * b, selected.stop, b)]

    def _run(self, fn: Any, selected: range, per_row: np.ndarray, *extra: Any) -> tuple[Row, list[dict[str, np.ndarray]]]:
        """Apply a block program to `selected`; per_row holds the selected rows' inputs. Returns the
        new full state (not yet committed) and the outputs of the selected rows, block by block."""
        state, outs = self._state, []
        for lo, size in self._blocks(selected):
            a, b = max(lo, selected.start), min(lo + size, selected.stop)
            mask = np.zeros(size, bool)
            mask[a - lo : b - lo] = True
            inputs = np.zeros((size, *per_row.shape[1:]), per_row.dtype)
            inputs[a - lo : b - lo] = per_row[a - selected.start : b - selected.start]
            state, out = fn(self._m, self._d0, state, self._put(np.int32(lo)), self._put(mask), self._put(inputs), *extra)
            outs.append(jax.tree.map(lambda x, i=a - lo, j=b - lo: np.asarray(x)[i:j], out))
        return state, outs

    # -- resets ---------------------------------------------------------------------------------
    def _reset_rows(self, selected: range, it: int, ep: int) -> np.ndarray:
        keys = np.empty((len(selected), 2), np.uint32)
        seeds = {g: derive_seed("reacher_mjx", self.seed, it, ep, g)
                 for g in {r // self.group_size for r in selected}}
        for i, r in enumerate(selected):
            s = seeds[r // self.group_size]
            keys[i] = (s >> 32) & 0xFFFFFFFF, s & 0xFFFFFFFF
        self._state, outs = self._run(_reset_block, selected, keys)
        return np.concatenate(outs) if outs else np.zeros((0, OBS_DIM), np.float32)

    def reset(self, it: int, ep: int, rows: slice | None = None) -> dict[str, torch.Tensor]:
        """Refresh the episodes of `rows` (global row slice; None = all): obs `[n, 10]` float32."""
        return {"obs": _torch(self._reset_rows(resolve_rows(rows, self.num_envs), int(it), int(ep)))}

    def resume(self, rows: slice | None = None) -> dict[str, torch.Tensor]:
        """The observation of the episode in progress in each of `rows`, which the next `step` continues
        (`sim_base`: episodes across rollouts); rows mid-episode count in `episodes_resumed`."""
        selected = resolve_rows(rows, self.num_envs)
        lo, hi = selected.start, selected.stop
        self._resumed += int((np.asarray(self._state["steps"][lo:hi]) > 0).sum())
        return {"obs": _torch(self._state["obs"][lo:hi])}

    # -- stepping -------------------------------------------------------------------------------
    def step(self, action: torch.Tensor, rows: slice | None = None) -> dict[str, torch.Tensor]:
        """Execute the action chunk `[n, chunk, 2]` of each row in turn.

        Returns obs `[n, 10]` (after an automatic reset for rows whose episode ended), reward `[n]`
        (sum over the executed sub-steps), the end-of-episode flags done / terminated (always 0: the
        task has no terminal state) / truncated / fault `[n]` (see `sim_base`; the rest of an ended
        episode's chunk is dropped) and final_obs `[n, 10]` (the ended episode's last good
        observation -- equal to obs for rows that did not end -- for bootstrapping).
        """
        selected = resolve_rows(rows, self.num_envs)
        act = action.detach().to("cpu", torch.float32).numpy()
        if act.shape != (len(selected), self.chunk, ACT_DIM):
            raise ValueError(f"ReacherMjxSim.step: action shape {tuple(act.shape)} != "
                             f"({len(selected)}, {self.chunk}, {ACT_DIM}) for rows={rows}")
        state, outs = self._run(_step_block, selected, act, self._max_steps, self.frame_skip)
        if not outs:
            return {k: torch.zeros(shape) for k, shape in
                    (("obs", (0, OBS_DIM)), ("reward", (0,)), ("done", (0,)), ("terminated", (0,)),
                     ("truncated", (0,)), ("fault", (0,)), ("final_obs", (0, OBS_DIM)))}
        out = {k: np.concatenate([o[k] for o in outs]) for k in outs[0]}
        faulted = np.flatnonzero(out["fault"])
        if len(faulted) and self.on_nan == "stop":
            i = int(faulted[0])
            raise EnvFault(f"ReacherMjxSim: env {selected[i]} faulted at episode step {int(out['fault_step'][i])}: "
                           "non-finite action, observation or reward, or diverged physics")
        self._state = state
        self._faults += len(faulted)
        self._env_steps += int(out["executed"].sum())
        self._finished += [(float(out["ep_return"][i]), float(out["ep_dist"][i])) for i in np.flatnonzero(out["recorded"])]
        flags = {"terminated": torch.zeros(len(selected)), "truncated": _torch(out["recorded"]).float(),
                 "fault": _torch(out["fault"]).float()}
        return {**{k: _torch(out[k]) for k in ("obs", "reward", "done", "final_obs")}, **flags}

    # -- state ----------------------------------------------------------------------------------
    def get_state(self, name: str) -> dict[str, torch.Tensor]:
        """The `episode` state of the real rows as torch CPU tensors (keys widened to int64, since
        torch has little uint32 support)."""
        self._check_name(name)
        out = {k: _torch(v[: self.num_envs]) for k, v in self._state.items()}
        out["key"] = out["key"].to(torch.int64)
        return out

    def set_state(self, name: str, value: dict[str, torch.Tensor]) -> None:
        self._check_name(name)
        new = {}
        if "obs" not in value and "physics" in value and "target" in value:  # saved before `resume` existed
            value = {**value, "obs": _torch(_observe_rows(self._m, self._d0, self._put(value["physics"].numpy()),
                                                          self._put(value["target"].numpy())))}
        for k, old in self._state.items():
            if k not in value:
                raise KeyError(f"ReacherMjxSim episode state lacks {k!r}")
            v = value[k].detach().cpu().numpy().astype(old.dtype)
            if v.shape != (self.num_envs, *old.shape[1:]):
                raise ValueError(f"episode state {k!r} has shape {v.shape}, expected {(self.num_envs, *old.shape[1:])}")
            new[k] = old.at[: self.num_envs].set(jax.device_put(v, self.device))
        self._state = new
