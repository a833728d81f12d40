"""Every decision that keeps a change goes through the decision rule (`stats.py`): the unpaired variant's sites
-- local trials (`local_trials.local_verdict`), layout values (`layout_search.layout_verdict`) and stage 2's
validation (`stage2.validation_verdict`) -- each on a fake measurer that produces runs in that site's own
design (order of runs, block sizes, the local trials' give-up rule) with controlled noise; no wall clock.

The noise model (`Noisy`): each run is true x exp(N(0, sigma)) (log-normal; sigma 0.05-0.40 is a relative
standard deviation of ~5-40% per run), times a load level that drifts as a random walk (`drift` per run),
and with probability 5% a stall that triples the run.

Measured here (seeded, 2,000 decisions per case; the tests assert the bounds in brackets; docs/optimizer.md
"Every decision and its rule" states them):
* false-accept rate (a candidate with the reference's time called faster), drift 2% per run, at sigma
  0.05 / 0.20 / 0.40: local trials (interleaved) 2.7% / 2.9% / 2.6%, layout values (R V R) 3.0% / 2.8% / 2.7%,
  stage 2's validation (A/B/A: 4 runs against 3) 2.7% / 2.9% / 2.9% [<= 5%, the rule's alpha]; a local trial
  whose runs are blocked (switching costly: the unchanged graph's runs, then the alternative's) is within
  alpha without drift (3.2%) but not under it (6.2% at 2% drift, sigma 0.05): its winners are validated on
  complete iterations by the paired rule before any is kept;
* power at a true 1.3x gain, sigma 0.05: 81% (local), 81% (layout), 80% (stage 2) with 5% stalls -- a stall
  among the candidate's four runs leaves it undecided -- and 99.7-100% without stalls [>= 75%, >= 95%]; at
  sigma 0.20 25-30%, at 0.40 11-12%: four runs cannot show a 1.3x gain under that noise, and it is not accepted.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import pytest

from rose_dsl.optimizer.decide import stop_repeating
from rose_dsl.optimizer.layout_search import layout_verdict
from rose_dsl.optimizer.local_trials import local_verdict
from rose_dsl.optimizer.records import Settings
from rose_dsl.optimizer.stage2 import reference_block, validation_verdict
from rose_dsl.optimizer.stats import DEFAULT_RULE, decide_unpaired, decisive, rank_sum_null

S = Settings()


class Noisy:
    """Runs of a plan whose true time is given, with the noise of the module docstring."""

    def __init__(self, sigma: float, rng: random.Random, drift: float, stalls: float = 0.05) -> None:
        self.sigma, self.rng, self.drift, self.stalls = sigma, rng, drift, stalls
        self.level = 0.0

    def __call__(self, true: float) -> float:
        self.level += self.rng.gauss(0.0, self.drift)
        t = true * math.exp(self.level + self.rng.gauss(0.0, self.sigma))
        return 3.0 * t if self.rng.random() < self.stalls else t


def local_trial(m: Noisy, ratio: float, blocked: bool = False) -> str:
    """A local trial as the runtime runs it (`interpreter/optimize/trials.py`): `local_repeats` runs of the unchanged
    graph and of the alternative, round-robin (or, switching costly, each graph's runs back to back), the
    alternative abandoned by the search's give-up rule; then the search's verdict."""
    n = S.local_repeats
    order = [(i, r) for i in range(2) for r in range(n)] if blocked else [(i, r) for r in range(n) for i in range(2)]
    ref: list[float] = []
    cand: list[float] = []
    abandoned = False
    for i, _ in order:
        if i == 0:
            ref.append(m(1.0))
        elif not abandoned:
            cand.append(m(ratio))
            abandoned = len(cand) < n and stop_repeating(ref, cand, S.abandon_factor, S.settle_factor) is not None
    return local_verdict(ref, cand, S.rule).outcome


def layout_value(m: Noisy, ratio: float) -> str:
    """Blocks R V R as `layout_search.choose_layout` runs them: two timed iterations per reference block
    (`validation_rounds` // 2 + 1), as many as both of them in the value's block."""
    per_ref = max(2, S.validation_rounds // 2 + 1)
    before = [m(1.0) for _ in range(per_ref)]
    value = [m(ratio) for _ in range(2 * per_ref)]
    after = [m(1.0) for _ in range(per_ref)]
    return layout_verdict(before, value, after, S.rule).outcome


def stage2_validation(m: Noisy, ratio: float) -> str:
    """Stage 2's A/B/A validation with nothing reused: candidate block, reference block (grown until the
    design can decide: `stage2.reference_block`), candidate block."""
    per_block = max(2, S.validation_rounds // 2 + 1)
    per_ref = reference_block(per_block, 0, 2 * per_block, 1, S.rule.alpha)
    cand = [m(ratio) for _ in range(per_block)]
    ref = [m(1.0) for _ in range(per_ref)]
    cand += [m(ratio) for _ in range(per_block)]
    return validation_verdict(ref, cand, S.rule).outcome


SITES: dict[str, Callable[[Noisy, float], str]] = {
    "local": local_trial, "layout": layout_value, "stage2": stage2_validation}


def rates(site: Callable[[Noisy, float], str], ratio: float, sigma: float, drift: float = 0.02,
          stalls: float = 0.05, trials: int = 2000, seed: int = 1) -> dict[str, float]:
    rng = random.Random(seed)
    counts = {"faster": 0, "slower": 0, "undecided": 0}
    for _ in range(trials):
        counts[site(Noisy(sigma, rng, drift, stalls), ratio)] += 1
    return {k: v / trials for k, v in counts.items()}


@pytest.mark.parametrize("site", sorted(SITES))
@pytest.mark.parametrize("sigma", [0.05, 0.2, 0.4])
def test_a_null_difference_is_accepted_at_most_alpha(site: str, sigma: float) -> None:
    got = rates(SITES[site], 1.0, sigma)
    assert got["faster"] <= DEFAULT_RULE.alpha, got
    assert got["faster"] > 0.01, got  # the bound is used: not a rule that never accepts anything


@pytest.mark.parametrize("site", sorted(SITES))
def test_a_real_gain_of_1_3x_at_low_noise_is_accepted(site: str) -> None:
    with_stalls, without = rates(SITES[site], 1 / 1.3, 0.05), rates(SITES[site], 1 / 1.3, 0.05, stalls=0.0)
    assert with_stalls["faster"] >= 0.75, with_stalls
    assert without["faster"] >= 0.95, without
    assert with_stalls["slower"] <= 0.005  # (a stall in the candidate's runs: once in 2,000 for stage 2)


def test_blocked_local_trials_are_within_alpha_without_drift_and_say_why_not_with_it() -> None:
    """Switching costly, the runtime runs the unchanged graph's repeats, then the alternative's: without drift
    the runs are exchangeable and the rate holds; with drift it does not (the module docstring's figure),
    which is why a local winner is kept only after the paired rule validated it on complete iterations."""
    def blocked(m: Noisy, ratio: float) -> str:
        return local_trial(m, ratio, blocked=True)

    assert rates(blocked, 1.0, 0.05, drift=0.0)["faster"] <= DEFAULT_RULE.alpha
    assert rates(blocked, 1.0, 0.05, drift=0.02)["faster"] > DEFAULT_RULE.alpha


def test_the_issues_trap_a_gain_smaller_than_its_spread_is_not_accepted() -> None:
    """Medians 1.17x apart with a 65% spread: the rank-sum test leaves it undecided at every site."""
    ref = [1.00, 1.02, 0.98, 1.01]
    cand = [0.55, 1.10, 0.84, 0.86]
    for verdict in (local_verdict(ref, cand, S.rule), layout_verdict(ref[:2], cand, ref[2:], S.rule),
                    validation_verdict(ref, cand, S.rule)):
        assert verdict.outcome == "undecided" and verdict.high > 1.0, verdict


def test_rank_sum_p_values_and_interval_match_scipy() -> None:
    scipy_stats = pytest.importorskip("scipy.stats")
    rng = random.Random(5)
    for n_ref, n_cand in ((4, 4), (7, 3), (6, 5), (3, 8)):
        ref = [1 + rng.random() for _ in range(n_ref)]
        cand = [0.85 + rng.random() for _ in range(n_cand)]
        v = decide_unpaired(ref, cand)
        want = scipy_stats.mannwhitneyu(cand, ref, alternative="less", method="exact").pvalue
        assert v.p_faster == pytest.approx(want, rel=1e-9)
        assert v.low <= v.ratio <= v.high
        assert v.unpaired == (n_ref, n_cand) and "rank-sum" in v.describe()


def test_the_null_distribution_of_the_rank_sum_is_exact() -> None:
    for n_ref, n_cand in ((2, 2), (3, 4), (5, 3)):
        counts = rank_sum_null(n_ref, n_cand)
        assert sum(counts) == math.comb(n_ref + n_cand, n_cand)
        assert counts[n_cand * (n_cand + 1)] == 1  # the candidate's runs all ranked first: one way


def test_a_design_that_cannot_decide_is_grown_until_it_can() -> None:
    """A/B/A with two-iteration blocks is four runs against two: p >= 1/15, so the reference block grows."""
    assert not decisive(2, 4) and decisive(3, 4) and decisive(2, 5)
    assert reference_block(2, 0, 4, 1, 0.05) == 3
    assert reference_block(2, 5, 3, 1, 0.05) == 2  # B/A/B with stage 1's runs reused: decisive already
    v = validation_verdict([1.0, 1.01], [0.5, 0.51, 0.52, 0.5], S.rule)
    assert v.outcome == "undecided" and "too few runs" in v.reason


def test_the_search_accepts_no_null_local_alternative_beyond_alpha() -> None:
    """End to end through the search's local trials (`optimize_graph` on the fake measurer of test_search.py):
    every alternative's local runs are the unchanged graph's (a null difference), with ±40% noise per run.
    The count of those the rank-sum test calls faster must be one a false-accept rate of alpha explains; the low-noise
    1.3x-and-more gain of the same workflow is accepted (test_search.py, test_picks_two_groups_...)."""
    from rose_dsl import load_workflow
    from rose_dsl.optimizer.search import optimize_graph

    from .fakes import FakeMeasurer
    from .test_search import LATENCY, LOCAL, ROOT

    class NullLocal(FakeMeasurer):
        def local(self, graphs, repeats, captured, probe_id, give_up=None):
            return super().local([graphs[0]] * len(graphs), repeats, captured, probe_id, give_up)

    wf = load_workflow(ROOT / "workflows" / "latency_interaction.yaml", {"iterations": 1000})
    decided = accepted = 0
    for seed in range(10):
        result = optimize_graph(wf, NullLocal(LATENCY, noise=0.4, seed=seed), Settings(rounds=1, **LOCAL),
                                log=lambda m: None)
        for m in (m for r in result.rounds for t in r.targets for m in t.alternatives):
            if m.status == "measured" and m.verdict is not None:
                decided += 1
                accepted += m.significant
                assert m.verdict.unpaired is not None  # the rank-sum variant decided it
    # (in about half the seeds every local alternative is dropped as dominated by the complete winner's measured
    # saving, `_drop_dominated`: 75 decisions over the ten seeds, 0 to 4 of them false accepts as the draws go.)
    # A false-accept rate of alpha gives as many or more accepts with probability >= 1%; a rule that accepted
    # one null in five (a fixed margin inside the noise) would give 15 of 75, p ~ 1e-6.
    assert decided >= 60
    alpha = DEFAULT_RULE.alpha
    tail = sum(math.comb(decided, k) * alpha**k * (1 - alpha) ** (decided - k) for k in range(accepted, decided + 1))
    assert tail >= 0.01, (accepted, decided, tail)
