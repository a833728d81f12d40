"""Security and input guards: what may be imported as a component; that a workflow's process-level fields
(`env`, `python_path`, `venv`) cannot choose code the command line did not allow; that validation does not
import user code unless asked; `python_path` on every backend; the declared batch size of separable
outputs. The threat model is in docs/reliability.md."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from interpreter.components import ComponentError, resolve_impl
from rose_dsl.importcheck import module_allowed
from rose_dsl.trust import env_refused

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
    assert "wf.yaml:7:47)" in proc.stderr  # where the batch is declared (unseen sweep, 2026-12-05: no position)


# --- the process-level fields meet the allowlist's rule (issue 12 item 16) ------------------------------
PROBE = """
import json, os, sys

class Probe:
    def __init__(self, report):
        self.report = report

    def work(self, x=0):
        with open(self.report, "w") as f:
            json.dump({"var": os.environ.get("PROBE_VAR"), "preload": os.environ.get("LD_PRELOAD"),
                       "module": __file__}, f)
        return {"y": x}
"""

PROBE_WF = """rose: 1
name: probe
components:
  p:
    impl: "probe_mod:Probe"
    args: {{report: "{report}"}}
{extra}
iteration:
  count: 1
  body:
    - {{node: n, call: p.work, in: {{x: iteration.i}}, out: [y]}}
"""


def _probe(tmp_path, extra: str) -> tuple[Path, Path]:
    lib = tmp_path / "lib"
    lib.mkdir(exist_ok=True)
    (lib / "probe_mod.py").write_text(PROBE)
    report = tmp_path / "seen.json"
    wf = tmp_path / "wf.yaml"
    wf.write_text(PROBE_WF.format(report=report, extra=extra))
    return wf, report


def _rose(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "rose_cli", *args, "--allow-module", "probe_mod"], capture_output=True,
                          text=True, cwd=cwd, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})


@pytest.mark.parametrize("name", ["LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "DYLD_INSERT_LIBRARIES", "PYTHONPATH",
                                  "PYTHONSTARTUP", "PYTHONHOME", "PYTHONWARNINGS", "PATH", "BASH_ENV", "ENV",
                                  "GCONV_PATH", "CUDA_INJECTION64_PATH", "NVTX_INJECTION64_PATH",
                                  "__EGL_VENDOR_LIBRARY_FILENAMES", "VK_ICD_FILENAMES", "NCCL_NET_PLUGIN",
                                  "XLA_FLAGS", "TRITON_CACHE_DIR", "RAY_RUNTIME_ENV_HOOK", "ld_preload"])
def test_loader_and_interpreter_variables_are_refused(name) -> None:
    reason = env_refused(name)
    assert reason is not None and f"--allow-env {name}" in reason
    assert env_refused(name, allowed=[name]) is None


@pytest.mark.parametrize("name", ["MUJOCO_GL", "PYOPENGL_PLATFORM", "OMP_NUM_THREADS", "XLA_PYTHON_CLIENT_PREALLOCATE",
                                  "CUDA_VISIBLE_DEVICES", "PROBE_VAR"])
def test_data_variables_are_allowed(name) -> None:
    assert env_refused(name) is None


@pytest.mark.parametrize("backend", ["local", "ray"])
def test_env_ld_preload_is_refused_before_anything_runs(tmp_path, backend) -> None:
    wf, report = _probe(tmp_path, "    env: {PROBE_VAR: ok, LD_PRELOAD: /tmp/evil.so}\n    python_path: [lib]")
    proc = _rose("execute", str(wf), "--backend", backend, "--allow-path", "lib", "-n", "1", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert f"{wf}:7:26: components.p.env.LD_PRELOAD: 'LD_PRELOAD' may choose the code the process runs" in proc.stderr
    assert "--allow-env LD_PRELOAD" in proc.stderr and "Traceback" not in proc.stderr
    assert not report.exists()  # no component was started
    proc = _rose("validate", str(wf), "--import", "--allow-path", "lib", cwd=tmp_path)
    assert proc.returncode == 2 and "components.p.env.LD_PRELOAD" in proc.stderr and not report.exists()
    proc = _rose("validate", str(wf), cwd=tmp_path)  # valid, and it says what running it needs
    assert proc.returncode == 0 and "note: " in proc.stderr and "--allow-env LD_PRELOAD" in proc.stderr


def test_an_allowed_variable_reaches_the_component(tmp_path) -> None:
    wf, report = _probe(tmp_path, "    env: {PROBE_VAR: ok, LD_PRELOAD: ''}\n    python_path: [lib]")
    proc = _rose("execute", str(wf), "--allow-env", "LD_PRELOAD", "--allow-path", "lib", "-n", "1", "-q", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(report.read_text())["var"] == "ok"


@pytest.mark.parametrize("field", ["python_path", "venv"])
def test_import_paths_and_interpreters_need_allow_path(tmp_path, field) -> None:
    value = "[lib]" if field == "python_path" else str(tmp_path / "venv")
    wf, report = _probe(tmp_path, f"    {field}: {value}")
    for command in (["execute", str(wf), "-n", "1"], ["validate", str(wf), "--import"]):
        proc = _rose(*command, cwd=tmp_path)
        assert proc.returncode == 2, proc.stderr
        assert f"components.p.{field}" in proc.stderr and "--allow-path" in proc.stderr
        assert not report.exists()
    elsewhere = tmp_path / "other"
    elsewhere.mkdir()
    proc = _rose("execute", str(wf), "-n", "1", "--allow-path", str(elsewhere), cwd=tmp_path)
    assert proc.returncode == 2 and f"components.p.{field}" in proc.stderr  # a different directory allows nothing
    link = elsewhere / "escape"
    link.symlink_to(tmp_path)  # inside the allowed dir by name, outside it once resolved
    proc = _rose("execute", str(wf), "-n", "1", "--allow-path", str(link / ".." / "x"), cwd=tmp_path)
    assert proc.returncode == 2


# --- python_path on every backend (issue 12 item 9) ------------------------------------------------------
@pytest.mark.parametrize("backend", ["local", "ray"])
def test_python_path_works_on_every_backend(tmp_path, backend) -> None:
    wf, report = _probe(tmp_path, "    python_path: [lib]\n    env: {PROBE_VAR: ok}")
    proc = _rose("execute", str(wf), "--backend", backend, "--allow-path", "lib", "-n", "1", "-q", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(report.read_text())
    assert seen["module"] == str(tmp_path / "lib" / "probe_mod.py") and seen["var"] == "ok"


def test_what_one_shared_process_cannot_honour_is_refused_on_the_local_backend(tmp_path) -> None:
    wf, report = _probe(tmp_path, "    python_path: [lib]\n    venv: venv")
    proc = _rose("execute", str(wf), "--allow-path", ".", "-n", "1", cwd=tmp_path)
    assert proc.returncode == 2 and "needs a process of its own: use --backend ray" in proc.stderr
    (tmp_path / "lib" / "json.py").write_text("")  # would shadow the json this process already imported
    wf, report = _probe(tmp_path, "    python_path: [lib]")
    proc = _rose("execute", str(wf), "--allow-path", ".", "-n", "1", cwd=tmp_path)
    assert proc.returncode == 2 and "provides json (already imported from" in proc.stderr
    assert not report.exists()


# --- arguments that name code (issue 59) ------------------------------------------------------------------
CODE_ARG = """rose: 1
name: v
components:
  r: {impl: "examples.llm.reward:RewardPool", args: {verifier: VERIFIER, workers: 1}}
