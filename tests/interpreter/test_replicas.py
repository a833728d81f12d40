"""Data-parallel replicas on the Ray backend (CPU, gloo): R replicas of the iteration, each on its own
processes and its share of the batch, with the trainer's gradients averaged over a process group set up
by rose, end with the weights one replica computes from the concatenated batch."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from interpreter.backends import RayBackend
from interpreter.runner import RunConfig, Runner
from interpreter.schedule import Schedule
from rose_dsl import load_workflow_text

ROOT = Path(__file__).resolve().parents[2]

DP = """
rose: 1
name: dp
params: {n: __N__, replicas: __R__}
components:
  data: {impl: "tests.mocks:DataShard", args: {n: "${n}"}, replicas: __R__}
  model: {impl: "tests.mocks:DPRegressor", args: {lr: 0.1}, state: [w], replicas: __R__}
iteration:
  count: 4
  body:
    - {node: b, call: data.batch, in: {it: iteration.i}, out: [x, y]}
    - {node: u, call: model.update, in: {x: b.x, y: b.y}, state: {w: update}}
"""


def _weights(replicas: int, n: int, compiled: bool = False) -> list[torch.Tensor]:
    wf = load_workflow_text(DP.replace("__R__", str(replicas)).replace("__N__", str(n)), "dp.yaml")
    sch = Schedule(wf)
    be = RayBackend(wf, ("tests.",), sch.program.loops_of)
    if compiled:
        be.compile(sch)
    try:
        Runner(wf, be, RunConfig(iterations=4, tensorboard=False), sch).run()
        return [be.control(name, "get_states")["w"] for name in be.components() if name.startswith("model")]
    finally:
        be.shutdown()


@pytest.fixture(scope="module")
def weights(ray_session):
    """`_weights`, each configuration run once for the module: the one-process run with all rows is the
    reference of several tests."""
    runs: dict[tuple[int, int, bool], list[torch.Tensor]] = {}

    def get(replicas: int, n: int, compiled: bool = False) -> list[torch.Tensor]:
        if (replicas, n, compiled) not in runs:
            runs[replicas, n, compiled] = _weights(replicas, n, compiled)
        return [w.clone() for w in runs[replicas, n, compiled]]

    return get


@pytest.mark.e2e
@pytest.mark.parametrize("compiled", [False, True])
def test_two_replicas_match_one_with_the_concatenated_batch(weights, compiled) -> None:
    (single,) = weights(1, 8, compiled)
    pair = _weights(2, 4, compiled)
    assert len(pair) == 2 and torch.equal(pair[0], pair[1])  # the replicas agree exactly
    assert torch.allclose(pair[0], single, rtol=0, atol=1e-12)  # and equal the single-process run
    assert not torch.equal(single, torch.zeros(3))


def test_unmappable_replica_counts_and_local_backend_are_refused(tmp_path) -> None:
    text = DP.replace("__R__", "2").replace("__N__", "4")
    wf = tmp_path / "dp.yaml"
    wf.write_text(text)
    # (without --backend, a replicated workflow runs on Ray: the local backend is refused only when asked for)
    proc = subprocess.run([sys.executable, "-m", "rose_cli", "execute", str(wf), "--allow-module", "tests", "-n", "1",
                           "--backend", "local"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 2 and "needs --backend ray" in proc.stderr
    wf.write_text(text.replace("replicas: 2}\n  model", "replicas: 1}\n  model"))
    proc = subprocess.run([sys.executable, "-m", "rose_cli", "execute", str(wf), "--allow-module", "tests", "-n", "1",
                           "--backend", "ray"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 2 and "declare `shard: DIM` on 'u'" in proc.stderr, proc.stderr
    wf.write_text(text.replace("replicas: 2}\niteration", "replicas: 3}\niteration"))
    proc = subprocess.run([sys.executable, "-m", "rose_cli", "execute", str(wf), "--allow-module", "tests", "-n", "1",
                           "--backend", "ray"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 2 and "one replica count must divide the other" in proc.stderr, proc.stderr
    assert re.search(rf"{re.escape(str(wf))}:\d+:\d+: iteration\.u\.in\.[xy]: ", proc.stderr)  # at the edge's `in:`
    # the counts are static: `rose validate` says the same (user-error sweep 2026-12-05, BUG_21: it said "valid")
    proc = subprocess.run([sys.executable, "-m", "rose_cli", "validate", str(wf)], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert proc.returncode == 2 and "one replica count must divide the other" in proc.stderr, proc.stderr


@pytest.mark.parametrize("workflow,counts", [
    ("embodied_ppo.yaml", [{"replicas": r, "trainer_replicas": t} for r in (1, 2, 3, 4) for t in (1, 2, 3, 4, 6)]),
    ("latency_sim_processes.yaml", [{"sim_replicas": r, "num_envs": 24} for r in (1, 2, 3, 4, 6)]),
])
def test_the_static_replica_check_refuses_exactly_what_the_runtime_cannot_map(workflow, counts) -> None:
    """`rose_dsl.replicas.replica_problems` (run by every command when the workflow loads) and the runtime's
    mapping (`for_replica`, run over two iterations by `check_replica_edges`) agree on every replica count of
    the shipped replicated workflows: the static check refuses a workflow exactly when the runtime would."""
    from interpreter.schedule import check_replica_edges
    from rose_dsl.build import build_workflow
    from rose_dsl.loader import load_file
    from rose_dsl.replicas import replica_problems

    doc = load_file(ROOT / "workflows" / workflow)
    refused = 0
    for sets in counts:
        wf = build_workflow(doc, sets)  # built, not checked: both checks see the same IR
        static = replica_problems(wf)
        try:
            check_replica_edges(wf)
            runtime = None
        except ValueError as exc:
            runtime = str(exc)
        assert (runtime is None) == (not static), (sets, runtime, [d.message for d in static])
        refused += bool(static)
    assert 0 < refused < len(counts) or workflow == "latency_sim_processes.yaml"


CARRY = """
rose: 1
name: carry
components:
  m: {impl: "tests.mocks:Sleeper", args: {seconds: 0.0}, replicas: 2}
