"""`rose optimize FILE -o PLAN.yaml`: profile real iterations, search rewrites (stage 1) and MPS quotas
(stage 2), write the plan, the report and a checkpoint of the training done on the way.

This module wires the pure search (`rose_dsl.optimizer`) to the runtime's measuring side
(`interpreter.trials`) and shows progress; it decides nothing itself. It follows `rose execute`'s
conventions and uses its pieces (`rose_cli.run`): the trust policy checked before anything starts;
`prepare` (the run directory rules), `gpu_session` (MPS daemon, SM sampling) and `build_backend` for
the set-up; `guarded` for the exit-code table and the one teardown. What it writes, and never clobbers
without `--overwrite`: the plan (`-o`), the report directory (`--report`, default `PLAN_report/`) and the
run directory of the iterations it trained (`--out`, default `REPORT/run/`, with `rose execute --out`'s
rules).

Exit codes (`rose_dsl.cli.ExitCode`): 0 done, 1 internal error, 2 invalid input (workflow, options, an
output that would be overwritten, a budget too small for the reference profile), 3 a component failed,
4 the watchdog fired, 5 a checkpoint could not be written, 130 interrupted.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

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
from rose_dsl.ir import Workflow
from rose_dsl.trust import TrustPolicy, check_trust

from .execute import BackendName
from .machine import machine_info

if TYPE_CHECKING:
    from rose_dsl.optimizer.records import Stage2Record

    from .run import Gpu, RunContext

__all__ = ["register", "optimize", "OptimizeOptions", "optimize_workflow", "Stage2Kinds"]


class Stage2Kinds(StrEnum):
    """What stage 2 tries for the GPU processes with slack (`--stage2`)."""

    BOTH = "both"
    QUOTAS = "quotas"
    PRIORITIES = "priorities"


def register(app: typer.Typer) -> None:
    app.command(name="optimize")(optimize)


def _positive(value: float | None) -> float | None:
    if value is not None and not value > 0:  # also refuses nan
        raise typer.BadParameter(f"must be more than 0 seconds, not {value}")
    return value


def _fraction(value: float) -> float:
    if not 0.0 <= value <= 1.0:  # also refuses nan (click's min/max let it pass to a wrong message)
        raise typer.BadParameter(f"must be a share of an iteration from 0 to 1, not {value}")
    return value


# the options, one type each (the search's, stage 2's, the outputs', how it runs); `OptimizeOptions` and
# `ExecuteOptions` carry them past the command function
OutputOpt = Annotated[Path, typer.Option("--output", "-o", dir_okay=False, help="write the plan here")]
ReportOpt = Annotated[Path | None, typer.Option("--report", file_okay=False, help="report directory (default: PLAN_report next to the plan)")]
BudgetOpt = Annotated[float | None, typer.Option("--budget-s", callback=_positive, help="stop searching after this many seconds")]
RoundsOpt = Annotated[int, typer.Option("--rounds", min=1, help="rounds of graph optimization (R)")]
TopKOpt = Annotated[int, typer.Option("--top-k", min=1, help="targets per round (K)")]
AlternativesOpt = Annotated[int, typer.Option("--alternatives", min=1, help="alternatives measured per target (L)")]
LocalMaxOpt = Annotated[float, typer.Option(
    "--local-max-fraction", callback=_fraction, help="a comparison graph estimated at this share of an iteration or more is measured by complete "
         "iterations (retained training) instead of a local trial on snapshots (pure overhead); 1 keeps "
         "every such graph local")]
LayoutOpt = Annotated[list[str] | None, typer.Option(
    "--layout", help="NAME=V1,V2,...: a workflow param that changes only how many processes a component runs "
         "as and their arguments (e.g. sim_replicas=1,2,4: simulator processes); each value is "
         "measured on complete iterations before stage 1 and the fastest kept (repeatable; "
         "docs/optimizer.md)")]
Stage1Opt = Annotated[Path | None, typer.Option("--stage1", exists=True, dir_okay=False, readable=True,
                                                help="skip the graph search: this plan of FILE (e.g. an earlier "
                                                     "run's stage1.yaml) is the graph; measure it against FILE, "
                                                     "then tune quotas on it with the whole budget")]
QuotaOpt = Annotated[bool, typer.Option("--quota/--no-quota", help="stage 2: tune the MPS quota of the process with slack")]
Stage2Opt = Annotated[Stage2Kinds, typer.Option("--stage2", case_sensitive=False, help="what stage 2 tries for the processes with slack: lower MPS "
                                                     "quotas, a below-normal MPS client priority, or both")]
OutDirOpt = Annotated[Path | None, typer.Option("--out", file_okay=False, help="run directory for the training done while optimizing "
                                                     "(default: REPORT/run)")]
TrainOpt = Annotated[bool, typer.Option("--train", help="then go on training with the plan in the same processes to the "
                                             "workflow's last iteration (rose execute's outputs in --out): no "
                                             "second start-up, no hand-over checkpoint")]
CheckpointEveryOpt = Annotated[int, typer.Option("--checkpoint-every", min=0, help="with --train: checkpoint every N iterations (0: never)")]
OverwriteOpt = Annotated[bool, typer.Option("--overwrite", help="replace the plan, report and run directory of an earlier "
                                                 "rose optimize")]
BackendOpt = Annotated[BackendName, typer.Option("--backend", help="local (threads in this process) or ray (one actor per "
                                                      "component); auto: ray for workflows with GPU components or "
                                                      "replicas, local otherwise")]
AddressOpt = Annotated[str | None, typer.Option("--address", help="join this Ray cluster instead of starting one")]
CallTimeoutOpt = Annotated[float, typer.Option("--call-timeout", callback=_positive, help="watchdog: seconds an iteration's calls may take")]
MpsOpt = Annotated[bool, typer.Option("--mps/--no-mps", help="run GPU components under NVIDIA MPS with their quotas")]
CompiledOpt = Annotated[bool, typer.Option("--compiled/--no-compiled", help="ray: compile each iteration into a Ray Compiled Graph")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="no progress lines")]


def optimize(file: FileArg, output: OutputOpt, report: ReportOpt = None, backend: BackendOpt = BackendName.AUTO,
             budget_s: BudgetOpt = None, rounds: RoundsOpt = 2, top_k: TopKOpt = 3, alternatives: AlternativesOpt = 4,
             local_max_fraction: LocalMaxOpt = 0.4, quota: QuotaOpt = True, stage2: Stage2Opt = Stage2Kinds.BOTH,
             stage1: Stage1Opt = None, out_dir: OutDirOpt = None, train: TrainOpt = False,
             checkpoint_every: CheckpointEveryOpt = 0, overwrite: OverwriteOpt = False, address: AddressOpt = None,
             call_timeout: CallTimeoutOpt = 900.0, allow_module: AllowModuleOpt = None, allow_env: AllowEnvOpt = None,
             allow_path: AllowPathOpt = None, mps: MpsOpt = True, compiled: CompiledOpt = True, quiet: QuietOpt = False,
             layout: LayoutOpt = None, sets: SetOpt = None) -> None:
    """Find a faster plan for a workflow by measuring it: rewrites that overlap work (stage 1), then the
    MPS quota of the process with slack (stage 2). Writes the plan, a report, and a checkpoint."""
    if checkpoint_every and not train:
        err.print("error: --checkpoint-every applies to the training that --train goes on with; rose optimize "
                  "alone writes one checkpoint, at its end", markup=False)
        raise typer.Exit(ExitCode.INVALID)
    wf = load_or_exit(file, sets)
    policy = TrustPolicy.from_options(allow_module, allow_env, allow_path)
    report_problems(wf, check_trust(wf, policy), "(the workflow asks to run code the command line did not allow)")
    given = None if stage1 is None else _given_stage1(file, stage1, wf, policy)
    layouts = _layouts(file, wf, sets, layout or [], given is not None)

    from interpreter.backends import default_backend

    from .run import TRIAL_MODULES, ExecuteOptions

    report_dir = report or output.with_name(output.stem + "_report")
    auto = "ray" if layouts else default_backend(wf)  # (a layout's processes are replicas: Ray's)
    run = ExecuteOptions(backend=auto if backend is BackendName.AUTO else backend.value,
                         out_dir=out_dir or report_dir / "run", overwrite=overwrite, address=address,
                         call_timeout=call_timeout, allowed=(*policy.modules, *TRIAL_MODULES), mps=mps, quiet=quiet,
                         compiled=compiled)
    opts = OptimizeOptions(file=file, output=output, report_dir=report_dir, budget_s=budget_s, rounds=rounds,
                           top_k=top_k, alternatives=alternatives, local_max_fraction=local_max_fraction, quota=quota,
                           stage2=stage2.value, stage1=given, layouts=tuple(layouts), train=train,
                           checkpoint_every=checkpoint_every)
    raise typer.Exit(optimize_workflow(wf, opts, run, out, err))


def _given_stage1(file: Path, stage1: Path, wf: Workflow, policy: TrustPolicy) -> Workflow:
    """`--stage1`: the plan, checked to compute what FILE computes, under FILE's MPS settings, and to run only
    code the command line allowed; exit 2 otherwise."""
    from .compare import same_computation

    given = load_or_exit(stage1, None, source=file)
    diffs = same_computation(wf, given)
    if diffs:
        err.print(f"error: --stage1 {stage1} does not compute what {file} computes (with these --set values): "
                  + "; ".join(diffs[:4]), markup=False)
        raise typer.Exit(ExitCode.INVALID)
    moved = mps_changes(wf, given)
    if moved:
        err.print(f"error: --stage1 {stage1} runs processes under other MPS settings than {file} ({'; '.join(moved)}): "
                  "--stage1 takes stage 1's graph (an earlier report's stage1.yaml), and stage 2 chooses the "
                  "quotas and priorities", markup=False)
        raise typer.Exit(ExitCode.INVALID)
    report_problems(given, check_trust(given, policy), "(the plan asks to run code the command line did not allow)")
    return given


def _layouts(file: Path, wf: Workflow, sets: list[str] | None, options: list[str], with_stage1: bool) -> list[Any]:
    """The `--layout` values to try, each checked (`optimizer/layouts.py`); exit 2 on a bad option."""
    if not options:
        return []
    from rose_dsl.cli import layout_loader
    from rose_dsl.optimizer.layouts import layouts, parse_layout_option

    if with_stage1:
        err.print("error: --layout and --stage1 do not go together: --stage1's plan fixes the layout", markup=False)
        raise typer.Exit(ExitCode.INVALID)
    knobs: dict[str, list[Any]] = {}
    try:
        for text in options:
            name, values = parse_layout_option(text)
            if name in knobs:
                raise ValueError(f"--layout {name} is given twice")
            knobs[name] = values
        found = layouts(wf, knobs, layout_loader(file, sets))
        # a value the workflow is not valid with is the option's fault, not a layout to skip: a typo
        # (`--layout steps=a,b`) was logged as "not tried" and the run went on, exit 0 (user-error sweep)
        invalid = next((lay for lay in found if lay.refused and lay.refused.startswith("not a valid workflow")), None)
        if invalid is not None:
            raise ValueError(f"--layout {invalid.label}: {invalid.refused}")
        return found
    except ValueError as exc:
        err.print(f"error: {exc}", markup=False)
        raise typer.Exit(ExitCode.INVALID) from None


@dataclass(frozen=True)
class OptimizeOptions:
    """What `rose optimize` adds to `rose execute`'s run options (`ExecuteOptions`)."""

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
    layouts: tuple[Any, ...] = ()  # --layout: the values to try before stage 1 (optimizer/layouts.py Layout)
    train: bool = False  # --train: training goes on with the plan in the same processes (`TrialSession.train_on`)
    checkpoint_every: int = 0  # with --train


