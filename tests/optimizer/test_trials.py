"""The runtime's measuring side: complete iterations are training, captured inputs are the values the
region really received, local trials leave training state exactly as it was, CPU busy sampling."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import torch

from interpreter.backends import make_backend
from interpreter.cpu_activity import CpuActivity, thread_clock
from interpreter.optimize.executor import Executor
from interpreter.optimize.trials import TrialSession, trial_components
from rose_dsl import load_workflow
from rose_dsl.optimizer.decide import stop_repeating
from rose_dsl.optimizer.regions import Probe, local_graphs, probe_workflow
from rose_dsl.transforms import apply_request

ROOT = Path(__file__).resolve().parents[2]
FAST = {"iterations": 50, "steps": 3, "fixed_ms": 0.2, "per_row_ms": 0.01}


def _executor(wf, kind: str = "local", allowed: tuple[str, ...] = ("examples.",)) -> Executor:
    """Workers as `rose optimize` starts them: the backend factory's, per-call, compiled per plan on Ray."""
    allowed = (*allowed, "interpreter.optimize.trials")
    return Executor(wf, lambda w, s: make_backend(kind, w, s, compiled=False, allowed=allowed, log=lambda m: None),
                    compiled=kind == "ray", log=lambda m: None, extra_components=trial_components())


@pytest.fixture()
def session():
    wf = load_workflow(ROOT / "workflows" / "latency_interaction.yaml", FAST)
    s = TrialSession(wf, _executor(wf), log=lambda m: None)
    yield wf, s
    s.close()


def _same(a: dict, b: dict) -> bool:
    if a.keys() != b.keys():
        return False
    for k in a:
        x, y = a[k], b[k]
        if isinstance(x, dict):
            if not _same(x, y):
                return False
        elif isinstance(x, torch.Tensor):
            if not torch.equal(x, y):
                return False
        elif x != y:
            return False
    return True


def test_complete_iterations_are_training(session) -> None:
    wf, s = session
    runs = s.complete([wf], 2, warmup=1)[0]
    assert s.k == 3 and len(runs) == 2 and [r.iteration for r in runs] == [1, 2]
    assert [line["iteration"] for line in s.retained] == [0, 1, 2]
    act = [c for c in runs[0].calls if c.source == "iteration.epoch.step.act"]
    assert len(act) == 2 * 3 and all(c.rows == 64 for c in act)
    assert all(c.activity is not None and 0.0 <= c.activity <= 1.0 for c in runs[0].calls)


def test_local_trials_leave_training_state_as_it_was(session) -> None:
    wf, s = session
    s.complete([wf], 1)
    plan = apply_request(wf, "split epoch.step 2").workflow
    region = ("iteration", "epoch")
    c0, (c1,) = local_graphs(wf, [plan], region, 1, "interpreter.optimize.trials:Feed")
    pw = probe_workflow(wf, [Probe(1, region, c0.externals)], "interpreter.optimize.trials:Probe")
    captured = s.capture(pw)
    # the iteration index the epoch loop saw: training iteration 2 (complete() ran the plan's untimed first
    # iteration, then its timed one)
    assert captured[1]["v0"] == 2
    before = {c: s.executor.get_states(c) for c in wf.components}
    runs = s.local([c0, c1], 2, captured, 1)
    assert [len(r) for r in runs] == [2, 2]
    assert all(r.seconds > 0 and r.calls for rs in runs for r in rs)
    assert {c.rows for c in runs[1][0].calls if "act" in c.node} == {32}
    after = {c: s.executor.get_states(c) for c in wf.components}
    assert _same(before, after)
    assert s.books.local_runs == 6  # two graphs: one untimed run (start-up) and two timed each
    # not vacuous: running the comparison graph without the session's restore does change training state
    s.executor.run(c0.workflow, 0)
    assert not _same(before["sim"], s.executor.get_states("sim"))


def test_a_local_trial_abandons_a_graph_whose_first_run_is_clearly_slower(session) -> None:
    """give_up (the search's rule, here: slower than that many times the unchanged graph's first timed run)
    -- a graph it gives up on gets no more repeats (the unchanged graph itself always gets all of them); the state is restored as ever."""
    wf, s = session
    s.complete([wf], 1)
    plan = apply_request(wf, "split epoch.step 2").workflow
    region = ("iteration", "epoch")
    c0, (c1,) = local_graphs(wf, [plan], region, 1, "interpreter.optimize.trials:Feed")
    captured = s.capture(probe_workflow(wf, [Probe(1, region, c0.externals)], "interpreter.optimize.trials:Probe"))
    before = {c: s.executor.get_states(c) for c in wf.components}
    runs = s.local([c0, c1], 3, captured, 1, give_up=lambda ref, own: stop_repeating(ref, own, 1e-9, None))  # all slower
    assert [len(r) for r in runs] == [3, 1] and s.books.local_abandoned == 2
    assert _same(before, {c: s.executor.get_states(c) for c in wf.components})
    runs = s.local([c0, c1], 3, captured, 1, give_up=lambda ref, own: stop_repeating(ref, own, 1e9, None))  # none is
    assert [len(r) for r in runs] == [3, 3] and s.books.local_abandoned == 2


