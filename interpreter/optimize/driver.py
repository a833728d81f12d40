"""`optimize(workflow, options, host) -> Outcome`: one run of the optimizer, top to bottom -- the outputs
checked, the run directory, the GPU session, the settings and the budget, the measuring session (with the
quota self-check beside its start-up), layouts and stage 1 (or the given `--stage1` plan), stage 2, the
plan and stage1.yaml written, the hand-over (a checkpoint, or the processes moved for `--train`), the
report. It decides nothing itself: the search (`rose_dsl.optimizer`) decides, the measuring side beside
this module (`trials`, `quota_trials`, `executor`) measures.

Why a `Host`: what starts and stops things for a command -- the run directory's rules and lock, the MPS
daemon, the backend's processes, the progress display, the signal handler, the one teardown (`ExitStack`)
and the exit-code table -- belongs to the command (`rose_cli`), which the runtime never imports. The
command implements this small protocol and hands it in, so the whole flow reads here in one place, and a
test runs it on a fake measuring session (`tests/optimizer/test_driver_identity.py`).

What the command keeps: option parsing and checks, the exit codes (`OutOfBudget`, `CannotOptimize`,
KeyboardInterrupt), the console summary of `Outcome.report`, and `--train`'s training with its progress
display, on `Outcome.session`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from rose_dsl.ir import Component, Workflow
from rose_dsl.measurement import Books, IterationRun
from rose_dsl.optimizer import (
    Budget,
    Layout,
    LayoutMeasurer,
    Ledger,
    Log,
    Measurer,
    MeteredMeasurer,
    Mps,
    OutOfBudget,
    Settings,
    Stage1Result,
    Stage2Record,
    Stop,
    build_report,
    choose_layout,
    first_probe_levels,
    given_plan,
    optimize_graph,
    plan_label,
    reorder_bound,
    temporal_copies,
    tune_mps,
    write_report,
)

from ..runner import IterationResult
from .quota_trials import CheckPrefetch, MpsClients, QuotaTrials, quota_sms, settle
from .run_state import read_state
from .trials import unsupported

__all__ = ["optimize", "OptimizeOptions", "Outcome", "Host", "RunOptions", "Gpu", "MeasuringSession",
           "CannotOptimize", "REPORT_FILES", "stage2_skipped", "mps_changes"]

REPORT_FILES = ("report.json", "report.md", "stage1.yaml", "timeline.svg", "quota_curve.svg")


@dataclass(frozen=True)
class OptimizeOptions:
    """What `rose optimize` adds to `rose execute`'s run options (`RunOptions`)."""

    file: Path
    output: Path
    report_dir: Path
    budget_s: float | None = None
    rounds: int = 2
    top_k: int = 3
    alternatives: int = 4
    local_max_fraction: float = 0.4  # Settings.local_max_fraction
    quota: bool = True
    stage2: str = "both"  # what stage 2 tries: "quotas", "priorities" (below-normal MPS client priority), "both"
    stage1: Workflow | None = None  # --stage1: the graph is this plan (no search)
    layouts: tuple[Layout, ...] = ()  # --layout: the values to try before stage 1
    train: bool = False  # --train: training goes on with the plan in the same processes (`TrialSession.train_on`)
    max_overhead: float = 0.0  # --max-overhead (a share, 0: off): with --train, search again on drift (`continuous`)
    resume_plan: Workflow | None = None  # --resume: the plan (-o) a --max-overhead run was on; no first search
    checkpoint_every: int = 0  # with --train
    sets: tuple[str, ...] = ()  # the command's `--set NAME=VALUE`s: the source as run, in the commands the report gives

    @property
    def source_args(self) -> str:
        """The source workflow as it ran, as a command line names it: `FILE --set a=1 ...` (a plan of a budget the
        source raises with `--set` runs beside it only with those values: docs/language.md)."""
        return " ".join([str(self.file), *(f"--set {s}" for s in self.sets)])


class CannotOptimize(Exception):
    """The run cannot start as asked: an output it would write over, a workflow it cannot measure (exit 2)."""


# --- what the driver asks of its surroundings --------------------------------------------------------------
class RunOptions(Protocol):
    """The run options the driver reads (the command's `ExecuteOptions` has them)."""

    @property
    def backend(self) -> str: ...  # "local" | "ray"

    @property
    def out_dir(self) -> Path | None: ...  # the run directory of the training done while optimizing

    @property
    def overwrite(self) -> bool: ...

    @property
    def check_quotas(self) -> bool: ...  # self-check the MPS quota levels before using them


