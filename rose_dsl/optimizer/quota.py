"""Stage 2 (paper §4.4, Algorithm 2): the MPS SM quota of the GPU process that has slack.

When two processes' work overlaps on one GPU, the one that is ready earlier can give SMs away without
delaying the point where both are needed: its slack sigma = C0 - F0 (readiness times from a common
origin). Lowering its quota speeds up the other branch; the synchronization moves earlier by
min(x, sigma - y). Rose tunes only that process's quota, searching the levels the machine really
distinguishes (2-SM steps on Hopper), coarse steps down until the time rises, then unit steps around the
best point, and keeps the result only if complete iterations get faster.

Branches here are read from the trace: a process's calls under one top-level item of the iteration and
one iteration of it (`epoch[1]` on the policy process, `update[0]` on the trainer's), per RL iteration.
Two branches of distinct processes on the same GPU whose calls run at the same time are a pair; each
pair's readiness times are the branches' ends. Overlap is the time both processes have a call running,
not the overlap of the branches' spans: a policy and a simulator that take turns inside one rollout epoch
(act -> step -> act) have overlapping spans but never share the GPU, and giving one of them SMs away can
only slow the chain down (the first H200 run of stage 2 tuned exactly such a pair). Pure functions: the
runtime measures, these decide.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from .profile import Call, IterationRun, process_bases

__all__ = ["BUDGET_SPENT", "Branch", "BranchPair", "find_branches", "rank_targets", "busy_s", "sm_demand", "distinct_levels", "QuotaSearch", "quota_search", "branch_key",
           "screening_probes",
           "merge_intervals", "concurrent_ns"]


@dataclass(frozen=True)
class Branch:
    process: str
    key: str  # `epoch[1]`, `update[0]`, `publish`
    iteration: int
    start_ns: int
    end_ns: int
    calls: int
    busy: tuple[tuple[int, int], ...] = ()  # when the process runs one of the branch's calls (disjoint, sorted)


# why a quota search or screening stopped when its budget ran out (`stage2.tune_mps` names the budget)
BUDGET_SPENT = "the time budget is spent"

def merge_intervals(spans: Sequence[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """The union of half-open intervals, as disjoint sorted intervals."""
    out: list[tuple[int, int]] = []
    for a, b in sorted(spans):
        if b <= a:
            continue
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return tuple(out)


def concurrent_ns(x: Sequence[tuple[int, int]], y: Sequence[tuple[int, int]]) -> int:
    """How long two sets of disjoint sorted intervals both cover (a merge of the two lists)."""
    i = j = total = 0
    while i < len(x) and j < len(y):
        lo, hi = max(x[i][0], y[j][0]), min(x[i][1], y[j][1])
        if hi > lo:
            total += hi - lo
        if x[i][1] <= y[j][1]:
            i += 1
        else:
            j += 1
    return total


@dataclass(frozen=True)
class BranchPair:
    target: str  # the earlier-ready process: its quota is tuned
    other: str
    gpu: int | None
    slack_s: float  # sigma = C0 - F0, overlap-weighted mean over the pairs where the target is earlier
    overlap_s: float  # overlapped time per iteration
    target_branches: tuple[str, ...]  # keys (`epoch[1]`) where the target is the earlier-ready branch
    other_branches: tuple[str, ...]
    pairs: int
    earlier_share: float  # of the overlap, the fraction where the target was ready first
    # `rank_targets`: per iteration, the sum over the target's calls with float of min(float, the time it
    # runs beside calls on the critical path), that time weighed by the SMs' activity over it (all of it
    # without activity samples) -- how much a slower target could hand to the critical path
    score_s: float = 0.0
    # `sm_demand`: the target's SM activity when it runs alone on its GPU (None: not measured). Lowering
    # the quota of a process that occupies few SMs frees few: the ranking weighs score_s by it
    demand: float | None = None

    @property
    def weight(self) -> float:
        """What the ranking sorts by: score_s, times the SM demand where it was measured."""
        return self.score_s * (self.demand if self.demand is not None else 1.0)


def branch_key(call: Call) -> tuple[str, str]:
    """(top-level item under the iteration, a key naming the branch): `iteration.epoch@1.step.act` at
    indices (k, 3, 7) is the branch `epoch@1[3]` of item `epoch@1`."""
    parts = call.path
    if len(parts) < 2:
        return parts[0], parts[0]
    top = parts[1]
    if len(parts) > 2 and len(call.indices) > 1:  # inside a loop at the top level: one branch per iteration
        return top, f"{top}[{call.indices[1]}]"
    return top, top


def _branches(runs: Sequence[IterationRun], processes: set[str]) -> dict[str, list[Branch]]:
    spans: dict[tuple[str, str, int], list[Call]] = defaultdict(list)
    for run in runs:
        for c in run.calls:
            if c.component in processes:
                spans[(c.component, branch_key(c)[1], c.iteration)].append(c)
    out: dict[str, list[Branch]] = defaultdict(list)
    for (proc, key, it), calls in spans.items():
        out[proc].append(Branch(proc, key, it, min(c.start_ns for c in calls), max(c.end_ns for c in calls), len(calls),
                                merge_intervals([(c.start_ns, c.end_ns) for c in calls])))
    return out


def find_branches(runs: Sequence[IterationRun], gpu_of: Mapping[str, int | None], min_overlap: float = 0.05) -> BranchPair | str:
    """The pair of GPU processes sharing a GPU whose branches overlap most, and which of the two is
    ready earlier (the target). A string says why there is none (then the quotas stay)."""
    gpu_procs = {p for p, g in gpu_of.items() if g is not None}
    if len(gpu_procs) < 2:
        return "fewer than two processes run on a GPU"
    branches = _branches(runs, gpu_procs)
    iteration_s = sum(r.seconds for r in runs) / max(1, len(runs))
    best: BranchPair | None = None
    procs = sorted(branches)
    for i, x in enumerate(procs):
        for y in procs[i + 1:]:
            if gpu_of[x] != gpu_of[y]:
                continue
            pair = _pair(x, y, branches[x], branches[y], gpu_of[x], len(runs))
            if pair is not None and (best is None or pair.overlap_s > best.overlap_s):
                best = pair
    if best is None:
        return "no two processes on the same GPU run overlapping branches"
    if best.overlap_s < min_overlap * iteration_s:
        return (f"{best.target} and {best.other} overlap {best.overlap_s:.3f} s per iteration, less than "
                f"{min_overlap:.0%} of it")
    if best.slack_s <= 0:
        return f"{best.target} and {best.other} become ready together: no slack to give"
    return best


def _pair(x: str, y: str, bx: list[Branch], by: list[Branch], gpu: int | None, iterations: int) -> BranchPair | None:
    weight: dict[str, float] = {x: 0.0, y: 0.0}
    slack: dict[str, float] = {x: 0.0, y: 0.0}
    keys: dict[str, set[str]] = {x: set(), y: set()}
    others: dict[str, set[str]] = {x: set(), y: set()}
    total, n = 0.0, 0
    for a in bx:
        for b in by:  # (of any RL iterations: an asynchronous plan runs k's update beside k + 1's rollout)
            if min(a.end_ns, b.end_ns) <= max(a.start_ns, b.start_ns):
                continue
            ov = concurrent_ns(a.busy, b.busy) / 1e9  # both processes running a call: sharing the GPU
            if ov <= 0:
                continue
            n += 1
            total += ov
            early, late = (a, b) if a.end_ns <= b.end_ns else (b, a)
            weight[early.process] += ov
            slack[early.process] += ov * (late.end_ns - early.end_ns) / 1e9
            keys[early.process].add(early.key)
            others[early.process].add(late.key)
    if n == 0:
        return None
    target = max((x, y), key=lambda p: weight[p])
    other = y if target == x else x
    w = weight[target]
    return BranchPair(target, other, gpu, slack[target] / w if w else 0.0, total / max(1, iterations),
                      tuple(sorted(keys[target])), tuple(sorted(others[target])), n, w / total if total else 0.0)


def screening_probes(ranked: Sequence[BranchPair], priorities: bool, per_kind: int = 3,
                     quotas: bool = True) -> list[tuple[BranchPair, str]]:
    """The one-step changes stage 2 screens, in the order it measures them (the budget may end the list):
    `(pair, "quota")` moves the pair's target one coarse quota step down, `(pair, "priority")` lowers its MPS
    client priority to below normal. Quota probes follow the ranking (`BranchPair.weight`: float beside
    critical calls, weighed by the SMs the target would free); priority probes follow `score_s` alone -- a
    priority frees no SMs, it lets the critical process's kernels be scheduled first, which is worth as much
    as the time the target runs beside them with float, launch-bound or not (H200, MJX interleaved rollout:
    the second simulator copy, ranked below the policy for quotas by its 12%-busy SMs, has the most such
    time). The two kinds alternate, best first, `per_kind` of each at most (`quotas`/`priorities` False: none
    of that kind)."""
    quota = [(p, "quota") for p in list(ranked)[:per_kind]] if quotas else []
    prio = [(p, "priority") for p in sorted(ranked, key=lambda p: p.score_s, reverse=True)[:per_kind]] if priorities else []
    out: list[tuple[BranchPair, str]] = []
    for i in range(max(len(quota), len(prio))):
        out += [*quota[i:i + 1], *prio[i:i + 1]]
    return out


def distinct_levels(sms_of_percent: Mapping[int, int]) -> list[tuple[int, int]]:
    """The quota levels a machine distinguishes: for each distinct SM count a client can see, the
    smallest percentage that gives it -- ascending (level k = 1..Q is the k-th)."""
    first: dict[int, int] = {}
    for percent in sorted(sms_of_percent):
        first.setdefault(sms_of_percent[percent], percent)
    return sorted(((p, s) for s, p in first.items()), key=lambda ps: ps[1])


@dataclass
class QuotaSearch:
    history: dict[int, float] = field(default_factory=dict)  # level (1..Q) -> measured completion time
    order: list[int] = field(default_factory=list)  # levels in the order they were measured
    best: int = 0
    stopped: str = ""
    skipped: list[int] = field(default_factory=list)  # levels `usable` refused, in the order asked
    known: frozenset[int] = frozenset()  # levels measured before the search (`quota_search(known=)`)

    @property
    def trials(self) -> int:
        """Measurements the search made (the levels it was given measured are not trials)."""
        return sum(k not in self.known for k in self.order)


def quota_search(q: int, k0: int, measure: Callable[[int], float], rho: int = 4, max_trials: int = 7,
                 out_of_time: Callable[[], bool] | None = None,
                 usable: Callable[[int], bool] | None = None,
                 known: Mapping[int, float] | None = None) -> QuotaSearch:
    """Algorithm 2 over levels 1..q starting at k0: coarse steps of `rho` levels downward while the time
    does not rise (or the minimum level is reached), then unit steps in both directions around the best
    coarse level (the anchor), a direction stopping when its time exceeds the anchor's; at most
    `max_trials` measurements (the first, at k0, included), fewer when `out_of_time()` says the time
    budget is spent. Returns every measurement and the best level.

    `usable(k)` (asked at most once per level) says whether level k may run at all -- on the H200 some
    SM counts compute wrong GEMMs (quota_safety.py). The search steps past an unusable level to the next
    one in the same direction instead of reading it as a rise: a hole in the curve is not its minimum.
    Unusable levels cost no trial; they are listed in `skipped`. Asking costs time (a check per level), so
    `out_of_time()` is consulted before each new question as before each measurement. A hole wider than
    `rho` levels is crossed after the fine search around the anchor, not before (a stated deviation:
    Algorithm 2 knows no holes).

    `known` holds levels already measured on the same comparison graph (stage 1's last measurement at
    k0, stage 2's screening of the first step down): the search reads them when it reaches them, free --
    no trial, no budget check. H200, MJX: the screening measured the policy 1.052x faster one
    step down, the budget had no room for a further trial, and the search -- asking the budget before
    reading the screened level -- kept 100%."""
    if not 1 <= k0 <= q:
        raise ValueError(f"the starting level {k0} is outside 1..{q}")
    if rho < 2:
        raise ValueError("the coarse step must be at least 2 levels")
    walk = _Walk(q, k0, measure, rho, max_trials, out_of_time, usable, dict(known or {}))
    if walk.t(k0) is None:
        return walk.s
    walk.coarse_then_fine(k0)
    # A run of unusable levels wider than the coarse step (on the H200, 60-88% of the SMs) is crossed
    # only after the fine search around the anchor: with a few trials left, the anchor's neighbours are
    # the likelier gain than a level past the hole. Then the first usable level below the hole is
    # measured, and the search goes on from it if it is no slower than the best so far.
    s = walk.s
    while walk.hole is not None and not s.stopped:
        k = walk.next_usable(walk.hole, -1)
        walk.hole = None
        if k is None or k in s.history:
            break
        v = walk.t(k)
        if v is None or v > min(s.history.values()):
            break
        walk.coarse_then_fine(k)
    s.best = min(s.history, key=lambda k: (s.history[k], -k))
    s.stopped = s.stopped or "both directions rose above the anchor"
    return s


class _Walk:
    """`quota_search`'s state: the measurements so far (`s`), the usability verdicts asked, and where a
    downward walk met a hole wider than the coarse step."""

    def __init__(self, q: int, k0: int, measure: Callable[[int], float], rho: int, max_trials: int,
                 out_of_time: Callable[[], bool] | None, usable: Callable[[int], bool] | None,
                 known: dict[int, float]) -> None:
        self.q, self.k0, self.measure, self.rho, self.max_trials = q, k0, measure, rho, max_trials
        self.out_of_time, self.usable, self.known = out_of_time, usable, known
        self.s = QuotaSearch(known=frozenset(known))
        self.verdicts: dict[int, bool] = {}
        self.hole: int | None = None  # the first level below a run of more than `rho` unusable ones

    def _spent(self) -> bool:
        if self.out_of_time is not None and self.out_of_time():
            self.s.stopped = self.s.stopped or BUDGET_SPENT
            return True
        return False

    def t(self, k: int) -> float | None:
        """Level k's time: known (free), or measured -- None when the trials or the time are spent."""
        s = self.s
        if k in self.known:
            s.history[k] = self.known[k]
            s.order.append(k)
            return s.history[k]
        if s.trials >= self.max_trials:
            s.stopped = s.stopped or f"the trial budget ({self.max_trials}) is spent"
            return None
        if s.order and self._spent():
            return None
        s.history[k] = self.measure(k)
        s.order.append(k)
        return s.history[k]

    def ok(self, k: int) -> bool:
        if k not in self.verdicts:
            self.verdicts[k] = self.usable is None or k == self.k0 or self.usable(k)
            if not self.verdicts[k]:
                self.s.skipped.append(k)
        return self.verdicts[k]

    def next_usable(self, k: int, d: int, max_skip: int | None = None) -> int | None:
        """k itself or the first usable level beyond it in direction d (None: none left in 1..q, more
        than `max_skip` unusable levels in a row -- a downward hole is remembered in `hole` --, or the
        time budget ran out while asking: each question may cost a check, so it is budgeted too)."""
        skipped = 0
        while 1 <= k <= self.q:
            if k in self.s.history or k in self.known:  # measured: usable, and no question to pay for
                return k
            if max_skip is not None and skipped > max_skip:
                if d < 0 and self.hole is None:
                    self.hole = k
                return None
            if k not in self.verdicts and self._spent():
                return None
            if self.ok(k):
                return k
            skipped += 1
            k += d
        return None

    def coarse_then_fine(self, kb: int) -> int:
        """Coarse steps down from kb while the time does not rise, then unit steps both ways around the
        anchor; the anchor."""
        history, rho = self.s.history, self.rho
        while kb > 1:  # coarse search
            k = self.next_usable(max(1, kb - rho), -1, max_skip=rho)
            if k is None:
                break
            v = self.t(k)
            if v is None or v > history[kb]:
                break
            kb = k
        for d in (-1, +1):  # fine search around the anchor
            k = self.next_usable(kb + d, d, max_skip=rho)
            while k is not None and k not in history:
                v = self.t(k)
                if v is None or v > history[kb]:
                    break
                k = self.next_usable(k + d, d, max_skip=rho)
        return kb


Floats = Mapping[tuple[str, tuple[int, ...]], float]


# GPM's SM_UTIL counters advance in steps of about 100 ms (`interpreter/gpu_activity.py`, H200 probe), so a
# sample polled over [start, end) reports a window that ends up to one step earlier: the activity it
# reads happened somewhere in [start - step, end), at half a step's lag on average.
COUNTER_STEP_NS = 100_000_000
# a component's own samples (alone on the GPUs over a sample's whole possible window) give its demand when
# they cover at least this much of its calls; otherwise the joint fit over every sample does
MIN_ALONE_NS = 300_000_000


def sm_demand(runs: Sequence[IterationRun], gpu_of: Mapping[str, int | None],
              step_ns: int = COUNTER_STEP_NS) -> dict[str, float]:
    """Each GPU process's SM activity while its calls run: the fraction of the device its kernels keep
    busy. Per component -- the processes of one component (temporal copies `sim@0`, replicas `sim#1`) run
    the same programs -- fitted to the activity samples (`IterationRun.activity_samples`, device-wide; the
    samples do not say which GPU they come from, so alone means alone on all of them):

    * where the component is the only one with a call in flight over a sample's whole possible window
      ([start - step, end): the counters lag), its demand is the least-squares slope of the samples'
      values on how much of the lag-centred window its calls cover (two copies in flight count twice);
    * a component with less than MIN_ALONE_NS of such samples (a short call always beside another's, like
      a policy's 0.15-s act between simulator steps) takes its coefficient in a non-negative least-squares
      fit of every sample's value on every component's coverage (activity adds up where calls overlap).

    Why stage 2 needs it: MPS's quota caps the SMs a process may use, so it frees SMs for the others
    only when the process occupies them. paper_mjx_vla on the H200: alone, the MJX
    simulator keeps ~3% of the SMs busy (launch-bound), the policy ~80%, the trainer ~91%; the simulator
    had the most float beside the critical path, and its step down gained 1.4%, while the
    policy's gained 4%. Why the lag and the fit: read as "samples whose own window sees one
    process", with no lag, the same declared graph gave the policy 0.14 to 0.88 and the simulator 0.04 to
    0.25 in four rounds on one H100 (`paper_table/mjx_stage1_h100_2026-12-05e/traces`), and
    the optimizer screened the simulator first (its step down: 1.01x; the policy's: 1.06x)."""
    gpu_procs = [p for p, g in gpu_of.items() if g is not None]
    on_gpu = set(gpu_procs)
    bases = process_bases(runs)
    base = {p: bases.get(p, p) for p in gpu_procs}  # a process with no call is a component of its own
    components = sorted(set(base.values()))
    if not components:
        return {}
    index = {c: i for i, c in enumerate(components)}
    rows: list[tuple[list[float], float]] = []  # (coverage of each component, value): the joint fit's data
    alone: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])  # sum f*v, sum f*f, covered ns
    half = step_ns // 2
    for run in runs:
        spans: dict[str, list[tuple[int, int]]] = defaultdict(list)
        for c in run.calls:
            if c.component in on_gpu:
                spans[c.component].append((c.start_ns, c.end_ns))
        merged = {p: merge_intervals(s) for p, s in spans.items()}
        for start, end, value in run.activity_samples:
            width = end - start
            if width <= 0:
                continue
            cover = [0.0] * len(components)
            seen: set[str] = set()
            for p, busy in merged.items():
                lagged = concurrent_ns(busy, ((start - half, end - half),))
                if lagged:
                    cover[index[base[p]]] += lagged / width
                if concurrent_ns(busy, ((start - step_ns, end),)):
                    seen.add(base[p])
            rows.append((cover, value))
            if len(seen) == 1:
                (comp,) = seen
                f = cover[index[comp]]
                acc = alone[comp]
                acc[0] += f * value
                acc[1] += f * f
                acc[2] += f * width
    demand = {c: min(1.0, fv / ff) for c, (fv, ff, ns) in alone.items() if ns >= MIN_ALONE_NS and ff > 0}
    if len(demand) < len(components) and rows:
        fitted = _nonnegative_fit(rows, len(components))
        seen_at_all = {c for c in components if any(cover[index[c]] > 0 for cover, _ in rows)}
        demand.update({c: min(1.0, fitted[index[c]]) for c in seen_at_all if c not in demand})
    return {p: demand[base[p]] for p in gpu_procs if base[p] in demand}


