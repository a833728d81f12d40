"""The long-tail LLM GRPO workload (issue 45; the learner side of issue 46): the current-architecture
decoder, forced lognormal completion lengths, submit/collect generation in row groups, the learner's
importance ratio and staleness metrics, the memory estimate, and learning through rose."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from examples.llm.arithmetic import answer_prefix_credit, answer_then_stop
from examples.llm.decoder import Decoder, DecoderConfig
from examples.llm.generator import Generator
from examples.llm.learner import GRPOLearner
from examples.llm.policy import completion_logp, param_hash
from examples.llm.reference import ReferenceScorer
from examples.llm.sampling import forced_lengths, lognormal_params
from examples.llm.tasks import PromptSource

ROOT = Path(__file__).resolve().parents[2]
POLICY = {"arch": "decoder", "layers": 2, "d_model": 32, "heads": 4, "kv_heads": 2, "intermediate": 64,
          "context": 40, "warm_steps": 0}




def _gen(**kw) -> Generator:
    args = {"k": 4, "max_new_tokens": 24, "policy": POLICY, "length_mean": 6.0, "length_p99": 20.0, "max_batch": 16}
    return Generator(**{**args, **kw})


@pytest.fixture(scope="module")
def prompts() -> dict[str, torch.Tensor]:
    return PromptSource(batch=6, seed=2).next_batch(it=0)["prompts"]


def _sub(record: dict[str, torch.Tensor], lo: int, hi: int) -> dict[str, torch.Tensor]:
    return {k: v[lo:hi] for k, v in record.items()}


def _assert_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


# -- the decoder -------------------------------------------------------------------------------------
@pytest.mark.parametrize("tie", [True, False])
def test_decoder_decode_with_a_kv_cache_matches_the_full_forward(tie: bool) -> None:
    """RoPE, grouped-query attention (4 query heads over 2 KV heads), SwiGLU, RMSNorm: one prefill expanded
    to 3 slots, then decode steps, row-wise (CPU) and as the cache's prefix of slots (GPU path)."""
    torch.manual_seed(0)
    model = Decoder(DecoderConfig(context=16, d_model=32, heads=4, kv_heads=2, intermediate=48,
                                  tie_embeddings=tie)).eval()
    assert (model.head is None) == tie
    seq = torch.randint(3, 17, (3, 10))
    seq[1:, :4] = seq[0, :4]
    full = model(seq)
    for slots in (torch.arange(3), None):
        cache = model.new_cache(3, "cpu", torch.float32)
        logits, k, v = model.prefill(seq[0, :4])
        assert k.shape == (2, 2, 4, 8)  # [layers, kv_heads, T, head_dim]
        cache.load_prefix(torch.arange(3), k, v)
        torch.testing.assert_close(logits, full[0, 3], atol=1e-5, rtol=1e-5)
        for t in range(4, 10):
            step = model.decode(seq[:, t], torch.full((3,), t), cache, slots, slots is not None)
            torch.testing.assert_close(step, full[:, t], atol=1e-5, rtol=1e-5)
            if slots is None:  # the fixed span the CUDA graphs use: the whole context, masked per row
                again = model.decode(seq[:, t], torch.full((3,), t), cache, None, False, span=16)
                torch.testing.assert_close(again, step, atol=1e-5, rtol=1e-5)


def test_decode_graph_buckets_are_powers_of_two_within_their_limits() -> None:
    from examples.llm.decode_graphs import bucket

    assert [bucket(n, 8, 512) for n in (1, 8, 9, 300, 512)] == [8, 8, 16, 512, 512]
    assert [bucket(n, 128, 2064) for n in (1, 129, 2048, 2049, 2064)] == [128, 256, 2048, 2064, 2064]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU (run on the device: "
                    "benchmarks/llm_longtail_probe.py compares graph and eager logits at the workload's shape)")
