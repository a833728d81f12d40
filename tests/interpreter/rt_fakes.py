"""CPU stand-ins for NVML and for the MPS control binary, used by the runtime tests."""

from __future__ import annotations

import ctypes
import os
import sys
import uuid
from pathlib import Path
from types import SimpleNamespace

import pynvml


class FakeClock:
    """A clock the test moves by hand (ns)."""

    def __init__(self, start: int = 1_000_000_000) -> None:
        self.now = start

    def __call__(self) -> int:
        return self.now

    def advance(self, ns: int) -> None:
        self.now += ns


class FakeNvml:
    """Enough of pynvml for the sampler and detect_mps, over a scripted device.

    ``activity(t_ns) -> 0..1`` is piecewise constant on segments ``[(t_from, value), ...]``; GPM samples
    carry the cumulative busy time, so SM_UTIL between two samples is the exact mean in between, as
    on hardware.  GPM structs and sample handles are pynvml's real ctypes types, so a wrong field name
    or handle type in the sampler fails here too.
    """

    NVML_SUCCESS = pynvml.NVML_SUCCESS
    NVML_GPM_METRICS_GET_VERSION = pynvml.NVML_GPM_METRICS_GET_VERSION
    NVML_GPM_METRIC_SM_UTIL = pynvml.NVML_GPM_METRIC_SM_UTIL
    NVML_COMPUTEMODE_PROHIBITED = pynvml.NVML_COMPUTEMODE_PROHIBITED
    c_nvmlGpmMetricsGet_t = pynvml.c_nvmlGpmMetricsGet_t

    def __init__(self, clock, segments=((0, 0.0),), *, init_ok=True, gpm=True, gpm_metric_fails=False,
                 gpm_metric_status=None,
                 util=True, count=1, compute_mode=0):
        self.clock, self.segments = clock, sorted(segments)
        self.init_ok, self.gpm, self.gpm_metric_fails, self.util = init_ok, gpm, gpm_metric_fails, util
        self.gpm_metric_status = gpm_metric_status  # a per-metric error code to report, if any
        self.count, self.compute_mode = count, compute_mode
        self.samples: dict[int, tuple[int, float] | None] = {}
        self.fail_next_sample_get = 0
        self.inits = 0
        self.metric_calls: list[tuple[int, int]] = []

    # activity model
    def busy(self, t: int) -> float:
        """Integral of activity over [0, t] (ns)."""
        total, segs = 0.0, list(self.segments) + [(float("inf"), 0.0)]
        for (a, v), (b, _) in zip(segs, segs[1:], strict=False):
            if t <= a:
                break
            total += v * (min(t, b) - a)
        return total

    def level(self, t: int) -> float:
        cur = 0.0
        for a, v in self.segments:
            if a <= t:
                cur = v
        return cur

    # NVML surface
    def nvmlInit(self):
        if not self.init_ok:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
        self.inits += 1

    def nvmlShutdown(self):
        self.inits -= 1

    def nvmlDeviceGetCount(self):
        return self.count

    def nvmlDeviceGetHandleByIndex(self, i):
        if i >= self.count:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return SimpleNamespace(index=i)

    def nvmlDeviceGetComputeMode(self, handle):
        return self.compute_mode

    def nvmlGpmQueryDeviceSupport(self, handle):
        return SimpleNamespace(isSupportedDevice=1 if self.gpm else 0)

    def nvmlGpmSampleAlloc(self):
        addr = 0x1000 * (len(self.samples) + 1)
        self.samples[addr] = None
        return ctypes.cast(ctypes.c_void_p(addr), pynvml.c_nvmlGpmSample_t)

    def nvmlGpmSampleFree(self, s):
        self.samples.pop(ctypes.cast(s, ctypes.c_void_p).value, None)

    def nvmlGpmSampleGet(self, handle, s):
        if self.fail_next_sample_get:
            self.fail_next_sample_get -= 1
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)
        t = self.clock()
        self.samples[ctypes.cast(s, ctypes.c_void_p).value] = (t, self.busy(t))
        return s

    def nvmlGpmMetricsGet(self, mg):
        assert mg.version == self.NVML_GPM_METRICS_GET_VERSION and mg.numMetrics == 1
        a = self.samples[ctypes.cast(mg.sample1, ctypes.c_void_p).value]
        b = self.samples[ctypes.cast(mg.sample2, ctypes.c_void_p).value]
        self.metric_calls.append((a[0], b[0]))
        m = mg.metrics[0]
        assert m.metricId == self.NVML_GPM_METRIC_SM_UTIL
        if self.gpm_metric_fails:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if self.gpm_metric_status is not None:
            m.nvmlReturn = self.gpm_metric_status
            return mg
        if b[0] <= a[0]:  # sample1 must be the older one
            m.nvmlReturn = pynvml.NVML_ERROR_INVALID_ARGUMENT
            return mg
        m.nvmlReturn = pynvml.NVML_SUCCESS
        m.value = 100.0 * (b[1] - a[1]) / (b[0] - a[0])
        return mg

    def nvmlDeviceGetUtilizationRates(self, handle):
        if not self.util:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(gpu=int(round(100 * self.level(self.clock()))), memory=0)


_FAKE_MPS = r'''#!{python}
"""Fake nvidia-cuda-mps-control: `-d` forks a daemon serving a Unix socket; otherwise a client."""
import os, socket, sys
pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
path = os.path.join(pipe, "control")
FAIL = {fail!r}

def send(cmd):
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(5)
    s.connect(path)
    s.sendall(cmd.encode())
    s.shutdown(socket.SHUT_WR)
    out = b""
    while chunk := s.recv(4096):
        out += chunk
    return out.decode()

if "-d" in sys.argv[1:]:
    if FAIL == "SILENT":  # claims success but starts nothing
        sys.exit(0)
    if FAIL:
        print(FAIL, file=sys.stderr)
        sys.exit(1)
    if os.path.exists(path):
        try:
            send("get_server_list")
            print("An instance of this daemon is already running", file=sys.stderr)
            sys.exit(1)
        except OSError:
            os.unlink(path)
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(path)
    srv.listen(8)
    if os.fork():
        sys.exit(0)
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    while True:
        conn, _ = srv.accept()
        data = b""
        while chunk := conn.recv(4096):
            data += chunk
        cmd = data.decode().strip()
        if cmd == "quit":
            conn.close()
            os.unlink(path)
            os._exit(0)
        conn.sendall(b"" if cmd == "get_server_list" else b"ok")
        conn.close()
else:
    try:
        print(send(sys.stdin.read()))
    except OSError:
        print("Cannot find MPS control daemon process", file=sys.stderr)
        sys.exit(1)
'''


def make_fake_mps_binary(directory: Path, fail: str | None = None) -> Path:
    """Write a fake control binary with a unique name (so process scans of one test see only its own)."""
    path = Path(directory) / f"fake-mps-control-{uuid.uuid4().hex[:8]}"
    path.write_text(_FAKE_MPS.format(python=sys.executable, fail=fail))
    path.chmod(0o755)
    return path


def quit_fake_daemon(binary: Path, pipe_dir: str) -> None:
    os.system(f"echo quit | CUDA_MPS_PIPE_DIRECTORY={pipe_dir} {binary} >/dev/null 2>&1")
