"""A small decoder-only transformer with a slot-based KV cache.

Three entry points, one set of weights:
- `forward(tokens)`: full causal pass over padded sequences (learner, reference scorer, warm start);
- `prefill(tokens)`: one prompt, returns its last-position logits and its KV (shared by the K samples);
- `decode(tokens, pos, cache, slots)`: one new token for each active decode slot, reading and appending
  to that slot's rows of a preallocated cache (continuous batching: slots are reused as sequences end).

Row invariance. On the CPU, `F.linear` picks a different GEMM kernel depending on the number of rows
(a 1-row product is computed differently from a 7-row one), so a sequence's logits would depend on how
many other sequences share its decode step. With `row_invariant=True`, `decode` computes every matmul
as a batch of independent 1-row products (`torch.bmm` against the expanded weight), so row r's result
is a function of row r alone: split invariance and slot-count invariance hold bit for bit. On CUDA the
generator turns this off for speed (cuBLAS gives no such guarantee either way).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class ModelConfig:
    """Model shape. The CPU default has ~0.4M parameters."""

    vocab_size: int = 17
    context: int = 32
    layers: int = 2
    d_model: int = 128
    heads: int = 4
    ffn_mult: int = 4

    def __post_init__(self) -> None:
        if self.d_model % self.heads:
            raise ValueError(f"d_model {self.d_model} is not divisible by heads {self.heads}")
        if min(self.vocab_size, self.context, self.layers, self.d_model, self.heads, self.ffn_mult) < 1:
            raise ValueError(f"model config has a non-positive size: {self}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


def _linear(x: torch.Tensor, lin: nn.Linear, row_invariant: bool) -> torch.Tensor:
    """`lin(x)` for x [A, d_in]; with `row_invariant`, as A independent 1-row products (see module doc)."""
    if not row_invariant:
        return lin(x)
    a, d_in = x.shape
    w = lin.weight.t().expand(a, d_in, lin.out_features)
    y = torch.bmm(x.unsqueeze(1), w).squeeze(1)
    return y + lin.bias if lin.bias is not None else y


class KVCache:
    """Keys and values for `slots` sequences of up to `context` tokens: k, v [layers, slots, H, T, hd]."""

    def __init__(self, cfg: ModelConfig, slots: int, device: torch.device | str, dtype: torch.dtype) -> None:
        shape = (cfg.layers, slots, cfg.heads, cfg.context, cfg.head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)

    @property
    def slots(self) -> int:
        return self.k.shape[1]

    def load_prefix(self, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Copy one prompt's prefill KV ([layers, H, T, hd]) into each slot of `slots`.

        The prefill ran once; its KV is expanded to the K samples (copied, never recomputed).
        """
        t = k.shape[2]
        self.k[:, slots, :, :t] = k.unsqueeze(1).to(self.k.dtype)
        self.v[:, slots, :, :t] = v.unsqueeze(1).to(self.v.dtype)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        d = cfg.d_model
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, cfg.ffn_mult * d)
        self.fc2 = nn.Linear(cfg.ffn_mult * d, d)

    def _split_heads(self, x: torch.Tensor) -> torch.Tensor:
        """[..., T, d] -> [..., H, T, hd]"""
        *lead, t, _ = x.shape
        return x.view(*lead, t, self.cfg.heads, self.cfg.head_dim).transpose(-3, -2)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Causal pass over x [B, T, d]; returns (x, k, v) with k, v [B, H, T, hd]."""
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = self._split_heads(q), self._split_heads(k), self._split_heads(v)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        x = x + self.fc2(F.gelu(self.fc1(self.ln2(x))))
        return x, k, v

    def decode(
        self, x: torch.Tensor, pos: torch.Tensor, cache: KVCache, layer: int, slots: torch.Tensor,
        row_invariant: bool,
    ) -> torch.Tensor:
        """One token per active slot: x [A, d] at positions pos [A]; appends k/v to the slots' cache."""
        a, d = x.shape
        cfg = self.cfg
        q, k, v = _linear(self.ln1(x), self.qkv, row_invariant).split(d, dim=-1)
        q, k, v = (z.view(a, cfg.heads, cfg.head_dim) for z in (q, k, v))
        cache.k[layer, slots, :, pos] = k.to(cache.k.dtype)
        cache.v[layer, slots, :, pos] = v.to(cache.v.dtype)
        keys, values = cache.k[layer, slots], cache.v[layer, slots]  # [A, H, T, hd]
        scores = (keys @ q.unsqueeze(-1).to(keys.dtype)).squeeze(-1) / math.sqrt(cfg.head_dim)  # [A, H, T]
        future = torch.arange(cfg.context, device=x.device).view(1, 1, -1) > pos.view(-1, 1, 1)
        probs = scores.float().masked_fill(future, float("-inf")).softmax(dim=-1)
        att = (probs.unsqueeze(2).to(values.dtype) @ values).squeeze(2).reshape(a, d)  # [A, d]
        x = x + _linear(att.to(x.dtype), self.proj, row_invariant)
        h = F.gelu(_linear(self.ln2(x), self.fc1, row_invariant))
        return x + _linear(h, self.fc2, row_invariant)


class TinyLM(nn.Module):
    """Token + learned position embeddings, pre-LN blocks, a final LayerNorm and an untied head."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.context, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size)
        self.apply(self._init)

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, nn.Linear | nn.Embedding):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def new_cache(self, slots: int, device: torch.device | str, dtype: torch.dtype) -> KVCache:
        return KVCache(self.cfg, slots, device, dtype)

    def _embed(self, tokens: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        if int(pos.max()) >= self.cfg.context:
            raise ValueError(f"position {int(pos.max())} is beyond the model context {self.cfg.context}")
        return self.tok_emb(tokens) + self.pos_emb(pos)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits [B, T, V] of right-padded sequences tokens [B, T] (padding only affects its own positions)."""
        x, _ = self._forward_kv(tokens)
        return self.head(self.ln_f(x))

    def _forward_kv(self, tokens: torch.Tensor) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        pos = torch.arange(tokens.shape[1], device=tokens.device)
        x = self._embed(tokens, pos)
        kv = []
        for block in self.blocks:
            x, k, v = block(x)
            kv.append((k, v))
        return x, kv

    @torch.no_grad()
    def prefill(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One prompt tokens [T] -> (last-position logits [V], k [layers, H, T, hd], v [layers, H, T, hd])."""
        x, kv = self._forward_kv(tokens.unsqueeze(0))
        logits = self.head(self.ln_f(x[0, -1]))
        k = torch.stack([k[0] for k, _ in kv])
        v = torch.stack([v[0] for _, v in kv])
        return logits, k, v

    @torch.no_grad()
    def decode(
        self, tokens: torch.Tensor, pos: torch.Tensor, cache: KVCache, slots: torch.Tensor | None,
        row_invariant: bool = True,
    ) -> torch.Tensor:
        """Logits [A, V] for the next token of each active slot, given its newest token [A] at pos [A];
        `slots` None: the first A slots."""
        if slots is None:
            slots = torch.arange(tokens.shape[0], device=tokens.device)
        x = self._embed(tokens, pos)
        for layer, block in enumerate(self.blocks):
            x = block.decode(x, pos, cache, layer, slots, row_invariant)
        return _linear(self.ln_f(x), self.head, row_invariant)
