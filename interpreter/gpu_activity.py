"""Device-wide SM activity of one GPU, sampled in the background on the trace's clock.

Why: the optimizer ranks nodes by their time-weighted mean SM activity and looks for low-activity
windows (paper §4.3), so activity must be on the same clock as the ExecutionTrace and must be
*device-wide* (under MPS several processes share the GPU; per-process counters would miss the overlap).

Sources, best first:

* ``gpm``: NVML GPU Performance Monitoring, ``NVML_GPM_METRIC_SM_UTIL`` (percentage of SMs busy).
  GPM computes a metric *between two samples*, so every poll takes a new sample and reports the value
  over ``[previous poll, this poll)``; the first poll only primes.  Hopper and newer.
* ``utilization``: ``nvmlDeviceGetUtilizationRates().gpu``, the percentage of time a kernel ran over
  the driver's own trailing window (1/6 s to 1 s).  Coarse ("a kernel was running", not "SMs were
  busy"), but available on older GPUs.
* ``none``: no NVML / no GPU (CPU machines).  Nothing is sampled; means are ``None``.

Each sample is ``(t_start_ns, t_end_ns, value)`` with value in ``[0, 1]``.  The sampler takes an
``nvml`` object (default: the :mod:`pynvml` module), so the sampling logic runs on CPU against a fake.
``gpu_index`` is NVML's index, which is not CUDA's when ``CUDA_VISIBLE_DEVICES`` remaps devices.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

__all__ = [
    "GpuActivity",
    "ActivitySample",
    "ActivitySampler",
    "fraction_below",
    "mean_activity",
    "merge_intervals",
]


_MAX_MISSES = 25  # ~0.5 s of GPM polls without a value


class ActivitySample(NamedTuple):
    t_start_ns: int
    t_end_ns: int
    value: float  # 0..1


# --- time-weighted math (pure functions; the sampler's methods delegate here) ---------------------
def merge_intervals(intervals: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted union of half-open intervals; empty ones dropped.

    Overlapping invocations (split groups of one node) are merged so that a stretch of time counts once.
    """
    out: list[list[int]] = []
    for s, e in sorted((int(s), int(e)) for s, e in intervals if e > s):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def _weighted(samples: Sequence[ActivitySample], intervals: Iterable[tuple[int, int]],
              pred: Callable[[float], float]) -> tuple[float, int]:
    """Sum of pred(value) x overlap, and the total overlap, of samples with the union of intervals."""
    merged = merge_intervals(intervals)
    if not merged or not samples:
        return 0.0, 0
    ends = [s.t_end_ns for s in samples]  # samples are time-ordered and non-overlapping
    num, den = 0.0, 0
    for lo, hi in merged:
        k = bisect.bisect_right(ends, lo)
        while k < len(samples) and samples[k].t_start_ns < hi:
            smp = samples[k]
            ov = min(hi, smp.t_end_ns) - max(lo, smp.t_start_ns)
            if ov > 0:
                num += pred(smp.value) * ov
                den += ov
            k += 1
    return num, den


def mean_activity(samples: Sequence[ActivitySample], intervals: Iterable[tuple[int, int]]) -> float | None:
    """Time-weighted mean activity over the union of ``[start, end)`` intervals.

    A sample contributes in proportion to its overlap with the intervals; time not covered by any
    sample is left out (not counted as idle).  ``None`` when no sample overlaps.
    """
    num, den = _weighted(samples, intervals, lambda v: v)
    return num / den if den else None


def fraction_below(samples: Sequence[ActivitySample], threshold: float,
                   window: tuple[int, int] | None = None) -> float | None:
    """Fraction of the sampled time in ``window`` (default: all samples) with activity < threshold."""
    if not samples:
        return None
    if window is None:
        window = (samples[0].t_start_ns, samples[-1].t_end_ns)
    num, den = _weighted(samples, [window], lambda v: 1.0 if v < threshold else 0.0)
    return num / den if den else None


