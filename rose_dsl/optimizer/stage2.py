"""Stage 2's decisions (paper §4.4, Algorithm 2): which GPU process with slack gets another MPS quota or
client priority, which level, and whether complete iterations keep it -- driven through a
`QuotaMeasurer`, the runtime's side (moving a process under other MPS settings with its state, timing
iterations, the GEMM self-check of a quota level), which this module never imports.

With the graph fixed by stage 1, the candidate processes come from the stage-1 plan's trace
(`quota.rank_targets`: float beside the critical path, weighed by SM demand). A round:

1. **screen** (`_Round._screen`): each candidate one coarse quota step down, or at a below-normal client
   priority, timed on its comparison graph against the current settings; the largest gain wins;
2. **search** (`_Round._search`): Algorithm 2 (`quota.quota_search`) over the levels the machine
   distinguishes, for a quota winner; the screening's measurements are read free;
3. **validate** (`_Round._validate`): the best setting against the plan's on complete iterations, in
   blocks that bracket one another (B/A/B or A/B/A), kept only if the decision rule calls it faster
   (`validation_verdict`: its unpaired variant -- blocks are not rounds of a pair).

Every level is self-checked before any process runs under it (`QuotaMeasurer.check_levels`; a level whose
GEMMs are wrong is never used). Every step asks the `Budget` first: a probe, a trial or a validation block
is started only if it and what must follow it fit. `tune_mps` runs rounds (at most
`Settings.quota_max_changes`), each from the plan the previous one kept. The section each returns is the
report's `stage2` (`Stage2Record` fields; plain data).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from ..ir import Workflow
from ..measurement import Books, IterationRun, OutOfBudget
from .bound import call_floats
from .budget import BlockCost, Budget
from .decide import summarize
from .quota import (
    BUDGET_SPENT,
    BranchPair,
    QuotaSearch,
    distinct_levels,
    quota_search,
    rank_targets,
    screening_probes,
    sm_demand,
)
from .records import Log, Settings, Stage1Result, Stage2Record, Stop
from .regions import Probe, common_ancestor, local_graphs, probe_workflow
from .stats import Rule, decide_unpaired, decisive

__all__ = ["QuotaMeasurer", "Verdict", "tune_quota", "tune_mps", "first_probe_levels", "describe"]

Mps = tuple[int, int]  # one process's MPS settings: (quota percent, client priority: 0 normal, 1 below normal)


def validation_verdict(reference: Sequence[float], candidate: Sequence[float], rule: Rule):
    """Is the candidate setting faster than the reference on complete iterations, from the validation's
    blocks? The decision rule's unpaired variant (`stats.decide_unpaired`, a rank-sum test at the rule's
    alpha): a block's iterations are not paired with another block's, so the candidate's iterations (its
    blocks pooled) are ranked against the reference's (pooled); the blocks bracket one another (A/B/A or
    B/A/B), so a drift that is linear over the validation moves both pools' middles alike."""
    return decide_unpaired(list(reference), list(candidate), rule)


def reference_block(per_block: int, n_reference: int, n_candidate: int, blocks: int, alpha: float) -> int:
    """Iterations per reference block: `per_block`, or more when the validation would otherwise be unable
    to decide at all (`stats.decisive`: A/B/A with two-iteration blocks is 4 runs against 2, whose complete
    separation has p = 1/15, above 5%; with 3 it is 1/35); `n_reference` the reference's runs outside these
    blocks."""
    k = per_block
    while blocks and not decisive(n_reference + k * blocks, n_candidate, alpha) and k < 4 * per_block:
        k += 1
    return k


class Verdict(Protocol):
    """The self-check's verdict on one quota level: are GEMMs correct under it on this machine?"""

    @property
    def ok(self) -> bool: ...

    @property
    def sm_count(self) -> int | None:
        """The SMs the check saw under the level; None: the check did not run."""

    @property
    def detail(self) -> str: ...


class QuotaMeasurer(Protocol):
    """What stage 2 asks of the runtime (which implements it structurally: its `QuotaTrials`)."""

    feed_impl: str
    probe_impl: str

    @property
    def books(self) -> Books:
        """The optimizer's books (stage 2 counts its trials and self-checks there)."""

    @property
    def prepare_s(self) -> float:
        """Seconds spent preparing plans so far (plan switches), booked apart from stage 2's own."""

    def iterations_left(self) -> int | None:
        """Training iterations the workflow has left (None: no count)."""

    def quota_sms(self) -> Mapping[int, int]:
        """For each quota percent 1..100, the SMs a process under it sees on this GPU."""

    def move(self, name: str, quota: int | None, env_priority: int | None, set_priority: int | None) -> None:
        """Move `name` to a new process (its state moved with it) under `quota` (None: none set) and the
        client environment of (`quota`, `env_priority`); `set_priority` not None: its client priority."""

    def complete(self, plans: Sequence[Workflow], rounds: int, warmup: int = 0,
                 labels: Sequence[str] = ()) -> list[list[IterationRun]]:
        """Complete iterations (training, kept) of each plan; raises OutOfBudget."""

    def capture(self, probe_wf: Workflow) -> Any: ...

    def local(self, graphs: Sequence[Any], repeats: int, captured: Any, probe_id: int) -> list[list[IterationRun]]: ...

    def check_levels(self, percents: list[int]) -> Mapping[int, Verdict]:
        """The GEMM self-check's verdict for each quota percent (cached per machine by the runtime)."""


