"""Asynchronous plans (`defer:`) with a staleness budget (`max_staleness:`), checked on executions.

The rewrite is refused whenever a read would be older than its state object's budget (default 0, so on
every shipped workflow), the analysis proves the lag of each read, and the pipelined runner
(`interpreter/pipeline.py`) executes accepted plans with several RL iterations in flight. The property
test draws the workflow's shape, the budget, the deferral, checkpoints and every call's duration, runs
the plan on the local backend and checks, on what the components saw, that no read is older than its
budget, that the lag the analysis proves is the one observed, and that each metrics line is its own
iteration's.
"""

from __future__ import annotations

import copy
import itertools
import uuid
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from interpreter.backends import LocalBackend
from interpreter.runner import RunConfig, Runner
from interpreter.schedule import Schedule
from rose_dsl import load_workflow, load_workflow_text
from rose_dsl.analysis import analyze, read_lags
from rose_dsl.ir import ExecutionNode
from rose_dsl.semantics import Program
from rose_dsl.transforms import Refused, apply
from tests.strategies import workflows

ROOT = Path(__file__).resolve().parents[2]


def _text(budget: int, middle: list[str], sleeps: dict[str, list[float]], run: str, count: int = 4,
          wait: bool = False) -> str:
    """generate -> the `middle` calls (scorer or learner reads) -> update -> publish -> sync."""
    state = f"{{weights: {{max_staleness: {budget}}}}}" if budget else "[weights]"
    extra = "".join(f"""
    - node: mid{n}
      call: {comp}
      in: {{rollouts: generate.rollouts}}
      out: [score]""" if comp == "scorer.score" else f"""
    - node: mid{n}
      call: learner.get
      state: {{weights: read}}
      out: [w]""" for n, comp in enumerate(middle))
    return f"""
rose: 1
name: versions
components:
  gen:
    impl: "tests.async_fakes:Generator"
    args: {{sleeps: {sleeps['gen']}, run: "{run}"}}
    state: {state}
  learner:
    impl: "tests.async_fakes:Learner"
    args: {{sleeps: {sleeps['learner']}, run: "{run}", wait_for_next: {str(wait).lower()}, last: {count - 1}}}
    state: [weights]
  scorer:
    impl: "tests.async_fakes:Scorer"
    args: {{sleeps: {sleeps['scorer']}}}
iteration:
  count: {count}
  body:
    - node: generate
      call: gen.generate
      in: {{it: iteration.i}}
      state: {{weights: read}}
      out: [rollouts]{extra}
    - node: update
      call: learner.update
      in: {{rollouts: generate.rollouts, it: iteration.i}}
      state: {{weights: update}}
    - node: publish
      call: learner.get
      state: {{weights: read}}
      out: [w]
    - node: sync
      call: gen.load
      in: {{w: publish.w, it: iteration.i}}
      state: {{weights: refresh}}
"""


def _run(wf, iterations: int, checkpoint_every: int = 0, out: Path | None = None):
    sch = Schedule(wf)
    be = LocalBackend(wf, ("tests.",), sch.program.loops_of)
    try:
        runner = Runner(wf, be, RunConfig(iterations=iterations, checkpoint_every=checkpoint_every, out_dir=out,
                                          tensorboard=False), sch)
        results = runner.run()
        return results, be.workers["gen"].obj, be.workers["learner"].obj, \
            {c: be.control(c, "get_states") for c in be.components()}
    finally:
        be.shutdown()


_SLEEPS = st.lists(st.sampled_from([0.0, 0.0, 0.001, 0.003, 0.008]), min_size=1, max_size=4)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(budget=st.integers(0, 3), k=st.integers(1, 3), middle=st.lists(st.sampled_from(["scorer.score", "learner.get"]),
                                                                      max_size=2),
       sleeps=st.fixed_dictionaries({"gen": _SLEEPS, "learner": _SLEEPS, "scorer": _SLEEPS}),
       iterations=st.integers(2, 6), every=st.sampled_from([0, 0, 2, 3]))
