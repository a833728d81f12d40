"""ActivitySampler on CPU: GPM two-sample logic, source fallback, time-weighted math."""

from __future__ import annotations

import time

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from interpreter.gpu_activity import (
    ActivitySample,
    ActivitySampler,
    fraction_below,
    mean_activity,
    merge_intervals,
)
from tests.interpreter.rt_fakes import FakeClock, FakeNvml

MS = 1_000_000


def _sampler(nvml, clock, **kw):
    s = ActivitySampler(0, clock=clock, nvml=nvml, **kw)
    s.open()
    return s


def test_gpm_reports_exact_mean_between_two_samples():
    clock = FakeClock(0)
    # idle until 100 ms, fully busy until 200 ms, then half busy
    nvml = FakeNvml(clock, [(0, 0.0), (100 * MS, 1.0), (200 * MS, 0.5)])
    s = _sampler(nvml, clock)
    assert s.source == "gpm"
    nvml.metric_calls.clear()  # drop the probe made while choosing the source
    clock.advance(5 * MS)
    assert s.poll_once() is None  # the first poll only primes: GPM needs two samples
    assert s.samples() == []
    for _ in range(10):
        clock.advance(30 * MS)
        s.poll_once()
    got = s.samples()
    assert [(a.t_start_ns // MS, a.t_end_ns // MS) for a in got] == [(5 + 30 * i, 35 + 30 * i) for i in range(10)]
    # each value is the exact mean over its own interval (e.g. [95, 125): 5 idle + 25 busy)
    for smp in got:
        exact = (nvml.busy(smp.t_end_ns) - nvml.busy(smp.t_start_ns)) / (smp.t_end_ns - smp.t_start_ns)
        assert smp.value == pytest.approx(exact)
    assert got[3].value == pytest.approx(25 / 30)
    # samples are contiguous: the older sample of each pair is the newer one of the previous pair
    assert all(a.t_end_ns == b.t_start_ns for a, b in zip(got, got[1:], strict=False))
    assert all(t1 > t0 for t0, t1 in nvml.metric_calls)


def test_transient_error_drops_one_interval_and_reprimes():
    clock = FakeClock(0)
    nvml = FakeNvml(clock, [(0, 0.0), (50 * MS, 1.0)])
    s = _sampler(nvml, clock)
    for _ in range(3):
        clock.advance(20 * MS)
        s.poll_once()
    nvml.fail_next_sample_get = 1
    clock.advance(20 * MS)
    assert s.poll_once() is None and s.errors == 1
    clock.advance(20 * MS)
    assert s.poll_once() is None  # re-prime
    clock.advance(20 * MS)
    smp = s.poll_once()
    assert smp is not None and (smp.t_start_ns, smp.t_end_ns) == (100 * MS, 120 * MS)
    assert smp.value == pytest.approx(1.0)
    # no sample spans the failed interval
    assert not any(a.t_start_ns < 80 * MS < a.t_end_ns for a in s.samples())


@pytest.mark.parametrize(
    ("kwargs", "prefer", "source", "reason_part"),
    [
        ({}, "auto", "gpm", "GPM"),
        ({"gpm": False}, "auto", "utilization", "GPM unavailable"),
        ({"gpm_metric_fails": True}, "auto", "utilization", "GPM unavailable"),
        ({"gpm_metric_status": 3}, "auto", "utilization", "not supported"),  # NVML_ERROR_NOT_SUPPORTED
        ({"gpm": False, "util": False}, "auto", "none", "utilization rates unavailable"),
        ({"init_ok": False}, "auto", "none", "NVML unavailable"),
        ({}, "utilization", "utilization", "utilization"),
        ({}, "none", "none", "disabled"),
    ],
)
def test_source_choice(kwargs, prefer, source, reason_part):
    clock = FakeClock()
    nvml = FakeNvml(clock, **kwargs)
    s = _sampler(nvml, clock, prefer=prefer)
    assert s.source == source
    assert reason_part in s.reason
    if source == "none":
        assert nvml.inits == 0  # NVML released when nothing is sampled
    s.close()
    assert nvml.inits == 0


def test_gpm_without_values_switches_to_utilization_at_run_time():
    clock = FakeClock(0)
    nvml = FakeNvml(clock, [(0, 0.4)], gpm_metric_status=999)  # GPM "works" but never gives a value
    s = _sampler(nvml, clock)
    assert s.source == "gpm"
    for _ in range(40):
        clock.advance(20 * MS)
        s.poll_once()
    assert s.source == "utilization" and "switched" in s.reason
    assert len(s.samples()) >= 10 and all(x.value == pytest.approx(0.4) for x in s.samples())


def test_utilization_fallback_values():
    clock = FakeClock(0)
    nvml = FakeNvml(clock, [(0, 0.25), (45 * MS, 0.75)], gpm=False)
    s = _sampler(nvml, clock)
    for _ in range(4):
        clock.advance(20 * MS)
        s.poll_once()
    assert [x.value for x in s.samples()] == pytest.approx([0.25, 0.75, 0.75])


def test_cpu_machine_has_no_source_and_never_raises():
    s = ActivitySampler(0)
    with s:
        time.sleep(0.05)
    if s.source == "none":  # this CPU machine (on a GPU box the real source is used)
        assert s.samples() == []
        assert s.mean_activity([(0, 10**18)]) is None
        assert s.reason


def test_background_thread_samples_and_stops():
    """The thread polls, its samples are contiguous, and stop stops it (not a timing test: no wall-time
    figure is asserted; the schedule is checked on a fake clock below)."""
    nvml = FakeNvml(time.perf_counter_ns, [(0, 0.3)])
    s = ActivitySampler(0, interval_s=0.01, nvml=nvml)
    with s:  # (until three samples, not for a wall time: a loaded machine may run the thread late)
        give_up = time.monotonic() + 120
        while len(s.samples()) < 3 and time.monotonic() < give_up:
            time.sleep(0.02)
    got = s.samples()
    assert s.source == "gpm" and len(got) >= 3
    assert all(a.t_end_ns == b.t_start_ns for a, b in zip(got, got[1:], strict=False))
    assert all(v.value == pytest.approx(0.3) for v in got)
    n = len(got)
    time.sleep(0.05)
    assert len(s.samples()) == n  # stopped
    assert nvml.inits == 0


@settings(max_examples=200)
@given(st.lists(st.tuples(st.integers(-80, 300), st.integers(0, 40)), min_size=1, max_size=30),
       st.sampled_from([0.01, 0.1, 0.25]))
def test_no_gpm_window_is_shorter_than_its_step_however_late_the_thread_runs(waits, interval_s):
    """GPM is polled every max(interval, 100 ms): its counters advance in ~100 ms steps, and shorter
    windows read 0 under full load (measured on the H200, benchmarks/results/gpm_probe.json). The
    thread's loop on a fake clock: each wait wakes ``late`` ms after it was due (negative: early), and
    each GPM sample takes ``call`` ms; no window may be shorter than the step, whatever the lateness."""
    clock = FakeClock(0)
    steps, call_ms = iter(waits), [0]
    nvml = FakeNvml(clock, [(0, 0.3)])
    untimed_get = nvml.nvmlGpmSampleGet

    def timed_get(*a):
        clock.advance(call_ms[0] * MS)
        return untimed_get(*a)

    nvml.nvmlGpmSampleGet = timed_get
    s = _sampler(nvml, clock, interval_s=interval_s)

    def wait(seconds: float) -> bool:
        step = next(steps, None)
        if step is None:
            return True  # stop
        late, call_ms[0] = step
        clock.advance(max(0, int(seconds * 1e9) + late * MS))
        return False

    s._loop(wait)
    got = s.samples()
    step_ns = max(interval_s, 0.1) * 1e9
    assert all(b.t_end_ns - b.t_start_ns >= step_ns for b in got)
    assert all(a.t_end_ns == b.t_start_ns for a, b in zip(got, got[1:], strict=False))


# --- the time-weighted math, against a brute force over integer time units --------------------------
@st.composite
def samples_and_intervals(draw):
    t, samples = draw(st.integers(0, 5)), []
    for _ in range(draw(st.integers(0, 12))):
        t += draw(st.integers(0, 3))  # gaps allowed
        d = draw(st.integers(1, 8))
        samples.append(ActivitySample(t, t + d, draw(st.sampled_from([0.0, 0.1, 0.25, 0.5, 0.9, 1.0]))))
        t += d
    ivs = [tuple(sorted(draw(st.tuples(st.integers(0, t + 5), st.integers(0, t + 5)))))
           for _ in range(draw(st.integers(0, 5)))]
    return samples, ivs


def _brute(samples, ivs, f):
    covered = {u for s, e in ivs for u in range(s, e)}
    vals = [f(smp.value) for smp in samples for u in range(smp.t_start_ns, smp.t_end_ns) if u in covered]
    return sum(vals) / len(vals) if vals else None


@settings(max_examples=300, deadline=None)
@given(samples_and_intervals())
def test_mean_activity_matches_brute_force(data):
    samples, ivs = data
    want = _brute(samples, ivs, lambda v: v)
    got = mean_activity(samples, ivs)
    assert (got is None) == (want is None)
    if want is not None:
        assert got == pytest.approx(want)


@settings(max_examples=200, deadline=None)
@given(samples_and_intervals(), st.sampled_from([0.1, 0.5, 0.8]))
def test_fraction_below_matches_brute_force(data, thr):
    samples, ivs = data
    window = ivs[0] if ivs else None
    if window is None:
        want = _brute(samples, [(samples[0].t_start_ns, samples[-1].t_end_ns)] if samples else [],
                      lambda v: v < thr)
    else:
        want = _brute(samples, [window], lambda v: v < thr)
    got = fraction_below(samples, thr, window)
    assert (got is None) == (want is None)
    if want is not None:
        assert got == pytest.approx(want)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.integers(0, 40)), max_size=8))
