"""Stage 2's pure pieces: branches and slack from traces (recorded on the H200 and synthetic), the
quota levels a machine distinguishes, and Algorithm 2 on synthetic latency curves."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import rose_dsl.optimizer.stage2 as stage2
from interpreter.mps import quota_levels
from interpreter.optimize.quota_trials import QuotaTrials, settle
from rose_dsl.measurement import Books
from rose_dsl.optimizer.budget import Budget
from rose_dsl.optimizer.profile import Call, IterationRun, runs_from_chrome_trace
from rose_dsl.optimizer.quota import BranchPair, distinct_levels, find_branches, quota_search
from rose_dsl.optimizer.records import Settings

ROOT = Path(__file__).resolve().parents[2]
TRACES = ROOT / "tests" / "data" / "gpu_traces"  # real GPU runs (README there: which run each is)


class _Stage2:
    """Stage 2 as `rose optimize` drives it: the optimizer's decisions (`stage2`) on the runtime's
    `QuotaTrials` over a fake session and GPU. `time`: a fake clock (its `perf_counter`) for the budget;
    `COUNT_MARGIN`: `Settings.quota_count_margin` for these calls."""

    time: object | None = None
    COUNT_MARGIN: float | None = None
    PARALLEL_CHECKS = Settings().quota_parallel_checks
    settle = staticmethod(settle)

    def _wire(self, session, gpu, settings, total_sms, check, stop, deadline):  # type: ignore[no-untyped-def]
        import time as real_time
        from dataclasses import replace

        clock = self.time.perf_counter if self.time is not None else real_time.perf_counter  # type: ignore[attr-defined]
        if self.COUNT_MARGIN is not None:
            settings = replace(settings, quota_count_margin=self.COUNT_MARGIN)
        qm = QuotaTrials(session, gpu, check=check, stop=stop, total_sms=total_sms)
        return qm, settings, Budget(deadline=deadline, clock=clock)

    def tune_quota(self, wf, result, session, gpu, settings, log, total_sms=None, check=None, stop=None,  # type: ignore[no-untyped-def]
                   deadline=None, **options):
        qm, settings, budget = self._wire(session, gpu, settings, total_sms, check, stop, deadline)
        return _section(stage2.tune_quota(result, qm, settings, log, budget=budget, stop=stop, **options))

    def tune_mps(self, wf, result, session, gpu, settings, log, total_sms=None, check=None, stop=None,  # type: ignore[no-untyped-def]
                 deadline=None, **options):
        qm, settings, budget = self._wire(session, gpu, settings, total_sms, check, stop, deadline)
        return _section(stage2.tune_mps(result, qm, settings, log, budget=budget, stop=stop, **options))


def _section(record):  # type: ignore[no-untyped-def]
    """What the tests read: the report's section (`Stage2Record.to_json`) with the kept plan."""
    return {**record.to_json(), **({"plan": record.plan} if record.plan is not None else {})}


_QT = _Stage2()  # one for all tests (monkeypatch puts back what a test sets on it)


def _c(node: str, comp: str, indices: tuple[int, ...], start_ms: float, end_ms: float) -> Call:
    return Call(node, comp, indices[0], indices, int(start_ms * 1e6), int(end_ms * 1e6))


def test_recorded_h200_trace_finds_the_trainer_has_slack() -> None:
    """embodied_ppo_gpu under MPS (H200): the PPO update of epoch 0 (trainer) overlaps the rollout of
    epoch 1 (policy) on GPU 0 and is done ~0.65 s before it: the trainer is the earlier-ready branch."""
    runs, gpu_of = runs_from_chrome_trace(json.loads((TRACES / "ppo_gpu_mps_p100_t100.trace.json").read_text()))
    assert gpu_of == {"sim": None, "policy": 0, "trainer": 0}
    pair = find_branches(runs[1:], gpu_of)
    assert isinstance(pair, BranchPair)
    assert (pair.target, pair.other, pair.gpu) == ("trainer", "policy", 0)
    assert pair.target_branches == ("update[0]",) and pair.other_branches == ("epoch[1]",)
    assert pair.slack_s == pytest.approx(0.65, abs=0.05)
    # the time both run a call (the policy's acts during the update; its simulator is on the CPU), not
    # the ~1.9 s by which the two branches' spans overlap
    assert 0.8 < pair.overlap_s < 1.1


def test_processes_that_take_turns_are_not_a_pair() -> None:
    """paper_mjx_vla declared (H200): policy and MJX simulator alternate inside each rollout epoch
    (act -> step -> act), so their branches' spans overlap but they never share the GPU; stage 2 used to
    tune the policy against its own simulator there (the first H200 run of `rose optimize`). The pair
    that does share the GPU is the rollout of epoch 1 against the PPO update of epoch 0."""
    trace = TRACES / "mjx_frame_skip4_declared.trace.json"
    runs, gpu_of = runs_from_chrome_trace(json.loads(trace.read_text()))
    assert gpu_of == {"sim": 0, "policy": 0, "trainer": 0}
    pair = find_branches(runs[1:], gpu_of)
    assert isinstance(pair, BranchPair)
    assert {pair.target, pair.other} == {"sim", "trainer"}
    assert set(pair.target_branches + pair.other_branches) == {"epoch[1]", "update[0]"}
    assert pair.slack_s > 0 and pair.overlap_s > 1.0


def test_a_chain_of_turns_alone_has_no_pair() -> None:
    calls, t = [], 0.0
    for step in range(5):
        calls.append(_c("iteration.epoch.step.act", "policy", (0, 0, step), t, t + 8.0))
        calls.append(_c("iteration.epoch.step.env", "sim", (0, 0, step), t + 8.0, t + 18.0))
        t += 18.0
    assert "overlapping" in find_branches([IterationRun(t / 1e3, tuple(calls))], {"policy": 0, "sim": 0})


def test_traces_without_gpu_processes_have_no_pair() -> None:
    runs, gpu_of = runs_from_chrome_trace(json.loads((TRACES / "ppo_gpu.trace.json").read_text()))
    assert find_branches(runs, gpu_of) == "fewer than two processes run on a GPU"


def _pipeline(policy_ms: float, sim_ms: float) -> list[IterationRun]:
    """Two processes alternating on groups: policy(B) next to sim(A), one step loop."""
    calls, t = [], 0.0
    for step in range(5):
        calls.append(_c("iteration.epoch.step.act@1", "policy", (0, 0, step), t, t + policy_ms))
        calls.append(_c("iteration.epoch.step.env@0", "sim", (0, 0, step), t, t + sim_ms))
        t += max(policy_ms, sim_ms)
    return [IterationRun(t / 1e3, tuple(calls))]


def test_the_earlier_ready_process_is_the_target() -> None:
    pair = find_branches(_pipeline(8.0, 10.0), {"policy": 0, "sim": 0})
    assert isinstance(pair, BranchPair) and pair.target == "policy" and pair.slack_s == pytest.approx(0.002)
    pair = find_branches(_pipeline(10.0, 8.0), {"policy": 0, "sim": 0})
    assert isinstance(pair, BranchPair) and pair.target == "sim"


def test_no_pair_on_distinct_gpus_without_overlap_or_slack() -> None:
    assert "overlapping" in find_branches(_pipeline(8.0, 10.0), {"policy": 0, "sim": 1})
    serial = [IterationRun(0.02, (_c("iteration.a", "p", (0,), 0, 10), _c("iteration.b", "q", (0,), 10, 20)))]
    assert "overlapping" in find_branches(serial, {"p": 0, "q": 0})
    assert "ready together" in find_branches(_pipeline(10.0, 10.0), {"policy": 0, "sim": 0})
    tiny = [IterationRun(10.0, _pipeline(8.0, 10.0)[0].calls)]
    assert "less than" in find_branches(tiny, {"policy": 0, "sim": 0})


def test_levels_the_h200_distinguishes() -> None:
    levels = distinct_levels(quota_levels(132))
    assert len(levels) == 66 and levels[-1] == (100, 132)
    as_dict = dict((s, p) for p, s in levels)
    assert as_dict[12] == 10 and as_dict[66] == 50 and as_dict[98] == 75  # 10%->12, 50%->66, 75%->98 SMs
    assert all(b[1] - a[1] == 2 for a, b in zip(levels, levels[1:], strict=False))


def test_u_shaped_curve_finds_the_minimum_within_seven_trials() -> None:
    """Figure 15's shape: too few SMs are slow, the default is not the best; minimum at level 58."""
    curve = {k: 1.0 + 0.002 * (k - 58) ** 2 for k in range(1, 67)}
    calls: list[int] = []
    s = quota_search(66, 66, lambda k: calls.append(k) or curve[k], rho=4, max_trials=7)
    # coarse 66 -> 62 -> 58 -> 54 (rises: stop); fine 57 and 59 both rise above the anchor 58: stop
    assert calls == s.order == [66, 62, 58, 54, 57, 59]
    assert s.trials <= 7 and s.best == 58
    assert s.history[58] == min(s.history.values())