def test_decode_graphs_replay_the_eager_step() -> None:
    from examples.llm.decode_graphs import DecodeGraphs

    torch.manual_seed(0)
    model = Decoder(DecoderConfig(context=300, d_model=64, heads=4, kv_heads=2, intermediate=96)).cuda().eval()
    cache = model.new_cache(24, "cuda", torch.float32)
    graphs = DecodeGraphs(model, cache)
    tok, pos = torch.randint(3, 17, (24,)), torch.zeros(24, dtype=torch.long)
    for t in range(0, 140):
        pos[:20] = t
        eager = model.decode(tok[:20].cuda(), pos[:20].cuda(), cache, None, False)
        torch.testing.assert_close(graphs.decode(tok, pos, 20), eager, atol=2e-2, rtol=2e-2)
    assert graphs.captured == 2  # spans 128 and 256, one slot bucket (32)


def test_decoder_rotary_positions_matter_and_config_is_checked() -> None:
    torch.manual_seed(1)
    model = Decoder(DecoderConfig(context=8, d_model=16, heads=2, kv_heads=1, intermediate=32)).eval()
    a = model(torch.tensor([[3, 4, 5, 6]]))[0, -1]
    b = model(torch.tensor([[4, 3, 5, 6]]))[0, -1]
    assert not torch.allclose(a, b)  # order is seen (RoPE), not a bag of tokens
    with pytest.raises(ValueError, match="multiple of kv_heads"):
        DecoderConfig(heads=4, kv_heads=3, d_model=32)
    with pytest.raises(ValueError, match="beyond the model context"):
        model(torch.zeros(1, 9, dtype=torch.long))


# -- forced long-tail lengths ------------------------------------------------------------------------
def test_lognormal_lengths_have_the_requested_mean_and_p99_and_are_keyed() -> None:
    mu, sigma = lognormal_params(256, 2048)
    assert math.isclose(math.exp(mu + sigma**2 / 2), 256) and math.isclose(math.exp(mu + 2.3263478740 * sigma), 2048)
    x = forced_lengths(0, 0, list(range(400)), 16, 256, 2048, 10**6).double()
    assert 0.85 * 256 < float(x.mean()) < 1.15 * 256
    assert 0.8 * 2048 < float(x.quantile(0.99)) < 1.25 * 2048
    assert int(forced_lengths(0, 0, list(range(400)), 16, 256, 2048, 2048).max()) == 2048  # capped
    # keyed by (seed, iteration, prompt id, sample): a prompt's lengths do not depend on its batch
    assert torch.equal(forced_lengths(0, 3, [5, 9], 4, 6, 20, 24)[1], forced_lengths(0, 3, [9], 4, 6, 20, 24)[0])
    assert not torch.equal(forced_lengths(0, 3, [9], 4, 6, 20, 24), forced_lengths(0, 4, [9], 4, 6, 20, 24))
    with pytest.raises(ValueError, match="p99 / mean"):
        lognormal_params(10, 1000)
    with pytest.raises(ValueError, match="both length_mean and length_p99"):
        _gen(length_p99=0.0)


def test_forced_lengths_end_completions_and_logp_is_of_the_same_distribution(prompts) -> None:
    gen = _gen()
    ro = gen.generate(prompts=prompts, it=1)["rollouts"]
    ids = prompts["index"].tolist()
    assert torch.equal(ro["lengths"], forced_lengths(0, 1, ids, 4, 6.0, 20.0, 24))
    assert ro["finished"].all() and ro["no_eos"].all()
    assert not (ro["tokens"][ro["mask"]] == gen.tokenizer.eos_id).any()  # EOS banned until the drawn length
    assert (ro["version"] == 0).all()
    # the learner and reference recompute the same masked, tempered distribution: ratio 1 up to rounding
    torch.testing.assert_close(completion_logp(gen.model, ro), ro["logp"], atol=2e-5, rtol=1e-5)
    ref = ReferenceScorer(policy=POLICY).score(rollouts=ro)["ref_logp"]
    torch.testing.assert_close(ref, ro["logp"], atol=2e-5, rtol=1e-5)


