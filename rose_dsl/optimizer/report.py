"""The optimizer's report: `report.json` for programs, `report.md` for people, and a timeline picture
(SVG: one iteration before and after, a row per component process, a bar per call, shaded by its
activity) -- written from the search's records, never from anything it did not measure.

SVG by hand rather than matplotlib: the picture must be produced on the GPU machine too, where only
the project's own dependencies are installed, and a few rectangles need no plotting library.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..ir import ExecutionNode, Workflow
from ..measurement import Books
from .decide import Summary
from .headline import LEGEND, clip, fix_for, headline, headline_lines
from .profile import IterationRun
from .search import DEVIATIONS, Measured, RoundRecord, Stage1Result, Stage2Record
from .stats import percent

# report.json's layout: 2 -- the books and stage 2's section are typed records (`Books`, `Stage2Record`),
# serialized here; a reader checks it before it reads the document's fields
REPORT_VERSION = 2

__all__ = ["build_report", "write_report", "timeline_svg", "overhead"]

HOUR_S = 3600.0


def _s(x: Summary | None) -> dict[str, Any] | None:
    return None if x is None else {k: v for k, v in x.to_json().items()}


def _alt(m: Measured) -> dict[str, Any]:
    return {"requests": list(m.requests), "family": m.family, "groups": m.groups, "partners": list(m.partners),
            "delta_s": m.delta_s, "predicted_iteration_s": m.predicted_iteration_s,
            "predicted_local_s": m.predicted_local_s, "measured": _s(m.summary), "status": m.status,
            "reason": m.reason, "significant": m.significant, "benefit_s": m.benefit_s,
            "verdict": m.verdict.to_json() if m.verdict is not None else None,
            "trial_rank": m.trial_rank, "trial_s": m.trial_s,
            "fix": fix_for(m.reason) if m.status == "infeasible" else None}


def _round(r: RoundRecord) -> dict[str, Any]:
    ranking = []
    if r.ranking is not None:
        for x in r.ranking.all:
            ranking.append({"node": x.node, "component": x.stats.component, "D_v": x.stats.total_s, "T_v": x.stats.mean_s,
                            "a_v": x.stats.activity, "tier": x.tier, "S_v": x.score, "eligible": x.eligible,
                            "rank": x.rank, "reason": x.reason})
    targets = []
    for t in r.targets:
        targets.append({"node": t.node, "D_v": t.total_s, "T_v": t.mean_s, "a_v": t.activity, "tier": t.tier,
                        "S_v": t.score, "rank": t.rank, "comparison_graph": t.region, "window": t.window,
                        "note": t.local_note, "c0": _s(t.c0.summary) if t.c0 else None,
                        "alternatives": [_alt(m) for m in t.alternatives],
                        "best": list(t.best.requests) if t.best else None})
    return {"index": r.index, "reference": _s(r.reference),
            "threshold_s": r.ranking.threshold_s if r.ranking else None, "ranking": ranking, "targets": targets,
            "combined": {"requests": r.combined, "predicted_iteration_s": r.combined_predicted_s,
                         "measured": _s(r.candidate), "reference": _s(r.reference_validation), "margin": r.margin,
                         "verdict": r.verdict.to_json() if r.verdict is not None else None,
                         "combinations": list(r.combinations),
                         "accepted": r.accepted, "note": r.note}}


def overhead(total_s: float, retained_s: float, iterations: int, plan_iteration_s: float,
             baseline_iteration_s: float, once_per_machine_s: float = 0.0, startup_s: float = 0.0,
             trains_on: bool = False) -> dict[str, Any]:
    """Total optimizer time split into retained training and net overhead (paper §5.4), the share of a
    one-hour run, and a stricter count that values retained iterations at the plan's speed.
    `once_per_machine_s`: the part of the net overhead a second run on the same machine does not pay (the
    cached quota self-checks); `net_repeat` is the net overhead without it. `startup_s`: starting the
    processes, which a plain run of the workflow pays as well; `net_beyond_startup` is the net overhead
    without it (the optimizer's own cost). `net` keeps every second, start-up included -- unless
    `trains_on`: training goes on in the optimizer's processes (`rose optimize --train`), so their start-up
    is the training run's own, paid once as a plain run pays it, and not the optimizer's."""
    net = max(0.0, total_s - retained_s - (startup_s if trains_on else 0.0))
    strict = max(0.0, total_s - iterations * plan_iteration_s - (startup_s if trains_on else 0.0))
    saved = baseline_iteration_s - plan_iteration_s
    repeat = max(0.0, net - once_per_machine_s)
    beyond = net if trains_on else max(0.0, net - startup_s)
    return {"total": total_s, "retained_training": retained_s, "net": net, "net_strict": strict, "trains_on": trains_on,
            "startup": startup_s, "net_beyond_startup": beyond, "fraction_of_1h_net_beyond_startup": beyond / HOUR_S,
            "once_per_machine": once_per_machine_s, "net_repeat": repeat, "fraction_of_1h_net_repeat": repeat / HOUR_S,
            "retained_iterations": iterations,
            "fraction_of_1h_total": total_s / HOUR_S, "fraction_of_1h_net": net / HOUR_S,
            "fraction_of_1h_net_strict": strict / HOUR_S,
            "break_even_iterations": (strict / saved) if saved > 0 else None}


def with_quotas(baseline_s: float, speedup: float, stage2: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The whole plan's figure when stage 2 kept a quota or a client priority: stage 1's before/after
    (declared against the stage-1 graph, interleaved) times stage 2's validation (the stage-1 graph against
    it with the change, interleaved). Two comparisons chained, each side by side in its own blocks -- not
    one measurement of the declared graph against the final plan, which `rose compare` or the paper table
    gives. `label` says the change ("policy 94%", "sim at below-normal priority")."""
    if not stage2 or not speedup or speedup != speedup:
        return None
    # each stage-2 round that kept a change was validated against the plan before it: the gains chain
    kept = [r for r in stage2.get("rounds") or [stage2] if (r.get("quotas") or r.get("priorities"))
            and (r.get("validation") or {}).get("accepted")]
    if not kept:
        return None
    gain = math.prod(r["validation"]["reference"]["median"] / r["validation"]["candidate"]["median"] for r in kept)
    quotas, priorities = dict(stage2.get("quotas") or {}), dict(stage2.get("priorities") or {})
    changes = [f"{name} {pct}%" for name, pct in quotas.items()]
    changes += [f"{name} at below-normal priority" for name, p in priorities.items() if p]
    return {"speedup": speedup * gain, "iteration_s": baseline_s / (speedup * gain), "stage2_gain": gain,
            "quotas": quotas, "priorities": priorities,
            "label": "MPS settings (" + ", ".join(changes) + ")", "changes": changes,
            "note": "stage 1's before/after times stage 2's validation (two interleaved comparisons, chained)"}


def _moves_note(books: Books) -> str:
    if not books.quota_moves:
        return ""
    return (f"; {int(books.quota_moves)} move(s) of a process, {int(books.quota_moves_to_parked)} of them "
            f"back to a parked process (a state hand-over, no start-up)")


def _prefetch_note(books: Books) -> str:
    if not books.quota_check_prefetch_levels:
        return ""
    beside = books.quota_check_beside_training_s
    return (f"; the screening's first {int(books.quota_check_prefetch_levels)} level(s) were checked beside the "
            f"processes' start-up ({books.quota_check_prefetch_s:.1f} s wall"
            + (f", {beside:.1f} s of it beside the first, untimed training iteration, which is counted as training "
               f"(it took {books.first_iteration_s:.1f} s)" if beside > 0 else "")
            + "; only the wait before the first measurement is counted here)")


def build_report(result: Stage1Result, *, books: Books, total_s: float, workflow: str, file: str,
                 settings: Mapping[str, Any], machine: Mapping[str, Any], stage2: Stage2Record | None,
                 plan_file: str, run_dir: str | None, activity_kind: str,
                 bound: Mapping[str, Any] | None = None, trains_on: bool = False,
                 metric_notes: Mapping[str, str] | None = None, source_args: str | None = None) -> dict[str, Any]:
    """report.json's document. `bound`: `bound.reorder_bound` of the declared graph's profile. `trains_on`:
    training goes on in these processes after the report (`rose optimize --train`; see `overhead`).
    `metric_notes`: how each metric merged over several processes was merged (`Executor.metric_notes`).
    `source_args`: the source as a command line names it, `--set`s included (default: `file`)."""
    base, plan = result.baseline.median, result.final.median
    spent = staleness(result.plan)
    section = stage2.to_json() if stage2 is not None else None
    rel = [(p - m) / m if m else None for _, p, m in result.model_errors]
    errors = [{"what": w, "predicted_s": p, "measured_s": m, "error": e}
              for (w, p, m), e in zip(result.model_errors, rel, strict=True)]
    abs_err = [abs(e) for e in rel if e is not None]
    trials: dict[str, dict[str, Any]] = {
              "complete": {"count": int(books.complete_iterations), "seconds": books.complete_s,
                           "note": "real training iterations (retained)"},
              "local": {"count": int(books.local_runs), "seconds": books.local_s,
                        "abandoned": int(books.local_abandoned),
                        "note": "comparison graphs on state snapshots (not training); abandoned: repeats "
                                "not run because the first run was clearly slower"},
              "captures": {"count": int(books.captures), "seconds": books.capture_s},
              "quota": {"count": int(books.quota_trials), "seconds": books.quota_s,
                        "note": "stage 2's time no other row books: moving the target to a new process under "
                                "each trial setting and back (probes, search, validation blocks) and what a block "
                                "costs beyond its iterations (those are training: the first row)" + _moves_note(books)},
              "quota_checks": {"count": int(books.quota_checks), "seconds": books.quota_check_s,
                               "note": "the GPU math self-check of each quota level asked (fresh MPS clients, "
                                       "several at once); cached per machine, so paid once per machine"
                                       + _prefetch_note(books)},
              "layout": {"count": int(books.layout_switches), "seconds": books.layout_s,
                         "note": "layout switches (`--layout`): stopping and starting the processes a layout changes"},
              "startup": {"count": 1, "seconds": books.startup_s,
                          "note": "starting the component processes (the workflow's, which a plain run starts too, "
                                  "and the optimizer's small trial components beside them)"},
              "setup": {"count": 1, "seconds": books.setup_s,
                        "note": "what runs before and around the processes' start-up: the MPS daemon, the SM-activity "
                                "sampler, the session's own set-up"},
              "checkpoint": {"count": 1 if books.checkpoint_s is not None else 0, "seconds": books.checkpoint_s or 0.0,
                             "note": "the checkpoint of the training done, from which `rose execute --plan ... "
                                     "--resume` goes on (a plain run writes one at its end as well)"},
              "plan_switches": {"count": int(books.plan_loads), "seconds": books.prepare_s,
                                "note": "loading plans onto the workers and compiling their graphs (a graph stays "
                                        "compiled while it is one of the last few used), starting a plan's copies"},
              "snapshots": {"count": int(books.guard_snapshots), "seconds": books.guard_snapshot_s,
                            "note": "the state a plan's first iteration writes, copied inside its component's process "
                                    "before it runs (a failing trial puts it back; local trials' snapshots are in "
                                    "their row)"}}
    if books.settle_s is not None:  # (`--train` only)
        trials["settle"] = {"count": int(books.settled), "seconds": books.settle_s,
                            "note": "moving processes to the plan's MPS settings before training goes on in them "
                                    "(`--train`): to the process parked under those settings where there is one "
                                    "(these moves are among the quota row's)"}
    counted = sum(v["seconds"] for v in trials.values())
    trials["other"] = {"count": 0, "seconds": max(0.0, total_s - counted),
                       "note": "what no row above counts: profiling and bookkeeping between trials, the driver's "
                               "own work, processes stopping"}
    return {
        "report_version": REPORT_VERSION,
        "workflow": workflow, "file": file, "source_args": source_args or file, "plan_file": plan_file, "activity": activity_kind,
        "baseline_iteration_s": base, "plan_iteration_s": plan,
        "speedup": base / plan if plan > 0 else math.nan,
        "with_quotas": with_quotas(base, base / plan if plan > 0 else math.nan, section),
        "baseline": _s(result.baseline), "plan": _s(result.final), "plan_requests": list(result.requests),
        "staleness": spent, "budgets_unused": unused_budgets(result.plan, spent),
        "rounds": [_round(r) for r in result.rounds], "stopped": result.stopped, "cut_short": result.cut_short,
        "trials": trials,
        "overhead_s": overhead(total_s, books.complete_s, int(books.complete_iterations),
                               plan, base, once_per_machine_s=books.quota_check_s,
                               startup_s=books.startup_s, trains_on=trains_on),
        "model": {"errors": errors, "mean_abs_error": sum(abs_err) / len(abs_err) if abs_err else None},
        "stage2": section,
        "reorder_bound": dict(bound) if bound is not None else None,
        "settings": dict(settings), "machine": dict(machine), "deviations": list(DEVIATIONS),
        "run_dir": run_dir,
        "before_after": {"verdict": result.verdict.to_json() if result.verdict is not None else None,
                         "validated": result.validated, "rule": result.rule},
        "metrics_merged": dict(metric_notes or {}),
    }


def staleness(plan: Workflow) -> dict[str, Any]:
    """Which staleness the plan uses: per state object read older than in the declared workflow, the
    largest lag its reads prove (RL iterations) and its budget; {} for a synchronous plan."""
    from ..analysis import iterations_in_flight, read_lags

    if iterations_in_flight(plan) == 1:
        return {}
    budgets = {s.key: s.max_staleness for s in plan.state_objects().values()}
    out: dict[str, Any] = {}
    for (state, _), lag in read_lags(plan).items():
        if lag:
            out[state] = {"lag": max(lag, out.get(state, {}).get("lag", 0)), "max_staleness": budgets.get(state, 0)}
    return out


def unused_budgets(plan: Workflow, used: Mapping[str, Any] | None = None) -> dict[str, str]:
    """Per state object whose `max_staleness` > 0 the plan does not spend, why: whether the search had
    asynchronous candidates for it (nodes directly in the RL iteration body that write or read it, which
    `defer` and `ahead` move) that it did not choose, or none at all (only such nodes are moved: a writer
    inside a loop -- an update step -- cannot be deferred). A user who declared a budget and got a
    synchronous plan is told which of the two it was. `used`: `staleness(plan)`, if already computed."""
    used = staleness(plan) if used is None else used
    out: dict[str, str] = {}
    for key, obj in sorted(plan.state_objects().items()):
        if obj.max_staleness <= 0 or key in used:
            continue
        top = [(i.name, e.access) for i in plan.root.body if isinstance(i, ExecutionNode)
               for e in i.effects if e.state == key]
        writers = [n for n, a in top if a.writes]
        readers = [n for n, a in top if not a.writes]
        allows = f"allows max_staleness {obj.max_staleness} but no read of it is older"
        if writers or readers:
            nodes = ", ".join(f"`{n}`" for n in dict.fromkeys(writers + readers))
            out[key] = (f"{allows}: the search had asynchronous candidates (`defer`/`ahead` of {nodes}) and chose "
                        "a synchronous plan (the alternatives say how each measured, or why it was refused)")
        else:
            out[key] = (f"{allows}: no asynchronous candidate, since no node directly in the RL iteration body "
                        "writes or reads it, and `defer`/`ahead` move only those (a writer or reader inside a loop "
                        "stays in its iteration)")
    return out


def staleness_line(section: Mapping[str, Any] | None, unused: Mapping[str, str] | None = None) -> str:
    """The report's staleness line: what the plan spends of each budget, and why a budget went unspent."""
    idle = "".join(f" `{state}` {why}." for state, why in sorted((unused or {}).items()))
    if not section:
        return "Staleness: none (a synchronous plan: every read sees what the declared workflow's read sees)." + idle
    parts = [f"`{state}` read up to {v['lag']} RL iteration{'s' * (v['lag'] != 1)} old (max_staleness "
             f"{v['max_staleness']})" for state, v in sorted(section.items())]
    return "Staleness: an asynchronous plan: " + "; ".join(parts) + "." + idle


# -- markdown ------------------------------------------------------------------------------------

def _f(x: float | None, unit: str = "s", digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f} {unit}".strip()


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def _med(m: Mapping[str, Any] | None) -> str:
    if not m:
        return "-"
    return f"{m['median']:.4f} s (n={m['n']}, spread {m['spread']:.0%})"


def _why(a: Mapping[str, Any]) -> str:
    """An alternative's reason on one line, cut at a word; a refusal with its fix."""
    why = clip(a["reason"], 160) if a["reason"] else ""
    if a.get("fix"):
        why += f" -- fix: {a['fix']}"
    return why.replace("|", "/")


def _combined_markdown(c: Mapping[str, Any]) -> list[str]:
    """A round's Combine step: the combinations of its winners (best predicted first) and the verdict on the
    one validated."""
    lines = [""]
    combos = c.get("combinations") or []
    if len(combos) > 1:
        lines += ["Combinations of the round's winners (best predicted first; the first is validated):", "",
                  "| combination | predicted |", "| --- | --- |"]
        lines += [f"| `{'; '.join(x['requests'])}` | {_f(x['predicted_s'], 's', 4)} |" for x in combos[:8]]
        lines.append("")
    if not c["requests"]:
        return [*lines, f"Combined: nothing to combine -- {clip(c['note'], 300)}.", ""]
    v = c.get("verdict")
    decided = (f"{v['outcome']} at {v['speedup']:.2f}x, confidence {percent(v['confidence'])}, n={v['n']}" if v
               else f"margin {_pct(c['margin'])}")
    lines += [f"Combined: `{'; '.join(c['requests']) or '-'}` predicted {_f(c['predicted_iteration_s'])}, measured "
              f"{_med(c['measured'])} vs reference {_med(c['reference'])} ({decided}): "
              f"**{'accepted' if c['accepted'] else 'rejected'}** ({clip(c['note'], 300)})", ""]
    return lines


def metrics_markdown(notes: Mapping[str, str]) -> list[str]:
    """Metrics that a plan's processes reported several times: per copy (not mergeable) and by which rule."""
    if not notes:
        return []
    lines = ["## Metrics under the plans", "", "A component ran on several processes under a plan; its metrics were "
             "merged by these rules (`metric_merge` in docs/components.md):", ""]
    lines += [f"- `{k}`: {v}" for k, v in sorted(notes.items())]
    return [*lines, ""]


def report_markdown(doc: Mapping[str, Any], picture: str | None) -> str:
    head = doc.get("headline") or headline(doc)
    lines = [f"# rose optimize: {doc['workflow']}", "",
             f"Source `{doc['file']}`, plan `{doc['plan_file']}`.", "", *headline_lines(head),
             "| | iteration (median) | |", "| --- | --- | --- |"]
    if head.get("layout_gain"):
        lines.append(f"| declared, as written | {head['declared_s']:.4f} s (spread {_pct(head['declared_spread'])}) | |")
    lines += [f"| declared{' at the layout' if head.get('layout_gain') else ''} | {_med(doc['baseline'])} | |",
              f"| plan | {_med(doc['plan'])} | **{doc['speedup']:.2f}x**"
              + (f" ({head['speedup']:.2f}x over the workflow as written)" if head.get("layout_gain") else "")
              + ("" if head["validated"] else ", not validated") + " |"]
    wq = doc.get("with_quotas")
    if wq:
        lines += [f"| plan with {', '.join(wq['changes'])} | {wq['iteration_s']:.4f} s (chained: {wq['stage2_gain']:.3f}x on the plan) "
                  f"| **{wq['speedup']:.2f}x** |", "",
                  f"The last row is {wq['note']}.", ""]
    else:
        lines += [""]
    lines += ["Plan: " + ("`" + "`, `".join(doc["plan_requests"]) + "`" if doc["plan_requests"] else "the declared graph "
                          "(no rewrite was decided faster by the rule)"), ""]
    lines += [staleness_line(doc.get("staleness"), doc.get("budgets_unused")), ""]
    if doc.get("stage2"):
        lines += stage2_markdown(doc["stage2"])
    lines += [f"Stopped: {doc['stopped']}.", ""]
    b = doc.get("reorder_bound")
    if b and b.get("speedup_bound"):
        lines += [f"Reorder bound: the declared iteration's longest dependency chain at the measured durations is "
                  f"{b['seconds']:.3f} s of {b['iteration_s']:.3f} s, so rewiring, fusing and interleaving these "
                  f"calls can give about {b['speedup_bound']:.2f}x at most; splits (smaller calls) and temporal "
                  f"splits (calls on component copies) are not bounded by it (chain: {' -> '.join(b['chain'][:6])}"
                  f"{' -> ...' if len(b['chain']) > 6 else ''}; `bound.py` says why it is an estimate).", ""]
    if picture:
        lines += [f"![one iteration before and after]({picture})", ""]
    if doc["rounds"]:
        lines += [f"Legend: {LEGEND}", ""]
    for r in doc["rounds"]:
        lines += [f"## Round {r['index']}", "", f"Reference: {_med(r['reference'])}; eligibility threshold "
                  f"{_f(r['threshold_s'])}.", "",
                  "| node | D_v | T(v) | a_v | tier | S(v) | target |", "| --- | --- | --- | --- | --- | --- | --- |"]
        for x in r["ranking"][:12]:
            lines.append(f"| {x['node'].removeprefix('iteration.')} | {_f(x['D_v'])} | {_f(x['T_v'], 's', 4)} | "
                         f"{_pct(x['a_v'])} | {x['tier'] or 'excluded'} | {_f(x['S_v'])} | "
                         f"{'#' + str(x['rank'] + 1) if x['rank'] is not None else x['reason']} |")
        for t in r["targets"]:
            lines += ["", f"### {t['node'].removeprefix('iteration.')}" + (f" (rank {t['rank'] + 1})" if t["rank"] is not None else ""),
                      "", f"Comparison graph: `{t['comparison_graph'] or 'the whole iteration'}`"
                      + (f" ({t['window']} iteration(s) of it)" if t["window"] else "")
                      + (f"; c0 {_med(t['c0'])}" if t["c0"] else "") + (f". {t['note']}" if t["note"] else ""), "",
                      "| alternative | status | measured | predicted | race (trial) | benefit/iteration | why |",
                      "| --- | --- | --- | --- | --- | --- | --- |"]
            for a in t["alternatives"]:
                pred = a["predicted_local_s"] if a["status"] == "measured" else a["predicted_iteration_s"]
                race = (f"#{a['trial_rank']} ({_f(a.get('trial_s'), 's', 3)})" if a.get("trial_rank") is not None
                        else "-")
                lines.append(f"| `{'; '.join(a['requests'])}` | {a['status']}{' ✓' if a['significant'] else ''} | "
                             f"{_med(a['measured'])} | {_f(pred, 's', 4)} | {race} | {_f(a['benefit_s'], 's', 4)} | "
                             f"{_why(a)} |")
        lines += _combined_markdown(r["combined"])
    lines += layout_markdown(doc.get("layout"))
    tr, ov = doc["trials"], doc["overhead_s"]
    lines += ["## Trials and overhead", "", "| kind | count | seconds | |", "| --- | --- | --- | --- |"]
    for k, v in tr.items():
        lines.append(f"| {k} | {v['count']} | {v['seconds']:.2f} | {v.get('note', '')} |")
    be = ov["break_even_iterations"]
    lines += ["", f"Total optimizer time {ov['total']:.1f} s, of which {ov['retained_training']:.1f} s were "
              f"{ov['retained_iterations']} training iterations kept: net overhead {ov['net']:.1f} s = "
              f"{ov['fraction_of_1h_net']:.2%} of a one-hour run ({ov['fraction_of_1h_total']:.2%} counting everything; "
              f"{ov['fraction_of_1h_net_strict']:.2%} valuing the kept iterations at the plan's speed"
              + (f", recovered after {be:.0f} iterations of the plan" if be is not None else "") + ")."
              + (f" Training goes on in these processes (`--train`): their start-up ({ov['startup']:.1f} s) is the "
                 "training run's own, as a plain run pays it, and is not counted here; no hand-over checkpoint is written."
                 if ov.get("trains_on") else
                 f" {ov['startup']:.1f} s of it were the processes' start-up, which a plain run pays as well: "
                 f"{ov['net_beyond_startup']:.1f} s = {ov['fraction_of_1h_net_beyond_startup']:.2%} without it."
                 if ov.get("startup") else "")
              + (f" {ov['once_per_machine']:.1f} s of it were quota self-checks, cached per machine: a second run "
                 f"here pays {ov['net_repeat']:.1f} s = {ov['fraction_of_1h_net_repeat']:.2%}."
                 if ov.get("once_per_machine") else ""), ""]
    m = doc["model"]
    if m["errors"]:
        lines += ["## Prediction vs measurement", "", f"Mean absolute error {_pct(m['mean_abs_error'])}.", "",
                  "| what | predicted | measured | error |", "| --- | --- | --- | --- |"]
        lines += [f"| {e['what']} | {e['predicted_s']:.4f} s | {e['measured_s']:.4f} s | {_pct(e['error'])} |"
                  for e in m["errors"]]
        lines.append("")
    lines += quota_curve_markdown(doc.get("stage2") or {})
    lines += metrics_markdown(doc.get("metrics_merged") or {})
    lines += ["## Deviations from the paper", ""] + [f"- {d}" for d in doc["deviations"]] + [""]
    if doc.get("run_dir"):
        lines += ["## Continue training", "", f"The iterations trained while optimizing are checkpointed in "
                  f"`{doc['run_dir']}`: `rose execute {doc.get('source_args') or doc['file']} --plan {doc['plan_file']} --out {doc['run_dir']} --resume`", ""]
    return "\n".join(lines)


def layout_markdown(section: Mapping[str, Any] | None) -> list[str]:
    """The layout trials (`rose optimize --layout`) as a table: each value, its A/B/A measurement against
    the declared layout, and the decision."""
    if not section:
        return []
    lines = ["## Layout (before stage 1)", "", section["summary"] + (" -- the declared graph and plan above are at "
             "this layout." if section.get("chosen") else "."), "",
             "| layout | changes | candidate | declared layout | | decision |", "| --- | --- | --- | --- | --- | --- |"]
    for row in section["candidates"]:
        label = ", ".join(f"{k}={v}" for k, v in row["values"].items())
        changed = ", ".join(row.get("changed") or []) or "-"
        if row.get("refused"):
            lines.append(f"| {label} | {changed} | - | - | | not tried: {row['refused']} |")
        elif "candidate" not in row:
            lines.append(f"| {label} | {changed} | - | - | | {row.get('failed') or row.get('not_measured')} |")
        else:
            lines.append(f"| {label} | {changed} | {_med(row['candidate'])} | {_med(row['reference'])} | "
                         f"{row['speedup']:.2f}x | {'kept' if row['accepted'] else 'not kept'} "
                         f"({_decided(row)}) |")
    return [*lines, ""]


def _decided(row: Mapping[str, Any]) -> str:
    """How a measured choice was decided: the decision rule's verdict (an older report: its noise margin)."""
    v = row.get("verdict")
    if v:
        return f"{v['outcome']}, confidence {percent(v['confidence'])}, {v.get('test', 'wilcoxon-signed-rank')}"
    return f"margin {_pct(row['margin'])}" if row.get("margin") is not None else "-"


def stage2_markdown(s2: Mapping[str, Any]) -> list[str]:
    """Stage 2's verdict, then each round's screening (one round unless a change was kept and time was left)."""
    lines = ["Stage 2 (MPS quotas and client priorities): " + s2.get("summary", s2.get("skipped", "")), ""]
    rounds = s2.get("rounds") or [s2]
    for i, r in enumerate(rounds):
        if len(rounds) > 1:
            lines += [f"Round {i + 1}: " + (r.get("summary") or f"skipped ({r.get('skipped')})"), ""]
        lines += screening_markdown(r)
    return lines


def screening_markdown(stage2: Mapping[str, Any]) -> list[str]:
    """Stage 2's screening: each process with float beside the critical path, one coarse quota step down or
    at a below-normal client priority."""
    rows = stage2.get("screened") or []
    if not rows:
        return []
    lines = ["| process | beside | score/iteration | SM demand | float | change | time | before it | gain |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        demand = "-" if r.get("demand") is None else f"{r['demand']:.2f}"
        if r.get("seconds") is None:
            lines.append(f"| {r['target']} | {r['other']} | {_f(r['score_s'])} | {demand} | {_f(r['slack_s'])} | "
                         f"{r.get('skipped', 'not run')} | - | - | - |")
            continue
        change = "below-normal priority" if r.get("kind") == "priority" else f"{r['percent']}%"
        lines.append(f"| {r['target']} | {r['other']} | {_f(r['score_s'])} | {demand} | {_f(r['slack_s'])} | {change} | "
                     f"{_f(r['seconds'], 's', 4)} | {_f(r['reference_s'], 's', 4)} ({r['start_percent']}%) | "
                     f"{r['gain']:.3f}x |")
    return [*lines, ""]


def quota_curve_markdown(stage2: Mapping[str, Any]) -> list[str]:
    """The stage-2 quota curve as a table (a level skipped because its GEMMs are wrong has no time)."""
    if not stage2.get("curve"):
        return []
    lines = ["## Quota curve (stage 2)", "", "| quota % | SMs | local time |", "| --- | --- | --- |"]
    lines += [f"| {p['percent']} | {p.get('sms', '-')} | "
              + (f"{p['seconds']:.4f} s |" if p.get("seconds") is not None else
                 "not run: the GPU math self-check fails under it on this machine |" if p.get("unsafe") else "- |")
              for p in stage2["curve"]]
    return lines + ["", "![quota curve](quota_curve.svg)", ""]


# -- pictures ----------------------------------------------------------------------------------------

_COLORS = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac")


def time_ticks(span_s: float, most: int = 8) -> list[float]:
    """Tick positions in seconds from 0 to `span_s`: a step of 1, 2 or 5 times a power of ten, the smallest
    that gives at most `most` intervals (a reader compares bars against round numbers)."""
    if not span_s > 0:
        return [0.0]
    step = 10.0 ** math.floor(math.log10(span_s / most))
    step = next(m * step for m in (1, 2, 5, 10) if span_s / (m * step) <= most)
    return [round(i * step, 12) for i in range(int(span_s / step + 1e-9) + 1)]


def tick_label(t: float, step: float) -> str:
    digits = max(0, -math.floor(math.log10(step))) if step > 0 else 0
    return f"{t:.{digits}f}"


def _time_axis(x0: float, width: float, y: int, span_ns: float) -> list[str]:
    """An axis under a panel's rows: a line, a tick and its label in seconds at round numbers."""
    ticks = time_ticks(span_ns / 1e9)
    step = ticks[1] - ticks[0] if len(ticks) > 1 else 1.0
    parts = [f'<line x1="{x0}" y1="{y}" x2="{x0 + width}" y2="{y}" stroke="#555"/>']
    for t in ticks:
        x = x0 + t * 1e9 / span_ns * width
        parts.append(f'<line x1="{x:.1f}" y1="{y}" x2="{x:.1f}" y2="{y + 4}" stroke="#555"/>'
                     f'<text x="{x:.1f}" y="{y + 14}" font-size="9" text-anchor="middle">{tick_label(t, step)}</text>')
    parts.append(f'<text x="{x0 - 6}" y="{y + 14}" font-size="9" text-anchor="end">time (s)</text>')
    return parts


def timeline_svg(panels: Sequence[tuple[str, IterationRun]], activity: str = "cpu", width: int = 900) -> str:
    """One iteration per panel, on a common time scale: a row per component process, a bar per call
    (colour: its node), bar opacity = the call's activity (SM activity or CPU busy fraction)."""
    nodes = sorted({c.source for _, run in panels for c in run.calls})
    color = {n: _COLORS[i % len(_COLORS)] for i, n in enumerate(nodes)}
    span = max((max(c.end_ns for c in run.calls) - min(c.start_ns for c in run.calls)) for _, run in panels if run.calls) \
        if any(run.calls for _, run in panels) else 1
    left, row_h, gap = 110, 18, 28
    y = 10
    parts = []
    for title, run in panels:
        comps = sorted({c.component for c in run.calls})
        parts.append(f'<text x="4" y="{y + 12}" font-size="13" font-weight="bold">{html.escape(title)} '
                     f'({run.seconds:.3f} s)</text>')
        y += 20
        t0 = min((c.start_ns for c in run.calls), default=0)
        for comp in comps:
            parts.append(f'<text x="4" y="{y + 13}" font-size="11">{html.escape(comp)}</text>')
            parts.append(f'<rect x="{left}" y="{y}" width="{width - left - 10}" height="{row_h - 2}" fill="#f3f3f3"/>')
            for c in run.calls:
                if c.component != comp:
                    continue
                x = left + (c.start_ns - t0) / span * (width - left - 10)
                w = max(0.5, (c.end_ns - c.start_ns) / span * (width - left - 10))
                op = 0.35 + 0.65 * (c.activity if c.activity is not None else 1.0)
                parts.append(f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{row_h - 2}" fill="{color[c.source]}" '
                             f'fill-opacity="{op:.2f}"><title>{html.escape(c.node)} {c.seconds * 1e3:.2f} ms'
                             f'{"" if c.activity is None else f" activity {c.activity:.0%}"}</title></rect>')
            y += row_h
        if run.activity_samples:  # device-wide SM activity under the calls
            parts.append(f'<text x="4" y="{y + 13}" font-size="11">SM activity</text>')
            parts.append(f'<rect x="{left}" y="{y}" width="{width - left - 10}" height="{row_h - 2}" fill="#f3f3f3"/>')
            for s0, s1, value in run.activity_samples:
                x = left + max(0, s0 - t0) / span * (width - left - 10)
                w = max(0.5, (min(s1, t0 + span) - max(s0, t0)) / span * (width - left - 10))
                h = (row_h - 2) * max(0.0, min(1.0, value))
                parts.append(f'<rect x="{x:.1f}" y="{y + row_h - 2 - h:.1f}" width="{w:.1f}" height="{h:.1f}" fill="#59a14f">'
                             f'<title>{value:.0%}</title></rect>')
            y += row_h
        parts += _time_axis(left, width - left - 10, y + 2, span)
        y += 18 + gap
    legend_y = y
    for i, n in enumerate(nodes):
        x = 4 + (i % 4) * 220
        yy = legend_y + (i // 4) * 16
        parts.append(f'<rect x="{x}" y="{yy}" width="10" height="10" fill="{color[n]}"/>'
                     f'<text x="{x + 14}" y="{yy + 9}" font-size="10">{html.escape(n.removeprefix("iteration."))}</text>')
    height = legend_y + (len(nodes) + 3) // 4 * 16 + 24
    note = "bar opacity: " + ("SM activity" if activity == "sm" else "CPU busy fraction of the component")
    parts.append(f'<text x="4" y="{height - 6}" font-size="10" fill="#555">{note}; same time scale in every panel</text>')
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif">'
            + "".join(parts) + "</svg>\n")


def curve_svg(points: Sequence[tuple[int, float]], width: int = 480, height: int = 260,
              holes: Sequence[int] = ()) -> str:
    """Local completion time against the quota (paper Figure 15); `holes`, the levels not run because the
    quota self-check found wrong products under them, as grey crosses on the axis."""
    if not points:
        return ""
    xs = [p for p, _ in points] + list(holes)
    ys = [s for _, s in points]
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(ys) * 0.95, max(ys) * 1.05

    def sx(x: float) -> float:
        return 50 + (x - x0) / ((x1 - x0) or 1) * (width - 70)

    def sy(v: float) -> float:  # the plot's top at y = 40: the title and the legend above it
        return height - 30 - (v - y0) / ((y1 - y0) or 1) * (height - 70)

    pts = sorted(points)
    path = " ".join(f"{'M' if i == 0 else 'L'}{sx(x):.1f},{sy(v):.1f}" for i, (x, v) in enumerate(pts))
    dots = "".join(f'<circle cx="{sx(x):.1f}" cy="{sy(v):.1f}" r="3" fill="#e15759"><title>{x}%: {v:.4f} s</title></circle>'
                   for x, v in pts)
    labels = "".join(f'<text x="{sx(x):.1f}" y="{height - 12}" font-size="9" text-anchor="middle">{x}</text>' for x, _ in pts)
    base = height - 30
    labels += "".join(f'<text x="{sx(x):.1f}" y="{base + 3:.1f}" font-size="10" fill="#999" text-anchor="middle">'
                      f'x<title>{x}%: not run (wrong products under it here)</title></text>' for x in holes)
    if holes:
        named = ", ".join(map(str, sorted(holes))) if len(holes) <= 4 else f"{len(holes)} levels, {min(holes)}-{max(holes)}"
        labels += (f'<text x="4" y="27" font-size="9" fill="#999">x: not run, the quota self-check found wrong '
                   f'products under it ({named}%)</text>')
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif">'
            f'<text x="4" y="14" font-size="12">local completion time vs SM quota of the target process</text>'
            f'<text x="4" y="{sy(y1) + 10:.0f}" font-size="9">{y1:.3f} s</text><text x="4" y="{sy(y0):.0f}" font-size="9">{y0:.3f} s</text>'
            f'<path d="{path}" fill="none" stroke="#4e79a7" stroke-width="2"/>{dots}{labels}'
            f'<text x="{width - 60}" y="{height - 2}" font-size="9">quota %</text></svg>\n')


def write_report(doc: Mapping[str, Any], out_dir: Path, panels: Sequence[tuple[str, IterationRun]] = ()) -> list[Path]:
    """report.json, report.md and timeline.svg (and quota_curve.svg) into `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    picture = None
    if panels and any(run.calls for _, run in panels):
        (out_dir / "timeline.svg").write_text(timeline_svg(panels, doc.get("activity", "cpu")))
        picture = "timeline.svg"
        written.append(out_dir / "timeline.svg")
    s2 = doc.get("stage2") or {}
    if s2.get("curve"):
        (out_dir / "quota_curve.svg").write_text(curve_svg([(p["percent"], p["seconds"]) for p in s2["curve"]
                                                              if p.get("seconds") is not None],
                                                             holes=[p["percent"] for p in s2["curve"] if p.get("unsafe")]))
        written.append(out_dir / "quota_curve.svg")
    doc = {**doc, "headline": headline(doc)}
    (out_dir / "report.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
    (out_dir / "report.md").write_text(report_markdown(doc, picture))
    return [out_dir / "report.json", out_dir / "report.md", *written]
