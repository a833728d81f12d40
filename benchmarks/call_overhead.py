"""Per-call cost of real work through rose: one component call (the policy's `act`, and the simulator's
`step`) called directly in one process, through rose's worker wrapper, and inside `rose execute` on the
local and the Ray backends -- interleaved round by round, with a breakdown of where the difference goes.

Variants (each round runs every variant once; per-call medians over the rounds' calls):
  direct           the component objects in this process, act -> sync -> step, nothing else running
  direct_nosync    the same, act timed to host return (how much of act is the device catching up)
  worker           act/step through `ComponentWorker.call` in this process (recipe evaluation, output
                   checks, device sync, the trace record), outputs left where they are (local backend)
  worker_to_cpu    the same with the outputs moved to the CPU, as a Ray worker does (output transfer)
  direct_1thread   direct with one intra-op CPU thread (what Ray gives an actor with num_cpus=0)
  direct_gil       direct, while a second simulator steps in a thread of this process (GIL contention,
                   what threads of the local backend suffer when components overlap)
  rose_local       one RL iteration of the workflow through `Runner` on the local backend (from the trace)
  rose_ray         the same on the Ray backend, compiled (one process per component)
  rose_ray_mps     (GPU, MPS available) the same with every GPU process an MPS client at its quota --
                   in a second phase, interleaved with `direct_phase2` (one Ray backend holds the GPU at a time)
Also measured: pickling act's inputs and outputs (what Ray does to them between processes) and the
cost of one trace record (worker tuple -> InvocationRecord -> trace).

    python benchmarks/call_overhead.py --out $OUT/call_overhead.json             # GPU: embodied_ppo_gpu
    python benchmarks/call_overhead.py --smoke --out /tmp/call_overhead.json     # CPU, tiny, a minute
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.dispatch import machine  # noqa: E402


def _sync() -> None:
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def _stats(ms: list[float]) -> dict[str, float]:
    if not ms:
        return {}
    q = statistics.quantiles(ms, n=4) if len(ms) > 1 else [ms[0]] * 3
    return {"median_ms": statistics.median(ms), "p25_ms": q[0], "p75_ms": q[2], "n": len(ms)}


class Direct:
    """The workflow's policy and simulator objects in this process, driven as the rollout drives them."""

    def __init__(self, wf: Any, device: str, allowed: tuple[str, ...]) -> None:
        from interpreter.components import construct

        self.wf = wf
        dev = {name: device if c.device == "gpu" else "cpu" for name, c in wf.components.items()}
        self.policy = construct(wf.components["policy"], wf.seed, dev["policy"], allowed)
        self.sim = construct(wf.components["sim"], wf.seed, dev["sim"], allowed)
        self.sim2 = construct(wf.components["sim"], wf.seed + 1, dev["sim"], allowed)  # the GIL neighbour
        self.steps = int(wf.params["steps"])

    def rollout(self, act: Callable[..., Any], step: Callable[..., Any], timed: dict[str, list[float]],
                sync: bool = True) -> None:
        """One rollout epoch: reset, then `steps` x (act, step), timing each call."""
        obs = self.sim.reset(it=0, ep=0)["obs"]
        for t in range(self.steps):
            t0 = time.perf_counter()
            out = act(obs=obs, it=0, ep=0, t=t)
            if sync:
                _sync()
            t1 = time.perf_counter()
            res = step(action=out["action"])
            t2 = time.perf_counter()
            timed["act"].append((t1 - t0) * 1e3)
            timed["step"].append((t2 - t1) * 1e3)
            obs = res["obs"]


