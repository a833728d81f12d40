"""The loader builds documents from parser events; PyYAML is the oracle. On any text (generated
workflows in every YAML style, with anchors, aliases, tags and random edits):
  * when the loader accepts it, the data is what `yaml.safe_load` gives, and every recorded position
    is the start mark of the node PyYAML's composer builds at that path (quoted scalars: one column in);
  * when PyYAML's composer rejects the text (syntax, undefined alias, duplicate anchor, two documents),
    the loader reports "not valid YAML" at the same mark -- even where a building error (a duplicate
    key, a merge key) comes earlier in the file, as when the composed graph was built afterwards.
"""

from __future__ import annotations

import pickle

import pytest
import yaml
from hypothesis import example, given, settings
from hypothesis import strategies as st
from yaml.constructor import SafeConstructor

import rose_dsl.loader as loader_module
from rose_dsl import WorkflowError, load_workflow
from rose_dsl.loader import FieldPositions, Limits, load_text

from ..strategies import workflows

# the parser the loader uses (marks differ slightly), with its one difference from PyYAML's safe loader:
# YAML 1.2's floats (`1e-4` a number; issue 42)
LOADER = loader_module._SafeLoader
CHARS = list(" :-[]{}\"'.$*@0123456789abcxyz\n\t#&!|>%,?~")
PIECES = CHARS + ["<<", "!!str ", "!!int ", "!!binary ", "---\n", "...\n", "\n- ", "&x ", "*x", "&y ", "*y", "2001-12-14",
                  "null", "yes", "0x1f", "1e3", "'q'", '"d"', "|\n  t\n"]


def _walk_composed(node: yaml.Node, path: tuple, out: dict, keys: dict, active: frozenset = frozenset()) -> None:
    """Every (path -> (line, col)) of a composed node graph, as the loader records them."""
    if id(node) in active:
        return
    m = node.start_mark
    shift = 2 if isinstance(node, yaml.ScalarNode) and node.style in ("'", '"') else 1
    out[path] = (m.line + 1, m.column + shift)
    if isinstance(node, yaml.SequenceNode):
        for i, child in enumerate(node.value):
            _walk_composed(child, path + (i,), out, keys, active | {id(node)})
    elif isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            key = SafeConstructor().construct_object(k, deep=True) if isinstance(k, yaml.ScalarNode) else None
            key = key if isinstance(key, str) else str(key)
            keys[path + (key,)] = (k.start_mark.line + 1, k.start_mark.column + 1)
            _walk_composed(v, path + (key,), out, keys, active | {id(node)})


