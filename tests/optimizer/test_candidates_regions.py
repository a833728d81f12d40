"""Candidate search (the paper's order, the sweep, feasibility) and comparison graphs (changed regions,
local graphs with replayed inputs, probes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rose_dsl import check, load_workflow
from rose_dsl.optimizer.candidates import Feasible, Infeasible, alternatives, memory_estimate, sweep
from rose_dsl.optimizer.candidates import check as check_alt
from rose_dsl.optimizer.regions import (
    FEED,
    PROBE,
    Probe,
    changed_regions,
    common_ancestor,
    local_graphs,
    probe_workflow,
)
from rose_dsl.resolve import check_workflow
from rose_dsl.transforms import apply_request

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wf():
    return load_workflow(ROOT / "workflows" / "latency_interaction.yaml")


@pytest.fixture(scope="module")
def ppo():
    return load_workflow(ROOT / "workflows" / "embodied_ppo.yaml", {"num_envs": 8, "steps": 3, "epochs": 4})


def test_loop_target_order_temporal_then_spatial_then_around(wf) -> None:
    alts = alternatives(wf, "iteration.epoch.step.act")
    labels = [a.label for a in alts]
    assert labels[:5] == ["split-time epoch 2; interleave epoch", "split-time epoch 2", "split epoch.step 2; interleave epoch.step",
                          "split epoch.step 4; interleave epoch.step", "split epoch.step 8; interleave epoch.step"]
    assert [a.groups for a in alts[2:5]] == [2, 4, 8]
    assert alts[2].partners == ("iteration.epoch.step.env",)  # the work that overlaps the policy: the simulator
    assert alts[2].split_nodes == ("iteration.epoch.step.act", "iteration.epoch.step.env")
    assert all(a.family == "rewire" for a in alts[5:])


def test_a_loop_inside_temporal_groups_is_split_in_every_group_first(wf) -> None:
    """After `split-time epoch 2; interleave epoch`, pipelining the step loop of one group alone leaves the other
    group as the bottleneck: the candidate that splits it in both groups comes first, and is legal."""
    plan = apply_request(apply_request(wf, "split-time epoch 2").workflow, "interleave epoch").workflow
    alts = alternatives(plan, "iteration.epoch.step.act")
    spatial = [a for a in alts if a.family == "split-interleave"]
    assert spatial[0].requests == ("split epoch@0.step 2", "interleave epoch@0.step",
                                   "split epoch@1.step 2", "interleave epoch@1.step")
    assert spatial[1].requests == ("split epoch@0.step 2", "interleave epoch@0.step")
    assert isinstance(check_alt(plan, spatial[0]), Feasible)


def test_group_counts_need_a_row_per_group_not_a_divisor(ppo) -> None:
    """2, 4 and 8 groups wherever each group gets a row: 6 envs split in 4 are groups of 2, 2, 1 and 1 (a
    prime batch was never split before uneven row groups); 3 envs are not split in 4 or 8."""
    alts = alternatives(ppo, "iteration.epoch.step.act")
    spatial = [a.groups for a in alts if a.family == "split-interleave"]
    assert spatial == [2, 4, 8]
    ppo6 = load_workflow(ROOT / "workflows" / "embodied_ppo.yaml", {"num_envs": 6, "steps": 3, "epochs": 3})
    assert [a.groups for a in alternatives(ppo6, "iteration.epoch.step.act") if a.family == "split-interleave"] == [2, 4]
    ppo3 = load_workflow(ROOT / "workflows" / "embodied_ppo.yaml", {"num_envs": 3, "steps": 3, "epochs": 3})
    assert [a.groups for a in alternatives(ppo3, "iteration.epoch.step.act") if a.family == "split-interleave"] == [2]
    # temporal groups: 2 (each with and without turns), and one group per epoch for a loop this short
    assert [a.groups for a in alternatives(ppo6, "iteration.epoch.step.act") if a.family == "temporal-split"] == [2, 2, 3, 3]


def test_a_short_free_loop_also_gets_one_temporal_group_per_iteration(ppo) -> None:
    """3 epochs in 2 groups leave one group two epochs long: `split-time epoch 3` is a candidate too (unseen
    sweep, 2026-12-05: 1.76x where 2 groups gave 1.42x), legal, and in the sweep. Loops of more iterations
    than the largest group count keep 2/4/8 only."""
    ppo3 = load_workflow(ROOT / "workflows" / "embodied_ppo.yaml", {"num_envs": 8, "steps": 3, "epochs": 3})
    labels = [a.label for a in alternatives(ppo3, "iteration.epoch.step.act") if a.family == "temporal-split"]
    assert labels == ["split-time epoch 2; interleave epoch", "split-time epoch 2",
                      "split-time epoch 3; interleave epoch", "split-time epoch 3"]
    three = next(a for a in sweep(ppo3) if a.label == "split-time epoch 3; interleave epoch")
    assert isinstance(check_alt(ppo3, three), Feasible)
    ppo5 = load_workflow(ROOT / "workflows" / "embodied_ppo.yaml", {"num_envs": 8, "steps": 3, "epochs": 5})
    assert [a.groups for a in alternatives(ppo5, "iteration.epoch.step.act") if a.family == "temporal-split"] == [2, 2, 4, 4, 5, 5]
    ppo9 = load_workflow(ROOT / "workflows" / "embodied_ppo.yaml", {"num_envs": 8, "steps": 3, "epochs": 9})
    assert [a.groups for a in alternatives(ppo9, "iteration.epoch.step.act") if a.family == "temporal-split"] == [2, 2, 4, 4, 8, 8]


def test_top_level_target_repositions_nearest_first(wf) -> None:
    alts = alternatives(wf, "iteration.publish")
    assert alts[0].family == "rewire"
    assert alts[0].requests in (("rewire publish before update",), ("rewire publish after sync",))
    assert {a.requests[0] for a in alts[:2]} == {"rewire publish before update", "rewire publish after sync"}


def test_sweep_holds_every_hand_written_configuration(wf) -> None:
    labels = {a.label for a in sweep(wf)}
    for k in (2, 4, 8):
        assert f"split epoch.step {k}; interleave epoch.step" in labels
    assert "split-time epoch 2" in labels
    assert "fuse epoch update" in labels  # training overlapped with the next rollout epoch


def test_feasibility_is_the_legality_oracle(wf) -> None:
    results = {a.label: check_alt(wf, a) for a in alternatives(wf, "iteration.update.sgd")}
    assert isinstance(results["fuse epoch update"], Feasible)
    bad = results["rewire publish before update"]
    assert isinstance(bad, Infeasible) and "trainer.weights" in bad.reason
    plan = results["fuse epoch update"].workflow
    check(plan)


def test_memory_estimate_refuses_copies_that_do_not_fit(wf) -> None:
    alt = next(a for a in alternatives(wf, "iteration.epoch.step.act") if a.family == "temporal-split")
    sizes = {"sim": 600, "policy": 100, "trainer": 100}
    assert isinstance(check_alt(wf, alt, memory_estimate(sizes, {"cpu": 1000}, wf.components)), Feasible)
    refused = check_alt(wf, alt, memory_estimate(sizes, {"cpu": 500}, wf.components))  # a second sim does not fit
    assert isinstance(refused, Infeasible) and "memory estimate" in refused.reason


def test_changed_regions_and_their_common_ancestor(wf) -> None:
    split = apply_request(wf, "split epoch.step 2").workflow
    moved = apply_request(split, "rewire epoch.step.env@0 after act@1").workflow
    temporal = apply_request(wf, "split-time epoch 2").workflow
    fused = apply_request(wf, "fuse epoch update").workflow
    assert changed_regions(wf, split) == {("iteration", "epoch")}  # the step loop's carries changed
    assert changed_regions(split, moved) == {("iteration", "epoch", "step")}  # only the body's order
    assert changed_regions(wf, temporal) == {("iteration",)}
    assert changed_regions(wf, fused) == {("iteration",)}
    assert changed_regions(wf, wf) == set()
    assert common_ancestor([("iteration", "epoch", "step"), ("iteration", "epoch")]) == ("iteration", "epoch")
    assert common_ancestor([("iteration", "epoch"), ("iteration", "update")]) == ("iteration",)


def test_local_graph_replays_outside_values_and_runs_a_window(wf) -> None:
    plan = apply_request(apply_request(wf, "split epoch.step 2").workflow, "interleave epoch.step").workflow
    c0, (c1,) = local_graphs(wf, [plan], ("iteration", "epoch"), 1, "interpreter.optimize.trials:Feed")
    assert not isinstance(c0, str) and not isinstance(c1, str)
    assert c0.externals == (("v0", "iteration.i"),)  # the reset's and the policy's iteration index
    assert c1.externals == c0.externals  # shared feed ports: one capture feeds both
    assert c0.writes == ("sim",)  # only the simulator's state changes: the snapshot to restore
    for g in (c0, c1):
        assert check_workflow(g.workflow) == []
        body = g.workflow.root.body
        assert body[0].name == FEED and body[1].name == "epoch" and body[1].count == 1
        assert g.workflow.root.count == 1
    reset = c0.workflow.find(("iteration", "epoch", "reset"))
    assert dict(reset.inputs)["it"].head == FEED


def test_the_whole_iteration_has_no_local_graph(wf) -> None:
    c0, _ = local_graphs(wf, [], ("iteration",), None, "x:Feed")
    assert isinstance(c0, str) and "whole iteration" in c0


def test_values_selected_by_an_index_of_the_region_cannot_be_replayed(wf) -> None:
    """`epoch[update.i].step.traj` inside the update loop changes with the loop's own index."""
    c0, _ = local_graphs(wf, [], ("iteration", "update"), 1, "x:Feed")
    assert isinstance(c0, str) and "cannot be replayed" in c0


