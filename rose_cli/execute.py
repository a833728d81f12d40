"""`rose execute`: its options. The run itself is `run.py`, imported only when the command runs."""

from __future__ import annotations

import os
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

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
    set_overrides,
)
from rose_dsl.trust import TrustPolicy, check_trust

__all__ = ["execute", "register", "positive_seconds", "BackendName"]


class TraceSwitch(StrEnum):
    ON = "on"
    OFF = "off"


class BackendName(StrEnum):
    AUTO = "auto"
    LOCAL = "local"
    RAY = "ray"


# (rose optimize and rose compare take it too, for their --out, and --report / --runs)
FollowLinksOpt = Annotated[bool, typer.Option("--follow-links", help="--out (--report, --runs) may be a symbolic link: "
                                                                     "write where it points (refused otherwise)")]


def refuse_linked_dir(path: Path | None, option: str, follow_links: bool) -> None:
    """A directory the user names for rose to write into (`rose optimize --report`, `rose compare --runs`) that is a
    symbolic link is refused unless --follow-links, as `--out` is (`interpreter.rundir.check_out_link`): `--overwrite`
    removed an earlier report's or round's files where it points (found by tests/cli/test_fuzz.py)."""
    if path is not None and path.is_symlink() and not follow_links:
        err.print(f"error: {option} {path} is a symbolic link (to {os.readlink(path)}); rose writes through it only "
                  "when asked: pass --follow-links, or give the directory itself", markup=False)
        raise typer.Exit(ExitCode.INVALID)


def positive_seconds(value: float) -> float:
    """An option callback: a duration must be more than 0 seconds (`not value > 0` also refuses nan)."""
    if not value > 0:
        raise typer.BadParameter(f"must be more than 0 seconds, not {value}")
    return value





def _loggers(text: str, out_dir: Path | None) -> tuple[str, ...]:
    """`--logger` as names, each installed; exit 2 naming the unknown or missing ones and the fix."""
    from interpreter.loggers import missing, parse_loggers

    try:
        names = parse_loggers(text)
    except ValueError as exc:
        err.print(f"error: --logger: {exc}", markup=False)
        raise typer.Exit(ExitCode.INVALID) from None
    absent = missing(tuple(n for n in names if n != "tensorboard"))  # (no TensorBoard: said once, at the start)
    if absent:
        err.print(f"error: --logger: not installed: {', '.join(absent)}", markup=False)
        raise typer.Exit(ExitCode.INVALID)
    if out_dir is None and any(n != "tensorboard" for n in names):
        err.print("note: --logger writes into the run directory: without --out only the console shows the metrics",
                  markup=False)
    return names


