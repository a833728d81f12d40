"""The reorder bound (rose_dsl/optimizer/bound.py): the critical path of the declared iteration at the
measured durations, against an iteration measured with every call run one after the other."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from rose_dsl import load_workflow
from rose_dsl.optimizer.bound import reorder_bound
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
