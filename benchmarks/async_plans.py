"""Synchronous vs asynchronous plans (issue 46): throughput on one set of workers, and reward against
wall-clock time from separate training runs.

`rose compare` measures throughput on one set of workers too (an asynchronous plan over windows of
pipelined iterations, docs/cli.md) and is what the done-means run uses
(`benchmarks/async_longtail_gpu.sh`); this script adds what `rose compare` cannot give, since all its
iterations are one training run: each plan's reward against wall-clock time from a run of its own. Here
each plan first runs *blocks* of iterations
through `Runner.run` (the pipelined runner, `interpreter/pipeline.py`), on the same workers, in the order
A B C / C B A per round, so that drift on a shared machine hits every plan alike; a block drains its
deferred calls at its end (as a checkpoint would), so the blocks are one training run. Then each plan
trains from scratch for `--iterations` (its own workers, the same seed) and its reward is recorded
against its cumulative wall-clock time; `--out` gets `async_plans.json` and `reward_vs_wall.svg`.

  python3 benchmarks/async_plans.py workflows/llm_grpo.yaml --plan sync=plans/best_sync.yaml \
      --plan async=plans/async.yaml --reward reward/mean_reward --out benchmarks/results/async_grpo

Plans are files `rose rewrite` / `rose optimize` wrote from the workflow (checked against it as `rose
compare` checks them). MPS quotas are not applied here (use `rose compare` for quota plans).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import machine, versions
from interpreter.backends import make_backend
from interpreter.executor import Executor
from interpreter.runner import RunConfig, Runner
from interpreter.schedule import Schedule
from rose_dsl.cli import load_or_exit
from rose_dsl.ir import Workflow

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e")


def blocks(plans: dict[str, Workflow], args: argparse.Namespace) -> dict[str, list[float]]:
    """Seconds per iteration of each plan, one block per round, interleaved A B C / C B A."""
    def build(wf: Workflow, sch: Schedule) -> Any:
        return make_backend(args.backend, wf, sch, compiled=False, device=args.device, allowed=tuple(args.allow))

    ex = Executor(next(iter(plans.values())), build)
    per: dict[str, list[float]] = {label: [] for label in plans}
    k = 0
    try:
        for r in range(args.rounds):
            order = list(plans) if r % 2 == 0 else list(reversed(plans))
            for label in order:
                runner: Runner = ex.runner(plans[label], RunConfig(iterations=k + args.block, tensorboard=False))
                t = time.perf_counter()
                runner.run(start=k)
                per[label].append((time.perf_counter() - t) / args.block)
                k += args.block
                print(f"round {r} {label}: {per[label][-1]:.4f} s/iteration", flush=True)
    finally:
        ex.close()
    return per


def curve(wf: Workflow, args: argparse.Namespace) -> list[tuple[float, float]]:
    """(cumulative wall-clock s, reward) per iteration of a training run from scratch."""
    sch = Schedule(wf)
    be = make_backend(args.backend, wf, sch, compiled=False, device=args.device, allowed=tuple(args.allow))
    points: list[tuple[float, float]] = []
    t0 = time.perf_counter()
    try:
        def seen(result: Any) -> None:
            if args.reward in result.metrics:
                points.append((time.perf_counter() - t0, result.metrics[args.reward]))

        Runner(wf, be, RunConfig(iterations=args.iterations, tensorboard=False), sch, on_iteration=seen).run()
    finally:
        be.shutdown()
    return points


def svg(curves: dict[str, list[tuple[float, float]]], title: str, width: int = 640, height: int = 380) -> str:
    """Reward against wall-clock time, one line per plan, cut at the shortest run's wall time."""
    budget = min(pts[-1][0] for pts in curves.values() if pts)
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
        line = " ".join(xy(t, v) for t, v in pts if t <= budget)
        out += [f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{line}"/>',
                f'<text x="{width - 150}" y="{40 + 16 * n}" fill="{color}">{label}</text>']
    return "\n".join(out + ["</svg>"]) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("workflow", type=Path)
    ap.add_argument("--plan", action="append", default=[], help="LABEL=PATH (repeatable)")
    ap.add_argument("--set", action="append", default=[], help="NAME=VALUE param override (repeatable)")
    ap.add_argument("--backend", default="local", choices=("local", "ray"))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--allow", action="append", default=["examples."])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--block", type=int, default=5, help="iterations per plan and round")
    ap.add_argument("--iterations", type=int, default=40, help="iterations of each reward-vs-wall run (0: none)")
    ap.add_argument("--reward", default="reward/mean_reward", help="the metric plotted")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    sets = args.set or None
    plans = {"declared": load_or_exit(args.workflow, sets)}
    for entry in args.plan:
        label, _, path = entry.partition("=")
        plans[label] = load_or_exit(Path(path), None, source=args.workflow, source_sets=sets)
    per = blocks(plans, args)
    curves = {label: curve(wf, args) for label, wf in plans.items()} if args.iterations else {}
    base = statistics.median(per["declared"])
    doc = {"workflow": str(args.workflow), "plans": {k: str(v.name) for k, v in plans.items()},
           "seconds_per_iteration": per, "median": {k: statistics.median(v) for k, v in per.items()},
           "throughput_vs_declared": {k: base / statistics.median(v) for k, v in per.items()},
           "reward_vs_wall": curves, "block": args.block, "rounds": args.rounds, "backend": args.backend,
           "machine": machine(), "versions": versions()}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "async_plans.json").write_text(json.dumps(doc, indent=1) + "\n")
    if curves:
        (args.out / "reward_vs_wall.svg").write_text(svg(curves, f"{args.workflow.name}: {args.reward}"))
    for label, ratio in doc["throughput_vs_declared"].items():
        print(f"{label}: {doc['median'][label]:.4f} s/iteration, {ratio:.2f}x the declared throughput")


if __name__ == "__main__":
    main()
