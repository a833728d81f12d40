"""Input recipes: how a call's inputs are built from earlier calls' outputs, as one small typed tree.

The driver never touches data. For every call it evaluates the input expressions with the semantics'
lazy evaluator (`rose_dsl.semantics.Program`) over *recipe* values instead of tensors (`RecipeOps`), and
sends the tree to the worker that runs the call; the worker evaluates it (`evaluate`) once the values
its leaves stand for have arrived. So data moves producer -> consumer directly, and a value is freed
when the last recipe holding it is done.

Why one IR: the schedule builds recipes, data-parallel replicas remap their leaves, the compiled Ray
graph binds them once for every RL iteration, and workers evaluate them -- four users of one closed set
of frozen node types, with one traversal (`map_leaves`) and one evaluator (`evaluate`).

The RL-iteration number is a node too (`IterVar`, with `Arith`/`Neg` over it): `Schedule.steps(K)`
evaluates inputs such as `iteration.i * 100 + step.i` to small symbolic trees, so one compiled graph
serves every iteration, and workers resolve them with the actual number -- with exactly the integer
semantics of the DSL's evaluator (Python's operators: `x // 0` raises, as it does there).

Leaves are of two kinds: `Ref(handle)` while a schedule is being built (an opaque backend handle: a
future, a Ray ObjectRef, a compiled-graph node) and `Leaf(i)` in a finished `Step` (the i-th of the
step's handles, resolved to values before `evaluate`).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Union

__all__ = [
    "Recipe", "Leaf", "Ref", "Const", "Seq", "Stack", "Cat", "Record", "Slice", "Part", "Take", "Put", "IterVar", "Arith", "Neg",
    "K", "LIVE_ROWS", "HELD", "RecipeOps", "lift", "map_leaves", "leaves_of", "number_leaves", "evaluate", "resolve_k",
]


class _Symbolic:
    """Integer arithmetic on the symbolic RL-iteration number builds `Arith` trees (the DSL's evaluator
    applies `+ - * // %` and unary minus to whatever loop indices it is given)."""

    __slots__ = ()

    def __add__(self, o: Any) -> Arith: return Arith("+", self, lift(o))  # type: ignore[arg-type]
    def __radd__(self, o: Any) -> Arith: return Arith("+", lift(o), self)  # type: ignore[arg-type]
    def __sub__(self, o: Any) -> Arith: return Arith("-", self, lift(o))  # type: ignore[arg-type]
    def __rsub__(self, o: Any) -> Arith: return Arith("-", lift(o), self)  # type: ignore[arg-type]
    def __mul__(self, o: Any) -> Arith: return Arith("*", self, lift(o))  # type: ignore[arg-type]
    def __rmul__(self, o: Any) -> Arith: return Arith("*", lift(o), self)  # type: ignore[arg-type]
    def __floordiv__(self, o: Any) -> Arith: return Arith("//", self, lift(o))  # type: ignore[arg-type]
    def __rfloordiv__(self, o: Any) -> Arith: return Arith("//", lift(o), self)  # type: ignore[arg-type]
    def __mod__(self, o: Any) -> Arith: return Arith("%", self, lift(o))  # type: ignore[arg-type]
    def __rmod__(self, o: Any) -> Arith: return Arith("%", lift(o), self)  # type: ignore[arg-type]
    def __neg__(self) -> Neg: return Neg(self)  # type: ignore[arg-type]

    def __bool__(self) -> bool:
        raise TypeError("the iteration number is symbolic here: it cannot decide control flow")


# -- the nodes ---------------------------------------------------------------------------------------
# Each node knows its children (`_map` rebuilds it with a function applied to them) and its value
# (`_eval`); everything else is written once, below, over these two.

@dataclass(frozen=True, slots=True)
class Leaf:
    """The value of the step's `index`-th handle."""

    index: int

    def _map(self, fn: Callable[[Recipe], Recipe]) -> Recipe:
        return self

    def _eval(self, env: _Env) -> Any:
        return env.leaves[self.index]


@dataclass(frozen=True, slots=True, eq=False)
class Ref:
    """A backend handle while the schedule is being built (compared by identity, like the handle)."""

    handle: Any

    def _map(self, fn: Callable[[Recipe], Recipe]) -> Recipe:
        return self

    def _eval(self, env: _Env) -> Any:
        raise ValueError("a recipe with unnumbered handles cannot be evaluated (use number_leaves)")


@dataclass(frozen=True, slots=True)
class Const:
    value: Any

    def _map(self, fn: Callable[[Recipe], Recipe]) -> Recipe:
        return self

    def _eval(self, env: _Env) -> Any:
        return self.value


@dataclass(frozen=True, slots=True)
class Seq:
    """A Python list of values (an input `loop[*].x` not wrapped in stack/cat)."""

    items: tuple[Recipe, ...]

    def _map(self, fn: Callable[[Recipe], Recipe]) -> Recipe:
        return Seq(tuple(fn(v) for v in self.items))

    def _eval(self, env: _Env) -> Any:
        return [v._eval(env) for v in self.items]


