"""Values typed on the command line (`--set NAME=VALUE`, `--layout NAME=V1,V2`) are the user's input:
whatever they hold, a mistake is one message and exit 2, never PyYAML's exception as an internal error
(exit 1). Issue 42: `[unclosed`, `*x`, a python tag and a 5,000-digit number were exit 1; `1e-4` was
refused as "not a number" (YAML 1.1); `.nan` and `.inf` validated and failed later."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from rose_dsl import WorkflowError, load_workflow
from rose_dsl.cli import app, set_overrides
from rose_dsl.optimizer.layouts import parse_layout_option

from .clirun import ROOT

PPO = ROOT / "workflows" / "embodied_ppo.yaml"
BIG = "9" * 5000


def validate(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["validate", *args])
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    return result.exit_code, result.output


@pytest.mark.parametrize(("value", "expected"), [
    ("num_envs=[unclosed", "--set num_envs='[unclosed': not valid YAML: did not find expected ',' or ']'"),
    ("seed=*x", "--set seed='*x': not valid YAML: found undefined alias"),
    ('seed=!!python/object/apply:os.system ["echo hi"]', "not valid YAML: unknown tag"),
    ("seed=!!binary aGk=", "YAML tags are not supported here (bytes)"),
    ("seed=@x", "not valid YAML: found character that cannot start any token"),
    (f"num_envs={BIG}", "an integer of 5000 digits is too large"),
    (f"num_envs={'9' * 4000}", "--set num_envs: an integer of 4000 digits is too large"),
    ("lr=.nan", "--set lr: nan is not a finite number"),
    ("lr=.inf", "--set lr: inf is not a finite number"),
    ("lr=-1e400", "--set lr: -inf is not a finite number"),
], ids=lambda v: v[:30])
def test_a_bad_set_value_is_one_message_and_exit_2(value: str, expected: str) -> None:
    code, text = validate(str(PPO), "--set", value)
    assert code == 2, text
    assert expected in text and "internal error" not in text
    assert len(text) < 1000  # the value is not echoed whole


def test_a_number_in_exponent_form_is_a_number() -> None:
    """YAML 1.1 reads `1e-4` as a string (it wants `1.0e-4`); rose reads YAML 1.2's floats."""
    assert set_overrides(["lr=1e-4", "x=2E3", "y=-.5e1"]) == {"lr": 1e-4, "x": 2000.0, "y": -5.0}
    assert load_workflow(PPO, set_overrides(["lr=1e-4"])).params["lr"] == 1e-4
    assert load_workflow(PPO, set_overrides(["lr=1e-4"])).components["trainer"].args["lr"] == 1e-4


@pytest.mark.parametrize(("old", "new", "expected"), [
    ("  lr: 0.001\n", "  lr: .nan\n", "params.lr: nan is not a finite number"),
    ("  steps: 25 ", f"  steps: {BIG} ", "an integer of 5000 digits is too large"),
    ("  steps: 25 ", f'  steps: "${{{BIG}}}" ', "integer literal of 5000 digits is too large"),
    ("  steps: 25 ", f'  steps: "${{1 + {BIG}}}" ', "integer literal of 5000 digits is too large"),
], ids=lambda v: v[:30])
def test_a_workflow_file_refuses_the_same_numbers(tmp_path: Path, old: str, new: str, expected: str) -> None:
    text = PPO.read_text()
    assert old in text
    (tmp_path / "wf.yaml").write_text(text.replace(old, new, 1))
    code, out = validate(str(tmp_path / "wf.yaml"))
    assert code == 2 and expected in out and "internal error" not in out, out
    assert len(out) < 2000


@pytest.mark.parametrize("option", ["sim_replicas=1,[2", "sim_replicas=*a", "sim_replicas=2,!!binary aGk=",
                                    f"sim_replicas={BIG}"], ids=lambda v: v[:30])
