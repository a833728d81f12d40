"""The optimizer's one `Budget` (rose_dsl/optimizer/budget.py) on a fake clock: shares of the whole from
its start or from now, `fits`, `spent` and `reached` at the deadline's edge, and `until`."""

from __future__ import annotations

from rose_dsl.optimizer.budget import BlockCost, Budget


class _Clock:
    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_shares_are_fractions_of_the_whole_from_its_start_or_from_now() -> None:
    clock = _Clock(100.0)
    whole = Budget.of(200.0, clock=clock, shares={"stage1": 0.65, "layouts": 0.35})
    assert whole.deadline == 300.0 and whole.total_s == 200.0
    clock.t = 150.0
    stage1 = whole.share("stage1")
    assert stage1.deadline == 100.0 + 0.65 * 200.0 and stage1.total_s == 0.65 * 200.0
    layouts = whole.share("layouts", from_now=True)
    assert layouts.deadline == 150.0 + 0.35 * 200.0
    assert Budget.of(None, clock=clock, shares={"stage1": 0.65}).share("stage1").deadline is None  # unlimited


def test_fits_spent_and_reached_at_the_deadlines_edge() -> None:
    clock = _Clock(0.0)
    b = Budget(deadline=10.0, clock=clock)
    assert b.fits(10.0) and not b.fits(10.5) and b.left() == 10.0
    clock.t = 10.0
    assert b.reached() and not b.spent() and b.fits(0.0)
    clock.t = 10.5
    assert b.spent() and not b.fits(0.0)
    free = Budget(clock=clock)
    assert free.fits(1e9) and not free.spent() and not free.reached() and free.left() is None


def test_until_keeps_the_earlier_deadline() -> None:
    clock = _Clock(0.0)
    b = Budget(deadline=50.0, clock=clock)
    assert b.until(40.0).deadline == 40.0 and b.until(60.0).deadline == 50.0 and b.until(None) is b
    assert Budget(clock=clock).until(5.0).deadline == 5.0


def test_a_block_costs_its_iterations_and_the_most_seen_beyond_them() -> None:
    assert BlockCost(2.0, 11.0).block(3) == 17.0 and BlockCost(2.0).block(0) == 0.0
