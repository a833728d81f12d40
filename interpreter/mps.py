"""NVIDIA MPS control: the daemon's lifetime, client environments and SM quota levels.

Why MPS (paper App. A): a per-process SM quota (``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``) constrains
every CUDA context of a worker, including simulators that create their own; it is fixed for the
client's lifetime, so a quota change means a new worker process.

Degradation: on a machine without the control binary, without an NVIDIA driver/GPU, or where the
daemon cannot be started, nothing here raises.  :class:`MpsDaemon` then has ``active == False`` and a
``warning`` saying why, and :meth:`MpsDaemon.client_env` returns ``{}``: components run without quotas.

Ownership: rose starts the control daemon with its pipe and log directories in a temporary directory
under the run directory (or under the system temp dir when the run dir's path is too long for Unix
sockets), and stops it (``quit``) on exit, on SIGTERM/SIGHUP and at interpreter exit.
An already running daemon is reused and left running, unless it is a rose daemon whose owner process
has died (then it is adopted and stopped at the end, so crashed runs leave nothing behind).
"""

from __future__ import annotations

import atexit
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .procs import pid_alive

__all__ = [
    "CONTROL_BINARY",
    "MpsAvailability",
    "MpsDaemon",
    "MpsError",
    "detect_mps",
    "expected_sms",
    "find_running_daemon",
    "probe_sm_count",
    "quota_levels",
]

CONTROL_BINARY = "nvidia-cuda-mps-control"
_DEFAULT_PIPE_DIR = "/tmp/nvidia-mps"
_OWNER_FILE = "rose-owner.json"
_MAX_BASE_LEN = 60  # + "/rose-mps-xxxxxxxx/pipe/" + socket names stays well under 107 bytes


class MpsError(RuntimeError):
    """A GPU-only measurement (:func:`probe_sm_count`) failed; carries the child's message."""


@dataclass(frozen=True)
class MpsAvailability:
    available: bool
    reason: str
    binary: str | None = None
    running_pid: int | None = None  # a control daemon already running (reuse it)
    running_pipe_dir: str | None = None


# --- detection -------------------------------------------------------------------------------------
def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def _environ(pid: int) -> dict[str, str] | None:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    env = {}
    for item in raw.split(b"\0"):
        k, sep, v = item.decode(errors="replace").partition("=")
        if sep:
            env[k] = v
    return env


def find_running_daemon(binary_name: str = CONTROL_BINARY,
                        pipe_dir: str | None = None) -> tuple[int, str] | None:
    """``(pid, pipe dir)`` of a running control daemon (``<binary> -d``), found through /proc.

    The pipe directory comes from the daemon's environment (default ``/tmp/nvidia-mps``); when that
    is unreadable (another user's daemon) the default is assumed.  ``pipe_dir`` filters.
    """
    name = os.path.basename(binary_name)
    try:
        entries = os.listdir("/proc")
    except OSError:  # not Linux
        return None
    for entry in entries:
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        argv = _cmdline(int(entry))
        # argv[0] for the real binary; argv[1] when it is a script run through an interpreter
        if "-d" in argv[1:] and any(os.path.basename(a) == name for a in argv[:2]):
            env = _environ(int(entry)) or {}
            found = env.get("CUDA_MPS_PIPE_DIRECTORY", _DEFAULT_PIPE_DIR)
            if pipe_dir is None or os.path.realpath(found) == os.path.realpath(pipe_dir):
                return int(entry), found
    return None


