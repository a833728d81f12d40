"""ReferenceScorer: per-token log-probs of the completions under the frozen initial policy (`reference.score`).

The reference is the warm-started initial policy, built from the same spec and seed as the generator
and learner (so its `weights_hash` equals their initial hash). Its log-probs are computed once, at
sampling time, and travel with the rollouts to the learner's KL term (the lecture's "cache reference
log-probs at sampling time"), so the learner never runs the reference inside its gradient step.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from examples.llm.policy import (
    PolicySpec,
    build_policy,
    completion_logp,
    flat_samples,
    param_hash,
    params_to,
    token_chunks,
)
from examples.llm.tokenizer import CharTokenizer

Record = dict[str, torch.Tensor]


class ReferenceScorer:
    """Frozen reference policy; stateless from the workflow's point of view (its weights never change)."""

    def __init__(
        self,
        seed: int = 0,
        device: str = "cpu",
        policy: Mapping[str, Any] | None = None,
        cache_dir: str | None = None,
        tokenizer_hash: str | None = None,
        max_rows: int = 1024,
        micro_tokens: int = 0,
    ) -> None:
        self.spec = PolicySpec.from_args(policy)
        self.device = torch.device(device)
        self.tokenizer = CharTokenizer()
        self.tokenizer_hash = self.tokenizer.hash()
        if tokenizer_hash is not None:
            self.tokenizer.check(tokenizer_hash, "ReferenceScorer")
        self.model = build_policy(self.spec, int(seed), self.device, cache_dir).eval()
        self.model.requires_grad_(False)
        self.weights_hash = param_hash(self.model.state_dict())
        if self.device.type == "cuda":
            params_to(self.model, torch.bfloat16)
        self.max_rows = int(max_rows)
        if int(micro_tokens) < 0:
            raise ValueError(f"ReferenceScorer: micro_tokens must be >= 0 (0: by max_rows), got {micro_tokens}")
        self.micro_tokens = int(micro_tokens)

    @torch.no_grad()
    def score(self, rollouts: Record) -> dict[str, torch.Tensor]:
        """`{"ref_logp": Tensor[P, K, L]}`: reference log-probs of each completion token, 0 off the mask.

        On the CPU each prompt's K sequences are scored in their own forward pass of a fixed shape, so a
        prompt's result is bit-identical whatever other prompts share the call (split invariance); on
        CUDA, up to `max_rows` sequences go through one pass, for speed, or with `micro_tokens` the
        samples in groups of at most that many tokens, longest first, each cut to its longest row (a
        long tail padded into every pass would multiply the work).
        """
        if self.micro_tokens and self.device.type != "cpu":
            return {"ref_logp": self._score_by_tokens(rollouts)}
        p_count, k, _ = rollouts["tokens"].shape
        step = 1 if self.device.type == "cpu" else max(1, self.max_rows // max(k, 1))
        parts = []
        for lo in range(0, p_count, step):
            chunk = {name: t[lo : lo + step] for name, t in rollouts.items()}
            with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.device.type == "cuda"):
                parts.append(completion_logp(self.model, chunk, self.device).float().cpu())
        out = torch.cat(parts) if parts else torch.zeros_like(rollouts["logp"])
        return {"ref_logp": out}

    def _score_by_tokens(self, rollouts: Record) -> torch.Tensor:
        p_count, k, length = rollouts["tokens"].shape
        out = torch.zeros(p_count * k, length)
        if p_count * k == 0:
            return out.view(p_count, k, length)
        sel = torch.ones(p_count, k, dtype=torch.bool).nonzero(as_tuple=True)
        samples = flat_samples(rollouts, sel)
        lengths = samples["prompt_len"] + samples["mask"].sum(-1).squeeze(1)
        for idx in token_chunks(lengths, self.micro_tokens):
            sub = {name: t[idx] for name, t in samples.items()}
            out[idx] = completion_logp(self.model, sub, self.device, trim=True).float().cpu().squeeze(1)
        return out.view(p_count, k, length)
