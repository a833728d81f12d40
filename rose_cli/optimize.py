"""`rose optimize FILE -o PLAN.yaml`: profile real iterations, search rewrites (stage 1) and MPS quotas
(stage 2), write the plan, the report and a checkpoint of the training done on the way.

This module turns the options into `OptimizeOptions` and hands them to the one driver,
`interpreter.optimize.optimize`, which runs the whole optimizer (the search, `rose_dsl.optimizer`; the
measuring side beside the driver); it decides nothing itself. It checks what only the options can get
wrong (`--stage1`, `--layout`, the trust policy) before anything starts; implements the driver's `Host`
with `rose execute`'s pieces (`rose_cli.run`: `prepare` for the run directory rules, `gpu_session` for
the MPS daemon and SM sampling, `start_trial_session`, `progress_log`) and its own signal handler
(`GracefulStop`); runs it under `guarded` (the exit-code table, the one teardown); and shows the summary
and `--train`'s progress. What it writes, and never clobbers without `--overwrite`: the plan (`-o`), the
report directory (`--report`, default `PLAN_report/`) and the run directory of the iterations it trained
(`--out`, default `REPORT/run/`, with `rose execute --out`'s rules).

Exit codes (`rose_dsl.cli.ExitCode`): 0 done, 1 internal error, 2 invalid input (workflow, options, an
output that would be overwritten, a budget too small for the reference profile), 3 a component failed,
4 the watchdog fired, 5 a checkpoint could not be written, 130 interrupted.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, ExitStack
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
from rose_dsl.ir import Component, Workflow
from rose_dsl.trust import TrustPolicy, check_trust

from .execute import BackendName, FollowLinksOpt, refuse_linked_dir
from .machine import machine_info

if TYPE_CHECKING:
    from interpreter.optimize import Gpu, Layout, MeasuringSession, OptimizeOptions, Outcome

    from .run import ExecuteOptions, RunContext

Log = Callable[[str], None]  # (a progress line)

__all__ = ["register", "optimize", "OptimizeOptions", "optimize_workflow", "Stage2Kinds", "GracefulStop", "Stopped"]


def __getattr__(name: str) -> Any:
    """`OptimizeOptions` is the driver's (`interpreter.optimize`), loaded on first use: importing this module
    (every `rose` command does, to register it) starts no runtime import (`rose validate` loads none)."""
    if name == "OptimizeOptions":
        from interpreter.optimize import OptimizeOptions

        return OptimizeOptions
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
RoundsOpt = Annotated[int, typer.Option("--rounds", min=1, help="rounds of graph optimization that keep a change (R); a round that keeps nothing is followed by one for the promising candidates it left untried")]
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
def _percent(value: str | None) -> float | None:
    """`--max-overhead 2%` (or `2`): a share of the run, 0 < P < 100."""
    if value is None:
        return None
    text = value.strip().removesuffix("%")
    try:
        share = float(text) / 100
    except ValueError:
        raise typer.BadParameter(f"a percentage of the run's time, e.g. 2%, not {value!r}") from None
    if not 0.0 < share < 1.0:  # (also refuses nan)
        raise typer.BadParameter(f"must be more than 0% and less than 100% of the run's time, not {value!r}")
    return share


MaxOverheadOpt = Annotated[str | None, typer.Option(
    "--max-overhead", help="with --train: go on searching for the whole run -- when the plan's iteration times "
         "drift, search again and switch plans -- spending at most this share of the run's time on "
         "candidates that lose (e.g. 2%; docs/optimizer.md)")]
ResumeOpt = Annotated[bool, typer.Option(
    "--resume", help="with --train --max-overhead: continue such a run in --out from its last checkpoint, on the "
         "plan -o names (the one it was on), with the search's state it kept (no first search)")]
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
             checkpoint_every: CheckpointEveryOpt = 0, max_overhead: MaxOverheadOpt = None,
             resume: ResumeOpt = False, overwrite: OverwriteOpt = False,
             follow_links: FollowLinksOpt = False, address: AddressOpt = None,
             call_timeout: CallTimeoutOpt = 900.0, allow_module: AllowModuleOpt = None, allow_env: AllowEnvOpt = None,
             allow_path: AllowPathOpt = None, mps: MpsOpt = True, compiled: CompiledOpt = True, quiet: QuietOpt = False,
             layout: LayoutOpt = None, sets: SetOpt = None) -> None:
    """Find a faster plan for a workflow by measuring it: rewrites that overlap work (stage 1), then the
    MPS quota of the process with slack (stage 2). Writes the plan, a report, and a checkpoint."""
    if checkpoint_every and not train:
        err.print("error: --checkpoint-every applies to the training that --train goes on with; rose optimize "
                  "alone writes one checkpoint, at its end", markup=False)
        raise typer.Exit(ExitCode.INVALID)
    share = _max_overhead(max_overhead, train, stage1, layout)
    if resume and share is None:
        err.print("error: --resume continues a run of rose optimize --train --max-overhead P (give both); to "
                  "continue training on a plan, use rose execute FILE --plan PLAN --out RUN --resume", markup=False)
        raise typer.Exit(ExitCode.INVALID)
    wf = load_or_exit(file, sets)
    policy = TrustPolicy.from_options(allow_module, allow_env, allow_path)
    report_problems(wf, check_trust(wf, policy), "(the workflow asks to run code the command line did not allow)")
    given = None if stage1 is None else _given_stage1(file, stage1, wf, policy, sets)
    resumed = _resumed_plan(file, output, out_dir, wf, policy, sets) if resume else None
    layouts = _layouts(file, wf, sets, layout or [], given is not None)

    from interpreter.backends import default_backend
    from interpreter.optimize import OptimizeOptions

    from .run import TRIAL_MODULES, ExecuteOptions

    report_dir = report or output.with_name(output.stem + "_report")
    refuse_linked_dir(report_dir, "--report", follow_links)
    auto = "ray" if layouts else default_backend(wf)  # (a layout's processes are replicas: Ray's)
    run = ExecuteOptions(backend=auto if backend is BackendName.AUTO else backend.value,
                         out_dir=out_dir or report_dir / "run", overwrite=overwrite, follow_links=follow_links,
                         address=address, resume=resume,
                         call_timeout=call_timeout, allowed=(*policy.modules, *TRIAL_MODULES), mps=mps, quiet=quiet,
                         compiled=compiled)
    opts = OptimizeOptions(file=file, output=output, report_dir=report_dir, budget_s=budget_s, rounds=rounds,
                           top_k=top_k, alternatives=alternatives, local_max_fraction=local_max_fraction, quota=quota,
                           stage2=stage2.value, stage1=given, layouts=tuple(layouts), train=train,
                           checkpoint_every=checkpoint_every, max_overhead=share or 0.0, resume_plan=resumed,
                           sets=tuple(sets or ()))
    raise typer.Exit(optimize_workflow(wf, opts, run, out, err))


def _max_overhead(value: str | None, train: bool, stage1: Path | None, layout: list[str] | None) -> float | None:
    """`--max-overhead`'s share, checked against the options it needs and those it cannot go with; exit 2."""
    try:
        share = _percent(value)
    except typer.BadParameter as exc:
        err.print(f"error: --max-overhead: {exc}", markup=False)
        raise typer.Exit(ExitCode.INVALID) from None
    problem = None
    if share is not None and not train:
        problem = "--max-overhead bounds the searches during the training that --train goes on with: add --train"
    elif share is not None and stage1 is not None:
        problem = "--max-overhead searches the graph again on drift; --stage1 fixes the graph: use one or the other"
    elif share is not None and layout:
        problem = "--max-overhead searches the graph again on the chosen layout; it does not go with --layout yet"
    if problem:
        err.print(f"error: {problem}", markup=False)
        raise typer.Exit(ExitCode.INVALID)
    return share


