"""GPU placement of replicas (issue 8): replica r of a component runs on GPU slot `gpu + r`; the slots
are the bundles of one Ray placement group (distinct GPUs); processes on one slot share its GPU.
Colocated: every component on the same slots; disaggregated: components on disjoint slots. Run here on
a Ray cluster with logical GPUs (the processes compute on the CPU)."""

from __future__ import annotations

import pytest

from interpreter.ray_backend import GpuPlacement, RayBackend
from interpreter.worker import CallFailed, component_of, replica_name, replica_of
from rose_dsl import load_workflow_text
from tests.shared_ray import own_ray

WF = """
rose: 1
name: placed
params: {replicas: 2, policy_gpu: 0, trainer_gpu: 0}
components:
  sim: {impl: "tests.mocks:DataShard", replicas: "${replicas}"}
  policy: {impl: "tests.mocks:DataShard", device: gpu, gpu: "${policy_gpu}", replicas: "${replicas}"}
  trainer: {impl: "tests.mocks:DataShard", device: gpu, gpu: "${trainer_gpu}", replicas: "${replicas}"}
iteration:
  count: 1
  body:
    - {node: b, call: policy.batch, in: {it: iteration.i}, out: [x, y]}
"""


def _placement(**params: int) -> GpuPlacement:
    return GpuPlacement.of(load_workflow_text(WF, "placed.yaml", params))


def test_colocated_and_disaggregated_slots() -> None:
    colocated = _placement()
    assert colocated.slot_of == {"policy": 0, "policy#1": 1, "trainer": 0, "trainer#1": 1}
    # each bundle is split among its processes and one more (a process moved to another quota: actor_moves.py)
    assert colocated.slots == 2 and colocated.share(0) == pytest.approx(1 / 3) and colocated.distinct("trainer")
    apart = _placement(trainer_gpu=2)
    assert apart.slot_of == {"policy": 0, "policy#1": 1, "trainer": 2, "trainer#1": 3}
    assert apart.slots == 4 and apart.share(3) == 0.5
    assert apart.describe() == "GPU 0: policy; GPU 1: policy#1; GPU 2: trainer; GPU 3: trainer#1"
    shared = _placement(replicas=2, policy_gpu=0, trainer_gpu=0)
    assert shared.distinct("policy")
    one_gpu = GpuPlacement({"trainer": 0, "trainer#1": 0})
    assert not one_gpu.distinct("trainer")  # NCCL would refuse: gloo is used


@pytest.fixture(scope="module")
def ray_four_gpus():
    with own_ray(num_gpus=4) as ray:  # logical GPUs: a cluster of the module's own, not the worker's shared one
        yield ray


def _visible_gpus(be: RayBackend) -> dict[str, str | None]:
    return {p: be.control(p, "info")["visible_gpus"] for p in be.components()}


@pytest.fixture(scope="module")
def colocated(ray_four_gpus):
    """The colocated workflow's processes (two replicas; trainer on the policy's slots), started once for
    the module (six Ray worker processes), with what each saw at start-up. It holds two of the cluster's
    four GPUs until the module ends: the disaggregated case (four slots) runs before it is started, and
    the test that kills some of its processes comes last."""
    be = RayBackend(load_workflow_text(WF, "placed.yaml", {"trainer_gpu": 0}), ("tests.",), {}, gpu_device="cpu")
    try:
        yield be, _visible_gpus(be)
    finally:
        be.shutdown()


@pytest.mark.e2e
@pytest.mark.parametrize("trainer_gpu", [2, 0])  # (2 first: see `colocated`)
def test_processes_land_on_their_slots(ray_four_gpus, trainer_gpu, request) -> None:
    if trainer_gpu == 0:
        _, seen = request.getfixturevalue("colocated")
    else:
        wf = load_workflow_text(WF, "placed.yaml", {"trainer_gpu": trainer_gpu})
        be = RayBackend(wf, ("tests.",), {}, gpu_device="cpu")
        try:
            seen = _visible_gpus(be)
        finally:
            be.shutdown()
    assert seen["sim"] is None or seen["sim"] == ""  # CPU processes get no GPU
    gpu_of = {p: v for p, v in seen.items() if not p.startswith("sim")}
    assert all(v and "," not in v for v in gpu_of.values())  # one GPU each
    assert gpu_of["policy"] != gpu_of["policy#1"]
    if trainer_gpu == 0:  # colocated: a replica's policy and trainer share a GPU
        assert gpu_of["trainer"] == gpu_of["policy"] and gpu_of["trainer#1"] == gpu_of["policy#1"]
    else:  # disaggregated: four distinct GPUs
        assert len(set(gpu_of.values())) == 4


