"""Ranking low-activity nodes (paper §4.3.2): which invocation windows are worth filling.

A node whose calls keep the device (or its CPU core) busy cannot give time to other work; a long node
that leaves most of it idle can. So nodes are grouped in activity tiers -- a < 0.5 first, then
0.5 <= a < 0.8, a >= 0.8 excluded (NVIDIA's guidance on SM activity) -- and ranked within a tier by
S(v) = D_v (1 - a_v), the idle time they leave per iteration. Short nodes are not worth a trial: a node
is eligible only when D_v >= min(tau_a, tau_r * T_iter).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .profile import NodeStats

__all__ = ["Ranked", "Ranking", "rank_nodes"]


@dataclass(frozen=True)
class Ranked:
    stats: NodeStats
    tier: int | None  # 1 (a < low), 2 (low <= a < high), None: excluded
    score: float  # S(v) = D_v (1 - a_v)
    eligible: bool
    reason: str  # why it is (not) a target
    rank: int | None = None  # pi(v): 0 for the first target

    @property
    def node(self) -> str:
        return self.stats.node


@dataclass(frozen=True)
class Ranking:
    targets: tuple[Ranked, ...]  # the top K, in rank order
    all: tuple[Ranked, ...]  # every node, in rank order (eligible first), for the report
    iteration_s: float
    threshold_s: float  # min(tau_a, tau_r T_iter)


def rank_nodes(stats: Mapping[str, NodeStats], iteration_s: float, *, k: int = 3, tau_a: float = 1.0,
               tau_r: float = 0.05, low: float = 0.5, high: float = 0.8) -> Ranking:
    """Tiers, S(v), eligibility and the top-k targets. A node with no activity measurement counts as
    idle (a = 0): without a sampler, every long node is a window."""
    threshold = min(tau_a, tau_r * iteration_s)
    rows: list[Ranked] = []
    for s in stats.values():
        a = 0.0 if s.activity is None else s.activity
        tier = 1 if a < low else 2 if a < high else None
        score = s.total_s * (1.0 - a)
        if tier is None:
            rows.append(Ranked(s, None, score, False, f"activity {a:.0%} >= {high:.0%}: the resource is busy"))
        elif s.total_s < threshold:
            rows.append(Ranked(s, tier, score, False, f"D_v {s.total_s:.3g} s < {threshold:.3g} s"))
        else:
            rows.append(Ranked(s, tier, score, True, f"tier {tier}, S(v) = {score:.3g} s"))
    rows.sort(key=lambda r: (not r.eligible, r.tier or 3, -r.score, r.node))
    ranked = tuple(Ranked(r.stats, r.tier, r.score, r.eligible, r.reason, i if r.eligible else None)
                   for i, r in enumerate(rows))
    return Ranking(tuple(r for r in ranked if r.eligible)[:k], ranked, iteration_s, threshold)
