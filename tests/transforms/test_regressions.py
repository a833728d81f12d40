"""One test per rewrite bug found (issue 12 and the siblings found while fixing it): each workflow is
the smallest one that showed the bug, and each test failed before its fix."""

from __future__ import annotations

import pytest

from rose_dsl import load_workflow_text
from rose_dsl.transforms import Refused, apply_request, compose

from .harness import assert_preserved

MOCK = '{{impl: "tests.mocks:Mock", state: [{states}], args: {{name: {name}, batch: 4, states: [{states}], behaviors: {{{behaviors}}}}}}}'


def workflow(body: str, behaviors: dict[str, str], states: str = "s") -> str:
    """A one-component workflow of mocks: `behaviors` maps a method to its mock behaviour."""
    beh = ", ".join(f"{m}: {b}" for m, b in behaviors.items())
    return f"rose: 1\nname: t\ncomponents:\n  c: {MOCK.format(name='c', states=states, behaviors=beh)}\n" \
           f"iteration:\n  count: 2\n  body:\n{body}"


SEP = "{state: {}, out: [o], separable: true}"
MIX = "{state: {}, out: [o], separable: false}"


def run_requests(text: str, *requests: str):
    wf = load_workflow_text(text, "wf.yaml")
    result = apply_request(wf, requests[0])
    for r in requests[1:]:
        result = compose(result, apply_request(result.workflow, r))
    return wf, result


# -- issue 12.1: a split body holding a nested loop whose collect selects its own iterations -------------
NESTED_COLLECT = workflow("""\
    - loop: outer
      count: 2
      body:
        - {node: a, call: c.a, in: {i: outer.i}, out: [o], batch: {dim: 0, size: 4}}
        - loop: inner
          count: 3
          carry: {x: {init: a.o, next: b.o}}
          body:
            - {node: b, call: c.b, in: {x: inner.x, t: inner.i}, out: [o], batch: {dim: 0, size: 4}}
          collect: {traj: "stack(inner[*].{inner.x, b.o})"}
    - {node: use, call: c.use, in: {t: "outer[-1].inner.traj"}, out: [o]}
""", {"a": SEP, "b": SEP, "use": MIX})


def test_split_body_with_nested_collect_keeps_the_collect_on_its_own_loop() -> None:
    wf, result = run_requests(NESTED_COLLECT, "split outer 2")
    collect = dict(result.workflow.find(("iteration", "outer", "inner@0")).collects)["traj"]
    from rose_dsl.expr import unparse

    assert unparse(collect) == "stack(inner@0[*].{inner@0.x, b.o})"
    assert_preserved(wf, result)


# -- siblings in loop fusion: names of the moved body renamed by binding, everywhere ---------------------
FUSE_RECORD = workflow("""\
    - loop: l1
      count: 2
      body:
        - {node: n1, call: c.p, in: {i: l1.i}, out: [o]}
    - loop: l2
      count: 2
      body:
        - {node: n1, call: c.q, in: {x: "l1[l2.i].n1.o"}, out: [o]}
    - {node: last, call: c.r, in: {x: "l2[-1].{n1.o}", y: "l1[0].{n1.o}"}, out: [o]}
""", {"p": MIX, "q": MIX, "r": MIX})


def test_fuse_renames_references_inside_records() -> None:
    """`l2[-1].{n1.o}` must follow l2's n1 (renamed n1_2 in l1's body), not become l1's n1."""
    wf, result = run_requests(FUSE_RECORD, "fuse l1 l2")
    last = result.workflow.find(("iteration", "last"))
    from rose_dsl.expr import unparse

    assert unparse(dict(last.inputs)["x"]) == "l1[-1].{n1_2.o}"
    assert_preserved(wf, result)


FUSE_NESTED_LOOP = workflow("""\
    - loop: l1
      count: 2
      body:
        - loop: m
          count: 2
          body:
            - {node: n, call: c.p, in: {i: m.i}, out: [o]}
    - loop: l2
      count: 2
      body:
        - loop: m
          count: 2
          body:
            - {node: n, call: c.q, in: {i: m.i, j: l2.i}, out: [o]}
        - {node: k, call: c.r, in: {x: "m[-1].n.o", y: "m[0].n.o"}, out: [o]}
""", {"p": MIX, "q": MIX, "r": MIX})


def test_fuse_renames_iteration_references_to_a_renamed_loop() -> None:
    wf, result = run_requests(FUSE_NESTED_LOOP, "fuse l1 l2")
    k = result.workflow.find(("iteration", "l1", "k"))
    from rose_dsl.expr import unparse

    assert unparse(dict(k.inputs)["x"]) == "m_2[-1].n.o"
    assert_preserved(wf, result)


FUSE_GROUPS = workflow("""\
    - loop: l1
      count: 2
      body:
        - {node: n1, call: c.p, in: {i: l1.i}, out: [o], batch: {dim: 0, size: 4}}
    - loop: l2
      count: 2
      body:
        - {node: n1, call: c.q, in: {i: l2.i}, out: [o], batch: {dim: 0, size: 4}}
        - {node: n2, call: c.r, in: {x: n1.o}, out: [o]}
""", {"p": SEP, "q": SEP, "r": MIX})


