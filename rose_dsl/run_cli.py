"""The body of `rose execute`: set up MPS, the backend, GPU sampling and the runner; report failures as
one message naming the node path and iteration, tear everything down on every exit path.

Exit codes: 0 done, 1 internal error, 2 invalid input, 3 a component failed, 4 the watchdog fired,
5 a checkpoint problem.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from .importcheck import DEFAULT_ALLOWED
from .ir import Workflow

__all__ = ["execute_command", "EXIT_COMPONENT", "EXIT_WATCHDOG", "EXIT_CHECKPOINT"]

EXIT_COMPONENT, EXIT_WATCHDOG, EXIT_CHECKPOINT = 3, 4, 5


def _fmt(metrics: dict[str, float]) -> str:
    keys = ["iteration_s", "env_steps_per_s", "tokens_per_s", "sm_activity"]
    shown = [f"{k.replace('_per_s', '/s')} {metrics[k]:.4g}" for k in keys if k in metrics]
    shown += [f"{k} {v:.4g}" for k, v in metrics.items() if "/" in k and not k.startswith("time/")][:8]
    return "  ".join(shown)


def execute_command(out: Console, err: Console, wf: Workflow, *, backend: str, iterations: int | None,
                    out_dir: Path | None, checkpoint_every: int, resume: bool, address: str | None,
                    call_timeout: float, allowed: tuple[str, ...], mps: bool, quiet: bool, compiled: bool = True) -> int:
    from interpreter.backends import CallFailed, WatchdogTimeout, default_backend, make_backend
    from interpreter.checkpoint import CheckpointError
    from interpreter.components import ComponentError
    from interpreter.runner import RunConfig, Runner
    from interpreter.schedule import Schedule

    if backend == "auto":
        backend = default_backend(wf)
    if backend not in ("local", "ray"):
        err.print(f"--backend must be 'local' or 'ray', not {backend!r}")
        return 2
    try:
        schedule = Schedule(wf)
    except ValueError as exc:
        err.print(f"{wf.file}: {exc}")
        return 2
    n = iterations if iterations is not None else (wf.root.count or 1)
    counts = {c.replicas for c in wf.components.values()}
    if len(counts) > 1:  # the hybrid placement: check that every input maps between replica counts
        from interpreter.schedule import check_replica_edges

        try:
            check_replica_edges(wf)
        except ValueError as exc:
            err.print(f"{wf.file}: {exc}", markup=False)
            return 2
    if max(counts) > 1 and backend != "ray":
        err.print(f"{wf.file}: replicas: {max(counts)} needs --backend ray (one process per replica)", markup=False)
        return 2
    allowed_all = allowed + DEFAULT_ALLOWED
    gpu_components = [c for c in wf.components.values() if c.device == "gpu"]
    daemon, sampler, be = None, None, None
    started = time.perf_counter()
    try:
        if gpu_components:
            daemon, sampler = _gpu_setup(err, wf, mps, out_dir)
        mps_env: dict[str, dict[str, str]] = {}
        if daemon is not None and daemon.active:
            mps_env = {c.name: daemon.client_env(c.mps_quota) for c in gpu_components}
        device = "cuda" if gpu_components and _cuda() else "cpu"
        if gpu_components and device == "cpu":
            names = ", ".join(c.name for c in gpu_components)
            err.print(f"error: component(s) {names} need a GPU (device: gpu) and none is available here; "
                      "use a CPU configuration of the workflow (device: cpu)", markup=False)
            return 2
        be = make_backend(backend, wf, schedule, compiled=compiled, address=address, mps_env=mps_env, device=device,
                          allowed=allowed_all, log=lambda line: err.print(line, markup=False))
        for name in be.components():
            info = be.control(name, "info") if backend == "ray" else None
            if info and info.get("sm_count"):
                out.print(f"component {name}: pid {info['pid']}, {info['sm_count']} SMs visible"
                          f"{' (MPS quota ' + str(info['mps_quota']) + '%)' if info.get('mps_quota') else ''}")
        config = RunConfig(iterations=n, out_dir=out_dir, checkpoint_every=checkpoint_every, resume=resume,
                           call_timeout_s=call_timeout)
        progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                            TimeElapsedColumn(), console=out, transient=True, disable=quiet)

        def on_iteration(result: Any) -> None:
            progress.update(task, completed=result.iteration + 1)
            if not quiet:
                progress.console.print(f"it {result.iteration:>4}  {_fmt(result.metrics)}", markup=False)

        runner = Runner(wf, be, config, schedule, on_iteration, sampler)

        def on_recovery(rec: dict[str, Any]) -> None:
            err.print(f"warning: {rec['failed'].splitlines()[0]}\n  restarted {', '.join(rec['restarted'])}"
                      f"{' (the GPU fault domain under MPS)' if rec['gpu_fatal'] and len(rec['restarted']) > 1 else ''}"
                      f" and continued from the checkpoint of iteration {rec['from_checkpoint']} "
                      f"(restart {rec['attempt']})", markup=False)

        runner.on_recovery = on_recovery
        with progress:
            task = progress.add_task(wf.name, total=n)
            results = runner.run()
        total = time.perf_counter() - started
        if not quiet:
            _print_nodes(out, runner.node_summary())
        _print_curve(out, results)
        out.print(f"done: {len(results)} iterations in {total:.1f} s" + (f"; outputs in {out_dir}" if out_dir else ""))
        return 0
    except (CallFailed, ComponentError) as exc:
        err.print(f"error: {exc}", markup=False)
        detail = getattr(exc, "detail", "")
        if detail:
            err.print(detail.rstrip(), markup=False)
        err.print("stopped; the last complete checkpoint (if any) is intact", markup=False)
        return EXIT_COMPONENT
    except WatchdogTimeout as exc:
        err.print(f"error: watchdog: {exc}; raise --call-timeout if this call is legitimately slow", markup=False)
        if be is not None:
            be.stuck = True  # shutdown must not wait for the stuck call
        for comp, stack in getattr(exc, "stacks", {}).items():
            lines = [ln for ln in stack.strip().splitlines() if ln.strip()]
            if "most recent call first" in stack:  # faulthandler's order (a component process)
                lines = [ln for ln in _call_thread(stack) if ln.strip().startswith("File")][:6][::-1]
            err.print(f"  stack of {comp} (innermost last):", markup=False)
            for ln in lines[-6:]:
                err.print(f"    {ln}", markup=False)
        if out_dir is not None:
            err.print(f"  full stacks in {out_dir / 'stacks.txt'}", markup=False)
        if backend == "local":
            # a stuck thread cannot be stopped, and the interpreter would wait for it at exit: tear down
            # what can be, then leave at once
            import os
            import sys

            if be is not None:
                be.shutdown()
            if sampler is not None:
                sampler.close()
            if daemon is not None:
                daemon.stop()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(EXIT_WATCHDOG)
        return EXIT_WATCHDOG
    except CheckpointError as exc:
        err.print(f"error: checkpoint: {exc}", markup=False)
        return EXIT_CHECKPOINT
    except KeyboardInterrupt:
        err.print("interrupted; stopping components")
        return 130
    finally:
        if be is not None:
            be.shutdown()
        if sampler is not None:
            sampler.close()
        if daemon is not None:
            daemon.stop()


def _call_thread(stack: str) -> list[str]:
    """The lines of the thread running the component's call in a faulthandler dump: the one inside
    rose's worker (a compiled graph runs calls off the main thread), else the current thread."""
    blocks = [b for b in stack.replace("Current thread", "\0Current thread").replace("Thread 0x", "\0Thread 0x")
              .split("\0") if b.strip()]
    for block in blocks:
        if "interpreter/worker.py" in block:
            return block.splitlines()
    current = [b for b in blocks if b.startswith("Current thread")]
    return (current or blocks or [""])[0].splitlines()