def optimize_workflow(wf: Workflow, opts: OptimizeOptions, run: Any, out: Console, err: Console) -> int:
    """Optimize `wf` with the run options `run` (an `ExecuteOptions`); the exit code. Everything started
    is stopped on every path (`rose_cli.run.guarded`: one teardown, the exit-code table)."""
    from rose_dsl.optimizer.search import OutOfBudget

    from .run import guarded

    def budget(exc: BaseException, ctx: RunContext) -> None:
        ctx.err.print(f"error: {exc}; raise --budget-s or the workflow's iteration count", markup=False)

    # (a candidate plan that fails loses its trial, not the run: only the declared workflow's failures end it)
    def stopped(exc: BaseException, ctx: RunContext) -> None:
        ctx.err.print(f"interrupted: {exc}", markup=False)

    return guarded(lambda teardown, ctx: _run(wf, opts, teardown, ctx, out), run, err,
                   ((OutOfBudget, ExitCode.INVALID, budget), (Stopped, ExitCode.INTERRUPTED, stopped)))


# --- before anything starts ------------------------------------------------------------------------
def check_outputs(wf: Workflow, opts: OptimizeOptions, overwrite: bool) -> None:
    """Refuse (SetupError) to write over the workflow itself, or over an earlier run's plan or report
    unless `overwrite` (the run directory has `rose execute --out`'s rules, checked by `prepare`)."""
    from .run import SetupError

    if opts.output.exists() and opts.output.resolve() == opts.file.resolve():
        raise SetupError(f"-o {opts.output} is the workflow itself; write the plan to another file")
    if opts.output.exists() and opts.output.is_dir():
        raise SetupError(f"-o {opts.output} is a directory; name the plan file")
    if opts.report_dir.exists() and not opts.report_dir.is_dir():
        raise SetupError(f"--report {opts.report_dir} is a file, not a directory")
    earlier = [str(p) for p in (opts.output, opts.report_dir / "report.json") if p.exists()]
    if earlier and not overwrite:
        raise SetupError(f"{' and '.join(earlier)} already exist{'s' if len(earlier) == 1 else ''} (an earlier "
                         "rose optimize?); choose another -o/--report, or replace them with --overwrite")
    from interpreter.trials import unsupported

    problem = unsupported(wf)
    if problem:
        raise SetupError(f"{wf.file}: {problem}")


