"""A fuzzing pass over the command line and plan files (issue 59): `rose validate` and `rose rewrite --do`, run
in this process (typer's CliRunner on `rose_cli.main:app`) on

* random mutations of the shipped workflows (`workflows/*.yaml`): a field dropped, duplicated or retyped; a
  number made 0, negative, huge, a float, a string; unicode, deep lists, long strings; bad `${...}`
  references, bad expressions in `in:` ports and `collect:`; bad `until:`, `max_staleness`, `defer:`,
  `ahead:`, `rows:` values; YAML anchors and aliases (a subtree shared, or one that holds itself);
* random plan files: a `rose rewrite` output whose `plan:` block (source, rewrites, layout) or body is mutated
  the same way, validated as a plan against its recorded source;
* random rewrite requests (a verb, names of the file's items or not, numbers) on the shipped workflows and on
  those plans;
* `--set NAME=VALUE` on the shipped workflows: names declared and not, values of the wrong kind, empty, huge, `nan`,
  `.inf`, `1e309`, unicode, YAML's own (`!!python/object`, `{a: 1}`, `[1,`, `~`, `yes`, an anchor, an alias);
* random command lines of `execute`, `optimize`, `graph`, `rewrite`, `compare` and `validate`, built from each typer
  command's own options (asked of the command: names, types, ranges, which paths must exist, be files or
  directories): valid and invalid values, missing files, directories where files go, links, an option twice, one
  without its value, an unknown one. `execute`, `optimize` and `compare` stop where they would start processes.

Every outcome is exit 0, or exit 2 with a message positioned at `FILE:LINE:COL` (or naming the request or
option it refuses); never a traceback, never exit 1 (an internal error). The work is bounded by construction
(each example is one or two in-process commands on a workflow of the repository, at most a few mutations),
not by a deadline: hypothesis runs with `deadline=None` (tests/conftest.py); a command line still running after
`HANG_S` fails as a hang. The default profile draws 40 examples per property (25 for `--set` and the command lines:
a few seconds each); `--hypothesis-profile=long` draws 3,000.

Every failure it found is pinned below as an `@example`, with what it was and the fix.
"""

from __future__ import annotations

import contextlib
import copy
import math
import re
import signal
import tempfile
from dataclasses import dataclass
from enum import Enum
from functools import cache
from pathlib import Path
from typing import Any
from unittest import mock

import typer.main
import yaml
from hypothesis import event, example, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from rose_cli.main import app

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = sorted(p.name for p in (ROOT / "workflows").glob("*.yaml"))
# (workflow, rewrite request): plans `rose rewrite` writes, one of each kind of rewrite (the asynchronous
# ones of fixtures whose budgets allow them as declared)
PLANS = [
    ("workflows/latency_decode.yaml", "split decode 2"),
    ("workflows/latency_chain.yaml", "ahead sample"),
    ("workflows/embodied_ppo.yaml", "split-time epoch 2"),
    ("workflows/latency_until_episodes.yaml", "split-time epoch 2"),
    ("workflows/latency_interaction.yaml", "split epoch.step 2"),
    ("workflows/embodied_ppo.yaml", "expand act"),
    ("tests/dsl/fixtures/async_two_budgets.yaml", "defer sync 1"),
    ("tests/dsl/fixtures/async_relay_chain.yaml", "defer sync1 1"),
    ("tests/dsl/fixtures/async_readers.yaml", "ahead rollout"),
]
# the default profile's count: the long profile's (3,000) applies when it is loaded
FAST = settings(max_examples=40) if settings.default.max_examples <= 200 else settings()

FEWER = settings(max_examples=25) if settings.default.max_examples <= 200 else settings()  # (the new properties' share)

POSITIONED = re.compile(r"\.yaml:\d+:\d+|<command line>|refused: |^error: |--set|--do|--layout", re.M)


def _invoke(args: list[str]) -> tuple[int, str]:
    """Run `rose ARGS` in this process: (exit code, what it printed); a raised exception is a failure."""
    result = CliRunner().invoke(app, args)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"rose {' '.join(args)} raised {result.exception!r}\n{result.output}") from result.exception
    return result.exit_code, result.output


def _check(args: list[str]) -> tuple[int, str]:
    """`rose ARGS` ends with exit 0, or exit 2 with a positioned message; every line that names the file names
    it as `FILE:LINE:COL: ` or `FILE: `."""
    code, output = _invoke(args)
    assert code in (0, 2), f"rose {' '.join(args)}: exit {code}\n{output}"
    assert "Traceback" not in output, output
    event(f"exit {int(code)}")  # (--hypothesis-show-statistics counts them)
    if code == 2:
        assert POSITIONED.search(output), f"rose {' '.join(args)}: exit 2 with no position:\n{output}"
    file = args[1]
    for line in output.splitlines():
        if line.startswith(file):
            assert re.match(rf"{re.escape(file)}(:\d+:\d+)?: ", line), f"rose {' '.join(args)}: {line!r}\n{output}"
    return code, output


# --- values a mutation puts in -------------------------------------------------------------------------------------
def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


