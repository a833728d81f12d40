"""The body of `rose execute`: check what can be checked before anything starts, set up the GPU (MPS
daemon, activity sampling), build the backend, run the iterations, and report a failure as one message
with its exit code -- with ONE teardown (an `ExitStack`) on every path, the watchdog's included.

The pieces, in the order a run meets them:

* `prepare` -- the schedule, the replica mapping, the run directory rules (its lock, what is in it, the
  params a resume would change): problems are `SetupError` / `RunDirInUse` / `ParamsChanged` (exit 2)
  before a process starts;
* `gpu_session` -- a context manager: the MPS daemon and the GPU sampler, stopped when it exits;
* `build_backend` -- the one call that turns a workflow into a running backend (the runtime's backend
  factory replaces it);
* `FAILURES` -- the table of exceptions -> exit code and report, applied by `guarded`, which also holds
  the one teardown (`rose optimize` runs through the same four pieces);
* `StopOnSignal` -- `rose execute`'s SIGINT / SIGTERM: the iteration in progress ends, its checkpoint and
  the export are written, and the run exits 130 / 143 (128 + the signal), never 0.
"""

from __future__ import annotations

import os
import shlex
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from interpreter.backends import Backend, CallFailed, WatchdogTimeout, make_backend
from interpreter.checkpoint import CheckpointError
from interpreter.components import ComponentError, StartProblems
from interpreter.rundir import RunDirInUse, RunDirLock, check_out_link, check_run_dir, clear_outputs
from interpreter.runner import IterationResult, ParamsChanged, Resumed, RunConfig, Runner
from interpreter.safe_io import OutputError
from interpreter.schedule import Schedule, check_replica_edges
from interpreter.shared_process import SharedProcessError
from interpreter.until_loops import ConditionError
from rose_dsl.cli import ExitCode
from rose_dsl.ir import Workflow

from . import report

__all__ = ["ExecuteOptions", "SetupError", "Gpu", "RunContext", "execute_workflow", "guarded", "prepare", "gpu_session", "check_quotas",
           "build_backend", "FAILURES", "Failure", "TRIAL_MODULES", "progress_log", "start_trial_session",
           "StopOnSignal", "Interrupted"]


@dataclass(frozen=True)
class ExecuteOptions:
    backend: str = "local"  # "local" | "ray"
    iterations: int | None = None  # None: the workflow's count
    out_dir: Path | None = None
    checkpoint_every: int = 0
    resume: bool = False
    overwrite: bool = False
    address: str | None = None
    call_timeout: float = 900.0
    allowed: tuple[str, ...] = ()  # module prefixes, the defaults included (TrustPolicy.modules)
    mps: bool = True
    quiet: bool = False
    compiled: bool = True
    check_quotas: bool = True  # refuse MPS quotas under which this machine's GEMMs are wrong (quota_safety.py)
    loggers: tuple[str, ...] = ("tensorboard",)  # where metrics go besides metrics.jsonl (interpreter/loggers.py)
    allow_param_change: tuple[str, ...] = ()  # params `--resume` may change (`--allow-param-change`)
    export: bool = True  # the final state into `--out`'s export/ (loadable without rose)
    follow_links: bool = False  # `--follow-links`: a `--out` that is a symbolic link is written through
    trace: bool = True  # `--trace on|off`: trace.json / trace.jsonl in `--out`


class SetupError(Exception):
    """The workflow cannot run as asked (on this machine, this backend, into this run directory)."""


class LagAboveProof(Exception):
    """A learner measured an older sample than the staleness checker proves any read of the plan can see:
    the checker accepted a plan it should have refused (a bug in rose, exit 1)."""


@dataclass
class Gpu:
    """What the GPU set-up gives the backend: the device for GPU components and MPS client environments."""

    device: str = "cpu"
    daemon: Any = None
    sampler: Any = None
    mps_env: dict[str, dict[str, str]] = field(default_factory=dict)

    @property
    def quotas_work(self) -> bool:
        """An MPS daemon is up, so a process's `mps_quota` binds."""
        return self.daemon is not None and self.daemon.active

    def client_env(self, quota: int | None, priority: int | None = None) -> dict[str, str]:
        """The environment of an MPS client process under `quota` percent of the SMs, at MPS client
        `priority` (1: below normal) (quotas_work only)."""
        return self.daemon.client_env(quota, priority)


