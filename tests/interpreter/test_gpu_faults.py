"""A fatal GPU error under MPS restarts the colocated processes together (issue 7).

Under MPS a fatal exception in one client fails every client on that GPU, and the server admits new
clients only after all of them have exited. rose therefore restarts the whole fault domain -- every MPS
process placed on the faulting GPU -- and restores all components from the last checkpoint. Here on the
CPU: a Ray cluster with one logical GPU, the two GPU components placed on it (run on the CPU, with an
MPS environment), a CPU component beside them; the GPU fault is the error text CUDA raises. The device
run with a real kernel fault is `benchmarks/gpu_faults.py`."""

from __future__ import annotations

import pytest

from interpreter.backends import RayBackend
from interpreter.runner import RunConfig, Runner
from interpreter.schedule import Schedule
from interpreter.worker import is_fatal_gpu_error
from rose_dsl import load_workflow_text
from tests.shared_ray import own_ray

FAULTY = """
rose: 1
name: gpu-fault
components:
  policy: {impl: "tests.mocks:GpuFaultOnce", args: {marker: "MARKER", at_call: 3}, device: gpu, state: [acc]}
  trainer: {impl: "tests.mocks:DiesOnce", args: {marker: "NEVER", at_call: 0}, device: gpu, state: [acc]}
  sim: {impl: "tests.mocks:Sleeper", args: {seconds: 0.0}}
iteration:
  count: 5
  body:
    - {node: act, call: policy.work, in: {x: iteration.i}, out: [y], state: {acc: update}}
    - {node: learn, call: trainer.work, in: {x: act.y}, out: [y], state: {acc: update}}
    - {node: step, call: sim.work, in: {x: learn.y}, out: [y]}
"""


def test_fatal_gpu_errors_are_recognised() -> None:
    assert is_fatal_gpu_error(RuntimeError("CUDA error: an illegal memory access was encountered"))
    assert is_fatal_gpu_error(RuntimeError("CUDA error: device-side assert triggered"))
    assert not is_fatal_gpu_error(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert not is_fatal_gpu_error(ValueError("illegal memory access in my parser"))  # not a CUDA error


@pytest.fixture(scope="module")
def ray_one_gpu():
    with own_ray(num_gpus=1) as ray:
        yield ray


@pytest.mark.e2e
@pytest.mark.parametrize("mps", [True, False])
@pytest.mark.parametrize("compiled", [False, True])
def test_fatal_gpu_error_restarts_the_colocated_mps_clients(tmp_path, ray_one_gpu, compiled, mps) -> None:
    wf = load_workflow_text(FAULTY.replace("MARKER", str(tmp_path / "faulted")).replace("NEVER", str(tmp_path / "x")),
                            "fault.yaml")
    sch = Schedule(wf)
    mps_env = {"policy": {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "75"},
               "trainer": {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25"}} if mps else None
    be = RayBackend(wf, ("tests.",), sch.program.loops_of, mps_env=mps_env, gpu_device="cpu")
    if compiled:
        be.compile(sch)
    try:
        assert be.placement.slot_of == {"policy": 0, "trainer": 0}
        before = dict(be.pids)
        runner = Runner(wf, be, RunConfig(iterations=5, out_dir=tmp_path / "run", checkpoint_every=1, tensorboard=False),
                        sch)
        results = runner.run()
        policy, trainer = (be.control(c, "get_states")["acc"] for c in ("policy", "trainer"))
        after = dict(be.pids)
    finally:
        be.shutdown()
    assert (tmp_path / "faulted").exists() and len(runner.recoveries) == 1
    rec = runner.recoveries[0]
    assert rec["gpu_fatal"] and "illegal memory access" in rec["failed"] and rec["from_checkpoint"] == 1
    # under MPS the whole GPU's clients restart together; without MPS only the faulting process
    assert rec["restarted"] == (["policy", "trainer"] if mps else ["policy"])
    assert (after["trainer"] != before["trainer"]) == mps and after["policy"] != before["policy"]
    assert after["sim"] == before["sim"]  # the CPU process is not in the fault domain
    # and the run ends as an uninterrupted one would
    assert [r.iteration for r in results] == [0, 1, 2, 3, 4]
    assert float(policy["total"]) == float(sum(range(5)))
    assert float(trainer["total"]) == float(sum(sum(range(i + 1)) for i in range(5)))