REPORT_FILES = ("report.json", "report.md", "stage1.yaml", "timeline.svg", "quota_curve.svg")


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


def _copies(wf: Workflow, backend: str, given: Workflow | None) -> dict[str, Any]:
    """The components to start besides the workflow's: on Ray (GPU processes are placed at start) the GPU
    copies a temporal split in two groups would need, or those of the given stage-1 plan (`--stage1`)."""
    from rose_dsl.optimizer.candidates import temporal_copies

    if backend != "ray" or not any(c.device == "gpu" for c in wf.components.values()):
        return {}
    copies = temporal_copies(wf, 2) if given is None else given.components
    return {n: c for n, c in copies.items() if n not in wf.components and c.device == "gpu"}


# --- the run ---------------------------------------------------------------------------------------------
class Stopped(Exception):
    """`rose optimize` was stopped by a signal and wrote what it had measured (exit 130)."""


class GracefulStop:
    """The first SIGINT or SIGTERM (Ctrl-C, `timeout`, a scheduler's pre-emption) asks the optimizer to
    stop at its next decision point as a spent budget would: the measurement in progress ends, no new
    one starts, and the plan, the report and the checkpoint are written with what was measured. A second
    signal, a second or more later, stops at once (KeyboardInterrupt: the usual teardown, nothing written). Calling the object
    gives the reason to stop, or None. Why: on the H200 a `timeout` twice killed a run minutes into its
    measurements and nothing of them was left."""

    def __init__(self, log: Any) -> None:
        self.log = log
        self.reason: str | None = None
        self._first = 0.0
        self._previous: dict[int, Any] = {}

    def __call__(self) -> str | None:
        return self.reason

    def _handle(self, signum: int, frame: Any) -> None:
        now = time.monotonic()
        if self.reason is not None:
            # coreutils `timeout` signals the command and then its whole process group: one request
            # arrives twice within microseconds, so a repeat within a second is the same request
            if now - self._first > 1.0:
                raise KeyboardInterrupt
            return
        self._first = now
        self.reason = f"stopped by {signal.Signals(signum).name}"
        self.log(f"{self.reason}: ending the measurement in progress, then writing the plan and the report "
                 f"(send it again to stop at once)")

    def __enter__(self) -> GracefulStop:
        if threading.current_thread() is threading.main_thread():  # signals reach the main thread only
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def _run(wf: Workflow, opts: OptimizeOptions, teardown: ExitStack, ctx: RunContext, out: Console) -> None:
    """The run, in its order: outputs checked, the GPU session, the settings and the budget, the processes
    (with the quota self-check beside their start-up), layouts and stage 1, stage 2, the plan, the
    hand-over (a checkpoint, or training going on), the report."""
    from .run import gpu_session, prepare, progress_log

    started = time.perf_counter()
    run = ctx.opts
    check_outputs(wf, opts, run.overwrite)
    prepare(wf, run, teardown, ctx.err)
    if run.overwrite:
        clear_report(opts.report_dir)  # the schedule, replicas, the cluster address, the run directory (cleared with --overwrite)
    gpu = teardown.enter_context(gpu_session(wf, run, ctx.err))
    quota_stage = stage2_skipped(wf, opts.quota, run.backend, gpu) is None
    settings, budget = _settings_and_budget(opts, quota_stage, started)
    prefetch = _prefetch(wf, opts, run, gpu, settings) if quota_stage else None
    with progress_log(out, run.quiet, budget.deadline) as log:  # (shows the budget left)
        session = _start(wf, opts, run, gpu, ctx, teardown, log, started, prefetch)
        stop = teardown.enter_context(GracefulStop(log))  # after Ray's start: its handlers are replaced
        wf, layout_section, result = _search(wf, opts, session, settings, budget, log, stop)
        session.join_pending()  # (stage 1 measured nothing: stage 2's checks find the prefetch's verdicts)
        running: dict[str, Any] = {}  # the MPS settings stage 2 left each process under
        stage2 = _stage2(wf, result, session, gpu, opts, run.backend, settings, log, budget, stop, running)
        plan = stage2.plan or result.plan
        chosen = (layout_section or {}).get("chosen")
        # a run that fails from here on (the hand-over checkpoint, the report) leaves no plan: one was taken
        # for a result and blocked the re-run without --overwrite (issue 42)
        finished: list[bool] = []
        teardown.callback(_unless_finished, [opts.output, opts.report_dir / "stage1.yaml"], finished)
        _write_plan(plan, opts.output, opts.file, result, stage2, chosen)
        # the graph of stage 1 alone (the paper table's `stage1` / `stage1_mps` rows)
        _write_plan(result.plan, opts.report_dir / "stage1.yaml", opts.file, result, None, chosen)
        train, ckpt = _hand_over(plan, wf, opts, session, gpu, running, log, stop)
    run_dir = run.out_dir if ckpt else None
    doc = _report_doc(wf, result, session, time.perf_counter() - started, opts, run_dir, settings, run.backend, stage2,
                      trains_on=train)
    _write_report(doc, result, layout_section, opts, stop)
    finished.append(True)
    _summary(out, doc, opts, run_dir)
    if stop():
        raise Stopped(f"{stop()}: the plan and {opts.report_dir / 'report.md'} hold what was measured before it")
    if train:
        _train_on(plan, wf.root.count or 1, session, opts, run, out, ctx.err, stop)