# --- readers over an NVML-like object -------------------------------------------------------------
class _GpmReader:
    """Two alternating GPM sample buffers; each poll reports SM_UTIL since the previous poll.

    GPM counters advance in steps of about 100 ms: over a 20 ms window SM_UTIL reads 0 during a
    full-GPU matmul, over 0.1-2 s windows it reads 93% (H200, benchmarks/results/gpm_probe.json). So GPM
    is polled no faster than `min_window_s`."""

    name = "gpm"
    min_window_s = 0.1

    def __init__(self, nvml: Any, handle: Any) -> None:
        self.nvml, self.handle = nvml, handle
        self.bufs = [nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc()]
        self.prev: Any = None  # the buffer holding the previous sample
        self.last_return: int | None = None  # the metric's own status of the last poll

    def prime(self) -> None:
        self.nvml.nvmlGpmSampleGet(self.handle, self.bufs[0])
        self.prev = self.bufs[0]

    def poll(self) -> float | None:
        cur = self.bufs[1] if self.prev is self.bufs[0] else self.bufs[0]
        self.nvml.nvmlGpmSampleGet(self.handle, cur)
        prev, self.prev = self.prev, cur
        if prev is None:
            return None
        mg = self.nvml.c_nvmlGpmMetricsGet_t()
        mg.version = self.nvml.NVML_GPM_METRICS_GET_VERSION
        mg.numMetrics = 1
        mg.sample1 = prev  # older
        mg.sample2 = cur  # newer
        mg.metrics[0].metricId = self.nvml.NVML_GPM_METRIC_SM_UTIL
        self.nvml.nvmlGpmMetricsGet(mg)
        self.last_return = int(mg.metrics[0].nvmlReturn)
        if self.last_return != getattr(self.nvml, "NVML_SUCCESS", 0):
            return None
        return float(mg.metrics[0].value) / 100.0

    def close(self) -> None:
        for b in self.bufs:
            try:
                self.nvml.nvmlGpmSampleFree(b)
            except Exception:  # noqa: BLE001 - freeing is best effort at shutdown
                pass


class _UtilReader:
    name = "utilization"
    min_window_s = 0.0

    def __init__(self, nvml: Any, handle: Any) -> None:
        self.nvml, self.handle = nvml, handle

    def prime(self) -> None:
        self.nvml.nvmlDeviceGetUtilizationRates(self.handle)

    def poll(self) -> float | None:
        return float(self.nvml.nvmlDeviceGetUtilizationRates(self.handle).gpu) / 100.0

    def close(self) -> None:
        pass


def _open_reader(nvml: Any, gpu_index: int, prefer: str) -> tuple[Any, str]:
    """Pick the best working source; returns (reader or None, reason for the choice)."""
    if nvml is None:
        try:
            import pynvml  # optional at import time
        except ImportError as e:
            return None, f"pynvml not importable ({e})"
        nvml = pynvml
    try:
        nvml.nvmlInit()
    except Exception as e:  # noqa: BLE001 - any NVML failure means "no GPU here"
        return None, f"NVML unavailable ({e}); no SM activity on this machine"
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(gpu_index)
    except Exception as e:  # noqa: BLE001 - a hardware probe: any failure means "not sampled", and says why
        _shutdown(nvml)
        return None, f"no GPU {gpu_index} ({e})"
    notes = []
    if prefer in ("auto", "gpm"):
        try:
            if not nvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice:
                raise RuntimeError("device does not support GPM")
            reader: Any = _GpmReader(nvml, handle)
            reader.prime()
            reader.poll()  # one full two-sample round trip, so a broken GPM is caught here
            if reader.last_return == getattr(nvml, "NVML_ERROR_NOT_SUPPORTED", 3):
                raise RuntimeError("SM_UTIL metric not supported")
            return reader, "NVML GPM SM_UTIL"
        except Exception as e:  # noqa: BLE001 - a probe (an old driver lacks GPM entirely): noted, the next source tried
            notes.append(f"GPM unavailable ({e})")
    if prefer in ("auto", "utilization"):
        try:
            reader = _UtilReader(nvml, handle)
            reader.prime()
            return reader, "; ".join(notes + ["NVML utilization rates (coarse: any kernel running)"])
        except Exception as e:  # noqa: BLE001 - a probe: noted, and activity is not sampled
            notes.append(f"utilization rates unavailable ({e})")
    _shutdown(nvml)
    return None, "; ".join(notes) or f"source {prefer!r} disabled"


