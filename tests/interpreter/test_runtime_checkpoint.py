"""Checkpoints: atomic publication, crash safety (SIGKILL mid-write), tamper detection, weights_only."""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from interpreter.checkpoint import (
    CheckpointError,
    latest_complete,
    list_complete,
    load_checkpoint,
    save_checkpoint,
    save_component_checkpoint,
)

ROOT = Path(__file__).resolve().parents[2]


def _states(k: int = 0):
    g = torch.Generator().manual_seed(k)
    return {
        "policy": {"rollout_weights": {"w": torch.randn(4, 3, generator=g), "b": torch.zeros(3)}},
        "trainer": {"weights": {"w": torch.randn(4, 3, generator=g)},
                    "optimizer": {"step": k, "lr": 3e-4, "betas": (0.9, 0.999), "state": [torch.ones(2)]}},
        "sim": {"episode": {"qpos": torch.randn(8, 2, dtype=torch.float64, generator=g), "t": 0.5 * k,
                            "rng": torch.Generator().manual_seed(k).get_state(), "name": "reacher",
                            "done": None}},
    }


def _assert_states_equal(a, b):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _assert_states_equal(a[k], b[k])
    elif isinstance(a, list | tuple):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _assert_states_equal(x, y)
    else:
        assert a == b


def test_round_trip(tmp_path):
    path = save_checkpoint(tmp_path, 7, _states(7), {"env_steps": 1234, "plan": "abc"})
    assert path.name == "ckpt-000007" and (path / "COMPLETE").is_file()
    ck = load_checkpoint(path)
    assert ck.iteration == 7 and ck.meta == {"env_steps": 1234, "plan": "abc"}
    _assert_states_equal(ck.states, _states(7))
    assert latest_complete(tmp_path) == path
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp left


def test_keep_last(tmp_path):
    for i in range(1, 6):
        save_checkpoint(tmp_path, i, _states(i), keep_last=2)
    assert [p.name for p in list_complete(tmp_path)] == ["ckpt-000004", "ckpt-000005"]
    save_checkpoint(tmp_path, 5, _states(55), keep_last=2)  # re-saving an iteration replaces it
    _assert_states_equal(load_checkpoint(tmp_path / "ckpt-000005").states, _states(55))
    with pytest.raises(ValueError):
        save_checkpoint(tmp_path, 6, _states(6), keep_last=0)


def test_partial_empty_and_temp_dirs_are_ignored(tmp_path):
    good = save_checkpoint(tmp_path, 1, _states(1))
    (tmp_path / "ckpt-000002").mkdir()  # empty
    partial = tmp_path / "ckpt-000003"
    (partial / "state").mkdir(parents=True)
    (partial / "meta.json").write_text("{}")  # no COMPLETE marker
    (tmp_path / ".tmp-ckpt-000004-1-abc").mkdir()
    assert latest_complete(tmp_path) == good
    with pytest.raises(CheckpointError, match="empty"):
        load_checkpoint(tmp_path / "ckpt-000002")
    with pytest.raises(CheckpointError, match="partial"):
        load_checkpoint(partial)
    with pytest.raises(CheckpointError, match="not a checkpoint directory"):
        load_checkpoint(tmp_path / "nope")
    assert latest_complete(tmp_path / "missing") is None


def test_tampered_file_is_detected(tmp_path):
    first = save_checkpoint(tmp_path, 1, _states(1))
    second = save_checkpoint(tmp_path, 2, _states(2))
    f = second / "state" / "trainer.pt"
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0x01  # same size: only the hash can tell
    f.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"trainer\.pt: content hash mismatch"):
        load_checkpoint(second)
    assert latest_complete(tmp_path) == second  # the cheap check cannot see it ...
    assert latest_complete(tmp_path, verify=True) == first  # ... the verified one skips back