iteration:
  count: 3
  carry: {s: {init: "1", next: a.y}}
  body:
    - {node: a, call: m.work, in: {x: iteration.s}, out: [y]}
"""


def test_each_replica_carries_its_own_values_between_iterations() -> None:
    """The iteration loop's carry of replica r comes from replica r's previous iteration (found: when the
    runner scheduled each replica in turn on one schedule, replica 0 read replica 1's carried value)."""
    from interpreter.schedule import replicated

    wf = load_workflow_text(CARRY, "carry.yaml")
    sch = Schedule(wf)
    seen = {}
    for k in range(3):
        def submit(step, r, k=k):
            seen[(k, r)] = step.handles
            return (f"y{k}.{r}",)

        sch.steps(k, replicated(submit, wf))
    assert seen == {(0, 0): (), (0, 1): (), (1, 0): ("y0.0",), (1, 1): ("y0.1",), (2, 0): ("y1.0",), (2, 1): ("y1.1",)}


@pytest.mark.parametrize("compiled", [False, True])
def test_hybrid_fewer_data_replicas_than_trainer_replicas(weights, compiled) -> None:
    """The hybrid placement: one data replica with all 8 rows feeds two trainer replicas, each taking a
    shard (`shard: 0`); they end with the weights of one trainer on all rows."""
    text = (DP.replace("__N__", "8").replace("replicas: __R__}\n  model", "replicas: 1}\n  model")
            .replace("replicas: __R__}\niteration", "replicas: 2}\niteration").replace("__R__", "2")
            .replace("state: {w: update}}", "state: {w: update}, shard: 0}"))
    wf = load_workflow_text(text, "hybrid.yaml")
    assert wf.components["data"].replicas == 1 and wf.components["model"].replicas == 2
    sch = Schedule(wf)
    be = RayBackend(wf, ("tests.",), sch.program.loops_of)
    if compiled:
        be.compile(sch)
    try:
        Runner(wf, be, RunConfig(iterations=4, tensorboard=False), sch).run()
        pair = [be.control(name, "get_states")["w"] for name in be.components() if name.startswith("model")]
    finally:
        be.shutdown()
    (single,) = weights(1, 8)
    assert len(pair) == 2 and torch.equal(pair[0], pair[1])
    assert torch.allclose(pair[0], single, rtol=0, atol=1e-12)


def test_for_replica_maps_fan_out_fan_in_and_refuses_mixes() -> None:
    """How replica j of a consumer builds an input from a producer with another replica count."""
    from dataclasses import replace

    from interpreter.recipe import Cat, Leaf, evaluate
    from interpreter.schedule import ReplicaSet, Step, for_replica

    sch = Schedule(load_workflow_text(DP.replace("__R__", "1").replace("__N__", "4"), "dp.yaml"))
    (_, node_step), = [(s, s) for s, _ in sch.steps(0, lambda step: ("x", "y")[: len(step.node.outputs) or 1])
                       if s.node.name == "u"]
    values = {f"x{r}": torch.arange(4.0).reshape(2, 2) + 10 * r for r in range(4)}
    two = ReplicaSet(("x0", "x1"), "data")
    step = Step(node_step.inv, replace(node_step.node, shard=0), (("x", Leaf(0)),), (two,))
    # fan-out: 4 consumer replicas from 2 producers, shard along dim 0
    got = [for_replica(step, j, 4) for j in range(4)]
    out = [evaluate(g.recipe[0][1], [values[h] for h in g.handles]) for g in got]
    assert [o.tolist() for o in out] == [[[0, 1]], [[2, 3]], [[10, 11]], [[12, 13]]]
    # fan-in: 1 consumer from 2 producers: concatenated along shard, or the first without shard
    (cat,) = [for_replica(step, 0, 1)]
    assert evaluate(cat.recipe[0][1], [values[h] for h in cat.handles]).shape == (4, 2)
    first = for_replica(replace(step, node=replace(step.node, shard=None)), 0, 1)
    assert first.handles == ("x0",)
    # fan-out without shard, and a port mixing counts, are refused
    with pytest.raises(ValueError, match="declare `shard: DIM`"):
        for_replica(replace(step, node=replace(step.node, shard=None)), 1, 4)
    mixed = Step(step.inv, step.node, (("x", Cat((Leaf(0), Leaf(1)), 0)),), (two, ReplicaSet(("a", "b", "c"), "other")))
    with pytest.raises(ValueError, match="mixes values from components with different replica counts"):
        for_replica(mixed, 0, 2)
