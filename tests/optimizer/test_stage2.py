"""Stage 2's decisions (`rose_dsl/optimizer/stage2.py`) on a fake `QuotaMeasurer`: no runtime, no torch, a
fake clock. The iteration time is a U over the trainer's quota (fastest at `best`); the self-check says
which levels are unsafe. What is checked is the decision: which level is kept, that an unsafe level is
never run, that the time budget and the iteration count end the search, and the record."""

from __future__ import annotations

import math
from dataclasses import dataclass

from rose_dsl.measurement import Books, IterationRun
from rose_dsl.optimizer.budget import Budget
from rose_dsl.optimizer.quota import BUDGET_SPENT
from rose_dsl.optimizer.records import Settings, Stage2Record
from rose_dsl.optimizer.stage2 import tune_mps, tune_quota

from .test_quota import ROOT, _stage1


@dataclass(frozen=True)
class _Verdict:
    ok: bool
    sm_count: int | None
    detail: str


class FakeQuotaMeasurer:
    feed_impl, probe_impl = "tests.fake:Feed", "tests.fake:Probe"  # (never run: the graph is the whole iteration)

    def __init__(self, best: int = 80, unsafe: tuple[int, ...] = (), left: int | None = None,
                 restart_s: float = 0.0) -> None:
        self.best, self.unsafe, self.left, self.restart_s = best, set(unsafe), left, restart_s
        self.books = Books()
        self.prepare_s = 0.0
        self.quota = {"trainer": 100, "policy": 100}
        self.ran_under: list[int] = []  # the trainer's quota at each complete iteration
        self.checked: list[int] = []
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    def iterations_left(self) -> int | None:
        return self.left

    def quota_sms(self) -> dict[int, int]:  # 132 SMs in 2-SM steps, as on an H100
        return {p: min(132, max(2, math.floor(p * 132 / 100 + 1e-9) // 2 * 2)) for p in range(1, 101)}

    def move(self, name: str, quota: int | None, env_priority: int | None, set_priority: int | None) -> None:
        self.quota[name] = 100 if quota is None else quota
        self.now += self.restart_s

    def complete(self, plans, rounds, warmup=0, labels=()):  # type: ignore[no-untyped-def]
        t = 1.0 + 0.0005 * (self.quota["trainer"] - self.best) ** 2
        self.ran_under += [self.quota["trainer"]] * rounds
        self.now += t * rounds
        return [[IterationRun(t * (1 + 0.001 * i), ()) for i in range(rounds)] for _ in plans]

    def capture(self, probe_wf):  # type: ignore[no-untyped-def]
        raise AssertionError("the comparison graph is the whole iteration: nothing is captured")

    def local(self, graphs, repeats, captured, probe_id):  # type: ignore[no-untyped-def]
        raise AssertionError("no local trials here")

    def check_levels(self, percents: list[int]) -> dict[int, _Verdict]:
        self.checked += percents
        return {p: _Verdict(p not in self.unsafe, self.quota_sms()[p], "wrong" if p in self.unsafe else "exact")
                for p in percents}


def test_the_fastest_safe_level_is_searched_validated_and_written_into_the_plan() -> None:
    _, result = _stage1(ROOT)
    qm = FakeQuotaMeasurer(best=80)
    rec = tune_quota(result, qm, Settings(), log=lambda m: None, budget=Budget(clock=qm.clock))
    assert isinstance(rec, Stage2Record) and rec.target == "trainer" and rec.kind == "quota"
    assert rec.validation is not None and rec.validation["accepted"]
    assert rec.quotas == {"trainer": rec.best_percent} and 70 <= (rec.best_percent or 0) < 100
    assert rec.plan is not None and rec.plan.components["trainer"].mps_quota == rec.best_percent
    assert qm.books.quota_trials == rec.trials <= Settings().quota_max_trials
    assert "plan" not in rec.to_json() and rec.to_json()["quotas"] == rec.quotas


def test_nothing_faster_keeps_the_plans_settings_and_the_process_where_it_was() -> None:
    _, result = _stage1(ROOT)
    qm = FakeQuotaMeasurer(best=100)
    rec = tune_quota(result, qm, Settings(), log=lambda m: None, budget=Budget(clock=qm.clock))
    assert rec.plan is None and rec.quotas is None and rec.best_percent == 100
    assert "kept trainer at 100%" in (rec.summary or "") and qm.quota["trainer"] == 100


def test_a_level_whose_self_check_fails_is_never_run() -> None:
    _, result = _stage1(ROOT)
    chosen = tune_quota(result, FakeQuotaMeasurer(best=80), Settings(), log=lambda m: None).best_percent
    assert chosen is not None and chosen < 100
    qm = FakeQuotaMeasurer(best=80, unsafe=(chosen,))
    rec = tune_quota(result, qm, Settings(), log=lambda m: None, budget=Budget(clock=qm.clock))
    assert chosen in qm.checked and chosen in (rec.unsafe_levels or {})
    assert chosen not in qm.ran_under and rec.best_percent != chosen


def test_a_deadline_without_room_for_a_trial_and_its_validation_ends_the_search_at_the_plans_level() -> None:
    """Each trial after the first starts only if it and a whole validation (three blocks) fit: at 10-s
    iterations a 60-s budget has room for the first measurement only, so nothing else runs or is kept."""
    _, result = _stage1(ROOT)
    qm = FakeQuotaMeasurer(best=80, restart_s=5.0)
    rec = tune_quota(result, qm, Settings(), log=lambda m: None, budget=Budget(deadline=60.0, clock=qm.clock))
    assert rec.search_stopped == BUDGET_SPENT and rec.trials == 1 and set(qm.ran_under) == {100}
    assert rec.plan is None and rec.quotas is None and qm.quota["trainer"] == 100


def test_the_iteration_count_is_stage_2s_budget() -> None:
    """Two iterations left at a 10-s pace are a 17-s budget (`quota_count_margin`): the search stops after
    its first measurement; without a count it goes on and keeps a level."""
    _, result = _stage1(ROOT)
    counted = FakeQuotaMeasurer(best=80, left=2)
    rec = tune_mps(result, counted, Settings(), log=lambda m: None, budget=Budget(clock=counted.clock))
    assert rec.search_stopped == BUDGET_SPENT and rec.trials == 1 and rec.plan is None
    free = FakeQuotaMeasurer(best=80)
    assert tune_mps(result, free, Settings(), log=lambda m: None, budget=Budget(clock=free.clock)).plan is not None


def test_the_next_round_starts_from_the_change_the_last_one_kept_as_a_value() -> None:
    """Round 2's log line names the change round 1 kept from the record's `kept` (not from a parse of its
    summary); the report's section leaves it out, as it does the plan."""
    _, result = _stage1(ROOT)
    qm = FakeQuotaMeasurer(best=80)
    lines: list[str] = []
    rec = tune_mps(result, qm, Settings(), log=lines.append, budget=Budget(clock=qm.clock))
    first = (rec.rounds or [rec])[0]
    assert first.kept is not None and first.kept.startswith("trainer at ") and (first.summary or "").startswith(first.kept + ": ")
    assert f"stage 2, round 2: from the plan with {first.kept}" in lines
    assert "kept" not in first.to_json() and "kept" not in rec.to_json()
