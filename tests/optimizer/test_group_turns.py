"""The optimizer finds the multi-turn agent's plan (issue 62) on its own: a loop that ends per row and
alternates between two components (decode on the policy, tool calls on a pool), followed by a consumer of
its rows, is copied per row group with that consumer, the consumer's groups moved after the last copy and
the copies taking turns -- `candidates.group_turns`, the plan `benchmarks/agent_tools_gpu.sh` writes by
hand. On fake measurers (simulated time; `fakes.RowTripsMeasurer` ends each row's turns as the runtime
does, so later turns run on fewer rows): the candidate is generated for the shipped agent workflow and for
a variant it was not written for, predicted faster by the cost model, raced first and kept; it is not
generated, or refused, where it cannot help or would change what the workflow computes."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hypothesis import event, given, settings

from rose_dsl import load_workflow, load_workflow_text
from rose_dsl.optimizer.candidates import TURNS, Alternative, Feasible, Infeasible, alternatives, check, sweep
from rose_dsl.optimizer.search import Settings, optimize_graph
from rose_dsl.transforms import apply_request, compose
from rose_dsl.transforms.plan_check import plan_differences

from ..strategies import turn_workflows
from ..transforms.harness import differences, execute
from .fakes import GroundTruth, RowTripsMeasurer

ROOT = Path(__file__).resolve().parents[2]
AGENT = ROOT / "workflows" / "llm_agent_tools.yaml"
VARIANT = Path(__file__).parent / "data" / "agent_variant.yaml"
# decode about as long as the tool wait, per turn; the rest of the iteration small beside the turns
TRUTH = GroundTruth(
    fixed={"prompts": 0.0005, "tasks": 0.0005, "agent": 0.002, "lm": 0.002, "tools": 0.004, "search": 0.004,
           "reference": 0.002, "reward": 0.002, "verifier": 0.002, "learner": 0.004, "trainer": 0.004},
    per_row={"agent": 0.001, "lm": 0.001, "tools": 0.0008, "search": 0.0008, "reference": 0.0003, "reward": 0.0002,
             "verifier": 0.0002})


def _agent():
    return load_workflow(AGENT, {"prompts": 8, "k": 4, "iterations": 100_000})


def _variant(text: str | None = None):
    return load_workflow_text(text or VARIANT.read_text(), str(VARIANT))


def _turns(alts):
    return [a for a in alts if a.family == TURNS]


def test_the_hand_plan_is_a_candidate_of_the_agent_workflow() -> None:
    """`benchmarks/agent_tools_gpu.sh`'s rose_plan for G = 4, its consumer moves last group first (so the
    consumer's groups keep their order), per group count of the settings that the rows allow."""
    wf = _agent()
    alts = _turns(sweep(wf, (2, 4, 8, 16)))
    assert [a.groups for a in alts] == [2, 4, 8]
    four = next(a for a in alts if a.groups == 4)
    assert four.requests == ("split-chain turn finish 4", "rewire finish@2 after turn@3", "rewire finish@1 after turn@3",
                             "rewire finish@0 after turn@3", "interleave turn@0 turn@1 turn@2 turn@3")
    assert all(isinstance(check(wf, a), Feasible) for a in alts)
    # a target in the loop proposes it too (ranked targets: the tool wait, the decode)
    assert [a.requests for a in _turns(alternatives(wf, "iteration.turn.tool"))] == [a.requests for a in alts]
    plan = check(wf, four)
    assert isinstance(plan, Feasible)
    order = [i.name for i in plan.workflow.root.body]
    assert order[2:10] == ["turn@0", "turn@1", "turn@2", "turn@3", "finish@0", "finish@1", "finish@2", "finish@3"]


def test_an_unseen_agent_variant_gets_it() -> None:
    """Other names, five turns, the consumer a verifier on a component of its own."""
    wf = _variant()
    alts = _turns(sweep(wf))
    assert [a.requests[0] for a in alts] == [f"split-chain episode grade {k}" for k in (2, 4, 8)]
    assert alts[0].requests[-1] == "interleave episode@0 episode@1"
    assert all(isinstance(check(wf, a), Feasible) for a in alts)


