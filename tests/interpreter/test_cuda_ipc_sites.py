"""Which compiled calls send CUDA tensors by IPC (interpreter/tensor_transport.py `ipc_sites`, the Ray
compiled iteration's `device_sites`): only a call whose every reader is another process on the producer's GPU, in a
method that takes device tensors, and never the driver. The transfer itself needs a GPU: it is exercised on
the H200 by benchmarks/weight_transfer.py (bit-identical weights, benchmarks/results/weight_transfer.json)
and by the paper table's runs."""

from __future__ import annotations

import pytest

from interpreter.tensor_transport import ipc_sites

SLOTS = {"trainer": 0, "policy": 0, "sim": None, "other_gpu": 1}
TAKES = {"policy": {"load_weights"}, "other_gpu": {"load_weights"}, "trainer": set()}


def _sites(readers, to_driver=frozenset(), producer=None):
    producer = producer or {1: "trainer"}
    return ipc_sites(producer, readers, set(to_driver), SLOTS, TAKES)


def test_a_call_read_only_by_a_device_method_on_the_same_gpu_goes_by_ipc() -> None:
    assert _sites({1: [("policy", "load_weights")]}) == {"trainer": {1}}


@pytest.mark.parametrize("readers, to_driver, why", [
    ({1: [("policy", "act")]}, (), "the reading method takes CPU tensors"),
    ({1: [("policy", "load_weights"), ("sim", "step")]}, (), "one reader is a CPU process"),
    ({1: [("other_gpu", "load_weights")]}, (), "the reader is on another GPU"),
    ({1: [("trainer", "update"), ("policy", "load_weights")]}, (), "the producer reads it itself"),
    ({1: [("policy", "load_weights")]}, (1,), "the driver reads it"),
    ({}, (), "nobody reads it"),
])
def test_any_other_reader_keeps_the_host_path(readers, to_driver, why) -> None:
    assert _sites(readers, to_driver) == {}, why


def test_a_cpu_producer_never_uses_ipc() -> None:
    assert _sites({1: [("policy", "load_weights")]}, producer={1: "sim"}) == {}


def test_the_ray_backend_knows_who_reads_each_compiled_call(ray_session) -> None:
    """On a compiled graph (CPU here), the trainer's publish is read by the policy's load_weights only;
    with both processes given one GPU slot, that call and only that one is an IPC site."""
    from interpreter.backends import RayBackend
    from interpreter.schedule import Schedule
    from rose_dsl import load_workflow_text

    wf = load_workflow_text("""
rose: 1
name: ipc
components:
  sim: {impl: "tests.mocks:Mock", args: {name: sim, behaviors: {step: {out: [obs]}}}}
  policy: {impl: "tests.mocks:Mock", args: {name: policy, behaviors: {act: {out: [action]}, load_weights: {}}}}
  trainer: {impl: "tests.mocks:Mock", args: {name: trainer, behaviors: {update: {out: [loss]}, publish: {out: [w]}}}}
iteration:
  count: 2
  body:
    - {node: act, call: policy.act, in: {it: iteration.i}, out: [action]}
    - {node: env, call: sim.step, in: {a: act.action}, out: [obs]}
    - {node: upd, call: trainer.update, in: {o: env.obs}, out: [loss]}
    - {node: publish, call: trainer.publish, in: {l: upd.loss}, out: [w]}
    - {node: sync, call: policy.load_weights, in: {w: publish.w}}
""", "ipc.yaml")
    sch = Schedule(wf)
    be = RayBackend(wf, ("tests.",), sch.program.loops_of)
    try:
        be.compile(sch)
        graph = be.compiled
        assert graph is not None and be.dag is graph.dag
        slots = {"policy": 0, "trainer": 0, "sim": None}
        plan = graph.device_sites(slots, {"policy": {"load_weights"}, "trainer": set()})
        assert list(plan) == ["trainer"] and len(plan["trainer"]) == 1
        (site,) = plan["trainer"]
        assert graph.readers[site] == [("policy", "load_weights")]
        # the policy's act goes to a CPU process, the update's loss to the trainer itself: never IPC
        assert graph.device_sites({**slots, "sim": 0}, {"policy": {"load_weights"}, "sim": set()}) == plan
        assert graph.device_sites(slots, {"policy": set(), "trainer": set()}) == {}
    finally:
        be.shutdown()


def test_a_site_keeps_the_clones_of_its_last_two_calls_until_the_graph_changes() -> None:
    from interpreter import tensor_transport as tt

    try:
        for _ in range(3):
            tt.device_site("publish")
            tt._KEPT["publish"][-1].append(object())  # what pack keeps for the call's readers
        assert len(tt._KEPT["publish"]) == 2 and tt.current_site() == "publish"
        tt.device_site(None)  # a call that is no site keeps nothing and sends through the host
        assert tt.current_site() is None and len(tt._KEPT["publish"]) == 2
        tt.release_sites()  # a new graph: the old one's readers are gone
        assert tt._KEPT == {}
    finally:
        tt.device_site(None)
        tt.release_sites()


def _producer(conn) -> None:  # a process of its own (spawned): packs a CUDA tensor as an IPC site would
    import pickle

    import torch

    from interpreter import tensor_transport as tt

    t = torch.arange(1 << 20, dtype=torch.float32, device="cuda")
    tt.device_site("publish")
    conn.send(pickle.dumps(tt.pack(t), protocol=5))
    t.add_(1.0)  # the producer changes its tensor after sending: the reader must not see it
    conn.recv()  # keep the process (and the transport's clone) until the reader is done


@pytest.mark.skipif(not __import__("torch").cuda.is_available(),
                    reason="needs a CUDA GPU: CUDA IPC between two processes on one GPU; exercised on the H200 by "
                           "benchmarks/weight_transfer.py (results/weight_transfer.json, bit-identical)")
def test_a_cuda_tensor_crosses_by_ipc_as_a_private_copy() -> None:
    import multiprocessing as mp
    import pickle

    import torch

    from interpreter.tensor_transport import unpack

    ctx = mp.get_context("spawn")
    here, there = ctx.Pipe()
    proc = ctx.Process(target=_producer, args=(there,))
    proc.start()
    try:
        packed = pickle.loads(here.recv())
        assert packed[0] == "ipc"
        got = unpack(packed)
        assert got.device.type == "cuda" and torch.equal(got, torch.arange(1 << 20, dtype=torch.float32, device="cuda"))
        got.add_(5.0)  # the reader's own: writable, nobody else sees it
    finally:
        here.send("done")
        proc.join(30)
