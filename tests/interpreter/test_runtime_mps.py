"""MPS control on CPU: detection, degradation, and the daemon lifecycle against a fake control binary."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
import torch

from interpreter.mps import (
    MpsDaemon,
    detect_mps,
    expected_sms,
    find_running_daemon,
    probe_sm_count,
    quota_levels,
)
from tests.interpreter.rt_fakes import FakeClock, FakeNvml, make_fake_mps_binary, quit_fake_daemon

ROOT = Path(__file__).resolve().parents[2]
GPU = pytest.mark.gpu
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")


@pytest.fixture
def short_tmp():
    """A short directory: Unix socket paths (the MPS pipe dir) are limited to 107 bytes."""
    d = Path(tempfile.mkdtemp(prefix="rt-", dir="/tmp"))
    yield d
    subprocess.run(["rm", "-rf", str(d)], check=False)


@pytest.fixture
def gpu_nvml():
    return FakeNvml(FakeClock())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie child of ours counts as gone
    stat = Path(f"/proc/{pid}/stat").read_text() if Path(f"/proc/{pid}/stat").exists() else ""
    return " Z " not in stat


def _wait_gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return False


# --- quota levels ------------------------------------------------------------------------------------
def test_expected_sms_fits_the_h200_measurements():
    assert [expected_sms(p, 132) for p in (10, 25, 50, 91)] == [12, 32, 66, 120]
    assert expected_sms(100, 132) == 132 and expected_sms(1, 132) == 2  # at least one TPC
    levels = quota_levels(132)
    assert list(levels) == list(range(1, 101))
    assert all(v % 2 == 0 for v in levels.values())
    assert list(levels.values()) == sorted(levels.values())  # monotone
    assert len(set(levels.values())) == 66  # 2, 4, ..., 132
    with pytest.raises(ValueError):
        expected_sms(0, 132)


# --- detection and degradation ---------------------------------------------------------------------
def test_no_binary(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    av = detect_mps()
    assert not av.available and "no nvidia-cuda-mps-control binary" in av.reason


def test_no_gpu_driver(short_tmp):
    binary = make_fake_mps_binary(short_tmp)
    av = detect_mps(str(binary), nvml=FakeNvml(FakeClock(), init_ok=False))
    assert not av.available and "no NVIDIA GPU/driver" in av.reason


def test_not_executable_and_prohibited(short_tmp, gpu_nvml):
    binary = make_fake_mps_binary(short_tmp)
    binary.chmod(0o644)
    assert "not permitted" in detect_mps(str(binary), gpu_nvml).reason
    binary.chmod(0o755)
    av = detect_mps(str(binary), FakeNvml(FakeClock(), compute_mode=2))
    assert not av.available and "PROHIBITED" in av.reason
    assert detect_mps(str(binary), FakeNvml(FakeClock(), count=0)).available is False
    assert detect_mps(str(binary), gpu_nvml).available


def test_this_cpu_machine_degrades_without_exception(tmp_path):
    with MpsDaemon(tmp_path) as mps:
        if torch.cuda.is_available():
            pytest.skip("a GPU machine: degradation is tested with fakes")
        assert not mps.active and not mps.owned
        assert "running without SM quotas" in mps.warning
        assert mps.client_env(50) == {} and mps.client_env(None) == {}
    assert list(tmp_path.iterdir()) == []


def test_start_failure_degrades(short_tmp, gpu_nvml):
    binary = make_fake_mps_binary(short_tmp, fail="permission denied: cannot create pipe")
    with MpsDaemon(short_tmp / "run", binary=str(binary), nvml=gpu_nvml) as mps:
        assert not mps.active
        assert "not permitted" in mps.warning and "permission denied" in mps.warning
        assert mps.client_env(30) == {}
    assert list((short_tmp / "run").iterdir()) == []  # the owned dir was removed


def test_daemon_that_never_answers_degrades(short_tmp, gpu_nvml):
    binary = make_fake_mps_binary(short_tmp, fail="SILENT")
    with MpsDaemon(short_tmp / "run", binary=str(binary), nvml=gpu_nvml, start_timeout_s=0.5) as mps:
        assert not mps.active and not mps.owned and "did not answer" in mps.warning
    assert list((short_tmp / "run").iterdir()) == []


def test_unwritable_run_dir_degrades(short_tmp, gpu_nvml):
    binary = make_fake_mps_binary(short_tmp)
    blocker = short_tmp / "file"
    blocker.write_text("not a directory")
    with MpsDaemon(blocker / "run", binary=str(binary), nvml=gpu_nvml) as mps:
        assert not mps.active and "running without SM quotas" in mps.warning
        assert mps.client_env(50) == {}


# --- lifecycle with the fake daemon ----------------------------------------------------------------
def test_start_client_env_and_stop(short_tmp, gpu_nvml):
    binary = make_fake_mps_binary(short_tmp)
    run_dir = short_tmp / "run"
    with MpsDaemon(run_dir, binary=str(binary), nvml=gpu_nvml) as mps:
        assert mps.active and mps.owned and mps.warning is None
        assert Path(mps.pipe_dir).parent.parent == run_dir  # owned by the run
        assert Path(mps.log_dir).is_dir() and Path(mps.log_dir).parent == Path(mps.pipe_dir).parent
        assert mps.pid is not None and _alive(mps.pid)
        assert find_running_daemon(str(binary), mps.pipe_dir) == (mps.pid, mps.pipe_dir)
        assert mps.command("get_server_list")[0] == 0
        assert mps.client_env(75) == {"CUDA_MPS_PIPE_DIRECTORY": mps.pipe_dir,
                                      "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "75"}
        assert mps.client_env(None) == {"CUDA_MPS_PIPE_DIRECTORY": mps.pipe_dir}
        # a client priority: below normal is 1; normal (0) is MPS's default and sets nothing
        assert mps.client_env(None, 1) == {"CUDA_MPS_PIPE_DIRECTORY": mps.pipe_dir, "CUDA_MPS_CLIENT_PRIORITY": "1"}
        assert mps.client_env(75, 0) == mps.client_env(75)
        with pytest.raises(ValueError):
            mps.client_env(0)
        with pytest.raises(ValueError):
            mps.client_env(None, 2)
        pid = mps.pid
    assert _wait_gone(pid)
    assert not mps.active and list(run_dir.iterdir()) == []
    mps.stop()  # idempotent


def test_long_run_dir_puts_the_pipe_dir_somewhere_short(short_tmp, gpu_nvml):
    binary = make_fake_mps_binary(short_tmp)
    deep = short_tmp / ("d" * 60) / ("e" * 60)
    with MpsDaemon(deep, binary=str(binary), nvml=gpu_nvml) as mps:
        assert mps.active and len(os.path.join(mps.pipe_dir, "control")) < 100
        pid = mps.pid
    assert _wait_gone(pid)
    assert not Path(mps.pipe_dir).exists()


def test_reuses_a_running_daemon_without_stopping_it(short_tmp, gpu_nvml):
    binary = make_fake_mps_binary(short_tmp)
    pipe = short_tmp / "theirs"
    pipe.mkdir()
    env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=str(pipe))
    subprocess.run([str(binary), "-d"], env=env, check=True)
    try:
        pid, found_pipe = find_running_daemon(str(binary))
        with MpsDaemon(short_tmp / "run", binary=str(binary), nvml=gpu_nvml) as mps:
            assert mps.active and not mps.owned and mps.pipe_dir == str(pipe)
            assert "already running" in mps.availability.reason
            assert mps.client_env(40)["CUDA_MPS_PIPE_DIRECTORY"] == str(pipe)
        assert _alive(pid)  # not ours: left running
    finally:
        quit_fake_daemon(binary, str(pipe))
    assert _wait_gone(pid)


def test_adopts_the_daemon_of_a_dead_rose_run(short_tmp, gpu_nvml):
    binary = make_fake_mps_binary(short_tmp)
    root = short_tmp / "rose-mps-old"
    (root / "pipe").mkdir(parents=True)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    (root / "rose-owner.json").write_text(json.dumps({"pid": int(dead)}))
    subprocess.run([str(binary), "-d"], env=dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=str(root / "pipe")),
                   check=True)
    pid, _ = find_running_daemon(str(binary))
    with MpsDaemon(short_tmp / "run", binary=str(binary), nvml=gpu_nvml) as mps:
        assert mps.active and mps.owned and mps.pid == pid
    assert _wait_gone(pid) and not root.exists()


_CHILD = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, {root!r})
    from tests.interpreter.rt_fakes import FakeClock, FakeNvml
    from interpreter.mps import MpsDaemon
    mps = MpsDaemon(sys.argv[1], binary=sys.argv[2], nvml=FakeNvml(FakeClock())).start()
    print(mps.pid, mps.pipe_dir, flush=True)
    if sys.argv[3] == "exit":
        sys.exit(0)  # no stop(): atexit must clean up
    time.sleep(60)
    """
)


