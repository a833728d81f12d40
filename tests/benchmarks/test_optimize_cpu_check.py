"""`benchmarks/optimize_cpu.py --check`: the optimizer's speed claims, which the end-to-end tests no longer
assert on wall time (issue 42), are checked on the A/B rounds a benchmark run measured -- here on the
recorded results and on altered copies of them (no run, no clock)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from benchmarks.optimize_cpu import check

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


def _recorded(name: str, file: str) -> dict:
    return json.loads((RESULTS / file).read_text())["results"][name]


def test_the_recorded_runs_meet_the_checks() -> None:
    for name in ("interaction", "nested", "chain"):
        assert check(name, _recorded(name, "optimize_cpu.json")) == [], name
    assert check("decode", _recorded("decode", "optimize_cpu_decode.json")) == []
    assert check("sim_processes", _recorded("sim_processes", "optimize_cpu_layout.json")) == []


def test_a_slower_or_over_split_or_unchosen_plan_fails_them() -> None:
    r = copy.deepcopy(_recorded("interaction", "optimize_cpu.json"))
    r["speedup"], r["plan_requests"] = 1.1, ["split epoch.step 8"]
    misses = check("interaction", r)
    assert any("A/B speedup 1.10x < 1.3x" in m for m in misses) and any("over-split" in m for m in misses)
    r = copy.deepcopy(_recorded("decode", "optimize_cpu_decode.json"))
    r["plan_requests"] = []
    assert any("split-chain sample decode grade" in m for m in check("decode", r))
    r = copy.deepcopy(_recorded("sim_processes", "optimize_cpu_layout.json"))
    r["optimizer"]["layout"]["chosen"] = None
    assert check("sim_processes", r) == ["layout sim_replicas not above 1: chosen the declared one"]
