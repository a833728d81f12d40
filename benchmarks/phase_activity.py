"""SM activity of each phase of the embodied policy and trainer, in isolation (GPU machine).

Why: NVML GPM's SM_UTIL advances in ~100 ms steps (benchmarks/results/gpm_probe.json), so the per-node
activity of a 4 ms denoising step or a 10 ms backbone call inside a run is smeared with its neighbours.
As the paper's local trials do, each phase is run here back to back on prepared inputs for `--seconds`,
with rose's sampler reading the device-wide activity over that window: the phase's own a_v, next to its
duration D_v. Sizes are `workflows/embodied_ppo_gpu.yaml`'s (and an image variant as in
`embodied_ppo_metaworld_gpu.yaml`).

  python3 benchmarks/phase_activity.py OUT.json [--seconds 2]
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch

from examples.embodied.policy import FlowPolicy
from examples.embodied.ppo import PPOTrainer
from interpreter.gpu_activity import ActivitySampler

CONFIGS = {
    "reacher_state_256envs": dict(obs_dim=10, act_dim=2, chunk=2, num_envs=256, hidden=512, denoise_steps=10,
                                  layers=8, heads=8, expert_layers=4),
    "metaworld_image_32envs": dict(obs_dim=39, act_dim=4, chunk=4, num_envs=32, hidden=256, denoise_steps=10,
                                   image=True, image_size=64, patch=8, layers=6, heads=8, expert_layers=3),
}


def _obs(cfg: dict, n: int) -> object:
    state = torch.randn(n, cfg["obs_dim"])
    if cfg.get("image"):
        return {"state": state, "image": torch.randint(0, 255, (n, 3, cfg["image_size"], cfg["image_size"]),
                                                       dtype=torch.uint8)}
    return state


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _measure(fn, sampler: ActivitySampler, seconds: float) -> dict:
    fn()
    _sync()  # warm
    calls, t0 = 0, time.perf_counter_ns()
    while time.perf_counter_ns() - t0 < seconds * 1e9:
        fn()
        calls += 1
        _sync()
    t1 = time.perf_counter_ns()
    return {"calls": calls, "mean_ms": (t1 - t0) / calls / 1e6, "sm_activity": sampler.mean_activity([(t0, t1)])}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--device", default="cuda", help="cpu: a dry run of the script (no activity)")
    ap.add_argument("--scale", type=float, default=1.0, help="multiply num_envs (dry runs)")
    args = ap.parse_args()
    sampler = ActivitySampler(0, interval_s=0.1)
    sampler.open()
    sampler.start()
    cuda = args.device == "cuda"
    results: dict = {"machine": torch.cuda.get_device_name(0) if cuda else platform.processor(),
                     "sms": torch.cuda.get_device_properties(0).multi_processor_count if cuda else None,
                     "torch": torch.__version__, "python": platform.python_version(), "sampler": sampler.source,
                     "seconds_per_phase": args.seconds, "phases": {}}
    time.sleep(0.5)
    t0 = time.perf_counter_ns()
    time.sleep(1.0)
    results["idle_sm_activity"] = sampler.mean_activity([(t0, time.perf_counter_ns())])
    for name, cfg in CONFIGS.items():
        results["phases"][name] = _phases({**cfg, "num_envs": max(1, int(cfg["num_envs"] * args.scale))}, args,
                                          sampler)
        print(name, json.dumps(results["phases"][name], indent=1), flush=True)
        if cuda:
            torch.cuda.empty_cache()
    sampler.close()
    args.out.write_text(json.dumps(results, indent=1) + "\n")


def _phases(cfg: dict, args: argparse.Namespace, sampler: ActivitySampler) -> dict:
    n = cfg["num_envs"]
    policy = FlowPolicy(**cfg, device=args.device)
    obs = _obs(cfg, n)
    first = policy.backbone(obs, 0, 0, 0)
    prefix, x = first["prefix"], first["x"]
    phases = {
        "backbone": lambda: policy.backbone(obs, 0, 0, 0),
        "denoise.flow (one step)": lambda: policy.flow_step(x, prefix, 0),
        "head": lambda: policy.head(x, prefix, 0, 0, 0),
        "act (whole)": lambda: policy.act(obs, 0, 0, 0),
    }
    tcfg = {k: v for k, v in cfg.items() if k != "num_envs"}
    trainer = PPOTrainer(**tcfg, lr=3e-4, device=args.device, ppo_epochs=1)
    T = 25 if args.device == "cuda" else 2
    traj = {"obs": _stack(obs, T), "next_obs": _stack(obs, T), "x0": torch.randn(T, n, cfg["chunk"], cfg["act_dim"]),
            "action": torch.randn(T, n, cfg["chunk"], cfg["act_dim"]), "logp": torch.randn(T, n) - 3,
            "reward": torch.randn(T, n), "done": torch.zeros(T, n)}
    phases["trainer.update (1 epoch x 4 minibatches)"] = lambda: trainer.update(traj)
    return {p: _measure(fn, sampler, args.seconds) for p, fn in phases.items()}


def _stack(obs: object, T: int) -> object:
    if isinstance(obs, dict):
        return {k: v.unsqueeze(0).expand(T, *v.shape).contiguous() for k, v in obs.items()}
    return obs.unsqueeze(0).expand(T, *obs.shape).contiguous()


if __name__ == "__main__":
    main()