def test_an_accepted_deferral_never_reads_older_than_the_budget_on_executions(budget, k, middle, sleeps, iterations,
                                                                              every, tmp_path_factory) -> None:
    wf = load_workflow_text(_text(budget, middle, sleeps, uuid.uuid4().hex, iterations), "versions.yaml")
    plan = apply(wf, f"defer sync {k}")
    if k >= iterations:  # every call of the node would run after the last iteration
        assert isinstance(plan, Refused) and f"at most {iterations - 1}" in plan.reason
        return
    if k > budget:
        assert isinstance(plan, Refused)
        assert f"allows max_staleness {budget}" in plan.reason and "'gen.weights'" in plan.reason
        return
    assert not isinstance(plan, Refused), plan
    proven = read_lags(plan.workflow)[("gen.weights", ("iteration", "generate"))]
    out = tmp_path_factory.mktemp("run") if every else None
    results, gen, learner, states = _run(plan.workflow, iterations, every, out)
    lags = [(it - 1) - stamp for it, stamp in gen.seen]
    assert [it for it, _ in gen.seen] == list(range(iterations))
    assert max(lags) <= budget and max(lags) <= proven
    # the lag the analysis proves is observed, unless a drain (checkpoint) came before it could build up
    if not every and iterations > k + 1:
        assert max(lags) == proven == k
    # each metrics line is its own iteration's rollout, in order
    assert [r.iteration for r in results] == list(range(iterations))
    assert [r.metrics["gen/rollout_it"] for r in results] == [float(i) for i in range(iterations)]
    # what the run leaves is the declared workflow's state: the last update synced
    assert states["gen"]["weights"].item() == states["learner"]["weights"].item() == iterations - 1


@pytest.mark.e2e
def test_the_pipelined_runner_overlaps_the_next_rollout_with_this_update() -> None:
    """Each update waits (bounded) until the next rollout has started: only iterations in flight together
    let it see that -- a synchronous plan runs each update before the next rollout."""
    sleeps = {"gen": [0.0], "learner": [0.0], "scorer": [0.0]}
    wf = load_workflow_text(_text(1, [], sleeps, uuid.uuid4().hex, 4, wait=True), "versions.yaml")
    plan = apply(wf, "defer sync 1")
    assert not isinstance(plan, Refused), plan
    assert Schedule(plan.workflow).depth == 2
    _, gen, learner, _ = _run(plan.workflow, 4)
    assert learner.overlapped == [True, True, True, False]  # the last has no next rollout
    assert [(it - 1) - stamp for it, stamp in gen.seen] == [0, 1, 1, 1]


def test_the_analysis_reports_each_reads_lag_and_validate_accepts_the_plan() -> None:
    sleeps = {"gen": [0.0], "learner": [0.0], "scorer": [0.0]}
    wf = load_workflow_text(_text(2, ["learner.get"], sleeps, "x"), "versions.yaml")
    assert any("lag 0, max_staleness 2" in line for line in analyze(wf).versions)
    plan = apply(wf, "defer sync 2")
    assert not isinstance(plan, Refused), plan
    lines = analyze(plan.workflow).versions
    assert "gen.weights: 'generate' reads a value at most 2 RL iterations older than the synchronous workflow's " \
           "(lag 2, max_staleness 2): gen.weights <- sync <- learner.weights" in lines  # and the chain (issue 58)
    # the learner's own reads keep lag 0: only the budgeted state may lag
    assert read_lags(plan.workflow)[("learner.weights", ("iteration", "mid0"))] == 0
    from rose_dsl.transforms import plan_differences

    assert plan_differences(wf, plan.workflow) == []


def test_a_deferral_that_only_a_budget_on_another_state_would_allow_is_refused() -> None:
    """Deferring the update makes the learner's own reads older: `learner.weights` has no budget."""
    sleeps = {"gen": [0.0], "learner": [0.0], "scorer": [0.0]}
    wf = load_workflow_text(_text(3, [], sleeps, "x"), "versions.yaml")
    refused = apply(wf, "defer update 1")
    assert isinstance(refused, Refused)
    assert "'learner.weights' allows max_staleness 0" in refused.reason


