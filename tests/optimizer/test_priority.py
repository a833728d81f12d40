"""Stage 2's MPS client priorities (beyond the paper): the screening also tries each process with float at a
below-normal priority, which takes no SMs away but lets the critical process's kernels be scheduled first;
a priority that wins is validated on complete iterations like a quota, and kept only if faster by the
noise margin. The sessions here are the fakes of test_quota.py, whose iteration time depends on the
processes' quotas and, here, on their priorities."""

from __future__ import annotations

import pytest

import rose_dsl.optimizer.stage2 as stage2
from rose_dsl.optimizer.quota import BranchPair, screening_probes

from .test_quota import _QT, ROOT, _checked, _Gpu, _stage1, _TwoProcessSession


def _pair(target: str, other: str, score_s: float, demand: float | None) -> BranchPair:
    """A pair whose branches meet only at the iteration (the comparison graph is complete iterations)."""
    return BranchPair(target, other, 0, 0.4, 1.0, ("update[0]",), ("epoch[1]",), 3, 1.0, score_s=score_s, demand=demand)


def test_priority_probes_follow_the_time_beside_critical_calls_and_alternate_with_quota_probes() -> None:
    """Quota probes follow the ranking (float weighed by the SMs the process would free); priority probes
    the float alone: a launch-bound simulator copy beside the critical one ranks last for a quota (few SMs
    to give) and first for a priority (H200, MJX interleaved rollout: 12% of the SMs busy, 1.0 s beside the
    critical copy, against the policy's 0.68 s at 28%)."""
    policy, sim = _pair("policy", "sim@0", 0.68, 0.28), _pair("sim", "sim@0", 1.02, 0.18)
    ranked = sorted([sim, policy], key=lambda p: p.weight, reverse=True)
    assert [p.target for p in ranked] == ["policy", "sim"]
    probes = [(p.target, kind) for p, kind in screening_probes(ranked, priorities=True)]
    assert probes == [("policy", "quota"), ("sim", "priority"), ("sim", "quota"), ("policy", "priority")]
    assert screening_probes(ranked, priorities=False) == [(policy, "quota"), (sim, "quota")]
    assert [k for _, k in screening_probes(ranked, True, per_kind=1)] == ["quota", "priority"]
    assert screening_probes(ranked, True, quotas=False) == [(sim, "priority"), (policy, "priority")]


class _PrioritySession(_TwoProcessSession):
    """As `_TwoProcessSession` (lowering the trainer's quota only slows the iteration; the policy's quota
    changes nothing), plus: `helps` at a below-normal priority takes `gain_s` off every iteration."""

    def __init__(self, helps: str, gain_s: float) -> None:
        super().__init__(helps=None, hurts="trainer")
        self.prio_helps, self.gain_s = helps, gain_s

    def _t(self) -> float:
        return super()._t() - (self.gain_s if self.executor.priority.get(self.prio_helps) == 1 else 0.0)


def _tune(monkeypatch: pytest.MonkeyPatch, session: _PrioritySession, priorities: bool = True,  # type: ignore[no-untyped-def]
          quotas: bool = True, check=None, ranking=None):
    qt = _QT
    from rose_dsl.optimizer.search import Settings

    def ranked(runs, gpu_of, floats, demand=None):  # the trainer ranks first, the policy second
        return ranking or [_pair("trainer", "policy", 0.9, None), _pair("policy", "trainer", 0.4, None)]

    monkeypatch.setattr(stage2, "rank_targets", ranked)
    _, result = _stage1(ROOT)
    log: list[str] = []
    out = qt.tune_quota(result.plan, result, session, _Gpu(), Settings(), log=log.append, total_sms=132,
                        check=check or _checked(), priorities=priorities, quotas=quotas)
    return out, result, log


