"""GRPOLearner: group-relative policy optimisation over the grouped rollout buffer (`learner.update`).

One `update` call is one optimiser step on a contiguous slice of the prompts (minibatch `mb` of
`minibatches`). The rollout record *is* the grouped buffer (prompts on dim 0, the K samples of a prompt
on dim 1), so group statistics need no regrouping pass. Per the lecture's buffer semantics, a sample is
valid when it has a completion and finite log-probs and reward; groups with fewer than `min_k` valid
samples are dropped (counted), invalid samples of kept groups are masked out.

Loss per completion token (token-level mean over the mask of the minibatch):
    -min(r * A, clip(r, 1 - clip, 1 + clip) * A) + kl_coef * k3(ref, new)
(`loss_agg: sequence`: each sample's token mean, then the mean over samples, as GRPO's paper writes it:
with forced long-tail lengths the tokens that only fill a completion then do not outweigh its answer)
with r = exp(logp_new - logp_behaviour), A = (reward - group mean) / (group std + eps) and the k3 KL
estimator exp(ref - new) - (ref - new) - 1 (unbiased for KL(pi || ref), always >= 0).

The behaviour log-probs are the generator's, recorded at sampling time (`rollouts["logp"]`), never
recomputed: the importance ratio r is against the policy that actually sampled, whatever its age (the
lecture's PPO/GRPO recipe; clipping bounds what a stale sample can move). Each sample carries the policy
version that sampled it (`rollouts["version"]`: weight syncs the generator had received); the learner
counts the weights it has published (`version`), and their difference is the sample's staleness. The
metrics give the ratio's statistics and a staleness histogram (`staleness_hist_<lag>`: samples trained
at that lag). With per-token versions (`version` [P, K, L]: the generator's partial rollouts) a sample's lag
is its oldest token's, and `mixed_version_samples` counts those sampled under several versions;
`max_staleness` (optional) makes a sample older than that an error. With synchronous plans every lag is 0 and r = 1 up to floating point (the
generator's KV-cache decode against the learner's full forward, bf16 on the GPU).

Micro-batches (`micro_tokens`): one optimiser step accumulates the gradients of groups of samples of
at most that many (padded) tokens each, longest first, so that a long-tail minibatch fits in memory on
the GPU; 0 = the whole minibatch in one pass (the CPU default).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from examples.llm.policy import (
    PolicySpec,
    build_policy,
    clone_weights,
    completion_logp,
    flat_samples,
    param_hash,
    token_chunks,
)
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
        micro_tokens: int = 0,
        loss_agg: str = "token",
        policy: Mapping[str, Any] | None = None,
        cache_dir: str | None = None,
        tokenizer_hash: str | None = None,
        max_staleness: int | None = None,
    ) -> None:
        if int(minibatches) < 1:
            raise ValueError(f"GRPOLearner: minibatches must be >= 1, got {minibatches}")
        if int(min_k) < 2:
            raise ValueError(f"GRPOLearner: min_k must be >= 2 (a group of one has no baseline), got {min_k}")
        self.spec = PolicySpec.from_args(policy)
        self.minibatches, self.min_k = int(minibatches), int(min_k)
        self.clip, self.kl_coef, self.adv_eps = float(clip), float(kl_coef), float(adv_eps)
        self.max_grad_norm = float(max_grad_norm)
        if int(micro_tokens) < 0:
            raise ValueError(f"GRPOLearner: micro_tokens must be >= 0 (0: no micro-batches), got {micro_tokens}")
        self.micro_tokens = int(micro_tokens)
        if loss_agg not in ("token", "sequence"):
            raise ValueError(f"GRPOLearner: loss_agg must be 'token' or 'sequence', got {loss_agg!r}")
        self.loss_agg = loss_agg
        self.max_staleness = None if max_staleness is None else int(max_staleness)  # checked per trained sample
        self.version = 0  # weights published (`get_weights`): the policy version a sample's lag is taken against
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
                    "param_groups": [dict(g) for g in sd["param_groups"]], "published": self.version}
        raise KeyError(f"GRPOLearner has no state {name!r} (it has: weights, optimizer)")

    def set_state(self, name: str, value: Any) -> None:
        if name == "weights":
            self.model.load_state_dict({k: v.to(self.device) for k, v in value.items()})
        elif name == "optimizer":  # (and the weights published so far: the policy version lags are taken against)
            self.opt.load_state_dict({k: v for k, v in value.items() if k != "published"})
            self.version = int(value.get("published", 0))  # (0: an older checkpoint's, as the generator's then)
        else:
            raise KeyError(f"GRPOLearner has no state {name!r} (it has: weights, optimizer)")

    def get_weights(self) -> dict[str, Any]:
        """`{"w": CPU copy of the parameters (bf16 when training on CUDA), "hash": their sha256}`, for
        `Generator.load_weights`; counts a published version."""
        w = clone_weights(self.model)
        if self.device.type == "cuda":  # the generator samples with bf16 weights there: half the bytes to move and hash
            w = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in w.items()}
        self.version += 1
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
        self._staleness(part, sel)
        dev = self.device
        m = tok_mask[sel].to(dev)
        if self.loss_agg == "token":  # every token of the minibatch weighs the same (long samples weigh more)
            weight = m.float() / n_tok
        else:  # every sample weighs the same: its tokens' mean, then the mean over samples (GRPO's paper)
            weight = m.float() / (m.sum(-1, keepdim=True).clamp(min=1) * m.shape[0])
        batch = {
            "samples": flat_samples(part, sel), "old": part["logp"][sel].to(dev), "ref": ref[sel].to(dev),
            "adv": adv[sel].to(dev).unsqueeze(-1), "mask": m, "weight": weight,
        }
        self.opt.zero_grad(set_to_none=True)
        stats = self._accumulate(batch, n_tok)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm)
        self.opt.step()
        r = torch.cat(stats.pop("ratios"))
        self._add(**stats, grad_norm=float(grad_norm), trained_steps=1.0, tokens=float(n_tok),
                  reward=float(rew[valid].mean()) if valid.any() else 0.0, ratio_sq=float((r * r).sum()),
                  ratio_sum=float(r.sum()), ratio_n=float(r.numel()))
        self._metrics["ratio_max"] = max(self._metrics.get("ratio_max", 0.0), float(r.max()))
        self._metrics["ratio_min"] = min(self._metrics.get("ratio_min", float("inf")), float(r.min()))

    def _accumulate(self, batch: dict[str, Any], n_tok: int) -> dict[str, Any]:
        """Forward and backward over the micro-batches of one step; the loss is the token mean of the step."""
        samples, lengths = batch["samples"], batch["samples"]["prompt_len"] + batch["mask"].sum(-1).cpu()
        n = lengths.numel()
        chunks = token_chunks(lengths, self.micro_tokens) if self.micro_tokens else [torch.arange(n)]
        trim = self.device.type != "cpu"
        loss_sum = kl_sum = clipped = 0.0
        ratios = []
        for idx in chunks:
            sub = {name: t[idx] for name, t in samples.items()}
            with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.device.type == "cuda"):
                new = completion_logp(self.model, sub, self.device, trim).float().squeeze(1)
            d = idx.to(self.device)
            old, ref_s, adv_s, m = batch["old"][d], batch["ref"][d], batch["adv"][d], batch["mask"][d]
            w = batch["weight"][d]
            ratio = torch.exp(new - old)
            surrogate = torch.minimum(ratio * adv_s, ratio.clamp(1 - self.clip, 1 + self.clip) * adv_s)
            log_r = ref_s - new
            kl = torch.exp(log_r) - log_r - 1
            loss = ((-surrogate + self.kl_coef * kl) * w).sum()
            loss.backward()
            with torch.no_grad():
                loss_sum += float(loss)
                kl_sum += float((kl * m).sum()) / n_tok
                clipped += float((((ratio - 1).abs() > self.clip) & m).sum()) / n_tok
                ratios.append(ratio.detach()[m].float().cpu())
        return {"loss": loss_sum, "kl": kl_sum, "clip_frac": clipped, "ratios": ratios}

    def _staleness(self, part: Record, sel: tuple[torch.Tensor, torch.Tensor]) -> None:
        """Count the trained samples by lag = published versions - the version that sampled them; with
        per-token versions ([P, K, L], partial rollouts) the oldest token's. Above `max_staleness` (when
        given) is an error: the generator's bound or the plan's deferral let an older sample through."""
        if "version" not in part:
            return
        versions = part["version"][sel]
        if versions.dim() == 2:  # per token: a sample is as old as its oldest token
            self._add(mixed_version_samples=float((versions.max(-1).values != versions.min(-1).values).sum()))
            versions = versions.min(-1).values
        lags = (self.version - versions).tolist()
        if self.max_staleness is not None and lags and max(lags) > self.max_staleness:
            raise ValueError(f"GRPOLearner.update: a sample sampled {max(lags)} published versions ago, above "
                             f"max_staleness {self.max_staleness}")
        for lag in set(lags):
            self._add(**{f"staleness_hist_{lag}": float(lags.count(lag))})
        self._add(staleness_sum=float(sum(lags)), staleness_n=float(len(lags)))
        self._metrics["staleness_max"] = max(self._metrics.get("staleness_max", 0.0), float(max(lags, default=0)))
        self._metrics["sample_version_min"] = min(self._metrics.get("sample_version_min", float("inf")),
                                                  float(versions.min()) if len(lags) else float("inf"))

    def _add(self, **values: float) -> None:
        for k, v in values.items():
            self._metrics[k] = self._metrics.get(k, 0.0) + v

    def pop_metrics(self) -> dict[str, float]:
        """Loss, KL, clip fraction, grad norm (means over trained steps); the importance ratio's mean, std,
        min and max over trained tokens; the staleness histogram, mean and max; dropped groups."""
        m, self._metrics = self._metrics, {}
        if not m:
            return {}
        n = max(m.get("trained_steps", 0.0), 1.0)
        out = {k: m[k] / n for k in ("loss", "kl", "clip_frac", "grad_norm", "reward") if k in m}
        out.update(
            ratio_max=m.get("ratio_max", 0.0), dropped_groups=m.get("dropped_groups", 0.0),
            groups=m.get("groups", 0.0), steps=m.get("steps", 0.0),
            skipped_steps=m.get("skipped_steps", 0.0), tokens=m.get("tokens", 0.0),
            policy_version=float(self.version),
        )
        if m.get("ratio_n"):
            mean = m["ratio_sum"] / m["ratio_n"]
            out.update(ratio_mean=mean, ratio_min=m["ratio_min"],
                       ratio_std=max(m["ratio_sq"] / m["ratio_n"] - mean * mean, 0.0) ** 0.5)
        if m.get("staleness_n"):
            out.update(staleness_mean=m["staleness_sum"] / m["staleness_n"], staleness_max=m["staleness_max"],
                       sample_version_min=m["sample_version_min"])
            out.update({k: v for k, v in m.items() if k.startswith("staleness_hist_")})
        if "mixed_version_samples" in m:  # per-token versions: samples whose tokens span several versions
            out["mixed_version_samples"] = m["mixed_version_samples"]
        return out
