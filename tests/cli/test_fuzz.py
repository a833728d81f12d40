"""A fuzzing pass over the command line and plan files (issue 59): `rose validate` and `rose rewrite --do`, run
in this process (typer's CliRunner on `rose_cli.main:app`) on

* random mutations of the shipped workflows (`workflows/*.yaml`): a field dropped, duplicated or retyped; a
  number made 0, negative, huge, a float, a string; unicode, deep lists, long strings; bad `${...}`
  references, bad expressions in `in:` ports and `collect:`; bad `until:`, `max_staleness`, `defer:`,
  `ahead:`, `rows:` values; YAML anchors and aliases (a subtree shared, or one that holds itself);
* random plan files: a `rose rewrite` output whose `plan:` block (source, rewrites, layout) or body is mutated
  the same way, validated as a plan against its recorded source;
* random rewrite requests (a verb, names of the file's items or not, numbers) on the shipped workflows and on
  those plans.

Every outcome is exit 0, or exit 2 with a message positioned at `FILE:LINE:COL` (or naming the request or
option it refuses); never a traceback, never exit 1 (an internal error). The work is bounded by construction
(each example is one or two in-process commands on a workflow of the repository, at most a few mutations),
not by a deadline: hypothesis runs with `deadline=None` (tests/conftest.py). The default profile draws 40
examples per property (a few seconds); `--hypothesis-profile=long` draws 3,000.

Every failure it found is pinned below as an `@example`, with what it was and the fix.
"""

from __future__ import annotations

import copy
import re
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

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
