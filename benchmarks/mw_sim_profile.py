"""Where a Meta-World simulator process spends its step: physics vs rendering, alone and side by side.

Question it answers (DEVELOPERS.md "Known gaps"): with P simulator processes of E envs each, does the
env step scale with P, and if not, is it the EGL renders that serialise across processes? If two
processes' renders cannot overlap, pipelining simulator groups can hide only the policy's act.

Each configuration starts P processes (spawned, each its own EGL contexts), each builds a
`MetaWorldVecSim(E envs, chunk, image_size)` like `paper_metaworld_vla.yaml`, resets, waits at a
barrier, then runs `steps` steps with random actions. Per step it records the wall time, the time in
MuJoCo physics (`_env_step`) and in rendering (`_render_into`: make-current + `env.render()` + release).
The result is the median over steps and processes.

    python benchmarks/mw_sim_profile.py --configs 1x32,2x16,4x8,8x4,4x4,2x4,8x4+load --out OUT.json

`+load` runs the configuration while another process keeps the GPU busy with matmuls.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import time
from typing import Any

from benchmarks.lib.common import machine, versions


def _worker(replica: int, replicas: int, envs: int, args: dict[str, Any], barrier: Any, queue: Any) -> None:
    import numpy as np
    import torch

    from examples.embodied.sim_metaworld import MetaWorldVecSim

    timers = {"physics": 0.0, "render": 0.0}

    class Timed(MetaWorldVecSim):
        def _env_step(self, r, action):  # type: ignore[no-untyped-def]
            t0 = time.perf_counter()
            out = super()._env_step(r, action)
            timers["physics"] += time.perf_counter() - t0
            return out

        def _render_into(self, images, i, r):  # type: ignore[no-untyped-def]
            t0 = time.perf_counter()
            super()._render_into(images, i, r)
            if images is not None:
                timers["render"] += time.perf_counter() - t0

    sim = Timed(num_envs=envs, chunk=args["chunk"], task="reach-v3", image_size=args["image_size"],
                max_episode_steps=10_000, gl=args["gl"], replica=replica, replicas=replicas)
    sim.reset(it=0, ep=0)
    rng = np.random.default_rng(replica)
    rows = []
    barrier.wait()
    for _ in range(args["steps"]):
        action = torch.from_numpy(rng.uniform(-1, 1, (envs, args["chunk"], 4)))
        timers["physics"] = timers["render"] = 0.0
        t0 = time.perf_counter()
        sim.step(action)
        rows.append({"step_s": time.perf_counter() - t0, **timers})
    queue.put(rows[args["warmup"]:])
    sim.close()


def _gpu_load(stop: Any) -> None:
    """Keep the GPU busy with bf16 matmuls (a trainer's update) until `stop` is set."""
    import torch

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    while not stop.is_set():
        for _ in range(20):
            a = (a @ a).clamp_(-1, 1)
        torch.cuda.synchronize()


def run_config(procs: int, envs: int, args: dict[str, Any], gpu_load: bool = False) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    loader = ctx.Process(target=_gpu_load, args=(stop,)) if gpu_load else None
    if loader is not None:
        loader.start()
        time.sleep(5)
    barrier, queue = ctx.Barrier(procs), ctx.Queue()
    workers = [ctx.Process(target=_worker, args=(p, procs, envs, args, barrier, queue)) for p in range(procs)]
    for w in workers:
        w.start()
    rows = [r for _ in workers for r in queue.get(timeout=600)]
    for w in workers:
        w.join(timeout=60)
    if loader is not None:
        stop.set()
        loader.join(timeout=60)
    med = {k: statistics.median(r[k] for r in rows) for k in ("step_s", "physics", "render")}
    frames = envs  # one frame per env per step (no episode ends: max_episode_steps is large)
    return {"procs": procs, "gpu_load": gpu_load, "envs_per_proc": envs, "total_envs": procs * envs, **{f"median_{k}": v for k, v in med.items()},
            "render_ms_per_frame": 1000 * med["render"] / frames,
            "physics_ms_per_env": 1000 * med["physics"] / envs, "samples": len(rows)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default="1x32,2x16,4x8,8x4,4x4,2x4,1x4")
    parser.add_argument("--chunk", type=int, default=8)
    parser.add_argument("--image-size", type=int, default=128)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--gl", default="egl")
    parser.add_argument("--out", default=None)
    ns = parser.parse_args()
    args = {"chunk": ns.chunk, "image_size": ns.image_size, "steps": ns.steps, "warmup": ns.warmup, "gl": ns.gl}
    results = []
    for spec in ns.configs.split(","):
        load = spec.endswith("+load")
        procs, envs = (int(v) for v in spec.removesuffix("+load").split("x"))
        res = run_config(procs, envs, args, gpu_load=load)
        results.append(res)
        print(json.dumps(res), flush=True)
    out = {"benchmark": "mw_sim_profile", "args": args, "machine": machine(), "versions": versions(), "results": results}
    if ns.out:
        with open(ns.out, "w") as fh:
            json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
