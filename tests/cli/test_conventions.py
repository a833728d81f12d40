"""CLI conventions (issue 12 items 10, 13, 14): `--version`, `-h` on every command, bad command-line
values refused with exit 2 and a plain message, unwritable outputs refused, DOT that Graphviz renders."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
from typer.testing import CliRunner

from rose_cli.main import app
from rose_dsl import __version__

from .clirun import ROOT, plain_failure, rose

PPO = str(ROOT / "workflows" / "embodied_ppo.yaml")
TINY = """rose: 1
name: tiny
components:
  a: {impl: "tests.mocks:Sleeper", args: {seconds: 0.0}}
iteration:
  count: 2
  body:
    - {node: w, call: a.work, in: {x: iteration.i}, out: [y]}
"""


def _commands() -> list[str]:
    return sorted(c.name or c.callback.__name__ for c in app.registered_commands)


def test_version_everywhere() -> None:
    for module in ("rose_cli", "rose_dsl.cli"):
        proc = rose("--version", module=module)
        assert proc.returncode == 0 and proc.stdout.strip() == f"rose {__version__}", proc.stdout + proc.stderr
    import rose_cli

    assert rose_cli.__version__ == __version__ and re.fullmatch(r"\d+\.\d+\.\d+", __version__)


def test_every_command_takes_h_as_help() -> None:
    assert {"validate", "graph", "rewrite", "execute", "optimize"} <= set(_commands())
    runner = CliRunner()
    for args in ([], *([c] for c in _commands())):
        short = runner.invoke(app, [*args, "-h"])
        long = runner.invoke(app, [*args, "--help"])
        assert short.exit_code == 0 and "Usage:" in short.output, (args, short.output)
        assert short.output == long.output


@pytest.mark.parametrize(("args", "expected"), [
    (["execute", "{wf}", "-n", "-1"], "Invalid value for '--iterations' / '-n'"),
    (["execute", "{wf}", "-n", "0"], "Invalid value for '--iterations' / '-n'"),
    (["execute", "{wf}", "--checkpoint-every", "-3"], "Invalid value for '--checkpoint-every'"),
    (["execute", "{wf}", "--call-timeout", "0"], "must be more than 0 seconds"),
    (["execute", "{wf}", "--call-timeout", "nan"], "must be more than 0 seconds"),
    (["execute", "{wf}", "--backend", "slurm"], "Invalid value for '--backend'"),
    (["execute", "{wf}", "--out", "{wf}"], "is a file"),
    (["execute", "{wf}", "--resume"], "--resume needs --out"),
    (["execute", "{wf}", "--backend", "ray", "--address", "127.0.0.1:1"], "no Ray cluster answers there"),
    (["execute", "{wf}", "--resume", "--overwrite", "--out", "{tmp}/run"], "choose one"),
    (["execute", "{tmp}/missing.yaml"], "missing.yaml' does not exist"),
    (["execute", "{wf}", "--plan", "{tmp}/missing.yaml"], "missing.yaml' does not exist"),
    (["validate", "{tmp}/missing.yaml"], "missing.yaml' does not exist"),
    (["validate", "{tmp}"], "is a directory"),
    (["graph", "{wf}", "--format", "png"], "Invalid value for '--format'"),
    (["optimize", "{wf}", "-o", "{tmp}/p.yaml", "--call-timeout", "nan"], "must be more than 0 seconds"),
    (["compare", "{wf}", "--call-timeout", "nan"], "must be more than 0 seconds"),
    (["compare", "{wf}", "--rounds", "0"], "Invalid value for '--rounds'"),
    (["compare", "{wf}", "--backend", "slurm"], "Invalid value for '--backend'"),
    (["compare", "{wf}", "--plan", "=x.yaml"], "--plan takes PATH or LABEL=PATH"),
    (["optimize", "{wf}", "-o", "{tmp}/p.yaml", "--budget-s", "0"], "must be more than 0 seconds"),
    (["optimize", "{wf}", "-o", "{tmp}/p.yaml", "--rounds", "0"], "Invalid value for '--rounds'"),
    (["optimize", "{wf}", "-o", "{tmp}/p.yaml", "--backend", "slurm"], "Invalid value for '--backend'"),
    (["optimize", "{wf}", "-o", "{tmp}/p.yaml", "--out", "{wf}"], "is a file"),
    (["optimize", "{wf}", "-o", "{tmp}", "--report", "{tmp}/r"], "is a directory"),
    (["optimize", "{wf}", "-o", "{tmp}/p.yaml", "--backend", "ray", "--address", "127.0.0.1:1"],
     "no Ray cluster answers there"),
    (["validate", "{wf}", "--set", "novalue"], "--set expects NAME=VALUE"),
    # an empty --allow-* value (an unset shell variable): --allow-path "" allowed the current directory
    (["validate", "{wf}", "--allow-path", ""], "an empty value names nothing to allow"),
    (["execute", "{wf}", "--allow-module", " "], "an empty value names nothing to allow"),
    (["compare", "{wf}", "--allow-env", ""], "an empty value names nothing to allow"),
])
def test_bad_command_line_values_are_exit_2_with_a_plain_message(tmp_path, args, expected) -> None:
    wf = tmp_path / "wf.yaml"
    wf.write_text(TINY)
    args = [a.replace("{wf}", str(wf)).replace("{tmp}", str(tmp_path)) for a in args]
    result = CliRunner().invoke(app, [*args, *(["--allow-module", "tests"] if args[0] in ("execute", "optimize") else [])])
    text = result.output
    assert result.exit_code == 2, text
    assert "Traceback" not in text and "internal error" not in text, text
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert expected in text
    assert ":0:0" not in text  # not dressed up as a position in a workflow
    assert not (tmp_path / "run").exists()  # refused before anything was written


def test_the_installed_entry_point_exits_2_on_a_bad_value(tmp_path) -> None:
    """The same through `main()` in a fresh interpreter (what the console script runs)."""
    text = plain_failure(rose("execute", str(tmp_path / "missing.yaml"), "-n", "-1"))
    assert "Invalid value" in text


@pytest.mark.parametrize("command", [["graph", PPO], ["rewrite", PPO, "--do", "split step 2"]])
def test_an_unwritable_output_is_the_users_to_fix(tmp_path, command) -> None:
    target = tmp_path / "no" / "such" / "dir" / "out.txt"
    text = plain_failure(rose(*command, "-o", str(target)))
    assert f"cannot write {target}" in text and not target.parent.exists()


def _svg_texts(dot_text: str, tmp_path) -> list[str]:
    src = tmp_path / "g.dot"
    src.write_text(dot_text)
    svg = subprocess.run(["dot", "-Tsvg", str(src)], capture_output=True, text=True, check=True).stdout
    return re.findall(r"<text[^>]*>([^<]*)</text>", svg)


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's `dot` is not installed (apt-get install graphviz)")
def test_dot_labels_render_as_lines_in_graphviz(tmp_path) -> None:
    """Graphviz itself renders the labels: one text line per label line, never a literal backslash-n."""
    plan = tmp_path / "plan.yaml"
    assert rose("rewrite", PPO, "--do", "expand act", "-o", str(plan)).returncode == 0  # phases: their own label
    for wf in (PPO, str(plan)):
        proc = rose("graph", wf, "--format", "dot")
        assert proc.returncode == 0, proc.stderr
        texts = _svg_texts(proc.stdout, tmp_path)
        assert texts and not [t for t in texts if "\\n" in t], [t for t in texts if "\\n" in t][:3]
        # a node's name, its call and its state effects are three rendered lines
        for line in ("env", "sim.step", "[episode:update]"):
            assert line in texts, line
    assert "backbone" in texts and "policy.act" in texts  # the phases' entry node, rendered from the plan


def test_a_loop_that_ends_on_a_condition_runs_and_validate_says_how_it_ends(tmp_path) -> None:
    """`rose validate` says, at the loop's `until:`, whether it ends per row or as a whole (no longer that the
    runtime refuses it), and `rose execute` runs it."""
    wf = tmp_path / "until.yaml"
    wf.write_text((ROOT / "tests" / "dsl" / "fixtures" / "until_decode.yaml").read_text())
    valid = rose("validate", str(wf))
    assert valid.returncode == 0, valid.stderr
    said = valid.stderr.replace("\n", " ")
    assert re.search(rf"note: {re.escape(str(wf))}:\d+:\d+: loop 'decode' ends per row", said), said
    assert "fixed count only" not in said
    whole = tmp_path / "whole.yaml"
    whole.write_text((ROOT / "tests" / "dsl" / "fixtures" / "until.yaml").read_text())
    said = rose("validate", str(whole)).stderr.replace("\n", " ")
    assert re.search(rf"note: {re.escape(str(whole))}:\d+:\d+: loop 'step' ends as a whole \('act' declares no batch:\)",
                     said), said
    ran = rose("execute", str(wf), "-n", "2", "--out", str(tmp_path / "run"))
    assert ran.returncode == 0, ran.stderr
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 2 and "lm/loss" in lines[-1]


def test_a_loop_that_ends_on_a_condition_without_a_bound_is_refused_with_the_fix(tmp_path) -> None:
    wf = tmp_path / "until.yaml"
    wf.write_text((ROOT / "tests" / "dsl" / "fixtures" / "until_decode.yaml").read_text()
                  .replace('      count: "${max_new}"\n', ""))
    for command in ("validate", "execute"):
        proc = rose(command, str(wf))
        assert proc.returncode == 2, proc.stderr
        out = plain_failure(proc)
        assert re.search(rf"{re.escape(str(wf))}:\d+:\d+: iteration\.body\[1\]\.until: loop 'decode' ends on a condition "
                         r"\(until\) but has no bound", out), out
        assert "add `count: N`" in out.replace("\n", " "), out