@dataclass
class RunContext:
    """What the failure reports need to know about the run they end."""

    err: Console
    opts: ExecuteOptions
    phase: str = "preparing"  # "starting components" | "running"
    backend: Backend | None = None


# --- before anything starts ------------------------------------------------------------------------
def prepare(wf: Workflow, opts: ExecuteOptions, teardown: ExitStack | None = None, err: Console | None = None) -> Schedule:
    """Everything that can be refused before a process starts; the schedule of one iteration. With
    `teardown`, the run directory is locked until it closes (`RunDirLock`) before anything in it is
    looked at or removed; `err` gets the notes (a lock taken over, files `--overwrite` left)."""
    try:
        schedule = Schedule(wf)
    except ValueError as exc:
        raise SetupError(f"{wf.file}: {exc}") from None
    counts = {c.replicas for c in wf.components.values()}
    if len(counts) > 1:  # the hybrid placement: every input must map between replica counts
        try:
            check_replica_edges(wf)
        except ValueError as exc:  # (positioned when the edge's `in:` is known)
            raise SetupError(str(exc) if str(exc).startswith(f"{wf.file}:") else f"{wf.file}: {exc}") from None
    if max(counts) > 1 and opts.backend != "ray":
        raise SetupError(f"{wf.file}: replicas: {max(counts)} needs --backend ray (one process per replica)")
    if opts.backend == "ray" and opts.address:
        _check_reachable(opts.address)
    if opts.out_dir is not None:
        _prepare_run_dir(wf, opts, teardown, err)
    return schedule


def _prepare_run_dir(wf: Workflow, opts: ExecuteOptions, teardown: ExitStack | None, err: Console | None) -> None:
    assert opts.out_dir is not None
    note = (lambda text: err.print(text, markup=False)) if err is not None else (lambda text: None)
    if opts.resume and opts.overwrite:  # (refused before the lock would create the directory)
        check_run_dir(opts.out_dir, resume=True, overwrite=True)
    check_out_link(opts.out_dir, opts.follow_links)
    if opts.out_dir.exists() and not opts.out_dir.is_dir():
        raise RunDirInUse(f"--out {opts.out_dir} is a file, not a directory")
    if teardown is not None:
        lock = teardown.enter_context(RunDirLock(opts.out_dir))
        if lock.note:
            note(lock.note)
    check_run_dir(opts.out_dir, resume=opts.resume, overwrite=opts.overwrite)
    if opts.resume:
        _check_resumed_params(wf, opts)
    if opts.overwrite:
        _, left = clear_outputs(opts.out_dir)
        if left:
            note(f"note: --overwrite removed only what rose wrote in {opts.out_dir}; it left {', '.join(left)}")


def _check_resumed_params(wf: Workflow, opts: ExecuteOptions) -> None:
    """`--resume` with other params than the newest checkpoint's is refused here, before processes start
    (the runner checks the checkpoint it loads as well)."""
    from interpreter.checkpoint import read_meta
    from interpreter.runner import check_params

    assert opts.out_dir is not None
    ckpt_dir = opts.out_dir / "checkpoints"
    for path in sorted(ckpt_dir.glob("ckpt-*"), key=lambda p: p.name, reverse=True):
        try:
            meta = read_meta(path).get("meta") or {}
        except CheckpointError:
            continue  # (the runner says why it is rejected)
        check_params(meta, wf, opts.allow_param_change, opts.out_dir)
        return


def _check_reachable(address: str) -> None:
    """A cluster address nobody answers at is refused at once: Ray would retry connecting for minutes."""
    import socket

    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit():
        return  # "auto" and other forms Ray resolves itself
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as exc:
        raise SetupError(f"--address {address}: no Ray cluster answers there ({exc.strerror or exc})") from None