def describe(setting: Mps) -> str:
    """`94%`, `100% at below-normal priority`: one process's MPS settings, as the log and the report say them."""
    return f"{setting[0]}%" + (" at below-normal priority" if setting[1] else "")


def _coarse_step(levels: list[tuple[int, int]]) -> int:
    """The search's and the screening's first step down, in levels (2-SM levels on Hopper: ~6%)."""
    return max(2, len(levels) // 16)


def _level_of(levels: list[tuple[int, int]], percent: int, quota_sms: Mapping[int, int]) -> int:
    return next(i + 1 for i, (_, sms) in enumerate(levels) if sms == quota_sms[percent])


def first_probe_levels(wf: Workflow, quota_sms: Mapping[int, int]) -> list[int]:
    """The quota levels stage 2 asks the self-check about first: each GPU process's quota one coarse step
    down, where the screening probes it. Below 100% only (100% needs no check)."""
    levels = distinct_levels(quota_sms)
    rho = _coarse_step(levels)
    out = set()
    for c in wf.components.values():
        if c.device != "gpu":
            continue
        percent = levels[max(1, _level_of(levels, c.mps_settings[0], quota_sms) - rho) - 1][0]
        if percent < 100:
            out.add(percent)
    return sorted(out)


def _gpu_of(wf: Workflow) -> dict[str, int | None]:
    return {name: (c.gpu or 0) if c.device == "gpu" else None for name, c in wf.components.items()}


def _region(plan: Workflow, pair: BranchPair) -> tuple[str, ...]:
    tops = {k.split("[")[0] for k in pair.target_branches + pair.other_branches}
    return common_ancestor([(plan.root.path[0], top) for top in sorted(tops)])


@dataclass(frozen=True)
class _Screened:
    """One screening probe that was measured: the pair, the kind of change, the target's settings before
    and during it, the quota levels (k0 before, k during: equal for a priority), both measurements."""

    pair: BranchPair
    kind: str  # "quota" | "priority"
    start: Mps
    setting: Mps
    k0: int
    k: int
    reference: list[float]
    values: list[float]

    @property
    def gain(self) -> float:
        return statistics.median(self.reference) / statistics.median(self.values)


def _pair_row(pair: BranchPair, kind: str) -> dict[str, Any]:
    return {"target": pair.target, "kind": kind, "other": pair.other, "score_s": pair.score_s, "demand": pair.demand,
            "slack_s": pair.slack_s, "overlap_s": pair.overlap_s}


def _stopped_rows(probes: Sequence[tuple[BranchPair, str]], reason: str) -> list[dict[str, Any]]:
    """The screening's rows of the probes a stop request or the budget left unmeasured."""
    return [{**_pair_row(p, kind), "skipped": reason, "stopped": True} for p, kind in probes]


class _Levels:
    """The quota levels of this GPU and which of them are safe: each level is self-checked (through the
    measurer) before any process runs under it, in batches of the nearest unchecked levels."""

    def __init__(self, qm: QuotaMeasurer, settings: Settings, log: Log, clock: Callable[[], float]) -> None:
        self.qm, self.log, self.clock = qm, log, clock
        self.sms_of = qm.quota_sms()
        self.levels = distinct_levels(self.sms_of)  # [(percent, SMs)] ascending: level k is levels[k - 1]
        self.rho = _coarse_step(self.levels)
        self.parallel = settings.quota_parallel_checks
        self.unsafe: dict[int, str] = {}
        self.checked: dict[int, Verdict] = {}  # percent -> verdict, for every level checked (asked or prefetched)
        # how many levels one self-check batch asks: the screening asks its probe's level alone, the search
        # (and a screening that met an unsafe level, so walks down) `quota_parallel_checks` (docs/optimizer.md)
        self.width = 1

    def level_of(self, percent: int) -> int:
        return _level_of(self.levels, percent, self.sms_of)

    def percent(self, k: int) -> int:
        return self.levels[k - 1][0]

    def _prefetch(self, k: int) -> None:
        """Check level k together with the unchecked levels nearest below it (the search goes down; the
        levels above are asked only around the anchor), `width` at once."""
        near = sorted((j for j in range(1, len(self.levels) + 1) if self.percent(j) < 100
                       and self.percent(j) not in self.checked and j != k), key=lambda j: (j > k, abs(j - k)))
        batch = [self.percent(j) for j in [k, *near[:self.width - 1]]]
        self.checked.update(self.qm.check_levels(batch))
        self.qm.books.quota_checks = self.qm.books.quota_checks + len(batch)
        if not all(self.checked[p].ok for p in batch):  # a run of unsafe levels: the walk down goes in batches
            self.width = self.parallel

    def _safe(self, k: int) -> bool:
        """A level under which this machine's GEMMs are wrong is never tried (quota_safety, issue 16)."""
        percent = self.percent(k)
        if percent >= 100:
            return True
        if percent not in self.checked:
            self._prefetch(k)
        verdict = self.checked[percent]
        if not verdict.ok:
            self.unsafe[percent] = verdict.detail
            why = ("its self-check did not run, so it is not known to be safe" if verdict.sm_count is None
                   else "the GPU math self-check fails under it here")
            self.log(f"  quota {percent}% ({verdict.sm_count} SMs) skipped: {why} ({verdict.detail})")
        return verdict.ok

    def usable(self, k: int) -> bool:
        t = self.clock()
        verdict = self._safe(k)
        # the self-checks are booked apart: a verdict is cached per machine (GPU, driver, torch/CUDA), so
        # they are paid once per machine, not by every run (the report shows the net overhead both ways)
        self.qm.books.quota_check_s = self.qm.books.quota_check_s + self.clock() - t
        return verdict

    def checked_json(self) -> dict[int, dict[str, Any]]:
        return {p: {"sms": v.sm_count, "safe": v.ok} for p, v in sorted(self.checked.items())}


class _Processes:
    """The MPS settings each process runs under, as the plan declares them and as they run now (`running`,
    shared with the caller), and the moves between them."""

    def __init__(self, plan: Workflow, qm: QuotaMeasurer, running: dict[str, Mps] | None) -> None:
        self.plan, self.qm = plan, qm
        self.declared: dict[str, Mps] = {name: c.mps_settings for name, c in plan.components.items()}
        self.mps: dict[str, Mps] = running if running is not None else {}
        for name, setting in self.declared.items():
            self.mps.setdefault(name, setting)

    def _restart(self, name: str, setting: Mps) -> None:
        comp = self.plan.components[name]
        # back to the plan's own settings: the process starts as it was started (no explicit 100% where the
        # plan sets no quota), so the reference is the very configuration stage 1 measured
        quota, priority = (comp.mps_quota, comp.mps_priority) if setting == self.declared[name] else setting
        self.qm.move(name, quota, priority, None if setting[1] == self.mps[name][1] else setting[1])
        self.mps[name] = setting

    def move(self, name: str, setting: Mps) -> None:
        """`name` to a new process under these settings (its state moved with it), unless it runs under them;
        first every other process back to the plan's settings, so that a measurement changes one process only
        (a probe's process put back, or an earlier round's target its validation left at the reference)."""
        for other, own in self.declared.items():
            if other != name and self.mps[other] != own:
                self._restart(other, own)
        if self.mps[name] != setting:
            self._restart(name, setting)


def _comparison(plan: Workflow, region: tuple[str, ...], qm: QuotaMeasurer, repeats: int) -> Callable[[], list[float]]:
    """How one quota trial is timed: the region locally (captured once), or complete iterations."""
    if region != plan.root.path:
        c0, _ = local_graphs(plan, [], region, 1, qm.feed_impl)
        if not isinstance(c0, str):
            pw = probe_workflow(plan, [Probe(999, region, c0.externals)], qm.probe_impl)
            if not isinstance(pw, str):
                captured = qm.capture(pw)
                return lambda: [r.seconds for r in qm.local([c0], repeats, captured, 999)[0]]
    return lambda: [r.seconds for r in qm.complete([plan], repeats, 0, ["quota trial"])[0]]


def _block_overhead(screened: Sequence[Mapping[str, Any]], move_s: float) -> float:
    """What a block of complete iterations costs beyond its iterations so far: the most any probe cost
    beyond its own (a restart, the plan switch, a slow first iteration), or a previous round's."""
    return max([move_s, *(max(r.get("overhead_s", 0.0), r.get("restart_s", 0.0)) for r in screened)])


class _Round:
    """One round of stage 2 on one plan: screen, search, validate (the module docstring)."""

    def __init__(self, result: Stage1Result, qm: QuotaMeasurer, settings: Settings, log: Log, budget: Budget,
                 stop: Stop | None, repeats: int, reference_s: list[float] | None, running: dict[str, Mps] | None,
                 move_s: float) -> None:
        self.result, self.plan, self.qm, self.s, self.log = result, result.plan, qm, settings, log
        self.budget, self.stop, self.repeats, self.move_s = budget, stop, repeats, move_s
        self.reference_s, self.running = reference_s, running
        # the validation's blocks: timed iterations per block
        self.per_block = max(2, settings.validation_rounds // 2 + 1)

    def _stopped(self) -> str | None:
        return self.stop() if self.stop is not None else None

    def run(self, priorities: bool, quotas: bool) -> Stage2Record:
        plan, result = self.plan, self.result
        gpu_of = _gpu_of(plan)
        # SM demand from every run measured: the declared graph's runs show each process alone most often
        demand = sm_demand([*result.baseline_runs, *result.final_runs], gpu_of)
        ranked = rank_targets(result.final_runs, gpu_of, [call_floats(plan, r) for r in result.final_runs],
                              demand=demand)
        if isinstance(ranked, str):
            return Stage2Record(skipped=f"no process to give SMs away: {ranked}; quotas kept")
        self.started = self.budget.now()
        self.lv = _Levels(self.qm, self.s, self.log, self.budget.now)
        self.procs = _Processes(plan, self.qm, self.running)
        # the starting level of a whole-iteration comparison graph is what stage 1 measured last: complete
        # iterations of this plan under these quotas -- reused instead of measured again
        self.final = [r.seconds for r in result.final_runs] if len(result.final_runs) >= self.repeats else []
        if self.reference_s is not None:  # a later round: the plan it starts from was measured by its validation
            self.final = list(self.reference_s)
        probes = screening_probes(ranked, priorities, self.s.quota_max_screened, quotas=quotas)
        if not probes:
            return Stage2Record(skipped="neither quotas nor priorities were asked for")
        chosen: _Screened | None = None
        screened: list[dict[str, Any]] = []
        if len(probes) > 1 or not quotas:  # (one quota candidate alone: its search's first trial is the probe)
            chosen, screened = self._screen(probes)
            if chosen is None:
                return self._nothing_screened(probes, screened)
        return self._tune(chosen.pair if chosen else ranked[0], chosen, screened)

    def _nothing_screened(self, probes: list[tuple[BranchPair, str]], screened: list[dict[str, Any]]) -> Stage2Record:
        cut = next((r["skipped"] for r in screened if r.get("stopped")), None)
        kinds = {k for _, k in probes}
        none_of = {"quota": "no process's first step down", "priority": "no process at a below-normal priority"}
        why = (f"the screening stopped ({cut})" if cut else
               "no process's first step down, nor a below-normal priority, was faster" if len(kinds) == 2 else
               f"{none_of[kinds.pop()]} was faster")
        return Stage2Record(skipped=f"{why}: quotas kept", screened=screened, checked_levels=self.lv.checked_json(),
                            unsafe_levels=self.lv.unsafe, trial_seconds=self.budget.now() - self.started)

    def _screening_over(self, overhead_s: float) -> str | None:
        """A stop request, or no time for one more probe and the search's validation after it: the probe's
        iterations and two restarts (the previous probe's process put back, this one moved), the validation's
        three blocks each with a restart -- `overhead_s` the most a probe has cost beyond its iterations so
        far (the restart, the plan switch, a slow first iteration); docs/optimizer.md says why restarts count."""
        reason = self._stopped()
        iteration_s = statistics.median(self.final) if self.final else 0.0
        need = (self.repeats + 3 * self.per_block) * iteration_s + 5 * overhead_s
        if not reason and not self.budget.fits(need):
            reason = BUDGET_SPENT
        return reason

    # -- 1. screening ---------------------------------------------------------------------------------
    def _screen(self, probes: list[tuple[BranchPair, str]]) -> tuple[_Screened | None, list[dict[str, Any]]]:
        """Which one-step change gets the search (or, for a priority, the validation): each probe (the order
        of `quota.screening_probes`) moves a process with float one coarse quota step down, or to a
        below-normal client priority, and times its comparison graph against that graph at the current
        settings; the largest gain wins. None when no probe was faster. Why measure: the floats say whose
        calls can wait, not whose SMs the critical calls lack (docs/optimizer.md).

        A probe's process is put back only when another probe follows (the budget says whether one fits):
        the last one probed stays moved, so when it wins, its block is the validation's first."""
        references: dict[tuple[str, ...], list[float]] = {}
        rows: list[dict[str, Any]] = []
        measured: list[_Screened] = []
        moved: tuple[str, Mps] | None = None  # the previous probe's process and the settings to put it back to
        overhead_s = self.move_s  # the most a probe cost beyond its measured iterations (so far: a previous round's)
        for i, (pair, kind) in enumerate(probes):
            reason = self._screening_over(overhead_s)
            if reason:
                rows += _stopped_rows(probes[i:], reason)
                break
            if moved is not None:
                self.procs.move(*moved)
                moved = None
            start = self.procs.declared[pair.target]
            row: dict[str, Any] = {**_pair_row(pair, kind), "start_percent": start[0], "start_priority": start[1]}
            rows.append(row)
            step = self._probe_setting(kind, start, row, overhead_s)
            if isinstance(step, str):  # "stopped"
                rows += _stopped_rows(probes[i + 1:], row["skipped"])
                break
            if step is None:
                continue
            probe = self._probe(pair, kind, start, step, references, row)
            overhead_s = max(overhead_s, row["overhead_s"], row["restart_s"])
            moved = (pair.target, start)
            measured.append(probe)
        best = max(measured, key=lambda p: p.gain, default=None)
        if best is not None and best.gain <= 1.0:
            best = None
        for probe in measured:  # only the winner may stay moved
            if probe is not best and self.procs.mps[probe.pair.target] == probe.setting:
                self.procs.move(probe.pair.target, probe.start)
        return best, rows

    def _probe_setting(self, kind: str, start: Mps, row: dict[str, Any],
                       overhead_s: float) -> tuple[int, Mps] | str | None:
        """The probe's (level, settings); None when it is skipped (`row` says why), "stopped" when the
        budget or a stop request ended the walk to a usable level (`row` says which)."""
        q0, p0 = start
        k0 = self.lv.level_of(q0)
        if kind == "priority":
            if p0 >= 1:
                row["skipped"] = "already at a below-normal priority"
                return None
            return k0, (q0, 1)
        # one coarse step down, or the first usable level within another coarse step below it: each level
        # asked may cost a self-check batch, so the walk is short and asks the budget at each step
        # (docs/optimizer.md: an unbounded walk once checked every level down to 52%, past the budget)
        rho = self.lv.rho
        k, lowest, reason = max(1, k0 - rho), max(1, k0 - 2 * rho), None
        while not self.lv.usable(k):
            k -= 1
            reason = self._screening_over(overhead_s) if k >= lowest else None
            if k < lowest or reason:
                break
        if reason:
            row.update(skipped=reason, stopped=True)
            return "stopped"
        if k < lowest:
            row["skipped"] = (f"no usable level within two coarse steps below {q0}% (the GPU math self-check "
                              f"fails under each of them here)")
            return None
        return k, (self.lv.percent(k), p0)

    def _probe(self, pair: BranchPair, kind: str, start: Mps, step: tuple[int, Mps],
               references: dict[tuple[str, ...], list[float]], row: dict[str, Any]) -> _Screened:
        """Measure one probe: its comparison graph at the current settings (once per graph), then moved."""
        k, setting = step
        plan, whole = self.plan, _region(self.plan, pair) == self.plan.root.path
        region = _region(plan, pair)
        graph = _comparison(plan, region, self.qm, self.repeats)
        if region not in references:
            if not (whole and self.final):
                self.procs.move(pair.target, start)  # every process as the plan has it
            references[region] = self.final if whole and self.final else graph()
        ref = references[region]
        t = self.budget.now()
        self.procs.move(pair.target, setting)
        row["restart_s"] = self.budget.now() - t
        values = graph()
        # complete iterations: what the block cost beyond them; a local graph tells the restart only
        row["overhead_s"] = (self.budget.now() - t - sum(values)) if whole else row["restart_s"]
        self.qm.books.quota_trials = self.qm.books.quota_trials + 1
        probe = _Screened(pair, kind, start, setting, self.lv.level_of(start[0]), k, ref, values)
        row.update(percent=setting[0], priority=setting[1], seconds=statistics.median(values), samples=values,
                   reference_s=statistics.median(ref), gain=probe.gain)
        self.log(f"  screening {pair.target} at {describe(setting)}: {statistics.median(values):.4f} s against "
                 f"{statistics.median(ref):.4f} s at {describe(start)} ({probe.gain:.3f}x)")
        return probe

    # -- 2. search --------------------------------------------------------------------------------------
    def _tune(self, pair: BranchPair, chosen: _Screened | None, screened: list[dict[str, Any]]) -> Stage2Record:
        """The chosen candidate: a priority straight to the validation; a quota searched, then validated."""
        plan, result = self.plan, self.result
        q0, p0 = start = plan.components[pair.target].mps_settings  # the plan's (the screening may have left it moved)
        region = _region(plan, pair)
        iteration_s = (statistics.median(self.final) if self.reference_s is not None else
                       statistics.median(r.seconds for r in result.final_runs) if result.final_runs else 0.0)
        self.cost = BlockCost(iteration_s, _block_overhead(screened, self.move_s))
        out = Stage2Record(
            target=pair.target, other=pair.other, gpu=pair.gpu, slack_s=pair.slack_s, overlap_s=pair.overlap_s,
            score_s=pair.score_s, demand=pair.demand, screened=screened,
            branches={"target": list(pair.target_branches), "other": list(pair.other_branches)},
            comparison_graph=".".join(region), levels=len(self.lv.levels), rho=self.lv.rho, start_percent=q0,
            unsafe_levels=self.lv.unsafe, trials=0, best_percent=q0)
        whole = region == plan.root.path
        if chosen is not None and chosen.kind == "priority":  # no search: one other setting, validated
            self.log(f"stage 2: {pair.target} at a below-normal MPS client priority was the screening's best "
                     f"({chosen.gain:.3f}x); validating it")
            out.kind, out.checked_levels = "priority", self.lv.checked_json()
            reuse = chosen.values if whole and self.procs.mps[pair.target] == chosen.setting else []
            out.block_overhead_s = self.cost.overhead_s
            return self._validate(out, pair.target, chosen.setting, start, reuse,
                                  before=self.final if whole else [])
        self.log(f"stage 2: {pair.target} has {pair.slack_s:.3f} s of float beside critical calls of {pair.other} "
                 f"({pair.overlap_s:.2f} s per iteration); tuning its quota from {q0}% on {'.'.join(region)}")
        seeded = {chosen.k0: chosen.reference, chosen.k: chosen.values} if chosen is not None else {}
        samples, known, search, reused = self._search(pair, start, region, seeded)
        best_percent = self.lv.percent(search.best)
        out.kind, out.curve, out.checked_levels = "quota", self._curve(search, samples, known), self.lv.checked_json()
        out.trials, out.search_stopped, out.best_percent = search.trials, search.stopped, best_percent
        reason = self._stopped()
        if reason:
            out.search_stopped = reason
        if (reason and best_percent != q0) or best_percent == q0:
            return self._not_searched_on(out, pair, start, search, screened, reason)
        # The target still runs at the level it was measured at last (the search and the screening leave it
        # there), so when that is the chosen level and the comparison graph was the whole iteration, that block
        # is the validation's A, and stage 1's measurement of the plan (or the previous round's) its first B --
        # two restarts and two blocks saved, the drift check intact
        best = (best_percent, p0)
        reuse = samples.get(search.best, []) if whole and self.procs.mps[pair.target] == best else []
        out.block_overhead_s = self.cost.overhead_s
        return self._validate(out, pair.target, best, start, reuse, before=reused)

    def _search(self, pair: BranchPair, start: Mps, region: tuple[str, ...],
                seeded: dict[int, list[float]]) -> tuple[dict[int, list[float]], dict[int, float], QuotaSearch,
                                                         list[float]]:
        """Algorithm 2 for `pair.target` from its plan's level: (every level's samples, the levels known
        before the search, the search, the starting level's samples reused from stage 1 or the previous
        round)."""
        plan, lv = self.plan, self.lv
        whole = region == plan.root.path
        k0 = lv.level_of(start[0])
        measure_graph = _comparison(plan, region, self.qm, self.repeats)
        samples: dict[int, list[float]] = {}
        reused = self.final if whole else []
        # levels measured already, read by the search for free: stage 1's last measurement at the current
        # quota, the screening's step down (and its reference)
        samples.update(seeded)
        if reused:
            samples[k0] = reused
            self.log(f"  quota {start[0]}% ({lv.levels[k0 - 1][1]} SMs): {statistics.median(reused):.4f} s "
                     "(stage 1's measurement)")
        known = {k: statistics.median(v) for k, v in samples.items()}

        def measure(k: int) -> float:
            percent = lv.percent(k)
            t = self.budget.now()
            self.procs.move(pair.target, (percent, self.procs.mps[pair.target][1]))  # (its priority kept)
            self._overhead(self.budget.now() - t)  # the restart at least
            values = measure_graph()
            samples[k] = values
            if whole:  # complete iterations: what the block cost beyond them
                self._overhead(self.budget.now() - t - sum(values))
            self.qm.books.quota_trials += 1
            self.log(f"  quota {percent}% ({lv.levels[k - 1][1]} SMs): {statistics.median(values):.4f} s")
            return statistics.median(values)

        def out_of_time() -> bool:
            """A stop request, or no time for the next probe AND a whole validation after it (three blocks:
            once the target has moved to the probed level, no measured block can be the validation's first)."""
            if self._stopped():
                return True
            return not self.budget.fits(self.cost.block(self.repeats) + 3 * self.cost.block(self.per_block))

        lv.width = self.s.quota_parallel_checks  # the search steps level by level: its checks go in batches
        search = quota_search(len(lv.levels), k0, measure, rho=lv.rho, max_trials=self.s.quota_max_trials,
                              out_of_time=out_of_time, usable=lv.usable, known=known)
        return samples, known, search, reused

    def _overhead(self, seconds: float) -> None:
        self.cost = replace(self.cost, overhead_s=max(self.cost.overhead_s, seconds))

    def _curve(self, search: QuotaSearch, samples: dict[int, list[float]], known: dict[int, float]) -> list[dict[str, Any]]:
        lv = self.lv
        curve: list[dict[str, Any]] = [
            {"percent": lv.percent(k), "sms": lv.levels[k - 1][1], "seconds": search.history[k],
             "n": len(samples.get(k, [])), "samples": samples.get(k, []), "unsafe": False, "reused": k in known}
            for k in sorted(search.history)]
        curve += [{"percent": lv.percent(k), "sms": lv.levels[k - 1][1], "seconds": None, "n": 0, "samples": [],
                   "unsafe": True} for k in search.skipped]
        curve.sort(key=lambda row: row["sms"])
        return curve

    def _not_searched_on(self, out: Stage2Record, pair: BranchPair, start: Mps, search: QuotaSearch,
                         screened: list[dict[str, Any]], reason: str | None) -> Stage2Record:
        """The search ends with nothing to validate: stopped (an unvalidated level is not kept), or no
        other level was faster."""
        q0 = start[0]
        self.procs.move(pair.target, start)
        if reason and out.best_percent != q0:
            out.summary = (f"stopped before validating {pair.target} at {out.best_percent}% ({reason}): "
                           f"kept {q0}% ({out.trials} trials)")
        else:
            probe = next((r for r in screened if r["target"] == pair.target and r.get("kind", "quota") == "quota"
                          and r.get("seconds") is not None), None)
            tried = f"screened at {probe['percent']}% ({probe['gain']:.3f}x), then " if probe else ""
            out.summary = (f"kept {pair.target} at {q0}%: no other level was faster locally ({out.trials} trials)"
                           if out.trials or not search.stopped else
                              f"kept {pair.target} at {q0}%: {tried}no other level was tried ({search.stopped})")
        out.trial_seconds = self.budget.now() - self.started
        return out

    # -- 3. validation ----------------------------------------------------------------------------------
    def _validate(self, out: Stage2Record, target: str, cand: Mps, ref: Mps, reuse: list[float],
                  before: list[float] | None = None) -> Stage2Record:
        """`target` under `cand` against `ref` (its settings before stage 2) on complete iterations, in blocks
        that bracket one another, so that a drift in time hits both alike: B/A/B when `before` is given --
        complete iterations under `ref`, the plan's own processes, measured before `reuse` (stage 1's
        measurement of the plan, or a previous round's) -- else A/B/A. `reuse` is a block already measured
        under `cand` with the target still there, the A. Each switch restarts the process, so B/A/B with both
        blocks measured runs one block and one restart, and ends with the target at `ref`, where it stays:
        the plan says `cand`, a later round moves it there before it measures anything, and otherwise only
        the hand-over checkpoint follows. `out` gets the validation and the summary, and, when `cand` was
        faster by more than the noise margin, `quotas` or `priorities` and the `plan` with them; otherwise the
        target goes back to `ref`."""
        best_s: list[float] = list(reuse)
        ref_s: list[float] = []
        blocks: list[tuple[Mps, list[float]]] = [(cand, best_s), (ref, ref_s), (cand, best_s)]
        if before:
            ref_s += before
            blocks = blocks[1:2] if reuse else blocks[:2]
            out.validation_reused_reference = len(before)
        elif reuse:
            blocks = blocks[1:]
        if reuse:
            out.validation_reused_block = len(reuse)
        n_cand = len(best_s) + self.per_block * sum(1 for _, b in blocks if b is best_s)
        per_ref = reference_block(self.per_block, len(ref_s), n_cand, sum(1 for _, b in blocks if b is ref_s),
                                  self.s.rule.alpha)
        sizes = [per_ref if b is ref_s else self.per_block for _, b in blocks]
        need_s = sum(self.cost.block(k) for k in sizes)
        if not self.budget.fits(need_s):
            self.procs.move(target, ref)
            out.trial_seconds = self.budget.now() - self.started
            out.summary = (f"{target} at {describe(cand)} was fastest ({out.trials} trials) but not validated: "
                              f"{BUDGET_SPENT} (the validation needs ~{need_s:.0f} s): kept {describe(ref)}")
            return out
        self.log(f"stage 2: validating {target} at {describe(cand)} against {describe(ref)} on complete iterations")
        for (setting, bucket), size in zip(blocks, sizes, strict=True):
            # a stop request between the blocks (each a restart and a few iterations): end here rather than
            # after the whole validation, which can outlast a caller's grace period
            reason = self._stopped()
            if reason:
                self.procs.move(target, ref)
                out.search_stopped, out.trial_seconds = reason, self.budget.now() - self.started
                out.summary = (f"stopped while validating {target} at {describe(cand)} ({reason}): kept "
                               f"{describe(ref)} ({out.trials} trials)")
                return out
            self.procs.move(target, setting)
            bucket += [r.seconds for r in self.qm.complete([self.plan], size, 0,
                                                           [f"mps {target} {describe(setting)}"])[0]]
        return self._verdict(out, target, cand, ref, summarize(ref_s), summarize(best_s))

    def _verdict(self, out: Stage2Record, target: str, cand: Mps, ref: Mps, reference: Any,
                 candidate: Any) -> Stage2Record:
        plan = self.plan
        verdict = validation_verdict(reference.values, candidate.values, self.s.rule)
        ok = verdict.outcome == "faster"
        out.validation = {"reference": reference.to_json(), "candidate": candidate.to_json(),
                          "verdict": verdict.to_json(), "accepted": ok}
        out.trial_seconds = self.budget.now() - self.started
        if not ok:
            self.procs.move(target, ref)
            out.summary = (f"{target} at {describe(cand)} was fastest locally but complete iterations were not "
                           f"faster by the decision rule ({candidate.median:.3f} vs {reference.median:.3f} s; "
                           f"{verdict.describe()}): kept {describe(ref)}")
            return out
        own = plan.components[target]
        comp = replace(own, mps_quota=cand[0] if cand[0] != ref[0] else own.mps_quota,
                       mps_priority=cand[1] if cand[1] != ref[1] else own.mps_priority)
        out.plan = replace(plan, components={**plan.components, target: comp})
        if cand[0] != ref[0]:
            out.quotas = {target: cand[0]}
        if cand[1] != ref[1]:
            out.priorities = {target: cand[1]}
        what = "quota trials" if cand[0] != ref[0] else "trials"
        out.kept = f"{target} at {describe(cand)} (was {describe(ref)})"
        out.summary = (f"{out.kept}: {reference.median / candidate.median:.2f}x "
                       f"on complete iterations ({out.trials} {what})")
        return out


def tune_quota(result: Stage1Result, qm: QuotaMeasurer, settings: Settings, log: Log, budget: Budget | None = None,
               stop: Stop | None = None, priorities: bool = False, quotas: bool = True,
               reference_s: list[float] | None = None, running: dict[str, Mps] | None = None,
               move_s: float = 0.0, repeats: int = 3) -> Stage2Record:
    """One round of Algorithm 2 for the stage-1 plan `result.plan`; returns the report's stage-2 section,
    with `quotas` (or `priorities`) and `plan` when a change is kept. `budget` ends the search early with
    the best level measured so far (leaving time for the validation). With `priorities`, the screening also
    tries each candidate at a below-normal MPS client priority (beyond the paper: it takes no SMs away, it
    lets the critical process's kernels go first); a priority that wins the screening is validated like a
    quota. `quotas` False: priorities only (no quota probe, search or self-check). `reference_s`: complete
    iterations of `result.plan` measured since `result.final_runs` (a later round: its predecessor's
    validation), the reference instead of those runs, which still give the ranking. `running`: the MPS
    settings each process runs under now, where they differ from the plan's; kept up to date as processes
    move. `move_s`: the most a block has cost beyond its iterations so far (a previous round's), what the
    budget counts per block until this round measures its own."""
    rnd = _Round(result, qm, settings, log, budget or Budget(), stop, repeats, reference_s, running, move_s)
    return rnd.run(priorities, quotas)


def _count_budget(qm: QuotaMeasurer, result: Stage1Result, budget: Budget, settings: Settings) -> Budget | None:
    """The workflow's iteration count as a deadline: the session trains at most that many iterations, and
    stage 2's blocks are complete iterations, so the iterations left, at the plan's measured pace and with
    a margin (`quota_count_margin`), are a time budget too -- checked as the time budget is, before each
    probe and block, so that stage 2 ends with what it validated instead of running out of iterations
    inside a block. None: no count, or nothing measured to pace it by."""
    left = qm.iterations_left()
    if left is None or not result.final_runs:
        return None
    pace = statistics.median(r.seconds for r in result.final_runs)
    by_count = budget.now() + settings.quota_count_margin * max(0, left) * pace
    return budget.until(by_count) if budget.deadline is None or by_count < budget.deadline else None


def tune_mps(result: Stage1Result, qm: QuotaMeasurer, settings: Settings, log: Log, budget: Budget | None = None,
             stop: Stop | None = None, priorities: bool = False, quotas: bool = True,
             running: dict[str, Mps] | None = None, repeats: int = 3) -> Stage2Record:
    """Stage 2 in rounds of `tune_quota`, each keeping at most one change (a quota or a client priority): a
    round that kept one is followed by another from the plan it kept -- its validation's candidate blocks
    are that round's reference; stage 1's runs still rank the processes (same graph) -- while the budget
    lasts, at most `quota_max_changes` rounds. Why more than one: a quota and a priority act on different
    processes and resources (the policy's SMs, a simulator's turn), so the best of each can add up; the
    paper tunes one process. The section is the first round's, with `rounds` (each round's section), and
    `quotas`, `priorities`, `plan` and `summary` for all of them."""
    budget = budget or Budget()
    started, booked = budget.now(), _other_books(qm)
    counted = _count_budget(qm, result, budget, settings)
    left = qm.iterations_left()
    try:
        out = _tune_rounds(result, qm, settings, log, counted or budget, stop, priorities, quotas, running, repeats)
    finally:
        _book_stage2(qm, booked, budget.now() - started)
    for key in ("summary", "skipped"):  # (a section says why it ended in one of them)
        said = getattr(out, key)
        if counted is not None and said is not None and BUDGET_SPENT in said:
            setattr(out, key, said + f" (stage 2's budget was the workflow's iteration count: {left} iterations "
                                     "were left when it began; raise it with --set iterations=N)")
    return out


def _tune_rounds(result: Stage1Result, qm: QuotaMeasurer, settings: Settings, log: Log, budget: Budget,
                 stop: Stop | None, priorities: bool, quotas: bool, running: dict[str, Mps] | None,
                 repeats: int) -> Stage2Record:
    # the MPS settings each process runs under now, across rounds (the caller's, to `settle` after)
    running = {} if running is None else running
    options = dict(budget=budget, stop=stop, priorities=priorities, quotas=quotas, running=running, repeats=repeats)
    try:
        out = tune_quota(result, qm, settings, log, **options)  # type: ignore[arg-type]
    except OutOfBudget as exc:  # (the count ran out inside a block all the same: nothing validated is lost)
        return Stage2Record(skipped=f"{exc}: stage 2 stopped before it validated anything; quotas kept")
    move_s = 0.0  # the most a block has cost beyond its iterations in the rounds so far
    rounds = [out]
    while len(rounds) < settings.quota_max_changes and rounds[-1].plan is not None:
        if (stop is not None and stop()) or budget.reached():
            break
        last = rounds[-1]
        # the next round's budget counts what a block cost here (a restart) from its first probe on; counted
        # as free until a probe of its own, a round's first probe could start where its validation no longer fit
        move_s = max(move_s, last.block_overhead_s or 0.0, _block_overhead(last.screened or [], 0.0))
        log(f"stage 2, round {len(rounds) + 1}: from the plan with {last.kept or ''}")
        assert last.plan is not None and last.validation is not None  # (a kept change was validated)
        result = replace(result, plan=last.plan)
        try:
            rounds.append(tune_quota(result, qm, settings, log, **options,  # type: ignore[arg-type]
                                     reference_s=list(last.validation["candidate"]["values"]), move_s=move_s))
        except OutOfBudget as exc:  # the earlier rounds' validated changes stand
            rounds.append(Stage2Record(skipped=f"{exc}: this round stopped before it validated anything"))
    return out if len(rounds) == 1 else _combine_rounds(out, rounds)


def _combine_rounds(out: Stage2Record, rounds: list[Stage2Record]) -> Stage2Record:
    """The section of several rounds: the first round's, with every round's, and what all kept."""
    kept = [r for r in rounds if r.plan is not None]
    quotas = {k: v for r in kept for k, v in (r.quotas or {}).items()}
    priorities = {k: v for r in kept for k, v in (r.priorities or {}).items()}
    return replace(out, rounds=[replace(r, plan=None) for r in rounds],
                   summary="; then ".join(r.summary or f"skipped ({r.skipped})" for r in rounds),
                   plan=kept[-1].plan if kept else None, quotas=quotas or None, priorities=priorities or None)


# the books' rows that time what stage 2 runs besides its restarts: complete iterations (training), the
# self-checks, local trials and their captures and snapshots, plan switches (`prepare_s`)
_OTHER_ROWS = ("complete_s", "quota_check_s", "local_s", "capture_s", "snapshot_s", "guard_snapshot_s", "layout_s")


def _other_books(qm: QuotaMeasurer) -> dict[str, float]:
    out = {k: float(getattr(qm.books, k)) for k in _OTHER_ROWS}
    out["prepare_s"] = float(qm.prepare_s or 0.0)
    out["quota_s"] = float(qm.books.quota_s)
    return out


def _book_stage2(qm: QuotaMeasurer, before: dict[str, float], elapsed: float) -> None:
    """`quota_s`: stage 2's time that no other row books -- moving the target to a new process under each
    trial setting and back (probes, the search, each validation block), and what a block costs beyond its
    iterations -- computed once from the stage's elapsed time, so that the report's rows add up (its
    complete iterations are training, booked in `complete_s`)."""
    after = _other_books(qm)
    others = sum(after[k] - before[k] for k in after if k != "quota_s")
    qm.books.quota_s = before["quota_s"] + max(0.0, elapsed - others)