def _state_writers(wf) -> list[str]:
    return [i.name for i in wf.root.body if isinstance(i, ExecutionNode) and any(e.access.writes for e in i.effects)]


@pytest.mark.parametrize("path", sorted((ROOT / "workflows").glob("*.yaml")), ids=lambda p: p.name)
def test_budget_zero_every_shipped_workflow_has_no_asynchronous_plan(path: Path) -> None:
    """No state object of a shipped workflow declares a budget, so every deferral is refused and every plan
    rose runs computes what the declared workflow computes (the runtime path is the synchronous one)."""
    wf = load_workflow(path)
    assert all(s.max_staleness == 0 for s in wf.state_objects().values())
    assert Program(wf).depth == 1
    for name, k in itertools.product(_state_writers(wf), (1, 2)):
        assert isinstance(apply(wf, f"defer {name} {k}"), Refused), (path.name, name, k)


def _stamped(doc: dict, sleeps: list[float], count: int) -> dict:
    """A random workflow (tests/strategies.py) on `Stamper`s: every node also gets the RL iteration (`rl`)."""
    def visit(items: list) -> None:
        for item in items:
            if "node" in item:
                item.setdefault("in", {})["rl"] = "iteration.i"
            for key in ("body", "phases"):
                if key in item:
                    visit(item[key])

    doc = copy.deepcopy(doc)
    visit(doc["iteration"]["body"])
    doc["iteration"]["count"] = count
    for comp in doc["components"].values():
        comp["impl"] = "tests.async_fakes:Stamper"
        comp["args"]["sleeps"] = sleeps
    return doc


def _nodes(items: list) -> list[dict]:
    return [n for i in items for n in ([i] if "node" in i else []) + _nodes(i.get("body", []) + i.get("phases", []))]


def _stamps_of(wf, iterations: int, stop=None, checkpoint_every: int = 0, out_dir=None,
               resume: bool = False) -> tuple[dict, dict, int]:
    """Which write each read saw (`Stamper.seen`), the final stamp of every state object, per component, and
    how many RL iterations ran (all of them unless `stop` ends the run; in run directory `out_dir`, if given;
    `resume`: continuing the run there, the reads of this part only, the iterations it wrote lines of)."""
    sch = Schedule(wf)
    be = LocalBackend(wf, ("tests.",), sch.program.loops_of)
    try:
        config = RunConfig(iterations=iterations, checkpoint_every=checkpoint_every, tensorboard=False, out_dir=out_dir,
                           resume=resume)
        results = Runner(wf, be, config, sch).run(stop=stop)
        if not resume:
            assert [r.iteration for r in results] == list(range(len(results)))
        objs = {c: be.workers[c].obj for c in wf.components}
        return ({(c, *key): v for c, o in objs.items() for key, v in o.seen.items()},
                {(c, s): v for c, o in objs.items() for s, v in o.stamps.items()}, len(results))
    finally:
        be.shutdown()