def check_quotas(components: list[Any], daemon: Any, err: Console) -> None:
    """Refuse a quota below 100% under which this machine's GEMMs compute wrong values (issue 16: cuBLAS
    under MPS at some SM counts); each (machine, quota) is checked once and cached."""
    from interpreter.quota_safety import UnsafeQuota, check_quota, known_safe, machine_fingerprint

    quotas = sorted({c.mps_quota for c in components if c.mps_quota is not None and c.mps_quota < 100})
    if not quotas:
        return
    fingerprint = machine_fingerprint()
    for quota in quotas:
        err.print(f"checking GEMMs under MPS quota {quota}% on this machine (cached after the first time)", markup=False)
        verdict = check_quota(quota, daemon.client_env(quota), fingerprint=fingerprint)
        if not verdict.ok:
            raise SetupError(f"{UnsafeQuota(verdict, known_safe(fingerprint))}; or pass --no-quota-check to run anyway")


@contextmanager
def gpu_session(wf: Workflow, opts: ExecuteOptions, err: Console) -> Iterator[Gpu]:
    """The MPS daemon (when asked for) and SM-activity sampling for the GPU components, stopped on exit."""
    gpu_components = [c for c in wf.components.values() if c.device == "gpu"]
    if not gpu_components:
        yield Gpu()
        return
    import torch

    if not torch.cuda.is_available():
        names = ", ".join(c.name for c in gpu_components)
        raise SetupError(f"component(s) {names} need a GPU (device: gpu) and none is available here; use a CPU "
                         "configuration of the workflow (device: cpu)")
    from interpreter.gpu_activity import GpuActivity
    from interpreter.mps import MpsDaemon

    with ExitStack() as stack:
        gpu = Gpu(device="cuda")
        if opts.mps:
            gpu.daemon = stack.enter_context(MpsDaemon(base_dir=(opts.out_dir / "mps") if opts.out_dir else None))
            if gpu.daemon.warning:
                err.print(f"warning: {gpu.daemon.warning}", markup=False)
            if gpu.daemon.active:
                gpu.mps_env = {c.name: gpu.daemon.client_env(c.mps_quota, c.mps_priority) for c in gpu_components}
                if opts.check_quotas:
                    check_quotas(gpu_components, gpu.daemon, err)
        sampler = GpuActivity.open_all(torch.cuda.device_count())  # every GPU of this machine (NVML index)
        stack.callback(sampler.close)
        gpu.sampler = sampler if sampler.per_gpu else None  # no NVML: run without activity
        yield gpu


def build_backend(wf: Workflow, schedule: Schedule, opts: ExecuteOptions, gpu: Gpu, err: Console) -> Backend:
    """The running backend for this workflow (components constructed): the runtime's factory. With Ray,
    the iteration is compiled into a Ray Compiled Graph; when that fails, the factory prints why and
    dispatches call by call on the same processes."""
    return make_backend(opts.backend, wf, schedule, compiled=opts.compiled, address=opts.address, mps_env=gpu.mps_env,
                        device=gpu.device, allowed=opts.allowed, log=lambda line: err.print(line, markup=False))


# --- measuring plans on one set of workers (rose optimize, rose compare) --------------------------------
TRIAL_MODULES = ("interpreter.optimize.trials",)  # the trial components (`__feed__`, `__probe__`) are rose's own code


def progress_log(out: Console, quiet: bool, deadline: float | None = None) -> Any:
    """A spinner with the latest line and the budget left (`deadline`, a `time.perf_counter()` value), and
    `log(line)` that also prints the line (unless quiet): `progress.optimizer_progress`."""
    from .clock import budget_clock
    from .progress import optimizer_progress

    return optimizer_progress(out, quiet, deadline, clock=budget_clock())


