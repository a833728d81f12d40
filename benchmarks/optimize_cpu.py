"""`rose optimize` on the latency-bound CPU workflows, then the declared workflow against the plan it
wrote, measured outside the optimizer: interleaved rounds (declared, plan, declared, plan, ...) of
`rose execute`, each in its own process, the first iteration of each run dropped.

    python3 benchmarks/optimize_cpu.py [--workflows interaction,nested,chain,sim_processes] [--rounds 5] [--iterations 8]
    python3 benchmarks/optimize_cpu.py --smoke        # one workflow, two short rounds (CI-sized)
    python3 benchmarks/optimize_cpu.py --workflows interaction,nested,chain,decode,sim_processes --check
        # the optimizer's speed claims (CHECKS), which the tests do not assert: run on a machine to itself

Writes `--out` (default benchmarks/results/optimize_cpu.json): machine, versions, settings, and per
workflow what the optimizer chose (its rewrites, its own before/after, overhead, trial counts) and
every measured iteration of the A/B rounds with medians, spread and the ratio. Prints a table last.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = {"interaction": "workflows/latency_interaction.yaml", "nested": "workflows/latency_nested.yaml",
             "chain": "workflows/latency_chain.yaml", "sim_processes": "workflows/latency_sim_processes.yaml",
             "decode": "workflows/latency_decode.yaml", "until_episodes": "workflows/latency_until_episodes.yaml"}
# what a workflow's runs need besides the defaults: the simulator-processes one is the `--layout` check, on
# Ray (replicas are processes) for the optimizer and for both sides of the A/B rounds alike
OPTIMIZE_ARGS = {"sim_processes": ["--layout", "sim_replicas=1,2,4", "--backend", "ray"]}
EXECUTE_ARGS = {"sim_processes": ["--backend", "ray"]}

# `--check`: what the optimizer must achieve on each workflow, measured by the A/B rounds outside it (the
# claims the end-to-end tests used to assert on wall time, which depends on the machine's load: issue 42).
# The minimum A/B speedup is below what the 2-core machine measured (benchmarks/results/optimize_cpu.json
# 1.58x / 1.55x / 1.29x, optimize_cpu_decode_2026-12-05.json 1.30x) by the spread of its rounds; the chain's
# is "never slower". `forbid`: over-split plans (eight groups pay eight fixed costs per step: slower).
CHECKS: dict[str, dict[str, Any]] = {
    "interaction": {"min_speedup": 1.3, "any_request": ("split-time epoch", "split epoch.step"), "forbid": " 8"},
    "nested": {"min_speedup": 1.3, "any_request": ("split rollout.step", "split-time rollout"), "forbid": " 8"},
    "chain": {"min_speedup": 0.95},
    "decode": {"min_speedup": 1.15, "any_request": ("split-chain sample decode grade",)},
    "sim_processes": {"min_speedup": 1.2, "layout_more_than": ("sim_replicas", 1)},
    "until_episodes": {"min_speedup": 1.3, "any_request": ("split-time epoch",)},
}


def check(name: str, result: dict[str, Any]) -> list[str]:
    """What `result` (one workflow's `bench`) misses of CHECKS[name]; [] when it holds (or none is set)."""
    want = CHECKS.get(name, {})
    requests = result.get("plan_requests") or []
    misses = []
    if "min_speedup" in want and result["speedup"] < want["min_speedup"]:
        misses.append(f"A/B speedup {result['speedup']:.2f}x < {want['min_speedup']}x")
    if "any_request" in want and not any(q.startswith(want["any_request"]) for q in requests):
        misses.append(f"no rewrite starting with {' or '.join(want['any_request'])} in {requests}")
    if "forbid" in want and any(q.startswith("split") and q.endswith(want["forbid"]) for q in requests):
        misses.append(f"an over-split plan: {requests}")
    if "layout_more_than" in want:
        knob, least = want["layout_more_than"]
        chosen = (result["optimizer"].get("layout") or {}).get("chosen") or {}
        if not chosen.get(knob, least) > least:
            misses.append(f"layout {knob} not above {least}: chosen {chosen or 'the declared one'}")
    return misses


def _rose(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "rose_cli", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


def _iteration_seconds(run: Path) -> list[float]:
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [d["iteration_s"] for d in lines[1:]]  # the first iteration warms up


def _summary(values: list[float]) -> dict[str, Any]:
    med = statistics.median(values)
    return {"n": len(values), "median": med, "min": min(values), "max": max(values), "spread": (max(values) - min(values)) / med}


def _versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in ("torch", "ray", "numpy"):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def bench(name: str, workflow: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    sets = ["--set", "iterations=400"]
    plan = work / name / "plan.yaml"
    r = _rose("optimize", workflow, *sets, "-o", str(plan), "-q", *(["--rounds", "1"] if args.smoke else []),
              *OPTIMIZE_ARGS.get(name, []))
    if r.returncode != 0:
        return {"error": f"rose optimize exited {r.returncode}: {r.stderr.strip()[-800:]}"}
    report = json.loads((work / name / "plan_report" / "report.json").read_text())
    rounds: dict[str, list[list[float]]] = {"declared": [], "plan": []}
    for k in range(args.rounds):
        for config in ("declared", "plan") if k % 2 == 0 else ("plan", "declared"):
            run = work / name / f"{config}-{k}"
            extra = ["--plan", str(plan)] if config == "plan" else sets
            r = _rose("execute", workflow, *extra, "-n", str(args.iterations), "--out", str(run), "-q",
                      *EXECUTE_ARGS.get(name, []))
            if r.returncode != 0:
                return {"error": f"rose execute ({config}) exited {r.returncode}: {r.stderr.strip()[-800:]}"}
            rounds[config].append(_iteration_seconds(run))
    per_round = {c: [statistics.median(v) for v in rs] for c, rs in rounds.items()}
    declared, planned = _summary(per_round["declared"]), _summary(per_round["plan"])
    return {"workflow": workflow, "plan_requests": report["plan_requests"],
            "optimizer": {"speedup": report["speedup"], "baseline_iteration_s": report["baseline_iteration_s"],
                          "plan_iteration_s": report["plan_iteration_s"], "overhead_s": report["overhead_s"],
                          "trials": report["trials"], "stopped": report["stopped"],
                          "model_mean_abs_error": report["model"]["mean_abs_error"],
                          "layout": report.get("layout")},
            "iteration_s": rounds, "round_medians": per_round, "declared": declared, "plan": planned,
            "speedup": declared["median"] / planned["median"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workflows", default="interaction,nested,chain",
                    help=f"comma-separated names ({', '.join(sorted(WORKFLOWS))}) or workflow files (*.yaml)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iterations", type=int, default=8)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "optimize_cpu.json")
    ap.add_argument("--smoke", action="store_true", help="one workflow, two rounds of 3 iterations")
    ap.add_argument("--check", action="store_true", help="exit 1 unless each workflow meets CHECKS (speedup, the "
                                                         "rewrites chosen): on a machine to itself")
    args = ap.parse_args()
    names = ["interaction"] if args.smoke else args.workflows.split(",")
    if args.smoke:
        args.rounds, args.iterations = 2, 3
    files = {Path(n).stem: str(Path(n).resolve()) for n in names if n.endswith((".yaml", ".yml"))}
    unknown = [n for n in names if n not in WORKFLOWS and not n.endswith((".yaml", ".yml"))]
    if unknown:
        ap.error(f"unknown workflow(s) {unknown}; choose from {sorted(WORKFLOWS)} or give workflow files")
    missing = [f for f in files.values() if not Path(f).is_file()]
    if missing:
        ap.error(f"no such workflow file(s): {missing}")
    names = [Path(n).stem if n in files.values() or n.endswith((".yaml", ".yml")) else n for n in names]
    workflows = {**WORKFLOWS, **files}
    work = Path(tempfile.mkdtemp(prefix="rose-optimize-cpu-"))
    try:
        results = {n: bench(n, workflows[n], args, work) for n in names}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    doc = {"machine": {"host": platform.node(), "cpu_count": os.cpu_count(), "platform": platform.platform(),
                       "load_average": os.getloadavg()},
           "versions": _versions(), "settings": {"rounds": args.rounds, "iterations": args.iterations,
                                                "smoke": args.smoke}, "results": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"{'workflow':<12} {'declared s':>11} {'plan s':>9} {'speedup':>8} {'optimizer':>9}  plan")
    failed = False
    for n, r in results.items():
        if "error" in r:
            failed = True
            print(f"{n:<12} error: {r['error'][:200]}")
            continue
        layout = (r["optimizer"].get("layout") or {}).get("chosen")
        chosen = "; ".join([*(f"layout {k}={v}" for k, v in (layout or {}).items()), *r["plan_requests"]])
        print(f"{n:<12} {r['declared']['median']:>11.4f} {r['plan']['median']:>9.4f} {r['speedup']:>7.2f}x "
              f"{r['optimizer']['speedup']:>8.2f}x  {chosen or 'declared'}")
        misses = check(n, r) if args.check else []
        for miss in misses:
            print(f"{'':<12} check failed: {miss}")
        failed = failed or bool(misses)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
