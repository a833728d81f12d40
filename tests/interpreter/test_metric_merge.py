"""Metrics under plans (`interpreter/metric_merge.py`): each metric merges across a component's processes
by the rule its component declares; a snapshot is reported per copy and named, never silently averaged."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from interpreter.backends import LocalBackend
from interpreter.metric_merge import merge_metrics, merge_rule_problem
from interpreter.runner import RunConfig, Runner
from interpreter.schedule import Schedule
from rose_dsl import load_workflow
from rose_dsl.transforms import apply_request

ROOT = Path(__file__).resolve().parents[2]


def test_rules_merge_as_declared() -> None:
    per = {"sim@0": {"steps": 20.0, "r": -1.0, "lr": 0.1, "best": 3.0, "ema": -5.0},
           "sim": {"steps": 10.0, "r": -2.0, "lr": 0.2, "best": 4.0, "ema": -7.0}}
    rules = {"sim": {"steps": "sum", "r": "mean", "lr": "last", "best": "max", "ema": "copies"}}
    got = merge_metrics(per, {"sim@0": 14, "sim": 7}, rules)
    assert got.values == {"sim/steps": 30.0, "sim/r": pytest.approx(-4.0 / 3), "sim/lr": 0.2, "sim/best": 4.0,
                          "sim/ema@0": -5.0, "sim/ema": -7.0}
    assert "not mergeable" in got.notes["sim/ema"] and "undeclared" not in got.notes["sim/r"]


def test_undeclared_metrics_keep_the_default_and_are_named() -> None:
    got = merge_metrics({"sim#1": {"env_steps": 3.0, "x": 1.0}, "sim": {"env_steps": 4.0, "x": 3.0}})
    assert got.values == {"sim/env_steps": 7.0, "sim/x": 2.0}
    assert "undeclared" in got.notes["sim/x"] and "snapshot" in got.notes["sim/x"]
    one = merge_metrics({"sim": {"x": 1.0}}, declared={"sim": {"x": "copies"}})
    assert one.values == {"sim/x": 1.0} and not one.notes  # one process: nothing to merge, nothing to say


def test_the_processes_are_folded_by_the_base_the_runner_gives_not_by_their_names() -> None:
    per = {"sim@0": {"steps": 2.0}, "sim": {"steps": 3.0}, "other#1": {"steps": 5.0}}
    got = merge_metrics(per, base={"sim@0": "sim", "sim": "sim", "other#1": "env"})
    assert got.values == {"sim/steps": 2.5, "env/steps": 5.0}  # undeclared: the mean over the processes


def test_a_star_sets_the_components_default() -> None:
    got = merge_metrics({"a@0": {"m": 1.0}, "a": {"m": 5.0}}, declared={"a": {"*": "max"}})
    assert got.values == {"a/m": 5.0}


def test_declaration_problems_are_named() -> None:
    assert merge_rule_problem({"x": "sum", "*": "copies"}) is None
    assert "unknown rule" in (merge_rule_problem({"x": "average"}) or "")
    assert "must be a dict" in (merge_rule_problem(["sum"]) or "")


def _metrics(impl: str, split: bool) -> tuple[list[dict[str, float]], dict[str, str]]:
    wf = load_workflow(ROOT / "workflows" / "latency_interaction.yaml",
                       {"epochs": 3, "iterations": 2, "fixed_ms": 0.0, "per_row_ms": 0.0})
    wf = replace(wf, components={**wf.components, "sim": replace(wf.components["sim"], impl=impl)})
    if split:
        wf = apply_request(wf, "split-time epoch 2").workflow
    sch = Schedule(wf)
    runner = Runner(wf, LocalBackend(wf, ("examples.", "tests."), sch.program.loops_of),
                    RunConfig(iterations=2, tensorboard=False), sch)
    try:
        runner.run()
    finally:
        runner.backend.shutdown()
    return [{k: v for k, v in r.metrics.items() if k.startswith("sim/")} for r in runner.results], runner.metric_notes


def test_a_snapshot_metric_under_split_time_is_reported_per_copy_and_named() -> None:
    """Declared: the snapshot differs between the declared run and any merge of the copies' snapshots, so
    the plan reports it per copy (`sim/reward_so_far@0`, `sim/reward_so_far`) and says so; the mergeable
    metrics stay equal to the declared run's."""
    impl = "tests.interpreter.snapshot_sim:SnapshotSim"
    declared, _ = _metrics(impl, split=False)
    split, notes = _metrics(impl, split=True)
    assert "sim/reward_so_far" in declared[0]
    assert {"sim/reward_so_far@0", "sim/reward_so_far"} <= set(split[0])
    assert "not mergeable" in notes["sim/reward_so_far"]
    for d, s in zip(declared, split, strict=True):
        assert s["sim/reward"] == pytest.approx(d["sim/reward"], rel=1e-12)
        assert s["sim/env_steps"] == d["sim/env_steps"]
    # what a silent average would have said: not the declared figure
    averaged = (split[1]["sim/reward_so_far@0"] + split[1]["sim/reward_so_far"]) / 2
    assert averaged != pytest.approx(declared[1]["sim/reward_so_far"], rel=1e-6)


def test_an_undeclared_snapshot_is_averaged_but_named_in_the_notes() -> None:
    split, notes = _metrics("tests.interpreter.snapshot_sim:UndeclaredSnapshotSim", split=True)
    assert "sim/reward_so_far" in split[0]
    assert "undeclared" in notes["sim/reward_so_far"]


def test_a_bad_declaration_is_said_and_the_defaults_apply() -> None:
    split, notes = _metrics("tests.interpreter.snapshot_sim:BadDeclarationSim", split=True)
    assert "sim/reward_so_far" in split[0]
    assert "unknown rule" in notes["sim"]


def test_a_learners_staleness_histogram_adds_up_over_data_parallel_replicas() -> None:
    """Issue 46's histogram: each trainer replica (`trainer#1`) counts the samples of its own shard, so the
    run's staleness.json must hold their sum (it held their mean: half the samples with two replicas)."""
    got = merge_metrics({"trainer": {"staleness_hist_1": 24.0, "staleness_mean": 1.0},
                         "trainer#1": {"staleness_hist_1": 24.0, "staleness_mean": 1.0}})
    assert got.values == {"trainer/staleness_hist_1": 48.0, "trainer/staleness_mean": 1.0}


def test_the_ppo_trainers_extremes_merge_as_extremes_over_its_replicas() -> None:
    from examples.embodied.ppo import PPOTrainer

    got = merge_metrics({"trainer": {"ratio_max": 1.2, "ratio_min": 0.9, "staleness_max": 0.0, "staleness_hist_0": 3.0},
                         "trainer#1": {"ratio_max": 1.5, "ratio_min": 0.7, "staleness_max": 1.0, "staleness_hist_0": 2.0}},
                        declared={"trainer": PPOTrainer.metric_merge})
    assert got.values == {"trainer/ratio_max": 1.5, "trainer/ratio_min": 0.7, "trainer/staleness_max": 1.0,
                          "trainer/staleness_hist_0": 5.0}