NUMBERS = [0, -1, -(10 ** 12), 10 ** 12, 10 ** 30, 2.5, -0.0, 1e308, float("inf"), float("nan"), True]
STRINGS = ["", "x", "0", "1e3", "0x10", "ü∞\u202e\x00", "x" * 5000, "${", "${}", "${nope}", "${iterations",
           "${iterations}${iterations}", "${ iterations }", "$${iterations}", "${iterations.x}", "a.b", "a.b.c.d",
           "iteration.i +", "iteration.i * 0", "iteration.i // 0", "iteration.i ** 99", "nope.out", "x[", "x[*]",
           "stack(", "stack(x[*].{})", "stack(epoch[*].{nope.o})", "cat(a, b", "a..b", "(((((((((1)))))))))",
           "1" * 400, "iteration.i - 10**12", ":", "[*]", "{a}"]
FIELD_VALUES: dict[str, list[Any]] = {  # values that are wrong in a way particular to the field
    "until": ["", "nope.done", "iteration.i", "envstep.done and", "true", 1, [], {"a": 1}, "${max_steps}"],
    "max_staleness": [-1, 10 ** 12, 10 ** 100, "${nope}", "${iterations} * 10**9", 0.5, "1", [], {"x": 1}],
    "defer": [0, -1, 1, 65, 10 ** 12, 2.5, "1", "${stale}", [], True],
    "ahead": [0, -1, 2, 10 ** 12, "1", [], True, None],
    "rows": [[0], [1, 0], [0, 10 ** 12], [-5, 2], [0, 2, 4], ["a", "b"], [0.5, 1], 3, "0:4", [[0, 1]]],
    "in": [{"x": "nope.out"}, {"x": "iteration.i +"}, {"x": ""}, {"": "iteration.i"}, "iteration.i", [1],
           {"x": "${nope}"}, {"x": "stack(epoch[*].{nope.o})"}],
    "collect": [{"c": "stack("}, {"c": "nope"}, {"c": "stack(x[*].{x.v})"}, "stack(a)", [], {"": "a"}],
    "count": [0, -1, 10 ** 12, 10 ** 30, 2.5, "${nope}", "many"],
    "batch": [{"dim": -1, "size": 4}, {"dim": 0, "size": 0}, {"dim": 0, "size": 10 ** 12}, {"size": 4}, 3],
    "replicas": [0, -1, 10 ** 12, "${nope}"],
    "plan": [None, {}, {"source": None}, {"source": "/nonexistent.yaml"}, {"source": ""}, {"rewrites": ["split"]},
             {"source": 3}, {"layout": {"x": 1}}, {"bogus": 1}, "x", []],
    "source": ["", "/nonexistent.yaml", "../" * 40 + "etc/passwd", None, 3, [], "workflows/x.yaml"],
    "rewrites": [None, [], ["split decode 0"], ["nonsense"], "split decode 2", [1], [["x"]]],
    "layout": [None, {}, {"sim_replicas": -1}, {"nope": 2}, [1], "x"],
    "params": [None, {}, [], "x", {"iterations": -1}, {"iterations": 10 ** 12}, {"new": "${new}"}],
}


def _fresh(values: list[Any]) -> st.SearchStrategy[Any]:
    """One of `values`, a copy (a mutation changes what it put in, and the next example must not see it)."""
    return st.sampled_from(values).map(copy.deepcopy)


VALUE = st.one_of(st.sampled_from(NUMBERS), st.sampled_from(STRINGS), _fresh([None, [], {}]),
                  st.integers(0, 80).map(_nested), st.text(max_size=20))


# --- mutations ---------------------------------------------------------------------------------------------------------
def _paths(node: Any, prefix: tuple = (), above: frozenset[int] = frozenset()) -> list[tuple]:
    """Every path into `node` (keys of mappings, indices of lists), not into a subtree that holds itself."""
    found = [prefix]
    if id(node) in above or len(prefix) > 40:
        return found
    inner = above | {id(node)}
    if isinstance(node, dict):
        for k, v in node.items():
            found += _paths(v, (*prefix, k), inner)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            found += _paths(v, (*prefix, i), inner)
    return found


def _get(doc: Any, path: tuple) -> Any:
    for p in path:
        doc = doc[p]
    return doc


def _mutate(doc: Any, draw: Any) -> Any:
    """One structural change of `doc` (in place, where it has a parent)."""
    paths = _paths(doc)[1:]
    if not paths:
        return doc
    path = draw(st.sampled_from(paths))
    parent, key = _get(doc, path[:-1]), path[-1]
    op = draw(st.sampled_from(["drop", "duplicate", "retype", "field", "alias", "self", "add"]))
    if op == "drop":
        del parent[key]
    elif op == "duplicate":  # a list item twice, a key under a second name (a duplicate key: below, in the text)
        if isinstance(parent, list):
            parent.insert(key, parent[key])
        else:
            parent[f"{key}2"] = parent[key]
    elif op == "retype":
        parent[key] = draw(VALUE)
    elif op == "field":  # a value particular to one field, put where that field may be
        name = draw(st.sampled_from(sorted(FIELD_VALUES)))
        target = parent if isinstance(parent, dict) else parent[key] if isinstance(parent[key], dict) else None
        if target is not None:
            target[name] = draw(_fresh(FIELD_VALUES[name]))
    elif op == "alias":  # another subtree shared here: yaml.dump writes it as an anchor and an alias
        parent[key] = _get(doc, draw(st.sampled_from(paths)))
    elif op == "self" and isinstance(parent[key], (dict, list)):  # a subtree that holds itself (a recursive alias)
        inner = parent[key]
        if isinstance(inner, dict):
            inner["again"] = inner
        else:
            inner.append(inner)
    elif op == "add" and isinstance(parent, dict):
        parent[draw(st.sampled_from(["bogus", "nodes", "phases", "split_of", "group", "merge", "env", "venv"]))] = \
            draw(VALUE)
    return doc


