"""Summaries of repeated measurements (median, spread, a robust standard error) for the report and the
estimates, and the local trials' shortcut for an alternative that can no longer win.

No decision to keep a change is made here: every one is the decision rule's (`stats.py`; docs/optimizer.md,
"Every decision and its rule"). A fixed margin beside the measured spread accepted gains smaller than their
spread (issue 44); it is gone.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["Summary", "summarize", "stop_repeating"]


@dataclass(frozen=True)
class Summary:
    n: int
    median: float
    mean: float
    min: float
    max: float
    spread: float  # (max - min) / median
    rel_se: float  # relative standard error of the median (robust)
    values: tuple[float, ...]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def summarize(values: Sequence[float]) -> Summary:
    if not values:
        raise ValueError("no measurements")
    vals = tuple(float(v) for v in values)
    med = statistics.median(vals)
    mad = statistics.median(abs(v - med) for v in vals)
    rel_se = (1.2533 * 1.4826 * mad / med / math.sqrt(len(vals))) if med > 0 else 0.0
    if len(vals) == 1:
        rel_se = 0.5  # one measurement says nothing about noise: be conservative
    return Summary(len(vals), med, statistics.fmean(vals), min(vals), max(vals),
                   (max(vals) - min(vals)) / med if med > 0 else 0.0, rel_se, vals)


def stop_repeating(reference: Sequence[float], runs: Sequence[float], abandon_above: float | None,
                   settle_above: float | None) -> str | None:
    """Why a local trial should give an alternative no further runs (None: go on), from its timed runs so
    far and the unchanged comparison graph's (`reference`, in order):

    * after its first run, slower than `abandon_above` x the unchanged graph's first run: clearly slower
      (run-to-run noise cannot make that a win);
    * after two runs, both slower than `settle_above` x the unchanged graph's median: both rank above at least
      half of the unchanged graph's runs, so the rank-sum test of the local trials (`local_trials.local_verdict`)
      can no longer call it faster, whatever its other runs (four runs against four, two of the unchanged graph's
      seen: each is above at least one, U >= 2, p >= 4/70 > 5%).
    Either only ends measuring an alternative that would not be accepted; neither accepts anything.
    """
    if not reference or not runs:
        return None
    if len(runs) == 1 and abandon_above is not None and runs[0] > abandon_above * reference[0]:
        return (f"{runs[0] / reference[0]:.2f}x the unchanged graph's first run (the limit is "
                f"{abandon_above}x)")
    med = statistics.median(reference)
    if len(runs) == 2 and settle_above is not None and med > 0 and min(runs) > settle_above * med:
        return (f"both runs {min(runs) / med:.2f}x or more the unchanged graph's median (above "
                f"{settle_above:.2f}x: the rank test could no longer call it faster)")
    return None
