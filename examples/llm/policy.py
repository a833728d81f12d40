"""The initial policy shared by generator, reference scorer and learner, and the helpers around it.

All three components must start from *identical* weights (the reference is the frozen initial policy;
the generator samples with the learner's weights). Each builds the policy from the same `PolicySpec`:
a seeded init followed by a short supervised warm start on the task, so that the initial policy has a
non-zero but imperfect reward. The warm start is cached on disk under a key derived from the spec and
guarded by a file lock: components constructed concurrently in separate processes train it once and all
load the same bytes (their weight hashes are then equal, which `weights_hash` exposes for checking).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from examples.llm.arithmetic import ArithmeticTask
from examples.llm.decoder import Decoder, DecoderConfig, rope_tables
from examples.llm.model import ModelConfig, TinyLM
from examples.llm.sampling import allowed_logits
from examples.llm.seeding import mix_seed
from examples.llm.tokenizer import CharTokenizer
from examples.llm.tools import CALL

Record = dict[str, torch.Tensor]
Policy = TinyLM | Decoder
ARCHS = ("tiny", "decoder")
_SFT_STREAM = 0x5F7  # the warm start draws its problems from a stream separate from the prompts'


@dataclass(frozen=True)
class PolicySpec:
    """Everything that determines the initial weights: model shape, task and warm-start recipe."""

    layers: int = 2
    d_model: int = 128
    heads: int = 4
    context: int = 32
    ffn_mult: int = 4
    digits: int = 2
    ops: str = "+"
    reverse: bool = True
    warm_steps: int = 3000  # upper bound; the warm start stops at `warm_target`
    warm_target: float = 0.75  # greedy accuracy at which the warm start stops
    warm_smoothing: float = 0.3  # label smoothing: sampled answers are right much less often than greedy
    warm_check_every: int = 5
    warm_batch: int = 64
    warm_lr: float = 1e-3
    # the current-architecture decoder (`decoder.py`); "tiny" is TinyLM. `warm_steps: 0` = random init
    arch: str = "tiny"
    kv_heads: int = 0  # decoder: key/value heads (0: as many as `heads`)
    intermediate: int = 0  # decoder: SwiGLU width (0: ffn_mult * d_model)
    tie_embeddings: bool = True  # decoder
    vocab: int = 0  # model vocabulary, >= the tokenizer's (0: the tokenizer's); padded ids are never sampled

    @classmethod
    def from_args(cls, policy: Mapping[str, Any] | None) -> PolicySpec:
        """Spec from a workflow `policy:` dict; unknown keys are an error naming the valid ones."""
        policy = dict(policy or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(policy) - known)
        if unknown:
            raise ValueError(f"unknown policy settings {unknown}; valid: {sorted(known)}")
        spec = cls(**policy)
        if spec.arch not in ARCHS:
            raise ValueError(f"policy arch must be one of {ARCHS}, got {spec.arch!r}")
        return spec

    def task(self) -> ArithmeticTask:
        return ArithmeticTask(digits=self.digits, ops=self.ops, reverse=self.reverse)

    def model_config(self, tokenizer: CharTokenizer) -> ModelConfig | DecoderConfig:
        if self.vocab and self.vocab < tokenizer.vocab_size:
            raise ValueError(f"policy vocab {self.vocab} is smaller than the tokenizer's {tokenizer.vocab_size}")
        vocab = max(self.vocab, tokenizer.vocab_size)
        if self.arch == "decoder":
            return DecoderConfig(
                vocab_size=vocab, context=self.context, layers=self.layers, d_model=self.d_model,
                heads=self.heads, kv_heads=self.kv_heads or self.heads,
                intermediate=self.intermediate or self.ffn_mult * self.d_model, tie_embeddings=self.tie_embeddings,
            )
        return ModelConfig(
            vocab_size=vocab, context=self.context, layers=self.layers,
            d_model=self.d_model, heads=self.heads, ffn_mult=self.ffn_mult,
        )

    def key(self, seed: int, tokenizer: CharTokenizer) -> str:
        """Cache key: sha256 of the spec, the seed, the tokenizer and the torch version. Settings at their
        defaults that came after the first cached specs are left out (the old caches stay valid)."""
        later = {"arch", "kv_heads", "intermediate", "tie_embeddings", "vocab"}
        spec = {k: v for k, v in asdict(self).items() if k not in later or v != getattr(PolicySpec, k)}
        blob = json.dumps(
            {"spec": spec, "seed": seed, "tok": tokenizer.hash(), "torch": torch.__version__},
            sort_keys=True,
        )
        return hashlib.sha256(blob.encode()).hexdigest()


def param_hash(weights: Mapping[str, torch.Tensor]) -> str:
    """sha256 over the names, dtypes, shapes and raw bytes of `weights` (any device and dtype)."""
    h = hashlib.sha256()
    for name in sorted(weights):
        t = weights[name].detach().to("cpu").contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def clone_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A detached CPU copy of the model's parameters (what crosses process boundaries on weight sync)."""
    return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}


