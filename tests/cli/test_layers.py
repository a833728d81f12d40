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


# The optimizer (issue 60): its search is `rose_dsl/optimizer` (pure), its driver and measuring side one
# package of the runtime, `interpreter/optimize`. The search names no runtime module, not even in a string (a
# `module:Class` it would hand to the runtime, a path in a docstring). In the runtime only the driver -- the
# package's `driver.py` and the `__init__.py` that re-exports its API -- imports the search or names it; the
# measuring side beside it implements the search's protocols structurally (the contract both share is
# `rose_dsl.measurement`), and nothing else in the runtime imports the package. The command
# (`rose_cli/optimize.py`) goes through the package's public API alone: no module of the search, no
# submodule of `interpreter.optimize`.
SEARCH, RUNTIME, OPTIMIZE = "rose_dsl/optimizer", "interpreter", "interpreter/optimize"
# (continuous.py is the driver's second half: `--max-overhead`'s training that searches again)
DRIVER = ("interpreter/optimize/__init__.py", "interpreter/optimize/driver.py", "interpreter/optimize/continuous.py")
COMMAND = "rose_cli/optimize.py"
_NAMES_RUNTIME = re.compile(r"\b(interpreter|rose_cli)[./:][A-Za-z_]")
_NAMES_SEARCH = re.compile(r"\brose_dsl[./]optimizer\b")


def _strings(path: Path) -> list[tuple[int, str]]:
    """Every string constant in a file (docstrings and f-string parts included), with its line."""
    return [(node.lineno, node.value) for node in ast.walk(ast.parse(path.read_text(), str(path)))
            if isinstance(node, ast.Constant) and isinstance(node.value, str)]


def _naming(files: list[Path], pattern: re.Pattern[str]) -> list[str]:
    return [f"{p.relative_to(ROOT)}:{line}: {pattern.search(text).group(0)}..."  # type: ignore[union-attr]
            for p in files for line, text in _strings(p) if pattern.search(text)]


def _package_of(path: Path) -> str:
    """The dotted package a file's relative imports start from."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1])


def _absolute_imports(path: Path, package: str | None = None) -> list[tuple[int, str]]:
    """Every module an import statement names, relative ones made absolute (`from . import x` names `pkg.x`);
    `package`: the file's (default: from its place under the repository)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = (package or _package_of(path)).split(".")
                base = ".".join([*parts[:len(parts) - node.level + 1], *([base] if base else [])])
            out.append((node.lineno, base))
            out += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]  # (`from pkg import module`)
    return out


def _in(name: str, module: str) -> bool:
    return name == module or name.startswith(module + ".")


def _files(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


def test_the_search_names_no_runtime_module_even_in_a_string() -> None:
    bad = _naming(_files(SEARCH), _NAMES_RUNTIME)
    assert not bad, "\n".join(bad)


def test_in_the_runtime_only_the_driver_imports_the_search_or_names_it() -> None:
    others = [p for p in _files(RUNTIME) if str(p.relative_to(ROOT)) not in DRIVER]
    imports = [f"{p.relative_to(ROOT)}:{line}: imports {name}" for p in others
               for line, name in _absolute_imports(p) if _in(name, "rose_dsl.optimizer")]
    bad = imports + _naming(others, _NAMES_SEARCH)
    assert not bad, "\n".join(bad)


def test_nothing_else_in_the_runtime_imports_the_optimizer_package() -> None:
    outside = [p for p in _files(RUNTIME) if not p.is_relative_to(ROOT / OPTIMIZE)]
    bad = [f"{p.relative_to(ROOT)}:{line}: imports {name}" for p in outside
           for line, name in _absolute_imports(p) if _in(name, "interpreter.optimize")]
    assert not bad, "\n".join(bad)


def test_the_command_uses_the_optimizers_public_api_only() -> None:
    """`rose optimize` imports no module of the search and no submodule of `interpreter.optimize`: the
    package's names (`interpreter/optimize/__init__.py`) are the whole of what it uses."""
    bad = [f"{COMMAND}:{line}: imports {name}" for line, name in _imports(ROOT / COMMAND)
           if _in(name, "rose_dsl.optimizer") or name.startswith("interpreter.optimize.")]
    assert not bad, "\n".join(bad)
    assert (ROOT / OPTIMIZE / "driver.py").exists(), "the driver is interpreter/optimize/driver.py"


def test_the_checks_see_what_they_look_for(tmp_path: Path) -> None:
    """The two string checks catch a `module:Class` string and a dotted name; the import checks a nested
    import, and a relative one made absolute."""
    sample = tmp_path / "m.py"
    sample.write_text('"""see `rose_dsl.optimizer.stage2`"""\nIMPL = "interpreter.optimize.trials:Feed"\n'
                      "def f():\n    from rose_dsl.optimizer import stage2\n")
    found = [text for _, text in _strings(sample)]
    assert any(_NAMES_SEARCH.search(t) for t in found) and any(_NAMES_RUNTIME.search(t) for t in found)
    assert (4, "rose_dsl.optimizer") in _imports(sample)
    assert not _NAMES_RUNTIME.search("the reference interpreter runs it") and not _NAMES_SEARCH.search("rose_dsl.optimizers")
    assert _package_of(ROOT / "interpreter" / "optimize" / "trials.py") == "interpreter.optimize"
    relative = tmp_path / "r.py"
    relative.write_text("from .optimize import driver\nfrom . import optimize\nfrom ..optimize import trials\n")
    names = [name for _, name in _absolute_imports(relative, package="interpreter")]
    assert {"interpreter.optimize", "interpreter.optimize.driver"} <= set(names)
    assert "interpreter.optimize.trials" in [n for _, n in _absolute_imports(relative, package="interpreter.optimize")]
    assert _in("interpreter.optimize.trials", "interpreter.optimize") and not _in("interpreter.optimized", "interpreter.optimize")


_LOADED = """
import importlib, json, pkgutil, sys
import interpreter
for m in pkgutil.walk_packages(interpreter.__path__, "interpreter."):
    if m.name in ("interpreter.optimize.driver", "interpreter.optimize.continuous"):
        continue
    importlib.import_module(m.name)
print(json.dumps(sorted(n for n in sys.modules if n == "rose_dsl.optimizer" or n.startswith("rose_dsl.optimizer."))))
"""


def test_importing_the_runtime_loads_nothing_of_the_search() -> None:
    """Every runtime module but the driver -- the measuring side and the package's `__init__` included, as a
    worker process importing the trial components does -- loads no module of the search."""
    proc = subprocess.run([sys.executable, "-c", _LOADED], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1]) == []
