"""The Combine step (paper §4.3.2) over everything measured in a round: the best compatible set of
alternatives, not the single largest saving.

Why: greedy rounds locked in a worse plan (issue 44). On a trainer-bound PPO, round 1 measured
`split-time rollout 3; interleave rollout` and `fuse rollout update` 1.4-3% apart and kept the larger
single saving; fusion and a step split, both measured in that round, combine (~0.42 s saved against
~0.27 s), but after the temporal split fusion was refused (`rollout@0` and `update` run different
iterations). So:

* every subset of the round's six largest winners (up to `max_size` alternatives, at most one per split
  family) is a candidate combination, and so is a subset with one of the next six where its savings added
  up could beat the best prediction so far (`combinations_of`);
* its requests are applied in an order that keeps them expressible: rewrites that keep item names (fuse,
  rewire, interleaving sibling loops) first, then temporal splits, then row splits (`ORDER`); a request
  names items of the round's graph, which a temporal split renames (`rollout.step` becomes
  `rollout@0.step`), so a split after it could not be expressed; if that order is refused the other
  orders are tried;
* each feasible combination is predicted (the cost model's iteration time, scaled to the measured
  reference; without a prediction, the measured savings added up), and ranked by the prediction, fewer
  rewrites first on a tie; only the best few are measured (by the caller), and the rest are kept in the
  round's record as the alternatives a later round may need.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import combinations, permutations

from ..ir import Workflow

__all__ = ["Option", "Combination", "combinations_of", "ORDER"]

# rewrite families in the order their requests are applied within a combination (lower first)
ORDER = {"fuse": 0, "rewire": 0, "take-turns": 0, "temporal-split": 1, "split-interleave": 2,
         "split-consumer": 2, "split-node": 2, "split-chain": 2}


@dataclass(frozen=True)
class Option:
    """One measured alternative as Combine sees it: its requests, its family (and the split family it
    belongs to: members that differ only in group count exclude each other), the iteration time it
    saved against the round's reference (s), and whether the decision rule called it faster."""

    requests: tuple[str, ...]
    family: str
    saving_s: float
    faster: bool
    family_key: tuple[str, ...] = ()
    label: str = ""


@dataclass
class Combination:
    options: tuple[Option, ...]
    requests: tuple[str, ...] = ()  # in the order applied
    workflow: Workflow | None = field(default=None, repr=False, compare=False)
    predicted_s: float | None = None
    refused: str = ""  # why no order of its requests was feasible

    @property
    def label(self) -> str:
        return "; ".join(self.requests or [r for o in self.options for r in o.requests])

    def to_json(self) -> dict[str, object]:
        return {"requests": list(self.requests), "alternatives": [o.label or "; ".join(o.requests) for o in self.options],
                "predicted_s": self.predicted_s, "refused": self.refused}


Apply = Callable[[Workflow, tuple[str, ...]], "Workflow | str"]  # the plan, or why it is refused
Predict = Callable[[Workflow], "float | None"]  # an iteration time in the reference's seconds


def _orders(options: Sequence[Option]) -> list[tuple[Option, ...]]:
    """Every order of `options`, the expressible one (by `ORDER`, then by saving) first."""
    first = tuple(sorted(options, key=lambda o: (ORDER.get(o.family, 3), -o.saving_s)))
    rest = [p for p in permutations(options) if p != first]
    return [first, *rest]


def _compatible(options: Sequence[Option]) -> bool:
    keys = [o.family_key or o.requests for o in options]
    return len(set(keys)) == len(keys)


def _plan(g: Workflow, options: Sequence[Option], apply: Apply) -> Combination:
    combo = Combination(tuple(options))
    reasons = []
    for order in _orders(options):
        requests = tuple(r for o in order for r in o.requests)
        got = apply(g, requests)
        if isinstance(got, str):
            reasons.append(got)
            continue
        combo.requests, combo.workflow = requests, got
        return combo
    combo.refused = reasons[0] if reasons else "no order applies"
    return combo


def combinations_of(g: Workflow, options: Sequence[Option], reference_s: float, apply: Apply, predict: Predict,
                    max_size: int = 3, max_options: int = 6, more_options: int = 6,
                    more_plans: int = 24) -> list[Combination]:
    """Feasible combinations of the round's winners (`faster` options with a positive saving), best
    predicted first. A single alternative is predicted by what it measured; a combination by the model
    relative to its best member -- measured(best) x model(combination) / model(best), so the model's bias
    cancels -- or, where the model cannot predict, by the members' savings added up. Singles are included,
    so the best single alternative is always among them.

    Which subsets are planned (each is applied and predicted, so the pool is bounded): every subset of the
    `max_options` largest savings; and, with one of the next `more_options` in it, the subsets whose
    savings added up could still reach the best prediction so far -- pairs before triples, each by its sum,
    at most `more_plans` of them, none holding a pair that applied in no order.
    Why the second pool: a round's largest savings are often one family's group counts (`split-time
    rollout 2`/`3`, each with turn-taking), and the member that combines best -- plain `split-time rollout
    3` beside a step pipeline, 1.60x where the six gave 1.44x (docs/optimizer.md, Combine) -- came 7th."""
    winners = sorted((o for o in options if o.faster and o.saving_s > 0), key=lambda o: -o.saving_s)
    core, more = winners[:max_options], winners[max_options:max_options + more_options]
    out: list[Combination] = []
    refused: set[frozenset[Option]] = set()  # subsets that apply in no order
    singles: dict[Option, Combination] = {}

    def add(subset: tuple[Option, ...]) -> None:
        combo = _plan(g, subset, apply)
        if combo.workflow is None:
            refused.add(frozenset(subset))
            return
        if len(subset) == 1:
            singles[subset[0]] = combo
        combo.predicted_s = _predicted(combo, subset, singles, reference_s, predict)
        out.append(combo)

    for size in range(1, min(max_size, len(core)) + 1):
        for subset in combinations(core, size):
            if _compatible(subset):
                add(subset)
    for o in more:
        add((o,))
    pool = core + more
    extra = sorted((s for size in range(2, min(max_size, len(pool)) + 1) for s in combinations(pool, size)
                    if any(o in more for o in s) and _compatible(s)), key=lambda s: (len(s), -sum(o.saving_s for o in s)))
    planned = 0
    for subset in extra:
        best = min((c.predicted_s for c in out if c.predicted_s is not None), default=reference_s)
        if planned >= more_plans:
            break
        if reference_s - sum(o.saving_s for o in subset) > best or any(frozenset(p) in refused for p in combinations(subset, 2)):
            continue  # its savings cannot add up to the best prediction, or a pair of it applies in no order
        planned += 1
        add(subset)
    out.sort(key=lambda c: (c.predicted_s if c.predicted_s is not None else reference_s, len(c.options), c.label))
    return out


def _predicted(combo: Combination, subset: Sequence[Option], singles: dict[Option, Combination],
               reference_s: float, predict: Predict) -> float:
    best = subset[0]  # (the winners are in order of saving)
    measured = reference_s - best.saving_s
    if len(subset) == 1:
        return measured
    anchor = singles.get(best)
    model_combo = predict(combo.workflow) if combo.workflow is not None else None
    model_best = predict(anchor.workflow) if anchor is not None and anchor.workflow is not None else None
    if model_combo is not None and model_best:
        return measured * model_combo / model_best
    return reference_s - sum(o.saving_s for o in subset)
