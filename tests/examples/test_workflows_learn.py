"""The shipped workflows train through rose itself (not only through the components' own drivers):
`rose execute` on the CPU improves the reward with a fixed seed."""

from __future__ import annotations

from pathlib import Path

import torch

from interpreter.backends import LocalBackend
from interpreter.runner import RunConfig, Runner
from interpreter.schedule import Schedule
from rose_dsl import load_workflow

ROOT = Path(__file__).resolve().parents[2]


def _train(path: Path, iterations: int, overrides: dict) -> list[dict[str, float]]:
    wf = load_workflow(path, overrides)
    sch = Schedule(wf)
    be = LocalBackend(wf, ("examples.",), sch.program.loops_of)
    try:
        results = Runner(wf, be, RunConfig(iterations=iterations, tensorboard=False), sch).run()
    finally:
        be.shutdown()
    return [r.metrics for r in results]


def test_llm_grpo_workflow_improves_reward_through_rose() -> None:
    torch.set_num_threads(1)
    metrics = _train(ROOT / "workflows" / "llm_grpo.yaml", 30, {"seed": 0})
    rewards = [m["reward/mean_reward"] for m in metrics]
    first, last = sum(rewards[:8]) / 8, sum(rewards[-8:]) / 8
    assert last > first + 0.05, (first, last, rewards)
    # the metrics the issue asks for are there
    for key in ("tokens_per_s", "learner/kl", "time/generate", "time/learn", "time/sync"):
        assert any(k.startswith(key) for k in metrics[-1]), key
