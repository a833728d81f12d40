"""Layout trials on the machine: which value of the workflow's layout knobs (`rose optimize --layout`,
`rose_dsl/optimizer/layouts.py`) trains fastest, measured on complete training iterations.

The values are measured in blocks between blocks of the declared layout: R, V1, R, V2, R, ... Each value
is compared with the two reference blocks around it (R V R: a drift in time hits both sides alike) and has
as many timed iterations as they have together; neighbouring values share a reference block, so n values
cost 2n + 1 blocks and 2n process switches (blocks A, B, A per value cost 3n and 3n). Before each block
the components the block's layout changes get fresh processes (`TrialSession.use_layout`); a block's first
iteration is training, not timed (the new processes' start-up). Every iteration is a real training
iteration (kept): the layouts compute the same thing, so switching between them keeps training on course.
A value is kept only if its iterations are faster than its references' by more than the noise margin
(`decide.faster`); of several, the fastest. A value is started only if its block and the next reference
block fit in what is left of the layouts' budget, by an estimate from the blocks measured so far; the ones
that do not fit are reported with the time they would have needed. This runs before stage 1, whose
rewrites then apply to the chosen layout.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from rose_dsl.ir import Workflow
from rose_dsl.optimizer.decide import faster, summarize
from rose_dsl.optimizer.layouts import Layout

from .backend_base import Unsupported
from .worker import CallFailed

__all__ = ["choose_layout"]


class _BlockFailed(Exception):
    """A block's iteration failed (the trial is lost, training goes on): the session's reason."""


def choose_layout(base: Workflow, candidates: Sequence[Layout], session: Any, settings: Any,
                  log: Callable[[str], None], deadline: float | None = None,
                  stop: Callable[[], str | None] | None = None) -> tuple[Layout | None, dict[str, Any]]:
    """The layout to train with (None: the declared one) and the report's `layout` section. `deadline`
    (a `time.perf_counter()` value) and `stop` end the trials early; a value not measured is not kept."""
    per_ref = max(2, settings.validation_rounds // 2 + 1)  # timed iterations per reference block
    per_value = 2 * per_ref  # a value's block: as many as its two reference blocks together
    rows: list[dict[str, Any]] = []
    best: tuple[float, Layout, dict[str, Any]] | None = None
    started = time.perf_counter()
    timed: list[float] = []  # every timed iteration so far (any layout): the cost model's iteration time
    switch_s: list[float] = []  # how long starting a layout's processes took (`use_layout`)
    block_wall: list[float] = []  # what blocks took beyond their iterations' time (calls, records)

    def block_estimate(timed_iterations: int) -> float:
        """Seconds a block with `timed_iterations` timed iterations (plus its untimed first) should take."""
        t = statistics.median(timed) if timed else 0.0
        return (statistics.median(switch_s) if switch_s else t) + (timed_iterations + 1) * t + \
            (statistics.median(block_wall) if block_wall else 0.0)

    def run_block(wf: Workflow, label: str, n: int, guard: bool) -> list[float]:
        t = time.perf_counter()
        replaced = session.use_layout(wf)
        switched = time.perf_counter() - t
        if replaced:
            switch_s.append(switched)
        got = session.complete([wf], n, labels=[label], guard_first=guard)[0]
        if session.last_failures:
            raise _BlockFailed(next(iter(session.last_failures.values())))
        secs = [r.seconds for r in got]
        timed.extend(secs)
        # the block's time beyond its timed iterations and the untimed first (~one more iteration)
        med = statistics.median(secs) if secs else 0.0
        block_wall.append(max(0.0, time.perf_counter() - t - switched - sum(secs) - med))
        return secs

    reference_runs: list[list[float]] = []  # the reference blocks, in order

    def reference_block() -> None:
        try:
            reference_runs.append(run_block(base, "layout declared", per_ref, guard=False))
        except _BlockFailed as exc:  # the declared layout failing is the run failing
            raise RuntimeError(f"the declared layout failed between layout trials: {exc}") from exc

    measurable = [lay for lay in candidates if not (lay.refused or lay.workflow is None)]
    for lay in candidates:
        row: dict[str, Any] = {"values": dict(lay.values), "changed": list(lay.changed)}
        rows.append(row)
        if lay.refused or lay.workflow is None:
            row["refused"] = lay.refused
            log(f"layout {lay.label}: not tried: {lay.refused}")
    if measurable and not (stop is not None and stop()):
        reference_block()  # R: the declared layout's block before the first value (no switch)
    for lay in measurable:
        row = next(r for r in rows if r["values"] == dict(lay.values))
        reason = stop() if stop is not None else None
        need = block_estimate(per_value) + block_estimate(per_ref)
        if not reason and not reference_runs:
            reason = "stopped before the declared layout's first block"
        if not reason and deadline is not None and time.perf_counter() + need > deadline:
            left = max(0.0, deadline - time.perf_counter())
            reason = (f"the time budget for layouts leaves {left:.0f} s and a value needs about {need:.0f} s "
                      f"(its block and the next reference block; --budget-s gives layouts 35%)")
            row["needed_s"] = round(need, 1)
        if reason:
            row["not_measured"] = reason
            log(f"layout {lay.label}: not measured: {reason}")
            continue
        assert lay.workflow is not None
        try:
            cand_runs = run_block(lay.workflow, f"layout {lay.label}", per_value, guard=True)
        except (_BlockFailed, CallFailed, Unsupported) as exc:
            row["failed"] = str(exc).splitlines()[0]
            log(f"layout {lay.label}: failed: {row['failed']}")
            reference_block()  # back to the declared layout; the next value compares against this block
            continue
        before = reference_runs[-1]
        reason = stop() if stop is not None else None
        if reason:  # no second reference block: the value is not kept half-measured
            row["not_measured"] = reason
            log(f"layout {lay.label}: not measured: {reason}")
            session.use_layout(base)
            break
        reference_block()  # R after the value: the value's second reference, the next value's first
        ref, cand = summarize(before + reference_runs[-1]), summarize(cand_runs)
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
                    "reference_blocks": len(reference_runs),
                    "trial_seconds": time.perf_counter() - started, "summary": summary}
