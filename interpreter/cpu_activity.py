"""Per-component CPU busy time, sampled in the background on the trace's clock: the CPU stand-in for
SM activity when the optimizer ranks nodes (a call that sleeps or waits leaves its core idle for other
work; a call that computes keeps it busy).

Sources: a component running as a thread of this process (local backend) is read through the thread's
own CPU-time clock (`time.pthread_getcpuclockid`, nanosecond resolution); a component running as a
process (Ray) through `/proc/<pid>/stat` (user + system time, in clock ticks). `busy(component, t0, t1)`
interpolates the cumulative CPU time at both ends of the window, so a call's activity is its
component's CPU time during the call divided by the call's wall time, in [0, 1].
"""

from __future__ import annotations

import bisect
import os
import threading
import time
from collections.abc import Callable, Mapping

__all__ = ["CpuActivity", "thread_clock", "process_clock"]

Reader = Callable[[], int | None]  # cumulative CPU ns of one component, None when it cannot be read
_TICK_NS = 1_000_000_000 // os.sysconf("SC_CLK_TCK")


def thread_clock(ident: int) -> Reader:
    """Reads the CPU time of this process's thread `ident` (`threading.get_ident()` in that thread; a
    local backend's worker reports its own in `info`)."""
    try:
        clock = time.pthread_getcpuclockid(ident)
    except OSError:
        return lambda: None

    def read() -> int | None:
        try:
            return time.clock_gettime_ns(clock)
        except OSError:  # the thread ended
            return None

    return read


def process_clock(pid: int) -> Reader:
    """Reads the user + system CPU time of process `pid` from /proc (clock-tick resolution)."""
    path = f"/proc/{pid}/stat"

    def read() -> int | None:
        try:
            with open(path) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            return None
        return (int(fields[11]) + int(fields[12])) * _TICK_NS  # utime, stime (fields 14, 15 of stat)

    return read


class CpuActivity:
    """Samples every component's cumulative CPU time every `period_s` until closed."""

    def __init__(self, readers: Mapping[str, Reader], period_s: float = 0.005) -> None:
        self.readers = dict(readers)
        self.period_s = period_s
        self.samples: dict[str, tuple[list[int], list[int]]] = {c: ([], []) for c in self.readers}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rose-cpu-activity", daemon=True)
        self._thread.start()

    def add(self, component: str, reader: Reader) -> None:
        with self._lock:
            self.readers[component] = reader
            self.samples.setdefault(component, ([], []))

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self.poll()

    def poll(self) -> None:
        with self._lock:
            readers = list(self.readers.items())
        now = time.perf_counter_ns()
        for comp, read in readers:
            value = read()
            if value is None:
                continue
            ts, vs = self.samples[comp]
            ts.append(now)
            vs.append(value)

    def _at(self, comp: str, t: int) -> float | None:
        ts, vs = self.samples.get(comp, ([], []))
        if len(ts) < 2 or t < ts[0] or t > ts[-1]:
            return None
        i = bisect.bisect_left(ts, t)
        if ts[i] == t:
            return float(vs[i])
        t0, t1, v0, v1 = ts[i - 1], ts[i], vs[i - 1], vs[i]
        return v0 + (v1 - v0) * (t - t0) / (t1 - t0)

    def busy(self, component: str, start_ns: int, end_ns: int) -> float | None:
        """The component's CPU time during [start, end) over the window's wall time (clamped to [0, 1])."""
        if end_ns <= start_ns:
            return None
        a, b = self._at(component, start_ns), self._at(component, end_ns)
        if a is None or b is None:
            return None
        return min(1.0, max(0.0, (b - a) / (end_ns - start_ns)))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2.0)
