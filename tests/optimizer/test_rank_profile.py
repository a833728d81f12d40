"""Profiles, node statistics and the ranking (paper §4.3.2), on synthetic calls and on a profile recorded
on the CPU (`data/latency_interaction.profile.json`, `rose optimize`'s own measuring path)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rose_dsl import load_workflow
from rose_dsl.optimizer.model import CostModel
from rose_dsl.optimizer.profile import Call, IterationRun, NodeStats, Profile, node_stats
from rose_dsl.optimizer.rank import rank_nodes

ROOT = Path(__file__).resolve().parents[2]
RECORDED = Path(__file__).parent / "data" / "latency_interaction.profile.json"


def _call(node: str, start_ms: float, dur_ms: float, activity: float | None = None, comp: str = "c",
          iteration: int = 0, rows: int | None = None, source: str = "") -> Call:
    return Call(node, comp, iteration, (iteration,), int(start_ms * 1e6), int((start_ms + dur_ms) * 1e6), rows, activity,
                source)


def test_node_stats_are_per_iteration_and_time_weighted() -> None:
    runs = [IterationRun(1.0, (_call("iteration.a@0", 0, 100, 0.2, source="iteration.a"),
                               _call("iteration.a@1", 100, 300, 0.6, source="iteration.a"),
                               _call("iteration.b", 400, 50, None))),
            IterationRun(1.0, (_call("iteration.a", 0, 200, 0.4, iteration=1),))]
    stats = node_stats(runs)
    a = stats["iteration.a"]
    assert a.total_s == pytest.approx(0.3)  # (0.1 + 0.3 + 0.2) / 2 iterations
    assert a.mean_s == pytest.approx(0.2)
    assert a.calls_per_iteration == pytest.approx(1.5)
    assert a.activity == pytest.approx((0.1 * 0.2 + 0.3 * 0.6 + 0.2 * 0.4) / 0.6)
    assert stats["iteration.b"].activity is None


def _stats(node: str, total: float, activity: float | None) -> NodeStats:
    return NodeStats(node, "c", total, total, 1.0, activity)


def test_tiers_then_score_then_threshold() -> None:
    stats = {s.node: s for s in (
        _stats("busy", 5.0, 0.9),  # excluded: a >= 0.8
        _stats("mid_long", 4.0, 0.6),  # tier 2 even though S is large
        _stats("low_short", 0.01, 0.1),  # below min(tau_a, tau_r * T_iter)
        _stats("low_a", 1.0, 0.2),  # S = 0.8
        _stats("low_b", 2.0, 0.45),  # S = 1.1
    )}
    ranking = rank_nodes(stats, iteration_s=10.0, k=3, tau_a=1.0, tau_r=0.05)
    assert ranking.threshold_s == pytest.approx(0.5)
    assert [t.node for t in ranking.targets] == ["low_b", "low_a", "mid_long"]
    assert [t.rank for t in ranking.targets] == [0, 1, 2]
    by = {r.node: r for r in ranking.all}
    assert by["busy"].tier is None and not by["busy"].eligible and "busy" in by["busy"].reason
    assert not by["low_short"].eligible and "D_v" in by["low_short"].reason
    assert by["mid_long"].tier == 2


def test_no_activity_counts_as_idle() -> None:
    ranking = rank_nodes({"x": _stats("x", 1.0, None)}, iteration_s=1.0)
    assert ranking.targets[0].score == pytest.approx(1.0)


def test_recorded_profile_ranks_the_interaction_loop_first() -> None:
    profile = Profile.load(RECORDED)
    assert profile.activity_kind == "cpu" and len(profile.runs) == 3
    stats = node_stats(profile)
    ranking = rank_nodes(stats, profile.iteration_s, k=3, tau_r=0.05)
    top = {t.node for t in ranking.targets[:2]}
    assert top == {"iteration.epoch.step.act", "iteration.epoch.step.env"}
    # sleeping components leave their core idle: tier 1
    assert all(t.tier == 1 for t in ranking.targets)
    assert stats["iteration.epoch.step.act"].calls_per_iteration == 20


def test_profile_json_round_trip(tmp_path: Path) -> None:
    profile = Profile.load(RECORDED)
    profile.save(tmp_path / "p.json")
    assert Profile.load(tmp_path / "p.json") == profile


def test_model_from_recorded_profile_predicts_the_declared_iteration() -> None:
    """The cost model fitted on the recorded iterations reproduces their time (the sequential plan), and
    says plainly that it cannot predict a split before it has seen another row count."""
    from rose_dsl.transforms import apply_request

    wf = load_workflow(ROOT / "workflows" / "latency_interaction.yaml")
    profile = Profile.load(RECORDED)
    model = CostModel()
    model.observe(profile.runs, wf)
    pred = model.predict(wf)
    assert pred.seconds == pytest.approx(profile.iteration_s, rel=0.15)
    assert model.latency_s < 0.005
    split = apply_request(wf, "split epoch.step 2").workflow
    unknown = model.predict(split)
    assert unknown.seconds is None and any("32 rows" in u for u in unknown.unknown)