class Gpu(MpsClients, Protocol):
    """The GPU set-up the host made: whether MPS quotas bind here, and the MPS clients' environments."""

    @property
    def quotas_work(self) -> bool: ...


class SessionExecutor(Protocol):
    """The figures the driver reads off the session's executor."""

    @property
    def startup_s(self) -> float: ...

    def metric_notes(self) -> dict[str, str]: ...


class MeasuringSession(Measurer, LayoutMeasurer, Protocol):
    """The measuring session (`trials.TrialSession`): the search's `Measurer` and `LayoutMeasurer`, plus the
    books, the work joined before the first measurement, the hand-over, and `--train`'s training."""

    books: Books
    pending: list[Callable[[], None]]
    k: int  # the next training iteration

    @property
    def executor(self) -> SessionExecutor: ...

    def join_pending(self) -> None: ...

    def sync_books(self) -> Books: ...

    def finish(self, plan_label: str) -> Path | None: ...

    def train_on(self, plan: Workflow, iterations: int, checkpoint_every: int = 0,
                 on_iteration: Callable[[IterationResult], None] | None = None,
                 stop: Callable[[], Any] | None = None) -> list[IterationResult]: ...


class Host(Protocol):
    """What the command provides: everything started goes on `teardown`, which the command closes on every
    path; failures raised here are the command's to report (its exit-code table)."""

    @property
    def run(self) -> RunOptions: ...

    @property
    def teardown(self) -> ExitStack: ...

    def prepare(self, wf: Workflow) -> None:
        """The run directory's rules (locked until the teardown), the schedule, the replicas: refused before
        anything starts."""

    def gpu_session(self, wf: Workflow) -> AbstractContextManager[Gpu]:
        """The MPS daemon and the GPU activity sampler, stopped when it exits."""

    def start_session(self, wf: Workflow, gpu: Gpu, copies: Mapping[str, Component], log: Log,
                      started: float) -> MeasuringSession:
        """The workflow's processes, the trial components and `copies`, as a measuring session counting its
        time from `started` (`time.perf_counter()`); stopped by the teardown."""

    def progress_log(self, deadline: float | None) -> AbstractContextManager[Log]:
        """The progress display (with the budget left until `deadline`) and the log its lines go to."""

    def stop_on_signal(self, log: Log) -> AbstractContextManager[Stop]:
        """The first SIGINT/SIGTERM asks the run to stop at its next decision point (`Stop()` says why)."""

    def machine(self, backend: str) -> dict[str, Any]:
        """What the report says about this machine."""


@dataclass
class Outcome:
    """What a run produced: the plan (written to `options.output`), the workflow trained (the chosen layout's),
    the report document (written to `options.report_dir`), the checkpoint's run directory (None: none), and,
    when `trains_on`, the session that `--train` goes on training in. `stop()` says why the run was stopped
    early (None: it was not)."""

    plan: Workflow
    workflow: Workflow
    report: dict[str, Any]
    run_dir: Path | None
    trains_on: bool
    session: MeasuringSession
    stop: Stop
    result: Stage1Result | None = None  # stage 1's (what `--max-overhead` trains on from)
    settings: Settings | None = None
    first_losing_s: float = 0.0  # the first search's losing seconds (`optimizer.drift`), with --max-overhead
    resumed: dict[str, Any] | None = None  # --resume: the search's state read back (`run_state.read_state`)


