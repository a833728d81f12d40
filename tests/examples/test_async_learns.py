"""Asynchronous plans of the shipped CPU workflows still learn (issue 46): the embodied PPO workflow with
`max_staleness: 1` on the rollout policy's weights and the weight sync deferred by one RL iteration
(`defer sync 1`), run through rose's pipelined runner on the local backend. The rollout of iteration k
then uses the weights of update k-2; PPO's ratio against the behaviour log-probs recorded at sampling
time, clipped, keeps that sound. Seeded; the threshold is on the reward, never on time."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from interpreter.backends import LocalBackend
from interpreter.runner import RunConfig, Runner
from interpreter.schedule import Schedule
from rose_dsl import load_workflow
from rose_dsl.ir import Workflow
from rose_dsl.transforms import Refused, apply

ROOT = Path(__file__).resolve().parents[2]


def with_budget(wf: Workflow, component: str, state: str, budget: int) -> Workflow:
    """`wf` with `max_staleness: budget` on one state object (what a user writes in the YAML)."""
    comp = wf.components[component]
    objects = tuple(replace(s, max_staleness=budget) if s.name == state else s for s in comp.state)
    return replace(wf, components={**wf.components, component: replace(comp, state=objects)})


def _train(wf: Workflow, iterations: int) -> list[dict[str, float]]:
    sch = Schedule(wf)
    be = LocalBackend(wf, ("examples.",), sch.program.loops_of)
    try:
        return [r.metrics for r in Runner(wf, be, RunConfig(iterations=iterations, tensorboard=False), sch).run()]
    finally:
        be.shutdown()


@pytest.mark.e2e
def test_embodied_ppo_with_budget_one_learns_and_its_samples_are_at_most_one_update_old() -> None:
    torch.set_num_threads(1)
    iterations = 24
    wf = load_workflow(ROOT / "workflows" / "embodied_ppo.yaml", {"seed": 0, "iterations": iterations, "num_envs": 16})
    assert isinstance(apply(wf, "defer sync 1"), Refused)  # the declared workflow allows no staleness
    plan = apply(with_budget(wf, "policy", "rollout_weights", 1), "defer sync 1")
    assert not isinstance(plan, Refused), plan
    assert Schedule(plan.workflow).depth == 2  # two RL iterations in flight
    metrics = _train(plan.workflow, iterations)
    returns = [m["sim/episode_return"] for m in metrics]
    first, last = sum(returns[:5]) / 5, sum(returns[-5:]) / 5
    assert last > first + 5.0, (first, last, returns)
    hist = {k: v for m in metrics for k, v in m.items() if k.startswith("trainer/staleness_hist_")}
    assert set(hist) == {"trainer/staleness_hist_0", "trainer/staleness_hist_1"}, hist
    assert metrics[0]["trainer/staleness_max"] == 0.0  # nothing to be stale against yet
    assert all(m["trainer/staleness_max"] == 1.0 for m in metrics[1:])  # then always the budget, never more
    assert all(0.0 < m["trainer/ratio_min"] <= m["trainer/ratio_mean"] <= m["trainer/ratio_max"] for m in metrics)


def test_llm_grpo_with_budget_one_learns() -> None:
    """The CPU GRPO workflow with `max_staleness: 1` on the generator's weights and the sync deferred by one
    RL iteration: generation of iteration k samples with the weights of update k-2, and the reward still
    rises as the synchronous test asks (tests/examples/test_workflows_learn.py: first/last 8 means)."""
    torch.set_num_threads(1)
    iterations = 30
    wf = load_workflow(ROOT / "workflows" / "llm_grpo.yaml", {"seed": 0, "iterations": iterations})
    assert isinstance(apply(wf, "defer sync 1"), Refused)
    plan = apply(with_budget(wf, "generator", "weights", 1), "defer sync 1")
    assert not isinstance(plan, Refused), plan
    rewards = [m["reward/mean_reward"] for m in _train(plan.workflow, iterations)]
    first, last = sum(rewards[:8]) / 8, sum(rewards[-8:]) / 8
    assert last > first + 0.05, (first, last, rewards)
