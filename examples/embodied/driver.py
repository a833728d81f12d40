"""A plain-Python driver with the iteration structure of `workflows/embodied_ppo.yaml`.

    for it in iterations:
        for ep in epochs:   reset(it, ep); for t in steps: act(obs, it, ep, t) -> step(action); collect
        for ep in epochs:   trainer.update(traj[ep])
        policy.load_weights(trainer.get_weights()["w"])

It is the reference the rose runtime is checked against, and the quickest way to see the components
learn: `python -m examples.embodied.driver --threads 1` (the defaults below: ~3 minutes on two CPU
cores; add `--algo grpo --group-size 4` for GRPO).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from .grpo import GRPOTrainer
from .policy import FlowPolicy
from .ppo import PPOTrainer
from .sim_reacher import ReacherVecSim


@dataclass
class RunConfig:
    algo: str = "ppo"
    seed: int = 0
    num_envs: int = 32
    steps: int = 25
    chunk: int = 2
    epochs: int = 2
    iterations: int = 90
    denoise_steps: int = 4
    hidden: int = 64
    lr: float = 1e-3
    group_size: int = 1
    image_size: int = 0  # > 0: camera images in the observation and a vision encoder in the policy
    threads: int | None = None
    model: dict[str, Any] = field(default_factory=dict)  # extra FlowNetConfig args (policy and trainer)
    trainer: dict[str, Any] = field(default_factory=dict)  # extra trainer args (ppo_epochs, ...)


def build(cfg: RunConfig) -> tuple[ReacherVecSim, FlowPolicy, PPOTrainer]:
    """The three components, constructed with the workflow's arguments."""
    sim = ReacherVecSim(num_envs=cfg.num_envs, chunk=cfg.chunk, seed=cfg.seed, group_size=cfg.group_size,
                        image_size=cfg.image_size)
    model = dict(cfg.model)
    if cfg.image_size:
        model.update(image=True, image_size=cfg.image_size)
    common = dict(obs_dim=sim.obs_dim, act_dim=sim.act_dim, chunk=cfg.chunk, hidden=cfg.hidden,
                  denoise_steps=cfg.denoise_steps, seed=cfg.seed, **model)
    policy = FlowPolicy(num_envs=cfg.num_envs, **common)
    trainer: PPOTrainer
    if cfg.algo == "ppo":
        trainer = PPOTrainer(lr=cfg.lr, sync_every=cfg.epochs, **common, **cfg.trainer)
    elif cfg.algo == "grpo":
        trainer = GRPOTrainer(lr=cfg.lr, group_size=cfg.group_size, sync_every=cfg.epochs, **common, **cfg.trainer)
    else:
        raise ValueError(f"unknown algo {cfg.algo!r} (ppo or grpo)")
    return sim, policy, trainer


def rollout(sim: ReacherVecSim, policy: FlowPolicy, it: int, ep: int, steps: int) -> dict[str, Any]:
    """One rollout epoch: reset, then `steps` x (act, step); returns the stacked trajectory."""
    obs = sim.reset(it=it, ep=ep)["obs"]
    records: list[dict[str, Any]] = []
    for t in range(steps):
        act = policy.act(obs=obs, it=it, ep=ep, t=t)
        env = sim.step(action=act["action"])
        records.append({"obs": obs, "action": act["action"], "logp": act["logp"], "value": act["value"],
                        "x0": act["x0"], "reward": env["reward"], "done": env["done"],
                        "terminated": env["terminated"], "next_obs": env["final_obs"]})
        obs = env["obs"]
    return {k: stack([r[k] for r in records]) for k in records[0]}


def stack(items: list[Any]) -> Any:
    """Stack tensors (or records of tensors, field by field) along a new time dimension."""
    if isinstance(items[0], dict):
        return {k: stack([item[k] for item in items]) for k in items[0]}
    return torch.stack(items)


def run(cfg: RunConfig, log: Callable[[str], None] | None = print) -> list[dict[str, float]]:
    """Train for `cfg.iterations`; returns one metrics dict per iteration (sim/..., trainer/...)."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    sim, policy, trainer = build(cfg)
    history: list[dict[str, float]] = []
    start, cpu_start = time.perf_counter(), time.process_time()
    for it in range(cfg.iterations):
        trajs = [rollout(sim, policy, it, ep, cfg.steps) for ep in range(cfg.epochs)]
        for traj in trajs:
            trainer.update(traj)
        policy.load_weights(trainer.get_weights()["w"])
        row: dict[str, float] = {"iteration": float(it), "seconds": time.perf_counter() - start,
                                 "cpu_seconds": time.process_time() - cpu_start}
        row.update({f"sim/{k}": v for k, v in sim.pop_metrics().items()})
        row.update({f"trainer/{k}": v for k, v in trainer.pop_metrics().items()})
        history.append(row)
        if log is not None:
            ret = row.get("sim/episode_return", float("nan"))
            log(f"it {it:4d}  {row['seconds']:7.1f}s (cpu {row['cpu_seconds']:6.1f}s)  return {ret:8.2f}  "
                f"dist {row.get('sim/episode_dist_return', float('nan')):7.2f}  "
                f"kl {row.get('trainer/approx_kl', 0.0):.4f}  std {row.get('trainer/action_std', 0.0):.3f}")
    return history


def mean_return(history: list[dict[str, float]], first: int, last: int) -> float:
    """Mean episode return over iterations [first, last) (those that finished episodes)."""
    vals = [h["sim/episode_return"] for h in history[first:last] if "sim/episode_return" in h]
    return sum(vals) / len(vals)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    defaults = RunConfig()
    for name, value in asdict(defaults).items():
        if isinstance(value, (int, float, str)) and not isinstance(value, bool):
            parser.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--model", type=json.loads, default={}, help="JSON dict of extra FlowNetConfig args")
    parser.add_argument("--trainer", type=json.loads, default={}, help="JSON dict of extra trainer args")
    parser.add_argument("--out", default=None, help="write the per-iteration history as JSON here")
    args = vars(parser.parse_args(argv))
    out = args.pop("out")
    history = run(RunConfig(**args))
    n = len(history)
    k = max(1, n // 10)
    print(json.dumps({"first_return": mean_return(history, 0, k), "last_return": mean_return(history, n - k, n),
                      "seconds": history[-1]["seconds"], "cpu_seconds": history[-1]["cpu_seconds"]}))
    if out:
        with open(out, "w") as f:
            json.dump({"config": args, "history": history}, f, indent=1)


if __name__ == "__main__":
    main()