# --- the run ---------------------------------------------------------------------------------------------
def optimize(wf: Workflow, opts: OptimizeOptions, host: Host) -> Outcome:
    """Optimize `wf` (see the module's docstring for the order)."""
    if opts.resume_plan is not None:
        return _resume(wf, opts, host)
    started = time.perf_counter()
    run = host.run
    check_outputs(wf, opts, run.overwrite)
    host.prepare(wf)
    if run.overwrite:
        clear_report(opts.report_dir)
    gpu = host.teardown.enter_context(host.gpu_session(wf))
    quota_stage = stage2_skipped(wf, opts.quota, run.backend, gpu) is None
    settings, budget = settings_and_budget(opts, quota_stage, started)
    prefetch = _prefetch(wf, opts, run, gpu, settings) if quota_stage else None
    with host.progress_log(budget.deadline) as log:  # (shows the budget left)
        session = _start(wf, opts, host, gpu, log, started, prefetch)
        stop = host.teardown.enter_context(host.stop_on_signal(log))  # after Ray's start: its handlers are replaced
        ledger = Ledger(session.elapsed, incumbent="") if opts.max_overhead > 0 else None
        measurer = session if ledger is None else MeteredMeasurer(session, ledger)  # (books its turns by plan)
        wf, layout_section, result = _search(wf, opts, measurer, settings, budget, log, stop)
        session.join_pending()  # (stage 1 measured nothing: stage 2's checks find the prefetch's verdicts)
        running: dict[str, Mps] = {}  # the MPS settings stage 2 left each process under
        stage2 = _stage2(wf, result, session, gpu, opts, run.backend, settings, log, budget, stop, running)
        plan = stage2.plan or result.plan
        chosen = (layout_section or {}).get("chosen")
        # a run that fails from here on (the hand-over checkpoint, the report) leaves no plan: one was taken
        # for a result and blocked the re-run without --overwrite (issue 42)
        finished: list[bool] = []
        host.teardown.callback(_unless_finished, [opts.output, opts.report_dir / "stage1.yaml"], finished)
        write_plan(plan, opts.output, opts.file, result, stage2, chosen)
        # the graph of stage 1 alone (the paper table's `stage1` / `stage1_mps` rows)
        write_plan(result.plan, opts.report_dir / "stage1.yaml", opts.file, result, None, chosen)
        train, ckpt = _hand_over(plan, wf, opts, session, gpu, running, log, stop)
    run_dir = run.out_dir if ckpt else None
    doc = _report_doc(wf, result, session, time.perf_counter() - started, opts, run_dir, settings, run.backend,
                      stage2, host.machine(run.backend), trains_on=train)
    _write_report(doc, result, layout_section, opts, stop)
    finished.append(True)
    losing = ledger.losing_s(plan_label(result.requests)) if ledger is not None else 0.0
    return Outcome(plan, wf, doc, run_dir, train, session, stop, result, settings, losing)


def _resume(wf: Workflow, opts: OptimizeOptions, host: Host) -> Outcome:
    """`--resume` of a `--train --max-overhead` run: no first search -- the run directory's state
    (`optimize_state.json`: the plan's requests, its expected time, the overhead spent) and the plan it was on
    (`opts.resume_plan`, the -o file) are read back, the processes started, and the run's elapsed time goes
    on from the state's; `continuous.keep_optimizing` loads the last checkpoint into them and trains on."""

    started = time.perf_counter()
    run = host.run
    assert opts.resume_plan is not None and run.out_dir is not None
    try:
        state = read_state(run.out_dir)
    except ValueError as exc:
        raise CannotOptimize(str(exc)) from None
    recorded = [str(r) for r in (opts.resume_plan.plan or {}).get("rewrites") or []]
    if recorded != list(state["plan_requests"]):
        raise CannotOptimize(f"{opts.output} is not the plan the run was on ({'; '.join(state['plan_requests']) or 'the declared graph'}, "
                             f"by {run.out_dir / 'optimize_state.json'}): name the plan file that run wrote")
    host.prepare(wf)
    gpu = host.teardown.enter_context(host.gpu_session(wf))
    settings, _ = settings_and_budget(opts, stage2_skipped(wf, opts.quota, run.backend, gpu) is None, started)
    elapsed = float(state["overhead"].get("elapsed_s", 0.0))
    with host.progress_log(None) as log:
        session = _start(wf, opts, host, gpu, log, started - elapsed, None)
        stop = host.teardown.enter_context(host.stop_on_signal(log))
    return Outcome(opts.resume_plan, wf, {}, None, True, session, stop, None, settings, 0.0, resumed=state)


