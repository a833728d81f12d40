"""`rose compare FILE --plan A.yaml --plan B.yaml`: is a plan faster? Measured on ONE set of workers.

A user who rewrote a workflow by hand (or got a plan from `rose optimize`) wants to know whether it
trains faster, and by how much, on this machine. Separate `rose execute` runs answer that badly on a
shared, noisy machine: each pays its own start-up (processes, models, compiled programs, CUDA graphs:
a minute for a 360M-parameter VLA) and sees the machine at another moment. `rose compare` starts the
components once and trains the declared workflow and every plan on the same workers, one iteration of
each per round, interleaved A B C / C B A (`interpreter.optimize.trials.TrialSession.complete`, the optimizer's
own measurement). Every plan computes what the declared workflow computes, so all the iterations are
one training run: none is wasted, and the run directory (`--out`) holds its checkpoint. The first
iteration of a plan after a switch is training, not a measurement (a switch recompiles the iteration;
a new process captures its CUDA graphs). An asynchronous plan (`defer:`) gains only with iterations in
flight together: each of its turns is a window of pipelined iterations (`rose_dsl.measurement.window`,
`TrialSession._window`), its seconds per iteration the measured ones' seconds over their number, and its
row says which staleness it uses. A plan with other MPS quotas moves its GPU components to
processes under those quotas on each switch, state moved with them. A plan written with a layout
(`plan: layout:`, e.g. `rose optimize --layout`'s, or simulator processes: other `replicas` and
per-process `args`) gets fresh processes for the components its layout changes on each switch to it and
back -- admitted only under the rules of `rose_dsl/optimizer/layouts.py` (only replicas and args change;
the changed components' state is refreshed by every iteration before use), and on Ray.

Written: a table (median seconds per iteration, spread, ratio to the declared workflow, every `*_per_s`
throughput metric, mean SM activity on a GPU), `--json` with every measured iteration, and `--runs DIR`:
per plan and round a run directory (`metrics.jsonl`, Chrome `trace.json` with the SM-activity counter)
in the layout `rose execute --out` writes, so the tools that read run directories
(`benchmarks/lib/paper_profile.py`, Perfetto) read these too.

Exit codes as `rose execute` (`rose_cli.run.FAILURES`); a plan that fails loses its rows and makes the
exit code 3 after everything else was measured and written.
"""

from __future__ import annotations

import itertools
import json
import statistics
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from rose_dsl.cli import (
    AllowEnvOpt,
    AllowModuleOpt,
    AllowPathOpt,
    ExitCode,
    FileArg,
    SetOpt,
    err,
    load_or_exit,
    out,
    report_problems,
)
from rose_dsl.identity import NodePath
from rose_dsl.ir import LoopNode, Workflow
from rose_dsl.trust import TrustPolicy, check_trust

from .execute import BackendName, FollowLinksOpt, positive_seconds, refuse_linked_dir
from .machine import machine_info

if TYPE_CHECKING:
    from rose_dsl.optimizer.profile import IterationRun

    from .run import RunContext

__all__ = ["register", "compare", "Entry", "same_computation", "write_run_dir", "plan_rows"]

LOW_ACTIVITY = 0.5


def register(app: typer.Typer) -> None:
    app.command(name="compare")(compare)


@dataclass(frozen=True)
class Entry:
    """One row of the comparison: the declared workflow or a plan of it."""

    label: str
    file: Path
    workflow: Workflow
    layout: tuple[str, ...] = ()  # the components the plan's layout runs differently (`plan: layout:`)


def _parse_plan(value: str) -> tuple[str, Path]:
    """`LABEL=PATH` or `PATH` (labelled by its file name)."""
    label, sep, path = value.partition("=")
    if not sep:
        return Path(value).stem, Path(value)
    if not label or not path:
        raise typer.BadParameter(f"--plan takes PATH or LABEL=PATH, not {value!r}")
    return label, Path(path)


