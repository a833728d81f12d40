"""Dependencies point one way (issue 13): the language (`rose_dsl`) never imports the runtime
(`interpreter`) or the command on top (`rose_cli`); the runtime never imports the command; checking a
workflow with `rose validate` starts no runtime (no Ray, no torch)."""

from __future__ import annotations

import ast
import json
import re
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


# The optimizer's search and the runtime that measures for it meet only in protocols (issue 43): the search
# (`rose_dsl.optimizer`) names no runtime module, not even in a string (a `module:Class` it would hand to
# the runtime, a path in a docstring), and the runtime (`interpreter`) imports nothing of the search, nor
# names it in a string; what both need is the contract in `rose_dsl.measurement`. The command wires them.
SEARCH, RUNTIME = "rose_dsl/optimizer", "interpreter"
_NAMES_RUNTIME = re.compile(r"\b(interpreter|rose_cli)[./:][A-Za-z_]")
_NAMES_SEARCH = re.compile(r"\brose_dsl[./]optimizer\b")


def _strings(path: Path) -> list[tuple[int, str]]:
    """Every string constant in a file (docstrings and f-string parts included), with its line."""
    return [(node.lineno, node.value) for node in ast.walk(ast.parse(path.read_text(), str(path)))
            if isinstance(node, ast.Constant) and isinstance(node.value, str)]


def _naming(folder: str, pattern: re.Pattern[str]) -> list[str]:
    return [f"{p.relative_to(ROOT)}:{line}: {pattern.search(text).group(0)}..."  # type: ignore[union-attr]
            for p in sorted((ROOT / folder).rglob("*.py")) for line, text in _strings(p) if pattern.search(text)]


def test_the_search_names_no_runtime_module_even_in_a_string() -> None:
    bad = _naming(SEARCH, _NAMES_RUNTIME)
    assert not bad, "\n".join(bad)


def test_the_runtime_imports_nothing_of_the_search_nor_names_it() -> None:
    imports = [f"{p.relative_to(ROOT)}:{line}: imports {name}" for p in sorted((ROOT / RUNTIME).rglob("*.py"))
               for line, name in _imports(p) if name == "rose_dsl.optimizer" or name.startswith("rose_dsl.optimizer.")]
    relative = [f"{p.relative_to(ROOT)}:{node.lineno}: imports .{node.module}" for p in sorted((ROOT / RUNTIME).rglob("*.py"))
                for node in ast.walk(ast.parse(p.read_text())) if isinstance(node, ast.ImportFrom)
                and node.level and (node.module or "").startswith("optimizer")]  # (no such sibling today; kept honest)
    bad = imports + relative + _naming(RUNTIME, _NAMES_SEARCH)
    assert not bad, "\n".join(bad)


def test_the_checks_see_what_they_look_for(tmp_path: Path) -> None:
    """The two string checks catch a `module:Class` string and a dotted name; the import check a nested one."""
    sample = tmp_path / "m.py"
    sample.write_text('"""see `rose_dsl.optimizer.stage2`"""\nIMPL = "interpreter.trials:Feed"\n'
                      "def f():\n    from rose_dsl.optimizer import stage2\n")
    found = [text for _, text in _strings(sample)]
    assert any(_NAMES_SEARCH.search(t) for t in found) and any(_NAMES_RUNTIME.search(t) for t in found)
    assert (4, "rose_dsl.optimizer") in _imports(sample)
    assert not _NAMES_RUNTIME.search("the reference interpreter runs it") and not _NAMES_SEARCH.search("rose_dsl.optimizers")


_LOADED = """
import importlib, json, pkgutil, sys
import interpreter
for m in pkgutil.walk_packages(interpreter.__path__, "interpreter."):
    importlib.import_module(m.name)
print(json.dumps(sorted(n for n in sys.modules if n == "rose_dsl.optimizer" or n.startswith("rose_dsl.optimizer."))))
"""


def test_importing_the_runtime_loads_nothing_of_the_search() -> None:
    proc = subprocess.run([sys.executable, "-c", _LOADED], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1]) == []