def test_merge_intervals_is_the_union(ivs):
    merged = merge_intervals(ivs)
    assert {u for s, e in merged for u in range(s, e)} == {u for s, e in ivs for u in range(s, e)}
    assert all(a[1] < b[0] for a, b in zip(merged, merged[1:], strict=False))  # disjoint, not touching


def test_partial_overlap_is_proportional():
    samples = [ActivitySample(0, 100, 1.0), ActivitySample(100, 200, 0.0)]
    assert mean_activity(samples, [(75, 125)]) == pytest.approx(0.5)
    assert mean_activity(samples, [(50, 150)]) == pytest.approx(0.5)
    assert mean_activity(samples, [(90, 130)]) == pytest.approx(0.25)
    # overlapping intervals (split groups) count shared time once
    assert mean_activity(samples, [(0, 100), (0, 100), (100, 200)]) == pytest.approx(0.5)
    assert mean_activity(samples, [(300, 400)]) is None
    assert fraction_below(samples, 0.5, (50, 200)) == pytest.approx(100 / 150)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")
def test_real_gpu_sees_a_matmul():
    a = torch.randn(8192, 8192, device="cuda")
    with ActivitySampler(0) as s:  # NVML index 0 = CUDA device 0 unless CUDA_VISIBLE_DEVICES remaps
        time.sleep(0.3)
        t0 = time.perf_counter_ns()
        for _ in range(30):
            a @ a
        torch.cuda.synchronize()
        t1 = time.perf_counter_ns()
        time.sleep(0.1)
    assert s.source in ("gpm", "utilization"), s.reason
    assert s.mean_activity([(t0, t1)]) > 0.5


