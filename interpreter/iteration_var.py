"""The RL-iteration number as a symbol, so that one compiled schedule serves every iteration.

`Schedule.steps(K)` with `K = IterationVar()` evaluates inputs such as `iteration.i` or `iteration.i * 100
+ step.i` to small expression trees; workers evaluate them with the actual iteration number.
"""

from __future__ import annotations

from typing import Any

__all__ = ["IterationVar", "KExpr", "K", "resolve_k"]


class KExpr:
    __slots__ = ("op", "args")

    def __init__(self, op: str, *args: Any) -> None:
        self.op, self.args = op, args

    def _bin(self, op: str, other: Any, swap: bool = False) -> KExpr:
        return KExpr(op, other, self) if swap else KExpr(op, self, other)

    def __add__(self, o): return self._bin("+", o)
    def __radd__(self, o): return self._bin("+", o, True)
    def __sub__(self, o): return self._bin("-", o)
    def __rsub__(self, o): return self._bin("-", o, True)
    def __mul__(self, o): return self._bin("*", o)
    def __rmul__(self, o): return self._bin("*", o, True)
    def __floordiv__(self, o): return self._bin("//", o)
    def __rfloordiv__(self, o): return self._bin("//", o, True)
    def __mod__(self, o): return self._bin("%", o)
    def __rmod__(self, o): return self._bin("%", o, True)
    def __neg__(self): return KExpr("neg", self)

    def value(self, k: int) -> int:
        if self.op == "k":
            return k
        if self.op == "neg":
            return -resolve_k(self.args[0], k)
        a, b = (resolve_k(x, k) for x in self.args)
        return {"+": a + b, "-": a - b, "*": a * b, "//": a // b if b else 0, "%": a % b if b else 0}[self.op]

    def __reduce__(self):
        return (KExpr, (self.op, *self.args))

    def __repr__(self) -> str:
        return "k" if self.op == "k" else f"({self.op} {' '.join(map(repr, self.args))})"

    def __bool__(self) -> bool:
        raise TypeError("the iteration number is symbolic here: it cannot decide control flow")


class IterationVar(KExpr):
    """The symbol itself (hashable, so it can stand in an invocation's indices)."""

    def __init__(self) -> None:
        super().__init__("k")

    def __hash__(self) -> int:
        return hash("rose-iteration-var")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, IterationVar)

    def __reduce__(self):
        return (IterationVar, ())


K = IterationVar()


def resolve_k(x: Any, k: int) -> Any:
    return x.value(k) if isinstance(x, KExpr) else x
