"""A component process of the shipped trainers that dies mid-run is recovered to what an uninterrupted run
computes (issue 46): the policy versions that staleness is measured with are state (a restarted generator
or learner does not start counting again at 0 while the other goes on), and a surviving generator forgets
the completions it had in flight (they were queued in a timeline the recovery abandoned: the partial
rollouts of an `ahead` plan). Ray backend, seeded CPU runs; nothing depends on the machine's speed."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from interpreter.runner import RunConfig, Runner
from interpreter.schedule import Schedule
from rose_dsl import load_workflow
from rose_dsl.ir import Workflow
from rose_dsl.transforms import Refused, apply

ROOT = Path(__file__).resolve().parents[2]
ITERATIONS = 6


def _impl(wf: Workflow, comp: str, impl: str, **args: object) -> Workflow:
    c = wf.components[comp]
    return replace(wf, components={**wf.components, comp: replace(c, impl=impl, args={**c.args, **args})})


def _run(ray, wf: Workflow, out: Path) -> tuple[list[dict[str, float]], dict[str, dict], list[dict]]:
    from interpreter.backends import RayBackend

    sch = Schedule(wf)
    be = RayBackend(wf, ("examples.", "tests."), sch.program.loops_of)
    try:
        runner = Runner(wf, be, RunConfig(iterations=ITERATIONS, checkpoint_every=2, out_dir=out, tensorboard=False), sch)
        results = runner.run()
        states = {c: be.control(c, "get_states") for c in wf.components if wf.components[c].state}
    finally:
        be.shutdown()
    assert [r.iteration for r in results] == list(range(ITERATIONS))
    return [r.metrics for r in results], states, runner.recoveries


def _same(a: object, b: object, where: str) -> None:
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for k in a:
            _same(a[k], b[k], f"{where}.{k}")
    elif torch.is_tensor(a):
        assert torch.is_tensor(b) and torch.equal(a, b), where
    else:
        assert a == b, where


def _grpo_ahead() -> Workflow:
    """The long-tail GRPO workflow, small, budget 1, with the next iteration's prompts submitted ahead
    (partial rollouts: completions in flight at every sync but the checkpoints')."""
    wf = load_workflow(ROOT / "workflows" / "llm_grpo_longtail.yaml",
                       {"iterations": ITERATIONS, "prompts": 8, "k": 4, "max_new_tokens": 32, "length_mean": 8,
                        "length_p99": 30, "stale": 1})
    plan = apply(wf, "ahead submit")
    assert not isinstance(plan, Refused), plan
    return plan.workflow


@pytest.fixture(scope="module")
def grpo_whole(ray_session, tmp_path_factory):
    """The uninterrupted run both GRPO cases compare with."""
    metrics, states, recoveries = _run(ray_session, _grpo_ahead(), tmp_path_factory.mktemp("whole"))
    assert recoveries == []
    return metrics, states


@pytest.mark.e2e
@pytest.mark.parametrize("dies", ["generator", "learner"])
def test_a_grpo_run_whose_process_dies_computes_what_an_uninterrupted_one_does(ray_session, grpo_whole, tmp_path,
                                                                              dies) -> None:
    """A process death in iteration 2 or 3 (the generator's collect, or the learner's first update) goes
    back to the checkpoint of iteration 1. Whichever process died, the run ends with the uninterrupted run's
    state, and every iteration's metrics -- the staleness histogram and the rewards included -- are the
    uninterrupted run's: a restarted process does not count policy versions from 0 again."""
    plan = _grpo_ahead()
    want_metrics, want_states = grpo_whole
    marker = str(tmp_path / "died")
    if dies == "generator":
        dying = _impl(plan, "generator", "tests.examples.dying:GeneratorDiesOnce", marker=marker, at_call=4)
    else:
        dying = _impl(plan, "learner", "tests.examples.dying:LearnerDiesOnce", marker=marker, at_call=5)
    got_metrics, got_states, recoveries = _run(ray_session, dying, tmp_path / "recovered")
    assert Path(marker).exists() and len(recoveries) == 1
    assert recoveries[0]["restarted"] == [dies] and recoveries[0]["from_checkpoint"] == 1
    _same(want_states, got_states, "states")
    for i, (want, got) in enumerate(zip(want_metrics, got_metrics, strict=True)):
        keys = sorted(k for k in want if k.startswith(("learner/", "reward/")) and not k.endswith("_s"))
        assert keys and [got.get(k) for k in keys] == [want[k] for k in keys], f"iteration {i}"
    assert max(m["learner/staleness_max"] for m in got_metrics) == 1


@pytest.mark.e2e
def test_a_ppo_run_whose_policy_process_dies_computes_what_an_uninterrupted_one_does(ray_session, tmp_path) -> None:
    """The embodied PPO workflow (synchronous, the trainer refusing any stale sample): the rollout policy's
    process dies in iteration 3 and restarts from the checkpoint of iteration 1 while the trainer goes on;
    the run ends as the uninterrupted one, every sample of lag 0."""
    wf = load_workflow(ROOT / "workflows" / "embodied_ppo.yaml",
                       {"iterations": ITERATIONS, "num_envs": 8, "steps": 5, "epochs": 2, "hidden": 32})
    wf = _impl(wf, "trainer", wf.components["trainer"].impl, max_staleness=0)
    want_metrics, want_states, _ = _run(ray_session, wf, tmp_path / "whole")
    marker = str(tmp_path / "died")
    dying = _impl(wf, "policy", "tests.examples.dying:PolicyDiesOnce", marker=marker, at_call=3 * 2 * 5 + 1)
    got_metrics, got_states, recoveries = _run(ray_session, dying, tmp_path / "recovered")
    assert Path(marker).exists() and len(recoveries) == 1
    assert recoveries[0]["restarted"] == ["policy"] and recoveries[0]["from_checkpoint"] == 1
    _same(want_states, got_states, "states")
    for i, (want, got) in enumerate(zip(want_metrics, got_metrics, strict=True)):
        keys = sorted(k for k in want if k.startswith(("trainer/", "sim/")) and not k.endswith("_s"))
        assert keys and [got.get(k) for k in keys] == [want[k] for k in keys], f"iteration {i}"
    assert all(m["trainer/staleness_max"] == 0 for m in got_metrics)


def test_a_resumed_ppo_run_counts_policy_versions_on_from_the_checkpoint(tmp_path) -> None:
    """`--resume` starts fresh processes from a checkpoint: the policy version (weights published, weight
    loads received) comes back with the state, so the resumed iterations' metrics -- `policy_version`
    included -- are the uninterrupted run's (it used to start again at 0 on both sides)."""
    from interpreter.backends import LocalBackend

    wf = load_workflow(ROOT / "workflows" / "embodied_ppo.yaml",
                       {"iterations": 4, "num_envs": 8, "steps": 5, "epochs": 2, "hidden": 32})

    def run(iterations: int, out: Path, resume: bool) -> list[dict[str, float]]:
        sch = Schedule(wf)
        be = LocalBackend(wf, ("examples.",), sch.program.loops_of)
        try:
            config = RunConfig(iterations=iterations, out_dir=out, checkpoint_every=1, resume=resume, tensorboard=False)
            return [r.metrics for r in Runner(wf, be, config, sch).run()]
        finally:
            be.shutdown()

    straight = run(4, tmp_path / "straight", False)
    run(2, tmp_path / "resumed", False)
    resumed = run(4, tmp_path / "resumed", True)
    assert len(resumed) == 2
    for want, got in zip(straight[2:], resumed, strict=True):
        keys = sorted(k for k in want if k.startswith(("trainer/", "sim/")) and not k.endswith("_s"))
        assert [got.get(k) for k in keys] == [want[k] for k in keys]
    assert [m["trainer/policy_version"] for m in resumed] == [3.0, 4.0]
