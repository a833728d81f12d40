"""The figures the paper table derives from a run's trace: activity integrals and the fraction below 50%,
the interaction loop's span, and the critical path with unlimited overlap."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.lib.paper_profile import Call, RunData, activity_over, critical_path, run_figures

ROOT = Path(__file__).resolve().parents[2]


def test_activity_is_a_step_function_integrated_over_the_window() -> None:
    track = [(0.0, 0.2), (1.0, 0.9), (3.0, 0.0), (4.0, 0.0)]
    integral, covered, below = activity_over(track, 0.5, 3.5)
    assert integral == pytest.approx(0.5 * 0.2 + 2.0 * 0.9 + 0.5 * 0.0)
    assert covered == pytest.approx(3.0) and below == pytest.approx(1.0)
    assert activity_over(track, 5.0, 6.0) == (0.0, 0.0, 0.0)  # no samples: nothing covered, nothing claimed


def _call(node: str, start: float, end: float, **loops: int) -> Call:
    return Call(node, node.split(".")[-1], start, end, tuple(loops.items()))


def _run() -> RunData:
    """Iteration 1 of a 1-epoch, 2-step embodied iteration: reset, act/env twice, one update, publish, sync;
    the update takes 5 s, the rollout 1 s."""
    calls = [
        _call("iteration.epoch.reset", 10.0, 10.1, iteration=1, epoch=0),
        _call("iteration.epoch.step.act", 10.1, 10.3, iteration=1, epoch=0, step=0),
        _call("iteration.epoch.step.env", 10.3, 10.6, iteration=1, epoch=0, step=0),
        _call("iteration.epoch.step.act", 10.6, 10.8, iteration=1, epoch=0, step=1),
        _call("iteration.epoch.step.env", 10.8, 11.1, iteration=1, epoch=0, step=1),
        _call("iteration.update.sgd", 11.1, 16.1, iteration=1, update=0),
        _call("iteration.publish", 16.1, 16.2, iteration=1),
        _call("iteration.sync", 16.2, 16.3, iteration=1),
    ]
    metrics = [{"iteration": 0, "iteration_s": 9.0, "sim/env_steps": 8.0},
               {"iteration": 1, "iteration_s": 6.3, "sim/env_steps": 8.0, "other/env_steps": 2.0}]
    activity = [[(10.0, 0.1), (11.1, 0.8), (16.1, 0.0), (16.3, 0.0)]]
    return RunData(metrics, calls, activity)


def test_run_figures_drop_warmup_and_measure_shape() -> None:
    fig = run_figures(_run(), warmup=1, work_metric="env_steps", loop=("iteration", "epoch", "step"),
                      policy_node="act")
    assert fig["iterations"] == [1] and fig["iteration_s"] == [6.3] and fig["work"] == [10.0]
    assert fig["throughput"] == pytest.approx(10.0 / 6.3)
    assert fig["loop_share"] == [pytest.approx(1.0 / 6.3)]  # the step loop spans 10.1 .. 11.1
    assert fig["sm_activity"] == pytest.approx((1.1 * 0.1 + 5.0 * 0.8) / 6.3)
    assert fig["frac_below_50"] == pytest.approx((1.1 + 0.2) / 6.3)
    assert fig["gpu_work_s"] == [pytest.approx(1.1 * 0.1 + 5.0 * 0.8)]
    assert fig["policy_call_s"] == pytest.approx(0.2)


def test_critical_path_follows_dependencies_with_unlimited_overlap() -> None:
    """With one epoch and two steps, the chain is the whole iteration; the second epoch of a two-epoch
    run would overlap the first update (it only reads the policy's weights)."""
    wf = ROOT / "workflows" / "embodied_ppo.yaml"
    cp = critical_path(_run(), wf, {"epochs": 1, "steps": 2}, warmup=1)
    assert cp["seconds"] == pytest.approx(6.3) and cp["unmatched"] == 0
    assert cp["path"][0] == "epoch.reset[0]" and cp["path"][-1] == "sync"  # the optimizer report's naming
    two = _run()
    extra = [_call(c.node, c.start, c.end, **{**dict(c.loops), "epoch": 1}) for c in two.calls
             if ".epoch." in c.node]
    extra.append(_call("iteration.update.sgd", 16.1, 21.1, iteration=1, update=1))
    cp2 = critical_path(RunData(two.metrics, two.calls + extra, []), wf, {"epochs": 2, "steps": 2}, warmup=1)
    # reset+rollout of epoch 0 (1.1 s), both updates (10 s), publish and sync (0.2 s): epoch 1's rollout is off the path
    assert cp2["seconds"] == pytest.approx(11.3)
