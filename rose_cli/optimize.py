"""`rose optimize FILE -o PLAN.yaml`: profile real iterations, search rewrites (stage 1) and MPS quotas
(stage 2), write the plan, the report and a checkpoint of the training done on the way.

This module wires the pure search (`rose_dsl.optimizer`) to the runtime's measuring side
(`interpreter.trials`) and shows progress; it decides nothing itself. `register(app)` adds the command
to a typer app (one line where the `rose` command is assembled).

Exit codes: 0 done, 1 internal error, 2 invalid input (workflow, options), 3 a component failed,
4 the watchdog fired.
"""

from __future__ import annotations

import os
import platform
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

__all__ = ["register", "optimize", "optimize_command"]

EXIT_INVALID, EXIT_COMPONENT, EXIT_WATCHDOG = 2, 3, 4


def register(app: typer.Typer) -> None:
    app.command(name="optimize")(optimize)


def optimize(
    file: Annotated[Path, typer.Argument(help="workflow YAML file", show_default=False)],
    output: Annotated[Path, typer.Option("--output", "-o", help="write the plan here")],
    report: Annotated[Path | None, typer.Option("--report", help="report directory (default: PLAN_report next to the plan)")] = None,
    backend: Annotated[str, typer.Option("--backend", help="local (threads) or ray (one actor per component)")] = "local",
    budget_s: Annotated[float | None, typer.Option("--budget-s", help="stop searching after this many seconds")] = None,
    rounds: Annotated[int, typer.Option("--rounds", help="rounds of graph optimization (R)")] = 2,
    top_k: Annotated[int, typer.Option("--top-k", help="targets per round (K)")] = 3,
    alternatives: Annotated[int, typer.Option("--alternatives", help="alternatives measured per target (L)")] = 4,
    quota: Annotated[bool, typer.Option("--quota/--no-quota", help="stage 2: tune the MPS quota of the process with slack")] = True,
    out_dir: Annotated[Path | None, typer.Option("--out", help="run directory for the training done while optimizing (default: REPORT/run)")] = None,
    address: Annotated[str | None, typer.Option("--address", help="join this Ray cluster instead of starting one")] = None,
    call_timeout: Annotated[float, typer.Option("--call-timeout", help="watchdog: seconds an iteration's calls may take")] = 900.0,
    allow_module: Annotated[list[str] | None, typer.Option("--allow-module", help="extra module prefix for impl (repeatable)")] = None,
    mps: Annotated[bool, typer.Option("--mps/--no-mps", help="run GPU components under NVIDIA MPS")] = True,
    compiled: Annotated[bool, typer.Option("--compiled/--no-compiled", help="ray: compile each iteration into a Ray Compiled Graph")] = True,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no progress lines")] = False,
    sets: Annotated[list[str] | None, typer.Option("--set", help="override a param: NAME=VALUE (repeatable)")] = None,
) -> None:
    """Find a faster plan for a workflow by measuring it: rewrites that overlap work (stage 1), then the
    MPS quota of the process with slack (stage 2). Writes the plan, a report, and a checkpoint."""
    out = Console(highlight=False, soft_wrap=True)
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    code = optimize_command(out, err, file=file, output=output, report=report, backend=backend, budget_s=budget_s,
                            rounds=rounds, top_k=top_k, alternatives=alternatives, quota=quota, out_dir=out_dir,
                            address=address, call_timeout=call_timeout, allowed=tuple(allow_module or ()), mps=mps,
                            compiled=compiled, quiet=quiet, sets=sets)
    raise typer.Exit(code)


def _overrides(items: list[str] | None) -> dict[str, Any]:
    import yaml

    result: dict[str, Any] = {}
    for item in items or []:
        name, sep, raw = item.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"--set expects NAME=VALUE, got {item!r}")
        result[name.strip()] = yaml.safe_load(raw) if raw.strip() else ""
    return result


def _check_options(backend: str, rounds: int, top_k: int, alternatives: int, budget_s: float | None) -> str | None:
    if backend not in ("local", "ray"):
        return f"--backend must be 'local' or 'ray', not {backend!r}"
    for name, value in (("--rounds", rounds), ("--top-k", top_k), ("--alternatives", alternatives)):
        if value < 1:
            return f"{name} must be at least 1, not {value}"
    if budget_s is not None and budget_s <= 0:
        return f"--budget-s must be positive, not {budget_s}"
    return None