def same_computation(wf: Workflow, plan: Workflow) -> list[str]:
    """How `plan` differs from `wf` in what it computes (empty: the same): every component of the
    workflow must be there with the same code, arguments, device and replicas. A plan may add copies of
    components (a temporal split) and choose other MPS quotas (which change speed, not values)."""
    diffs = []
    for name, comp in wf.components.items():
        other = plan.components.get(name)
        if other is None:
            diffs.append(f"component {name!r} is missing")
            continue
        for what in ("impl", "args", "device", "replicas", "gpu"):
            a, b = getattr(comp, what, None), getattr(other, what, None)
            if a != b:
                diffs.append(f"component {name!r}: {what} {b!r} where the workflow has {a!r}")
    return diffs


def compare(
    file: FileArg,
    plans: Annotated[list[str] | None, typer.Option("--plan", help="a plan of FILE to compare, PATH or LABEL=PATH "
                                                                  "(repeatable)")] = None,
    rounds: Annotated[int, typer.Option("--rounds", "-r", min=1, help="measured iterations of each plan, one per round")] = 3,
    warmup: Annotated[int, typer.Option("--warmup", min=0, help="iterations of the declared workflow first, not measured")] = 1,
    backend: Annotated[BackendName, typer.Option("--backend", help="local (threads in this process) or ray (one actor "
                                                                 "per component); auto: ray for workflows with GPU "
                                                                 "components or replicas, local otherwise")] = BackendName.AUTO,
    json_path: Annotated[Path | None, typer.Option("--json", dir_okay=False, help="write every measurement here")] = None,
    runs_dir: Annotated[Path | None, typer.Option("--runs", file_okay=False,
                                                  help="write a run directory per plan and round here (metrics.jsonl, trace.json)")] = None,
    out_dir: Annotated[Path | None, typer.Option("--out", file_okay=False,
                                                 help="run directory of the training done (metrics, checkpoint)")] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="replace earlier outputs in --out, --runs and --json")] = False,
    follow_links: FollowLinksOpt = False,
    address: Annotated[str | None, typer.Option("--address", help="join this Ray cluster instead of starting one")] = None,
    call_timeout: Annotated[float, typer.Option("--call-timeout", callback=positive_seconds,
                                                help="watchdog: seconds an iteration's calls may take")] = 900.0,
    allow_module: AllowModuleOpt = None,
    allow_env: AllowEnvOpt = None,
    allow_path: AllowPathOpt = None,
    mps: Annotated[bool, typer.Option("--mps/--no-mps", help="run GPU components under NVIDIA MPS with their quotas")] = True,
    compiled: Annotated[bool, typer.Option("--compiled/--no-compiled", help="ray: compile each iteration into a Ray Compiled Graph")] = True,
    quota_check: Annotated[bool, typer.Option("--quota-check/--no-quota-check",
                                              help="check GEMMs under every MPS quota below 100% first (cached)")] = True,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no progress lines")] = False,
    sets: SetOpt = None,
) -> None:
    """Compare the declared workflow with plans of it, interleaved on one set of workers: seconds per
    iteration (median, spread), throughput, SM activity. The iterations are one training run."""
    wf = load_or_exit(file, sets)
    entries = [Entry("declared", file, wf)]
    for value in plans or []:
        label, path = _parse_plan(value)
        if not path.is_file():
            err.print(f"error: --plan {value}: no such file", markup=False)
            raise typer.Exit(ExitCode.INVALID)
        entries.append(Entry(label, path, load_or_exit(path, None, source=file, source_sets=sets)))
    labels = [e.label for e in entries]
    if len(set(labels)) != len(labels):
        err.print(f"error: two rows have one label ({', '.join(labels)}); name them with --plan LABEL=PATH", markup=False)
        raise typer.Exit(ExitCode.INVALID)
    for k, e in enumerate(entries[1:], start=1):
        diffs = same_computation(wf, e.workflow)
        if diffs and (e.workflow.plan or {}).get("layout"):
            entries[k] = e = _as_layout(wf, file, e)
            diffs = []
        if diffs:
            err.print(f"error: {e.file} does not compute what {file} computes (with these --set values): "
                      + "; ".join(diffs[:4]) + ("; ..." if len(diffs) > 4 else ""), markup=False)
            raise typer.Exit(ExitCode.INVALID)
    policy = TrustPolicy.from_options(allow_module, allow_env, allow_path)
    for e in entries:
        report_problems(e.workflow, check_trust(e.workflow, policy),
                        "(the workflow asks to run code the command line did not allow)")

    from interpreter.backends import default_backend
    from interpreter.optimize.trials import unsupported

    problem = unsupported(wf)
    if problem:
        err.print(f"error: {file}: {problem}", markup=False)
        raise typer.Exit(ExitCode.INVALID)
    from rose_dsl.measurement import window

    # per round and row: an unmeasured iteration after the switch to it, then its window (one iteration, or
    # an asynchronous plan's pipelined ones)
    need = warmup + rounds * sum(1 + window(e.workflow).iterations for e in entries)
    if wf.root.count is not None and wf.root.count < need:
        err.print(f"error: comparing {len(entries)} rows over {rounds} rounds trains up to {need} iterations and "
                  f"{file} trains {wf.root.count}; raise its iteration count (e.g. --set iterations={need})", markup=False)
        raise typer.Exit(ExitCode.INVALID)
    _check_outputs(json_path, runs_dir, overwrite, follow_links)

    layouts = [e for e in entries if e.layout]
    if layouts:
        _check_layouts(entries, file)
        if backend is BackendName.LOCAL:
            err.print(f"error: {layouts[0].label} runs another layout (other processes for "
                      f"{', '.join(layouts[0].layout)}): that needs --backend ray", markup=False)
            raise typer.Exit(ExitCode.INVALID)
    from .run import TRIAL_MODULES, ExecuteOptions, guarded

    chosen = default_backend(wf) if backend is BackendName.AUTO else backend.value
    if layouts and chosen != "ray":
        err.print("note: --backend ray (a plan runs another layout: its processes are replaced on each switch)",
                  markup=False)
        chosen = "ray"
    run = ExecuteOptions(backend=chosen, out_dir=out_dir, overwrite=overwrite, follow_links=follow_links,
                         address=address, call_timeout=call_timeout,
                         allowed=(*policy.modules, *TRIAL_MODULES), mps=mps, quiet=quiet, compiled=compiled,
                         check_quotas=quota_check)
    options = _Options(rounds, warmup, json_path, runs_dir)
    code: dict[str, int] = {}
    exit_code = guarded(lambda teardown, ctx: _run(entries, run, options, teardown, ctx, code), run, err)
    raise typer.Exit(exit_code or code.get("exit", 0))


