"""Snapshots kept in the component's own process (`ComponentWorker.keep_states`): what `rose optimize`
guards a plan's first iteration and repeats local trials with. A restore gives back the state bit for
bit; a copy that is kept for another restore is never the object the component holds on to (it changes
its state in place); nothing is kept after a dropping restore."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from interpreter.worker import ComponentWorker
from rose_dsl import load_workflow_text


class InPlace:
    """A component that keeps what `set_state` gives it and changes it in place."""

    def __init__(self) -> None:
        self.w = torch.arange(4, dtype=torch.float64)
        self.extra = {"count": 0, "arr": np.zeros(3)}

    def step(self) -> dict:
        self.w.mul_(2).add_(1)  # in place: a kept copy handed over by reference would change too
        self.extra["count"] += 1
        self.extra["arr"] += 1
        return {"y": self.w.sum()}

    def get_state(self, name: str):
        return {"w": self.w, "extra": self.extra}

    def set_state(self, name: str, value) -> None:
        self.w, self.extra = value["w"], value["extra"]


def _worker() -> ComponentWorker:
    wf = load_workflow_text("""
rose: 1
name: kept
components:
  c: {impl: "tests.interpreter.test_kept_states:InPlace", state: [s]}
iteration:
  count: 1
  body:
    - {node: n, call: c.step, out: [y], state: {s: update}}
""", "kept.yaml")
    return ComponentWorker(wf.components["c"], 0, "cpu", ("tests.",))


def test_a_kept_state_comes_back_bit_for_bit_however_often_it_is_restored() -> None:
    worker = _worker()
    before = worker.get_states()
    before = {"s": {"w": before["s"]["w"].clone(), "count": before["s"]["extra"]["count"]}}
    assert worker.keep_states() == 4 * 8 + 3 * 8
    for _ in range(3):  # a local trial's repeats: restore (keeping the copy), run, changes in place
        worker.restore_kept(drop=False)
        assert torch.equal(worker.obj.w, before["s"]["w"]) and worker.obj.extra["count"] == 0
        worker.obj.step()
        worker.obj.step()
        assert not torch.equal(worker.obj.w, before["s"]["w"])
    worker.restore_kept()  # the last restore drops the copy
    assert torch.equal(worker.obj.w, before["s"]["w"]) and worker.obj.extra["count"] == 0
    assert np.array_equal(worker.obj.extra["arr"], np.zeros(3))
    with pytest.raises(RuntimeError, match="restore_kept without keep_states"):
        worker.restore_kept()


def test_a_dropped_copy_cannot_be_restored() -> None:
    worker = _worker()
    worker.keep_states()
    worker.obj.step()
    worker.drop_kept()
    with pytest.raises(RuntimeError, match="without keep_states"):
        worker.restore_kept(drop=False)
