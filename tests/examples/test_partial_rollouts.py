"""Partial rollouts (issue 46, item 5): a weight sync while completions are in flight, which then continue
under the new weights with each token's sampling version recorded, within the generator's bound on the
oldest token's lag (a group that would exceed it restarts from its prompt); the GRPO learner takes a
sample's lag from its oldest token. Without a sync in flight, the option changes nothing but the shape of
`version`; off (the default), a sync in flight is refused as before (test_llm_longtail.py)."""

from __future__ import annotations

import pytest
import torch

from examples.llm.generator import Generator
from examples.llm.learner import GRPOLearner
from examples.llm.policy import param_hash
from examples.llm.reference import ReferenceScorer
from examples.llm.tasks import PromptSource

POLICY = {"arch": "decoder", "layers": 2, "d_model": 32, "heads": 4, "kv_heads": 2, "intermediate": 64,
          "context": 40, "warm_steps": 0}




def _gen(**kw) -> Generator:
    args = {"k": 4, "max_new_tokens": 24, "policy": POLICY, "length_mean": 6.0, "length_p99": 20.0, "max_batch": 6}
    return Generator(**{**args, **kw})


@pytest.fixture(scope="module")
def prompts() -> dict[str, torch.Tensor]:
    return PromptSource(batch=6, seed=2).next_batch(it=0)["prompts"]


def _sub(record: dict[str, torch.Tensor], lo: int, hi: int) -> dict[str, torch.Tensor]:
    return {k: v[lo:hi] for k, v in record.items()}


def _new_weights(gen: Generator) -> dict[str, torch.Tensor]:
    w = {k: v.clone() for k, v in gen.weights.items()}
    for v in w.values():
        if v.is_floating_point():
            v.add_(0.05 * torch.randn(v.shape, generator=torch.Generator().manual_seed(v.numel())))
    return w


def _first_group_then_sync(gen: Generator, prompts: dict[str, torch.Tensor], syncs: int):
    """Submit every prompt, collect the first two (the others decode beside them), sync `syncs` times while
    the rest are in flight, collect the rest."""
    pending = gen.submit(prompts=prompts, it=0)["pending"]
    first = gen.collect(pending=_sub(pending, 0, 2), it=0)["rollouts"]
    fl = gen._flight
    assert bool(((fl.lengths > 0) & ~fl.done).any()), "no completion was unfinished at the sync"
    for _ in range(syncs):
        w = _new_weights(gen)
        gen.load_weights(w=w, hash=param_hash(w))
    return first, gen.collect(pending=_sub(pending, 2, 6), it=0)["rollouts"]


def test_without_a_sync_in_flight_partial_rollouts_change_only_the_version_shape(prompts) -> None:
    off = _gen().generate(prompts=prompts, it=3)["rollouts"]
    on = _gen(partial_rollouts=1).generate(prompts=prompts, it=3)["rollouts"]
    assert off.keys() == on.keys() and off["version"].shape == (6, 4)
    for key in off:
        if key != "version":
            assert torch.equal(off[key], on[key]), key
    assert on["version"].shape == (6, 4, 24) and torch.equal(on["version"], off["version"].unsqueeze(-1).expand(6, 4, 24))


def test_completions_unfinished_at_a_sync_continue_under_the_new_weights(prompts) -> None:
    gen = _gen(partial_rollouts=1)
    first, rest = _first_group_then_sync(gen, prompts, syncs=1)
    assert int(first["version"].max()) == 0 and gen.version == 1
    v, mask = rest["version"], rest["mask"]
    oldest, newest = v.min(-1).values, v.max(-1).values
    assert bool((oldest < newest).any()), "no completion holds tokens of both versions"
    assert bool((gen.version - oldest <= 1).all())
    # versions never decrease along a completion
    assert bool(((v[..., 1:] >= v[..., :-1]) | ~mask[..., 1:]).all())
    # the same prompts, no sync in flight: the tokens sampled before the sync are the same, after it not all
    plain = _gen().generate(prompts=prompts, it=0)["rollouts"]
    before = (v == 0) & mask
    assert torch.equal(rest["tokens"][before], plain["tokens"][2:][before])
    assert not torch.equal(rest["tokens"], plain["tokens"][2:])