def test_monotone_curves_stop_by_the_rules() -> None:
    # more SMs always faster: the first coarse step rises, fine search goes down one step and stops
    s = quota_search(66, 66, lambda k: 100.0 - k, rho=4)
    assert s.order == [66, 62, 65] and s.best == 66
    # fewer SMs never slower (the process has slack to spare): coarse search reaches level 1
    s = quota_search(20, 20, lambda k: 1.0 + 0.001 * k, rho=4, max_trials=20)
    assert s.order[:6] == [20, 16, 12, 8, 4, 1] and s.best == 1 and 2 in s.history
    # a budget of 3 trials stops the search where it is and still returns the best measured level
    s = quota_search(66, 66, lambda k: 1.0 + 0.001 * k, rho=4, max_trials=3)
    assert s.trials == 3 and s.best == 58 and "budget" in s.stopped


def test_unusable_levels_are_stepped_past_not_read_as_a_rise() -> None:
    """Holes in the curve (levels whose GEMMs are wrong) must not stop the search: it takes the next
    usable level in the same direction, asks about each level once and spends no trial on a hole."""
    curve = {k: 1.0 + 0.002 * (k - 58) ** 2 for k in range(1, 67)}
    asked: list[int] = []

    def usable(k: int) -> bool:
        asked.append(k)
        return k not in (62, 58)

    s = quota_search(66, 66, lambda k: curve[k], rho=4, max_trials=7, usable=usable)
    # coarse 66 -> (62 unusable) 61 -> 57 -> 53 rises; fine: 56 rises, (58 unusable) 59 ties, 60 rises
    assert s.order == [66, 61, 57, 53, 56, 59, 60] and s.skipped == [62, 58]
    assert 62 not in s.history and 58 not in s.history and len(asked) == len(set(asked))
    assert s.best in (57, 59) and s.trials == 7
    # every level below the start unusable: the start is the only measurement, and the best
    s = quota_search(10, 10, lambda k: 1.0, rho=2, usable=lambda k: False)
    # (8, 7, 6: a hole wider than rho; the anchor's neighbour 9; then across the hole from 5)
    assert s.order == [10] and s.best == 10 and s.skipped == [8, 7, 6, 9, 5, 4, 3, 2, 1]


def test_bad_search_arguments() -> None:
    with pytest.raises(ValueError):
        quota_search(10, 11, lambda k: 1.0)
    with pytest.raises(ValueError):
        quota_search(10, 10, lambda k: 1.0, rho=1)


class _FakeExecutor:
    def __init__(self) -> None:
        self.quota = {"trainer": 100}
        self.priority: dict[str, int] = {}  # processes moved to another client priority
        self.replaced: list[int] = []
        self.envs: list[dict] = []  # each new process's MPS environment

    def replace_quota(self, comp: str, percent: int, env: dict, priority: int | None = None) -> None:
        if priority is not None:
            self.priority[comp] = priority
        assert env == _Gpu().client_env(percent, self.priority.get(comp, 0))
        self.envs.append(env)
        percent = 100 if percent is None else percent  # a process back to the plan's settings: no quota set
        self.quota[comp] = percent
        self.replaced.append(percent)


class _FakeSession:
    """Complete iterations whose time depends on the trainer's quota (a U around 80%)."""

    def __init__(self, best: int = 80) -> None:
        self.executor = _FakeExecutor()
        self.books = Books()
        self.best = best

    def _t(self) -> float:
        return 1.0 + 0.0005 * (self.executor.quota["trainer"] - self.best) ** 2

    def replace_quota(self, comp: str, percent: int, env: dict, priority: int | None = None) -> None:
        self.executor.replace_quota(comp, percent, env, priority)

    def complete(self, plans, rounds, warmup=0, labels=(), guard_first=False):
        return [[IterationRun(self._t() * (1 + 0.001 * i), ()) for i in range(rounds)] for _ in plans]


class _Gpu:
    def client_env(self, percent: int, priority: int | None = None) -> dict:
        return {"MPS": str(percent), **({"PRIORITY": str(priority)} if priority else {})}


def _checked(unsafe: tuple[int, ...] = ()):
    """The GEMM self-check of each level (interpreter/quota_safety.py), here a table."""
    from interpreter.quota_safety import QuotaVerdict

    seen: list[int] = []
    batches: list[list[int]] = []

    def check(percents: list[int]) -> dict[int, QuotaVerdict]:
        batches.append(list(percents))
        seen.extend(percents)
        return {p: QuotaVerdict(p, None, p not in unsafe, 27, int(p in unsafe), "wrong" if p in unsafe else "exact", "test")
                for p in percents}

    check.seen = seen  # type: ignore[attr-defined]
    check.batches = batches  # type: ignore[attr-defined]
    return check


def _stage1(root: Path):
    from dataclasses import replace

    from rose_dsl import load_workflow
    from rose_dsl.optimizer.decide import summarize
    from rose_dsl.optimizer.search import Stage1Result

    wf = load_workflow(root / "workflows" / "latency_interaction.yaml")
    gpu = {n: replace(c, device="gpu", gpu=0) for n, c in wf.components.items() if n in ("policy", "trainer")}
    wf = replace(wf, components={**wf.components, **gpu})
    calls = []
    for it in range(2):  # the trainer's update 0 ends 0.45 s before the policy's rollout of epoch 1
        base = it * 10_000
        calls += [_c("iteration.epoch.step.act", "policy", (it, 1, s), base + 1000 + 300 * s, base + 1250 + 300 * s)
                  for s in range(10)]
        calls.append(_c("iteration.update.sgd", "trainer", (it, 0), base + 1000, base + 3500))
    runs = [IterationRun(10.0, tuple(c for c in calls if c.iteration == it)) for it in range(2)]
    s = summarize([1.0, 1.0, 1.0])
    return wf, Stage1Result(wf, (), s, s, [], [], "", baseline_runs=runs, final_runs=runs)


def test_tune_quota_searches_validates_and_writes_the_quota() -> None:
    tune_quota = _QT.tune_quota
    from rose_dsl.optimizer.search import Settings

    wf, result = _stage1(ROOT)
    session = _FakeSession(best=80)
    out = tune_quota(wf, result, session, _Gpu(), Settings(), log=lambda m: None, total_sms=132, check=_checked())
    assert out["target"] == "trainer" and out["other"] == "policy" and out["slack_s"] == pytest.approx(0.45)
    assert out["comparison_graph"] == "iteration"  # update and epoch: the LCA is the whole iteration
    assert out["trials"] <= 7 and session.books.quota_trials == out["trials"]
    assert out["best_percent"] < 100 and out["validation"]["accepted"]
    assert out["quotas"] == {"trainer": out["best_percent"]}
    assert out["plan"].components["trainer"].mps_quota == out["best_percent"]
    assert session.executor.quota["trainer"] == out["best_percent"]  # the process runs under the kept quota
    assert [p["percent"] for p in out["curve"]] == sorted(p["percent"] for p in out["curve"])


def test_tune_quota_keeps_the_default_when_nothing_is_faster() -> None:
    tune_quota = _QT.tune_quota
    from rose_dsl.optimizer.search import Settings

    wf, result = _stage1(ROOT)
    session = _FakeSession(best=100)
    out = tune_quota(wf, result, session, _Gpu(), Settings(), log=lambda m: None, total_sms=132, check=_checked())
    assert out["best_percent"] == 100 and "quotas" not in out and "kept trainer at 100%" in out["summary"]
    assert session.executor.quota["trainer"] == 100


def test_a_whole_iteration_graph_reuses_stage_1s_measurement_as_its_first_point() -> None:
    """The comparison graph of update/epoch is the whole iteration: the starting quota's time is what
    stage 1 measured last (complete iterations of the same plan and quotas), not three more iterations."""
    from dataclasses import replace

    tune_quota = _QT.tune_quota
    from rose_dsl.optimizer.search import Settings

    wf, result = _stage1(ROOT)
    result = replace(result, final_runs=[*result.final_runs, result.final_runs[0]])  # 3 runs: enough to reuse
    session = _FakeSession(best=80)
    out = tune_quota(wf, result, session, _Gpu(), Settings(), log=lambda m: None, total_sms=132, check=_checked())
    start = next(p for p in out["curve"] if p["percent"] == 100)
    assert start["reused"] and start["samples"] == [r.seconds for r in result.final_runs]
    assert 100 not in session.executor.replaced[:1]  # the first trial moved the trainer to a new level
    assert out["trials"] == session.books.quota_trials == sum(1 for p in out["curve"] if not p["reused"])
    assert 1 <= out["trials"] <= 7 and out["best_percent"] < 100


def test_the_time_budget_ends_the_search_with_the_best_so_far() -> None:
    calls: list[int] = []
    s = quota_search(66, 66, lambda k: calls.append(k) or 1.0 + 0.001 * k, rho=4, out_of_time=lambda: len(calls) >= 2)
    assert s.order == [66, 62] and s.best == 62 and "time budget" in s.stopped


def test_stepping_past_unusable_levels_stops_when_the_time_budget_is_spent() -> None:
    """H200, 2026-12-02: after 94% a run of unsafe levels (88% down to 78%) was checked one by one, ~18 s
    each, past the budget until the command's hard limit killed it without a report. Asking is budgeted."""
    asked: list[int] = []
    clock = {"t": 0.0}

    def usable(k: int) -> bool:
        asked.append(k)
        clock["t"] += 18.0
        return k <= 30

    s = quota_search(66, 66, lambda k: 1.0 + 0.001 * k, rho=4, usable=usable, out_of_time=lambda: clock["t"] > 100)
    # 62..58 unusable (a hole wider than the coarse step), then the anchor's neighbour 65, unusable too:
    # after six questions (108 s) the budget is spent: no seventh, no trial
    assert s.order == [66] and asked == [62, 61, 60, 59, 58, 65] and "time budget" in s.stopped and s.best == 66


