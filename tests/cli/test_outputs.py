"""One convention for every file a user names for rose to write (issue 42): an existing file is replaced
only with `--overwrite`; without it the command exits 2 with the fix and leaves the file as it was, before
any work. Each writer of `rose` is listed here: `graph -o`, `rewrite -o`, `optimize -o/--report`,
`compare --json/--runs`, and the run directories of `execute/optimize/compare --out` (their own rules,
`interpreter/rundir.py`, tested in test_run_dir.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from rose_cli.main import app

from .clirun import ROOT

PPO = str(ROOT / "workflows" / "embodied_ppo.yaml")
LATENCY = str(ROOT / "workflows" / "latency_interaction.yaml")
MINE = "a file of the user's own\n"


def _invoke(args: list[str]) -> tuple[int, str]:
    result = CliRunner().invoke(app, args)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.output


# (the command, with {out} the file it would write); each is refused before it loads a workflow or starts a
# process, so these run in milliseconds
WRITERS = [
    ["graph", PPO, "-o", "{out}"],
    ["rewrite", PPO, "--do", "split epoch.step 2", "-o", "{out}"],
    ["optimize", LATENCY, "-o", "{out}"],
    ["compare", LATENCY, "--json", "{out}"],
]


@pytest.mark.parametrize("command", WRITERS, ids=lambda c: c[0])
def test_an_existing_output_is_refused_without_overwrite(tmp_path: Path, command: list[str]) -> None:
    target = tmp_path / "mine.txt"
    target.write_text(MINE)
    code, text = _invoke([a.replace("{out}", str(target)) for a in command])
    assert code == 2, text
    assert str(target) in text and "already exist" in text and "--overwrite" in text, text
    assert "Traceback" not in text
    assert target.read_text() == MINE


@pytest.mark.parametrize("command", WRITERS[:2], ids=lambda c: c[0])
def test_overwrite_replaces_it(tmp_path: Path, command: list[str]) -> None:
    target = tmp_path / "mine.txt"
    target.write_text(MINE)
    code, text = _invoke([*(a.replace("{out}", str(target)) for a in command), "--overwrite"])
    assert code == 0, text
    assert target.read_text() != MINE and f"wrote {target}" in text


def test_a_new_output_needs_no_flag(tmp_path: Path) -> None:
    target = tmp_path / "plan.yaml"
    code, text = _invoke(["rewrite", PPO, "--do", "split epoch.step 2", "-o", str(target)])
    assert code == 0 and target.exists(), text


def test_rewrite_never_writes_over_its_own_workflow(tmp_path: Path) -> None:
    wf = tmp_path / "wf.yaml"
    wf.write_text(Path(PPO).read_text())
    code, text = _invoke(["rewrite", str(wf), "--do", "split epoch.step 2", "-o", str(wf), "--overwrite"])
    assert code == 2 and "is the workflow itself" in text, text
    assert wf.read_text() == Path(PPO).read_text()


def test_a_directory_is_not_an_output_file(tmp_path: Path) -> None:
    code, text = _invoke(["graph", PPO, "-o", str(tmp_path), "--overwrite"])
    assert code == 2 and "is a directory" in text and "Traceback" not in text, text
