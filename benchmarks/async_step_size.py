"""How large a PPO step an asynchronous plan tolerates, on the CPU (issue 46).

On the GPU the MJX workload's asynchronous plan (`defer sync 1`, samples two updates old) collapsed to a
saturated return at the workflow's learning rate, where the synchronous plan only dipped
(docs/results.md, "Asynchronous plans on the GPU"). This reproduces the regime on the CPU Reacher workflow
(`workflows/embodied_ppo.yaml`): for each learning rate, the declared (synchronous) workflow and its
asynchronous plan (`max_staleness: 1` on the policy's rollout weights, the sync deferred by one RL
iteration) train from the same seed, and the JSON records the episode return of every iteration, PPO's
clip fraction and the largest importance ratio.

    python3 benchmarks/async_step_size.py --lrs 0.001,0.005,0.01,0.015,0.02 --iterations 40
        # ~1.5 s an iteration on a 2-core machine: ~10 min; writes benchmarks/results/async_step_size_cpu.json

Learning figures, not timings: the machine's speed changes nothing they say.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python3 benchmarks/async_step_size.py` from anywhere

import torch

from benchmarks.lib.common import machine, versions
from interpreter.backends import LocalBackend
from interpreter.runner import RunConfig, Runner
from interpreter.schedule import Schedule
from rose_dsl import load_workflow
from rose_dsl.ir import Workflow
from rose_dsl.transforms import Refused, apply

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = ROOT / "workflows" / "embodied_ppo.yaml"


def asynchronous(wf: Workflow) -> Workflow:
    """The workflow with `max_staleness: 1` on `policy.rollout_weights` and `defer sync 1` applied."""
    comp = wf.components["policy"]
    state = tuple(replace(s, max_staleness=1) if s.name == "rollout_weights" else s for s in comp.state)
    plan = apply(replace(wf, components={**wf.components, "policy": replace(comp, state=state)}), "defer sync 1")
    if isinstance(plan, Refused):
        raise SystemExit(f"defer sync 1 was refused: {plan}")
    return plan.workflow


def train(wf: Workflow, iterations: int) -> list[dict[str, float]]:
    schedule = Schedule(wf)
    backend = LocalBackend(wf, ("examples.",), schedule.program.loops_of)
    try:
        config = RunConfig(iterations=iterations, tensorboard=False)
        return [r.metrics for r in Runner(wf, backend, config, schedule).run()]
    finally:
        backend.shutdown()


def run(lr: float, plan: str, args: argparse.Namespace) -> dict[str, Any]:
    params = {"seed": args.seed, "iterations": args.iterations, "num_envs": args.num_envs, "lr": lr}
    wf = load_workflow(WORKFLOW, params)
    metrics = train(asynchronous(wf) if plan == "async" else wf, args.iterations)
    returns = [m["sim/episode_return"] for m in metrics]
    k = min(5, len(returns))
    return {"lr": lr, "plan": plan, "returns": returns, "first5": sum(returns[:k]) / k, "last5": sum(returns[-k:]) / k,
            "clip_frac_mean": sum(m["trainer/clip_frac"] for m in metrics) / len(metrics),
            "ratio_max": max(m["trainer/ratio_max"] for m in metrics),
            "staleness_max": max(m.get("trainer/staleness_max", 0.0) for m in metrics)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lrs", default="0.001,0.005,0.01,0.015,0.02", help="comma-separated learning rates")
    ap.add_argument("--iterations", type=int, default=40)
    ap.add_argument("--num-envs", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "async_step_size_cpu.json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    runs = []
    for lr in (float(x) for x in args.lrs.split(",")):
        for plan in ("sync", "async"):
            runs.append(run(lr, plan, args))
            r = runs[-1]
            print(f"lr {lr:g} {plan:5s}: return {r['first5']:.1f} -> {r['last5']:.1f}, clip fraction "
                  f"{r['clip_frac_mean']:.2f}, ratio max {r['ratio_max']:.1f}", flush=True)
            doc = {"benchmark": "benchmarks/async_step_size.py", "workflow": str(WORKFLOW.relative_to(ROOT)),
                   "iterations": args.iterations, "num_envs": args.num_envs, "seed": args.seed,
                   "async_plan": "max_staleness 1 on policy.rollout_weights + defer sync 1", "runs": runs,
                   "machine": machine(), "versions": versions()}
            args.out.write_text(json.dumps(doc, indent=1) + "\n")  # after every run: a cut-short run keeps its part


if __name__ == "__main__":
    main()
