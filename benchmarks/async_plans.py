"""Synchronous vs asynchronous plans (issue 46): throughput on one set of workers, and reward against
wall-clock time from separate training runs over the same wall budget.

`rose compare` measures throughput on one set of workers too (an asynchronous plan over windows of
pipelined iterations, docs/cli.md) and is what the done-means throughput run uses
(`benchmarks/async_longtail_gpu.sh`); this script adds what `rose compare` cannot give, since all its
iterations are one training run: each plan's reward against wall-clock time from a run of its own.

Blocks (`--rounds R`, 0: none): each plan runs blocks of `--block` iterations through `Runner.run` (the
pipelined runner, `interpreter/pipeline.py`) on the same workers, in the order A B C / C B A per round, so
that drift on a shared machine hits every plan alike; a block drains its deferred calls at its end (as a
checkpoint would), so the blocks are one training run.

Curves (`--iterations N`, 0: none; `--curve-plans` picks the plans): each plan trains from scratch (its
own workers, the same seed) and its reward is recorded against its wall-clock time, counted from when its
workers are up (component start-up, a model load, is not training). `--wall-s W` gives every run the same
wall budget: a run stops after the first iteration that ends past W s (`Runner.run`'s `stop`, so it ends
as a run asked to stop does: no new iteration submitted, the ones in flight finished and the deferred
calls drained); N stays a cap. The runs are compared up to the common budget B, the shortest run's wall
time: per plan, the reward at B (interpolated), and the area under the reward-vs-wall curve up to B and
its mean (area / B), the curve held at the first iteration's reward before it ends (iteration 0's rollout
reads the initial weights) -- "reward per wall-clock second not worse" as numbers, beside the picture.

A call cut short (a `timeout`) keeps what it did: `--out`/async_plans.json is rewritten (temp file and
rename) after every block and every curve point, with the summary and reward_vs_wall.svg over the curves
so far (`curves_finished` names the runs that ended by themselves).

  python3 benchmarks/async_plans.py workflows/llm_grpo.yaml --plan sync=plans/best_sync.yaml \
      --plan async=plans/async.yaml --rounds 0 --wall-s 100 --reward reward/mean_reward --out results/async

Plans are files `rose rewrite` / `rose optimize` wrote from the workflow (checked against it as `rose
compare` checks them). The GPU is set up as `rose execute` sets it up (`rose_cli.run.gpu_session`): an MPS
daemon, so that a plan's GPU processes run side by side instead of taking turns on the GPU, and each
curve run's processes under the MPS quota and priority its plan gives them, each quota below 100% checked
by the GEMM self-check first. The blocks run every plan on one set of workers, at the declared workflow's
MPS settings (`rose compare` moves a process to another quota between plans; use it for quota plans).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from itertools import pairwise
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rich.console import Console

from benchmarks.lib.common import machine, versions
from interpreter.backends import Backend
from interpreter.optimize.executor import Executor
from interpreter.runner import RunConfig, Runner
from interpreter.schedule import Schedule
from rose_cli.run import ExecuteOptions, Gpu, SetupError, build_backend, gpu_session
from rose_dsl.cli import load_or_exit
from rose_dsl.ir import Workflow

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e")
clock: Callable[[], float] = time.perf_counter  # every wall time here (a test replaces it by a fake clock)
Points = list[tuple[float, float]]


class Report:
    """async_plans.json as measured so far, rewritten whole after every block and every curve point (a temp
    file renamed over it, so a kill never leaves half a file), with the summary and the SVG."""

    def __init__(self, out: Path, doc: dict[str, Any]) -> None:
        self.out, self.doc = out, doc
        out.mkdir(parents=True, exist_ok=True)

    def save(self) -> None:
        path = self.out / "async_plans.json"
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(self.doc, indent=1) + "\n")
        os.replace(tmp, path)

    def block(self, label: str, seconds: float) -> None:
        per = self.doc["seconds_per_iteration"]
        per.setdefault(label, []).append(seconds)
        self.doc["median"] = {k: statistics.median(v) for k, v in per.items()}
        base = self.doc["median"].get("declared")
        self.doc["throughput_vs_declared"] = {k: base / m for k, m in self.doc["median"].items()} if base else {}
        self.save()

    def point(self, label: str, points: Points, title: str) -> None:
        """A curve's points so far; the summary and the picture over every curve with points, so a call
        killed mid-run keeps them too (a run cut short covers the common budget as far as it got)."""
        self.doc["reward_vs_wall"][label] = points
        curves = {k: v for k, v in self.doc["reward_vs_wall"].items() if v}
        if curves:
            self.doc["common_budget_s"] = budget = min(pts[-1][0] for pts in curves.values())
            self.doc["reward_summary"] = {k: reward_summary(v, budget) for k, v in curves.items()}
            svg_path = self.out / "reward_vs_wall.svg"
            tmp = svg_path.with_name(svg_path.name + ".tmp")
            tmp.write_text(svg(curves, title))
            os.replace(tmp, svg_path)
        self.save()

    def curve_done(self, label: str) -> None:
        self.doc["curves_finished"].append(label)
        self.save()


def _options(args: argparse.Namespace) -> ExecuteOptions:
    """`rose execute`'s options for these runs: the backend and trust asked for, no run directory."""
    return ExecuteOptions(backend=args.backend, allowed=tuple(args.allow), quiet=True)


