"""GRPOLearner: group-relative policy optimisation over the grouped rollout buffer (`learner.update`).

One `update` call is one optimiser step on a contiguous slice of the prompts (minibatch `mb` of
`minibatches`). The rollout record *is* the grouped buffer (prompts on dim 0, the K samples of a prompt
on dim 1), so group statistics need no regrouping pass. Per the lecture's buffer semantics, a sample is
valid when it has a completion and finite log-probs and reward; groups with fewer than `min_k` valid
samples are dropped (counted), invalid samples of kept groups are masked out.

Loss per completion token (token-level mean over the mask of the minibatch):
    -min(r * A, clip(r, 1 - clip, 1 + clip) * A) + kl_coef * k3(ref, new)
with r = exp(logp_new - logp_sampling), A = (reward - group mean) / (group std + eps) and the k3 KL
estimator exp(ref - new) - (ref - new) - 1 (unbiased for KL(pi || ref), always >= 0).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from examples.llm.policy import PolicySpec, build_policy, clone_weights, completion_logp, param_hash
from examples.llm.tokenizer import CharTokenizer

Record = dict[str, torch.Tensor]


def group_advantages(reward: torch.Tensor, valid: torch.Tensor, min_k: int, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO advantages [P, K] over valid samples and the mask [P] of groups kept (>= min_k valid).

    Invalid samples and dropped groups get advantage 0 (and are masked out of the loss by the caller).
    """
    w = valid.float()
    n = w.sum(dim=1, keepdim=True)
    r = torch.where(valid, reward, torch.zeros_like(reward))
    mean = r.sum(dim=1, keepdim=True) / n.clamp(min=1)
    var = ((r - mean) ** 2 * w).sum(dim=1, keepdim=True) / n.clamp(min=1)
    adv = (r - mean) / (var.sqrt() + eps)
    keep = n.squeeze(1) >= min_k
    return torch.where(valid & keep.unsqueeze(1), adv, torch.zeros_like(adv)), keep