def test_several_gpus_are_sampled_and_charged_separately():
    """Issue 8: with several GPUs the run's activity is the mean over them, each GPU has its own figure,
    and a node is charged with its own GPU's activity."""
    from interpreter.gpu_activity import GpuActivity
    from interpreter.runner import Runner

    clock = FakeClock(0)
    busy, idle = FakeNvml(clock, [(0, 0.8)]), FakeNvml(clock, [(0, 0.2)])
    samplers = {0: ActivitySampler(0, clock=clock, nvml=busy), 1: ActivitySampler(0, clock=clock, nvml=idle)}  # (each fake NVML has one GPU)
    for s in samplers.values():
        s.open()
    for _ in range(6):
        for s in samplers.values():
            s.poll_once()
        clock.advance(100 * MS)
    act = GpuActivity(samplers)
    window = [(100 * MS, 500 * MS)]
    assert act.mean_activity(window, gpu=0) == pytest.approx(0.8)
    assert act.mean_activity(window, gpu=1) == pytest.approx(0.2)
    assert act.mean_activity(window) == pytest.approx(0.5)
    assert set(act.samples_by_gpu()) == {0, 1}
    runner = Runner.__new__(Runner)  # only what _gpu_of reads
    runner.sampler, runner.processes = act, {11: {"visible_gpus": "1"}, 12: {"visible_gpus": ""}, 13: {"visible_gpus": "0,1"}}
    assert runner._gpu_of(11) == 1 and runner._gpu_of(12) is None and runner._gpu_of(13) is None