def test_probe_workflow_captures_before_the_region(wf) -> None:
    pw = probe_workflow(wf, [Probe(7, ("iteration", "epoch"), (("v0", "iteration.i"),))], "interpreter.optimize.trials:Probe")
    assert not isinstance(pw, str)
    names = [i.name for i in pw.root.body]
    assert names[:2] == ["__probe_7", "epoch"]
    probe = pw.root.body[0]
    assert probe.component == PROBE and [p for p, _ in probe.inputs] == ["probe_id", "v0"]
    assert [s.name for s in pw.components[PROBE].state] == ["captured"]
    assert check_workflow(pw) == []


def test_sweep_ignores_loops_inside_phases_that_do_not_run(ppo) -> None:
    labels = {a.label for a in sweep(ppo)}
    assert not any("denoise" in label for label in labels)  # act runs its entry, not its phases
    expanded = apply_request(ppo, "expand act").workflow
    assert any("denoise" in a.label for a in sweep(expanded))


def test_chains_take_loops_and_stop_where_groups_could_not_overlap() -> None:
    """A decode loop and its verifier form a chain (the loop copied whole per group); `reset -> step` on the
    simulator and policy does not (the step loop uses the simulator too: its groups could not run beside the
    reset's); a node that declares its rows but is not separable never heads or joins a chain."""
    decode = load_workflow(ROOT / "workflows" / "latency_decode.yaml")
    chains = [a.label for a in sweep(decode) if a.family == "split-chain"]
    assert "split-chain decode grade 4" in chains and "split-chain sample decode grade 2" in chains
    assert not any("learn" in c for c in chains)  # the learner is not separable
    assert isinstance(check_alt(decode, next(a for a in sweep(decode) if a.label == "split-chain decode grade 4")), Feasible)
    targets = [a.label for a in alternatives(decode, "iteration.decode.token") if a.family == "split-chain"]
    assert targets[:3] == ["split-chain decode grade 2", "split-chain decode grade 4", "split-chain decode grade 8"]
    interaction = load_workflow(ROOT / "workflows" / "latency_interaction.yaml")
    assert not any(a.label.startswith("split-chain epoch.reset") for a in sweep(interaction))
    sampler = load_workflow(ROOT / "workflows" / "latency_decode.yaml")
    from dataclasses import replace

    sample = sampler.find(("iteration", "sample"))
    body = tuple(replace(i, separable=False) if i is sample else i for i in sampler.root.body)
    sampler = replace(sampler, root=replace(sampler.root, body=body))
    chains = [a.label for a in sweep(sampler) if a.family == "split-chain"]
    assert chains and not any(" sample " in c for c in chains)
    assert not any(a.family == "split-node" for a in alternatives(sampler, "iteration.sample"))