class GRPOLearner:
    """The trained policy. State `weights` (parameters) and `optimizer` (Adam moments)."""

    def __init__(
        self,
        lr: float,
        minibatches: int,
        seed: int = 0,
        device: str = "cpu",
        clip: float = 0.2,
        kl_coef: float = 0.02,
        min_k: int = 2,
        adv_eps: float = 1e-4,
        max_grad_norm: float = 1.0,
        policy: Mapping[str, Any] | None = None,
        cache_dir: str | None = None,
        tokenizer_hash: str | None = None,
    ) -> None:
        if int(minibatches) < 1:
            raise ValueError(f"GRPOLearner: minibatches must be >= 1, got {minibatches}")
        if int(min_k) < 2:
            raise ValueError(f"GRPOLearner: min_k must be >= 2 (a group of one has no baseline), got {min_k}")
        self.spec = PolicySpec.from_args(policy)
        self.minibatches, self.min_k = int(minibatches), int(min_k)
        self.clip, self.kl_coef, self.adv_eps = float(clip), float(kl_coef), float(adv_eps)
        self.max_grad_norm = float(max_grad_norm)
        self.device = torch.device(device)
        self.tokenizer = CharTokenizer()
        self.tokenizer_hash = self.tokenizer.hash()
        if tokenizer_hash is not None:
            self.tokenizer.check(tokenizer_hash, "GRPOLearner")
        self.model = build_policy(self.spec, int(seed), self.device, cache_dir).train()
        self.initial_hash = param_hash(self.model.state_dict())
        self.opt = torch.optim.Adam(self.model.parameters(), lr=float(lr))
        self._metrics: dict[str, float] = {}

    # -- state ---------------------------------------------------------------------------------------
    @property
    def weights(self) -> dict[str, torch.Tensor]:
        return {k: v.detach() for k, v in self.model.state_dict().items()}

    @property
    def optimizer(self) -> dict[str, Any]:
        return self.opt.state_dict()

    def get_state(self, name: str) -> Any:
        if name == "weights":
            return clone_weights(self.model)
        if name == "optimizer":
            sd = self.opt.state_dict()
            return {"state": {i: {k: v.clone() if torch.is_tensor(v) else v for k, v in s.items()}
                              for i, s in sd["state"].items()},
                    "param_groups": [dict(g) for g in sd["param_groups"]]}
        raise KeyError(f"GRPOLearner has no state {name!r} (it has: weights, optimizer)")

    def set_state(self, name: str, value: Any) -> None:
        if name == "weights":
            self.model.load_state_dict({k: v.to(self.device) for k, v in value.items()})
        elif name == "optimizer":
            self.opt.load_state_dict(value)
        else:
            raise KeyError(f"GRPOLearner has no state {name!r} (it has: weights, optimizer)")

    def get_weights(self) -> dict[str, Any]:
        """`{"w": CPU copy of the parameters, "hash": their sha256}`, for `Generator.load_weights`."""
        w = clone_weights(self.model)
        return {"w": w, "hash": param_hash(w)}

    # -- training ------------------------------------------------------------------------------------
    def update(self, rollouts: Record, ref_logp: torch.Tensor, reward: torch.Tensor, mb: int) -> None:
        """One GRPO step on minibatch `mb` (a contiguous slice of the prompts)."""
        mb = int(mb)
        if not 0 <= mb < self.minibatches:
            raise ValueError(f"GRPOLearner.update: mb={mb} is outside 0..{self.minibatches - 1}")
        p_count = rollouts["tokens"].shape[0]
        if ref_logp.shape != rollouts["tokens"].shape or reward.shape != rollouts["tokens"].shape[:2]:
            raise ValueError(
                f"GRPOLearner.update: shapes disagree: tokens {tuple(rollouts['tokens'].shape)}, "
                f"ref_logp {tuple(ref_logp.shape)}, reward {tuple(reward.shape)} (want [P, K, L], [P, K])"
            )
        lo, hi = p_count * mb // self.minibatches, p_count * (mb + 1) // self.minibatches
        part = {name: t[lo:hi] for name, t in rollouts.items()}
        ref, rew = ref_logp[lo:hi].float(), reward[lo:hi].float()
        mask = part["mask"]
        valid = (
            (part["lengths"] > 0)
            & torch.isfinite(rew)
            & torch.isfinite(part["logp"]).all(-1)
            & torch.isfinite(ref).all(-1)
        )
        adv, keep = group_advantages(rew, valid, self.min_k, self.adv_eps)
        tok_mask = mask & (valid & keep.unsqueeze(1)).unsqueeze(-1)
        self._add(groups=float(hi - lo), dropped_groups=float((~keep).sum()), steps=1.0)
        n_tok = int(tok_mask.sum())
        if n_tok == 0:
            self._add(skipped_steps=1.0)
            return
        sel = (valid & keep.unsqueeze(1)).nonzero(as_tuple=True)  # train only on the kept samples
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.device.type == "cuda"):
            new = completion_logp(self.model, _select_samples(part, sel), self.device).float().squeeze(1)
        dev = self.device
        old = part["logp"][sel].to(dev)
        ref_s, adv_s, m = ref[sel].to(dev), adv[sel].to(dev).unsqueeze(-1), tok_mask[sel].to(dev)
        ratio = torch.exp(new - old)
        surrogate = torch.minimum(ratio * adv_s, ratio.clamp(1 - self.clip, 1 + self.clip) * adv_s)
        log_r = ref_s - new
        kl = torch.exp(log_r) - log_r - 1
        loss = ((-surrogate + self.kl_coef * kl) * m).sum() / n_tok
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm)
        self.opt.step()
        with torch.no_grad():
            r, mf = ratio.detach()[m], m.float()
            clipped = ((ratio - 1).abs() > self.clip) & m
            self._add(
                loss=float(loss), kl=float((kl.detach() * mf).sum() / n_tok), ratio_mean=float(r.mean()),
                clip_frac=float(clipped.sum() / n_tok), grad_norm=float(grad_norm), trained_steps=1.0,
                tokens=float(n_tok), reward=float(rew[valid].mean()) if valid.any() else 0.0,
            )
            self._metrics["ratio_max"] = max(self._metrics.get("ratio_max", 0.0), float(r.max()))

    def _add(self, **values: float) -> None:
        for k, v in values.items():
            self._metrics[k] = self._metrics.get(k, 0.0) + v

    def pop_metrics(self) -> dict[str, float]:
        """Loss, KL, ratio mean/max, clip fraction, grad norm (means over trained steps), dropped groups."""
        m, self._metrics = self._metrics, {}
        if not m:
            return {}
        n = max(m.get("trained_steps", 0.0), 1.0)
        out = {k: m[k] / n for k in ("loss", "kl", "ratio_mean", "clip_frac", "grad_norm", "reward") if k in m}
        out.update(
            ratio_max=m.get("ratio_max", 0.0), dropped_groups=m.get("dropped_groups", 0.0),
            groups=m.get("groups", 0.0), steps=m.get("steps", 0.0),
            skipped_steps=m.get("skipped_steps", 0.0), tokens=m.get("tokens", 0.0),
        )
        return out


def _select_samples(part: Record, sel: tuple[torch.Tensor, torch.Tensor]) -> Record:
    """A one-sample-per-row rollout record ([N, 1, L]) of the selected (prompt, sample) pairs."""
    p_idx, k_idx = sel
    return {
        "prompt": part["prompt"][p_idx], "prompt_len": part["prompt_len"][p_idx],
        "temperature": part["temperature"][p_idx],
        "tokens": part["tokens"][p_idx, k_idx].unsqueeze(1), "mask": part["mask"][p_idx, k_idx].unsqueeze(1),
    }
