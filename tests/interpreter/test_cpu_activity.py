"""CPU activity that means idle (`interpreter/cpu_activity.py`): running, runnable (descheduled by load) and
idle told apart, on a fake /proc and a fake clock; one real check with threads that asserts no speed."""

from __future__ import annotations

import os
import signal
import threading
import time

from interpreter.cpu_activity import (
    FUTEX_SYSCALL,
    CpuActivity,
    LockWaitCounter,
    LockWaitHelper,
    Split,
    lock_wait_probe,
    process_clock,
    schedstat_reader,
    thread_clock,
)
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
    cpu = CpuActivity({}, period_s=0.01)
    cpu.add_thread("sleep", idents[0])  # (with the helper process that samples its lock waits)
    cpu.add("spin", thread_clock(idents[1]))
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


# -- the GIL: blocked on the process's lock while another thread runs (a fake /proc in tmp_path) ------------

class FakeTasks:
    """`<root>/<pid>/task/<tid>/{stat,syscall}` files in a directory, as /proc lays them out."""

    def __init__(self, root, pid: int) -> None:
        self.root, self.pid = root, pid

    # what each wait looks like in /proc/<pid>/task/<tid>/syscall (number, uaddr, op, val, timeout, ...), as
    # recorded on this machine (x86_64, glibc, CPython 3.11): the GIL's mutex and its condition's timed wait;
    # queue.get() / Event.wait() without a timeout; Event.wait(100); time.sleep; a read
    WAITS = {"futex": ("F", "0x80", "0x0"), "gil_cond": ("F", "0x89", "0x7f12a0"), "queue": ("F", "0x189", "0x0"),
             "timed_event": ("F", "0x89", "0x7f12a0"), "nanosleep": ("230", "0x0", "0x0"), "read": ("0", "0x0", "0x0")}

    def thread(self, tid: int, state: str, syscall: str | None = None) -> None:
        """One thread's state letter and, asleep, the wait it is in (`WAITS`)."""
        task = self.root / str(self.pid) / "task" / str(tid)
        task.mkdir(parents=True, exist_ok=True)
        (task / "stat").write_text(f"{tid} (python3 worker) {state} 1 1 1 0 -1 0 0 0 0 0 30 10\n")
        text = "running"
        if syscall is not None:
            nr, op, timeout = self.WAITS[syscall]
            nr = str(FUTEX_SYSCALL if FUTEX_SYSCALL is not None else 202) if nr == "F" else nr
            text = f"{nr} 0x55d0c0 {op} 0x2 {timeout} 0x0 0x0 0x7ffd 0x7f12"
        (task / "syscall").write_text(text + "\n")
        (task / "wchan").write_text("futex_wait_queue" if syscall in ("futex", "gil_cond", "queue", "timed_event") else "0")


def _gil_activity(tmp_path, states: list[dict[int, tuple[str, str | None]]]) -> tuple[CpuActivity, FakeTasks]:
    """A component on thread 11 of process 10 (no CPU time of its own: all of its busy time is blocked), polled
    once per step at 0, 10, 20, ... ms with the threads' states of that step."""
    tasks, clock = FakeTasks(tmp_path, 10), FakeClock()
    cpu = CpuActivity({}, clock=clock, start=False)
    cpu.add("comp", lambda: (0, 0), lock_wait_probe(10, 11, root=str(tmp_path)))
    for step, threads in enumerate(states):
        clock.now = step * 10 * MS
        for tid, (state, call) in threads.items():
            tasks.thread(tid, state, call)
        cpu.poll()
    return cpu, tasks


def test_a_thread_waiting_for_the_gil_while_another_runs_reads_busy(tmp_path) -> None:
    """latency_gil_trap.yaml's case: the component's thread sleeps on the GIL's futex while another thread of
    its process runs Python. Neither running nor runnable, it read idle; blocked on the lock, it is busy."""
    waiting = {11: ("S", "futex"), 12: ("R", None)}
    cpu, _ = _gil_activity(tmp_path, [waiting] * 5)
    split = cpu.split("comp", 0, 40 * MS)
    assert split is not None and split.running == 0.0 and split.blocked == 1.0 and split.busy == 1.0
    stats = {"gil": NodeStats("gil", "gil", 0.5, 0.5, 1.0, split.busy)}
    assert not rank_nodes(stats, 1.0).targets  # nothing to overlap with a lock that is taken