def _settings_and_budget(opts: OptimizeOptions, quota_stage: bool, started: float) -> tuple[Any, Any]:
    """The search's `Settings` from the options, and the one `Budget` of the run, on the clock the command
    started on: with stage 2 to come, stage 1 gets its share (`Settings.stage1_share`; all of it goes to
    stage 2 with --stage1); when stage 2 will be skipped (no GPU component, no MPS, --no-quota...), all."""
    from rose_dsl.optimizer.budget import Budget
    from rose_dsl.optimizer.search import Settings

    settings = Settings(top_k=opts.top_k, alternatives=opts.alternatives, rounds=opts.rounds,
                        local_max_fraction=None if opts.local_max_fraction >= 1.0 else opts.local_max_fraction)
    budget = Budget.of(opts.budget_s, started=started,
                       shares={"stage1": settings.stage1_share if quota_stage else 1.0, "layouts": settings.layout_share})
    settings.budget_s = budget.share("stage1").total_s  # (the report's settings say stage 1's share)
    return settings, budget


def _prefetch(wf: Workflow, opts: OptimizeOptions, run: Any, gpu: Gpu, settings: Any) -> Any:
    """The screening's first quota self-check (the optimizer says which levels), started now, beside the
    processes' start-up; None when stage 2 will try no quota or the checks are off."""
    if opts.stage2 not in ("both", "quotas") or not run.check_quotas:
        return None
    from interpreter.quota_trials import CheckPrefetch, quota_sms
    from rose_dsl.optimizer.stage2 import first_probe_levels

    return CheckPrefetch(gpu, lambda: first_probe_levels(wf, quota_sms()), parallel=settings.quota_parallel_checks)


