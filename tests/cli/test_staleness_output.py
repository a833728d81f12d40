"""A run's staleness histogram (issue 46): `rose execute` sums the learner's per-iteration counts
(`PREFIX/staleness_hist_LAG`) over the whole run into `staleness.json` and prints a line per learner."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rose_cli.report import staleness_histogram

from .clirun import ROOT, rose


def test_the_histogram_sums_each_learner_s_counts_over_the_iterations() -> None:
    lines = [{"learner/staleness_hist_0": 8.0, "learner/reward": 0.5},
             {"learner/staleness_hist_1": 6.0, "learner/staleness_hist_0": 2.0, "ppo/staleness_hist_2": 3},
             {"learner/staleness_mean": 1.0, "iteration": 2}]
    assert staleness_histogram(lines) == {"learner": {0: 10.0, 1: 6.0}, "ppo": {2: 3.0}}
    assert staleness_histogram([{"learner/reward": 1.0}]) == {}


def test_an_asynchronous_run_writes_its_histogram(tmp_path: Path) -> None:
    """The shipped CPU long-tail GRPO workflow with its generator's budget set to 1 (`--set stale=1`) and
    `defer sync 1`: the first update trains on the initial weights' rollout (lag 0), every later one on a
    rollout one update old (lag 1); a synchronous run of the same workflow has lag 0 only. At the
    workflow's own budget (0) the deferral is refused, and the plan runs only beside its source run with the
    budget it was written against (`--set stale=1`: a plan may not raise its source's budget)."""
    wf, plan = ROOT / "workflows" / "llm_grpo_longtail.yaml", tmp_path / "async.yaml"
    r = rose("rewrite", str(wf), "--do", "defer sync 1", "-o", str(plan))
    assert r.returncode == 2 and "allows max_staleness 0" in r.stderr, r.stderr
    r = rose("rewrite", str(wf), "--set", "iterations=4", "--set", "stale=1", "--do", "defer sync 1", "-o", str(plan))
    assert r.returncode == 0, r.stderr
    r = rose("execute", str(wf), "--set", "stale=1", "--plan", str(plan), "--out", str(tmp_path / "run"))
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads((tmp_path / "run" / "staleness.json").read_text())
    lags = doc["learner"]["samples_by_lag"]
    assert set(lags) == {"0", "1"} and lags["1"] == 3 * lags["0"] and doc["learner"]["max_lag"] == 1
    # beside it, the checker's proof (issue 58): the rollout's reads lag 1 update of the learner's weights,
    # which is what the learner measured
    proof = doc["proof"]
    assert proof["by_source"] == {"learner.weights": doc["learner"]["max_lag"]}
    assert {r["read"]: r["lag"] for r in proof["reads"] if r["state"] == "generator.weights"} == {"submit": 1, "generate": 1}
    assert "staleness (learner): lag 0:" in r.stdout and "lag 1:" in r.stdout
    r = rose("execute", str(wf), "--set", "iterations=2", "--out", str(tmp_path / "sync"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert set(json.loads((tmp_path / "sync" / "staleness.json").read_text())["learner"]["samples_by_lag"]) == {"0"}


def test_a_negative_lag_is_shown_not_dropped() -> None:
    """A sample newer than the learner's published weights is a bug (the PPO policy once counted a resume's
    restore as a weight sync): staleness.json shows it instead of silently leaving it out."""
    assert staleness_histogram([{"ppo/staleness_hist_-1": 2.0, "ppo/staleness_hist_0": 1.0}]) == {"ppo": {-1: 2.0, 0: 1.0}}


@pytest.mark.e2e
def test_a_checkpoint_every_iteration_is_said_to_leave_nothing_overlapping(tmp_path: Path) -> None:
    """`--checkpoint-every 1` drains an asynchronous plan before every checkpoint: the run is synchronous
    (lag 0 throughout), and `rose execute` says so before it starts; a larger N gets a note, and a
    synchronous workflow neither."""
    wf, plan = ROOT / "workflows" / "llm_grpo_longtail.yaml", tmp_path / "async.yaml"
    r = rose("rewrite", str(wf), "--set", "iterations=3", "--set", "stale=1", "--do", "defer sync 1", "-o", str(plan))
    assert r.returncode == 0, r.stderr
    r = rose("execute", str(wf), "--set", "stale=1", "--plan", str(plan), "--out", str(tmp_path / "every1"), "--checkpoint-every", "1")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "warning: --checkpoint-every 1 drains this asynchronous plan's pipeline after every iteration" in r.stderr
    lags = json.loads((tmp_path / "every1" / "staleness.json").read_text())["learner"]["samples_by_lag"]
    assert set(lags) == {"0"}  # what the warning says: nothing overlapped
    r = rose("execute", str(wf), "--set", "stale=1", "--plan", str(plan), "--out", str(tmp_path / "every2"), "--checkpoint-every", "2")
    assert r.returncode == 0 and "one iteration in 2 does not overlap the next" in r.stderr, r.stderr
    r = rose("execute", str(wf), "--set", "iterations=2", "--out", str(tmp_path / "sync"), "--checkpoint-every", "1")
    assert r.returncode == 0 and "drains" not in r.stderr, r.stderr


def test_a_measured_lag_above_the_proof_is_a_checker_bug() -> None:
    """Issue 58: the run measures what the checker proves; a learner reporting an older sample than any read
    of the plan is proved to see means the checker accepted a plan it should not have -- `rose execute` then
    ends with exit 1 saying so (after its work is kept). At or below the proof: nothing."""
    import io

    from rich.console import Console

    from interpreter.runner import IterationResult
    from rose_cli.report import staleness
    from rose_dsl import load_workflow
    from rose_dsl.transforms import apply

    plan = apply(load_workflow(ROOT / "tests" / "dsl" / "fixtures" / "async_relay_chain.yaml"), "defer sync1 1")
    console = Console(file=io.StringIO())
    ok = [IterationResult(0, 1.0, {"learner/staleness_hist_0": 2.0}), IterationResult(1, 1.0, {"learner/staleness_hist_1": 2.0})]
    assert staleness(console, None, ok, plan.workflow) is None
    over = [*ok, IterationResult(2, 1.0, {"learner/staleness_hist_2": 1.0})]
    assert staleness(console, None, over, plan.workflow) == (
        "the run measured lag 2 (learner: samples 2 learner updates old) where the checker proves at most 1 for "
        "every read of this plan (staleness.json, `proof`): the checker accepted a plan it should not have")
    assert staleness(console, None, over, load_workflow(ROOT / "tests" / "dsl" / "fixtures" / "async_relay_chain.yaml")) is None
