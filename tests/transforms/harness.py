"""Running a workflow and a rewrite of it on mock components, and comparing what they computed."""

from __future__ import annotations

from typing import Any

import torch

from interpreter.components import instantiate
from interpreter.reference import ReferenceRun, run_reference
from interpreter.values import TorchOps
from rose_dsl.ir import Workflow
from rose_dsl.semantics import Frame
from rose_dsl.transforms.rewritten import Locate

ALLOWED = ("tests.",)


def execute(wf: Workflow, order: str = "program", seed: int = 0, iterations: int = 2) -> tuple[ReferenceRun, dict[str, Any]]:
    comps = instantiate(wf, ALLOWED)
    return run_reference(wf, comps, range(iterations), order=order, seed=seed), comps


def orders(wf: Workflow) -> list[tuple[str, int]]:
    """The orders to run a rewrite in: random legal orders, or program order only when a loop ends on a
    condition (only an in-order executor can tell when it ends)."""
    from rose_dsl.ir import LoopNode

    if any(isinstance(i, LoopNode) and i.dynamic for i in wf.items()):
        return [("program", 0)]
    return [("random", 0), ("random", 1)]


def differences(wf_a: Workflow, run_a: ReferenceRun, comps_a: dict[str, Any], wf_b: Workflow, run_b: ReferenceRun,
                comps_b: dict[str, Any], locate: Locate) -> list[str]:
    """Where run_b computed something else than run_a: outputs of every original call (located in the
    rewrite: a split node's outputs are read through its merge) and the final value of every state."""
    diffs: list[str] = []
    every_b = {inv: v for outs in run_b.outputs.values() for inv, v in outs.items()}  # a deferred call: a later iteration's
    for k, outs in run_a.outputs.items():
        frame = Frame(lambda inv, port: every_b[inv][port], TorchOps(),
                      root_carry=run_b.frames[k].root_carry if k in run_b.frames else {})
        for inv, values in outs.items():
            loc = locate(inv.path, inv.indices)
            if loc is None:
                continue
            path, idx = loc
            ctx = dict(zip(run_b.program.loops_of[path], idx, strict=True))
            for port, value in values.items():
                try:
                    other = run_b.program.output(path, port, ctx, frame)
                except KeyError:  # run_b never made this call (a loop that ends on a condition stopped earlier)
                    diffs.append(f"{inv} not run")
                    break
                if not torch.equal(value, other):
                    diffs.append(f"{inv}.{port}")
    for name, comp in wf_a.components.items():
        for so in comp.state:
            a = comps_a[name].get_state(so.name)
            b = comps_b[name].get_state(so.name)
            if not torch.equal(a, b):
                diffs.append(f"final {name}.{so.name}")
    return diffs


def mockify(wf: Workflow, batch: int) -> Workflow:
    """The same workflow with every component replaced by a Mock that honours the nodes' declarations
    (state effects, outputs, separability), so that any workflow's rewrites can be executed and compared."""
    from dataclasses import replace

    from rose_dsl.ir import ExecutionNode

    behaviors: dict[str, dict[str, dict]] = {name: {} for name in wf.components}
    for item in wf.items():
        if isinstance(item, ExecutionNode):
            spec = {"state": {e.state.split(".", 1)[1]: e.access.value for e in item.effects},
                    "out": list(item.outputs), "separable": item.batch == 0}
            known = behaviors[item.component].setdefault(item.method, spec)
            assert known == spec, f"{item.call} is declared differently by two nodes"
    comps = {name: replace(c, impl="tests.mocks:Mock", args={"name": name, "batch": batch, "behaviors": behaviors[name],
                                                              "states": [s.name for s in c.state]})
             for name, c in wf.components.items()}
    return replace(wf, components=comps)


def assert_preserved(original: Workflow, rewritten) -> None:
    """The rewrite (a `Rewritten`) computes what `original` computes, in program order and in random legal
    orders, bit for bit, and its plan reads back as the same IR."""
    from rose_dsl import load_workflow_text
    from rose_dsl.serialize import to_yaml

    assert load_workflow_text(to_yaml(rewritten.workflow), "plan.yaml") == rewritten.workflow
    ref_run, ref_comps = execute(original, "program")
    for order, seed in [("program", 0)] + [o for o in orders(rewritten.workflow) if o[0] == "random"]:
        run, comps = execute(rewritten.workflow, order, seed=seed)
        diffs = differences(original, ref_run, ref_comps, rewritten.workflow, run, comps, rewritten.locate)
        assert diffs == [], (rewritten.description, order, seed, diffs)
