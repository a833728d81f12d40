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

Why waiting for the GIL counts as busy too: a thread of a Python process that wants the interpreter lock
while another thread of that process holds it sleeps on a futex -- neither running nor runnable -- and read
as idle, so a GIL-bound component looked like slack to overlap (`workflows/latency_gil_trap.yaml`: every
rewrite there is slower). Overlapping it gains nothing: the lock is taken. So a third part, *blocked*: the
component's thread sleeps in a futex wait of the GIL's kind (a mutex, or a condition with a timeout: not a
Python lock, queue or event waited on without one) while another thread of its process is runnable
(running or in the run queue) -- sampled each poll from `/proc/<pid>/task/*/stat` (the state) and the
thread's `syscall` file (or `wchan`), the sampling thread itself left out (it is running when it reads);
for threads of this very process from a helper process (`LockWaitHelper`: a sampling thread here would
take part in the GIL it measures). A
thread asleep in a futex with no other thread runnable is waiting for work or for another process: idle;
one asleep in anything else (sleep, I/O, poll) is idle whoever runs. `busy` is running + runnable + blocked.

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
import mmap
import os
import platform
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

__all__ = ["CpuActivity", "Split", "thread_clock", "process_clock", "schedstat_reader", "lock_wait_probe",
           "LockWaitCounter", "LockWaitHelper", "FUTEX_SYSCALL"]

Sample = tuple[int, int]  # cumulative (running ns, runnable ns) of one component
Reader = Callable[[], Sample | None]  # None when it cannot be read
# is the component's thread blocked on its process's lock (the GIL) now? None when it cannot be read
Probe = Callable[[], bool | None]
ReadText = Callable[[str], str]  # a /proc file's text (a fake in tests); raises OSError when absent
_TICK_NS = 1_000_000_000 // os.sysconf("SC_CLK_TCK")
# the futex system call's number (the first field of /proc/<pid>/task/<tid>/syscall while a thread waits in
# it), by architecture; elsewhere the probe reads `wchan` only
FUTEX_SYSCALL = {"x86_64": 202, "aarch64": 98, "riscv64": 98, "ppc64le": 221, "s390x": 238}.get(platform.machine())
# futex(2) operations (linux/futex.h): the command bits, FUTEX_WAIT, FUTEX_WAIT_BITSET, the realtime-clock flag
_FUTEX_CMD_MASK, _FUTEX_WAIT, _FUTEX_WAIT_BITSET, _FUTEX_CLOCK_REALTIME = 0x7F, 0, 9, 0x100


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


def _state(text: str) -> str:
    """A /proc stat line's state letter (the field after the parenthesised command, which may hold spaces)."""
    return text.rsplit(")", 1)[1].split()[0]


def _lock_wait(task: str, read: ReadText) -> bool | None:
    """Is the thread (its /proc task directory) asleep in a futex wait of the kind the GIL's is? Its `syscall`
    file: `<nr> <uaddr> <op> <val> <timeout> ...`. CPython 3.11 on glibc waits for the GIL on a mutex
    (FUTEX_WAIT) or on a condition with a 5-ms timeout (FUTEX_WAIT_BITSET on the monotonic clock, a timeout
    given); a Python lock, queue, event or future waited on without a timeout is FUTEX_WAIT_BITSET on the
    realtime clock (flag 0x100) without one -- waiting for work, not for the lock -- and is not counted.
    Without a readable `syscall` file, `wchan` says futex or not (any futex then counts)."""
    try:
        fields = read(f"{task}/syscall").split()
        if fields and fields[0].lstrip("-").isdigit():
            if FUTEX_SYSCALL is None or int(fields[0]) != FUTEX_SYSCALL or len(fields) < 5:
                return False
            op, timeout = int(fields[2], 16), int(fields[4], 16)
            command = op & _FUTEX_CMD_MASK
            return command == _FUTEX_WAIT or (command == _FUTEX_WAIT_BITSET and timeout != 0
                                              and not op & _FUTEX_CLOCK_REALTIME)
    except (OSError, ValueError):
        pass
    try:
        return "futex" in read(f"{task}/wchan")
    except OSError:
        return None


def lock_wait_probe(pid: int, tid: int, root: str = "/proc", read: ReadText = _read_text,
                    tasks: Callable[[str], list[str]] = os.listdir,
                    exclude: Callable[[], set[int]] = set) -> Probe:
    """Is thread `tid` of process `pid` blocked on its process's lock -- asleep in a futex wait while another
    of the process's threads is runnable (`R`)? The thread that asks is left out when it belongs to `pid`
    (reading, it runs), and so are the threads `exclude()` names (a sampling thread of `pid`). None when the
    thread's files cannot be read (it ended, or /proc is not there)."""
    base = f"{root}/{pid}/task"

    def probe() -> bool | None:
        try:
            if _state(read(f"{base}/{tid}/stat")) != "S":
                return False  # running or runnable (counted already), or in I/O (D): not a lock wait
        except (OSError, IndexError):
            return None
        waiting = _lock_wait(f"{base}/{tid}", read)
        if not waiting:
            return waiting
        me = threading.get_native_id() if pid == os.getpid() else None
        try:
            left_out = {tid, me, *exclude()}
            others = [t for t in tasks(base) if t.isdigit() and int(t) not in left_out]
        except OSError:
            return None
        for t in others:
            try:
                if _state(read(f"{base}/{t}/stat")) == "R":
                    return True
            except (OSError, IndexError):
                continue  # (a thread that ended between the listing and the read)
        return False

    return probe