def test_more_slots_than_gpus_is_a_clear_error(ray_four_gpus) -> None:
    wf = load_workflow_text(WF, "placed.yaml", {"replicas": 3, "trainer_gpu": 3})
    with pytest.raises(CallFailed, match="places processes on 6 GPUs .* but the Ray cluster has 4"):
        RayBackend(wf, ("tests.",), {}, gpu_device="cpu")


def test_dead_processes_are_found_in_one_timeout_not_one_each(colocated) -> None:
    """`dead_components` asks every process at once: with several dead it answers within its timeout
    (one by one, each dead process cost the whole timeout: a minute when Ray's services died under a run;
    that case is not reproduced here -- a killed actor is reported at once -- the bound is the contract)."""
    import os
    import signal
    import time

    be, _ = colocated  # (the workflow with replicas: 2; its processes are not used after this test)
    assert be.dead_components(timeout=5) == []
    pids = {p: be.control(p, "info")["pid"] for p in be.components()}
    victims = ["sim#1", "policy", "trainer#1"]
    for p in victims:
        os.kill(pids[p], signal.SIGKILL)
    time.sleep(1.0)
    waits: list[tuple[int, float | None]] = []  # (references waited on, timeout) of each ray.wait
    real_wait = be.ray.wait

    def counting_wait(refs, *args, **kwargs):  # type: ignore[no-untyped-def]
        waits.append((len(refs), kwargs.get("timeout")))
        return real_wait(refs, *args, **kwargs)

    be.ray.wait = counting_wait
    try:
        dead = be.dead_components(timeout=3)
    finally:
        be.ray.wait = real_wait
    assert sorted(dead) == sorted(victims) and dead == [p for p in be.components() if p in victims]
    # all at once: one wait for every process that took the question, bounded by one timeout -- not one
    # wait (and one timeout) per process; counted, not timed, so a loaded machine cannot fail it
    assert len(waits) == 1 and waits[0][1] == 3 and waits[0][0] <= len(be.components())


ONE_GPU = """
rose: 1
name: one-gpu
components:
  policy: {impl: "tests.mocks:DataShard", device: gpu}
  trainer: {impl: "tests.mocks:DataShard", device: gpu}
iteration:
  count: 1
  body:
    - {node: b, call: policy.batch, in: {it: iteration.i}, out: [x, y]}
"""


def test_a_process_moved_to_another_quota_starts_beside_the_one_it_parks(ray_four_gpus) -> None:
    """Stage 2 moves a process to a trial quota and back (`actor_moves.py`): the new process starts while
    the old one is still alive, parked, on the same GPU -- the slot's bundle keeps room for one process more
    (with the bundle split exactly among the workflow's processes, the new one waited for a share that
    never came) -- and the move back hands the state to the parked process instead of starting a third."""
    from interpreter.procs import pid_alive

    be = RayBackend(load_workflow_text(ONE_GPU, "one.yaml"), ("tests.",), {}, gpu_device="cpu", start_timeout_s=30)
    try:
        first = be.control("policy", "info")
        moved = be.replace_actor("policy", 94, {}, keep=True)
        assert moved["pid"] != first["pid"] and moved["visible_gpus"] == first["visible_gpus"]
        assert be.parked["policy"].pid == first["pid"] and pid_alive(first["pid"])
        back = be.replace_actor("policy", None, {}, keep=True)
        assert back["pid"] == first["pid"] and be.parked["policy"].pid == moved["pid"]
        other = be.replace_actor("trainer", 94, {}, keep=True)  # one parked process per GPU: the policy's goes
        assert set(be.parked) == {"trainer"} and other["visible_gpus"] == first["visible_gpus"]
    finally:
        be.shutdown()
    assert not be.parked


@pytest.mark.parametrize("component, replica", [("policy", 0), ("policy", 3), ("sim@1", 0), ("sim@1", 2)])
def test_a_process_name_reads_back_as_its_component_and_replica(component, replica) -> None:
    """`replica_of` is `replica_name`'s inverse, the one place the runtime reads a process name back."""
    name = replica_name(component, replica)
    assert replica_of(name) == (component, replica)
    assert component_of(name) == component
