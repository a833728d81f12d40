"""The multi-turn, tool-using agent workload (issue 62): the calculator's grammar and limits, the KV cache
extended by tool output (never recomputed) with the behaviour log-probs the learner recomputes, the
declared workflow learning through rose, and rose's row-group plans of it -- one group's tool calls while
another decodes, the groups' turns interleaved -- computing the declared values bit for bit (local and Ray)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from examples.llm.tools import CallError, calculate, final_answer, latency_ms
from interpreter.local_backend import LocalBackend
from interpreter.runner import RunConfig, Runner
from interpreter.schedule import Schedule
from rose_dsl import load_workflow
from rose_dsl.ir import Workflow
from rose_dsl.transforms import apply_request

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / "workflows" / "llm_agent_tools.yaml"
SMALL = {"prompts": 4, "k": 4, "tool_ms_mean": 1, "tool_ms_p99": 8, "tool_timeout_ms": 6}




def test_the_calculator_parses_its_grammar_and_refuses_the_rest() -> None:
    assert calculate("12+3*4") == 24 and calculate("5-9") == -4 and calculate("7") == 7
    for text, why in [("", "0 characters"), ("1+", "does not parse"), ("+1", "does not parse"),
                      ("__import__('os')", "does not parse"), ("a", "does not parse"), ("99999", "more than 4 digits"),
                      ("9999*9999", "beyond 4 digits"), ("1" * 17, "17 characters")]:
        with pytest.raises(CallError, match=why):
            calculate(text)
    assert final_answer("3+4=81", 18) == 1.0 and final_answer("81", 18) == 1.0 and final_answer("81=7", 18) == 0.0


def test_tool_latencies_are_long_tailed_and_keyed_by_the_call() -> None:
    draws = [latency_ms(0, 0, p, j, 0, 2.0, 20.0) for p in range(40) for j in range(10)]
    assert latency_ms(0, 0, 3, 1, 0, 2.0, 20.0) == latency_ms(0, 0, 3, 1, 0, 2.0, 20.0)
    mean = sum(draws) / len(draws)
    assert 1.0 < mean < 4.0 and max(draws) > 5 * mean  # a long tail


def _rollouts(groups: list[tuple[int, int]], row_invariant: bool = True,
              forced: bool = False) -> tuple[dict[str, torch.Tensor], object]:
    """One iteration's rollouts, computed by the components directly, the prompt rows cut into `groups`
    whose turns alternate (each group's turn, then its tool call, then the next group's); `row_invariant`
    False: the GPU's decode path (the slots' rows batched), run on the CPU; `forced`: forced turns (with
    the context their budgets and tool outputs need)."""
    from examples.llm.agent import Agent
    from examples.llm.tasks import PromptSource
    from examples.llm.tools import ToolPool

    policy = {"arch": "decoder", "layers": 2, "d_model": 64, "heads": 4, "kv_heads": 2, "intermediate": 176,
              "context": 64 if forced else 40}
    agent = Agent(k=4, max_turns=3, turn_tokens=6, turn_len_mean=3, turn_len_p99=6, forced_turns=forced, policy=policy)
    agent.row_invariant = row_invariant
    tools = ToolPool(workers=2, latency_mean_ms=1, latency_p99_ms=8, timeout_ms=6)
    prompts = PromptSource(batch=6).next_batch(0)["prompts"]
    first = agent.start(prompts, 0)
    carry = {g: {n: first[n][lo:hi] for n in first} for g, (lo, hi) in enumerate(groups)}
    for t in range(3):
        for g, (lo, hi) in enumerate(groups):
            c = carry[g]
            call = agent.turn(c["obs"], c["obs_len"], c["sdone"], t, 0, rows=slice(lo, hi))["call"]
            out = tools.run(call, c["sdone"], t, 0, rows=slice(lo, hi))
            carry[g] = {n: out[n] for n in ("obs", "obs_len", "sdone")}
    parts = [agent.finish(carry[g]["sdone"], {n: v[lo:hi] for n, v in prompts.items()}, 0, rows=slice(lo, hi))
             ["rollouts"] for g, (lo, hi) in enumerate(groups)]
    tools.close()
    return {n: torch.cat([p[n] for p in parts]) for n in parts[0]}, agent


def test_tool_output_extends_the_context_and_is_masked_out_of_the_loss() -> None:
    from examples.llm.policy import completion_logp

    whole, agent = _rollouts([(0, 6)])
    tool_tokens = (~whole["mask"]) & (torch.arange(whole["tokens"].shape[-1]) < whole["lengths"].unsqueeze(-1))
    assert bool(tool_tokens.any()), "some sample called its tool"
    assert bool((whole["logp"][tool_tokens] == 0).all())
    # the behaviour log-probs are the learner's teacher-forced ones: decoding through the extended cache
    # computed what a full forward over prompt + policy tokens + tool tokens computes
    recomputed = completion_logp(agent.model, whole).detach()
    assert torch.allclose(recomputed, whole["logp"], atol=1e-4)
    split, _ = _rollouts([(0, 2), (2, 5), (5, 6)])
    for name in whole:
        assert torch.equal(whole[name], split[name]), name  # row groups taking turns: the same samples
    batched, agent = _rollouts([(0, 6)], row_invariant=False)  # the GPU's path: its own log-probs agree too
    assert torch.allclose(completion_logp(agent.model, batched).detach(), batched["logp"], atol=1e-4)


def test_forced_turns_run_to_their_budgets_under_bans_the_learner_recomputes() -> None:
    """Forced turns: EOS and `=` never sampled, each sample's policy tokens are its drawn turns' budgets
    (the last one ending it as finished, unless its tool timed out), prompt rows end at different trips,
    row groups give the same samples, and the learner's log-probs -- under the same bans, carried as
    `no_eos`/`no_call` -- are the behaviour ones (and are not without the call ban)."""
    from examples.llm.agent import forced_turns
    from examples.llm.policy import completion_logp
    from examples.llm.sampling import forced_lengths

    whole, agent = _rollouts([(0, 6)], forced=True)
    assert bool(whole["no_eos"].all()) and bool(whole["no_call"].all())
    policy_tokens = whole["tokens"][whole["mask"]]
    assert not bool(((policy_tokens == agent.tokenizer.eos_id) | (policy_tokens == agent.call_id)).any())
    ids = whole["index"].tolist()
    turns = forced_turns(0, 0, ids, 4, 3)
    assert len(set(turns.max(dim=1).values.tolist())) > 1, "prompt rows end their turn loops at different trips"
    budgets = torch.stack([forced_lengths(t + 1, 0, ids, 4, 3, 6, 6) for t in range(3)], dim=-1)
    want = torch.stack([budgets[r, j, : int(turns[r, j])].sum() for r in range(6) for j in range(4)]).view(6, 4)
    fin = whole["finished"]
    assert int(fin.sum()) >= 12 and bool((whole["mask"].sum(-1)[fin] == want[fin]).all())
    assert bool((whole["mask"].sum(-1)[~fin] <= want[~fin]).all())  # a timed-out call ended it early
    recomputed = completion_logp(agent.model, whole).detach()
    assert torch.allclose(recomputed, whole["logp"], atol=1e-4)
    unbanned = completion_logp(agent.model, {**whole, "no_call": torch.zeros(6, dtype=torch.bool)}).detach()
    assert not torch.allclose(unbanned, whole["logp"], atol=1e-3)
    split, _ = _rollouts([(0, 2), (2, 5), (5, 6)], forced=True)
    for name in whole:
        assert torch.equal(whole[name], split[name]), name


def _metrics(wf: Workflow, iterations: int, backend: str = "local") -> list[dict[str, float]]:
    sch = Schedule(wf)
    if backend == "local":
        be = LocalBackend(wf, ("examples.",), sch.program.loops_of)
    else:
        from interpreter.backends import make_backend

        be = make_backend("ray", wf, sch, allowed=("examples.",), log=lambda _: None)
    try:
        results = Runner(wf, be, RunConfig(iterations=iterations, tensorboard=False), sch).run()
    finally:
        be.shutdown()
    # times, and how calls were batched (row groups decode in more, smaller steps): not values
    timed = ("time/", "iteration_s", "_per_s", "seconds", "wait_s", "queue_high_water", "decode_steps")
    return [{k: v for k, v in r.metrics.items() if not any(t in k for t in timed)} for r in results]


PLANS = {
    "chain": ("split-chain turn finish ref score 2",),
    # one group's tool calls while the other decodes: the groups' turns take turns
    "interleaved": ("split-chain turn finish ref score 2", "rewire score@0 after turn@1", "rewire ref@0 after turn@1",
                    "rewire finish@0 after turn@1", "interleave turn@0 turn@1"),
}


def _plan(name: str, sets: dict[str, object] = SMALL) -> Workflow:
    wf = load_workflow(WORKFLOW, sets)
    for request in PLANS[name]:
        wf = apply_request(wf, request).workflow
    return wf


def _values(metrics: list[dict[str, float]]) -> list[dict[str, float]]:
    return [{k: v for k, v in m.items() if not k.startswith("trips/")} for m in metrics]


@pytest.mark.e2e
@pytest.mark.slow
def test_rose_plans_of_the_agent_compute_the_declared_values_on_local_and_ray(ray_session) -> None:
    """Row groups of the turn loop with their consumers, and those groups' turns interleaved: the declared
    workflow's values bit for bit (every learner and component metric but times and batching counts), on
    the local backend and, for the interleaved plan, on Ray."""
    want = _metrics(load_workflow(WORKFLOW, SMALL), 2)
    assert want[0]["agent/calls"] > 0 and want[0]["trips/turn"] >= 2 and want[0]["agent/tool_tokens"] > 0
    for name in PLANS:
        assert _values(_metrics(_plan(name), 2)) == _values(want), name
    assert _values(_metrics(_plan("interleaved"), 2, "ray")) == _values(want)


def test_rose_plans_of_the_forced_agent_compute_the_declared_values_locally() -> None:
    """Forced turns (every turn to its budget, drawn turn counts): the row-group plans still compute the
    declared values bit for bit on the local backend (the interleaved plan: its row groups and their
    turns taking turns), with the partial-credit reward so that the learner has signal and trains."""
    sets = {**SMALL, "forced_turns": True, "verifier": "examples.llm.tools:final_prefix_credit"}
    want = _metrics(load_workflow(WORKFLOW, sets), 2)
    assert want[0]["agent/calls"] > 0 and want[0]["agent/eos_rate"] > 0.5 and want[0]["trips/turn"] >= 2
    assert want[1]["learner/grad_norm"] > 0
    assert _values(_metrics(_plan("interleaved", sets), 2)) == _values(want)


@pytest.mark.slow
def test_the_agent_workflow_learns_through_rose() -> None:
    """20 iterations of the CPU variant (16 prompts x 8 samples, up to 3 turns): the reward of iterations
    10-19 beats that of iterations 0-4 (seed 0: 0.091 -> 0.154 on the 2-core machine)."""
    rewards = [m["reward/mean_reward"] for m in _metrics(load_workflow(WORKFLOW, {"seed": 0}), 20)]
    first, later = sum(rewards[:5]) / 5, sum(rewards[10:20]) / 10
    assert later > first + 0.03, (first, later, rewards)


def test_the_gpu_variant_fits_one_card() -> None:
    """The memory estimate of llm_agent_tools_gpu.yaml (benchmarks/llm_memory.py): one KV slot per sample at
    the full context, within an H100's 78 GiB with the estimate's headroom."""
    from benchmarks.llm_memory import estimate

    got = estimate(ROOT / "workflows" / "llm_agent_tools_gpu.yaml", {})
    assert got["slots"] == 64 * 8 and got["kv_cache_bytes"] == 24 * 512 * 2 * 2112 * 64 * 2 * 2
    assert got["total_gib"] < 78 * 0.85
