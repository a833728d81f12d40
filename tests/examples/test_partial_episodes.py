"""Partial episodes (issue 46, item 5, the embodied side): rollouts that continue the episodes the previous
one left (`sim.resume`, workflows/embodied_ppo_continuing.yaml) instead of resetting them, so that an
episode runs across the weight sync between RL iterations -- its later steps drawn by the new weights, each
step's sample carrying the policy version that drew it, which the PPO trainer checks against its budget.
With the sync deferred (`defer sync 1`, `max_staleness: 1`) the lag rose proves for `act` bounds every
step's; the trainer raises beyond it. Seeded; thresholds are on rewards and counts, never on time."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from examples.embodied.sim_reacher import ReacherVecSim
from rose_dsl import load_workflow
from rose_dsl.transforms import Refused, apply
from tests.examples.test_async_learns import _train

ROOT = Path(__file__).resolve().parents[2]
CONTINUING = ROOT / "workflows" / "embodied_ppo_continuing.yaml"


def _actions(n: int, t: int, chunk: int = 2) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(t).uniform(-1, 1, (n, chunk, 2))).float()


def test_resume_returns_the_last_observation_and_changes_nothing() -> None:
    """resume then step is step: the same observations, rewards and flags, bit for bit, with episodes
    ending on the way (50-step episodes, 30 chunks of 2); rows mid-episode count as resumed."""
    plain, resumed = ReacherVecSim(num_envs=3, chunk=2, seed=4), ReacherVecSim(num_envs=3, chunk=2, seed=4)
    for sim in (plain, resumed):
        sim.reset(it=0, ep=0)
    assert int(resumed.pop_metrics().get("episodes_resumed", 0)) == 0
    assert torch.equal(resumed.resume()["obs"], plain.resume()["obs"])
    for t in range(30):
        a, b = plain.step(_actions(3, t)), resumed.step(_actions(3, t))
        assert torch.equal(resumed.resume()["obs"], b["obs"])  # the observation the step returned
        assert torch.equal(resumed.resume(slice(1, 3))["obs"], b["obs"][1:3])
        for key in a:
            assert torch.equal(a[key], b[key]), (t, key)
    metrics = resumed.pop_metrics()
    assert metrics["episodes"] == 3.0  # every row ended one episode, at its 25th chunk (t = 24) ...
    # ... and was mid-episode at the 5 row-resumes of every other t (3 rows, then 2)
    assert metrics["episodes_resumed"] == 5 * (30 - 1)


def test_resume_after_a_state_restore_returns_the_saved_observation() -> None:
    sim = ReacherVecSim(num_envs=2, chunk=2, seed=1)
    sim.reset(it=0, ep=0)
    for t in range(5):
        sim.step(_actions(2, t))
    state, obs = sim.get_state("episode"), sim.resume()["obs"]
    other = ReacherVecSim(num_envs=2, chunk=2, seed=9)
    other.set_state("episode", state)
    assert torch.equal(other.resume()["obs"], obs)
    assert torch.equal(other.step(_actions(2, 7))["obs"], sim.step(_actions(2, 7))["obs"])


def test_the_continuing_workflow_refuses_what_its_episodes_forbid() -> None:
    """Budget 0: no deferral. The epoch loop is dependent (each epoch reads the episode the previous one
    left), so a temporal split, whose copies would run other episodes, is refused."""
    wf = load_workflow(CONTINUING, {"iterations": 4})
    assert isinstance(apply(wf, "defer sync 1"), Refused)
    split = apply(load_workflow(CONTINUING, {"iterations": 4, "stale": 1}), "split-time epoch 2")
    assert isinstance(split, Refused) and "dependent" in split.reason


@pytest.mark.e2e
@pytest.mark.parametrize("epochs", [1, 2])
def test_partial_episodes_under_a_deferred_sync_learn_within_the_budget(epochs: int) -> None:
    """`--set stale=1` and `defer sync 1`: the return rises (as the reset-per-epoch workflow's test asks,
    tests/examples/test_async_learns.py); every RL iteration after the first starts with episodes in
    progress (epochs=1: the rollout right after each sync continues them), and every sample is at most 1
    update old -- the trainer checks it (`max_staleness: 1` raises beyond) and counts 1 from iteration 1 on."""
    torch.set_num_threads(1)
    iterations = 24 if epochs == 2 else 6
    wf = load_workflow(CONTINUING, {"seed": 0, "iterations": iterations, "num_envs": 16, "stale": 1, "epochs": epochs})
    plan = apply(wf, "defer sync 1")
    assert not isinstance(plan, Refused), plan
    metrics = _train(plan.workflow, iterations)
    assert all(m["sim/episodes_resumed"] > 0 for m in metrics[1:])
    assert metrics[0]["trainer/staleness_max"] == 0.0
    assert all(m["trainer/staleness_max"] == 1.0 for m in metrics[1:])
    if epochs == 2:
        returns = [m["sim/episode_return"] for m in metrics]
        first, last = sum(returns[:5]) / 5, sum(returns[-5:]) / 5
        assert last > first + 5.0, (first, last, returns)