@pytest.mark.parametrize("which", ["agent", "variant"])
def test_it_is_predicted_faster_raced_first_and_kept(which: str) -> None:
    wf = _agent() if which == "agent" else _variant()
    trips = (3, 3, 2, 3, 1, 3, 2, 3) if which == "agent" else (5, 1, 2, 4, 5, 1, 3, 2)
    m = RowTripsMeasurer(TRUTH, trips, iterations=100_000)
    result = optimize_graph(wf, m, Settings(budget_s=20.0, final_rounds=0, top_k=1, rounds=1, groups=(2, 4)),
                            log=lambda _: None)
    ref = result.rounds[0].reference.median
    two = next(a for t in result.rounds[0].targets for a in t.alternatives if a.family == TURNS and a.groups == 2)
    assert two.predicted_iteration_s is not None and two.predicted_iteration_s < 0.9 * ref
    assert two.trial_rank == 1 and two.status == "complete" and two.significant
    assert result.requests == two.requests
    assert result.final.median < 0.95 * result.baseline.median  # (the variant's true gain is ~8%, the noise 1%)


def test_not_where_it_cannot_help() -> None:
    # a decode loop on one component (the copies' trips would only queue on it)
    one = load_workflow(ROOT / "tests" / "dsl" / "fixtures" / "until_decode_split.yaml")
    assert not _turns(sweep(one))
    assert not _turns(alternatives(one, "iteration.decode.gen"))
    # no consumer of the loop's rows after it (an episode loop last in its epoch; the epochs' update loop is
    # not split by rows)
    assert not _turns(sweep(load_workflow(ROOT / "workflows" / "latency_until_episodes.yaml")))
    # one row: no row groups
    assert not _turns(sweep(_variant(VARIANT.read_text().replace("rows: 8", "rows: 1"))))
    # a static loop: its body split and interleaved is the same overlap (`split-interleave`)
    static = VARIANT.read_text().replace("      until: lookup.over\n", "")
    assert not _turns(sweep(_variant(static)))
    # on a plan that already interleaves the copies, nothing more of it
    wf = _variant()
    plan = check(wf, _turns(sweep(wf))[0])
    assert isinstance(plan, Feasible) and not _turns(sweep(plan.workflow))


def test_not_where_the_copies_would_compute_something_else() -> None:
    """A tool with a cache (state it writes) inside the loop: each copy would run its own number of turns, so
    the cache would see other calls than the declared loop's -- the split's own check refuses it, so no
    candidate."""
    cached = (VARIANT.read_text().replace("  search:\n    impl: \"examples.llm.tools:ToolPool\"\n    device: cpu\n",
                                          "  search:\n    impl: \"examples.llm.tools:ToolPool\"\n    device: cpu\n"
                                          "    state: [cache]\n")
              .replace("          out: [ctx, ended, over]\n", "          state: {cache: update}\n          out: [ctx, ended, over]\n"))
    wf = _variant(cached)
    assert wf.components["search"].state and not _turns(sweep(wf))
    assert not _turns(alternatives(wf, "iteration.episode.lookup"))
    # forced through as requests, the rewrite refuses it (the legality checks, not the generator, decide)
    forced = Alternative(("split-chain episode grade 2", "rewire grade@0 after episode@1",
                          "interleave episode@0 episode@1"), TURNS, "t", groups=2)
    refused = check(wf, forced)
    assert isinstance(refused, Infeasible) and "writes state" in refused.reason


@settings(max_examples=max(10, settings.default.max_examples // 10))  # 20 by default, 300 in the long profile
@given(turn_workflows())
def test_every_feasible_candidate_computes_the_declared_values(doc) -> None:
    """On random agents' turns (tests/strategies.py: per-row turn counts and decode lengths, a decode loop
    inside the turn loop, the tool on its own component): every group-turns candidate the sweep proposes
    that the rewrites accept is a plan the plan check accepts and computes the declared values bit for bit
    (the rewrites' own property suite runs the moves in the other order, first group first)."""
    wf = load_workflow_text(yaml.safe_dump(doc, sort_keys=False), "wf.yaml")
    alts = _turns(sweep(wf, (2, 3)))
    assert alts or doc["components"]["c0"]["args"]["batch"] < 2
    ref_run, ref_comps = execute(wf, "program")
    for alt in alts:
        got = check(wf, alt)
        event(f"feasible: {isinstance(got, Feasible)}")
        if not isinstance(got, Feasible):
            continue
        assert plan_differences(wf, got.workflow) == [], alt.requests
        result = apply_request(wf, alt.requests[0])
        for r in alt.requests[1:]:
            result = compose(result, apply_request(result.workflow, r))
        run, comps = execute(result.workflow, "program")
        assert differences(wf, ref_run, ref_comps, result.workflow, run, comps, result.locate) == [], alt.requests