def execute(
    file: FileArg,
    plan: Annotated[Path | None, typer.Option("--plan", help="run this plan (a rewritten workflow) instead of FILE",
                                              exists=True, dir_okay=False, readable=True)] = None,
    backend: Annotated[BackendName, typer.Option("--backend", help="local (threads in this process) or ray (one actor "
                                                                 "per component); auto: ray for workflows with GPU "
                                                                 "components or replicas, local otherwise")] = BackendName.AUTO,
    iterations: Annotated[int | None, typer.Option("--iterations", "-n", min=1,
                                                   help="RL iterations in all (default: the workflow's count); "
                                                        "with --resume, the total including those done")] = None,
    out_dir: Annotated[Path | None, typer.Option("--out", file_okay=False,
                                                 help="run directory: metrics.jsonl, tb/, trace.json, checkpoints/")] = None,
    checkpoint_every: Annotated[int, typer.Option("--checkpoint-every", min=0,
                                                  help="also checkpoint every N iterations (0: only at the end of "
                                                       "the run and at the first Ctrl-C/SIGTERM, as always)")] = 0,
    resume: Annotated[bool, typer.Option("--resume", help="continue the run in --out from its last usable checkpoint")] = False,
    allow_param_change: Annotated[list[str] | None, typer.Option(
        "--allow-param-change", metavar="NAME[,NAME...]",
        help="with --resume: params that may differ from the run's (refused otherwise)")] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="replace what rose wrote in --out (a user's own files "
                                                                "there stay)")] = False,
    follow_links: FollowLinksOpt = False,
    trace: Annotated[TraceSwitch, typer.Option("--trace", help="with --out: write the call trace (trace.json for "
                                                               "Perfetto, trace.jsonl; ~75 KB per PPO iteration), "
                                                               "or not")] = TraceSwitch.ON,
    export: Annotated[bool, typer.Option("--export/--no-export", help="with --out: copy the final state to export/ "
                                                                      "(loadable without rose)")] = True,
    address: Annotated[str | None, typer.Option("--address", help="join this Ray cluster instead of starting one")] = None,
    call_timeout: Annotated[float, typer.Option("--call-timeout", callback=positive_seconds,
                                                help="watchdog: seconds an iteration's calls may take")] = 900.0,
    allow_module: AllowModuleOpt = None,
    allow_env: AllowEnvOpt = None,
    allow_path: AllowPathOpt = None,
    mps: Annotated[bool, typer.Option("--mps/--no-mps", help="run GPU components under NVIDIA MPS with their quotas")] = True,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no per-iteration lines")] = False,
    compiled: Annotated[bool, typer.Option("--compiled/--no-compiled", help="ray: compile each iteration into a Ray Compiled Graph")] = True,
    quota_check: Annotated[bool, typer.Option("--quota-check/--no-quota-check",
                                              help="before a GPU component runs under an MPS quota below 100%, check "
                                                   "that GEMMs are correct under it on this machine (cached)")] = True,
    logger: Annotated[str, typer.Option("--logger", help="where metrics go besides metrics.jsonl, comma-separated: "
                                                         "tensorboard, mlflow (local store in --out/mlruns), wandb "
                                                         "(offline, in --out/wandb), or none")] = "tensorboard",
    sets: SetOpt = None,
) -> None:
    """Train: run RL iterations of a workflow (or plan) on the local or Ray backend."""
    if resume and out_dir is None:
        err.print("error: --resume needs --out (the run directory holding the checkpoints)", markup=False)
        raise typer.Exit(ExitCode.INVALID)
    loggers = _loggers(logger, out_dir)
    allowed_changes = tuple(n.strip() for names in allow_param_change or () for n in names.split(",") if n.strip())
    if allowed_changes and not resume:
        err.print("error: --allow-param-change applies to --resume (a new run takes any params)", markup=False)
        raise typer.Exit(ExitCode.INVALID)
    if plan is None:
        wf = load_or_exit(file, sets)
    else:
        # with --plan, --set gives the params the source runs with (`--set stale=1`: the budget the plan was
        # written against, which a plan may not raise by itself); it cannot change the plan, which holds its own
        wf = load_or_exit(plan, None, source=file, source_sets=sets)
        differ = [name for name, value in set_overrides(sets).items() if wf.params.get(name) != value]
        if differ:
            err.print(f"error: --set {differ[0]}=... does not apply to a plan ({plan}): a plan holds its params resolved "
                      "(args, counts, quotas), and --set with --plan only states the source's where the plan has the "
                      f"same value ({differ[0]}={wf.params.get(differ[0])!r}); pass --set to `rose rewrite` when writing "
                      "the plan", markup=False)
            raise typer.Exit(ExitCode.INVALID)
    policy = TrustPolicy.from_options(allow_module, allow_env, allow_path)
    report_problems(wf, check_trust(wf, policy), "(the workflow asks to run code the command line did not allow)")

    from interpreter.backends import default_backend

    from .run import ExecuteOptions, execute_workflow

    opts = ExecuteOptions(backend=default_backend(wf) if backend is BackendName.AUTO else backend.value, iterations=iterations, out_dir=out_dir, checkpoint_every=checkpoint_every,
                          resume=resume, overwrite=overwrite, address=address, call_timeout=call_timeout,
                          allowed=policy.modules, mps=mps, quiet=quiet, compiled=compiled,
                          check_quotas=quota_check, allow_param_change=allowed_changes, export=export,
                          loggers=loggers, follow_links=follow_links, trace=trace is TraceSwitch.ON)
    raise typer.Exit(execute_workflow(wf, opts, out, err))


def register(app: typer.Typer) -> None:
    app.command()(execute)
