"""Property 3: on the embodied PPO workflow, the rewrites the paper shows are found legal and compute
the same thing (Figure 9): split + interleave of the policy-simulator loop, the training loop's
iterations rewired next to the rollout epochs that feed them, and a rewire inside the interaction
step; and the tempting illegal ones are refused, naming the dependency."""

from __future__ import annotations

from pathlib import Path

import pytest

from rose_dsl import check, load_workflow, load_workflow_text
from rose_dsl.serialize import to_yaml
from rose_dsl.transforms import Refused, apply_request, compose

from .harness import differences, execute, mockify

PPO = Path(__file__).resolve().parents[2] / "workflows" / "embodied_ppo.yaml"


@pytest.fixture(scope="module")
def ppo():
    wf = load_workflow(PPO, {"num_envs": 6, "steps": 3, "epochs": 4, "denoise_steps": 2})
    return mockify(wf, batch=6)


def _apply(wf, *requests):
    result = apply_request(wf, requests[0])
    for r in requests[1:]:
        result = compose(result, apply_request(result.workflow, r))
    return result


def _same(original, rewritten, seeds=(0, 1, 2)):
    ref_run, ref_comps = execute(original, "program")
    for seed in seeds:
        run, comps = execute(rewritten.workflow, "random", seed=seed)
        assert differences(original, ref_run, ref_comps, rewritten.workflow, run, comps, rewritten.locate) == []


@pytest.mark.parametrize("requests", [
    ("split step 2", "interleave step"),  # Figure 9a: simulator-group pipelining, derived
    ("split step 3", "interleave step 2"),
    ("fuse epoch update",),  # Figure 9b: update j right after epoch j's trajectories
    ("split step 2", "interleave step", "fuse epoch update"),
    ("split step 2", "rewire env@0 before act@1"),  # Figure 9c: a rewire inside the interaction step
    ("split act 2",),  # the policy call split by rows (its phases go with each group)
    ("split reset 2",),
    ("split-time epoch 2",),  # Figure 9b: rollout epochs in two groups, each with its own simulator copy
    ("split-time epoch 2", "split epoch@0.step 2", "split epoch@1.step 2"),
    ("split-time epoch 2", "interleave epoch"),  # the groups take turns: their copies step at the same time
    ("split-time epoch 3", "interleave epoch"),
    ("split-time epoch 2", "split epoch@0.step 2", "interleave epoch"),
    # issue 12.1: a loop body holding a nested loop with a collect (the inner collect follows its loop)
    ("split epoch 2",),
    ("split epoch 3", "interleave epoch"),
], ids=" + ".join)
def test_paper_rewrites_preserve_results(ppo, requests) -> None:
    result = _apply(ppo, *requests)
    check(result.workflow)
    text = to_yaml(result.workflow)
    assert load_workflow_text(text, "plan.yaml") == result.workflow
    assert "&id" not in text and "*id" not in text  # a copy's args shared with the original: no YAML anchors
    _same(ppo, result)


def test_interleaved_temporal_groups_take_turns_on_the_shared_policy(ppo) -> None:
    """Without `interleave`, the shared policy runs every call of group 0 before group 1's; with it, the
    groups' calls alternate, each group keeping its own order (so both simulator copies step at once)."""
    from rose_dsl.semantics import Program

    def acts(wf):
        return [(s.node.path[1], s.inv.indices) for s in Program(wf).unroll(0) if s.node.call.endswith(".act")]

    plain = _apply(ppo, "split-time epoch 2").workflow
    turns = _apply(ppo, "split-time epoch 2", "interleave epoch").workflow
    assert [g for g, _ in acts(plain)][:4] == ["epoch@0"] * 4
    assert [g for g, _ in acts(turns)][:4] == ["epoch@0", "epoch@1"] * 2
    assert sorted(acts(plain)) == sorted(acts(turns))  # the same calls
    for group in ("epoch@0", "epoch@1"):  # each group's own order kept
        assert [i for g, i in acts(turns) if g == group] == [i for g, i in acts(plain) if g == group]
    with pytest.raises(Refused, match="already take turns"):
        apply_request(turns, "interleave epoch")
    with pytest.raises(Refused, match="stagger"):
        apply_request(plain, "interleave epoch 2")


@pytest.mark.parametrize(("requests", "reason"), [
    (("rewire sync before publish",), "'publish' runs later"),
    (("rewire update before epoch",), "loop 'epoch' runs later"),
    (("split sgd 2",), "not batch-separable"),
    (("split step 99",), "would leave empty groups"),
    (("split step 2", "rewire act@1 after env@1"), "'act@1' runs later"),
    (("fuse update epoch",), "runs after"),
    (("split-time update 2",), "is dependent"),
    (("split-time step 2",), "is dependent"),
])
def test_illegal_rewrites_are_refused_with_the_dependency(ppo, requests, reason) -> None:
    with pytest.raises(Refused) as info:
        _apply(ppo, *requests)
    assert reason in info.value.reason


def test_sync_moved_into_rollout_is_refused_and_would_change_the_policy_version(ppo) -> None:
    """Moving the weight sync before the rollout breaks the policy-version rule; forced, rollout reads
    the new weights (different actions)."""
    from rose_dsl.transforms import rewire

    with pytest.raises(Refused) as info:
        rewire(ppo, ("iteration", "sync"), before="epoch")
    assert "data dependency" in info.value.reason or "policy.rollout_weights" in info.value.reason
