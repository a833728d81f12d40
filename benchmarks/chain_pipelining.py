"""Pipelining a chain without a loop (issue 15): `generate -> score -> learn` on latency-bound CPU
stages (each call waits 5 ms + 1 ms per row, 128 rows), run by rose's local backend.

Variants, each a plan of the same workflow (identical results, checked):
  declared          the workflow as written
  merge_2           split generate 2 + split score 2 as rose wrote them before merge-slice forwarding:
                    score@g reads `generate.tokens[a:b]` through the merge, so it waits for every group
  chain_K           `split-chain generate score K` (or the two splits in either order): score@g reads
                    generate@g and starts as soon as that group is done
  loop_4            the issue's workaround: both nodes inside a one-iteration loop whose body is split 4 ways
Rounds are interleaved (every variant once per round, in a rotated order); the per-iteration wall time
of each variant is the median over rounds of its iterations' median, with the spread.

    python benchmarks/chain_pipelining.py --out benchmarks/results/chain_pipelining.json
    python benchmarks/chain_pipelining.py --smoke          # seconds: fewer rows, rounds and iterations
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

WORKFLOW = """
rose: 1
name: chain
params: {{rows: {rows}, fixed_ms: {fixed}, per_row_ms: {per_row}}}
components:
  gen: {{impl: "examples.bench.latency:Stage", args: {{rows: "${{rows}}", fixed_ms: "${{fixed_ms}}", per_row_ms: "${{per_row_ms}}"}}}}
  rm: {{impl: "examples.bench.latency:Stage", args: {{rows: "${{rows}}", fixed_ms: "${{fixed_ms}}", per_row_ms: "${{per_row_ms}}"}}}}
  learner: {{impl: "examples.bench.latency:Stage", state: [w], args: {{rows: "${{rows}}", fixed_ms: "${{fixed_ms}}", per_row_ms: "${{per_row_ms}}"}}}}
iteration:
  count: 1000
  body:
{body}
"""
FLAT = """\
    - {node: generate, call: gen.generate, in: {it: iteration.i}, out: [tokens], batch: {dim: 0, size: "${rows}"}}
    - {node: score, call: rm.score, in: {tokens: generate.tokens}, out: [reward], batch: {dim: 0, size: "${rows}"}}
    - {node: learn, call: learner.learn, in: {tokens: generate.tokens, reward: score.reward}, state: {w: update}, out: [loss]}"""
LOOPED = """\
    - loop: wrap
      count: 1
      body:
        - {node: generate, call: gen.generate, in: {it: iteration.i}, out: [tokens], batch: {dim: 0, size: "${rows}"}}
        - {node: score, call: rm.score, in: {tokens: generate.tokens}, out: [reward], batch: {dim: 0, size: "${rows}"}}
    - {node: learn, call: learner.learn, in: {tokens: "wrap[0].generate.tokens", reward: "wrap[0].score.reward"}, state: {w: update}, out: [loss]}"""


def variants(rows: int, fixed: float, per_row: float, groups: list[int]):
    """name -> workflow IR of each variant (plans made by rose's rewrites)."""
    from rose_dsl import load_workflow_text
    from rose_dsl.serialize import to_yaml
    from rose_dsl.transforms import apply_request, compose

    def text(body: str) -> str:
        return WORKFLOW.format(rows=rows, fixed=fixed, per_row=per_row, body=body)

    flat = load_workflow_text(text(FLAT), "chain.yaml")
    out = {"declared": flat}
    two = compose(apply_request(flat, "split generate 2"), apply_request(apply_request(flat, "split generate 2").workflow,
                                                                        "split score 2")).workflow
    half = rows // 2
    merged = to_yaml(two).replace("generate@0.tokens}", f"'generate.tokens[0:{half}]'}}").replace(
        "generate@1.tokens}", f"'generate.tokens[{half}:{rows}]'}}")
    out["merge_2"] = load_workflow_text(merged, "merge_2.yaml")
    for k in groups:
        out[f"chain_{k}"] = apply_request(flat, f"split-chain generate score {k}").workflow
    looped = load_workflow_text(text(LOOPED), "looped.yaml")
    out["loop_4"] = apply_request(looped, "split wrap 4").workflow
    return out


def run_iterations(wf, first: int, n: int) -> tuple[list[float], list[float]]:
    """Per-iteration wall times of n iterations from `first`, and the learner's loss of each (to check
    that every variant computes the same)."""
    from interpreter.backends import LocalBackend
    from interpreter.schedule import Schedule

    sch = Schedule(wf)
    be = LocalBackend(wf, ("examples.",), sch.program.loops_of)
    times, losses = [], []
    try:
        for k in range(first, first + n):
            t = time.perf_counter()
            submitted = sch.steps(k, be.submit)
            results = [be.result(handles[0], 600) if handles else None for _, handles in submitted]
            times.append(time.perf_counter() - t)
            loss = [r for (step, _), r in zip(submitted, results, strict=True) if step.node.name == "learn"]
            losses.append(float(loss[-1]) if loss and loss[-1] is not None else float("nan"))
    finally:
        be.shutdown()
    return times, losses


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=128)
    ap.add_argument("--fixed-ms", type=float, default=5.0)
    ap.add_argument("--per-row-ms", type=float, default=1.0)
    ap.add_argument("--groups", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iterations", type=int, default=6, help="iterations per variant per round")
    ap.add_argument("--smoke", action="store_true", help="a seconds-long run (16 rows, 2 rounds, 2 iterations)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "chain_pipelining.json")
    args = ap.parse_args()
    if args.smoke:
        args.rows, args.rounds, args.iterations, args.groups = 16, 2, 2, [2, 4]
    plans = variants(args.rows, args.fixed_ms, args.per_row_ms, args.groups)
    names = list(plans)
    raw: dict[str, list[list[float]]] = {n: [] for n in names}
    losses: dict[str, list[float]] = {n: [] for n in names}
    for r in range(args.rounds):
        order = names[r % len(names):] + names[:r % len(names)]  # rotate: no variant always runs first
        for name in order:
            times, loss = run_iterations(plans[name], 0, args.iterations)
            raw[name].append(times)
            losses[name] = loss
    same = all(losses[n] == losses["declared"] for n in names)
    summary = {}
    for name in names:
        per_round = [statistics.median(ts[1:] or ts) for ts in raw[name]]  # the first iteration warms up
        summary[name] = {"median_s": statistics.median(per_round), "min_s": min(per_round), "max_s": max(per_round)}
    base = summary["declared"]["median_s"]
    for name in names:
        summary[name]["speedup"] = base / summary[name]["median_s"]
    import torch

    result = {
        "benchmark": "chain_pipelining",
        "machine": {"platform": platform.platform(), "processor": platform.processor(), "python": platform.python_version(),
                    "cpus": __import__("os").cpu_count()},
        "versions": {"torch": torch.__version__},
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "same_losses": same,
        "summary": summary,
        "raw_s": raw,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(f"{'variant':<10} {'median s':>9} {'min':>7} {'max':>7} {'vs declared':>12}")
    for name in names:
        s = summary[name]
        print(f"{name:<10} {s['median_s']:9.3f} {s['min_s']:7.3f} {s['max_s']:7.3f} {s['speedup']:11.2f}x")
    print(f"identical losses across variants: {same}; wrote {args.out}")
    if not same:
        sys.exit(1)


if __name__ == "__main__":
    main()
