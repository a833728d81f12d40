"""A name is not an identity (issue 43): a plan may hold a loop `step@7`, a component `policy@2` and two
distinct nodes `publish` and `publish@1` -- the spelling the rewrites give split groups and temporal
copies (a workflow file may not: `resolve.check_reserved_names`; a plan file may be written by hand). Everything the search knows of a measured call (its structural
node, its base component) comes from the plan's fields, filled by the runtime where the call is recorded;
read from the names, `step@7` would lose its `@7`, `publish@1` would merge with `publish` and the
processes `policy` and `policy@2` would be one component. Each test here fails if anything parses them."""

from __future__ import annotations

from pathlib import Path

import pytest

from interpreter.chrome_trace import to_chrome_trace
from interpreter.optimize.trials import TrialSession
from interpreter.trace import InvocationRecord
from rose_dsl import load_workflow
from rose_dsl.ir import ExecutionNode
from rose_dsl.measurement import call_identity
from rose_dsl.optimizer.model import CostModel
from rose_dsl.optimizer.profile import Call, IterationRun, node_stats, runs_from_chrome_trace
from rose_dsl.optimizer.quota import sm_demand
from rose_dsl.transforms import apply_request, compose

from .test_trials import FAST, ROOT, _executor

# latency_interaction.yaml as a plan with names that look like the rewrites' own
RENAMES = (("\nparams:", "\nplan: {source: latency_interaction.yaml, rewrites: []}\nparams:"), ("loop: step", "loop: step@7"), ("step.obs", "step@7.obs"), ("step.i", "step@7.i"),
           ("step[*]", "step@7[*]"), ("].step.traj", "].step@7.traj"), ("  policy:", "  policy@2:"),
           ("call: policy.", "call: policy@2."), ("node: sync", "node: publish@1"))


@pytest.fixture(scope="module")
def tricky(tmp_path_factory: pytest.TempPathFactory):
    text = (ROOT / "workflows" / "latency_interaction.yaml").read_text()
    for old, new in RENAMES:
        assert old in text, old
        text = text.replace(old, new)
    path = tmp_path_factory.mktemp("tricky") / "workflow.yaml"
    path.write_text(text)
    return load_workflow(path, FAST)


def _plan(wf, *requests: str):
    result = None
    for r in requests:
        step = apply_request(result.workflow if result is not None else wf, r)
        result = step if result is None else compose(result, step)
    assert result is not None
    return result.workflow


def _nodes(wf) -> set[str]:
    return {".".join(i.path) for i in wf.items() if isinstance(i, ExecutionNode)}


def test_measured_calls_carry_the_source_workflow_s_nodes_and_components(tricky) -> None:
    """Real runs on the local runtime: the declared graph and a plan split in time and in rows. Every call
    of the plan counts as a node of the declared graph, as named there, and as a component declared there
    (the temporal copy of `sim` as `sim`); the cost model learnt from them predicts both graphs."""
    plan = _plan(tricky, "split-time epoch 2", "split epoch@0.step@7.act 2")
    assert "iteration.epoch@0.step@7.act@1" in _nodes(plan)  # a group inside a loop whose own name has an '@'
    session = TrialSession(tricky, _executor(tricky), log=lambda m: None)
    try:
        declared, planned = session.complete([tricky, plan], 1, warmup=1)
    finally:
        session.close()
    for runs in (declared, planned):
        calls = [c for r in runs for c in r.calls]
        assert {c.source for c in calls} == _nodes(tricky)
        assert {c.base for c in calls} == set(tricky.components)
    assert {c.component for r in planned for c in r.calls} > set(tricky.components)  # the copy ran as its own process
    stats = node_stats(declared)
    assert stats["iteration.publish@1"].component == "policy@2" and stats["iteration.publish"].component == "trainer"
    assert stats["iteration.epoch.step@7.act"].calls_per_iteration == FAST["steps"] * 2  # two epochs
    model = CostModel()
    model.observe(declared, tricky)
    model.observe(planned, plan)
    for wf in (tricky, plan):
        prediction = model.predict(wf)
        assert prediction.seconds is not None and prediction.unknown == ()


