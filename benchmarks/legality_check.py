"""How long one rewrite with its legality check takes on the embodied workflow (the optimizer runs it
for every candidate, thousands of times, in one warm process).

For each request (`rose rewrite --do` syntax) it times `transforms.apply_request`: the rewrite and every
check it runs (well-formedness, and the order oracle on the invocation graphs of two RL iterations), in
a warm process, requests round-robin: `rewrite_cold` with no graph kept, `rewrite` right after (the
original's graph kept, as for an optimizer's second and later candidates), `rewrite_cpu` the latter's
process CPU time. For where the time goes, the pieces alone: the invocation graph of the original and
of the rewritten workflow, and `check_workflow` of the rewritten one. With
`--baseline REV` the same is timed with the language library of that git revision, alternating A/B
process by process. Writes raw timings, medians and spread, machine and versions to JSON.

    python benchmarks/legality_check.py --rounds 5 --baseline fae95f3
    python benchmarks/legality_check.py --smoke
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

# (label, request, request that prepares the workflow first or None)
REQUESTS = [
    ("split step 2", "split step 2", None),
    ("split-time epoch 2", "split-time epoch 2", None),
    ("fuse epoch update", "fuse epoch update", None),
    ("interleave step (after split step 2)", "interleave step", "split step 2"),
    ("rewire publish before update (refused)", "rewire publish before update", None),
]
PIECES = ("rewrite_cold", "graph_original", "graph_rewritten", "check_rewritten")


def child(workflow: Path, inner: int) -> dict[str, object]:
    """Time every request `inner` times (round-robin, after one warm-up each) with the `rose_dsl` first
    on sys.path."""
    import rose_dsl
    from rose_dsl import analysis, load_workflow
    from rose_dsl.analysis import invocation_graph
    from rose_dsl.resolve import check_workflow
    from rose_dsl.transforms import Refused, apply_request

    forget = getattr(analysis, "clear_graph_cache", lambda: None)  # graphs kept by workflow (newer versions)

    wf = load_workflow(workflow)
    cases = []
    for label, request, prepare in REQUESTS:
        base = apply_request(wf, prepare).workflow if prepare else wf
        try:
            new = apply_request(base, request).workflow
            outcome = "applied"
        except Refused:
            new, outcome = None, "refused"
        cases.append((label, request, base, new, outcome))

    def timed(fn, cpu: list[float] | None = None) -> float:
        t, c = time.perf_counter(), time.process_time()
        try:
            fn()
        except Refused:
            pass
        if cpu is not None:
            cpu.append(time.process_time() - c)
        return time.perf_counter() - t

    out: dict[str, dict[str, list[float]]] = {label: {"rewrite": [], "rewrite_cpu": [], **{p: [] for p in PIECES}}
                                              for label, *_ in cases}
    for rep in range(inner + 1):
        for label, request, base, new, _ in cases:
            cpu: list[float] = []
            forget()
            samples = {"rewrite_cold": timed(lambda b=base, r=request: apply_request(b, r)),
                       "rewrite": timed(lambda b=base, r=request: apply_request(b, r), cpu)}
            samples["rewrite_cpu"] = cpu[0]
            forget()
            samples["graph_original"] = timed(lambda b=base: invocation_graph(b, 2))
            if new is not None:
                forget()
                samples["graph_rewritten"] = timed(lambda n=new: invocation_graph(n, 2))
                samples["check_rewritten"] = timed(lambda n=new: check_workflow(n))
            if rep:  # the first round warms up
                for k, v in samples.items():
                    out[label][k].append(v)
    g = invocation_graph(wf, 2)
    return {"times": out, "outcome": {label: o for label, *_, o in cases}, "invocations": len(g.order),
            "edges": sum(1 for _ in g.edges()), "rose_dsl": str(Path(rose_dsl.__file__).parent)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workflow", type=Path, default=ROOT / "workflows" / "embodied_ppo.yaml")
    ap.add_argument("--rounds", type=int, default=5, help="fresh processes per variant")
    ap.add_argument("--inner", type=int, default=10, help="timed repeats of each request per process")
    ap.add_argument("--baseline", help="a git revision to time alongside this checkout (interleaved)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "legality_check.json")
    ap.add_argument("--smoke", action="store_true", help="1 round, 2 repeats, output to a temporary file")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--root", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        sys.path.insert(0, str(args.root))
        print(json.dumps(child(args.workflow, args.inner)))
        return
    if args.smoke:
        args.rounds, args.inner = 1, 2
        args.out = Path(tempfile.mkdtemp()) / "legality_check.json"
    variants = {"current": ROOT}
    if args.baseline:
        variants = {"baseline": checkout(args.baseline), "current": ROOT}
    names = list(variants)
    load_at_start = os.getloadavg()
    runs: dict[str, list[dict]] = {v: [] for v in variants}
    for r in range(args.rounds):
        for v in (names if r % 2 == 0 else names[::-1]):
            runs[v].append(run_child(Path(__file__), variants[v], ["--workflow", str(args.workflow), "--inner", str(args.inner)]))
    labels = [label for label, *_ in REQUESTS]
    summary = {}
    for v in variants:
        summary[v] = {}
        for label in labels:
            entry = {}
            for piece in ("rewrite", "rewrite_cpu", *PIECES):
                samples = [t for run in runs[v] for t in run["times"][label][piece]]
                if samples:
                    entry[piece + "_s"] = spread(samples)
            entry["outcome"] = runs[v][0]["outcome"][label]
            summary[v][label] = entry
    result = {
        "benchmark": "legality_check",
        "what": "transforms.apply_request (rewrite + legality checks) on a warm process; pieces timed alone",
        "workflow": str(args.workflow.relative_to(ROOT)) if args.workflow.is_relative_to(ROOT) else str(args.workflow),
        "invocations_two_iterations": runs["current"][0]["invocations"], "edges": runs["current"][0]["edges"],
        "config": {"rounds": args.rounds, "inner": args.inner, "order": "interleaved A/B processes, requests round-robin"},
        "variants": {v: (git_rev(args.baseline) if v == "baseline" else versions()["rose"]) for v in variants},
        "machine": {**machine(), "loadavg_at_start": load_at_start}, "loadavg_at_end": os.getloadavg(),
        "versions": versions(), "summary": summary,
        "raw": {v: [run["times"] for run in runs[v]] for v in variants},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}  ({result['invocations_two_iterations']} invocations, {result['edges']} edges over two iterations)")
    print(f"load average {result['machine']['loadavg_at_start']} at start, {result['loadavg_at_end']} at end")
    print(f"{'variant':>9} {'request':<40} {'median ms':>9} {'q1':>6} {'q3':>6} {'max':>6} {'cpu ms':>6}  pieces (median ms)")
    for v in variants:
        for label in labels:
            e = summary[v][label]
            t = e["rewrite_s"]
            pieces = " ".join(f"{p} {1e3 * e[p + '_s']['median']:.1f}" for p in PIECES if p + "_s" in e)
            print(f"{v:>9} {label:<40} {1e3 * t['median']:>9.1f} {1e3 * t['q1']:>6.1f} {1e3 * t['q3']:>6.1f} "
                  f"{1e3 * t['max']:>6.1f} {1e3 * e['rewrite_cpu_s']['median']:>6.1f}  {pieces}")


if __name__ == "__main__":
    main()
