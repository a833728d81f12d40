"""`optimize_compare_summary.py`: is the optimizer's figure within the compare's paired ratios?"""

from __future__ import annotations

from benchmarks.optimize_compare_summary import summarize


def _docs(reported: float, declared: list[float], plan: list[float]) -> tuple[dict, dict]:
    report = {"workflow": "w", "speedup": reported, "plan_requests": ["split-time epoch 2"], "headline": {},
              "stopped": "done", "cut_short": False, "settings": {"budget_s": 300.0}, "overhead_s": {},
              "machine": {"gpu": "G"}}
    row = {"throughput": {}, "sm_activity": None, "spread": 0.01}
    compare = {"rounds_done": len(declared), "rows": [
        {**row, "label": "declared", "seconds": declared, "median_s": sorted(declared)[len(declared) // 2],
         "speedup": 1.0},
        {**row, "label": "rose", "seconds": plan, "median_s": sorted(plan)[len(plan) // 2], "speedup": 1.2}]}
    return report, compare


def test_the_reported_figure_is_judged_against_the_compare_s_spread_and_paired_ratios() -> None:
    # rounds give 1.25, 1.20, 1.10 (declared / plan, round by round); the compare says 1.2x, spreads 1%
    declared, plan = [10.0, 9.6, 8.8], [8.0, 8.0, 8.0]
    assert summarize(*_docs(1.21, declared, plan))["reported_within_compare_range"] is True
    assert summarize(*_docs(1.30, declared, plan))["reported_within_compare_range"] is False
    assert summarize(*_docs(1.05, declared, plan))["reported_within_compare_range"] is False
    # two close rounds: the paired range is narrow, the rows' spread (1%) around 1.2x still counts
    assert summarize(*_docs(1.19, [9.6, 9.61], [8.0, 8.0]))["reported_within_compare_range"] is True
    assert summarize(*_docs(1.17, [9.6, 9.61], [8.0, 8.0]))["reported_within_compare_range"] is False
    doc = summarize(*_docs(1.21, declared, plan))
    assert [round(r, 3) for r in doc["compare"]["paired_ratios"]] == [1.25, 1.2, 1.1]
    assert doc["machine"] == {"gpu": "G"}  # the report's, where the compare has none


def test_one_round_gives_no_range_and_no_verdict() -> None:
    assert summarize(*_docs(1.0, [10.0], [10.0]))["reported_within_compare_range"] is None