def start_trial_session(wf: Workflow, opts: ExecuteOptions, gpu: Gpu, ctx: RunContext, teardown: ExitStack,
                        copies: dict[str, Any], log: Callable[[str], None], started: float | None = None) -> Any:
    """The workers of `wf` plus the trial components and `copies` (components plans add: on Ray, GPU
    processes are placed when the workers start; each copy runs under its own MPS quota), as a
    `TrialSession`; both stopped by the teardown. `started`: when the command started (`time.perf_counter()`),
    from which the session counts its elapsed time (default: now)."""
    from dataclasses import replace

    from interpreter.optimize.executor import Executor
    from interpreter.optimize.trials import TrialSession, trial_components

    extra: dict[str, Any] = dict(trial_components())
    for name, comp in copies.items():
        if name not in wf.components and name not in extra:
            extra[name] = comp
            if gpu.quotas_work:
                gpu.mps_env[name] = gpu.client_env(comp.mps_quota, comp.mps_priority)
    ctx.phase = "starting components"
    # the Executor compiles each plan it runs itself: no compiled graph of the declared workflow first
    per_call = replace(opts, compiled=False)
    executor = Executor(wf, lambda w, s: build_backend(w, s, per_call, gpu, ctx.err), compiled=opts.compiled,
                        call_timeout_s=opts.call_timeout, sampler=gpu.sampler, log=log, extra_components=extra)
    teardown.callback(executor.close)
    ctx.backend = executor.backend
    session = TrialSession(wf, executor, out_dir=opts.out_dir, gpu_sampler=gpu.sampler, log=log, started=started)
    teardown.callback(session.close)
    ctx.phase = "running"
    return session


# --- failures -> exit codes ------------------------------------------------------------------------------
def _report_setup(exc: BaseException, ctx: RunContext) -> None:
    ctx.err.print(f"error: {exc}", markup=False)


def _positioned(diagnostics: list[Any]) -> str:
    """Workflow diagnostics as `rose validate` prints them, each with its source line where the file reads."""
    from rose_dsl.errors import WorkflowError

    texts: dict[str, str] = {}
    for d in diagnostics:
        try:
            texts.setdefault(d.pos.file, Path(d.pos.file).read_text())
        except OSError:
            pass
    return WorkflowError(list(diagnostics), texts=texts).format()


def _report_start_problems(exc: BaseException, ctx: RunContext) -> None:
    """What a started component found that the user fixes in the workflow (an impl that does not import, a
    missing method...): said where, before any call (exit 2)."""
    assert isinstance(exc, StartProblems)
    ctx.err.print(_positioned(exc.diagnostics) if exc.diagnostics else f"error: {exc}", markup=False)
    ctx.err.print(exc.closing, markup=False)


def _report_condition(exc: BaseException, ctx: RunContext) -> None:
    """A loop condition that is not a done flag (`until_loops.ConditionError`): said at the `until:` (exit 2)."""
    assert isinstance(exc, ConditionError)
    ctx.err.print(_positioned(exc.diagnostics), markup=False)
    ctx.err.print(f"stopped; {kept_line(ctx.opts.out_dir)}" if ctx.opts.out_dir is not None else
                  "stopped (no --out: no checkpoint)", markup=False)


def _report_component(exc: BaseException, ctx: RunContext) -> None:
    ctx.err.print(f"error: {exc}", markup=False)
    detail = getattr(exc, "detail", "")
    if detail:
        ctx.err.print(detail.rstrip(), markup=False)
    if ctx.phase == "starting components":
        # a constructor that raised was imported and found: the check to point at is its arguments
        constructing = "constructing component" in str(exc)
        ctx.err.print("(the component's `args:` are its constructor's keyword arguments; `rose validate --import FILE` "
                      "checks them where the constructor names its parameters)" if constructing else
                      "(`rose validate --import FILE` checks every impl, called method and constructor argument "
                      "before a run)", markup=False)
    ctx.err.print(f"stopped; {kept_line(ctx.opts.out_dir)}" if ctx.opts.out_dir is not None else
                  "stopped (no --out: no checkpoint)", markup=False)


