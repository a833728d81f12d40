"""Issue 15's capability: pipelining a chain of separable nodes without a loop. After splitting a
producer and its consumer into row groups, group g of the consumer depends on group g of the producer
only (a slice of a merge that is exactly one group's rows reads that group), whatever order the splits
were asked in; `split-chain` does both at once."""

from __future__ import annotations

import pytest

from rose_dsl import load_workflow_text
from rose_dsl.analysis import invocation_graph
from rose_dsl.expr import unparse
from rose_dsl.transforms import Refused, apply_request, compose

from .harness import assert_preserved

CHAIN = """
rose: 1
name: chain
components:
  gen: {impl: "tests.mocks:Mock", args: {name: gen, batch: 8, behaviors: {
          generate: {state: {}, out: [tokens], separable: true}}}}
  rm: {impl: "tests.mocks:Mock", args: {name: rm, batch: 8, behaviors: {
          score: {state: {}, out: [reward], separable: true}}}}
  learner: {impl: "tests.mocks:Mock", state: [w], args: {name: learner, batch: 8, states: [w], behaviors: {
          learn: {state: {w: update}, out: [loss], separable: false}}}}
iteration:
  count: 2
  body:
    - {node: generate, call: gen.generate, in: {it: iteration.i}, out: [tokens], batch: {dim: 0, size: 8}}
    - {node: score, call: rm.score, in: {tokens: generate.tokens}, out: [reward], batch: {dim: 0, size: 8}}
    - {node: learn, call: learner.learn, in: {tokens: generate.tokens, reward: score.reward}, state: {w: update}, out: [loss]}
"""


def _apply(*requests):
    wf = load_workflow_text(CHAIN, "chain.yaml")
    result = apply_request(wf, requests[0])
    for r in requests[1:]:
        result = compose(result, apply_request(result.workflow, r))
    return wf, result


def _producers(result, consumer: str) -> set[str]:
    g = invocation_graph(result.workflow, iterations=1)
    inv = next(i for i in g.order if i.path[-1] == consumer)
    return {p.path[-1] for p in g.producers(inv)}


@pytest.mark.parametrize("requests", [
    ("split generate 2", "split score 2"),
    ("split score 2", "split generate 2"),
    ("split-chain generate score 2",),
], ids=" + ".join)
def test_group_g_of_the_consumer_waits_for_group_g_of_the_producer_only(requests) -> None:
    wf, result = _apply(*requests)
    assert _producers(result, "score@0") == {"generate@0"}
    assert _producers(result, "score@1") == {"generate@1"}
    assert unparse(dict(result.workflow.find(("iteration", "score@1")).inputs)["tokens"]) == "generate@1.tokens"
    assert_preserved(wf, result)


def test_groups_of_other_sizes_read_the_part_of_one_group_they_need() -> None:
    wf, result = _apply("split generate 2", "split score 4")
    inputs = [unparse(dict(result.workflow.find(("iteration", f"score@{g}")).inputs)["tokens"]) for g in range(4)]
    assert inputs == ["generate@0.tokens[0:2]", "generate@0.tokens[2:4]", "generate@1.tokens[0:2]",
                      "generate@1.tokens[2:4]"]
    assert _producers(result, "score@3") == {"generate@1"}
    assert_preserved(wf, result)
    wf, result = _apply("split generate 4", "split score 2")
    assert _producers(result, "score@0") == {"generate@0", "generate@1"}
    assert unparse(dict(result.workflow.find(("iteration", "score@0")).inputs)["tokens"]) == \
        "cat(generate@0.tokens, generate@1.tokens)"
    assert_preserved(wf, result)


def test_a_chain_is_refused_where_its_nodes_are_not_a_chain() -> None:
    wf = load_workflow_text(CHAIN, "chain.yaml")
    with pytest.raises(Refused, match="in program order"):
        apply_request(wf, "split-chain score generate 2")
    with pytest.raises(Refused, match="not batch-separable"):
        apply_request(wf, "split-chain score learn 2")