def worker_calls(direct: Direct, to_cpu: bool, allowed: tuple[str, ...], device: str):
    """act and step through `ComponentWorker.call`, with the workflow's own nodes and recipes."""
    from interpreter.recipe import Leaf
    from interpreter.worker import ComponentWorker

    wf = direct.wf
    nodes = {item.path[-1]: item for item in wf.items() if hasattr(item, "method")}
    act_node, step_node = nodes["act"], nodes["env"]
    loops = {act_node.path: (("iteration",), ("iteration", "epoch"), ("iteration", "epoch", "step")),
             step_node.path: (("iteration",), ("iteration", "epoch"), ("iteration", "epoch", "step"))}
    workers = {}
    for name, node in (("policy", act_node), ("sim", step_node)):
        comp = wf.components[name]
        dev = device if comp.device == "gpu" else "cpu"
        w = ComponentWorker(comp, wf.seed, dev, allowed, outputs_to_cpu=to_cpu)
        w.register_nodes({node.path: node}, loops)
        workers[name] = w
    recipe_act = tuple((p, Leaf(i)) for i, p in enumerate(("obs", "it", "ep", "t")))

    def act(obs: Any, it: int, ep: int, t: int) -> dict[str, Any]:
        w = workers["policy"]
        values = w.call(w.nodes[act_node.path], None, (0, 0, t), recipe_act, [obs, it, ep, t])
        return dict(zip(act_node.outputs, values, strict=True))

    def step(action: Any) -> dict[str, Any]:
        w = workers["sim"]
        values = w.call(w.nodes[step_node.path], None, (0, 0, 0), (("action", Leaf(0)),), [action])
        return dict(zip(step_node.outputs, values, strict=True))

    # the same simulator state as `direct` (the worker built its own objects: use direct's sim for resets)
    workers["sim"].obj = direct.sim
    return act, step, workers


def rose_variant(wf: Any, kind: str, allowed: tuple[str, ...], device: str, mps_env: dict | None = None):
    """One RL iteration per call of `once`, through Runner; act/step durations from the trace."""
    from interpreter.backends import make_backend
    from interpreter.runner import RunConfig, Runner
    from interpreter.schedule import Schedule

    sch = Schedule(wf)
    be = make_backend(kind, wf, sch, compiled=True, mps_env=mps_env, device=device, allowed=allowed,
                      log=lambda line: print(line, file=sys.stderr))
    runner = Runner(wf, be, RunConfig(iterations=10**6, tensorboard=False), sch)
    k = [0]

    def once(timed: dict[str, list[float]]) -> None:
        before = len(runner.trace)
        runner.run_iteration(k[0])
        k[0] += 1
        for r in runner.trace.records()[before:]:
            name = r.node.rsplit(".", 1)[-1]
            if name in ("act", "env") and r.duration_ns:
                timed["act" if name == "act" else "step"].append(r.duration_ns / 1e6)

    processes = {c: be.control(c, "info") for c in be.components()}  # threads, MPS quota, SMs seen
    return once, be.shutdown, processes


def gil_neighbour(direct: Direct, stop: threading.Event) -> threading.Thread:
    import torch

    def spin() -> None:
        direct.sim2.reset(it=0, ep=0)
        action = torch.zeros(direct.wf.params["num_envs"], direct.wf.params["chunk"], 2)
        while not stop.is_set():
            direct.sim2.step(action=action)

    t = threading.Thread(target=spin, name="gil-neighbour", daemon=True)
    t.start()
    return t


def record_cost(workers: dict[str, Any]) -> float:
    """Microseconds per trace record: the worker's tuple -> InvocationRecord -> numbered into a trace."""
    from interpreter.trace import ExecutionTrace

    w = workers["sim"]
    info = next(iter(w.nodes.values()))
    n = 2000
    w._records = [(info, (0, 0, i), 1, 2, None, None) for i in range(n)]  # a benchmark's probe
    trace = ExecutionTrace()
    t = time.perf_counter()
    for r in w.pop_records():
        trace.add(r)
    return (time.perf_counter() - t) / n * 1e6


