"""Issue 58: every shipped asynchronous workflow's proof agrees with what a run measures. A shipped workflow is
asynchronous when it declares a staleness budget (`max_staleness`, through its `stale` param: 0 as shipped,
`--set stale=1` for the plan `defer sync 1` its comments name). For each, a short CPU run of that plan writes
`staleness.json`: the checker's proof (the lag of every budgeted read, by source state) beside each
learner's measured histogram; they must agree -- the largest lag measured is the largest lag proved, never
more, and no read's proved lag exceeds its budget. The runs take minutes on the 2-core machine: they run
with `--hypothesis-profile=long` (CI checks that the list below names every shipped asynchronous workflow,
and `test_staleness_output.py` runs the long-tail GRPO one)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import settings

from .clirun import ROOT, rose

ASYNC = sorted(p.stem for p in (ROOT / "workflows").glob("*.yaml") if "max_staleness" in p.read_text())
# the smallest sizes that still run several updates (each budgeted read then happens at its largest lag)
TINY = {
    "embodied_ppo_continuing": ["num_envs=4", "steps=4", "epochs=1", "hidden=16", "denoise_steps=1"],
    "llm_grpo_longtail": [],
}
NOT_ON_CPU = {
    "llm_grpo_longtail_gpu": "a GPU workflow (its CPU twin, llm_grpo_longtail, is checked)",
    "paper_mjx_vla": "MJX on a GPU",
}


def test_every_shipped_asynchronous_workflow_is_checked_or_says_why_not() -> None:
    assert ASYNC == sorted([*TINY, *NOT_ON_CPU]), "a shipped workflow with a staleness budget is new: add it to TINY"


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(TINY))
def test_the_proof_of_a_shipped_asynchronous_plan_agrees_with_its_measured_lags(tmp_path: Path, name: str) -> None:
    if settings.default.max_examples < 1000:
        pytest.skip("the shipped asynchronous workflows' runs take minutes: --hypothesis-profile=long")
    wf, plan = ROOT / "workflows" / f"{name}.yaml", tmp_path / "plan.yaml"
    sets = [x for s in ["iterations=4", "stale=1", *TINY[name]] for x in ("--set", s)]
    r = rose("rewrite", str(wf), *sets, "--do", "defer sync 1", "-o", str(plan))
    assert r.returncode == 0, r.stderr
    r = rose("execute", str(wf), *sets, "--plan", str(plan), "--out", str(tmp_path / "run"))
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads((tmp_path / "run" / "staleness.json").read_text())
    proof = doc.pop("proof")
    assert all(read["lag"] <= read["max_staleness"] for read in proof["reads"]), proof
    proved = max(proof["by_source"].values())
    assert proved == 1 and doc, doc  # (the budget the plan was written against; a learner measured)
    for learner, measured in doc.items():
        assert measured["max_lag"] == proved, (learner, measured, proof)
        assert {int(lag) for lag in measured["samples_by_lag"]} <= set(range(proved + 1)), measured