def _text_edit(text: str, draw: Any) -> str:
    """A change only the text can make: a duplicated key, an anchor used before it is defined, a tab."""
    lines = text.splitlines(keepends=True)
    i = draw(st.integers(0, len(lines) - 1))
    op = draw(st.sampled_from(["dup_line", "alias_undefined", "anchor", "tab", "merge_key", "tag"]))
    line = lines[i]
    if op == "dup_line":
        lines.insert(i, line)
    elif op == "alias_undefined" and ": " in line:
        lines[i] = line.split(": ", 1)[0] + ": *nowhere\n"
    elif op == "anchor" and ": " in line and not line.rstrip().endswith(":"):
        head, value = line.split(": ", 1)
        lines[i] = f"{head}: &a {value}"
        lines.append("extra: *a\n")
    elif op == "tab":
        lines[i] = "\t" + line
    elif op == "merge_key" and ": " in line:
        indent = line[: len(line) - len(line.lstrip())]
        lines.insert(i, f"{indent}<<: {{count: 3}}\n")
    elif op == "tag" and ": " in line:
        head, value = line.split(": ", 1)
        lines[i] = f"{head}: !!python/object:os.system {value}"
    return "".join(lines)


def _dump(doc: Any) -> str:
    try:
        return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, width=200)
    except (yaml.YAMLError, RecursionError, ValueError):  # a structure PyYAML cannot write
        return yaml.safe_dump({"rose": 1, "name": "unwritable"})


def _write(directory: str, name: str, text: str) -> str:
    path = Path(directory) / name
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    return str(path)


@cache
def _plan(workflow: str, request: str) -> str:
    """The plan `rose rewrite WORKFLOW --do REQUEST` writes."""
    code, text = _invoke(["rewrite", str(ROOT / workflow), "--do", request])
    assert code == 0, text
    return text[text.index("# plan written"):]


# --- the cases -----------------------------------------------------------------------------------------------------------
@st.composite
def mutated_workflows(draw: Any) -> tuple[str, str]:
    """(file name, text): a shipped workflow, mutated."""
    name = draw(st.sampled_from(WORKFLOWS))
    doc = yaml.safe_load((ROOT / "workflows" / name).read_text())
    for _ in range(draw(st.integers(1, 3))):
        doc = _mutate(doc, draw)
    text = _dump(doc)
    if draw(st.booleans()):
        text = _text_edit(text, draw)
    return name, text


@st.composite
def mutated_plans(draw: Any) -> tuple[str, str]:
    """("plan.yaml", text): a plan `rose rewrite` wrote, its `plan:` block or its body (or both) mutated."""
    doc = yaml.safe_load(_plan(*draw(st.sampled_from(PLANS))))
    block = draw(st.sampled_from(["plan", "body", "both"]))
    for _ in range(draw(st.integers(1, 3))):
        if block in ("plan", "both") and isinstance(doc.get("plan"), dict) and doc["plan"]:
            if draw(st.booleans()):
                doc["plan"] = _mutate(doc["plan"], draw)
            key = draw(st.sampled_from(["source", "rewrites", "layout", "plan", "params"]))
            if key == "params":
                doc["params"] = draw(_fresh(FIELD_VALUES["params"]))
            elif isinstance(doc.get("plan"), dict):
                doc["plan"][key] = draw(_fresh(FIELD_VALUES[key]))
        if block in ("body", "both"):
            doc = _mutate(doc, draw) if draw(st.booleans()) else _reset_field(doc, draw)
    return "plan.yaml", _dump(doc)


def _reset_field(doc: Any, draw: Any) -> Any:
    """A plan's own fields given another value where they are: `defer:`, `ahead:`, `rows:`, `split_of:`,
    `group:`, `until:`, `max_staleness:`, `count:`."""
    name = draw(st.sampled_from(["defer", "ahead", "rows", "split_of", "group", "until", "max_staleness", "count"]))
    places = [p for p in _paths(doc) if p and p[-1] == name]
    if places:
        path = draw(st.sampled_from(places))
        values = FIELD_VALUES.get(name, [None, -1, 10 ** 12, "nope", "", [], {"a": 1}, 2.5])
        _get(doc, path[:-1])[name] = draw(_fresh(values))
    return doc


VERBS = ["split", "split-chain", "split-time", "interleave", "fuse", "rewire", "expand", "defer", "ahead", "merge", ""]


