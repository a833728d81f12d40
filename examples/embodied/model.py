"""A VLA-shaped network: vision encoder + transformer backbone + flow-matching action expert.

The same `FlowNet` is built by the rollout policy (`policy.FlowPolicy`) and by the trainers
(`ppo.PPOTrainer`, `grpo.GRPOTrainer`) from one `FlowNetConfig` and seed, so both start from
bit-identical weights and the trainer can recompute exactly what the policy computed.

Shape of the computation (pi0-like, scaled down by default):

* **backbone** -- observation tokens: an optional learned instruction token, optional image patch
  tokens from a small conv encoder, and `obs_tokens` tokens projected from the proprioceptive state;
  a stack of pre-LN self-attention blocks turns them into the *prefix* `[n, L, d]`.
* **action expert** -- one Euler step of the flow from noise to an action chunk `[n, chunk, act_dim]`:
  the chunk's tokens attend to the prefix and to themselves, and predict the clean chunk `x1_hat`.
  The velocity is `(x1_hat - x) / (1 - tau)` (the rectified-flow velocity implied by an
  x1-prediction), so the last Euler step lands exactly on `x1_hat`. With the output layer
  zero-initialised the initial policy mean is 0 -- a calm start that RL fine-tuning needs.
* **value head** -- an MLP on the mean-pooled prefix.
* **observation normalization** -- the proprioceptive state is standardized with running statistics
  kept as buffers (part of the weights, so the rollout policy gets them with every weight sync; the
  trainer updates them, see `ppo.PPOTrainer`). Reacher's target offsets are ~50x smaller than its
  joint velocities; without this the backbone barely sees them.
* **exploration** -- a learned, state-independent log-std per action dimension; the final action is
  `mean + std * eps`, so its log-probability given the flow output is an exact Gaussian.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

Obs = torch.Tensor | dict[str, torch.Tensor]


@dataclass(frozen=True)
class FlowNetConfig:
    """Sizes of a `FlowNet`. The defaults (~140k parameters) train on two CPU cores; widen `hidden`,
    `layers`, `heads` and `expert_layers` to reach hundreds of millions of parameters on a GPU
    (e.g. hidden=1024, layers=16, heads=16, expert_layers=8 is ~330M)."""

    obs_dim: int
    act_dim: int
    chunk: int
    hidden: int = 64
    denoise_steps: int = 4
    layers: int = 2
    heads: int = 4
    expert_layers: int = 1
    mlp_ratio: int = 4
    obs_tokens: int = 4
    image: bool = False
    image_size: int = 64
    image_channels: int = 3
    patch: int = 8
    num_instructions: int = 0
    init_log_std: float = -0.5
    noise_std: float = 1.0
    obs_norm: bool = True

    def __post_init__(self) -> None:
        if self.hidden % self.heads:
            raise ValueError(f"hidden={self.hidden} must be divisible by heads={self.heads}")
        if self.denoise_steps < 1:
            raise ValueError("denoise_steps must be >= 1")
        if self.image and self.image_size % self.patch:
            raise ValueError(f"image_size={self.image_size} must be divisible by patch={self.patch}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Attention(nn.Module):
    """Multi-head attention of `x`'s tokens over `context` (self-attention when context is x)."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, 2 * dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        n, lq, d = x.shape
        lk, h = context.shape[1], self.heads
        q = self.q(x).view(n, lq, h, d // h).transpose(1, 2)
        k, v = self.kv(context).view(n, lk, 2, h, d // h).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v)
        return self.out(y.transpose(1, 2).reshape(n, lq, d))


class Block(nn.Module):
    """Pre-LN transformer block. With a `prefix`, queries attend to [prefix; own tokens] (the
    action expert's attention pattern in pi0); without, it is plain self-attention."""

    def __init__(self, dim: int, heads: int, mlp_ratio: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp_ratio * dim), nn.GELU(), nn.Linear(mlp_ratio * dim, dim))

    def forward(self, x: torch.Tensor, prefix: torch.Tensor | None = None) -> torch.Tensor:
        h = self.norm1(x)
        context = h if prefix is None else torch.cat([prefix.to(h.dtype), h], dim=1)
        x = x + self.attn(h, context)
        return x + self.mlp(self.norm2(x))


class VisionEncoder(nn.Module):
    """A small conv patch encoder: `[n, C, H, W]` (uint8 or float in [0, 1]) -> `[n, P, d]` tokens."""

    def __init__(self, cfg: FlowNetConfig) -> None:
        super().__init__()
        d = cfg.hidden
        self.stem = nn.Sequential(
            nn.Conv2d(cfg.image_channels, d // 2, kernel_size=3, padding=1),
            nn.GELU(),
            nn.Conv2d(d // 2, d, kernel_size=cfg.patch, stride=cfg.patch),
        )
        self.num_tokens = (cfg.image_size // cfg.patch) ** 2

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        if image.dtype == torch.uint8:
            image = image.float() / 255.0
        feats = self.stem(image.float() * 2.0 - 1.0)
        return feats.flatten(2).transpose(1, 2)


def _time_features(tau: float, dim: int, device: torch.device) -> torch.Tensor:
    """Sinusoidal features of the flow time tau in [0, 1) -> `[dim]`."""
    half = dim // 2
    freqs = torch.exp(torch.arange(half, device=device, dtype=torch.float32) * (-math.log(1000.0) / half))
    angles = tau * 1000.0 * freqs
    return torch.cat([torch.sin(angles), torch.cos(angles)])


class FlowNet(nn.Module):
    """Backbone, action expert, value head and exploration log-std (see the module docstring)."""

    def __init__(self, cfg: FlowNetConfig) -> None:
        super().__init__()
        self.cfg = cfg
        d = cfg.hidden
        self.register_buffer("obs_mean", torch.zeros(cfg.obs_dim))
        self.register_buffer("obs_var", torch.ones(cfg.obs_dim))
        self.proprio = nn.Linear(cfg.obs_dim, cfg.obs_tokens * d)
        self.vision = VisionEncoder(cfg) if cfg.image else None
        self.instruction = nn.Embedding(cfg.num_instructions, d) if cfg.num_instructions else None
        num_tokens = cfg.obs_tokens + (self.vision.num_tokens if self.vision else 0) + (1 if cfg.num_instructions else 0)
        self.pos = nn.Parameter(torch.randn(num_tokens, d) * 0.02)
        self.blocks = nn.ModuleList(Block(d, cfg.heads, cfg.mlp_ratio) for _ in range(cfg.layers))
        self.norm = nn.LayerNorm(d)

        self.act_in = nn.Linear(cfg.act_dim, d)
        self.chunk_pos = nn.Parameter(torch.randn(cfg.chunk, d) * 0.02)
        self.time_mlp = nn.Sequential(nn.Linear(d, d), nn.GELU(), nn.Linear(d, d))
        self.expert = nn.ModuleList(Block(d, cfg.heads, cfg.mlp_ratio) for _ in range(cfg.expert_layers))
        self.expert_norm = nn.LayerNorm(d)
        self.act_out = nn.Linear(d, cfg.act_dim)
        nn.init.zeros_(self.act_out.weight)
        nn.init.zeros_(self.act_out.bias)

        self.value_head = nn.Sequential(nn.Linear(d, d), nn.Tanh(), nn.Linear(d, 1))
        nn.init.orthogonal_(self.value_head[2].weight, gain=0.1)
        nn.init.zeros_(self.value_head[2].bias)
        self.log_std = nn.Parameter(torch.full((cfg.act_dim,), float(cfg.init_log_std)))
        self.frozen_blocks = 0  # see freeze_backbone

    def freeze_backbone(self, trainable_blocks: int | None) -> None:
        """Train only the top `trainable_blocks` backbone blocks (with the action expert, value head and
        log-std); None (or a negative count) trains everything.

        Why: RL fine-tuning of a large pretrained VLA commonly leaves the bottom of the backbone (and the
        encoders) fixed. The trainer then runs the frozen part without autograd -- no activations kept,
        no backward through it, no optimizer state for it -- which is what makes a >300M-parameter
        policy's update affordable next to its rollout. The frozen part computes exactly what the
        rollout policy computes (same weights, same code)."""
        layers = len(self.blocks)
        keep = layers if trainable_blocks is None or int(trainable_blocks) < 0 else min(int(trainable_blocks), layers)
        frozen = layers - keep
        self.frozen_blocks = frozen
        stem = [m for m in (self.proprio, self.vision, self.instruction) if m is not None]
        for module in stem + list(self.blocks[:frozen]):
            module.requires_grad_(frozen == 0)
        self.pos.requires_grad_(frozen == 0)
        for block in self.blocks[frozen:]:
            block.requires_grad_(True)

    # -- backbone -----------------------------------------------------------------------------
    def backbone(self, obs: Obs, stem: torch.Tensor | None = None) -> torch.Tensor:
        """Observation (a state tensor, or a record with "state" and optional "image" /
        "instruction") -> prefix tokens `[n, L, d]`. `stem`: `self.stem(obs)` computed before (a
        trainer reuses the frozen part's output over its PPO epochs: same weights, same rows)."""
        x = self.stem(obs) if stem is None else stem
        for block in self.blocks[self.frozen_blocks:]:
            x = block(x)
        return self.norm(x)

    def stem(self, obs: Obs) -> torch.Tensor:
        """The tokens after the input embeddings and the frozen blocks (all of the backbone's input
        side when nothing is frozen), without autograd when the stem is frozen."""
        if isinstance(obs, dict):
            state = obs["state"]
            image, instruction = obs.get("image"), obs.get("instruction")
        else:
            state, image, instruction = obs, None, None
        n = state.shape[0]
        state = state.float()
        if self.cfg.obs_norm:
            state = ((state - self.obs_mean) * torch.rsqrt(self.obs_var + 1e-8)).clamp(-10.0, 10.0)
        frozen = self.frozen_blocks
        with torch.no_grad() if frozen else contextlib.nullcontext():  # a frozen stem keeps no activations
            tokens = []
            if self.instruction is not None:
                ids = instruction.long() if instruction is not None else torch.zeros(n, dtype=torch.long, device=state.device)
                tokens.append(self.instruction(ids)[:, None, :])
            if self.vision is not None:
                if image is None:
                    raise ValueError("this FlowNet has image=True: obs must be a record with an 'image' tensor")
                tokens.append(self.vision(image))
            tokens.append(self.proprio(state).view(n, self.cfg.obs_tokens, self.cfg.hidden))
            x = torch.cat(tokens, dim=1) + self.pos
            for block in self.blocks[:frozen]:
                x = block(x)
        return x

    def value(self, prefix: torch.Tensor) -> torch.Tensor:
        """State value `[n]` (float32) from the prefix."""
        return self.value_head(prefix.mean(dim=1)).squeeze(-1).float()

    # -- flow -----------------------------------------------------------------------------------
    def flow_step(self, x: torch.Tensor, prefix: torch.Tensor, k: int) -> torch.Tensor:
        """Euler step `k` of `denoise_steps`: x at tau=k/K -> x at tau=(k+1)/K (float32)."""
        steps = self.cfg.denoise_steps
        if not 0 <= k < steps:
            raise ValueError(f"flow step k={k} out of range 0..{steps - 1}")
        tau = k / steps
        h = self.act_in(x) + self.chunk_pos + self.time_mlp(_time_features(tau, self.cfg.hidden, x.device))
        for block in self.expert:
            h = block(h, prefix)
        x1_hat = self.act_out(self.expert_norm(h)).float()
        velocity = (x1_hat - x) / (1.0 - tau)
        return x + velocity / steps

    def mean_action(self, x0: torch.Tensor, prefix: torch.Tensor) -> torch.Tensor:
        """Integrate the whole flow from the initial noise x0 -> the action-chunk mean."""
        x = x0
        for k in range(self.cfg.denoise_steps):
            x = self.flow_step(x, prefix, k)
        return x

    # -- exploration distribution -----------------------------------------------------------
    def log_prob(self, action: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
        """log N(action; mean, exp(log_std)^2), summed over chunk and action dims -> `[n]`."""
        log_std = self.log_std.float()
        z = (action.float() - mean.float()) * torch.exp(-log_std)
        per_dim = -0.5 * z.square() - log_std - 0.5 * math.log(2.0 * math.pi)
        return per_dim.flatten(1).sum(dim=1)

    def entropy(self) -> torch.Tensor:
        """Entropy of the exploration Gaussian of one action chunk (a scalar)."""
        per_dim = self.log_std.float() + 0.5 * math.log(2.0 * math.pi * math.e)
        return per_dim.sum() * self.cfg.chunk

    def evaluate(self, obs: Obs, x0: torch.Tensor, action: torch.Tensor,
                 stem: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Trainer path: (log-prob of the stored `action`, value) under the current weights, with
        the flow started from the same x0 the rollout used -- so the PPO ratio is exact."""
        prefix = self.backbone(obs, stem)
        mean = self.mean_action(x0.float(), prefix)
        return self.log_prob(action, mean), self.value(prefix)


def build_model(cfg: FlowNetConfig, seed: int, device: str | torch.device = "cpu") -> FlowNet:
    """Build a `FlowNet` on `device` whose initial weights depend only on (cfg, seed, device type),
    leaving the global RNG untouched -- the policy and the trainer call this independently and get
    identical weights.

    On CUDA the weights are drawn on the GPU itself (CUDA's RNG, seeded the same way): initialising a
    1B-parameter model on the CPU first takes seconds per process, and every `rose execute` run builds
    it twice (policy and trainer). The weights then differ from a CPU build of the same seed, which is
    fine: the policy and the trainer of one workflow run on the same kind of device.
    """
    device = torch.device(device)
    if device.type != "cuda":
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return FlowNet(cfg).to(device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    with torch.random.fork_rng(devices=[index]), torch.device(torch.device("cuda", index)):
        torch.manual_seed(seed)
        return FlowNet(cfg)


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