def _check_outputs(json_path: Path | None, runs_dir: Path | None, overwrite: bool, follow_links: bool) -> None:
    """--json and --runs: neither an earlier one's (unless --overwrite) nor, for --runs, a link (unless
    --follow-links); exit 2 before any work."""
    refuse_linked_dir(runs_dir, "--runs", follow_links)
    for path in (p for p in (json_path, runs_dir) if p is not None):
        if path.exists() and not overwrite and (path.is_file() or any(path.iterdir())):
            err.print(f"error: {path} already exists; choose another path or pass --overwrite", markup=False)
            raise typer.Exit(ExitCode.INVALID)


def _as_layout(wf: Workflow, file: Path, e: Entry) -> Entry:
    """`e` as a layout plan of `wf` (its `plan: layout:` values), or exit 2 saying why it is not one."""
    from dataclasses import replace

    from rose_dsl.optimizer.layouts import layout_change

    values = (e.workflow.plan or {}).get("layout")
    changed, why = layout_change(wf, e.workflow)
    if why is None and not changed:
        why = "yet runs every component as the workflow does (and still differs from it)"
    if why is not None:
        err.print(f"error: {e.file} declares the layout {values} but is not a layout of {file}: {why}", markup=False)
        raise typer.Exit(ExitCode.INVALID)
    return replace(e, layout=tuple(changed))