def test_a_group_whose_oldest_token_would_exceed_the_bound_restarts_from_its_prompt(prompts) -> None:
    gen = _gen(partial_rollouts=1)
    _, rest = _first_group_then_sync(gen, prompts, syncs=2)
    assert gen.version == 2
    assert bool((gen.version - rest["version"].min(-1).values <= 1).all())  # nothing of version 0 survived
    assert int(rest["version"].min()) >= 1
    assert gen.pop_metrics()["partial_restarts"] > 0


def test_the_learner_takes_a_samples_lag_from_its_oldest_token(prompts) -> None:
    gen = _gen(partial_rollouts=1)
    _, rest = _first_group_then_sync(gen, prompts, syncs=1)
    ref = ReferenceScorer(policy=POLICY).score(rollouts=rest)["ref_logp"]
    reward = torch.tensor([[1.0, 0.0, 0.5, 0.0]] * 4)
    learner = GRPOLearner(lr=1e-3, minibatches=1, policy=POLICY, max_staleness=1)
    learner.get_weights()  # the version the generator was synced to
    learner.update(rollouts=rest, ref_logp=ref, reward=reward, mb=0)
    m = learner.pop_metrics()
    oldest = rest["version"].min(-1).values
    assert m["staleness_hist_1"] == float((oldest == 0).sum()) > 0 and m["staleness_max"] == 1
    assert m["mixed_version_samples"] == float((rest["version"].max(-1).values != oldest).sum()) > 0
    strict = GRPOLearner(lr=1e-3, minibatches=1, policy=POLICY, max_staleness=0)
    strict.get_weights()
    with pytest.raises(ValueError, match="above max_staleness 0"):
        strict.update(rollouts=rest, ref_logp=ref, reward=reward, mb=0)


def _partial_workflow(iterations: int):
    """workflows/llm_grpo.yaml with partial rollouts: each iteration queues its prompts (`submit`), then the
    next iteration's (`prompts.peek`, `submit_ahead`), before its `generate` (the generator's `collect`),
    so that the next iteration's completions decode beside this one's and are unfinished at its weight
    sync; the generator bounds their oldest token's lag by 1, the learner checks max_staleness 1."""
    from pathlib import Path

    import yaml

    from rose_dsl import load_workflow_text

    doc = yaml.safe_load((Path(__file__).resolve().parents[2] / "workflows" / "llm_grpo.yaml").read_text())
    doc["params"].update(iterations=iterations, seed=0)
    doc["components"]["generator"]["args"]["partial_rollouts"] = 1
    doc["components"]["learner"]["args"]["max_staleness"] = 1
    body = doc["iteration"]["body"]
    at = next(i for i, item in enumerate(body) if item.get("node") == "generate")
    rows = {"dim": 0, "size": "${prompts}", "separable": False}
    submit = {"call": "generator.submit", "state": {"weights": "read"}, "out": ["pending"], "batch": rows}
    body[at:at] = [
        {"node": "submit", "in": {"prompts": "sample.prompts", "it": "iteration.i"}, **submit},
        {"node": "ahead", "call": "prompts.peek", "in": {"it": "iteration.i"}, "state": {"cursor": "read"},
         "out": ["prompts"], "batch": rows},
        {"node": "submit_ahead", "in": {"prompts": "ahead.prompts", "it": "iteration.i + 1"}, **submit},
    ]
    return load_workflow_text(yaml.safe_dump(doc, sort_keys=False), "llm_grpo_partial.yaml")


def test_the_grpo_workflow_with_partial_rollouts_learns_within_the_bound() -> None:
    """Through rose (local backend), seed 0, 30 iterations: the reward rises as the budget-1 test of the
    asynchronous plan asks (tests/examples/test_async_learns.py); completions cross a weight sync (tokens of
    two versions) and none is more than 1 version old at the learner (which would raise: max_staleness 1).
    Deterministic on a CPU: the figures do not depend on the machine's speed."""
    from tests.examples.test_async_learns import _train

    metrics = _train(_partial_workflow(30), 30)
    rewards = [m["reward/mean_reward"] for m in metrics]
    first, last = sum(rewards[:8]) / 8, sum(rewards[-8:]) / 8
    assert last > first + 0.05, (first, last, rewards)
    assert all(m["learner/staleness_max"] <= 1 for m in metrics)
    assert sum(m.get("learner/mixed_version_samples", 0.0) for m in metrics) > 0  # completions crossed a sync
    assert sum(m.get("learner/staleness_hist_1", 0.0) for m in metrics) > 0


