"""Issue 12.6: a plan is checked against its source workflow (the same invocation-level dependencies,
mapped through the plan's groups); hand edits that change what it computes are refused with the
difference, hand edits that keep every dependency are accepted."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rose_dsl import WorkflowError, load_workflow, load_workflow_text
from rose_dsl.serialize import to_yaml
from rose_dsl.transforms import apply_request, compose
from rose_dsl.transforms.plan_check import check_plan_source, plan_differences

PPO = Path(__file__).resolve().parents[2] / "workflows" / "embodied_ppo.yaml"
SMALL = {"num_envs": 4, "steps": 3, "epochs": 2, "denoise_steps": 2}


@pytest.fixture(scope="module")
def ppo():
    return load_workflow(PPO, SMALL)


def _plan(wf, *requests):
    result = apply_request(wf, requests[0])
    for r in requests[1:]:
        result = compose(result, apply_request(result.workflow, r))
    return result.workflow


def _edited(plan, *edits: tuple[str, str]):
    """The plan written out, edited by hand (regex substitutions, each must apply), and read back."""
    text = to_yaml(plan, plan={"source": str(PPO)})
    for pattern, new in edits:
        text, n = re.subn(pattern, new, text, count=1)
        assert n == 1, pattern
    return load_workflow_text(text, "plan.yaml")


@pytest.mark.parametrize("requests", [
    ("split step 2", "interleave step"),
    ("fuse epoch update",),
    ("split-time epoch 2", "split epoch@0.step 2"),
    ("split epoch 2",),
    ("split act 2", "expand act@0"),
    ("expand act", "split step 2"),
    ("split step 2", "fuse epoch update"),
], ids=" + ".join)
def test_plans_that_rose_writes_keep_every_dependency(ppo, requests) -> None:
    assert plan_differences(ppo, _plan(ppo, *requests)) == []


@pytest.mark.parametrize(("edit", "expected"), [
    ((r"state: \{episode: update\}", "state: {episode: read}"), "its state accesses differ from the source's 'env'"),
    ((r"(loop: step\n\s+count:) 3", r"\1 2"), "is not run by the plan"),
    ((r"from: \[act@0, act@1\]", "from: [act@1, act@0]"), "merges its groups out of row order"),
    ((r"in: {obs: step\.obs@0", "in: {obs: step.obs@1"), "does not read obs of the source's"),
    ((r"rows: \[0, 2\]", "rows: [0, 1]"), "not once, nor as row groups that partition its batch"),
    ((r"call: policy\.act", "call: policy.head"), "calls policy.head where the source's 'act' calls policy.act"),
], ids=["state annotation", "loop count", "merge order", "another group's carry", "rows", "method"])
def test_hand_edits_that_change_the_computation_are_refused(ppo, edit, expected) -> None:
    plan = _edited(_plan(ppo, "split step 2"), edit)
    messages = [d.message for d in plan_differences(ppo, plan)]
    assert any(expected in m for m in messages), messages


def test_a_hand_deferral_past_the_budget_says_how_old_the_read_would_be(ppo) -> None:
    """A plan written with `defer sync 1` under budget 1, its deferral raised by hand to 2: refused, saying
    the read would be 2 RL iterations old where the state object allows 1 (as `rose rewrite` says it)."""
    from tests.examples.test_async_learns import with_budget

    wf = with_budget(ppo, "policy", "rollout_weights", 1)
    plan = _plan(wf, "defer sync 1")
    assert plan_differences(wf, plan) == []
    text = to_yaml(plan, plan={"source": str(PPO)})
    text, n = re.subn(r"defer: 1", "defer: 2", text)
    assert n == 1
    messages = [d.message for d in plan_differences(wf, load_workflow_text(text, "plan.yaml"))]
    # (issue 58: a deferral no budget allows is refused before the check unrolls its iterations)
    assert messages == ["'sync' is deferred by 2 RL iterations, more than any state's budget allows (the largest "
                        "max_staleness is 1): what it writes would be read, or left, 2 RL iterations old; give "
                        "`defer:` at most 1"], messages


def test_a_node_run_ahead_by_hand_without_its_producer_names_the_rule(ppo) -> None:
    """`ahead: 1` written by hand on sync, not on publish whose weights it loads: refused at the field,
    naming the producer and the request that marks both (it was a program-order error about iteration
    numbers). A plan that rose writes runs its producers ahead with it (test_ahead_plans.py)."""
    plan = _edited(_plan(ppo, "split step 2"), (r"(  - node: sync\n(?:    .*\n)+)", r"\1    ahead: 1\n"))
    differences = plan_differences(ppo, plan)
    assert [(d.path, d.pos.line > 0) for d in differences] == [("sync.ahead", True)], differences
    assert ("'sync' runs ahead (`ahead: 1`) but reads 'publish' of its own RL iteration, which does not"
            in differences[0].message), differences[0].message
    assert '--do "ahead sync"' in differences[0].message


def test_a_hand_reordering_that_breaks_a_state_dependency_is_refused(ppo) -> None:
    """publish moved (by hand) before the update loop: it would publish the old weights."""
    plan = _edited(_plan(ppo, "split step 2"), (r"(  - loop: update\n(?:    .*\n)+)(  - node: publish\n(?:    .*\n)+)", r"\2\1"))
    messages = [d.message for d in plan_differences(ppo, plan)]
    assert any("publish would see the initial value of 'trainer.weights', where the source's call sees the value "
               "of update[1].sgd" in m for m in messages), messages


def test_a_hand_reordering_that_keeps_every_dependency_is_accepted(ppo) -> None:
    """Interleaving the groups by hand (what `interleave step` does) keeps every dependency."""
    plan = _plan(ppo, "split step 2")
    text = to_yaml(plan)
    act1 = re.search(r"      - node: act@1\n(?:        .*\n)+", text).group(0)
    by_hand = text.replace(act1, "")
    by_hand = by_hand.replace("      - node: env@0\n", act1 + "      - node: env@0\n", 1)
    edited = load_workflow_text(by_hand, "plan.yaml")
    names = [i.name for i in edited.find(("iteration", "epoch", "step")).body]
    assert names[:3] == ["act@0", "act@1", "env@0"]
    assert plan_differences(ppo, edited) == []


def test_a_changed_end_condition_is_refused() -> None:
    source = Path(__file__).resolve().parents[1] / "dsl" / "fixtures" / "until.yaml"
    wf = load_workflow(source)
    edited = load_workflow_text(to_yaml(wf).replace("until: env.done", "until: env.reward"), "plan.yaml")
    messages = [d.message for d in plan_differences(wf, edited)]
    assert any("ends on env.reward where the source's 'step' ends on env.done" in m for m in messages), messages


def test_the_check_runs_where_plans_are_loaded(ppo, tmp_path) -> None:
    """`check_plan_source` finds the source from `plan: source:`, and refuses a plan whose source is gone."""
    plan = _plan(ppo, "split step 2")
    good = tmp_path / "plan.yaml"
    good.write_text(to_yaml(plan, plan={"source": str(PPO)}))
    check_plan_source(load_workflow(good))
    bad = tmp_path / "bad.yaml"
    bad.write_text(good.read_text().replace("state: {episode: update}", "state: {episode: read}", 1))
    with pytest.raises(WorkflowError) as info:
        check_plan_source(load_workflow(bad))
    first = info.value.diagnostics[0].format()
    assert first.startswith(f"{bad}:") and "the plan differs from its source" in first
    lost = tmp_path / "lost.yaml"
    lost.write_text(to_yaml(plan, plan={"source": "nowhere/none.yaml"}))
    with pytest.raises(WorkflowError, match="the plan's source workflow 'nowhere/none.yaml' is not found"):
        check_plan_source(load_workflow(lost))
    check_plan_source(load_workflow(lost), PPO)  # the source given explicitly (rose execute SOURCE --plan PLAN)


def test_a_plan_of_another_workflow_says_so_and_a_plan_written_with_other_params_is_noted(ppo, tmp_path) -> None:
    """Unseen sweep (2026-12-05): a plan of workflow x5 given to x2 was reported as `<command line>:0:0: --set
    names an undefined param 'eval_steps'` (no --set was given); now the plan's `name:` line says whose plan
    it is. A plan written with other params than its source file's runs with them: they are returned (the
    CLI prints a note), and a param the source does not define is refused at the plan's `params:`."""
    plan = _plan(ppo, "split step 2")
    other = tmp_path / "other.yaml"
    other.write_text(PPO.read_text().replace("name: ", "name: other-", 1))
    mine = tmp_path / "plan.yaml"
    mine.write_text(to_yaml(plan, plan={"source": str(PPO)}))
    with pytest.raises(WorkflowError) as info:
        check_plan_source(load_workflow(mine), other)
    first = info.value.diagnostics[0].format().splitlines()[0]
    assert first.startswith(f"{mine}:") and f"the plan was made from {PPO} (workflow '{ppo.name}'), not from {other}" in first
    assert check_plan_source(load_workflow(mine)) == {
        name: (value, load_workflow(PPO).params[name]) for name, value in ppo.params.items()
        if load_workflow(PPO).params[name] != value}
    extra = tmp_path / "extra.yaml"
    text = mine.read_text()
    extra.write_text(text.replace("params: {", "params: {bogus: 1, ", 1) if "params: {" in text else
                     text.replace("params:\n", "params:\n  bogus: 1\n", 1))
    with pytest.raises(WorkflowError, match="the plan sets param 'bogus', which its source .* does not define"):
        check_plan_source(load_workflow(extra))


