"""What Algorithm 1 is given and what it returns: the `Measurer` protocol the runtime implements, the
search's `Settings`, and the records of a run (each alternative measured, each target, each round, the
stage-1 result) that the report is built from. Plain data; the algorithm is in `search.py`."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Protocol

from ..ir import Workflow
from ..measurement import OutOfBudget
from .decide import Summary
from .profile import IterationRun
from .rank import Ranking
from .regions import LocalGraph
from .stats import DEFAULT_RULE, Rule, Verdict

__all__ = ["DEVIATIONS", "OutOfBudget", "Measurer", "Settings", "Measured", "TargetRecord", "RoundRecord", "Stage1Result", "Stage2Record",
           "Log", "Stop", "GiveUp"]


class Measurer(Protocol):
    """What stage 1 (and the final before/after) asks of the runtime: complete iterations, captures and
    local trials. The runtime implements it structurally (it imports nothing of the search)."""

    @property
    def feed_impl(self) -> str:
        """The runtime's class (`module:Class`) that implements the `FEED` trial component."""

    @property
    def probe_impl(self) -> str:
        """The runtime's class that implements the `PROBE` trial component."""

    @property
    def activity_kind(self) -> str:
        """"sm" (GPU SM activity), "cpu" (component busy fraction) or "none"."""

    @property
    def component_bytes(self) -> Mapping[str, int]:
        """State bytes per component (for the memory estimate; may be fetched lazily)."""

    @property
    def memory_limits(self) -> Mapping[str, int]:
        """Bytes available per device kind for the processes a plan adds."""

    def complete(self, plans: Sequence[Workflow], rounds: int, warmup: int = 0,
                 labels: Sequence[str] = (), guard_first: bool = False) -> list[list[IterationRun]]:
        """Interleaved complete iterations (real training) of each plan (named by `labels`, the rewrite
        requests that made it, for the run's records); raises OutOfBudget. A plan's first iteration ever
        is guarded (a failure loses the trial, not the training) unless it is plans[0] -- the reference --
        and not `guard_first`."""

    def capture(self, probe_wf: Workflow) -> Any:
        """One real iteration of a probe workflow; the captured values per probe id (opaque)."""

    def local(self, graphs: Sequence[LocalGraph], repeats: int, captured: Any, probe_id: int,
              give_up: GiveUp | None = None) -> list[list[IterationRun]]:
        """Interleaved runs of local graphs on the captured inputs, state restored before each. A graph
        for which `give_up(graphs[0]'s seconds so far, its own so far)` is true (the search's rule,
        `decide.stop_repeating`: clearly slower than the unchanged comparison graph) gets no further
        runs: its list is shorter than `repeats`."""

    def elapsed(self) -> float: ...

    @property
    def last_failures(self) -> Mapping[int, str]:
        """Plans (by index) of the last `complete`/`local` call that failed -- a component raised; the
        state they may have changed is restored and training goes on -- with the reason."""

    def placement(self, plan: Workflow) -> str | None:
        """Why the runtime cannot run `plan` on its processes (None: it can)."""