iteration:
  count: 1
  body:
    - {node: w, call: r.score, in: {x: iteration.i}, out: [y]}
"""


@pytest.mark.parametrize("verifier", ['"this:s"', '"os:system"', '["examples.llm.arithmetic:check_answer", "this:s"]'])
def test_an_argument_naming_code_passes_the_same_allow_list_as_impl(tmp_path, verifier) -> None:
    """`verifier: "this:s"` passed `validate --import`, then `execute` imported `this` in two reward workers
    (the Zen of Python printed twice): any installed callable ran without --allow-module."""
    from typer.testing import CliRunner

    from rose_cli.main import app
    from rose_dsl import load_workflow_text
    from rose_dsl.trust import TrustPolicy, check_trust

    wf = tmp_path / "v.yaml"
    wf.write_text(CODE_ARG.replace("VERIFIER", verifier))
    for command in (["validate", "--import", str(wf)], ["execute", str(wf), "-n", "1"]):
        r = CliRunner().invoke(app, command)
        assert r.exit_code == 2, r.output
        assert "components.r.args.verifier" in r.output and "names code to import and call" in r.output
        assert "Traceback" not in r.output
    module = verifier.split('"')[-2].split(":")[0]
    assert ("deny list" if module == "os" else f"--allow-module {module}") in r.output
    loaded = load_workflow_text(wf.read_text(), str(wf))
    assert check_trust(loaded, TrustPolicy.from_options(["this"])) == [] or module == "os"
    ok = load_workflow_text(CODE_ARG.replace("VERIFIER", '"examples.llm.arithmetic:check_answer"'), "ok.yaml")
    assert check_trust(ok, TrustPolicy.from_options()) == []  # the default prefix allows the shipped verifier
