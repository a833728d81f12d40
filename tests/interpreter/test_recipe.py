"""The recipe IR: one set of node types, one traversal, one evaluator -- and recipes built for the
symbolic RL iteration (what a compiled graph binds once) mean what the DSL's evaluator computes for each
concrete iteration, errors included."""

from __future__ import annotations

import pickle

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import interpreter.recipe as R
from interpreter.recipe import (
    Arith,
    Cat,
    Const,
    IterVar,
    K,
    Leaf,
    Neg,
    Part,
    Record,
    Ref,
    Seq,
    Slice,
    Stack,
    Take,
    evaluate,
    leaves_of,
    map_leaves,
    number_leaves,
    resolve_k,
)
from interpreter.schedule import Schedule
from rose_dsl import load_workflow_text

ONE_NODE = """
rose: 1
name: recipe
components:
  a: {impl: "examples.bench.load:Echo"}
iteration:
  body:
    - {node: first, call: a.f, in: {x: 1}, out: [y]}
    - {node: n, call: a.f, in: {x: "EXPR"}, out: [y]}
"""


def _input_of_n(expr: str, k):
    """The recipe of node n's input `x` when iteration k (an int, or the symbol K) is scheduled."""
    sch = Schedule(load_workflow_text(ONE_NODE.replace("EXPR", expr), "recipe.yaml"))
    steps = sch.steps(k, lambda step: (torch.arange(10.0),))
    step = next(s for s, _ in steps if s.node.name == "n")
    return step.recipe[0][1], [torch.arange(10.0)] * len(step.handles)


def _outcome(fn):
    try:
        return ("value", fn())
    except ZeroDivisionError:
        return ("raises", ZeroDivisionError)


_ints = st.one_of(st.just("iteration.i"), st.integers(0, 4).map(str))
_exprs = st.recursive(
    _ints,
    lambda sub: st.one_of(
        st.tuples(sub, st.sampled_from(["+", "-", "*", "//", "%"]), sub).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
        sub.map(lambda e: f"-({e})"),
    ),
    max_leaves=6,
)


@settings(max_examples=60, deadline=None)
@given(expr=_exprs, k=st.integers(0, 5))
def test_symbolic_iteration_arithmetic_means_what_the_dsl_computes(expr, k) -> None:
    """Differential: an input built for the symbolic iteration and resolved at k equals the input the
    DSL's evaluator builds for k -- including raising where it raises (`x // 0`: the old KExpr gave 0)."""
    concrete = _outcome(lambda: evaluate(_input_of_n(expr, k)[0]))
    # (a constant part such as `0 // 0` raises while the symbolic recipe is built, as it does for k)
    assert _outcome(lambda: evaluate(_input_of_n(expr, K)[0], k=k)) == concrete


def test_division_by_zero_raises_in_the_worker_as_in_the_dsl() -> None:
    recipe, _ = _input_of_n("iteration.i // (iteration.i - iteration.i)", K)
    with pytest.raises(ZeroDivisionError):
        evaluate(recipe, k=3)
    with pytest.raises(ZeroDivisionError):
        resolve_k(K % (K - K), 2)


def test_symbolic_slice_bounds() -> None:
    recipe, leaves = _input_of_n("first.y[iteration.i * 2:iteration.i * 2 + 3]", K)
    assert isinstance(recipe, Slice) and isinstance(recipe.start, Arith)
    for k in range(3):
        want, want_leaves = _input_of_n("first.y[iteration.i * 2:iteration.i * 2 + 3]", k)
        assert torch.equal(evaluate(recipe, leaves, k=k), evaluate(want, want_leaves))


def _every_node() -> R.Recipe:
    """A recipe with every node type (checked against the module's list below)."""
    return Record((
        ("stack", Stack((Leaf(0), Leaf(1)))),
        ("cat", Cat((Leaf(0), Leaf(1)), 0)),
        ("seq", Seq((Leaf(2), Const(7)))),
        ("slice", Slice(Leaf(0), K, Arith("+", K, Const(2)))),
        ("part", Part(Leaf(1), 0, 1, 2)),
        ("neg", Neg(K)),
        ("k", IterVar()),
        ("take", Take(Leaf(1), (3, 1), 0)),
        ("put", R.Put(Leaf(0), Leaf(1), (0, 2), 0)),
    ))


def test_every_node_type_is_mapped_and_evaluated() -> None:
    """`map_leaves` reaches the leaves under every node type (the tagged-tuple recipes forgot `part` in
    two of their four walkers), and `evaluate` gives every type its meaning."""
    recipe = _every_node()
    seen_types = set()

    def collect(r):
        seen_types.add(type(r))
        for child in getattr(r, "items", ()) or ():
            collect(child)
        for _, child in getattr(r, "fields", ()) or ():
            collect(child)
        for name in ("target", "source", "start", "stop", "left", "right", "operand"):
            child = getattr(r, name, None)
            if child is not None:
                collect(child)

    collect(recipe)
    assert seen_types | {Ref} == set(R._NODES), "a node type is missing from this test"
    assert [leaf.index for leaf in leaves_of(recipe)] == [0, 1, 0, 1, 2, 0, 1, 1, 0, 1]
    shifted = map_leaves(recipe, lambda leaf: Leaf(leaf.index + 1))
    a, b, c = torch.arange(4.0), torch.arange(4.0) + 10, "third"
    got, want = evaluate(shifted, [None, a, b, c], k=1), evaluate(recipe, [a, b, c], k=1)
    assert got.keys() == want.keys()
    for key in ("stack", "cat", "slice", "part", "take", "put"):
        assert torch.equal(got[key], want[key]), key
    assert want["seq"] == ["third", 7] and want["neg"] == -1 and want["k"] == 1
    assert torch.equal(want["slice"], a[1:3]) and torch.equal(want["part"], b[2:])
    assert torch.equal(want["take"], b[[3, 1]]) and torch.equal(got["take"], want["take"])
    assert want["put"].tolist() == [10.0, 1.0, 12.0, 3.0]  # rows 0 and 2 of b, the rest of a


def test_numbering_dedups_handles_and_refuses_numbered_recipes() -> None:
    h1, h2 = object(), object()
    recipes, handles = number_leaves([("x", Stack((Ref(h1), Ref(h2), Ref(h1)))), ("y", Ref(h2))])
    assert handles == (h1, h2)
    assert recipes == (("x", Stack((Leaf(0), Leaf(1), Leaf(0)))), ("y", Leaf(1)))
    with pytest.raises(ValueError, match="numbered already"):
        number_leaves(recipes)
    with pytest.raises(ValueError, match="unnumbered"):
        evaluate(Ref(h1))


def test_the_iteration_symbol_travels_and_cannot_decide_control_flow() -> None:
    recipe = _every_node()
    back = pickle.loads(pickle.dumps(recipe))  # what Ray does to a compiled graph's bound arguments
    assert back == recipe and hash(pickle.loads(pickle.dumps(K))) == hash(K)
    assert {K: 1}[IterVar()] == 1  # invocations with the symbol as an index are looked up by it
    with pytest.raises(TypeError, match="symbolic"):
        bool(K + 1)
    with pytest.raises(ValueError, match="needs the iteration number"):
        evaluate(K)