def _backend(wf: Workflow, sch: Schedule, args: argparse.Namespace, gpu: Gpu, compiled: bool = True) -> Backend:
    return build_backend(wf, sch, replace(_options(args), compiled=compiled), gpu, Console(stderr=True))


def blocks(plans: dict[str, Workflow], args: argparse.Namespace, report: Report) -> None:
    """Seconds per iteration of each plan, one block per round, interleaved A B C / C B A."""
    declared = next(iter(plans.values()))
    with gpu_session(declared, _options(args), Console(stderr=True)) as gpu:
        ex = Executor(declared, lambda wf, sch: _backend(wf, sch, args, gpu, compiled=False))
        _blocks(ex, plans, args, report)


def _blocks(ex: Executor, plans: dict[str, Workflow], args: argparse.Namespace, report: Report) -> None:
    k = 0
    try:
        for r in range(args.rounds):
            order = list(plans) if r % 2 == 0 else list(reversed(plans))
            for label in order:
                runner: Runner = ex.runner(plans[label], RunConfig(iterations=k + args.block, tensorboard=False))
                t = clock()
                runner.run(start=k)
                report.block(label, (clock() - t) / args.block)
                k += args.block
                print(f"round {r} {label}: {report.doc['seconds_per_iteration'][label][-1]:.4f} s/iteration",
                      flush=True)
    finally:
        ex.close()


def curve(wf: Workflow, args: argparse.Namespace, on_point: Callable[[Points], None]) -> Points:
    """(wall-clock s, reward) per iteration of a training run from scratch, until `args.iterations` or the
    first iteration that ends past `args.wall_s`; `on_point` gets the points so far after each one."""
    sch = Schedule(wf)
    with gpu_session(wf, _options(args), Console(stderr=True)) as gpu:
        return _curve(wf, sch, args, on_point, _backend(wf, sch, args, gpu))


def _curve(wf: Workflow, sch: Schedule, args: argparse.Namespace, on_point: Callable[[Points], None],
           be: Backend) -> Points:
    points: Points = []
    ended = [0.0]  # when the last finished iteration ended
    try:
        t0 = clock()

        def seen(result: Any) -> None:
            ended[0] = clock() - t0
            if args.reward in result.metrics:
                points.append((ended[0], float(result.metrics[args.reward])))
                on_point(points)
            elif not points:  # (a misspelt metric would otherwise give an empty curve, silently)
                print(f"warning: iteration {result.iteration} has no metric {args.reward} (it has "
                      f"{', '.join(sorted(result.metrics))})", file=sys.stderr, flush=True)

        def over_budget() -> bool:
            return args.wall_s is not None and ended[0] >= args.wall_s

        Runner(wf, be, RunConfig(iterations=args.iterations, tensorboard=False), sch, on_iteration=seen).run(
            stop=over_budget)
    finally:
        be.shutdown()
    return points


def reward_at(points: Sequence[tuple[float, float]], t: float) -> float:
    """The reward-vs-wall curve at time t: linear between points, the first point's reward before it (the
    initial weights' reward), the last point's after it."""
    if t <= points[0][0]:
        return points[0][1]
    for (t0, r0), (t1, r1) in pairwise(points):
        if t <= t1:
            return r0 + (r1 - r0) * (t - t0) / (t1 - t0) if t1 > t0 else r1
    return points[-1][1]


def reward_summary(points: Sequence[tuple[float, float]], budget: float) -> dict[str, float | int]:
    """One plan's run up to the common wall budget: the reward there, the area under the curve up to it
    (trapezoids over `reward_at`'s curve) and its mean over the budget, the gain per wall-clock second, and
    the iterations finished within it."""
    knots = [0.0] + [t for t, _ in points if 0.0 < t < budget] + [budget]
    area = sum((b - a) * (reward_at(points, a) + reward_at(points, b)) / 2 for a, b in pairwise(knots))
    at = reward_at(points, budget)
    return {"reward_at_budget": at, "area": area, "mean_reward": area / budget if budget > 0 else at,
            "gain_per_s": (at - points[0][1]) / budget if budget > 0 else 0.0,
            "iterations": sum(1 for t, _ in points if t <= budget)}