def assert_reads_within_budget(wf, plan, budgeted: tuple[str, str], budget: int, iterations: int) -> None:
    """Run `wf` and its asynchronous `plan` on the fakes: every read of the plan sees what the synchronous
    run's same read saw L RL iterations earlier, L = 0 for updates and unbudgeted state objects and
    L <= `budget` (and <= the lag the analysis proves) for reads of `budgeted` (component, state); and the
    plan's run leaves every state object as the synchronous run does."""
    proven = read_lags(plan)
    sync_seen, sync_left, _ = _stamps_of(wf, iterations)
    seen, left, _ = _stamps_of(plan, iterations)
    assert set(seen) == set(sync_seen)
    event("an older read observed" if seen != sync_seen else "no read older")
    modes = {(n.component, n.method, e.state.split(".", 1)[1]): e.access.value for n in wf.items()
             if isinstance(n, ExecutionNode) for e in n.effects}
    for (c, method, it, n, s), stamp in seen.items():
        if stamp == sync_seen[(c, method, it, n, s)]:
            continue
        allowed = budget if (c, s) == budgeted and modes[(c, method, s)] == "read" else 0
        lag = next((lag for lag in range(1, it + 2) if stamp == sync_seen.get((c, method, it - lag, n, s), ("init",))), None)
        assert lag is not None and lag <= allowed, ((c, method, it, n, s), stamp, lag, allowed)
        node = next(i.path for i in wf.items() if isinstance(i, ExecutionNode) and (i.component, i.method) == (c, method))
        assert lag <= proven[(f"{c}.{s}", node)], (method, lag, proven)
    assert left == sync_left


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(doc=workflows(max_nodes=8, max_depth=2), data=st.data())
def test_random_workflows_deferred_within_budget_read_no_older_values_on_executions(doc, data) -> None:
    """Random workflows, a random budget on a random state object, a random top-level node deferred by a
    random K, random call durations: when the oracle accepts the plan, its execution on the pipelined
    runner (several RL iterations in flight) has every read see the write the synchronous execution's
    same read saw L RL iterations earlier, with L = 0 for updates and unbudgeted state objects and
    L <= max_staleness otherwise; the lag it observes is at most the one the analysis proves; and the run
    leaves every state object as the synchronous one does."""
    states = [(c, s) for c, comp in doc["components"].items() for s in comp["state"]]
    tops = [i["node"] for i in doc["iteration"]["body"] if "node" in i]
    assume(states and tops)
    budget = data.draw(st.sampled_from([0, 1, 1, 2, 2]), label="budget")
    read = {(n["call"].split(".")[0], s) for n in _nodes(doc["iteration"]["body"]) for s, m in n.get("state", {}).items()
            if m == "read"}  # mostly a state object something reads: the case a budget is for
    comp, state = data.draw(st.sampled_from(sorted(read) if read and data.draw(st.integers(0, 3)) else states),
                            label="budgeted")
    writers = [i["node"] for i in doc["iteration"]["body"] if "node" in i and i["call"].startswith(f"{comp}.")
               and i.get("state", {}).get(state) in ("update", "refresh")]  # mostly a writer of that state
    name = data.draw(st.sampled_from(writers) if writers and data.draw(st.integers(0, 3)) else st.sampled_from(tops),
                     label="deferred")
    k = data.draw(st.integers(1, 2), label="K")
    sleeps = data.draw(st.lists(st.sampled_from([0.0, 0.0, 0.001, 0.004]), min_size=1, max_size=3), label="sleeps")
    iterations = 4
    doc = _stamped(doc, sleeps, iterations)
    doc["components"][comp]["state"] = {s: ({"max_staleness": budget} if s == state else None)
                                        for s in doc["components"][comp]["state"]}
    wf = load_workflow_text(yaml.safe_dump(doc), "random.yaml")
    plan = apply(wf, f"defer {name} {k}")
    assume(not isinstance(plan, Refused))
    event("deferred, with a loop that ends on a condition" if wf.root.dynamic or any(
        getattr(i, "dynamic", False) for i in wf.items()) else "deferred, static loops only")
    assert_reads_within_budget(wf, plan.workflow, (comp, state), budget, iterations)


def test_an_asynchronous_plan_on_ray_reads_the_weights_one_update_older(ray_session) -> None:
    """The Ray backend (call by call: a compiled graph runs one iteration) queues control calls too, so it
    keeps two RL iterations in flight; each iteration's metrics line is still its own rollout's."""
    from interpreter.backends import RayBackend

    sleeps = {"gen": [0.0], "learner": [0.0], "scorer": [0.0]}
    wf = load_workflow_text(_text(1, [], sleeps, uuid.uuid4().hex, 4), "versions.yaml")
    plan = apply(wf, "defer sync 1")
    assert not isinstance(plan, Refused), plan
    sch = Schedule(plan.workflow)
    be = RayBackend(plan.workflow, ("tests.",), sch.program.loops_of)
    try:
        assert be.capabilities.pipelined
        results = Runner(plan.workflow, be, RunConfig(iterations=4, tensorboard=False), sch).run()
        states = {c: be.control(c, "get_states") for c in ("gen", "learner")}
    finally:
        be.shutdown()
    assert [r.metrics["gen/rollout_it"] for r in results] == [0.0, 1.0, 2.0, 3.0]
    assert [r.metrics["gen/lag"] for r in results] == [0.0, 1.0, 1.0, 1.0]
    assert states["gen"]["weights"].item() == states["learner"]["weights"].item() == 3.0


