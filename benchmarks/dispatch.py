"""Per-invocation dispatch overhead: rose's backends against plain Ray remote calls and Ray Compiled
Graphs, on the same chain of no-op calls alternating between two component processes.

Each method runs a chain of N dependent calls (a -> b -> a -> ...), so nothing overlaps and the time
per call is the dispatch cost. Methods are interleaved round by round (A, B, C, ... then again) and
the median per-call time over rounds is reported.

    python benchmarks/dispatch.py --calls 200 --rounds 7 --out benchmarks/results/dispatch.json
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


def rose_runner(backend: str, calls: int):
    from interpreter.backends import LocalBackend, RayBackend
    from interpreter.schedule import Schedule
    from rose_dsl import load_workflow_text

    wf = load_workflow_text(CHAIN.format(half=calls // 2), "chain.yaml")
    sch = Schedule(wf)
    cls = {"local": LocalBackend, "ray": RayBackend, "ray-compiled": RayBackend}[backend]
    be = cls(wf, ("examples.",), sch.program.loops_of)
    if backend == "ray-compiled":
        be.compile(sch)
    k = [0]

    def once() -> float:
        # the calls of one iteration, without the per-iteration bookkeeping (metrics, trace collection)
        t = time.perf_counter()
        if backend == "ray-compiled":
            be.execute_iteration(k[0], 600)
        else:
            submitted = sch.steps(k[0], be.submit)
            for _, handles in submitted:
                be.result(handles[0], 600)
        k[0] += 1
        return (time.perf_counter() - t) / calls

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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--cg-calls", type=int, default=40, help="chain length for the compiled graph (it has a node cap)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "dispatch.json")
    args = ap.parse_args()
    import ray

    ray.init(num_cpus=4, include_dashboard=False, logging_level="ERROR")
    methods, closers, errors = {}, [], {}
    for name, make in [("rose_local", lambda: rose_runner("local", args.calls)),
                       ("rose_ray", lambda: rose_runner("ray", args.calls)),
                       ("rose_ray_compiled", lambda: rose_runner("ray-compiled", args.cg_calls)),
                       ("ray_remote_get_each", lambda: plain_ray(args.calls, False)),
                       ("ray_remote_pipelined", lambda: plain_ray(args.calls, True)),
                       ("ray_compiled_graph", lambda: compiled_graph(args.cg_calls))]:
        try:
            once, close = make()
            once()  # warm up
            methods[name] = once
            closers.append(close)
        except Exception as exc:  # noqa: BLE001 - recorded, the others still run
            errors[name] = f"{type(exc).__name__}: {exc}"
    samples: dict[str, list[float]] = {m: [] for m in methods}
    for _ in range(args.rounds):
        for name, once in methods.items():
            samples[name].append(once())
    for close in closers:
        try:
            close()
        except Exception:  # noqa: BLE001
            pass
    ray.shutdown()
    med = {m: statistics.median(v) for m, v in samples.items()}
    result = {
        "benchmark": "dispatch", "calls_per_chain": args.calls, "compiled_graph_calls": args.cg_calls,
        "rounds": args.rounds, "per_call_s": samples, "median_per_call_us": {m: v * 1e6 for m, v in med.items()},
        "errors": errors,
        "machine": {"platform": platform.platform(), "python": platform.python_version(),
                    "cpus": __import__("os").cpu_count()},
        "versions": {"ray": ray.__version__, "torch": __import__("torch").__version__},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    for m, v in sorted(med.items(), key=lambda kv: kv[1]):
        print(f"{m:>24}: {v * 1e6:8.1f} us per call")
    for m, e in errors.items():
        print(f"{m:>24}: failed: {e}")


if __name__ == "__main__":
    main()
