"""GRPO for the flow policy: group-relative episode advantages, PPO-clipped objective, no critic.

The simulator is built with the same `group_size`: envs r with equal `r // group_size` reset from the
same seed, so a group's members start every episode in the same state and differ only by the policy's
noise. Each episode's return is compared with the other members' returns for the same episode slot:
`adv = (R - mean_group) / (std_group + eps)`, applied to every step of that episode.
"""

from __future__ import annotations

from typing import Any

import torch

from .ppo import PPOTrainer, Traj


class GRPOTrainer(PPOTrainer):
    """State objects as `PPOTrainer` (`weights`, `optimizer`); the value head is built but untrained."""

    def __init__(
        self,
        obs_dim: int,
        act_dim: int,
        chunk: int,
        hidden: int,
        denoise_steps: int,
        lr: float,
        group_size: int,
        seed: int = 0,
        device: str = "cpu",
        ppo_epochs: int = 4,
        minibatches: int = 4,
        clip: float = 0.2,
        ent_coef: float = 0.0,
        max_grad_norm: float = 0.5,
        sync_every: int = 1,
        eps: float = 1e-6,
        image: bool = False,
        replica: int = 0,
        replicas: int = 1,
        **model_kwargs: Any,
    ) -> None:
        if group_size < 2:
            raise ValueError("GRPO needs group_size >= 2 (envs per group sharing an initial state)")
        super().__init__(
            obs_dim, act_dim, chunk, hidden, denoise_steps, lr, seed=seed, device=device,
            ppo_epochs=ppo_epochs, minibatches=minibatches, clip=clip, vf_coef=0.0, ent_coef=ent_coef,
            max_grad_norm=max_grad_norm, sync_every=sync_every, image=image, replica=replica,
            replicas=replicas, **model_kwargs,
        )
        self.group_size, self.eps = int(group_size), float(eps)

    def _advantages(self, traj: Traj) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Per-step advantage `[T, N]` = the group-normalized return of the step's episode.

        Episode slot e of row n covers the steps after its e-th `done`; the last slot may be cut by
        the end of the rollout, which cuts all group members at the same step, so their partial
        returns stay comparable.
        """
        reward, done = traj["reward"].float(), traj["done"].float()
        T, N = reward.shape
        if N % self.group_size:
            raise ValueError(f"GRPO: {N} envs is not a multiple of group_size={self.group_size}")
        slot = (torch.cumsum(done, dim=0) - done).long()  # episode slot of each step  [T, N]
        slots = int(slot.max()) + 1
        returns = torch.zeros(slots, N, device=reward.device).scatter_add_(0, slot, reward)  # [E, N]
        present = torch.zeros(slots, N, device=reward.device).scatter_add_(0, slot, torch.ones_like(reward)) > 0
        grouped = returns.view(slots, N // self.group_size, self.group_size)
        mask = present.view_as(grouped).float()
        count = mask.sum(-1, keepdim=True).clamp_min(1.0)
        mean = (grouped * mask).sum(-1, keepdim=True) / count
        std = (((grouped - mean) * mask).square().sum(-1, keepdim=True) / count).sqrt()
        adv_slot = ((grouped - mean) / (std + self.eps) * mask).view(slots, N)
        return torch.gather(adv_slot, 0, slot), None

    def _normalize(self, adv: torch.Tensor) -> torch.Tensor:
        """Already normalized within groups."""
        return adv