def _check_layouts(entries: list[Entry], file: Path) -> None:
    """Layout plans replace processes on each switch: refused when another row runs copies of a component
    a layout changes (the copies would outlive the processes they copy), exit 2."""
    for e in (x for x in entries if x.layout):
        for other in entries:
            copies = sorted(n for n, c in other.workflow.components.items() if c.copy_of in e.layout)
            if copies:
                err.print(f"error: {e.label} runs {', '.join(e.layout)} as another layout and {other.label} runs "
                          f"copies of it ({', '.join(copies)}): they cannot share the workers; compare them in "
                          "separate runs", markup=False)
                raise typer.Exit(ExitCode.INVALID)


@dataclass(frozen=True)
class _Options:
    rounds: int
    warmup: int
    json_path: Path | None
    runs_dir: Path | None


def mps_moves(plan: Workflow, current: dict[str, tuple[int, int]]) -> list[Any]:
    """The components of `plan` whose GPU process must move to a new one before `plan` runs: its MPS quota
    or client priority (both fixed for a process's lifetime) differs from the settings the process runs
    under now (`current`: name -> (quota, priority), for every running GPU process)."""
    return [c for n, c in plan.components.items() if n in current and c.mps_settings != current[n]]


def _run(entries: list[Entry], run: Any, opts: _Options, teardown: ExitStack, ctx: RunContext, code: dict[str, int]) -> None:
    from .run import check_quotas, gpu_session, prepare, progress_log, start_trial_session

    started = time.perf_counter()
    wf = entries[0].workflow
    prepare(wf, run, teardown, ctx.err)
    gpu = teardown.enter_context(gpu_session(wf, run, ctx.err))
    # the quotas the plans ask for (checked once each, as rose execute does)
    gpu_comps = [c for e in entries for c in e.workflow.components.values() if c.device == "gpu"]
    if gpu.quotas_work and run.check_quotas:
        check_quotas(gpu_comps, gpu.daemon, ctx.err)
    mps_differ = len({(c.name, c.mps_quota, c.mps_priority) for c in gpu_comps}) > len({c.name for c in gpu_comps})
    if mps_differ and not gpu.quotas_work:
        ctx.err.print("warning: the plans ask for other MPS quotas or client priorities, which do not bind without "
                      "an MPS daemon: they run under the same SMs and priority", markup=False)
    # the copies the plans add, started now (on Ray, GPU processes are placed when the workers start)
    copies = {n: c for e in entries[1:] for n, c in e.workflow.components.items()}
    with progress_log(out, run.quiet) as log:
        session = start_trial_session(wf, run, gpu, ctx, teardown, copies, log)
        log(f"workers started ({time.perf_counter() - started:.0f} s)")
        # each GPU process's (quota, priority) now: the declared components' and the copies', as started
        started_as = [*wf.components.values(), *(c for n, c in copies.items() if n not in wf.components)]
        current = {c.name: c.mps_settings for c in started_as if c.device == "gpu"}

        running_layout = 0  # the entry whose layout the processes run (0: the declared one)

        def before(i: int) -> None:
            """Run the layout of the plan about to run (fresh processes for what it changes) and move GPU
            components under its quotas and client priorities (state moved with them)."""
            nonlocal running_layout
            want = i if entries[i].layout else 0
            if want != running_layout:
                replaced = session.use_layout(entries[want].workflow)
                if replaced:
                    log(f"  {entries[want].label}: new processes for {', '.join(replaced)}")
                running_layout = want
            if not gpu.quotas_work:
                return
            for comp in mps_moves(entries[i].workflow, current):
                quota, priority = current[comp.name] = comp.mps_settings
                log(f"  {entries[i].label}: {comp.name} to MPS quota {quota}%, "
                    f"{'below normal' if priority else 'normal'} priority")
                session.replace_quota(comp.name, comp.mps_quota, gpu.client_env(comp.mps_quota, priority), priority=priority)

        # one round at a time (A B C, then C B A), each written as soon as it is measured: a run cut short
        # (a device call's time limit, ^C) leaves every finished round on disk
        if opts.runs_dir is not None:
            import shutil

            for e in entries:  # (--overwrite: no round of an earlier run stays)
                shutil.rmtree(opts.runs_dir / e.label, ignore_errors=True)
        results: list[list[IterationRun]] = [[] for _ in entries]
        failures: dict[int, str] = {}
        for r in range(opts.rounds):
            order = [i for i in (range(len(entries)) if r % 2 == 0 else reversed(range(len(entries))))
                     if i not in failures]
            labels, warmup = [entries[i].label for i in order], opts.warmup if r == 0 else 0
            got = session.complete([entries[i].workflow for i in order], 1, warmup, labels,
                                   _in(order, before, log, f"  round {r + 1}/{opts.rounds}", labels, started, warmup))
            for j, why in session.last_failures.items():
                failures[order[j]] = why
            for j, i in enumerate(order):
                results[i] += got[j]
                if got[j] and opts.runs_dir is not None:
                    write_run_dir(opts.runs_dir / entries[i].label / f"round{len(results[i]) - 1}",
                                  entries[i].workflow, got[j])
            _write_json(opts, entries, results, failures, run.backend, time.perf_counter() - started,
                        session.books, r + 1)
            log(_round_line(r, opts.rounds, [(entries[i].label, got[j]) for j, i in enumerate(order)], failures))
        session.finish("rose compare")
    total = time.perf_counter() - started
    _print_table(plan_rows(entries, results, failures), total, session.books)
    if opts.runs_dir is not None:
        out.print(f"wrote run directories under {opts.runs_dir}", markup=False)
    if opts.json_path is not None:
        out.print(f"wrote {opts.json_path}", markup=False)
    if failures:
        for i, why in sorted(failures.items()):
            ctx.err.print(f"error: {entries[i].label} failed: {why}", markup=False)
        code["exit"] = ExitCode.COMPONENT


