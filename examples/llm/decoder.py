"""A decoder of a current open-model architecture, at any size: RoPE, grouped-query attention, SwiGLU,
RMSNorm, optionally tied embeddings (the layout of Qwen2/Llama-style models).

Why a second model next to `TinyLM`: the long-tail workload (issue 45) must give the GPU the work of a
real sub-billion model -- the shape of a 0.5B open model is hidden 896, 24 layers, 14 query heads over 2
key/value heads, SwiGLU intermediate 4864 -- while `TinyLM` keeps the small CPU workflows as they were.
Both expose the same entry points, so the generator, reference scorer and learner take either:
- `forward(tokens)`: full causal pass over right-padded sequences (learner, reference, warm start);
- `prefill(tokens)`: one prompt, its last-position logits and its KV (shared by the prompt's K samples);
- `decode(tokens, pos, cache, slots)`: one new token per decode slot against a preallocated cache.

Weights are random (seeded) or warm-started on the toy task (`policy.py`): no pretrained weights can be
downloaded here. The vocabulary is the toy tokenizer's unless `vocab` pads it (padded ids are never
sampled: `policy.allowed_logits`).

Decode on the GPU (`slots=None`): the rows are the cache's first A slots (a view, no gather: the generator
hands out the lowest free slot first and decodes the prefix of slots up to the highest one in use), and
attention reads positions up to the longest active row only, through SDPA with grouped-query heads.
On the CPU (`slots` given, `row_invariant=True`) every matmul is a batch of 1-row products and attention
spans the whole context, so a row's result does not depend on the other rows (split invariance, as in
`model.py`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from examples.llm.model import _linear


@dataclass(frozen=True)
class DecoderConfig:
    """Model shape; `kv_heads` divides `heads` (grouped-query attention, `kv_heads == heads` is MHA)."""

    vocab_size: int = 17
    context: int = 64
    layers: int = 2
    d_model: int = 64
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 176
    tie_embeddings: bool = True
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6

    def __post_init__(self) -> None:
        if min(self.vocab_size, self.context, self.layers, self.d_model, self.heads, self.kv_heads,
               self.intermediate) < 1:
            raise ValueError(f"decoder config has a non-positive size: {self}")
        if self.d_model % self.heads or (self.d_model // self.heads) % 2:
            raise ValueError(f"d_model {self.d_model} must split into {self.heads} heads of an even size (RoPE)")
        if self.heads % self.kv_heads:
            raise ValueError(f"heads {self.heads} is not a multiple of kv_heads {self.kv_heads}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads

    def to_dict(self) -> dict[str, int | float | bool]:
        return asdict(self)


class GQACache:
    """Keys (after RoPE) and values of `slots` sequences: k, v [layers, slots, kv_heads, context, hd],
    allocated once at the generator's slot count (continuous batching reuses a slot, never reallocates)."""

    def __init__(self, cfg: DecoderConfig, slots: int, device: torch.device | str, dtype: torch.dtype) -> None:
        shape = (cfg.layers, slots, cfg.kv_heads, cfg.context, cfg.head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)

    @property
    def slots(self) -> int:
        return self.k.shape[1]

    def load_prefix(self, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Copy one prompt's prefill KV ([layers, kv_heads, T, hd]) into each slot of `slots`."""
        t = k.shape[2]
        self.k[:, slots, :, :t] = k.unsqueeze(1).to(self.k.dtype)
        self.v[:, slots, :, :t] = v.unsqueeze(1).to(self.v.dtype)


def rope_tables(cfg: DecoderConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [context, hd/2] of the rotary embedding (fp32)."""
    half = cfg.head_dim // 2
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(half, dtype=torch.float64) / half))
    angles = torch.arange(cfg.context, dtype=torch.float64).unsqueeze(1) * inv.unsqueeze(0)
    return angles.cos().float(), angles.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the two halves of x [..., hd] by angles cos/sin broadcast to [..., hd/2] (rotate-half form)."""
    a, b = x.float().chunk(2, dim=-1)
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1).to(x.dtype)


class _Step(NamedTuple):
    """One decode step's per-row inputs shared by every layer (see `Decoder.decode`)."""

    pos: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor
    slots: torch.Tensor | None
    rows: torch.Tensor
    seen: torch.Tensor | None
    t: int
    row_invariant: bool


class DecoderBlock(nn.Module):
    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        hd = cfg.head_dim
        self.attn_norm = nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.qkv = nn.Linear(cfg.d_model, (cfg.heads + 2 * cfg.kv_heads) * hd, bias=True)  # Qwen2: qkv bias
        self.o_proj = nn.Linear(cfg.heads * hd, cfg.d_model, bias=False)
        self.mlp_norm = nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.gate_up = nn.Linear(cfg.d_model, 2 * cfg.intermediate, bias=False)
        self.down = nn.Linear(cfg.intermediate, cfg.d_model, bias=False)

    def _qkv(self, x: torch.Tensor, row_invariant: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        cfg, hd = self.cfg, self.cfg.head_dim
        y = _linear(x, self.qkv, row_invariant) if x.dim() == 2 else self.qkv(x)
        return y.split([cfg.heads * hd, cfg.kv_heads * hd, cfg.kv_heads * hd], dim=-1)

    def _mlp(self, x: torch.Tensor, row_invariant: bool) -> torch.Tensor:
        lin = (lambda z, m: _linear(z, m, row_invariant)) if x.dim() == 2 else (lambda z, m: m(z))
        gate, up = lin(self.mlp_norm(x), self.gate_up).chunk(2, dim=-1)
        return lin(F.silu(gate) * up, self.down)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Causal pass over x [B, T, d]; returns (x, k, v), k/v [B, kv_heads, T, hd] (k after RoPE)."""
        b, t, _ = x.shape
        cfg, hd = self.cfg, self.cfg.head_dim
        q, k, v = self._qkv(self.attn_norm(x), False)
        q = apply_rope(q.view(b, t, cfg.heads, hd).transpose(1, 2), cos, sin)
        k = apply_rope(k.view(b, t, cfg.kv_heads, hd).transpose(1, 2), cos, sin)
        v = v.view(b, t, cfg.kv_heads, hd).transpose(1, 2)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=cfg.kv_heads != cfg.heads)
        x = x + self.o_proj(att.transpose(1, 2).reshape(b, t, cfg.heads * hd))
        return x + self._mlp(x, False), k, v

    def decode(self, x: torch.Tensor, step: _Step, cache: GQACache, layer: int) -> torch.Tensor:
        """One token per row: x [A, d] at positions step.pos [A]; appends its k/v to the rows' cache slots."""
        a = x.shape[0]
        cfg, hd = self.cfg, self.cfg.head_dim
        pos, slots, row_invariant = step.pos, step.slots, step.row_invariant
        y = _linear(self.attn_norm(x), self.qkv, row_invariant).view(a, cfg.heads + 2 * cfg.kv_heads, hd)
        qk = apply_rope(y[:, : cfg.heads + cfg.kv_heads], step.cos, step.sin)  # q and k rotated in one pass
        q, k, v = qk[:, : cfg.heads], qk[:, cfg.heads :], y[:, cfg.heads + cfg.kv_heads :]
        cache.k[layer, step.rows, :, pos] = k.to(cache.k.dtype)
        cache.v[layer, step.rows, :, pos] = v.to(cache.v.dtype)
        if slots is None:  # the first A slots, positions up to the longest row: views, one SDPA call
            keys, values = cache.k[layer, :a, :, : step.t], cache.v[layer, :a, :, : step.t]
            att = F.scaled_dot_product_attention(q.unsqueeze(2).to(keys.dtype), keys, values, attn_mask=step.seen,
                                                 enable_gqa=cfg.kv_heads != cfg.heads).reshape(a, cfg.d_model)
        else:  # row-wise over the whole context (split invariance on the CPU)
            keys, values = cache.k[layer, slots], cache.v[layer, slots]  # [A, kvh, T, hd]
            g = cfg.heads // cfg.kv_heads
            qg = q.view(a, cfg.kv_heads, g, hd).to(keys.dtype)
            scores = (qg @ keys.transpose(-1, -2)) / math.sqrt(hd)  # [A, kvh, g, T]
            future = torch.arange(cfg.context, device=x.device).view(1, 1, 1, -1) > pos.view(-1, 1, 1, 1)
            probs = scores.float().masked_fill(future, float("-inf")).softmax(dim=-1)
            att = (probs.to(values.dtype) @ values).reshape(a, cfg.d_model)
        x = x + _linear(att.to(x.dtype), self.o_proj, row_invariant)
        return x + self._mlp(x, row_invariant)


class Decoder(nn.Module):
    """Token embeddings, RMSNorm pre-norm blocks with RoPE/GQA attention and SwiGLU, a final RMSNorm, and
    a head tied to the embeddings (or not)."""

    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(DecoderBlock(cfg) for _ in range(cfg.layers))
        self.norm = nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.head = None if cfg.tie_embeddings else nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        cos, sin = rope_tables(cfg)
        self.register_buffer("rope_cos", cos, persistent=False)  # derived from the config: not weights
        self.register_buffer("rope_sin", sin, persistent=False)
        self.apply(self._init)

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, nn.Linear | nn.Embedding):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def new_cache(self, slots: int, device: torch.device | str, dtype: torch.dtype) -> GQACache:
        return GQACache(self.cfg, slots, device, dtype)

    def _logits(self, x: torch.Tensor, row_invariant: bool = False) -> torch.Tensor:
        x = self.norm(x)
        if self.head is not None:
            return _linear(x, self.head, row_invariant) if row_invariant else self.head(x)
        w = self.tok_emb.weight
        if row_invariant:
            return torch.bmm(x.unsqueeze(1), w.t().expand(x.shape[0], *w.t().shape)).squeeze(1)
        return x @ w.t()

    def _check_pos(self, top: int) -> None:
        if top >= self.cfg.context:
            raise ValueError(f"position {top} is beyond the model context {self.cfg.context}")

    def _forward_kv(self, tokens: torch.Tensor) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        t = tokens.shape[1]
        self._check_pos(t - 1)
        x = self.tok_emb(tokens)
        cos, sin = self.rope_cos[:t], self.rope_sin[:t]
        kv = []
        for block in self.blocks:
            x, k, v = block(x, cos, sin)
            kv.append((k, v))
        return x, kv

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits [B, T, V] of right-padded sequences tokens [B, T]."""
        return self._logits(self._forward_kv(tokens)[0])

    @torch.no_grad()
    def prefill(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One prompt tokens [T] -> (last-position logits [V], k, v [layers, kv_heads, T, hd])."""
        x, kv = self._forward_kv(tokens.unsqueeze(0))
        return (self._logits(x[0, -1:])[0], torch.stack([k[0] for k, _ in kv]),
                torch.stack([v[0] for _, v in kv]))

    @torch.no_grad()
    def decode(self, tokens: torch.Tensor, pos: torch.Tensor, cache: GQACache, slots: torch.Tensor | None,
               row_invariant: bool = True, span: int | None = None) -> torch.Tensor:
        """Logits [A, V] for the next token of each row, given its newest token [A] at pos [A]; `slots`
        names each row's cache slot, or None for the first A slots (see the module docstring). `span`
        (first-A-slots path only): attend over positions [0, span) instead of up to the longest row, the
        caller having checked every pos < span -- no host sync, a fixed shape (`decode_graphs.py`)."""
        if span is None:
            top = int(pos.max())  # one host sync per step (the generator reads the sampled tokens anyway)
            self._check_pos(top)
            span = top + 1
        x = self.tok_emb(tokens)
        a, t = tokens.shape[0], span
        rows = torch.arange(a, device=tokens.device) if slots is None else slots
        seen = None if slots is not None else \
            (torch.arange(t, device=tokens.device).view(1, -1) <= pos.view(-1, 1)).view(a, 1, 1, t)
        # what every layer shares, computed once per step: RoPE angles (broadcast over heads), rows, mask
        step = _Step(pos, self.rope_cos[pos].unsqueeze(1), self.rope_sin[pos].unsqueeze(1), slots, rows, seen, t,
                     row_invariant)
        for layer, block in enumerate(self.blocks):
            x = block.decode(x, step, cache, layer)
        return self._logits(x, row_invariant)
