"""The rules by which a component's metrics merge across the processes that run it (`metric_merge`, a class
attribute of the component: docs/components.md). One home for the language's check (`rose validate
--import`, `importcheck.py`) and the runtime's merge (`interpreter/metric_merge.py`), which the language
must not import."""

from __future__ import annotations

__all__ = ["RULES", "ADDITIVE_METRICS", "ADDITIVE_PREFIXES"]

# sum | rows-weighted mean | the original process's | max | min | not mergeable: one figure per process
RULES = ("sum", "mean", "last", "max", "min", "copies")
# metrics that add up over data-parallel replicas when undeclared (the rest are averaged)
ADDITIVE_METRICS = ("env_steps", "tokens", "episodes", "env_faults", "errors", "retries")
# ... and those starting with one of these: a histogram's bucket counts, one metric per bucket whose names no
# declaration can list (the learners' `staleness_hist_<lag>`, issue 46: data-parallel trainer replicas each
# count their own shard's samples)
ADDITIVE_PREFIXES = ("staleness_hist_",)
