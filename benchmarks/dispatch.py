"""Per-invocation dispatch overhead: rose's backends against plain Ray remote calls and Ray Compiled
Graphs, on the same chain of no-op calls alternating between two component processes.

Each method runs a chain of N dependent calls (a -> b -> a -> ...), so nothing overlaps and the time
per call is the dispatch cost. Methods are interleaved round by round (A, B, C, ... then again) and
the median per-call time over rounds is reported, with the spread, side by side in one JSON file
(machine, versions, config, raw timings) -- the figure that matters is rose's compiled backend
against the bare compiled graph (`ratio_to_bare_compiled_graph`).

    python benchmarks/dispatch.py --calls 200 --rounds 7 --out benchmarks/results/dispatch.json
    python benchmarks/dispatch.py --smoke        # a quick check that every method runs
    python benchmarks/dispatch.py --baseline DIR # also DIR/interpreter's compiled backend (before/after)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CHAIN = """
rose: 1
name: dispatch-chain
components:
  a: {{impl: "examples.bench.load:Echo"}}
  b: {{impl: "examples.bench.load:Echo"}}
iteration:
  count: 1
  body:
    - loop: hop
      count: {half}
      carry: {{x: {{init: iteration.i, next: pb.y}}}}
      body:
        - {{node: pa, call: a.f, in: {{x: hop.x}}, out: [y]}}
        - {{node: pb, call: b.f, in: {{x: pa.y}}, out: [y]}}
"""


def rose_runner(backend: str, calls: int, package: str = "interpreter"):
    """One iteration of the chain workflow through rose's backend (without the runner's per-iteration
    bookkeeping: metrics, trace collection), per call. `package`: another copy of the runtime to
    measure side by side (`--baseline`)."""
    import importlib

    from rose_dsl import load_workflow_text

    backends = importlib.import_module(f"{package}.backends")
    schedule = importlib.import_module(f"{package}.schedule")
    wf = load_workflow_text(CHAIN.format(half=calls // 2), "chain.yaml")
    sch = schedule.Schedule(wf)
    if backend == "local":
        be = backends.LocalBackend(wf, ("examples.",), sch.program.loops_of)
    elif backend == "ray-compiled" and hasattr(backends, "RayCompiledBackend"):  # a baseline from before compile()
        be = backends.RayCompiledBackend(wf, ("examples.",), sch.program.loops_of)
    else:
        be = backends.RayBackend(wf, ("examples.",), sch.program.loops_of)
    if backend == "ray-compiled":
        be.compile(sch)
    k = [0]

    def once() -> float:
        t = time.perf_counter()
        if backend == "ray-compiled":
            be.execute_iteration(k[0], 600)
        else:
            submitted = sch.steps(k[0], be.submit)
            for _, handles in submitted:
                be.result(handles[0], 600)
        k[0] += 1
        elapsed = time.perf_counter() - t
        for comp in be.components():  # the records would pile up otherwise (the runner collects them)
            be.control(comp, "pop_records")
        return elapsed / calls

    return once, be.shutdown


def plain_ray(calls: int, pipelined: bool):
    import ray

    from examples.bench.load import Echo

    Actor = ray.remote(Echo)
    a, b = Actor.options(num_cpus=0).remote(), Actor.options(num_cpus=0).remote()
    ray.get([a.f.remote(0), b.f.remote(0)])

    def once() -> float:
        t = time.perf_counter()
        x = 0
        for i in range(calls):
            actor = a if i % 2 == 0 else b
            x = actor.f.remote(x) if pipelined else ray.get(actor.f.remote(x))
        if pipelined:
            ray.get(x)
        return (time.perf_counter() - t) / calls

    return once, lambda: (ray.kill(a), ray.kill(b))


def compiled_graph(calls: int):
    import ray
    from ray.dag import InputNode

    from examples.bench.load import Echo

    Actor = ray.remote(Echo)
    a, b = Actor.options(num_cpus=0).remote(), Actor.options(num_cpus=0).remote()
    with InputNode() as inp:
        x = inp
        for i in range(calls):
            x = (a if i % 2 == 0 else b).f.bind(x)
    dag = x.experimental_compile()
    ray.get(dag.execute(0))

    def once() -> float:
        t = time.perf_counter()
        ray.get(dag.execute(1))
        return (time.perf_counter() - t) / calls

    def close():
        dag.teardown()
        ray.kill(a)
        ray.kill(b)

    return once, close


def _baseline(directory: Path) -> str:
    """Make `directory/interpreter` importable as `interpreter_baseline` (its imports are relative) --
    in Ray's workers too, through PYTHONPATH -- and return that name."""
    import shutil
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="rose-baseline-"))
    shutil.copytree(directory / "interpreter", root / "interpreter_baseline")
    sys.path.insert(0, str(root))
    os.environ["PYTHONPATH"] = os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])
    return "interpreter_baseline"