class LockWaitCounter:
    """Cumulative ns a thread was blocked on its process's lock, from `probe` asked at each call: the
    interval since the previous call counts when the probe finds it blocked now (a sampled estimate)."""

    def __init__(self, probe: Probe, clock: Callable[[], int] = time.perf_counter_ns) -> None:
        self.probe, self.clock = probe, clock
        self.total: int = 0
        self.last: int | None = None

    def __call__(self) -> int | None:
        now, blocked = self.clock(), self.probe()
        if blocked is None:
            return None
        if blocked and self.last is not None:
            self.total += now - self.last
        self.last = now
        return self.total


_SLOTS = 256  # threads one helper watches (a slot each: 8 bytes of its shared counters)


class LockWaitHelper:
    """Samples the lock probes of this process's own threads from another process.

    Why: a sampling *thread* needs the GIL itself, and by releasing it around each /proc read it wakes the
    threads waiting for it, which are then runnable when it reads their state: three GIL-bound spinners of
    its own process read blocked 0.02-0.13 of their time where schedstat leaves ~0.5 unexplained. A helper
    process (`_helper_main`, started with this interpreter) takes no part in this process's GIL; it polls
    every `period_s` and keeps each watched thread's cumulative blocked ns in a shared file that this
    process maps (`watch` returns its reader). It exits when its stdin closes (`close`) or this process ends."""

    def __init__(self, period_s: float, root: str = "/proc", pid: int | None = None) -> None:
        self.pid = os.getpid() if pid is None else pid
        self._file = tempfile.NamedTemporaryFile(prefix="rose-lockwait-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
        self._file.truncate(8 * _SLOTS)
        self._map = mmap.mmap(self._file.fileno(), 8 * _SLOTS)
        self.slots: dict[int, int] = {}
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        # a Ctrl-C is rose's to handle, not the helper's: it had printed a KeyboardInterrupt traceback from here
        # during `rose optimize` (issue 59). Its own process group keeps the terminal's SIGINT away, and it
        # ignores one sent to it; it still ends when its stdin closes or this process is gone.
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "import signal; signal.signal(signal.SIGINT, signal.SIG_IGN); "
             "from interpreter.cpu_activity import _helper_main; _helper_main()",
             str(self.pid), self._file.name, str(period_s), root],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env, process_group=0)

    def _send(self, line: str) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass  # the helper ended: its counters stay as they were (the windows after read unknown)

    def exclude(self, tid: int) -> None:
        """A thread of the watched process never counted as the one holding the lock (the sampler)."""
        self._send(f"x {tid}")

    def watch(self, tid: int) -> Callable[[], int | None]:
        """Start watching `tid`; the reader of its cumulative blocked ns."""
        slot = self.slots.setdefault(tid, len(self.slots))
        if slot >= _SLOTS:
            return lambda: None
        self._send(f"w {slot} {tid}")
        return lambda: struct.unpack_from("q", self._map, 8 * slot)[0]

    def close(self) -> None:
        if self.proc.stdin is not None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
        try:
            self.proc.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self._map.close()
        self._file.close()


def _helper_main() -> None:
    """The helper process (`LockWaitHelper`): argv pid, shared file, period, /proc root; stdin commands
    `w SLOT TID` (watch) and `x TID` (leave out); polls until stdin closes or the parent is gone."""
    pid, path, period, root = int(sys.argv[1]), sys.argv[2], float(sys.argv[3]), sys.argv[4]
    counters: dict[int, LockWaitCounter] = {}
    left_out: set[int] = set()
    lock, done = threading.Lock(), threading.Event()

    def commands() -> None:
        for line in sys.stdin:
            parts = line.split()
            with lock:
                if parts[:1] == ["w"] and len(parts) == 3:
                    probe = lock_wait_probe(pid, int(parts[2]), root, exclude=lambda: left_out)
                    counters[int(parts[1])] = LockWaitCounter(probe)
                elif parts[:1] == ["x"] and len(parts) == 2:
                    left_out.add(int(parts[1]))
        done.set()

    threading.Thread(target=commands, daemon=True).start()
    parent = os.getppid()
    with open(path, "r+b") as f:
        shared = mmap.mmap(f.fileno(), 8 * _SLOTS)
        while not done.wait(period) and os.getppid() == parent:
            with lock:
                items = list(counters.items())
            for slot, counter in items:
                total = counter()
                if total is not None:
                    struct.pack_into("q", shared, 8 * slot, total)