@st.composite
def rewrite_requests(draw: Any) -> tuple[str, str, tuple[str, ...]]:
    """(file name, its text, requests): random `rose rewrite --do` requests on a shipped workflow or on a plan
    `rose rewrite` wrote (a plan is rewritten further as a workflow is)."""
    from rose_dsl import load_workflow_text
    from rose_dsl.ir import LoopNode

    if draw(st.booleans()):
        name = draw(st.sampled_from(WORKFLOWS))
        text = (ROOT / "workflows" / name).read_text()
    else:
        name, text = "plan.yaml", _plan(*draw(st.sampled_from(PLANS)))
    wf = load_workflow_text(text, name)
    items = sorted({i.name for i in wf.items()})
    word = st.one_of(st.sampled_from(items), st.sampled_from(["iteration", "epoch.step", "before", "after", "nope",
                                                              "iteration.nope", "a..b", ""]),
                     st.sampled_from([str(n) for n in (0, 1, 2, 3, -1, 64, 65, 10 ** 12, 10 ** 30)] + ["2.5", "x"]))
    loops = sorted({i.name for i in wf.items() if isinstance(i, LoopNode)}) or items
    shaped = st.one_of(st.tuples(st.sampled_from(["split", "expand", "defer", "ahead", "rewire"]), st.sampled_from(items),
                                 st.sampled_from(["", "1", "2", "3"])),
                       st.tuples(st.sampled_from(["split-time", "interleave", "split"]), st.sampled_from(loops),
                                 st.sampled_from(["", "2", "4"])))
    requests = [" ".join([draw(st.sampled_from(VERBS)), *draw(st.lists(word, max_size=4))]) if draw(st.booleans())
                else " ".join(draw(shaped)).strip()  # (the form of a request: more of them get past the parser)
                for _ in range(draw(st.integers(1, 2)))]
    return name, text, tuple(requests)


def _without_params(plan: tuple) -> str:
    doc = yaml.safe_load(_plan(*plan))
    doc["params"] = {}
    return _dump(doc)


def _validate(case: tuple[str, str]) -> None:
    name, text = case
    with tempfile.TemporaryDirectory() as d:
        _check(["validate", _write(d, name, text)])


# --- the properties ------------------------------------------------------------------------------------------------------
@FAST
@given(mutated_workflows())
def test_mutated_workflows_validate_or_are_refused_with_a_position(case: tuple[str, str]) -> None:
    _validate(case)


@FAST
@given(mutated_plans())
@example(("plan.yaml", "rose: 1\n" + "#\n" * 98 + "rose2: 1\n")).via(
    "found: an error at line 100 printed as `plan.yaml💯1` (rich read `:100:` as an emoji code); the "
    "consoles print no emoji now (rose_dsl/cli.py)")
@example(("plan.yaml", _without_params(PLANS[3]))).via(
    "found: a plan whose `params:` were emptied by hand still reads `${epochs}` in an `in:` expression; it was "
    "validated, and the plan check raised KeyError('epochs') building its graph (exit 1). An undefined param "
    "in any body expression is refused where it is written now (rose_dsl/build.py, `_Ctx.expression`)")
def test_mutated_plans_validate_or_are_refused_with_a_position(case: tuple[str, str]) -> None:
    _validate(case)


@FAST
@given(rewrite_requests())
def test_random_rewrite_requests_apply_or_are_refused(case: tuple[str, str, tuple[str, ...]]) -> None:
    name, text, requests = case
    with tempfile.TemporaryDirectory() as d:
        _check(["rewrite", _write(d, name, text), *(a for r in requests for a in ("--do", r))])


# --- `--set` values, and every command's options -------------------------------------------------------------------------
# `rose execute`, `optimize` and `compare` are run up to where they would start processes: `rose_cli.run.gpu_session`
# (the first thing each does after every check -- options, workflow, plans, trust, run directory) raises `Started`
# instead, so no example trains. `validate --import` starts a child process per component and is left out
# (`tests/cli/test_import_check.py` runs it); every other option is drawn.
ARG_COMMANDS = ["execute", "optimize", "graph", "rewrite", "compare", "validate"]
EXPENSIVE = {("validate", "--import")}
ARG_WORKFLOWS = {"latency_interaction.yaml": "split epoch.step 2", "latency_until_episodes.yaml": "split-time epoch 2"}
HANG_S = 120  # a command that has not ended by then hangs (each example is one in-process command: well under 1 s)


class Started(Exception):
    """Raised in place of `rose_cli.run.gpu_session`: the command accepted its input and would start processes."""


class Hung(BaseException):
    """A command ran past `HANG_S` (a BaseException: no `except Exception` in rose swallows it)."""


@contextlib.contextmanager
def _no_start_and_no_hang(what: str) -> Any:
    def fire(signum: int, frame: Any) -> None:
        raise Hung(f"rose {what}: still running after {HANG_S} s")

    previous = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, HANG_S)
    try:
        with mock.patch("rose_cli.run.gpu_session", side_effect=Started):
            yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _run_args(args: list[str]) -> tuple[int | str, str]:
    """`rose ARGS` in this process: (exit code, or "started" where it would have started processes; what it printed).
    An exception other than `Started`, or a hang, fails the example."""
    with _no_start_and_no_hang(" ".join(args)):
        result = CliRunner().invoke(app, args)
    if isinstance(result.exception, Started):
        return "started", result.output
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"rose {' '.join(args)} raised {result.exception!r}\n{result.output}") from result.exception
    return result.exit_code, result.output


NAMED = re.compile(r"\.yaml:\d+:\d+|<command line>|refused: |--[a-z][a-z0-9-]*|'-[a-z]'|[Mm]issing (argument|option)|"
                   r"[Nn]o such option|[Gg]ot unexpected extra argument")


