"""A timeline picture of one RL iteration from a run's trace: a row per component process, a bar per
invocation coloured by node, and the SM-activity counter when the trace has one.

    python benchmarks/plot_timeline.py RUN_DIR/trace.json OUT.png [--iteration 2]

(matplotlib is not a dependency of rose: `pip install matplotlib` to draw; `timeline()` needs none.)
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from rose_dsl.optimizer.report import tick_label, time_ticks


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("trace", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--iteration", type=int, default=None, help="RL iteration to show (default: the last)")
    ap.add_argument("--title", default=None)
    args = ap.parse_args()
    plot(args.trace, args.out, args.iteration, args.title)
    print(f"wrote {args.out}")


def timeline(trace: Path, iteration: int | None = None) -> dict[str, Any]:
    """What the picture shows, in seconds from the iteration's first call: the RL iteration drawn
    (default: the last), a row per (process, thread) with its bars `(start_s, duration_s, node)`, the
    SM-activity counter `(t_s, percent)`, and the time axis's ticks (round numbers of seconds)."""
    doc = json.loads(trace.read_text())
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    calls = [e for e in events if e.get("ph") == "X"]

    def iteration_of(e: dict) -> int:
        return int((e.get("args", {}).get("loops") or {}).get("iteration", -1))

    its = sorted({iteration_of(e) for e in calls})
    k = iteration if iteration is not None else its[-1]
    calls = [e for e in calls if iteration_of(e) == k]
    t0 = min(e["ts"] for e in calls)  # trace times are microseconds
    t1 = max(e["ts"] + e["dur"] for e in calls)
    rows = sorted({(e["pid"], e.get("tid", 0)) for e in calls})
    spans: dict[tuple[int, int], list[tuple[float, float, str]]] = defaultdict(list)
    for e in calls:
        spans[(e["pid"], e.get("tid", 0))].append(((e["ts"] - t0) / 1e6, e["dur"] / 1e6, e["name"].split("@")[0]))
    counters = [((e["ts"] - t0) / 1e6, next(iter(e["args"].values())))
                for e in events if e.get("ph") == "C" and t0 <= e["ts"] <= t1]
    return {"iteration": k, "span_s": (t1 - t0) / 1e6,
            "rows": [(f"{names.get(p, p)}" + (f" #{t}" if t else ""), spans[(p, t)]) for p, t in rows],
            "nodes": sorted({node for _, bars in spans.items() for *_, node in bars}),
            "activity": counters, "ticks": time_ticks((t1 - t0) / 1e6)}


def plot(trace: Path, out: Path, iteration: int | None = None, title: str | None = None) -> Path:
    """Draw RL iteration `iteration` (default: the last) of a Chrome trace into the PNG `out`, on a time
    axis in seconds with a labelled tick at each round number (`time_ticks`, as the optimizer's SVG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = timeline(trace, iteration)
    rows, nodes = data["rows"], data["nodes"]
    cmap = plt.get_cmap("tab20")
    colour = {n: cmap(i % 20) for i, n in enumerate(nodes)}
    counters = data["activity"]
    fig, axes = plt.subplots(2 if counters else 1, 1, figsize=(14, 2 + 0.6 * len(rows)), sharex=True,
                             gridspec_kw={"height_ratios": [3, 1]} if counters else None, squeeze=False)
    ax = axes[0][0]
    for y, (_, bars) in enumerate(rows):
        for start, dur, name in bars:
            ax.barh(y, dur, left=start, color=colour[name], edgecolor="none")
    ax.set_yticks(range(len(rows)), [label for label, _ in rows])
    ax.set_title(f"{title or trace.parent.name}: RL iteration {data['iteration']}")
    handles = [plt.Rectangle((0, 0), 1, 1, color=colour[n]) for n in nodes]
    ax.legend(handles, [n.removeprefix("iteration.") for n in nodes], fontsize=7, ncol=4, loc="upper right")
    if counters:
        cax = axes[1][0]
        cax.step([t for t, _ in counters], [v for _, v in counters], where="post")
        cax.set_ylabel("SM activity (%)")
    ticks = data["ticks"]
    step = ticks[1] - ticks[0] if len(ticks) > 1 else 1.0
    axes[-1][0].set_xticks(ticks, [tick_label(t, step) for t in ticks])
    axes[-1][0].set_xlim(0, data["span_s"])
    axes[-1][0].set_xlabel("time since the iteration's first call (s)")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


if __name__ == "__main__":
    main()
