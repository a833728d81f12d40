"""The README's two set-up commands are what CI runs (.ci/run says so in its header): the install line
installs what CI installs, and the test command is CI's test command, character for character. A README
edit that changes one without the other would send a new user down a path nobody checks."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _ci_lines() -> list[str]:
    return [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def _setup_block() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"## Set-up.*?```bash\n(.*?)```", readme, re.S)
    assert block, "README has no set-up block"
    return [line.strip() for line in block.group(1).splitlines() if line.strip() and not line.startswith("#")]


def test_readme_installs_what_ci_installs():
    install = next(line for line in _setup_block() if line.startswith("pip install"))
    readme_args = shlex.split(install.split("&&")[0])[2:]
    ci = next(line for line in _ci_lines() if "pip install" in line and "--upgrade" not in line)
    ci_args = [a for a in shlex.split(ci)[ci.split().index("install") + 1:] if not a.startswith("-q")]
    assert readme_args == ci_args


def test_readme_test_command_is_cis():
    readme_test = next(line for line in _setup_block() if "pytest" in line)
    assert readme_test in _ci_lines()
