"""Token sampling by inverse CDF from per-sample uniform streams.

Each (prompt, sample) pair owns a stream of uniforms keyed by (seed, iteration, prompt id, sample
index), drawn up front. Sampling a token consumes the uniform of its position, so what a sequence
samples does not depend on which other sequences share its decode step, on the number of decode slots,
or on the order in which the scheduler admits work.
"""

from __future__ import annotations

import math
import random

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


def allowed_logits(logits: torch.Tensor, n_tokens: int, ban: int | list[int] | None = None) -> torch.Tensor:
    """`logits` [..., V] with the ids the policy may not emit set to -inf: ids >= `n_tokens` (a model vocabulary
    padded beyond the tokenizer's) and `ban` (an id or ids: EOS while a forced completion length is not
    reached; the agent's forced turns also ban its tool-call token). The
    sampler and every log-prob recomputation apply the same mask, so the behaviour, reference and learner
    log-probs are of one distribution (the mask is part of the environment, as top-p is)."""
    if logits.shape[-1] <= n_tokens and ban is None:
        return logits
    logits = logits.clone()
    logits[..., n_tokens:] = float("-inf")
    if ban is not None:
        logits[..., ban] = float("-inf")
    return logits


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


Z99 = 2.3263478740408408  # the standard normal's 99th percentile
_LENGTH_STREAM = 0x1E5  # the length draws have their own stream, apart from the token uniforms


def lognormal_params(mean: float, p99: float) -> tuple[float, float]:
    """(mu, sigma) of the lognormal with this mean and 99th percentile: ln p99 = mu + z sigma and
    ln mean = mu + sigma^2 / 2 give sigma = z - sqrt(z^2 - 2 ln(p99 / mean)) (the narrower root)."""
    if not 0 < mean < p99:
        raise ValueError(f"completion lengths need 0 < mean < p99, got mean {mean}, p99 {p99}")
    disc = Z99 * Z99 - 2 * math.log(p99 / mean)
    if disc < 0:
        raise ValueError(f"no lognormal has mean {mean} and p99 {p99}: p99 / mean must be <= "
                         f"{math.exp(Z99 * Z99 / 2):.1f}")
    sigma = Z99 - math.sqrt(disc)
    return math.log(mean) - sigma * sigma / 2, sigma


def forced_lengths(seed: int, it: int, prompt_ids: list[int], k: int, mean: float, p99: float,
                   limit: int) -> torch.Tensor:
    """Completion lengths [P, K] (int64, in [1, limit]): sample (p, j) draws its length from the lognormal
    of `mean` and `p99` with its own generator keyed by (seed, it, prompt id, j), so that every plan, row
    grouping and slot count generates the same lengths (a systems stand-in for a trained model's lengths)."""
    mu, sigma = lognormal_params(mean, p99)
    out = torch.empty(len(prompt_ids), k, dtype=torch.long)
    for p, pid in enumerate(prompt_ids):
        for j in range(k):
            x = random.Random(mix_seed(seed, it, pid, j, _LENGTH_STREAM)).lognormvariate(mu, sigma)
            out[p, j] = max(1, min(limit, round(x)))
    return out