@dataclass
class Settings:
    """Every knob of the optimizer, stage 2's limits and the budget's shares included. Each one's reason is
    in docs/optimizer.md ("Settings and the budget"); the report lists their values."""

    top_k: int = 3  # K
    alternatives: int = 4  # L
    rounds: int = 2  # R: rounds that keep a change (a round that keeps nothing does not count; `search._next_round`)
    tau_a: float = 1.0  # absolute eligibility threshold (s)
    tau_r: float = 0.05  # relative eligibility threshold (of T_iter)
    warmup: int = 1  # iterations run before the first profile (not timed)
    reference_iterations: int = 3
    validation_rounds: int = 3
    # complete-iteration candidates the decision rule (`rule`) leaves undecided whose median is faster get more
    # interleaved rounds, up to the rule's next look, until it decides or its last look; 0: decide on the first rounds
    extra_rounds: int = 3
    # every decision to keep a change (`stats.py`; docs/optimizer.md, "Every decision and its rule"): a sequential
    # signed-rank test on interleaved pairs (stage 1's complete iterations, the before/after), its unpaired
    # rank-sum variant where runs are not rounds of a pair (local trials, layouts, stage 2's validation);
    # false-accept rate <= rule.alpha
    rule: Rule = field(default_factory=lambda: DEFAULT_RULE)
    final_rounds: int = 5  # the before/after comparison at the end (training, kept)
    local_repeats: int = 4  # the fewest runs at which the rank-sum test decides with one run out of place
    window_fraction: float = 0.25  # a loop region runs about this fraction of an iteration locally
    # a comparison graph estimated at this share of an iteration or more is measured by complete iterations
    # instead of a local trial. None: always local.
    local_max_fraction: float | None = 0.4
    groups: tuple[int, ...] = (2, 4, 8)
    budget_s: float | None = None  # stage 1's seconds (its share of `--budget-s`); a `Budget` given wins
    tolerance: float = 0.05  # measure what the model predicts no slower than (1 + tolerance) x G
    # a further calibration split (another family's k = 2), after the first one taught the model: measured
    # unless predicted slower than (1 + calibration_band) x the unchanged comparison graph
    calibration_band: float = 0.25
    # a local trial stops repeating an alternative whose first run took more than this many times the
    # unchanged graph's first run. None: every alternative gets all its repeats.
    abandon_factor: float | None = 1.3
    # ... and one whose first two runs both took more than this many times the unchanged graph's median
    # (`decide.stop_repeating`). None: no such stop.
    settle_factor: float | None = 1.03
    # the budget's named shares (`budget.Budget.share`): stage 1's of the whole when stage 2 follows (all of
    # it otherwise), and the layout trials' (counted from when they start)
    stage1_share: float = 0.65
    layout_share: float = 0.35
    # stage 1 may go on into stage 2's share to decide a candidate measured at least this much faster (its point
    # estimate) that the rule has not decided yet: such a gain is more than the quota stage has been seen to win
    borrow_speedup: float = 1.10
    # stage 2 (`stage2.py`): trials of one quota search (the paper's seven), rounds of one change each,
    # processes screened before the search, quota self-checks run side by side, and the share of the
    # workflow's iterations left that stage 2 plans to use
    quota_max_trials: int = 7
    quota_max_changes: int = 2
    quota_max_screened: int = 3
    quota_parallel_checks: int = 6
    quota_count_margin: float = 0.85


@dataclass
class Measured:
    label: str
    requests: tuple[str, ...] = ()
    family: str = ""
    groups: int | None = None
    partners: tuple[str, ...] = ()
    delta_s: float | None = None
    predicted_iteration_s: float | None = None
    predicted_local_s: float | None = None
    summary: Summary | None = None
    status: str = "pending"  # measured | skipped | infeasible | unmeasurable | complete
    reason: str = ""
    benefit_s: float = 0.0  # estimated iteration time saved
    significant: bool = False
    # the decision rule's: paired on complete iterations, its unpaired variant on a local trial's runs
    verdict: Verdict | None = None
    workflow: Workflow | None = field(default=None, repr=False)
    runs: list[IterationRun] = field(default_factory=list, repr=False)  # complete-iteration trials
    # the reference's runs interleaved with those (its own pairs: the race measures one candidate at a time)
    reference_runs: list[IterationRun] = field(default_factory=list, repr=False)
    trial_s: float | None = None  # estimated seconds of its complete-iteration trial (one pair over the rounds)
    trial_rank: int | None = None  # its place in the race (by predicted gain per trial second; 1 first)

    def plan(self) -> Workflow:
        """The workflow of a feasible alternative (infeasible ones have none and are never measured)."""
        if self.workflow is None:
            raise ValueError(f"{self.label} is not feasible")
        return self.workflow