def test_plans_with_copies_share_the_workers_and_fold_their_metrics(session) -> None:
    wf, s = session
    temporal = apply_request(wf, "split-time epoch 2").workflow
    declared, split = s.complete([wf, temporal], 1)
    assert "sim@0" in s.executor.components() or "sim@1" in s.executor.components()
    for run in (declared[0], split[0]):
        assert not any("@" in k.split("/")[0] for k in run.metrics)
        assert run.metrics["sim/env_steps"] == 2 * 3 * 64


def test_finish_writes_a_resumable_checkpoint(tmp_path) -> None:
    from interpreter.checkpoint import latest_complete, load_checkpoint

    wf = load_workflow(ROOT / "workflows" / "latency_interaction.yaml", FAST)
    s = TrialSession(wf, _executor(wf), out_dir=tmp_path,
                     log=lambda m: None)
    try:
        s.complete([wf], 2)
        s.finish("plan.yaml")
    finally:
        s.close()
    ckpt = load_checkpoint(latest_complete(tmp_path / "checkpoints"))
    # three trained iterations: the plan's untimed first one and the two timed
    assert ckpt.iteration == 2 and set(ckpt.states) == {"sim", "policy", "trainer"}
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 3


def test_root_carries_are_refused() -> None:
    from dataclasses import replace

    from rose_dsl.expr import Int
    from rose_dsl.ir import Carry

    wf = load_workflow(ROOT / "workflows" / "latency_interaction.yaml", FAST)
    carried = replace(wf, root=replace(wf.root, carries=(Carry("x", Int(0, 0), Int(0, 1)),)))
    with pytest.raises(ValueError, match="carries values"):
        TrialSession(carried, _executor(wf))


def test_cpu_busy_fraction_tells_sleeping_from_computing() -> None:
    """Whatever the machine's load: the spinner runs until it has used 0.3 s of CPU (not for a wall-clock
    time, in which a loaded machine may give it almost none); both threads live until the window is read."""
    go, spun, leave = threading.Event(), threading.Event(), threading.Event()

    def sleeper() -> None:
        leave.wait(120)

    def spinner() -> None:
        go.wait(120)
        start = time.thread_time()
        while time.thread_time() - start < 0.3:
            pass
        spun.set()
        leave.wait(120)

    threads = [threading.Thread(target=sleeper), threading.Thread(target=spinner)]
    for t in threads:
        t.start()
    sleeping, spinning = (t.ident for t in threads)
    assert sleeping is not None and spinning is not None
    cpu = CpuActivity({"sleep": thread_clock(sleeping), "spin": thread_clock(spinning)}, period_s=0.01)
    try:
        cpu.poll()  # (samples on both sides of the window, whatever the sampler thread gets to do)
        t0 = time.perf_counter_ns()
        go.set()
        assert spun.wait(120)
        t1 = time.perf_counter_ns()
        cpu.poll()
        sleep, spin = cpu.busy("sleep", t0, t1), cpu.busy("spin", t0, t1)
    finally:
        leave.set()
        for t in threads:
            t.join()
        cpu.close()
    assert sleep is not None and spin is not None
    assert sleep < 0.02
    assert spin > 0 and spin > 10 * sleep
    assert cpu.busy("nobody", t0, t1) is None


@pytest.mark.e2e
def test_ray_compiled_executor_switches_plans_and_restores_state(ray_session) -> None:
    """The GPU path's mechanics on the CPU: plans switched on one set of Ray actors (recompiled), a
    temporal-split copy added as a new actor, a local trial that leaves training state as it was. (On the
    worker's Ray cluster, `ray_session`: a backend that finds none starts and stops its own.)"""
    wf = load_workflow(ROOT / "workflows" / "latency_interaction.yaml", FAST)
    s = TrialSession(wf, _executor(wf, "ray"), log=lambda m: None)
    try:
        split = apply_request(wf, "split epoch.step 2").workflow
        temporal = apply_request(wf, "split-time epoch 2").workflow
        runs = s.complete([wf, split, temporal], 1)
        assert [len(r) for r in runs] == [1, 1, 1] and s.k == 6  # each new plan: one untimed iteration first
        # each plan ran as a compiled graph of its own (no silent fall-back to per-call dispatch)
        assert s.executor.compiled and s.executor.backend.capabilities.compiled and s.executor.loads == 3
        assert any(c.startswith("sim@") for c in s.executor.components())
        for rs in runs:
            assert rs[0].metrics["sim/env_steps"] == 2 * 3 * 64
        region = ("iteration", "epoch")
        c0, (c1,) = local_graphs(wf, [split], region, 1, "interpreter.optimize.trials:Feed")
        captured = s.capture(probe_workflow(wf, [Probe(1, region, c0.externals)], "interpreter.optimize.trials:Probe"))
        before = {c: s.executor.get_states(c) for c in wf.components}
        local = s.local([c0, c1], 1, captured, 1)
        assert all(r[0].calls for r in local)
        assert _same(before, {c: s.executor.get_states(c) for c in wf.components})
    finally:
        s.close()


