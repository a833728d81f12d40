"""Does an MPS client priority keep the trainer's update from stalling the rollout beside it?

The question (issue 15, MJX and Meta-World timelines): the declared runtime already runs epoch 0's
update beside epoch 1's rollout, but on MJX the simulator's first step beside the update stretches
from ~0.4 s to ~1.7 s: its thousands of tiny dependent kernels queue behind the update's large ones,
so the overlap buys nothing. SM quotas would leave SMs free for them, but the levels that could
(50-88%) make cuBLAS compute wrong values on this H200 (issue 16). An MPS client priority
(`CUDA_MPS_CLIENT_PRIORITY`: 0 normal, 1 below normal, read when the client starts CUDA) changes no SM
count, so cuBLAS sees the same GPU; it only tells the scheduler whose pending work goes first.

What runs (one MPS daemon, every process a client of it):
- load processes: the real `PPOTrainer` of `workflows/paper_mjx_vla.yaml` (its sizes), each
  repeating `update` on one rollout its own `FlowPolicy` produced, or (`aQ`) that `FlowPolicy`'s `act`
  back to back; one process per variant (priority 0, priority 1, quota Q), idle until asked;
- victims, one process each: `mjx` (the workflow's `ReacherMjxSim.step`, 256 envs, frame_skip 20;
  needs the MJX import dir, `benchmarks/mjx_env.sh`) and `act` (`FlowPolicy.act`, CUDA graphs).

Per round and victim, in a rotated order: the victim alone, beside each trainer variant, and each
trainer variant alone; each for `--window` seconds. Reported: the victim's median step, and the
trainer's median update while the victim runs (the price of a low priority), medians over rounds.

    python benchmarks/mps_priority.py --victims mjx,act --rounds 3 --window 8 --out OUT.json
    python benchmarks/mps_priority.py --small --victims act --rounds 1 --window 2   # CPU smoke
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import queue
import statistics
import sys
import time
from contextlib import contextmanager
from typing import Any

from benchmarks.lib.common import machine, versions

MJX_ARGS = {"obs_dim": 10, "act_dim": 2, "chunk": 8, "hidden": 1024, "denoise_steps": 10, "layers": 24, "heads": 16,
            "expert_layers": 4, "obs_tokens": 256}
SMALL_ARGS = {"obs_dim": 10, "act_dim": 2, "chunk": 4, "hidden": 64, "denoise_steps": 2, "layers": 2, "heads": 4,
              "expert_layers": 1, "obs_tokens": 4}


def _device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _policy(cfg: dict[str, Any]) -> Any:
    from examples.embodied.policy import FlowPolicy

    dev = _device()
    return FlowPolicy(num_envs=cfg["num_envs"], device=dev, cuda_graphs=dev == "cuda", **cfg["model"])


def _rollout(policy: Any, cfg: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """One epoch's trajectory in the shapes the workflow's collect gives the trainer."""
    import torch

    n, steps, obs_dim = cfg["num_envs"], cfg["steps"], cfg["model"]["obs_dim"]
    gen = torch.Generator().manual_seed(0)
    obs = [torch.randn(n, obs_dim, generator=gen) for _ in range(steps + 1)]
    acts = [policy.act(obs[t], 0, 0, t) for t in range(steps)]
    traj = {k: torch.stack([a[k].cpu() for a in acts]) for k in ("action", "logp", "value", "x0")}
    zeros = torch.zeros(steps, n)
    env = {"obs": torch.stack(obs[:-1]), "reward": torch.randn(steps, n, generator=gen), "done": zeros,
           "terminated": zeros, "next_obs": torch.stack(obs[1:])}
    return traj, env


def _trainer_proc(name: str, cfg: dict[str, Any], go: Any, ready: Any, out: Any) -> None:
    import torch

    from examples.embodied.ppo import PPOTrainer

    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    if name.startswith("m"):  # a simulator load: the other temporal group's MJX steps back to back
        sim = _mjx_sim(cfg)
        gen = torch.Generator().manual_seed(2)

        def work() -> None:
            sim.step(torch.rand(cfg["num_envs"], cfg["model"]["chunk"], 2, generator=gen) * 2 - 1)
        _serve(work, sync, name, go, ready, out)
        return
    policy = _policy(cfg)
    if name.startswith("a"):  # a policy load: the rollout's acts back to back (the interleaved temporal split's policy)
        obs = torch.randn(cfg["num_envs"], cfg["model"]["obs_dim"])

        def work() -> None:
            policy.act(obs, 0, 0, 0)
    else:
        traj, env = _rollout(policy, cfg)
        trainer = PPOTrainer(device=_device(), minibatches=4, micro_batch=cfg["micro_batch"], trainable_blocks=2,
                             ppo_epochs=1, values="rollout", sync_every=2, lr=5e-4, **cfg["model"])

        def work() -> None:
            trainer.update(traj, env)
    _serve(work, sync, name, go, ready, out)


def _serve(work: Any, sync: Any, name: str, go: Any, ready: Any, out: Any) -> None:
    """A load process's loop: warm up, then run `work` back to back while `go` is set, reporting the spans."""
    for _ in range(2):  # warm-up: allocator, cuBLAS heuristics, CUDA graphs
        work()
    sync()
    ready.set()
    while True:
        go.wait()
        spans = []
        while go.is_set():
            t0 = time.perf_counter()
            work()
            sync()
            spans.append((t0, time.perf_counter()))
        out.put((name, spans))


