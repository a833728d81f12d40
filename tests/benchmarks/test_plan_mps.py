"""benchmarks/plan_mps.py: a plan with a component's MPS client priority or quota changed, which `rose compare`
takes as a row of the same computation (it moves the process on each switch)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from benchmarks.plan_mps import with_mps
from rose_cli.compare import same_computation
from rose_dsl import load_workflow
from rose_dsl.cli import load_or_exit

ROOT = Path(__file__).resolve().parents[2]
GPU_WF = ROOT / "workflows" / "llm_grpo_longtail_gpu.yaml"


def test_a_low_priority_learner_plan_is_the_same_computation(tmp_path: Path) -> None:
    source, out = tmp_path / "best_async.yaml", tmp_path / "low.yaml"
    for cmd in ([sys.executable, "-m", "rose_cli", "rewrite", str(GPU_WF), "--set", "stale=1", "--do", "defer sync 1",
                 "-o", str(source)],
                [sys.executable, str(ROOT / "benchmarks" / "plan_mps.py"), str(source), "-o", str(out),
                 "--priority", "learner=1", "--quota", "reference=70"]):
        res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        assert res.returncode == 0, res.stderr
    low = load_or_exit(out, None, source=GPU_WF, source_sets=["stale=1"])
    assert (low.components["learner"].mps_priority, low.components["reference"].mps_quota) == (1, 70)
    assert low.components["generator"].mps_priority is None
    assert same_computation(load_workflow(GPU_WF, {"stale": 1}), low) == []


@pytest.mark.parametrize(("settings", "message"), [
    ({"priority": ["prompts=1"]}, "not on the GPU"),
    ({"priority": ["trainer=1"]}, "no component 'trainer'"),
    ({"priority": ["learner=2"]}, "0 <= N <= 1"),
    ({"quota": ["learner"]}, "COMPONENT=N"),
    ({"quota": ["learner=0"]}, "1 <= N <= 100"),
])
def test_bad_settings_are_refused_by_name(settings: dict[str, list[str]], message: str) -> None:
    doc = yaml.safe_load(GPU_WF.read_text())
    with pytest.raises(ValueError, match=message):
        with_mps(doc, settings)
