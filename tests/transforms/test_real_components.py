"""Plans run on the real components compute bit for bit what the declared workflow computes (CPU):
issue 12.1's rewrite of the shipped PPO workflow (`split epoch 2`: the inner step loop and its collect
copied per row group), and the pipelined chain of issue 15 (latency-bound stages)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from interpreter.backends import LocalBackend
from interpreter.runner import RunConfig, Runner
from interpreter.schedule import Schedule
from rose_dsl import load_workflow, load_workflow_text
from rose_dsl.ir import Workflow
from rose_dsl.transforms import apply_request, compose, plan_differences

ROOT = Path(__file__).resolve().parents[2]


def _states(wf: Workflow, iterations: int) -> dict:
    sch = Schedule(wf)
    be = LocalBackend(wf, ("examples.",), sch.program.loops_of)
    try:
        Runner(wf, be, RunConfig(iterations=iterations, tensorboard=False), sch).run()
        return {c: be.control(c, "get_states") for c in be.components() if "@" not in c}
    finally:
        be.shutdown()


def _equal(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    return a == b


@pytest.mark.e2e
@pytest.mark.parametrize("requests", [("split epoch 2",), ("split epoch 2", "interleave epoch")], ids=" + ".join)
def test_ppo_with_its_epoch_body_split_trains_bit_for_bit_like_the_declared_workflow(requests) -> None:
    wf = load_workflow(ROOT / "workflows" / "embodied_ppo.yaml", {"num_envs": 8, "steps": 4, "epochs": 2, "seed": 5})
    plan = apply_request(wf, requests[0])
    for r in requests[1:]:
        plan = compose(plan, apply_request(plan.workflow, r))
    assert plan_differences(wf, plan.workflow) == []
    assert _equal(_states(wf, 2), _states(plan.workflow, 2))


def test_the_pipelined_chain_computes_what_the_declared_chain_computes() -> None:
    from benchmarks.chain_pipelining import FLAT, WORKFLOW

    wf = load_workflow_text(WORKFLOW.format(rows=8, fixed=0.0, per_row=0.0, body=FLAT), "chain.yaml")
    plan = apply_request(wf, "split-chain generate score 4").workflow
    assert _equal(_states(wf, 3), _states(plan, 3))
