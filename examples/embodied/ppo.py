"""PPO trainer for the flow policy: GAE, clipped objective, value loss, gradient clipping.

The trainer owns its own `FlowNet` built from the same config and seed as `FlowPolicy`, so at
iteration 0 both hold identical weights. Log-probabilities are recomputed exactly: the trajectory
carries the initial flow noise `x0` of each step, the trainer re-runs the flow from it under its
current weights, and scores the stored action under the Gaussian exploration head (see
`model.FlowNet.evaluate`).

Trajectory record (time first, as the workflow's `collect: stack(...)` builds it):
obs `[T, N, obs_dim]` (or a record of such), action / x0 `[T, N, chunk, act_dim]`, logp / value /
reward / done `[T, N]`, optionally terminated `[T, N]`, next_obs `[T, N, obs_dim]` -- the observation the
step ended in *before* any automatic reset (the simulator's `final_obs`), which non-terminal episode
ends bootstrap from.

Off-policy samples (an asynchronous plan, `defer:` with `max_staleness`): the ratio is always taken
against the behaviour log-probs recorded at sampling time (`logp`) and clipped, so a sample drawn by
older weights moves the policy at most as far as the clip allows -- the recipe of the RL-inference
lecture. Optionally `version [T, N]`: the policy version that drew each sample (`FlowPolicy.version`,
weight loads so far); the trainer counts the weights it has published (`version`), and the difference
is the sample's staleness. The metrics give the ratio's mean, min and max and a staleness histogram
(`staleness_hist_<lag>`: samples trained at that lag this iteration), its mean and max. `max_staleness`
(optional, as the GRPO learner's) makes a sample older than that an error: the plan's deferral (or a
component's own carried work) let an older sample through than the workflow allows.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from .data_parallel import (
    ReplicaRows,
    all_gather_rows,
    all_reduce_sum,
    global_mean_std,
    is_distributed,
    local_minibatch,
)
from .determinism import keyed_generator
from .model import FlowNet, FlowNetConfig, Obs, build_model
from .policy import autocast_for

Traj = dict[str, Any]


def flatten_time(tree: Any) -> Any:
    """`[T, N, ...]` -> `[T*N, ...]` for a tensor or a record of tensors."""
    if isinstance(tree, dict):
        return {k: flatten_time(v) for k, v in tree.items()}
    return tree.reshape(tree.shape[0] * tree.shape[1], *tree.shape[2:])


def take(tree: Any, idx: torch.Tensor) -> Any:
    if isinstance(tree, dict):
        return {k: take(v, idx) for k, v in tree.items()}
    return tree[idx]


def _with_time(tree: Any) -> Any:
    """`[n, ...]` -> `[1, n, ...]` for a tensor or a record of tensors."""
    if isinstance(tree, dict):
        return {k: v.unsqueeze(0) for k, v in tree.items()}
    return tree.unsqueeze(0)


def to_device(tree: Any, device: torch.device) -> Any:
    if isinstance(tree, dict):
        return {k: to_device(v, device) for k, v in tree.items()}
    return tree.to(device)


class PPOTrainer:
    """State objects: `weights` (the trained `FlowNet`) and `optimizer` (Adam's state plus the update
    counter that keys the minibatch permutations, so a restored trainer repeats the same updates).

    Discounting is per environment step: one decision executes `chunk` steps, so it is discounted
    by `gamma ** chunk`. How an episode ended decides the TD target (the simulator's flags, see
    `sim_base`): after a terminal state (`terminated`) nothing follows, so the target is the reward
    alone; an episode cut short (`truncated` at max steps, or a `fault`) would have gone on, so its
    target bootstraps from V(next_obs) -- the simulator's `final_obs`, the observation before the
    automatic reset. The GAE recursion stops at every `done`. A trajectory without `terminated` (a
    simulator that cannot terminate, like Reacher-v5) treats every `done` as a truncation. By default
    the critic is re-evaluated under the current weights at the start of each update (the workflow's
    second epoch is trained after the first changed the weights); see `values` below.

    Observation normalization stays exact too: the trainer accumulates running statistics of every
    observation it trains on, but copies them into the model's normalizer buffers only at the end of
    every `sync_every`-th update -- set it to the number of updates between weight syncs (the
    workflow's `epochs`), so each update evaluates with the statistics its rollout used.

    Sizing a large policy's update (the paper-shaped GPU workloads): `micro_batch` rows per forward and
    backward pass, gradients accumulated over a minibatch (bounded activation memory, same gradient);
    `trainable_blocks` trains only the top backbone blocks, the action expert and the heads (the frozen
    bottom runs without autograd, see `FlowNet.freeze_backbone`, and once per update: its output is
    reused by every PPO epoch); `values="rollout"` takes V(obs) from
    the rollout's stored values instead of re-evaluating the critic over every observation (standard
    PPO; the default "recompute" re-evaluates under the current weights); `value_batch` bounds the rows
    of one critic pass.

    Data parallel (`replicas: R`, see `data_parallel.py`): the R trainer replicas, each given its
    replica's `[T, n]` trajectories, train exactly as one trainer on the concatenated `[T, R * n]`
    batch (global minibatch permutation, summed gradients, global advantage and observation moments),
    so they hold the same weights after every update.
    """

    data_parallel_group = True  # rose sets up torch.distributed over the replicas
    # each replica's extremes are over its own shard: the run's are the extreme of theirs (the rest: the
    # defaults -- means, and the staleness histogram's counts summed)
    metric_merge = {"ratio_max": "max", "ratio_min": "min", "staleness_max": "max"}

    def __init__(
        self,
        obs_dim: int,
        act_dim: int,
        chunk: int,
        hidden: int,
        denoise_steps: int,
        lr: float,
        seed: int = 0,
        device: str = "cpu",
        ppo_epochs: int = 4,
        minibatches: int = 4,
        clip: float = 0.2,
        gamma: float = 0.99,
        lam: float = 0.95,
        vf_coef: float = 0.5,
        ent_coef: float = 0.0,
        max_grad_norm: float = 0.5,
        reward_scale: float = 0.1,
        sync_every: int = 1,
        image: bool = False,
        replica: int = 0,
        replicas: int = 1,
        micro_batch: int | None = None,
        trainable_blocks: int | None = None,
        values: str = "recompute",
        value_batch: int = 4096,
        max_staleness: int | None = None,
        **model_kwargs: Any,
    ) -> None:
        if values not in ("recompute", "rollout"):
            raise ValueError(f"values must be 'recompute' or 'rollout', got {values!r}")
        if micro_batch is not None and int(micro_batch) < 1:
            raise ValueError(f"micro_batch must be >= 1 or None, got {micro_batch!r}")
        self.replica, self.replicas = int(replica), int(replicas)
        self.cfg = FlowNetConfig(
            obs_dim=obs_dim, act_dim=act_dim, chunk=chunk, hidden=hidden, denoise_steps=denoise_steps,
            image=image, **model_kwargs,
        )
        self.seed, self.device = int(seed), torch.device(device)
        self.model: FlowNet = build_model(self.cfg, self.seed, self.device).train()
        self.model.freeze_backbone(trainable_blocks)
        self.opt = torch.optim.Adam([p for p in self.model.parameters() if p.requires_grad], lr=float(lr), eps=1e-5,
                                    foreach=True)
        self.micro_batch = None if micro_batch is None else int(micro_batch)
        self.values_from = values
        self.updates = 0
        self.ppo_epochs, self.minibatches = int(ppo_epochs), int(minibatches)
        self.clip, self.gamma, self.lam = float(clip), float(gamma), float(lam)
        self.vf_coef, self.ent_coef, self.max_grad_norm = float(vf_coef), float(ent_coef), float(max_grad_norm)
        self.reward_scale, self.sync_every = float(reward_scale), int(sync_every)
        self.obs_stats = {"mean": torch.zeros(obs_dim, dtype=torch.float64),
                          "var": torch.ones(obs_dim, dtype=torch.float64), "count": 0.0}
        self.value_batch = int(value_batch)
        self._metrics: dict[str, list[float]] = {}
        self._extremes: dict[str, float] = {}  # max / min over the iteration (ratio, staleness)
        self._counts: dict[str, float] = {}  # sums over the iteration (the staleness histogram)
        self.version = 0  # weights published (`get_weights`): a sample's staleness is taken against it
        self.max_staleness = None if max_staleness is None else int(max_staleness)  # checked per trained sample

    # -- advantages -------------------------------------------------------------------------------
    @torch.no_grad()
    def _values(self, obs: Obs) -> torch.Tensor:
        """Critic values of `[T, N, ...]` observations under the current weights -> `[T, N]`."""
        flat = flatten_time(obs)
        size = (flat["state"] if isinstance(flat, dict) else flat).shape[0]
        parts = []
        with autocast_for(self.device):
            for start in range(0, size, self.value_batch):  # bounded activation memory for big models
                chunk = take(flat, torch.arange(start, min(size, start + self.value_batch), device=self.device))
                parts.append(self.model.value(self.model.backbone(chunk)))
        return torch.cat(parts).view(*(obs["state"] if isinstance(obs, dict) else obs).shape[:2])

    @torch.no_grad()
    def _rollout_values(self, traj: Traj, bootstrap: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(V(obs), V(next_obs)) `[T, N]` from the values the rollout policy stored (`traj["value"]`), as
        standard PPO does: V(next_obs[t]) is V(obs[t + 1]) unless the episode ended at t; only the
        observations non-terminal ends bootstrap from (`bootstrap`: the episode's last, `next_obs`) and
        the rollout's final ones are evaluated here, under the current weights -- one backbone pass over
        a few rows instead of two over all of them."""
        if "value" not in traj:
            raise KeyError(f"{type(self).__name__}(values='rollout'): the trajectory lacks 'value' (policy.act's)")
        value = traj["value"].float()
        fresh = bootstrap.bool().clone()
        fresh[-1] = True
        next_value = torch.zeros_like(value)
        next_value[:-1] = value[1:]
        t, n = fresh.nonzero(as_tuple=True)
        if len(t):
            obs = traj["next_obs"]
            picked = {k: v[t, n] for k, v in obs.items()} if isinstance(obs, dict) else obs[t, n]
            next_value[t, n] = self._values(_with_time(picked)).view(-1)
        return value, next_value

    def _advantages(self, traj: Traj) -> tuple[torch.Tensor, torch.Tensor | None]:
        """GAE advantages `[T, N]` and value targets `[T, N]`."""
        reward = traj["reward"].float() * self.reward_scale
        done = traj["done"].float()
        # a terminal state has no value after it; truncations and faults bootstrap (see the class docstring)
        terminated = traj["terminated"].float() if "terminated" in traj else torch.zeros_like(done)
        if self.values_from == "rollout":
            value, next_value = self._rollout_values(traj, done * (1.0 - terminated))
        else:
            value, next_value = self._values(traj["obs"]), self._values(traj["next_obs"])
        discount = self.gamma ** self.cfg.chunk
        delta = reward + discount * (1.0 - terminated) * next_value - value
        adv = torch.zeros_like(delta)
        running = torch.zeros_like(delta[0])
        for t in range(delta.shape[0] - 1, -1, -1):
            running = delta[t] + discount * self.lam * (1.0 - done[t]) * running
            adv[t] = running
        return adv, adv + value

    # -- update -----------------------------------------------------------------------------------
    def update(self, traj: Traj, env: Traj | None = None) -> None:
        """One PPO update (`ppo_epochs` x `minibatches` gradient steps) on one rollout epoch.

        `env`: the simulator's part of the trajectory (obs, reward, done, next_obs) as its own record,
        merged into `traj`. A workflow whose simulator runs in more processes than the policy (sim
        replicas) must pass the two parts on two inputs: rose maps values between replica counts
        port by port (the simulator's parts are concatenated from its replicas)."""
        if env is not None:
            traj = {**traj, **env}
        missing = {"obs", "action", "logp", "reward", "done", "next_obs", "x0"} - set(traj)
        if missing:
            raise KeyError(f"{type(self).__name__}.update: trajectory lacks {sorted(missing)} "
                           "(x0 comes from policy.act's 'x0' output, next_obs from sim.step's 'final_obs')")
        traj = to_device(traj, self.device)
        if "version" in traj:
            self._staleness(flatten_time(traj["version"]))
        adv, returns = self._advantages(traj)
        batch = {
            "obs": flatten_time(traj["obs"]),
            "x0": flatten_time(traj["x0"]).float(),
            "action": flatten_time(traj["action"]).float(),
            "logp": flatten_time(traj["logp"]).float(),
            "adv": self._normalize(flatten_time(adv)),
        }
        if returns is not None:
            batch["ret"] = flatten_time(returns)
        if self.model.frozen_blocks and self.ppo_epochs > 1:
            batch["stem"] = self._stem(batch["obs"])
        steps, local = traj["reward"].shape[:2]
        rows = ReplicaRows(local, self.replica, self.replicas)
        size = steps * rows.total  # rows of the global batch (all replicas)
        minibatches = min(self.minibatches, size)  # a batch smaller than that: one row per minibatch
        mb_size = size // minibatches
        distributed = is_distributed(self.replicas)
        for epoch in range(self.ppo_epochs):
            gen = keyed_generator("ppo-perm", self.seed, self.updates, epoch)
            perm = torch.randperm(size, generator=gen)
            for start in range(0, mb_size * minibatches, mb_size):
                chosen = perm[start : start + mb_size]
                if distributed:
                    chosen = local_minibatch(chosen, rows)
                self._step(take(batch, chosen.to(self.device)), mb_size if distributed else None)
        self.updates += 1
        self._track_obs(batch["obs"])
        if self.updates % self.sync_every == 0 and self.cfg.obs_norm:
            self.model.obs_mean.copy_(self.obs_stats["mean"])
            self.model.obs_var.copy_(self.obs_stats["var"])

    @torch.no_grad()
    def _stem(self, obs: Obs) -> torch.Tensor:
        """The frozen part's output for every row, once per update: its weights and the observation
        statistics do not change within an update, so the PPO epochs reuse it instead of recomputing
        it each epoch (what makes several epochs affordable for a large frozen backbone)."""
        size = (obs["state"] if isinstance(obs, dict) else obs).shape[0]
        parts = []
        with autocast_for(self.device):
            for start in range(0, size, self.value_batch):
                idx = torch.arange(start, min(size, start + self.value_batch), device=self.device)
                parts.append(self.model.stem(take(obs, idx)))
        return torch.cat(parts)

    @torch.no_grad()
    def _track_obs(self, obs: Obs) -> None:
        """Fold a batch's state statistics into the running ones (Chan et al.'s parallel update)."""
        state = (obs["state"] if isinstance(obs, dict) else obs).detach()
        if is_distributed(self.replicas):  # the moments of every replica's observations
            state = all_gather_rows(state.to(torch.float64))
        state = state.to("cpu", torch.float64)
        n_b, mean_b, var_b = float(state.shape[0]), state.mean(0), state.var(0, unbiased=False)
        n_a, mean_a, var_a = self.obs_stats["count"], self.obs_stats["mean"], self.obs_stats["var"]
        total = n_a + n_b
        delta = mean_b - mean_a
        self.obs_stats = {
            "mean": mean_a + delta * (n_b / total),
            "var": (var_a * n_a + var_b * n_b + delta.square() * (n_a * n_b / total)) / total,
            "count": total,
        }

    def _step(self, mb: dict[str, Any], global_size: int | None = None) -> None:
        """One gradient step on a minibatch, accumulated over micro-batches of at most `micro_batch` rows
        (bounded activation memory; the gradient is the minibatch's, up to summation order).
        `global_size`: data parallel, `mb` holds this replica's part of a minibatch of that many rows --
        per-row losses are summed and divided by it, gradients summed over replicas."""
        rows = mb["adv"].shape[0]
        if global_size is not None and rows == 0:
            self._empty_step()
            return
        denom = global_size if global_size is not None else rows
        size = self.micro_batch or rows
        entropy = self.model.entropy()
        ent_share = self.ent_coef * entropy / (self.replicas if global_size is not None else 1)
        sums = {"policy": torch.zeros((), device=self.device), "value": torch.zeros((), device=self.device),
                "kl": torch.zeros((), device=self.device), "clip": torch.zeros((), device=self.device),
                "ratio": torch.zeros((), device=self.device), "ratio_max": torch.full((), -torch.inf, device=self.device),
                "ratio_min": torch.full((), torch.inf, device=self.device)}
        self.opt.zero_grad(set_to_none=True)
        for start in range(0, rows, size):
            part = take(mb, torch.arange(start, min(rows, start + size), device=self.device))
            with autocast_for(self.device):
                logp, value = self.model.evaluate(part["obs"], part["x0"], part["action"], part.get("stem"))
            log_ratio = logp - part["logp"]
            ratio = torch.exp(log_ratio)
            adv = part["adv"]
            policy_sum = torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - self.clip, 1 + self.clip)).sum()
            value_sum = (0.5 * (value - part["ret"]).square()).sum() if "ret" in part else torch.zeros((), device=self.device)
            loss = (policy_sum + self.vf_coef * value_sum) / denom
            if start == 0:  # the entropy term belongs to the minibatch, once
                loss = loss - ent_share
            loss.backward()
            with torch.no_grad():
                sums["policy"] += policy_sum.detach()
                sums["value"] += value_sum.detach()
                sums["kl"] += ((ratio - 1) - log_ratio).sum()
                sums["clip"] += ((ratio - 1).abs() > self.clip).float().sum()
                sums["ratio"] += ratio.sum()
                sums["ratio_max"] = torch.maximum(sums["ratio_max"], ratio.max())
                sums["ratio_min"] = torch.minimum(sums["ratio_min"], ratio.min())
        with torch.no_grad():
            policy_loss, value_loss = sums["policy"] / denom, sums["value"] / denom
            total = policy_loss + self.vf_coef * value_loss - ent_share.detach()
        grad_norm = self._apply(total, summed=global_size is not None)
        with torch.no_grad():
            stats = {
                "loss": total, "policy_loss": policy_loss, "value_loss": value_loss, "entropy": entropy,
                "approx_kl": sums["kl"] / rows, "clip_frac": sums["clip"] / rows, "ratio_mean": sums["ratio"] / rows,
                "grad_norm": grad_norm, "action_std": torch.exp(self.model.log_std).mean(),
            }
            if global_size is not None:  # a share of the minibatch loss: scaled so the replicas' mean is the loss
                for name in ("loss", "policy_loss", "value_loss"):
                    stats[name] = stats[name] * self.replicas
        for name, v in stats.items():
            self._metrics.setdefault(name, []).append(float(v.detach()))
        self._extreme("ratio_max", float(sums["ratio_max"]), max)
        self._extreme("ratio_min", float(sums["ratio_min"]), min)

    def _extreme(self, name: str, value: float, pick: Any) -> None:
        """The max (or min) of a figure over the iteration's gradient steps, not their mean."""
        self._extremes[name] = pick(self._extremes.get(name, value), value)

    def _staleness(self, versions: torch.Tensor) -> None:
        """Count the samples of an update by lag = published versions - the version that drew them."""
        lags = (self.version - versions.long()).tolist()
        if self.max_staleness is not None and lags and max(lags) > self.max_staleness:
            raise ValueError(f"{type(self).__name__}.update: a sample drawn {max(lags)} published versions ago, "
                             f"above max_staleness {self.max_staleness}")
        for lag in sorted(set(lags)):
            self._counts[f"staleness_hist_{lag}"] = self._counts.get(f"staleness_hist_{lag}", 0.0) + lags.count(lag)
        self._counts["staleness_sum"] = self._counts.get("staleness_sum", 0.0) + sum(lags)
        self._counts["staleness_n"] = self._counts.get("staleness_n", 0.0) + len(lags)
        self._extreme("staleness_max", float(max(lags, default=0)), max)

    def _empty_step(self) -> None:
        """A replica holding no row of this minibatch still joins the gradient sum (and the entropy term)."""
        self.opt.zero_grad(set_to_none=True)
        loss = -self.ent_coef * self.model.entropy() / self.replicas
        loss.backward()
        self._apply(loss.detach(), summed=True)

    def _apply(self, loss: torch.Tensor, summed: bool) -> torch.Tensor:
        """After the backward pass(es): gradients summed over the replicas (`summed`), clip, and step --
        never into NaN weights. Returns the gradient norm before clipping."""
        params = [p for p in self.model.parameters() if p.requires_grad]
        if summed:
            for p in params:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
            all_reduce_sum([p.grad for p in params])
        grad_norm = nn.utils.clip_grad_norm_(params, self.max_grad_norm)
        if not bool(torch.isfinite(loss) & torch.isfinite(grad_norm)):
            raise FloatingPointError(f"{type(self).__name__}: non-finite loss ({float(loss)}) or gradient norm "
                                     f"({float(grad_norm)}) at update {self.updates}; the weights were not changed")
        self.opt.step()
        return grad_norm

    def _normalize(self, adv: torch.Tensor) -> torch.Tensor:
        """Batch advantage normalization (scale-free policy steps whatever the reward scale); over every
        replica's advantages when data parallel."""
        if is_distributed(self.replicas):
            mean, std = global_mean_std(adv)
            return (adv - mean) / (std + 1e-8)
        return (adv - adv.mean()) / (adv.std() + 1e-8)

    # -- weights / state ----------------------------------------------------------------------
    def get_weights(self) -> dict[str, dict[str, torch.Tensor]]:
        """The weights the rollout policy needs to be refreshed with (`FlowPolicy.load_weights`), cloned:
        every tensor an update can change (the trainable parameters and all buffers), not the frozen
        backbone blocks, which both sides build from the same config and seed and nobody changes.

        Why: with `trainable_blocks` set, most of a large VLA is frozen; publishing it anyway moved the
        whole model (~720 MB for the 360M-parameter workload) through the object store every
        iteration -- on the H200 a 4-s idle gap between the last update and the policy's refresh. A
        strong user syncs only what changes. With everything trainable this is the full state dict."""
        self.version += 1  # the policy that loads these draws samples of this version
        trainable = {name for name, p in self.model.named_parameters() if p.requires_grad}
        buffers = {name for name, _ in self.model.named_buffers()}
        return {"w": {k: v.detach().clone() for k, v in self.model.state_dict().items()
                      if k in trainable or k in buffers}}

    def get_state(self, name: str) -> Any:
        if name == "weights":
            return {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        if name == "optimizer":
            return {"adam": copy.deepcopy(self.opt.state_dict()), "updates": self.updates,
                    "obs_stats": copy.deepcopy(self.obs_stats), "published": self.version}
        raise KeyError(f"{type(self).__name__} has no state object {name!r} (it owns 'weights', 'optimizer')")

    def set_state(self, name: str, value: Any) -> None:
        if name == "weights":
            self.model.load_state_dict(value)
        elif name == "optimizer":
            self.opt.load_state_dict(copy.deepcopy(value["adam"]))
            self.updates = int(value["updates"])
            self.obs_stats = copy.deepcopy(value["obs_stats"])
            self.version = int(value.get("published", 0))  # the policy version lags are taken against (0: older)
        else:
            raise KeyError(f"{type(self).__name__} has no state object {name!r} (it owns 'weights', 'optimizer')")

    def pop_metrics(self) -> dict[str, float]:
        """Means over the gradient steps since the previous call; the ratio's extremes; the staleness
        histogram (sample counts), its mean and max, and the policy version published so far."""
        out = {k: sum(v) / len(v) for k, v in self._metrics.items() if v}
        out.update(self._extremes)
        counts = self._counts
        if counts.get("staleness_n"):
            out["staleness_mean"] = counts["staleness_sum"] / counts["staleness_n"]
            out.update({k: v for k, v in counts.items() if k.startswith("staleness_hist_")})
        out["policy_version"] = float(self.version)
        self._metrics, self._extremes, self._counts = {}, {}, {}
        return out
