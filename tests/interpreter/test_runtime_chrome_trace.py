"""Chrome/Perfetto export: well-formed trace events, tracks, lanes, counter track, round trip."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from interpreter.chrome_trace import (
    GPU_PID_BASE,
    read_chrome_trace,
    to_chrome_trace,
    validate_trace_events,
    write_chrome_trace,
)
from interpreter.gpu_activity import ActivitySample
from interpreter.trace import ExecutionTrace, InvocationRecord
from tests.interpreter.rt_fakes import FakeClock

US = 1000


def _trace() -> ExecutionTrace:
    clock = FakeClock(5_000_000)
    tr = ExecutionTrace(clock=clock)
    act = tr.begin("it.step.act", component="policy", pid=11, gpu=0, loop_indices=[("it", 0), ("step", 2)],
                   state=[("rollout_weights", "read")], inputs=["step.obs"])
    clock.advance(100 * US)
    child = tr.begin("it.step.act.backbone", component="policy", pid=11, parent=act)
    clock.advance(50 * US)
    tr.end(child)
    clock.advance(10 * US)
    tr.end(act, outputs=["act.action"], device_start_ns=clock.now - 50 * US, device_end_ns=clock.now + 40 * US)
    # two split groups of env overlapping in one process
    g0 = tr.begin("it.step.env", component="sim", pid=12, group=0, state=[("episode", "update")])
    clock.advance(30 * US)
    g1 = tr.begin("it.step.env", component="sim", pid=12, group=1, state=[("episode", "update")])
    clock.advance(30 * US)
    tr.end(g0)
    clock.advance(30 * US)
    tr.end(g1)
    tr.begin("it.step.unfinished", component="sim", pid=12)
    return tr


def _samples():
    t0 = 5_000_000
    return [ActivitySample(t0 + i * 20 * US, t0 + (i + 1) * 20 * US, v)
            for i, v in enumerate([0.0, 0.5, 0.96, 1.0, 0.2])]


def test_events_are_well_formed_and_complete(tmp_path):
    tr = _trace()
    doc = to_chrome_trace(tr, {0: _samples()})
    assert validate_trace_events(doc) == []
    ev = doc["traceEvents"]
    xs = [e for e in ev if e["ph"] == "X"]
    assert len(xs) == 4 and doc["otherData"]["incomplete"] == 1
    for e in xs:
        assert {"ph", "name", "ts", "dur", "pid", "tid", "args"} <= set(e)
    act = next(e for e in xs if e["name"] == "it.step.act")
    assert act["ts"] == 0.0 and act["dur"] == pytest.approx(200.0)  # host 160 µs, device ends 40 µs later
    assert act["args"]["loops"] == {"it": 0, "step": 2}
    assert act["args"]["state"] == {"rollout_weights": "read"} and act["args"]["host_dur_us"] == 160.0
    names = {e["pid"]: e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "process_name"}
    assert names[11] == "policy (pid 11)" and names[12] == "sim (pid 12)"
    assert names[GPU_PID_BASE] == "GPU 0 SM activity"
    cs = [e for e in ev if e["ph"] == "C"]
    assert [c["args"]["sm"] for c in cs] == [0.0, 50.0, 96.0, 100.0, 20.0, 0.0]
    assert [c["ts"] for c in cs] == [0.0, 20.0, 40.0, 60.0, 80.0, 100.0]
    # the overlapping split groups are on separate lanes; parent and child share one
    envs = [e for e in xs if e["name"] == "it.step.env"]
    assert envs[0]["tid"] != envs[1]["tid"]
    child = next(e for e in xs if e["name"] == "it.step.act.backbone")
    assert child["tid"] == act["tid"]
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in ev if e["name"] == "thread_name"}
    assert sorted(threads.values()) == ["policy", "sim", "sim #2"]


def test_write_and_read_round_trip(tmp_path):
    tr = _trace()
    path = write_chrome_trace(tmp_path / "trace.json", tr, {0: _samples()}, metadata={"run": "r1"})
    doc = read_chrome_trace(path)
    assert doc == json.loads(json.dumps(to_chrome_trace(tr, {0: _samples()}, metadata={"run": "r1"})))
    origin = doc["otherData"]["origin_ns"]
    # the records are recoverable from the file: call id -> (node, start, duration)
    got = {e["args"]["call_id"]: (e["name"], round(e["ts"] * 1000) + origin, round(e["dur"] * 1000))
           for e in doc["traceEvents"] if e["ph"] == "X"}
    want = {r.call_id: (r.node, r.host_start_ns, r.duration_ns) for r in tr.records() if r.done}
    assert got == want and doc["otherData"]["run"] == "r1"


@pytest.mark.parametrize(
    ("event", "problem"),
    [
        ({"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 0}, "dur"),
        ({"ph": "X", "name": "a", "pid": "1", "tid": 1, "ts": 0, "dur": 1}, "pid"),
        ({"ph": "Q", "name": "a", "pid": 1, "tid": 1, "ts": 0}, "unknown ph"),
        ({"ph": "C", "name": "a", "pid": 1, "tid": 1, "ts": 0, "args": {"v": "x"}}, "numeric"),
        ({"ph": "X", "name": 3, "pid": 1, "tid": 1, "ts": 0, "dur": 1}, "name"),
    ],
)
def test_validator_catches_malformed_events(event, problem):
    errs = validate_trace_events({"traceEvents": [event]})
    assert errs and problem in errs[0]


def test_validator_catches_bad_nesting():
    ev = [{"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 0, "dur": 10},
          {"ph": "X", "name": "b", "pid": 1, "tid": 1, "ts": 5, "dur": 10}]
    assert any("without nesting" in p for p in validate_trace_events({"traceEvents": ev}))
    assert validate_trace_events([]) != []


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 30), st.sampled_from(["a", "b"])),
                min_size=1, max_size=25))
def test_any_overlap_pattern_exports_properly_nested(spans):
    recs = [InvocationRecord(i + 1, f"n.{comp}", comp, s * US, host_end_ns=(s + d) * US, status="ok", pid=3)
            for i, (s, d, comp) in enumerate(spans)]
    doc = to_chrome_trace(recs)
    assert validate_trace_events(doc) == []
    assert sum(e["ph"] == "X" for e in doc["traceEvents"]) == len(recs)
