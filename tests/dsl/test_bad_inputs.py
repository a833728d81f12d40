"""Every user error is one positioned message, never a traceback: the table in bad_inputs.py pins the
exact first line (file:line:col: field path: what), and the CLI exits 2 with it on stderr."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rose_dsl import WorkflowError, load_workflow_text

from .bad_inputs import CASES


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
