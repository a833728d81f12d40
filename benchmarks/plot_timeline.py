"""A timeline picture of one RL iteration from a run's trace: a row per component process, a bar per
invocation coloured by node, and the SM-activity counter when the trace has one.

    python benchmarks/plot_timeline.py RUN_DIR/trace.json OUT.png [--iteration 2]
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("trace", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--iteration", type=int, default=None, help="RL iteration to show (default: the last)")
    ap.add_argument("--title", default=None)
    args = ap.parse_args()
    plot(args.trace, args.out, args.iteration, args.title)
    print(f"wrote {args.out}")


def plot(trace: Path, out: Path, iteration: int | None = None, title: str | None = None) -> Path:
    """Draw RL iteration `iteration` (default: the last) of a Chrome trace into the PNG `out`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    doc = json.loads(trace.read_text())
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    calls = [e for e in events if e.get("ph") == "X"]

    def iteration_of(e: dict) -> int:
        return int((e.get("args", {}).get("loops") or {}).get("iteration", -1))

    its = sorted({iteration_of(e) for e in calls})
    k = iteration if iteration is not None else its[-1]
    calls = [e for e in calls if iteration_of(e) == k]
    t0 = min(e["ts"] for e in calls)
    t1 = max(e["ts"] + e["dur"] for e in calls)
    rows = sorted({(e["pid"], e.get("tid", 0)) for e in calls})
    nodes = sorted({e["name"].split("@")[0] for e in calls})
    cmap = plt.get_cmap("tab20")
    colour = {n: cmap(i % 20) for i, n in enumerate(nodes)}
    counters = [e for e in events if e.get("ph") == "C" and t0 <= e["ts"] <= t1]
    fig, axes = plt.subplots(2 if counters else 1, 1, figsize=(14, 2 + 0.6 * len(rows)), sharex=True,
                             gridspec_kw={"height_ratios": [3, 1]} if counters else None, squeeze=False)
    ax = axes[0][0]
    spans = defaultdict(list)
    for e in calls:
        spans[(e["pid"], e.get("tid", 0))].append(e)
    for y, row in enumerate(rows):
        for e in spans[row]:
            name = e["name"].split("@")[0]
            ax.barh(y, e["dur"] / 1e3, left=(e["ts"] - t0) / 1e3, color=colour[name], edgecolor="none")
    ax.set_yticks(range(len(rows)), [f"{names.get(p, p)}" + (f" #{t}" if t else "") for p, t in rows])
    ax.set_title(f"{title or trace.parent.name}: RL iteration {k}")
    handles = [plt.Rectangle((0, 0), 1, 1, color=colour[n]) for n in nodes]
    ax.legend(handles, [n.removeprefix("iteration.") for n in nodes], fontsize=7, ncol=4, loc="upper right")
    if counters:
        cax = axes[1][0]
        xs = [(e["ts"] - t0) / 1e3 for e in counters]
        ys = [next(iter(e["args"].values())) for e in counters]  # percent
        cax.step(xs, ys, where="post")
        cax.set_ylabel("SM activity")
    axes[-1][0].set_xlabel("ms")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


if __name__ == "__main__":
    main()
