"""hypothesis: random valid workflows validate and round-trip (YAML -> IR -> YAML -> IR equal); random
mutations of valid workflows (text edits, structural edits, random bytes) never crash the validator: the
only outcomes are a Workflow or a WorkflowError whose every diagnostic has a position and a path."""

from __future__ import annotations

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from rose_dsl import WorkflowError, load_workflow_text
from rose_dsl.serialize import to_yaml

from ..strategies import workflows


@settings()
@given(workflows())
def test_random_workflows_validate_and_round_trip(doc) -> None:
    text = yaml.safe_dump(doc, sort_keys=False)
    wf = load_workflow_text(text, "wf.yaml")
    again = load_workflow_text(to_yaml(wf), "wf2.yaml")
    assert again == wf


def _assert_clean(text: str) -> None:
    try:
        load_workflow_text(text, "wf.yaml")
    except WorkflowError as exc:
        assert exc.diagnostics
        for d in exc.diagnostics:
            assert d.message and d.path and d.pos.file == "wf.yaml"
            d.format(text)  # formatting (with the caret excerpt) must not fail either


@settings()
@given(workflows(), st.data())
def test_text_mutations_never_crash(doc, data) -> None:
    text = yaml.safe_dump(doc, sort_keys=False)
    for _ in range(data.draw(st.integers(1, 4))):
        if not text:
            break
        i = data.draw(st.integers(0, len(text) - 1))
        op = data.draw(st.sampled_from(["delete", "insert", "replace", "dup_line"]))
        ch = data.draw(st.sampled_from(list(" :-[]{}\"'.$*@0123456789abcxyz\n\t#&!|>%")))
        if op == "delete":
            text = text[:i] + text[i + 1:]
        elif op == "insert":
            text = text[:i] + ch + text[i:]
        elif op == "replace":
            text = text[:i] + ch + text[i + 1:]
        else:
            lines = text.splitlines(keepends=True)
            j = data.draw(st.integers(0, len(lines) - 1))
            lines.insert(j, lines[j])
            text = "".join(lines)
    _assert_clean(text)


def _mutate(node, data):
    if isinstance(node, dict) and node:
        key = data.draw(st.sampled_from(sorted(node, key=str)))
        choice = data.draw(st.integers(0, 4))
        if choice == 0:
            node = dict(node)
            del node[key]
            return node
        if choice == 1:
            return {**node, key: data.draw(st.sampled_from([None, 0, -1, 2.5, "x", "a.b", "${nope}", [], {}, True]))}
        if choice == 2:
            return {**node, key + "x": node[key]}
        return {**node, key: _mutate(node[key], data)}
    if isinstance(node, list) and node:
        i = data.draw(st.integers(0, len(node) - 1))
        choice = data.draw(st.integers(0, 2))
        if choice == 0:
            return node[:i] + node[i + 1:]
        if choice == 1:
            return node + [node[i]]
        return node[:i] + [_mutate(node[i], data)] + node[i + 1:]
    return data.draw(st.sampled_from([None, 0, "n1.o0", "l2[5].n3.o0", "stack(", [1], {"a": 1}]))


@settings()
@given(workflows(), st.data())
def test_structural_mutations_never_crash(doc, data) -> None:
    for _ in range(data.draw(st.integers(1, 3))):
        doc = _mutate(doc, data)
    _assert_clean(yaml.safe_dump(doc, sort_keys=False))


@settings()
@given(st.binary(max_size=400))
def test_random_bytes_never_crash(raw: bytes) -> None:
    _assert_clean(raw.decode("utf-8", errors="replace"))


@settings()
@given(workflows(), st.data())
def test_fast_and_precise_schema_validators_agree(doc, data) -> None:
    """The generated fast validator decides validity; jsonschema explains errors. They must agree."""
    from rose_dsl.schema import _fast, _validator

    for _ in range(data.draw(st.integers(0, 3))):
        doc = _mutate(doc, data)
    fast_ok = True
    try:
        _fast(1)(doc)
    except Exception:  # noqa: BLE001 - any refusal by the fast validator counts as "invalid"
        fast_ok = False
    precise_ok = not any(True for _ in _validator(1).iter_errors(doc)) if isinstance(doc, dict) else False
    assert fast_ok == precise_ok
