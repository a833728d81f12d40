"""Every user error is one positioned message, never a traceback: the table in bad_inputs.py pins the
exact first line (file:line:col: field path: what), and the CLI exits 2 with it on stderr."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rose_dsl import WorkflowError, load_workflow_text

from .bad_inputs import CASES, MINI, mini


@pytest.mark.parametrize(("name", "text", "expected"), CASES, ids=[c[0] for c in CASES])
def test_bad_input_message(name: str, text: str, expected: str) -> None:
    with pytest.raises(WorkflowError) as info:
        load_workflow_text(text, "wf.yaml")
    first_lines = [d.format().splitlines()[0] for d in info.value.diagnostics]
    assert any(line.startswith(expected) or expected in line for line in first_lines), first_lines


def test_cli_exit_code_and_message(tmp_path) -> None:
    bad = tmp_path / "wf.yaml"
    bad.write_text(dict((c[0], c[1]) for c in CASES)["unknown_port"])
    proc = subprocess.run([sys.executable, "-m", "rose_dsl.cli", "validate", str(bad)], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "node 'act' has no output 'actoin'" in proc.stderr
    assert "hint: did you mean 'action'?" in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout


def test_cli_missing_file_exit_2(tmp_path) -> None:
    proc = subprocess.run([sys.executable, "-m", "rose_dsl.cli", "validate", str(tmp_path / "none.yaml")],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "none.yaml' does not exist" in proc.stderr
    assert ":0:0" not in proc.stderr and "invalid workflow" not in proc.stderr  # a usage error, not a position


@pytest.mark.parametrize(("value", "refused"), [("fast", True), ("[1, 2]", True), ("3", False), ("2.5", False)])
def test_set_keeps_a_number_param_a_number(value: str, refused: bool) -> None:
    """Fourth unseen sweep (BUG_2): `--set pi_fixed=fast` on a float param passed `rose validate` and failed
    at the component's construction (exit 3, naming neither --set nor the param). A number param takes a
    number (an int param a float too: it may be read as one); a string param takes anything."""
    from pathlib import Path

    from rose_dsl import load_workflow
    from rose_dsl.cli import set_overrides

    wf = Path(__file__).resolve().parents[2] / "workflows" / "latency_interaction.yaml"
    sets = set_overrides([f"fixed_ms={value}"])
    if not refused:
        assert load_workflow(wf, sets).params["fixed_ms"] == sets["fixed_ms"]
        return
    with pytest.raises(WorkflowError) as info:
        load_workflow(wf, sets)
    assert f"<command line>:0:0: params.fixed_ms: --set fixed_ms={sets['fixed_ms']!r} is not a number: the " \
           "workflow declares fixed_ms: " in info.value.format()


def test_an_expression_too_long_to_read_is_one_message_not_an_internal_error() -> None:
    """User-error sweep (2026-12-05, BUG_9): a 1000-term `${...}` sum was a RecursionError, exit 1."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "workflows" / "latency_interaction.yaml").read_text()
    long = " + ".join(["1"] * 1000)
    with pytest.raises(WorkflowError) as info:
        load_workflow_text(text.replace('count: "${iterations}"', f'count: "${{{long}}}"', 1), "wf.yaml")
    (d,) = info.value.diagnostics
    assert d.path == "iteration.count" and "expression too long: 999 operators" in d.message
    assert len(d.message) < 400  # the expression is not echoed whole


