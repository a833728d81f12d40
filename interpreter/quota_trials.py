"""Stage 2 on the machine: quota trials for the GPU process with slack (paper §4.4, Algorithm 2).

With the graph fixed by stage 1, the branch pair and its slack come from the stage-1 plan's trace
(`rose_dsl.optimizer.quota.rank_targets`, from the plan's critical path). Each trial moves the target component to a new process
under the trial's MPS quota -- its state goes with it (`RayBackend.replace_actor`), so no training
progress is lost -- and times the comparison graph: the LCA of both branches, locally on captured
inputs and state snapshots when that is a loop, or complete iterations (real training) when it is the
whole iteration. The best quota is validated on complete iterations against the stage-1 quota, in
blocks around it -- q0 (stage 1's own measurement), q*, q0 again, where those blocks were measured already;
each switch restarts a process -- and kept only if faster by the noise margin.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from rose_dsl.ir import Workflow
from rose_dsl.optimizer.bound import call_floats
from rose_dsl.optimizer.decide import faster, summarize
from rose_dsl.optimizer.quota import (
    BUDGET_SPENT,
    BranchPair,
    distinct_levels,
    quota_search,
    rank_targets,
    screening_probes,
    sm_demand,
)
from rose_dsl.optimizer.regions import Probe, common_ancestor, local_graphs, probe_workflow
from rose_dsl.optimizer.search import OutOfBudget

from .mps import expected_sms, quota_levels
from .quota_safety import QuotaVerdict, check_quotas, machine_fingerprint

__all__ = ["tune_quota", "tune_mps", "first_probe_levels", "CheckPrefetch"]

Mps = tuple[int, int]  # one process's MPS settings: (quota percent, client priority: 0 normal, 1 below normal)

MAX_TRIALS = 7  # the paper's budget (§5.4): seven short quota trials
MAX_CHANGES = 2  # stage-2 rounds: one change each (a quota or a priority), the next from the plan kept
MAX_SCREENED = 3  # processes probed one coarse step down before the search picks one
PARALLEL_CHECKS = 6  # quota self-checks side by side: fresh MPS clients (MPS admits 48 per GPU), each
# poisoning at most a quarter of the free GPU memory


def _total_sms() -> int:
    import torch

    return int(torch.cuda.get_device_properties(0).multi_processor_count)


def _coarse_step(levels: list[tuple[int, int]]) -> int:
    """The search's and the screening's first step down, in levels (2-SM levels on Hopper: ~6%)."""
    return max(2, len(levels) // 16)


def _level_of(levels: list[tuple[int, int]], percent: int, total: int) -> int:
    return next(i + 1 for i, (_, sms) in enumerate(levels) if sms == expected_sms(percent, total))


def first_probe_levels(wf: Workflow, total_sms: int) -> list[int]:
    """The quota levels stage 2 asks the self-check about first: each GPU process's quota one coarse step
    down, where the screening probes it (`_screen`). Below 100% only (100% needs no check)."""
    levels = distinct_levels(quota_levels(total_sms))
    rho = _coarse_step(levels)
    out = set()
    for c in wf.components.values():
        if c.device != "gpu":
            continue
        percent = levels[max(1, _level_of(levels, c.mps_settings[0], total_sms) - rho) - 1][0]
        if percent < 100:
            out.add(percent)
    return sorted(out)


class CheckPrefetch:
    """The self-check of the screening's first levels (`first_probe_levels`), started beside the component
    processes' start-up instead of after stage 1: a check is a fresh MPS client's CUDA start plus CPU
    references (35-49 s for one level on an H100, 2026-12-05), the processes' start-up 20-27 s there, and
    neither needs the other. `wait` joins it right before stage 1's first timed iteration
    (`TrialSession.pending`): the untimed warm-up iteration runs beside it, no measurement does. The
    verdicts land in the per-machine cache, where stage 2's own checks find them. A prefetch that fails
    leaves stage 2 to check as before. The thread is a daemon: an interrupted run does not wait
    for it (its check process, a few seconds of GEMMs, ends by itself)."""

    def __init__(self, wf: Workflow, gpu: Any, check: Callable[[list[int]], Any] | None = None,
                 total_sms: Callable[[], int] = _total_sms) -> None:
        import threading

        self.levels: list[int] = []
        self.error: str | None = None
        self.started = time.perf_counter()
        self.ended: float | None = None

        def run() -> None:
            try:
                self.levels = first_probe_levels(wf, total_sms())
                if self.levels:
                    (check or (lambda percents: check_quotas(percents, gpu.client_env, parallel=PARALLEL_CHECKS)))(
                        self.levels)
            except Exception as exc:  # noqa: BLE001 - stage 2 checks again; the report says why this did not
                self.error = f"{type(exc).__name__}: {exc}"
            finally:
                self.ended = time.perf_counter()

        self._thread = threading.Thread(target=run, name="rose-quota-check-prefetch", daemon=True)
        self._thread.start()

    def wait(self, books: dict[str, float], log: Callable[[str], None], training_since: float | None = None) -> None:
        """Join it. The seconds waited are the self-check's cost beyond the start-up, booked with the checks
        (`quota_check_s`); `quota_check_prefetch_s` is its whole wall time, beside the start-up;
        `quota_check_beside_training_s` the part of it after `training_since` (a `time.perf_counter()`
        value: when the first, untimed iteration began), beside training -- said in the report, since any
        slowdown it caused that iteration is counted as training."""
        t = time.perf_counter()
        if self._thread.is_alive():
            log("waiting for the quota self-check started with the processes (stage 2 needs it; it is cached per machine)")
        self._thread.join()
        waited = time.perf_counter() - t
        books["quota_check_s"] = books.get("quota_check_s", 0.0) + waited
        books["quota_check_prefetch_s"] = (self.ended or t) - self.started
        books["quota_check_prefetch_levels"] = len(self.levels)
        if training_since is not None:
            books["quota_check_beside_training_s"] = max(0.0, (self.ended or t) - training_since)
        if self.error:
            log(f"the quota self-check started with the processes failed ({self.error}); stage 2 checks again")


def _gpu_of(wf: Workflow) -> dict[str, int | None]:
    return {name: (c.gpu or 0) if c.device == "gpu" else None for name, c in wf.components.items()}


def _region(plan: Workflow, pair: BranchPair) -> tuple[str, ...]:
    tops = {k.split("[")[0] for k in pair.target_branches + pair.other_branches}
    return common_ancestor([(plan.root.path[0], top) for top in sorted(tops)])


def tune_quota(wf: Workflow, result: Any, session: Any, gpu: Any, settings: Any, log: Callable[[str], None],
               total_sms: int | None = None, repeats: int = 3, deadline: float | None = None,
               check: Callable[[list[int]], dict[int, QuotaVerdict]] | None = None,
               stop: Callable[[], str | None] | None = None, priorities: bool = False,
               quotas: bool = True, reference_s: list[float] | None = None,
               running: dict[str, Mps] | None = None, move_s: float = 0.0) -> dict[str, Any]:
    """Algorithm 2 for the stage-1 plan `result.plan`; returns the report's stage-2 section, with
    `quotas` (or `priorities`) and `plan` when a change is kept. `deadline` (a `time.perf_counter()` value)
    ends the search early with the best level measured so far (leaving time for the validation).
    `check(percents)` says for each level whether GEMMs are correct under it on this machine (default:
    `quota_safety.check_quotas`, cached, PARALLEL_CHECKS at once); an unsafe level is never used. With
    `priorities`, the screening also tries each candidate at a below-normal MPS client priority (beyond the
    paper: it takes no SMs away, it lets the critical process's kernels go first); a priority that wins the
    screening is validated like a quota. `quotas` False: priorities only (no quota probe, search or
    self-check). `reference_s`: complete iterations of `result.plan` measured since `result.final_runs`
    (a later stage-2 round: its predecessor's validation), the reference instead of those runs, which
    still give the ranking (the graph is the same; only one process's MPS settings changed). `running`: the
    MPS settings each process runs under now, where they differ from the plan's (a validation ends with its
    target at the reference, `_validate`); it is kept up to date as processes move. `move_s`: the most a
    block has cost beyond its iterations so far (a previous round's), what the budget counts per block until
    this round measures its own."""
    plan = result.plan
    gpu_of = _gpu_of(plan)
    # SM demand from every run measured: the declared graph's runs show each process alone most often
    demand = sm_demand([*result.baseline_runs, *result.final_runs], gpu_of)
    ranked = rank_targets(result.final_runs, gpu_of, [call_floats(plan, r) for r in result.final_runs], demand=demand)
    if isinstance(ranked, str):
        return {"skipped": f"no process to give SMs away: {ranked}; quotas kept"}
    started = time.perf_counter()
    total = total_sms or _total_sms()
    levels = distinct_levels(quota_levels(total))  # [(percent, SMs)] ascending: level k is levels[k - 1]
    rho = _coarse_step(levels)
    # each process's MPS settings: (quota percent, client priority), both fixed for a process's lifetime --
    # as the plan declares them, and as the processes run now (`running`, shared with the caller)
    declared: dict[str, Mps] = {name: c.mps_settings for name, c in plan.components.items()}
    mps: dict[str, Mps] = running if running is not None else {}
    for name, setting in declared.items():
        mps.setdefault(name, setting)

    def level_of(percent: int) -> int:
        return _level_of(levels, percent, total)

    def restart(name: str, setting: Mps) -> None:
        comp = plan.components[name]
        # back to the plan's own settings: the process starts as it was started (no explicit 100% where the
        # plan sets no quota), so the reference is the very configuration stage 1 measured
        quota, priority = (comp.mps_quota, comp.mps_priority) if setting == declared[name] else setting
        if setting[1] == mps[name][1]:
            session.replace_quota(name, quota, gpu.client_env(quota, priority))
        else:
            session.replace_quota(name, quota, gpu.client_env(quota, priority), priority=setting[1])
        mps[name] = setting

    def move(name: str, setting: Mps) -> None:
        """`name` to a new process under these settings (its state moved with it), unless it runs under them;
        first every other process back to the plan's settings, so that a measurement changes one process only
        (a probe's process put back, or an earlier round's target its validation left at the reference)."""
        for other, own in declared.items():
            if other != name and mps[other] != own:
                restart(other, own)
        if mps[name] != setting:
            restart(name, setting)

    def use_on(name: str, percent: int) -> None:  # (the process keeps its client priority)
        move(name, (percent, mps[name][1]))

    unsafe: dict[int, str] = {}
    checked: dict[int, QuotaVerdict] = {}  # percent -> verdict, for every level checked (asked or prefetched)
    if check is None:
        fingerprint = machine_fingerprint()

        def check(percents: list[int]) -> dict[int, QuotaVerdict]:
            return check_quotas(percents, gpu.client_env, fingerprint=fingerprint, parallel=PARALLEL_CHECKS, stop=stop)

    # how many levels one self-check batch asks: the screening asks its probe's level alone, the search (and
    # a screening that met an unsafe level, so walks down) PARALLEL_CHECKS -- H100, MJX (2026-12-05): the
    # screening's batch of six cost 42.4 s where one level costs ~20 s, and no search followed
    width = [1]

    def prefetch(k: int) -> None:
        """Check level k together with the unchecked levels nearest below it (the search goes down; the
        levels above are asked only around the anchor), `width` at once -- a batch of PARALLEL_CHECKS costs
        about twice what one check costs."""
        near = sorted((j for j in range(1, len(levels) + 1) if levels[j - 1][0] < 100 and levels[j - 1][0] not in checked
                       and j != k), key=lambda j: (j > k, abs(j - k)))
        batch = [levels[j - 1][0] for j in [k, *near[:width[0] - 1]]]
        checked.update(check(batch))
        session.books["quota_checks"] = session.books.get("quota_checks", 0) + len(batch)
        if not all(checked[p].ok for p in batch):  # a run of unsafe levels: the walk down goes in batches
            width[0] = PARALLEL_CHECKS

    def safe(k: int) -> bool:
        """A level under which this machine's GEMMs are wrong is never tried (quota_safety.py, issue 16)."""
        percent = levels[k - 1][0]
        if percent >= 100:
            return True
        if percent not in checked:
            prefetch(k)
        verdict = checked[percent]
        if not verdict.ok:
            unsafe[percent] = verdict.detail
            why = ("its self-check did not run, so it is not known to be safe" if verdict.sm_count is None
                   else "the GPU math self-check fails under it here")
            log(f"  quota {percent}% ({verdict.sm_count} SMs) skipped: {why} ({verdict.detail})")
        return verdict.ok

    def usable(k: int) -> bool:
        t = time.perf_counter()
        verdict = safe(k)
        # the self-checks are booked apart: a verdict is cached per machine (GPU, driver, torch/CUDA), so
        # they are paid once per machine, not by every run (the report shows the net overhead both ways)
        session.books["quota_check_s"] = session.books.get("quota_check_s", 0.0) + time.perf_counter() - t
        return verdict

    def checked_levels() -> dict[int, dict[str, Any]]:
        return {p: {"sms": v.sm_count, "safe": v.ok} for p, v in sorted(checked.items())}

    # the starting level of a whole-iteration comparison graph is what stage 1 measured last: complete
    # iterations of this plan under these quotas -- reused instead of measured again
    final = [r.seconds for r in result.final_runs] if len(result.final_runs) >= repeats else []
    if reference_s is not None:  # a later round: the plan it starts from was measured by its validation
        final = list(reference_s)
    # the search leaves time for the validation that follows it: three blocks of complete iterations
    # and the process restarts between them (a restart's cost: the slowest trial's overhead so far)
    per_block = max(2, settings.validation_rounds // 2 + 1)
    pair = ranked[0]
    seeded: dict[int, list[float]] = {}
    screened: list[dict[str, Any]] = []
    probes = screening_probes(ranked, priorities, MAX_SCREENED, quotas=quotas)
    if not probes:
        return {"skipped": "neither quotas nor priorities were asked for"}
    chosen: _Screened | None = None
    if len(probes) > 1 or not quotas:  # (one quota candidate alone: its search's first trial is the probe)
        iteration_s = statistics.median(final) if final else 0.0

        def screening_over(overhead_s: float) -> str | None:
            """A stop request, or no time for one more probe and the search's validation after it: the probe's
            iterations and two restarts (the previous probe's process put back, this one moved), the validation's
            three blocks each with a restart -- `overhead_s` the most a probe has cost beyond its iterations so
            far (the restart, the plan switch, a slow first iteration). H200, MJX (2026-12-04e): counted without
            restarts, a second probe looked affordable in a budget that then had no room left to validate the first."""
            reason = stop() if stop is not None else None
            need = (repeats + 3 * per_block) * iteration_s + 5 * overhead_s
            if not reason and deadline is not None and time.perf_counter() + need > deadline:
                reason = BUDGET_SPENT
            return reason

        chosen, screened = _screen(plan, probes, session, repeats, final, levels, rho, level_of, usable, mps,
                                   declared, move, log, screening_over, move_s)
        if chosen is None:
            cut = next((r["skipped"] for r in screened if r.get("stopped")), None)
            kinds = {k for _, k in probes}
            none_of = {"quota": "no process's first step down", "priority": "no process at a below-normal priority"}
            why = (f"the screening stopped ({cut})" if cut else
                   "no process's first step down, nor a below-normal priority, was faster" if len(kinds) == 2 else
                   f"{none_of[kinds.pop()]} was faster")
            return {"skipped": f"{why}: quotas kept", "screened": screened, "checked_levels": checked_levels(),
                    "unsafe_levels": unsafe, "trial_seconds": time.perf_counter() - started}
        pair = chosen.pair
        seeded = {chosen.k0: chosen.reference, chosen.k: chosen.values}
    q0, p0 = start = plan.components[pair.target].mps_settings  # the plan's (the screening may have left it moved)
    k0 = level_of(q0)
    region = _region(plan, pair)
    iteration_s = (statistics.median(final) if reference_s is not None else
                   statistics.median(r.seconds for r in result.final_runs) if result.final_runs else 0.0)
    # what a block of complete iterations costs beyond its iterations (a restart, the plan switch, a slow
    # first iteration): the most any probe so far cost beyond its own
    cost = {"overhead": max([move_s, *(max(r.get("overhead_s", 0.0), r.get("restart_s", 0.0)) for r in screened)])}

    def block_s(iterations: int) -> float:
        return iterations * iteration_s + cost["overhead"]

    out: dict[str, Any] = {
        "target": pair.target, "other": pair.other, "gpu": pair.gpu, "slack_s": pair.slack_s, "overlap_s": pair.overlap_s,
        "score_s": pair.score_s, "demand": pair.demand, "screened": screened,
        "branches": {"target": list(pair.target_branches), "other": list(pair.other_branches)},
        "comparison_graph": ".".join(region), "levels": len(levels), "rho": rho, "start_percent": q0,
        "unsafe_levels": unsafe, "trials": 0, "search_stopped": None, "best_percent": q0,
    }
    if chosen is not None and chosen.kind == "priority":  # no search: one other setting, validated
        log(f"stage 2: {pair.target} at a below-normal MPS client priority was the screening's best "
            f"({chosen.gain:.3f}x); validating it")
        out.update(kind="priority", checked_levels=checked_levels())
        reuse = chosen.values if region == plan.root.path and mps[pair.target] == chosen.setting else []
        out["block_overhead_s"] = cost["overhead"]
        return _validate(out, plan, pair.target, chosen.setting, start, reuse, session, move, settings, per_block,
                         block_s, deadline, stop, log, started, before=final if region == plan.root.path else [])
    log(f"stage 2: {pair.target} has {pair.slack_s:.3f} s of float beside critical calls of {pair.other} "
        f"({pair.overlap_s:.2f} s per iteration); tuning its quota from {q0}% on {'.'.join(region)}")
    measure_graph = _comparison(plan, region, session, repeats)
    samples: dict[int, list[float]] = {}
    reused = final if region == plan.root.path else []
    # levels measured already, read by the search for free: stage 1's last measurement at the current
    # quota, the screening's step down (and its reference)
    samples.update(seeded)
    if reused:
        samples[k0] = reused
        log(f"  quota {q0}% ({levels[k0 - 1][1]} SMs): {statistics.median(reused):.4f} s (stage 1's measurement)")
    known = {k: statistics.median(v) for k, v in samples.items()}

    def measure(k: int) -> float:
        percent = levels[k - 1][0]
        t = time.perf_counter()
        use_on(pair.target, percent)
        cost["overhead"] = max(cost["overhead"], time.perf_counter() - t)  # the restart at least
        values = measure_graph()
        samples[k] = values
        if region == plan.root.path:  # complete iterations: what the block cost beyond them
            cost["overhead"] = max(cost["overhead"], time.perf_counter() - t - sum(values))
        session.books["quota_trials"] += 1
        log(f"  quota {percent}% ({levels[k - 1][1]} SMs): {statistics.median(values):.4f} s")
        return statistics.median(values)

    def out_of_time() -> bool:
        """A stop request, or no time for the next probe AND a whole validation after it (three blocks: once
        the target has moved to the probed level, no measured block can be the validation's first). H200, MJX
        (2026-12-05, 500-s budget): counting the validation alone, the search probed 93% (and self-checked
        five levels below it) after screening 94% at 1.032x, and then had no time left to validate 94%."""
        if stop is not None and stop():
            return True
        return deadline is not None and time.perf_counter() + block_s(repeats) + 3 * block_s(per_block) > deadline

    width[0] = PARALLEL_CHECKS  # the search steps level by level: its checks go in batches
    search = quota_search(len(levels), k0, measure, rho=rho, max_trials=MAX_TRIALS, out_of_time=out_of_time,
                          usable=usable, known=known)
    best_percent = levels[search.best - 1][0]
    curve: list[dict[str, Any]] = [{"percent": levels[k - 1][0], "sms": levels[k - 1][1],
              "seconds": search.history[k],
              "n": len(samples.get(k, [])), "samples": samples.get(k, []),
              "unsafe": False, "reused": k in known} for k in sorted(search.history)]
    curve += [{"percent": levels[k - 1][0], "sms": levels[k - 1][1], "seconds": None, "n": 0, "samples": [], "unsafe": True}
              for k in search.skipped]
    curve.sort(key=lambda row: row["sms"])
    out.update(kind="quota", curve=curve, checked_levels=checked_levels(), trials=search.trials,
               search_stopped=search.stopped, best_percent=best_percent)
    reason = stop() if stop is not None else None
    if reason:
        out["search_stopped"] = reason
    if reason and best_percent != q0:  # stopped: an unvalidated level is not kept
        move(pair.target, start)
        out["summary"] = (f"stopped before validating {pair.target} at {best_percent}% ({reason}): kept {q0}% "
                          f"({out['trials']} trials)")
        out["trial_seconds"] = time.perf_counter() - started
        return out
    if best_percent == q0:
        move(pair.target, start)
        probe = next((r for r in screened if r["target"] == pair.target and r.get("kind", "quota") == "quota"
                      and r.get("seconds") is not None), None)
        tried = f"screened at {probe['percent']}% ({probe['gain']:.3f}x), then " if probe else ""
        out["summary"] = (f"kept {pair.target} at {q0}%: no other level was faster locally ({out['trials']} trials)"
                          if out["trials"] or not search.stopped else
                          f"kept {pair.target} at {q0}%: {tried}no other level was tried ({search.stopped})")
        out["trial_seconds"] = time.perf_counter() - started
        return out
    # The target still runs at the level it was measured at last (the search and the screening leave it
    # there), so when that is the chosen level and the comparison graph was the whole iteration, that block
    # is the validation's A, and stage 1's measurement of the plan (or the previous round's) its first B --
    # two restarts and two blocks saved, the drift check intact
    best = (best_percent, p0)
    reuse = samples.get(search.best, []) if region == plan.root.path and mps[pair.target] == best else []
    out["block_overhead_s"] = cost["overhead"]
    return _validate(out, plan, pair.target, best, start, reuse, session, move, settings, per_block, block_s,
                     deadline, stop, log, started, before=reused)


def tune_mps(wf: Workflow, result: Any, session: Any, gpu: Any, settings: Any, log: Callable[[str], None],
             changes: int = MAX_CHANGES, **options: Any) -> dict[str, Any]:
    """Stage 2 in rounds of `tune_quota`, each keeping at most one change (a quota or a client priority): a
    round that kept one is followed by another from the plan it kept -- its validation's candidate blocks are
    that round's reference; stage 1's runs still rank the processes (same graph) -- while the budget lasts (each round starts only if its
    screening fits, as the first). Why more than one: a quota and a priority act on different processes
    and resources (the policy's SMs, a simulator's turn), so the best of each can add up; the paper tunes
    one process. The section is the first round's, with `rounds` (each round's section), and `quotas`,
    `priorities`, `plan` and `summary` for all of them."""
    started, booked = time.perf_counter(), _other_books(session)
    by_count, deadline = _count_deadline(session, result), options.get("deadline")
    counted = by_count is not None and (deadline is None or by_count < deadline)
    if counted:
        options["deadline"] = by_count
        left = session.limit - session.k
    try:
        out = _tune_rounds(wf, result, session, gpu, settings, log, changes, **options)
    finally:
        _book_stage2(session, booked, time.perf_counter() - started)
    for key in ("summary", "skipped"):  # (a section says why it ended in one of them)
        if counted and BUDGET_SPENT in str(out.get(key, "")):
            out[key] += (f" (stage 2's budget was the workflow's iteration count: {left} iterations were left "
                         "when it began; raise it with --set iterations=N)")
    return out


COUNT_MARGIN = 0.85  # of the iterations left, the share stage 2 plans to use (a faster quota runs more per second)


def _count_deadline(session: Any, result: Any) -> float | None:
    """The workflow's iteration count as a deadline: the session trains at most `limit` iterations
    (`TrialSession._iteration` refuses more, OutOfBudget), and stage 2's blocks are complete iterations, so
    the iterations left, at the plan's measured pace and with a margin, are a time budget too -- checked as
    the time budget is, before each probe and block, so that stage 2 ends with what it validated instead
    of running out of iterations inside a block. None: no count, or nothing measured to pace it by."""
    limit, k = getattr(session, "limit", None), getattr(session, "k", None)
    runs = getattr(result, "final_runs", None) or []
    if limit is None or k is None or not runs:
        return None
    return time.perf_counter() + COUNT_MARGIN * max(0, limit - k) * statistics.median(r.seconds for r in runs)


# the report's rows that time what stage 2 runs besides its restarts: complete iterations (training), the
# self-checks, local trials and their captures and snapshots, plan switches (the executor's `prepare_s`)
_OTHER_ROWS = ("complete_s", "quota_check_s", "local_s", "capture_s", "snapshot_s", "guard_snapshot_s", "layout_s")


def _other_books(session: Any) -> dict[str, float]:
    out = {k: float(session.books.get(k, 0.0)) for k in _OTHER_ROWS}
    out["prepare_s"] = float(getattr(getattr(session, "executor", None), "prepare_s", 0.0) or 0.0)
    out["quota_s"] = float(session.books.get("quota_s", 0.0))
    return out


def _book_stage2(session: Any, before: dict[str, float], elapsed: float) -> None:
    """`quota_s`: stage 2's time that no other row books -- moving the target to a new process under each
    trial setting and back (probes, the search, each validation block), and what a block costs beyond its
    iterations -- computed once from the stage's elapsed time, so that the report's rows add up. Before,
    the probes' blocks were booked whole, their complete iterations (training, in `complete_s`) counted
    twice, and the validation's restarts nowhere (H100, 2026-12-05: 46.6 s booked, ~40 s of restarts)."""
    after = _other_books(session)
    others = sum(after[k] - before[k] for k in after if k != "quota_s")
    session.books["quota_s"] = before["quota_s"] + max(0.0, elapsed - others)


def settle(plan: Workflow, running: dict[str, Mps], session: Any, gpu: Any) -> list[str]:
    """Move each process that runs under other MPS settings than `plan` declares (`running`, as stage 2 left
    them: a validation ends with its target at the reference) to a process under the plan's, its state
    moved with it -- to the parked process of those settings where there is one (`replace_actor`) -- so
    that training goes on in the processes as the plan runs them (`rose optimize --train`). The names moved."""
    moved = []
    for name, comp in plan.components.items():
        if name in running and running[name] != comp.mps_settings:
            session.replace_quota(name, comp.mps_quota, gpu.client_env(comp.mps_quota, comp.mps_priority),
                                  priority=comp.mps_priority)
            running[name] = comp.mps_settings
            moved.append(name)
    return moved


def _tune_rounds(wf: Workflow, result: Any, session: Any, gpu: Any, settings: Any, log: Callable[[str], None],
                 changes: int, running: dict[str, Mps] | None = None, **options: Any) -> dict[str, Any]:
    # the MPS settings each process runs under now, across rounds (the caller's, to `settle` after)
    running = {} if running is None else running
    try:
        out = tune_quota(wf, result, session, gpu, settings, log, **options, running=running)
    except OutOfBudget as exc:  # (the count ran out inside a block all the same: nothing validated is lost)
        return {"skipped": f"{exc}: stage 2 stopped before it validated anything; quotas kept"}
    move_s = 0.0  # the most a block has cost beyond its iterations in the rounds so far
    rounds = [out]
    while len(rounds) < changes and "plan" in rounds[-1]:
        stop, deadline = options.get("stop"), options.get("deadline")
        if (stop is not None and stop()) or (deadline is not None and time.perf_counter() >= deadline):
            break
        last = rounds[-1]
        # the next round's budget counts what a block cost here (a restart: 10.9-13.5 s on the H100s) from its
        # first probe on; counted as free until a probe of its own, a round's first probe could start where
        # its validation no longer fit
        move_s = max([move_s, float(last.get("block_overhead_s", 0.0)),
                      *(max(r.get("overhead_s", 0.0), r.get("restart_s", 0.0)) for r in last.get("screened", []))])
        log(f"stage 2, round {len(rounds) + 1}: from the plan with {last['summary'].split(':')[0]}")
        result = replace(result, plan=last["plan"])
        try:
            rounds.append(tune_quota(wf, result, session, gpu, settings, log, **options, running=running,
                                     reference_s=list(last["validation"]["candidate"]["values"]), move_s=move_s))
        except OutOfBudget as exc:  # the earlier rounds' validated changes stand
            rounds.append({"skipped": f"{exc}: this round stopped before it validated anything"})
    if len(rounds) == 1:
        return out
    kept = [r for r in rounds if "plan" in r]
    top = {**out, "rounds": [{k: v for k, v in r.items() if k != "plan"} for r in rounds],
           "summary": "; then ".join(r.get("summary") or f"skipped ({r.get('skipped')})" for r in rounds)}
    quotas = {k: v for r in kept for k, v in (r.get("quotas") or {}).items()}
    priorities = {k: v for r in kept for k, v in (r.get("priorities") or {}).items()}
    top.pop("quotas", None)
    top.pop("priorities", None)
    top.update({"plan": kept[-1]["plan"]} if kept else {})
    top.update({"quotas": quotas} if quotas else {})
    top.update({"priorities": priorities} if priorities else {})
    return top


def _describe(setting: Mps) -> str:
    """`94%`, `100% at below-normal priority`: one process's MPS settings, as the log and the report say them."""
    return f"{setting[0]}%" + (" at below-normal priority" if setting[1] else "")


def _validate(out: dict[str, Any], plan: Workflow, target: str, cand: Mps, ref: Mps, reuse: list[float], session: Any,
              move: Callable[[str, Mps], None], settings: Any, per_block: int, block_s: Callable[[int], float],
              deadline: float | None, stop: Callable[[], str | None] | None, log: Callable[[str], None],
              started: float, before: list[float] | None = None) -> dict[str, Any]:
    """`target` under `cand` against `ref` (its settings before stage 2) on complete iterations, in blocks
    that bracket one another, so that a drift in time hits both alike: B/A/B when `before` is given --
    complete iterations under `ref`, the plan's own processes, measured before `reuse` (stage 1's
    measurement of the plan, or a previous round's) -- else A/B/A. `reuse` is a block already measured under
    `cand` with the target still there, the A. Each switch restarts the process, so B/A/B with both blocks
    measured runs one block and one restart (H100, MJX, 2026-12-05: a restart 10.9-13.5 s, A/B/A cost two),
    and ends with the target at `ref`, where it stays: the plan says `cand`, a later round moves it there
    before it measures anything (`move`), and otherwise only the hand-over checkpoint follows. `out` (the stage-2
    section) gets the validation and the summary, and, when `cand` was faster by more than the noise margin,
    `quotas` or `priorities` and the `plan` with them; otherwise the target goes back to `ref`."""
    best_s: list[float] = list(reuse)
    ref_s: list[float] = []
    blocks: list[tuple[Mps, list[float]]] = [(cand, best_s), (ref, ref_s), (cand, best_s)]
    if before:
        ref_s += before
        blocks = blocks[1:2] if reuse else blocks[:2]
        out["validation_reused_reference"] = len(before)
    elif reuse:
        blocks = blocks[1:]
    if reuse:
        out["validation_reused_block"] = len(reuse)
    need_s = len(blocks) * block_s(per_block)
    if deadline is not None and time.perf_counter() + need_s > deadline:
        move(target, ref)
        out["trial_seconds"] = time.perf_counter() - started
        out["summary"] = (f"{target} at {_describe(cand)} was fastest ({out['trials']} trials) but not validated: "
                          f"{BUDGET_SPENT} (the validation needs ~{need_s:.0f} s): kept {_describe(ref)}")
        return out
    log(f"stage 2: validating {target} at {_describe(cand)} against {_describe(ref)} on complete iterations")
    for setting, bucket in blocks:
        # a stop request between the blocks (A/B/A, each a restart and a few iterations): end here rather
        # than after the whole validation -- on the H200 the three blocks took ~90 s, longer than the
        # SIGKILL grace of a device call (2026-12-02: killed in validation, no report)
        reason = stop() if stop is not None else None
        if reason:
            move(target, ref)
            out.update(search_stopped=reason, trial_seconds=time.perf_counter() - started,
                       summary=f"stopped while validating {target} at {_describe(cand)} ({reason}): kept "
                               f"{_describe(ref)} ({out['trials']} trials)")
            return out
        move(target, setting)
        bucket += [r.seconds for r in session.complete([plan], per_block, 0, [f"mps {target} {_describe(setting)}"])[0]]
    reference, candidate = summarize(ref_s), summarize(best_s)
    ok, eps = faster(reference, candidate, settings.eps_min, settings.z)
    out["validation"] = {"reference": reference.to_json(), "candidate": candidate.to_json(), "margin": eps, "accepted": ok}
    out["trial_seconds"] = time.perf_counter() - started
    if not ok:
        move(target, ref)
        out["summary"] = (f"{target} at {_describe(cand)} was fastest locally but complete iterations were not faster "
                          f"by more than {eps:.1%} ({candidate.median:.3f} vs {reference.median:.3f} s): kept {_describe(ref)}")
        return out
    comp = replace(plan.components[target], mps_quota=cand[0] if cand[0] != ref[0] else plan.components[target].mps_quota,
                   mps_priority=cand[1] if cand[1] != ref[1] else plan.components[target].mps_priority)
    out["plan"] = replace(plan, components={**plan.components, target: comp})
    if cand[0] != ref[0]:
        out["quotas"] = {target: cand[0]}
    if cand[1] != ref[1]:
        out["priorities"] = {target: cand[1]}
    what = "quota trials" if cand[0] != ref[0] else "trials"
    out["summary"] = (f"{target} at {_describe(cand)} (was {_describe(ref)}): {reference.median / candidate.median:.2f}x "
                      f"on complete iterations ({out['trials']} {what})")
    return out


def _comparison(plan: Workflow, region: tuple[str, ...], session: Any, repeats: int) -> Callable[[], list[float]]:
    """How one quota trial is timed: the region locally (captured once), or complete iterations."""
    if region != plan.root.path:
        c0, _ = local_graphs(plan, [], region, 1, "interpreter.trials:Feed")
        if not isinstance(c0, str):
            pw = probe_workflow(plan, [Probe(999, region, c0.externals)], "interpreter.trials:Probe")
            if not isinstance(pw, str):
                captured = session.capture(pw)
                return lambda: [r.seconds for r in session.local([c0], repeats, captured, 999)[0]]
    return lambda: [r.seconds for r in session.complete([plan], repeats, 0, ["quota trial"])[0]]


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


def _stopped_rows(probes: list[tuple[BranchPair, str]], reason: str) -> list[dict[str, Any]]:
    """The screening's rows of the probes a stop request or the budget left unmeasured."""
    return [{"target": p.target, "kind": kind, "other": p.other, "score_s": p.score_s, "demand": p.demand,
             "slack_s": p.slack_s, "overlap_s": p.overlap_s, "skipped": reason, "stopped": True} for p, kind in probes]


def _screen(plan: Workflow, probes: list[tuple[BranchPair, str]], session: Any, repeats: int, final: list[float],
            levels: list[tuple[int, int]], rho: int, level_of: Callable[[int], int], usable: Callable[[int], bool],
            mps: dict[str, Mps], declared: dict[str, Mps], move: Callable[[str, Mps], None],
            log: Callable[[str], None], stop: Callable[[float], str | None] | None,
            move_s: float = 0.0) -> tuple[_Screened | None, list[dict[str, Any]]]:
    """Which one-step change gets the search (or, for a priority, the validation): each probe (the order of
    `quota.screening_probes`) moves a process with float one coarse quota step down, or to a below-normal
    client priority, and times its comparison graph against that graph at the current settings; the largest
    gain wins. None when no probe was faster. Why measure: the floats say whose calls can wait, not whose
    SMs the critical calls lack -- on the H200 the interleaved MJX rollout ranks the second simulator first,
    a launch-bound process with few SMs to give, while the policy's acts at 94% gave 4% (one `rose compare`,
    2026-12-03).

    A probe's process is put back only when another probe follows (`stop(restart_s)` says whether one fits):
    the last one probed stays moved, so when it wins, its block is the validation's first."""
    references: dict[tuple[str, ...], list[float]] = {}
    rows: list[dict[str, Any]] = []
    measured: list[_Screened] = []
    moved: tuple[str, Mps] | None = None  # the previous probe's process and the settings to put it back to
    overhead_s = move_s  # the most a probe cost beyond its measured iterations (so far: a previous round's)
    for i, (pair, kind) in enumerate(probes):
        reason = stop(overhead_s) if stop is not None else None
        if reason:
            rows += _stopped_rows(probes[i:], reason)
            break
        if moved is not None:
            move(*moved)
            moved = None
        start = declared[pair.target]
        q0, p0 = start
        k0 = level_of(q0)
        row: dict[str, Any] = {"target": pair.target, "kind": kind, "other": pair.other, "score_s": pair.score_s,
                               "demand": pair.demand, "slack_s": pair.slack_s, "overlap_s": pair.overlap_s,
                               "start_percent": q0, "start_priority": p0}
        rows.append(row)
        if kind == "priority":
            if p0 >= 1:
                row["skipped"] = "already at a below-normal priority"
                continue
            k, setting = k0, (q0, 1)
        else:
            # one coarse step down, or the first usable level within another coarse step below it: each level
            # asked may cost a self-check batch (~20-40 s), so the walk is short and asks the budget at each
            # step -- H100, MJX (2026-12-05): from 94%, every level from 88% to 52% failed its check, and an
            # unbounded walk checked all of them, past the time budget, until the run was killed
            k, lowest, reason = max(1, k0 - rho), max(1, k0 - 2 * rho), None
            while not usable(k):
                k -= 1
                reason = stop(overhead_s) if stop is not None and k >= lowest else None
                if k < lowest or reason:
                    break
            if reason:
                row.update(skipped=reason, stopped=True)
                rows += _stopped_rows(probes[i + 1:], reason)
                break
            if k < lowest:
                row["skipped"] = (f"no usable level within two coarse steps below {q0}% (the GPU math self-check "
                                  f"fails under each of them here)")
                continue
            setting = (levels[k - 1][0], p0)
        region = _region(plan, pair)
        graph = _comparison(plan, region, session, repeats)
        if region not in references:
            if not (region == plan.root.path and final):
                move(pair.target, start)  # every process as the plan has it
            references[region] = final if region == plan.root.path and final else graph()
        ref = references[region]
        t = time.perf_counter()
        move(pair.target, setting)
        row["restart_s"] = time.perf_counter() - t
        values = graph()
        # complete iterations: what the block cost beyond them; a local graph tells the restart only
        row["overhead_s"] = (time.perf_counter() - t - sum(values)) if region == plan.root.path else row["restart_s"]
        overhead_s = max(overhead_s, row["overhead_s"], row["restart_s"])
        session.books["quota_trials"] = session.books.get("quota_trials", 0) + 1
        moved = (pair.target, start)
        probe = _Screened(pair, kind, start, setting, k0, k, ref, values)
        row.update(percent=setting[0], priority=setting[1], seconds=statistics.median(values), samples=values,
                   reference_s=statistics.median(ref), gain=probe.gain)
        log(f"  screening {pair.target} at {_describe(setting)}: {statistics.median(values):.4f} s against "
            f"{statistics.median(ref):.4f} s at {_describe(start)} ({probe.gain:.3f}x)")
        measured.append(probe)
    best = max(measured, key=lambda p: p.gain, default=None)
    if best is not None and best.gain <= 1.0:
        best = None
    for probe in measured:  # only the winner may stay moved
        if probe is not best and mps[probe.pair.target] == probe.setting:
            move(probe.pair.target, probe.start)
    return best, rows
