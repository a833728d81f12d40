"""The decision rule: is a candidate plan faster than a reference, from interleaved paired samples?

Why a test and not a margin: a fixed margin beside the measured spread accepted a candidate at "1.17x,
margin 3%" whose own spread was 74% (issue 44); on a loaded machine the noise is larger than most gains,
and the only honest answers are "faster", "slower" or "undecided" with a stated confidence.

The test. Each round runs the reference and the candidate back to back (A B, then B A), so drift of the
machine's load touches both alike and the pair's log-ratio d = log(candidate / reference) cancels it. The
candidate is called faster when a one-sided **Wilcoxon signed-rank test** on the d's rejects "not faster";
slower when the mirror test rejects "not slower". Why this test:
* distribution-free: under "no difference" an interleaved pair is exchangeable (the order alternates), so
  d is symmetric about 0 and the signed-rank statistic's null distribution is exact whatever the noise --
  log-normal, heavy-tailed, a stalled iteration -- which a t-test is not (one outlier moves a mean) and a
  bootstrap is not at 5-16 pairs (its intervals under-cover at small n);
* ranks, not values: an outlier counts as one large rank, not as a large number;
* more power than a sign test at the same n (it uses the sizes of the differences, not only their signs).
The price: at n < 5 no outcome reaches 95% (all five pairs faster gives p = 1/32), so a rule with
alpha = 0.05 needs at least five rounds to call anything.

Sequential: samples grow round by round and the test is applied at the rule's looks (e.g. n = 5, 8, 12,
16); each look spends its own share of alpha (Bonferroni over the looks: the probability that any look
falsely says "faster" is at most the sum of the shares = alpha, whatever the looks' dependence). A
measurement cut short between two looks is judged at the next look's share, never at a fresh one. The
measuring stops at the first look that decides, when the candidate is shown not to be worth more rounds
(its confidence interval's best case is below `worth`), or when the looks (or the caller's budget) run out:
then the outcome is "undecided".

The estimate reported beside the outcome is the Hodges-Lehmann ratio (the median of the Walsh averages of
the d's) with its distribution-free confidence interval at the look's level.

The unpaired variant (`decide_unpaired`): where the measurements are not rounds of a pair -- a local trial
(the runtime runs each graph's repeats back to back when switching is costly, abandons clearly slower
alternatives mid-way, and pools the unchanged graph's runs over batches), the layout trials (blocks R V R)
and stage 2's validation (blocks A/B/A or B/A/B) -- the same rule is applied as a one-sided **Wilcoxon
rank-sum (Mann-Whitney) test** on the two samples: exact (ties by mid-ranks), distribution-free when the
runs of both are exchangeable under "no difference", at the rule's alpha in one look (these designs measure
a fixed number of runs; nothing is added after a look). Its estimate is the Hodges-Lehmann ratio of the two
samples (the median of all log-ratios candidate / reference) with its distribution-free interval. A design
must be able to decide at all: `decisive(n_ref, n_cand, alpha)` says whether a complete separation of
samples of these sizes reaches alpha (at three runs against two it gives p = 0.1: nothing could be accepted).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Literal

__all__ = ["Rule", "Verdict", "decide", "decide_sequence", "decide_unpaired", "decisive", "sequential", "signed_rank_null",
           "rank_sum_null", "DEFAULT_RULE", "percent"]

Outcome = Literal["faster", "slower", "undecided"]


@dataclass(frozen=True)
class Rule:
    """A sequential signed-rank rule. `alpha` bounds the false-accept rate over all looks together (and,
    separately, the false "slower" rate); `shares[i]` is the part of alpha spent at `looks[i]` (they sum
    to 1). `min_gain`: the relative gain a candidate must be shown to exceed to be "faster" (0: any gain).
    `worth`: stop measuring a candidate once its interval's best case gains less than this (0: never)."""

    alpha: float = 0.05
    looks: tuple[int, ...] = (5, 8, 12, 16)
    shares: tuple[float, ...] = (0.65, 0.15, 0.1, 0.1)
    min_gain: float = 0.0
    worth: float = 0.02

    def __post_init__(self) -> None:
        if len(self.looks) != len(self.shares) or not self.looks:
            raise ValueError("a rule needs one alpha share per look")
        if list(self.looks) != sorted(set(self.looks)) or self.looks[0] < 1:
            raise ValueError(f"looks must be increasing sample counts, got {self.looks}")
        if abs(sum(self.shares) - 1.0) > 1e-9 or min(self.shares) <= 0:
            raise ValueError(f"alpha shares must be positive and sum to 1, got {self.shares}")
        if not 0 < self.alpha < 0.5:
            raise ValueError(f"alpha must be in (0, 0.5), got {self.alpha}")

    @property
    def max_n(self) -> int:
        return self.looks[-1]

    def level_at(self, n: int) -> float:
        """The alpha spent when judging at `n` samples: the share of the first look at or after n."""
        for look, share in zip(self.looks, self.shares, strict=True):
            if n <= look:
                return self.alpha * share
        return self.alpha * self.shares[-1]

    def is_look(self, n: int) -> bool:
        return n in self.looks

    def describe(self) -> str:
        looks = ", ".join(f"n={n}: {self.alpha * s:.3g}" for n, s in zip(self.looks, self.shares, strict=True))
        gain = f" by more than {self.min_gain:.0%}" if self.min_gain else ""
        return (f"one-sided Wilcoxon signed-rank test on the log-ratios of interleaved pairs, applied at "
                f"n = {', '.join(map(str, self.looks))} rounds with alpha shares ({looks}); 'faster'{gain} "
                f"when it rejects 'not faster', so a candidate that is not faster is accepted with probability "
                f"at most {self.alpha:.0%} over all looks ({1 - self.alpha:.0%} confidence); 'slower' "
                f"likewise; otherwise 'undecided'")

    def to_json(self) -> dict[str, Any]:
        return {"test": "wilcoxon-signed-rank", "alpha": self.alpha, "looks": list(self.looks),
                "shares": list(self.shares), "min_gain": self.min_gain, "worth": self.worth}