# --- before anything starts ------------------------------------------------------------------------
def check_outputs(wf: Workflow, opts: OptimizeOptions, overwrite: bool) -> None:
    """Refuse (CannotOptimize) to write over the workflow itself, or over an earlier run's plan or report
    unless `overwrite` (the run directory has `rose execute --out`'s rules, checked by `Host.prepare`)."""
    if opts.output.exists() and opts.output.resolve() == opts.file.resolve():
        raise CannotOptimize(f"-o {opts.output} is the workflow itself; write the plan to another file")
    if opts.output.exists() and opts.output.is_dir():
        raise CannotOptimize(f"-o {opts.output} is a directory; name the plan file")
    if opts.report_dir.exists() and not opts.report_dir.is_dir():
        raise CannotOptimize(f"--report {opts.report_dir} is a file, not a directory")
    earlier = [str(p) for p in (opts.output, opts.report_dir / "report.json") if p.exists()]
    if earlier and not overwrite:
        raise CannotOptimize(f"{' and '.join(earlier)} already exist{'s' if len(earlier) == 1 else ''} (an earlier "
                             "rose optimize?); choose another -o/--report, or replace them with --overwrite")
    problem = unsupported(wf)
    if problem:
        raise CannotOptimize(f"{wf.file}: {problem}")


def clear_report(report_dir: Path) -> None:
    """`--overwrite`: remove an earlier report's files (a picture this run does not draw must not stay)."""
    for name in REPORT_FILES:
        (report_dir / name).unlink(missing_ok=True)


def mps_changes(wf: Workflow, plan: Workflow) -> list[str]:
    """The processes `plan` runs under other MPS settings than `wf` (a copy is compared with the component it
    copies), as "policy: quota 94%" / "sim: below-normal priority"."""
    out = []
    for name, comp in plan.components.items():
        base = wf.components.get(comp.copy_of or name)
        if base is None or comp.mps_settings == base.mps_settings:
            continue
        (q, p), (q0, p0) = comp.mps_settings, base.mps_settings
        parts = ([f"quota {q}%"] if q != q0 else []) + ([f"{'below-normal' if p else 'normal'} priority"] if p != p0 else [])
        out.append(f"{name}: {', '.join(parts)}")
    return out


def stage2_skipped(wf: Workflow, quota: bool, backend: str, gpu: Gpu) -> str | None:
    """Why stage 2 (MPS quotas) cannot run for this workflow here, or None when it will. Asked before stage
    1, whose share of the budget depends on it, and again when stage 2 would start."""
    if not quota:
        return "--no-quota"
    if not any(c.device == "gpu" for c in wf.components.values()):
        return "no GPU components: MPS quotas do not apply on the CPU"
    if backend != "ray":
        return "quotas need one process per component (--backend ray)"
    if not gpu.quotas_work:
        return "MPS is not active here (see the warning above), so quotas cannot bind"
    return None


def settings_and_budget(opts: OptimizeOptions, quota_stage: bool, started: float) -> tuple[Settings, Budget]:
    """The search's `Settings` from the options, and the one `Budget` of the run, on the clock the command
    started on: with stage 2 to come, stage 1 gets its share (`Settings.stage1_share`; all of it goes to
    stage 2 with --stage1); when stage 2 will be skipped (no GPU component, no MPS, --no-quota...), all."""
    settings = Settings(top_k=opts.top_k, alternatives=opts.alternatives, rounds=opts.rounds,
                        local_max_fraction=None if opts.local_max_fraction >= 1.0 else opts.local_max_fraction)
    budget = Budget.of(opts.budget_s, started=started,
                       shares={"stage1": settings.stage1_share if quota_stage else 1.0, "layouts": settings.layout_share})
    settings.budget_s = budget.share("stage1").total_s  # (the report's settings say stage 1's share)
    return settings, budget


def copies_to_start(wf: Workflow, backend: str, given: Workflow | None) -> dict[str, Component]:
    """The components to start besides the workflow's: on Ray (GPU processes are placed at start) the GPU
    copies a temporal split in two groups would need, or those of the given stage-1 plan (`--stage1`)."""
    if backend != "ray" or not any(c.device == "gpu" for c in wf.components.values()):
        return {}
    copies = temporal_copies(wf, 2) if given is None else given.components
    return {n: c for n, c in copies.items() if n not in wf.components and c.device == "gpu"}


def _prefetch(wf: Workflow, opts: OptimizeOptions, run: RunOptions, gpu: Gpu, settings: Settings) -> CheckPrefetch | None:
    """The screening's first quota self-check (the optimizer says which levels), started now, beside the
    processes' start-up; None when stage 2 will try no quota or the checks are off."""
    if opts.stage2 not in ("both", "quotas") or not run.check_quotas:
        return None
    return CheckPrefetch(gpu, lambda: first_probe_levels(wf, quota_sms()), parallel=settings.quota_parallel_checks)


