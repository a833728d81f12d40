"""Timeline pictures have a time axis (issue 42): labelled ticks in seconds at round numbers, in the
optimizer's `timeline.svg` and in `benchmarks/plot_timeline.py`."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from rose_dsl.optimizer.profile import Call, IterationRun
from rose_dsl.optimizer.report import tick_label, time_ticks, timeline_svg


@pytest.mark.parametrize(("span", "ticks"), [
    (0.37, [0.0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35]),
    (1.0, [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]),
    (12.0, [0.0, 2.0, 4.0, 6.0, 8.0, 10.0, 12.0]),
    (0.0042, [0.0, 0.001, 0.002, 0.003, 0.004]),  # (a 0.0005 step would be 8.4 intervals)
])
def test_ticks_are_round_numbers_of_seconds_covering_the_span(span: float, ticks: list[float]) -> None:
    assert time_ticks(span) == pytest.approx(ticks)
    assert time_ticks(0.0) == [0.0]


def test_labels_show_the_steps_digits() -> None:
    assert [tick_label(t, 0.05) for t in time_ticks(0.37)[:3]] == ["0.00", "0.05", "0.10"]
    assert [tick_label(t, 2.0) for t in time_ticks(12.0)[-2:]] == ["10", "12"]


def test_the_svg_timeline_has_a_labelled_axis_in_seconds_under_each_panel() -> None:
    calls = (Call("iteration.a", "policy", 0, (0,), 0, 200_000_000), Call("iteration.b", "sim", 0, (0,), 100_000_000, 370_000_000))
    run = IterationRun(0.37, calls, 0, 370_000_000)
    svg = timeline_svg([("declared", run), ("plan", run)])
    ET.fromstring(svg)  # well-formed
    assert svg.count("time (s)") == 2
    labels = re.findall(r'text-anchor="middle">([0-9.]+)</text>', svg)
    assert labels == ["0.00", "0.05", "0.10", "0.15", "0.20", "0.25", "0.30", "0.35"] * 2
    # the 0.20 tick sits where the policy's 200-ms bar ends
    bar = re.search(r'<rect x="([0-9.]+)" y="\d+" width="([0-9.]+)" height="\d+" fill="#[0-9a-f]+" fill-opacity', svg)
    tick = re.search(r'<line x1="([0-9.]+)"[^>]*/><text x="[0-9.]+" y="\d+" font-size="9" text-anchor="middle">0.20<', svg)
    assert bar and tick
    assert float(bar.group(1)) + float(bar.group(2)) == pytest.approx(float(tick.group(1)), abs=0.2)


def _trace(path: Path) -> Path:
    events = [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "policy"}},
              {"ph": "M", "name": "process_name", "pid": 2, "args": {"name": "sim"}}]
    for k in range(2):
        base = 1_000_000 * k  # microseconds
        events += [{"ph": "X", "name": "iteration.act", "pid": 1, "tid": 0, "ts": base + 100, "dur": 250_000,
                    "args": {"loops": {"iteration": k}}},
                   {"ph": "X", "name": "iteration.env@1", "pid": 2, "tid": 0, "ts": base + 250_100, "dur": 500_000,
                    "args": {"loops": {"iteration": k}}},
                   {"ph": "C", "name": "sm", "pid": 0, "ts": base + 300_000, "args": {"sm": 40}}]
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def test_plot_timeline_works_in_seconds_with_round_ticks(tmp_path: Path) -> None:
    from benchmarks.plot_timeline import timeline

    data = timeline(_trace(tmp_path / "trace.json"))
    assert data["iteration"] == 1 and data["span_s"] == pytest.approx(0.75)
    assert data["ticks"] == pytest.approx([0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7])
    (policy, bars_p), (sim, bars_s) = data["rows"]
    assert policy == "policy" and bars_p == [(0.0, 0.25, "iteration.act")]
    assert sim == "sim" and bars_s == [(pytest.approx(0.25), 0.5, "iteration.env")]
    assert data["activity"] == [(pytest.approx(0.2999), 40)]


def test_plot_timeline_draws_the_axis(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="matplotlib is not a dependency of rose (plot_timeline's own)")
    from benchmarks.plot_timeline import plot

    out = plot(_trace(tmp_path / "trace.json"), tmp_path / "t.png")
    assert out.stat().st_size > 0