@pytest.mark.e2e
def test_training_goes_on_in_the_sessions_ray_processes(tmp_path: Path, ray_session) -> None:
    """`rose optimize --train` on Ray: after the optimizer's iterations (and a quota move that parked the
    old process), `train_on` trains the plan in the same actors to the last iteration -- the parked process
    stopped, the plan compiled -- and the run directory's metrics and final state are those of the declared
    workflow trained in one go."""
    n = 12
    wf = load_workflow(ROOT / "workflows" / "latency_interaction.yaml", {**FAST, "iterations": n})
    plan = apply_request(wf, "split epoch.step 2").workflow
    s = TrialSession(wf, _executor(wf, "ray"), out_dir=tmp_path / "run", log=lambda m: None)
    try:
        s.complete([wf, plan], 2)
        first = s.k
        s.replace_quota("policy", 94, {})
        assert set(s.executor.backend.parked) == {"policy"}
        results = s.train_on(plan, n, checkpoint_every=n)
        assert [r.iteration for r in results] == list(range(first, n)) and not s.executor.backend.parked
        assert s.executor.compiled and s.executor.backend.capabilities.compiled
        trained = {c: s.executor.get_states(c) for c in wf.components}
    finally:
        s.close()
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [d["iteration"] for d in lines] == list(range(n))
    one_go = TrialSession(wf, _executor(wf), log=lambda m: None)
    try:
        one_go.complete([wf], n - 1)  # (and its first iteration, untimed)
        assert one_go.k == n
        assert _same(trained, {c: one_go.executor.get_states(c) for c in wf.components})
    finally:
        one_go.close()


def test_training_that_goes_on_stops_at_a_signal_with_a_checkpoint_to_resume_from(tmp_path: Path) -> None:
    """A stop request (SIGTERM under `rose optimize --train`) ends the training after the iteration in
    progress, with a checkpoint of the last one done: `rose execute --plan --resume` goes on from there."""
    from interpreter.checkpoint import find_resumable

    wf = load_workflow(ROOT / "workflows" / "latency_interaction.yaml", {**FAST, "iterations": 20})
    s = TrialSession(wf, _executor(wf), out_dir=tmp_path / "run", log=lambda m: None)
    try:
        s.complete([wf], 2)
        done: list[int] = []
        results = s.train_on(wf, 20, on_iteration=lambda r: done.append(r.iteration), stop=lambda: len(done) >= 4)
    finally:
        s.close()
    assert [r.iteration for r in results] == [3, 4, 5, 6]
    ckpt, _ = find_resumable(tmp_path / "run" / "checkpoints")
    assert ckpt is not None and ckpt.iteration == 6


BROKEN = """
rose: 1
name: broken-split
params: {rows: 8}
components:
  prompts: {impl: "examples.bench.latency:Source", args: {num_envs: 8, fixed_ms: 0.1, per_row_ms: 0.0}, device: cpu}
  gen: {impl: "examples.bench.latency:Policy", args: {num_envs: 8, fixed_ms: 0.1, per_row_ms: 0.0}, device: cpu, state: [weights]}
  scorer: {impl: "tests.optimizer.components:NoRows", device: cpu, state: [seen]}
  learner: {impl: "examples.bench.latency:Trainer", args: {fixed_ms: 0.1, per_row_ms: 0.0}, device: cpu, state: [weights, optimizer]}
iteration:
  count: 20
  body:
    - {node: sample, call: prompts.sample, in: {it: iteration.i}, out: [x], batch: {dim: 0, size: 8}}
    - {node: generate, call: gen.act, in: {obs: sample.x, it: iteration.i}, state: {weights: read}, out: [action, value], batch: {dim: 0, size: 8}}
    - {node: learn, call: learner.update, in: {batch: "{generate.action, generate.value}"}, state: {weights: update, optimizer: update}}
    - {node: score, call: scorer.score, in: {x: generate.action}, state: {seen: update}, out: [s], batch: {dim: 0, size: 8}}
    - {node: publish, call: learner.get_weights, state: {weights: read}, out: [w]}
    - {node: sync, call: gen.load_weights, in: {w: publish.w}, state: {weights: refresh}}
"""