def detect_mps(binary: str | None = None, nvml: Any = None) -> MpsAvailability:
    """Can rose use MPS here?  Never raises; ``reason`` explains a ``False``.

    Checks, in order: the control binary on PATH (or ``binary``), an NVIDIA driver with at least one
    GPU (NVML), a compute mode that allows compute, then whether a daemon already runs (reuse it).
    Permission problems that only show when starting the daemon are reported by :class:`MpsDaemon`.
    """
    path = binary or shutil.which(CONTROL_BINARY)
    if path is None or not os.path.isfile(path):
        return MpsAvailability(False, f"MPS unavailable: no {CONTROL_BINARY} binary on PATH")
    if not os.access(path, os.X_OK):
        return MpsAvailability(False, f"MPS unavailable: {path} is not executable (not permitted)", path)
    if nvml is None:
        try:
            import pynvml
        except ImportError as e:
            return MpsAvailability(False, f"MPS unavailable: pynvml not importable ({e})", path)
        nvml = pynvml
    try:
        nvml.nvmlInit()
    except Exception as e:  # noqa: BLE001 - any NVML failure means no usable driver/GPU
        return MpsAvailability(False, f"MPS unavailable: no NVIDIA GPU/driver (NVML: {e})", path)
    try:
        count = nvml.nvmlDeviceGetCount()
        if count < 1:
            return MpsAvailability(False, "MPS unavailable: NVML sees no GPU", path)
        prohibited = getattr(nvml, "NVML_COMPUTEMODE_PROHIBITED", 2)
        for i in range(count):
            try:
                mode = nvml.nvmlDeviceGetComputeMode(nvml.nvmlDeviceGetHandleByIndex(i))
            except Exception:  # noqa: BLE001 - unknown mode: let the daemon decide
                continue
            if mode == prohibited:
                return MpsAvailability(False, f"MPS unavailable: GPU {i} compute mode is PROHIBITED", path)
    except Exception as e:  # noqa: BLE001 - a hardware probe: any failure means "no MPS here", and says why
        return MpsAvailability(False, f"MPS unavailable: NVML query failed ({e})", path)
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001 - the probe's answer is known; a failing NVML shutdown changes nothing
            pass
    running = find_running_daemon(path)
    if running is not None:
        pid, pipe = running
        return MpsAvailability(True, f"MPS control daemon already running (pid {pid}, pipe dir {pipe}); "
                               "reusing it", path, pid, pipe)
    return MpsAvailability(True, "MPS available", path)


