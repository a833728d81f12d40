"""benchmarks/async_step_size.py: each learning rate trains the declared workflow and its asynchronous plan,
and the asynchronous run's samples are one update old (the trainer's own count), so the sweep compares what
it says it compares."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from benchmarks import async_step_size


def test_the_sweep_trains_both_plans_and_the_async_one_at_lag_one(tmp_path: Path, monkeypatch) -> None:
    out = tmp_path / "sweep.json"
    argv = ["async_step_size.py", "--lrs", "0.001", "--iterations", "3", "--num-envs", "4", "--out", str(out)]
    monkeypatch.setattr(sys, "argv", argv)
    threads = torch.get_num_threads()
    try:
        async_step_size.main()
    finally:
        torch.set_num_threads(threads)
    runs = json.loads(out.read_text())["runs"]
    assert [(r["lr"], r["plan"]) for r in runs] == [(0.001, "sync"), (0.001, "async")]
    assert all(len(r["returns"]) == 3 for r in runs)
    assert runs[0]["staleness_max"] == 0.0 and runs[1]["staleness_max"] == 1.0
    assert runs[0]["returns"][0] == runs[1]["returns"][0]  # the same seed: the first rollout is the same
    assert runs[0]["returns"][1:] != runs[1]["returns"][1:]  # then the async one samples with older weights
