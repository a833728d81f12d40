"""Summarise benchmarks/gpu_scaling.sh's runs: env-steps/s per placement (median over the iterations after
the first, which pays for process start, compilation and NCCL set-up), per-node time, and a bar picture.
  python benchmarks/scaling_summary.py /tmp/scaling   # the runs' directory; the archived runs:
  #   git archive results-archive benchmarks/results/scaling | tar -x"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

RUNS = {  # run directory -> (GPUs, placement, replicas)
    "scale_1gpu": (1, "one GPU (policy + trainer colocated)", 1),
    "scale_2gpu_colocated": (2, "colocated: replica r's policy and trainer on GPU r", 2),
    "scale_2gpu_disaggregated": (2, "disaggregated: policy on GPU 0, trainer on GPU 1", 1),
}


def main() -> None:
    root = Path(sys.argv[1])
    rows = []
    for name, (gpus, placement, replicas) in RUNS.items():
        metrics = [json.loads(line) for line in (root / name / "metrics.jsonl").read_text().splitlines() if line]
        steady = metrics[1:] or metrics
        nodes = json.loads((root / name / "nodes.json").read_text())
        rows.append({"run": name, "gpus": gpus, "placement": placement, "replicas": replicas,
                     "envs": 256 * replicas, "iterations": len(metrics),
                     "env_steps_per_s_median": statistics.median(m["env_steps_per_s"] for m in steady),
                     "iteration_s_median": statistics.median(m["iteration_s"] for m in steady),
                     "per_iteration_s_by_node": {n["node"].removeprefix("iteration."): round(n["per_iteration_s"], 3)
                                                 for n in nodes},
                     "update_call_s": next(n["mean_s"] for n in nodes if n["node"].endswith("update.sgd"))})
    base = rows[0]["env_steps_per_s_median"]
    for r in rows:
        r["throughput_vs_1gpu"] = round(r["env_steps_per_s_median"] / base, 3)
    out = {"workflow": "workflows/embodied_ppo_gpu.yaml (256 Reacher envs per replica, 39M-parameter policy)",
           "machine": "2x NVIDIA H200 (nvidia-h200-x2), 32 cores; torch 2.11, Ray 2.60; MPS on, quotas 100",
           "command": "N=3 bash benchmarks/gpu_scaling.sh", "runs": rows,
           "note": "one pass of each (device time allowed no interleaved repeats); iteration 0 excluded"}
    (root / "summary.json").write_text(json.dumps(out, indent=1) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.2))
    labels = [f"{r['gpus']} GPU{'s' if r['gpus'] > 1 else ''}\n{r['run'].split('_', 2)[-1]}" for r in rows]
    bars = ax.bar(labels, [r["env_steps_per_s_median"] for r in rows], color=["#888", "#4a7", "#47a"])
    for b, r in zip(bars, rows, strict=True):
        ax.text(b.get_x() + b.get_width() / 2, b.get_height(), f"{r['env_steps_per_s_median']:.0f}\n×{r['throughput_vs_1gpu']}",
                ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("env-steps/s (median)")
    ax.set_title("embodied PPO, 256 envs per replica: declared workflow by placement")
    ax.set_ylim(0, max(r["env_steps_per_s_median"] for r in rows) * 1.3)
    fig.tight_layout()
    fig.savefig(root / "scaling.png", dpi=120)
    print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
