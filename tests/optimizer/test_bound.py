"""The reorder bound (rose_dsl/optimizer/bound.py): the critical path of the declared iteration at the
measured durations, against an iteration measured with every call run one after the other."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from rose_dsl import load_workflow
from rose_dsl.optimizer.bound import local_saving_bound, reorder_bound
from rose_dsl.optimizer.profile import IterationRun

from .fakes import FakeMeasurer, GroundTruth

ROOT = Path(__file__).resolve().parents[2]


def _serialized(run: IterationRun) -> IterationRun:
    """The same calls, one after the other (what a fully sequential runtime would measure)."""
    t, calls = run.start_ns, []
    for c in sorted(run.calls, key=lambda c: c.start_ns):
        calls.append(replace(c, start_ns=t, end_ns=t + (c.end_ns - c.start_ns)))
        t += c.end_ns - c.start_ns
    return replace(run, calls=tuple(calls), seconds=(t - run.start_ns) / 1e9, end_ns=t)


def test_the_bound_is_the_longest_chain_and_says_what_overlap_could_give() -> None:
    """latency_interaction: epoch 1's rollout does not need update 0 (and update 0 only needs epoch 0),
    so with unlimited overlap update 0 runs beside epoch 1; every other call is on the chain."""
    wf = load_workflow(ROOT / "workflows" / "latency_interaction.yaml", {"iterations": 4})
    truth = GroundTruth(fixed={"sim": 0.002, "policy": 0.003, "trainer": 0.01})
    runs = [_serialized(r) for r in FakeMeasurer(truth, noise=0.0).complete([wf], 3)[0]]
    b = reorder_bound(wf, runs)
    assert b is not None and b["matched"] == b["invocations"]
    update0 = [c.seconds for c in runs[0].calls if c.node.endswith("update.sgd") and c.indices[1] == 0]
    assert b["seconds"] == pytest.approx(runs[0].seconds - update0[0], rel=1e-6)
    assert b["speedup_bound"] == pytest.approx(runs[0].seconds / b["seconds"]) and b["speedup_bound"] > 1
    assert b["chain"][0] == "epoch.reset[0]" and b["chain"][-1] == "sync"
    assert "update.sgd[1]" in b["chain"] and "update.sgd[0]" not in b["chain"]


def test_no_calls_no_bound() -> None:
    wf = load_workflow(ROOT / "workflows" / "latency_interaction.yaml")
    assert reorder_bound(wf, []) is None and reorder_bound(wf, [IterationRun(1.0)]) is None


def test_a_change_inside_a_region_saves_at_most_its_span_beyond_its_busiest_process() -> None:
    """`local_saving_bound`: each epoch's span is 11 simulator calls and 10 policy calls one after the other;
    the simulator alone is busy for 11 of them, so no local rewrite of the epoch can save more than the
    policy's 10 calls per epoch -- 2 epochs x 10 x 2 ms per iteration, bounded by `sim`."""
    wf = load_workflow(ROOT / "workflows" / "latency_interaction.yaml", {"iterations": 4})
    truth = GroundTruth(fixed={"sim": 0.006, "policy": 0.002, "trainer": 0.02})
    runs = FakeMeasurer(truth, noise=0.0).complete([wf], 3)[0]
    seconds, process = local_saving_bound(wf, ("iteration", "epoch"), runs) or (None, None)
    assert seconds == pytest.approx(2 * 10 * 0.002, rel=1e-6) and process == "sim"
    assert local_saving_bound(wf, ("iteration", "nothing"), runs) is None


def test_no_measured_local_alternative_saves_more_than_the_bound() -> None:
    """The bound's claim checked against what the search measures: with the simulator and the policy of
    similar cost (each half of an epoch: the bound is large), every local alternative's measured saving per
    iteration stays under it."""
    from rose_dsl.optimizer.search import Settings, optimize_graph

    from .test_search import LATENCY

    wf = load_workflow(ROOT / "workflows" / "latency_interaction.yaml", {"iterations": 1000})
    runs = FakeMeasurer(LATENCY, noise=0.0).complete([wf], 3)[0]
    result = optimize_graph(wf, FakeMeasurer(LATENCY), Settings(local_max_fraction=None), log=lambda _: None)
    measured = [a for t in result.rounds[0].targets for a in t.alternatives if a.status == "measured"]
    assert measured
    for a in measured:
        bound = local_saving_bound(wf, ("iteration", "epoch"), runs)
        assert bound is not None and a.benefit_s <= bound[0] * 1.05, (a.label, a.benefit_s, bound)