def _check_refusal(args: list[str], code: int | str, output: str) -> None:
    """Exit 2 says what it refuses: one message naming the file (at its line and column), the option or the param, and
    no traceback and no internal error."""
    shown = " ".join(args)
    assert code in (0, 2, "started"), f"rose {shown}: exit {code}\n{output}"
    assert "Traceback" not in output and "internal error" not in output, f"rose {shown}:\n{output}"
    if code == 2:
        assert NAMED.search(output) or any(a in output for a in args if len(a) > 3), \
            f"rose {shown}: exit 2 naming neither the file, an option nor a param:\n{output}"
        assert len(re.findall(r"^(?:Error|error): ", output, re.M)) <= 1, f"rose {shown}: more than one error:\n{output}"


# -- `--set NAME=VALUE`
SET_VALUES = ["", " ", "0", "-1", "1", "2", "3", "-0", "2.5", "1e3", "nan", ".nan", "NaN", "inf", ".inf", "-.inf", "1e309",
              "-1e309", str(10 ** 30), str(2 ** 62), str(2 ** 62 + 1), str(-(2 ** 63)), "0x10", "0o17", "1_000",
              "ü∞", "\u202e1", "\x00", "x" * 5000, "!!python/object:os.system", "!!python/object/apply:os.system [ls]",
              "!!binary aGk=", "!!float 1", "{a: 1}", "{", "[1,", "[1, 2]", "[]", "~", "null", "yes", "no", "true",
              "false", "on", "off", "y", "${iterations}", "${nope}", "${", "*a", "&a 1", "'quoted'", '"3"', ":", "- 1",
              "a: b", "#", "1 # two", "%YAML 1.1", "---", "..."]
SET_NAMES = ["nope", "", " ", "Iterations", "iterations.x", "${iterations}", "a=b", "ü", "\u202e"]


def _set_item(params: list[str]) -> st.SearchStrategy[str]:
    name = st.one_of(st.sampled_from(params), st.sampled_from(params).map(lambda n: f" {n} "), st.sampled_from(SET_NAMES))
    numbers = st.one_of(st.integers(-3, 70).map(str), st.floats(-1e6, 1e6).map(repr))  # (mostly taken: a workflow's)
    value = st.integers(0, 4).flatmap(lambda i: st.sampled_from(SET_VALUES) if i < 2 else
                                      st.text(max_size=12) if i == 2 else numbers)
    malformed = st.one_of(st.sampled_from(params), st.just("="), st.just(""))  # (no `=`, or no name)
    # (one item in six malformed: a choice drawn as a number, which hypothesis does not bend toward its first branch)
    return st.integers(0, 5).flatmap(lambda i: malformed if i == 0 else st.builds(lambda n, v: f"{n}={v}", name, value))


def _refused_set(declared: dict[str, Any], item: str) -> str | None:
    """Why `--set ITEM` must be refused whatever the workflow does with the value (None: it depends on the
    workflow): no `=`, a name the workflow does not declare, a value that is not YAML, a YAML tag, a non-finite or
    huge number, or another kind than a number or boolean param's."""
    from rose_dsl.build import _ACCEPTS, MAX_INT, _kind
    from rose_dsl.loader import load_value

    name, sep, raw = item.partition("=")
    name = name.strip()
    if not sep or not name:
        return "not NAME=VALUE"
    if name not in declared:
        return "an undefined param"
    try:
        value = load_value(raw, "--set x") if raw.strip() else ""
    except ValueError:
        return "not a value"
    if not isinstance(value, bool | int | float | str):
        return "not a param's value"  # (a list, a mapping, null: the schema's params are scalars)
    if isinstance(value, float) and not math.isfinite(value):
        return "not finite"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INT:
        return "too large"
    kind = _kind(declared[name])
    if kind is not None and _kind(value) not in _ACCEPTS[kind]:
        return f"not {kind}"
    return None


@st.composite
def set_cases(draw: Any) -> tuple[str, list[str]]:
    name = draw(st.sampled_from(WORKFLOWS))
    params = list(yaml.safe_load((ROOT / "workflows" / name).read_text()).get("params") or {})
    return name, draw(st.lists(_set_item(params or ["iterations"]), min_size=1, max_size=2))


@FEWER
@given(set_cases())
@example(("latency_interaction.yaml", ["iterations=1e309"])).via("1e309 is infinity: refused as not finite")
@example(("embodied_ppo.yaml", ["trainer_replicas=${replicas}"])).via("a --set value is a value, not an expression")
@example(("embodied_grpo.yaml", ["seed=", "seed=1"])).via("a param given twice: the last value counts")
@example(("embodied_grpo.yaml", ["seed=\x00", "seed=1"])).via("...but every value must read as one")
@example(("embodied_ppo_metaworld.yaml", ["task=- 1"])).via(
    "found: a list, a mapping or null given by --set to a param declared as text (`task: reach-v3`) validated, where "
    "the same value in the file's params: is refused by the schema; refused at the command line now "
    "(rose_dsl/build.py, `_params`)")
