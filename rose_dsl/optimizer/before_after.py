"""Before/after measurements on complete iterations: plans interleaved round by round (a stop request ends
them at a round's boundary), and the `--stage1` path, where a given plan is the graph and only its
before/after against the declared graph is measured.

Why interleaved rounds: the GPU host is shared and noisy (two runs of one workflow minutes apart took
10.0 and 13.8 s per iteration), so A and B alternate -- A B, B A, ... -- and drift touches both alike.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..ir import Workflow
from .decide import summarize
from .profile import IterationRun
from .records import Log, Measurer, OutOfBudget, Settings, Stage1Result, Stop
from .stats import decide

__all__ = ["interleaved", "given_plan", "declared_graph"]


def interleaved(measurer: Measurer, plans: Sequence[Workflow], rounds: int, labels: Sequence[str],
                stop: Stop | None = None, warmup: int = 0) -> tuple[list[list[IterationRun]], str | None]:
    """`rounds` complete iterations of each plan, interleaved as `Measurer.complete` interleaves them (the
    order reversed every other round), one round per call so that a stop request (`stop()`) ends the
    measurement at the next round's boundary instead of after all of them: the rounds finished are
    returned with the reason. (A before/after of 5 rounds of 8-s iterations is ~2 minutes of a plan
    switching every iteration; stopped by a signal, waiting for all of it ran into the caller's kill.)"""
    out: list[list[IterationRun]] = [[] for _ in plans]
    for r in range(rounds):
        reason = stop() if stop is not None else None
        if reason:
            return out, reason
        order = list(range(len(plans)))[::-1] if r % 2 else list(range(len(plans)))
        got = measurer.complete([plans[i] for i in order], 1, warmup if r == 0 else 0, [labels[i] for i in order])
        for i, runs in zip(order, got, strict=True):
            out[i] += runs
        failed = getattr(measurer, "last_failures", None)
        if failed:  # a plan's iteration failed (its trial is lost; training went on): stop comparing
            return out, f"{labels[order[next(iter(failed))]] or 'the declared graph'} failed: {next(iter(failed.values()))}"
    return out, None


def given_plan(wf: Workflow, plan: Workflow, requests: Sequence[str], measurer: Measurer,
               settings: Settings | None = None, log: Log = print, stop: Stop | None = None) -> Stage1Result:
    """Stage 1 skipped: `plan` (a plan of `wf`, e.g. an earlier run's stage-1 plan) is the graph. Its
    before/after against the declared graph is measured as `optimize_graph` measures its own (complete,
    interleaved, retained iterations), so stage 2 and the report see the same kind of result."""
    s = settings or Settings()
    label = "; ".join(requests)
    same = declared_graph(wf, plan)
    log(f"stage 1 skipped: the graph is the given plan ({label or 'no rewrite'}); "
        + (f"it is the declared graph: {s.final_rounds} complete iterations of it, once" if same else
           f"before/after: {s.final_rounds} complete iterations each"))
    try:
        if same:  # measuring the declared graph twice, interleaved, would only pay every switch twice
            (before,), cut = interleaved(measurer, [plan], max(1, s.final_rounds), [label], stop, s.warmup)
            after = before
        else:
            (before, after), cut = interleaved(measurer, [wf, plan], max(1, s.final_rounds), ["", label], stop, s.warmup)
    except OutOfBudget as exc:
        raise OutOfBudget(f"{exc}: not even the before/after of the given plan fits") from None
    if not before or not after:
        raise OutOfBudget(f"{cut}: not even the before/after of the given plan was measured")
    if cut:
        log(f"before/after cut short after {len(after)} round(s): {cut}")
    verdict = None if same else decide([r.seconds for r in before[:len(after)]],
                                       [r.seconds for r in after[:len(before)]], s.rule, more=False)
    return Stage1Result(plan, tuple(requests), summarize([r.seconds for r in before]),
                        summarize([r.seconds for r in after]), [], [], "stage 1 skipped: the given plan", False,
                        list(before), list(after), verdict, verdict is not None and verdict.outcome == "faster",
                        s.rule.describe())


def declared_graph(wf: Workflow, plan: Workflow) -> bool:
    """Is `plan` (already checked to compute what `wf` computes) the declared graph itself: the same
    iteration tree (source positions aside), the same components, each under the same MPS quota and client
    priority? Judged
    on the graphs, not on the plan's metadata: a hand-edited plan may name no rewrite and still differ."""
    if plan.root != wf.root or set(plan.components) != set(wf.components):
        return False
    return all(plan.components[n].mps_settings == c.mps_settings for n, c in wf.components.items())