def _shutdown(nvml: Any) -> None:
    try:
        nvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - releasing NVML after the sampler is done: nothing depends on it
        pass


class ActivitySampler:
    """Background sampler of one GPU's device-wide SM activity.

    ``source`` is ``"gpm"``, ``"utilization"`` or ``"none"`` after :meth:`start`; ``reason`` says why.
    :meth:`poll_once` runs one sampling step synchronously (what the thread does every ``interval_s``),
    which keeps the sampling logic testable without threads or a GPU.
    """

    def __init__(self, gpu_index: int = 0, *, interval_s: float = 0.02,
                 clock: Callable[[], int] = time.perf_counter_ns, nvml: Any = None,
                 prefer: str = "auto", max_samples: int | None = 1_000_000) -> None:
        if prefer not in ("auto", "gpm", "utilization", "none"):
            raise ValueError(f"prefer must be auto, gpm, utilization or none, not {prefer!r}")
        self.gpu_index = gpu_index
        self.interval_s = interval_s
        self.clock = clock
        self.source = "none"
        self.reason = "not started"
        self.errors = 0
        self._nvml = nvml
        self.prefer = prefer
        self._reader: Any = None
        self._samples: deque[ActivitySample] = deque(maxlen=max_samples)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t_prev: int | None = None
        self._misses = 0

    # --- lifecycle -------------------------------------------------------------------------------
    def open(self) -> str:
        """Choose the source (without starting the thread); returns it."""
        if self._reader is None and self.reason == "not started":
            if self.prefer == "none":
                self.reason = "disabled"
            else:
                self._reader, self.reason = _open_reader(self._nvml, self.gpu_index, self.prefer)
            self.source = self._reader.name if self._reader is not None else "none"
        return self.source

    def start(self) -> ActivitySampler:
        if self.open() == "none" or (self._thread is not None and self._thread.is_alive()):
            return self
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=f"rose-sm-activity-{self.gpu_index}",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def close(self) -> None:
        """Stop and release NVML (samples stay readable)."""
        self.stop()
        if self._reader is not None:
            self._reader.close()
            _shutdown(self._reader.nvml)
            self._reader = None

    def __enter__(self) -> ActivitySampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- sampling --------------------------------------------------------------------------------
    def poll_once(self) -> ActivitySample | None:
        """Take one sample; returns the new ``(t_start, t_end, value)`` or None (priming / error).

        A raised NVML error drops the interval and re-primes, so one transient failure never makes a
        later sample span the wrong interval.  A GPM source that yields no value for
        ``_MAX_MISSES`` polls in a row is replaced by the utilization fallback.
        """
        if self._reader is None:
            return None
        t0 = self.clock()
        try:
            if self._t_prev is None:
                self._reader.prime()
                value = None
            else:
                value = self._reader.poll()
        except Exception:  # noqa: BLE001 - a transient NVML error drops one interval, not the run
            self.errors += 1
            self._t_prev = None
            return None
        t = (t0 + self.clock()) // 2  # the sample was taken somewhere inside the call
        t_prev, self._t_prev = self._t_prev, t
        if t_prev is None:
            return None
        if value is None or t <= t_prev:
            self._misses += 1
            if self._misses >= _MAX_MISSES and isinstance(self._reader, _GpmReader):
                self._fall_back()
            return None
        self._misses = 0
        smp = ActivitySample(t_prev, t, min(1.0, max(0.0, value)))
        with self._lock:
            self._samples.append(smp)
        return smp

    def _fall_back(self) -> None:
        old = self._reader
        reader = _UtilReader(old.nvml, old.handle)
        try:
            reader.prime()
        except Exception as e:  # noqa: BLE001 - a probe: the reason is recorded, sampling keeps what it had
            self.reason += f"; GPM gave no values and utilization rates failed ({e})"
            return
        old.close()
        self._reader, self.source, self._t_prev, self._misses = reader, reader.name, None, 0
        self.reason += (f"; GPM gave no SM_UTIL value for {_MAX_MISSES} polls (status "
                        f"{old.last_return}): switched to NVML utilization rates")

    def _run(self) -> None:
        self._loop(self._stop.wait)

    def _loop(self, wait: Callable[[float], bool]) -> None:
        """Poll until ``wait(seconds)`` returns True (stop was asked).

        Each poll starts at least ``interval`` after the previous sample's time, on the sampler's own
        clock, so no window is shorter than GPM's step even after a late poll. (A fixed-rate schedule
        catches up after a late poll with a short window, which GPM reads as 0 under full load.) A poll
        that failed is retried ``interval`` later, never in a tight loop.
        """
        interval_ns = int(max(self.interval_s, getattr(self._reader, "min_window_s", 0.0)) * 1e9)
        while True:
            self.poll_once()
            due = (self._t_prev if self._t_prev is not None else self.clock()) + interval_ns
            while True:  # (a wait may return early: wait again until due)
                if wait(max(0, due - self.clock()) / 1e9):
                    return
                if self.clock() >= due:
                    break

    # --- queries ---------------------------------------------------------------------------------
    def samples(self, since_ns: int | None = None) -> list[ActivitySample]:
        with self._lock:
            out = list(self._samples)
        if since_ns is not None:
            out = [s for s in out if s.t_end_ns > since_ns]
        return out

    def mean_activity(self, intervals: Iterable[tuple[int, int]]) -> float | None:
        return mean_activity(self.samples(), intervals)

    def fraction_below(self, threshold: float, window: tuple[int, int] | None = None) -> float | None:
        return fraction_below(self.samples(), threshold, window)


