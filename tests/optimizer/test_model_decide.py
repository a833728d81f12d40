"""The cost model (row model, contention, simulation) and the accept/reject rule."""

from __future__ import annotations

from pathlib import Path

import pytest

from rose_dsl import load_workflow
from rose_dsl.optimizer.decide import summarize
from rose_dsl.optimizer.model import CostModel, overlaps, simulate
from rose_dsl.optimizer.profile import Call, IterationRun
from rose_dsl.transforms import apply_request

from .fakes import GroundTruth

ROOT = Path(__file__).resolve().parents[2]


def _c(node: str, comp: str, start_ms: float, dur_ms: float, rows: int | None = None) -> Call:
    return Call(node, comp, 0, (0,), int(start_ms * 1e6), int((start_ms + dur_ms) * 1e6), rows)


def test_overlap_fractions() -> None:
    calls = [_c("iteration.a", "x", 0, 10), _c("iteration.b", "y", 5, 10), _c("iteration.c", "x", 20, 5)]
    o = overlaps(calls)
    assert o[0] == {"y": pytest.approx(0.5)}
    assert o[1] == {"x": pytest.approx(0.5)}
    assert o[2] == {}


def test_row_model_from_two_row_counts_and_contention_from_overlaps() -> None:
    """Alone, a call takes 2 ms + 0.1 ms/row; while y runs it is 1.5x slower: the model learns both."""
    calls = [_c("iteration.a", "x", 0, 2 + 0.1 * 64, 64), _c("iteration.a", "x", 20, 2 + 0.1 * 32, 32)]
    t = 100.0
    for _ in range(4):  # overlapped calls: 1.5 x the solo time, fully under a call of y
        d = (2 + 0.1 * 32) * 1.5
        calls += [_c("iteration.a", "x", t, d, 32), _c("iteration.b", "y", t - 1, d + 2)]
        t += 50
    model = CostModel()
    model.observe([IterationRun(1.0, tuple(calls))])
    m = model.rows["iteration.a"]
    assert m.fixed_s == pytest.approx(0.002, rel=1e-6) and m.per_row_s == pytest.approx(0.0001, rel=1e-6)
    assert m.at(16) == pytest.approx(0.0036)
    assert model.contention[("x", "y")] == pytest.approx(0.5, rel=1e-3)


def test_one_row_count_means_unknown_scaling() -> None:
    model = CostModel()
    model.observe([IterationRun(1.0, (_c("iteration.a", "x", 0, 5, 64),))])
    assert model.rows["iteration.a"].at(64) == pytest.approx(0.005)
    assert model.rows["iteration.a"].at(32) is None


def test_simulation_of_a_pipelined_loop_matches_the_analysis() -> None:
    """Two equal stages on two processes, S steps: serial 2 S t; split in two groups, the policy of one
    group runs while the simulator of the other does -- (S + 1/2) x 2 t' with t' the half-batch time."""
    wf = load_workflow(ROOT / "workflows" / "latency_interaction.yaml", {"steps": 10, "epochs": 1})
    truth = GroundTruth(fixed={"sim": 0.0, "policy": 0.0, "trainer": 0.0}, per_row={"sim": 0.001, "policy": 0.001})
    serial = simulate(wf, truth.cost)
    # reset (64 ms) + 10 x (act + env) (64 ms each); update, publish, sync cost nothing
    assert serial.seconds == pytest.approx(0.064 + 10 * 0.128)
    plan = apply_request(wf, "split epoch.step 2").workflow
    piped = simulate(plan, truth.cost)
    assert piped.seconds == pytest.approx(0.064 + (10 * 2 + 1) * 0.032)
    slowed = simulate(plan, truth.cost, {("policy", "sim"): 1.0, ("sim", "policy"): 1.0})
    assert slowed.seconds > piped.seconds  # calls that overlap share the machine


def test_latency_delays_every_dependent_call() -> None:
    wf = load_workflow(ROOT / "workflows" / "latency_interaction.yaml", {"steps": 2, "epochs": 1})
    truth = GroundTruth(fixed={"sim": 0.01, "policy": 0.01, "trainer": 0.0})
    a = simulate(wf, truth.cost).seconds
    b = simulate(wf, truth.cost, latency_s=0.001).seconds
    assert b > a


def test_summary() -> None:
    """Summaries are for the report and the estimates; deciding is the rule's (tests/optimizer/test_decisions.py)."""
    tight = summarize([1.0, 1.01, 0.99, 1.0, 1.0])
    noisy = summarize([1.0, 1.3, 0.7, 1.2, 0.8])
    assert tight.median == 1.0 and tight.spread == pytest.approx(0.02)
    assert noisy.rel_se > tight.rel_se >= 0
    with pytest.raises(ValueError):
        summarize([])