def _resumed_plan(file: Path, output: Path, out_dir: Path | None, wf: Workflow, policy: TrustPolicy,
                  sets: list[str] | None) -> Workflow:
    """`--resume`: the plan the run was on (-o, as the run rewrote it), checked against FILE; exit 2 otherwise."""
    if out_dir is None:
        err.print("error: --resume needs the run directory of the run to continue: --out RUN", markup=False)
        raise typer.Exit(ExitCode.INVALID)
    if not output.is_file():
        err.print(f"error: --resume: -o {output} does not exist; name the plan file the run wrote (it is rewritten "
                  "at every switch)", markup=False)
        raise typer.Exit(ExitCode.INVALID)
    plan = load_or_exit(output, None, source=file, source_sets=sets)
    report_problems(plan, check_trust(plan, policy), "(the plan asks to run code the command line did not allow)")
    return plan


def _given_stage1(file: Path, stage1: Path, wf: Workflow, policy: TrustPolicy, sets: list[str] | None) -> Workflow:
    """`--stage1`: the plan, checked to compute what FILE computes, under FILE's MPS settings, and to run only
    code the command line allowed; exit 2 otherwise."""
    from .compare import same_computation

    given = load_or_exit(stage1, None, source=file, source_sets=sets)  # (a plan may not raise its source's budget)
    diffs = same_computation(wf, given)
    if diffs:
        err.print(f"error: --stage1 {stage1} does not compute what {file} computes (with these --set values): "
                  + "; ".join(diffs[:4]), markup=False)
        raise typer.Exit(ExitCode.INVALID)
    from interpreter.optimize import mps_changes

    moved = mps_changes(wf, given)
    if moved:
        err.print(f"error: --stage1 {stage1} runs processes under other MPS settings than {file} ({'; '.join(moved)}): "
                  "--stage1 takes stage 1's graph (an earlier report's stage1.yaml), and stage 2 chooses the "
                  "quotas and priorities", markup=False)
        raise typer.Exit(ExitCode.INVALID)
    report_problems(given, check_trust(given, policy), "(the plan asks to run code the command line did not allow)")
    return given


