"""Data-parallel replicas on the Ray backend (CPU, gloo): R replicas of the iteration, each on its own
processes and its share of the batch, with the trainer's gradients averaged over a process group set up
by rose, end with the weights one replica computes from the concatenated batch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from interpreter.backends import RayBackend, RayCompiledBackend
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


@pytest.fixture(scope="module")
def ray_session():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=4, include_dashboard=False, logging_level="ERROR")
    yield ray
    ray.shutdown()


def _weights(replicas: int, n: int, cls=RayBackend) -> list[torch.Tensor]:
    wf = load_workflow_text(DP.replace("__R__", str(replicas)).replace("__N__", str(n)), "dp.yaml")
    sch = Schedule(wf)
    be = cls(wf, ("tests.",), sch.program.loops_of)
    if isinstance(be, RayCompiledBackend):
        be.compile(sch)
    try:
        Runner(wf, be, RunConfig(iterations=4, tensorboard=False), sch).run()
        return [be.control(name, "get_states")["w"] for name in be.components() if name.startswith("model")]
    finally:
        be.shutdown()


@pytest.mark.parametrize("cls", [RayBackend, RayCompiledBackend])
def test_two_replicas_match_one_with_the_concatenated_batch(ray_session, cls) -> None:
    (single,) = _weights(1, 8, cls)
    pair = _weights(2, 4, cls)
    assert len(pair) == 2 and torch.equal(pair[0], pair[1])  # the replicas agree exactly
    assert torch.allclose(pair[0], single, rtol=0, atol=1e-12)  # and equal the single-process run
    assert not torch.equal(single, torch.zeros(3))


def test_mixed_replica_counts_and_local_backend_are_refused(tmp_path) -> None:
    text = DP.replace("__R__", "2").replace("__N__", "4")
    wf = tmp_path / "dp.yaml"
    wf.write_text(text)
    proc = subprocess.run([sys.executable, "-m", "rose_dsl.cli", "execute", str(wf), "--allow-module", "tests", "-n", "1"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 2 and "needs --backend ray" in proc.stderr
    wf.write_text(text.replace("replicas: 2}\n  model", "replicas: 1}\n  model"))
    proc = subprocess.run([sys.executable, "-m", "rose_dsl.cli", "execute", str(wf), "--allow-module", "tests", "-n", "1",
                           "--backend", "ray"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 2 and "different replica counts" in proc.stderr


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
    """The iteration loop's carry of replica r comes from replica r's previous iteration (found: the
    schedule kept one carry for all replicas, so replica 0 read replica 1's value and replica 1 failed)."""
    sch = Schedule(load_workflow_text(CARRY, "carry.yaml"))
    seen = {}
    for k in range(3):
        for r in range(2):
            def submit(step, r=r, k=k):
                seen[(k, r)] = step.handles
                return (f"y{k}.{r}",)

            sch.steps(k, submit, replica=r)
    assert seen == {(0, 0): (), (0, 1): (), (1, 0): ("y0.0",), (1, 1): ("y0.1",), (2, 0): ("y1.0",), (2, 1): ("y1.1",)}
