"""benchmarks/lib/common.py: what every result file records beside its figures (issue 60: the benchmarks'
library is a package with its own tests)."""

from __future__ import annotations

import platform

import pytest

from benchmarks.lib import common


def test_summary_is_median_and_spread_over_the_median():
    assert common.summary([3.0, 1.0, 2.0]) == {"n": 3, "median": 2.0, "min": 1.0, "max": 3.0, "spread": 1.0}
    assert common.summary([]) == {"n": 0, "median": None, "min": None, "max": None, "spread": None}
    assert common.summary([0.0, 0.0])["spread"] is None  # no relative spread around a zero median


def test_versions_names_python_and_every_package_absent_ones_as_none():
    got = common.versions(("pytest", "surely-not-an-installed-package"))
    assert got["python"] == platform.python_version()
    assert got["pytest"] == pytest.__version__ and got["surely-not-an-installed-package"] is None


def test_machine_lists_no_gpu_where_nvidia_smi_is_missing(monkeypatch):
    def missing(*args, **kwargs):
        raise FileNotFoundError("nvidia-smi")

    monkeypatch.setattr(common.subprocess, "run", missing)
    info = common.machine()
    assert info["gpus"] == [] and info["cpu_count"] and info["platform"]


def test_time_calls_runs_warmup_then_reps_and_returns_one_time_each():
    calls = []
    times = common.time_calls(lambda: calls.append(1), reps=3, warmup=2)
    assert len(calls) == 5 and len(times) == 3 and all(t >= 0 for t in times)


def test_budget_counts_down_on_its_clock(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(common.time, "monotonic", lambda: now[0])
    budget = common.Budget(10)
    now[0] = 104.0
    assert budget.elapsed() == 4.0 and budget.left() == 6.0
