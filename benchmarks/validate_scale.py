"""How long `rose validate` takes on a large workflow (issue: under 1 s for 2,000 nodes on the CPU machine).

Generates a workflow of N ExecutionNodes (a chain of loops, each holding a chain of nodes with data
and state edges, carries and collects), then times the full validate path in-process: load, schema,
build, resolve, analysis summary (median of repeats). Writes JSON to benchmarks/results/.

    python benchmarks/validate_scale.py --nodes 2000
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rose_dsl import load_workflow_text  # noqa: E402
from rose_dsl.analysis import analyze  # noqa: E402


def make_workflow(nodes: int, per_loop: int = 50) -> str:
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "validate_scale.json")
    args = ap.parse_args()
    text = make_workflow(args.nodes)
    times = []
    for _ in range(args.repeats):
        from rose_dsl.expr import parse_expr

        parse_expr.cache_clear()
        t0 = time.perf_counter()
        wf = load_workflow_text(text, "scale.yaml")
        analyze(wf)
        times.append(time.perf_counter() - t0)
    result = {
        "benchmark": "validate_scale",
        "nodes": args.nodes,
        "bytes": len(text),
        "seconds": times,
        "median_s": statistics.median(times),
        "machine": {"platform": platform.platform(), "python": platform.python_version(), "processor": platform.processor(),
                    "cpus": __import__("os").cpu_count()},
        "versions": {"rose": subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                                            text=True).stdout.strip(),
                     "pyyaml": yaml.__version__, "lark": __import__("lark").__version__,
                     "jsonschema": __import__("importlib.metadata").metadata.version("jsonschema")},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"validate {args.nodes} nodes ({len(text) / 1e3:.0f} kB): median {result['median_s']:.3f} s over {args.repeats} runs")


if __name__ == "__main__":
    main()
