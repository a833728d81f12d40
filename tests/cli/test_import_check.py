"""`rose validate --import` (issue 12 item 15): what a run would meet only when it starts a component is
found before it, at the `impl:` or `call:` that names it, with a did-you-mean; at run time the failing
component or invocation is named once."""

from __future__ import annotations

import os
import stat
import sys

import pytest

from .clirun import ROOT, plain_failure, rose

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


def _in_process(*args: str) -> str:
    """`rose` in this process (typer's runner), on the worker's Ray cluster where it runs on Ray (a process of
    its own started Ray again: 5-18 s on the 2-core machine): the failure's output, checked as
    `plain_failure` checks a process's (exit 2, no traceback, no internal error)."""
    from typer.testing import CliRunner

    from rose_cli.main import app

    r = CliRunner().invoke(app, list(args))
    text = r.stdout + r.stderr
    assert r.exit_code == 2 and (r.exception is None or isinstance(r.exception, SystemExit)), (text, r.exception)
    assert "Traceback" not in text and "internal error" not in text, text
    return text


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


@pytest.mark.e2e
def test_at_run_time_an_import_failure_is_said_at_its_impl(tmp_path, ray_session) -> None:
    """User-error sweep (2026-12-05, BUG_12's other half): a module that does not import was exit 3 naming
    the component, without line:col. The worker reports it (a Ray actor's constructor exception reaches the
    driver as text only) and the run stops before any call, exit 2 at `components.b.impl`, on both backends
    (the local one in `rose`'s own process, Ray's in this one, on the worker's cluster)."""
    wf = _write(tmp_path, impl_b="tests.mockz:Flaky")
    for backend in ("local", "ray"):
        args = ("execute", str(wf), "--allow-module", "tests", "-q", "--backend", backend)
        text = plain_failure(rose(*args)) if backend == "local" else _in_process(*args)
        assert f"{wf}:5:14: components.b.impl: cannot import 'tests.mockz'" in text, text
        assert "rose validate --import" in text and "component 'b' could not be started" in text
    assert os.path.exists(wf)


@pytest.mark.e2e
def test_at_run_time_a_missing_method_is_found_before_the_first_call_at_each_call(tmp_path, ray_session) -> None:
    """User-error sweep (2026-12-05, BUG_12): a misspelled method was found at its first call -- after other
    calls had run -- and said as a component failure (exit 3) with no position. The started component is
    asked for every method its nodes call before any call: exit 2 at each `call:`, as `--import` says it, on
    both backends (the local one in `rose`'s own process, Ray's in this one); nothing ran (no metrics)."""
    wf = _write(tmp_path, call_a="wrok")
    for backend in ("local", "ray"):
        out = tmp_path / f"run-{backend}"
        args = ("execute", str(wf), "--allow-module", "tests", "-q", "--backend", backend, "--out", str(out))
        text = plain_failure(rose(*args)) if backend == "local" else _in_process(*args)
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


STATEFUL = """rose: 1
name: stateful
components:
  t: {impl: "IMPL", state: [weights]}
iteration:
  count: 1
  body:
    - {node: step, call: t.update, in: {PORTS}, out: [y], state: {weights: update}}
"""


def _stateful(tmp_path, impl="tests.cli.state_mocks:WithGetSet", ports="x: iteration.i"):
    wf = tmp_path / "wf.yaml"
    wf.write_text(STATEFUL.replace("IMPL", impl).replace("PORTS", ports))
    return wf


def test_an_in_port_the_method_does_not_take_is_reported_at_the_port(tmp_path) -> None:
    """Issue 42: a wrong `in:` port name passed `validate --import` and failed at run time (exit 3, TypeError)."""
    wf = _stateful(tmp_path, ports="xx: iteration.i")
    text = _check(wf)
    assert (f"{wf}:8:45: iteration.step.in.xx: tests.cli.state_mocks:WithGetSet.update() takes no argument 'xx' "
            "(it takes x)") in text
    assert "1 problem found by importing the components" in text
    # **kwargs takes any port
    ok = rose("validate", str(_stateful(tmp_path, "tests.cli.state_mocks:TakesAnything", "xx: iteration.i")),
              "--import", "--allow-module", "tests")
    assert ok.returncode == 0, ok.stderr


def test_a_state_a_checkpoint_cannot_hold_is_found_at_import_check(tmp_path) -> None:
    """Issue 42: a `torch.optim.Adam` object as state passed validate and execute and failed only in `rose
    optimize` (exit 5) with no hint; a dict of requires_grad tensors broke training with a RuntimeError."""
    wf = _stateful(tmp_path, "tests.cli.state_mocks:AdamAsState")
    wf.write_text(wf.read_text().replace("state: [weights]", "state: [optimizer]").replace(
        "{weights: update}", "{optimizer: update}"))
    text = _check(wf)
    assert ("components.t.state.optimizer: state 'optimizer' is a torch.optim.adam.Adam (from attribute "
            "'optimizer'), which a checkpoint cannot hold") in text
    assert "get_state(name) and set_state(name, value)" in text and "state_dict()" in text
    text = _check(_stateful(tmp_path, "tests.cli.state_mocks:ParametersAsState"))
    assert "components.t.state.weights: state 'weights'['w'] requires grad" in text
    assert "get_state returning detached copies, set_state copying them in place" in text