@pytest.mark.parametrize("how", ["exit", "sigterm", "sighup", "sigkill"])
def test_no_daemon_left_behind(short_tmp, how):
    binary = make_fake_mps_binary(short_tmp)
    script = short_tmp / "child.py"
    script.write_text(_CHILD.format(root=str(ROOT)))
    proc = subprocess.Popen([sys.executable, str(script), str(short_tmp / "run"), str(binary), how],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        pid_s, pipe = proc.stdout.readline().split()
        daemon = int(pid_s)
        assert _alive(daemon)
        if how != "exit":  # SIGKILL: no handler runs; the watcher process stops the daemon
            proc.send_signal({"sigterm": signal.SIGTERM, "sighup": signal.SIGHUP, "sigkill": signal.SIGKILL}[how])
        rc = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    want = {"exit": 0, "sigterm": -signal.SIGTERM, "sighup": -signal.SIGHUP, "sigkill": -signal.SIGKILL}[how]
    assert rc == want, proc.stderr.read()  # the process still dies of the signal it got
    assert _wait_gone(daemon)
    deadline = time.monotonic() + 10.0  # after SIGKILL the watcher removes the directory after the daemon quits
    while Path(pipe).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(pipe).exists()


# --- GPU only ----------------------------------------------------------------------------------------
@GPU
@needs_gpu
def test_probe_sm_count_under_quotas(tmp_path):
    total = torch.cuda.get_device_properties(0).multi_processor_count
    with MpsDaemon(tmp_path) as mps:
        if not mps.active:
            pytest.skip(mps.warning)
        assert probe_sm_count(None, mps.client_env(None)) == total
        for pct in (25, 50):
            assert probe_sm_count(pct, mps.client_env(pct)) == expected_sms(pct, total)
