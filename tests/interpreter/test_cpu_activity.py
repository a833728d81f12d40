"""CPU activity that means idle (`interpreter/cpu_activity.py`): running, runnable (descheduled by load) and
idle told apart, on a fake /proc and a fake clock; one real check with threads that asserts no speed."""

from __future__ import annotations

import threading
import time

from interpreter.cpu_activity import CpuActivity, process_clock, schedstat_reader, thread_clock
from rose_dsl.optimizer.profile import NodeStats
from rose_dsl.optimizer.rank import rank_nodes

MS = 1_000_000


class FakeProc:
    """A /proc whose files the test writes; a missing file raises OSError as the real one does."""

    def __init__(self) -> None:
        self.files: dict[str, str] = {}

    def __call__(self, path: str) -> str:
        if path not in self.files:
            raise FileNotFoundError(path)
        return self.files[path]

    def schedstat(self, path: str, running_ms: float, runnable_ms: float) -> None:
        self.files[path] = f"{int(running_ms * MS)} {int(runnable_ms * MS)} 7\n"


class FakeClock:
    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


def _sampled(proc: FakeProc, clock: FakeClock, steps: list[tuple[float, dict[str, tuple[float, float]]]]) -> CpuActivity:
    """Poll once per step after advancing the clock to the step's time (ms) and writing each component's
    cumulative (running ms, runnable ms)."""
    cpu = CpuActivity({c: schedstat_reader(f"/t/{c}", proc) for c in steps[0][1]}, clock=clock, start=False)
    for t_ms, comps in steps:
        clock.now = int(t_ms * MS)
        for c, (run, wait) in comps.items():
            proc.schedstat(f"/t/{c}", run, wait)
        cpu.poll()
    return cpu


def test_load_descheduling_reads_busy_and_sleep_reads_idle() -> None:
    """The issue's case: a compute-bound call on a loaded machine runs 45% of its wall time and waits in the
    run queue for the rest. CPU time alone said 45% (idle, a target); with the run queue it is busy."""
    proc, clock = FakeProc(), FakeClock()
    cpu = _sampled(proc, clock, [
        (0, {"loaded": (0, 0), "sleeper": (0, 0), "io": (0, 0)}),
        (100, {"loaded": (45, 53), "sleeper": (1, 0), "io": (20, 2)}),
        (200, {"loaded": (90, 106), "sleeper": (2, 0), "io": (40, 4)}),
    ])
    loaded = cpu.split("loaded", 0, 200 * MS)
    assert loaded is not None
    assert abs(loaded.running - 0.45) < 1e-9 and abs(loaded.runnable - 0.53) < 1e-9
    assert abs(cpu.busy("loaded", 0, 200 * MS) - 0.98) < 1e-9  # type: ignore[operator]
    assert cpu.busy("sleeper", 0, 200 * MS) == 0.01
    io = cpu.split("io", 50 * MS, 150 * MS)  # interpolated between samples
    assert io is not None and abs(io.running - 0.2) < 1e-9 and abs(io.idle - 0.78) < 1e-9
    assert cpu.busy("loaded", 0, 300 * MS) is None  # beyond the samples: unknown, not a guess
    assert cpu.busy("nobody", 0, 100 * MS) is None


def test_ranking_targets_the_sleeper_not_the_descheduled_computer() -> None:
    """Ranked by what overlapping could gain (S(v) = D_v (1 - a_v)): the loaded compute node is excluded,
    the sleeping one of the same length is the target."""
    proc, clock = FakeProc(), FakeClock()
    cpu = _sampled(proc, clock, [(0, {"compute": (0, 0), "wait": (0, 0)}),
                                 (500, {"compute": (230, 255), "wait": (15, 1)})])
    stats = {n: NodeStats(n, n, 0.5, 0.5, 1.0, cpu.busy(n, 0, 500 * MS)) for n in ("compute", "wait")}
    ranking = rank_nodes(stats, 1.0)
    assert [r.node for r in ranking.targets] == ["wait"]
    excluded = next(r for r in ranking.all if r.node == "compute")
    assert excluded.tier is None and "busy" in excluded.reason


def test_process_reader_adds_the_main_threads_run_queue_time() -> None:
    proc = FakeProc()
    stat_tail = " ".join(["S"] + ["0"] * 10 + ["30", "10"] + ["0"] * 30)  # utime 30, stime 10 ticks
    proc.files["/proc/42/stat"] = f"42 (python3 (ray)) {stat_tail}\n"
    proc.schedstat("/proc/42/schedstat", 400, 120)
    sample = process_clock(42, proc)()
    assert sample is not None
    tick_ns = sample[0] // 40
    assert sample == (40 * tick_ns, 120 * MS)
    del proc.files["/proc/42/schedstat"]  # no schedstat: CPU time only
    assert process_clock(42, proc)() == (40 * tick_ns, 0)
    assert process_clock(43, proc)() is None


def test_real_threads_sleeping_reads_idle_spinning_reads_busy() -> None:
    """On this machine, whatever its load: a sleeping thread is idle; a spinning one is busy (running or
    waiting for a CPU), which is what CPU time alone got wrong under load."""
    stop = threading.Event()

    def spinner() -> None:
        while not stop.is_set():
            sum(range(1000))

    threads = [threading.Thread(target=stop.wait), threading.Thread(target=spinner)]
    for t in threads:
        t.start()
    idents = [t.ident for t in threads]
    assert idents[0] is not None and idents[1] is not None
    cpu = CpuActivity({"sleep": thread_clock(idents[0]), "spin": thread_clock(idents[1])}, period_s=0.01)
    try:
        cpu.poll()  # samples on both sides of the window, however loaded the machine (the sampler may lag)
        t0 = time.perf_counter_ns()
        time.sleep(0.4)
        t1 = time.perf_counter_ns()
        cpu.poll()
    finally:
        stop.set()
        for t in threads:
            t.join()
        cpu.close()
    sleep, spin = cpu.busy("sleep", t0, t1), cpu.busy("spin", t0, t1)
    assert sleep is not None and spin is not None
    assert sleep < 0.05
    # the GIL: the spinner waits for it while this thread and the sampler run Python, which reads as idle
    # (a lock wait is not run-queue time), so "busy" here means most of the window, not all of it
    assert spin > 0.5, (sleep, spin)
