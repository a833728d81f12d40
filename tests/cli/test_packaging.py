"""Packaging (issue 12 items 11, 12): the wheel holds the schema and no generic top-level package, and,
installed outside the source tree, `rose --version`, `rose validate` (good and bad files), the user's own
`examples` package and the repository's example components all work. `.ci/wheel_check` does it; CI also
runs it on its own."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from .clirun import ROOT


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(),
                    reason="needs a git checkout (the wheel is built from the tracked files)")
def test_the_installed_wheel_works_outside_the_source_tree() -> None:
    proc = subprocess.run(["bash", str(ROOT / ".ci" / "wheel_check")], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "wheel check passed" in proc.stdout
