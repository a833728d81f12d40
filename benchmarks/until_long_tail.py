"""The long-tail overlap, measured: a decode loop that ends per row (`until:`) with long-tailed completion
lengths, scored per row, against the same workflow split into row groups with its scorer (`split-chain decode
score K`), where group g's scoring runs while group g+1 still generates.

The components sleep (`examples/bench/until_loops.py`: `SleepyLM`, `SleepyJudge`): a step costs `fixed_ms +
per_row_ms * rows`, scoring `per_token_ms` per token, so what is measured is the schedule, not CPU contention
on a loaded machine. Every plan runs on its own local-backend workers, iterations interleaved round by round;
the median iteration per plan, its speed-up over the declared workflow, and whether it trained the same
(the learner's final weights) go into one JSON file with machine and versions.

    python benchmarks/until_long_tail.py --rounds 5   # -> benchmarks/results/until_long_tail.json
    python benchmarks/until_long_tail.py --smoke
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.dispatch import machine  # noqa: E402 - after the path is set

WORKFLOW = """
rose: 1
name: until-long-tail
params: {{rows: {rows}, max_new: {most}}}
components:
  lm: {{impl: "examples.bench.until_loops:SleepyLM", state: [weights],
       args: {{rows: "${{rows}}", fixed_ms: {fixed_ms}, per_row_ms: {per_row_ms}, mean: {mean}, sigma: {sigma}, most: "${{max_new}}"}}}}
  judge: {{impl: "examples.bench.until_loops:SleepyJudge", args: {{per_token_ms: {per_token_ms}}}}}
iteration:
  count: 1000
  body:
    - {{node: prompt, call: lm.prompts, in: {{it: iteration.i}}, out: [tok, len0], batch: {{dim: 0, size: "${{rows}}", separable: false}}}}
    - loop: decode
      count: "${{max_new}}"
      until: gen.eos
      carry:
        tok: {{init: prompt.tok, next: gen.tok}}
        len: {{init: prompt.len0, next: gen.len}}
      body:
        - {{node: gen, call: lm.step, in: {{tok: decode.tok, t: decode.i, it: iteration.i}}, out: [tok, eos, len],
           batch: {{dim: 0, size: "${{rows}}"}}}}
    - {{node: score, call: judge.final, in: {{tok: decode.tok, length: decode.len}}, out: [reward], batch: {{dim: 0, size: "${{rows}}"}}}}
    - {{node: learn, call: lm.learn, in: {{reward: score.reward}}, state: {{weights: update}}}}
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--most", type=int, default=64, help="the loop's bound (count:)")
    ap.add_argument("--mean", type=float, default=8.0, help="mean completion length, in trips")
    ap.add_argument("--sigma", type=float, default=1.0, help="log-sd of the lengths (the tail)")
    ap.add_argument("--fixed-ms", type=float, default=0.5)
    ap.add_argument("--per-row-ms", type=float, default=0.05)
    ap.add_argument("--per-token-ms", type=float, default=1.0)
    ap.add_argument("--groups", default="2,4,8")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "until_long_tail.json")
    args = ap.parse_args()
    if args.smoke:
        args.rounds, args.groups = 2, "2"
    import torch

    from interpreter.local_backend import LocalBackend
    from interpreter.runner import RunConfig, Runner
    from interpreter.schedule import Schedule
    from rose_dsl import load_workflow_text
    from rose_dsl.transforms import apply_request

    text = WORKFLOW.format(rows=args.rows, most=args.most, mean=args.mean, sigma=args.sigma, fixed_ms=args.fixed_ms,
                           per_row_ms=args.per_row_ms, per_token_ms=args.per_token_ms)
    declared = load_workflow_text(text, "until_long_tail.yaml")
    plans = {"declared": declared}
    for k in (int(x) for x in args.groups.split(",")):
        plans[f"split-chain {k}"] = apply_request(declared, f"split-chain decode score {k}").workflow
    runners, backends = {}, []
    for name, wf in plans.items():
        sch = Schedule(wf)
        be = LocalBackend(wf, ("examples.",), sch.program.loops_of)
        backends.append(be)
        runners[name] = Runner(wf, be, RunConfig(iterations=args.rounds + 1, tensorboard=False), sch)
    seconds: dict[str, list[float]] = {n: [] for n in plans}
    trips: dict[str, list[dict[str, float]]] = {n: [] for n in plans}
    weights: dict[str, float] = {}
    try:
        for k in range(args.rounds + 1):  # iteration 0 warms up
            for name, runner in runners.items():
                r = runner.run_iteration(k)
                if k:
                    seconds[name].append(r.seconds)
                    trips[name].append({m: v for m, v in r.metrics.items() if m.startswith("trips/")})
                weights[name] = r.metrics.get("lm/weights", float("nan"))
    finally:
        for be in backends:
            be.shutdown()
    med = {n: statistics.median(v) for n, v in seconds.items()}
    result = {
        "benchmark": "until_long_tail", "config": {k: v for k, v in vars(args).items() if k != "out"} | {"out": None},
        "median_iteration_s": med, "speedup_vs_declared": {n: med["declared"] / v for n, v in med.items()},
        "iteration_s": seconds, "trips": trips,
        "same_training": {n: weights[n] == weights["declared"] for n in weights}, "final_weights": weights,
        "machine": machine(), "versions": {"torch": torch.__version__, "python": sys.version.split()[0]},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    for n, v in med.items():
        print(f"{n:>16}: {v * 1e3:8.1f} ms/iteration  {med['declared'] / v:5.2f}x  same training: "
              f"{weights[n] == weights['declared']}")


if __name__ == "__main__":
    main()
