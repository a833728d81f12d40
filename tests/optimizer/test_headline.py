"""What a person reads first (`rose_dsl/optimizer/headline.py`, report.md): the headline is what was
validated, against the workflow as written, with its spread; a legend for the ranking's symbols; reasons cut
at a word; each refusal with its fix (issues 42 and 44)."""

from __future__ import annotations

import re

import pytest

from rose_dsl.measurement import Books
from rose_dsl.optimizer.headline import clip, fix_for, headline, headline_lines
from rose_dsl.optimizer.report import build_report, report_markdown
from rose_dsl.optimizer.search import Settings, optimize_graph

from .fakes import FakeMeasurer
from .test_search import LATENCY, QUIET, wf  # noqa: F401 - the fixture


def _doc(result, **extra):
    doc = build_report(result, books=Books(complete_iterations=10, complete_s=5.0), total_s=8.0, workflow="w",
                       file="w.yaml", settings={}, machine={}, stage2=None, plan_file="p.yaml", run_dir=None,
                       activity_kind="cpu")
    doc.update(extra)
    return doc


def test_a_before_after_decided_by_the_rule_is_the_validated_headline(wf) -> None:  # noqa: F811
    result = optimize_graph(wf, FakeMeasurer(LATENCY, iterations=10_000), Settings(), **QUIET)
    assert result.requests and result.verdict is not None and result.verdict.outcome == "faster"
    assert result.validated and "Wilcoxon" in result.rule
    h = headline(_doc(result))
    assert h["validated"] and "confidence" in h["how"] and "compare" not in h
    text = report_markdown(_doc(result), None)
    assert "not validated" not in text and "Decision rule: one-sided Wilcoxon" in text


def test_no_before_after_means_not_validated_with_the_stages_spread_and_a_compare_command(wf) -> None:  # noqa: F811
    """H100, issue 42: 1.29x reported from a declared median of spread 20% after the before/after measured 0
    rounds; `rose compare` then measured 1.21x. Now the figure says it is the stage's own, with its spread."""
    result = optimize_graph(wf, FakeMeasurer(LATENCY, iterations=10_000), Settings(final_rounds=0), **QUIET)
    assert result.requests and result.verdict is None and not result.validated
    doc = _doc(result)
    h = headline(doc)
    assert not h["validated"] and h["compare"] == "rose compare w.yaml --plan p.yaml --rounds 8"
    first = headline_lines(h)[0]
    assert "**not validated**" in first and re.search(r"spread \d+%\) -> plan", first)
    assert "no before/after was measured" in first
    assert ", not validated |" in report_markdown(doc, None)


def test_with_a_layout_the_headline_is_against_the_workflow_as_written(wf) -> None:  # noqa: F811
    """Meta-World, H200 (issue 44): the layout trials measured sim_replicas=8 at 1.86x (4.41 s against 8.21 s)
    and the table read "declared 4.6088 s -> plan 4.6088 s, 1.00x": its declared was the graph after the layout."""
    result = optimize_graph(wf, FakeMeasurer(LATENCY, iterations=10_000), Settings(rounds=1), **QUIET)
    row = {"values": {"sim_replicas": 8}, "accepted": True, "speedup": 1.86, "margin": 0.05,
           "reference": {"median": 8.21, "spread": 0.05, "n": 4}, "candidate": {"median": 4.41, "spread": 0.04, "n": 4}}
    doc = _doc(result, layout={"candidates": [row], "chosen": {"sim_replicas": 8}, "summary": "sim_replicas=8: 1.86x"})
    h = headline(doc)
    assert h["speedup"] == pytest.approx(1.86 * doc["speedup"]) and h["declared_s"] == 8.21
    assert "as written" in h["against"] and "chained" in h["how"]
    text = report_markdown(doc, None)
    assert "| declared, as written | 8.2100 s" in text and "| declared at the layout |" in text


def test_the_report_has_a_legend_and_cuts_no_reason_mid_word(wf) -> None:  # noqa: F811
    result = optimize_graph(wf, FakeMeasurer(LATENCY, iterations=10_000), Settings(rounds=1), **QUIET)
    text = report_markdown(_doc(result), None)
    legend = next(line for line in text.splitlines() if line.startswith("Legend:"))
    for symbol in ("D_v", "T(v)", "a_v", "tier", "S(v) = D_v (1 - a_v)"):
        assert symbol in legend
    long = "loop 'epoch' is dependent ('trainer.weights' updated by sgd, written by sgd; " * 5
    cut = clip(long, 100)
    assert len(cut) <= 100 and cut.endswith(" ...") and long.startswith(cut[:-4])
    assert long[len(cut) - 4] == " "  # the cut falls between words


def test_each_refusal_says_the_fix() -> None:
    assert "loop of their own" in fix_for("loop 'epoch' is dependent ('trainer.weights' updated by sgd): its iterations")
    assert "fuse first" in fix_for("'rollout@0' and 'update' run different iterations (0, 2 against 0, 1, 2)")
    assert "batch: 0" in fix_for("'score' (scorer.score) is not batch-separable: it has no 'batch:' declaration, so")
    assert fix_for("something no table knows")  # never empty


def test_infeasible_alternatives_carry_their_fix_into_report_md(wf) -> None:  # noqa: F811
    result = optimize_graph(wf, FakeMeasurer(LATENCY, iterations=10_000), Settings(rounds=1), **QUIET)
    doc = _doc(result)
    refused = [a for r in doc["rounds"] for t in r["targets"] for a in t["alternatives"] if a["status"] == "infeasible"]
    assert refused and all(a["fix"] for a in refused)
    text = report_markdown(doc, None)
    assert text.count("-- fix: ") >= len(refused)


def test_metrics_merged_over_copies_are_named_in_the_report() -> None:
    from rose_dsl.optimizer.report import metrics_markdown

    notes = {"sim/reward_so_far": "not mergeable (declared 'copies'): one figure per process (2)",
             "sim/reward": "mean over 2 processes (undeclared: the default; declare metric_merge if it is a snapshot)"}
    text = "\n".join(metrics_markdown(notes))
    assert "## Metrics under the plans" in text and "`sim/reward_so_far`: not mergeable" in text
    assert "undeclared" in text and metrics_markdown({}) == []