def test_a_priority_that_wins_the_screening_is_validated_and_written_into_the_plan(monkeypatch) -> None:
    session = _PrioritySession(helps="policy", gain_s=0.1)
    out, result, log = _tune(monkeypatch, session)
    assert [(r["target"], r["kind"]) for r in out["screened"]] == [
        ("trainer", "quota"), ("trainer", "priority"), ("policy", "quota"), ("policy", "priority")]
    won = out["screened"][3]
    assert won["priority"] == 1 and won["percent"] == 100 and won["gain"] > 1.05
    assert out["kind"] == "priority" and out["target"] == "policy" and out["validation"]["accepted"]
    assert out["priorities"] == {"policy": 1} and "quotas" not in out
    # the probe was the screening's last: its block is the validation's first A
    assert out["validation_reused_block"] == 3 and out["validation"]["candidate"]["n"] == 3 + 2
    comp = out["plan"].components["policy"]
    assert (comp.mps_priority, comp.mps_quota) == (1, result.plan.components["policy"].mps_quota)
    assert session.executor.priority == {"trainer": 0, "policy": 1}  # the trainer went back to normal
    assert session.executor.quota == {"trainer": 100, "policy": 100}
    assert "below-normal priority (was 100%)" in out["summary"] and any("validating policy" in m for m in log)
    from rose_dsl.optimizer.report import screening_markdown, with_quotas

    table = screening_markdown(out)
    assert "| policy | trainer |" in table[5] and "| below-normal priority |" in table[5]
    chained = with_quotas(2.0, 1.5, out)
    assert chained is not None and chained["changes"] == ["policy at below-normal priority"]
    assert chained["speedup"] == pytest.approx(1.5 * out["validation"]["reference"]["median"]
                                               / out["validation"]["candidate"]["median"])


def test_a_process_already_at_a_below_normal_priority_is_not_probed_again_and_keeps_it(monkeypatch) -> None:
    """A plan that gives the policy a below-normal priority: the screening does not probe it again, and the
    policy's quota probe moves it with its priority (a quota change keeps the process's priority)."""
    from dataclasses import replace

    qt = _QT
    from rose_dsl.optimizer.search import Settings

    session = _PrioritySession(helps="policy", gain_s=0.1)
    session.executor.priority["policy"] = 1
    _, result = _stage1(ROOT)
    plan = result.plan
    plan = replace(plan, components={**plan.components, "policy": replace(plan.components["policy"], mps_priority=1)})
    result = replace(result, plan=plan)
    monkeypatch.setattr(stage2, "rank_targets", lambda runs, gpu_of, floats, demand=None: [
        _pair("trainer", "policy", 0.9, None), _pair("policy", "trainer", 0.4, None)])
    out = qt.tune_quota(plan, result, session, _Gpu(), Settings(), log=lambda m: None, total_sms=132,
                        check=_checked(), priorities=True)
    rows = {(r["target"], r["kind"]): r for r in out["screened"]}
    assert rows[("policy", "priority")]["skipped"] == "already at a below-normal priority"
    assert rows[("policy", "quota")]["priority"] == 1  # (the fake asserts each move's env carries it)
    assert "no process's first step down, nor a below-normal priority, was faster" in out["skipped"]
    assert session.executor.priority == {"policy": 1, "trainer": 0}


def test_without_priorities_the_screening_is_the_quota_screening(monkeypatch) -> None:
    session = _PrioritySession(helps="policy", gain_s=0.1)
    out, _, _ = _tune(monkeypatch, session, priorities=False)
    assert [r["kind"] for r in out["screened"]] == ["quota", "quota"]
    assert "priorities" not in out and session.executor.priority == {}


