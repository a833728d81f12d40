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

from examples.llm.policy import PolicySpec, build_policy, completion_logp, param_hash
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
        self.max_rows = int(max_rows)

    @torch.no_grad()
    def score(self, rollouts: Record) -> dict[str, torch.Tensor]:
        """`{"ref_logp": Tensor[P, K, L]}`: reference log-probs of each completion token, 0 off the mask.

        On the CPU each prompt's K sequences are scored in their own forward pass of a fixed shape, so a
        prompt's result is bit-identical whatever other prompts share the call (split invariance); on
        CUDA, up to `max_rows` sequences go through one pass, for speed.
        """
        p_count, k, _ = rollouts["tokens"].shape
        step = 1 if self.device.type == "cpu" else max(1, self.max_rows // max(k, 1))
        parts = []
        for lo in range(0, p_count, step):
            chunk = {name: t[lo : lo + step] for name, t in rollouts.items()}
            with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.device.type == "cuda"):
                parts.append(completion_logp(self.model, chunk, self.device).float().cpu())
        out = torch.cat(parts) if parts else torch.zeros_like(rollouts["logp"])
        return {"ref_logp": out}
