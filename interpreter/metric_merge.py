"""How a component's metrics merge across the processes that run it: data-parallel replicas (`sim#1`) and
the copies a temporal split makes (`sim@0`).

Why declared: a plan may run one component on several processes, and rose must report one figure per
metric as the declared workflow would. A count adds up; a mean over rows is the rows-weighted mean of the
copies' means; a setting (a learning rate) is the value of the process that ran last. A *snapshot* (a
running mean of the last 100 episodes, a best-so-far) cannot be merged at all: each copy saw only its own
calls, and no function of the copies' snapshots is the declared run's (under a split in time a snapshot
`sim/return_ema` read -65.04 against -71.84 declared, averaged silently; issue 44). A component says which
is which with a class attribute:

    metric_merge = {"env_steps": "sum", "episode_return": "mean", "return_ema": "copies", "*": "mean"}

Rules (`RULES`): `sum`, `mean` (weighted by the batch rows each process ran this iteration; the plain mean
when they are equal or unknown), `last` (the original process: a temporal split leaves the loop's last
iteration to it, and replica 0 of data-parallel replicas), `max`, `min`, and `copies` (not mergeable:
reported per process, `sim/return_ema@0`, `sim/return_ema`, and named in the plan's report). `*` sets the
component's default. Undeclared metrics keep the old default (`ADDITIVE_METRICS` summed, the rest the
weighted mean), and every undeclared metric merged over more than one process is named in the notes, so
that a report can say which figures rest on that default.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rose_dsl.identity import ProcessId
from rose_dsl.metric_rules import ADDITIVE_METRICS, ADDITIVE_PREFIXES, RULES

__all__ = ["ADDITIVE_METRICS", "RULES", "Merged", "merge_metrics", "merge_rule_problem"]



@dataclass
class Merged:
    """Merged values (`component/metric`, or `component/metric@copy` for `copies`) and, per merged key, how
    it was merged when more than one process reported it (for reports)."""

    values: dict[str, float] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)


def merge_rule_problem(declared: Any) -> str | None:
    """What is wrong with a component's `metric_merge` declaration (None: nothing)."""
    if not isinstance(declared, Mapping):
        return f"metric_merge must be a dict of metric name -> rule, got {type(declared).__name__}"
    bad = {k: v for k, v in declared.items() if not isinstance(k, str) or v not in RULES}
    if bad:
        return (f"metric_merge: unknown rule(s) {', '.join(f'{k!r}: {v!r}' for k, v in bad.items())} "
                f"(rules: {', '.join(RULES)})")
    return None


def _rule(name: str, declared: Mapping[str, str]) -> tuple[str, bool]:
    """(rule, was it declared) for metric `name`."""
    if name in declared:
        return declared[name], True
    if "*" in declared:
        return declared["*"], True
    return ("sum" if name.endswith(ADDITIVE_METRICS) or name.startswith(ADDITIVE_PREFIXES) else "mean"), False


def _copy_suffix(process: str, component: str) -> str:
    """`sim@0` -> `@0`, `sim#1` -> `#1`, `sim` -> `` (the original process)."""
    return process[len(component):]


def _weighted_mean(vs: list[tuple[float, str]], work: Mapping[str, int]) -> float:
    weights = [work.get(p) for _, p in vs]
    if len(vs) > 1 and all(w for w in weights) and len(set(weights)) > 1:
        return sum(v * w for (v, _), w in zip(vs, weights, strict=True) if w) / sum(w for w in weights if w)
    return sum(v for v, _ in vs) / len(vs)


def _merge_one(rule: str, vs: list[tuple[float, str]], work: Mapping[str, int], comp: str) -> float:
    if rule == "sum":
        return sum(v for v, _ in vs)
    if rule == "max":
        return max(v for v, _ in vs)
    if rule == "min":
        return min(v for v, _ in vs)
    if rule == "last":
        originals = [v for v, p in vs if p == comp]
        return originals[0] if originals else vs[-1][0]
    return _weighted_mean(vs, work)


def _name_base(process: str) -> str:
    """`sim@1#2` -> `sim`, read from the name: only for a process `merge_metrics` is not told the base of."""
    return ProcessId.parse(process).component


def merge_metrics(per_process: Mapping[str, Mapping[str, float]], work: Mapping[str, int] | None = None,
                  declared: Mapping[str, Mapping[str, str]] | None = None,
                  base: Mapping[str, str] | None = None) -> Merged:
    """`{process: {metric: value}}` -> one figure per `component/metric` by each metric's rule (`declared`:
    component -> its `metric_merge`), `copies` metrics one per process when several report them. `work`:
    the batch rows each process ran this iteration (the weights of `mean`). `base`: each process's
    component as the source workflow names it (the runner's, from the plan's `copy_of`)."""
    def base_of(process: str) -> str:
        return base[process] if base is not None and process in base else _name_base(process)

    values: dict[str, list[tuple[float, str]]] = {}
    for process in sorted(per_process, key=lambda p: (base_of(p), p)):
        comp = base_of(process)
        for name, value in per_process[process].items():
            values.setdefault(f"{comp}/{name}", []).append((float(value), process))
    out = Merged()
    for key, vs in values.items():
        comp, name = key.split("/", 1)
        rule, own = _rule(name, (declared or {}).get(comp, {}))
        if len(vs) == 1:
            out.values[key] = vs[0][0]
        elif rule == "copies":
            for v, p in vs:
                out.values[f"{key}{_copy_suffix(p, comp)}"] = v
            out.notes[key] = f"not mergeable (declared 'copies'): one figure per process ({len(vs)})"
        else:
            out.values[key] = _merge_one(rule, vs, work or {}, comp)
            out.notes[key] = (f"{rule} over {len(vs)} processes" + ("" if own else
                              " (undeclared: the default; declare metric_merge if it is a snapshot)"))
    return out
