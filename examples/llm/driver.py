"""A plain-Python driver with the structure of workflows/llm_grpo.yaml (no rose involved).

    next_batch -> generate -> reference score -> reward -> `minibatches` learner updates
               -> get_weights -> load_weights (hash-checked)

It is the reference the rose execution of that workflow can be compared against, and the loop that the
tests use to check that GRPO improves the warm-started policy. Run it with

    python -m examples.llm.driver --iterations 40
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from examples.llm.arithmetic import check_answer
from examples.llm.generator import Generator
from examples.llm.learner import GRPOLearner
from examples.llm.reference import ReferenceScorer
from examples.llm.reward import RewardPool
from examples.llm.tasks import PromptSource

EVAL_SEED_OFFSET = 10_007  # held-out prompt stream for evaluation
EVAL_IT = -1  # iteration index reserved for evaluation sampling streams


@dataclass
class DriverConfig:
    """The workflow's params plus the component settings it leaves at their defaults."""

    seed: int = 0
    prompts: int = 16
    k: int = 8
    max_new_tokens: int = 8
    temperature: float = 1.0
    top_p: float = 1.0
    iterations: int = 40
    minibatches: int = 2
    lr: float = 3e-4
    kl_coef: float = 0.02
    reward_workers: int = 2
    reward_timeout_s: float = 2.0
    max_batch: int = 64
    eval_prompts: int = 64
    policy: dict[str, Any] = field(default_factory=dict)
    cache_dir: str | None = None
    device: str = "cpu"  # generator, reference and learner (the workflow places each on its own)


def evaluate(gen: Generator, prompts: dict[str, torch.Tensor], reverse: bool = True) -> float:
    """Mean exact-answer reward of the generator's samples on a fixed prompt set (no learning, no pool)."""
    ro = gen.generate(prompts=prompts, it=EVAL_IT)["rollouts"]
    gen.pop_metrics()  # evaluation traffic is not training traffic
    p_count, k, _ = ro["tokens"].shape
    hits = [
        check_answer(gen.tokenizer.decode(ro["tokens"][p, j].tolist()), int(ro["answer"][p]), reverse)
        for p in range(p_count)
        for j in range(k)
    ]
    return sum(hits) / max(len(hits), 1)


def run(cfg: DriverConfig, log: Callable[[str], None] | None = print) -> dict[str, Any]:
    """Train for `cfg.iterations`; returns the per-iteration history and held-out eval before/after."""
    t_start = time.perf_counter()
    common = {"seed": cfg.seed, "policy": cfg.policy, "cache_dir": cfg.cache_dir, "device": cfg.device}
    src = PromptSource(batch=cfg.prompts, seed=cfg.seed, digits=cfg.policy.get("digits", 2),
                       ops=cfg.policy.get("ops", "+"))
    gen = Generator(k=cfg.k, max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, top_p=cfg.top_p,
                    max_batch=cfg.max_batch, **common)
    ref = ReferenceScorer(**common)
    learner = GRPOLearner(lr=cfg.lr, minibatches=cfg.minibatches, kl_coef=cfg.kl_coef, **common)
    if not gen.weights_hash == ref.weights_hash == learner.initial_hash:
        raise RuntimeError("generator, reference and learner did not start from the same weights")
    if len({gen.tokenizer_hash, ref.tokenizer_hash, learner.tokenizer_hash, src.tokenizer_hash}) != 1:
        raise RuntimeError("components disagree on the tokenizer")
    reverse = gen.spec.reverse
    eval_src = PromptSource(batch=cfg.eval_prompts, seed=cfg.seed + EVAL_SEED_OFFSET,
                            digits=gen.spec.digits, ops=gen.spec.ops)
    eval_prompts = eval_src.next_batch()["prompts"]
    history: list[dict[str, float]] = []
    with RewardPool(workers=cfg.reward_workers, timeout_s=cfg.reward_timeout_s, policy=cfg.policy) as pool:
        eval_before = evaluate(gen, eval_prompts, reverse)
        setup_s = time.perf_counter() - t_start
        for it in range(cfg.iterations):
            t0 = time.perf_counter()
            prompts = src.next_batch(it=it)["prompts"]
            rollouts = gen.generate(prompts=prompts, it=it)["rollouts"]
            ref_logp = ref.score(rollouts=rollouts)["ref_logp"]
            reward = pool.score(rollouts=rollouts)["reward"]
            for mb in range(cfg.minibatches):
                learner.update(rollouts=rollouts, ref_logp=ref_logp, reward=reward, mb=mb)
            published = learner.get_weights()
            gen.load_weights(w=published["w"], hash=published["hash"])
            row = {"it": float(it), "reward": float(reward.mean()), "seconds": time.perf_counter() - t0}
            for name, comp in (("generator", gen), ("reward", pool), ("learner", learner)):
                row.update({f"{name}/{k}": v for k, v in comp.pop_metrics().items()})
            history.append(row)
            if log:
                log(f"it {it:3d}  reward {row['reward']:.3f}  kl {row.get('learner/kl', 0):.4f}  "
                    f"tok/s {row.get('generator/tokens_per_s', 0):7.0f}  {row['seconds']:.2f}s")
        eval_after = evaluate(gen, eval_prompts, reverse)
    result = {
        "config": asdict(cfg), "history": history, "eval_before": eval_before, "eval_after": eval_after,
        "setup_s": setup_s, "train_s": time.perf_counter() - t_start - setup_s,
    }
    if log:
        log(f"held-out reward {eval_before:.3f} -> {eval_after:.3f} "
            f"({result['train_s']:.1f}s training, {setup_s:.1f}s setup)")
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    defaults = DriverConfig()
    for name in ("seed", "prompts", "k", "max_new_tokens", "iterations", "minibatches", "max_batch",
                 "reward_workers", "eval_prompts"):
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=getattr(defaults, name))
    for name in ("temperature", "top_p", "lr", "kl_coef", "reward_timeout_s"):
        parser.add_argument(f"--{name.replace('_', '-')}", type=float, default=getattr(defaults, name))
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--policy", type=json.loads, default={}, help='JSON overrides, e.g. \'{"warm_steps": 400}\'')
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    parser.add_argument("--json", default=None, help="write the result (history included) to this file")
    args = vars(parser.parse_args(argv))
    threads, out = args.pop("threads"), args.pop("json")
    if threads:
        torch.set_num_threads(threads)
    result = run(DriverConfig(**args))
    if out:
        with open(out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
