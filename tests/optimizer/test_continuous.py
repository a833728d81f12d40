"""`rose optimize --train --max-overhead P` end to end on the CPU: a sleep-timed chain whose phase times change
half-way (tests/optimizer/data/drift_chain.yaml, a param schedule: before `at` (120) a split pays a 15-ms call K
times and the declared graph is fastest; from `at` on the calls cost per row and `split-chain generate score
4` or 8 is 1.5-1.7x faster than the declared graph, 2 groups ~1.3x). The run starts on the declared graph,
sees the drift, searches again and ends on a split chain, with the drift, the search and the switch in
metrics.jsonl. The allowance is most of the run (90%): the run is a minute long, and a search that must
decide its candidates on a loaded machine (spreads of 100% and more) needs ~15 s of it.

Marked `slow` (about a minute on the loaded 2-core machine: two searches on real sleeps); the decisions
themselves are tested on a fake clock in test_drift.py. The factors are large (1.3x the other way in the
first half, 1.3-1.7x in the second), so machine noise cannot make the declared graph best in either half;
which group count the second search decides depends on how many candidates the load lets it decide."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

DRIFT_WF = Path(__file__).parent / "data" / "drift_chain.yaml"
CHAIN = re.compile(r"split-chain (sample )?generate score [248]$")
# half the workflow's timings (the same factors): a shorter run
SETS = ["--set", "at=120", "--set", "iterations=340", "--set", "fixed_ms=15", "--set", "later_per_row_ms=0.78125"]


@pytest.mark.e2e
@pytest.mark.slow
def test_the_run_ends_on_the_plan_best_for_its_second_half(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from rose_cli.main import app

    plan, run = tmp_path / "plan.yaml", tmp_path / "run"
    r = CliRunner().invoke(app, ["optimize", str(DRIFT_WF), *SETS, "--rounds", "1", "--budget-s", "8", "-o", str(plan),
                                 "--out", str(run), "--train", "--max-overhead", "90%", "-q"])
    assert r.exit_code == 0, r.output
    report = json.loads((tmp_path / "plan_report" / "report.json").read_text())
    assert report["plan_requests"] == [], report["plan_requests"]  # the first half: the declared graph
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    events = [x for x in lines if "event" in x]
    iterations = [x["iteration"] for x in lines if "event" not in x]
    assert iterations == list(range(340))  # every iteration trained once, in order, events between them
    switch = next((e for e in events if e["event"] == "switch"), None)
    # (the chain may start at the prompts' node: `split-chain sample generate score K` pipelines the same way)
    assert switch is not None and switch["old"] == "" and CHAIN.match(switch["new"]), events
    assert switch["iteration"] >= 120 and switch["declared_s"] > 1.25 * switch["new_s"], switch  # its evidence
    # (a loaded machine may slow the declared graph enough before `at` to start the search early: the rule
    # sees a drift either way, and the search that switches measures the second half)
    drift = next(e for e in events if e["event"] == "drift")
    assert drift["window"]["ratio"] > 1.5 and drift["iteration"] < switch["iteration"], drift
    assert [e["event"] for e in events if e["iteration"] < switch["iteration"]][-1] == "search"
    state = json.loads((run / "optimize_state.json").read_text())
    assert state["plan_requests"] == [switch["new"]] and state["iteration"] == 340
    assert state["overhead"]["spent_s"] <= 0.9 * state["overhead"]["elapsed_s"]
    assert f"# plan written by `rose optimize` from {DRIFT_WF}" in plan.read_text()
    assert switch["new"] in plan.read_text()  # the plan file is the plan the run ended on


@pytest.mark.parametrize("args, says", [
    (["--max-overhead", "2%"], "add --train"),
    (["--train", "--max-overhead", "two"], "a percentage of the run's time"),
    (["--train", "--max-overhead", "100%"], "less than 100%"),
    (["--train", "--max-overhead", "0"], "more than 0%"),
    (["--train", "--max-overhead", "2", "--stage1", str(DRIFT_WF)], "--stage1 fixes the graph"),
    (["--train", "--max-overhead", "2", "--layout", "rows=32,64"], "does not go with --layout"),
    (["--train", "--resume"], "--resume continues a run of rose optimize --train --max-overhead"),
    (["--train", "--max-overhead", "2", "--resume", "--out", "RUN"], "name the plan file the run wrote"),
    (["--train", "--max-overhead", "2", "--resume", "--out", "RUN", "PLAN"], "optimize_state.json does not exist"),
])
def test_max_overhead_is_refused_where_it_cannot_apply(tmp_path: Path, args: list[str], says: str) -> None:
    """One message and exit 2, before anything starts."""
    from typer.testing import CliRunner

    from rose_cli.main import app

    plan, given = tmp_path / "p.yaml", "PLAN" in args
    if given:  # a plan file exists (the declared graph, as a run that never switched wrote it)
        plan.write_text(DRIFT_WF.read_text())
    args = [str(tmp_path / "run") if a == "RUN" else a for a in args if a != "PLAN"]
    r = CliRunner().invoke(app, ["optimize", str(DRIFT_WF), "-o", str(plan), *args])
    assert r.exit_code == 2 and says in r.output and "Traceback" not in r.output, r.output
    assert plan.exists() == given  # (nothing written, nothing removed)
