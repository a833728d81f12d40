"""`rose validate --import` (issue 12 item 15): what a run would meet only when it starts a component is
found before it, at the `impl:` or `call:` that names it, with a did-you-mean; at run time the failing
component or invocation is named once."""

from __future__ import annotations

import os
import stat
import sys

from .clirun import plain_failure, rose

TWO = """rose: 1
name: two
components:
  a: {impl: "IMPL_A", args: {seconds: 0.0}}
  b: {impl: "IMPL_B"}
iteration:
  count: 1
  body:
    - {node: first, call: a.CALL_A, in: {x: iteration.i}, out: [y]}
    - {node: second, call: b.work, in: {x: first.y}, out: [y]}
    - {node: third, call: a.CALL_A, in: {x: second.y}, out: [y]}
"""


def _write(tmp_path, impl_a="tests.mocks:Sleeper", impl_b="tests.mocks:Flaky", call_a="work"):
    wf = tmp_path / "wf.yaml"
    wf.write_text(TWO.replace("IMPL_A", impl_a).replace("IMPL_B", impl_b).replace("CALL_A", call_a))
    return wf


def _check(wf, *extra):
    return plain_failure(rose("validate", str(wf), "--import", "--allow-module", "tests", *extra))


def test_a_good_workflow_imports(tmp_path) -> None:
    proc = rose("validate", str(_write(tmp_path)), "--import", "--allow-module", "tests")
    assert proc.returncode == 0, proc.stderr


def test_a_misspelled_module_class_and_methods_all_at_once(tmp_path) -> None:
    wf = _write(tmp_path, impl_a="tests.mocks:Sleepr", impl_b="tests.mockz:Flaky")
    text = _check(wf)
    assert f"{wf}:4:14: components.a.impl: 'tests.mocks' has no class 'Sleepr'" in text
    assert "hint: did you mean 'Sleeper'?" in text
    assert f"{wf}:5:14: components.b.impl: cannot import 'tests.mockz': module 'tests' has no submodule 'mockz'" in text
    assert "hint: did you mean 'mocks'?" in text
    assert "2 problems found by importing the components" in text


def test_a_misspelled_top_level_package(tmp_path) -> None:
    text = _check(_write(tmp_path, impl_a="tetss.mocks:Sleeper"), "--allow-module", "tetss")
    assert "cannot import 'tetss.mocks': no module named 'tetss'" in text and "did you mean 'tests'" in text


def test_a_missing_method_is_reported_at_each_call(tmp_path) -> None:
    wf = _write(tmp_path, call_a="wrok")
    text = _check(wf)
    assert f"{wf}:9:27: iteration.first.call: class 'tests.mocks:Sleeper' has no method 'wrok'" in text
    assert f"{wf}:11:27: iteration.third.call: class 'tests.mocks:Sleeper' has no method 'wrok'" in text
    assert text.count("hint: did you mean 'work'?") == 2
    assert "components.a.impl" not in text  # the class is fine: the calls are what to fix


def test_a_module_that_fails_to_import_says_why(tmp_path) -> None:
    pkg = tmp_path / "userpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "broken.py").write_text("import json\nraise RuntimeError('no licence file')\n")
    wf = _write(tmp_path, impl_b="userpkg.broken:C")
    text = plain_failure(rose("validate", str(wf), "--import", "--allow-module", "tests", "--allow-module", "userpkg",
                              cwd=tmp_path))
    assert "components.b.impl: importing 'userpkg.broken' failed: RuntimeError: no licence file" in text


def test_the_import_check_runs_in_the_components_own_interpreter(tmp_path) -> None:
    """`venv:` picks the interpreter the component runs in; the check imports with that one."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    marker = tmp_path / "used"
    python = venv / "bin" / "python"
    python.write_text(f"#!/bin/sh\ntouch {marker}\nexec {sys.executable} \"$@\"\n")
    python.chmod(python.stat().st_mode | stat.S_IEXEC)
    wf = _write(tmp_path)
    wf.write_text(wf.read_text().replace('impl: "tests.mocks:Flaky"}', f'impl: "tests.mocks:Flaky", venv: "{venv}"}}'))
    text = _check(wf)  # refused by the trust policy: nothing runs
    assert "components.b.venv" in text and not marker.exists()
    proc = rose("validate", str(wf), "--import", "--allow-module", "tests", "--allow-path", str(venv))
    assert proc.returncode == 0, proc.stderr
    assert marker.exists()


def test_at_run_time_an_import_failure_is_said_at_its_impl(tmp_path) -> None:
    """User-error sweep (2026-12-05, BUG_12's other half): a module that does not import was exit 3 naming
    the component, without line:col. The worker reports it (a Ray actor's constructor exception reaches the
    driver as text only) and the run stops before any call, exit 2 at `components.b.impl`, on both backends."""
    wf = _write(tmp_path, impl_b="tests.mockz:Flaky")
    for backend in ("local", "ray"):
        text = plain_failure(rose("execute", str(wf), "--allow-module", "tests", "-q", "--backend", backend))
        assert f"{wf}:5:14: components.b.impl: cannot import 'tests.mockz'" in text, text
        assert "rose validate --import" in text and "component 'b' could not be started" in text
    assert os.path.exists(wf)


def test_at_run_time_a_missing_method_is_found_before_the_first_call_at_each_call(tmp_path) -> None:
    """User-error sweep (2026-12-05, BUG_12): a misspelled method was found at its first call -- after other
    calls had run -- and said as a component failure (exit 3) with no position. The started component is
    asked for every method its nodes call before any call: exit 2 at each `call:`, as `--import` says it, on
    both backends; nothing ran (no metrics written)."""
    wf = _write(tmp_path, call_a="wrok")
    for backend in ("local", "ray"):
        out = tmp_path / f"run-{backend}"
        text = plain_failure(rose("execute", str(wf), "--allow-module", "tests", "-q", "--backend", backend,
                                  "--out", str(out)))
        assert f"{wf}:9:27: iteration.first.call: class 'tests.mocks:Sleeper' has no method 'wrok'" in text, text
        assert f"{wf}:11:27: iteration.third.call: class 'tests.mocks:Sleeper' has no method 'wrok'" in text
        assert text.count("hint: did you mean 'work'?") == 2
        assert "stopped before the first call" in text
        assert not (out / "metrics.jsonl").exists() or not (out / "metrics.jsonl").read_text().strip()


def test_an_argument_the_constructor_does_not_take_is_reported_at_args(tmp_path) -> None:
    """User-error sweep (2026-12-05, BUG_11): an `args:` key the constructor does not take passed `--import`,
    and the run then failed constructing it (exit 3) with a hint to run `--import`."""
    wf = tmp_path / "wf.yaml"
    wf.write_text(_write(tmp_path).read_text().replace("args: {seconds: 0.0}", "args: {secnds: 0.0}"))
    text = _check(wf)
    assert "components.a.args.secnds: 'tests.mocks:Sleeper' takes no argument 'secnds'" in text
    assert "did you mean 'seconds'?" in text