def test_a_plan_cut_short_is_refused_with_its_source_and_without_it(ppo, tmp_path) -> None:
    """Fourth unseen sweep (BUG_6, BUG_1): a plan cut after its first temporal group lost the `plan:` block
    (written last then) and loaded as an ordinary workflow: `rose validate` said valid, `rose execute` trained
    half a rollout with no update, exit 0. Now the block comes first; a file with plan-only constructs and no
    block is refused at the first of them; and checked against its source, each missing node is one message
    shown with the source's own line (it was shown with the plan's line at the same number)."""
    plan = _plan(ppo, "split-time epoch 2", "interleave epoch")
    text = to_yaml(plan, plan={"source": str(PPO)})
    assert text.index("\nplan:") < text.index("\ncomponents:")  # the block first: a cut keeps it
    lines = text.splitlines(keepends=True)
    cut = next(i for i, line in enumerate(lines) if "epoch@1" in line and "loop:" in line)
    headless = tmp_path / "headless.yaml"  # cut there, and without its `plan:` block
    body = "".join(lines[:cut])
    start = body.index("\nplan:")
    end = body.index("\nparams:")
    headless.write_text(body[:start] + body[end:])
    with pytest.raises(WorkflowError) as info:
        check_plan_source(load_workflow(headless))
    (d,) = info.value.diagnostics
    assert "copy_of" in d.path and "a plan-only construct in a file without a `plan: source:` block" in d.message
    truncated = tmp_path / "truncated.yaml"
    truncated.write_text("".join(lines[:cut]))
    with pytest.raises(WorkflowError) as info:
        check_plan_source(load_workflow(truncated))
    missing = [d for d in info.value.diagnostics if "is not run by the plan" in d.message]
    paths = [d.path for d in missing]
    assert len(paths) == len(set(paths)) and "update.sgd" in paths  # one message per source node
    source_lines = PPO.read_text().splitlines()
    for d in missing:
        assert d.pos.file == str(PPO)
        shown = info.value.format().split(f"{d.pos}: ", 1)[1].splitlines()[1]
        assert shown == f"  | {source_lines[d.pos.line - 1]}"  # the source's line, not the plan's