def test_a_futex_wait_with_nothing_else_runnable_and_a_sleep_read_idle(tmp_path) -> None:
    """Waiting for the lock with no other thread runnable, sleeping, or waiting for work on a queue or event
    (a Python lock without a timeout: not the GIL's kind of wait) is idle whoever runs; half the window
    blocked on the lock reads half busy."""
    cpu, _ = _gil_activity(tmp_path, [{11: ("S", "futex"), 12: ("S", "futex")}] * 2
                           + [{11: ("S", "nanosleep"), 12: ("R", None)}] * 2 + [{11: ("S", "queue"), 12: ("R", None)}])
    assert cpu.busy("comp", 0, 40 * MS) == 0.0
    cpu, _ = _gil_activity(tmp_path / "cond", [{11: ("S", "gil_cond"), 12: ("R", None)}] * 3)
    assert cpu.busy("comp", 0, 20 * MS) == 1.0  # the GIL's condition: a timed wait on the monotonic clock
    cpu, _ = _gil_activity(tmp_path / "half", [{11: ("S", "futex"), 12: ("R", None)}] * 3
                           + [{11: ("S", "futex"), 12: ("S", "read")}] * 2)
    assert cpu.split("comp", 0, 40 * MS) == Split(0.0, 0.0, 0.5)


def test_the_lock_probe_leaves_out_the_thread_that_reads_and_says_when_it_cannot_read(tmp_path) -> None:
    """The sampler is a thread of the process it samples (local backend): reading /proc, it runs, and must not
    count as the thread holding the lock. A thread that ended (no files) is unknown, not idle or busy."""
    import os

    me = threading.get_native_id()
    tasks = FakeTasks(tmp_path, os.getpid())
    tasks.thread(11, "S", "futex")
    tasks.thread(me, "R")
    probe = lock_wait_probe(os.getpid(), 11, root=str(tmp_path))
    assert probe() is False
    tasks.thread(12, "R")
    assert probe() is True
    tasks.thread(11, "R")
    assert probe() is False  # running or runnable: counted by schedstat already, not twice
    assert lock_wait_probe(os.getpid(), 99, root=str(tmp_path))() is None
    tasks.thread(11, "S", "queue")
    assert probe() is False  # waiting for work: a Python lock without a timeout
    tasks.thread(11, "S", "timed_event")
    assert probe() is True  # the limit (docs/optimizer.md): a timed Python wait reads as the GIL's condition does
    tasks.thread(11, "S", "futex")
    (tmp_path / str(os.getpid()) / "task" / "11" / "syscall").unlink()  # no syscall file: `wchan` says futex
    assert probe() is True


def test_a_lock_wait_counter_adds_the_intervals_its_probe_finds_blocked() -> None:
    clock, answers = FakeClock(), iter([False, True, True, None, False, True])
    counter = LockWaitCounter(lambda: next(answers), clock)
    got = []
    for t in (0, 10, 20, 30, 40, 50):
        clock.now = t * MS
        got.append(counter())
    assert got == [0, 10 * MS, 20 * MS, None, 20 * MS, 30 * MS]


def test_the_helper_process_counts_a_gil_wait_and_not_a_wait_for_work(tmp_path) -> None:
    """`LockWaitHelper` (threads of rose's own process are sampled from another process, which takes no part
    in their GIL) on a fake /proc: thread 11 waits on the GIL's mutex while 12 runs, thread 13 waits on a
    queue. The helper's counter for 11 grows; 13's stays 0. (Waits for the helper, asserts no speed.)"""
    tasks = FakeTasks(tmp_path, 10)
    tasks.thread(11, "S", "futex")
    tasks.thread(12, "R")
    tasks.thread(13, "S", "queue")
    helper = LockWaitHelper(0.005, root=str(tmp_path), pid=10)
    try:
        gil, work = helper.watch(11), helper.watch(13)
        deadline = time.monotonic() + 60.0  # (a loaded machine starts the helper late; no figure depends on it)
        while not gil() and time.monotonic() < deadline and helper.proc.poll() is None:
            time.sleep(0.05)
        assert gil() > 0 and work() == 0
        assert os.getpgid(helper.proc.pid) != os.getpgid(0)  # a terminal's Ctrl-C does not reach it...
        helper.proc.send_signal(signal.SIGINT)  # ...and one sent to it is ignored (issue 59: a traceback)
    finally:
        helper.close()
    assert helper.proc.returncode == 0  # it ended when its stdin closed