def svg(curves: dict[str, Points], title: str, width: int = 640, height: int = 380) -> str:
    """Reward against wall-clock time, one line per plan, cut at the shortest run's wall time (the legend
    gives each plan's mean reward over that budget)."""
    budget = min(pts[-1][0] for pts in curves.values() if pts) or 1.0
    pts_all = [p for pts in curves.values() for p in pts if p[0] <= budget]
    lo, hi = min(v for _, v in pts_all), max(v for _, v in pts_all)
    hi = hi if hi > lo else lo + 1.0

    def xy(t: float, v: float) -> str:
        return f"{60 + (width - 80) * t / budget:.1f},{height - 40 - (height - 90) * (v - lo) / (hi - lo):.1f}"

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
           'font-size="12">', f'<text x="60" y="20">{title}</text>',
           f'<text x="{width // 2}" y="{height - 8}">wall-clock s (0 to {budget:.0f})</text>',
           f'<text x="4" y="{height // 2}">{lo:.3g} .. {hi:.3g}</text>']
    for n, (label, pts) in enumerate(curves.items()):
        color = COLORS[n % len(COLORS)]
        line = " ".join(xy(t, v) for t, v in [(0.0, pts[0][1]), *pts] if t <= budget)
        mean = reward_summary(pts, budget)["mean_reward"]
        out += [f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{line}"/>',
                f'<text x="{width - 200}" y="{40 + 16 * n}" fill="{color}">{label} (mean {mean:.3g})</text>']
    return "\n".join(out + ["</svg>"]) + "\n"


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("workflow", type=Path)
    ap.add_argument("--plan", action="append", default=[], help="LABEL=PATH (repeatable)")
    ap.add_argument("--set", action="append", default=[], help="NAME=VALUE param override (repeatable)")
    ap.add_argument("--backend", default="local", choices=("local", "ray"))
    ap.add_argument("--allow", action="append", default=["examples."])
    ap.add_argument("--rounds", type=int, default=3, help="rounds of throughput blocks (0: curves only)")
    ap.add_argument("--block", type=int, default=5, help="iterations per plan and round")
    ap.add_argument("--iterations", type=int, default=40, help="the most iterations of each reward-vs-wall run "
                    "(0: no curves)")
    ap.add_argument("--wall-s", type=float, default=None, help="each curve run stops after the first iteration "
                    "that ends past this many seconds of its wall clock (the same budget for every plan)")
    ap.add_argument("--curve-plans", default=None, help="LABEL,... the plans that get curves (default: all)")
    ap.add_argument("--reward", default="reward/mean_reward", help="the metric plotted")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    if args.rounds < 0 or args.block < 1 or args.iterations < 0 or (args.wall_s is not None and args.wall_s <= 0):
        ap.error("--rounds and --iterations must be >= 0, --block >= 1, --wall-s > 0")
    return args


def curve_labels(args: argparse.Namespace, plans: dict[str, Workflow]) -> list[str]:
    """The plans that get curves, in `--curve-plans`' order; a label no `--plan` gives exits 2."""
    if not args.iterations:
        return []
    if args.curve_plans is None:
        return list(plans)
    labels = [s.strip() for s in args.curve_plans.split(",") if s.strip()]
    unknown = [s for s in labels if s not in plans]
    if unknown or not labels:
        print(f"error: --curve-plans: {','.join(unknown) or '(none)'} is not a plan here (the plans: "
              f"{','.join(plans)})", file=sys.stderr)
        raise SystemExit(2)
    return labels


def _measure(plans: dict[str, Workflow], labels: list[str], args: argparse.Namespace, report: Report) -> None:
    """The throughput blocks (`--rounds`), then each curve run in turn, into `report` as they come."""
    if args.rounds:
        blocks(plans, args, report)
    title = f"{args.workflow.name}: {args.reward}"
    for label in labels:
        def point(points: Points, label: str = label) -> None:
            print(f"curve {label}: iteration {len(points) - 1} ends at {points[-1][0]:.1f} s, "
                  f"{args.reward} {points[-1][1]:.4g}", flush=True)
            report.point(label, points, title)

        report.point(label, curve(plans[label], args, point), title)
        report.curve_done(label)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse(argv)
    sets = args.set or None
    plans = {"declared": load_or_exit(args.workflow, sets)}
    for entry in args.plan:
        label, _, path = entry.partition("=")
        plans[label] = load_or_exit(Path(path), None, source=args.workflow, source_sets=sets)
    labels = curve_labels(args, plans)
    report = Report(args.out, {
        "workflow": str(args.workflow), "plans": {k: str(v.name) for k, v in plans.items()},
        "seconds_per_iteration": {}, "median": {}, "throughput_vs_declared": {}, "block": args.block,
        "rounds": args.rounds, "reward": args.reward, "wall_s": args.wall_s, "iterations_cap": args.iterations,
        "curve_plans": labels, "reward_vs_wall": {}, "curves_finished": [], "common_budget_s": None,
        "reward_summary": {}, "backend": args.backend, "machine": machine(), "versions": versions()})
    report.save()
    try:
        _measure(plans, labels, args, report)
    except SetupError as exc:  # no GPU for a GPU workflow, a quota this GPU computes wrongly under
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    for label, ratio in report.doc["throughput_vs_declared"].items():
        print(f"{label}: {report.doc['median'][label]:.4f} s/iteration, {ratio:.2f}x the declared throughput")
    for label, s in report.doc["reward_summary"].items():
        print(f"{label}: up to {report.doc['common_budget_s']:.1f} s: reward {s['reward_at_budget']:.4g}, "
              f"mean {s['mean_reward']:.4g}, {s['iterations']} iterations")


if __name__ == "__main__":
    main()