def _start(wf: Workflow, opts: OptimizeOptions, run: Any, gpu: Gpu, ctx: RunContext, teardown: ExitStack, log: Any,
           started: float, prefetch: Any) -> Any:
    """The measuring session (the workflow's processes and the trial components), its set-up booked; the
    prefetched self-check is joined before the first measurement, so the warm-up iteration runs beside it."""
    from .run import start_trial_session

    session = start_trial_session(wf, run, gpu, ctx, teardown, _copies(wf, run.backend, opts.stage1), log,
                                  started=started)  # stage 1's budget and stage 2's deadline: one clock
    # what ran before and around the processes' start-up: the MPS daemon, the SM sampler, the session's own
    session.books.setup_s = max(0.0, time.perf_counter() - started - session.executor.startup_s)
    if prefetch is not None:
        since = time.perf_counter()  # (stage 1's first, untimed iteration starts now)
        session.pending.append(lambda: prefetch.wait(session.books, log, training_since=since))
    return session


def _search(wf: Workflow, opts: OptimizeOptions, session: Any, settings: Any, budget: Any, log: Any,
            stop: Any) -> tuple[Workflow, dict[str, Any] | None, Any]:
    """Layouts first, within their share of the budget from now (stage 1's rewrites then apply to the chosen
    one), then stage 1 (or the `--stage1` plan measured): the workflow trained, the layout section, stage 1's
    result."""
    from rose_dsl.optimizer.search import OutOfBudget, given_plan, optimize_graph

    layout_section = None
    if opts.layouts:
        from rose_dsl.optimizer.layout_search import choose_layout

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


