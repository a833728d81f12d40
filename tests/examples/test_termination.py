"""Terminal states, truncations and faults kept apart from the simulator to the trainers (issue 13):
a trainer bootstraps V(next_obs) only where the episode did not end in a terminal state."""

from __future__ import annotations

import torch

from examples.embodied.driver import rollout
from examples.embodied.grpo import GRPOTrainer
from examples.embodied.policy import FlowPolicy
from examples.embodied.ppo import PPOTrainer
from examples.embodied.sim_reacher import ReacherVecSim


def test_a_task_that_terminates_reports_terminated_not_truncated() -> None:
    """Reaching the target ends the episode as a terminal state; the step limit truncates; a fault is a
    fault. Each is its own flag, `done` is any of them."""
    sim = ReacherVecSim(num_envs=3, chunk=4, seed=1, max_episode_steps=2, terminate_within=10.0)  # always within
    start = sim.reset(it=0, ep=0)["obs"]
    out = sim.step(torch.zeros(3, 4, 2))
    assert out["terminated"].tolist() == [1.0] * 3 and out["truncated"].tolist() == [0.0] * 3
    assert out["fault"].tolist() == [0.0] * 3 and out["done"].tolist() == [1.0] * 3
    assert not torch.equal(out["final_obs"], out["obs"])  # the terminal observation, not the reset's
    metrics = sim.pop_metrics()
    assert metrics["episodes"] == 3 and metrics["env_steps"] == 3  # the rest of each chunk was dropped
    assert start.shape == out["obs"].shape
    plain = ReacherVecSim(num_envs=3, chunk=4, seed=1, max_episode_steps=2)
    plain.reset(it=0, ep=0)
    cut = plain.step(torch.zeros(3, 4, 2))
    assert cut["truncated"].tolist() == [1.0] * 3 and cut["terminated"].tolist() == [0.0] * 3
    bad = torch.zeros(3, 4, 2)
    bad[1, 0, 0] = float("nan")
    plain.reset(it=0, ep=1)
    faulted = plain.step(bad)
    assert faulted["fault"].tolist() == [0.0, 1.0, 0.0] and faulted["done"][1] == 1.0
    assert faulted["terminated"][1] == 0.0 and faulted["truncated"][1] == 0.0


def _trainer() -> PPOTrainer:
    trainer = PPOTrainer(obs_dim=10, act_dim=2, chunk=1, hidden=32, denoise_steps=2, lr=1e-3, gamma=0.5, lam=1.0,
                         reward_scale=1.0)
    trainer._values = lambda obs: obs[..., 0]  # a critic that reads obs[0]
    return trainer


def test_ppo_does_not_bootstrap_a_terminal_state() -> None:
    obs, next_obs = torch.zeros(3, 1, 10), torch.zeros(3, 1, 10)
    next_obs[0, 0, 0], next_obs[1, 0, 0], next_obs[2, 0, 0] = 7.0, 4.0, 2.0
    reward = torch.ones(3, 1)
    done = torch.tensor([[1.0], [1.0], [0.0]])
    terminated = torch.tensor([[1.0], [0.0], [0.0]])  # t=0 terminal, t=1 truncated, t=2 goes on
    adv, returns = _trainer()._advantages({"obs": obs, "next_obs": next_obs, "reward": reward, "done": done,
                                           "terminated": terminated})
    # t=0: the reward alone (was 1 + 0.5*7 when every done bootstrapped); t=1: 1 + 0.5*4; t=2: 1 + 0.5*2
    torch.testing.assert_close(adv, torch.tensor([[1.0], [3.0], [2.0]]))
    torch.testing.assert_close(returns, adv)


def test_rollout_values_skip_the_bootstrap_of_terminal_states() -> None:
    trainer = PPOTrainer(obs_dim=10, act_dim=2, chunk=1, hidden=32, denoise_steps=2, lr=1e-3, gamma=0.5, lam=1.0,
                         reward_scale=1.0, values="rollout")
    evaluated = []
    trainer._values = lambda obs: (evaluated.append(obs.shape[1]), obs[..., 0])[1]
    obs, next_obs = torch.zeros(2, 2, 10), torch.zeros(2, 2, 10)
    next_obs[..., 0] = torch.tensor([[5.0, 6.0], [7.0, 8.0]])
    traj = {"obs": obs, "next_obs": next_obs, "reward": torch.ones(2, 2), "value": torch.tensor([[1.0, 1.0], [2.0, 2.0]]),
            "done": torch.tensor([[1.0, 1.0], [0.0, 0.0]]), "terminated": torch.tensor([[1.0, 0.0], [0.0, 0.0]])}
    adv, _ = trainer._advantages(traj)
    assert evaluated == [3]  # the truncated row at t=0 and both rows of the last step; not the terminal one
    # row 0: t=0 terminal: 1 - 1; t=1: 1 + 0.5*7 - 2.  row 1: t=0 truncated: 1 + 0.5*6 - 1; t=1: 1 + 0.5*8 - 2
    torch.testing.assert_close(adv, torch.tensor([[0.0, 3.0], [2.5, 3.0]]))


def test_training_on_a_task_that_terminates() -> None:
    """The flags flow from the simulator through a rollout into PPO and GRPO updates."""
    sim = ReacherVecSim(num_envs=4, chunk=2, seed=0, max_episode_steps=6, terminate_within=0.12, group_size=2)
    policy = FlowPolicy(obs_dim=10, act_dim=2, chunk=2, num_envs=4, hidden=16, denoise_steps=2)
    traj = rollout(sim, policy, it=0, ep=0, steps=6)
    assert traj["terminated"].shape == traj["done"].shape == (6, 4)
    assert bool((traj["terminated"] <= traj["done"]).all())
    for trainer in (PPOTrainer(obs_dim=10, act_dim=2, chunk=2, hidden=16, denoise_steps=2, lr=1e-3),
                    GRPOTrainer(obs_dim=10, act_dim=2, chunk=2, hidden=16, denoise_steps=2, lr=1e-3, group_size=2)):
        trainer.update(traj)
        assert torch.isfinite(torch.tensor(trainer.pop_metrics()["loss"]))