def _nonnegative_fit(rows: Sequence[tuple[Sequence[float], float]], n: int, sweeps: int = 500) -> list[float]:
    """Non-negative least squares, min |X d - v| with d >= 0, by coordinate descent on the normal equations
    (a handful of components: no solver library needed; the objective is convex, each step exact)."""
    gram = [[sum(x[i] * x[j] for x, _ in rows) for j in range(n)] for i in range(n)]
    rhs = [sum(x[i] * v for x, v in rows) for i in range(n)]
    d = [0.0] * n
    for _ in range(sweeps):
        change = 0.0
        for i in range(n):
            if gram[i][i] <= 0:
                continue
            new = max(0.0, (rhs[i] - sum(gram[i][j] * d[j] for j in range(n) if j != i)) / gram[i][i])
            change = max(change, abs(new - d[i]))
            d[i] = new
        if change < 1e-9:
            break
    return d


def busy_s(samples: Sequence[tuple[int, int, float]], lo: int, hi: int) -> float:
    """SM-busy seconds in [lo, hi) (ns): the device's SM activity samples integrated over it; where no
    sample covers the window, every second counts as busy (without samples: its length)."""
    covered = busy = 0.0
    for start, end, value in samples:
        both = min(end, hi) - max(start, lo)
        if both > 0:
            covered += both
            busy += value * both
    return (busy + max(0.0, (hi - lo) - covered)) / 1e9