def _layouts(file: Path, wf: Workflow, sets: list[str] | None, options: list[str], with_stage1: bool) -> list[Layout]:
    """The `--layout` values to try, each checked (the search's `layouts`); exit 2 on a bad option."""
    if not options:
        return []
    from interpreter.optimize import layouts, parse_layout_option
    from rose_dsl.cli import layout_loader

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



# --- the run ---------------------------------------------------------------------------------------------
def optimize_workflow(wf: Workflow, opts: OptimizeOptions, run: ExecuteOptions, out: Console, err: Console) -> int:
    """Optimize `wf` with the run options `run`; the exit code. Everything started is stopped on every path
    (`rose_cli.run.guarded`: one teardown, the exit-code table, with the driver's failures first)."""
    from interpreter.optimize import CannotOptimize, OutOfBudget

    from .run import guarded

    def budget(exc: BaseException, ctx: RunContext) -> None:
        ctx.err.print(f"error: {exc}; raise --budget-s or the workflow's iteration count", markup=False)

    # (a candidate plan that fails loses its trial, not the run: only the declared workflow's failures end it)
    def stopped(exc: BaseException, ctx: RunContext) -> None:
        ctx.err.print(f"interrupted: {exc}", markup=False)

    def refused(exc: BaseException, ctx: RunContext) -> None:
        ctx.err.print(f"error: {exc}", markup=False)

    return guarded(lambda teardown, ctx: _run(wf, opts, teardown, ctx, out), run, err,
                   ((OutOfBudget, ExitCode.INVALID, budget), (Stopped, ExitCode.INTERRUPTED, stopped),
                    (CannotOptimize, ExitCode.INVALID, refused)))


def _run(wf: Workflow, opts: OptimizeOptions, teardown: ExitStack, ctx: RunContext, out: Console) -> None:
    """The driver's run (`interpreter.optimize.optimize`), then what the command shows: the summary, a stop
    said as exit 130, and `--train`'s training with its progress."""
    from interpreter.optimize import optimize as optimize_run

    outcome = optimize_run(wf, opts, _CommandHost(ctx, teardown, out))
    total = outcome.workflow.root.count or 1
    left = total - outcome.session.k
    if outcome.resumed is None:  # (a resumed run has no first search to sum up)
        _summary(out, outcome.report, opts, outcome.run_dir, left)
    if opts.train and left <= 0:  # (issue 59: --train said nothing, and the command it printed trained 0 iterations)
        ctx.err.print(f"note: --train: nothing left to train with the plan: the search trained all {total} of the "
                      "workflow's iterations (give more, e.g. --set iterations=N)", markup=False)
    reason = outcome.stop()
    if reason:
        raise Stopped(f"{reason}: the plan and {opts.report_dir / 'report.md'} hold what was measured before it")
    if outcome.trains_on:
        _train_on(outcome, opts, ctx.opts, out, ctx.err)


class _CommandHost:
    """The driver's `Host` for `rose optimize`: `rose execute`'s pieces (`rose_cli.run`) on this command's
    run options, consoles and teardown."""

    def __init__(self, ctx: RunContext, teardown: ExitStack, out: Console) -> None:
        self.ctx, self.teardown, self.out = ctx, teardown, out

    @property
    def run(self) -> ExecuteOptions:
        return self.ctx.opts

    def prepare(self, wf: Workflow) -> None:
        from .run import prepare

        prepare(wf, self.run, self.teardown, self.ctx.err)

    def gpu_session(self, wf: Workflow) -> AbstractContextManager[Gpu]:
        from .run import gpu_session

        return gpu_session(wf, self.run, self.ctx.err)

    def start_session(self, wf: Workflow, gpu: Gpu, copies: Mapping[str, Component], log: Log,
                      started: float) -> MeasuringSession:
        from .run import Gpu as RunGpu
        from .run import start_trial_session

        assert isinstance(gpu, RunGpu)  # (the one `gpu_session` gave)
        session: MeasuringSession = start_trial_session(wf, self.run, gpu, self.ctx, self.teardown, dict(copies), log,
                                                        started=started)
        return session

    def progress_log(self, deadline: float | None) -> AbstractContextManager[Log]:
        from .run import progress_log

        log: AbstractContextManager[Log] = progress_log(self.out, self.run.quiet, deadline)
        return log

    def stop_on_signal(self, log: Log) -> GracefulStop:
        return GracefulStop(log)

    def machine(self, backend: str) -> dict[str, Any]:
        return machine_info(backend)