def test_fuse_of_a_split_body_keeps_group_names_valid() -> None:
    """Fusing moved `n1@0` next to l1's `n1` and named it `n1@0_2`, which is not a name."""
    wf, result = run_requests(FUSE_GROUPS, "split l2.n1 2", "fuse l1 l2")
    names = [i.name for i in result.workflow.find(("iteration", "l1")).body]
    assert names == ["n1", "n1_2@0", "n1_2@1", "n1_2", "n2"]
    assert_preserved(wf, result)


def test_fuse_refuses_a_body_reading_another_iteration_of_the_first_loop() -> None:
    text = FUSE_RECORD.replace('"l1[l2.i].n1.o"', '"l1[-1].n1.o"')
    with pytest.raises(Refused, match=r"reads 'l1\[-1\].n1.o' \(the last iteration of 'l1'\)"):
        run_requests(text, "fuse l1 l2")


def test_a_rewrite_that_fails_inside_rose_is_a_clean_refusal(monkeypatch) -> None:
    """A bug in a rewrite must not escape as an exception (the optimizer calls rewrites on workflows
    nobody checked): it is refused, marked internal."""
    import dataclasses

    from rose_dsl.transforms import passes

    def broken(*args, **kwargs):
        raise KeyError("planted")

    monkeypatch.setitem(passes.PASSES, "split-loop", dataclasses.replace(passes.PASSES["split-loop"], build=broken))
    wf = load_workflow_text(NESTED_COLLECT, "wf.yaml")
    with pytest.raises(Refused) as info:
        apply_request(wf, "split outer 2")
    assert info.value.internal and "a bug in rose" in info.value.reason


# -- issue 12.2: a loop that ends on a condition, inside a region split into row groups -----------------
FLAG = "{state: {}, out: [done], separable: true, flags: [done]}"
UNTIL_INSIDE = workflow("""\
    - loop: outer
      count: 2
      body:
        - loop: wait
          count: 4
          until: check.done
          body:
            - {node: work, call: c.work, in: {t: wait.i}, state: {s: update}, out: [o], batch: {dim: 0, size: 4}}
            - {node: check, call: c.check, in: {t: wait.i, x: work.o}, out: [done], batch: {dim: 0, size: 4}}
""", {"work": "{state: {s: update}, out: [o], separable: true}", "check": FLAG})


def test_split_of_a_body_holding_an_until_loop_is_refused() -> None:
    wf = load_workflow_text(UNTIL_INSIDE, "wf.yaml")
    with pytest.raises(Refused, match=r"loop 'wait' inside loop 'outer' ends on a condition \(until\): split into "
                                      r"row groups, each group would stop on its own rows' condition"):
        apply_request(wf, "split outer 2")


def test_split_of_a_node_whose_phases_hold_an_until_loop_is_refused() -> None:
    text = workflow("""\
    - node: act
      call: c.act
      in: {t: iteration.i}
      out: [o]
      batch: {dim: 0, size: 4}
      phases:
        - loop: wait
          count: 3
          until: check.done
          body:
            - {node: check, call: c.check, in: {t: wait.i, x: act.t}, out: [done], batch: {dim: 0, size: 4}}
        - {node: head, call: c.head, in: {x: act.t}, out: [o], batch: {dim: 0, size: 4}}
""", {"act": SEP, "check": FLAG, "head": SEP})
    wf = load_workflow_text(text, "wf.yaml")
    with pytest.raises(Refused, match="loop 'wait' inside the phases of 'act' ends on a condition"):
        apply_request(wf, "split act 2")


def test_split_of_an_until_loop_itself_says_why_in_its_own_words() -> None:
    """Issue 12.4: not the temporal split's 'its iterations are kept whole'."""
    wf = load_workflow_text(UNTIL_INSIDE, "wf.yaml")
    with pytest.raises(Refused) as info:
        apply_request(wf, "split outer.wait 2")
    assert "the condition would read the merge of every group's rows" in info.value.reason
    assert "kept whole" not in info.value.reason


# -- siblings found by the extended generator ----------------------------------------------------------
INT_IN_RECORD = workflow("""\
    - {node: a, call: c.a, in: {t: iteration.i}, out: [o], batch: {dim: 0, size: 4}}
    - {node: b, call: c.b, in: {x: "{it: iteration.i, v: a.o}"}, out: [o], batch: {dim: 0, size: 4}}
""", {"a": SEP, "b": SEP})


def test_split_node_reading_a_record_with_an_integer_field() -> None:
    """The record is sliced for each group; its integer field is the same for every row (the values
    layer sliced the integer and failed)."""
    wf, result = run_requests(INT_IN_RECORD, "split b 2")
    assert_preserved(wf, result)


