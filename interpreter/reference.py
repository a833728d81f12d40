"""The reference interpreter: runs a workflow (or a rewritten plan) on real component objects, in
program order or in a random order that the dependencies allow.

It exists to define and test semantics, not to be fast: every call runs in this thread. The random
order respects exactly what the runtime respects -- data dependencies between calls, and each
component's program order (a component is one process executing its calls in order; its state
accesses are ordered by that) -- so a rewrite that is wrong shows up as a different result here.
"""

from __future__ import annotations

import itertools
import random
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rose_dsl.analysis import AfterOrder
from rose_dsl.ir import Component, LoopNode, Workflow
from rose_dsl.semantics import (
    CallSite,
    Frame,
    Invocation,
    Lookup,
    Program,
    SemanticError,
    ValueOps,
    run_sequential,
)

from .components import invoke
from .recipe import RecipeOps, Ref, evaluate, leaves_of, lift, number_leaves
from .until_loops import UntilLoops, keep_done_rows, live_inputs
from .values import TorchOps

__all__ = ["ReferenceRun", "run_reference", "schedule_dependencies"]


@dataclass
class ReferenceRun:
    program: Program
    components: Mapping[str, Any]
    outputs: dict[int, dict[Invocation, dict[str, Any]]] = field(default_factory=dict)  # per RL iteration
    frames: dict[int, Frame] = field(default_factory=dict)
    order: list[Invocation] = field(default_factory=list)


class _Caller:
    ops: ValueOps = TorchOps()

    def __init__(self, components: Mapping[str, Any], defs: Mapping[str, Component]) -> None:
        self.components = components
        self.defs = defs  # the components' definitions (a temporal split's seeding calls read their state)

    def call(self, site: CallSite, inputs: dict[str, Any]) -> dict[str, Any]:
        return invoke(self.components[site.node.component], site.node, inputs, str(site.inv),
                      comp=self.defs.get(site.node.component))


def _lookup_in(outputs: dict[Invocation, dict[str, Any]], run: ReferenceRun) -> Lookup:
    """A frame's lookup over one iteration's outputs (a function, so each iteration binds its own dict);
    a deferred call (`defer:`) reads those of the RL iteration it belongs to."""
    return lambda inv, port: (outputs[inv] if inv in outputs else _ran_before(run, inv))[port]


def _ran_before(run: ReferenceRun, inv: Invocation) -> dict[str, Any]:
    """The outputs of a call that ran in an earlier RL iteration's place: its own, or, for a call run ahead
    (`ahead:`), the one before its own."""
    for place in (inv.indices[0], inv.indices[0] - 1):
        outs = run.outputs.get(place)
        if outs is not None and inv in outs:
            return outs[inv]
    raise KeyError(inv)


def schedule_dependencies(program: Program, sites: list[CallSite]) -> dict[Invocation, set[Invocation]]:
    """For each call: the calls it must wait for (its data producers, the previous call of its component
    and what an `after:` names) -- its inputs' recipes, built as the runtime's schedule builds them, name
    its producers."""
    frame = Frame(lambda inv, port: Ref(inv), RecipeOps())
    deps: dict[Invocation, set[Invocation]] = defaultdict(set)
    last_of: dict[str, Invocation] = {}
    order = AfterOrder(program.items)
    for site in sites:
        for value in program.inputs(site, frame).values():
            deps[site.inv].update(leaf.handle for leaf in leaves_of(lift(value)) if isinstance(leaf, Ref))
        deps[site.inv].update(inv for inv, _ in order.visit(site))
        prev = last_of.get(site.node.component)
        if prev is not None:
            deps[site.inv].add(prev)
        last_of[site.node.component] = site.inv
    return deps


