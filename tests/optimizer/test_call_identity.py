"""A measured call's identity -- its node in the source workflow and the component the source names --
comes from the plan's IR fields (`split_of`, `copy_of`), not from the `@`/`#` in names (issue 43): the
runtime fills `Call.source`/`Call.base` from `call_identity(plan)`, and the search reads the fields."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from rose_dsl import load_workflow
from rose_dsl.ir import ExecutionNode, LoopNode
from rose_dsl.measurement import Call, call_identity, legacy_identity
from rose_dsl.transforms import apply_request, compose

PPO = Path(__file__).resolve().parents[2] / "workflows" / "embodied_ppo.yaml"


def _plan(*requests: str):
    wf = load_workflow(PPO, {"num_envs": 6, "steps": 3, "epochs": 4, "denoise_steps": 2})
    result = None
    for r in requests:
        step = apply_request(result.workflow if result is not None else wf, r)
        result = step if result is None else compose(result, step)
    return result.workflow if result is not None else wf


@pytest.mark.parametrize("requests", [
    (), ("split step 2", "interleave step"), ("split-time epoch 2", "split epoch@0.step 2"),
    ("split act 2",), ("split step 2", "fuse epoch update"), ("split-time epoch 3", "interleave epoch"),
])
def test_the_identity_from_fields_is_what_the_names_said(requests) -> None:
    plan = _plan(*requests)
    identity = call_identity(plan)
    nodes = [i for i in plan.items() if isinstance(i, ExecutionNode)]
    assert set(identity) == {".".join(n.path) for n in nodes}
    for n in nodes:
        path = ".".join(n.path)
        assert identity[path] == legacy_identity(path, n.component)


def test_the_identity_follows_split_of_and_copy_of_not_the_names() -> None:
    plan = _plan("split-time epoch 2")
    assert any(isinstance(i, LoopNode) and i.plan.split_of == "epoch" for i in plan.items())
    copy = next(c for c in plan.components.values() if c.copy_of is not None)
    renamed = replace(plan, components={**plan.components, copy.name: replace(copy, copy_of="elsewhere")})
    node = next(i for i in plan.items() if isinstance(i, ExecutionNode) and i.component == copy.name)
    source, base = call_identity(renamed)[".".join(node.path)]
    assert base == "elsewhere"
    assert source.split(".")[:2] == ["iteration", "epoch"] and "@" not in source


def test_a_call_reads_its_fields_and_never_parses_its_names() -> None:
    recorded = Call("iteration.step@1.act", "sim@1", 0, (0,), 0, 10, source="iteration.loop.act", base="policy")
    assert (recorded.source, recorded.base) == ("iteration.loop.act", "policy")
    bare = Call("iteration.step@1.act@0", "policy#2", 0, (0,), 0, 10)  # no fields: the names are the identity
    assert (bare.source, bare.base) == ("iteration.step@1.act@0", "policy#2")
    assert legacy_identity(bare.node, bare.component) == ("iteration.step.act", "policy")  # old files only
