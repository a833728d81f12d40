"""Security and input guards of the runtime: what may be imported as a component, that validation does
not import user code unless asked, and the declared batch size of separable outputs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from interpreter.components import ComponentError, resolve_impl
from rose_dsl.importcheck import module_allowed

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("impl", ["os:system", "subprocess:Popen", "builtins:eval", "pickle:Unpickler",
                                  "importlib:import_module", "ctypes:CDLL"])
def test_dangerous_modules_are_never_components(impl) -> None:
    with pytest.raises(ComponentError, match="deny list|outside the allowed"):
        resolve_impl(impl, ("examples.", "os", "subprocess", "builtins", "pickle", "importlib", "ctypes"))


def test_only_allowed_prefixes_and_the_resolved_class_is_checked() -> None:
    assert module_allowed("examples.llm.tasks", ("examples.",)) is None
    assert "outside the allowed prefixes" in module_allowed("mypkg.sim", ("examples.",))
    # a name under an allowed module that resolves to a class defined elsewhere is refused
    with pytest.raises(ComponentError, match="resolves to"):
        resolve_impl("examples.bench.load:Any", ("examples.",))


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "rose_cli", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=300)


def test_validate_imports_user_code_only_when_asked(tmp_path) -> None:
    marker = tmp_path / "imported"
    pkg = tmp_path / "examples_evil"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "mod.py").write_text(f"open({str(marker)!r}, 'w').write('x')\nclass C:\n    def f(self): pass\n")
    wf = tmp_path / "wf.yaml"
    wf.write_text('rose: 1\nname: x\ncomponents:\n  c: {impl: "examples_evil.mod:C"}\n'
                  "iteration:\n  body:\n    - {node: n, call: c.f}\n")
    assert _cli("validate", str(wf)).returncode == 0 and not marker.exists()
    proc = _cli("validate", str(wf), "--import")
    assert proc.returncode == 2 and "outside the allowed prefixes" in proc.stderr and not marker.exists()
    env_run = subprocess.run([sys.executable, "-m", "rose_dsl.cli", "validate", str(wf), "--import", "--allow-module",
                              "examples_evil"], capture_output=True, text=True, cwd=ROOT, timeout=300,
                             env={**__import__("os").environ, "PYTHONPATH": f"{tmp_path}:{ROOT}"})
    assert env_run.returncode == 0, env_run.stderr
    assert marker.exists()  # imported, in a child process, because it was asked for


def test_an_output_with_the_wrong_batch_size_stops_the_run(tmp_path) -> None:
    wf = tmp_path / "wf.yaml"
    wf.write_text('rose: 1\nname: rows\ncomponents:\n  w: {impl: "tests.mocks:WrongRows"}\n'
                  "iteration:\n  body:\n    - {node: a, call: w.act, out: [y], batch: {dim: 0, size: 6}}\n")
    proc = _cli("execute", str(wf), "--allow-module", "tests", "-n", "1")
    assert proc.returncode == 3
    assert "output 'y' of w.act has 5 rows along dim 0; the node declares a batch of 6" in proc.stderr
