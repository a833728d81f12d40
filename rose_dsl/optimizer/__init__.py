"""The optimizer's search: from measured iterations of a workflow to a faster plan of it. Pure -- it
analyses the language's IR (`rose_dsl.ir`, `rose_dsl.analysis`, `rose_dsl.transforms`) and hands plans to
a measurer it is given; it imports no runtime and names none (`tests/cli/test_layers.py`).

Why here, beside the language and not in a package of its own: everything it reasons about is the IR --
rewrites, their legality, the dependency graph, a cost model simulated over the invocation order -- and
the runtime is reached only through the protocols below, which the runtime's optimizer package implements
structurally (its measuring side; the same package holds the one driver, `optimize(workflow, options,
host)`). The same split as torch.fx's passes beside its graph, with the pass manager apart.

The modules, in the order a run meets them:

* `records`   -- what the search is given and returns: the `Measurer` protocol, `Settings`, the records;
* `budget`    -- `Budget`: one clock, one deadline, named shares of it;
* `layouts`, `layout_search` -- `--layout`: the layouts a knob admits, and the trials that choose one;
* `search`    -- stage 1, Algorithm 1 (`optimize_graph`), over `profile` (calls -> per-node figures),
  `rank` (targets), `candidates` (alternatives, feasibility, the copies a split needs), `model` (the cost
  model), `regions` and `local_trials` (comparison graphs on captured inputs), `combine`, `decide` and
  `stats` (every keep-or-not decision), `before_after` (the final comparison; `given_plan`);
* `drift`     -- after the first search (`--train --max-overhead`): the drift rule, the overhead's books;
* `stage2`    -- stage 2, MPS quotas and client priorities (`tune_mps`), over `quota`;
* `bound`, `report`, `headline` -- the reorder bound, the report document and files, its headline.

`__all__` is the search's public API: what the driver and the commands use. Tests and the search's own
modules import the submodules directly.
"""

from .before_after import given_plan
from .bound import reorder_bound
from .budget import Budget
from .candidates import temporal_copies
from .drift import DriftMonitor, DriftRule, Ledger, MeteredMeasurer, Overhead, plan_label
from .headline import headline
from .layout_search import LayoutMeasurer, choose_layout
from .layouts import Layout, layout_change, layouts, parse_layout_option
from .records import Log, Measurer, OutOfBudget, Settings, Stage1Result, Stage2Record, Stop
from .report import build_report, staleness, write_report
from .search import optimize_graph
from .stage2 import Mps, QuotaMeasurer, first_probe_levels, tune_mps

__all__ = [
    # what the search is given and returns
    "Settings", "Budget", "Measurer", "LayoutMeasurer", "QuotaMeasurer", "OutOfBudget", "Log", "Stop",
    "Stage1Result", "Stage2Record", "Mps",
    # layouts, stage 1, stage 2
    "Layout", "layouts", "parse_layout_option", "layout_change", "choose_layout", "optimize_graph", "given_plan",
    "temporal_copies", "tune_mps", "first_probe_levels",
    # the whole run: drift and the overhead of searching again
    "DriftRule", "DriftMonitor", "Ledger", "MeteredMeasurer", "Overhead", "plan_label",
    # the report
    "reorder_bound", "build_report", "write_report", "headline", "staleness",
]
