"""Does a plan train what the declared workflow trains? Two fresh `rose execute` runs from the same seed --
the declared workflow and a plan of it (`rose rewrite --do ...`, or a plan file) -- then every
iteration's metrics and the final state of every component, compared value by value.

Why a script and not only the CPU test: on the CPU the tests check bit-identity (same kernels, same
order); on a GPU a plan changes what runs beside what (temporal copies in their own processes, MPS
quotas), which may change the kernels cuBLAS/XLA pick or the order of reductions. The issue asks how
close the GPU results are; this measures it on the real workload and records it with the machine.

    python3 benchmarks/plan_semantics.py workflows/paper_mjx_vla.yaml --iterations 3 \
        --do "split-time epoch 2" --do "interleave epoch" --backend ray --out $OUT/semantics \
        --allow-env JAX_COMPILATION_CACHE_DIR --allow-path /tmp/mjxenv --allow-path .mjxenv
    python3 benchmarks/plan_semantics.py workflows/latency_interaction.yaml --iterations 4 \
        --do "split epoch.step 2" --backend local --out /tmp/sem      # CPU: expect bit-identical

Writes `semantics.json` (per metric and per state tensor: max absolute and relative difference,
whether bit-identical) under --out, and prints a summary. Exit 0 when it ran (identity is a finding,
not a pass/fail), 1 when a run failed.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.lib.common import machine, versions  # noqa: E402


def _rose(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rose_cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def _metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _final_state(run_dir: Path) -> dict[str, Any]:
    from interpreter.checkpoint import latest_complete, load_checkpoint

    path = latest_complete(run_dir / "checkpoints")
    if path is None:
        raise RuntimeError(f"no complete checkpoint in {run_dir}")
    return load_checkpoint(path).states


def _flatten(value: Any, prefix: str, out: dict[str, Any]) -> None:
    """Tensors (and numbers) in nested dicts/lists, by a dotted path."""
    import torch

    if isinstance(value, torch.Tensor):
        out[prefix] = value
    elif isinstance(value, dict):
        for k, v in value.items():
            _flatten(v, f"{prefix}.{k}" if prefix else str(k), out)
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _flatten(v, f"{prefix}[{i}]", out)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        out[prefix] = float(value)


def _diff(a: Any, b: Any) -> dict[str, Any]:
    import torch

    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if a.shape != b.shape or a.dtype != b.dtype:
            return {"identical": False, "note": f"{tuple(a.shape)} {a.dtype} vs {tuple(b.shape)} {b.dtype}"}
        identical = bool(torch.equal(a, b))
        if not a.is_floating_point():
            return {"identical": identical, "numel": a.numel()}
        x, y = a.double(), b.double()
        d = (x - y).abs()
        scale = y.abs().max().item() or 1.0
        return {"identical": identical, "numel": a.numel(), "max_abs": d.max().item() if d.numel() else 0.0,
                "max_rel_to_max": (d.max().item() / scale) if d.numel() else 0.0,
                "frac_equal": (d == 0).double().mean().item() if d.numel() else 1.0}
    fa, fb = float(a), float(b)
    if math.isnan(fa) and math.isnan(fb):
        return {"identical": True, "max_abs": 0.0}
    return {"identical": fa == fb, "max_abs": abs(fa - fb), "rel": abs(fa - fb) / (abs(fb) or 1.0)}


# the LLM reward pool's back-pressure counters (examples/llm/reward.py): how deep its queue got and how often a
# submit waited, which depend on how a plan cuts the calls (row groups submit smaller batches), not on values
BACKPRESSURE = ("queue_high_water", "blocked_submits")


def compare(declared: Path, planned: Path) -> dict[str, Any]:
    """Metrics per iteration (keys both runs report, timing keys left out) and final states. Per metric: the
    largest differences, the first iteration that differs (`first_differs`: on a GPU, whether the plan's first
    iteration already computes differently or a difference only carries over from an update) and both runs'
    values of every iteration (`declared`, `plan`)."""
    ma, mb = _metrics(declared), _metrics(planned)
    def timing(key: str) -> bool:  # how fast (or how the calls were chunked), not what was computed
        return key.startswith(("time/", "sm_activity")) or key.endswith(("_s", "seconds", "throughput")) \
            or key.endswith(BACKPRESSURE)

    metrics: dict[str, dict[str, Any]] = {}
    for it, (ra, rb) in enumerate(zip(ma, mb, strict=False)):
        for k in sorted(set(ra) & set(rb)):
            if k == "iteration" or timing(k):
                continue
            if not isinstance(ra[k], (int, float)) or not isinstance(rb[k], (int, float)):
                continue
            d = _diff(ra[k], rb[k])
            row = metrics.setdefault(k, {"identical": True, "max_abs": 0.0, "max_rel": 0.0, "n": 0,
                                         "first_differs": None, "declared": [], "plan": []})
            if not d["identical"] and row["first_differs"] is None:
                row["first_differs"] = ra.get("iteration", it)
            row["identical"] = row["identical"] and d["identical"]
            row["declared"].append(ra[k])
            row["plan"].append(rb[k])
            row["max_abs"] = max(row["max_abs"], d.get("max_abs", 0.0))
            row["max_rel"] = max(row["max_rel"], d.get("rel", 0.0))
            row["n"] += 1
    sa, sb = _final_state(declared), _final_state(planned)
    flat_a: dict[str, Any] = {}
    flat_b: dict[str, Any] = {}
    _flatten(sa, "", flat_a)
    _flatten(sb, "", flat_b)
    states = {k: _diff(flat_a[k], flat_b[k]) for k in sorted(set(flat_a) & set(flat_b))}
    only = sorted(set(flat_a) ^ set(flat_b))
    return {"iterations": [len(ma), len(mb)], "metrics": metrics, "states": states, "state_keys_in_one_run_only": only,
            "all_metrics_identical": all(r["identical"] for r in metrics.values()),
            "all_states_identical": all(r["identical"] for r in states.values()),
            "max_state_rel_to_max": max((r.get("max_rel_to_max", 0.0) for r in states.values()), default=0.0),
            "max_metric_rel": max((r["max_rel"] for r in metrics.values()), default=0.0)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("workflow")
    ap.add_argument("--do", action="append", default=[], help="a rewrite request (as rose rewrite --do)")
    ap.add_argument("--plan", help="a plan file of WORKFLOW instead of --do (its iteration count must be >= --iterations)")
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--set", action="append", default=[], dest="sets", help="NAME=VALUE for both runs")
    ap.add_argument("--backend", default="ray")
    ap.add_argument("--out", required=True)
    ap.add_argument("--allow-env", action="append", default=[])
    ap.add_argument("--allow-path", action="append", default=[])
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per rose command")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sets = [x for s in [*args.sets, f"iterations={args.iterations}"] for x in ("--set", s)]
    trust = [x for v in args.allow_env for x in ("--allow-env", v)] + [x for v in args.allow_path for x in ("--allow-path", v)]
    plan = Path(args.plan) if args.plan else out / "plan.yaml"
    if not args.plan:
        if not args.do:
            ap.error("give --do REQUEST (one or more) or --plan FILE")
        r = _rose("rewrite", args.workflow, *sets, *[x for d in args.do for x in ("--do", d)], "-o", str(plan),
                  "--overwrite", timeout=args.timeout)
        if r.returncode != 0:
            print(r.stderr, file=sys.stderr)
            return 1
    runs: dict[str, Any] = {}
    for name, extra in (("declared", sets), ("plan", ["--plan", str(plan)])):  # a plan holds its params
        run_dir = out / name
        t = time.perf_counter()
        r = _rose("execute", args.workflow, *extra, "--backend", args.backend, "--out", str(run_dir),
                  "--checkpoint-every", str(args.iterations), "--overwrite", "-q", *trust, timeout=args.timeout)
        runs[name] = {"exit": r.returncode, "wall_s": time.perf_counter() - t, "stderr_tail": r.stderr[-2000:]}
        if r.returncode != 0:
            print(f"{name}: exit {r.returncode}\n{r.stderr[-2000:]}", file=sys.stderr)
            (out / "semantics.json").write_text(json.dumps({"runs": runs}, indent=1))
            return 1
    result = compare(out / "declared", out / "plan")
    doc = {"script": "benchmarks/plan_semantics.py", "argv": sys.argv[1:], "machine": machine(), "versions": versions(),
           "date": time.strftime("%Y-%m-%d %H:%M:%S"), "workflow": args.workflow, "requests": args.do,
           "plan": str(plan), "iterations": args.iterations, "backend": args.backend, "runs": runs, **result}
    (out / "semantics.json").write_text(json.dumps(doc, indent=1))
    print(f"metrics: {'bit-identical' if result['all_metrics_identical'] else 'differ'} "
          f"(largest relative difference {result['max_metric_rel']:.3g}); states: "
          f"{'bit-identical' if result['all_states_identical'] else 'differ'} "
          f"(largest difference {result['max_state_rel_to_max']:.3g} of the tensor's largest value)")
    for k, row in result["metrics"].items():
        if not row["identical"]:
            print(f"  metric {k}: max abs {row['max_abs']:.3g}, max rel {row['max_rel']:.3g} over {row['n']} iterations"
                  f" (first differs at iteration {row['first_differs']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
