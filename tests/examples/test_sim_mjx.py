"""Tests of `examples.embodied.sim_mjx.ReacherMjxSim` against the component contract.

MJX needs mujoco>=3.17 + jax, which the project's own environment (mujoco 3.3.0) does not have, so
the simulator runs in a subprocess whose PYTHONPATH starts with the MJX install dir (`$ROSE_MJXENV`,
default `<repo>/.mjxenv`, made by `pip install --target .mjxenv "mujoco==3.17.0" "mujoco-mjx==3.17.0"
"jax[cpu]"`). That subprocess is this file run as a script: it plays fixed scenarios and saves their
outputs with torch.save; the tests here load them with `torch.load(weights_only=True)` (as rose's
checkpoints do) and compare. Without such an install (CI) the module is skipped.

One subprocess compiles the two block programs once (~25 s on a CPU); a second one, sharing a JAX
compilation cache, checks that the results do not depend on the process.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
MJXENV = Path(os.environ.get("ROSE_MJXENV", REPO / ".mjxenv"))
N, CHUNK, BLOCK, EP_LEN = 6, 2, 4, 7  # 7-step episodes end mid-chunk; blocks of 4 leave a partial block
GROUPINGS = [[slice(0, 6)], [slice(0, 3), slice(3, 6)], [slice(0, 1), slice(1, 5), slice(5, 6)]]
T = 9  # chunks per scenario: two auto-resets per env


def _env() -> dict[str, str]:
    paths = [str(MJXENV)] if MJXENV.is_dir() else []
    return {**os.environ, "PYTHONPATH": os.pathsep.join([*paths, str(REPO)])}


def _skip_reason() -> str | None:
    probe = "import mujoco; from mujoco import mjx; import jax; print(mujoco.__version__)"
    res = subprocess.run([sys.executable, "-c", probe], env=_env(), capture_output=True, text=True, timeout=120)
    if res.returncode:
        return f"mujoco.mjx + jax not importable (install them with pip --target {MJXENV})"
    version = tuple(int(x) for x in res.stdout.strip().splitlines()[-1].split(".")[:2])
    return None if version >= (3, 17) else f"mujoco {version} < 3.17 under {MJXENV}"


# -- the scenarios (run in the subprocess, where jax and mujoco 3.17 import) ----------------------
def _actions(t: int, scale: float = 1.5) -> torch.Tensor:
    """Deterministic actions for all rows at chunk t (some beyond the [-1, 1] control range)."""
    return scale * torch.randn((N, CHUNK, 2), generator=torch.Generator().manual_seed(1000 + t))


def _play(sim: Any, grouping: list[slice], chunks: int, nan_at: tuple[int, int] | None = None) -> dict[str, Any]:
    """reset + `chunks` steps, each call made once per group; outputs stacked over time."""
    obs = torch.cat([sim.reset(it=3, ep=1, rows=g)["obs"] for g in grouping])
    outs: dict[str, list[torch.Tensor]] = {"obs": [], "reward": [], "done": [], "final_obs": []}
    for t in range(chunks):
        act = _actions(t)
        if nan_at is not None and nan_at[0] == t:
            act[nan_at[1], 1] = float("nan")
        parts = [sim.step(act[g], rows=g) for g in grouping]
        for k in outs:
            outs[k].append(torch.cat([p[k] for p in parts]))
    return {"reset_obs": obs, **{k: torch.stack(v) for k, v in outs.items()},
            "state": sim.get_state("episode"), "metrics": sim.pop_metrics()}


def _scenarios() -> dict[str, Any]:
    from examples.embodied.sim_mjx import EnvFault, ReacherMjxSim

    def make(**kw: Any) -> ReacherMjxSim:
        return ReacherMjxSim(**{"num_envs": N, "chunk": CHUNK, "seed": 5, "max_episode_steps": EP_LEN,
                                "row_block": BLOCK, **kw})

    res: dict[str, Any] = {"groupings": [_play(make(), g, T) for g in GROUPINGS]}
    res["again"] = _play(make(), GROUPINGS[0], T)
    res["other_seed"] = _play(make(seed=6), GROUPINGS[0], 2)
    res["grouped"] = _play(make(group_size=2), GROUPINGS[1], 1)
    # state round trip: snapshot mid-episode, restore into a fresh sim, continue both
    a, b = make(), make(seed=99)
    a.reset(it=0, ep=0)
    for t in range(2):
        a.step(_actions(t))
    b.set_state("episode", a.get_state("episode"))
    res["roundtrip"] = [torch.stack([s.step(_actions(t))["obs"] for t in range(2, 6)]) for s in (a, b)]
    # resume (episodes across rollouts): the observation each step returned, and no side effect
    r, q = make(), make()
    r.reset(it=0, ep=0)
    q.reset(it=0, ep=0)
    returned, resumed, halves = [], [], []
    for t in range(T):
        returned.append(r.step(_actions(t))["obs"])
        resumed.append(r.resume()["obs"])
        halves.append(torch.cat([r.resume(rows=g)["obs"] for g in GROUPINGS[1]]))
        q.step(_actions(t))
    res["resume"] = {"returned": torch.stack(returned), "resumed": torch.stack(resumed), "halves": torch.stack(halves),
                     "state": r.get_state("episode"), "plain_state": q.get_state("episode"),
                     "resumed_count": r.pop_metrics().get("episodes_resumed", 0.0)}
    older = {k: v for k, v in r.get_state("episode").items() if k != "obs"}  # a state saved before `resume`
    fresh = make(seed=99)
    fresh.set_state("episode", older)
    res["resume_older_state"] = (fresh.resume()["obs"], r.resume()["obs"])
    # faults: a NaN action, a NaN physics state, and on_nan="stop"
    res["nan_action"] = _play(make(), GROUPINGS[1], 3, nan_at=(1, 2))
    c = make()
    c.reset(it=0, ep=0)
    state = c.get_state("episode")
    state["physics"][1, 3] = float("nan")  # a qvel entry of env 1 (time, qpos[2], qvel[2], ...)
    c.set_state("episode", state)
    res["nan_state"] = {**c.step(_actions(0)), "metrics": c.pop_metrics()}
    s = make(on_nan="stop")
    s.reset(it=0, ep=0)
    before = s.get_state("episode")
    act = _actions(0)
    act[4, 0, 1] = float("inf")
    try:
        s.step(act[3:6], rows=slice(3, 6))
        res["stop_error"] = ""
    except EnvFault as exc:
        res["stop_error"] = str(exc)
    res["stop_state_kept"] = all(torch.equal(before[k], v) for k, v in s.get_state("episode").items())
    errors = []
    for call in (lambda: s.step(torch.zeros(N, CHUNK + 1, 2)), lambda: s.get_state("weights")):
        try:
            call()
            errors.append("")
        except (ValueError, KeyError) as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
    res["errors"] = errors
    return res


# -- the tests ---------------------------------------------------------------------------------------
if __name__ != "__main__":
    _reason = _skip_reason()
    if _reason:
        pytest.skip(_reason, allow_module_level=True)


def _run_scenarios(path: Path, cache: Path) -> dict[str, Any]:
    env = {**_env(), "JAX_COMPILATION_CACHE_DIR": str(cache), "JAX_PLATFORMS": "cpu"}
    res = subprocess.run([sys.executable, __file__, str(path)], env=env, capture_output=True, text=True, timeout=500)
    assert res.returncode == 0, f"scenario subprocess failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    return torch.load(path, weights_only=True)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("mjx")
    return _run_scenarios(tmp / "a.pt", tmp / "cache"), _run_scenarios(tmp / "b.pt", tmp / "cache")


@pytest.fixture(scope="module")
def res(runs: tuple[dict[str, Any], dict[str, Any]]) -> dict[str, Any]:
    return runs[0]


def assert_same(a: Any, b: Any, path: str = "") -> None:
    """Bit-identical nested results (NaN == NaN)."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            assert_same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{path}[{i}]")
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, path
        assert torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0)), f"{path} differs"
    else:
        assert a == b or (isinstance(a, float) and math.isnan(a) and math.isnan(b)), f"{path}: {a} != {b}"


