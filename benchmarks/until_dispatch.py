"""What a trip of a loop that ends on a condition (`until:`) costs to dispatch, against a `count:` loop of
the same body.

The body is two dependent no-op calls on two component processes (`a.tick` -> `b.tick`, a [rows] counter
each); the loop runs `--trips` trips. Methods, interleaved round by round, median per trip over rounds:

* `count_*`: the body in a `count:` loop (on Ray call by call, and as one compiled graph);
* `until_*`: the body in an `until: b.done` loop with the same bound whose rows never finish early, so it
  runs the same trips -- the difference is the per-trip decision: the driver fetches the condition's
  producer after each trip, and an iteration holding such a loop is dispatched call by call (no compiled
  graph, no recompile per trip);
* `until_*_narrowing`: rows finish at evenly spread trips, so later trips give the calls only the rows not
  done (the per-row path: `Take` of the inputs, the held outputs); per trip run.

    python benchmarks/until_dispatch.py --trips 100 --rounds 7   # -> benchmarks/results/until_dispatch.json
    python benchmarks/until_dispatch.py --smoke
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.dispatch import machine, summarize  # noqa: E402 - after the path is set

BODY = """
rose: 1
name: until-dispatch
params: {{rows: {rows}, trips: {trips}}}
components:
  a: {{impl: "examples.bench.until_loops:Tick", args: {{rows: "${{rows}}", trips: "${{trips}}", spread: {spread}}}}}
  b: {{impl: "examples.bench.until_loops:Tick", args: {{rows: "${{rows}}"}}}}
iteration:
  count: 1000
  body:
    - {{node: start, call: a.start, in: {{it: iteration.i}}, out: [x], batch: {{dim: 0, size: "${{rows}}", separable: false}}}}
    - loop: hop
      count: "${{trips}}"
      {until}
      carry: {{x: {{init: start.x, next: pb.x}}}}
      body:
        - {{node: pa, call: a.tick, in: {{x: hop.x}}, out: [x, done], batch: {{dim: 0, size: "${{rows}}"}}}}
        - {{node: pb, call: b.tick, in: {{x: pa.x}}, out: [x, done], batch: {{dim: 0, size: "${{rows}}"}}}}
"""


def runner(backend: str, kind: str, rows: int, trips: int):
    """One iteration of the loop through rose's backend (as benchmarks/dispatch.py: no per-iteration metrics
    or trace collection); returns a function giving seconds per trip run, and the teardown."""
    from interpreter.backends import LocalBackend, RayBackend
    from interpreter.schedule import Schedule
    from rose_dsl import load_workflow_text

    text = BODY.format(rows=rows, trips=trips, spread="true" if kind == "until_narrowing" else "false",
                       until="until: pb.done" if kind.startswith("until") else "")
    wf = load_workflow_text(text, "until_dispatch.yaml")
    sch = Schedule(wf)
    be = (LocalBackend if backend == "local" else RayBackend)(wf, ("examples.",), sch.program.loops_of)
    compiled = backend == "ray-compiled"
    if compiled:
        be.compile(sch)
    k = [0]

    def once() -> float:
        t = time.perf_counter()
        if compiled:
            be.execute_iteration(k[0], 600)
            ran = trips
        else:
            submitted = sch.steps(k[0], be.submit, lambda h: be.result(h, 600))
            for _, handles in submitted:
                be.result(handles[0], 600)
            ran = sch.trips.get(("iteration", "hop"), trips)
        k[0] += 1
        elapsed = time.perf_counter() - t
        for comp in be.components():
            be.control(comp, "pop_records")
        return elapsed / ran

    return once, be.shutdown


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trips", type=int, default=100)
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--smoke", action="store_true", help="20 trips, 2 rounds (checks that everything runs)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "until_dispatch.json")
    args = ap.parse_args()
    if args.smoke:
        args.trips, args.rounds = 20, 2
    import ray

    ray.init(num_cpus=4, include_dashboard=False, logging_level="ERROR")
    makers = {
        "count_local": ("local", "count"), "until_local": ("local", "until"),
        "until_local_narrowing": ("local", "until_narrowing"),
        "count_ray": ("ray", "count"), "count_ray_compiled": ("ray-compiled", "count"),
        "until_ray": ("ray", "until"), "until_ray_narrowing": ("ray", "until_narrowing"),
    }
    methods, closers, errors = {}, [], {}
    for name, (backend, kind) in makers.items():
        try:
            once, close = runner(backend, kind, args.rows, args.trips)
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
        close()
    ray.shutdown()
    stats = summarize(samples)
    med = {m: s["median_us"] for m, s in stats.items()}
    ratios = {f"{u}/{c}": med[u] / med[c] for u, c in (("until_ray", "count_ray"), ("until_ray", "count_ray_compiled"),
                                                      ("until_local", "count_local"),
                                                      ("until_ray_narrowing", "until_ray")) if u in med and c in med}
    result = {
        "benchmark": "until_dispatch", "trips": args.trips, "rows": args.rows, "calls_per_trip": 2,
        "rounds": args.rounds, "smoke": args.smoke, "per_trip_s": samples, "median_per_trip_us": med,
        "stats_us": stats, "ratios": ratios, "errors": errors, "machine": machine(),
        "versions": {"ray": ray.__version__, "torch": __import__("torch").__version__, "python": sys.version.split()[0]},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    for m, s in sorted(stats.items(), key=lambda kv: kv[1]["median_us"]):
        print(f"{m:>24}  {s['median_us']:8.1f} us/trip  ({s['p25_us']:.1f}-{s['p75_us']:.1f})")
    for r, v in ratios.items():
        print(f"{r:>40}: {v:.2f}x")
    for m, e in errors.items():
        print(f"{m:>24}: failed: {e}")


if __name__ == "__main__":
    main()