WORKFLOWS = sorted((Path(__file__).resolve().parents[2] / "workflows").glob("*.yaml"))


@pytest.mark.parametrize("path", WORKFLOWS, ids=[p.name for p in WORKFLOWS])
def test_every_shipped_workflow_is_a_workflow_not_a_headless_plan(path: Path) -> None:
    """The hand-pipelined workflows write row slices and `merge:` items themselves: those are not refused as
    plan-only constructs (they were, for a while, in the fix for plans cut short)."""
    check_plan_source(load_workflow(path))


@pytest.mark.parametrize(("edit", "key"), [
    ((r"(- loop: epoch[^\n]*\n)", r"\1      interleave: true\n"), "interleave"),
    ((r"(- node: publish\n)", r"\1      group: 3\n"), "group"),
    ((r"(- node: publish\n)", r"\1      expand: true\n"), "expand"),
])
def test_plan_only_fields_in_a_file_without_a_plan_block_are_refused(tmp_path, edit, key) -> None:
    """User-error sweep (2026-12-05, BUG_8): these fields were accepted in a plain workflow, exit 0."""
    text, n = re.subn(edit[0], edit[1], PPO.read_text(), count=1)
    assert n == 1
    f = tmp_path / "w.yaml"
    f.write_text(text)
    with pytest.raises(WorkflowError) as info:
        check_plan_source(load_workflow(f))
    (d,) = info.value.diagnostics
    assert d.path.endswith(f".{key}") and "which rose writes only into plans" in d.message


