"""`rose init DIR` (issue 42): a user who installed rose runs the shipped workflows from any directory. After
a non-editable install every shipped workflow failed outside the source tree (`no module named 'examples'`,
hinted "did you mean 'example' or 'tempfile'?"); `rose init` writes a workflow and the example components it
imports into DIR, from the copies the wheel carries (`rose_cli/starter/`)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from rose_cli.init import DEFAULT_WORKFLOW, starter_workflows
from rose_cli.main import app

from .clirun import ROOT


def test_init_writes_the_workflow_and_the_subpackages_it_imports(tmp_path: Path) -> None:
    r = CliRunner().invoke(app, ["init", str(tmp_path / "proj")])
    assert r.exit_code == 0, r.output
    proj = tmp_path / "proj"
    assert (proj / "workflow.yaml").read_text() == (ROOT / "workflows" / f"{DEFAULT_WORKFLOW}.yaml").read_text()
    assert (proj / "examples" / "embodied" / "ppo.py").read_text() == (ROOT / "examples/embodied/ppo.py").read_text()
    assert (proj / "examples" / "__init__.py").is_file() and not (proj / "examples" / "llm").exists()
    # what is there is the user's: not written over unless asked
    (proj / "workflow.yaml").write_text("mine")
    r = CliRunner().invoke(app, ["init", str(proj), "--workflow", "latency_chain"])
    assert r.exit_code == 2 and "already holds workflow.yaml" in r.output and "--overwrite" in r.output
    assert (proj / "workflow.yaml").read_text() == "mine"
    r = CliRunner().invoke(app, ["init", str(proj), "--workflow", "latency_chain.yaml", "--overwrite"])
    assert r.exit_code == 0 and (proj / "examples" / "bench" / "latency.py").is_file(), r.output


def test_init_names_the_shipped_workflows() -> None:
    r = CliRunner().invoke(app, ["init", "x", "--workflow", "latency_chian"])
    assert r.exit_code == 2 and "no such shipped workflow (did you mean 'latency_chain'" in r.output, r.output
    r = CliRunner().invoke(app, ["init", "--list"])  # (no DIR needed: the README shows it so, issue 59)
    assert r.exit_code == 0, r.output
    lines = dict(line.split(maxsplit=1) for line in r.output.splitlines())  # one line each: name, description
    assert set(lines) == {p.stem for p in (ROOT / "workflows").glob("*.yaml")}
    assert lines["embodied_ppo"] == "Embodied PPO, as declared"  # its opening comment's first sentence
    assert set(starter_workflows()) == {p.stem for p in (ROOT / "workflows").glob("*.yaml")}
    r = CliRunner().invoke(app, ["init"])
    assert r.exit_code == 2 and "missing DIR" in r.output and "Traceback" not in r.output


def test_init_hints_at_out_and_never_writes_through_a_link(tmp_path: Path) -> None:
    """The hint had no --out (a Ctrl-C then kept nothing); --overwrite wrote through a linked workflow.yaml
    into the file it pointed at (issue 59)."""
    proj = tmp_path / "proj"
    r = CliRunner().invoke(app, ["init", str(proj), "--workflow", "latency_chain"])
    assert r.exit_code == 0 and "rose execute workflow.yaml --out runs/first" in r.output, r.output
    victim = tmp_path / "mine.yaml"
    victim.write_text("mine")
    (proj / "workflow.yaml").unlink()
    (proj / "workflow.yaml").symlink_to(victim)
    r = CliRunner().invoke(app, ["init", str(proj), "--workflow", "latency_chain", "--overwrite"])
    assert r.exit_code == 2 and "workflow.yaml is a symbolic link" in r.output, r.output
    assert victim.read_text() == "mine"


def _installed(tmp_path: Path) -> dict[str, str]:
    """An environment that sees rose as an installed copy (its three packages, no `examples`, no checkout)."""
    site = tmp_path / "site"
    for package in ("rose_dsl", "interpreter", "rose_cli"):
        shutil.copytree(ROOT / package, site / package, ignore=shutil.ignore_patterns("__pycache__"))
    return {**os.environ, "PYTHONPATH": str(site)}


def _rose(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rose_cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def test_a_shipped_workflow_runs_from_any_directory_after_init(tmp_path: Path) -> None:
    env = _installed(tmp_path)
    shutil.copy(ROOT / "workflows" / "latency_chain.yaml", tmp_path / "chain.yaml")
    before = _rose(env, tmp_path, "validate", "--import", "chain.yaml")
    assert before.returncode == 2, before.stderr
    assert "no module named 'examples'" in before.stderr and "rose init DIR --workflow NAME" in before.stderr
    assert "did you mean" not in before.stderr  # not a stray module of some dependency
    r = _rose(env, tmp_path, "init", "proj", "--workflow", "latency_chain")
    assert r.returncode == 0, r.stderr
    r = _rose(env, tmp_path / "proj", "validate", "--import", "workflow.yaml")
    assert r.returncode == 0, r.stderr
    r = _rose(env, tmp_path / "proj", "execute", "workflow.yaml", "-n", "1", "--set", "rows=4", "-q")
    assert r.returncode == 0, r.stdout + r.stderr
