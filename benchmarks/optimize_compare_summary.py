"""Issue 44's check, as one result file: does `rose optimize`'s reported speedup lie within what `rose
compare` then measures for its plan against the declared workflow on the same machine?

  python3 benchmarks/optimize_compare_summary.py REPORT.json COMPARE.json -o optimize_compare.json

The compare interleaves declared and plan round by round, so each round gives one paired ratio (declared
seconds / plan seconds). The compare's range is the compare's speedup widened by the larger of the two rows'
spreads ((max - min) / median of each row's seconds), and further to the smallest and largest paired ratio;
"within" means the report's figure lies in that range. With one round there is no spread and the answer is
null (not measured), never true.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any


def summarize(report: dict[str, Any], compare: dict[str, Any], plan_label: str = "rose") -> dict[str, Any]:
    rows = {row["label"]: row for row in compare["rows"]}
    declared, plan = rows["declared"], rows[plan_label]
    ratios = [d / p for d, p in zip(declared["seconds"], plan["seconds"], strict=False) if p > 0]
    reported, speedup = report["speedup"], plan["speedup"]
    spread = max(declared["spread"], plan["spread"])
    low, high = min([speedup * (1 - spread), *ratios]), max([speedup * (1 + spread), *ratios])
    within = (low <= reported <= high) if len(ratios) >= 2 else None
    return {
        "workflow": report["workflow"],
        "optimize": {"speedup": reported, "plan_requests": report["plan_requests"], "headline": report["headline"],
                     "stopped": report["stopped"], "cut_short": report["cut_short"],
                     "budget_s": report["settings"].get("budget_s"), "overhead_s": report["overhead_s"]},
        "compare": {"rounds": compare["rounds_done"], "declared_s": declared["seconds"], "plan_s": plan["seconds"],
                    "declared_median_s": declared["median_s"], "plan_median_s": plan["median_s"],
                    "declared_spread": declared["spread"], "plan_spread": plan["spread"],
                    "speedup": speedup, "paired_ratios": ratios, "range": [low, high],
                    "paired_ratio_median": statistics.median(ratios) if ratios else None,
                    "throughput": {"declared": declared["throughput"], "plan": plan["throughput"]},
                    "sm_activity": {"declared": declared["sm_activity"], "plan": plan["sm_activity"]}},
        "reported_within_compare_range": within,
        "machine": compare.get("machine") or report["machine"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("report", type=Path)
    ap.add_argument("compare", type=Path)
    ap.add_argument("-o", "--out", type=Path, required=True)
    ap.add_argument("--label", default="rose", help="the plan's row in the compare")
    args = ap.parse_args()
    doc = summarize(json.loads(args.report.read_text()), json.loads(args.compare.read_text()), args.label)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    c = doc["compare"]
    print(f"optimize reported {doc['optimize']['speedup']:.3f}x; compare {c['speedup']:.3f}x over {c['rounds']} "
          f"round(s), range {c['range'][0]:.3f}-{c['range'][1]:.3f}x: within = {doc['reported_within_compare_range']}")


if __name__ == "__main__":
    main()
