"""benchmarks/plan_semantics.py on the CPU: a plan of the latency workflow trains what the declared one
trains -- states bit-identical, metrics equal up to the summation order of a mean over temporal copies
(docs/optimizer.md, "Semantics"); the script must find exactly that, and find a real difference."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.plan_semantics import compare, main  # noqa: E402


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_a_temporal_split_trains_the_same_state_on_the_cpu(tmp_path: Path) -> None:
    out = tmp_path / "sem"
    code = main(["workflows/latency_interaction.yaml", "--iterations", "3", "--do", "split-time epoch 2",
                 "--do", "interleave epoch", "--backend", "local", "--out", str(out)])
    assert code == 0
    doc = json.loads((out / "semantics.json").read_text())
    assert doc["iterations"] == [3, 3] and doc["all_states_identical"]
    assert any(k.startswith("trainer.weights") for k in doc["states"])
    assert doc["metrics"] and doc["max_metric_rel"] < 1e-12  # summation order at most
    assert doc["metrics"]["trainer/loss"]["identical"]
    assert doc["metrics"]["trainer/loss"]["first_differs"] is None
    assert doc["metrics"]["trainer/loss"]["declared"] == doc["metrics"]["trainer/loss"]["plan"]

    # the first iteration that differs is named: the declared run against itself with iteration 1's loss moved
    moved = tmp_path / "moved"
    shutil.copytree(out / "declared", moved)
    rows = [json.loads(line) for line in (moved / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rows[1]["trainer/loss"] += 1e-3
    (moved / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    loss = compare(out / "declared", moved)["metrics"]["trainer/loss"]
    assert not loss["identical"] and loss["first_differs"] == rows[1]["iteration"]
    assert loss["plan"][1] - loss["declared"][1] == pytest.approx(1e-3)

    # a run that trained differently is found: one more iteration's state against the 3-iteration one
    other = tmp_path / "other"
    assert main(["workflows/latency_interaction.yaml", "--iterations", "4", "--do", "split epoch.step 2",
                 "--backend", "local", "--out", str(other)]) == 0
    diff = compare(out / "declared", other / "plan")
    assert not diff["all_states_identical"] and diff["max_state_rel_to_max"] > 0
