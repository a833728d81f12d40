"""ExecutionTrace: records, the duration rule, queries, thread safety, JSONL round trip."""

from __future__ import annotations

import threading

import pytest

from interpreter.trace import ExecutionTrace, InvocationRecord, TraceFormatError
from tests.interpreter.rt_fakes import FakeClock


def _small_trace() -> ExecutionTrace:
    clock = FakeClock(0)
    tr = ExecutionTrace(clock=clock, meta={"workflow": "toy"})
    it = tr.begin("iteration", component="driver", loop_indices=[("iteration", 0)])
    for step in range(3):
        clock.advance(10)
        act = tr.begin("iteration.epoch.step.act", component="policy", parent=it, pid=101, gpu=0,
                       loop_indices=[("iteration", 0), ("epoch", 0), ("step", step)],
                       inputs=["step.obs"], state=[("rollout_weights", "read")])
        clock.advance(5)
        tr.end(act, outputs=["act.action"], device_start_ns=clock.now - 3, device_end_ns=clock.now + 20)
        env = tr.begin("iteration.epoch.step.env", component="sim", parent=it, pid=102, group=step % 2,
                       loop_indices=[("iteration", 0), ("epoch", 0), ("step", step)],
                       state=[("episode", "update")])
        clock.advance(7)
        tr.end(env)
    clock.advance(1)
    tr.end(it)
    return tr


def test_duration_rule_host_start_to_later_of_host_and_device_end():
    tr = _small_trace()
    acts = tr.by_node("iteration.epoch.step.act")
    assert len(acts) == 3
    for r in acts:
        assert r.host_end_ns - r.host_start_ns == 5
        assert r.duration_ns == 25  # device completion (host end + 20) is later than host return
        assert r.interval == (r.host_start_ns, r.device_end_ns)
    env = tr.by_node("iteration.epoch.step.env")[0]
    assert env.duration_ns == 7 and env.device_end_ns is None
    # device ends before host return: host return counts
    r = InvocationRecord(1, "n", "c", 0, host_end_ns=10, device_start_ns=2, device_end_ns=6, status="ok")
    assert r.duration_ns == 10


def test_queries():
    tr = _small_trace()
    assert tr.node_paths() == ["iteration", "iteration.epoch.step.act", "iteration.epoch.step.env"]
    d = tr.node_durations()
    assert d["iteration.epoch.step.act"] == [25, 25, 25] and d["iteration.epoch.step.env"] == [7, 7, 7]
    root = tr.by_node("iteration")[0]
    assert {r.node for r in tr.children(root.call_id)} == {"iteration.epoch.step.act", "iteration.epoch.step.env"}
    assert [r.loop_indices[-1] for r in tr.by_node("iteration.epoch.step.env")] == [("step", i) for i in range(3)]
    assert [r.group for r in tr.by_node("iteration.epoch.step.env")] == [0, 1, 0]
    assert tr.intervals("iteration.epoch.step.env")[0] == (15, 22)


def test_running_and_error_records():
    clock = FakeClock(0)
    tr = ExecutionTrace(clock=clock)
    a = tr.begin("x", component="c")
    assert tr.get(a).status == "running" and tr.get(a).duration_ns is None
    assert tr.intervals("x") == [] and tr.node_durations() == {}
    clock.advance(4)
    tr.end(a, status="error", error="ValueError: boom")
    assert tr.get(a).done and tr.node_durations() == {}  # failed calls are not timing data
    assert tr.intervals("x") == [(0, 4)]
    # device span reported after host return (completion callback)
    b = tr.begin("y", component="c")
    clock.advance(2)
    tr.end(b)
    tr.set_device(b, 5, 30)
    assert tr.get(b).duration_ns == 26
    with pytest.raises(KeyError):
        tr.end(999)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"status": "done"},
        {"state": (("w", "write"),)},
        {"host_end_ns": -1},
        {"device_start_ns": 5},
        {"device_start_ns": 9, "device_end_ns": 5},
    ],
)
def test_record_validation(kwargs):
    with pytest.raises(ValueError):
        InvocationRecord(1, "n", "c", 0, **kwargs)


def test_concurrent_begin_end_gives_unique_ids():
    tr = ExecutionTrace()
    ids: list[int] = []
    lock = threading.Lock()

    def worker(k: int) -> None:
        mine = []
        for i in range(400):
            cid = tr.begin(f"n{k}", component=f"c{k}", loop_indices=[("i", i)])
            tr.end(cid)
            mine.append(cid)
        with lock:
            ids.extend(mine)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(tr) == 3200 and len(set(ids)) == 3200
    assert all(r.done for r in tr.records())
    assert [r.call_id for r in tr.records()] == sorted(ids)


def test_append_remote_records():
    tr = ExecutionTrace()
    cid = tr.new_call_id()
    tr.append(InvocationRecord(cid, "a", "sim", 10, host_end_ns=20, status="ok", pid=7))
    with pytest.raises(ValueError, match="duplicate"):
        tr.append(InvocationRecord(cid, "a", "sim", 10))
    assert tr.begin("b", component="sim") == cid + 1


def test_jsonl_round_trip(tmp_path):
    tr = _small_trace()
    path = tr.dump_jsonl(tmp_path / "trace.jsonl")
    back = ExecutionTrace.load_jsonl(path)
    assert back.records() == tr.records()
    assert back.meta == {"workflow": "toy"}
    assert isinstance(back.records()[1].loop_indices[0], tuple)
    assert not list(tmp_path.glob(".*tmp*"))


def test_jsonl_errors_name_the_line(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_text("")
    with pytest.raises(TraceFormatError, match="empty"):
        ExecutionTrace.load_jsonl(p)
    p.write_text('{"something": 1}\n')
    with pytest.raises(TraceFormatError, match=":1: not a rose trace"):
        ExecutionTrace.load_jsonl(p)
    good = _small_trace().dump_jsonl(tmp_path / "g.jsonl").read_text().splitlines()
    p.write_text("\n".join(good[:2] + ['{"call_id": 99, "node": "x"}'] + good[2:]) + "\n")
    with pytest.raises(TraceFormatError, match=":3: bad record"):
        ExecutionTrace.load_jsonl(p)
    p.write_text("\n".join(good[:3] + ["{not json"]) + "\n")
    with pytest.raises(TraceFormatError, match=":4: not JSON"):
        ExecutionTrace.load_jsonl(p)