def _hand_over(plan: Workflow, wf: Workflow, opts: OptimizeOptions, session: Any, gpu: Gpu,
               running: dict[str, Any], log: Any, stop: Any) -> tuple[bool, Any]:
    """(whether training goes on, the checkpoint written): with --train, every process moved to the plan's
    MPS settings (`settle`) -- a process that cannot move ends that, and the hand-over checkpoint is written
    as without --train; otherwise (or stopped) the checkpoint `rose execute --resume` continues from."""
    t = time.perf_counter()
    train = opts.train and not stop() and session.k < (wf.root.count or 1)  # (stopped: checkpoint, as without)
    if train:
        from interpreter.backends import CallFailed
        from interpreter.quota_trials import settle

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


def _write_report(doc: dict[str, Any], result: Any, layout_section: dict[str, Any] | None, opts: OptimizeOptions,
                  stop: Any) -> None:
    from rose_dsl.optimizer.report import write_report

    if layout_section is not None:
        doc["layout"] = layout_section
    if stop():
        doc["interrupted"] = stop()  # the signal that ended the run early (what was measured is all here)
    panels = [("declared", _typical(result.baseline_runs)), ("plan", _typical(result.final_runs))]
    write_report(doc, opts.report_dir, [p for p in panels if p[1] is not None])


