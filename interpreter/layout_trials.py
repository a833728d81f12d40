"""Layout trials on the machine: which value of the workflow's layout knobs (`rose optimize --layout`,
`rose_dsl/optimizer/layouts.py`) trains fastest, measured on complete training iterations.

Each admissible value is measured against the declared layout in blocks A, B, A (value, declared, value):
before each block the components the value changes get fresh processes (`TrialSession.use_layout`), the
block's first iteration is training, not timed (the new processes' start-up), and the others are timed.
Every iteration is a real training iteration (kept): the layouts compute the same thing, so switching
between them keeps training on course. A value is kept only if its iterations are faster than the
declared layout's by more than the noise margin (`decide.faster`); of several, the fastest. This runs
before stage 1, whose rewrites then apply to the chosen layout.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from rose_dsl.ir import Workflow
from rose_dsl.optimizer.decide import faster, summarize
from rose_dsl.optimizer.layouts import Layout

from .backend_base import Unsupported
from .worker import CallFailed

__all__ = ["choose_layout"]


def choose_layout(base: Workflow, candidates: Sequence[Layout], session: Any, settings: Any,
                  log: Callable[[str], None], deadline: float | None = None,
                  stop: Callable[[], str | None] | None = None) -> tuple[Layout | None, dict[str, Any]]:
    """The layout to train with (None: the declared one) and the report's `layout` section. `deadline`
    (a `time.perf_counter()` value) and `stop` end the trials early; a value not measured is not kept."""
    per_block = max(2, settings.validation_rounds // 2 + 1)
    rows: list[dict[str, Any]] = []
    best: tuple[float, Layout, dict[str, Any]] | None = None
    started = time.perf_counter()
    block_s: list[float] = []  # how long a block took (with its switch), to leave the rest of the budget alone

    def no_time(blocks_left: int) -> str | None:
        if stop is not None and stop():
            return stop()
        if deadline is not None and time.perf_counter() + blocks_left * max(block_s, default=0.0) > deadline:
            return "the time budget for layouts is spent"
        return None

    for lay in candidates:
        row: dict[str, Any] = {"values": dict(lay.values), "changed": list(lay.changed)}
        rows.append(row)
        if lay.refused or lay.workflow is None:
            row["refused"] = lay.refused
            log(f"layout {lay.label}: not tried: {lay.refused}")
            continue
        runs: dict[str, list[float]] = {"candidate": [], "reference": []}
        blocks = ((lay.workflow, "candidate"), (base, "reference"), (lay.workflow, "candidate"))
        for j, (wf, key) in enumerate(blocks):
            reason = no_time(len(blocks) - j)  # (a value's blocks are all measured or it is not kept)
            if reason:
                row["not_measured"] = reason
                break
            t = time.perf_counter()
            try:
                session.use_layout(wf)
                got = session.complete([wf], per_block, labels=[f"layout {lay.label}" if key == "candidate" else
                                                                  "layout declared"], guard_first=True)[0]
            except (CallFailed, Unsupported) as exc:
                row["failed"] = str(exc).splitlines()[0]
                break
            if session.last_failures:
                row["failed"] = next(iter(session.last_failures.values()))
                break
            runs[key] += [r.seconds for r in got]
            block_s.append(time.perf_counter() - t)
        session.use_layout(base)  # back to the declared layout (no switch when it already runs)
        if "failed" in row or "not_measured" in row or not runs["candidate"] or not runs["reference"]:
            why = row.get("failed") or row.get("not_measured") or "not measured"
            log(f"layout {lay.label}: {'failed' if 'failed' in row else 'not measured'}: {why}")
            continue
        ref, cand = summarize(runs["reference"]), summarize(runs["candidate"])
        ok, eps = faster(ref, cand, settings.eps_min, settings.z)
        row.update(reference=ref.to_json(), candidate=cand.to_json(), margin=eps, accepted=ok,
                   speedup=ref.median / cand.median if cand.median > 0 else None)
        log(f"layout {lay.label}: {cand.median:.4f} s against {ref.median:.4f} s declared "
            f"({ref.median / cand.median:.2f}x, margin {eps:.1%}): {'kept' if ok else 'not faster'}")
        if ok and (best is None or cand.median < best[0]):
            best = (cand.median, lay, row)
    chosen = best[1] if best is not None else None
    if chosen is not None and chosen.workflow is not None:
        session.use_layout(chosen.workflow)
    summary = (f"{chosen.label}: {best[2]['speedup']:.2f}x on complete iterations" if best is not None and chosen else
               "kept the declared layout (no value was faster by more than the noise)")
    return chosen, {"candidates": rows, "chosen": dict(chosen.values) if chosen else None,
                    "trial_seconds": time.perf_counter() - started, "summary": summary}