class Stopped(Exception):
    """`rose optimize` was stopped by a signal and wrote what it had measured (exit 130)."""


class GracefulStop:
    """The first SIGINT or SIGTERM (Ctrl-C, `timeout`, a scheduler's pre-emption) asks the optimizer to
    stop at its next decision point as a spent budget would: the measurement in progress ends, no new
    one starts, and the plan, the report and the checkpoint are written with what was measured. A second
    signal, a second or more later, stops at once (KeyboardInterrupt: the usual teardown, nothing written). Calling the object
    gives the reason to stop, or None. Why: on the H200 a `timeout` twice killed a run minutes into its
    measurements and nothing of them was left."""

    def __init__(self, log: Log) -> None:
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


def _train_on(outcome: Outcome, opts: OptimizeOptions, run: ExecuteOptions, out: Console, err: Console) -> None:
    """`--train`: the plan's iterations from where the optimizer's training ended to the last, in the same
    processes (`TrialSession.train_on`), shown as `rose execute` shows them."""
    from rose_dsl.analysis import iterations_in_flight

    from . import report
    from .run import iteration_progress

    plan, iterations, session, stop = outcome.plan, outcome.workflow.root.count or 1, outcome.session, outcome.stop
    report.checkpoint_drains(err, iterations_in_flight(plan), opts.checkpoint_every)
    first, t = session.k, time.perf_counter()
    if outcome.resumed is not None:  # (about: the checkpoint's iteration is the runner's to find)
        first = int(outcome.resumed["iteration"])
    progress, _, on_iteration = iteration_progress(out, plan.name, iterations, run.quiet, completed=first)
    if outcome.resumed is not None:
        out.print(f"resuming the run in {run.out_dir} from its last checkpoint, on "
                  f"{'; '.join(outcome.resumed['plan_requests']) or 'the declared graph'}", markup=False)
    else:
        out.print(f"training goes on with the plan in the same processes: iterations {first}..{iterations - 1}",
                  markup=False)
    with progress:
        if opts.max_overhead > 0:  # the search goes on: drift -> search again -> switch (`keep_optimizing`)
            from interpreter.optimize import keep_optimizing

            rec = keep_optimizing(outcome, opts, lambda m: out.print(m, markup=False), opts.checkpoint_every,
                                  on_iteration)
            plan = rec.plan
            switches = sum(1 for e in rec.events if e["event"] == "switch")
            ov = rec.overhead
            out.print(f"searches after the first: {ov['searches']}, switches: {switches}, ending on "
                      f"{'; '.join(rec.requests) or 'the declared graph'}; overhead {ov['spent_s']:.1f} s = "
                      f"{ov['share']:.2%} of {ov['elapsed_s']:.0f} s (at most {opts.max_overhead:.1%})", markup=False)
        else:
            session.train_on(plan, iterations, opts.checkpoint_every, on_iteration, stop)
    results = session.k - first
    out.print(f"done: {results} iterations of the plan in {time.perf_counter() - t:.1f} s; outputs in "
              f"{run.out_dir}", markup=False)
    if stop():
        raise Stopped(f"{stop()}: training stopped after iteration {session.k - 1}; "
                      + (f"resume: rose optimize {opts.source_args} -o {opts.output} --out {run.out_dir} --train "
                         f"--max-overhead {opts.max_overhead * 100:.4g}% --resume" if opts.max_overhead > 0 else
                         f"resume: rose execute {opts.source_args} --plan {opts.output} --out {run.out_dir} --resume"))


def _summary(out: Console, doc: dict[str, Any], opts: OptimizeOptions, run_dir: Path | None, left: int = 1) -> None:
    """What the run found and wrote; `left`: the workflow's iterations not trained yet (none: the command to continue
    training names a new total, `-n`, since `--resume` alone would train 0 iterations)."""
    from interpreter.optimize import headline

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
        link = " --follow-links" if run_dir.is_symlink() else ""  # (else the command would be refused)
        more = "" if left > 0 else " -n N (the workflow's iterations are all trained: N, a new total)"
        out.print(f"continue training: rose execute {opts.source_args} --plan {opts.output} --out {run_dir}{link} "
                  f"--resume{more}", markup=False)


if __name__ == "__main__":  # `python -m rose_cli.optimize` for a quick run without the rose command
    app = typer.Typer(add_completion=False)
    register(app)
    sys.exit(app())