def _mjx_sim(cfg: dict[str, Any]) -> Any:
    """The workflow's MJX simulator (256 envs, its frame_skip), reset."""
    sys.path.insert(0, cfg["mjx_path"])  # spawned children take the parent's sys.path, not PYTHONPATH
    from examples.embodied.sim_mjx import ReacherMjxSim

    sim = ReacherMjxSim(num_envs=cfg["num_envs"], chunk=cfg["model"]["chunk"], frame_skip=cfg["frame_skip"],
                        max_episode_steps=10_000, device="gpu" if _device() == "cuda" else "cpu")
    sim.reset(0, 0)
    return sim


def _victim_proc(kind: str, cfg: dict[str, Any], cmd: Any, out: Any) -> None:
    import torch

    if kind == "mjx":
        sim = _mjx_sim(cfg)
        gen = torch.Generator().manual_seed(1)

        def step() -> None:
            sim.step(torch.rand(cfg["num_envs"], cfg["model"]["chunk"], 2, generator=gen) * 2 - 1)
    else:
        policy = _policy(cfg)
        obs = torch.randn(cfg["num_envs"], cfg["model"]["obs_dim"])
        sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)

        def step() -> None:
            policy.act(obs, 0, 0, 0)
            sync()
    for _ in range(3):
        step()
    out.put(("ready", kind))
    while True:
        window = cmd.get()
        if window is None:
            return
        times, end = [], time.perf_counter() + window
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            step()
            times.append(time.perf_counter() - t0)
        out.put((kind, times))