def _start(wf: Workflow, opts: OptimizeOptions, host: Host, gpu: Gpu, log: Log, started: float,
           prefetch: CheckPrefetch | None) -> MeasuringSession:
    """The measuring session (the workflow's processes and the trial components), its set-up booked; the
    prefetched self-check is joined before the first measurement, so the warm-up iteration runs beside it."""
    copies = copies_to_start(wf, host.run.backend, opts.stage1)
    session = host.start_session(wf, gpu, copies, log, started)  # stage 1's budget and stage 2's deadline: one clock
    # what ran before and around the processes' start-up: the MPS daemon, the SM sampler, the session's own
    session.books.setup_s = max(0.0, time.perf_counter() - started - session.executor.startup_s)
    if prefetch is not None:
        since = time.perf_counter()  # (stage 1's first, untimed iteration starts now)
        session.pending.append(lambda: prefetch.wait(session.books, log, training_since=since))
    return session


# --- layouts, stage 1, stage 2 ---------------------------------------------------------------------------
def _search(wf: Workflow, opts: OptimizeOptions, session: Any, settings: Settings, budget: Budget,
            log: Log, stop: Stop) -> tuple[Workflow, dict[str, Any] | None, Stage1Result]:
    """Layouts first, within their share of the budget from now (stage 1's rewrites then apply to the chosen
    one), then stage 1 (or the `--stage1` plan measured): the workflow trained, the layout section, stage 1's
    result."""
    layout_section = None
    if opts.layouts:
        chosen, layout_section = choose_layout(wf, opts.layouts, session, settings, log,
                                               budget=budget.share("layouts", from_now=True), stop=stop)
        if chosen is not None and chosen.workflow is not None:
            wf = chosen.workflow
            log(f"layout: {layout_section['summary']}; stage 1 goes on with it")
    try:
        if opts.stage1 is not None:
            requests = [str(r) for r in (opts.stage1.plan or {}).get("rewrites") or []]
            return wf, layout_section, given_plan(wf, opts.stage1, requests, session, settings, log, stop)
        return wf, layout_section, optimize_graph(wf, session, settings, log, stop, budget=budget.share("stage1"))
    except OutOfBudget:
        if stop():  # stopped before the reference was measured: nothing to write
            raise KeyboardInterrupt from None
        raise


def _stage2(wf: Workflow, result: Stage1Result, session: MeasuringSession, gpu: Gpu, opts: OptimizeOptions,
            backend: str, settings: Settings, log: Log, budget: Budget, stop: Stop,
            running: dict[str, Mps]) -> Stage2Record:
    """Stage 2 (the search's `tune_mps`) on the measuring side's `QuotaTrials`, or why it is skipped."""
    skipped = stage2_skipped(wf, opts.quota, backend, gpu)
    if skipped is not None:
        return Stage2Record(skipped=skipped)
    reason = stop()
    if reason:
        return Stage2Record(skipped=reason)
    if budget.spent():
        return Stage2Record(skipped="the time budget (--budget-s) was spent by stage 1")
    trials = QuotaTrials(session, gpu, stop=stop, parallel=settings.quota_parallel_checks)
    return tune_mps(result, trials, settings, log, budget=budget, stop=stop, running=running,
                    quotas=opts.stage2 in ("both", "quotas"), priorities=opts.stage2 in ("both", "priorities"))


# --- what is written -----------------------------------------------------------------------------------
def _unless_finished(paths: list[Path], finished: list[bool]) -> None:
    """At teardown: remove the plans written when the run did not get to write its report (it failed)."""
    if not finished:
        for path in paths:
            path.unlink(missing_ok=True)