def test_a_trace_carries_the_identity_the_plan_s_fields_give() -> None:
    """`trace.json` as the runtime writes it: the reader takes each call's structural node and base
    component from the event, not from `epoch@0` or `sim@0` in its names."""
    wf = load_workflow(ROOT / "workflows" / "latency_interaction.yaml", FAST)
    plan = _plan(wf, "split-time epoch 2")
    node = next(n for n in plan.items() if isinstance(n, ExecutionNode) and n.component != n.component.split("@")[0])
    path = ".".join(node.path)
    record = InvocationRecord(call_id=1, node=path, component=node.component, host_start_ns=0, host_end_ns=1000,
                              loop_indices=(("iteration", 0),), status="ok")
    identity = {path: ("iteration.renamed.reset", "elsewhere")}  # fields that disagree with the names
    (run,), _ = runs_from_chrome_trace(to_chrome_trace([record], identity=identity))
    assert (run.calls[0].source, run.calls[0].base) == identity[path]
    (legacy,), _ = runs_from_chrome_trace(to_chrome_trace([record]))  # a trace written before the fields
    assert legacy.calls[0].source == ".".join(p.split("@")[0] for p in node.path)
    assert call_identity(plan)[path][1] == "sim"


def test_sm_demand_is_per_base_component_as_the_calls_carry_it() -> None:
    """Processes `policy` and `policy@2` are two components (two SM demands), `sim@0` -- a temporal copy of
    `sim`, as its calls say -- shares `sim`'s. Each runs alone in turn; the counter lags 60 ms."""
    ms = 1_000_000
    level = {"policy": 0.3, "policy@2": 0.8, "sim": 0.05, "sim@0": 0.05}
    calls: list[Call] = []
    t = 0
    while t < 20_000 * ms:
        for proc, dur in (("policy", 400), ("sim", 400), ("policy@2", 400), ("sim@0", 400)):
            base = "sim" if proc == "sim@0" else proc
            calls.append(Call("iteration.x", proc, 0, (0,), t, t + dur * ms, base=base))
            t += dur * ms

    def activity(lo: int, hi: int) -> float:
        return sum(level[c.component] * max(0, min(c.end_ns, hi) - max(c.start_ns, lo)) for c in calls) / (hi - lo)

    lag = 60 * ms
    samples = tuple((s, s + 100 * ms, activity(s - lag, s + 100 * ms - lag)) for s in range(0, t - 100 * ms, 100 * ms))
    run = IterationRun(t / 1e9, tuple(calls), 0, t, 0, activity_samples=samples)
    demand = sm_demand([run], dict.fromkeys(level, 0))
    assert demand["policy"] == pytest.approx(0.3, abs=0.05)
    assert demand["policy@2"] == pytest.approx(0.8, abs=0.05)
    assert demand["sim@0"] == demand["sim"] == pytest.approx(0.05, abs=0.02)


def test_a_profile_file_reads_the_fields_it_was_written_with(tmp_path: Path) -> None:
    """A profile saved and loaded keeps each call's fields; one written before them reads the names once."""
    from rose_dsl.optimizer.profile import Profile

    call = Call("iteration.step@7.act", "policy@2", 0, (0,), 0, 10, source="iteration.step@7.act", base="policy@2")
    profile = Profile((IterationRun(1.0, (call,)),))
    profile.save(tmp_path / "p.json")
    assert Profile.load(tmp_path / "p.json") == profile
    doc = profile.to_json()
    for c in doc["runs"][0]["calls"]:
        del c["source"], c["base"]
    (old,) = Profile.from_json(doc).calls
    assert (old.source, old.base) == ("iteration.step.act", "policy")