def params_to(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """Cast the parameters only (bf16 inference on the GPU); buffers such as RoPE tables stay fp32."""
    for p in model.parameters():
        p.data = p.data.to(dtype)
    return model


def make_model(cfg: ModelConfig | DecoderConfig) -> Policy:
    return Decoder(cfg) if isinstance(cfg, DecoderConfig) else TinyLM(cfg)


def sequences(rollouts: Record, max_width: int, trim: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompt + completion token rows [P*K, W] (right-padded) and each row's prompt length [P*K].

    Each sequence starts at position 0 with its own prompt, so positions match what the generator saw.
    The width W = min(prompt width + L, max_width) depends on the record's layout only, never on its
    contents, so every prompt group is laid out (and computed) the same way whatever batch it is in.
    With `trim` (the GPU, where that guarantee is not made) W is the longest row's, so a batch of
    long-tail completions is not padded to the length limit.
    """
    prompt, plen, comp = rollouts["prompt"], rollouts["prompt_len"], rollouts["tokens"]
    p, k, length = comp.shape
    plen_rows = plen.repeat_interleave(k)
    width = prompt.shape[1] + length
    seq = torch.zeros(p * k, width, dtype=torch.long)
    seq[:, : prompt.shape[1]] = prompt.repeat_interleave(k, dim=0)
    cols = plen_rows.unsqueeze(1) + torch.arange(length).unsqueeze(0)
    seq.scatter_(1, cols, comp.reshape(p * k, length))
    if trim and p * k:
        width = int((plen_rows + rollouts["mask"].reshape(p * k, length).sum(-1)).max())
    return seq[:, : min(width, max_width)], plen_rows


def completion_logp(model: Policy, rollouts: Record, device: torch.device | str = "cpu",
                    trim: bool = False) -> torch.Tensor:
    """Per-token log-probs [P, K, L] of the completions under `model`, 0 outside the completion mask.

    Uses the sampling temperature carried in the rollouts, so that these log-probs are comparable to the
    generator's sampling log-probs (same distribution family: softmax(logits / T)), and the same
    `allowed_logits` mask (padded vocabulary; EOS banned in rows whose length was forced, `no_eos`, and the
    tool-call token in rows whose agent turns were, `no_call`).
    """
    p, k, length = rollouts["tokens"].shape
    if p * k == 0:
        return torch.zeros(p, k, length)
    seq, plen = sequences(rollouts, model.cfg.context, trim)
    seq, plen = seq.to(device), plen.to(device)
    width = seq.shape[1]
    logits = model(seq).float()  # [N, T, V]
    cols = plen.unsqueeze(1) - 1 + torch.arange(length, device=device).unsqueeze(0)  # predicting positions
    cols = cols.clamp(max=width - 1)
    picked = logits.gather(1, cols.unsqueeze(-1).expand(-1, -1, logits.shape[-1]))  # [N, L, V]
    picked = _allowed(picked, rollouts, k)
    temp = rollouts["temperature"].to(device).repeat_interleave(k).view(-1, 1, 1)
    logp = F.log_softmax(picked / temp, dim=-1)
    tok = rollouts["tokens"].to(device).reshape(p * k, length, 1)
    out = logp.gather(-1, tok).squeeze(-1).view(p, k, length)
    return out.masked_fill(~rollouts["mask"].to(device), 0.0)


def _allowed(picked: torch.Tensor, rollouts: Record, k: int) -> torch.Tensor:
    """`allowed_logits` row by row: EOS banned in the rows of prompts whose completion lengths were forced
    (`no_eos` [P]), the tool-call token in those whose agent turns were (`no_call` [P], `agent.py`)."""
    tok = CharTokenizer()
    out = allowed_logits(picked, tok.vocab_size)
    for name, ban in (("no_eos", tok.eos_id), ("no_call", tok.encode(CALL)[0])):
        flag = rollouts.get(name)
        if flag is not None and bool(flag.any()):
            banned = allowed_logits(out, tok.vocab_size, ban)
            rows = flag.to(picked.device).repeat_interleave(k).view(-1, 1, 1)
            out = torch.where(rows, banned, out)
    return out


def flat_samples(rollouts: Record, sel: tuple[torch.Tensor, torch.Tensor]) -> Record:
    """A one-sample-per-row rollout record ([N, 1, L]) of the selected (prompt, sample) pairs."""
    p_idx, k_idx = sel
    out = {name: rollouts[name][p_idx] for name in ("prompt", "prompt_len", "temperature") }
    out.update(tokens=rollouts["tokens"][p_idx, k_idx].unsqueeze(1), mask=rollouts["mask"][p_idx, k_idx].unsqueeze(1))
    for name in ("no_eos", "no_call"):
        if name in rollouts:
            out[name] = rollouts[name][p_idx]
    return out


def token_chunks(lengths: torch.Tensor, budget: int) -> list[torch.Tensor]:
    """Row indices grouped so that rows x longest row <= `budget` tokens per group (at least one row each),
    rows taken longest first: the micro-batches of the reference and the learner on the GPU, where a long
    tail padded into every batch would multiply the work."""
    order = torch.argsort(lengths, descending=True, stable=True).tolist()
    groups: list[list[int]] = []
    for i in order:
        if groups and (len(groups[-1]) + 1) * int(lengths[groups[-1][0]]) <= budget:
            groups[-1].append(i)
        else:
            groups.append([i])
    return [torch.tensor(g, dtype=torch.long) for g in groups]


def _sft_batch(tok: CharTokenizer, task: ArithmeticTask, stream: int, start: int, n: int) -> Record:
    """Teacher-forcing rows `BOS prompt answer EOS` and a mask selecting the answer+EOS targets."""
    rows, targets = [], []
    for i in range(start, start + n):
        text, answer = task.problem(stream, i)
        prompt = tok.encode(text, bos=True)
        rows.append(prompt + tok.encode(task.answer_text(answer), eos=True))
        targets.append(len(prompt))
    width = max(len(r) for r in rows)
    seq = torch.full((n, width), tok.pad_id, dtype=torch.long)
    mask = torch.zeros(n, width, dtype=torch.bool)
    for r, (ids, first) in enumerate(zip(rows, targets, strict=True)):
        seq[r, : len(ids)] = torch.tensor(ids)
        mask[r, first : len(ids)] = True
    return {"seq": seq, "mask": mask}


@torch.no_grad()
def answer_stats(model: Policy, batch: Record) -> dict[str, float]:
    """Teacher-forced competence on `batch`, without sampling noise.

    expected_reward: mean probability of sampling exactly the right answer+EOS at temperature 1.
    greedy_accuracy: fraction of problems on which greedy decoding is right (every argmax along the
    right answer is the right token, which is exactly when greedy decoding reproduces it).
    """
    logits = model(batch["seq"][:, :-1]).float()
    target, mask = batch["seq"][:, 1:], batch["mask"][:, 1:]
    logp = F.log_softmax(logits, dim=-1).gather(-1, target.unsqueeze(-1)).squeeze(-1)
    right = (logits.argmax(dim=-1) == target) | ~mask
    return {
        "expected_reward": float((logp * mask).sum(dim=1).exp().mean()),
        "greedy_accuracy": float(right.all(dim=1).float().mean()),
    }


def warm_start(model: Policy, tok: CharTokenizer, spec: PolicySpec, seed: int) -> dict[str, float]:
    """Supervised steps on the task (answer tokens only) until greedy accuracy reaches `warm_target`.

    The label smoothing leaves the policy knowing more than it samples: its greedy answers are mostly
    right, its temperature-1 samples much less often (the regime of an SFT model before RL, where pass@k
    is well above pass@1). GRPO then has signal in most groups and a direction to improve in.
    Stopping on a target rather than after a fixed step count lands every seed in the same regime
    (small transformers learn this task abruptly, after a plateau whose length depends on the seed).
    Deterministic for a given (spec, seed) on the CPU.
    """
    task = spec.task()
    opt = torch.optim.Adam(model.parameters(), lr=spec.warm_lr)
    stream = mix_seed(seed, _SFT_STREAM)
    val = _sft_batch(tok, task, mix_seed(seed, _SFT_STREAM + 1), 0, 256)
    loss, stats, step = float("nan"), answer_stats(model, val), 0
    while step < spec.warm_steps and stats["greedy_accuracy"] < spec.warm_target:
        batch = _sft_batch(tok, task, stream, step * spec.warm_batch, spec.warm_batch)
        logits = model(batch["seq"][:, :-1])
        target = batch["seq"][:, 1:].masked_fill(~batch["mask"][:, 1:], -100)
        out = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1), ignore_index=-100,
                              label_smoothing=spec.warm_smoothing)
        opt.zero_grad(set_to_none=True)
        out.backward()
        opt.step()
        step, loss = step + 1, float(out.detach())
        if step % spec.warm_check_every == 0:
            stats = answer_stats(model, val)
    return {"steps": float(step), "loss": loss, **stats}


_MEMO: dict[str, tuple[dict[str, torch.Tensor], dict[str, float]]] = {}


def default_cache_dir() -> Path:
    return Path(os.environ.get("ROSE_CACHE_DIR", Path.home() / ".cache" / "rose")) / "llm"


def warm_started(
    spec: PolicySpec, seed: int, cache_dir: str | os.PathLike[str] | None = None
) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """(initial weights, warm-start stats) for (spec, seed): trained once, then cached in memory and on disk."""
    tok = CharTokenizer()
    if spec.warm_steps == 0:  # a seeded random init: every process makes the same bytes, nothing to cache
        blob = train_initial(spec, seed, tok)
        return blob["weights"], blob["warm_start"]
    key = spec.key(seed, tok)
    if key not in _MEMO:
        root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        root.mkdir(parents=True, exist_ok=True)
        path = root / f"warmstart-{key[:20]}.pt"
        with open(root / f"warmstart-{key[:20]}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one process trains, the others wait and load its bytes
            if not path.exists():
                tmp = path.with_suffix(f".tmp{os.getpid()}")
                torch.save(train_initial(spec, seed, tok), tmp)
                os.replace(tmp, path)
            blob = torch.load(path, weights_only=True)
        _MEMO[key] = (blob["weights"], blob["warm_start"])
    weights, stats = _MEMO[key]
    return {k: v.clone() for k, v in weights.items()}, dict(stats)


def train_initial(spec: PolicySpec, seed: int, tok: CharTokenizer) -> dict[str, Any]:
    """Seeded init + warm start, uncached; returns the blob that `warm_started` stores.

    Runs on one thread, so that the bytes do not depend on the process's thread setting (and a model
    this small trains fastest that way); `fork_rng` leaves the process's global RNG untouched.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(mix_seed(seed, 1))
            model = make_model(spec.model_config(tok))
            stats = warm_start(model, tok, spec, seed) if spec.warm_steps else {"steps": 0.0}
    finally:
        torch.set_num_threads(threads)
    return {"weights": clone_weights(model), "spec": asdict(spec), "seed": seed, "warm_start": stats}


def build_policy(
    spec: PolicySpec, seed: int, device: torch.device | str = "cpu",
    cache_dir: str | os.PathLike[str] | None = None,
) -> Policy:
    """The policy on `device` holding the warm-started (or, with `warm_steps: 0`, seeded random) weights."""
    with torch.random.fork_rng(devices=[]), torch.device("meta"):
        model = make_model(spec.model_config(CharTokenizer()))
    model = model.to_empty(device="cpu")
    if isinstance(model, Decoder):  # non-persistent buffers are not in the weights: rebuild them
        model.rope_cos, model.rope_sin = rope_tables(model.cfg)
    model.load_state_dict(warm_started(spec, seed, cache_dir)[0])
    return model.to(device)