def test_a_priority_that_is_not_faster_on_complete_iterations_is_not_kept(monkeypatch) -> None:
    """The screening's probe was faster, the validation's blocks are not (drift, noise): the trainer goes
    back to the normal priority and the plan keeps it. (Its probe was not the screening's last, so all three
    blocks are the validation's own.)"""
    session = _PrioritySession(helps="trainer", gain_s=0.1)
    complete = session.complete

    def drifting(plans, rounds, warmup=0, labels=(), guard_first=False):  # type: ignore[no-untyped-def]
        out = complete(plans, rounds, warmup, labels, guard_first)
        if labels and str(labels[0]).startswith("mps trainer") and "below-normal" in str(labels[0]):  # validation A
            return [[type(r)(r.seconds + 0.2, r.calls) for r in out[0]]]
        return out

    session.complete = drifting  # type: ignore[method-assign]
    out, _, _ = _tune(monkeypatch, session)
    assert out["kind"] == "priority" and out["target"] == "trainer" and not out["validation"]["accepted"]
    assert "validation_reused_block" not in out and out["validation"]["candidate"]["n"] == 2 * 2
    assert "priorities" not in out and "plan" not in out and "not faster" in out["summary"]
    assert session.executor.priority.get("trainer") == 0


def test_priorities_alone_probe_even_one_candidate_and_never_self_check_a_quota(monkeypatch) -> None:
    """`--stage2 priorities`: no quota probe, search or GEMM self-check; a single candidate is probed (with
    quotas, one candidate's first search trial is its probe, so there is no screening then)."""
    def check(percents):  # type: ignore[no-untyped-def]
        raise AssertionError(f"a quota self-check was asked for: {percents}")

    session = _PrioritySession(helps="policy", gain_s=0.1)
    out, _, _ = _tune(monkeypatch, session, quotas=False, check=check, ranking=[_pair("policy", "trainer", 0.4, None)])
    assert [(r["target"], r["kind"]) for r in out["screened"]] == [("policy", "priority")]
    assert out["priorities"] == {"policy": 1} and out["validation"]["accepted"]
    assert session.executor.quota == {"trainer": 100, "policy": 100}
    nothing = _PrioritySession(helps="trainer", gain_s=0.0)
    out, _, _ = _tune(monkeypatch, nothing, quotas=False, check=check, ranking=[_pair("policy", "trainer", 0.4, None)])
    assert out["skipped"].startswith("no process at a below-normal priority was faster")
    assert nothing.executor.priority == {"policy": 0}


class _BothSession(_TwoProcessSession):
    """The trainer's quota has its best at 80% (as in test_quota.py) and the policy at a below-normal
    priority takes another 0.05 s off: one change of each kind helps."""

    def __init__(self) -> None:
        super().__init__(helps="trainer", hurts="policy")

    def _t(self) -> float:
        return super()._t() - (0.05 if self.executor.priority.get("policy") == 1 else 0.0)

    def complete(self, plans, rounds, warmup=0, labels=(), guard_first=False):  # type: ignore[no-untyped-def]
        self.blocks = [*getattr(self, "blocks", []), (self.executor.quota["trainer"], self.executor.priority.get("policy", 0))]
        return super().complete(plans, rounds, warmup, labels, guard_first)