@dataclass(frozen=True, slots=True)
class Stack:
    items: tuple[Recipe, ...]

    def _map(self, fn: Callable[[Recipe], Recipe]) -> Recipe:
        return Stack(tuple(fn(v) for v in self.items))

    def _eval(self, env: _Env) -> Any:
        return env.ops.stack([v._eval(env) for v in self.items])


@dataclass(frozen=True, slots=True)
class Cat:
    items: tuple[Recipe, ...]
    dim: int = 0

    def _map(self, fn: Callable[[Recipe], Recipe]) -> Recipe:
        return Cat(tuple(fn(v) for v in self.items), self.dim)

    def _eval(self, env: _Env) -> Any:
        return env.ops.cat([v._eval(env) for v in self.items], self.dim)


@dataclass(frozen=True, slots=True)
class Record:
    fields: tuple[tuple[str, Recipe], ...]

    def _map(self, fn: Callable[[Recipe], Recipe]) -> Recipe:
        return Record(tuple((name, fn(v)) for name, v in self.fields))

    def _eval(self, env: _Env) -> Any:
        return env.ops.record({name: v._eval(env) for name, v in self.fields})


@dataclass(frozen=True, slots=True)
class Slice:
    """Rows `start:stop` along the batch dimension; the bounds may be symbolic."""

    target: Recipe
    start: Recipe | None = None
    stop: Recipe | None = None

    def _map(self, fn: Callable[[Recipe], Recipe]) -> Recipe:
        return Slice(fn(self.target), self.start, self.stop)

    def _eval(self, env: _Env) -> Any:
        start = None if self.start is None else self.start._eval(env)
        stop = None if self.stop is None else self.stop._eval(env)
        return env.ops.slice(self.target._eval(env), start, stop)


@dataclass(frozen=True, slots=True)
class Part:
    """Shard `index` of `parts` equal shards along `dim` (a data-parallel replica's share)."""

    target: Recipe
    dim: int
    index: int
    parts: int

    def _map(self, fn: Callable[[Recipe], Recipe]) -> Recipe:
        return Part(fn(self.target), self.dim, self.index, self.parts)

    def _eval(self, env: _Env) -> Any:
        return env.ops.part(self.target._eval(env), self.dim, self.index, self.parts)


@dataclass(frozen=True, slots=True)
class Take:
    """Rows `index` (increasing row numbers) along `dim` of every tensor in the value: what a call in a loop
    that ends per row gets once some rows are done (`until_loops.UntilLoops`)."""

    target: Recipe
    index: tuple[int, ...]
    dim: int

    def _map(self, fn: Callable[[Recipe], Recipe]) -> Recipe:
        return Take(fn(self.target), self.index, self.dim)

    def _eval(self, env: _Env) -> Any:
        return env.ops.take(self.target._eval(env), self.index, self.dim)


@dataclass(frozen=True, slots=True)
class Put:
    """`target` with rows `index` along `dim` of every tensor replaced by those rows of `source` (both full
    values): the outputs a call in a loop that ends per row keeps for its done rows, when rows done in an
    enclosing per-row loop keep that loop's previous trip's values and the others this loop's
    (`until_loops.UntilLoops`)."""

    target: Recipe
    source: Recipe
    index: tuple[int, ...]
    dim: int

    def _map(self, fn: Callable[[Recipe], Recipe]) -> Recipe:
        return Put(fn(self.target), fn(self.source), self.index, self.dim)

    def _eval(self, env: _Env) -> Any:
        return env.ops.put(self.target._eval(env), self.source._eval(env), self.index, self.dim)


@dataclass(frozen=True, slots=True)
class IterVar(_Symbolic):
    """The RL-iteration number as a symbol (hashable: it stands in invocations' indices)."""

    def _map(self, fn: Callable[[Recipe], Recipe]) -> Recipe:
        return self

    def _eval(self, env: _Env) -> Any:
        if env.k is None:
            raise ValueError("a recipe compiled for a symbolic RL iteration needs the iteration number")
        return env.k

    def __repr__(self) -> str:
        return "k"


_ARITH: dict[str, Callable[[Any, Any], Any]] = {
    "+": operator.add, "-": operator.sub, "*": operator.mul, "//": operator.floordiv, "%": operator.mod,
}


@dataclass(frozen=True, slots=True)
class Arith(_Symbolic):
    op: str  # + - * // %
    left: Recipe
    right: Recipe

    def __post_init__(self) -> None:
        if self.op not in _ARITH:
            raise ValueError(f"unknown arithmetic operator {self.op!r}")

    def _map(self, fn: Callable[[Recipe], Recipe]) -> Recipe:
        return self

    def _eval(self, env: _Env) -> Any:
        return _ARITH[self.op](self.left._eval(env), self.right._eval(env))

    def __repr__(self) -> str:
        return f"({self.left!r} {self.op} {self.right!r})"


