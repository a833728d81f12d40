"""Token sampling by inverse CDF from per-sample uniform streams.

Each (prompt, sample) pair owns a stream of uniforms keyed by (seed, iteration, prompt id, sample
index), drawn up front. Sampling a token consumes the uniform of its position, so what a sequence
samples does not depend on which other sequences share its decode step, on the number of decode slots,
or on the order in which the scheduler admits work.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from examples.llm.seeding import mix_seed


def uniform_streams(seed: int, it: int, prompt_ids: list[int], k: int, length: int) -> torch.Tensor:
    """Uniforms [P, K, L] in [0, 1): row (p, j) comes from a generator seeded by (seed, it, id_p, j)."""
    out = torch.empty(len(prompt_ids), k, length, dtype=torch.float64)
    g = torch.Generator()
    for p, pid in enumerate(prompt_ids):
        for j in range(k):
            g.manual_seed(mix_seed(seed, it, pid, j))
            out[p, j] = torch.rand(length, generator=g, dtype=torch.float64)
    return out


def sample_rows(
    logits: torch.Tensor, u: torch.Tensor, temperature: float, top_p: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row of logits [A, V] with uniforms u [A]; returns (tokens [A], logp [A]).

    The token is drawn from softmax(logits / temperature) restricted to the smallest set of most likely
    tokens whose mass reaches `top_p` (nucleus sampling). The returned log-prob is that of the token under
    the *tempered, untruncated* distribution, which is what the learner and reference recompute
    (`completion_logp`); with top_p < 1 the truncation is thus treated as part of the environment.
    Every operation is row-wise, so row r's result depends on row r only.
    """
    logp_all = F.log_softmax(logits.float() / temperature, dim=-1)
    probs, order = logp_all.exp().sort(dim=-1, descending=True, stable=True)
    if top_p < 1.0:
        mass_before = probs.cumsum(dim=-1) - probs
        probs = probs * (mass_before < top_p)  # the most likely token is always kept
    cdf = probs.double().cumsum(dim=-1)
    target = (u.to(cdf.device) * cdf[:, -1]).unsqueeze(1)
    idx = torch.searchsorted(cdf, target, right=True)
    last_positive = (probs > 0).sum(dim=-1, keepdim=True) - 1  # guards u * total rounding up to total
    idx = torch.minimum(idx, last_positive)
    tokens = order.gather(1, idx).squeeze(1)
    return tokens, logp_all.gather(1, tokens.unsqueeze(1)).squeeze(1)