DEFAULT_RULE = Rule()


@dataclass(frozen=True)
class Verdict:
    """The rule's answer at `n` pairs. `ratio` is candidate / reference time (Hodges-Lehmann; < 1 is
    faster), `low`-`high` its confidence interval at `1 - 2 * level`; `p_faster`/`p_slower` the one-sided
    p-values; `confidence` the confidence of the outcome (1 - its p-value; undecided: of the likelier
    side); `final`: no more rounds would help (decided, shown not worth it, or the looks are spent)."""

    outcome: Outcome
    n: int
    ratio: float
    low: float
    high: float
    p_faster: float
    p_slower: float
    level: float
    final: bool
    reason: str
    pairs: tuple[tuple[float, float], ...] = field(default=(), compare=False)
    # the unpaired variant (`decide_unpaired`): how many runs of the reference and of the candidate
    unpaired: tuple[int, int] | None = None

    @property
    def speedup(self) -> float:
        return 1.0 / self.ratio if self.ratio > 0 else math.inf

    @property
    def confidence(self) -> float:
        if self.outcome == "faster":
            return 1.0 - self.p_faster
        if self.outcome == "slower":
            return 1.0 - self.p_slower
        return 1.0 - min(self.p_faster, self.p_slower)

    def describe(self) -> str:
        lo, hi = 1.0 / self.high if self.high > 0 else math.inf, 1.0 / self.low if self.low > 0 else math.inf
        on = (f"{self.n} interleaved pair(s)" if self.unpaired is None else
              f"{self.unpaired[1]} run(s) against {self.unpaired[0]} (rank-sum)")
        return (f"{self.outcome}: {self.speedup:.2f}x (interval {lo:.2f}-{hi:.2f}x) on {on}, confidence "
                f"{percent(self.confidence)} -- {self.reason}")

    def to_json(self) -> dict[str, Any]:
        design = {"test": "wilcoxon-signed-rank"} if self.unpaired is None else {
            "test": "wilcoxon-rank-sum", "n_reference": self.unpaired[0], "n_candidate": self.unpaired[1]}
        return {**design, "outcome": self.outcome, "n": self.n, "ratio": self.ratio, "speedup": self.speedup,
                "low": self.low, "high": self.high, "p_faster": self.p_faster, "p_slower": self.p_slower,
                "level": self.level, "confidence": self.confidence, "final": self.final, "reason": self.reason}


