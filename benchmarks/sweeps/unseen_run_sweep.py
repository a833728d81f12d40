"""Third unseen-workflow sweep's driver (its workflows are in the archived sweep's folder: `git archive results-archive benchmarks/results/optimize_cpu_unseen_2026-12-05c | tar -x` (repository root) first): the measuring logic of benchmarks/optimize_cpu.py (bench()), adapted so each workflow
can take its own `--set`s and the optimizer a `--budget-s`, and so the work directory (plans, reports, run
directories) is kept under WORK. Each command gets a 300-s timeout (a hang is recorded as an error).

    WORK=/tmp/sw3/work python3 run_sweep.py --workflows x1_grpo_branches.yaml,... [--rounds 4] [--iterations 8]
        [--budget-s 75] [--opt-iterations 300] [--sets x4_param_count=episodes=1] --out results.json
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WORK = Path(os.environ.get("WORK", "/tmp/sw3/work"))


def rose(*args, timeout=300):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    t0 = time.time()
    try:
        r = subprocess.run([sys.executable, "-m", "rose_cli", *args], cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=timeout)
        return r.returncode, r.stdout, r.stderr, time.time() - t0
    except subprocess.TimeoutExpired as e:
        return "timeout", str(e.stdout or ""), str(e.stderr or ""), time.time() - t0


def secs(run):
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [d["iteration_s"] for d in lines[1:]]


def summary(v):
    med = statistics.median(v)
    return {"n": len(v), "median": med, "min": min(v), "max": max(v), "spread": (max(v) - min(v)) / med}


def bench(name, wf, args, extra_sets):
    sets = ["--set", f"iterations={args.opt_iterations}", *[x for s in extra_sets for x in ("--set", s)]]
    plan = WORK / name / "plan.yaml"
    (WORK / name).mkdir(parents=True, exist_ok=True)
    rc, out, err, dt = rose("optimize", wf, *sets, "-o", str(plan), "-q", "--budget-s", str(args.budget_s))
    res = {"workflow": wf, "sets": sets, "optimize_wall_s": dt, "optimize_rc": rc}
    if rc != 0:
        res["error"] = f"rose optimize exited {rc}: {err.strip()[-1500:]}"
        return res
    report = json.loads((WORK / name / "plan_report" / "report.json").read_text())
    rounds = {"declared": [], "plan": []}
    for k in range(args.rounds):
        for config in ("declared", "plan") if k % 2 == 0 else ("plan", "declared"):
            run = WORK / name / f"{config}-{k}"
            extra = ["--plan", str(plan)] if config == "plan" else sets
            rc, out, err, dt = rose("execute", wf, *extra, "-n", str(args.iterations), "--out", str(run), "-q")
            if rc != 0:
                res["error"] = f"rose execute ({config}, round {k}) exited {rc}: {err.strip()[-1500:]}"
                return res
            rounds[config].append(secs(run))
    per_round = {c: [statistics.median(v) for v in rs] for c, rs in rounds.items()}
    d, p = summary(per_round["declared"]), summary(per_round["plan"])
    res.update({"plan_requests": report["plan_requests"],
                "optimizer": {"speedup": report["speedup"], "baseline_iteration_s": report["baseline_iteration_s"],
                              "plan_iteration_s": report["plan_iteration_s"], "overhead_s": report["overhead_s"],
                              "trials": report["trials"], "stopped": report["stopped"]},
                "iteration_s": rounds, "round_medians": per_round, "declared": d, "plan": p,
                "speedup": d["median"] / p["median"]})
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workflows", required=True)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--iterations", type=int, default=8)
    ap.add_argument("--budget-s", type=float, default=75)
    ap.add_argument("--opt-iterations", type=int, default=300)
    ap.add_argument("--sets", action="append", default=[], help="STEM=NAME=VALUE")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    extra = {}
    for s in args.sets:
        stem, kv = s.split("=", 1)
        extra.setdefault(stem, []).append(kv)
    doc = json.loads(args.out.read_text()) if args.out.exists() else {"results": {}}
    for f in args.workflows.split(","):
        f = str(Path(f).resolve())
        name = Path(f).stem + ("" if Path(f).stem not in extra else "__" + "_".join(extra[Path(f).stem]).replace("=", ""))
        t0 = time.time()
        r = bench(name, f, args, extra.get(Path(f).stem, []))
        r["wall_s"] = time.time() - t0
        r["load_average_after"] = os.getloadavg()
        doc["results"][name] = r
        args.out.write_text(json.dumps(doc, indent=1) + "\n")
        if "error" in r:
            print(f"{name}: ERROR {r['error'][:600]}", flush=True)
        else:
            print(f"{name}: declared {r['declared']['median']:.4f} plan {r['plan']['median']:.4f} "
                  f"speedup {r['speedup']:.2f}x optimizer {r['optimizer']['speedup']:.2f}x "
                  f"plan {'; '.join(r['plan_requests']) or 'declared'} ({r['wall_s']:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