def test_set_values_are_taken_as_the_file_would_take_them_or_refused_at_the_command_line(
        case: tuple[str, list[str]]) -> None:
    """`validate FILE --set ...`: a value refused whatever the workflow does with it (`_refused_set`) exits 2 naming
    `--set` or the param; any other ends as the same workflow with the value written in its `params:` does (the
    values are read as the file's are), except a string holding `${`, which --set passes as text."""
    name, items = case
    doc = yaml.safe_load((ROOT / "workflows" / name).read_text())
    declared = doc.get("params") or {}
    args = ["validate", str(ROOT / "workflows" / name), *(a for i in items for a in ("--set", i))]
    code, output = _run_args(args)
    _check_refusal(args, code, output)
    # (a param set twice: the last value counts, but every value must read as one)
    last = {i.partition("=")[0].strip() if "=" in i else f"#{n}": i for n, i in enumerate(items)}
    unreadable = ("not NAME=VALUE", "not a value")
    why = next((w for i in items if (w := _refused_set(declared, i)) in unreadable), None) or \
        next((w for i in last.values() if (w := _refused_set(declared, i)) is not None), None)
    event(f"--set: {why or 'taken'}: exit {code}")
    if why is not None:
        assert code == 2, f"rose {' '.join(args)}: {why}, yet exit {code}\n{output}"
        return
    from rose_dsl.loader import load_value

    edited = copy.deepcopy(doc)
    for item in last.values():
        key, _, raw = item.partition("=")
        value = load_value(raw, "--set x") if raw.strip() else ""
        if isinstance(value, str) and "${" in value:
            return  # (in the file, an expression; on the command line, text)
        edited["params"][key.strip()] = value
    with tempfile.TemporaryDirectory() as d:
        in_file, _ = _run_args(["validate", _write(d, name, _dump(edited))])
    assert code == in_file, f"rose {' '.join(args)}: exit {code}, but exit {in_file} with the values in the file\n{output}"


# -- every option of every command, found by asking typer's click command for them
@dataclass(frozen=True)
class Piece:
    """Words of a command line, and whether they are refused whatever else is given (False), fine alone (True), or
    either, depending on the rest (None). `{d}` stands for the example's directory."""

    words: tuple[str, ...]
    valid: bool | None
    unless: str | None = None  # (refused unless this option is on the line too)


# the example's directory: a copy of the workflow, a plan of it, an invalid workflow, a directory, a file, a link
FILES = {"wf": "{d}/wf.yaml", "plan": "{d}/plan.yaml", "bad": "{d}/bad.yaml", "dir": "{d}/dir", "full": "{d}/full",
         "text": "{d}/notes.txt", "missing": "{d}/missing.yaml", "nodir": "{d}/nodir/x.yaml", "link": "{d}/link"}
# what a text option is given (its values mean what the command makes of them: most are valid or not by the rest)
TEXT_VALUES: dict[str, list[tuple[str, bool | None]]] = {
    "allow_module": [("examples.", None), ("examples", None), ("os", None), ("", False), ("ü", None)],
    "allow_env": [("MUJOCO_GL", None), ("LD_PRELOAD", None), ("", False), ("A=B", None)],
    "allow_path": [("{d}", None), ("/nonexistent", None), ("{d}/notes.txt", None), ("", False)],
    "allow_param_change": [("iterations", None), ("nope", None), ("a,b", None), ("", None), (",", None)],
    "logger": [("tensorboard", True), ("none", True), ("bogus", False), ("none,mlflow", False), ("", False),
               ("tensorboard,tensorboard", None), (",", False)],
    "address": [("auto", None), ("127.0.0.1:1", None), ("ray://127.0.0.1:1", None), ("", None), ("x:y", None)],
    "layout": [("x", False), ("nope=1", False), ("=1", False), ("", False), ("iterations=1,2", None),
               ("num_envs=8", None), ("num_envs=", False)],
    "do": [("split epoch.step 2", None), ("nonsense", False), ("", False), ("defer sync 1", None), ("split", False)],
    # (with --train only: a value valid on its own is still refused without it)
    "max_overhead": [("2%", None), ("2", None), ("0.5 %", None), ("0", False), ("100%", False), ("nan", False),
                     ("-1%", False), ("two", False), ("", False)],
    "plans": [(FILES["plan"], None), ("p=" + FILES["plan"], None), (FILES["missing"], False), (FILES["dir"], False),
              (FILES["bad"], False), ("=", False), ("", False), ("a=" + FILES["text"], False)],
}


# options whose values are taken only with another option (the fuzz does not require them to be taken alone)
NOT_ALONE = {("execute", "--resume"): "needs --out holding a run", ("optimize", "--checkpoint-every"): "needs --train",
             ("optimize", "--resume"): "needs --train --max-overhead and --out holding such a run"}


@cache
def _params_of(command: str) -> list[Any]:
    return [p for p in typer.main.get_command(app).commands[command].params
            if not any((command, o) in EXPENSIVE for o in p.opts)]


def _annotation(p: Any) -> Any:
    return p.type_descriptor.annotation