@pytest.mark.parametrize(("old", "new", "expected"), [
    # a param read before it is defined: said so, once (its uses were each "is '${...}', not an integer")
    ('  iterations: 20\n', '  iterations: "${later}"\n  later: 20\n',
     "params.iterations: param 'later' is defined after this one"),
    ('  iterations: 20\n', '  iterations: "${steps} // 0"\n', "params.iterations: division by zero"),
    ('  iterations: 20\n', '  iterations: "${iterations} + 1"\n', "params.iterations: param 'iterations' refers to itself"),
    # a misspelled count: the unknown key with its did-you-mean, not also "a loop needs 'count:'"
    ('  count: "${iterations}"\n', '  cout: "${iterations}"\n', "iteration.cout: unknown key 'cout'"),
])
def test_one_cause_is_one_message(old: str, new: str, expected: str) -> None:
    """User-error sweep (2026-12-05, BUG_5, BUG_6): one cause gave a message at every consequence too."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "workflows" / "latency_interaction.yaml").read_text()
    assert old in text
    with pytest.raises(WorkflowError) as info:
        load_workflow_text(text.replace(old, new, 1), "wf.yaml")
    lines = [d.format().splitlines()[0] for d in info.value.diagnostics]
    assert len(lines) == 1 and expected in lines[0], lines


def test_an_item_with_two_kinds_says_so_and_a_whole_float_count_is_a_count() -> None:
    """User-error sweep (2026-12-05, BUG_7, BUG_18)."""
    with pytest.raises(WorkflowError) as info:
        load_workflow_text(mini("    - {node: p, call: a.f, out: [y], loop: l, count: 2}\n"), "wf.yaml")
    (d,) = info.value.diagnostics
    assert d.message == "an item has both 'node:' and 'loop:'"
    wf = load_workflow_text(MINI.replace("  count: 1\n", "  count: 3.0\n"), "wf.yaml")
    assert wf.root.count == 3


def test_an_unclosed_bracket_names_where_it_was_opened() -> None:
    """User-error sweep (2026-12-05, BUG_3): the parser gives up lines after an unclosed `[`; the message
    also points at the bracket it was inside."""
    text = MINI.replace("out: [y]}", "out: [y}\n    - {node: q, call: a.f, out: [z]}")
    with pytest.raises(WorkflowError) as info:
        load_workflow_text(text, "wf.yaml")
    assert "note: while parsing a flow sequence here" in info.value.format()


def test_a_body_node_named_after_its_loop_says_how_to_read_it() -> None:
    """User-error sweep (2026-12-05, BUG_20): `stack(act.action)` in a step loop's collect was "unknown name
    'act'" though `act` is in the loop; the hint now says how to read it through the loop."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "workflows" / "latency_interaction.yaml").read_text()
    start = text.index("collect:")
    line = text[start:].splitlines()[1]
    broken = text.replace(line, line.split(":")[0] + ': "stack(act.action)"', 1)
    with pytest.raises(WorkflowError) as info:
        load_workflow_text(broken, "wf.yaml")
    assert any("'act' runs inside loop 'step'" in (d.hint or "") and "step[*].act.action" in (d.hint or "")
               for d in info.value.diagnostics), info.value.format()


@pytest.mark.parametrize(("slice_", "expected"), [
    ("[4:2]", "rows 4:2 are no rows (the stop is before the start)"),
    ("[0:${n} // 0]", "a slice bound: division by zero"),
])
def test_static_slice_bounds_are_checked(slice_: str, expected: str) -> None:
    """User-error sweep (2026-12-05, BUG_10): these passed validation, then failed inside a component."""
    text = MINI.replace("    - {node: p, call: a.f, out: [y]}\n",
                        "    - {node: p, call: a.f, out: [y]}\n"
                        f"    - {{node: q, call: a.f, in: {{x: \"p.y{slice_}\"}}, out: [z]}}\n")
    with pytest.raises(WorkflowError) as info:
        load_workflow_text(text, "wf.yaml")
    assert any(expected in d.message for d in info.value.diagnostics), info.value.format()
    ok = MINI.replace("    - {node: p, call: a.f, out: [y]}\n",
                      "    - {node: p, call: a.f, out: [y]}\n    - {node: q, call: a.f, in: {x: \"p.y[0:-1]\"}, out: [z]}\n")
    load_workflow_text(ok, "wf.yaml")  # a negative bound counts from the end


def test_a_slice_past_the_rows_its_producer_declares_is_refused() -> None:
    """User-error sweep (2026-12-05, BUG_10's remainder): `act.action[0:1000]` of a node declaring 64 rows
    along dim 0 ran on the 64 (Python's slicing stops at the end). A bound within the declared rows, a
    negative one, or a producer without a declared size (or batched along another dim) is not refused."""
    def with_slice(batch: str, slice_: str) -> str:
        return MINI.replace("    - {node: p, call: a.f, out: [y]}\n",
                            f"    - {{node: p, call: a.f, out: [y], batch: {batch}}}\n"
                            f"    - {{node: q, call: a.f, in: {{x: \"p.y{slice_}\"}}, out: [z]}}\n")

    with pytest.raises(WorkflowError) as info:
        load_workflow_text(with_slice("{dim: 0, size: 64}", "[0:1000]"), "wf.yaml")
    (d,) = info.value.diagnostics
    assert "row 1000 is past the 64 rows 'p' declares" in d.message and d.pos.line > 0, info.value.format()
    with pytest.raises(WorkflowError, match="row 65 is past"):
        load_workflow_text(with_slice("{dim: 0, size: 64}", "[65:]"), "wf.yaml")
    for batch, slice_ in (("{dim: 0, size: 64}", "[0:64]"), ("{dim: 0, size: 64}", "[32:-1]"),
                          ("{dim: 0}", "[0:1000]"), ("{dim: 1, size: 64}", "[0:1000]")):
        load_workflow_text(with_slice(batch, slice_), "wf.yaml")
