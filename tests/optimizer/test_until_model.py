"""The optimizer takes loops that end on a condition: the profile reads each run's trips and each row's trips
off the calls (a loop that ends per row gives its calls only the rows not done), the cost model simulates a
plan with each such loop as long as measured -- a row group's copy as long as its slowest row -- and the
candidates include splitting the loop with its consumer into row groups, per group count."""

from __future__ import annotations

from pathlib import Path

import pytest

from rose_dsl import load_workflow_text
from rose_dsl.optimizer.candidates import Feasible, alternatives, check, sweep
from rose_dsl.optimizer.model import CostModel
from rose_dsl.optimizer.profile import Call, IterationRun, TripStats, trip_stats
from rose_dsl.transforms import apply_request

WF = load_workflow_text((Path(__file__).resolve().parents[1] / "dsl" / "fixtures" / "until_decode_split.yaml").read_text(),
                        "until.yaml")
LENGTHS = (1, 1, 2, 1, 1, 3, 1, 10)  # per row: a long tail (one row ten times the median)


def _run(k: int, lengths=LENGTHS, ms_per_row: float = 1.0) -> IterationRun:
    """A measured iteration of the declared workflow: `gen` at each trip on the rows not done yet."""
    calls, t = [Call("iteration.prompt", "lm", k, (k,), 0, 100_000, len(lengths))], 100_000
    for trip in range(max(lengths)):
        live = sum(1 for n in lengths if n > trip)
        dur = int((0.2 + ms_per_row * live) * 1e6)
        calls.append(Call("iteration.decode.gen", "lm", k, (k, trip), t, t + dur, live))
        t += dur
    for node, comp in (("iteration.score", "judge"), ("iteration.learn", "lm")):
        calls.append(Call(node, comp, k, (k,), t, t + 1_000_000, len(lengths) if node.endswith("score") else None))
        t += 1_000_000
    return IterationRun(t / 1e9, tuple(calls), 0, t, k)


def test_the_profile_reads_each_rows_trips_off_the_rows_each_trip_computed() -> None:
    stats = trip_stats([_run(0), _run(1)], [("iteration.decode", "iteration.decode.gen")])["iteration.decode"]
    assert stats.trips == (10, 10) and stats.rows == 8
    assert stats.row_trips == tuple(sorted(LENGTHS * 2))
    assert stats.spread > 1.0  # the long tail


def test_a_group_is_as_long_as_its_slowest_row() -> None:
    stats = TripStats("l", (10,), tuple(sorted(LENGTHS)), 8)
    assert stats.group_trips(8) == 10  # every row: the longest
    assert stats.group_trips(1) == pytest.approx(sum(LENGTHS) / 8)  # one row: the mean
    # four rows of eight: the longest row (10) is among them half the time, else the longest of the other
    # three (3 with probability 4/7, else 2 with probability 2/3, else 1): (10 + 17/7) / 2
    assert stats.group_trips(4) == pytest.approx((10 + 17 / 7) / 2)
    flat = TripStats("l", (4,), (4,) * 8, 8)
    assert flat.group_trips(2) == 4 and flat.spread == 0.0  # no spread: splitting shortens nothing


def test_the_model_simulates_each_copy_as_long_as_its_slowest_row() -> None:
    model = CostModel()
    model.observe([_run(0), _run(1)], WF)
    declared = model.with_trips(WF)
    assert declared.find(("iteration", "decode")).count == 10  # type: ignore[union-attr]
    plan = apply_request(WF, "split-chain decode score 4").workflow
    static = model.with_trips(plan)
    counts = [static.find(("iteration", f"decode@{g}")).count for g in range(4)]  # type: ignore[union-attr]
    want = round(TripStats("l", (10,), tuple(sorted(LENGTHS * 2)), 8).group_trips(2))
    assert counts == [want] * 4 and want < 10
    assert all(not getattr(i, "dynamic", False) for i in static.items())
    assert model.predict(plan, lower_bound=True).seconds is not None


def test_without_measured_trips_the_analysis_count_stands() -> None:
    assert CostModel().with_trips(WF) is WF


def test_the_candidates_split_an_until_loop_with_its_consumer_per_group_count() -> None:
    wanted = {f"split-chain decode score {k}" for k in (2, 4, 8)}
    assert wanted <= {a.requests[0] for a in sweep(WF) if a.family == "split-chain"}
    alts = [a for a in alternatives(WF, "iteration.decode.gen") if a.family == "split-chain"]
    assert {a.groups for a in alts} == {2, 4, 8}
    assert all(isinstance(check(WF, a), Feasible) for a in alts)
    assert not [a for a in alternatives(WF, "iteration.decode.gen") if a.family == "split-interleave"]


def test_the_candidates_interleave_rollout_epochs_whose_episodes_end_on_their_own() -> None:
    """Rollout epochs holding an episode loop that ends per row: the temporal split of the epochs with its
    groups taking turns is a candidate and legal -- and it runs interleaved (tests/transforms/
    test_until_rewrites.py), so what the optimizer measures for it is the overlap, not the split alone
    (CPU, `latency_until_episodes.yaml`: 1.77x, docs/results.md)."""
    wf = load_workflow_text((Path(__file__).resolve().parents[2] / "workflows" / "latency_until_episodes.yaml")
                            .read_text(), "latency_until_episodes.yaml")
    alts = [a for a in sweep(wf) if a.requests == ("split-time epoch 2", "interleave epoch")]
    assert alts and all(isinstance(check(wf, a), Feasible) for a in alts)
    # the episode loop itself is never split in time (its trips are known only as it runs)
    assert {r.split()[1] for a in sweep(wf) for r in a.requests if r.startswith("split-time")} == {"epoch"}


def test_the_candidates_interleave_sibling_until_loops_on_different_components() -> None:
    """A decode and an episode rollout that share no component: the driver waits for the decode's condition
    after each trip, so the episodes started only once every completion ended, and the take-turns candidate
    was never proposed (it asked for a shared component). Acceptance sweep of issue 45, CPU, 1 ms per act
    and step: `interleave decode ep` 2.15x the declared iteration (`rose compare`, 20 rounds)."""
    wf = load_workflow_text((Path(__file__).resolve().parents[1] / "dsl" / "fixtures" / "until_siblings.yaml")
                            .read_text(), "until_siblings.yaml")
    alts = [a for a in sweep(wf) if a.family == "take-turns" and a.requests[-1] == "interleave decode ep"]
    assert alts and all(isinstance(check(wf, a), Feasible) for a in alts)
    assert [a for a in alternatives(wf, "iteration.decode.gen") if a.requests[-1] == "interleave decode ep"]