def _machine(backend: str) -> dict[str, Any]:
    info: dict[str, Any] = {"host": platform.node(), "platform": platform.platform(), "python": platform.python_version(),
                            "cpus": os.cpu_count(), "backend": backend}
    try:
        import torch

        info["torch"] = torch.__version__
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
            info["gpu_count"] = torch.cuda.device_count()
    except Exception:  # noqa: BLE001 - descriptive only
        pass
    if backend == "ray":
        try:
            import ray

            info["ray"] = ray.__version__
        except ImportError:
            pass
    return info


def optimize_command(out: Console, err: Console, *, file: Path, output: Path, report: Path | None, backend: str,
                     budget_s: float | None, rounds: int, top_k: int, alternatives: int, quota: bool,
                     out_dir: Path | None, address: str | None, call_timeout: float, allowed: tuple[str, ...],
                     mps: bool, compiled: bool, quiet: bool, sets: list[str] | None) -> int:
    from rose_dsl import WorkflowError, load_workflow

    problem = _check_options(backend, rounds, top_k, alternatives, budget_s)
    if problem:
        err.print(f"error: {problem}", markup=False)
        return EXIT_INVALID
    try:
        wf = load_workflow(file, _overrides(sets))
    except WorkflowError as exc:
        err.print(exc.format(), markup=False)
        err.print(f"{file}: invalid workflow", markup=False)
        return EXIT_INVALID
    except ValueError as exc:
        err.print(f"error: {exc}", markup=False)
        return EXIT_INVALID
    report_dir = report or output.with_name(output.stem + "_report")
    run_dir = out_dir or report_dir / "run"
    if (run_dir / "checkpoints").exists() or (run_dir / "metrics.jsonl").exists():
        err.print(f"error: {run_dir} already holds a run (checkpoints or metrics); choose another --out", markup=False)
        return EXIT_INVALID
    return _run(out, err, wf, file=file, output=output, report_dir=report_dir, run_dir=run_dir, backend=backend,
                budget_s=budget_s, rounds=rounds, top_k=top_k, alternatives=alternatives, quota=quota, address=address,
                call_timeout=call_timeout, allowed=allowed, mps=mps, compiled=compiled, quiet=quiet)


def _run(out: Console, err: Console, wf: Any, *, file: Path, output: Path, report_dir: Path, run_dir: Path,
         backend: str, budget_s: float | None, rounds: int, top_k: int, alternatives: int, quota: bool,
         address: str | None, call_timeout: float, allowed: tuple[str, ...], mps: bool, compiled: bool,
         quiet: bool) -> int:
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from interpreter.backends import CallFailed, WatchdogTimeout
    from interpreter.components import ComponentError
    from interpreter.trials import Executor, TrialSession
    from rose_dsl.importcheck import DEFAULT_ALLOWED
    from rose_dsl.optimizer.search import OutOfBudget, Settings, optimize_graph

    started = time.perf_counter()
    quota_stage = quota and backend == "ray" and any(c.device == "gpu" for c in wf.components.values())
    # with stage 2 to come, stage 1 gets about two thirds of the budget
    settings = Settings(top_k=top_k, alternatives=alternatives, rounds=rounds,
                        budget_s=None if budget_s is None else budget_s * (0.65 if quota_stage else 1.0))
    deadline = None if budget_s is None else started + budget_s
    progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=out,
                        transient=True, disable=quiet)
    task = progress.add_task("starting the components", total=None)

    def log(msg: str) -> None:
        progress.update(task, description=msg)
        if not quiet:
            progress.console.print(msg, markup=False)

    gpu = _GpuSetup(wf, mps, run_dir, err)
    session = None
    try:
        with progress:
            problem = gpu.start()
            if problem:
                err.print(f"error: {problem}", markup=False)
                return EXIT_INVALID
            executor = Executor(wf, backend, compiled=compiled, allowed=allowed + DEFAULT_ALLOWED, address=address,
                                mps_env=gpu.mps_env, device=gpu.device, call_timeout_s=call_timeout,
                                sampler=gpu.sampler, log=log, extra_components=_start_with(wf, backend, gpu))
            try:
                session = TrialSession(wf, executor, out_dir=run_dir, gpu_sampler=gpu.sampler, log=log)
            except ValueError as exc:
                executor.close()
                err.print(f"{wf.file}: {exc}", markup=False)
                return EXIT_INVALID
            try:
                result = optimize_graph(wf, session, settings, log)
            except OutOfBudget as exc:
                err.print(f"error: {exc}; raise --budget-s or the workflow's iteration count", markup=False)
                return EXIT_INVALID
            stage2 = _stage2(wf, result, session, gpu, quota, backend, settings, log, deadline)
            plan = stage2.pop("plan", None) or result.plan
            _write_plan(plan, output, file, result, stage2)
            # the graph of stage 1 alone (the paper table's `stage1` / `stage1_mps` rows)
            _write_plan(result.plan, report_dir / "stage1.yaml", file, result, {})
            ckpt = session.finish(output.name)
        total = time.perf_counter() - started
        doc = _report_doc(wf, result, session, total, file, output, run_dir if ckpt else None, settings, backend, stage2)
        from rose_dsl.optimizer.report import write_report

        panels = [("declared", _typical(result.baseline_runs)), ("plan", _typical(result.final_runs))]
        write_report(doc, report_dir, [p for p in panels if p[1] is not None])
        _summary(out, doc, output, report_dir, run_dir if ckpt else None, file)
        return 0
    except (CallFailed, ComponentError) as exc:
        err.print(f"error: {exc}", markup=False)
        detail = getattr(exc, "detail", "")
        if detail:
            err.print(detail.rstrip(), markup=False)
        return EXIT_COMPONENT
    except WatchdogTimeout as exc:
        err.print(f"error: watchdog: {exc}; raise --call-timeout if this call is legitimately slow", markup=False)
        return EXIT_WATCHDOG
    finally:
        if session is not None:
            session.close()
        gpu.close()