def test_generation_is_split_and_slot_invariant_with_forced_lengths(prompts) -> None:
    whole = _gen().generate(prompts=prompts, it=2)["rollouts"]
    few = _gen(max_batch=3).generate(prompts=prompts, it=2)["rollouts"]
    _assert_equal(whole, few)
    gen = _gen()
    parts = [gen.generate(prompts=_sub(prompts, lo, hi), it=2)["rollouts"] for lo, hi in ((0, 2), (2, 6))]
    _assert_equal(whole, {k: torch.cat([p[k] for p in parts]) for k in whole})


def test_submit_then_collect_in_groups_gives_generate_and_guards_the_sync(prompts) -> None:
    """`submit` queues every prompt; `collect` of one row group decodes all queued completions until that
    group's are finished and returns them; the other groups' completions stay in flight. Any order of
    groups gives the tokens of one `generate`; a weight sync while completions are in flight is refused."""
    whole = _gen().generate(prompts=prompts, it=3)["rollouts"]
    gen = _gen(max_batch=6)
    pending = gen.submit(prompts=prompts, it=3)["pending"]
    late = gen.collect(pending=_sub(pending, 4, 6), it=3)["rollouts"]
    assert gen._flight.rows_in_flight()
    with pytest.raises(RuntimeError, match="not collected yet"):
        gen.load_weights(w=gen.weights, hash=gen.weights_hash)
    early = gen.collect(pending=_sub(pending, 0, 4), it=3)["rollouts"]
    _assert_equal(whole, {k: torch.cat([early[k], late[k]]) for k in whole})
    assert not gen._flight.rows_in_flight()
    m = gen.pop_metrics()
    assert m["generated_tokens"] == float(whole["mask"].sum()) and m["mean_active_slots"] <= 6
    gen.load_weights(w=gen.weights, hash=gen.weights_hash)
    assert gen.version == 1


# -- the learner side (issue 46, item 3) --------------------------------------------------------------
def test_learner_reports_ratio_and_staleness_against_the_behaviour_logp(prompts) -> None:
    gen, learner = _gen(), GRPOLearner(lr=1e-3, minibatches=1, policy=POLICY, micro_tokens=24)
    ro = gen.generate(prompts=prompts, it=4)["rollouts"]
    ref = ReferenceScorer(policy=POLICY).score(rollouts=ro)["ref_logp"]
    reward = torch.tensor([[1.0, 0.0, 0.5, 0.0]] * 6)
    learner.update(rollouts=ro, ref_logp=ref, reward=reward, mb=0)
    m = learner.pop_metrics()
    assert m["staleness_hist_0"] == 24 and m["staleness_max"] == 0 and m["sample_version_min"] == 0
    assert abs(m["ratio_mean"] - 1) < 1e-4 and m["ratio_max"] - m["ratio_min"] < 1e-3  # synchronous: r ~ 1
    # two weight publications later, the same samples are 2 versions old: their ratio moves off 1
    learner.get_weights()
    learner.get_weights()
    learner.update(rollouts=ro, ref_logp=ref, reward=reward, mb=0)
    m = learner.pop_metrics()
    assert m["staleness_hist_2"] == 24 and m["staleness_mean"] == 2 and m["policy_version"] == 2
    assert m["ratio_std"] > 1e-4 and m["ratio_max"] > 1.0 > m["ratio_min"]


def test_micro_batches_give_the_gradient_of_one_pass(prompts) -> None:
    gen = _gen()
    ro = gen.generate(prompts=prompts, it=5)["rollouts"]
    ref = ReferenceScorer(policy=POLICY).score(rollouts=ro)["ref_logp"]
    reward = torch.tensor([[1.0, 0.0, 0.5, 0.0]] * 6)
    grads, losses = [], []
    for micro in (0, 16):
        learner = GRPOLearner(lr=1e-3, minibatches=1, policy=POLICY, micro_tokens=micro)
        learner.update(rollouts=ro, ref_logp=ref, reward=reward, mb=0)
        grads.append({n: p.grad.clone() for n, p in learner.model.named_parameters()})  # (kept until the next step)
        losses.append(learner.pop_metrics()["loss"])
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], atol=1e-7, rtol=1e-4)
    assert param_hash(learner.model.state_dict()) != param_hash(
        GRPOLearner(lr=1e-3, minibatches=1, policy=POLICY).model.state_dict())


