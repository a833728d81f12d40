"""The semantics-preservation suite (the acceptance of the transformations).

Property 1: any sequence of accepted rewrites, executed in any order the dependencies allow, gives the
same outputs and the same final state, bit for bit, as the original run sequentially.
Property 2: a refused reordering, forced through anyway, yields an ill-formed workflow (a reference to
something that now runs later) or a different result -- the checker is not vacuous.
"""

from __future__ import annotations

import pytest
import yaml
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from rose_dsl import load_workflow_text
from rose_dsl.ir import ExecutionNode, LoopNode, MergeNode, Workflow
from rose_dsl.resolve import check_workflow
from rose_dsl.serialize import to_yaml
from rose_dsl.transforms.common import Refused, Rewritten
from rose_dsl.transforms.reorder import fuse_loops, interleave, rewire
from rose_dsl.transforms.split import split_loop_body, split_node
from rose_dsl.transforms.temporal import split_temporal

from ..strategies import workflows
from .harness import differences, execute, orders


def _compose(first, second):
    def locate(path, idx):
        loc = first(path, idx)
        return None if loc is None else second(*loc)

    return locate


def _candidates(wf: Workflow):
    items = [i for i in wf.items() if i.path != wf.root.path]
    return items


def _random_rewrite(wf: Workflow, data) -> tuple[str, Rewritten | Refused]:
    items = _candidates(wf)
    loops = [i for i in items if isinstance(i, LoopNode)]
    nodes = [i for i in items if isinstance(i, ExecutionNode)]
    ops = ["rewire", "split_node"] + (["split_loop", "interleave", "fuse", "split_time"] if loops else [])
    op = data.draw(st.sampled_from(ops))
    try:
        if op == "rewire":
            item = data.draw(st.sampled_from(items))
            parent = wf.find(item.path[:-1])
            body = parent.body if isinstance(parent, LoopNode) else parent.phases
            others = [i.name for i in body if i.name != item.name]
            if not others:
                return op, Refused("no sibling")
            anchor = data.draw(st.sampled_from(others))
            if data.draw(st.booleans()):
                return op, rewire(wf, item.path, before=anchor)
            return op, rewire(wf, item.path, after=anchor)
        if op == "split_node":
            if not nodes:
                return op, Refused("no node")
            return op, split_node(wf, data.draw(st.sampled_from(nodes)).path, data.draw(st.sampled_from([2, 3])))
        loop = data.draw(st.sampled_from(loops))
        if op == "split_loop":
            return op, split_loop_body(wf, loop.path, data.draw(st.sampled_from([2, 3])))
        if op == "interleave":
            return op, interleave(wf, loop.path, data.draw(st.integers(1, 2)))
        if op == "split_time":
            return op, split_temporal(wf, loop.path, data.draw(st.sampled_from([2, 3])))
        parent = wf.find(loop.path[:-1])
        body = list(parent.body) if isinstance(parent, LoopNode) else []
        names = [i.name for i in body]
        later = [i for i in body if isinstance(i, LoopNode) and loop.name in names and names.index(i.name) > names.index(loop.name)]
        if not later:
            return op, Refused("no later loop")
        return op, fuse_loops(wf, loop.path, data.draw(st.sampled_from(later)).path)
    except Refused as exc:
        return op, exc


@settings()
@given(workflows(max_nodes=10), st.data())
def test_accepted_rewrites_preserve_results_in_any_legal_order(doc, data) -> None:
    original = load_workflow_text(yaml.safe_dump(doc, sort_keys=False), "wf.yaml")
    wf, locate, applied = original, (lambda p, i: (p, i)), []
    for _ in range(data.draw(st.integers(1, 4))):
        op, result = _random_rewrite(wf, data)
        if isinstance(result, Rewritten):
            wf, locate = result.workflow, _compose(locate, result.locate)
            applied.append(result.description)
    note(f"applied: {applied}")
    assert not check_workflow(wf)
    # a plan is itself a workflow: it serialises, validates and reads back the same
    assert load_workflow_text(to_yaml(wf), "plan.yaml") == wf
    ref_run, ref_comps = execute(original, "program")
    for order, seed in orders(wf):
        run, comps = execute(wf, order, seed=seed)
        assert differences(original, ref_run, ref_comps, wf, run, comps, locate) == [], applied


