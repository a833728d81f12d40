"""How long `rose validate` takes as a workflow grows: load + schema + build + check + analysis.

Generates a workflow of N ExecutionNodes (a chain of loops, each holding a chain of 50 nodes with data
and state edges, carries and collects) and times the validate path in a fresh process per sample (as
the `rose` command runs it; one untimed warm-up on a small workflow first, so that grammar and schema
loading are not counted). With `--baseline REV` the same files are timed with the language library of
that git revision too, alternating A/B round by round. Writes raw timings, medians and spread, machine
and versions to JSON and prints a table last.

    python benchmarks/validate_scale.py --nodes 100,1000,10000 --rounds 5 --baseline fae95f3
    python benchmarks/validate_scale.py --smoke          # a quick check that it runs
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from abtest import ROOT, checkout, git_rev, machine, run_child, spread, versions  # noqa: E402

STAGES = ("load", "build", "check", "analysis")


def make_workflow(nodes: int, per_loop: int = 50) -> str:
    import yaml

    body = []
    prev = None
    n = 0
    loop_id = 0
    while n < nodes:
        loop_id += 1
        inner = []
        for j in range(min(per_loop, nodes - n)):
            node = {"node": f"n{j}", "call": f"c{j % 4}.m{j % 3}", "out": ["y"],
                    "state": {f"s{j % 2}": ["read", "update", "refresh"][j % 3]}}
            ins = {}
            if j > 0:
                ins["a"] = f"n{j - 1}.y"
            else:
                ins["a"] = f"l{loop_id}.v"
            if j > 2:
                ins["b"] = f"n{j - 3}.y"
            node["in"] = ins
            inner.append(node)
            n += 1
        init = f"{prev}.c" if prev else "iteration.i"
        body.append({"loop": f"l{loop_id}", "count": 3, "carry": {"v": {"init": init, "next": f"n{len(inner) - 1}.y"}},
                     "body": inner, "collect": {"c": f"stack(l{loop_id}[*].n0.y)"}})
        prev = f"l{loop_id}"
    doc = {"rose": 1, "name": f"scale-{nodes}", "components": {f"c{i}": {"impl": "examples.x:C", "state": ["s0", "s1"]} for i in range(4)},
           "iteration": {"count": 10, "body": body}}
    return yaml.safe_dump(doc, sort_keys=False)


def child(file: Path) -> dict[str, object]:
    """One timed validation of `file` with whatever `rose_dsl` is first on sys.path."""
    from rose_dsl.analysis import analyze
    from rose_dsl.build import build_workflow
    from rose_dsl.expr import parse_expr
    from rose_dsl.loader import load_text
    from rose_dsl.resolve import check_workflow

    def once(text: str) -> dict[str, float]:
        parse_expr.cache_clear()
        t = [(time.perf_counter(), time.process_time())]
        doc = load_text(text, "scale.yaml")
        t.append((time.perf_counter(), time.process_time()))
        wf = build_workflow(doc)
        t.append((time.perf_counter(), time.process_time()))
        assert not check_workflow(wf)
        t.append((time.perf_counter(), time.process_time()))
        analyze(wf)
        t.append((time.perf_counter(), time.process_time()))
        out = {stage: t[i + 1][0] - t[i][0] for i, stage in enumerate(STAGES)}
        out["total"] = t[-1][0] - t[0][0]
        out["cpu_total"] = t[-1][1] - t[0][1]  # this process's CPU time: less sensitive to a busy machine
        return out

    import rose_dsl

    once(make_workflow(120, per_loop=7))  # warm-up: grammar, schema, regexes
    return {**once(file.read_text()), "rose_dsl": str(Path(rose_dsl.__file__).parent)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", default="100,1000,10000", help="comma-separated workflow sizes")
    ap.add_argument("--rounds", type=int, default=5, help="fresh-process samples per size and variant")
    ap.add_argument("--baseline", help="a git revision to time alongside this checkout (interleaved)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "validate_scale.json")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, 1 round, output to a temporary file")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--root", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--file", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        sys.path.insert(0, str(args.root))
        print(json.dumps(child(args.file)))
        return
    if args.smoke:
        args.nodes, args.rounds = "60,200", 1
        args.out = Path(tempfile.mkdtemp()) / "validate_scale.json"
    sizes = [int(x) for x in args.nodes.split(",")]
    variants = {"current": ROOT}
    if args.baseline:
        variants = {"baseline": checkout(args.baseline), "current": ROOT}
    files = {}
    tmp = Path(tempfile.mkdtemp(prefix="rose-scale-"))
    for n in sizes:
        files[n] = tmp / f"scale-{n}.yaml"
        files[n].write_text(make_workflow(n))
    load_at_start = os.getloadavg()
    raw: dict[str, dict[int, list[dict[str, float]]]] = {v: {n: [] for n in sizes} for v in variants}
    names = list(variants)
    for r in range(args.rounds):
        for n in sizes:
            for v in (names if r % 2 == 0 else names[::-1]):  # A B, then B A: neither always goes first
                raw[v][n].append(run_child(Path(__file__), variants[v], ["--file", str(files[n])]))
    summary = {v: {str(n): {"nodes": n, "bytes": files[n].stat().st_size,
                            "total_s": spread([s["total"] for s in raw[v][n]]),
                            "cpu_total_s": spread([s["cpu_total"] for s in raw[v][n]]),
                            "stages_median_s": {st: spread([s[st] for s in raw[v][n]])["median"] for st in STAGES}}
                   for n in sizes} for v in variants}
    result = {
        "benchmark": "validate_scale",
        "what": "load + schema + build + check + analysis of a generated workflow, one fresh process per sample",
        "config": {"sizes": sizes, "rounds": args.rounds, "per_loop": 50, "order": "interleaved A/B, alternating"},
        "variants": {v: (git_rev(args.baseline) if v == "baseline" else versions()["rose"]) for v in variants},
        "machine": {**machine(), "loadavg_at_start": load_at_start}, "loadavg_at_end": os.getloadavg(),
        "versions": versions(),
        "summary": summary,
        "raw": {v: {str(n): raw[v][n] for n in sizes} for v in variants},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    print(f"load average {result['machine']['loadavg_at_start']} at start, {result['loadavg_at_end']} at end")
    print(f"{'variant':>9} {'nodes':>6} {'median s':>9} {'min':>7} {'max':>7} {'cpu s':>7} {'us/node':>8}  stages (median s)")
    for v in variants:
        for n in sizes:
            t = summary[v][str(n)]["total_s"]
            cpu = summary[v][str(n)]["cpu_total_s"]["median"]
            st = " ".join(f"{k} {summary[v][str(n)]['stages_median_s'][k]:.3f}" for k in STAGES)
            print(f"{v:>9} {n:>6} {t['median']:>9.3f} {t['min']:>7.3f} {t['max']:>7.3f} {cpu:>7.3f} "
                  f"{1e6 * t['median'] / n:>8.1f}  {st}")


if __name__ == "__main__":
    main()