def rank_targets(runs: Sequence[IterationRun], gpu_of: Mapping[str, int | None], floats: Sequence[Floats | None],
                 min_overlap: float = 0.05, critical: float = 0.01,
                 demand: Mapping[str, float] | None = None) -> list[BranchPair] | str:
    """The GPU processes whose quota stage 2 may lower, best first, read from each run's total floats
    (`bound.call_floats`, parallel to `runs`): a process is a candidate when some of its calls have
    float (could end later without the iteration ending later) while calls on the critical path (float
    below `critical` x the iteration) of another process on the same GPU run beside them. Those are the
    calls whose SMs, given away, can only speed the critical path up. Where the runs carry the device's
    SM activity, that time beside critical calls counts by how busy the SMs were (`busy_s`): SMs given
    away help a critical call only where it lacks them. H200, MJX interleaved rollout:
    beside the critical simulator copy, the other copy ran 1.7 s per iteration with the SMs 12% busy (two
    launch-bound programs: nothing to free), the policy 0.47 s with them 85% busy; the policy's step down
    gained 1.052x, the simulator's 0.988-1.016x. Ranked by `score_s`; `slack_s` is
    the overlap-weighted float of the target's calls, `other` the process whose critical calls it runs
    beside most. With `demand` (`sm_demand`), the score is weighed by the process's SM activity alone
    (`BranchPair.weight`): a launch-bound process has float but few SMs to give. A string says why there
    is none.

    The paper's rule (`find_branches`: of two overlapping branches the one ready first) assumes the two
    meet at one consumer. Temporal groups that each feed their own update do not: the group that ends
    first is the critical one. Without floats for every run (a trace of another graph) the paper's rule
    decides, as a one-element list."""
    if not runs or any(f is None for f in floats) or len(floats) != len(runs):
        pair = find_branches(runs, gpu_of, min_overlap)
        return pair if isinstance(pair, str) else [pair]
    gpu_procs = {p for p, g in gpu_of.items() if g is not None}
    if len(gpu_procs) < 2:
        return "fewer than two processes run on a GPU"
    score: dict[str, float] = defaultdict(float)
    overlap: dict[str, float] = defaultdict(float)
    weighted: dict[str, float] = defaultdict(float)
    beside: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    keys: dict[str, set[str]] = defaultdict(set)
    other_keys: dict[str, set[str]] = defaultdict(set)
    pairs: dict[str, int] = defaultdict(int)
    for run, fl in zip(runs, floats, strict=True):
        assert fl is not None
        eps = critical * run.seconds
        on_gpu = [c for c in run.calls if c.component in gpu_procs]

        def float_of(c: Call, fl: Floats = fl) -> float:
            return fl.get((c.node, tuple(c.indices)), 0.0)

        crit = [c for c in on_gpu if float_of(c) <= eps]
        for c in on_gpu:
            f = float_of(c)
            if f <= eps:
                continue
            conc = 0.0  # how long c runs beside critical calls of other processes on its GPU
            busy = 0.0  # of that, the SM-busy seconds (the device's SM activity integrated over it)
            for d in crit:
                if d.component == c.component or gpu_of[d.component] != gpu_of[c.component]:
                    continue
                lo, hi = max(c.start_ns, d.start_ns), min(c.end_ns, d.end_ns)
                both = (hi - lo) / 1e9
                if both <= 0:
                    continue
                conc += both
                # the samples read [lo, hi) about half a counter step after it happened (`sm_demand`)
                busy += busy_s(run.activity_samples, lo + COUNTER_STEP_NS // 2, hi + COUNTER_STEP_NS // 2)
                beside[c.component][d.component] += both
                other_keys[c.component].add(branch_key(d)[1])
                pairs[c.component] += 1
            if conc > 0:
                overlap[c.component] += conc
                weighted[c.component] += conc * f
                keys[c.component].add(branch_key(c)[1])
                score[c.component] += min(f, conc) * (busy / conc)
    n = len(runs)
    iteration_s = sum(r.seconds for r in runs) / n
    ranked = [BranchPair(p, max(beside[p], key=beside[p].__getitem__), gpu_of[p], weighted[p] / overlap[p],
                         overlap[p] / n, tuple(sorted(keys[p])), tuple(sorted(other_keys[p])), pairs[p], 1.0,
                         score_s=score[p] / n, demand=(demand or {}).get(p))
              for p in score if overlap[p] > 0]
    ranked.sort(key=lambda b: (-b.weight, b.target))
    if not ranked:
        return "no process with slack runs beside a call on the critical path of another on its GPU"
    best = ranked[0]
    kept = [b for b in ranked if b.overlap_s >= min_overlap * iteration_s]
    if not kept:
        return (f"{best.target} runs {best.overlap_s:.3f} s per iteration beside critical calls of {best.other}, "
                f"less than {min_overlap:.0%} of it")
    return kept