def _path_pieces(opt: str, info: Any) -> list[Piece]:
    """A path option's values, refused by click where its `exists`/`file_okay`/`dir_okay` say so; a directory rose
    writes into (`--out`, `--report`, `--runs`: only a directory, perhaps not there yet) that is a link, refused unless
    --follow-links."""
    found = []
    writes_into = not info.exists and not info.file_okay and info.dir_okay
    for kind, path in FILES.items():
        is_file, is_dir = kind in ("wf", "plan", "bad", "text"), kind in ("dir", "full", "link")
        refused = (info.exists and not (is_file or is_dir)) or (is_file and not info.file_okay) or \
            (is_dir and not info.dir_okay)
        if kind == "link" and writes_into:
            found.append(Piece((opt, path), False, unless="--follow-links"))
        elif kind == "missing" and not info.exists and not info.dir_okay:  # (a file to write, new)
            found.append(Piece((opt, path), True))
        else:
            found.append(Piece((opt, path), False if refused else None))
    return found


def _pieces(command: str, p: Any) -> list[Piece]:
    """Every value drawn for the option `p` of `command`, from its type (`p.type_descriptor`) and range."""
    opt = p.opts[0]
    kind, info = _annotation(p), p.type_descriptor.parameter_info
    if p.name == "sets":
        return []  # (drawn from the workflow's params: `_set_item`)
    alone = None if (command, opt) in NOT_ALONE else True
    if kind is bool:
        return [Piece((o,), alone) for o in (*p.opts, *p.secondary_opts)] + [Piece((f"{opt}=yes",), False)]
    if isinstance(kind, type) and issubclass(kind, Enum):
        return [Piece((opt, e.value), True) for e in kind] + [Piece((opt, "bogus"), False), Piece((opt, ""), False),
                                                             Piece((opt, next(iter(kind)).value.upper()), None)]
    if kind is int:
        low = p.min if p.min is not None else 0
        return [Piece((opt, str(v)), alone) for v in (low, low + 1, low + 2)] + \
            [Piece((opt, v), False) for v in ("x", "1.5", "", "0x10", "nan")] + \
            [Piece((opt, str(10 ** 30)), None)] + ([Piece((opt, str(low - 1)), False)] if p.min is not None else [])
    if kind is float:  # (each float option takes a positive number or a fraction: its callback says which)
        assert p.callback is not None, f"{command} {opt}: a float option with no range check"
        return [Piece((opt, v), False) for v in ("nan", "-nan", "x", "", "-1", "-inf")] + \
            [Piece((opt, v), None) for v in ("0", "inf", "1e309", "1e-300")] + [Piece((opt, "0.5"), True)]
    if kind is Path:
        return _path_pieces(opt, info)
    assert p.name in TEXT_VALUES, f"{command} {opt}: a text option with no values to draw (add it to TEXT_VALUES)"
    return [Piece((opt, v), tag) for v, tag in TEXT_VALUES[p.name]]


def test_every_option_of_the_fuzzed_commands_has_values_to_draw() -> None:
    """A new option is drawn from its type; a new text option needs values in TEXT_VALUES (this fails until it has)."""
    for command in ARG_COMMANDS:
        for p in _params_of(command):
            if p.opts[0].startswith("-") and p.name != "sets":
                assert _pieces(command, p), (command, p.name)


@st.composite
def command_lines(draw: Any) -> tuple[str, str, list[Piece]]:
    """(command, workflow, pieces): the FILE argument and up to 6 options of one command (an option may come twice),
    perhaps `--set`s, an unknown option, an option without its value, or FILE after the options."""
    command = draw(st.sampled_from(ARG_COMMANDS))
    workflow = draw(st.sampled_from(sorted(ARG_WORKFLOWS)))
    params = _params_of(command)
    options = [p for p in params if p.opts[0].startswith("-")]
    file = draw(st.sampled_from([Piece((FILES["wf"],), None)] * 12 + [Piece((FILES["plan"],), None)] * 3 +
                                [Piece((FILES[k],), False) for k in ("missing", "dir", "bad", "link")] +
                                [Piece(("",), False)]))
    pieces: list[Piece] = []
    for p in draw(st.lists(st.sampled_from(options), max_size=6)):
        if p.name == "sets":  # (one in six a random item; else a param set to its own value)
            declared = yaml.safe_load((ROOT / "workflows" / workflow).read_text())["params"]
            item = draw(_set_item(list(declared)) if draw(st.integers(0, 5)) == 0 else
                        st.sampled_from([f"{k}={v}" for k, v in declared.items()]))
            pieces.append(Piece(("--set", item), False if _refused_set(declared, item) else None))
        else:
            drawn = _pieces(command, p)  # (five times in six a value that may be taken: more lines get past the checks)
            refused = [piece for piece in drawn if piece.valid is False]
            taken = [piece for piece in drawn if piece.valid is not False]
            pieces.append(draw(st.sampled_from(refused if refused and (not taken or draw(st.integers(0, 5)) == 0)
                                               else taken)))
    for p in options:  # (most lines give the options a command requires: `optimize -o`)
        if p.required and draw(st.integers(0, 3)) > 0:
            pieces.append(Piece((p.opts[0], FILES["missing"]), True))
    end = draw(st.sampled_from([""] * 12 + ["unknown", "no value", "extra"]))
    if end == "unknown":
        pieces.append(Piece(("--bogus",), False))
    elif end == "no value":
        valued = [p for p in options if _annotation(p) is not bool]
        pieces.append(Piece((draw(st.sampled_from(valued)).opts[0],), False))
    elif end == "extra":
        pieces.append(Piece(("extra.yaml",), False))
    if draw(st.booleans()):
        pieces.insert(0, file)
    else:
        pieces.insert(len(pieces) - (end != ""), file)
    return command, workflow, pieces