class GpuActivity:
    """SM activity of every GPU a run uses: one `ActivitySampler` per GPU (NVML index), on one clock.

    `mean_activity(intervals)` is the mean over the GPUs that reported (a run's device-wide activity on
    several GPUs); `mean_activity(intervals, gpu=i)` one GPU's, which is what a node running on GPU i
    is charged with."""

    def __init__(self, samplers: dict[int, ActivitySampler]) -> None:
        self.per_gpu = dict(samplers)

    @classmethod
    def open_all(cls, count: int, **kwargs: Any) -> GpuActivity:
        """Start a sampler on GPUs 0..count-1 (those that fail to open are left out)."""
        samplers = {}
        for i in range(max(1, count)):
            sampler = ActivitySampler(i, **kwargs)
            try:
                sampler.open()
                sampler.start()
            except Exception:  # noqa: BLE001 - no NVML / no such GPU: not sampled
                continue
            samplers[i] = sampler
        return cls(samplers)

    def mean_activity(self, intervals: Iterable[tuple[int, int]], gpu: int | None = None) -> float | None:
        intervals = list(intervals)
        if gpu is not None:
            sampler = self.per_gpu.get(gpu)
            return sampler.mean_activity(intervals) if sampler is not None else None
        values = [v for v in (s.mean_activity(intervals) for s in self.per_gpu.values()) if v is not None]
        return sum(values) / len(values) if values else None

    def samples_by_gpu(self) -> dict[int, list[ActivitySample]]:
        return {i: s.samples() for i, s in self.per_gpu.items()}

    def close(self) -> None:
        for sampler in self.per_gpu.values():
            sampler.close()