def test_a_resumed_asynchronous_run_sees_what_an_uninterrupted_one_sees(tmp_path) -> None:
    """A checkpoint drains what is deferred, so the state it saves is the declared workflow's and a resume
    starts with nothing pending: 4 iterations, then a resume to 6, read exactly what 6 in one go read."""
    sleeps = {"gen": [0.0, 0.002], "learner": [0.001], "scorer": [0.0]}
    wf = load_workflow_text(_text(1, ["scorer.score"], sleeps, uuid.uuid4().hex, 6), "versions.yaml")
    plan = apply(wf, "defer sync 1")
    assert not isinstance(plan, Refused), plan

    def run(out: Path, iterations: int, resume: bool) -> list[float]:
        sch = Schedule(plan.workflow)
        be = LocalBackend(plan.workflow, ("tests.",), sch.program.loops_of)
        try:
            config = RunConfig(iterations=iterations, checkpoint_every=2, out_dir=out, resume=resume, tensorboard=False)
            return [r.metrics["gen/lag"] for r in Runner(plan.workflow, be, config, sch).run()]
        finally:
            be.shutdown()

    whole = run(tmp_path / "whole", 6, False)
    assert whole == [0.0, 1.0, 0.0, 1.0, 0.0, 1.0]  # each checkpoint (after 1, 3, 5) drains the deferred sync
    assert run(tmp_path / "parts", 4, False) + run(tmp_path / "parts", 6, True) == whole


def test_an_asynchronous_run_keeps_its_work_without_checkpoint_every(tmp_path) -> None:
    """As a synchronous run does, a pipelined one ends with a checkpoint of its last iteration (drained: the
    declared workflow's state) and `export/`, though it was given no `--checkpoint-every`."""
    sleeps = {"gen": [0.0, 0.002], "learner": [0.001], "scorer": [0.0]}
    wf = load_workflow_text(_text(1, ["scorer.score"], sleeps, uuid.uuid4().hex, 5), "versions.yaml")
    plan = apply(wf, "defer sync 1")
    assert not isinstance(plan, Refused), plan
    _, _, _, deferred = _run(plan.workflow, 5, out=tmp_path / "async")
    _, _, _, declared = _run(wf, 5, out=tmp_path / "sync")
    assert sorted(p.name for p in (tmp_path / "async" / "checkpoints").iterdir()) == ["ckpt-000004"]
    assert (tmp_path / "async" / "export" / "manifest.json").is_file()
    assert yaml.safe_load((tmp_path / "async" / "export" / "manifest.json").read_text())["iteration"] == 4
    assert repr(deferred) == repr(declared)  # the final states: what the declared workflow leaves