def test_asynchronous_candidates_only_where_a_budget_allows_them(ppo) -> None:
    """The sweep proposes `defer` (an asynchronous plan) when, and only when, a state object declares a
    staleness budget > 0: one candidate per deferral 1..budget of its writer, each legal; the report says
    which staleness the plan uses."""
    from dataclasses import replace

    from rose_dsl.optimizer.report import staleness, staleness_line

    assert not [a for a in sweep(ppo) if a.family == "defer"]
    comp = ppo.components["policy"]
    budgeted = replace(ppo, components={**ppo.components, "policy": replace(
        comp, state=tuple(replace(s, max_staleness=2) for s in comp.state))})
    alts = [a for a in sweep(budgeted) if a.family == "defer"]
    assert [a.label for a in alts] == ["defer sync 1", "defer sync 2"]
    assert all(isinstance(check_alt(budgeted, a), Feasible) for a in alts)
    assert sum(1 for a in sweep(budgeted) if a.family != "defer") == len(sweep(ppo))  # synchronous ones stay
    plan = check_alt(budgeted, alts[1])
    assert isinstance(plan, Feasible)
    assert staleness(plan.workflow) == {"policy.rollout_weights": {"lag": 2, "max_staleness": 2}}
    assert "`policy.rollout_weights` read up to 2 RL iterations old (max_staleness 2)" in staleness_line(staleness(plan.workflow))
    assert staleness(budgeted) == {} and staleness_line({}).startswith("Staleness: none")