@dataclass
class TargetRecord:
    node: str
    total_s: float = 0.0
    mean_s: float = 0.0
    activity: float | None = None
    tier: int | None = None
    score: float = 0.0
    rank: int | None = None
    region: str | None = None
    window: int | None = None
    local_note: str = ""
    c0: Measured | None = None
    alternatives: list[Measured] = field(default_factory=list)
    best: Measured | None = None


@dataclass
class RoundRecord:
    index: int
    reference: Summary
    ranking: Ranking | None = None
    targets: list[TargetRecord] = field(default_factory=list)
    combined: list[str] = field(default_factory=list)  # the requests of the combination
    combined_predicted_s: float | None = None
    candidate: Summary | None = None
    reference_validation: Summary | None = None
    margin: float | None = None
    accepted: bool = False
    note: str = ""
    verdict: Verdict | None = None  # the decision rule's verdict on the validated plan
    # every feasible combination of the round's winners, best predicted first (the alternatives a later round
    # may need, and what the report shows of the Combine step)
    combinations: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Stage1Result:
    plan: Workflow
    requests: tuple[str, ...]
    baseline: Summary
    final: Summary
    rounds: list[RoundRecord]
    model_errors: list[tuple[str, float, float]]  # (what, predicted s, measured s)
    stopped: str = ""
    # the search ran out of training iterations or time before it had decided every round it began: a
    # plan kept for that reason says nothing about what would have been faster
    cut_short: bool = False
    baseline_runs: list[IterationRun] = field(default_factory=list, repr=False)
    final_runs: list[IterationRun] = field(default_factory=list, repr=False)
    # the before/after's verdict by the decision rule (None: no before/after was measured), and whether the
    # headline figure is validated by it (False: cut short, or not measured: the figure is a stage's own)
    verdict: Verdict | None = None
    validated: bool = False
    rule: str = ""  # the decision rule, as the report states it