def test_a_failing_candidate_loses_its_trial_not_the_training() -> None:
    """Splitting `score` fails (it changes per-row state but takes no rows=) after the learner already updated its
    weights in that iteration: the state is put back, the iteration is trained again, and training ends
    exactly where a run of the declared workflow alone ends."""
    from rose_dsl import load_workflow_text

    wf = load_workflow_text(BROKEN, "broken.yaml")
    bad = apply_request(wf, "split score 2").workflow
    runs = []
    # the reference trains as many iterations as the session with the failure: there, the declared plan's
    # first iteration after the failed one is training again (the workers had switched away from it)
    for plans, rounds in (([wf, bad], 3), ([wf], 4)):
        s = TrialSession(wf, _executor(wf, allowed=("examples.", "tests.")), log=lambda m: None)
        try:
            out = s.complete(plans, rounds)
            runs.append((out, dict(s.last_failures), s.k, {c: s.executor.get_states(c) for c in wf.components}))
        finally:
            s.close()
    (out, failures, k, states), (_, _, k_ref, ref_states) = runs
    assert list(failures) == [1] and "rows" in failures[1]
    # 3 timed + the declared plan's untimed first iteration + its untimed first iteration after the failure
    assert out[1] == [] and len(out[0]) == 3 and k == k_ref == 5
    assert _same(states, ref_states)


def test_switching_back_to_a_plan_reloads_its_nodes(session) -> None:
    """Two plans name different nodes by one path (`act@0` takes 32 rows in two groups, 16 in four): each
    switch loads the plan's own nodes onto the workers, so going back to the first plan runs its rows,
    not those of the plan loaded last."""
    wf, s = session
    two, four = (apply_request(wf, f"split epoch.step {g}").workflow for g in (2, 4))
    runs = s.complete([two, four], 2)  # A B, then B A: A runs after B
    for plan_runs, rows in zip(runs, (32, 16), strict=True):
        for run in plan_runs:
            assert {c.rows for c in run.calls if c.source == "iteration.epoch.step.act"} == {rows}
            assert run.metrics["sim/env_steps"] == 2 * 3 * 64
    assert s.executor.loads == 3


def test_a_process_moved_under_a_new_quota_gets_a_warm_up_iteration(session, monkeypatch) -> None:
    """After `replace_quota` (a new process: its first calls compile, capture CUDA graphs, fill the
    allocator) the next complete iteration of the same plan is training, not a measurement."""
    wf, s = session
    moved: list[tuple[str, int]] = []
    monkeypatch.setattr(s.executor, "replace_quota", lambda comp, quota, env, **kw: moved.append((comp, quota)) or {})
    s.complete([wf], 1)  # the plan's first iteration (untimed) + one measured
    assert s.k == 2
    s.complete([wf], 1)  # no switch: measured at once
    assert s.k == 3
    s.replace_quota("policy", 50, {})
    runs = s.complete([wf], 1)
    assert moved == [("policy", 50)] and s.k == 5 and len(runs[0]) == 1


def test_pending_work_is_joined_after_the_warm_up_and_before_the_first_timed_iteration(session) -> None:
    """The quota self-check started beside the start-up (`CheckPrefetch`) is joined through `pending`: the
    untimed warm-up iteration runs beside it (it waited before the warm-up, 10-12 s on an H100), no timed
    iteration or local trial does, and it runs once."""
    wf, s = session
    joined: list[tuple[int, int]] = []
    s.pending.append(lambda: joined.append((s.k, len(s.retained))))
    runs = s.complete([wf], 2, warmup=1)[0]
    assert joined == [(1, 1)]  # after the warm-up's iteration (k counts it), before any timed one
    assert len(runs) == 2 and not s.pending
    s.complete([wf], 1)
    assert joined == [(1, 1)]  # once
    s.pending.append(lambda: joined.append((s.k, -1)))
    s.local([], 1, {}, 0)  # a local trial is a measurement too
    assert joined[-1] == (s.k, -1)


def test_the_session_counts_elapsed_time_from_the_commands_start() -> None:
    """`rose optimize` passes its own start: stage 1's share of the budget and stage 2's deadline are then on
    one clock, the processes' start-up counted in both (it was in stage 2's alone)."""
    import time

    wf = load_workflow(ROOT / "workflows" / "latency_interaction.yaml", FAST)
    before = time.perf_counter() - 100.0
    s = TrialSession(wf, _executor(wf), log=lambda m: None, started=before)
    try:
        assert s.elapsed() >= 100.0
    finally:
        s.close()
    fresh = TrialSession(wf, _executor(wf), log=lambda m: None)
    try:
        assert fresh.elapsed() < 100.0
    finally:
        fresh.close()