@settings()
@given(workflows(max_nodes=10), st.data())
def test_refused_reorders_forced_through_break_something(doc, data) -> None:
    wf = load_workflow_text(yaml.safe_dump(doc, sort_keys=False), "wf.yaml")
    items = [i for i in _candidates(wf) if not isinstance(i, MergeNode)]
    item = data.draw(st.sampled_from(items))
    parent = wf.find(item.path[:-1])
    body = parent.body if isinstance(parent, LoopNode) else parent.phases
    others = [i.name for i in body if i.name != item.name]
    if not others:
        return
    anchor = data.draw(st.sampled_from(others))
    before = data.draw(st.booleans())
    kwargs = {"before": anchor} if before else {"after": anchor}
    try:
        rewire(wf, item.path, **kwargs)
        return  # accepted: property 1's business
    except Refused as exc:
        reason = exc.reason
    forced = rewire(wf, item.path, check=False, **kwargs).workflow
    if check_workflow(forced):
        assert "data dependency" in reason
        return  # the forced plan reads a value before it is computed: a violated dependency
    ref_run, ref_comps = execute(wf, "program")
    run, comps = execute(forced, "program")
    diffs = differences(wf, ref_run, ref_comps, forced, run, comps, lambda p, i: (p, i))
    # what every state access observed (a read whose result is unused still saw another value)
    seen_before = {n: sorted(c.log) for n, c in ref_comps.items()}
    seen_after = {n: sorted(c.log) for n, c in comps.items()}
    note(f"refused: {reason}")
    assert diffs or seen_before != seen_after, f"forced through, '{reason}' changed nothing"


def test_the_suite_is_not_vacuous() -> None:
    """Every kind of rewrite is accepted on some generated workflows (else property 1 checks nothing)."""
    import collections

    seen: collections.Counter = collections.Counter()

    @settings(max_examples=400, deadline=None, database=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(workflows(max_nodes=10), st.data())
    def collect(doc, data):
        wf = load_workflow_text(yaml.safe_dump(doc, sort_keys=False), "wf.yaml")
        for _ in range(3):
            op, result = _random_rewrite(wf, data)
            if isinstance(result, Rewritten):
                seen[op] += 1
                wf = result.workflow

    collect()
    assert {op for op, n in seen.items() if n > 0} >= {"rewire", "split_node", "split_loop", "interleave", "fuse",
                                                       "split_time"}, seen


FORCED = """
rose: 1
name: forced
components:
  c: {impl: "tests.mocks:Mock", state: [s],
      args: {name: c, batch: 6, states: [s], behaviors: {
        p: {state: {}, out: [y], separable: true},
        q: {state: {s: update}, out: [z], separable: false}}}}
iteration:
  count: 2
  body:
    - {node: p, call: c.p, in: {i: iteration.i}, out: [y], batch: {dim: 0, size: 6}}
    - loop: l
      count: 3
      body:
        - {node: q, call: c.q, in: {x: p.y, j: l.i}, state: {s: update}, out: [z]}
"""


def test_forced_splits_of_what_the_checker_refuses_change_the_result() -> None:
    """Property 2 for the split refusals: a node whose rows mix (no batch: declaration) split by rows,
    and a dependent loop split in time, compute something else when forced through."""
    wf = load_workflow_text(FORCED, "forced.yaml")
    q, loop = ("iteration", "l", "q"), ("iteration", "l")
    with pytest.raises(Refused, match="not batch-separable"):
        split_node(wf, q, 2, batch_size=6)
    with pytest.raises(Refused, match="is dependent"):
        split_temporal(wf, loop, 3)
    ref_run, ref_comps = execute(wf, "program")
    for forced in (split_node(wf, q, 2, batch_size=6, force=True), split_temporal(wf, loop, 3, force=True, check=False)):
        run, comps = execute(forced.workflow, "program")
        assert differences(wf, ref_run, ref_comps, forced.workflow, run, comps, forced.locate), forced.description
