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

__all__ = ["Summary", "summarize", "margin", "faster"]


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
