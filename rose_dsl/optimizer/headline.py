"""What a person reads first in a report and on the console: the headline figure -- what was validated,
against the workflow the user wrote -- the legend of the ranking's symbols, and, for each refused rewrite,
the fix.

Why a headline of its own: on an H100 a run reported 1.29x from a declared median with 20% spread after its
before/after had measured 0 rounds; `rose compare` then measured 1.21x (issue 42). With `--layout`, the
table's "declared" was the graph after the layout, so a layout that measured 1.86x read "1.00x" (issue 44).
So the headline says which comparison it is: the before/after, decided by the rule (`stats.py`) --
"validated" -- or, when that was cut short or not decided, the stage's own figure with its spread, marked
"not validated", with the `rose compare` command that would validate it; with a layout, the layout's own
comparison with the declared workflow as written chained with stage 1's.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Mapping
from typing import Any

from .stats import percent

__all__ = ["LEGEND", "headline", "headline_lines", "fix_for", "clip"]

LEGEND = (
    "D_v: the node's invocation time per iteration (all its calls); T(v): the mean time of one call; a_v: its "
    "activity over its calls, time-weighted (on a GPU the SM activity; on the CPU the fraction of the calls' time "
    "its component ran or waited for a CPU, so a call descheduled by load is not idle); tier: 1 when a_v < 50%, 2 "
    "when a_v < 80%, 'excluded' above (the resource is busy, nothing can overlap it); S(v) = D_v (1 - a_v): the "
    "idle time per iteration the node leaves, what overlapping other work with it could gain -- the ranking within "
    "a tier. A node is a target when D_v reaches the eligibility threshold.")

# a refusal's reason -> what the user could change (first match); the reasons are `transforms`' and the search's
_FIXES: tuple[tuple[str, str], ...] = (
    (r"is dependent \(", "its iterations share state (listed): a temporal split needs a free loop -- move the "
                         "state's updates (e.g. the trainer's update) into a loop of their own after it"),
    (r"run different iterations", "fuse the loops before splitting one in time (a combination is applied fuse "
                                  "first), or fuse them in the workflow"),
    (r"runs after '.*': fuse the earlier loop first", "name the earlier loop first"),
    (r"is not batch-separable: it has no 'batch:'", "declare `batch: 0` on the node if row r of its outputs "
                                                    "depends only on row r of its inputs (docs/components.md)"),
    (r"declares the rows of its outputs but is not batch-separable", "none if it truly depends across rows; "
                                                                      "else declare `batch: 0`"),
    (r"rows rose cannot tell", "declare the producer's rows: `batch: {dim: 0, size: N, separable: false}`"),
    (r"batch on dim", "put the batch on dimension 0"),
    (r"groups would leave some empty", "fewer groups than the loop's iterations"),
    (r"ends on a condition \(until\)", "a fixed `count:` where the work allows it"),
    (r"has carried values or collected outputs", "read the loop's iterations as `loop[j]...` instead of collecting"),
    (r"not started with the session|GPU placement", "start rose with the copies' GPU processes (Ray places GPUs "
                                                    "at start): run the plan with `rose execute --plan`"),
    (r"memory|bytes", "more memory on that device, or fewer copies (a smaller group count)"),
    (r"changes nothing", "none: the graph already has that shape"),
    (r"already (contains )?split groups|already a split group|already takes turns", "none: it is split already"),
    (r"depends on|needs|would break|sees|reads", "none without changing the workflow's data flow: the rewrite "
                                                 "would change what a call computes"),
)


def fix_for(reason: str) -> str:
    """What would let a refused rewrite apply (or why nothing should)."""
    for pattern, fix in _FIXES:
        if re.search(pattern, reason):
            return fix
    return "see the reason: it names the declaration that stands in the way"


def clip(text: str, width: int = 200) -> str:
    """`text` on one table line, cut at a word boundary (never mid-word), '|' made safe for Markdown."""
    return textwrap.shorten(text.replace("|", "/"), width=width, placeholder=" ...")


def _chosen_layout(doc: Mapping[str, Any]) -> Mapping[str, Any] | None:
    layout = doc.get("layout") or {}
    chosen = layout.get("chosen")
    if not chosen:
        return None
    return next((r for r in layout.get("candidates") or [] if r.get("values") == chosen and r.get("accepted")), None)


def headline(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The figure the report and the console lead with: speedup over the declared workflow as written, its
    seconds and spreads, whether it is validated, how it was obtained, and what to run to validate it."""
    base, plan = doc["baseline"] or {}, doc["plan"] or {}
    speedup = float(doc["speedup"])
    ba = doc.get("before_after") or {}
    verdict = ba.get("verdict")
    requests = doc.get("plan_requests") or []
    out: dict[str, Any] = {"speedup": speedup, "declared_s": base.get("median"), "declared_spread": base.get("spread"),
                           "plan_s": plan.get("median"), "plan_spread": plan.get("spread"),
                           "validated": bool(ba.get("validated")) or not requests, "verdict": verdict,
                           "rule": ba.get("rule"), "against": "the declared workflow"}
    if not requests:
        out["how"] = "no rewrite kept: the plan is the declared graph"
    elif out["validated"] and verdict:
        out["how"] = (f"before/after, {verdict['n']} interleaved rounds each, decided by the rule with confidence "
                      f"{percent(verdict['confidence'])}")
    else:
        why = (f"the before/after measured {verdict['n']} round(s) and the rule says {verdict['outcome']} "
               f"({verdict['reason']})" if verdict else "no before/after was measured")
        out["how"] = f"not validated: {why}; the figure is the stage's own, declared and plan medians with their spreads"
        out["compare"] = (f"rose compare {doc.get('source_args') or doc['file']} --plan {doc['plan_file']} --rounds 8"
                          + ("" if not doc.get("layout") else " (with the layout's --set values)"))
    row = _chosen_layout(doc)
    if row is not None:
        gain = float(row["speedup"])
        written = (row.get("reference") or {})
        out.update(speedup=speedup * gain, declared_s=written.get("median"), declared_spread=written.get("spread"),
                   layout_gain=gain, against="the declared workflow as written (before the layout)",
                   how=out["how"] + f"; chained with the layout's own comparison ({gain:.2f}x against the workflow "
                                    "as written, blocks interleaved R V R)")
        out["plan_s"] = out["declared_s"] / out["speedup"] if out["declared_s"] and out["speedup"] else out["plan_s"]
    return out


def _spread(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def headline_lines(h: Mapping[str, Any]) -> list[str]:
    """The headline as report.md's first lines."""
    mark = "" if h["validated"] else " -- **not validated**"
    lines = [f"**{h['speedup']:.2f}x** over {h['against']}{mark}: declared {h['declared_s']:.4f} s (spread "
             f"{_spread(h['declared_spread'])}) -> plan {h['plan_s']:.4f} s (spread {_spread(h['plan_spread'])}) per "
             f"iteration. {h['how'][0].upper() + h['how'][1:]}.", ""]
    if h.get("compare"):
        lines += [f"To validate it: `{h['compare']}`.", ""]
    if h.get("rule"):
        lines += [f"Decision rule: {h['rule']}.", ""]
    return lines
