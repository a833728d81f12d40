"""Local trials of stage 1: alternatives whose changes stay inside a loop (or a node), timed on their
target's comparison graph with captured inputs and state snapshots -- pure overhead, as no training
happens in them, so they run after a round's complete trials and only where they can still matter.

`_LocalTrials` is the part of the search (`search._Search`) that runs them: which alternatives still
deserve a trial after the complete ones (`_drop_dominated`), how big a comparison graph is against an
iteration (`_region_s`, `_window`, `_share`), capturing the inputs once per round (`_local_trials`), and the
calibration-first measuring of each target's alternatives (`_local_target`). It shares the search's state
(the measurer, settings, cost model, the round in progress) and is not used on its own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..ir import LoopNode, Workflow
from .bound import local_saving_bound
from .candidates import Alternative, Feasible, check
from .decide import Summary, stop_repeating, summarize
from .model import CostModel
from .profile import IterationRun, item_sources
from .records import Log, Measured, Measurer, RoundRecord, Settings, TargetRecord
from .regions import LocalGraph, Probe, external_texts, probe_workflow
from .stats import Rule, Verdict, decide_unpaired

__all__ = ["local_verdict"]


def local_verdict(unchanged: Sequence[float], runs: Sequence[float], rule: Rule) -> Verdict:
    """Is an alternative faster than the unchanged comparison graph, from a local trial's runs? The decision
    rule's unpaired variant (`stats.decide_unpaired`, a rank-sum test at the rule's alpha), not the paired
    one: a local trial's runs are not rounds of a pair -- with costly switches the runtime runs each graph's
    repeats back to back, an alternative abandoned as clearly slower has fewer runs than the unchanged graph,
    and the unchanged graph's runs are pooled over the target's batches -- while on the captured inputs, with
    the state restored before each run, every run of one graph is a draw of the same thing (no training moves
    between them), so under "no difference" all runs are exchangeable, which is what the test needs."""
    return decide_unpaired(list(unchanged), list(runs), rule)


class _LocalTrials:
    # the search's state these methods read and write (set by `search._Search.__init__` and its round)
    m: Measurer
    s: Settings
    log: Log
    model: CostModel
    memory: Callable[[Workflow], Any]
    errors: list[tuple[str, float, float]]
    probe_ids: int
    local_cache: dict[tuple[str, ...], dict[tuple[str, ...], Measured]]
    c0_runs: dict[tuple[str, ...], list[IterationRun]]
    calibrated: bool
    last_plan: Workflow | None
    wf_current: Workflow
    rec: RoundRecord | None

    def budget(self, need_s: float = 0.0) -> None:
        raise NotImplementedError

    def _drop_dominated(self, g: Workflow, local_plans: list, ref_runs: list[IterationRun]) -> list:
        """The local alternatives still worth a trial after the complete trials: one that cannot be applied
        on top of the best complete winner (so `_combine` would take one or the other) and whose region
        cannot save more per iteration than the winner measured (`bound.local_saving_bound`) would never
        be chosen -- its trial is pure overhead. A target left with none needs no capture either."""
        assert self.rec is not None
        won = [m for t in self.rec.targets for m in t.alternatives if m.status == "complete" and m.significant]
        if not won:
            return local_plans
        winner = max(won, key=lambda m: m.benefit_s)
        kept = []
        for t, region, c0, pairs in local_plans:
            bound = local_saving_bound(g, region, ref_runs)
            left = []
            for m, lg in pairs:
                if bound is not None and bound[0] < winner.benefit_s and not isinstance(
                        check(winner.plan(), Alternative(m.requests, m.family, ""), self.memory), Feasible):
                    m.status = "skipped"
                    m.reason = (f"cannot beat `{winner.label}` ({winner.benefit_s:.3f} s/iteration measured) and "
                                f"does not combine with it: a change inside {'.'.join(region[1:])} saves at most "
                                f"{bound[0]:.3f} s/iteration ({bound[1]} is busy for the rest of it)")
                else:
                    left.append((m, lg))
            if left:
                kept.append((t, region, c0, left))
            elif pairs:
                t.local_note = f"no local trial: every alternative is dominated by `{winner.label}`"
        return kept

    @staticmethod
    def _region_s(g: Workflow, region: tuple[str, ...], runs: list[IterationRun]) -> float:
        """Seconds of calls under `region` per run of it (summed: concurrent calls count each)."""
        prefix = item_sources(g)[region] + "."
        per_iteration = sum(c.seconds for r in runs for c in r.calls if c.source.startswith(prefix))
        per_iteration /= max(1, len(runs))
        outer = 1
        for n in range(2, len(region)):
            loop = g.find(region[:n])
            if isinstance(loop, LoopNode):
                outer *= max(1, len(loop.indices()))
        return per_iteration / outer

    def _window(self, g: Workflow, region: tuple[str, ...], runs: list[IterationRun], t_iter: float) -> int | None:
        item = g.find(region)
        if not isinstance(item, LoopNode) or not item.indices():
            return None
        one = self._region_s(g, region, runs) / len(item.indices())
        if one <= 0:
            return len(item.indices())
        return max(1, min(len(item.indices()), round(self.s.window_fraction * t_iter / one)))

    def _share(self, g: Workflow, region: tuple[str, ...], window: int | None, runs: list[IterationRun],
               t_iter: float) -> float | None:
        """One local run's estimated share of an iteration: the region's (or its window's) call seconds over
        T_iter, at most 1 (summed: overlapping calls each count, which errs toward complete iterations).
        None when nothing was measured under it."""
        item = g.find(region)
        seconds = self._region_s(g, region, runs)
        if isinstance(item, LoopNode) and item.indices() and window is not None:
            seconds *= window / len(item.indices())
        if seconds <= 0 or t_iter <= 0:
            return None
        return min(1.0, seconds / t_iter)

    def _local_trials(self, g: Workflow, plans, reference: Summary) -> None:
        probes = {}
        for _t, region, _c0, _pairs in plans:
            if region not in probes:
                self.probe_ids += 1
                probes[region] = Probe(self.probe_ids, region, ())
        externals: dict[tuple[str, ...], dict[str, str]] = {}
        for _t, region, c0, pairs in plans:
            externals.setdefault(region, {}).update(dict(external_texts([c0] + [lg for _, lg in pairs])))
        probe_list = [Probe(p.id, p.region, tuple(sorted(externals[p.region].items(), key=lambda kv: int(kv[0][1:]))))
                      for p in probes.values()]
        pw = probe_workflow(g, probe_list, self.m.probe_impl)
        if isinstance(pw, str):
            for t, _, _, pairs in plans:
                t.local_note = pw
                for m, _ in pairs:
                    m.status, m.reason = "unmeasurable", pw
            return
        self.budget()
        self.log(f"capturing the inputs of {len(probes)} comparison graph(s) in one training iteration")
        captured = self.m.capture(pw)
        self.last_plan = None  # the workers ran the probe graph
        for t, region, c0, pairs in plans:
            self._local_target(t, probes[region].id, c0, pairs, captured, reference)

    def _local_target(self, t: TargetRecord, probe_id: int, c0: LocalGraph, pairs, captured, reference: Summary) -> None:
        graph_of = {id(m): lg for m, lg in pairs}
        chosen = [m for m, _ in pairs]
        cache = self.local_cache.setdefault(c0.region, {})
        for m in chosen:
            hit = cache.get(m.requests)
            if hit is not None:
                m.summary, m.status, m.predicted_local_s = hit.summary, hit.status, hit.predicted_local_s
                m.reason = hit.reason
        todo = [m for m in chosen if m.requests not in cache]
        # calibration first (k = 2, or no prediction) -- one measurement, then every other calibration
        # candidate re-predicted with what it taught the model and measured only unless clearly slower
        # (`calibration_band`); then the rest, re-predicted with the model's tolerance
        first = [m for m in todo if m.groups == 2 or m.groups is None and m.predicted_iteration_s is None] or todo[:1]
        rest = [m for m in todo if m not in first]
        c0_runs = self.c0_runs.setdefault(c0.region, [])
        # a split measured earlier (another target's comparison graph) has calibrated the model already
        forced = [] if self.calibrated else first[:1]
        for n, batch in enumerate((forced, [m for m in first if m not in forced], rest)):
            if not batch:
                continue
            self.budget()
            band = self.s.calibration_band if n <= 1 else self.s.tolerance
            batch = [m for m in batch if self._still_promising(m, c0, graph_of[id(m)], band)]
            if not batch:
                continue
            self.log(f"  {t.node.removeprefix('iteration.')}: local trials of {len(batch)} alternative(s) on "
                     f"{'.'.join(c0.region[1:])} (x{self.s.local_repeats})")
            graphs = [c0] + [graph_of[id(m)] for m in batch]
            runs = self.m.local(graphs, self.s.local_repeats, captured, probe_id, self._give_up)
            failed = dict(self.m.last_failures)
            if 0 in failed or not runs[0]:
                t.local_note = f"the unchanged comparison graph failed: {failed.get(0, 'no run completed')}"
                return
            for graph, rs in zip(graphs, runs, strict=True):
                self.model.observe(rs, graph.workflow)
            c0_runs += runs[0]
            base = summarize([r.seconds for r in runs[0]]).median
            p0 = self.model.predict(c0.workflow)
            for i, (m, rs) in enumerate(zip(batch, runs[1:], strict=True), start=1):
                if i in failed or not rs:
                    m.status, m.reason = "failed", failed.get(i, "no run completed")
                    continue
                m.summary = summarize([r.seconds for r in rs])
                m.status = "measured"
                if len(rs) < self.s.local_repeats and runs[0]:
                    # the unchanged graph's runs as the trial saw them: all of them first when switches are
                    # costly, else as many as the alternative's
                    ref, own = [r.seconds for r in runs[0]], [r.seconds for r in rs]
                    why = (stop_repeating(ref, own, self.s.abandon_factor, self.s.settle_factor)
                           or stop_repeating(ref[:len(own)], own, self.s.abandon_factor, self.s.settle_factor))
                    m.reason = f"abandoned after {len(rs)} of {self.s.local_repeats} runs: {why or 'clearly slower'}"
                self.calibrated = self.calibrated or m.groups is not None
                pred = self.model.predict(graph_of[id(m)].workflow)
                if pred.seconds is not None and p0.seconds:
                    m.predicted_local_s = base * pred.seconds / p0.seconds
                    self.errors.append((f"local {m.label}", m.predicted_local_s, m.summary.median))
        for m in chosen:
            if m.status in ("measured", "skipped", "failed"):
                cache.setdefault(m.requests, m)
        if not c0_runs:
            return
        unchanged = summarize([r.seconds for r in c0_runs])
        t.c0 = Measured("c0 (unchanged)", summary=unchanged, status="measured")
        scale = self._scale(c0)
        for m in chosen:
            if m.summary is None:
                continue
            m.verdict = local_verdict(unchanged.values, m.summary.values, self.s.rule)
            m.significant = m.verdict.outcome == "faster"
            if not m.significant and m.status == "measured":
                m.reason = m.reason or f"not decided faster: {m.verdict.describe()}"
            m.benefit_s = (unchanged.median - m.summary.median) * scale
        best = [m for m in chosen if m.significant]
        top = max(best, key=lambda m: m.benefit_s) if best else None
        if top is not None and (t.best is None or top.benefit_s > t.best.benefit_s):
            t.best = top  # (a complete-iteration alternative, measured first, may already be better)

    def _give_up(self, reference: Sequence[float], runs: Sequence[float]) -> str | None:
        """The local trials' rule for the runtime (`Measurer.local`): an alternative clearly slower than the
        unchanged graph gets no more runs (`decide.stop_repeating`, `abandon_factor`, `settle_factor`)."""
        return stop_repeating(reference, runs, self.s.abandon_factor, self.s.settle_factor)

    def _still_promising(self, m: Measured, c0: LocalGraph, lg: LocalGraph, band: float) -> bool:
        """False (and `m` skipped, saying why) when the model predicts `lg` more than (1 + band) x the
        unchanged graph. A plan with nodes at row counts not measured yet (say the epoch's reset, split for
        the first time, after a split of the step loop calibrated the simulator's and the policy's calls) is
        judged by its lower bound (`CostModel.predict(lower_bound=True)`): if even that is clearly slower,
        so is the plan. H100, MJX: `split epoch 2; interleave epoch` was measured after the
        step loop's split had shown a split call costs what a whole one does -- unpredictable only for the
        reset at 128 rows, 1.74x slower, ~40 s of a local trial."""
        p, p0 = self.model.predict(lg.workflow), self.model.predict(c0.workflow)
        if not p0.seconds:
            return True
        assumed = ""
        if p.seconds is None:
            p = self.model.predict(lg.workflow, lower_bound=True)
            if p.seconds is None:
                return True
            assumed = (" even with " + ", ".join(p.unknown) + " at the least a call can cost there "
                       "(time growing with rows; a lower bound)")
        if p.seconds > (1 + band) * p0.seconds:
            m.status, m.reason = "skipped", (f"{'after calibration ' if self.calibrated else ''}the model predicts "
                                             f"the comparison graph {p.seconds / p0.seconds:.2f}x the unchanged "
                                             f"one{assumed}")
            return False
        return True

    def _scale(self, c0: LocalGraph) -> float:
        """How many times per iteration the comparison graph's work runs (loop windows scaled up)."""
        path = c0.region
        times = 1.0
        for n in range(2, len(path)):
            loop = self.wf_current.find(path[:n])
            if isinstance(loop, LoopNode):
                times *= max(1, len(loop.indices()))
        item = self.wf_current.find(path)
        if isinstance(item, LoopNode) and c0.window:
            times *= len(item.indices()) / c0.window
        return times

