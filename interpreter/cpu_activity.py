"""Per-component CPU activity, sampled in the background on the trace's clock: the CPU stand-in for SM
activity when the optimizer ranks nodes (a call that sleeps or waits leaves its core idle for other work;
a call that computes keeps it busy).

Why run-queue time counts as busy: on a loaded machine a computing thread is descheduled part of the
time -- pure-Python calls read 44-49% CPU time over wall time on the shared 2-core machine (issue 44) --
and CPU time alone then ranked compute-bound work idle and targeted it. A thread that is runnable but not
running wants the CPU as much as one that runs: overlapping other work with it gains nothing. So a
component's time splits three ways: *running* (CPU time), *runnable* (waiting in the run queue: the
kernel's `schedstat` wait time) and *idle* (neither: asleep, in I/O, waiting for another process or a
lock). Its activity is running + runnable over wall time; what overlapping could win is the idle part.

Sources: a component running as a thread of this process (local backend) is read from the thread's own
`/proc/self/task/<tid>/schedstat` (CPU ns, run-queue ns); a component running as a process (Ray) from
`/proc/<pid>/stat` (user + system time of all its threads, clock ticks) and its main thread's
`/proc/<pid>/schedstat` (run-queue ns: Ray runs an actor's calls on that thread; reading every thread of
a process every few ms would cost more than it measures). Where schedstat cannot be read the run-queue
time is 0: activity is CPU time over wall time, as before. `busy(component, t0, t1)` interpolates the
cumulative counters at both ends of the window.
"""

from __future__ import annotations

import bisect
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

__all__ = ["CpuActivity", "Split", "thread_clock", "process_clock", "schedstat_reader"]

Sample = tuple[int, int]  # cumulative (running ns, runnable ns) of one component
Reader = Callable[[], Sample | None]  # None when it cannot be read
ReadText = Callable[[str], str]  # a /proc file's text (a fake in tests); raises OSError when absent
_TICK_NS = 1_000_000_000 // os.sysconf("SC_CLK_TCK")


def _read_text(path: str) -> str:
    with open(path) as f:
        return f.read()


def schedstat_reader(path: str, read: ReadText = _read_text) -> Reader:
    """(CPU ns, run-queue wait ns) from a schedstat file: `<on-cpu ns> <run-queue ns> <timeslices>`."""

    def sample() -> Sample | None:
        try:
            fields = read(path).split()
            return int(fields[0]), int(fields[1])
        except (OSError, ValueError, IndexError):
            return None

    return sample


def _native_id(ident: int) -> int | None:
    for t in threading.enumerate():
        if t.ident == ident:
            return t.native_id
    return None


def thread_clock(ident: int, read: ReadText = _read_text) -> Reader:
    """A thread of this process (`threading.get_ident()` in that thread; a local backend's worker reports
    its own in `info`): its schedstat when readable, else its CPU-time clock with no run-queue time."""
    native = _native_id(ident)
    if native is not None:
        stat = schedstat_reader(f"/proc/self/task/{native}/schedstat", read)
        if stat() is not None:
            return stat
    try:
        clock = time.pthread_getcpuclockid(ident)
    except OSError:
        return lambda: None

    def sample() -> Sample | None:
        try:
            return time.clock_gettime_ns(clock), 0
        except OSError:  # the thread ended
            return None

    return sample


def process_clock(pid: int, read: ReadText = _read_text) -> Reader:
    """Process `pid`: user + system CPU time of all its threads (clock ticks) and its main thread's
    run-queue wait (0 when schedstat cannot be read)."""
    stat, sched = f"/proc/{pid}/stat", schedstat_reader(f"/proc/{pid}/schedstat", read)

    def sample() -> Sample | None:
        try:
            fields = read(stat).rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            return None
        cpu = (int(fields[11]) + int(fields[12])) * _TICK_NS  # utime, stime (fields 14, 15 of stat)
        waited = sched()
        return cpu, waited[1] if waited is not None else 0

    return sample


@dataclass(frozen=True)
class Split:
    """A component's window, as fractions of its wall time: running, runnable (descheduled by load), idle."""

    running: float
    runnable: float

    @property
    def busy(self) -> float:
        return min(1.0, self.running + self.runnable)

    @property
    def idle(self) -> float:
        return 1.0 - self.busy


class CpuActivity:
    """Samples every component's cumulative CPU time every `period_s` until closed."""

    def __init__(self, readers: Mapping[str, Reader], period_s: float = 0.005,
                 clock: Callable[[], int] = time.perf_counter_ns, start: bool = True) -> None:
        self.readers = dict(readers)
        self.period_s = period_s
        self.clock = clock
        self.samples: dict[str, tuple[list[int], list[Sample]]] = {c: ([], []) for c in self.readers}
        self._lock = threading.Lock()
        self._polling = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rose-cpu-activity", daemon=True)
        if start:  # (tests poll by hand on a fake clock)
            self._thread.start()

    def add(self, component: str, reader: Reader) -> None:
        with self._lock:
            self.readers[component] = reader
            self.samples.setdefault(component, ([], []))

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self.poll()

    def poll(self) -> None:
        """One sample of every component. Whole under `_polling`: the sampler thread and a caller (a test,
        a measurement's edge) may poll at once, and each component's samples must stay in time order
        (`_at` reads the first and last as the covered window)."""
        with self._lock:
            readers = list(self.readers.items())
        with self._polling:
            now = self.clock()
            for comp, read in readers:
                value = read()
                if value is None:
                    continue
                ts, vs = self.samples[comp]
                ts.append(now)
                vs.append(value)

    def _at(self, comp: str, t: int) -> tuple[float, float] | None:
        ts, vs = self.samples.get(comp, ([], []))
        if len(ts) < 2 or t < ts[0] or t > ts[-1]:
            return None
        i = bisect.bisect_left(ts, t)
        if ts[i] == t:
            return float(vs[i][0]), float(vs[i][1])
        t0, t1, v0, v1 = ts[i - 1], ts[i], vs[i - 1], vs[i]
        w = (t - t0) / (t1 - t0)
        return v0[0] + (v1[0] - v0[0]) * w, v0[1] + (v1[1] - v0[1]) * w

    def split(self, component: str, start_ns: int, end_ns: int) -> Split | None:
        """The component's running and runnable time during [start, end) over the window's wall time."""
        if end_ns <= start_ns:
            return None
        a, b = self._at(component, start_ns), self._at(component, end_ns)
        if a is None or b is None:
            return None
        wall = end_ns - start_ns
        running = min(1.0, max(0.0, (b[0] - a[0]) / wall))
        return Split(running, min(1.0 - running, max(0.0, (b[1] - a[1]) / wall)))

    def busy(self, component: str, start_ns: int, end_ns: int) -> float | None:
        """The component's activity during [start, end): running + runnable over wall time, in [0, 1]."""
        split = self.split(component, start_ns, end_ns)
        return None if split is None else split.busy

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2.0)
