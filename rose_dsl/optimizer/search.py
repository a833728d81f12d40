"""Algorithm 1 (window-guided graph optimization), driven over a `Measurer` the runtime implements.

One round: profile the current graph G on complete iterations; rank nodes; for each of the top-K
targets (and the hand-written sweep), find alternatives, predict them, measure c0 and the promising
ones on their comparison graph; combine the best alternative of each target greedily; validate the
combination on complete iterations and accept it only when it is faster by more than the noise margin.
Rounds repeat on the accepted graph until one accepts nothing, R rounds ran, or the budget is spent.

The driver never touches a backend: it hands workflows (plans, local graphs, probe graphs) to the
measurer and gets `IterationRun`s back, so it runs unchanged on threads, Ray actors, or -- in the unit
tests -- a fake measurer that simulates time.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ..ir import Workflow
from ..measurement import window
from .before_after import declared_graph, given_plan, interleaved
from .budget import Budget
from .candidates import (
    SWEEP,
    TURNS,
    Alternative,
    Feasible,
    Infeasible,
    alternatives,
    check,
    memory_estimate,
    sweep,
)
from .combine import Option, combinations_of
from .decide import Summary, summarize
from .local_trials import _LocalTrials
from .model import CostModel
from .profile import IterationRun, node_stats
from .rank import rank_nodes
from .records import (
    DEVIATIONS,
    Log,
    Measured,
    Measurer,
    OutOfBudget,
    RoundRecord,
    Settings,
    Stage1Result,
    Stage2Record,
    Stop,
    TargetRecord,
)
from .regions import (
    changed_regions,
    common_ancestor,
    local_graphs,
)
from .stats import Rule, Verdict, decide, decide_sequence


def paired(rule: Rule, reference: Sequence[IterationRun], candidate: Sequence[IterationRun], more: bool) -> Verdict:
    """The decision rule on two plans' runs of the same interleaved rounds (the i-th of each is one round)."""
    n = min(len(reference), len(candidate))
    return decide([r.seconds for r in reference[:n]], [r.seconds for r in candidate[:n]], rule, more)

__all__ = ["Settings", "Measurer", "Measured", "TargetRecord", "RoundRecord", "Stage1Result", "Stage2Record", "optimize_graph",
           "OutOfBudget", "DEVIATIONS", "given_plan", "interleaved", "declared_graph", "Stop"]




def _secs(x: float) -> str:
    """Seconds as a person reads them: whole above 10, one decimal below (a 0.5-s budget is not "0 s")."""
    return f"{x:.0f}" if x >= 10 else f"{x:.1f}" if x >= 1 else f"{x:.2g}"


def split_family(m: Measured) -> tuple[str, ...]:
    """An alternative's requests without its split group count: the members of one split family (`split
    epoch.step 2`, `4`, `8`, each with `interleave epoch.step`) share it."""
    if m.groups is None:
        return (m.family, *m.requests)
    suffix = f" {m.groups}"
    if m.family == TURNS:  # (its moves and its interleave name the k groups: the split says the family)
        return (m.family, m.requests[0].removesuffix(suffix))
    return (m.family, *(r[:-len(suffix)] if r.endswith(suffix) else r for r in m.requests))