def test_a_missing_top_level_module_is_hinted_only_from_the_users_own_directories(tmp_path, monkeypatch) -> None:
    """Issue 42: `no module named 'examples'` came with "did you mean 'example' or 'tempfile'?" (stray modules of
    dependencies). A top-level hint names only modules of the working directory or the component's
    python_path; a missing `examples` says how to get the example components (`rose init`)."""
    from rose_dsl import load_workflow_text
    from rose_dsl.importcheck import import_problems
    from rose_dsl.trust import TrustPolicy

    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    monkeypatch.chdir(tmp_path)
    text = TWO.replace("IMPL_A", "tempfil.x:A").replace("IMPL_B", "mypkh.x:B").replace("CALL_A", "work")
    wf = load_workflow_text(text, "wf.yaml")
    found = {d.path: d for d in import_problems(wf, TrustPolicy.from_options(["tempfil", "mypkh"], None, None))}
    assert found["components.a.impl"].message == "cannot import 'tempfil.x': no module named 'tempfil'"
    assert found["components.a.impl"].hint is None  # not the standard library's 'tempfile'
    assert found["components.b.impl"].hint == "did you mean 'mypkg'?"
    from rose_dsl.importcheck import check_imports

    result = check_imports({"a": ("examples.nowhere:A", ["work"], [], [str(tmp_path)], None)},
                           env={"PYTHONPATH": str(tmp_path)})["a"]
    assert result["impl"][0] == "cannot import 'examples.nowhere': no module named 'examples'"
    assert "rose init DIR --workflow NAME" in result["impl"][1]


def _merge(tmp_path, cls):
    return _write(tmp_path, impl_a=f"tests.cli.merge_mocks:{cls}")


def test_declared_metric_merge_rules_that_exist_pass(tmp_path) -> None:
    for cls in ("Counted", "WithSnapshot", "ComputedNames"):
        proc = rose("validate", str(_merge(tmp_path, cls)), "--import", "--allow-module", "tests")
        assert proc.returncode == 0, (cls, proc.stderr)


def test_a_metric_merge_naming_a_metric_never_reported_is_positioned_with_a_hint(tmp_path) -> None:
    """`metric_merge` is a class attribute, so the error is at the component's `impl:`, with the field path
    down to the rule, the class's own file and line, what pop_metrics() does report, and a did-you-mean."""
    wf = _merge(tmp_path, "Misnamed")
    text = _check(wf)
    assert f"{wf}:4:14: components.a.impl.metric_merge.rewrd: tests.cli.merge_mocks:Misnamed.metric_merge (" in text
    assert "merge_mocks.py:" in text
    assert "names the metric 'rewrd', which its pop_metrics() never reports (it reports 'env_steps', 'reward')" in text
    assert "hint: did you mean 'reward'?" in text


def test_an_unknown_rule_a_declaration_that_is_no_dict_and_no_pop_metrics_each_exit_2(tmp_path) -> None:
    cases = {"UnknownRule": ("components.a.impl.metric_merge.reward", "gives 'reward' the rule 'average', which is not a rule",
                             "a snapshot (a running mean, a best-so-far) is 'copies'"),
             "NotADict": ("components.a.impl.metric_merge", "is a list, not a dict of metric name -> rule",
                          "declare e.g. metric_merge = {"),
             "NoMetrics": ("components.a.impl.metric_merge", "declares metric_merge", "report the metrics from pop_metrics()")}
    for cls, (path, what, fix) in cases.items():
        wf = _merge(tmp_path, cls)
        proc = rose("validate", str(wf), "--import", "--allow-module", "tests")
        assert proc.returncode == 2, (cls, proc.stderr)
        text = plain_failure(proc)
        assert f"{wf}:4:14: {path}: " in text and what in text and fix in text, (cls, text)
        assert "Traceback" not in text


def test_a_stateful_method_without_rows_in_a_loop_that_ends_per_row_is_found() -> None:
    """It passed `validate --import` and stopped the run at the trip where the first row was done (exit 3,
    issue 59): from then on the call gets only the rows not done, and `rows=` is how it learns which. Checked
    on the signatures the import child reports (`import_problems` adds these problems to its own; no child
    process here: one costs seconds of torch import)."""
    from rose_dsl import load_workflow_text
    from rose_dsl.importcheck import _per_row_loops, _rows_problems
    from rose_dsl.ir import ExecutionNode

    wf = load_workflow_text((ROOT / "tests" / "dsl" / "fixtures" / "until_decode.yaml").read_text(), "w.yaml")
    methods: dict[str, list] = {}
    for item in wf.items():
        if isinstance(item, ExecutionNode) and item.component == "lm":
            methods.setdefault(item.method, []).append(item)
    per_row = _per_row_loops(wf)
    without = {m: {"names": ["tok", "t", "it"] if m == "step" else ["it", "logp", "reward", "eos"], "required": [],
                   "any": False} for m in methods}
    problems = _rows_problems("x:NoRowsLM", per_row, methods, without)
    assert [(d.path, d.pos.line) for d in problems] == [("iteration.decode.gen.call", 18)], problems
    assert "runs in loop 'decode', which ends per row" in problems[0].message
    assert "declares state (lm.weights)" in problems[0].message and "takes no `rows=` argument" in problems[0].message
    with_rows = {**without, "step": {"names": ["tok", "t", "it", "rows"], "required": [], "any": False}}
    assert _rows_problems("x:ToyLM", per_row, methods, with_rows) == []  # the shipped one takes rows=
    assert _rows_problems("x:K", per_row, methods, {**without, "step": {"names": [], "required": [], "any": True}}) == []