def machine() -> dict:
    info = {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count()}
    try:
        info["cpu"] = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                           if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    try:
        import torch

        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    try:
        info["commit"] = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                                        timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        pass
    return info


def summarize(samples: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    out = {}
    for name, values in samples.items():
        us = sorted(v * 1e6 for v in values)
        q = statistics.quantiles(us, n=4) if len(us) > 1 else [us[0]] * 3
        out[name] = {"median_us": statistics.median(us), "p25_us": q[0], "p75_us": q[2], "min_us": us[0],
                     "max_us": us[-1]}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=200, help="chain length for the per-call methods")
    ap.add_argument("--cg-calls", type=int, default=40,
                    help="chain length for both compiled graphs (rose's and the bare one; Ray caps a graph's size)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--methods", default="all", help="comma-separated subset of the methods")
    ap.add_argument("--smoke", action="store_true", help="short chains, 2 rounds (checks that everything runs)")
    ap.add_argument("--baseline", type=Path, default=None,
                    help="a directory holding another version's `interpreter/` package (e.g. `git archive REV "
                         "interpreter | tar -x -C DIR`): its compiled backend is measured in the same rounds")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "dispatch.json")
    args = ap.parse_args()
    if args.smoke:
        args.calls, args.cg_calls, args.rounds = 20, 10, 2
    import ray

    ray.init(num_cpus=4, include_dashboard=False, logging_level="ERROR")
    makers = {
        "rose_local": lambda: rose_runner("local", args.calls),
        "rose_ray": lambda: rose_runner("ray", args.calls),
        "rose_ray_compiled": lambda: rose_runner("ray-compiled", args.cg_calls),
        "ray_remote_get_each": lambda: plain_ray(args.calls, False),
        "ray_remote_pipelined": lambda: plain_ray(args.calls, True),
        "ray_compiled_graph": lambda: compiled_graph(args.cg_calls),
    }
    if args.baseline is not None:
        makers["rose_ray_compiled_baseline"] = lambda: rose_runner("ray-compiled", args.cg_calls, _baseline(args.baseline))
    chosen = list(makers) if args.methods == "all" else args.methods.split(",")
    methods, closers, errors = {}, [], {}
    for name in chosen:
        try:
            once, close = makers[name]()
            once()  # warm up
            methods[name] = once
            closers.append(close)
        except Exception as exc:  # noqa: BLE001 - recorded in the results; the other methods still run
            errors[name] = f"{type(exc).__name__}: {exc}"
    samples: dict[str, list[float]] = {m: [] for m in methods}
    for _ in range(args.rounds):
        for name, once in methods.items():
            samples[name].append(once())
    for close in closers:
        try:
            close()
        except Exception as exc:  # noqa: BLE001 - teardown of a benchmark; said, not fatal
            print(f"warning: teardown: {type(exc).__name__}: {exc}", file=sys.stderr)
    ray.shutdown()
    stats = summarize(samples)
    bare = stats.get("ray_compiled_graph", {}).get("median_us")
    result = {
        "benchmark": "dispatch", "calls_per_chain": args.calls, "compiled_graph_calls": args.cg_calls,
        "rounds": args.rounds, "smoke": args.smoke, "per_call_s": samples,
        "median_per_call_us": {m: s["median_us"] for m, s in stats.items()}, "stats_us": stats,
        "ratio_to_bare_compiled_graph": {m: s["median_us"] / bare for m, s in stats.items()} if bare else {},
        "errors": errors, "machine": machine(),
        "versions": {"ray": ray.__version__, "torch": __import__("torch").__version__},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{'method':>24}  {'median':>8}  {'p25-p75':>15}  vs bare CG")
    for m, s in sorted(stats.items(), key=lambda kv: kv[1]["median_us"]):
        ratio = f"{s['median_us'] / bare:5.2f}x" if bare else ""
        print(f"{m:>24}  {s['median_us']:6.1f}us  {s['p25_us']:6.1f}-{s['p75_us']:6.1f}us  {ratio}")
    for m, e in errors.items():
        print(f"{m:>24}: failed: {e}")


if __name__ == "__main__":
    main()