@dataclass(frozen=True, slots=True)
class Neg(_Symbolic):
    operand: Recipe

    def _map(self, fn: Callable[[Recipe], Recipe]) -> Recipe:
        return self

    def _eval(self, env: _Env) -> Any:
        return -self.operand._eval(env)

    def __repr__(self) -> str:
        return f"-{self.operand!r}"


Recipe = Union[Leaf, Ref, Const, Seq, Stack, Cat, Record, Slice, Part, Take, Put, IterVar, Arith, Neg]  # noqa: UP007 - a runtime alias
_NODES = (Leaf, Ref, Const, Seq, Stack, Cat, Record, Slice, Part, Take, Put, IterVar, Arith, Neg)

K = IterVar()

# The two inputs a call of a loop that ends per row gets besides its ports once some rows are done (the
# schedule adds them last; the worker takes them out before the call): the rows it computes, and its own
# outputs of the previous trip, which the done rows keep. Not identifiers, so no port can be named so.
LIVE_ROWS = "rose.live_rows"
HELD = "rose.held"


# -- one traversal, one evaluator ---------------------------------------------------------------

def lift(value: Any) -> Recipe:
    """A value the lazy evaluator produced, as a recipe: nodes stay, lists become `Seq`, the rest `Const`."""
    if isinstance(value, _NODES):
        return value
    if isinstance(value, list):
        return Seq(tuple(lift(v) for v in value))
    return Const(value)


def map_leaves(recipe: Recipe, fn: Callable[[Leaf | Ref], Recipe]) -> Recipe:
    """The recipe with every `Leaf`/`Ref` replaced by `fn(leaf)` (bottom-up, a new tree)."""
    if isinstance(recipe, Leaf | Ref):
        return fn(recipe)
    return recipe._map(lambda child: map_leaves(child, fn))


def leaves_of(recipe: Recipe) -> Iterator[Leaf | Ref]:
    """Every `Leaf`/`Ref` of the recipe, left to right."""
    found: list[Leaf | Ref] = []

    def visit(leaf: Leaf | Ref) -> Recipe:
        found.append(leaf)
        return leaf

    map_leaves(recipe, visit)
    return iter(found)


def number_leaves(recipes: Sequence[tuple[str, Recipe]]) -> tuple[tuple[tuple[str, Recipe], ...], tuple[Any, ...]]:
    """Replace every `Ref(handle)` by `Leaf(i)`; return the recipes and the handles (each handle once,
    in first-use order), which is what a worker receives."""
    handles: list[Any] = []
    seen: dict[int, int] = {}

    def number(leaf: Leaf | Ref) -> Recipe:
        if isinstance(leaf, Leaf):
            raise ValueError("number_leaves: the recipe is numbered already")
        key = id(leaf.handle)
        if key not in seen:
            seen[key] = len(handles)
            handles.append(leaf.handle)
        return Leaf(seen[key])

    return tuple((port, map_leaves(r, number)) for port, r in recipes), tuple(handles)


class _Env:
    """What evaluation needs besides the recipe (a plain class: made once per call, on the hot path)."""

    __slots__ = ("leaves", "ops", "k")

    def __init__(self, leaves: Sequence[Any], ops: Any, k: int | None) -> None:
        self.leaves, self.ops, self.k = leaves, ops, k


def evaluate(recipe: Recipe, leaves: Sequence[Any] = (), ops: Any = None, k: int | None = None) -> Any:
    """The value a recipe stands for, given the values of its leaves (in a worker); `k` is the RL
    iteration when the recipe was built for the symbolic one. `ops` combines values (torch by default)."""
    return recipe._eval(_Env(leaves, ops if ops is not None else _torch_ops(), k))


def resolve_k(value: Any, k: int) -> Any:
    """A possibly symbolic integer (an invocation index, a slice bound) at RL iteration k."""
    return value._eval(_Env((), None, k)) if isinstance(value, IterVar | Arith | Neg) else value


_TORCH_OPS: Any = None


def _torch_ops() -> Any:
    global _TORCH_OPS
    if _TORCH_OPS is None:
        from .values import TorchOps

        _TORCH_OPS = TorchOps()
    return _TORCH_OPS


class RecipeOps:
    """`ValueOps` for the lazy evaluator that build recipe trees instead of values."""

    def stack(self, values: Sequence[Any]) -> Recipe:
        return Stack(tuple(lift(v) for v in values))

    def cat(self, values: Sequence[Any], dim: int = 0) -> Recipe:
        return Cat(tuple(lift(v) for v in values), dim)

    def record(self, fields: Mapping[str, Any]) -> Recipe:
        return Record(tuple((name, lift(v)) for name, v in fields.items()))

    def slice(self, value: Any, start: Any, stop: Any) -> Recipe:
        return Slice(lift(value), None if start is None else lift(start), None if stop is None else lift(stop))

    def truth(self, value: Any) -> bool:
        raise RuntimeError("a loop with a dynamic end cannot be scheduled statically")
