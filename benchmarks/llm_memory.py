"""GPU memory of an LLM GRPO workflow, estimated on the CPU before a device call (issue 45): does the
long-tail workload fit one GPU with its generator, reference and learner processes side by side?

    python3 benchmarks/llm_memory.py [workflows/llm_grpo_longtail_gpu.yaml] [--set k=v ...] [--gib 78]

Per process (the three GPU components run in their own processes on the one GPU):
- generator: bf16 weights + the KV cache, preallocated for `max_batch` slots at the full context
  (layers x slots x kv_heads x context x head_dim x 2 (k, v) x 2 bytes);
- reference: bf16 weights + one layer's transient activations of a `micro_tokens` pass (no grad);
- learner: fp32 weights, gradients and Adam's two moments (16 bytes a parameter) + the activations a
  backward keeps for `micro_tokens` tokens over every layer (bf16 autocast; the per-token count below);
- each: a CUDA context (`CONTEXT_GIB`).
An estimate, not a measurement: the allocator's fragmentation and cuBLAS workspaces come on top, so the
verdict asks for `HEADROOM` of the card free.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

GIB = 1024**3
CONTEXT_GIB = 0.6  # a CUDA context with torch's kernels loaded, per process
HEADROOM = 0.15  # fraction of the card the estimate leaves for fragmentation and workspaces


def _component_args(wf: Any, name: str) -> dict[str, Any]:
    return dict(wf.components[name].args)


def saved_bytes_per_token_layer(d: int, qkv: int, inter: int) -> int:
    """Bytes one token keeps for the backward in one decoder layer under bf16 autocast: fp32 norm inputs
    and residuals (4 d each, four of them), bf16 matmul inputs and outputs (2 bytes each): qkv and its
    RoPE'd copy, attention output, o_proj input, gate_up output, silu and product, down input."""
    return 16 * d + 2 * d * 2 + 2 * qkv * 2 + 2 * (2 * inter) + 2 * inter * 3


def estimate(path: Path, sets: dict[str, str]) -> dict[str, Any]:
    """Bytes per process and in all for the workflow at `path` with `sets` applied."""
    import torch

    from examples.llm.policy import PolicySpec, make_model
    from examples.llm.tokenizer import CharTokenizer
    from rose_dsl import load_workflow

    wf = load_workflow(path, sets)
    policy = "generator" if "generator" in wf.components else "agent"  # (the agent workload's generator)
    gen, ref, learn = (_component_args(wf, n) for n in (policy, "reference", "learner"))
    spec = PolicySpec.from_args(gen.get("policy"))
    cfg = spec.model_config(CharTokenizer())
    with torch.device("meta"):
        n_params = make_model(cfg).num_params()
    hd = cfg.d_model // cfg.heads
    kv_heads = getattr(cfg, "kv_heads", cfg.heads)
    inter = getattr(cfg, "intermediate", cfg.d_model * getattr(cfg, "ffn_mult", 4))
    slots = int(gen.get("max_batch", 64))
    kv = cfg.layers * slots * kv_heads * cfg.context * hd * 2 * 2
    ref_tokens = int(ref.get("micro_tokens", 0)) or cfg.context * int(ref.get("max_rows", 1024))
    learn_tokens = int(learn.get("micro_tokens", 0)) or cfg.context * slots
    qkv = (cfg.heads + 2 * kv_heads) * hd
    per_token = saved_bytes_per_token_layer(cfg.d_model, qkv, inter) * cfg.layers
    logits = lambda tokens: tokens * cfg.vocab_size * 4 * 3  # noqa: E731 - fp32 logits, log-softmax, grad
    procs = {
        "generator": 2 * n_params + kv + CONTEXT_GIB * GIB,
        "reference": 2 * n_params + ref_tokens * (2 * inter * 3 + 4 * cfg.d_model * 4) + logits(ref_tokens)
        + CONTEXT_GIB * GIB,
        "learner": 16 * n_params + learn_tokens * per_token + logits(learn_tokens) + CONTEXT_GIB * GIB,
    }
    total = sum(procs.values())
    return {
        "workflow": str(path), "params": n_params, "kv_cache_bytes": kv, "slots": slots, "context": cfg.context,
        "learner_micro_tokens": learn_tokens, "saved_bytes_per_token": per_token,
        "processes_gib": {k: v / GIB for k, v in procs.items()}, "total_gib": total / GIB,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("workflow", nargs="?", default=str(ROOT / "workflows" / "llm_grpo_longtail_gpu.yaml"))
    ap.add_argument("--set", action="append", default=[], metavar="K=V")
    ap.add_argument("--gib", type=float, default=78.0, help="the card's memory (H100: ~78 GiB usable)")
    args = ap.parse_args(argv)
    sets = {k: yaml.safe_load(v) for k, v in (s.split("=", 1) for s in args.set)}
    out = estimate(Path(args.workflow), sets)
    out["fits"] = out["total_gib"] <= args.gib * (1 - HEADROOM)
    print(json.dumps(out, indent=1))
    return 0 if out["fits"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
