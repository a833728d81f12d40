"""Stage 2 on the machine: quota trials for the GPU process with slack (paper §4.4, Algorithm 2).

With the graph fixed by stage 1, the branch pair and its slack come from the stage-1 plan's trace
(`rose_dsl.optimizer.quota.rank_targets`, from the plan's critical path). Each trial moves the target component to a new process
under the trial's MPS quota -- its state goes with it (`RayBackend.replace_actor`), so no training
progress is lost -- and times the comparison graph: the LCA of both branches, locally on captured
inputs and state snapshots when that is a loop, or complete iterations (real training) when it is the
whole iteration. The best quota is validated on complete iterations against the stage-1 quota, in
blocks (q*, q0, q*: each switch restarts a process) and kept only if faster by the noise margin.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from rose_dsl.ir import Workflow
from rose_dsl.optimizer.bound import call_floats
from rose_dsl.optimizer.decide import faster, summarize
from rose_dsl.optimizer.quota import BranchPair, distinct_levels, quota_search, rank_targets, sm_demand
from rose_dsl.optimizer.regions import Probe, common_ancestor, local_graphs, probe_workflow

from .mps import expected_sms, quota_levels
from .quota_safety import QuotaVerdict, check_quotas, machine_fingerprint

__all__ = ["tune_quota"]

MAX_TRIALS = 7  # the paper's budget (§5.4): seven short quota trials
MAX_SCREENED = 3  # processes probed one coarse step down before the search picks one
PARALLEL_CHECKS = 6  # quota self-checks side by side: fresh MPS clients (MPS admits 48 per GPU), each
# poisoning at most a quarter of the free GPU memory


def _total_sms() -> int:
    import torch

    return int(torch.cuda.get_device_properties(0).multi_processor_count)


def _gpu_of(wf: Workflow) -> dict[str, int | None]:
    return {name: (c.gpu or 0) if c.device == "gpu" else None for name, c in wf.components.items()}


def _region(plan: Workflow, pair: BranchPair) -> tuple[str, ...]:
    tops = {k.split("[")[0] for k in pair.target_branches + pair.other_branches}
    return common_ancestor([(plan.root.path[0], top) for top in sorted(tops)])


def tune_quota(wf: Workflow, result: Any, session: Any, gpu: Any, settings: Any, log: Callable[[str], None],
               total_sms: int | None = None, repeats: int = 3, deadline: float | None = None,
               check: Callable[[list[int]], dict[int, QuotaVerdict]] | None = None,
               stop: Callable[[], str | None] | None = None) -> dict[str, Any]:
    """Algorithm 2 for the stage-1 plan `result.plan`; returns the report's stage-2 section, with
    `quotas` and `plan` when a quota is kept. `deadline` (a `time.perf_counter()` value) ends the search
    early with the best level measured so far (leaving time for the validation). `check(percents)` says for
    each level whether GEMMs are correct under it on this machine (default: `quota_safety.check_quotas`,
    cached, PARALLEL_CHECKS at once); an unsafe level is never used."""
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
    rho = max(2, len(levels) // 16)
    quotas = {name: c.mps_quota or 100 for name, c in plan.components.items()}  # each process's quota now

    def level_of(percent: int) -> int:
        return next(i + 1 for i, (_, sms) in enumerate(levels) if sms == expected_sms(percent, total))

    def use_on(name: str, percent: int) -> None:
        if quotas[name] != percent:  # (the process keeps its client priority)
            session.replace_quota(name, percent, gpu.client_env(percent, plan.components[name].mps_priority))
            quotas[name] = percent

    unsafe: dict[int, str] = {}
    checked: dict[int, QuotaVerdict] = {}  # percent -> verdict, for every level checked (asked or prefetched)
    if check is None:
        fingerprint = machine_fingerprint()

        def check(percents: list[int]) -> dict[int, QuotaVerdict]:
            return check_quotas(percents, gpu.client_env, fingerprint=fingerprint, parallel=PARALLEL_CHECKS)

    def prefetch(k: int) -> None:
        """Check level k together with the unchecked levels nearest below it (the search goes down; the
        levels above are asked only around the anchor), PARALLEL_CHECKS at once -- a batch costs about
        what one check costs."""
        near = sorted((j for j in range(1, len(levels) + 1) if levels[j - 1][0] < 100 and levels[j - 1][0] not in checked
                       and j != k), key=lambda j: (j > k, abs(j - k)))
        batch = [levels[j - 1][0] for j in [k, *near[:PARALLEL_CHECKS - 1]]]
        checked.update(check(batch))
        session.books["quota_checks"] = session.books.get("quota_checks", 0) + len(batch)

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

    # the starting level of a whole-iteration comparison graph is what stage 1 measured last: complete
    # iterations of this plan under these quotas -- reused instead of measured again
    final = [r.seconds for r in result.final_runs] if len(result.final_runs) >= repeats else []
    # the search leaves time for the validation that follows it: three blocks of complete iterations
    # and the process restarts between them (a restart's cost: the slowest trial's overhead so far)
    per_block = max(2, settings.validation_rounds // 2 + 1)
    pair = ranked[0]
    seeded: dict[int, list[float]] = {}
    screened: list[dict[str, Any]] = []
    if len(ranked) > 1:
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
                reason = "the time budget is spent"
            return reason

        chosen, seeded, screened = _screen(plan, ranked[:MAX_SCREENED], session, repeats, final, levels, rho,
                                           level_of, usable, use_on, log, screening_over)
        if chosen is None:
            cut = next((r["skipped"] for r in screened if r.get("stopped")), None)
            why = f"the screening stopped ({cut})" if cut else "no process's first step down was faster"
            return {"skipped": f"{why}: quotas kept", "screened": screened,
                    "checked_levels": {p: {"sms": v.sm_count, "safe": v.ok} for p, v in sorted(checked.items())},
                    "unsafe_levels": unsafe, "trial_seconds": time.perf_counter() - started}
        pair = chosen
    q0 = plan.components[pair.target].mps_quota or 100
    k0 = level_of(q0)
    region = _region(plan, pair)
    log(f"stage 2: {pair.target} has {pair.slack_s:.3f} s of float beside critical calls of {pair.other} "
        f"({pair.overlap_s:.2f} s per iteration); tuning its quota from {q0}% on {'.'.join(region)}")
    measure_graph = _comparison(plan, region, session, repeats)
    samples: dict[int, list[float]] = {}

    def use(percent: int) -> None:
        use_on(pair.target, percent)

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
        use(percent)
        cost["overhead"] = max(cost["overhead"], time.perf_counter() - t)  # the restart at least
        values = measure_graph()
        samples[k] = values
        if region == plan.root.path:  # complete iterations: what the block cost beyond them
            cost["overhead"] = max(cost["overhead"], time.perf_counter() - t - sum(values))
        session.books["quota_trials"] += 1
        session.books["quota_s"] += time.perf_counter() - t
        log(f"  quota {percent}% ({levels[k - 1][1]} SMs): {statistics.median(values):.4f} s")
        return statistics.median(values)

    iteration_s = statistics.median(r.seconds for r in result.final_runs) if result.final_runs else 0.0
    # what a block of complete iterations costs beyond its iterations (a restart, the plan switch, a slow
    # first iteration): the most any probe so far cost beyond its own
    cost = {"overhead": max((max(r.get("overhead_s", 0.0), r.get("restart_s", 0.0)) for r in screened), default=0.0)}

    def block_s(iterations: int) -> float:
        return iterations * iteration_s + cost["overhead"]

    def out_of_time() -> bool:
        """A stop request, or no time for the next probe AND a whole validation after it (three blocks: once
        the target has moved to the probed level, no measured block can be the validation's first). H200, MJX
        (2026-12-05, 500-s budget): counting the validation alone, the search probed 93% (and self-checked
        five levels below it) after screening 94% at 1.032x, and then had no time left to validate 94%."""
        if stop is not None and stop():
            return True
        return deadline is not None and time.perf_counter() + block_s(repeats) + 3 * block_s(per_block) > deadline

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
    out: dict[str, Any] = {
        "target": pair.target, "other": pair.other, "gpu": pair.gpu, "slack_s": pair.slack_s, "overlap_s": pair.overlap_s,
        "score_s": pair.score_s, "demand": pair.demand, "screened": screened,
        "branches": {"target": list(pair.target_branches), "other": list(pair.other_branches)},
        "comparison_graph": ".".join(region), "levels": len(levels), "rho": rho, "start_percent": q0,
        "curve": curve, "unsafe_levels": unsafe,
        "checked_levels": {p: {"sms": v.sm_count, "safe": v.ok} for p, v in sorted(checked.items())},
        "trials": search.trials, "search_stopped": search.stopped, "best_percent": best_percent,
    }
    reason = stop() if stop is not None else None
    if reason:
        out["search_stopped"] = reason
    if reason and best_percent != q0:  # stopped: an unvalidated level is not kept
        use(q0)
        out["summary"] = (f"stopped before validating {pair.target} at {best_percent}% ({reason}): kept {q0}% "
                          f"({out['trials']} trials)")
        out["trial_seconds"] = time.perf_counter() - started
        return out
    if best_percent == q0:
        use(q0)
        probe = next((r for r in screened if r["target"] == pair.target and r.get("seconds") is not None), None)
        tried = f"screened at {probe['percent']}% ({probe['gain']:.3f}x), then " if probe else ""
        out["summary"] = (f"kept {pair.target} at {q0}%: no other level was faster locally ({out['trials']} trials)"
                          if out["trials"] or not search.stopped else
                          f"kept {pair.target} at {q0}%: {tried}no other level was tried ({search.stopped})")
        out["trial_seconds"] = time.perf_counter() - started
        return out
    # A/B/A on complete iterations. The target still runs at the level it was measured at last (the search
    # and the screening leave it there), so when that is the chosen level and the comparison graph was the
    # whole iteration, that block is the first A -- a restart and a block saved, the drift check intact
    best_s: list[float] = []
    ref_s: list[float] = []
    blocks: list[tuple[int, list[float]]] = [(best_percent, best_s), (q0, ref_s), (best_percent, best_s)]
    if region == plan.root.path and quotas[pair.target] == best_percent and samples.get(search.best):
        best_s += samples[search.best]
        blocks = blocks[1:]
        out["validation_reused_block"] = len(samples[search.best])
    need_s = len(blocks) * block_s(per_block)
    if deadline is not None and time.perf_counter() + need_s > deadline:
        use(q0)
        out["trial_seconds"] = time.perf_counter() - started
        out["summary"] = (f"{pair.target} at {best_percent}% was fastest ({out['trials']} trials) but not validated: "
                          f"the time budget is spent (the validation needs ~{need_s:.0f} s): kept {q0}%")
        return out
    log(f"stage 2: validating {pair.target} at {best_percent}% against {q0}% on complete iterations")
    for percent, bucket in blocks:
        # a stop request between the blocks (A/B/A, each a restart and a few iterations): end here rather
        # than after the whole validation -- on the H200 the three blocks took ~90 s, longer than the
        # SIGKILL grace of a device call (2026-12-02: killed in validation, no report)
        reason = stop() if stop is not None else None
        if reason:
            use(q0)
            out.update(search_stopped=reason, trial_seconds=time.perf_counter() - started,
                       summary=f"stopped while validating {pair.target} at {best_percent}% ({reason}): kept {q0}% "
                               f"({out['trials']} trials)")
            return out
        use(percent)
        bucket += [r.seconds for r in session.complete([plan], per_block, 0, [f"mps {pair.target} {percent}%"])[0]]
    ref, cand = summarize(ref_s), summarize(best_s)
    ok, eps = faster(ref, cand, settings.eps_min, settings.z)
    out["validation"] = {"reference": ref.to_json(), "candidate": cand.to_json(), "margin": eps, "accepted": ok}
    out["trial_seconds"] = time.perf_counter() - started
    if not ok:
        use(q0)
        out["summary"] = (f"{pair.target} at {best_percent}% was fastest locally but complete iterations were not faster "
                          f"by more than {eps:.1%} ({cand.median:.3f} vs {ref.median:.3f} s): kept {q0}%")
        return out
    quota_plan = replace(plan, components={**plan.components,
                                           pair.target: replace(plan.components[pair.target], mps_quota=best_percent)})
    out.update(quotas={pair.target: best_percent}, plan=quota_plan,
               summary=f"{pair.target} at {best_percent}% (was {q0}%): {ref.median / cand.median:.2f}x on complete "
                       f"iterations ({out['trials']} quota trials)")
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


def _screen(plan: Workflow, ranked: list[BranchPair], session: Any, repeats: int, final: list[float],
            levels: list[tuple[int, int]], rho: int, level_of: Callable[[int], int], usable: Callable[[int], bool],
            use_on: Callable[[str, int], None], log: Callable[[str], None],
            stop: Callable[[float], str | None] | None) -> tuple[BranchPair | None, dict[int, list[float]], list[dict[str, Any]]]:
    """Which of several processes with float gets the search: each is moved one coarse step down (the
    first level the search would try) and its comparison graph timed against that graph at the current
    quotas; the largest gain wins, and its two measurements seed the search. None when no step down was
    faster. Why measure: the floats say whose calls can wait, not whose SMs the critical calls lack -- on
    the H200 the interleaved MJX rollout ranks the second simulator first, a launch-bound process with
    few SMs to give, while the policy's acts at 94% gave 4% (one `rose compare`, 2026-12-03).

    A probe's process is put back only when another probe follows (`stop(restart_s)` says whether one fits):
    the last one probed stays one step down, so when it wins, its block is the validation's first."""
    references: dict[tuple[str, ...], list[float]] = {}
    rows: list[dict[str, Any]] = []
    probes: dict[str, tuple[BranchPair, int, int, list[float], list[float]]] = {}
    moved: tuple[str, int] | None = None  # the previous probe's process and the quota to put it back to
    overhead_s = 0.0  # the most a probe cost beyond its measured iterations
    for i, pair in enumerate(ranked):
        reason = stop(overhead_s) if stop is not None else None
        if reason:
            rows += [{"target": p.target, "other": p.other, "score_s": p.score_s, "demand": p.demand, "slack_s": p.slack_s,
                      "overlap_s": p.overlap_s, "skipped": reason, "stopped": True} for p in ranked[i:]]
            break
        if moved is not None:
            use_on(*moved)
            moved = None
        q0 = plan.components[pair.target].mps_quota or 100
        k0 = level_of(q0)
        k = max(1, k0 - rho)
        while k >= 1 and not usable(k):
            k -= 1
        row: dict[str, Any] = {"target": pair.target, "other": pair.other, "score_s": pair.score_s,
                               "demand": pair.demand, "slack_s": pair.slack_s, "overlap_s": pair.overlap_s, "start_percent": q0}
        rows.append(row)
        if k < 1:
            row["skipped"] = "no usable level below its quota"
            continue
        region = _region(plan, pair)
        graph = _comparison(plan, region, session, repeats)
        if region not in references:
            references[region] = final if region == plan.root.path and final else graph()
        ref = references[region]
        percent = levels[k - 1][0]
        t = time.perf_counter()
        use_on(pair.target, percent)
        row["restart_s"] = time.perf_counter() - t
        values = graph()
        # complete iterations: what the block cost beyond them; a local graph tells the restart only
        row["overhead_s"] = (time.perf_counter() - t - sum(values)) if region == plan.root.path else row["restart_s"]
        overhead_s = max(overhead_s, row["overhead_s"], row["restart_s"])
        session.books["quota_trials"] = session.books.get("quota_trials", 0) + 1
        session.books["quota_s"] = session.books.get("quota_s", 0.0) + time.perf_counter() - t
        moved = (pair.target, q0)
        gain = statistics.median(ref) / statistics.median(values)
        row.update(percent=percent, seconds=statistics.median(values), samples=values,
                   reference_s=statistics.median(ref), gain=gain)
        log(f"  screening {pair.target} at {percent}%: {statistics.median(values):.4f} s against "
            f"{statistics.median(ref):.4f} s at {q0}% ({gain:.3f}x)")
        probes[pair.target] = (pair, k0, k, ref, values)
    best = max(probes.values(), key=lambda p: statistics.median(p[3]) / statistics.median(p[4]), default=None)
    if best is not None and statistics.median(best[4]) >= statistics.median(best[3]):
        best = None
    for name in probes:  # only the winner may stay moved
        if best is None or name != best[0].target:
            use_on(name, plan.components[name].mps_quota or 100)
    if best is None:
        return None, {}, rows
    pair, k0, k, ref, values = best
    return pair, {k0: ref, k: values}, rows
