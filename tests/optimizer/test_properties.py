"""The optimizer's moves join the semantics-preservation suite: on random workflows over deterministic
mock components, every feasible alternative the candidate search proposes (the paper's order and the
hand-written sweep), and every greedy combination of two, executes in any legal order to the same
outputs and final state as the original; a probe workflow (capturing a region's inputs) computes the
same; every comparison graph stands alone as a valid workflow."""

from __future__ import annotations

import yaml
from hypothesis import event, given, note, settings
from hypothesis import strategies as st

from rose_dsl import load_workflow_text
from rose_dsl.ir import ExecutionNode
from rose_dsl.optimizer.candidates import Feasible, alternatives, check, sweep
from rose_dsl.optimizer.regions import Probe, changed_regions, common_ancestor, local_graphs, probe_workflow
from rose_dsl.resolve import check_workflow
from rose_dsl.transforms import apply_request, compose

from ..strategies import workflows
from ..transforms.harness import differences, execute, orders

SINK = "tests.optimizer.components:Sink"


def _rewritten(wf, requests):
    result = apply_request(wf, requests[0])
    for r in requests[1:]:
        result = compose(result, apply_request(result.workflow, r))
    return result


def _same(original, result, seeds=(0,)) -> list[str]:
    """Differences between the original in program order and the result in random legal orders (program
    order only where a loop ends on a condition: only an in-order executor can tell when it ends)."""
    ref_run, ref_comps = execute(original, "program")
    out = []
    random_ok = orders(result.workflow) != [("program", 0)]
    for seed in seeds:
        run, comps = execute(result.workflow, "random" if random_ok else "program", seed=seed)
        out += differences(original, ref_run, ref_comps, result.workflow, run, comps, result.locate)
    return out


@settings(max_examples=max(150, settings.default.max_examples // 4))  # 150 by default, 750 in the long profile
@given(workflows(max_nodes=9), st.data())
def test_every_feasible_alternative_and_combination_preserves_results(doc, data) -> None:
    wf = load_workflow_text(yaml.safe_dump(doc, sort_keys=False), "wf.yaml")
    nodes = [i for i in wf.items() if isinstance(i, ExecutionNode)]
    target = ".".join(data.draw(st.sampled_from(nodes)).path)
    alts = alternatives(wf, target, (2, 3)) + sweep(wf, (2, 3))
    feasible = [r for r in (check(wf, a) for a in alts) if isinstance(r, Feasible)]
    note(f"feasible: {[f.alt.label for f in feasible]}")
    event(f"feasible alternatives: {min(len(feasible), 4)}")
    for f in feasible[:4]:
        event(f"family {f.alt.family}")
    for f in feasible[:4]:
        result = _rewritten(wf, f.alt.requests)
        assert result.workflow == f.workflow
        assert _same(wf, result) == [], f.alt.label
    if len(feasible) >= 2:  # greedy combination: the second applied on top of the first, when it still applies
        a, b = data.draw(st.permutations(feasible))[:2]
        second = check(a.workflow, b.alt)
        if isinstance(second, Feasible):
            event("combination executed")
            combo = _rewritten(wf, a.alt.requests + b.alt.requests)
            assert _same(wf, combo) == [], (a.alt.label, b.alt.label)


@settings(max_examples=max(150, settings.default.max_examples // 4))  # 150 by default, 750 in the long profile
@given(workflows(max_nodes=9), st.data())
def test_probes_preserve_results_and_comparison_graphs_stand_alone(doc, data) -> None:
    wf = load_workflow_text(yaml.safe_dump(doc, sort_keys=False), "wf.yaml")
    nodes = [i for i in wf.items() if isinstance(i, ExecutionNode)]
    target = ".".join(data.draw(st.sampled_from(nodes)).path)
    feasible = [r for r in (check(wf, a) for a in alternatives(wf, target, (2,)) + sweep(wf, (2,)))
                if isinstance(r, Feasible)]
    regions = [r for f in feasible for r in changed_regions(wf, f.workflow) if r != wf.root.path]
    if not regions:
        return
    region = common_ancestor(regions)
    local = [f for f in feasible if wf.root.path not in changed_regions(wf, f.workflow)]
    c0, graphs = local_graphs(wf, [f.workflow for f in local], region, 1, "tests.optimizer.components:Feed")
    for g in [c0, *graphs]:
        if not isinstance(g, str):
            assert check_workflow(g.workflow) == []
    if isinstance(c0, str):
        return
    pw = probe_workflow(wf, [Probe(1, region, c0.externals)], SINK)
    if isinstance(pw, str):
        return
    from rose_dsl.transforms import Rewritten

    event("probe workflow executed")
    assert _same(wf, Rewritten(pw, lambda p, i: (p, i), "probes")) == []