def _round_line(r: int, rounds: int, measured: list[tuple[str, list[IterationRun]]], failures: dict[int, str]) -> str:
    """One progress line per round (a long call shows where it is; the JSON beside it has the figures)."""
    parts = [f"{label} {statistics.median(x.seconds for x in runs):.2f} s" if runs else f"{label} -"
             for label, runs in measured]
    return f"round {r + 1}/{rounds}: " + ", ".join(parts) + (f" ({len(failures)} failed)" if failures else "")


def _in(order: list[int], before: Callable[[int], None], log: Callable[[str], None], head: str, labels: list[str],
        started: float, warmup: int) -> Callable[[int], None]:
    """`before` for one round's call of `complete`, whose plan j is row order[j], after a line saying that
    plan j starts (a row of a long call takes minutes: without it nothing shows between round ends). With a
    warm-up, `complete` calls it for the first plan's warm-up iterations first."""
    calls = itertools.count()

    def call(j: int) -> None:
        what = "warm-up" if warmup and next(calls) == 0 else f"{j + 1} of {len(labels)}"
        log(f"{head}: {labels[j]} ({what}, {time.perf_counter() - started:.0f} s in)")
        before(order[j])

    return call


def _write_json(opts: _Options, entries: list[Entry], results: list[list[IterationRun]], failures: dict[int, str],
                backend: str, seconds: float, books: Any, rounds_done: int) -> None:
    if opts.json_path is None:
        return
    doc = {"workflow": str(entries[0].file), "rounds": opts.rounds, "rounds_done": rounds_done, "warmup": opts.warmup,
           "backend": backend, "seconds_total": seconds, "books": books.to_json(),
           "machine": machine_info(backend), "rows": plan_rows(entries, results, failures)}
    opts.json_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = opts.json_path.with_name(opts.json_path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    tmp.replace(opts.json_path)


def _activity(run: IterationRun) -> tuple[float | None, float | None]:
    """Time-weighted mean SM activity over the iteration's samples, and the fraction below 50%."""
    covered = integral = below = 0.0
    for a, b, v in run.activity_samples:
        lo, hi = max(a, run.start_ns), min(b, run.end_ns)
        if hi > lo:
            covered += hi - lo
            integral += v * (hi - lo)
            below += (hi - lo) if v < LOW_ACTIVITY else 0.0
    return (integral / covered, below / covered) if covered else (None, None)


def plan_rows(entries: list[Entry], results: list[list[IterationRun]], failures: dict[int, str]) -> list[dict[str, Any]]:
    """One summary per row: every measured iteration (an asynchronous plan: every measured window, its
    seconds per iteration), the median and spread, the ratio to the declared workflow (> 1: faster), each
    `*_per_s` metric's median, SM activity, the staleness the plan uses and how a measurement ran."""
    from rose_dsl.measurement import window
    from rose_dsl.optimizer.report import staleness

    rows: list[dict[str, Any]] = []
    base = None
    for i, (e, runs) in enumerate(zip(entries, results, strict=True)):
        seconds = [r.seconds for r in runs]
        med = statistics.median(seconds) if seconds else None
        if i == 0:
            base = med
        rates: dict[str, float] = {}
        for key in sorted({k for r in runs for k in r.metrics if k.endswith("_per_s")}):
            vals = [float(r.metrics[key]) for r in runs if r.metrics.get(key) is not None]
            if vals:
                rates[key] = statistics.median(vals)
        act = [_activity(r) for r in runs]
        sm = [a for a, _ in act if a is not None]
        low = [b for _, b in act if b is not None]
        plan_meta = e.workflow.plan
        win = window(e.workflow)
        rows.append({
            "label": e.label, "file": str(e.file),
            "requests": list(plan_meta.get("rewrites") or []) if plan_meta else [],
            "mps_quota": {n: c.mps_quota for n, c in e.workflow.components.items() if c.device == "gpu"},
            "mps_priority": {n: c.mps_priority for n, c in e.workflow.components.items()
                             if c.device == "gpu" and c.mps_priority is not None},
            "iterations": [{"iteration": r.iteration, "seconds": r.seconds, "metrics": r.metrics} for r in runs],
            "staleness": staleness(e.workflow),
            "window": {"fill": win.fill, "measured": win.measured, "tail": win.tail},
            "seconds": seconds, "median_s": med,
            "spread": (max(seconds) - min(seconds)) / med if seconds and med else None,
            "speedup": base / med if base and med else None,
            "throughput": rates,
            "sm_activity": statistics.mean(sm) if sm else None,
            "frac_below_50": statistics.mean(low) if low else None,
            "failed": failures.get(i),
        })
    for row in rows[1:]:
        row["verdict"] = verdict(rows[0], row)
    return rows


def verdict(reference: dict[str, Any], row: dict[str, Any]) -> dict[str, Any] | None:
    """Faster, slower or undecided than the declared workflow, with the interval of the speed-up: the
    optimizer's own rule (`rose_dsl.optimizer.stats`): a signed-rank test on the rounds' pairs (each round
    measures every row once, interleaved), or a rank-sum test where the rows' counts differ. None for a
    failed row or one with no measurement."""
    from rose_dsl.optimizer.stats import decide, decide_unpaired

    ref, cand = reference["seconds"], row["seconds"]
    if row["failed"] or reference["failed"] or not ref or not cand or min(ref + cand) <= 0:
        return None
    v = decide(ref, cand, more=False) if len(ref) == len(cand) else decide_unpaired(ref, cand)
    return {**v.to_json(), "text": v.describe()}


def _print_table(rows: list[dict[str, Any]], total: float, books: Any) -> None:
    rates = sorted({k for r in rows for k in r["throughput"]})
    table = Table(title="seconds per iteration, interleaved on one set of workers")
    stale_col = any(r["staleness"] for r in rows)  # (a column only where an asynchronous plan is compared)
    for col in ("plan", "median s", "spread", "n", "vs declared", *rates, "SM activity", *["staleness"] * stale_col):
        table.add_column(col, justify="left" if col in ("plan", "staleness") else "right")
    for r in rows:
        stale = [", ".join(f"{state} {v['lag']}" for state, v in sorted(r["staleness"].items())) or "0"] * stale_col
        if r["failed"]:
            table.add_row(r["label"], "failed", "", str(len(r["seconds"])), "", *["" for _ in rates], "", *stale)
            continue
        table.add_row(r["label"], f"{r['median_s']:.4f}" if r["median_s"] else "-",
                      f"{r['spread']:.0%}" if r["spread"] is not None else "-", str(len(r["seconds"])),
                      f"{r['speedup']:.2f}x" if r["speedup"] else "-",
                      *[f"{r['throughput'][k]:.1f}" if k in r["throughput"] else "-" for k in rates],
                      f"{r['sm_activity']:.0%}" if r["sm_activity"] is not None else "-", *stale)
    # piped (a log, `| tee`): the table at its own width, not cut to 80 columns ("decl…", "medi…")
    wide = out if out.is_terminal else type(out)(file=out.file, width=max(out.width, 1000), highlight=False,
                                                  soft_wrap=True)
    wide.print(table)
    for r in rows[1:]:
        if r.get("verdict"):
            out.print(f"{r['label']} vs {rows[0]['label']}: {r['verdict']['text']}", markup=False)
    for r in (r for r in rows if r["window"]["measured"] > 1):
        w = r["window"]
        out.print(f"{r['label']}: an asynchronous plan, measured over windows of {w['measured']} consecutive "
                  f"pipelined iterations (after {w['fill']} filling the pipeline; {w['tail']} more, then what is "
                  "deferred drained, not timed): seconds per iteration = window / iterations", markup=False)
    out.print(f"{int(books.complete_iterations)} training iterations in {total:.1f} s (start-up and "
              "plan switches included)", markup=False)


def _loop_names(plan: Workflow, node: str, depth: int) -> list[str]:
    """The names of the loops enclosing an executed node (`iteration.epoch@1.step.act@0` -> iteration,
    epoch, step), outermost first; `l<i>` where the plan does not say."""
    parts = NodePath.parse(node).parts
    names = []
    for n in range(1, len(parts)):
        item = plan.find(tuple(parts[:n]))
        if isinstance(item, LoopNode):
            names.append(item.plan.split_of or item.name)  # a group of a split loop is that loop
    if len(names) != depth:
        names = ["iteration"] + [f"l{i}" for i in range(1, depth)]
    return names


def write_run_dir(path: Path, plan: Workflow, runs: list[IterationRun]) -> None:
    """A run directory as `rose execute --out` writes it, for these iterations: `metrics.jsonl` (one line
    per iteration: its index, `iteration_s`, its metrics) and a Chrome trace (`trace.json`: a complete
    event per call, category = process, `args.loops` = loop indices; the SM-activity counter)."""
    from interpreter.safe_io import atomic_writer, real_dir, write_atomic

    real_dir(path)  # (never through a link: interpreter/safe_io.py)
    with atomic_writer(path / "metrics.jsonl") as f:
        for r in runs:
            f.write(json.dumps({"iteration": r.iteration, "iteration_s": r.seconds, **r.metrics}) + "\n")
    pids: dict[str, int] = {}
    events: list[dict[str, Any]] = []
    for r in runs:
        for c in r.calls:
            pid = pids.setdefault(c.component, len(pids) + 1)
            loops = dict(zip(_loop_names(plan, c.node, len(c.indices)), c.indices, strict=True))
            events.append({"name": c.node, "cat": c.component, "ph": "X", "pid": pid, "tid": 0,
                           "ts": c.start_ns / 1e3, "dur": (c.end_ns - c.start_ns) / 1e3, "args": {"loops": loops}})
        for a, _, v in r.activity_samples:
            events.append({"name": "SM activity", "ph": "C", "pid": 0, "ts": a / 1e3, "args": {"sm_activity": v * 100}})
    meta = [{"name": "process_name", "ph": "M", "pid": pid, "args": {"name": comp}} for comp, pid in pids.items()]
    meta.append({"name": "process_name", "ph": "M", "pid": 0, "args": {"name": "GPU"}})
    write_atomic(path / "trace.json", json.dumps({"traceEvents": meta + events, "displayTimeUnit": "ms"}))