def _keys_as_str(data):
    """PyYAML's data with mapping keys written as strings, as the loader keeps them (a workflow's keys
    are names)."""
    if isinstance(data, dict):
        return {k if isinstance(k, str) else str(k): _keys_as_str(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_keys_as_str(v) for v in data]
    return data


def _check(text: str) -> None:
    try:
        composed = yaml.compose(text, Loader=LOADER)
        composer_error = None
    except yaml.MarkedYAMLError as exc:
        composed, composer_error = None, exc
    except yaml.YAMLError:
        return  # a reader error (a control character): the loader's message is checked elsewhere
    try:
        doc = load_text(text, "wf.yaml")
    except WorkflowError as exc:
        assert exc.text == text
        if composer_error is not None:
            mark = composer_error.problem_mark or composer_error.context_mark
            d = exc.diagnostics[0]
            assert d.message.startswith("not valid YAML"), d
            assert (d.pos.line, d.pos.col) == (mark.line + 1, mark.column + 1), (d, composer_error)
        return
    assert composer_error is None, composer_error
    if composed is None:
        return
    assert repr(doc.data) == repr(_keys_as_str(yaml.load(text, Loader=LOADER)))
    values: dict = {}
    keys: dict = {}
    _walk_composed(composed, (), values, keys)
    assert {p: v[:2] for p, v in doc.positions.items()} == values
    assert {p: v[:2] for p, v in doc.key_positions.items()} == keys


def _edited(text: str, data: st.DataObject) -> str:
    for _ in range(data.draw(st.integers(0, 5))):
        if not text:
            break
        i = data.draw(st.integers(0, len(text) - 1))
        piece = data.draw(st.sampled_from(PIECES))
        op = data.draw(st.sampled_from(["delete", "insert", "replace"]))
        text = text[:i] + (piece if op != "delete" else "") + text[i + (0 if op == "insert" else 1):]
    return text


@settings()
@given(workflows(max_nodes=8), st.data())
def test_loader_agrees_with_pyyaml_on_edited_workflows(doc, data) -> None:
    flow = data.draw(st.sampled_from([None, True, False]))
    _check(_edited(yaml.safe_dump(doc, sort_keys=False, default_flow_style=flow), data))


@settings()
@given(st.lists(st.sampled_from(PIECES), max_size=40).map("".join))
@example("!:\n- ")  # found by this test: an unknown tag on a list, which PyYAML's safe loader refuses
def test_loader_agrees_with_pyyaml_on_fragments(text: str) -> None:
    if text.strip():
        _check(text)


@pytest.mark.parametrize("text", [
    "a: &x [1, {b: 2}]\nc: *x\n",                  # an alias replays its anchored node, positions included
    "a: &k b\n*k : 3\n",                           # an alias as a mapping key
    "a: 1\na: 2\nb: [\n",                          # a syntax error later wins over an earlier duplicate key
    "a: 1\na: 2\n---\nb: 1\n",                     # so does a second document
    "a: *y\n",                                     # an undefined alias
    "a: &x 1\nb: &x 2\n",                          # a duplicate anchor
    "a: !!binary aGVsbG8=\nb: 2001-12-14\nc: 0x1f\n",
])
def test_loader_agrees_with_pyyaml_on(text: str) -> None:
    _check(text)


def test_a_scalar_no_constructor_takes_is_an_error_not_a_crash() -> None:
    """`!!int` with no digits made PyYAML's int constructor raise IndexError (a traceback)."""
    with pytest.raises(WorkflowError) as err:
        load_text("rose: !!int\n", "wf.yaml")
    d = err.value.diagnostics[0]
    assert (str(d.pos), d.message) == ("wf.yaml:1:7", "not valid YAML: '' is not a valid int")


def test_recursive_alias_and_limits() -> None:
    with pytest.raises(WorkflowError, match="recursive YAML alias"):
        load_text("a: &x [*x]\n", "wf.yaml")
    laughs = "a: &a [x, x, x]\nb: &b [*a, *a, *a]\nc: [*b, *b, *b]\n"
    assert len(load_text(laughs, "wf.yaml").data["c"]) == 3
    with pytest.raises(WorkflowError, match="more than 20 YAML nodes"):
        load_text(laughs, "wf.yaml", Limits(max_nodes=20))


def test_field_positions_are_source_positions_and_survive_pickling() -> None:
    wf = load_workflow("workflows/embodied_ppo.yaml")
    reset = wf.root.body[0].body[0]
    assert isinstance(reset.field_pos, FieldPositions)
    pos = reset.field_pos.get("in.it")
    assert (pos.file, pos.line, pos.col, pos.inline) == ("workflows/embodied_ppo.yaml", 52, 20, True)
    assert reset.field_pos["in.it"] == pos and reset.field_pos.get("nothing") is None
    again = pickle.loads(pickle.dumps(reset.field_pos))
    assert again.get("in.it") == pos and dict(again.items()) == dict(reset.field_pos.items())


def test_a_number_in_exponent_form_is_a_number_as_in_yaml_1_2() -> None:
    """Issue 42: YAML 1.1 (PyYAML) reads `1e-4` as a string; `lr: 1e-4` was then refused or passed on as text."""
    assert load_text("a: [1e-4, 2E3, -.5e1, 1.5e+2, 1_0e1, e3, 1e, '1e3']\n", "wf.yaml").data == {
        "a": [1e-4, 2000.0, -5.0, 150.0, 100.0, "e3", "1e", "1e3"]}