@dataclass(frozen=True)
class Split:
    """A component's window, as fractions of its wall time: running, runnable (descheduled by load), blocked
    on its process's lock while another of its threads ran (the GIL; sampled), idle."""

    running: float
    runnable: float
    blocked: float = 0.0

    @property
    def busy(self) -> float:
        return min(1.0, self.running + self.runnable + self.blocked)

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
        self.samples: dict[str, tuple[list[int], list[tuple[int, int, int]]]] = {c: ([], []) for c in self.readers}
        self.probes: dict[str, Probe] = {}
        self.counters: dict[str, Callable[[], int | None]] = {}  # cumulative blocked ns (a `LockWaitHelper`'s)
        self.helper: LockWaitHelper | None = None
        self._lock = threading.Lock()
        self._polling = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rose-cpu-activity", daemon=True)
        if start:  # (tests poll by hand on a fake clock)
            self._thread.start()

    def add(self, component: str, reader: Reader, probe: Probe | None = None,
            blocked: Callable[[], int | None] | None = None) -> None:
        """Sample `component` by `reader`; `probe` (`lock_wait_probe`): whether its thread is blocked on its
        process's lock at each poll, or `blocked`: its cumulative blocked ns (None for both: never blocked)."""
        with self._lock:
            self.readers[component] = reader
            self.samples.setdefault(component, ([], []))
            if probe is not None:
                self.probes[component] = probe
            if blocked is not None:
                self.counters[component] = blocked

    def add_thread(self, component: str, ident: int) -> None:
        """A component running as a thread of this process (`threading.get_ident()` in it): its schedstat,
        and its lock waits sampled by a helper process (`LockWaitHelper`: a thread here would bias them)."""
        native = _native_id(ident)
        counter = None
        if native is not None and FUTEX_SYSCALL is not None:
            if self.helper is None:
                self.helper = LockWaitHelper(self.period_s)
                if self._thread.native_id is not None:
                    self.helper.exclude(self._thread.native_id)
            counter = self.helper.watch(native)
        self.add(component, thread_clock(ident), blocked=counter)

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self.poll()

    def poll(self) -> None:
        """One sample of every component. Whole under `_polling`: the sampler thread and a caller (a test,
        a measurement's edge) may poll at once, and each component's samples must stay in time order
        (`_at` reads the first and last as the covered window)."""
        with self._lock:
            readers = list(self.readers.items())
            probes, counters = dict(self.probes), dict(self.counters)
        with self._polling:
            now = self.clock()
            for comp, read in readers:
                value = read()
                if value is None:
                    continue
                ts, vs = self.samples[comp]
                # blocked ns, cumulative: the interval since the last sample counts when the probe finds
                # the thread blocked now (a sampled estimate, as the GPU's activity is)
                blocked = vs[-1][2] if vs else 0
                probe, counter = probes.get(comp), counters.get(comp)
                if counter is not None:
                    blocked = max(blocked, counter() or 0)  # (the helper's counter only grows)
                elif ts and probe is not None and probe():
                    blocked += now - ts[-1]
                ts.append(now)
                vs.append((value[0], value[1], blocked))

    def _at(self, comp: str, t: int) -> tuple[float, ...] | None:
        ts, vs = self.samples.get(comp, ([], []))
        if len(ts) < 2 or t < ts[0] or t > ts[-1]:
            return None
        i = bisect.bisect_left(ts, t)
        if ts[i] == t:
            return tuple(float(x) for x in vs[i])
        t0, t1, v0, v1 = ts[i - 1], ts[i], vs[i - 1], vs[i]
        w = (t - t0) / (t1 - t0)
        return tuple(a + (b - a) * w for a, b in zip(v0, v1, strict=True))

    def split(self, component: str, start_ns: int, end_ns: int) -> Split | None:
        """The component's running, runnable and blocked time during [start, end) over its wall time."""
        if end_ns <= start_ns:
            return None
        a, b = self._at(component, start_ns), self._at(component, end_ns)
        if a is None or b is None:
            return None
        wall = end_ns - start_ns
        running = min(1.0, max(0.0, (b[0] - a[0]) / wall))
        runnable = min(1.0 - running, max(0.0, (b[1] - a[1]) / wall))
        return Split(running, runnable, min(1.0 - running - runnable, max(0.0, (b[2] - a[2]) / wall)))

    def busy(self, component: str, start_ns: int, end_ns: int) -> float | None:
        """The component's activity during [start, end): running + runnable + blocked on its process's lock,
        over wall time, in [0, 1]."""
        split = self.split(component, start_ns, end_ns)
        return None if split is None else split.busy

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2.0)
        if self.helper is not None:
            self.helper.close()
            self.helper = None
