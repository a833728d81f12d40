#!/usr/bin/env bash
# Meta-World reach-v3 learns under `rose execute` on the CPU: PPO with the flow-matching policy, seed 0,
# the workflow's defaults (16 envs, 2 rollout epochs of one 100-step episode = 3,200 env steps per
# iteration, 60 iterations). Writes RES (default runs/metaworld_learn_results/): metrics.jsonl (per iteration),
# run.log (the CLI's output, with its learning curve), summary.json (command, machine, versions, first
# vs last returns and success rates, wall/CPU time, env-steps/s) and curve.png (if matplotlib is there);
# the canonical result is summary.json and curve.png copied to benchmarks/results/metaworld_learn.{json,png}.
#
# Needs `pip install -e '.[metaworld]'` (metaworld 3.1.1, mujoco 3.3.0). Usage (any directory):
#   bash benchmarks/metaworld_learn.sh                   # ~3-4 min on a 2-core VM
#   bash benchmarks/metaworld_learn.sh -n 100            # extra arguments go to `rose execute`
#   RUN=/tmp/mw RES=/tmp/mw_res bash benchmarks/metaworld_learn.sh
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${RUN:-runs/metaworld_learn}
RES=${RES:-runs/metaworld_learn_results}
PY=${PYTHON:-python3}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
CMD=(-m rose_cli execute workflows/embodied_ppo_metaworld.yaml --out "$RUN" --set seed=0 "$@")
rm -rf "$RUN" && mkdir -p "$RUN" "$RES"
LOAD=$(cut -d' ' -f1-3 /proc/loadavg)
/usr/bin/time -f '%e %U %S' -o "$RUN/time.txt" "$PY" "${CMD[@]}" 2>&1 | tee "$RES/run.log"
cp "$RUN/metrics.jsonl" "$RES/metrics.jsonl"

"$PY" - "$RES" "$RUN/time.txt" "$LOAD" "python3 ${CMD[*]}" <<'EOF'
import json
import os
import platform
import subprocess
import sys
from importlib.metadata import version

res, time_file, load, command = sys.argv[1:5]
rows = [json.loads(line) for line in open(os.path.join(res, "metrics.jsonl"))]
wall, user, sys_s = (float(v) for v in open(time_file).read().split()[-3:])
ret = [r["sim/episode_return"] for r in rows]
succ = [r["sim/success_rate"] for r in rows]
env_steps = sum(r["sim/env_steps"] for r in rows)


def mean(xs):
    return sum(xs) / len(xs)


def run(*cmd):
    return subprocess.run(cmd, capture_output=True, text=True).stdout.strip()


summary = {
    "what": "PPO (flow-matching policy) on Meta-World reach-v3 through `rose execute`, CPU, seed 0",
    "command": f"bash benchmarks/metaworld_learn.sh  (runs: {command})",
    "git_commit": run("git", "rev-parse", "HEAD"),
    "git_uncommitted": run("git", "status", "--porcelain", "--untracked-files=no").splitlines(),
    "machine": {"uname": run("uname", "-a"),
                "nproc": os.cpu_count(), "loadavg_at_start": load, "note": "a VM shared with other jobs: wall time is inflated",
                "cpu": next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")},
    "versions": {"python": platform.python_version(),
                 **{p: version(p) for p in ("torch", "mujoco", "metaworld", "gymnasium", "numpy")}},
    "iterations": len(rows), "env_steps": env_steps,
    "episode_return": {"first_5_mean": mean(ret[:5]), "last_5_mean": mean(ret[-5:]), "max_possible": 1000.0},
    "success_rate": {"first_5_mean": mean(succ[:5]), "last_5_mean": mean(succ[-5:])},
    "first_iteration_success_ge_0.9": next((i for i, s in enumerate(succ) if s >= 0.9), None),
    "wall_s": wall, "cpu_s": user + sys_s, "env_steps_per_s_wall": env_steps / wall,
    "iteration_s_median": sorted(r["iteration_s"] for r in rows)[len(rows) // 2],
    "return_per_iteration": [round(v, 1) for v in ret], "success_per_iteration": succ,
}
json.dump(summary, open(os.path.join(res, "summary.json"), "w"), indent=1)
print(json.dumps({k: summary[k] for k in ("iterations", "episode_return", "success_rate", "wall_s", "cpu_s",
                                          "env_steps_per_s_wall")}))
try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    sys.exit(0)
fig, ax = plt.subplots(figsize=(7, 3.6))
ax.plot(ret, color="tab:blue", label="episode return")
ax.set_xlabel("iteration (3,200 env steps each)")
ax.set_ylabel("episode return (max 1000)", color="tab:blue")
ax2 = ax.twinx()
ax2.plot(succ, color="tab:green", label="success rate")
ax2.set_ylabel("success rate", color="tab:green")
ax2.set_ylim(-0.02, 1.02)
ax.set_title(f"Meta-World reach-v3, PPO via rose execute, 2-core CPU, {wall:.0f} s wall")
fig.tight_layout()
fig.savefig(os.path.join(res, "curve.png"), dpi=110)
EOF
