"""The shortcuts that make validation and legality checks fast give the same answers as the long way:
the order-only invocation graph, plain references parsed without lark, the schema compiled with
`anyOf` for exclusive `oneOf`, and `bulk()` leaving the garbage collector as it found it. Also the
dependency rule for a split group's refresh (found by the rewrite property suite)."""

from __future__ import annotations

import gc

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from rose_dsl import load_workflow, load_workflow_text
from rose_dsl.analysis import invocation_graph
from rose_dsl.bulk import bulk
from rose_dsl.expr import Ref, parse_expr, parse_with_grammar
from rose_dsl.schema import exclusive_one_of_as_any_of
from rose_dsl.transforms import Refused, rewire, split_node

from ..strategies import workflows

NAME = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,6}(@[0-9]{1,2})?", fullmatch=True)


@settings()
@given(workflows())
def test_order_only_graph_is_the_full_graph_without_edges(doc) -> None:
    wf = load_workflow_text(yaml.safe_dump(doc, sort_keys=False), "wf.yaml")
    full, lean = invocation_graph(wf, 2), invocation_graph(wf, 2, edges=False)
    assert lean.order == full.order and lean.node == full.node
    assert dict(lean.accesses) == dict(full.accesses)
    assert not list(lean.edges())


@settings()
@given(NAME, NAME, st.sampled_from(["", " ", "x", "[0]", ".y", "(", " + 1"]))
def test_plain_references_parse_as_the_grammar_does(head: str, attr: str, suffix: str) -> None:
    text = f"{head}.{attr}{suffix}"
    parse_expr.cache_clear()
    try:
        fast = parse_expr(text)
    except Exception as exc:  # noqa: BLE001 - then the grammar must refuse it too
        with pytest.raises(Exception):  # noqa: B017
            parse_with_grammar(text)
        assert suffix, exc
        return
    slow = parse_with_grammar(text)
    assert fast == slow and fast.offset == slow.offset
    if not suffix:
        assert fast == Ref(0, head, attr)


def test_exclusive_one_of_becomes_any_of_only_when_types_are_disjoint() -> None:
    schema = {"properties": {
        "a": {"oneOf": [{"type": "string", "minLength": 1}, {"type": "integer"}]},
        "b": {"oneOf": [{"type": "integer"}, {"type": "number"}]},          # 1 matches both: exactly one
        "c": {"oneOf": [{"type": "string"}, {"minimum": 3}]},               # a branch without a type
        "d": {"oneOf": [{"type": ["integer", "null"]}, {"type": "object"}]},
    }}
    out = exclusive_one_of_as_any_of(schema)["properties"]
    assert "anyOf" in out["a"] and "oneOf" not in out["a"]
    assert "oneOf" in out["b"] and "oneOf" in out["c"]
    assert "anyOf" in out["d"]
    assert schema["properties"]["a"]["oneOf"]  # the input is left alone


def test_bulk_restores_the_collector_and_nests() -> None:
    assert gc.isenabled()
    with bulk():
        assert not gc.isenabled()
        with bulk():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with bulk():
            pass
        assert not gc.isenabled()  # paused by the program: left paused
    finally:
        gc.enable()
    with pytest.raises(ValueError), bulk():
        raise ValueError
    assert gc.isenabled()


SPLIT_REFRESH = """
rose: 1
name: split-refresh
components:
  c: {impl: "tests.mocks:MockC0", state: [s]}
iteration:
  count: 1
  body:
    - loop: l
      count: 1
      body:
        - {node: a, call: c.a, state: {s: refresh}}
    - {node: b, call: c.b, state: {s: refresh}, batch: {dim: 0, size: 6}}
"""


def test_a_split_groups_refresh_hides_nothing() -> None:
    """b's groups each refresh their rows of s: after them, rows of the first group are still its own,
    so a's refresh must stay before it. (The rule treated the second group's refresh as overwriting the
    first's, and accepted moving `l` between the groups: the final state changed.)"""
    wf = load_workflow_text(SPLIT_REFRESH, "wf.yaml")
    split = split_node(wf, ("iteration", "b"), 2).workflow
    g = invocation_graph(split, 2)
    first_group = [inv for inv in g.order if inv.path[-1] == "b@0" and inv.indices == (0,)][0]
    assert any(p.path[-1] == "a" for p in g.producers(first_group))
    # the legality oracle compares what each access sees and what the iteration leaves: the rows of b@0
    # would be left holding a's value
    with pytest.raises(Refused, match="which value of 'c.s' RL iteration 0 leaves"):
        rewire(split, ("iteration", "l"), after="b@0")


def test_a_full_refresh_still_hides_an_unobserved_one() -> None:
    """Without rows the second refresh overwrites everything: the first may move freely."""
    wf = load_workflow_text(SPLIT_REFRESH.replace(", batch: {dim: 0, size: 6}", "").replace(
        "    - {node: b, call: c.b, state: {s: refresh}}\n",
        "    - {node: b, call: c.b, state: {s: refresh}}\n    - {node: d, call: c.d, state: {s: refresh}}\n"), "wf.yaml")
    assert rewire(wf, ("iteration", "l"), after="b")


def test_the_embodied_graph_is_unchanged_in_size() -> None:
    """A coarse anchor for the benchmark's workflow: 212 calls and 1364 dependencies over two RL
    iterations (the golden analyses check the edges themselves; 1264 before the trajectory carried each
    sample's policy version, `act.version`: one more edge per rollout step)."""
    g = invocation_graph(load_workflow("workflows/embodied_ppo.yaml"), 2)
    assert (len(g.order), sum(1 for _ in g.edges())) == (212, 1364)


def test_graphs_are_kept_by_workflow_identity() -> None:
    from rose_dsl.analysis import clear_graph_cache

    wf = load_workflow("workflows/embodied_ppo.yaml")
    same = load_workflow("workflows/embodied_ppo.yaml")  # equal, but another object
    g = invocation_graph(wf, 2)
    assert invocation_graph(wf, 2) is g
    assert invocation_graph(same, 2) is not g and invocation_graph(wf, 3) is not g
    assert invocation_graph(wf, 2, edges=False) is not g
    clear_graph_cache()
    assert invocation_graph(wf, 2) is not g