def test_row_groups_that_do_not_partition_are_one_message_at_the_rows_to_fix(ppo) -> None:
    """User-error sweep (2026-12-05, BUG_15): one hand edit of a group's rows gave a message per invocation
    (cut at 12), all at the first group's line; now one, at the `rows:` of the group that breaks it."""
    plan = _edited(_plan(ppo, "split step 2"), (r"rows: \[2, 4\]", "rows: [1, 4]"))
    diffs = plan_differences(ppo, plan)
    assert len(diffs) == 1 and "act@1" in diffs[0].path and diffs[0].path.endswith(".rows"), diffs
    assert "partition its batch of 4" in diffs[0].message and "more calls of it" in diffs[0].message


def test_a_loop_fused_with_itself_is_refused_as_such(ppo) -> None:
    """User-error sweep (2026-12-05, BUG_14): `fuse epoch epoch` was refused as a broken dependency naming
    `step_2`, a loop that exists only in the rewriter's scratch graph."""
    from rose_dsl.transforms import Refused

    with pytest.raises(Refused, match="a loop cannot be fused with itself"):
        apply_request(ppo, "fuse epoch epoch")


@pytest.mark.parametrize(("edit", "expected"), [
    ((r"init: 'reset\.obs\[2:4\]'", "init: 'reset.obs[0:2]'"),
     "carried value 'obs@1' starts with rows [0, 2] (reset.obs[0:2]) and goes on with rows [2, 4] (env@1.obs)"),
    ((r"init: 'reset\.obs\[2:4\]'", "init: 'cat(reset.obs[0:1], reset.obs[3:4])'"),
     "carried value 'obs@1' starts with rows [0, 1] and [3, 4] (cat(reset.obs[0:1], reset.obs[3:4])) and goes on "
     "with rows [2, 4] (env@1.obs)"),
], ids=["carry init", "carry init, cat"])
def test_a_row_group_that_reads_other_rows_is_refused(ppo, edit, expected) -> None:
    """Issue 42: a plan hand-edited to read other rows (`obs@1: {init: 'reset.obs[32:64]'}` -> `[0:32]`) kept every
    dependency the check tracked (per row group) and trained the second group on the first group's rows."""
    plan = _edited(_plan(ppo, "split step 2"), edit)
    messages = [d.message for d in plan_differences(ppo, plan)]
    assert any(expected in m for m in messages), messages


def _plan_file(ppo, tmp_path: Path, source: str) -> Path:
    path = tmp_path / "plans" / "plan.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(to_yaml(_plan(ppo, "split step 2"), plan={"source": source}))
    return path


@pytest.mark.parametrize(("source", "why"), [
    ("/proc/self/environ", "is not a workflow file (.yaml/.yml)"),
    ("../secret.txt", "is not a workflow file (.yaml/.yml)"),
    ("../secrets.yaml", "is not a valid workflow (4 problems)"),
])
def test_a_plan_source_that_is_no_workflow_is_refused_without_its_content(ppo, tmp_path, monkeypatch, source,
                                                                          why) -> None:
    """Issue 42: `plan: source: /proc/self/environ` printed the environment's values in the error's excerpt,
    a secrets file its lines. The source is refused, naming the path only."""
    monkeypatch.setenv("ROSE_TEST_SECRET", "hunter2")
    (tmp_path / "secret.txt").write_text("password: hunter2\n")
    (tmp_path / "secrets.yaml").write_text("rose: 1\ntoken: hunter2\n")
    plan = _plan_file(ppo, tmp_path, source)
    with pytest.raises(WorkflowError) as info:
        check_plan_source(load_workflow(plan))
    text = info.value.format()
    assert "hunter2" not in text and why in text and text.startswith(f"{plan}:"), text


def test_a_plan_source_is_found_relative_to_the_plan_from_any_directory(ppo, tmp_path, monkeypatch) -> None:
    """`rose rewrite -o` records the source relative to the plan; a plan recorded relative to the working
    directory it was written in (before issue 42) is still found from there."""
    (tmp_path / "wf.yaml").write_text(PPO.read_text())
    plan = _plan_file(ppo, tmp_path, "../wf.yaml")
    monkeypatch.chdir("/")
    check_plan_source(load_workflow(plan, SMALL))
    monkeypatch.chdir(tmp_path)
    check_plan_source(load_workflow(_plan_file(ppo, tmp_path, "wf.yaml"), SMALL))
    from rose_dsl.transforms.plan_check import recorded_source

    assert recorded_source(tmp_path / "wf.yaml", tmp_path / "plans" / "p.yaml") == "../wf.yaml"
    assert recorded_source("wf.yaml", None) == "wf.yaml"