def write_plan(plan: Workflow, output: Path, file: Path, result: Stage1Result, stage2: Stage2Record | None,
               layout: Mapping[str, Any] | None = None) -> None:
    """The plan file: the plan's YAML with its `plan:` record (source, rewrites, times, MPS settings, layout)
    and a header saying the same; checked to validate (a plan that does not is rose's bug), written atomically."""
    from rose_dsl import WorkflowError, load_workflow_text
    from rose_dsl.serialize import to_yaml
    from rose_dsl.transforms.plan_check import recorded_source

    quotas = (stage2.quotas if stage2 else None) or {}
    priorities = (stage2.priorities if stage2 else None) or {}
    meta: dict[str, Any] = {"source": recorded_source(file, output), "rewrites": list(result.requests),
                            "written_by": "rose optimize", "baseline_iteration_s": round(result.baseline.median, 6),
                            "plan_iteration_s": round(result.final.median, 6)}
    if quotas:
        meta["mps_quota"] = dict(quotas)
    if priorities:
        meta["mps_priority"] = dict(priorities)
    if layout:  # (the plan's params hold these values: `rose execute FILE --plan` checks it against FILE with them)
        meta["layout"] = dict(layout)
    lines = [f"#   {r}" for r in result.requests] or ["#   (no rewrite: the declared graph was fastest)"]
    lines += [f"#   layout {k} = {v}" for k, v in (layout or {}).items()]
    header = "\n".join([f"# plan written by `rose optimize` from {file}", *lines,
                        *[f"#   mps_quota {c} = {q}%" for c, q in quotas.items()],
                        *[f"#   mps_priority {c} = {p} (below normal)" for c, p in priorities.items()]])
    text = to_yaml(plan, plan=meta, header=header)
    try:
        load_workflow_text(text, str(output))
    except WorkflowError as exc:  # a bug: a plan the optimizer built does not validate
        raise RuntimeError(f"the optimized plan does not validate (a bug in rose):\n{exc.format()}") from None
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(output.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(output)


def _hand_over(plan: Workflow, wf: Workflow, opts: OptimizeOptions, session: MeasuringSession, gpu: Gpu,
               running: dict[str, Mps], log: Log, stop: Stop) -> tuple[bool, Path | None]:
    """(whether training goes on, the checkpoint written): with --train, every process moved to the plan's
    MPS settings (`settle`) -- a process that cannot move ends that, and the hand-over checkpoint is written
    as without --train; otherwise (or stopped) the checkpoint `rose execute --resume` continues from."""
    from ..backends import CallFailed

    t = time.perf_counter()
    train = opts.train and not stop() and session.k < (wf.root.count or 1)  # (stopped: checkpoint, as without)
    if train:
        try:
            session.books.settled = len(settle(plan, running, session, gpu))
        except CallFailed as exc:  # a process could not move: no training goes on, the hand-over as without
            log(f"cannot go on training ({exc}); writing the checkpoint to resume from instead")
            train = False
        session.books.settle_s = time.perf_counter() - t
    if train:
        return True, None
    t = time.perf_counter()
    ckpt = session.finish(opts.output.name)
    session.books.checkpoint_s = time.perf_counter() - t  # the hand-over to `rose execute --resume`
    return False, ckpt


def _report_doc(wf: Workflow, result: Stage1Result, session: MeasuringSession, total: float, opts: OptimizeOptions,
                run_dir: Path | None, settings: Settings, backend: str, stage2: Stage2Record, machine: dict[str, Any],
                trains_on: bool = False) -> dict[str, Any]:
    bound: dict[str, Any] | None
    try:
        bound = reorder_bound(wf, result.baseline_runs)
    except Exception as exc:  # noqa: BLE001 - an estimate for the report must not cost the plan and the report
        bound = {"error": f"{type(exc).__name__}: {exc}"}
    return build_report(result, books=session.sync_books(), total_s=total, workflow=wf.name, file=str(opts.file),
                        settings=asdict(settings), machine=machine, stage2=stage2, plan_file=str(opts.output),
                        run_dir=str(run_dir) if run_dir else None, activity_kind=session.activity_kind, bound=bound,
                        trains_on=trains_on, metric_notes=session.executor.metric_notes(), source_args=opts.source_args)


def _write_report(doc: dict[str, Any], result: Stage1Result, layout_section: dict[str, Any] | None,
                  opts: OptimizeOptions, stop: Stop) -> None:
    if layout_section is not None:
        doc["layout"] = layout_section
    if stop():
        doc["interrupted"] = stop()  # the signal that ended the run early (what was measured is all here)
    panels = [(name, run) for name, run in (("declared", _typical(result.baseline_runs)),
                                            ("plan", _typical(result.final_runs))) if run is not None]
    write_report(doc, opts.report_dir, panels)


def _typical(runs: Sequence[IterationRun]) -> IterationRun | None:
    """The run to draw: the median one (a typical iteration)."""
    if not runs:
        return None
    ordered = sorted(runs, key=lambda r: r.seconds)
    return ordered[len(ordered) // 2]