@contextmanager
def _env(extra: dict[str, str]):  # type: ignore[no-untyped-def]
    """Spawned children copy os.environ when they start: set a client's MPS variables around it."""
    saved = {k: os.environ.get(k) for k in extra}
    os.environ.update(extra)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _spans_within(spans: list[tuple[float, float]], t0: float, t1: float) -> list[float]:
    return [b - a for a, b in spans if a >= t0 - 1e-3 and b <= t1 + 1e-3]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--victims", default="mjx,act")
    parser.add_argument("--trainers", default="p0,p1,q94",
                        help="loads: the PPO update as pP (priority P, no quota), qQ (quota Q%%, priority 0), qQpP; "
                             "the policy's act back to back as aQ (quota Q%%) or aQpP; the MJX simulator's step back "
                             "to back (the other temporal group's simulator) as mQ or mQpP")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--window", type=float, default=8.0)
    parser.add_argument("--small", action="store_true", help="tiny model sizes (CPU smoke test)")
    parser.add_argument("--no-mps", action="store_true")
    parser.add_argument("--mjx-path", default="/tmp/mjxenv", help="MuJoCo 3.17 + MJX import dir (mjx_env.sh)")
    parser.add_argument("--out", default=None)
    ns = parser.parse_args()
    cfg = {"model": SMALL_ARGS if ns.small else MJX_ARGS, "num_envs": 8 if ns.small else 256, "steps": 2 if ns.small else 6,
           "micro_batch": 8 if ns.small else 256, "frame_skip": 2 if ns.small else 20, "mjx_path": ns.mjx_path}
    victims = [v for v in ns.victims.split(",") if v]
    variants = [t for t in ns.trainers.split(",") if t]

    from interpreter.mps import MpsDaemon

    daemon = MpsDaemon(os.environ.get("ROSE_MPS_DIR", "/tmp/rose-mps-priority"))
    if not ns.no_mps:
        daemon.start()
    ctx = mp.get_context("spawn")
    results: dict[str, Any] = {"rounds": []}
    procs: list[Any] = []
    try:
        out = ctx.Queue()
        trainers: dict[str, tuple[Any, Any]] = {}
        for name in variants:
            quota = int(name[1:].split("p")[0]) if name.startswith(("q", "a", "m")) and name[1:2].isdigit() else None
            prio = name.split("p")[-1] if "p" in name else "0"
            env = daemon.client_env(quota) if daemon.active else {}
            if daemon.active:
                env["CUDA_MPS_CLIENT_PRIORITY"] = prio
            go, ready = ctx.Event(), ctx.Event()
            with _env(env):
                p = ctx.Process(target=_trainer_proc, args=(name, cfg, go, ready, out), daemon=True)
                p.start()
            procs.append(p)
            trainers[name] = (go, ready)
        victim_cmd: dict[str, Any] = {}
        for kind in victims:
            env = daemon.client_env(None) if daemon.active else {}
            if kind == "mjx":
                env.update({"XLA_PYTHON_CLIENT_PREALLOCATE": "false", "MUJOCO_GL": "disable"})
            q = ctx.Queue()
            with _env(env):
                p = ctx.Process(target=_victim_proc, args=(kind, cfg, q, out), daemon=True)
                p.start()
            procs.append(p)
            victim_cmd[kind] = q
        t_start = time.perf_counter()

        def alive() -> None:
            dead = [p for p in procs if not p.is_alive()]
            if dead:
                raise SystemExit(f"{len(dead)} process(es) died while starting (exit codes "
                                 f"{[p.exitcode for p in dead]}); see the traceback above")

        for _go, ready in trainers.values():
            while not ready.wait(timeout=5):
                alive()
        pending = len(victims)
        while pending:
            try:
                msg = out.get(timeout=5)
            except queue.Empty:
                alive()
                continue
            assert msg[0] == "ready", msg
            pending -= 1
        results["setup_s"] = time.perf_counter() - t_start
        print(f"ready after {results['setup_s']:.1f} s", flush=True)

        configs = [(v, t) for v in victims for t in [None, *variants]] + [(None, t) for t in variants]
        for r in range(ns.rounds):
            order = configs[r % len(configs):] + configs[: r % len(configs)]
            if r % 2:
                order = order[::-1]
            rows = []
            for victim, trainer in order:
                if trainer is not None:
                    trainers[trainer][0].set()
                    time.sleep(0.5)  # let an update start
                t0 = time.perf_counter()
                vt: list[float] = []
                if victim is not None:
                    victim_cmd[victim].put(ns.window)
                    while True:
                        msg = out.get(timeout=ns.window * 20 + 300)
                        if msg[0] == victim:
                            vt = msg[1]
                            break
                else:
                    time.sleep(ns.window)
                t1 = time.perf_counter()
                spans: list[float] = []
                if trainer is not None:
                    trainers[trainer][0].clear()
                    while True:
                        msg = out.get(timeout=600)
                        if msg[0] == trainer:
                            spans = _spans_within(msg[1], t0, t1) or [b - a for a, b in msg[1]]
                            break
                row = {"victim": victim, "trainer": trainer,
                       "victim_median_s": statistics.median(vt) if vt else None, "victim_steps": len(vt),
                       "trainer_median_update_s": statistics.median(spans) if spans else None,
                       "trainer_updates": len(spans)}
                rows.append(row)
                print(json.dumps(row), flush=True)
            results["rounds"].append(rows)
        summary = []
        for victim, trainer in configs:
            vs = [row["victim_median_s"] for rows in results["rounds"] for row in rows
                  if row["victim"] == victim and row["trainer"] == trainer and row["victim_median_s"] is not None]
            ts = [row["trainer_median_update_s"] for rows in results["rounds"] for row in rows
                  if row["victim"] == victim and row["trainer"] == trainer and row["trainer_median_update_s"] is not None]
            summary.append({"victim": victim, "trainer": trainer,
                            "victim_step_s": statistics.median(vs) if vs else None,
                            "victim_spread": (max(vs) - min(vs)) / statistics.median(vs) if len(vs) > 1 else None,
                            "trainer_update_s": statistics.median(ts) if ts else None})
        results["summary"] = summary
        print(json.dumps(summary, indent=1), flush=True)
    finally:
        for q in locals().get("victim_cmd", {}).values():
            q.put(None)
        for p in procs:
            p.terminate()
        for p in procs:
            p.join(timeout=10)
        daemon.stop()
    doc = {"benchmark": "mps_priority", "args": vars(ns), "cfg": cfg, "machine": machine(), "versions": versions(),
           **results}
    if ns.out:
        with open(ns.out, "w") as fh:
            json.dump(doc, fh, indent=1)


if __name__ == "__main__":
    sys.exit(main())