def pickle_cost(direct: Direct) -> dict[str, float]:
    """Milliseconds to pickle and unpickle act's inputs and outputs (protocol 5, as Ray does)."""
    obs = direct.sim.reset(it=0, ep=0)["obs"]
    out = direct.policy.act(obs=obs, it=0, ep=0, t=0)
    _sync()
    from interpreter.worker import _to_cpu

    out = _to_cpu(out)
    res = {}
    for name, value in (("act_inputs", obs), ("act_outputs", out)):
        times = []
        for _ in range(20):
            t = time.perf_counter()
            pickle.loads(pickle.dumps(value, protocol=5))
            times.append((time.perf_counter() - t) * 1e3)
        res[f"{name}_ms"] = statistics.median(times)
        res[f"{name}_bytes"] = len(pickle.dumps(value, protocol=5))
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workflow", type=Path, default=ROOT / "workflows" / "embodied_ppo_gpu.yaml")
    ap.add_argument("--set", action="append", default=["epochs=1", "iterations=1000"], metavar="NAME=VALUE")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--variants", default="all")
    ap.add_argument("--smoke", action="store_true", help="CPU workflow, 8 envs, 3 steps, 2 rounds")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "call_overhead.json")
    args = ap.parse_args()
    if args.smoke:
        args.workflow = ROOT / "workflows" / "embodied_ppo.yaml"
        args.set += ["num_envs=8", "steps=3", "denoise_steps=2"]
        args.rounds = 2
    import torch

    from rose_dsl import load_workflow

    params: dict[str, Any] = {}
    for item in args.set:
        name, _, value = item.partition("=")
        params[name] = int(value) if value.lstrip("-").isdigit() else value
    wf = load_workflow(args.workflow, params)
    allowed = ("examples.",)
    gpu = torch.cuda.is_available() and any(c.device == "gpu" for c in wf.components.values())
    device = "cuda" if gpu else "cpu"
    if not gpu:
        torch.set_num_threads(1)  # as the local backend does on the CPU (and the Ray actors have one core each)
    wanted = None if args.variants == "all" else set(args.variants.split(","))

    def want(name: str) -> bool:
        return wanted is None or name in wanted

    direct = Direct(wf, device, allowed)
    act_w, step_w, workers = worker_calls(direct, False, allowed, device)
    act_c, step_c, _ = worker_calls(direct, True, allowed, device)
    variants: dict[str, Callable[[dict[str, list[float]]], None]] = {}
    if want("direct"):
        variants["direct"] = lambda timed: direct.rollout(direct.policy.act, direct.sim.step, timed)
    if want("direct_nosync"):
        variants["direct_nosync"] = lambda timed: direct.rollout(direct.policy.act, direct.sim.step, timed, sync=False)
    if want("worker"):
        variants["worker"] = lambda timed: direct.rollout(act_w, step_w, timed, sync=False)
    if want("worker_to_cpu"):
        variants["worker_to_cpu"] = lambda timed: direct.rollout(act_c, step_c, timed, sync=False)
    if want("direct_1thread"):
        def one_thread(timed: dict[str, list[float]]) -> None:
            before = torch.get_num_threads()
            torch.set_num_threads(1)  # what Ray gives an actor with num_cpus=0 (OMP_NUM_THREADS=1)
            try:
                direct.rollout(direct.policy.act, direct.sim.step, timed)
            finally:
                torch.set_num_threads(before)

        variants["direct_1thread"] = one_thread
    if want("direct_gil"):
        def with_neighbour(timed: dict[str, list[float]]) -> None:
            stop = threading.Event()
            thread = gil_neighbour(direct, stop)
            try:
                direct.rollout(direct.policy.act, direct.sim.step, timed)
            finally:
                stop.set()
                thread.join()

        variants["direct_gil"] = with_neighbour
    errors: dict[str, str] = {}
    processes: dict[str, dict[str, Any]] = {}
    timed: dict[str, dict[str, list[float]]] = {}

    def measure(phase: dict[str, Callable[[dict[str, list[float]]], None]]) -> None:
        """Warm every variant up once, then run them round by round (interleaved)."""
        # progress on stdout as it goes: a device call cut at its limit still shows how far each variant got
        for v, fn in phase.items():
            t0 = time.perf_counter()
            fn({"act": [], "step": []})
            timed.setdefault(v, {"act": [], "step": []})
            print(f"warm-up {v}: {time.perf_counter() - t0:.1f} s", flush=True)
        for r in range(args.rounds):
            for v, fn in phase.items():
                t0 = time.perf_counter()
                fn(timed[v])
                print(f"round {r} {v}: {time.perf_counter() - t0:.2f} s", flush=True)

    def with_rose(phase: dict, name: str, kind: str, mps_env: dict | None, closers: list) -> None:
        if not want(name):
            return
        try:
            once, close, processes[name] = rose_variant(wf, kind, allowed, device, mps_env)
            phase[name] = once
            closers.append(close)
        except Exception as exc:  # noqa: BLE001 - recorded in the results; the other variants still run
            errors[name] = f"{type(exc).__name__}: {exc}"

    # phase 1: everything but MPS, interleaved
    closers: list[Callable[[], None]] = []
    try:
        with_rose(variants, "rose_local", "local", None, closers)
        with_rose(variants, "rose_ray", "ray", None, closers)
        measure(variants)
        extras = {"trace_record_us": record_cost(workers), **pickle_cost(direct)}
    finally:
        for close in closers:
            close()
    # phase 2 (GPU): Ray's GPU components as MPS clients at their quotas, interleaved with `direct` again
    # (a second Ray backend cannot hold the GPU while the first does: one phase after the other)
    if gpu and want("rose_ray_mps"):
        from interpreter.mps import MpsDaemon

        daemon = MpsDaemon()
        daemon.start()
        closers = []
        try:
            if daemon.active:
                phase: dict[str, Callable[[dict[str, list[float]]], None]] = {
                    "direct_phase2": lambda timed_: direct.rollout(direct.policy.act, direct.sim.step, timed_)}
                with_rose(phase, "rose_ray_mps", "ray", {c.name: daemon.client_env(c.mps_quota)
                                                          for c in wf.components.values() if c.device == "gpu"}, closers)
                measure(phase)
            else:
                errors["rose_ray_mps"] = f"MPS not available: {daemon.warning}"
        finally:
            for close in closers:
                close()
            daemon.stop()
    stats = {v: {call: _stats(ms) for call, ms in calls.items()} for v, calls in timed.items()}

    def med(v: str, call: str = "act") -> float | None:
        return stats.get(v, {}).get(call, {}).get("median_ms")

    def diff(a: str, b: str, call: str = "act") -> float | None:
        x, y = med(a, call), med(b, call)
        return None if x is None or y is None else x - y

    breakdown = {
        "device_wait_after_return_ms": diff("direct", "direct_nosync"),
        "worker_wrapper_ms": diff("worker", "direct"),
        "output_transfer_ms": diff("worker_to_cpu", "worker"),
        "one_cpu_thread_ms": diff("direct_1thread", "direct"),
        "one_cpu_thread_step_ms": diff("direct_1thread", "direct", "step"),
        "gil_contention_ms": diff("direct_gil", "direct"),
        "gil_contention_step_ms": diff("direct_gil", "direct", "step"),
        "rose_local_over_direct_ms": diff("rose_local", "direct"),
        "rose_local_step_over_direct_ms": diff("rose_local", "direct", "step"),
        "rose_ray_over_direct_ms": diff("rose_ray", "direct"),
        "rose_ray_step_over_direct_ms": diff("rose_ray", "direct", "step"),
        "rose_ray_mps_over_direct_ms": diff("rose_ray_mps", "direct_phase2"),
        **extras,
    }
    result = {
        "benchmark": "call_overhead", "workflow": str(args.workflow.relative_to(ROOT)), "params": params,
        "rounds": args.rounds, "smoke": args.smoke, "device": device, "stats": stats, "breakdown": breakdown,
        "raw_ms": timed, "errors": errors, "processes": processes, "machine": machine(),
        "versions": {"torch": torch.__version__, "ray": __import__("ray").__version__},
        "env": {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES")},
        "driver_torch_threads": torch.get_num_threads(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{'variant':>14}  {'act median':>10}  {'p25-p75':>17}  {'step median':>11}")
    for v, s in stats.items():
        a, st = s.get("act", {}), s.get("step", {})
        if a:
            print(f"{v:>14}  {a['median_ms']:8.2f}ms  {a['p25_ms']:7.2f}-{a['p75_ms']:7.2f}ms  "
                  f"{st.get('median_ms', float('nan')):9.2f}ms")
    for k, v in breakdown.items():
        if v is not None:
            print(f"{k:>32}: {v:8.3f}")
    for v, e in errors.items():
        print(f"{v:>14}: failed: {e}")


if __name__ == "__main__":
    main()