def _expected_refusal(command: str, pieces: list[Piece]) -> bool:
    """Whether the command line must be refused: a piece refused whatever else is given (for an option that takes
    one value, its last occurrence counts: click keeps the last), or a required option missing."""
    if any(piece.words == ("--help-requests",) for piece in pieces):  # (`rewrite`: a help, as -h, applies nothing)
        pieces = [Piece(p.words, None) if p.words[0] in ("--do", "--layout", "--set", FILES["bad"]) else p for p in pieces]
    given = {w for piece in pieces for w in piece.words[:1]}
    pieces = [Piece(p.words, None) if p.unless in given else p for p in pieces]
    last: dict[str, Piece] = {}
    for piece in pieces:
        p = next((p for p in _params_of(command) if piece.words[0] in (*p.opts, *p.secondary_opts)), None)
        key = piece.words[0] if p is None or p.multiple else p.name
        if piece.words[0] == "--set" and len(piece.words) == 2 and "=" in piece.words[1]:
            key = "--set " + piece.words[1].partition("=")[0].strip()  # (a param set twice: the last value counts)
        elif p is None or p.multiple or len(piece.words) == 1 and _annotation(p) is not bool:
            key = f"{key}#{id(piece)}"  # (each counts: a repeatable option's values, an option without its value)
        last[key] = piece
    required = [p for p in _params_of(command) if p.required and p.opts[0].startswith("-")]
    return any(piece.valid is False for piece in last.values()) or any(not set(p.opts) & given for p in required)


def _directory(d: str, workflow: str) -> None:
    text = (ROOT / "workflows" / workflow).read_text()
    Path(d, "wf.yaml").write_text(text)
    plan = _plan(f"workflows/{workflow}", ARG_WORKFLOWS[workflow]).replace(str(ROOT / "workflows" / workflow), str(Path(d, "wf.yaml")))
    Path(d, "plan.yaml").write_text(plan)
    Path(d, "bad.yaml").write_text("rose: 1\nname: bad\ncomponents: {}\niteration: {count: -1, body: []}\n")
    Path(d, "dir").mkdir()
    Path(d, "full").mkdir()
    Path(d, "full", "kept.txt").write_text("a user's file\n")
    Path(d, "notes.txt").write_text("notes\n")
    Path(d, "link").symlink_to(Path(d, "dir"))


def _expected_to_run(command: str, pieces: list[Piece]) -> bool:
    """Whether the command line must be taken: the workflow as FILE and every option a value taken alone (`rewrite`
    needs a request, which may be refused, so it is left out)."""
    return command != "rewrite" and sum(p.words == (FILES["wf"],) for p in pieces) == 1 and \
        all(p.valid is True for p in pieces if p.words != (FILES["wf"],)) and \
        all(set(p.opts) & {w for piece in pieces for w in piece.words[:1]}
            for p in _params_of(command) if p.required and p.opts[0].startswith("-"))


@FEWER
@given(command_lines())
@example(("validate", "latency_interaction.yaml", [Piece(("{d}/wf.yaml",), None), Piece(("--allow-module", ""), False)])).via(
    "found: an empty --allow-module / --allow-path / --allow-env value was taken (`--allow-path \"$DIR\"` with DIR unset "
    "allowed the current directory); refused at the option now (rose_dsl/cli.py, `_names_something`)")
@example(("compare", "latency_interaction.yaml", [Piece(("{d}/wf.yaml",), None), Piece(("--overwrite",), True),
                                                   Piece(("--runs", "{d}/link"), False, "--follow-links")])).via(
    "found: `rose compare --runs LINK --overwrite` removed the rounds of an earlier compare where LINK points and "
    "wrote through it, and `rose optimize --report LINK --overwrite` removed a report's files there; both are refused "
    "unless --follow-links, as --out is (rose_cli/execute.py, `refuse_linked_dir`)")
def test_random_command_lines_run_only_when_valid_and_are_refused_with_one_clear_message(
        case: tuple[str, str, list[Piece]]) -> None:
    """Each of execute, optimize, graph, rewrite, compare, validate with random options of its own (each option's
    name and type from the typer command): a command line with a value refused whatever else is given exits 2, with
    one message naming the file, the option or the param; none ever raises, exits 1 or hangs."""
    command, workflow, pieces = case
    with tempfile.TemporaryDirectory() as d:
        _directory(d, workflow)
        args = [command, *(w.replace("{d}", d) for piece in pieces for w in piece.words)]
        code, output = _run_args(args)
        _check_refusal(args, code, output)
    must_refuse, must_run = _expected_refusal(command, pieces), _expected_to_run(command, pieces)
    event(f"{command}: {'refused by construction' if must_refuse else 'valid by construction' if must_run else 'may run'}: "
          f"{code}")
    if must_refuse:
        assert code == 2, f"rose {' '.join(args)}: refused by construction, yet {code}\n{output}"
    if must_run:
        assert code in (0, "started"), f"rose {' '.join(args)}: valid by construction, yet {code}\n{output}"