@dataclass
class Stage2Record:
    """What stage 2 (`stage2.py`) did for one plan, or for several rounds (`rounds`): the report's `stage2`
    section (`to_json`). A section is either `skipped` (why stage 2 did not start or found nothing to try)
    or names its `target` process and ends with a `summary`; `plan`, `quotas`/`priorities` when a change
    was validated and kept. Rows of the screening, the quota curve and the validation stay plain data."""

    skipped: str | None = None
    summary: str | None = None
    target: str | None = None  # the process whose MPS settings were tuned, and the one it runs beside
    other: str | None = None
    gpu: int | None = None
    slack_s: float | None = None
    overlap_s: float | None = None
    score_s: float | None = None
    demand: float | None = None
    kind: str | None = None  # "quota" (searched) | "priority" (validated as screened)
    screened: list[dict[str, Any]] | None = None  # one row per screening probe
    branches: dict[str, list[str]] | None = None
    comparison_graph: str | None = None
    levels: int | None = None  # quota levels the GPU distinguishes, the coarse step, the starting quota
    rho: int | None = None
    start_percent: int | None = None
    unsafe_levels: dict[int, str] | None = None  # percent -> why its self-check failed
    trials: int | None = None
    search_stopped: str | None = None
    best_percent: int | None = None
    curve: list[dict[str, Any]] | None = None  # the quota search's measurements (and the levels skipped)
    checked_levels: dict[int, dict[str, Any]] | None = None
    validation: dict[str, Any] | None = None  # reference, candidate (Summary JSON), margin, accepted
    validation_reused_reference: int | None = None
    validation_reused_block: int | None = None
    block_overhead_s: float | None = None
    trial_seconds: float | None = None
    quotas: dict[str, int] | None = None  # kept: process -> quota percent / client priority
    priorities: dict[str, int] | None = None
    rounds: list[Stage2Record] | None = None  # several rounds: each one's section
    plan: Workflow | None = field(default=None, repr=False)  # the plan with the kept change (not serialized)
    kept: str | None = field(default=None, repr=False)  # that change, as the next round's log line says it (not serialized)

    def to_json(self) -> dict[str, Any]:
        """The report's section: every field that was set, rounds included, the plan left out."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None or f.name in ("plan", "kept"):
                continue
            out[f.name] = [r.to_json() for r in value] if f.name == "rounds" else value
        return out


Log = Callable[[str], None]

# the search's rule for a local trial: (the unchanged graph's seconds so far, an alternative's so far) ->
# why the alternative gets no more runs, or None
GiveUp = Callable[[Sequence[float], Sequence[float]], str | None]


Stop = Callable[[], str | None]  # why the search must end now (a signal, say), or None to go on


# How this search departs from the paper's Algorithm 1 (listed in every report).
DEVIATIONS = (
    "on the CPU, a node's activity a_v is the fraction of its calls' time its component ran, waited for a CPU or "
    "was blocked on its process's lock (the GIL) while another of its threads ran (CPU time + run-queue delay + "
    "sampled lock wait; no SM activity)",
    "candidates are ordered by the duration mismatch of target and partner both after the split",
    "alternatives the calibrated model predicts to be slower are not measured; the first split of each "
    "family (k = 2) is measured as calibration -- the first one always, the others unless the model, calibrated "
    "by the first, predicts them more than 25% slower than the unchanged comparison graph (where a node runs at "
    "a row count not measured yet, judged by the lower bound of its time: time grows with rows)",
    "alternatives whose comparison graph is the whole iteration, or is estimated at 40% of an iteration or "
    "more (`local_max_fraction`), are measured by complete iterations (real, retained training) instead of "
    "local trials on snapshots",
    "when a combination of several targets fails validation, the best single alternative is validated "
    "before the round ends",
    "a node's phases are ranked only when the graph runs them expanded",
    "acceptance on complete iterations is a sequential one-sided Wilcoxon signed-rank test on interleaved pairs "
    "(false-accept rate <= alpha over all looks; `stats.py`) instead of a fixed margin; a candidate whose median is "
    "faster but which the test leaves undecided gets more interleaved rounds, up to the rule's next look",
    "Combine takes the best predicted compatible set of the round's winners (every subset of up to three of its six "
    "largest single savings, and those with one of the next six whose savings could reach the best prediction; one "
    "per split family, applied fuse/rewire first, then temporal, then row splits), not the single largest saving",
    "a block of complete iterations is not started when its estimate (iterations x the reference's median) "
    "would overrun stage 1's share of the budget: stage 2 keeps its share",
    "a round measures its complete-iteration alternatives (training, kept) before its local trials (overhead); "
    "when the budget ends during the local trials the round still decides on what it measured",
    "the final before/after (interleaved complete iterations) has the last word: a plan it measures slower "
    "than the declared graph is dropped for the declared graph; one the budget or the workflow's iterations cut "
    "short (or leave none) is joined by round 1's pairs of the same two graphs when no later round changed the "
    "plan, judged in the order they came",
    "a local trial stops repeating an alternative whose first run took more than abandon_factor (1.3) x the "
    "unchanged comparison graph's first run",
    "a local trial stops repeating an alternative whose first two runs both took more than settle_factor "
    "(1.03) x the unchanged comparison graph's median: the rank test could no longer call it faster",
    "local trials, layout values and stage 2's validation are decided by the decision rule's unpaired variant (a "
    "rank-sum test at the rule's alpha; their runs are not rounds of a pair) instead of a fixed noise margin",
    "after a complete-iteration alternative won, a local alternative is not measured when it cannot be applied "
    "on top of the winner and its region's span beyond its busiest process (the most a local change saves) is "
    "less than the winner's measured saving per iteration",
    "stage 2 (Algorithm 2) screens each candidate process one quota step down and, alternately, at a below-normal "
    "MPS client priority (no SMs taken away; the critical process's kernels go first); a priority that wins is "
    "validated on complete iterations like a quota, without a search (--stage2 quotas: quotas only; --stage2 priorities: priorities only)",
)
