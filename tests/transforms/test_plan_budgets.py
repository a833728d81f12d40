"""Issue 58: every file is checked against its own budgets, a plan may not raise its source's, and a `defer:`
no budget allows is refused before anything is unrolled.

* A workflow file with `defer:`/`ahead:` and no `plan:` block (or `source: ""`) is proved against itself run
  synchronously, wherever it is loaded (`check_plan_source`, which `rose validate`, `execute`, `compare`
  and `optimize` all call through `load_or_exit`): it said "valid ... (lag 1, max_staleness 0)" and ran.
* One rule for budgets in plans: a plan's params may not raise a `max_staleness` of its source as it runs
  (`--set stale=1` when the plan was written, `params: stale: 5` by hand), as a hand edit of
  `max_staleness` may not; `rose execute SOURCE --set stale=1 --plan PLAN` runs the source with that budget.
* `ahead` of a call that reads no state is legal at budget 0: it computes exactly what the declared workflow
  computes (proved lag 0 on every read).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from rose_dsl import WorkflowError, load_workflow, load_workflow_text
from rose_dsl.analysis import read_lags
from rose_dsl.cli import app
from rose_dsl.transforms import Refused, apply, check_plan_source
from rose_dsl.versions import version_proof
from tests.transforms.test_async_acceptance import PARAM_BUDGET

FIXTURES = Path(__file__).resolve().parents[1] / "dsl" / "fixtures"


def _cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    return result.exit_code, result.output


def _with_defer(text: str, node: str, k: int) -> str:
    """`text` with `defer: k` on the node written `{node: NAME, ...}` (a hand edit)."""
    return text.replace(f"{{node: {node}, ", f"{{node: {node}, defer: {k}, ")


@pytest.mark.parametrize("plan_block", ["", "plan: {source: \"\"}\n"])
def test_a_file_that_defers_without_a_source_is_proved_against_its_own_budget(tmp_path: Path, plan_block: str) -> None:
    text = (FIXTURES / "async_relay_budget0.yaml").read_text()
    f = tmp_path / "own.yaml"
    f.write_text(plan_block + _with_defer(text, "sync1", 1))
    with pytest.raises(WorkflowError) as exc:
        check_plan_source(load_workflow(f))
    message = exc.value.diagnostics[0].message
    assert "records no `plan: source:`, so it is proved against its own budgets" in message
    assert "act would read 'actor.weights' 1 update of 'learner.weights' old: actor.weights <- sync2 <- " \
           "relay.weights <- sync1 <- learner.weights: lag 1 > max_staleness 0" in message
    # the same file under budgets that allow it loads; `rose validate` says which it is
    f.write_text(plan_block + _with_defer(text.replace("actor_stale: 0", "actor_stale: 1"), "sync1", 1))
    assert check_plan_source(load_workflow(f)) == {}
    f.write_text(plan_block + _with_defer(text, "sync1", 1))
    code, out = _cli("validate", str(f))
    line = 14 + plan_block.count("\n")  # the actor's read
    assert code == 2 and f"{f.name}:{line}:71: act.state: the file defers" in out, out


def test_a_plan_may_not_raise_its_source_budget(tmp_path: Path) -> None:
    source, plan = tmp_path / "src.yaml", tmp_path / "plan.yaml"
    source.write_text(PARAM_BUDGET)
    code, out = _cli("rewrite", str(source), "--set", "stale=1", "--do", "defer sync 1", "-o", str(plan))
    assert code == 0, out
    code, out = _cli("validate", str(plan))
    assert code == 2
    assert "plan.yaml:8:10: params.stale: the plan raises the budget of its source" in out
    assert "'gen.weights' has max_staleness 1 in the plan and 0 in the source as it runs" in out
    assert "re-derive the plan from a source whose budget allows it" in out
    # the source run with the budget the plan was written against: accepted (as `rose execute SOURCE --set
    # stale=1 --plan PLAN` and `rose compare SOURCE --set stale=1 --plan PLAN` load it)
    assert check_plan_source(load_workflow(plan), source, {"stale": 1}) == {"stale": (1, 0)}  # (noted, not refused)
    # a hand edit that raises it further, with a deferral to match, is refused the same way
    plan.write_text(plan.read_text().replace("stale: 1", "stale: 3").replace("defer: 1", "defer: 3"))
    with pytest.raises(WorkflowError) as exc:
        check_plan_source(load_workflow(plan), source, {"stale": 1})
    assert "'gen.weights' has max_staleness 3 in the plan and 1 in the source as it runs" in exc.value.diagnostics[0].message


@pytest.mark.parametrize("k", [10 ** 4, 10 ** 12])
def test_a_defer_no_budget_allows_is_refused_before_the_check_unrolls(tmp_path: Path, k: int) -> None:
    """`defer: 10000` in a hand-edited plan took minutes to refuse (the check unrolled 1 + K RL iterations)."""
    source = FIXTURES / "async_readers.yaml"
    code, out = _cli("rewrite", str(source), "--do", "defer sync 1", "-o", str(tmp_path / "p.yaml"))
    assert code == 0, out
    edited = tmp_path / "edited.yaml"
    edited.write_text((tmp_path / "p.yaml").read_text().replace("defer: 1", f"defer: {k}"))
    code, out = _cli("validate", str(edited))
    assert code == 2
    assert "edited.yaml:52:12: sync.defer: the plan differs from its source" in out
    assert f"'sync' is deferred by {k} RL iterations, more than any state's budget allows (the largest " \
           "max_staleness is 1)" in out
    assert "give `defer:` at most 1" in out
    refused = apply(load_workflow(source), f"defer sync {k}")
    assert isinstance(refused, Refused) and "at most 4" in refused.reason  # the rewrite: below the count


AHEAD_NO_STATE = PARAM_BUDGET.replace(
    "    - {node: rollout,",
    "    - {node: noise, call: scorer.score, in: {rollouts: iteration.i}, out: [score]}\n    - {node: rollout,").replace(
    "  learner: {impl", "  scorer: {impl: \"tests.async_fakes:Scorer\"}\n  learner: {impl")


def test_ahead_of_a_call_that_reads_no_state_is_legal_at_budget_zero() -> None:
    """The docs' rule "budget 0 computes what the declared workflow computes" holds: such a call's values are
    the declared ones (its inputs are its own iteration's), so every read's proved lag is 0."""
    wf = load_workflow_text(AHEAD_NO_STATE, "noise.yaml")
    assert all(s.max_staleness == 0 for s in wf.state_objects().values())
    plan = apply(wf, "ahead noise")
    assert not isinstance(plan, Refused), plan
    assert set(read_lags(plan.workflow).values()) == {0}
    assert {p.lag for p in version_proof(plan.workflow).values()} == {0}
    assert isinstance(apply(wf, "ahead rollout"), Refused)  # a read of the budget-0 weights may not move


def test_execute_with_a_plan_takes_set_as_the_source_params_and_refuses_another_value(tmp_path: Path) -> None:
    """`rose execute SOURCE --set stale=1 --plan PLAN`: the source runs with the budget the plan was written
    against (accepted); `--set stale=2` would not be what the plan runs with: refused, exit 2, before running."""
    from rose_cli.main import app as rose_app

    source, plan = tmp_path / "src.yaml", tmp_path / "plan.yaml"
    source.write_text(PARAM_BUDGET)
    assert _cli("rewrite", str(source), "--set", "stale=1", "--do", "defer sync 1", "-o", str(plan))[0] == 0
    result = CliRunner().invoke(rose_app, ["execute", str(source), "--set", "stale=2", "--plan", str(plan),
                                           "--allow-module", "tests"])
    assert result.exit_code == 2
    assert "--set stale=... does not apply to a plan" in result.output and "(stale=1)" in result.output
    result = CliRunner().invoke(rose_app, ["execute", str(source), "--plan", str(plan), "--allow-module", "tests"])
    assert result.exit_code == 2 and "the plan raises the budget of its source" in result.output
