"""Dependencies point one way (issue 13): the language (`rose_dsl`) never imports the runtime
(`interpreter`) or the command on top (`rose_cli`); the runtime never imports the command; checking a
workflow with `rose validate` starts no runtime (no Ray, no torch)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from .clirun import ROOT

# package -> packages it must never import (statically, anywhere in a file, or at run time)
FORBIDDEN = {"rose_dsl": ("interpreter", "rose_cli"), "interpreter": ("rose_cli",)}


def _imports(path: Path) -> list[tuple[int, str]]:
    """Every module an import statement names (module level or inside functions), with its line."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module))
    return out


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_no_import_statement_points_up(package) -> None:
    bad = [f"{p.relative_to(ROOT)}:{line}: imports {name}"
           for p in sorted((ROOT / package).rglob("*.py"))
           for line, name in _imports(p) if name.split(".")[0] in FORBIDDEN[package]]
    assert not bad, "\n".join(bad)


_PROBE = """
import importlib, json, pkgutil, sys
import {package}
for m in pkgutil.walk_packages({package}.__path__, "{package}."):
    importlib.import_module(m.name)
print(json.dumps(sorted({{n.split(".")[0] for n in sys.modules}})))
"""


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_importing_every_module_loads_nothing_above(package) -> None:
    proc = subprocess.run([sys.executable, "-c", _PROBE.format(package=package)], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr
    loaded = set(json.loads(proc.stdout.splitlines()[-1]))
    assert not loaded & set(FORBIDDEN[package]), loaded & set(FORBIDDEN[package])


def test_validate_starts_no_runtime() -> None:
    code = ("import sys; from typer.testing import CliRunner; from rose_cli.main import app; "
            "r = CliRunner().invoke(app, ['validate', 'workflows/embodied_ppo.yaml']); assert r.exit_code == 0, r.output; "
            "print(sorted(m for m in ('interpreter', 'ray', 'torch') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[]"
