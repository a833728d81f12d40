"""Layout trials: which value of the workflow's layout knobs (`rose optimize --layout`, `layouts.py`)
trains fastest, measured on complete training iterations through a `LayoutMeasurer` (the runtime's
measuring session implements it: `use_layout` switches the processes, `complete` trains).

The values are measured in blocks between blocks of the declared layout: R, V1, R, V2, R, ... Each value
is compared with the two reference blocks around it (R V R: a drift in time hits both sides alike) and has
as many timed iterations as they have together; neighbouring values share a reference block, so n values
cost 2n + 1 blocks and 2n process switches (blocks A, B, A per value cost 3n and 3n). Before each block
the components the block's layout changes get fresh processes (`LayoutMeasurer.use_layout`); a block's first
iteration is training, not timed (the new processes' start-up). Every iteration is a real training
iteration (kept): the layouts compute the same thing, so switching between them keeps training on course.
A value is kept only if the decision rule calls its iterations faster than its references' (`layout_verdict`:
the rule's unpaired variant, a rank-sum test at the rule's alpha -- blocks are not rounds of a pair); of
several kept, the fastest. A value is started only if its block and the next reference
block fit in what is left of the layouts' budget, by an estimate from the blocks measured so far; the ones
that do not fit are reported with the time they would have needed. This runs before stage 1, whose
rewrites then apply to the chosen layout.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from ..ir import Workflow
from ..measurement import IterationRun
from .budget import Budget
from .decide import summarize
from .layouts import Layout
from .records import Settings
from .stats import Rule, Verdict, decide_unpaired

__all__ = ["choose_layout", "LayoutMeasurer", "layout_verdict"]


def layout_verdict(before: Sequence[float], value: Sequence[float], after: Sequence[float], rule: Rule) -> Verdict:
    """Is a layout value faster than the declared layout, from its block and the two reference blocks around
    it (R V R)? The decision rule's unpaired variant (`stats.decide_unpaired`): the iterations of a block are
    not paired with any of a reference block, so the test is a rank-sum test of the value's iterations against
    both reference blocks pooled -- a drift in time that is linear over the three blocks moves the pooled
    reference's middle as much as the value's, which is why the value is bracketed. Two iterations per
    reference block and four of the value can decide at 5% with one iteration out of place (p = 2/70)."""
    return decide_unpaired([*before, *after], list(value), rule)



class LayoutMeasurer(Protocol):
    """What the layout trials ask of the runtime."""

    trial_errors: tuple[type[Exception], ...]  # what loses a block's trial rather than the run

    def use_layout(self, wf: Workflow) -> list[str]:
        """Train `wf` (another layout of the workflow) from the next iteration: the components it defines
        differently get fresh processes (their names)."""

    def complete(self, plans: Sequence[Workflow], rounds: int, warmup: int = 0, labels: Sequence[str] = (),
                 guard_first: bool = False) -> list[list[IterationRun]]: ...

    @property
    def last_failures(self) -> Mapping[int, str]: ...


class _BlockFailed(Exception):
    """A block's iteration failed (the trial is lost, training goes on): the session's reason."""


class _Blocks:
    """Runs blocks of complete iterations of one layout and learns what a block costs."""

    def __init__(self, session: LayoutMeasurer, budget: Budget) -> None:
        self.session, self.budget = session, budget
        self.timed: list[float] = []  # every timed iteration so far (any layout): the cost model's iteration time
        self.switch_s: list[float] = []  # how long starting a layout's processes took (`use_layout`)
        self.wall: list[float] = []  # what blocks took beyond their iterations' time (calls, records)

    def estimate(self, timed_iterations: int) -> float:
        """Seconds a block with `timed_iterations` timed iterations (plus its untimed first) should take."""
        t = statistics.median(self.timed) if self.timed else 0.0
        return (statistics.median(self.switch_s) if self.switch_s else t) + (timed_iterations + 1) * t + \
            (statistics.median(self.wall) if self.wall else 0.0)

    def run(self, wf: Workflow, label: str, n: int, guard: bool) -> list[float]:
        t = self.budget.now()
        replaced = self.session.use_layout(wf)
        switched = self.budget.now() - t
        if replaced:
            self.switch_s.append(switched)
        got = self.session.complete([wf], n, labels=[label], guard_first=guard)[0]
        if self.session.last_failures:
            raise _BlockFailed(next(iter(self.session.last_failures.values())))
        secs = [r.seconds for r in got]
        self.timed.extend(secs)
        # the block's time beyond its timed iterations and the untimed first (~one more iteration)
        med = statistics.median(secs) if secs else 0.0
        self.wall.append(max(0.0, self.budget.now() - t - switched - sum(secs) - med))
        return secs


def choose_layout(base: Workflow, candidates: Sequence[Layout], session: LayoutMeasurer, settings: Settings,
                  log: Callable[[str], None], budget: Budget | None = None,
                  stop: Callable[[], str | None] | None = None) -> tuple[Layout | None, dict[str, Any]]:
    """The layout to train with (None: the declared one) and the report's `layout` section. `budget` (the
    layouts' share) and `stop` end the trials early; a value not measured is not kept."""
    budget = budget or Budget()
    per_ref = max(2, settings.validation_rounds // 2 + 1)  # timed iterations per reference block
    blocks = _Blocks(session, budget)
    started = budget.now()
    reference_runs: list[list[float]] = []  # the reference blocks, in order

    def reference_block() -> None:
        try:
            reference_runs.append(blocks.run(base, "layout declared", per_ref, guard=False))
        except _BlockFailed as exc:  # the declared layout failing is the run failing
            raise RuntimeError(f"the declared layout failed between layout trials: {exc}") from exc

    rows: list[dict[str, Any]] = []
    for lay in candidates:
        rows.append({"values": dict(lay.values), "changed": list(lay.changed)})
        if lay.refused or lay.workflow is None:
            rows[-1]["refused"] = lay.refused
            log(f"layout {lay.label}: not tried: {lay.refused}")
    measurable = [lay for lay in candidates if not (lay.refused or lay.workflow is None)]
    if measurable and not (stop is not None and stop()):
        reference_block()  # R: the declared layout's block before the first value (no switch)
    best: tuple[float, Layout, dict[str, Any]] | None = None
    for lay in measurable:
        row = next(r for r in rows if r["values"] == dict(lay.values))
        verdict = _try_value(lay, row, blocks, per_ref, reference_runs, reference_block, base, settings, log, stop)
        if verdict == "stopped":
            break
        if isinstance(verdict, float) and (best is None or verdict < best[0]):
            best = (verdict, lay, row)
    chosen = best[1] if best is not None else None
    if chosen is not None and chosen.workflow is not None:
        session.use_layout(chosen.workflow)
    summary = (f"{chosen.label}: {best[2]['speedup']:.2f}x on complete iterations" if best is not None and chosen else
               "kept the declared layout (no value was faster by more than the noise)")
    return chosen, {"candidates": rows, "chosen": dict(chosen.values) if chosen else None,
                    "reference_blocks": len(reference_runs),
                    "trial_seconds": budget.now() - started, "summary": summary}


def _try_value(lay: Layout, row: dict[str, Any], blocks: _Blocks, per_ref: int, reference_runs: list[list[float]],
               reference_block: Callable[[], None], base: Workflow, settings: Settings, log: Callable[[str], None],
               stop: Callable[[], str | None] | None) -> float | str | None:
    """One value's block between two reference blocks, and its verdict in `row`: its median when it is
    kept (faster by more than the noise margin), "stopped" when a stop request ends the trials, else None."""
    per_value = 2 * per_ref  # a value's block: as many as its two reference blocks together
    reason = stop() if stop is not None else None
    need = blocks.estimate(per_value) + blocks.estimate(per_ref)
    if not reason and not reference_runs:
        reason = "stopped before the declared layout's first block"
    if not reason and not blocks.budget.fits(need):
        left = max(0.0, blocks.budget.left() or 0.0)
        reason = (f"the time budget for layouts leaves {left:.0f} s and a value needs about {need:.0f} s "
                  f"(its block and the next reference block; --budget-s gives layouts {settings.layout_share:.0%})")
        row["needed_s"] = round(need, 1)
    if reason:
        row["not_measured"] = reason
        log(f"layout {lay.label}: not measured: {reason}")
        return None
    assert lay.workflow is not None
    lost: tuple[type[BaseException], ...] = (_BlockFailed, *blocks.session.trial_errors)
    try:
        cand_runs = blocks.run(lay.workflow, f"layout {lay.label}", per_value, guard=True)
    except lost as exc:
        row["failed"] = str(exc).splitlines()[0]
        log(f"layout {lay.label}: failed: {row['failed']}")
        reference_block()  # back to the declared layout; the next value compares against this block
        return None
    before = reference_runs[-1]
    reason = stop() if stop is not None else None
    if reason:  # no second reference block: the value is not kept half-measured
        row["not_measured"] = reason
        log(f"layout {lay.label}: not measured: {reason}")
        blocks.session.use_layout(base)
        return "stopped"
    reference_block()  # R after the value: the value's second reference, the next value's first
    ref, cand = summarize(before + reference_runs[-1]), summarize(cand_runs)
    verdict = layout_verdict(before, cand_runs, reference_runs[-1], settings.rule)
    ok = verdict.outcome == "faster"
    row.update(reference=ref.to_json(), candidate=cand.to_json(), verdict=verdict.to_json(), accepted=ok,
               speedup=ref.median / cand.median if cand.median > 0 else None)
    log(f"layout {lay.label}: {cand.median:.4f} s against {ref.median:.4f} s declared: "
        f"{'kept' if ok else 'not kept'} ({verdict.describe()})")
    return cand.median if ok else None