STACK_FROM_OUTSIDE = workflow("""\
    - loop: roll
      count: 3
      body:
        - {node: a, call: c.a, in: {t: roll.i}, out: [o], batch: {dim: 0, size: 4}}
    - loop: l
      count: 2
      body:
        - {node: b, call: c.b, in: {x: "stack(roll[*].a.o)", t: l.i}, out: [o], batch: {dim: 0, size: 4}}
""", {"a": SEP, "b": SEP})


def test_split_body_refuses_rows_of_a_stack_of_outside_values() -> None:
    """`stack(roll[*].a.o)` has its batch on dim 1; slicing each stacked element by reference would have
    sliced the list of iterations instead (time, not rows)."""
    wf = load_workflow_text(STACK_FROM_OUTSIDE, "wf.yaml")
    with pytest.raises(Refused, match=r"'roll\[\*\].a.o' read inside loop 'l' has its rows combined by stack"):
        apply_request(wf, "split l 2")


# -- issue 12.4: refusals name the invocations and the position in the original workflow ---------------
PPO = __import__("pathlib").Path(__file__).resolve().parents[2] / "workflows" / "embodied_ppo.yaml"


def _ppo():
    from rose_dsl import load_workflow

    return load_workflow(PPO, {"num_envs": 6, "steps": 3, "epochs": 4, "denoise_steps": 2})


def test_a_broken_state_dependency_names_both_invocations_and_the_line() -> None:
    wf = _ppo()
    with pytest.raises(Refused) as info:
        apply_request(wf, "rewire publish before update")
    line = next(n for n, text in enumerate(PPO.read_text().splitlines(), 1) if "node: publish" in text)
    assert info.value.reason == (
        f"{PPO}:{line + 2}:14: moving 'publish' before 'update' would break the state dependency update[3].sgd -> "
        "publish ('trainer.weights': read): publish would see the initial value instead")


def test_a_full_batch_update_fused_into_the_rollout_names_the_epoch_it_needs() -> None:
    """The issue's example: an update reading every epoch's trajectories cannot run inside epoch 0."""
    import dataclasses

    from rose_dsl.expr import parse_expr

    wf = _ppo()
    sgd = wf.find(("iteration", "update", "sgd"))
    full = dataclasses.replace(sgd, inputs=(("traj", parse_expr("stack(epoch[*].step.traj)")),))
    from rose_dsl.transforms.tree import replace_item

    wf = replace_item(wf, sgd.path, full)
    with pytest.raises(Refused) as info:
        apply_request(wf, "fuse epoch update")
    assert info.value.reason.startswith(f"{PPO}:")
    assert ("'update' reads 'epoch[*].step.traj' (every iteration of 'epoch'): fused, update[0] would run inside "
            "epoch[0], before epoch[3] has computed it") in info.value.reason


def test_a_refusal_after_earlier_rewrites_cites_the_original_file() -> None:
    wf = _ppo()
    split = apply_request(wf, "split step 2")
    with pytest.raises(Refused) as info:
        apply_request(split.workflow, "rewire act@1 after env@1")
    line = next(n for n, text in enumerate(PPO.read_text().splitlines(), 1) if "in: {action: act.action}" in text)
    assert info.value.reason.startswith(f"{PPO}:{line}:")
    assert "'act@1' runs later in the same iteration" in info.value.reason


# -- issue 42: `after:` naming the item a rewrite replaces --------------------------------------------
@pytest.mark.parametrize("found", [f for f in __import__("tests.transforms.found", fromlist=["ACCEPTED"]).ACCEPTED
                                   if f.title.startswith("issue 42")], ids=lambda f: f.requests[0])
def test_a_rewrite_of_an_item_named_by_after_retargets_the_after(found) -> None:
    """`split-time` of a loop that a sibling runs `after:`, and the paper's fuse (Figure 9b) with a node `after:`
    the second loop, were refused as "would break a data dependency": the plan's `after:` named the old item.
    Accepted now, with the `after:` naming what stands for it, and computing the same in every legal order."""
    import yaml

    from rose_dsl.serialize import to_yaml
    from rose_dsl.transforms.plan_check import plan_differences

    wf, result = run_requests(yaml.safe_dump(found.doc, sort_keys=False), *found.requests)
    after = [i.after for i in result.workflow.root.body if i.after]
    assert after in ([("l1@0", "l1@1")], [("l1",)]), after
    assert load_workflow_text(to_yaml(result.workflow), "plan.yaml") == result.workflow
    assert plan_differences(wf, result.workflow) == []
    assert_preserved(wf, result)


def test_the_papers_fuse_with_a_node_after_the_update_is_accepted() -> None:
    """Figure 9b on the embodied PPO workflow, with `publish` declared to run `after: [update]`."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "workflows" / "embodied_ppo.yaml").read_text()
    old = "    - node: publish\n"
    assert old in text
    wf = load_workflow_text(text.replace(old, old + "      after: [update]\n", 1), "wf.yaml")
    fused = apply_request(wf, "fuse epoch update").workflow
    assert fused.find(("iteration", "publish")).after == ("epoch",)
    split = apply_request(wf, "split-time epoch 2").workflow  # the update loop reads every epoch: after all of them
    assert [i.name for i in split.root.body][:2] == ["epoch@0", "epoch@1"]