def run_reference(wf: Workflow, components: Mapping[str, Any], iterations: Iterable[int],
                  order: str = "program", seed: int = 0) -> ReferenceRun:
    """Run RL iterations. order='program' follows program order; 'random' picks any ready call."""
    program = Program(wf)
    run = ReferenceRun(program, components)
    caller = _Caller(components, wf.components)
    if order == "program" and any(isinstance(i, LoopNode) and i.dynamic for i in wf.items()):
        ks = list(iterations)
        for k in ks:
            _run_with_until(run, caller, k, ks[0], k == ks[-1])
        return run
    if order == "program":
        def keep(k, outs):
            run.outputs[k] = dict(outs)
            run.order.extend(outs)

        frame = run_sequential(program, caller, list(iterations), keep)
        for k in run.outputs:
            run.frames[k] = frame
        return run
    rng = random.Random(seed)
    ks = list(iterations)
    for k in ks:
        outputs: dict[Invocation, dict[str, Any]] = {}
        frame = Frame(_lookup_in(outputs, run), caller.ops, root_carry=_carry_from(run, k))
        sites = list(program.unroll(k, since=ks[0] if ks else 0, ahead=k != ks[-1]))
        if program.depth > 1 and k == ks[-1]:  # what is still deferred runs at the end (`Program.drain`)
            sites += list(program.drain(k, ks[0]))
        deps = schedule_dependencies(program, sites)
        by_inv = {s.inv: s for s in sites}
        # a deferred call's producers ran in an earlier RL iteration: done
        waiting = {s.inv: {d for d in deps[s.inv] if d in by_inv} for s in sites}
        users: dict[Invocation, list[Invocation]] = defaultdict(list)
        for inv, ds in waiting.items():
            for d in ds:
                users[d].append(inv)
        ready = [inv for inv, ds in waiting.items() if not ds]
        while ready:
            inv = ready.pop(rng.randrange(len(ready)))
            site = by_inv[inv]
            outputs[inv] = caller.call(site, program.inputs(site, frame))
            run.order.append(inv)
            for u in users[inv]:
                waiting[u].discard(inv)
                if not waiting[u]:
                    ready.append(u)
        if len(outputs) != len(sites):
            raise SemanticError("the schedule has a cycle: not every call could run")
        program.end_iteration(k, frame)
        run.outputs[k] = outputs
        run.frames[k] = frame
    return run


def _run_with_until(run: ReferenceRun, caller: _Caller, k: int, first: int = 0, last: bool = False) -> None:
    """RL iteration k in program order, loops that end on a condition run as the runtime's schedule runs
    them (`until_loops.UntilLoops`: per row, a call after some rows are done computes only the rows not
    done and a done row keeps its values), on concrete values: the handles are the values themselves. An
    asynchronous plan's deferred call reads the outputs of its own (earlier) RL iteration, and what is
    still deferred runs after the `last` iteration (`Program.drain`), as `run_reference`'s other paths do."""
    program = run.program
    outputs: dict[Invocation, dict[str, Any]] = {}
    handles: dict[Invocation, tuple[Any, ...]] = {}
    aliases: dict[Invocation, Invocation] = {}

    def lookup(inv: Invocation, port: str) -> Any:
        inv = aliases.get(inv, inv)
        return (outputs[inv] if inv in outputs else _ran_before(run, inv))[port]

    frame = Frame(lookup, caller.ops, root_carry=_carry_from(run, k))
    until = UntilLoops(program, frame, handles, {}, lambda value: value, k)
    until.aliases = aliases
    sites = program.unroll(k, until.reached, since=first, ahead=not last)
    if program.depth > 1 and last:
        sites = itertools.chain(sites, program.drain(k, first))
    for site in sites:
        # a deferred call's inputs are those of its own RL iteration: evaluated in that iteration's frame,
        # which knows how many trips its loops that end on a condition ran
        own = run.frames.get(site.inv.indices[0], frame) if site.inv.indices[0] != k else frame
        pairs = until.narrow(site, [(port, lift(v)) for port, v in program.inputs(site, own).items()])
        recipe, leaves = number_leaves(pairs)
        inputs = {port: evaluate(r, leaves, caller.ops, k) for port, r in recipe}
        live, held = live_inputs(recipe, inputs)
        node = site.node
        outs = invoke(caller.components[node.component], node, inputs, str(site.inv), live,
                      caller.defs.get(node.component))
        if live is not None:
            outs = keep_done_rows(node, outs, live, held)
        outputs[site.inv] = outs
        handles[site.inv] = tuple(outs[o] for o in node.outputs) or (None,)
        until.component[site.inv] = node.component
        run.order.append(site.inv)
    for alias, ran in until.aliases.items():  # the trips a per-row loop did not run repeat its last
        outputs[alias] = outputs[ran]
    program.end_iteration(k, frame)
    run.outputs[k] = outputs
    run.frames[k] = frame


def _carry_from(run: ReferenceRun, k: int) -> dict[int, dict[str, Any]]:
    prev = run.frames.get(k - 1)
    return dict(prev.root_carry) if prev is not None else {}