def test_tampered_or_truncated_marker_and_files(tmp_path):
    p = save_checkpoint(tmp_path, 1, _states(1))
    marker = (p / "COMPLETE").read_text()
    (p / "COMPLETE").write_text(marker.replace('"iteration": 1', '"iteration": 2'))
    with pytest.raises(CheckpointError, match="digest mismatch"):
        load_checkpoint(p)
    (p / "COMPLETE").write_text(marker[: len(marker) // 2])
    with pytest.raises(CheckpointError, match="unreadable marker"):
        load_checkpoint(p)
    (p / "COMPLETE").write_text(marker)
    sim = p / "state" / "sim.pt"
    sim.write_bytes(sim.read_bytes()[:-10])
    assert latest_complete(tmp_path) is None  # size mismatch: not complete
    with pytest.raises(CheckpointError, match=r"sim\.pt: \d+ bytes, the marker says \d+ \(truncated"):
        load_checkpoint(p)
    sim.unlink()
    with pytest.raises(CheckpointError, match="missing"):
        load_checkpoint(p)


class _Thing:
    pass


@pytest.mark.parametrize(
    ("value", "where", "what"),
    [
        (np.random.default_rng(0), "states['sim']['episode']", "numpy"),
        ({"ok": torch.ones(1), "bad": [1, _Thing()]}, r"states['sim']['episode']['bad'][1]", "_Thing"),
        (collections.namedtuple("P", "x y")(1, 2), "states['sim']['episode']", "P"),
        (np.zeros(3), "states['sim']['episode']", "torch.from_numpy"),
        ({_Thing(): 1}, "states['sim']['episode']", "not a plain key"),
    ],
)
def test_not_weights_only_loadable_is_refused_at_save(tmp_path, value, where, what):
    with pytest.raises(CheckpointError) as e:
        save_checkpoint(tmp_path, 1, {"sim": {"episode": value}})
    assert where in str(e.value) and what in str(e.value)
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_everything_the_checker_allows_does_load(tmp_path):
    value = {"set": {1, 2}, "bytes": b"ab", "complex": 1 + 2j, "device": torch.device("cpu"),
             "dtype": torch.float16, "size": torch.Size([2, 3]), "param": torch.nn.Parameter(torch.ones(2)),
             "od": collections.OrderedDict(a=1), "keys": {1: 2, None: 3, 1.5: 4, False: 5}, "none": None}
    p = save_checkpoint(tmp_path, 1, {"c": {"s": value}})
    got = load_checkpoint(p).states["c"]["s"]
    assert got["set"] == {1, 2} and got["size"] == torch.Size([2, 3]) and got["dtype"] is torch.float16
    assert torch.equal(got["param"], torch.ones(2))


def test_bad_meta_and_names(tmp_path):
    with pytest.raises(CheckpointError, match="JSON"):
        save_checkpoint(tmp_path, 1, {"c": {}}, {"t": torch.ones(1)})
    with pytest.raises(CheckpointError, match="file name"):
        save_checkpoint(tmp_path, 1, {"../evil": {}})
    with pytest.raises(CheckpointError, match="non-negative"):
        save_checkpoint(tmp_path, -1, {})
    assert list_complete(tmp_path) == []


_CHILD = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, {root!r})
    import torch
    import interpreter.checkpoint as ck

    run_dir, stage = sys.argv[1], sys.argv[2]
    big = {{"policy": {{"w": torch.arange(2_000_000, dtype=torch.float32)}}, "sim": {{"x": torch.ones(3)}}}}
    ck.save_checkpoint(run_dir, 1, big, {{"n": 1}})

    def hang():
        print("HANG", flush=True)
        time.sleep(60)

    real_write, real_publish, calls = ck._write_file, ck._publish, [0]

    def write(path, data):
        calls[0] += 1
        if stage == "mid-file" and calls[0] == 2:  # half of state/policy.pt is on disk
            with open(path, "wb") as f:
                f.write(data[: len(data) // 2])
                f.flush()
            hang()
        if stage == "before-marker" and path.name == "COMPLETE":
            hang()
        real_write(path, data)

    def publish(tmp, final):
        if stage == "before-rename":
            hang()
        real_publish(tmp, final)

    ck._write_file, ck._publish = write, publish
    ck.save_checkpoint(run_dir, 2, big, {{"n": 2}})
    print("FINISHED", flush=True)
    """
)


@pytest.mark.parametrize("stage", ["mid-file", "before-marker", "before-rename"])
def test_sigkill_during_write_leaves_previous_checkpoint_latest(tmp_path, stage):
    script = tmp_path / "child.py"
    script.write_text(_CHILD.format(root=str(ROOT)))
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, str(script), str(run_dir), stage], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline().strip()
        assert line == "HANG", proc.stderr.read()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL
    leftovers = [p.name for p in run_dir.iterdir() if p.name.startswith(".tmp-ckpt-000002-")]
    assert len(leftovers) == 1  # the interrupted write stayed in its temp dir
    latest = latest_complete(run_dir, verify=True)
    assert latest is not None and latest.name == "ckpt-000001"
    ck = load_checkpoint(latest)
    assert ck.meta == {"n": 1} and torch.equal(ck.states["policy"]["w"], torch.arange(2_000_000,
                                                                                       dtype=torch.float32))
    # the next save works and removes the dead writer's temp dir
    save_checkpoint(run_dir, 2, {"sim": {"x": torch.zeros(1)}})
    assert latest_complete(run_dir).name == "ckpt-000002"
    assert not [p for p in run_dir.iterdir() if p.name.startswith(".")]


class _Processes:
    """`Backend.control` of component processes that hold `states`: each writes its own state file
    (`ComponentWorker.write_state_file`, the real method on a worker-shaped stand-in), some on another host."""

    def __init__(self, states, elsewhere=()):
        from interpreter.worker import ComponentWorker

        self.states, self.elsewhere, self.asked = states, set(elsewhere), []
        self.write = ComponentWorker.write_state_file

    def __call__(self, comp, method, *args):
        self.asked.append((comp, method))
        me = self

        class Stand:  # what write_state_file reads of its worker
            name = comp

            def get_states(self):
                return me.states[comp]

        if method == "get_states":
            return self.states[comp]
        path, host = args
        return self.write(Stand(), path, "another-host" if comp in self.elsewhere else host)


def test_each_process_writes_its_own_state_file_and_the_checkpoint_is_the_same(tmp_path):
    """The end-of-run checkpoint through the driver took 16.4 s on an H100 (MJX, a 4-GB trainer state):
    now each component's process writes its file, all at once, and the checkpoint is the one the driver
    would have written -- same files, same hashes, same states; a process on another host (whose file
    system is not the run directory's) sends its state to the driver, which writes it."""
    direct = save_checkpoint(tmp_path / "a", 3, _states(3), {"k": 1})
    control = _Processes(_states(3), elsewhere={"sim"})
    path = save_component_checkpoint(tmp_path / "b", 3, ["policy", "trainer", "sim"], control, {"k": 1})
    ck = load_checkpoint(path)
    _assert_states_equal(ck.states, _states(3))
    assert ck.meta == {"k": 1}
    import json

    marker = json.loads((path / "COMPLETE").read_text())
    assert marker["files"] == json.loads((direct / "COMPLETE").read_text())["files"]
    assert ("sim", "get_states") in control.asked and ("trainer", "get_states") not in control.asked


def test_a_state_a_process_cannot_write_as_a_checkpoint_leaves_nothing(tmp_path):
    bad = _states(1)
    bad["sim"]["episode"] = np.zeros(3)
    with pytest.raises(CheckpointError) as e:
        save_component_checkpoint(tmp_path, 1, ["policy", "trainer", "sim"], _Processes(bad))
    assert "states['sim']['episode']" in str(e.value) and "torch.from_numpy" in str(e.value)
    assert [p for p in tmp_path.iterdir()] == []  # no checkpoint, no temp


def test_a_state_file_that_is_not_where_the_process_said_is_refused(tmp_path):
    def control(comp, method, *args):  # a process that says it wrote a file the driver cannot see
        return {"sha256": "0" * 64, "size": 10}

    with pytest.raises(CheckpointError, match="written elsewhere or incompletely"):
        save_component_checkpoint(tmp_path, 1, ["policy"], control)
    assert latest_complete(tmp_path) is None


# --- reading only what a checkpoint is (issue 42) ----------------------------------------------------------
def _load_within(path, seconds=30.0):
    """load_checkpoint in a daemon thread: a read that blocks (a FIFO) fails the test instead of hanging it."""
    import threading

    box = {}

    def target():
        try:
            box["value"] = load_checkpoint(path)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            box["error"] = exc

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), "load_checkpoint blocked"
    if "error" in box:
        raise box["error"]
    return box["value"]


def _rewrite_marker(path, **changes):
    """A marker edited consistently (its digest recomputed): what someone who edits one by hand can make."""
    import json

    from interpreter.checkpoint import _digest

    marker = json.loads((path / "COMPLETE").read_text())
    marker.update(changes)
    marker["digest"] = _digest(marker["iteration"], marker["files"])
    (path / "COMPLETE").write_text(json.dumps(marker))


@pytest.mark.parametrize("make", ["symlink-dev-zero", "fifo", "symlink-inside"])
def test_a_state_file_that_is_not_a_regular_file_is_refused_before_it_is_read(tmp_path, make):
    p = save_checkpoint(tmp_path, 1, _states(1))
    f = p / "state" / "sim.pt"
    f.unlink()
    if make == "symlink-dev-zero":
        f.symlink_to("/dev/zero")
    elif make == "fifo":
        os.mkfifo(f)
    else:
        f.symlink_to(p / "state" / "policy.pt")
    what = {"fifo": "a FIFO"}.get(make, "a symbolic link")
    with pytest.raises(CheckpointError, match=rf"state/sim\.pt: {what}; a checkpoint holds regular files only"):
        _load_within(p)
    assert list_complete(tmp_path) == []


def test_a_marker_that_lists_a_path_outside_the_checkpoint_is_refused(tmp_path):
    import json

    secret = tmp_path / "secret.pt"
    torch.save({"x": torch.ones(1)}, secret)
    p = save_checkpoint(tmp_path / "run", 1, {"c": {"x": torch.zeros(1)}})
    files = json.loads((p / "COMPLETE").read_text())["files"]
    files["state/../../../secret.pt"] = {"sha256": "0" * 64, "size": secret.stat().st_size}
    _rewrite_marker(p, files=files)
    with pytest.raises(CheckpointError, match=r"lists 'state/\.\./\.\./\.\./secret\.pt', which is not a checkpoint file"):
        load_checkpoint(p)


def test_a_linked_state_directory_or_checkpoint_directory_is_refused(tmp_path):
    p = save_checkpoint(tmp_path / "run", 1, {"c": {"x": torch.zeros(1)}})
    moved = tmp_path / "elsewhere"
    (p / "state").rename(moved)
    (p / "state").symlink_to(moved)
    with pytest.raises(CheckpointError, match="state: a symbolic link"):
        load_checkpoint(p)
    (p / "state").unlink()
    moved.rename(p / "state")
    link = tmp_path / "run" / "ckpt-000002"
    link.symlink_to(p)
    with pytest.raises(CheckpointError, match="ckpt-000002: a symbolic link"):
        load_checkpoint(link)
    assert load_checkpoint(p).iteration == 1


def test_the_name_the_marker_and_meta_json_must_agree_on_the_iteration(tmp_path):
    import json
    import shutil

    run = tmp_path / "run"
    for i in (1, 2):
        save_checkpoint(run, i, _states(i))
    copy = run / "ckpt-000099"
    shutil.copytree(run / "ckpt-000001", copy)
    with pytest.raises(CheckpointError, match="named for iteration 99 but its COMPLETE marker is of iteration 1"):
        load_checkpoint(copy)
    from interpreter.checkpoint import find_resumable

    ck, rejected = find_resumable(run)
    assert ck.iteration == 2 and [r.path.name for r in rejected] == ["ckpt-000099"]
    assert [p.name for p in list_complete(run)] == ["ckpt-000001", "ckpt-000002"]
    # meta.json saying another iteration than the marker (both rewritten consistently)
    p = run / "ckpt-000002"
    head = json.loads((p / "meta.json").read_text())
    head["iteration"] = 7
    data = json.dumps(head).encode()
    (p / "meta.json").write_bytes(data)
    files = json.loads((p / "COMPLETE").read_text())["files"]
    import hashlib

    files["meta.json"] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    _rewrite_marker(p, files=files)
    with pytest.raises(CheckpointError, match=r"meta\.json: iteration 7, the COMPLETE marker says 2"):
        load_checkpoint(p)


def test_pruning_goes_by_the_iteration_a_checkpoint_holds_not_its_name(tmp_path):
    import shutil

    run = tmp_path / "run"
    save_checkpoint(run, 1, _states(1), keep_last=2)
    shutil.copytree(run / "ckpt-000001", run / "ckpt-000099")  # a copy under a higher number
    for i in (2, 3, 4):
        save_checkpoint(run, i, _states(i), keep_last=2)
    assert sorted(p.name for p in run.iterdir()) == ["ckpt-000003", "ckpt-000004"]


def test_the_processes_of_a_replicated_component_each_write_their_state(tmp_path):
    """`replicas: 2` runs `sim` and `sim#1` (docs/language.md): the end-of-run checkpoint of such a run on
    Ray was refused ("component name 'sim#1' cannot be a file name"), so every `rose execute --out` of a
    replicated workflow ended with exit 5; the replica's state now round-trips under its process name."""
    states = {**_states(2), "sim#1": _states(3)["sim"]}
    path = save_component_checkpoint(tmp_path, 2, sorted(states), _Processes(states))
    ck = load_checkpoint(path)
    _assert_states_equal(ck.states, states)
    assert latest_complete(tmp_path) == path