def test_a_budget_the_plan_does_not_spend_is_explained() -> None:
    """A budget on a state object the chosen plan does not read older: the report says whether the search
    had asynchronous candidates for it (and chose a synchronous plan) or could have none -- its readers and
    writers all inside loops, which `defer` and `ahead` do not move (an unseen `until:` workflow with a
    budget on its policy's weights, eighth session: the report said only "a synchronous plan")."""
    from dataclasses import replace

    from rose_dsl import load_workflow
    from rose_dsl.optimizer.report import staleness, staleness_line, unused_budgets

    def with_budget(wf, comp_name: str, budget: int):
        comp = wf.components[comp_name]
        return replace(wf, components={**wf.components, comp_name: replace(
            comp, state=tuple(replace(st, max_staleness=budget) for st in comp.state))})

    until = with_budget(load_workflow(ROOT / "workflows" / "latency_until_episodes.yaml"), "pi", 1)
    assert not [a for a in sweep(until) if a.family in ("defer", "ahead")]
    why = unused_budgets(until)
    assert set(why) == {"pi.weights"} and "no asynchronous candidate" in why["pi.weights"]
    assert "`pi.weights` allows max_staleness 1 but no read of it is older" in staleness_line({}, why)
    ppo = with_budget(load_workflow(ROOT / "workflows" / "embodied_ppo.yaml"), "policy", 2)
    assert [a for a in sweep(ppo) if a.family == "defer"]
    why = unused_budgets(ppo)
    assert "asynchronous candidates (`defer`/`ahead` of `sync`)" in why["policy.rollout_weights"]
    plan = check_alt(ppo, next(a for a in sweep(ppo) if a.label == "defer sync 1"))
    assert isinstance(plan, Feasible) and unused_budgets(plan.workflow) == {} and staleness(plan.workflow)
    assert unused_budgets(load_workflow(ROOT / "workflows" / "embodied_ppo.yaml")) == {}  # no budget: nothing to say