def _start_with(wf: Any, backend: str, gpu: _GpuSetup) -> dict[str, Any]:
    """The components the workers start with besides the workflow's: the trial components, and on Ray
    the GPU copies a temporal split in two groups would need (GPU processes are placed at start)."""
    from interpreter.trials import trial_components
    from rose_dsl.optimizer.candidates import temporal_copies

    extra = trial_components()
    if backend == "ray" and gpu.gpu_components:
        copies = {n: c for n, c in temporal_copies(wf, 2).items() if c.device == "gpu"}
        extra.update(copies)
        for name, comp in copies.items():  # a copy runs under its original's MPS quota
            if gpu.quotas_work:
                gpu.mps_env[name] = gpu.client_env(comp.mps_quota)
    return extra


def _typical(runs: list[Any]) -> Any:
    """The run to draw: the median one (a typical iteration)."""
    if not runs:
        return None
    ordered = sorted(runs, key=lambda r: r.seconds)
    return ordered[len(ordered) // 2]


class _GpuSetup:
    """MPS daemon and SM-activity sampler for workflows with GPU components (nothing on the CPU)."""

    def __init__(self, wf: Any, mps: bool, run_dir: Path, err: Console) -> None:
        self.wf, self.mps, self.run_dir, self.err = wf, mps, run_dir, err
        self.daemon: Any = None
        self.sampler: Any = None
        self.mps_env: dict[str, dict[str, str]] = {}
        self.device = "cpu"
        self.gpu_components = [c for c in wf.components.values() if c.device == "gpu"]

    def start(self) -> str | None:
        if not self.gpu_components:
            return None
        try:
            import torch

            cuda = torch.cuda.is_available()
        except Exception:  # noqa: BLE001
            cuda = False
        if not cuda:
            names = ", ".join(c.name for c in self.gpu_components)
            return f"component(s) {names} need a GPU (device: gpu) and none is available here"
        self.device = "cuda"
        from interpreter.gpu_activity import GpuActivity
        from interpreter.mps import MpsDaemon

        if self.mps:
            self.daemon = MpsDaemon(base_dir=self.run_dir / "mps")
            self.daemon.start()
            if self.daemon.warning:
                self.err.print(f"warning: {self.daemon.warning}", markup=False)
            if self.daemon.active:
                self.mps_env = {c.name: self.daemon.client_env(c.mps_quota) for c in self.gpu_components}
        import torch

        sampler = GpuActivity.open_all(torch.cuda.device_count())
        self.sampler = sampler if sampler.per_gpu else None
        return None

    @property
    def quotas_work(self) -> bool:
        return self.daemon is not None and self.daemon.active

    def client_env(self, quota: int | None) -> dict[str, str]:
        return self.daemon.client_env(quota)

    def close(self) -> None:
        if self.sampler is not None:
            self.sampler.close()
        if self.daemon is not None:
            self.daemon.stop()


def _stage2(wf: Any, result: Any, session: Any, gpu: _GpuSetup, quota: bool, backend: str, settings: Any,
            log: Any, deadline: float | None) -> dict[str, Any]:
    if not quota:
        return {"skipped": "--no-quota"}
    if not gpu.gpu_components:
        return {"skipped": "no GPU components: MPS quotas do not apply on the CPU"}
    if backend != "ray":
        return {"skipped": "quotas need one process per component (--backend ray)"}
    if not gpu.quotas_work:
        return {"skipped": "MPS is not active here (see the warning above), so quotas cannot bind"}
    from interpreter.quota_trials import tune_quota

    if deadline is not None and time.perf_counter() > deadline:
        return {"skipped": "the time budget (--budget-s) was spent by stage 1"}
    return tune_quota(wf, result, session, gpu, settings, log, deadline=deadline)


def _write_plan(plan: Any, output: Path, file: Path, result: Any, stage2: dict[str, Any]) -> None:
    from rose_dsl import WorkflowError, load_workflow_text
    from rose_dsl.serialize import to_yaml

    quotas = stage2.get("quotas") or {}
    meta = {"source": str(file), "rewrites": list(result.requests), "written_by": "rose optimize",
            "baseline_iteration_s": round(result.baseline.median, 6), "plan_iteration_s": round(result.final.median, 6)}
    if quotas:
        meta["mps_quota"] = dict(quotas)
    lines = [f"#   {r}" for r in result.requests] or ["#   (no rewrite: the declared graph was fastest)"]
    header = "\n".join([f"# plan written by `rose optimize` from {file}", *lines,
                        *[f"#   mps_quota {c} = {q}%" for c, q in quotas.items()]])
    text = to_yaml(plan, plan=meta, header=header)
    try:
        load_workflow_text(text, str(output))
    except WorkflowError as exc:  # a bug: a plan the optimizer built does not validate
        raise RuntimeError(f"the optimized plan does not validate (a bug in rose):\n{exc.format()}") from None
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(output.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(output)


def _report_doc(wf: Any, result: Any, session: Any, total: float, file: Path, output: Path, run_dir: Path | None,
                settings: Any, backend: str, stage2: dict[str, Any]) -> dict[str, Any]:
    from rose_dsl.optimizer.report import build_report

    return build_report(result, books=session.sync_books(), total_s=total, workflow=wf.name, file=str(file),
                        settings=asdict(settings), machine=_machine(backend), stage2=stage2, plan_file=str(output),
                        run_dir=str(run_dir) if run_dir else None, activity_kind=session.activity_kind)


def _summary(out: Console, doc: dict[str, Any], output: Path, report_dir: Path, run_dir: Path | None, file: Path) -> None:
    ov = doc["overhead_s"]
    out.print(f"declared {doc['baseline_iteration_s']:.3f} s -> plan {doc['plan_iteration_s']:.3f} s per iteration: "
              f"{doc['speedup']:.2f}x", markup=False)
    out.print("plan: " + ("; ".join(doc["plan_requests"]) or "the declared graph"), markup=False)
    if doc.get("stage2"):
        s2 = doc["stage2"]
        out.print("stage 2: " + (s2.get("summary") or f"skipped ({s2.get('skipped')})"), markup=False)
    out.print(f"optimizer time {ov['total']:.1f} s: {ov['retained_training']:.1f} s training kept, net overhead "
              f"{ov['net']:.1f} s ({ov['fraction_of_1h_net']:.2%} of a one-hour run)", markup=False)
    out.print(f"wrote {output}, {report_dir / 'report.md'} (stage 1 alone: {report_dir / 'stage1.yaml'})", markup=False)
    if run_dir is not None:
        out.print(f"continue training: rose execute {file} --plan {output} --out {run_dir} --resume", markup=False)


if __name__ == "__main__":  # `python -m rose_cli.optimize` for a quick run without the rose command
    app = typer.Typer(add_completion=False)
    register(app)
    sys.exit(app())