def _train_on(plan: Workflow, iterations: int, session: Any, opts: OptimizeOptions, run: Any, out: Console,
              err: Console, stop: Any) -> None:
    """`--train`: the plan's iterations from where the optimizer's training ended to the last, in the same
    processes (`TrialSession.train_on`), shown as `rose execute` shows them."""
    from rose_dsl.analysis import iterations_in_flight

    from . import report
    from .run import iteration_progress

    report.checkpoint_drains(err, iterations_in_flight(plan), opts.checkpoint_every)
    first, t = session.k, time.perf_counter()
    progress, _, on_iteration = iteration_progress(out, plan.name, iterations, run.quiet, completed=first)
    out.print(f"training goes on with the plan in the same processes: iterations {first}..{iterations - 1}",
              markup=False)
    with progress:
        results = session.train_on(plan, iterations, opts.checkpoint_every, on_iteration, stop)
    out.print(f"done: {len(results)} iterations of the plan in {time.perf_counter() - t:.1f} s; outputs in "
              f"{run.out_dir}", markup=False)
    if stop():
        raise Stopped(f"{stop()}: training stopped after iteration {first + len(results) - 1}; "
                      f"resume: rose execute {opts.file} --plan {opts.output} --out {run.out_dir} --resume")


def _typical(runs: list[Any]) -> Any:
    """The run to draw: the median one (a typical iteration)."""
    if not runs:
        return None
    ordered = sorted(runs, key=lambda r: r.seconds)
    return ordered[len(ordered) // 2]


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


def _stage2(wf: Workflow, result: Any, session: Any, gpu: Gpu, opts: OptimizeOptions, backend: str, settings: Any,
            log: Any, budget: Any, stop: Any = None, running: dict[str, Any] | None = None) -> Stage2Record:
    """Stage 2 (the optimizer's `stage2.tune_mps`) on the runtime's `QuotaTrials`, or why it is skipped."""
    from rose_dsl.optimizer.records import Stage2Record

    skipped = stage2_skipped(wf, opts.quota, backend, gpu)
    if skipped is not None:
        return Stage2Record(skipped=skipped)
    from interpreter.quota_trials import QuotaTrials
    from rose_dsl.optimizer.stage2 import tune_mps

    if stop is not None and stop():
        return Stage2Record(skipped=stop())
    if budget.spent():
        return Stage2Record(skipped="the time budget (--budget-s) was spent by stage 1")
    trials = QuotaTrials(session, gpu, stop=stop, parallel=settings.quota_parallel_checks)
    return tune_mps(result, trials, settings, log, budget=budget, stop=stop, running=running,
                    quotas=opts.stage2 in ("both", "quotas"), priorities=opts.stage2 in ("both", "priorities"))


def _unless_finished(paths: list[Path], finished: list[bool]) -> None:
    """At teardown: remove the plans written when the run did not get to write its report (it failed)."""
    if not finished:
        for path in paths:
            path.unlink(missing_ok=True)


def _write_plan(plan: Workflow, output: Path, file: Path, result: Any, stage2: Stage2Record | None,
                layout: dict[str, Any] | None = None) -> None:
    from rose_dsl import WorkflowError, load_workflow_text
    from rose_dsl.serialize import to_yaml

    quotas = (stage2.quotas if stage2 else None) or {}
    priorities = (stage2.priorities if stage2 else None) or {}
    from rose_dsl.transforms.plan_check import recorded_source

    meta = {"source": recorded_source(file, output), "rewrites": list(result.requests), "written_by": "rose optimize",
            "baseline_iteration_s": round(result.baseline.median, 6), "plan_iteration_s": round(result.final.median, 6)}
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


def _report_doc(wf: Workflow, result: Any, session: Any, total: float, opts: OptimizeOptions, run_dir: Path | None,
                settings: Any, backend: str, stage2: Stage2Record, trains_on: bool = False) -> dict[str, Any]:
    from rose_dsl.optimizer.bound import reorder_bound
    from rose_dsl.optimizer.report import build_report

    try:
        bound = reorder_bound(wf, result.baseline_runs)
    except Exception as exc:  # noqa: BLE001 - an estimate for the report must not cost the plan and the report
        bound = {"error": f"{type(exc).__name__}: {exc}"}
    return build_report(result, books=session.sync_books(), total_s=total, workflow=wf.name, file=str(opts.file),
                        settings=asdict(settings), machine=machine_info(backend), stage2=stage2, plan_file=str(opts.output),
                        run_dir=str(run_dir) if run_dir else None, activity_kind=session.activity_kind, bound=bound,
                        trains_on=trains_on, metric_notes=_metric_notes(session))


def _metric_notes(session: Any) -> dict[str, str]:
    """How the plans' processes' metrics were merged (`Executor.metric_notes`; none from a session without one)."""
    notes = getattr(getattr(session, "executor", None), "metric_notes", None)
    return dict(notes()) if callable(notes) else {}


def _summary(out: Console, doc: dict[str, Any], opts: OptimizeOptions, run_dir: Path | None) -> None:
    from rose_dsl.optimizer.headline import headline

    ov, head = doc["overhead_s"], headline(doc)
    spreads = (f" (spreads {head['declared_spread']:.0%} / {head['plan_spread']:.0%})"
               if head.get("declared_spread") is not None and head.get("plan_spread") is not None else "")
    out.print(f"declared {head['declared_s']:.3f} s -> plan {head['plan_s']:.3f} s per iteration{spreads}: "
              f"{head['speedup']:.2f}x over {head['against']}" + ("" if head["validated"] else " -- NOT VALIDATED"),
              markup=False)
    if not head["validated"]:
        out.print(f"{head['how']}; to validate it: {head['compare']}", markup=False)
    if doc.get("with_quotas"):
        wq = doc["with_quotas"]
        out.print(f"with stage 2's {wq['label']}: ~{wq['iteration_s']:.3f} s per iteration: {wq['speedup']:.2f}x over declared "
                  f"({doc['speedup']:.2f}x times {wq['stage2_gain']:.3f}x, two interleaved comparisons chained)",
                  markup=False)
    out.print("plan: " + ("; ".join(doc["plan_requests"]) or "the declared graph"), markup=False)
    if doc.get("cut_short"):
        out.print(f"note: the search was cut short ({doc['stopped']}) before it had decided every round it began: "
                  "give it more training iterations (the workflow's iteration count, e.g. --set iterations=N) or "
                  "more time (--budget-s)", markup=False)
    if doc.get("layout"):
        out.print("layout: " + doc["layout"]["summary"], markup=False)
    if doc.get("stage2"):
        s2 = doc["stage2"]
        out.print("stage 2: " + (s2.get("summary") or f"skipped ({s2.get('skipped')})"), markup=False)
    out.print(f"optimizer time {ov['total']:.1f} s: {ov['retained_training']:.1f} s training kept, net overhead "
              f"{ov['net']:.1f} s ({ov['fraction_of_1h_net']:.2%} of a one-hour run; "
              + ("the processes' start-up is the training's own: it goes on in them)" if ov.get("trains_on") else
                 f"{ov['fraction_of_1h_net_beyond_startup']:.2%} without the processes' start-up)"), markup=False)
    report = opts.report_dir
    out.print(f"wrote {opts.output}, {report / 'report.md'} (stage 1 alone: {report / 'stage1.yaml'})", markup=False)
    if run_dir is not None:
        out.print(f"continue training: rose execute {opts.file} --plan {opts.output} --out {run_dir} --resume",
                  markup=False)


if __name__ == "__main__":  # `python -m rose_cli.optimize` for a quick run without the rose command
    app = typer.Typer(add_completion=False)
    register(app)
    sys.exit(app())