def test_partial_rollouts_under_a_deferred_sync_stay_within_the_bound_plus_the_deferral() -> None:
    """With the sync also deferred by one RL iteration (`defer sync 1`, `max_staleness: 2` on the generator's
    weights: the generator's bound 1 + the plan's 1), a sample is at most 2 versions old at the learner
    (`max_staleness: 2`, which raises beyond), and some are."""
    from dataclasses import replace

    from interpreter.schedule import Schedule
    from rose_dsl.transforms import Refused, apply
    from tests.examples.test_async_learns import _train, with_budget

    wf = _partial_workflow(8)
    learner = wf.components["learner"]
    wf = replace(wf, components={**wf.components, "learner": replace(learner, args={**learner.args, "max_staleness": 2})})
    plan = apply(with_budget(wf, "generator", "weights", 2), "defer sync 1")
    assert not isinstance(plan, Refused), plan
    assert Schedule(plan.workflow).depth == 2
    metrics = _train(plan.workflow, 8)
    assert max(m["learner/staleness_max"] for m in metrics) == 2
    assert sum(m.get("learner/mixed_version_samples", 0.0) for m in metrics) > 0


def _ahead_iterations(gen: Generator, source: PromptSource, iterations: int) -> list[dict[str, torch.Tensor]]:
    """The partial-rollout pattern at the generator: iteration i collects its prompts with iteration i+1's
    queued behind them, then syncs (new weights) while those decode; the largest number of rows held."""
    batches = [source.next_batch(it=i)["prompts"] for i in range(iterations + 1)]
    gen.submit(prompts=batches[0], it=0)
    out, held = [], 0
    for i in range(iterations):
        gen.submit(prompts=batches[i + 1], it=i + 1)
        out.append(gen.collect(pending=batches[i], it=i)["rollouts"])
        held = max(held, len(gen._flight.prompt_of))
        w = _new_weights(gen)
        gen.load_weights(w=w, hash=param_hash(w))
    out.append({"held": torch.tensor(held)})
    return out


def test_a_flight_never_empty_drops_the_rows_it_returned_and_computes_the_same(monkeypatch) -> None:
    """With the next iteration's prompts always queued, the flight is never empty between calls; it still
    keeps only the rows in flight (compaction), and renumbering them changes no token, log-prob or version."""
    compacted = _ahead_iterations(_gen(partial_rollouts=1), PromptSource(batch=6, seed=2), 6)
    monkeypatch.setattr("examples.llm.generator._Flight._compact", lambda self: None)
    kept = _ahead_iterations(_gen(partial_rollouts=1), PromptSource(batch=6, seed=2), 6)
    rows_per_iteration = 6 * 4
    assert int(compacted[-1]["held"]) <= 3 * rows_per_iteration < int(kept[-1]["held"])
    for a, b in zip(compacted[:-1], kept[:-1], strict=True):
        assert a.keys() == b.keys()
        for key in a:
            assert torch.equal(a[key], b[key]), key
    assert any(bool((r["version"].max(-1).values > r["version"].min(-1).values).any()) for r in compacted[:-1])


def test_a_restore_drops_the_completions_in_flight_and_brings_back_their_version(prompts) -> None:
    """set_state is a restore, not a sync: the version saved with the weights comes back, and completions
    in flight (queued in a timeline a recovery abandoned, some of their tokens sampled by newer weights) are
    dropped; collecting the same prompts then gives what a fresh generator with that state gives."""
    gen = _gen(partial_rollouts=1)
    saved = gen.get_state("weights")
    assert saved["version"] == 0
    pending = gen.submit(prompts=prompts, it=1)["pending"]
    gen.collect(pending=_sub(pending, 0, 2), it=1)
    assert bool(((gen._flight.lengths > 0) & ~gen._flight.done).any()), "no completion was unfinished at the sync"
    w = _new_weights(gen)
    gen.load_weights(w=w, hash=param_hash(w))
    assert gen.version == 1 and gen._flight.rows_in_flight()
    gen.set_state("weights", saved)
    assert gen.version == 0 and not gen._flight.rows_in_flight()
    again = gen.collect(pending=prompts, it=1)["rollouts"]
    fresh = _gen(partial_rollouts=1).collect(pending=prompts, it=1)["rollouts"]
    assert again.keys() == fresh.keys()
    for key in again:
        assert torch.equal(again[key], fresh[key]), key
    gen.set_state("weights", gen.weights)  # a plain parameter dict (an older checkpoint): version 0
    assert gen.version == 0
