"""The table of README.md from the runs here: each run's `rose compare` (the optimizer's plan `rose` against
the declared workflow and the hand-written plans, interleaved) and its `rose optimize` log.

    python3 benchmarks/optimize_cpu_unseen_summary.py DIR   # DIR/<run>/compare.json and optimize.log
"""

import json
import re
import sys
from pathlib import Path

HERE = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("/tmp/s44/opt")
out = []
for f in sorted(HERE.glob("*/compare.json")):
    d = json.loads(f.read_text())
    rows = {r["label"]: r for r in d["rows"]}
    hands = {k: v for k, v in rows.items() if k not in ("declared", "rose")}
    if "rose" not in rows or not hands:
        continue
    best = max(hands.values(), key=lambda r: r["speedup"])
    log = (f.parent / "optimize.log").read_text() if (f.parent / "optimize.log").exists() else ""
    plan = re.findall(r"^plan: (.*)$", log, re.M)
    head = re.findall(r"^declared .* per iteration.*$", log, re.M)
    out.append({"run": f.parent.name, "plan": plan[-1] if plan else None, "optimize_headline": head[-1] if head else None,
                "compare_rounds": d["rounds_done"], "declared_s": rows["declared"]["median_s"],
                "rose_speedup": rows["rose"]["speedup"], "rose_spread": rows["rose"]["spread"],
                "best_hand": best["label"], "best_hand_speedup": best["speedup"],
                "rose_over_best_hand": rows["rose"]["speedup"] / best["speedup"],
                "hands": {k: round(v["speedup"], 3) for k, v in hands.items()}})
for o in out:
    print(f"{o['run']:12s} rose {o['rose_speedup']:.2f}x  best hand {o['best_hand_speedup']:.2f}x ({o['best_hand'][:40]})  "
          f"ratio {o['rose_over_best_hand']:.2f}  plan: {o['plan']}")
(HERE / "summary.json").write_text(json.dumps(out, indent=1) + "\n")