def test_a_wide_hole_is_crossed_after_the_fine_search_around_the_anchor() -> None:
    """The H200's shape (levels = SM count / 2): 90-94% safe, 60-88% (levels 30-58) unsafe, 50% safe. With
    few trials the anchor's safe neighbours (93%, 91%) are measured before anything past the hole; with
    more, the search crosses the hole and keeps going only if the level below is no slower."""
    curve = {k: 1.0 + 0.01 * abs(k - 60) for k in range(1, 67)}  # minimum at level 60 (91%)
    unsafe = set(range(30, 59))
    s = quota_search(66, 66, lambda k: curve[k], rho=4, max_trials=5, usable=lambda k: k not in unsafe)
    # coarse 66 -> 62 -> (58..54 unsafe: a hole); fine 61, 60, 59 (none slower than the anchor 62); the
    # trial budget ends it
    assert s.order == [66, 62, 61, 60, 59] and s.best == 60 and not set(s.order) & unsafe
    s = quota_search(66, 66, lambda k: curve[k], rho=4, max_trials=12, usable=lambda k: k not in unsafe)
    # the fine search goes down to 59 and up to 63 (slower than the anchor); then the hole is crossed:
    # 29 is slower than the best, so the search ends there
    assert s.order[:6] == [66, 62, 61, 60, 59, 63] and s.order[-1] == 29 and s.best == 60
    # a curve that keeps falling below the hole: the search goes on from there (coarse again)
    falling = {k: 1.0 + 0.01 * k for k in range(1, 67)}
    s = quota_search(66, 66, lambda k: falling[k], rho=4, max_trials=12, usable=lambda k: k not in unsafe)
    assert 29 in s.order and 25 in s.order and s.best < 29


def test_tune_quota_never_uses_a_level_whose_gemms_are_wrong() -> None:
    """Issue 16: on the H200 cuBLAS is wrong at 78 and 92 SMs; the search must route around such levels."""
    tune_quota = _QT.tune_quota
    from rose_dsl.optimizer.search import Settings

    wf, result = _stage1(ROOT)
    session = _FakeSession(best=80)
    reference = tune_quota(wf, result, _FakeSession(best=80), _Gpu(), Settings(), log=lambda m: None, total_sms=132,
                           check=_checked())
    bad = reference["best_percent"]  # make the level the search would choose unsafe
    check = _checked(unsafe=(bad,))
    out = tune_quota(wf, result, session, _Gpu(), Settings(), log=lambda m: None, total_sms=132, check=check)
    assert bad in check.seen and bad in out["unsafe_levels"]
    assert out["best_percent"] != bad and bad not in session.executor.replaced
    assert any(p["unsafe"] and p["seconds"] is None for p in out["curve"])
    assert session.books.quota_trials == out["trials"] == sum(1 for p in out["curve"] if not p["unsafe"])
    # the report shows the hole in the curve instead of failing on it
    from rose_dsl.optimizer.report import quota_curve_markdown

    assert "not run: the GPU math self-check fails" in "\n".join(quota_curve_markdown(out))


def test_a_run_of_unsafe_levels_is_checked_in_parallel_batches() -> None:
    """H200, 2026-12-02: below 94% nearly every level down to 50% is unsafe; checked one at a time (~18 s
    each) they took the whole stage-2 budget. The search asks level by level; the checks go in batches of
    the nearest unchecked levels, each level checked once."""
    PARALLEL_CHECKS, tune_quota = _Stage2.PARALLEL_CHECKS, _QT.tune_quota
    from rose_dsl.optimizer.search import Settings

    wf, result = _stage1(ROOT)
    unsafe = tuple(range(51, 89))  # 51%..88%, as on the H200 (roughly)
    check = _checked(unsafe=unsafe)
    out = tune_quota(wf, result, _FakeSession(best=40), _Gpu(), Settings(), log=lambda m: None, total_sms=132, check=check)
    assert all(len(b) <= PARALLEL_CHECKS for b in check.batches)
    assert len(check.seen) == len(set(check.seen))  # no level checked twice
    asked_unsafe = [p for p in out["unsafe_levels"]]
    assert len(asked_unsafe) > PARALLEL_CHECKS and len(check.batches) <= len(asked_unsafe) // (PARALLEL_CHECKS // 2) + 2
    assert out["best_percent"] not in unsafe and out["best_percent"] < 51
    assert set(out["checked_levels"]) == set(check.seen)


