"""Write a copy of a plan with some components' MPS settings changed: a `rose compare` row that measures what
stage 2 would screen -- a below-normal client priority or a smaller quota for the process with slack --
without the search.

  python3 benchmarks/plan_mps.py best_async.yaml -o best_async_low.yaml --priority learner=1
  python3 benchmarks/plan_mps.py plan.yaml -o plan_q.yaml --quota learner=70

Why (issue 46): in the long-tail LLM workload's asynchronous plan, the learner runs beside the generation
and slows it (14,580 tokens/s alone, 12,560 beside it), and it has slack, since it finishes first. Whether
a lower priority for it recovers the generation's speed is one interleaved row, far cheaper on the device
than a `rose optimize` run. Why a script and not `rose rewrite --do`: MPS settings are not graph rewrites;
stage 2 writes them the same way, as the component fields `mps_priority` and `mps_quota`
(docs/language.md). A quota below 100 is checked for the GPU's unsafe levels by `rose compare` itself.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

FIELDS = {"priority": ("mps_priority", 0, 1), "quota": ("mps_quota", 1, 100)}


def _setting(text: str, kind: str) -> tuple[str, int]:
    name, sep, value = text.partition("=")
    low, high = FIELDS[kind][1:]
    if not sep or not name or not value.strip().isdigit() or not low <= int(value) <= high:
        raise ValueError(f"--{kind} takes COMPONENT=N with {low} <= N <= {high}, not {text!r}")
    return name, int(value)


def with_mps(doc: dict[str, Any], settings: dict[str, list[str]]) -> dict[str, Any]:
    """`doc` (a workflow or plan document) with the given `--priority`/`--quota` settings on its GPU components;
    raises ValueError naming a component that is missing or not on the GPU."""
    comps = doc.get("components") or {}
    for kind, values in settings.items():
        field = FIELDS[kind][0]
        for text in values:
            name, value = _setting(text, kind)
            if name not in comps:
                raise ValueError(f"no component {name!r} (components: {', '.join(comps)})")
            if comps[name].get("device") != "gpu":
                raise ValueError(f"component {name!r} is not on the GPU: MPS settings do not apply to it")
            comps[name][field] = value
    return doc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("plan", type=Path)
    ap.add_argument("-o", "--out", type=Path, required=True)
    ap.add_argument("--priority", action="append", default=[], help="COMPONENT=0|1 (1: below normal)")
    ap.add_argument("--quota", action="append", default=[], help="COMPONENT=PERCENT")
    args = ap.parse_args()
    try:
        doc = with_mps(yaml.safe_load(args.plan.read_text()), {"priority": args.priority, "quota": args.quota})
    except ValueError as exc:
        print(f"{args.plan}: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    args.out.write_text(yaml.safe_dump(doc, sort_keys=False, width=120))


if __name__ == "__main__":
    main()