def percent(confidence: float) -> str:
    """A confidence as a person reads it: never "100.0%" for 99.95% (one more digit near certainty)."""
    return f"{confidence:.1%}" if confidence < 0.999 else f"{min(confidence, 0.9999):.2%}"


@lru_cache(maxsize=64)
def _null_counts(doubled_ranks: tuple[int, ...]) -> tuple[int, ...]:
    """counts[w]: how many of the 2^n sign patterns give the doubled positive rank sum w (exact; ties
    carry mid-ranks, doubled to stay integers)."""
    counts = [0] * (sum(doubled_ranks) + 1)
    counts[0] = 1
    top = 0
    for r in doubled_ranks:
        for w in range(top, -1, -1):
            if counts[w]:
                counts[w + r] += counts[w]
        top += r
    return tuple(counts)


def signed_rank_null(n: int) -> tuple[int, ...]:
    """The exact null counts of W+ (doubled) for n untied ranks -- exposed for the tests."""
    return _null_counts(tuple(2 * (i + 1) for i in range(n)))


def _doubled_ranks(absolute: Sequence[float]) -> list[int]:
    order = sorted(range(len(absolute)), key=lambda i: absolute[i])
    ranks = [0] * len(absolute)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and absolute[order[j + 1]] == absolute[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = i + j + 2  # 2 x the mid-rank of positions i..j (1-based)
        i = j + 1
    return ranks


def _p_values(d: Sequence[float]) -> tuple[float, float]:
    """One-sided p-values (P[W+ <= observed], P[W+ >= observed]) of the signed-rank test; zeros dropped."""
    nz = [x for x in d if x != 0.0]
    if not nz:
        return 1.0, 1.0
    ranks = _doubled_ranks([abs(x) for x in nz])
    w = sum(r for r, x in zip(ranks, nz, strict=True) if x > 0)
    counts = _null_counts(tuple(sorted(ranks)))
    total = float(2 ** len(nz))
    return sum(counts[: w + 1]) / total, sum(counts[w:]) / total


def _interval(d: Sequence[float], level: float) -> tuple[float, float, float]:
    """Hodges-Lehmann estimate of the median log-ratio and its interval at 1 - 2 * level: the Walsh averages
    between the c-th smallest and c-th largest, c the largest count with P[W+ < c] <= level (the whole
    range when n is too small for that level)."""
    n = len(d)
    walsh = sorted((d[i] + d[j]) / 2 for i in range(n) for j in range(i, n))
    m = len(walsh)
    est = walsh[m // 2] if m % 2 else (walsh[m // 2 - 1] + walsh[m // 2]) / 2
    counts = signed_rank_null(n)  # undoubled W+ = w // 2; only even doubled sums occur without ties
    total, acc, c = float(2 ** n), 0.0, 0
    for w in range(0, len(counts), 2):
        acc += counts[w]
        if acc / total > level:
            break
        c = w // 2 + 1
    c = min(c, (m - 1) // 2)
    return est, walsh[c], walsh[m - 1 - c]


def decide(reference: Sequence[float], candidate: Sequence[float], rule: Rule = DEFAULT_RULE,
           more: bool = True) -> Verdict:
    """The rule's verdict on paired samples (reference[i] and candidate[i] measured in the same round).
    `more`: could the caller measure more rounds (False: the budget or the caller stops here, so an
    undecided verdict is final)."""
    if len(reference) != len(candidate) or not reference:
        raise ValueError(f"need paired samples, got {len(reference)} and {len(candidate)}")
    if min(reference) <= 0 or min(candidate) <= 0:
        raise ValueError("times must be positive")
    n = len(reference)
    d = [math.log(c / r) for r, c in zip(reference, candidate, strict=True)]
    level = rule.level_at(n)
    shift = -math.log(1.0 - rule.min_gain) if rule.min_gain else 0.0
    p_faster, _ = _p_values([x + shift for x in d])
    _, p_slower = _p_values(d)
    est, lo, hi = _interval(d, level)
    ratio, low, high = math.exp(est), math.exp(lo), math.exp(hi)
    pairs = tuple(zip(reference, candidate, strict=True))
    judged = rule.is_look(n) or not more or n >= rule.max_n
    if judged and p_faster <= level:
        return Verdict("faster", n, ratio, low, high, p_faster, p_slower, level, True,
                       f"p = {p_faster:.3g} <= {level:.3g} at n = {n}", pairs)
    if judged and p_slower <= level:
        return Verdict("slower", n, ratio, low, high, p_faster, p_slower, level, True,
                       f"p = {p_slower:.3g} <= {level:.3g} at n = {n}", pairs)
    if judged and rule.worth and low > 1.0 - rule.worth and n >= rule.looks[0]:
        return Verdict("undecided", n, ratio, low, high, p_faster, p_slower, level, True,
                       f"at best {1 - low:.1%} faster (< {rule.worth:.0%}): not worth more rounds", pairs)
    final = not more or n >= rule.max_n
    why = ("the looks are spent" if n >= rule.max_n else "the measurement stopped" if not more
           else f"p = {min(p_faster, p_slower):.3g} > {level:.3g}" if judged else f"next look at n = "
           f"{next(x for x in rule.looks if x > n)}")
    return Verdict("undecided", n, ratio, low, high, p_faster, p_slower, level, final, why, pairs)


def decide_sequence(reference: Sequence[float], candidate: Sequence[float], rule: Rule = DEFAULT_RULE) -> Verdict:
    """The rule applied to pairs measured in order, as `sequential` would have applied it while they came in:
    the verdict of the first look that decides, else the undecided verdict on all of them (final). A decision
    at a look stands -- its share of alpha is spent there -- so pairs measured after it (a before/after joined
    to the interleaved trial that decided the same two graphs) cannot undo it at a later, stricter look."""
    n = min(len(reference), len(candidate))
    for look in rule.looks:
        if look >= n:
            break
        v = decide(reference[:look], candidate[:look], rule, more=True)
        if v.outcome != "undecided":
            return v
    return decide(reference[:n], candidate[:n], rule, more=False)


def sequential(measure_pair: Callable[[], tuple[float, float] | None], rule: Rule = DEFAULT_RULE,
               go_on: Callable[[], bool] = lambda: True,
               start: Sequence[tuple[float, float]] = ()) -> Verdict:
    """Measure interleaved rounds (`measure_pair()` -> (reference s, candidate s), None when it could not)
    until the rule decides, the looks are spent or `go_on()` says stop; `start`: pairs already measured."""
    pairs = list(start)
    while True:
        verdict = decide([r for r, _ in pairs], [c for _, c in pairs], rule) if pairs else None
        if verdict is not None and verdict.final:
            return verdict
        if not go_on():
            break
        got = measure_pair()
        if got is None:
            break
        pairs.append(got)
    if not pairs:
        return Verdict("undecided", 0, 1.0, 0.0, math.inf, 1.0, 1.0, rule.level_at(1), True, "nothing measured")
    return decide([r for r, _ in pairs], [c for _, c in pairs], rule, more=False)


@lru_cache(maxsize=256)
def _subset_sums(doubled_ranks: tuple[int, ...], k: int) -> tuple[int, ...]:
    """counts[w]: how many k-subsets of the ranks have the doubled rank sum w (exact, ties as mid-ranks)."""
    table = [[0] * (sum(doubled_ranks) + 1) for _ in range(k + 1)]
    table[0][0] = 1
    top = 0
    for r in doubled_ranks:
        top += r
        for j in range(min(k, len(doubled_ranks)), 0, -1):
            row, below = table[j], table[j - 1]
            for w in range(top, r - 1, -1):
                if below[w - r]:
                    row[w] += below[w - r]
    return tuple(table[k])


def rank_sum_null(n_ref: int, n_cand: int) -> tuple[int, ...]:
    """The exact null counts of the candidate's doubled rank sum for untied samples -- exposed for the tests."""
    return _subset_sums(tuple(2 * (i + 1) for i in range(n_ref + n_cand)), n_cand)


def decisive(n_ref: int, n_cand: int, alpha: float = DEFAULT_RULE.alpha) -> bool:
    """Can the rank-sum test at `alpha` say "faster" at all: is a complete separation (every candidate run
    faster than every reference run, p = 1 / C(n_ref + n_cand, n_cand)) at most alpha? At 2 runs against 4
    it is 1/15: such a design could never accept anything."""
    return n_ref >= 1 and n_cand >= 1 and math.comb(n_ref + n_cand, n_cand) * alpha >= 1.0


def _rank_sum_p(reference: Sequence[float], candidate: Sequence[float]) -> tuple[float, float]:
    """One-sided p-values (P[W <= observed], P[W >= observed]) of the candidate's rank sum."""
    both = list(reference) + list(candidate)
    ranks = _doubled_ranks(both)
    w = sum(ranks[len(reference):])
    counts = _subset_sums(tuple(sorted(ranks)), len(candidate))
    total = float(sum(counts))
    return sum(counts[: w + 1]) / total, sum(counts[w:]) / total


def _shift_interval(reference: Sequence[float], candidate: Sequence[float], level: float) -> tuple[float, float, float]:
    """Hodges-Lehmann shift of the log-times (the median of every log(c / r)) and its interval at 1 - 2 *
    level: the c-th smallest and c-th largest difference, c the largest count with P[U < c] <= level."""
    diffs = sorted(math.log(c) - math.log(r) for r in reference for c in candidate)
    m = len(diffs)
    est = diffs[m // 2] if m % 2 else (diffs[m // 2 - 1] + diffs[m // 2]) / 2
    n_c = len(candidate)
    counts = rank_sum_null(len(reference), n_c)
    total, acc, c = float(sum(counts)), 0.0, 0
    for u, w in enumerate(range(n_c * (n_c + 1), len(counts), 2)):
        acc += counts[w]
        if acc / total > level:
            break
        c = u + 1
    c = min(c, (m - 1) // 2)
    return est, diffs[c], diffs[m - 1 - c]


def decide_unpaired(reference: Sequence[float], candidate: Sequence[float], rule: Rule = DEFAULT_RULE) -> Verdict:
    """The rule's verdict on two samples that are not paired rounds (the module docstring says where and
    why): a one-sided rank-sum test at `rule.alpha`, once; `rule.min_gain` shifts what "faster" means as in
    `decide`. Always final: these designs measure a fixed number of runs."""
    if not reference or not candidate:
        raise ValueError(f"need runs of both, got {len(reference)} and {len(candidate)}")
    if min(reference) <= 0 or min(candidate) <= 0:
        raise ValueError("times must be positive")
    level = rule.alpha
    scaled = [c / (1.0 - rule.min_gain) for c in candidate] if rule.min_gain else list(candidate)
    p_faster, _ = _rank_sum_p(reference, scaled)
    _, p_slower = _rank_sum_p(reference, candidate)
    est, lo, hi = _shift_interval(reference, candidate, level)
    ratio, low, high = math.exp(est), math.exp(lo), math.exp(hi)
    sizes = (len(reference), len(candidate))
    n = min(sizes)
    if p_faster <= level:
        outcome: Outcome = "faster"
        reason = f"p = {p_faster:.3g} <= {level:.3g}"
    elif p_slower <= level:
        outcome, reason = "slower", f"p = {p_slower:.3g} <= {level:.3g}"
    else:
        outcome = "undecided"
        reason = f"p = {min(p_faster, p_slower):.3g} > {level:.3g}" + (
            "" if decisive(*sizes, alpha=level) else " (too few runs for the test to decide)")
    return Verdict(outcome, n, ratio, low, high, p_faster, p_slower, level, True, reason, unpaired=sizes)