def test_shapes_and_dtypes(res: dict[str, Any]) -> None:
    run = res["groupings"][0]
    assert run["reset_obs"].shape == (N, 10) and run["reset_obs"].dtype == torch.float32
    assert run["obs"].shape == run["final_obs"].shape == (T, N, 10)
    assert run["reward"].shape == run["done"].shape == (T, N)
    assert all(v.dtype == torch.float32 for k, v in run.items() if k in ("obs", "reward", "done", "final_obs"))
    assert all(isinstance(v, torch.Tensor) and v.shape[0] == N for v in run["state"].values())
    assert torch.isfinite(run["obs"]).all() and torch.isfinite(run["reward"]).all()


def test_observation_is_reacher_v5(res: dict[str, Any]) -> None:
    """cos/sin of the joints, target xy (in the 0.2 m disc), and fingertip - target matching the
    arm's forward kinematics (links 0.1 m and 0.11 m to the fingertip) of the *new* state."""
    obs = torch.cat([res["groupings"][0]["reset_obs"][None], res["groupings"][0]["obs"]]).reshape(-1, 10).double()
    c, s, target = obs[:, :2], obs[:, 2:4], obs[:, 4:6]
    assert torch.allclose(c**2 + s**2, torch.ones_like(c), atol=1e-5)
    assert (target.norm(dim=1) <= 0.2 + 1e-6).all()
    c12, s12 = c[:, 0] * c[:, 1] - s[:, 0] * s[:, 1], s[:, 0] * c[:, 1] + c[:, 0] * s[:, 1]
    tip = torch.stack([0.1 * c[:, 0] + 0.11 * c12, 0.1 * s[:, 0] + 0.11 * s12], dim=1)
    assert torch.allclose(tip - target, obs[:, 8:10], atol=1e-5)