def test_answer_prefix_credit() -> None:
    assert answer_prefix_credit("18", 81) == 1.0
    assert answer_prefix_credit("18=7+", 81) == 1.0  # a non-digit ends the answer
    assert answer_prefix_credit("187", 81) == pytest.approx(2 / 3)  # the answer runs on
    assert answer_prefix_credit("1", 81) == pytest.approx(1 / 3)
    assert answer_prefix_credit("71", 81) == 0.0
    assert answer_then_stop("18=", 81) == 1.0 and answer_then_stop("187", 81) == 0.0


# -- the GPU configuration's memory ---------------------------------------------------------------------
def test_memory_estimate_of_the_gpu_workflow() -> None:
    from benchmarks.llm_memory import estimate

    path = ROOT / "workflows" / "llm_grpo_longtail_gpu.yaml"
    base = estimate(path, {})
    assert 3.4e8 < base["params"] < 3.7e8  # the 0.5B open model's layer shapes with a 17-token vocabulary
    assert base["kv_cache_bytes"] == 24 * 512 * 2 * 2064 * 64 * 2 * 2
    assert base["total_gib"] < 78 * 0.85
    double = estimate(path, {"max_batch": 1024})
    assert double["processes_gib"]["generator"] > base["processes_gib"]["generator"] + 12


def test_the_gpu_code_paths_agree_with_the_cpu_ones(prompts) -> None:
    """What runs only on the device, run on the CPU: decode over the prefix of slots (views of the cache,
    attention up to the longest row), the reference's micro-batches by tokens cut to their longest row,
    and the learner's trimmed micro-batches: the same tokens and log-probs up to float rounding."""
    exact = _gen(max_batch=8).generate(prompts=prompts, it=6)["rollouts"]
    fast = _gen(max_batch=8)
    fast.row_invariant = False
    got = fast.generate(prompts=prompts, it=6)["rollouts"]
    assert torch.equal(got["tokens"], exact["tokens"]) and torch.equal(got["lengths"], exact["lengths"])
    torch.testing.assert_close(got["logp"], exact["logp"], atol=1e-4, rtol=1e-4)
    ref = ReferenceScorer(policy=POLICY, micro_tokens=40)
    torch.testing.assert_close(ref._score_by_tokens(exact), ref.score(rollouts=exact)["ref_logp"], atol=1e-5,
                               rtol=1e-5)
    trimmed = completion_logp(fast.model, exact, trim=True)
    torch.testing.assert_close(trimmed, exact["logp"], atol=2e-5, rtol=1e-5)


# -- learning through rose -------------------------------------------------------------------------------
@pytest.mark.timeout(300)
def test_longtail_workflow_learns_through_rose() -> None:
    """workflows/llm_grpo_longtail.yaml, seed 0, 30 iterations on the local backend: the reward of the
    last 8 iterations is well above the first 8's (deterministic on a CPU: the figures do not depend on
    the machine's speed), every sample trained at lag 0, the first minibatch on-policy."""
    from tests.examples.test_workflows_learn import _train

    metrics = _train(ROOT / "workflows" / "llm_grpo_longtail.yaml", 30, {"seed": 0})
    rewards = [m["reward/mean_reward"] for m in metrics]
    first, last = sum(rewards[:8]) / 8, sum(rewards[-8:]) / 8
    assert last >= 1.4 * first and last >= first + 0.02, (first, last, rewards)
    for m in metrics:
        assert m["learner/staleness_max"] == 0 and m["learner/staleness_hist_0"] == 16 * 8
        assert m["generator/eos_rate"] == 1.0  # every completion ended at its drawn length
    assert 0.9 < metrics[0]["learner/ratio_mean"] < 1.1