CURVE_METRICS = ("episode_return", "reward", "mean_reward")


def _print_nodes(out: Console, rows: list[dict[str, Any]]) -> None:
    from rich.table import Table

    t = Table(title="time per node (per iteration; split groups merged)", title_justify="left", show_edge=False)
    for col in ("node", "calls", "mean", "per iteration", "SM activity"):
        t.add_column(col, justify="left" if col == "node" else "right")
    for r in rows[:12]:
        act = r.get("sm_activity")
        t.add_row(r["node"].removeprefix("iteration."), str(r["invocations"]), f"{r['mean_s'] * 1e3:.2f} ms",
                  f"{r['per_iteration_s']:.3f} s", "-" if act is None else f"{act:.0%}")
    out.print(t)


def _print_curve(out: Console, results: list) -> None:
    """The learning curve at the end of a run: the first reward-like metric, averaged over windows."""
    if len(results) < 2:
        return
    name = next((k for k in results[-1].metrics for m in CURVE_METRICS if k.endswith("/" + m)), None)
    if name is None:
        return
    values = [(r.iteration, r.metrics[name]) for r in results if name in r.metrics]
    windows = min(10, len(values))
    size = max(1, len(values) // windows)
    blocks = "▁▂▃▄▅▆▇█"
    means = []
    for w in range(0, len(values), size):
        chunk = values[w:w + size]
        means.append((chunk[0][0], chunk[-1][0], sum(v for _, v in chunk) / len(chunk)))
    lo, hi = min(m for *_, m in means), max(m for *_, m in means)
    spark = "".join(blocks[int((m - lo) / (hi - lo + 1e-12) * (len(blocks) - 1))] for *_, m in means)
    out.print(f"{name}: {spark}  " + "  ".join(f"[{a}-{b}] {m:.3g}" for a, b, m in means), markup=False)


def _cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        return False


def _gpu_setup(err: Console, wf: Workflow, mps: bool, out_dir: Path | None):
    from interpreter.gpu_activity import GpuActivity
    from interpreter.mps import MpsDaemon

    daemon = None
    if mps:
        daemon = MpsDaemon(base_dir=(out_dir / "mps") if out_dir else None)
        daemon.start()
        if daemon.warning:
            err.print(f"warning: {daemon.warning}", markup=False)
    sampler = GpuActivity.open_all(_gpu_count())  # every GPU of this machine (NVML index)
    if not sampler.per_gpu:  # no NVML: run without activity
        sampler = None
    return daemon, sampler


def _gpu_count() -> int:
    try:
        import torch

        return torch.cuda.device_count()
    except Exception:  # noqa: BLE001
        return 1