def _report_watchdog(exc: BaseException, ctx: RunContext) -> None:
    ctx.err.print(f"error: watchdog: {exc}; raise --call-timeout if this call is legitimately slow", markup=False)
    if ctx.backend is not None:
        ctx.backend.stuck = True  # the teardown must not wait for the stuck call
    report.stacks(ctx.err, getattr(exc, "stacks", {}), ctx.opts.out_dir)


def _report_checkpoint(exc: BaseException, ctx: RunContext) -> None:
    ctx.err.print(f"error: checkpoint: {exc}", markup=False)


def _report_output(exc: BaseException, ctx: RunContext) -> None:
    """A file of the run directory that could not be written (disk full, read-only, a link): what was kept."""
    ctx.err.print(f"error: writing the run directory: {exc}", markup=False)
    if ctx.opts.out_dir is not None:
        ctx.err.print(kept_line(ctx.opts.out_dir), markup=False)


def _report_interrupt(exc: BaseException, ctx: RunContext) -> None:
    """Stopped at once (a second signal, or one before `StopOnSignal` was installed): the iteration in
    progress is lost; what is kept is the last checkpoint, said by name."""
    ctx.err.print("interrupted; stopping components", markup=False)
    out_dir = ctx.opts.out_dir
    if out_dir is not None:
        ctx.err.print(kept_line(out_dir), markup=False)


def kept_line(out_dir: Path) -> str:
    """What a stopped run leaves to continue from, naming the checkpoint, or that there is none."""
    from interpreter.checkpoint import list_complete

    done = list_complete(out_dir / "checkpoints")
    if not done:
        return (f"no checkpoint in {out_dir}: it stopped before its first one (a run writes one at its end, on "
                "the first Ctrl-C or SIGTERM, and every N iterations with --checkpoint-every N)")
    return f"the last checkpoint is {done[-1]}; continue with: {resume_command(out_dir)}"


def resume_command(out_dir: Path) -> str:
    """The command line that continues this run: the user's own, with --resume (and without --overwrite)."""
    args = sys.argv[1:]
    if args[:1] != ["execute"]:  # (run from elsewhere than the `rose` command: the general form)
        link = " --follow-links" if out_dir.is_symlink() else ""  # (else the command would be refused)
        return f"rose execute FILE --out {shlex.quote(str(out_dir))}{link} --resume"
    kept = [a for a in args if a != "--overwrite"]
    return shlex.join(["rose", *kept, *([] if "--resume" in kept else ["--resume"])])


class Interrupted(Exception):
    """`rose execute` was stopped by a signal after keeping its work (exit 128 + the signal's number)."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.exit_code = 128 + signum


class SignalInterrupt(KeyboardInterrupt):
    """The second signal: stop at once (exit 128 + its number)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.exit_code = 128 + signum