def test_stage2_keeps_a_quota_and_then_a_priority_in_two_rounds(monkeypatch) -> None:
    """`tune_mps`: round 1 keeps the best single change (the trainer's quota, searched and validated); round
    2 starts from that plan -- its validation's iterations are the profile -- and keeps the policy's
    priority; the plan has both, the section says both, and the whole figure chains both validations."""
    qt = _QT
    from rose_dsl.optimizer.report import stage2_markdown, with_quotas
    from rose_dsl.optimizer.search import Settings

    monkeypatch.setattr(stage2, "rank_targets", lambda runs, gpu_of, floats, demand=None: [
        _pair("trainer", "policy", 0.9, None), _pair("policy", "trainer", 0.4, None)])
    _, result = _stage1(ROOT)
    session = _BothSession()
    log: list[str] = []
    marks: list[int] = []  # how many blocks had run when round 2 started

    def logged(message: str) -> None:
        log.append(message)
        if message.startswith("stage 2, round 2"):
            marks.append(len(session.blocks))

    out = qt.tune_mps(result.plan, result, session, _Gpu(), Settings(), log=logged, total_sms=132, check=_checked(),
                      priorities=True)
    first, second = out["rounds"]
    assert first["kind"] == "quota" and first["quotas"] == {"trainer": first["best_percent"]} and first["best_percent"] < 94
    assert second["kind"] == "priority" and second["priorities"] == {"policy": 1}
    assert out["quotas"] == first["quotas"] and out["priorities"] == {"policy": 1}
    comps = out["plan"].components
    assert (comps["trainer"].mps_quota, comps["policy"].mps_priority) == (first["best_percent"], 1)
    # round 1's validation ended with the trainer at its reference; round 2 put it where the plan says before
    # measuring anything, and its own validation (B/A/B) ended with the policy back at its reference
    assert session.executor.quota["trainer"] == first["best_percent"] and session.executor.priority["policy"] == 0
    # every block of round 2 measures the round's plan with at most one process changed (the trainer left at
    # 100% beside the policy's priority probe would be two)
    round2 = session.blocks[marks[0]:]
    assert round2 and all((q != first["best_percent"]) + prio <= 1 for q, prio in round2), round2
    assert (first["best_percent"], 1) in round2
    assert "; then policy at 100% at below-normal priority" in out["summary"]
    assert any(m.startswith("stage 2, round 2") for m in log)
    assert "plan" not in first
    chained = with_quotas(2.0, 1.0, out)
    assert chained is not None and chained["stage2_gain"] == pytest.approx(
        (first["validation"]["reference"]["median"] / first["validation"]["candidate"]["median"])
        * (second["validation"]["reference"]["median"] / second["validation"]["candidate"]["median"]))
    md = "\n".join(stage2_markdown(out))
    assert "Round 2: policy at 100% at below-normal priority" in md


def test_a_round_that_keeps_nothing_ends_stage_2(monkeypatch) -> None:
    qt = _QT
    from rose_dsl.optimizer.search import Settings

    monkeypatch.setattr(stage2, "rank_targets", lambda runs, gpu_of, floats, demand=None: [
        _pair("trainer", "policy", 0.9, None), _pair("policy", "trainer", 0.4, None)])
    _, result = _stage1(ROOT)
    session = _PrioritySession(helps="trainer", gain_s=0.0)  # nothing helps
    out = qt.tune_mps(result.plan, result, session, _Gpu(), Settings(), log=lambda m: None, total_sms=132,
                      check=_checked(), priorities=True)
    assert "rounds" not in out and "plan" not in out and "skipped" in out


def test_a_process_a_validation_left_at_its_reference_is_put_where_the_plan_says_before_anything_is_measured(
        monkeypatch) -> None:
    """A validation on complete iterations ends B/A/B -- the target back at its reference, while the plan it
    accepted says otherwise (a restart saved when nothing follows). When a later round does measure, every
    block must be that round's plan with one process changed: the trainer (80% in the plan, left at 100%)
    moves to 80% before the policy's priority probe, not after."""
    from dataclasses import replace

    qt = _QT
    from rose_dsl.optimizer.search import Settings

    monkeypatch.setattr(stage2, "rank_targets", lambda runs, gpu_of, floats, demand=None: [_pair("policy", "trainer", 0.4, None)])
    _, result = _stage1(ROOT)
    plan = replace(result.plan, components={**result.plan.components,
                                            "trainer": replace(result.plan.components["trainer"], mps_quota=80)})
    result = replace(result, plan=plan)
    session = _BothSession()
    session.executor.quota["trainer"] = 100
    running = {"trainer": (100, 0)}
    out = qt.tune_quota(plan, result, session, _Gpu(), Settings(), log=lambda m: None, total_sms=132, check=_checked(),
                        priorities=True, quotas=False, reference_s=[1.05, 1.05, 1.05], running=running)
    assert out["priorities"] == {"policy": 1}
    assert session.executor.replaced[0] == 80  # the trainer first
    assert session.blocks and all(q == 80 for q, _ in session.blocks), session.blocks
    assert running["trainer"] == (80, 0) and running["policy"] == (100, 0)  # the policy back at its reference (B/A/B)
