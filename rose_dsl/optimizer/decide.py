"""Accept or reject from repeated measurements: medians, spread, and a margin from the measured noise.

Why not a fixed epsilon: run-to-run noise differs by machine and workload (±15% on the H200 for a
launch-bound simulator, a few percent for sleeping CPU components). A candidate is accepted when its
median beats the reference's by more than eps = max(eps_min, z * sqrt(se_ref^2 + se_cand^2)), where se
is the robust relative standard error of a median (1.2533 * 1.4826 * MAD / median / sqrt(n)).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["Summary", "summarize", "margin", "faster", "undecided", "stop_repeating"]


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


def margin(reference: Summary, candidate: Summary, eps_min: float = 0.03, z: float = 2.0) -> float:
    """The relative improvement a candidate must show to be called faster than the reference."""
    return max(eps_min, z * math.sqrt(reference.rel_se ** 2 + candidate.rel_se ** 2))


def faster(reference: Summary, candidate: Summary, eps_min: float = 0.03, z: float = 2.0) -> tuple[bool, float]:
    """(is the candidate faster by more than the margin, the margin)."""
    eps = margin(reference, candidate, eps_min, z)
    return candidate.median < (1.0 - eps) * reference.median, eps


def undecided(reference: Summary, candidate: Summary, eps_min: float = 0.03, z: float = 2.0) -> bool:
    """Could more runs decide for the candidate? Its median beats the reference's by more than `eps_min`
    (the smallest win ever accepted) but not by the noise margin, which shrinks as 1/sqrt(n) with more
    runs of both. A candidate within eps_min of the reference never can: more runs are wasted on it.

    Why: with three runs each, the margin on the H200 was 6-10%, above the 4-5% that the best hand-written
    configuration of the MJX workload (two rollout epochs at once) gained there; the search rejected it and
    lost to it. A few more interleaved rounds shrink the margin towards eps_min."""
    ok, _ = faster(reference, candidate, eps_min, z)
    return not ok and candidate.median < (1.0 - eps_min) * reference.median


def stop_repeating(reference: Sequence[float], runs: Sequence[float], abandon_above: float | None,
                   settle_above: float | None) -> str | None:
    """Why a local trial should give an alternative no further runs (None: go on), from its timed runs so
    far and the unchanged comparison graph's (`reference`, in order):

    * after its first run, slower than `abandon_above` x the unchanged graph's first run: clearly slower
      (run-to-run noise cannot make that a win);
    * after two runs, both slower than `settle_above` x the unchanged graph's median: the median of three
      is at least the faster of the two, so it can come out faster than the unchanged graph by the
      smallest accepted margin eps_min only if that median rises by more than settle_above / (1 - eps_min)
      - 1 (6% for 1.03 and 3%): the third run would not change the verdict.
    """
    if not reference or not runs:
        return None
    if len(runs) == 1 and abandon_above is not None and runs[0] > abandon_above * reference[0]:
        return (f"{runs[0] / reference[0]:.2f}x the unchanged graph's first run (the limit is "
                f"{abandon_above}x)")
    med = statistics.median(reference)
    if len(runs) == 2 and settle_above is not None and med > 0 and min(runs) > settle_above * med:
        return (f"both runs {min(runs) / med:.2f}x or more the unchanged graph's median (above "
                f"{settle_above:.2f}x: a third could not make it faster by the margin)")
    return None