def test_a_bad_layout_value_is_a_value_error(option: str) -> None:
    with pytest.raises(ValueError, match="--layout sim_replicas"):
        parse_layout_option(option)


def test_a_bad_layout_value_exits_2() -> None:
    result = CliRunner().invoke(app, ["rewrite", str(PPO), "--layout", "sim_replicas=1,[2"])
    assert result.exit_code == 2 and "not valid YAML" in result.output, result.output


TEXT = (st.text(st.characters(codec="utf-8"), max_size=40) | st.sampled_from(
    ["[", "{", "*", "&a", "!!python/name:os.system", "!!int x", "!!float", "? a", "- -", "|", ">", "'", '"',
     "1e400", ".nan", "0x" + "f" * 40, "9" * 4400, "%YAML 1.1", "---", "...", "a: b: c", "\t", "\x1b[2J"])
    | st.lists(st.sampled_from(["[", "]", "{", "}", ",", ":", " ", "*", "&", "!", "a", "1", "'", '"', "#", "-"]),
               max_size=12).map("".join))


@settings(max_examples=300, deadline=None)
@given(TEXT)
def test_any_set_value_is_taken_or_refused_as_the_users_mistake(raw: str) -> None:
    """Fuzz: `--set` with any text is a value or a WorkflowError (exit 2), never another exception."""
    try:
        sets = set_overrides([f"num_envs={raw}", f"lr={raw}", f"seed={raw}"])
        load_workflow(PPO, sets)
    except WorkflowError as exc:
        assert exc.diagnostics and all("\x1b" not in d.format() for d in exc.diagnostics)


@settings(max_examples=300, deadline=None)
@given(TEXT, TEXT)
def test_any_layout_value_is_taken_or_refused_as_the_users_mistake(a: str, b: str) -> None:
    try:
        parse_layout_option(f"sim_replicas={a},{b}")
    except ValueError as exc:
        assert "\x1b" not in str(exc)


def test_what_rose_prints_shows_terminal_controls_escaped(tmp_path: Path) -> None:
    """Issue 42: a name with `\\e[2J` (clear the screen) or an RTL override was printed raw: the terminal
    obeyed it. The consoles every command prints through escape them (`errors.printable`)."""
    wf = tmp_path / "wf.yaml"
    wf.write_text(PPO.read_text().replace("name: embodied-ppo", 'name: "ppo\\e[2J\\u202e"', 1))
    code, text = validate(str(wf))
    assert code == 0, text
    assert "ppo\\x1b[2J\\u202e" in text and "\x1b" not in text and "\u202e" not in text
    code, text = validate(str(PPO), "--set", "nu\u202em_envs=1")
    assert code == 2 and "nu\\u202em_envs" in text and "\u202e" not in text, text


def test_a_set_on_a_plan_file_is_refused_at_its_param_not_ignored(tmp_path: Path) -> None:
    """A plan holds its params resolved: `rose optimize PLAN --set iterations=100` trained the plan's 4
    iterations, then advised raising the iteration count. Every command that loads the plan refuses the
    `--set` at the plan's `params:` entry, with the fix; without `--set` the plan still loads."""
    plan = tmp_path / "plan.yaml"
    wf = ROOT / "workflows" / "latency_interaction.yaml"
    result = CliRunner().invoke(app, ["rewrite", str(wf), "--set", "iterations=4", "--do", "split-time epoch 2",
                                      "-o", str(plan)])
    assert result.exit_code == 0, result.output
    line = next(i for i, text in enumerate(plan.read_text().splitlines(), 1) if text.strip() == "iterations: 4")
    code, out = validate(str(plan), "--set", "iterations=100")
    assert code == 2, out
    assert f"plan.yaml:{line}:3: params.iterations: --set iterations=... does not apply to a plan" in out
    assert "rose rewrite SOURCE --set NAME=VALUE" in out
    assert validate(str(plan))[0] == 0
