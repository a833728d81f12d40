"""A deterministic fake of the measuring session `rose optimize` starts (`TrialSession`): the search's
`FakeMeasurer` (every call of a component costs a ground truth the search does not see, simulated, with
seeded noise) plus what the command's driver asks of a session beyond the `Measurer` protocol -- the books,
the pending work joined before the first measurement, the hand-over checkpoint, layout switches -- and a
record of every call the driver and the search make of it, in order (`calls`), for the driver's golden test
(`test_driver_identity.py`).

The ground truth of a shipped latency workflow is read from its components' own arguments (`fixed_ms`,
`per_row_ms`: what `examples/bench/latency.py` waits per call), so the fake measures what the real CPU run
would, up to the noise."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rose_dsl.ir import Workflow
from rose_dsl.measurement import Books
from rose_dsl.serialize import to_yaml

from .fakes import FakeMeasurer, GroundTruth


def latency_truth(wf: Workflow) -> GroundTruth:
    """Seconds per call and per row of each component, from its `fixed_ms` / `per_row_ms` arguments."""
    fixed = {n: float(c.args.get("fixed_ms", 0.0)) / 1000 for n, c in wf.components.items()}
    per_row = {n: float(c.args.get("per_row_ms", 0.0)) / 1000 for n, c in wf.components.items()}
    return GroundTruth(fixed=fixed, per_row=per_row)


def digest(plan: Workflow) -> str:
    """A short name for a plan's whole text (two calls on the same plan show the same digest)."""
    return hashlib.sha256(to_yaml(plan).encode()).hexdigest()[:12]


class _Executor:
    """The few executor figures the driver reads off a session."""

    startup_s = 0.0
    prepare_s = 0.0
    loads = 0

    def metric_notes(self) -> dict[str, str]:
        return {}


class FakeSession(FakeMeasurer):
    """`TrialSession`'s surface on a simulated ground truth; `calls` records each call with its plans'
    labels and digests. Iterations are limited by the workflow's count, as on the real session."""

    trial_errors: tuple[type[Exception], ...] = ()

    def __init__(self, wf: Workflow, out_dir: Path | None, seed: int = 0) -> None:
        super().__init__(latency_truth(wf), noise=0.02, seed=seed, iterations=wf.root.count)
        self.wf, self.out_dir = wf, out_dir
        self.books = Books()
        self.executor = _Executor()
        self.pending: list[Callable[[], None]] = []
        self.calls: list[list[Any]] = []

    def placement(self, plan: Workflow) -> str | None:
        return None

    def join_pending(self) -> None:
        while self.pending:
            self.pending.pop(0)()

    def sync_books(self) -> Books:
        return self.books

    def complete(self, plans: Sequence[Workflow], rounds: int, warmup: int = 0, labels: Sequence[str] = (),
                 guard_first: bool = False) -> list[list[Any]]:
        self.calls.append(["complete", list(labels), [digest(p) for p in plans], rounds, warmup])
        self.join_pending()
        out = super().complete(plans, rounds, warmup, labels, guard_first)
        self.books.complete_iterations += sum(len(runs) for runs in out) + warmup
        return out

    def capture(self, probe_wf: Workflow) -> Any:
        self.calls.append(["capture", digest(probe_wf)])
        self.books.captures += 1
        return super().capture(probe_wf)

    def local(self, graphs: Sequence[Any], repeats: int, captured: Any, probe_id: int,
              give_up: Any = None) -> list[list[Any]]:
        self.calls.append(["local", [".".join(g.region) for g in graphs], [digest(g.workflow) for g in graphs],
                           repeats, probe_id])
        self.join_pending()
        out = super().local(graphs, repeats, captured, probe_id, give_up)
        self.books.local_runs += sum(len(runs) for runs in out)
        return out

    def use_layout(self, wf: Workflow) -> list[str]:
        self.calls.append(["use_layout", digest(wf)])
        changed = sorted(n for n, c in wf.components.items() if self.wf.components.get(n) != c)
        self.wf = wf
        if changed:
            self.books.layout_switches += 1
        return changed

    def finish(self, plan_label: str) -> Path | None:
        self.calls.append(["finish", plan_label, self.k])
        return None if self.out_dir is None or self.k == 0 else self.out_dir / "checkpoints" / f"it{self.k - 1}"
