"""The optimizer on the runtime: its driver and its measuring side, in one place.

* `driver`       -- `optimize(workflow, options, host) -> Outcome`, the one entry point: the whole run of
  `rose optimize` below option parsing, in the order it happens (the command implements `Host`);
* `trials`       -- `TrialSession`, the search's `Measurer` on a real backend: complete iterations
  (training, kept), captured inputs, local trials on state snapshots, layout switches, the hand-over;
* `quota_trials` -- stage 2's side: processes moved under MPS quotas and priorities, the quota self-check
  (`CheckPrefetch`), `settle` for `--train`;
* `continuous`   -- `keep_optimizing`: `--train --max-overhead P`, training on with searches again when the
  running plan's iteration times drift (the driver's second half: it uses the search too);
* `executor`     -- `Executor`: plans run on one set of workers through the `Backend` interface alone
  (also `rose compare`'s).

The search itself is `rose_dsl.optimizer` (pure: it analyses the IR and imports no runtime). Only the
driver imports it; the measuring side implements its protocols structurally, and nothing else in the
runtime imports this package (`tests/cli/test_layers.py`).

The names below load their module on first use: a worker process that imports the trial components
(`trials.Feed`, `trials.Probe`) does not load the driver, nor through it the search.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rose_dsl.optimizer import Layout, OutOfBudget, headline, layouts, parse_layout_option

    from .continuous import keep_optimizing
    from .driver import (
        REPORT_FILES,
        CannotOptimize,
        Gpu,
        Host,
        MeasuringSession,
        OptimizeOptions,
        Outcome,
        RunOptions,
        mps_changes,
        optimize,
        stage2_skipped,
    )
    from .executor import Executor
    from .trials import TrialSession, trial_components, unsupported

_WHERE = {
    **dict.fromkeys(("optimize", "OptimizeOptions", "Outcome", "Host", "RunOptions", "Gpu", "MeasuringSession",
                     "CannotOptimize", "REPORT_FILES", "stage2_skipped", "mps_changes"), ".driver"),
    **dict.fromkeys(("TrialSession", "trial_components", "unsupported"), ".trials"),
    "Executor": ".executor",
    "keep_optimizing": ".continuous",
    # what the command shows and checks of the search's (its exit codes, the summary, `--layout`)
    **dict.fromkeys(("OutOfBudget", "headline", "Layout", "layouts", "parse_layout_option"), "rose_dsl.optimizer"),
}

__all__ = ["optimize", "OptimizeOptions", "Outcome", "Host", "RunOptions", "Gpu", "MeasuringSession", "CannotOptimize",
           "REPORT_FILES", "stage2_skipped", "mps_changes", "TrialSession", "trial_components", "unsupported", "Executor",
           "OutOfBudget", "headline", "Layout", "layouts", "parse_layout_option", "keep_optimizing"]


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(where, __name__), name)