def test_concurrent_time_is_the_measure_of_the_intersection() -> None:
    """merge_intervals / concurrent_ns against a brute-force count on a small integer grid."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from rose_dsl.optimizer.quota import concurrent_ns, merge_intervals

    spans = st.lists(st.tuples(st.integers(0, 40), st.integers(0, 40)), max_size=6)

    @settings(max_examples=200, deadline=None)
    @given(spans, spans)
    def check(x, y):
        mx, my = merge_intervals(x), merge_intervals(y)
        assert all(a < b for a, b in mx) and all(p[1] < q[0] for p, q in zip(mx, mx[1:], strict=False))
        covered = lambda s, t: any(a <= t < b for a, b in s)  # noqa: E731
        assert concurrent_ns(mx, my) == sum(covered(x, t) and covered(y, t) for t in range(41))

    check()


def test_a_stop_request_ends_the_quota_search_and_keeps_the_unvalidated_level_out() -> None:
    """A signal during stage 2 (`rose optimize`'s GracefulStop): no new trial starts, and a level that was
    faster locally but not validated on complete iterations is not kept."""
    tune_quota = _QT.tune_quota
    from rose_dsl.optimizer.search import Settings

    wf, result = _stage1(ROOT)
    session = _FakeSession(best=80)
    asked = {"n": 0}

    def stop() -> str | None:
        asked["n"] += 1
        return "stopped by SIGTERM" if session.books.quota_trials >= 2 else None

    out = tune_quota(wf, result, session, _Gpu(), Settings(), log=lambda m: None, total_sms=132, check=_checked(),
                     stop=stop)
    assert out["trials"] == 2 and asked["n"] > 0
    assert out["search_stopped"] == "stopped by SIGTERM" and "validation" not in out and "quotas" not in out
    assert "stopped before validating" in out["summary"] and session.executor.quota["trainer"] == 100


def test_a_stop_request_during_validation_ends_it_between_blocks_and_keeps_the_default() -> None:
    """The validation's A/B/A blocks are minutes on the GPU: a signal after the first block ends it there
    (no half-validated quota is kept, the process is back at its default)."""
    tune_quota = _QT.tune_quota
    from rose_dsl.optimizer.search import Settings

    wf, result = _stage1(ROOT)
    session = _FakeSession(best=80)
    calls = {"complete": 0}
    complete = session.complete

    def counted(*a, **k):
        calls["complete"] += 1
        return complete(*a, **k)

    session.complete = counted  # type: ignore[method-assign]
    searched = {"done": False}

    def stop() -> str | None:
        return "stopped by SIGTERM" if searched["done"] else None

    def log(message: str) -> None:
        if "validating" in message:
            searched["done"] = True  # the signal lands as the validation starts its first block
            calls["at_validation"] = calls["complete"]

    out = tune_quota(wf, result, session, _Gpu(), Settings(), log=log, total_sms=132, check=_checked(), stop=stop)
    assert calls["complete"] == calls["at_validation"]  # no validation block ran after the signal
    assert "stopped while validating" in out["summary"] and "quotas" not in out and "validation" not in out
    assert session.executor.quota["trainer"] == 100


def test_the_quota_curve_picture_marks_the_levels_not_run() -> None:
    """The H200 leaves holes in the curve (levels whose products are wrong): the picture shows them as
    such instead of drawing a line through them or leaving them out silently."""
    from rose_dsl.optimizer.report import curve_svg

    svg = curve_svg([(100, 9.05), (94, 8.34)], holes=[88, 87, 78])
    assert svg.count("not run (wrong products under it here)") == 3 and "(78, 87, 88%)" in svg
    assert "not run" not in curve_svg([(100, 9.05), (94, 8.34)])


def test_a_level_whose_check_did_not_run_is_skipped_and_said_so() -> None:
    """A self-check that could not run (out of memory next to the training run, say) leaves the level
    unproven: skipped like an unsafe one, but the log does not claim its GEMMs are wrong."""
    from interpreter.quota_safety import QuotaVerdict
    tune_quota = _QT.tune_quota
    from rose_dsl.optimizer.search import Settings

    def check(percents: list[int]) -> dict[int, QuotaVerdict]:
        return {p: QuotaVerdict(p, None, False, 78, 78, "the check did not run: CUDA out of memory", "t") if p == 94
                else QuotaVerdict(p, 120, True, 78, 0, "exact", "t") for p in percents}

    wf, result = _stage1(ROOT)
    lines: list[str] = []
    out = tune_quota(wf, result, _FakeSession(best=80), _Gpu(), Settings(), log=lines.append, total_sms=132, check=check)
    said = [ln for ln in lines if "94%" in ln]
    assert said and "did not run" in said[0] and "GEMMs are wrong" not in said[0]
    assert 94 in out["unsafe_levels"] and out["best_percent"] != 94


def test_the_self_checks_are_booked_apart_as_a_once_per_machine_cost() -> None:
    """The quota self-checks are cached per machine: the report gives the net overhead with and without
    them, and counts every level asked."""
    tune_quota = _QT.tune_quota
    from rose_dsl.optimizer.report import overhead
    from rose_dsl.optimizer.search import Settings

    wf, result = _stage1(ROOT)
    session = _FakeSession(best=80)
    check = _checked(unsafe=(94, 93))
    tune_quota(wf, result, session, _Gpu(), Settings(), log=lambda m: None, total_sms=132, check=check)
    assert session.books.quota_checks == len(check.seen) > 0 and session.books.quota_check_s >= 0.0
    ov = overhead(400.0, 160.0, 18, 8.0, 8.7, once_per_machine_s=90.0)
    assert ov["net"] == 240.0 and ov["net_repeat"] == 150.0
    assert ov["fraction_of_1h_net_repeat"] == pytest.approx(150.0 / 3600)
    assert overhead(400.0, 160.0, 18, 8.0, 8.7)["net_repeat"] == 240.0


def test_a_spent_budget_before_any_trial_is_said_as_such() -> None:
    """H200, 2026-12-03 (paper_mjx_vla): stage 1 left stage 2 too little time for one trial, and the report said
    "no other level was faster locally (0 trials)" -- as if levels had been measured and lost."""
    import time
    from dataclasses import replace

    tune_quota = _QT.tune_quota
    from rose_dsl.optimizer.search import Settings

    wf, result = _stage1(ROOT)
    result = replace(result, final_runs=[*result.final_runs, result.final_runs[0]])  # the first point: reused
    session = _FakeSession(best=80)
    out = tune_quota(wf, result, session, _Gpu(), Settings(), log=lambda m: None, total_sms=132, check=_checked(),
                     deadline=time.perf_counter())
    assert out["trials"] == 0 and out["best_percent"] == 100
    assert "no other level was tried (the time budget is spent)" in out["summary"]
    assert "faster" not in out["summary"]


# -- whose SMs to give away: floats on the critical path (rank_targets) and the screening --------------

PQ = TRACES / "mjx_policy_quota"


def _recorded(name: str):
    from rose_dsl import load_workflow
    from rose_dsl.optimizer.bound import call_floats

    wf = load_workflow(ROOT / "workflows" / "paper_mjx_vla.yaml") if name == "declared" else load_workflow(PQ / name / "plan.yaml")
    runs, _ = runs_from_chrome_trace(json.loads((PQ / name / "trace.json").read_text()))
    return runs, {c: 0 for c in wf.components}, [call_floats(wf, r) for r in runs]


def test_the_interleaved_rollouts_first_group_is_critical_and_the_paper_rule_would_slow_it() -> None:
    """paper_mjx_vla, `split-time epoch 2; interleave epoch` on the H200: group 0's rollout feeds update 0,
    which update 1 waits for, so group 0 (simulator copy sim@0) is the critical path and group 1 (sim)
    can wait ~1.2 s at its end. Ready-first (the paper's rule) names sim@0 -- the one process whose
    quota can only slow the iteration down."""
    from rose_dsl.optimizer.quota import rank_targets

    runs, gpu_of, floats = _recorded("candidate_st2i")
    (run,), (fl,) = runs, floats
    assert fl is not None
    for c in run.calls:
        f = fl[(c.node, tuple(c.indices))]
        if ".epoch@0." in c.node or c.node.endswith("update.sgd"):
            assert f < 0.005, c
    last = max((c for c in run.calls if c.node.endswith("epoch@1.step.env")), key=lambda c: c.start_ns)
    assert fl[(last.node, tuple(last.indices))] > 1.0
    paper = find_branches(runs, gpu_of)
    assert isinstance(paper, BranchPair) and paper.target == "sim@0"
    ranked = rank_targets(runs, gpu_of, floats)
    assert not isinstance(ranked, str)
    assert [b.target for b in ranked] == ["sim", "policy"]  # both have float beside sim@0's critical steps
    assert all(b.other in ("sim@0", "policy", "trainer") and b.score_s > 0.5 for b in ranked)


def test_on_the_declared_graph_floats_and_the_paper_rule_agree_on_the_trainer() -> None:
    """Declared paper_mjx_vla: update 0 runs beside epoch 1's rollout and ends 2.5 s before update 1 can
    start -- the pair stage 2 always found, by either rule."""
    from rose_dsl.optimizer.quota import rank_targets

    runs, gpu_of, floats = _recorded("declared")
    ranked = rank_targets(runs, gpu_of, floats)
    assert not isinstance(ranked, str) and [b.target for b in ranked] == ["trainer"]
    assert ranked[0].slack_s == pytest.approx(2.5, abs=0.2) and ranked[0].other_branches == ("epoch[1]",)
    paper = find_branches(runs, gpu_of)
    assert isinstance(paper, BranchPair) and paper.target == "trainer"


def test_sm_demand_reads_each_process_alone_from_the_recorded_activity() -> None:
    """paper_mjx_vla on the H200: alone on the GPU the MJX simulator keeps few SMs busy (launch-bound), the
    policy more, the trainer most. The recorded traces carry the activity samples (`runs_from_chrome_trace`)."""
    from rose_dsl.optimizer.quota import sm_demand

    runs, gpu_of, _ = _recorded("declared")
    assert all(run.activity_samples for run in runs)
    assert all(0.0 <= v <= 1.0 and a < b for run in runs for a, b, v in run.activity_samples)
    demand = sm_demand(runs, gpu_of)
    assert demand["sim"] < 0.25 < demand["policy"] < demand["trainer"] and demand["trainer"] > 0.8
    # the interleaved plan's processes: a temporal copy (sim@0) runs the component's programs, so the
    # component's samples give one figure for both
    plan_runs, plan_gpu, _ = _recorded("candidate_st2i")
    both = sm_demand([*runs, *plan_runs], plan_gpu)
    assert both["sim@0"] == both["sim"] < 0.25 < both["policy"]
    assert sm_demand(runs, {c: None for c in gpu_of}) == {}  # CPU processes have no SM demand


def test_a_process_that_keeps_few_sms_busy_ranks_below_one_that_keeps_many() -> None:
    """Lowering a quota frees SMs only where the process occupies them: the ranking weighs each process's
    float beside the critical path by its SM demand."""
    from rose_dsl.optimizer.quota import rank_targets

    runs, gpu_of, floats = _recorded("candidate_st2i")
    plain = rank_targets(runs, gpu_of, floats)
    assert not isinstance(plain, str) and [b.target for b in plain] == ["sim", "policy"]
    weighed = rank_targets(runs, gpu_of, floats, demand={"sim": 0.03, "policy": 0.8, "trainer": 0.9})
    assert not isinstance(weighed, str) and [b.target for b in weighed] == ["policy", "sim"]
    by = {b.target: b for b in weighed}
    assert by["sim"].weight == pytest.approx(by["sim"].score_s * 0.03)
    assert by["sim"].score_s == next(b.score_s for b in plain if b.target == "sim")  # the score itself is unchanged


def _async_window():
    """The H200 window of `split-time epoch 2; interleave epoch; defer sync 1` on paper_mjx_vla, the trainer
    at a below-normal MPS priority (`mjx_async_window/`, eighth session): as stage 2 gets it, one run whose
    calls are those of several pipelined RL iterations, seconds per iteration = span / 3 measured. The
    compare's trace names no GPU: all four processes shared GPU 0."""
    from rose_dsl import load_workflow
    from rose_dsl.optimizer.bound import call_floats
    from rose_dsl.optimizer.profile import IterationRun

    d = TRACES / "mjx_async_window"
    runs, gpu_of = runs_from_chrome_trace(json.loads((d / "trace.json").read_text()))
    calls = tuple(sorted((c for r in runs for c in r.calls), key=lambda c: c.start_ns))
    t0, t1 = calls[0].start_ns, max(c.end_ns for c in calls)
    samples = tuple(s for r in runs for s in r.activity_samples)
    window = IterationRun((t1 - t0) / 1e9 / 3, calls, t0, t1, runs[0].iteration, activity_samples=samples)
    plan = load_workflow(d / "plan.yaml")
    return window, {c: 0 for c in gpu_of}, call_floats(plan, window)


def test_in_a_window_of_an_asynchronous_plan_the_update_beside_the_next_rollout_has_the_float() -> None:
    """Iteration k's update runs beside iteration k + 1's rollout, which the one after waits for: the
    rollout is the critical path and the trainer's calls can wait ~1.3 s (the trace: the update ends ~1.5 s
    before the rollout beside it). Floats are of the unrolled graph over the window's iterations, each call
    under its own: read as one iteration, the calls of different iterations collided and a simulator copy
    ranked first, the trainer last."""
    from rose_dsl.optimizer.quota import rank_targets

    window, gpu_of, fl = _async_window()
    assert fl is not None and len(fl) == len(window.calls)  # every call its own key
    # the updates of iterations 4 and 5 (not 6's: no rollout after the window waits for it here)
    sgd = [c for c in window.calls if c.node.endswith("update.sgd") and c.iteration in (4, 5)]
    assert len(sgd) == 4 and all(1.2 < fl[(c.node, c.indices)] < 2.2 for c in sgd)
    # the critical chain: the rollout group on the simulator process `sim` (epoch@1), step after step
    chain = [c for c in window.calls if c.node == "iteration.epoch@1.step.env" and c.iteration == 6]
    assert len(chain) == 6 and all(fl[(c.node, c.indices)] < 0.01 for c in chain)
    ranked = rank_targets([window], gpu_of, [fl])
    assert not isinstance(ranked, str) and ranked[0].target == "trainer"
    assert ranked[0].slack_s == pytest.approx(1.3, abs=0.3) and ranked[0].other == "sim"


def test_without_floats_the_paper_rule_decides() -> None:
    from rose_dsl.optimizer.quota import rank_targets

    runs = _pipeline(8.0, 10.0)
    ranked = rank_targets(runs, {"policy": 0, "sim": 0}, [None])
    assert not isinstance(ranked, str) and [b.target for b in ranked] == ["policy"]
    assert isinstance(rank_targets(runs, {"policy": 0, "sim": 1}, [None]), str)


class _TwoProcessSession(_FakeSession):
    """Complete iterations whose time depends on two processes' quotas: lowering `helps` speeds the
    iteration up to its best level, lowering `hurts` only slows it."""

    def __init__(self, helps: str | None, hurts: str) -> None:
        super().__init__()
        self.executor.quota = {"trainer": 100, "policy": 100}
        self.helps, self.hurts = helps, hurts

    def _t(self) -> float:
        q = self.executor.quota
        t = 1.0 + 0.002 * (100 - q[self.hurts])
        if self.helps is not None:
            t += 0.0005 * (q[self.helps] - 80) ** 2 - 0.0005 * 20 ** 2
        return t


def _two_candidates(monkeypatch: pytest.MonkeyPatch):
    qt = _QT

    def ranked(runs, gpu_of, floats, demand=None):  # the trainer ranks first, the policy second
        return [BranchPair("trainer", "policy", 0, 0.4, 1.0, ("update[0]",), ("epoch[1]",), 3, 1.0, score_s=0.9),
                BranchPair("policy", "trainer", 0, 0.2, 0.5, ("epoch[1]",), ("update[0]",), 3, 1.0, score_s=0.4)]

    monkeypatch.setattr(stage2, "rank_targets", ranked)
    return qt.tune_quota


def test_screening_moves_each_candidate_one_step_and_searches_the_one_that_helped(monkeypatch: pytest.MonkeyPatch) -> None:
    from rose_dsl.optimizer.search import Settings

    tune_quota = _two_candidates(monkeypatch)
    _, result = _stage1(ROOT)
    session = _TwoProcessSession(helps="policy", hurts="trainer")
    check = _checked()
    out = tune_quota(result.plan, result, session, _Gpu(), Settings(), log=lambda m: None, total_sms=132, check=check)
    # the screening self-checks its probe level alone (both probes ask 94%: one check); the search that
    # follows asks in batches (H100, MJX 2026-12-05: a batch of six cost 42 s, one level ~20 s)
    assert check.batches[0] == [94] and len(check.batches) > 1 and len(check.batches[1]) > 1
    assert [row["target"] for row in out["screened"]] == ["trainer", "policy"]
    assert out["screened"][0]["gain"] < 1 < out["screened"][1]["gain"]
    assert all(row["percent"] == 94 for row in out["screened"])  # one coarse step (8 SMs) below 100%
    assert out["target"] == "policy" and out["validation"]["accepted"]
    assert out["quotas"] == {"policy": out["best_percent"]} and 70 <= out["best_percent"] < 94
    assert session.executor.quota == {"trainer": 100, "policy": out["best_percent"]}  # the trainer went back
    probe = next(p for p in out["curve"] if p["percent"] == 94)
    assert probe["samples"] == out["screened"][1]["samples"]  # the screening's trial seeds the search
    from rose_dsl.optimizer.report import screening_markdown

    table = screening_markdown(out)
    assert table[2].startswith("| trainer | policy | 0.900 s | - | 0.400 s | 94% |") and "| policy |" in table[3]


def test_an_unsafe_probe_level_turns_the_screenings_checks_into_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    """The screening asks its probe level alone; when that level is unsafe (on the H200, 60-88% nearly all
    are), the walk down to a usable level asks PARALLEL_CHECKS levels at a time, each level once -- and
    goes at most one more coarse step down: a probe is one step (H100, 2026-12-05: every level from 88% to
    52% failed, and an unbounded walk checked them all until the run was killed)."""
    PARALLEL_CHECKS = _Stage2.PARALLEL_CHECKS
    from rose_dsl.optimizer.search import Settings

    tune_quota = _two_candidates(monkeypatch)
    _, result = _stage1(ROOT)
    check = _checked(unsafe=tuple(range(80, 95)))
    out = tune_quota(result.plan, result, _TwoProcessSession(helps="policy", hurts="trainer"), _Gpu(), Settings(),
                     log=lambda m: None, total_sms=132, check=check)
    assert check.batches[0] == [94] and len(check.batches[1]) == PARALLEL_CHECKS and len(check.batches) == 2
    assert len(check.seen) == len(set(check.seen)) and min(check.seen) >= 80
    assert all(row["skipped"].startswith("no usable level within two coarse steps below 100%")
               for row in out["screened"] if row["kind"] == "quota")
    # a hole two coarse steps deep is crossed: the first usable level below it is probed
    check = _checked(unsafe=tuple(range(90, 95)))
    out = tune_quota(result.plan, result, _TwoProcessSession(helps="policy", hurts="trainer"), _Gpu(), Settings(),
                     log=lambda m: None, total_sms=132, check=check)
    assert {row.get("percent") for row in out["screened"]} == {88}


def test_the_screenings_walk_past_unsafe_levels_asks_the_budget_at_each_step(monkeypatch) -> None:
    """Each level the walk asks may cost a self-check batch (20-40 s on an H100): when a batch has spent the
    time a probe and its validation need, the walk ends there -- the probes left are reported stopped by
    the budget, no further level is checked, nothing is measured."""
    from dataclasses import replace

    qt = _QT
    from rose_dsl.optimizer.search import Settings

    _two_candidates(monkeypatch)
    clock = _Clock()
    monkeypatch.setattr(qt, "time", clock)
    _, result = _stage1(ROOT)
    result = replace(result, final_runs=[*result.final_runs, result.final_runs[0]])  # 10-s iterations, reused
    inner = _checked(unsafe=tuple(range(50, 95)))

    def check(percents):  # a batch takes 40 s
        clock.t += 40.0
        return inner(percents)

    session = _TimedSession(clock)
    out = qt.tune_quota(result.plan, result, session, _Gpu(), Settings(), log=lambda m: None, total_sms=132,
                        check=check, deadline=150.0)
    assert inner.batches == [[94], inner.batches[1]] and len(inner.batches[1]) > 1  # the probe level, one batch
    assert out["screened"][0]["skipped"] == "the time budget is spent" and all(r.get("stopped") for r in out["screened"])
    assert session.executor.replaced == [] and "quotas" not in out


def test_screening_keeps_the_quotas_when_no_step_down_helps(monkeypatch: pytest.MonkeyPatch) -> None:
    from rose_dsl.optimizer.search import Settings

    tune_quota = _two_candidates(monkeypatch)
    _, result = _stage1(ROOT)
    session = _TwoProcessSession(helps=None, hurts="trainer")
    out = tune_quota(result.plan, result, session, _Gpu(), Settings(), log=lambda m: None, total_sms=132, check=_checked())
    assert "no process's first step down was faster" in out["skipped"] and len(out["screened"]) == 2
    assert session.executor.quota == {"trainer": 100, "policy": 100}


def _stage2_on_the_recorded_st2i(check):  # type: ignore[no-untyped-def]
    """tune_quota on the H200 recording of `split-time epoch 2; interleave epoch` (plan and trace), in a
    session where only the policy's quota helps: (plan, stage 2's section, session)."""
    tune_quota = _QT.tune_quota
    from rose_dsl import load_workflow
    from rose_dsl.optimizer.decide import summarize
    from rose_dsl.optimizer.search import Settings, Stage1Result

    plan = load_workflow(PQ / "candidate_st2i" / "plan.yaml")
    runs, _ = runs_from_chrome_trace(json.loads((PQ / "candidate_st2i" / "trace.json").read_text()))
    s = summarize([7.64, 7.64, 7.64])
    result = Stage1Result(plan, ("split-time epoch 2", "interleave epoch"), s, s, [], [], "", baseline_runs=runs,
                          final_runs=runs * 3)
    session = _TwoProcessSession(helps="policy", hurts="sim")
    session.executor.quota = {name: 100 for name in plan.components}
    out = tune_quota(plan, result, session, _Gpu(), Settings(), log=lambda m: None, total_sms=132, check=check)
    return plan, out, session


def test_stage2_on_the_recorded_interleaved_plan_screens_the_policy_first_and_tunes_it() -> None:
    """End to end on the H200 recording (plan and trace of `split-time epoch 2; interleave epoch`): the
    floats rank the policy and sim (group 1's simulator), the policy first by its SM demand (the simulator
    keeps few SMs busy); a session in which only the policy's quota helps (as the H200 compare measured:
    7.31 s at 94% against 7.64 s) ends with the policy's quota."""
    plan, out, session = _stage2_on_the_recorded_st2i(_checked())
    assert [row["target"] for row in out["screened"]] == ["policy", "sim"]
    assert out["target"] == "policy" and out["quotas"] == {"policy": out["best_percent"]}
    assert session.executor.quota["sim"] == 100 and session.executor.quota["sim@0"] == 100


class _Clock:
    """`time` for quota_trials: seconds pass only when the session runs iterations or restarts a process."""

    def __init__(self) -> None:
        self.t = 0.0

    def perf_counter(self) -> float:
        return self.t


class _TimedSession(_TwoProcessSession):
    RESTART_S = 20.0

    def __init__(self, clock: _Clock) -> None:
        super().__init__(helps="policy", hurts="trainer")
        self.clock = clock

    def replace_quota(self, comp: str, percent: int, env: dict, priority: int | None = None) -> None:
        super().replace_quota(comp, percent, env, priority)
        self.clock.t += self.RESTART_S

    def complete(self, plans, rounds, warmup=0, labels=(), guard_first=False):
        out = super().complete(plans, rounds, warmup, labels, guard_first)
        self.clock.t += sum(r.seconds for r in out[0])
        return out


def _timed_tune(monkeypatch, session_class, deadline: float):  # type: ignore[no-untyped-def]
    """tune_quota with the trainer and the policy as candidates, on a clock only the session advances."""
    qt = _QT
    from rose_dsl.optimizer.search import Settings

    tune_quota = _two_candidates(monkeypatch)
    clock = _Clock()
    monkeypatch.setattr(qt, "time", clock)
    _, result = _stage1(ROOT)
    session = session_class(clock)
    out = tune_quota(result.plan, result, session, _Gpu(), Settings(), log=lambda m: None, total_sms=132,
                     check=_checked(), deadline=deadline)
    return out, session, clock


@pytest.mark.parametrize("deadline", [150.0, 140.0])
def test_a_screened_step_down_is_validated_when_the_budget_has_room_for_nothing_more(monkeypatch, deadline) -> None:
    """H200, MJX (2026-12-04, `--stage1`, --budget-s 400): the screening measured the policy one step down
    1.052x faster; the search asked the budget before reading that measurement, found no room for a trial,
    and kept 100%. The screened level is now the search's for free, and its block is the validation's first
    A (B and A are left to run): with time for those two blocks (150 s) the step down is validated and kept;
    without it (140 s) the report says so and the policy goes back to 100%."""
    out, session, _ = _timed_tune(monkeypatch, _TimedSession, deadline)
    assert [row["target"] for row in out["screened"]] == ["trainer", "policy"]
    assert out["target"] == "policy" and out["best_percent"] == 94 and out["trials"] == 0
    if deadline == 150.0:
        assert out["validation"]["accepted"] and out["quotas"] == {"policy": 94}
        assert out["validation_reused_block"] == 3 and out["validation"]["candidate"]["n"] == 3 + 2
        assert session.executor.quota == {"trainer": 100, "policy": 94}
    else:
        assert "quotas" not in out and "not validated: the time budget is spent" in out["summary"]
        assert session.executor.quota == {"trainer": 100, "policy": 100}


class _BookedSession(_TimedSession):
    """_TimedSession that books its complete iterations, as `TrialSession` does."""

    def __init__(self, clock: _Clock) -> None:
        super().__init__(clock)

    def complete(self, plans, rounds, warmup=0, labels=(), guard_first=False):
        out = super().complete(plans, rounds, warmup, labels, guard_first)
        self.books.complete_s += sum(r.seconds for r in out[0])
        self.books.complete_iterations += len(out[0])
        return out


@pytest.mark.parametrize("deadline", [150.0, 140.0, 1000.0])
def test_stage2s_row_books_its_restarts_and_not_its_training(monkeypatch, deadline) -> None:
    """The report's rows must add up: stage 2's `quota_s` is what no other row books -- here, on a clock
    that only restarts (20 s each) and iterations advance, exactly the restarts. Before, a probe's block was
    booked whole (its iterations, which are training, counted twice) and the validation's restarts nowhere
    (H100, 2026-12-05: 46.6 s booked where ~40 s of restarts ran)."""
    qt = _QT
    from rose_dsl.optimizer.search import Settings

    _two_candidates(monkeypatch)
    clock = _Clock()
    monkeypatch.setattr(qt, "time", clock)
    _, result = _stage1(ROOT)
    session = _BookedSession(clock)
    qt.tune_mps(result.plan, result, session, _Gpu(), Settings(), log=lambda m: None, total_sms=132,
                check=_checked(), deadline=deadline)
    restarts = len(session.executor.replaced)
    assert restarts >= 2 and session.books.complete_iterations > 0
    assert session.books.quota_s == pytest.approx(_TimedSession.RESTART_S * restarts)
    assert clock.t == pytest.approx(session.books.quota_s + session.books.complete_s)


def test_levels_measured_before_the_search_are_read_free_of_trials_and_budget() -> None:
    calls: list[int] = []
    s = quota_search(66, 66, lambda k: calls.append(k) or 1.0, rho=4, out_of_time=lambda: True,
                     known={66: 1.0, 62: 0.95})
    assert calls == [] and s.trials == 0 and s.best == 62 and s.stopped == "the time budget is spent"
    # with time, the search goes on from the known levels and counts only its own measurements
    s = quota_search(66, 66, lambda k: calls.append(k) or 1.0 + 0.01 * abs(k - 60), rho=4, max_trials=3,
                     known={66: 1.06, 62: 1.02})
    assert 66 not in calls and 62 not in calls and s.trials == len(calls) == 3  # max_trials: its own three
    assert s.order[:2] == [66, 62] and s.history[s.best] == min(s.history.values())


def test_time_beside_the_critical_path_counts_by_how_busy_the_sms_were(monkeypatch: pytest.MonkeyPatch) -> None:
    """H200, MJX, one `rose compare` session (2026-12-04): in the interleaved plan's trace, group 1's simulator
    runs 1.7 s per iteration beside the critical simulator copy with the SMs 12% busy (two launch-bound
    programs: no SM to free), the policy 0.47 s beside it with them 85% busy. Stage 2 on the H200 screened
    the simulator first (0.988x and 1.016x one step down, in two runs) and the policy second (1.052x), and
    with a budget for one probe only the simulator's ran. Weighed by the SM activity over the overlap (and
    by each process's SM demand, from the declared graph's trace of the same session), the policy ranks first;
    counted by plain overlap, as before, the simulator did."""
    import rose_dsl.optimizer.quota as quota
    from rose_dsl import load_workflow
    from rose_dsl.optimizer.bound import call_floats

    here = TRACES / "mjx_rose"
    plan = load_workflow(here / "rose.yaml")
    runs, _ = runs_from_chrome_trace(json.loads((here / "rose" / "trace.json").read_text()))
    declared, _ = runs_from_chrome_trace(json.loads((here / "declared" / "trace.json").read_text()))
    assert runs[0].activity_samples
    gpu_of = {c.component: 0 for r in runs + declared for c in r.calls}
    floats = [call_floats(plan, r) for r in runs]
    demand = quota.sm_demand(declared + runs, gpu_of)
    assert demand["sim"] < 0.3 < 0.5 < demand["policy"]
    ranked = quota.rank_targets(runs, gpu_of, floats, demand=demand)
    assert not isinstance(ranked, str) and [b.target for b in ranked] == ["policy", "sim"]
    # the weighing is what changed it: the plain overlap without the demand ranks the simulator first
    assert quota.busy_s([(0, 10**9, 0.25)], 0, 2 * 10**9) == pytest.approx(0.25 + 1.0)  # uncovered: busy
    monkeypatch.setattr(quota, "busy_s", lambda samples, lo, hi: (hi - lo) / 1e9)
    before = quota.rank_targets(runs, gpu_of, floats)
    assert not isinstance(before, str) and [b.target for b in before] == ["sim", "policy"]


def test_a_second_probe_that_would_leave_no_time_to_validate_the_first_is_not_started(monkeypatch) -> None:
    """The screening's budget counts the restarts (H200 MJX: ~13-20 s each, two per probe and one per
    validation block): after the first candidate's probe gained, a second probe and a validation do not fit
    in 130 s, so the first stays one step down and is validated with its probe as the first block. Before,
    the first was put back as soon as its probe ended, and its validation (three blocks) did not fit."""
    from dataclasses import replace

    qt = _QT
    from rose_dsl.optimizer.search import Settings

    def ranked(runs, gpu_of, floats, demand=None):  # the policy ranks first here
        return [BranchPair("policy", "trainer", 0, 0.2, 0.5, ("epoch[1]",), ("update[0]",), 3, 1.0, score_s=0.9),
                BranchPair("trainer", "policy", 0, 0.4, 1.0, ("update[0]",), ("epoch[1]",), 3, 1.0, score_s=0.4)]

    monkeypatch.setattr(stage2, "rank_targets", ranked)
    clock = _Clock()
    monkeypatch.setattr(qt, "time", clock)
    _, result = _stage1(ROOT)
    result = replace(result, final_runs=[*result.final_runs, result.final_runs[0]])  # 10-s iterations, reused
    session = _TimedSession(clock)
    out = qt.tune_quota(result.plan, result, session, _Gpu(), Settings(), log=lambda m: None, total_sms=132,
                        check=_checked(), deadline=130.0)
    assert [row.get("skipped") for row in out["screened"]] == [None, "the time budget is spent"]
    assert out["target"] == "policy" and out["validation"]["accepted"] and out["quotas"] == {"policy": 94}
    assert out["validation_reused_block"] == 3 and out["validation_reused_reference"] == len(result.final_runs)
    # the probe, then the validation's second B: its A is the probe's block, its first B stage 1's measurement
    assert session.executor.replaced == [94, 100]
    assert out["validation"]["reference"]["n"] == len(result.final_runs) + 2 and out["validation"]["candidate"]["n"] == 3
    # back at the reference, the policy starts as stage 1 started it: no quota set (not an explicit 100%)
    assert session.executor.envs[-1] == _Gpu().client_env(None)


def test_settle_moves_each_process_stage_2_left_at_its_reference_to_the_plans_settings(monkeypatch) -> None:
    """`rose optimize --train` goes on training in the optimizer's processes: a validation that kept the
    policy at 94% ends with it back at 100% (B/A/B), so `settle` moves it to the plan's 94% -- and only it,
    once; a second settle has nothing to move."""
    from dataclasses import replace

    qt = _QT
    from rose_dsl.optimizer.search import Settings

    def ranked(runs, gpu_of, floats, demand=None):
        return [BranchPair("policy", "trainer", 0, 0.2, 0.5, ("epoch[1]",), ("update[0]",), 3, 1.0, score_s=0.9)]

    monkeypatch.setattr(stage2, "rank_targets", ranked)
    clock = _Clock()
    monkeypatch.setattr(qt, "time", clock)
    _, result = _stage1(ROOT)
    result = replace(result, final_runs=[*result.final_runs, result.final_runs[0]])
    session = _TimedSession(clock)
    running: dict = {}
    out = qt.tune_quota(result.plan, result, session, _Gpu(), Settings(), log=lambda m: None, total_sms=132,
                        check=_checked(), deadline=130.0, running=running)
    assert out["quotas"] == {"policy": 94} and session.executor.quota["policy"] == 100
    assert qt.settle(out["plan"], running, session, _Gpu()) == ["policy"]
    assert session.executor.replaced == [94, 100, 94] and session.executor.quota["policy"] == 94
    assert session.executor.envs[-1] == _Gpu().client_env(94)
    assert qt.settle(out["plan"], running, session, _Gpu()) == [] and session.executor.replaced == [94, 100, 94]


class _CountedSession(_BookedSession):
    """_BookedSession with the workflow's iteration count, as `TrialSession` keeps it: an iteration past
    `limit` is refused (OutOfBudget)."""

    def __init__(self, clock: _Clock, limit: int) -> None:
        super().__init__(clock)
        self.k, self.limit = 0, limit

    def complete(self, plans, rounds, warmup=0, labels=(), guard_first=False):
        from rose_dsl.optimizer.search import OutOfBudget

        if self.k + rounds * len(plans) + warmup > self.limit:
            raise OutOfBudget(f"the workflow's {self.limit} iterations are all trained")
        self.k += rounds * len(plans) + warmup
        return super().complete(plans, rounds, warmup, labels, guard_first)


@pytest.mark.parametrize("margin", [None, 10.0])
def test_stage2_ends_within_the_workflows_iteration_count(monkeypatch, margin) -> None:
    """Stage 2's blocks are training iterations, and the session trains at most the workflow's count: the
    iterations left, at the plan's pace, are a budget checked as the time budget is (here 12 iterations of
    ~10 s: the screening and its validation do not fit), and the report says which budget ended it. Before,
    a block past the count raised out of stage 2 and `rose optimize` exited 2 without its plan and report.
    With a count budget that is wrong (`margin` 10: ten times the iterations there are) a block still runs
    out -- stage 2 then ends with nothing validated, quotas kept, and says why."""
    qt = _QT
    from rose_dsl.optimizer.search import Settings

    _two_candidates(monkeypatch)
    clock = _Clock()
    monkeypatch.setattr(qt, "time", clock)
    if margin is not None:
        monkeypatch.setattr(qt, "COUNT_MARGIN", margin)
    _, result = _stage1(ROOT)
    session = _CountedSession(clock, limit=12)
    out = qt.tune_mps(result.plan, result, session, _Gpu(), Settings(), log=lambda m: None, total_sms=132,
                      check=_checked(), deadline=10_000.0)
    assert session.k <= session.limit and "quotas" not in out and "plan" not in out
    if margin is None:
        said = out.get("summary") or out["skipped"]
        assert "the workflow's iteration count: 12 iterations were left" in said, out
    else:
        assert out["skipped"].startswith("the workflow's 12 iterations are all trained: stage 2 stopped"), out
    # with the count left out (no limit), the same stage 2 validates a lower quota for the policy
    free = _BookedSession(_Clock())
    monkeypatch.setattr(qt, "time", free.clock)
    assert "policy" in qt.tune_mps(result.plan, result, free, _Gpu(), Settings(), log=lambda m: None,
                                   total_sms=132, check=_checked(), deadline=10_000.0).get("quotas", {})


class _SteppedOnceSession(_TimedSession):
    """The policy is fastest one coarse step down (94%) and slower at every level below it, as the MJX
    policy measured on the H200 (7.45 s at 94%, 7.56 s at 93%, 7.69 s at 100%)."""

    def _t(self) -> float:
        q = self.executor.quota
        return 1.0 + 0.002 * (100 - q["trainer"]) + 0.0015 * (q["policy"] - 94) ** 2 - 0.0015 * 36


def test_the_search_probes_no_level_after_which_the_validation_would_not_fit(monkeypatch) -> None:
    """H200, MJX (2026-12-05, 500-s budget): after the screening measured the policy at 94% 1.032x faster,
    the search probed 93% because the budget held a validation after that moment -- but not after the probe:
    93% was slower, the policy no longer stood at 94%, so the validation needed all three blocks, and 94% was
    reported "not validated". A probe now has to leave room for a whole validation after itself; here the
    search stops at once and the screened level is validated with its own block as the first A."""
    # the search starts at ~66 s with blocks of ~50 s (3 x 10-s iterations + a 20-s restart): room for the
    # validation's three blocks (216 s) but not for a probe and then those blocks (266 s)
    out, _, clock = _timed_tune(monkeypatch, _SteppedOnceSession, 230.0)
    assert out["target"] == "policy" and out["trials"] == 0 and out["best_percent"] == 94
    assert out["validation"]["accepted"] and out["quotas"] == {"policy": 94}
    assert clock.t <= 230.0


H100_TRACES = TRACES / "mjx_stage1_h100"


def test_sm_demand_reads_the_lagging_counters_the_same_in_every_round() -> None:
    """paper_mjx_vla's declared graph on one H100 (2026-12-05), four rounds of one iteration each: GPM's SM
    counters advance in ~100-ms steps, so a sample reads a window up to one step earlier than it was polled.
    Read with no lag, from the samples whose own window saw one process, the same graph gave the policy 0.14
    to 0.88 and the simulator 0.04 to 0.25 (the round below ranked the simulator above the policy, and the
    optimizer's stage 2 screened it first, for 1.01x, where the policy's step down gave 1.06x). Read with
    the lag, the policy's 0.15-s acts (never alone over a lagged window) by the joint fit, every round says
    what the H200 measured: the simulator keeps few SMs busy, the policy most of them."""
    from rose_dsl.optimizer.quota import sm_demand

    rounds = sorted(H100_TRACES.glob("s*/declared/round*.json"))
    assert len(rounds) == 4
    for path in rounds:
        runs, gpu_of = runs_from_chrome_trace(json.loads(path.read_text()))
        gpu_of = {c: 0 for c in gpu_of}  # one GPU (the recording does not name it)
        demand = sm_demand(runs, gpu_of)
        assert demand["sim"] < 0.1 < 0.45 < demand["policy"] < 0.8 < demand["trainer"], (path, demand)
    # the optimizer's inputs: the declared graph's runs and the plan's (where the policy is never alone)
    for session in ("s1", "s2"):
        runs, gpu_of = [], {}
        for path in sorted(H100_TRACES.glob(f"{session}/*/round*.json")):
            r, g = runs_from_chrome_trace(json.loads(path.read_text()))
            runs += r
            gpu_of.update({c: 0 for c in g})
        demand = sm_demand(runs, gpu_of)
        assert demand["sim"] == demand["sim@0"] < 0.1 < 0.45 < demand["policy"], (session, demand)


def test_a_component_seen_alone_long_enough_is_read_alone_and_the_others_are_fitted() -> None:
    """Synthetic: a simulator (activity 0.05) whose 400-ms steps alternate with a policy's (0.8) 120-ms
    acts, sampled every 100 ms by a counter that lags 60 ms. The simulator is alone over whole lagged
    windows; the policy never is, and the joint fit gives it."""
    from rose_dsl.optimizer.quota import sm_demand

    ms = 1_000_000
    calls, t, i = [], 0, 0
    while t < 20_000 * ms:
        calls.append(Call("epoch.step.act", "policy", 0, (0, i), t, t + 120 * ms))
        calls.append(Call("epoch.step.env", "sim", 0, (0, i), t + 120 * ms, t + 520 * ms))
        t, i = t + 520 * ms, i + 1
    level = {"policy": 0.8, "sim": 0.05}

    def activity(lo: int, hi: int) -> float:
        return sum(level[c.component] * max(0, min(c.end_ns, hi) - max(c.start_ns, lo)) for c in calls) / (hi - lo)

    lag = 60 * ms
    samples = tuple((s, s + 100 * ms, activity(s - lag, s + 100 * ms - lag)) for s in range(0, t - 100 * ms, 100 * ms))
    run = IterationRun(t / 1e9, tuple(calls), 0, t, 0, activity_samples=samples)
    demand = sm_demand([run], {"policy": 0, "sim": 0})
    assert demand["sim"] == pytest.approx(0.05, abs=0.02)
    assert demand["policy"] == pytest.approx(0.8, abs=0.1)


def test_the_self_check_started_with_the_processes_asks_what_the_screening_asks_first(monkeypatch) -> None:
    """The prefetch (`CheckPrefetch`, started beside the processes' start-up) checks each GPU process's first
    coarse step down -- the level the screening's first probe asks the self-check about -- so that stage 2
    finds it cached. End to end on the H200 recording: the first level tune_quota asks is one of them."""
    from interpreter.optimize.quota_trials import CheckPrefetch
    from rose_dsl.optimizer.stage2 import first_probe_levels

    check = _checked()
    plan, _, _ = _stage2_on_the_recorded_st2i(check)
    assert first_probe_levels(plan, quota_levels(132)) == [94]  # every process at 100%: one level
    assert check.batches[0] == first_probe_levels(plan, quota_levels(132))

    asked: list[list[int]] = []
    logged: list[str] = []
    books = Books(quota_check_s=1.0)
    prefetch = CheckPrefetch(_Gpu(), lambda: first_probe_levels(plan, quota_levels(132)), check=asked.append)
    prefetch.wait(books, logged.append)
    assert asked == [[94]] and prefetch.error is None
    assert books.quota_check_prefetch_levels == 1 and books.quota_check_s >= 1.0

    # joined after the first (untimed) training iteration: how long it ran beside training is booked and said
    # (on a fake clock: the check takes 0.2 s of it, whatever the machine's load)
    import interpreter.optimize.quota_trials as qt

    clock = _Clock()
    monkeypatch.setattr(qt, "time", clock)

    def slow(percents: list[int]) -> None:
        clock.t += 0.2

    clock.t = 50.0
    beside = CheckPrefetch(_Gpu(), lambda: first_probe_levels(plan, quota_levels(132)), check=slow)
    # the first training iteration began 0.05 s after the check did
    beside.wait(books, logged.append, training_since=50.05)
    assert books.quota_check_beside_training_s == pytest.approx(0.15)
    assert books.quota_check_prefetch_s == pytest.approx(0.2)
    from rose_dsl.optimizer.report import _prefetch_note

    assert "beside the first, untimed training iteration, which is counted as training" in _prefetch_note(books)

    def broken() -> list[int]:
        raise RuntimeError("no CUDA here")

    failing = CheckPrefetch(_Gpu(), broken, check=asked.append)
    failing.wait(books, logged.append)  # a prefetch that fails leaves stage 2 to check: said, not raised
    assert failing.error == "RuntimeError: no CUDA here" and "stage 2 checks again" in logged[-1]


def test_a_process_declared_below_100_percent_is_prefetched_one_step_below_its_own_quota() -> None:
    from rose_dsl import load_workflow
    from rose_dsl.optimizer.stage2 import first_probe_levels

    wf = load_workflow(ROOT / "workflows" / "paper_mjx_vla.yaml", {"trainer_quota": 50})
    assert {n: c.mps_settings[0] for n, c in wf.components.items()} == {"sim": 100, "policy": 100, "trainer": 50}
    levels = first_probe_levels(wf, quota_levels(132))
    assert len(levels) == 2 and levels[1] == 94 and levels[0] < 50


def test_a_later_rounds_budget_counts_the_restarts_the_earlier_round_measured(monkeypatch) -> None:
    """A round's screening asks the budget for a probe and a validation, each block costed with the most a
    block cost beyond its iterations so far. A second round starts with the first round's figure (`move_s`),
    not with none: here 20-s restarts leave no room for round 2's probe, which free restarts would have."""
    qt = _QT
    from rose_dsl.optimizer.search import Settings

    _two_candidates(monkeypatch)
    clock = _Clock()
    monkeypatch.setattr(qt, "time", clock)
    _, result = _stage1(ROOT)

    def tune(move_s: float):  # type: ignore[no-untyped-def]
        clock.t = 0.0
        session = _TimedSession(clock)
        out = qt.tune_quota(result.plan, result, session, _Gpu(), Settings(), log=lambda m: None, total_sms=132,
                            check=_checked(), deadline=90.0, move_s=move_s)
        return out, session

    free, _ = tune(0.0)
    counted, session = tune(20.0)
    assert any("seconds" in row for row in free["screened"])  # restarts counted as free: a probe ran
    assert counted["skipped"].startswith("the screening stopped (the time budget is spent)")
    assert session.executor.replaced == []
    # tune_mps hands round 1's figure to round 2
    seen: list[float] = []
    real = stage2.tune_quota

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(kwargs.get("move_s", 0.0))
        return real(*args, **kwargs)

    monkeypatch.setattr(stage2, "tune_quota", spy)
    clock.t = 0.0
    qt.tune_mps(result.plan, result, _TimedSession(clock), _Gpu(), Settings(), log=lambda m: None, total_sms=132,
                check=_checked(), deadline=10_000.0)
    assert len(seen) == 2 and seen[0] == 0.0 and seen[1] >= _TimedSession.RESTART_S


class _NoisySession(_FakeSession):
    """Complete iterations of `curve(trainer's quota)` seconds, each x (1 + uniform(-noise, noise)), seeded."""

    def __init__(self, curve, noise: float, seed: int) -> None:
        import random

        super().__init__()
        self.curve, self.noise, self.rng = curve, noise, random.Random(seed)

    def _t(self) -> float:
        return self.curve(self.executor.quota["trainer"])

    def complete(self, plans, rounds, warmup=0, labels=(), guard_first=False):
        return [[IterationRun(self._t() * (1 + self.rng.uniform(-self.noise, self.noise)), ()) for _ in range(rounds)]
                for _ in plans]


def test_stage2_validation_keeps_a_real_gain_and_no_null_one_under_noise() -> None:
    """Stage 2's validation is the decision rule's unpaired variant (`stage2.validation_verdict`): with every
    quota as fast as 100% and ±40% noise per iteration, the search still picks a level by its medians, and
    the validation kept none of the 29 it was asked about over 40 seeds [<= alpha, 5%, of the trials]; with
    a 1.3x gain at 80% and ±5% noise it kept a quota in 40 of 40 (blocks A/B/A: 4 runs against 3, the
    reference block grown from 2 so that the blocks can decide)."""
    tune_quota = _QT.tune_quota
    from rose_dsl.optimizer.search import Settings

    wf, result = _stage1(ROOT)

    def kept(curve, noise: float) -> tuple[int, int]:
        outs = [tune_quota(wf, result, _NoisySession(curve, noise, seed), _Gpu(), Settings(), log=lambda m: None,
                           total_sms=132, check=_checked()) for seed in range(40)]
        return sum("quotas" in o for o in outs), sum("validation" in o for o in outs)

    null_kept, null_validated = kept(lambda q: 1.0, 0.4)
    assert null_validated >= 20 and null_kept <= 0.05 * 40, (null_kept, null_validated)
    gain_kept, _ = kept(lambda q: 1.0 + 0.00075 * (q - 80) ** 2, 0.05)
    assert gain_kept >= 0.9 * 40


class _AsyncSession(_TwoProcessSession):
    """`_TwoProcessSession` over the four GPU processes of the recorded asynchronous MJX plan."""

    def __init__(self, helps: str | None, hurts: str) -> None:
        super().__init__(helps, hurts)
        self.executor.quota = {"trainer": 100, "policy": 100, "sim": 100, "sim@0": 100}


def test_stage2_on_an_asynchronous_plans_window_screens_and_tunes_the_trainer_first() -> None:
    """Stage 2 end to end on the H200 window of MJX's asynchronous plan (`_async_window`), with the real
    ranking, screening and quota search on a simulated session where lowering the trainer's quota speeds
    the iteration up: the trainer is screened first, tuned and validated, the simulators left alone. (The
    floats' ranking on this window is the test above; weighed by the processes' SM demand, the trainer
    came first here even with the floats of before.)"""
    from rose_dsl import load_workflow
    from rose_dsl.optimizer.decide import summarize
    from rose_dsl.optimizer.search import Settings, Stage1Result

    window, _, _ = _async_window()
    plan = load_workflow(TRACES / "mjx_async_window" / "plan.yaml")
    s = summarize([window.seconds] * 3)
    result = Stage1Result(plan, (), s, s, [], [], "", baseline_runs=[window], final_runs=[window])
    session = _AsyncSession(helps="trainer", hurts="sim")
    session.executor.priority["trainer"] = 1  # (the recorded plan runs it at a below-normal priority)
    out = _QT.tune_quota(plan, result, session, _Gpu(), Settings(), log=lambda m: None, total_sms=132, check=_checked())
    assert out["screened"][0]["target"] == "trainer"
    assert out["target"] == "trainer" and out["validation"]["accepted"]
    assert out["quotas"] == {"trainer": out["best_percent"]} and out["best_percent"] < 100
    assert session.executor.quota["sim"] == session.executor.quota["sim@0"] == 100