class _Search(_LocalTrials):
    def __init__(self, wf: Workflow, measurer: Measurer, settings: Settings, log: Log, stop: Stop | None = None,
                 budget: Budget | None = None) -> None:
        self.wf, self.m, self.s, self.log = wf, measurer, settings, log
        self.stop = stop
        # stage 1's share of the time budget; without one, `settings.budget_s` on the measurer's clock
        self.time = budget if budget is not None else Budget.of(settings.budget_s, clock=measurer.elapsed, started=0.0)
        self.model = CostModel()
        fits = memory_estimate(measurer.component_bytes, measurer.memory_limits, wf.components)
        placement = getattr(measurer, "placement", None)
        self.memory = (lambda plan: fits(plan) or placement(plan)) if callable(placement) else fits
        self.errors: list[tuple[str, float, float]] = []
        self.probe_ids = 0
        self.label = ""  # the requests that made the current graph, as a prefix for plan labels
        self.local_cache: dict[tuple[str, ...], dict[tuple[str, ...], Measured]] = {}  # per round
        self.c0_runs: dict[tuple[str, ...], list[IterationRun]] = {}
        self.calibrated = False  # has a split been measured locally (the model knows what splitting costs)?
        self.accepted_reference: list[IterationRun] = []  # the reference's runs beside the last validated plan
        self.iteration_s: float | None = None  # the current reference's median iteration (budget estimates)
        self.out_of_budget = ""  # set when local trials ran out of budget: the round decides, then the search ends
        self.rec: RoundRecord | None = None  # the round in progress
        # turn costs of complete trials (`_turn_s`): learned from the turns measured
        self.seen: set[int] = set()  # plans (by id) that have run an iteration
        self.last_plan: Workflow | None = None  # the plan the workers ran last
        self.last_plan_run: IterationRun | None = None  # and its last measured run
        self.switch_s: float | None = None  # a synchronous plan's unmeasured iteration after a switch (s)
        self.drain_s: float | None = None  # a window's time beyond its iterations (the drain after its tail; s)
        self.setup_s: float | None = None  # a new plan's set-up beyond what a turn of a plan seen before pays (s)
        self.expected: dict[int, float] = {}  # a plan's (by id) seconds per iteration: measured, else predicted
        self.cut = ""  # why a block of complete trials ended before its last turn (the search ends after the round)
        self.block_failures: dict[int, str] = {}  # the last block's failed plans (by index)
        # what was measured on the current graph (a round that keeps nothing is followed by one that measures
        # what it left untried, not the same candidates again), and the promising candidates a round left
        # untried for its per-target limit L
        self.tried: set[tuple[str, ...]] = set()
        self.waiting: list[Measured] = []
        self.budget_skips: list[str] = []  # the round's candidates not begun because no round of them fitted

    # -- helpers ----------------------------------------------------------------------------------
    def budget(self, need_s: float = 0.0) -> None:
        """Raise OutOfBudget when stopped, or when the budget is spent -- or would be by a measurement
        expected to take `need_s` seconds: it is not started (what comes after stage 1, stage 2's quota
        trials, has its own share of the budget; on the H200 a block of complete trials begun just before
        the deadline left stage 2 no time for a single trial)."""
        reason = self.stop() if self.stop is not None else None
        if reason:
            raise OutOfBudget(reason)
        if not self.time.limited:
            return
        total = self.time.total_s or 0.0
        if self.time.spent():
            raise OutOfBudget(f"the time budget of {_secs(total)} s is spent")
        if need_s > 0 and not self.time.fits(need_s):
            raise OutOfBudget(f"the time budget of {_secs(total)} s leaves {_secs(self.time.left() or 0.0)} s "
                              f"and the next measurement needs about {_secs(need_s)} s")

    def complete(self, plans: Sequence[Workflow], rounds: int, warmup: int = 0,
                 labels: Sequence[str] = (), skip_first: bool = False) -> list[list[IterationRun]]:
        """`rounds` interleaved complete iterations of each plan (the order reversed every other round),
        handed to the measurer one turn at a time so that the budget and a stop request are checked before
        every turn, not once per block: a turn that would not fit -- its iteration, the unmeasured one a
        switch between plans costs, and a new plan's set-up, by `_turn_s` -- is not started, and the block
        ends with what it measured (`self.cut` says why). H200, MJX: a block of eight plans
        estimated at one iteration per plan and round took twice that and more, ran 40 s past SIGTERM and
        was killed with nothing written. Failed plans are in `self.block_failures` (by index). `skip_first`:
        the first plan's first turn is not run -- the caller has its run already (`_fresh_reference`)."""
        labels = list(labels) or ["" for _ in plans]
        self.block_failures = {}
        out: list[list[IterationRun]] = [[] for _ in plans]
        first = True
        for r in range(rounds):
            order = list(range(len(plans)))[::-1] if r % 2 else list(range(len(plans)))
            for i in order:
                if i in self.block_failures or (skip_first and r == 0 and i == 0):
                    continue
                plan, w = plans[i], (warmup if first else 0)
                try:
                    self.budget(self._turn_s(plan, w))
                except OutOfBudget as exc:
                    if not out[0]:
                        raise  # nothing to compare with: the caller's budget handling applies
                    self.cut = self.out_of_budget = str(exc)
                    return out
                new, switch = id(plan) not in self.seen, self.last_plan is not plan
                t0 = self.m.elapsed()
                got = self.m.complete([plan], 1, w, [labels[i]], guard_first=i > 0)
                wall, first = self.m.elapsed() - t0, False
                self.seen.add(id(plan))
                self.last_plan = None if self.m.last_failures else plan
                if self.m.last_failures:
                    self.block_failures[i] = next(iter(self.m.last_failures.values()))
                    continue
                self.model.observe(got[0], plan)
                out[i] += got[0]
                self.last_plan_run = got[0][-1] if got[0] else None
                self.expected[id(plan)] = summarize([r.seconds for r in out[i]]).median
                self._learn_turn(plan, wall - sum(self._trained_s(plan, run.seconds) for run in got[0]), w, new,
                                 switch)
        return out

    def _turn_s(self, plan: Workflow, warmup: int = 0, last: Workflow | None = None,
                seen: set[int] | None = None) -> float:
        """Expected seconds of one turn of `plan`: what it trains (`_trained_s`: its timed iteration, or an
        asynchronous plan's window -- at the plan's own seconds per iteration, measured or else predicted,
        not the reference's), plus what the measuring session adds (`Measurer.complete`): a synchronous plan's
        unmeasured iteration after a switch from another plan (and before its first), a window's drain, and
        for a new plan its set-up (processes for new copies, programs compiled and CUDA
        graphs captured for new batch sizes, the guard's snapshot) -- learned from the turns measured so far,
        an iteration each until then. Without a reference time yet: no estimate. `last` and `seen` (default:
        the workers' now) let `_block_s` estimate turns ahead. (Estimating a window as that many reference
        iterations cost `defer sync 1` its decision on an H100: 83 s estimated where ~50 s was spent.)"""
        it = self.iteration_s or 0.0
        need = it * warmup + self._trained_s(plan, self.expected.get(id(plan), it))
        new = id(plan) not in (self.seen if seen is None else seen)
        if window(plan).iterations > 1:
            need += self.drain_s or 0.0
        elif new or (self.last_plan if last is None else last) is not plan:
            need += self.switch_s if self.switch_s is not None else it
        if new:
            need += self.setup_s if self.setup_s is not None else it
        return need

    def _trained_s(self, plan: Workflow, seconds: float) -> float:
        """The seconds a turn of `plan` trains when its timed measurement is `seconds`: that iteration; for an
        asynchronous plan the whole window (`measurement.window`) -- its fill iterations about as long as a
        drained one (the reference's; nothing overlaps the first), the measured and tail ones `seconds`
        each (the period)."""
        win = window(plan)
        if win.iterations == 1:
            return seconds
        return (self.iteration_s or seconds) * win.fill + seconds * (win.measured + win.tail)

    def _learn_turn(self, plan: Workflow, unmeasured_s: float, warmup: int, new: bool, switch: bool) -> None:
        """What a turn cost beyond what it trained: a synchronous plan's iteration after a switch, a window's
        drain, or (a new plan) its set-up; the largest seen so far is the estimate (a
        block cut short costs a candidate, one that overruns costs the stage after it)."""
        it = self.iteration_s or 0.0
        extra = max(0.0, unmeasured_s - warmup * it)
        windowed = window(plan).iterations > 1
        if not new:
            if windowed:
                self.drain_s = max(self.drain_s or 0.0, extra)
            elif switch:
                self.switch_s = max(self.switch_s or 0.0, extra)
        elif self.iteration_s:  # (less what a turn of a plan seen before pays: the drain, or the unmeasured iteration)
            paid = (self.drain_s or 0.0) if windowed else (self.switch_s if self.switch_s is not None else it)
            self.setup_s = max(self.setup_s or 0.0, extra - paid)

    def _block_s(self, plans: Sequence[Workflow], rounds: int) -> float:
        """Expected seconds of a block of `plans` interleaved over `rounds` (as `complete` runs it)."""
        last, seen, total = self.last_plan, set(self.seen), 0.0
        for r in range(rounds):
            for plan in (list(plans)[::-1] if r % 2 else list(plans)):
                total += self._turn_s(plan, last=last, seen=seen)
                last = plan
                seen.add(id(plan))
        return total

    def predict(self, wf: Workflow, reference: Workflow, measured_s: float, lower_bound: bool = False) -> float | None:
        """`wf`'s iteration time, scaled from the reference's measured one by the cost model; None when
        the model cannot say. Both are predicted per iteration in steady state (`CostModel.period`): an
        asynchronous plan (`defer`, `ahead`) by simulating several pipelined iterations, so that its gain
        -- the next rollout beside this update -- is predicted like any other candidate's and it is measured
        in the order of that gain, not after every predicted one. `lower_bound`: a node seen at one row count
        only is taken at the least it can cost at the plan's rows (`CostModel.predict`)."""
        p, p0 = self.model.period(wf, lower_bound), self.model.period(reference)
        if p.seconds is None or not p0.seconds:
            return None
        return measured_s * p.seconds / p0.seconds

    # -- one round --------------------------------------------------------------------------------
    def round(self, index: int, g: Workflow, ref_runs: list[IterationRun]) -> tuple[RoundRecord, Workflow | None,
                                                                                  tuple[str, ...], list[IterationRun]]:
        reference = summarize([r.seconds for r in ref_runs])
        rec = RoundRecord(index, reference)
        self.iteration_s = reference.median
        self.rec, self.wf_current = rec, g
        self.local_cache, self.c0_runs = {}, {}
        stats = node_stats(ref_runs)
        rec.ranking = rank_nodes(stats, reference.median, k=self.s.top_k, tau_a=self.s.tau_a, tau_r=self.s.tau_r)
        self.log(f"round {index}: T_iter {reference.median:.3f} s; targets: "
                 + (", ".join(t.node.removeprefix("iteration.") for t in rec.ranking.targets) or "none"))
        targets = [self._target(g, t.node, stats, reference, t) for t in rec.ranking.targets]
        targets.append(self._target(g, SWEEP, stats, reference, None))
        rec.targets = [t for t in targets if t.alternatives]
        self._measure(g, rec, ref_runs, reference)
        chosen = self._combine(g, rec)
        if not chosen:
            rec.note = "no alternative was decided faster (complete iterations: by the decision rule; local trials: beyond the noise margin)"
            return rec, None, (), []
        return self._validate(g, rec, chosen, reference, ref_runs)

    def _target(self, g: Workflow, node: str, stats, reference: Summary, ranked) -> TargetRecord:
        rec = TargetRecord(node)
        if ranked is not None:
            s = ranked.stats
            rec.total_s, rec.mean_s, rec.activity = s.total_s, s.mean_s, s.activity
            rec.tier, rec.score, rec.rank = ranked.tier, ranked.score, ranked.rank
        alts = sweep(g, self.s.groups) if node == SWEEP else alternatives(g, node, self.s.groups)
        measured = []
        for alt in alts:
            result = check(g, alt, self.memory)
            m = Measured(alt.label, alt.requests, alt.family, alt.groups, alt.partners)
            if isinstance(result, Infeasible):
                m.status, m.reason = "infeasible", result.reason
            else:
                m.workflow = result.workflow
                m.delta_s = self._delta(node, alt, stats)
                m.predicted_iteration_s = self.predict(result.workflow, g, reference.median)
                if m.predicted_iteration_s is None and alt.family == TURNS:
                    m.predicted_iteration_s = self._turns_prediction(result.workflow, g, reference.median)
            measured.append(m)
        rec.alternatives = measured
        return rec

    def _turns_prediction(self, plan: Workflow, g: Workflow, measured_s: float) -> float | None:
        """A `group_turns` candidate's prediction when its consumer's row groups were never measured: the loop's
        own nodes were (a loop that ends per row calls them on the rows still active, so the profile holds
        several row counts), and the consumer -- one call per group, after every copy -- is taken at its lower
        bound (`RowModel.at`): what the prediction is about, the copies' steady state (one group's decode
        beside another's tool wait), stays the model's. Without it the candidate would enter the race only
        after every predicted one, whatever it gains (the agent workload: the loop is most of the iteration)."""
        return self.predict(plan, g, measured_s, lower_bound=True)

    def _delta(self, node: str, alt: Alternative, stats) -> float | None:
        """|T^(v) - T^(w)|: the target's and its partners' mean call time, both after the split."""
        def after(name: str) -> float | None:
            s = stats.get(name)
            if s is None:
                return None
            if alt.groups and name in alt.split_nodes and s.rows:
                m = self.model.rows.get(name)
                est = m.at(s.rows[-1] // alt.groups) if m is not None else None
                return est if est is not None else s.mean_s / alt.groups
            return s.mean_s
        tv = after(node) if node != SWEEP else None
        tw = [x for x in (after(w) for w in alt.partners) if x is not None]
        if tv is None or not tw:
            return None
        return abs(tv - sum(tw) / len(tw))

    def _order(self, ms: list[Measured]) -> list[Measured]:
        return sorted(ms, key=lambda m: (m.delta_s is None, m.delta_s or 0.0))

    # -- measuring --------------------------------------------------------------------------------
    def _measure(self, g: Workflow, rec: RoundRecord, ref_runs: list[IterationRun], reference: Summary) -> None:
        """Alternatives whose changes stay inside a loop (or a node) are timed locally on their target's
        comparison graph; those that change the iteration's own body, by complete iterations (each
        distinct alternative once per round, however many targets proposed it)."""
        local_plans = []
        whole: dict[tuple[str, ...], list[Measured]] = {}
        root = g.root.path
        for t in rec.targets:
            feasible = []
            for m in t.alternatives:
                if m.workflow is not None and m.requests in self.tried:
                    m.status, m.reason = "skipped", "measured in an earlier round on this plan"
                elif m.workflow is not None:
                    feasible.append(m)
            chosen = self._select(t, feasible, reference)
            regions = {id(m): changed_regions(g, m.plan()) for m in chosen}
            local = [m for m in chosen if root not in regions[id(m)]]
            for m in chosen:
                if root in regions[id(m)]:
                    whole.setdefault(m.requests, []).append(m)
            if not local:
                continue
            region = common_ancestor([r for m in local for r in regions[id(m)]])
            t.region = ".".join(region)
            t.window = self._window(g, region, ref_runs, reference.median)
            share = self._share(g, region, t.window, ref_runs, reference.median)
            if self.s.local_max_fraction is not None and share is not None and share >= self.s.local_max_fraction:
                t.local_note = (f"the comparison graph {t.region} is about {share:.0%} of an iteration (>= "
                                f"{self.s.local_max_fraction:.0%}): measured by complete iterations, which are training")
                for m in local:
                    whole.setdefault(m.requests, []).append(m)
                continue
            c0, graphs = local_graphs(g, [m.plan() for m in local], region, t.window, self.m.feed_impl)
            if isinstance(c0, str):
                t.local_note = c0
                for m in local:
                    whole.setdefault(m.requests, []).append(m)
                continue
            pairs = []
            for m, lg in zip(local, graphs, strict=True):
                if isinstance(lg, str):
                    m.status, m.reason = "unmeasurable", lg
                else:
                    pairs.append((m, lg))
            local_plans.append((t, region, c0, pairs))
        # complete-iteration trials first: they are training (kept), so they cost the search little but
        # the plan switches, while a local trial is pure overhead. On the H200 (MJX) local
        # trials of spatial splits took 134 s of stage 1's 292 s and the complete trials of the temporal
        # split -- the 1.23x the round was after -- never ran.
        if whole:
            self._complete_trials(g, whole, ref_runs)
            local_plans = self._drop_dominated(g, local_plans, ref_runs)
        if local_plans:
            try:
                self._local_trials(g, local_plans, reference)
            except OutOfBudget as exc:
                # the round still decides on what it measured (deciding measures nothing more when one complete
                # alternative won; a combination to validate is cut at its first turn); the search ends after it.
                # A stop request (SIGTERM) too: what the complete trials found is kept, not thrown away
                self.out_of_budget = str(exc)
                for _t, _region, _c0, pairs in local_plans:
                    for m, _lg in pairs:
                        if m.status == "pending":
                            m.status, m.reason = "skipped", f"not measured: {exc}"

    def _select(self, t: TargetRecord, feasible: list[Measured], reference: Summary) -> list[Measured]:
        """Which alternatives get measured: calibration (k = 2 of a split family, or no prediction),
        then those predicted not slower, in the paper's order; at most L (the sweep: all promising).

        The split group count is a searched parameter of one alternative, not L alternatives of its own:
        the members of a family (the same split but for k) take one of the L places, in ascending k, so k = 2
        -- the calibration that tells the model what more groups cost -- is never cut while a larger k is
        kept. H100, MJX: ordered by duration mismatch, `split epoch.step 8` and `4` took two of
        the four places and `2` was cut; the 8-group split was then measured as the calibration: one local
        run of 18.7 s (5.99x the unchanged graph) and its start-up, ~84 s of overhead."""
        limit = self.s.alternatives if t.node != SWEEP else len(feasible)
        ordered = self._order(feasible)
        first_at: dict[tuple[str, ...], int] = {}
        for i, m in enumerate(ordered):
            first_at.setdefault(split_family(m), i)
        ordered.sort(key=lambda m: (first_at[split_family(m)], m.groups or 0))
        places: list[tuple[str, ...]] = []
        chosen: list[Measured] = []
        for m in ordered:
            pred = m.predicted_iteration_s
            calibrate = pred is None or (m.groups == 2 and m.family != "temporal-split")
            promising = pred is not None and pred <= (1 + self.s.tolerance) * reference.median
            family = split_family(m)
            has_place = family in places or len(places) < limit
            if has_place and (calibrate or promising):
                chosen.append(m)
                if family not in places:
                    places.append(family)
            else:
                m.status = "skipped"
                m.reason = (f"predicted {pred:.3f} s, slower than the reference {reference.median:.3f} s"
                            if pred is not None and not promising else f"beyond the {limit} alternatives per target")
                if not has_place and (pred is None or pred < (1 - self.s.rule.worth) * reference.median):
                    self.waiting.append(m)  # a later round on this plan measures it
        return chosen

    def _complete_trials(self, g: Workflow, whole: dict[tuple[str, ...], list[Measured]],
                         ref_runs: list[IterationRun]) -> None:
        """Complete-iteration trials as a race against the shared reference `g`: one candidate at a time,
        in the order of predicted gain per second of trial (`_trial_order`), each interleaved with `g` until
        the decision rule decides it (`_settle`) or its looks are spent; then the next one enters. No block
        has to fit the budget as a whole: a candidate is skipped only when not even one interleaved round of
        it fits what is left. (One block of every candidate, cut to what its estimate fitted, left the best
        candidates unmeasured: H100, long-tail LLM, `defer sync 1` at 1.7x was one of 11 left out.)"""
        self.budget()
        order = self._trial_order(g, [ms[0] for ms in whole.values()])
        self.log(f"  complete-iteration trials of {len(order)} alternative(s), one at a time against the reference, "
                 "by predicted gain per trial second (real training)")
        for rank, m in enumerate(order, start=1):
            ms = whole[m.requests]
            for same in ms:
                same.trial_rank, same.trial_s = rank, m.trial_s
            share = self.time  # (a candidate that borrows the rest of the budget borrows it for itself alone)
            reason = self._dominated(m) or self._cannot_start(g, m)
            if reason:
                for same in ms:
                    same.status, same.reason = "skipped", f"not measured: {reason}"
            else:
                self._race(g, m, ms, ref_runs)
            self.time = share
        assert self.rec is not None
        for t in self.rec.targets:
            best = [m for m in t.alternatives if m.significant and m.status == "complete"]
            if best:
                top = max(best, key=lambda m: m.benefit_s)
                if t.best is None or top.benefit_s > t.best.benefit_s:
                    t.best = top

    def _trial_order(self, g: Workflow, unique: list[Measured]) -> list[Measured]:
        """The candidates by predicted gain per second of trial (`Measured.trial_s`: one interleaved pair with
        the reference over the validation rounds, by `_block_s`), largest first; then the unpredicted ones (what
        they gain is unknown), then those predicted to gain nothing (calibrations), each in the candidates'
        order."""
        ref = self.iteration_s or 0.0

        for m in unique:
            if m.predicted_iteration_s is not None:
                self.expected.setdefault(id(m.plan()), m.predicted_iteration_s)

        def key(i: int) -> tuple[int, float, int]:
            m = unique[i]
            m.trial_s = self._block_s([g, m.plan()], self.s.validation_rounds) or None
            if m.predicted_iteration_s is None:
                return 1, 0.0, i
            gain = ref - m.predicted_iteration_s
            return (0 if gain > 0 else 2), -gain / (m.trial_s or 1.0), i

        return [unique[i] for i in sorted(range(len(unique)), key=key)]

    def _cannot_start(self, g: Workflow, m: Measured) -> str | None:
        """Why a candidate's trial is not begun: stopped, the budget spent (the search ends after this round),
        or not even one interleaved round of it fits what is left (a cheaper candidate after it still may)."""
        if self.out_of_budget:
            return self.out_of_budget
        need = self._block_s([g, m.plan()], 1)
        pred, ref = m.predicted_iteration_s, self.iteration_s
        if not self.time.fits(need) and pred and ref:
            self._borrow_for(ref / pred, "predicted")  # (then the whole budget is checked below, as any other)
        try:
            self.budget(need)
        except OutOfBudget as exc:
            if self.time.spent() or (self.stop is not None and self.stop()):
                self.out_of_budget = str(exc)
            self.budget_skips.append(str(exc))
            return str(exc)
        return None

    def _dominated(self, m: Measured) -> str | None:
        """Why a candidate is not worth its trial after another was decided faster: it is predicted to save less
        than the winner measured and cannot be applied on top of it (so `_combine` would take one or the other)
        -- the complete-trial counterpart of `_drop_dominated`. An unpredicted candidate is always measured."""
        assert self.rec is not None
        won = [w for t in self.rec.targets for w in t.alternatives if w.status == "complete" and w.significant]
        if not won or m.predicted_iteration_s is None or self.iteration_s is None:
            return None
        winner = max(won, key=lambda w: w.benefit_s)
        gain = self.iteration_s - m.predicted_iteration_s
        if gain >= winner.benefit_s or isinstance(check(winner.plan(), Alternative(m.requests, m.family, ""), self.memory),
                                                  Feasible):
            return None
        return (f"predicted to save {gain:.3f} s/iteration, less than `{winner.label}` measured "
                f"({winner.benefit_s:.3f} s), and does not combine with it")

    def _race(self, g: Workflow, m: Measured, ms: list[Measured], ref_runs: list[IterationRun]) -> None:
        """One candidate against the reference: interleaved rounds until the rule decides it; every alternative
        that proposed the same requests (`ms`) gets the outcome."""
        plans, labels = [g, m.plan()], [self.label, self.label + m.label]
        fresh = self._fresh_reference(g, ref_runs)
        try:
            runs = self.complete(plans, self.s.validation_rounds, labels=labels, skip_first=bool(fresh))
        except OutOfBudget as exc:
            self.out_of_budget = self.out_of_budget or str(exc)
            for same in ms:
                same.status, same.reason = "skipped", f"not measured: {exc}"
            return
        runs[0][:0] = fresh
        failed = dict(self.block_failures)
        runs = self._settle(plans, runs, failed, labels)
        ref_runs += runs[0][len(fresh):]
        if 1 not in failed and not runs[1] and self.cut:
            for same in ms:
                same.status, same.reason = "skipped", f"not measured: {self.cut}"
            return
        if 1 in failed or not runs[1]:
            for same in ms:
                same.status, same.reason = "failed", failed.get(1, "no iteration completed")
            return
        summary, ref = summarize([r.seconds for r in runs[1]]), summarize([r.seconds for r in runs[0]])
        verdict = paired(self.s.rule, runs[0], runs[1], more=False)
        for same in ms:
            same.summary, same.runs, same.status, same.reference_runs = summary, list(runs[1]), "complete", list(runs[0])
            same.verdict, same.significant = verdict, verdict.outcome == "faster"
            same.benefit_s = ref.median - summary.median
            if not same.significant:
                same.reason = same.reason or verdict.describe()
        self.log(f"  {m.label}: {verdict.describe()}")
        if m.predicted_iteration_s is not None:
            self.errors.append((f"iteration {m.label}", m.predicted_iteration_s, summary.median))

    def _fresh_reference(self, g: Workflow, ref_runs: list[IterationRun]) -> list[IterationRun]:
        """The reference's last run, when it is the last thing the workers ran (no other plan's turn since):
        it opens the next candidate's first interleaved pair as well as a new turn of the reference would, and
        costs nothing (H100, long-tail LLM: a reference turn is ~14 s of a 420-s budget whose race had room
        for four of the five pairs the decision rule's first look needs)."""
        if self.last_plan is g and ref_runs and self.last_plan_run is ref_runs[-1]:
            return [ref_runs[-1]]
        return []

    def _settle(self, plans: Sequence[Workflow], runs: list[list[IterationRun]], failed: dict[int, str],
                labels: Sequence[str]) -> list[list[IterationRun]]:
        """`runs` of `plans` (the first the reference) with more interleaved rounds of the reference and of every
        candidate the decision rule has not decided yet and whose median is faster (the only ones that could
        come out faster), up to the rule's next look each time, until it decides them, its looks are spent or
        the budget is (what was measured is kept). A candidate that fails in them keeps its first runs."""
        if not self.s.extra_rounds or 0 in failed or not runs[0]:
            return runs
        out = [list(rs) for rs in runs]
        while True:
            open_ = [i for i in range(1, len(plans)) if i not in failed and out[i] and self._open(out[0], out[i])]
            if not open_:
                return out
            n = min(len(out[i]) for i in open_)
            more_rounds = next((k for k in self.s.rule.looks if k > n), self.s.rule.max_n) - n
            self._borrow(out, open_)
            open_, dropped = self._fit_settle(plans, out, open_, more_rounds)
            self.log(f"  {len(open_)} alternative(s) faster but not decided by the rule at n = {n}: {more_rounds} "
                     "more interleaved round(s)" + (f"; {len(dropped)} left undecided for the budget" if dropped
                                                    else ""))
            # (a block cut after the reference's turn left it a run ahead of the candidates: that run opens
            # the next pair, no second reference turn in a row)
            ahead = self.last_plan is plans[0] and len(out[0]) > max(len(out[i]) for i in open_)
            try:
                more = self.complete([plans[0]] + [plans[i] for i in open_], more_rounds,
                                     labels=[labels[0]] + [labels[i] for i in open_], skip_first=ahead)
            except OutOfBudget:
                return out  # (the search's next budget check ends it)
            failed_more = dict(self.block_failures)
            if 0 in failed_more or not (more[0] or ahead):
                return out
            out[0] += more[0]
            for j, i in enumerate(open_, start=1):
                if j in failed_more:
                    failed[i] = failed_more[j]
                else:
                    out[i] += more[j]
            if self.cut:
                return out

    def _borrow(self, out: list[list[IterationRun]], open_: list[int]) -> None:
        """`_borrow_for` the largest speedup the open candidates' runs show so far."""
        best = min((paired(self.s.rule, out[0], out[i], more=True).ratio for i in open_), default=1.0)
        if best > 0:
            self._borrow_for(1.0 / best, "measured")

    def _borrow_for(self, speedup: float, how: str) -> bool:
        """Let stage 1 go on into the rest of the whole budget (stage 2's share) for a candidate `how`
        ("measured", "predicted") at least `Settings.borrow_speedup` faster: to start its trial, or to decide it
        (the rule's first look needs five pairs). H200, long-tail LLM: `defer sync 1` measured 1.96x on two
        pairs when stage 1's share ran out; stage 2 then found no process with slack and left its share unspent.
        What the share's end had cut is forgotten (the search goes on). True when the budget grew."""
        whole = self.time.whole()
        if whole.deadline == self.time.deadline or speedup < self.s.borrow_speedup:
            return False
        self.log(f"  a candidate {how} {speedup:.2f}x: stage 1 goes on into the rest of the budget "
                 f"({whole.left() or 0.0:.0f} s left) for it")
        self.time, self.cut, self.out_of_budget = whole, "", ""
        return True

    def _fit_settle(self, plans: Sequence[Workflow], out: list[list[IterationRun]], open_: list[int],
                    rounds: int) -> tuple[list[int], list[int]]:
        """The open candidates whose extra rounds fit what is left of the budget, the largest estimated gain
        first; the rest stay undecided. Every candidate in a block costs each round a turn, so a block of all
        of them can miss the rule's next look where one of them alone reaches it (H100, MJX, budget 290 s:
        1.21x and 1.02x stayed undecided at 4 pairs, one round short of the first look)."""
        if not self.time.limited or len(open_) < 2:
            return open_, []
        left = self.time.left() or 0.0
        by_gain = sorted(open_, key=lambda i: (paired(self.s.rule, out[0], out[i], more=True).ratio, i))
        kept = by_gain[:1]  # the most promising, even when the estimate says it will not fit (as `_trial_order` puts first)
        for i in by_gain[1:]:
            if self._block_s([plans[0]] + [plans[j] for j in sorted(kept + [i])], rounds) > left:
                break
            kept.append(i)
        return sorted(kept), [i for i in open_ if i not in kept]

    def _open(self, reference: list[IterationRun], candidate: list[IterationRun]) -> bool:
        """Is the candidate worth more rounds? The rule has not decided it (and could with more rounds), and its
        estimated gain is at least the rule's `worth` (a candidate 1% faster is not worth the iterations)."""
        v = paired(self.s.rule, reference, candidate, more=True)
        return not v.final and v.ratio < 1.0 - self.s.rule.worth

    # -- combine and validate ---------------------------------------------------------------------
    def _combine(self, g: Workflow, rec: RoundRecord) -> list[Measured]:
        """The Combine step (`combine.py`): the best predicted compatible set of everything the round called
        faster, not the single largest saving; every feasible combination is kept in the round's record."""
        winners = {m.requests: m for t in rec.targets for m in t.alternatives
                   if m.significant and m.status in ("complete", "measured")}
        options = [Option(m.requests, m.family, m.benefit_s, True, split_family(m), m.label) for m in winners.values()]

        def apply(base: Workflow, requests: tuple[str, ...]) -> Workflow | str:
            got = check(base, Alternative(requests, "combination", ""), self.memory)
            return got.workflow if isinstance(got, Feasible) else got.reason

        ref_s = self.iteration_s or rec.reference.median
        combos = combinations_of(g, options, ref_s, apply, lambda plan: self.model.predict(plan).seconds)
        rec.combinations = [c.to_json() for c in combos]
        if not combos:
            self.combined_wf = g
            return []
        best = combos[0]
        chosen = [winners[o.requests] for o in sorted(best.options, key=lambda o: best.requests.index(o.requests[0]))]
        rec.combined = list(best.requests)
        assert best.workflow is not None
        self.combined_wf = best.workflow
        if len(chosen) > 1:
            self.log(f"round {rec.index}: combining {len(chosen)} alternatives (predicted {best.predicted_s:.3f} s "
                     f"against {ref_s:.3f} s): {best.label}")
        return chosen

    def _validate(self, g: Workflow, rec: RoundRecord, chosen: list[Measured], reference: Summary,
                  ref_runs: list[IterationRun]):
        options = [(chosen, self.combined_wf)]
        if len(chosen) > 1:  # the combination failing: the best single alternative measured
            single = max(chosen, key=lambda m: m.benefit_s)
            options.append(([single], single.plan()))
        for picked, plan in options:
            requests = tuple(r for m in picked for r in m.requests)
            rec.combined = list(requests)
            rec.combined_predicted_s = self.predict(plan, g, reference.median)
            reuse = picked[0].summary if len(picked) == 1 and picked[0].status == "complete" else None
            if reuse is not None:  # RunOrReuse: already measured on complete iterations, interleaved with G
                paired_ref = picked[0].reference_runs
                cand, ref = reuse, summarize([r.seconds for r in paired_ref])
                runs = picked[0].runs
                self.accepted_reference = list(paired_ref)
                verdict = picked[0].verdict or paired(self.s.rule, paired_ref, runs, more=False)
            else:
                self.log(f"round {rec.index}: validating {'; '.join(requests)} on complete iterations")
                labels = [self.label, self.label + "; ".join(requests)]
                try:
                    both = self.complete([g, plan], self.s.validation_rounds, labels=labels)
                except OutOfBudget as exc:  # the single best, measured already, needs no more budget
                    self.out_of_budget = self.out_of_budget or str(exc)
                    rec.note = f"not validated: {exc}"
                    self.log(f"round {rec.index}: {rec.note}")
                    continue
                failed = dict(self.block_failures)
                both = self._settle([g, plan], both, failed, labels)
                ref_runs += both[0]
                if 1 not in failed and not both[1] and self.cut:
                    rec.note = f"not validated: {self.cut}"
                    self.log(f"round {rec.index}: {rec.note}")
                    continue
                if 1 in failed or not both[1]:
                    rec.note = f"the combination failed: {failed.get(1, 'no iteration completed')}"
                    self.log(f"round {rec.index}: rejected ({rec.note})")
                    continue
                ref, cand, runs = summarize([r.seconds for r in both[0]]), summarize([r.seconds for r in both[1]]), both[1]
                self.accepted_reference = list(both[0])
                verdict = paired(self.s.rule, both[0], both[1], more=False)
            rec.candidate, rec.reference_validation, rec.verdict = cand, ref, verdict
            if rec.combined_predicted_s is not None:
                self.errors.append((f"iteration {'; '.join(requests)}", rec.combined_predicted_s, cand.median))
            if verdict.outcome == "faster":
                rec.accepted = True
                rec.note = verdict.describe()
                return rec, plan, requests, runs
            rec.note = f"not accepted: {verdict.describe()}"
            self.log(f"round {rec.index}: rejected ({rec.note})")
        return rec, None, (), []


def optimize_graph(wf: Workflow, measurer: Measurer, settings: Settings | None = None, log: Log = print,
                   stop: Stop | None = None, budget: Budget | None = None) -> Stage1Result:
    """Algorithm 1 on `wf`: returns the selected plan and everything measured on the way. `stop()`, asked
    wherever the time budget is, ends the search early as a spent budget does (and skips the final
    before/after): what was decided so far is the result. Three steps: the reference profile, the rounds
    (`_walk`), the before/after that decides the headline (`_conclude`)."""
    s = settings or Settings()
    search = _Search(wf, measurer, s, log, stop, budget)
    runs = _reference_profile(search, wf, s, stop)
    return _conclude(search, wf, _walk(search, wf, runs, s, log), runs, measurer, s, log, stop)


@dataclass
class _Walked:
    """Where the rounds of Algorithm 1 left the search: the plan, its requests and its last runs."""
    graph: Workflow
    requests: tuple[str, ...]
    runs: list[IterationRun]
    rounds: list[RoundRecord]
    stopped: str = ""
    cut_short: bool = False


def _reference_profile(search: _Search, wf: Workflow, s: Settings, stop: Stop | None) -> list[IterationRun]:
    """The declared graph's reference iterations, or OutOfBudget when the budget does not hold them all
    (one iteration compared with itself is no before/after: a tiny budget must not print "1.00x" and exit 0)."""
    try:
        runs = search.complete([wf], s.reference_iterations, warmup=s.warmup, labels=[""])[0]
    except OutOfBudget as exc:
        raise OutOfBudget(f"{exc}: not even the reference profile fits") from None
    stopped_by_request = stop is not None and bool(stop())
    if len(runs) < s.reference_iterations and search.cut and not stopped_by_request:
        raise OutOfBudget(f"{search.cut}: not even the reference profile fits ({len(runs)} of its "
                          f"{s.reference_iterations} iterations)")
    return list(runs)


def _walk(search: _Search, wf: Workflow, runs: list[IterationRun], s: Settings, log: Log) -> _Walked:
    """Round after round, each on the plan the last one kept, until R rounds kept a change, the budget is
    spent, or a round kept nothing and no candidate it left untried is predicted faster than the current plan
    by more than the noise (`_next_round`). A round cut short stays in the record with what it measured."""
    w = _Walked(wf, (), runs, [])
    accepted, r = 0, 0
    try:
        while accepted < s.rounds:
            r += 1
            search.label = "; ".join(w.requests) + ("; " if w.requests else "")
            search.waiting, search.budget_skips = [], []
            rec, plan, applied, new_runs = search.round(r, w.graph, w.runs)
            w.rounds.append(rec)
            search.tried |= {m.requests for t in rec.targets for m in t.alternatives
                             if m.status in ("complete", "measured", "failed")}
            if plan is not None:
                w.graph, w.requests, w.runs = plan, w.requests + applied, new_runs
                accepted, search.tried = accepted + 1, set()
            if search.out_of_budget:
                noise = _noise(rec) if plan is None else ""
                w.stopped, w.cut_short = search.out_of_budget + (f"; {noise}" if noise else ""), True
                log(f"stopping after round {r}: {w.stopped}")
                return w
            if plan is None and search.budget_skips:  # what is left of the budget fits no candidate's trial
                noise = _noise(rec)
                w.stopped, w.cut_short = search.budget_skips[-1] + (f"; {noise}" if noise else ""), True
                rec.note = f"cut short: {w.stopped}; {rec.note}" if rec.note else f"cut short: {w.stopped}"
                log(f"stopping after round {r}: {w.stopped}")
                return w
            if plan is None:
                why = _next_round(search, r, rec)
                if why is None:
                    continue
                w.stopped = why
                log(f"stopping after round {r}: {why}")
                return w
        w.stopped = f"{s.rounds} round(s) kept a change"
    except OutOfBudget as exc:
        w.stopped, w.cut_short = str(exc), True
        log(f"stopping: {w.stopped}")
        if search.rec is not None and (not w.rounds or w.rounds[-1] is not search.rec):
            search.rec.note = search.rec.note or f"cut short: {exc}"
            w.rounds.append(search.rec)
    return w


def _next_round(search: _Search, r: int, rec: RoundRecord) -> str | None:
    """After round `r` kept nothing: None when another round on the same plan should measure the promising
    candidates it left untried (it measured something, so the rounds cannot repeat themselves), else why the
    search stops -- naming the noise when candidates stayed undecided in it."""
    waiting = {m.requests: m for m in search.waiting if m.requests not in search.tried}
    measured = [m for t in rec.targets for m in t.alternatives if m.status in ("complete", "measured")]
    if waiting and measured:
        search.log(f"round {r} kept nothing; {len(waiting)} untried candidate(s) are predicted faster than the "
                   "plan: another round on it")
        return None
    noise = _noise(rec)
    if noise:
        return (f"round {r} kept nothing: {noise}, and no untried candidate is predicted faster by more than "
                f"{search.s.rule.worth:.0%}")
    return (f"round {r} kept nothing, and no untried candidate is predicted faster than the plan by more than "
            f"{search.s.rule.worth:.0%}")


def _noise(rec: RoundRecord) -> str:
    """What the noise did to a round: its candidates measured faster that the rule left undecided, with the
    reference's spread ("" when none stayed undecided). A loaded machine (spreads of 100-200%) decides nothing
    at a budget that a quiet one decides easily; the stop must say which of the two happened."""
    undecided = [m for t in rec.targets for m in t.alternatives if m.status == "complete" and m.verdict is not None
                 and m.verdict.outcome == "undecided" and m.benefit_s > 0]
    if not undecided:
        return ""
    return (f"{len(undecided)} candidate(s) measured faster stayed undecided in the noise (the reference's iterations "
            f"spread {rec.reference.spread:.0%}); a quieter machine or a larger --budget-s could decide them")


def _conclude(search: _Search, wf: Workflow, w: _Walked, profile: list[IterationRun], measurer: Measurer,
              s: Settings, log: Log, stop: Stop | None) -> Stage1Result:
    """The headline: the final before/after decides it by the rule when it can be measured; a plan measured
    slower than the declared graph there is dropped (it was accepted on a reference that drifted); without a
    before/after, round 1's interleaved reference, if the plan is round 1's, is the "before"."""
    g, requests, stopped = w.graph, w.requests, w.stopped
    baseline_runs, final_runs = profile, list(w.runs)
    verdict: Verdict | None = None
    validated, measured = False, False
    stop_reason = stop() if stop is not None else None
    if stop_reason and requests:
        log(f"no before/after comparison: {stop_reason}")
    elif requests and s.final_rounds:
        try:
            before, after, cut = _before_after(search, wf, g, requests, measurer, s, log)
        except OutOfBudget as exc:  # (round 1's pairs of the same two graphs may still stand in for it, below)
            log(f"no before/after comparison: {exc}")
            before, after, cut = [], [], str(exc)
        if cut and _round_1_only(w) and search.accepted_reference:
            # round 1's validation interleaved the same two graphs: its runs join the few rounds the budget left,
            # judged in the order they came (a decision at an earlier look stands)
            before, after = list(search.accepted_reference) + before, list(w.runs) + after
        if before and after:
            measured = True
            verdict = decide_sequence([r.seconds for r in before], [r.seconds for r in after], s.rule)
            validated = verdict.outcome == "faster"  # (a cut-short n < 5 never is)
            baseline_runs, final_runs = before, after
            log(f"before/after: {verdict.describe()}" + (f" (cut short: {cut})" if cut else ""))
            b, f = summarize([r.seconds for r in before]), summarize([r.seconds for r in after])
            if verdict.outcome == "slower" or f.median > b.median:
                log(f"before/after: the plan ({f.median:.4f} s) is slower than the declared graph "
                    f"({b.median:.4f} s): keeping the declared graph")
                stopped = (f"{stopped}; " if stopped else "") + (
                    f"the plan ({'; '.join(requests)}) was accepted, then measured slower than the declared graph "
                    f"in the before/after ({f.median:.4f} s against {b.median:.4f} s): declared graph kept")
                g, requests, final_runs, validated = wf, (), list(before), False
    if requests and not measured and _round_1_only(w) and search.accepted_reference:
        # round 1's validation interleaved the plan with the declared graph itself: a fairer "before" than
        # the profile, which ran earlier beside no plan
        baseline_runs = list(search.accepted_reference)
    return Stage1Result(g, requests, summarize([r.seconds for r in baseline_runs]), summarize([r.seconds for r in final_runs]),
                        w.rounds, search.errors, stopped, w.cut_short, baseline_runs, final_runs, verdict, validated,
                        s.rule.describe())


def _round_1_only(w: _Walked) -> bool:
    """Did round 1 keep the plan and no later round change it (so `w.runs` are still round 1's runs of the
    plan, interleaved with `accepted_reference`, the declared graph's)? A later round that kept nothing
    measured other candidates beside the plan: the two graphs' pairs of round 1 stand."""
    return bool(w.rounds) and bool(w.rounds[0].accepted) and not any(r.accepted for r in w.rounds[1:])


def _before_after(search: _Search, wf: Workflow, g: Workflow, requests: tuple[str, ...], measurer: Measurer,
                  s: Settings, log: Log) -> tuple[list[IterationRun], list[IterationRun], str | None]:
    """The final before/after (retained training, budgeted: a round is not begun past stage 1's share):
    `final_rounds` interleaved rounds of the declared graph and the plan, then more, up to the decision
    rule's next look each time, while the rule has not decided and the budget allows. Returns the runs
    and why the measurement was cut short (None: it ran until the rule decided or its looks ran out)."""
    def within_budget() -> str | None:
        try:
            search.budget(search._block_s([wf, g], 1))
        except OutOfBudget as exc:
            return str(exc)
        return None

    label = "; ".join(requests)
    log(f"before/after: {s.final_rounds} complete iterations each of the declared graph and the plan")
    (before, after), cut = interleaved(measurer, [wf, g], s.final_rounds, ["", label], within_budget)
    while not cut and before and after:
        v = paired(s.rule, before, after, more=True)
        if v.final:
            break
        n = min(len(before), len(after))
        more = next((k for k in s.rule.looks if k > n), s.rule.max_n) - n
        log(f"before/after undecided at n = {n} ({v.reason}): {more} more round(s)")
        (b, a), cut = interleaved(measurer, [wf, g], more, ["", label], within_budget)
        before, after = before + b, after + a
    if cut:
        log(f"before/after cut short after {min(len(before), len(after))} round(s): {cut}")
    return before, after, cut



def speedup(a: Summary, b: Summary) -> float:
    return a.median / b.median if b.median > 0 else math.nan