class StopOnSignal:
    """The first SIGINT or SIGTERM asks the run to stop after the iteration in progress (`Runner.run`'s
    `stop`), which then writes a checkpoint of it and the export; a second one stops at once
    (`SignalInterrupt`: the iteration in progress is lost, the last checkpoint stays); later ones are said
    and ignored, so that the teardown the second one started (components, Ray, the MPS daemon) ends
    rather than being cut short and leaving processes behind. A repeat within `SAME_S` of the first is
    taken as the same request (`timeout` signals the command, then its group: one request twice), and
    said, so that a quick double Ctrl-C is never silently dropped (issue 59: one was ignored for 39 s).
    Calling the object gives the signal's number, or None. Notes are written with `os.write`: a handler
    may run inside a print, and Python's buffered streams refuse being re-entered."""

    SAME_S = 0.25
    clock = staticmethod(time.monotonic)  # (the tests' fake clock replaces it)

    def __init__(self) -> None:
        self.signum: int | None = None
        self._first = 0.0
        self._stopping = False  # the second signal came: stopping at once
        self._previous: dict[int, Any] = {}

    def __call__(self) -> int | None:
        return self.signum

    def _handle(self, signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if self._stopping:
            os.write(2, f"\n{name}: already stopping at once (ending the components)\n".encode())
            return
        if self.signum is not None:
            if self.clock() - self._first < self.SAME_S:
                os.write(2, f"\n{name} again at once: taken as the same request; send it again to stop at once\n"
                         .encode())
                return
            self._stopping = True
            raise SignalInterrupt(signum)
        self.signum, self._first = signum, self.clock()
        os.write(2, f"\n{name}: ending the iteration in progress, then writing a checkpoint "
                    "and stopping (send it again to stop at once)\n".encode())

    def install(self) -> StopOnSignal:
        """(Again after Ray's start, which sets its own handlers.)"""
        if threading.current_thread() is threading.main_thread():  # signals reach the main thread only
            for sig in (signal.SIGINT, signal.SIGTERM):
                previous = signal.signal(sig, self._handle)
                self._previous.setdefault(sig, previous)
        return self

    def __enter__(self) -> StopOnSignal:
        return self.install()

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


# first match wins; anything else is a bug (exit 1, `rose_dsl.cli.run_app`)
Failure = tuple[type[BaseException], ExitCode, Callable[[BaseException, RunContext], None]]
FAILURES: tuple[Failure, ...] = (
    (SetupError, ExitCode.INVALID, _report_setup),
    (RunDirInUse, ExitCode.INVALID, _report_setup),
    (ParamsChanged, ExitCode.INVALID, _report_setup),
    (Interrupted, ExitCode.INTERRUPTED, lambda exc, ctx: ctx.err.print(str(exc), markup=False)),
    (SharedProcessError, ExitCode.INVALID, _report_setup),
    (StartProblems, ExitCode.INVALID, _report_start_problems),
    (ConditionError, ExitCode.INVALID, _report_condition),
    (CallFailed, ExitCode.COMPONENT, _report_component),
    (ComponentError, ExitCode.COMPONENT, _report_component),
    (WatchdogTimeout, ExitCode.WATCHDOG, _report_watchdog),
    (CheckpointError, ExitCode.CHECKPOINT, _report_checkpoint),
    (OutputError, ExitCode.CHECKPOINT, _report_output),
    (KeyboardInterrupt, ExitCode.INTERRUPTED, _report_interrupt),
)


# --- the run ---------------------------------------------------------------------------------------------
def guarded(body: Callable[[ExitStack, RunContext], None], opts: ExecuteOptions, err: Console,
            failures: tuple[Failure, ...] = ()) -> int:
    """Run a command's body with one teardown and the exit-code table: the body registers everything it
    starts on the ExitStack it is given, which is closed on every path; an exception in `failures` (the
    command's own, looked up first) or `FAILURES` is reported and becomes its exit code, anything else
    is a bug and propagates (exit 1 in `run_app`)."""
    ctx = RunContext(err, opts)
    with ExitStack() as teardown:
        try:
            body(teardown, ctx)
            return ExitCode.OK
        except BaseException as exc:
            code, reporter = next(((c, r) for kind, c, r in (*failures, *FAILURES) if isinstance(exc, kind)),
                                  (None, None))
            if code is None or reporter is None:
                raise
            reporter(exc, ctx)
            code = getattr(exc, "exit_code", code)  # (a signal: 128 + its number)
            if isinstance(exc, WatchdogTimeout) and opts.backend == "local":
                # a stuck thread cannot be stopped and the interpreter would wait for it at exit: tear down
                # what can be, then leave at once
                teardown.close()
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
            return code


def iteration_progress(out: Console, name: str, total: int, quiet: bool,
                       completed: int = 0) -> tuple[Any, Any, Callable[[IterationResult], None]]:
    """The progress of a training run (`rose execute`, `rose optimize --train`): `i/N` with a time estimate
    and each iteration's metrics line (`progress.IterationProgress`): the progress (enter it around the run),
    its task, and the `on_iteration` callback that advances both."""
    from .progress import IterationProgress

    progress = IterationProgress(out, name, total, quiet, completed,
                                 line_of=lambda r: f"it {r.iteration:>4}  {report.metrics_line(r.metrics)}")
    return progress, progress.task, progress


def execute_workflow(wf: Workflow, opts: ExecuteOptions, out: Console, err: Console) -> int:
    """Run the workflow; the exit code. Everything started is stopped on every path (one ExitStack)."""
    return guarded(lambda teardown, ctx: _run(wf, opts, teardown, ctx, out), opts, err)


def _run(wf: Workflow, opts: ExecuteOptions, teardown: ExitStack, ctx: RunContext, out: Console) -> None:
    started = time.perf_counter()
    stop = teardown.enter_context(StopOnSignal())
    schedule = prepare(wf, opts, teardown, ctx.err)
    if opts.out_dir is None:  # (said now, not first at a Ctrl-C that finds nothing to keep)
        ctx.err.print("note: no --out: nothing of this run is kept (no checkpoint, metrics or export); add --out DIR "
                      "to keep them", markup=False)
    gpu = teardown.enter_context(gpu_session(wf, opts, ctx.err))
    ctx.phase = "starting components"
    be = ctx.backend = build_backend(wf, schedule, opts, gpu, ctx.err)
    teardown.callback(be.shutdown)
    stop.install()  # (Ray's start replaces the handlers)
    ctx.phase = "running"
    if opts.backend == "ray":
        report.processes(out, be)
    n = opts.iterations if opts.iterations is not None else (wf.root.count or 1)
    config = RunConfig(iterations=n, out_dir=opts.out_dir, checkpoint_every=opts.checkpoint_every,
                       resume=opts.resume, call_timeout_s=opts.call_timeout,
                       allow_param_change=opts.allow_param_change, export=opts.export,
                       tensorboard="tensorboard" in opts.loggers, loggers=opts.loggers, trace=opts.trace)
    report.checkpoint_drains(ctx.err, schedule.depth, opts.checkpoint_every)
    progress, task, on_iteration = iteration_progress(out, wf.name, n, opts.quiet)

    def on_resume(resumed: Resumed) -> None:
        report.resumed(ctx.err, resumed, n)
        progress.resumed_at(resumed.iteration + 1)

    runner = Runner(wf, be, config, schedule, on_iteration, gpu.sampler)
    runner.on_recovery = lambda rec: report.recovery(ctx.err, rec)
    runner.on_resume = on_resume
    with progress:
        results = runner.run(stop=stop)
    if runner.outputs is not None and runner.outputs.unavailable:
        ctx.err.print(f"warning: {runner.outputs.unavailable}", markup=False)
    if not opts.quiet:
        report.nodes(out, runner.node_summary())
    report.curve(out, results)
    beyond = report.staleness(out, opts.out_dir, results, wf)
    if stop() is not None:
        raise Interrupted(_stopped_line(stop() or 0, runner, opts), stop() or 0)
    if runner.last_checkpoint is not None:
        out.print(_kept(runner), markup=False)
    if beyond is not None:  # (after its work is kept) exit 1: a bug in rose, said plainly by `run_app`
        raise LagAboveProof(beyond)
    total = time.perf_counter() - started
    out.print(f"done: {len(results)} iterations in {total:.1f} s" + (f"; outputs in {opts.out_dir}" if opts.out_dir else ""),
              markup=False)


def _kept(runner: Runner) -> str:
    """Where the run's work is: its last checkpoint and the export."""
    assert runner.last_checkpoint is not None
    export = f"; final state for use without rose in {runner.exported} (docs/components.md)" if runner.exported else ""
    return f"checkpoint: {runner.last_checkpoint}{export}"


def _stopped_line(signum: int, runner: Runner, opts: ExecuteOptions) -> str:
    name = signal.Signals(signum).name
    if opts.out_dir is None:
        return f"stopped by {name} after {len(runner.results)} iteration(s); nothing kept (no --out)"
    if runner.last_checkpoint is None:
        return f"stopped by {name} before the first iteration ended: nothing to keep in {opts.out_dir}"
    return f"stopped by {name}; {_kept(runner)}\ncontinue with: {resume_command(opts.out_dir)}"