# --- quota levels ----------------------------------------------------------------------------------
def expected_sms(percent: float, total_sms: int, granularity: int = 2) -> int:
    """SMs a client sees under ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=percent``.

    Rounded *down* to the allocation granularity (2 SMs, one TPC, on Hopper/Ampere: App. A), at least
    one granule.  Fits the H200 measurements exactly: 10%->12, 25%->32, 50%->66, 91%->120 of 132 SMs
    (rounding up or to nearest would give 14 at 10%).  :func:`probe_sm_count` is the ground truth.
    """
    if not 0 < percent <= 100:
        raise ValueError(f"MPS quota must be in (0, 100], got {percent}")
    if total_sms < granularity:
        return total_sms
    raw = math.floor(percent * total_sms / 100 + 1e-9)
    return min(total_sms, max(granularity, raw // granularity * granularity))


def quota_levels(sm_count: int, granularity: int = 2) -> dict[int, int]:
    """Percent 1..100 -> effective SM count.  Consecutive equal values show equivalent quotas, so a
    quota search only needs the smallest percent of each distinct count."""
    return {p: expected_sms(p, sm_count, granularity) for p in range(1, 101)}


_PROBE = "import torch; print(torch.cuda.get_device_properties(0).multi_processor_count)"


def probe_sm_count(percent: int | None, env: dict[str, str] | None = None,
                   timeout_s: float = 180.0, python: str = sys.executable) -> int:
    """SM count seen by a *fresh* CUDA client under the quota (GPU only; raises :class:`MpsError`).

    ``env`` should be :meth:`MpsDaemon.client_env` (the pipe directory); the quota only binds when a
    daemon serves the client.
    """
    child_env = dict(os.environ)
    child_env.pop("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", None)
    child_env.update(env or {})
    if percent is not None:
        child_env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(int(percent))
    try:
        proc = subprocess.run([python, "-c", _PROBE], env=child_env, capture_output=True, text=True,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise MpsError(f"SM-count probe at {percent}% timed out after {timeout_s:.0f} s") from None
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines or not lines[-1].isdigit():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise MpsError(f"SM-count probe at {percent}% failed (exit {proc.returncode}): {' | '.join(tail)}")
    return int(lines[-1])


# --- the daemon ------------------------------------------------------------------------------------
_pid_alive = pid_alive  # kept under the old name for the tests' monkeypatching


class MpsDaemon:
    """Context manager owning (or reusing) the MPS control daemon for a run.

    ``with MpsDaemon(run_dir) as mps: env = mps.client_env(75)``.  After entry, ``active`` says whether
    quotas work, ``owned`` whether this object will stop the daemon, ``warning`` why MPS is off.
    """

    def __init__(self, base_dir: str | os.PathLike[str] | None = None, *, binary: str | None = None,
                 nvml: Any = None, start_timeout_s: float = 15.0, handle_signals: bool = True) -> None:
        self.base_dir = Path(base_dir) if base_dir is not None else Path(tempfile.gettempdir())
        self.start_timeout_s = start_timeout_s
        self.handle_signals = handle_signals
        self.active = False
        self.owned = False
        self.warning: str | None = None
        self.availability: MpsAvailability | None = None
        self.pipe_dir: str | None = None
        self.log_dir: str | None = None
        self.pid: int | None = None
        self._binary = binary
        self._nvml = nvml
        self._root: Path | None = None
        self._old_handlers: dict[int, Any] = {}
        self._lock = threading.RLock()  # re-entrant: a signal may arrive inside stop()

    # --- control commands ------------------------------------------------------------------------
    def _daemon_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["CUDA_MPS_PIPE_DIRECTORY"] = self.pipe_dir or _DEFAULT_PIPE_DIR
        if self.log_dir:
            env["CUDA_MPS_LOG_DIRECTORY"] = self.log_dir
        return env

    def command(self, cmd: str, timeout_s: float = 5.0) -> tuple[int, str]:
        """Send one control command (``echo cmd | nvidia-cuda-mps-control``); ``(rc, output)``."""
        if self.availability is None or self.availability.binary is None:
            return 1, "MPS control binary not known (start() not called or MPS unavailable)"
        try:
            p = subprocess.run([self.availability.binary], input=cmd + "\n", env=self._daemon_env(),
                               capture_output=True, text=True, timeout=timeout_s)
        except (subprocess.TimeoutExpired, OSError) as e:
            return 1, str(e)
        return p.returncode, (p.stdout + p.stderr).strip()

    def _answers(self) -> bool:
        rc, out = self.command("get_server_list", timeout_s=2.0)
        return rc == 0 and "cannot find" not in out.lower()

    # --- lifecycle -------------------------------------------------------------------------------
    def start(self) -> MpsDaemon:
        """Start or reuse the daemon; on any failure, stop what was started and disable quotas."""
        try:
            return self._start()
        except Exception as e:  # noqa: BLE001 - MPS trouble must never stop a run: it runs without quotas
            self.stop()
            self._remove_root()
            return self._disable(f"MPS unavailable: {type(e).__name__}: {e}")

    def _start(self) -> MpsDaemon:
        av = self.availability = detect_mps(self._binary, self._nvml)
        if not av.available:
            return self._disable(av.reason)
        if av.running_pid is not None:
            self.pipe_dir, self.pid = av.running_pipe_dir, av.running_pid
            owner = self._dead_rose_owner(Path(self.pipe_dir or _DEFAULT_PIPE_DIR))
            if owner is not None:  # left behind by a killed rose run: adopt it, stop it at exit
                self._root, self.owned = owner, True
                self._write_owner()
                self._install_cleanup()
            self.active = True
            return self
        self.base_dir.mkdir(parents=True, exist_ok=True)
        # The daemon's pipe dir holds Unix sockets, whose paths are limited to 107 bytes: a deep run
        # dir falls back to a short private dir in the system temp dir (removed the same way).
        parent = self.base_dir if len(str(self.base_dir.resolve())) <= _MAX_BASE_LEN else None
        self._root = Path(tempfile.mkdtemp(prefix="rose-mps-", dir=parent))
        self.pipe_dir, self.log_dir = str(self._root / "pipe"), str(self._root / "log")
        os.makedirs(self.pipe_dir)
        os.makedirs(self.log_dir)
        self._write_owner()
        out_path = self._root / "start.out"
        with open(out_path, "w") as out:  # a file, not a pipe: the forked daemon may keep fds open
            try:
                rc = subprocess.run([str(av.binary), "-d"], env=self._daemon_env(), stdout=out, stderr=out,
                                    stdin=subprocess.DEVNULL, start_new_session=True, timeout=30).returncode
                err = ""
            except (subprocess.TimeoutExpired, OSError) as e:
                rc, err = -1, str(e)
        out_text = err or out_path.read_text(errors="replace").strip()
        if rc != 0:
            self._remove_root()
            return self._disable(f"MPS unavailable: `{CONTROL_BINARY} -d` failed (exit {rc}, "
                                 f"not permitted?): {out_text or 'no output'}")
        self.owned = True
        self._install_cleanup()
        deadline = time.monotonic() + self.start_timeout_s
        while not self._answers():
            if time.monotonic() > deadline:
                log = Path(self.log_dir) / "control.log"
                tail = log.read_text(errors="replace").strip().splitlines()[-2:] if log.exists() else []
                self.stop()
                return self._disable(f"MPS unavailable: control daemon did not answer within "
                                     f"{self.start_timeout_s:.0f} s (control.log: {' | '.join(tail) or 'empty'})")
            time.sleep(0.05)
        found = find_running_daemon(str(av.binary), self.pipe_dir)
        self.pid = found[0] if found else None
        self.active = True
        return self

    def _disable(self, reason: str) -> MpsDaemon:
        self.active, self.owned, self.warning = False, False, f"{reason}; running without SM quotas"
        return self

    def _write_owner(self) -> None:
        assert self._root is not None
        (self._root / _OWNER_FILE).write_text(json.dumps({"pid": os.getpid()}))

    @staticmethod
    def _dead_rose_owner(pipe_dir: Path) -> Path | None:
        root = pipe_dir.parent
        try:
            owner = json.loads((root / _OWNER_FILE).read_text())["pid"]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return root if isinstance(owner, int) and not _pid_alive(owner) else None

    def _install_cleanup(self) -> None:
        atexit.register(self.stop)
        if self._root is not None and self.availability is not None and self.availability.binary:
            # a SIGKILLed driver runs no atexit: a watcher process stops the daemon then
            from .reaper import start_mps_reaper

            start_mps_reaper(str(self.availability.binary), self.pipe_dir or _DEFAULT_PIPE_DIR, str(self._root))
        if not self.handle_signals or threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGTERM, signal.SIGHUP):
            self._old_handlers[sig] = signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.stop()
        old = self._old_handlers.get(signum, signal.SIG_DFL)
        if callable(old):
            old(signum, frame)
        elif old != signal.SIG_IGN:  # SIG_DFL: die of the same signal, as without us
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    def stop(self) -> None:
        """Quit the daemon if this object owns it; idempotent, never raises."""
        with self._lock:
            if self.owned:
                self.owned = False
                self._quit()
                self._remove_root()
            self.active = False
            atexit.unregister(self.stop)
            for sig, old in self._old_handlers.items():
                try:
                    if signal.getsignal(sig) == self._on_signal:
                        signal.signal(sig, old)
                except (ValueError, TypeError):  # not the main thread
                    pass
            self._old_handlers.clear()

    def _quit(self) -> None:
        self.command("quit", timeout_s=10.0)
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            if self.pid is not None and not _pid_alive(self.pid):
                return
            if self.pid is None and not self._answers():
                return
            time.sleep(0.05)
        if self.pid is not None:  # it ignored quit: it is ours, end it by pid
            try:
                os.kill(self.pid, signal.SIGTERM)
            except OSError:
                pass

    def _remove_root(self) -> None:
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None

    def __enter__(self) -> MpsDaemon:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- clients ---------------------------------------------------------------------------------
    def client_env(self, quota_percent: int | None, priority: int | None = None) -> dict[str, str]:
        """Env vars for a worker (Ray ``runtime_env={"env_vars": ...}``); ``{}`` when MPS is off.

        ``None`` means no quota (all SMs) and the normal priority.  ``priority`` 1 is MPS's "below
        normal" (``CUDA_MPS_CLIENT_PRIORITY``): the client's kernels are scheduled after those of
        normal-priority clients.  Both must be set before the worker initialises CUDA.
        """
        if quota_percent is not None and not 0 < quota_percent <= 100:
            raise ValueError(f"MPS quota must be in 1..100 percent, got {quota_percent}")
        if priority is not None and priority not in (0, 1):
            raise ValueError(f"MPS client priority must be 0 (normal) or 1 (below normal), got {priority}")
        if not self.active:
            return {}
        env = {"CUDA_MPS_PIPE_DIRECTORY": self.pipe_dir or _DEFAULT_PIPE_DIR}
        if quota_percent is not None:
            env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(int(quota_percent))
        if priority:
            env["CUDA_MPS_CLIENT_PRIORITY"] = str(int(priority))
        return env