def test_rose_validate_prints_the_lag_of_each_budgeted_read(tmp_path) -> None:
    import subprocess
    import sys

    from rose_dsl.serialize import to_yaml

    sleeps = {"gen": [0.0], "learner": [0.0], "scorer": [0.0]}
    source = tmp_path / "versions.yaml"
    source.write_text(_text(1, [], sleeps, "x"))
    plan = apply(load_workflow(source), "defer sync 1")
    assert not isinstance(plan, Refused), plan
    (tmp_path / "plan.yaml").write_text(to_yaml(plan.workflow))
    out = subprocess.run([sys.executable, "-m", "rose_dsl.cli", "validate", str(tmp_path / "plan.yaml"), "--explain"],
                         capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "gen.weights: 'generate' reads a value at most 1 RL iteration older than the synchronous workflow's " \
           "(lag 1, max_staleness 1)" in " ".join(out.stdout.split())


def test_a_workflow_with_a_loop_that_ends_on_a_condition_runs_deferred_with_each_iterations_trips() -> None:
    """`defer` is no longer refused where a loop ends on a condition: the pipelined runner schedules such a
    loop's trips as its condition is fetched, and each iteration's metrics line holds its own trips (its
    successor's submission, which decides the successor's, comes before it is logged)."""
    sleeps = {"gen": [0.0, 0.002], "learner": [0.001], "scorer": [0.0]}
    text = _text(1, [], sleeps, uuid.uuid4().hex, 7).replace("""  body:
    - node: generate""", """  body:
    - loop: decode
      count: 4
      until: tok.done
      body:
        - node: tok
          call: gen.step
          in: {it: iteration.i, t: decode.i}
          state: {weights: read}
          out: [done]
    - node: generate""")
    plan = apply(load_workflow_text(text, "versions.yaml"), "defer sync 1")
    assert not isinstance(plan, Refused), plan
    results, gen, _, states = _run(plan.workflow, 7)
    assert [r.metrics["trips/decode"] for r in results] == [float(1 + k % 3) for k in range(7)]
    lags = [(it - 1) - stamp for it, stamp in gen.seen]
    assert max(lags) == 1 and states["gen"]["weights"].item() == 6.0


@pytest.mark.e2e
def test_a_pipelined_run_restarts_a_killed_process_from_the_last_checkpoint(tmp_path, ray_session) -> None:
    """SIGKILL inside a call of an asynchronous plan (Ray, iterations in flight): the iterations in flight
    are abandoned, the process restarted, every component put back at the last checkpoint (taken after a
    drain: nothing deferred pending) and the pipeline starts again after it; the run ends with the state an
    uninterrupted one leaves, each iteration logged once."""
    from interpreter.backends import RayBackend

    sleeps = {"gen": [0.0], "learner": [0.0], "scorer": [0.0]}
    text = _text(1, [], sleeps, uuid.uuid4().hex, 6).replace("""  scorer:""", f"""  dies:
    impl: "tests.mocks:DiesOnce"
    args: {{marker: "{tmp_path / 'died'}", at_call: 4}}
    state: [acc]
  scorer:""").replace("""    - node: update""", """    - node: count
      call: dies.work
      in: {x: iteration.i}
      state: {acc: update}
      out: [y]
    - node: update""")
    plan = apply(load_workflow_text(text, "versions.yaml"), "defer sync 1")
    assert not isinstance(plan, Refused), plan
    sch = Schedule(plan.workflow)
    be = RayBackend(plan.workflow, ("tests.",), sch.program.loops_of)
    try:
        config = RunConfig(iterations=6, checkpoint_every=2, out_dir=tmp_path / "run", tensorboard=False)
        runner = Runner(plan.workflow, be, config, sch)
        results = runner.run()
        states = {c: be.control(c, "get_states") for c in ("gen", "learner", "dies")}
    finally:
        be.shutdown()
    assert (tmp_path / "died").exists() and len(runner.recoveries) == 1
    assert runner.recoveries[0]["restarted"] == ["dies"] and runner.recoveries[0]["from_checkpoint"] == 1
    assert [r.iteration for r in results] == list(range(6))
    assert float(states["dies"]["acc"]["total"]) == float(sum(range(6)))
    assert states["gen"]["weights"].item() == states["learner"]["weights"].item() == 5.0
    assert all(r.metrics["gen/lag"] <= 1 for r in results)


def test_a_windows_metrics_are_what_its_measured_iterations_did_over_its_seconds() -> None:
    """A throughput over a window is its work over its seconds (each line's rate times its `iteration_s` is
    its work), not the mean of the lines' rates; other metrics are means."""
    from interpreter.optimize.trials import window_metrics

    lines = [{"iteration_s": 1.0, "tokens_per_s": 100.0, "gen/lag": 1.0},
             {"iteration_s": 3.0, "tokens_per_s": 20.0, "gen/lag": 0.0}]
    got = window_metrics(lines, 2.0)  # the window: 160 tokens in 2 s (its iterations overlapped)
    assert got["tokens_per_s"] == 80.0 and got["gen/lag"] == 0.5
    assert got["iteration_s"] == 1.0 and got["window/iterations"] == 2.0