def test_split_invariance(res: dict[str, Any]) -> None:
    whole = res["groupings"][0]
    for grouping, run in zip(GROUPINGS[1:], res["groupings"][1:], strict=True):
        for key in ("reset_obs", "obs", "reward", "done", "final_obs", "state"):
            assert_same(whole[key], run[key], f"{grouping}:{key}")
        for key in ("episodes", "env_faults", "env_steps"):
            assert whole["metrics"][key] == run["metrics"][key]
        assert abs(whole["metrics"]["episode_return"] - run["metrics"]["episode_return"]) < 1e-9


def test_deterministic_in_and_across_processes(runs: tuple[dict[str, Any], dict[str, Any]]) -> None:
    first, second = runs
    assert_same(first["groupings"][0], first["again"])
    assert_same(first["groupings"], second["groupings"])
    assert not torch.equal(first["other_seed"]["reset_obs"], first["again"]["reset_obs"]), "the seed is ignored"


def test_group_size_shares_resets(res: dict[str, Any]) -> None:
    obs = res["grouped"]["reset_obs"]
    assert torch.equal(obs[0], obs[1]) and torch.equal(obs[4], obs[5])
    assert not torch.equal(obs[0], obs[2])


def test_resume_returns_what_the_step_returned_and_changes_nothing(res: dict[str, Any]) -> None:
    """`resume` (episodes continued across rollouts): each row's observation as the last step returned it,
    in any row grouping, with no effect on the episode state; rows mid-episode count as resumed (all but
    the chunks whose step ended the episodes, 3 and 7)."""
    r = res["resume"]
    assert torch.equal(r["resumed"], r["returned"]) and torch.equal(r["halves"], r["returned"])
    assert_same(r["state"], r["plain_state"])
    assert r["resumed_count"] == 2 * N * (T - 2)
    recomputed, saved = res["resume_older_state"]  # an older state's observation: recomputed from its physics
    assert torch.allclose(recomputed, saved, atol=1e-6)


def test_state_round_trip(res: dict[str, Any]) -> None:
    original, restored = res["roundtrip"]
    assert torch.equal(original, restored)


def test_auto_reset(res: dict[str, Any]) -> None:
    """7-step episodes with 2-action chunks end at the first action of chunk 3 (dropping the second)
    and of chunk 7 (a new episode starts with chunk 4); obs is the reset observation, final_obs the
    ended episode's last one, and the ending chunk's reward is that single action's."""
    run = res["groupings"][0]
    done = run["done"]
    expected = torch.zeros(T, N)
    expected[[3, 7]] = 1.0
    assert torch.equal(done, expected)
    ended, going = done.bool(), ~done.bool()
    assert torch.equal(run["obs"][going], run["final_obs"][going])
    assert not torch.isclose(run["obs"][ended], run["final_obs"][ended]).all(dim=-1).any()
    a = _actions(3)[:, 0].clamp(-1, 1)
    single = -run["final_obs"][3, :, 8:10].norm(dim=1) - (a * a).sum(dim=1)
    assert torch.allclose(run["reward"][3], single, atol=1e-5)
    assert (run["state"]["count"] == 2).all() and (run["state"]["steps"] == 2).all()
    m = run["metrics"]
    assert m["episodes"] == 2 * N and m["env_faults"] == 0 and m["env_steps"] == N * (7 + 7 + 2)
    assert -2 * EP_LEN * 5 < m["episode_return"] < 0


def test_nan_action_resets_that_env_only(res: dict[str, Any]) -> None:
    bad, good = res["nan_action"], res["groupings"][1]
    assert bad["done"][1, 2] == 1.0 and bad["metrics"]["env_faults"] == 1
    assert torch.isfinite(bad["obs"]).all() and torch.isfinite(bad["final_obs"]).all()
    others = [0, 1, 3, 4, 5]
    for key in ("obs", "reward", "done", "final_obs"):
        assert torch.equal(bad[key][:, others], good[key][:3, others]), key
    # the faulted chunk executed its first action only: final_obs is that step's observation
    assert not torch.equal(bad["final_obs"][1, 2], bad["obs"][0, 2])


def test_nan_state_is_detected(res: dict[str, Any]) -> None:
    out = res["nan_state"]
    assert out["done"].tolist() == [0, 1, 0, 0, 0, 0] and out["metrics"]["env_faults"] == 1
    assert torch.isfinite(out["obs"]).all() and torch.isfinite(out["final_obs"]).all()


def test_on_nan_stop_names_the_env_and_keeps_state(res: dict[str, Any]) -> None:
    assert "env 4" in res["stop_error"] and "episode step 0" in res["stop_error"]
    assert res["stop_state_kept"]


def test_bad_inputs_raise_clearly(res: dict[str, Any]) -> None:
    shape_error, name_error = res["errors"]
    assert shape_error.startswith("ValueError") and "action shape" in shape_error
    assert name_error.startswith("KeyError") and "episode" in name_error


if __name__ == "__main__":
    torch.save(_scenarios(), sys.argv[1])
