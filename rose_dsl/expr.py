"""Expressions: the lark grammar in `expr.lark`, an immutable AST, and its printer.

The AST is small on purpose: references (`node.port`, `loop.var`, `loop.i`), iteration references
(`loop[index].<ref>`), records, `stack`/`cat` calls, batch slices and integer arithmetic. Name
resolution and typing happen in `build.py`; evaluation in the interpreters. Every node keeps the
character offset where it starts so that an error inside an expression points at the exact column.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

from lark import Lark, Token, Transformer, Tree, v_args
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken, VisitError

__all__ = [
    "Expr", "Int", "Param", "BinOp", "Neg", "Ref", "Index", "IterRef", "Record", "Call", "Slice",
    "ExprSyntaxError", "parse_expr", "parse_with_grammar", "unparse", "walk", "children", "map_expr",
    "FUNCTIONS",
]

FUNCTIONS = {"stack": "stack values along a new leading dimension", "cat": "concatenate along dim 0"}


@dataclass(frozen=True)
class Expr:
    offset: int = field(compare=False)  # where the expression starts in its source string


@dataclass(frozen=True)
class Int(Expr):
    value: int


@dataclass(frozen=True)
class Param(Expr):
    name: str


@dataclass(frozen=True)
class BinOp(Expr):
    op: str  # one of + - * // %
    left: Expr
    right: Expr


@dataclass(frozen=True)
class Neg(Expr):
    operand: Expr


@dataclass(frozen=True)
class Ref(Expr):
    """`head.attr`: a node's output port, a loop's carried value or collect, or a loop index (`.i`)."""

    head: str
    attr: str


@dataclass(frozen=True)
class Index(Expr):
    """The iteration selector of an IterRef: kind is 'int' (value >= 0), 'last' (-1), 'all' (*),
    or 'loop' (the current index of another, enclosing loop, named by `loop`)."""

    kind: str
    value: int = 0
    loop: str = ""


@dataclass(frozen=True)
class IterRef(Expr):
    """`loop[index].inner`: `inner` is resolved inside the loop body, at the selected iteration(s)."""

    loop: str
    index: Index
    inner: Expr  # Ref, IterRef or Record


@dataclass(frozen=True)
class Record(Expr):
    fields: tuple[tuple[str, Expr], ...]


@dataclass(frozen=True)
class Call(Expr):
    fn: str
    args: tuple[Expr, ...]


@dataclass(frozen=True)
class Slice(Expr):
    """`target[start:stop]` along the batch dimension (dim 0)."""

    target: Expr
    start: Expr | None
    stop: Expr | None


MAX_OPERATORS = 256  # per expression string; a 200-term sum reads fine
MAX_INT = 2**62  # the largest integer an expression holds or computes (a count, a row, an index)


class ExprSyntaxError(Exception):
    """A parse error at character `offset` of the expression string."""

    def __init__(self, offset: int, message: str) -> None:
        super().__init__(message)
        self.offset = offset
        self.message = message


@functools.cache
def _parser() -> Lark:
    grammar = (Path(__file__).parent / "expr.lark").read_text()
    return Lark(grammar, parser="lalr", propagate_positions=True, maybe_placeholders=True)


def _off(meta_or_token: object) -> int:
    if isinstance(meta_or_token, Token):
        return (meta_or_token.start_pos or 0)
    return getattr(meta_or_token, "start_pos", 0) or 0


def _literal(meta: object, tok: Token) -> int:
    """An integer literal, at most MAX_INT (a 5,000-digit one was Python's int-from-text ValueError, exit 1)."""
    text = str(tok)
    if len(text.lstrip("0")) > len(str(MAX_INT)) or int(text) > MAX_INT:
        raise ExprSyntaxError(_off(meta), f"integer literal of {len(text)} digits is too large (at most {MAX_INT})")
    return int(text)


@v_args(meta=True, inline=True)
class _ToAst(Transformer):
    def int(self, meta, tok):
        return Int(_off(meta), _literal(meta, tok))

    def pname(self, meta, tok):
        return Param(_off(meta), str(tok))

    def param(self, meta, inner):
        return inner

    def _bin(op: str):  # type: ignore[misc]  # a factory evaluated in the class body
        def method(self, meta, left, right):
            return BinOp(_off(meta), op, left, right)

        return method

    add, sub, mul, floordiv, mod = _bin("+"), _bin("-"), _bin("*"), _bin("//"), _bin("%")

    def neg(self, meta, operand):
        if isinstance(operand, Int):
            return Int(_off(meta), -operand.value)
        return Neg(_off(meta), operand)

    def ref(self, meta, head, attr):
        return Ref(_off(meta), str(head), str(attr))

    def idx_int(self, meta, tok):
        return Index(_off(meta), "int", _literal(meta, tok))

    def idx_neg(self, meta, tok):
        if _literal(meta, tok) != 1:
            raise ExprSyntaxError(_off(meta), f"negative iteration index -{tok}: only -1 (the last iteration) is allowed")
        return Index(_off(meta), "last", -1)

    def idx_all(self, meta):
        return Index(_off(meta), "all")

    def idx_loop(self, meta, loop, attr):
        if str(attr) != "i":
            raise ExprSyntaxError(_off(meta), f"'{loop}.{attr}' as an iteration index: only a loop index '{loop}.i' may select an iteration")
        return Index(_off(meta), "loop", 0, str(loop))

    def iterref(self, meta, loop, index, inner):
        return IterRef(_off(meta), str(loop), index, inner)

    def call(self, meta, fn, *args):
        if str(fn) not in FUNCTIONS:
            known = ", ".join(FUNCTIONS)
            raise ExprSyntaxError(_off(meta), f"unknown function '{fn}' (known: {known})")
        return Call(_off(meta), str(fn), tuple(args))

    def named_field(self, meta, name, value):
        return (str(name), value)

    def ref_field(self, meta, ref):
        return (ref.attr, ref)

    def record(self, meta, *fields):
        names = [n for n, _ in fields]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ExprSyntaxError(_off(meta), f"record field '{sorted(dup)[0]}' appears twice; name one of them ('name: ref')")
        return Record(_off(meta), tuple(fields))

    def slice(self, meta, target, start, stop):
        return Slice(_off(meta), target, start, stop)


@functools.cache
def _terminal_names() -> dict[str, str]:
    """Terminal name -> how an error message shows it, derived from the grammar itself."""
    names = {"NAME": "a name", "INT": "an integer", "$END": "end of expression"}
    for term in _parser().terminals:
        if term.name not in names and term.pattern.type == "str":
            names[term.name] = repr(term.pattern.value)
        elif term.name not in names:
            names[term.name] = "'" + re.sub(r"\\(.)", r"\1", term.pattern.value) + "'"
    return names


def _expected(exc: UnexpectedInput) -> str:
    wanted = getattr(exc, "expected", None) or getattr(exc, "allowed", None) or []
    names = sorted({_terminal_names().get(t, t.lower()) for t in wanted if t != "WS_INLINE"})
    return " or ".join(names[:8]) if names else "a valid expression"


# `node.port` exactly (the NAME of expr.lark on both sides), the shape of most inputs: parsed without
# lark (about 100 times faster), to the same Ref the grammar gives (tested against it).
_PLAIN_REF = re.compile(r"([A-Za-z_][A-Za-z0-9_]*(?:@[0-9]+)?)\.([A-Za-z_][A-Za-z0-9_]*(?:@[0-9]+)?)")


@functools.lru_cache(maxsize=65536)
def parse_expr(text: str) -> Expr:
    """Parse an expression string. Raises ExprSyntaxError with the offset of the problem."""
    plain = _PLAIN_REF.fullmatch(text)
    if plain is not None:
        return Ref(0, plain[1], plain[2])
    return parse_with_grammar(text)


def parse_with_grammar(text: str) -> Expr:
    """`parse_expr` through the lark grammar always (no shortcut, no cache): the reference."""
    if not text.strip():
        raise ExprSyntaxError(0, "empty expression")
    # every later pass (the parser's tree, the AST, evaluation, the printer) recurses once per operator:
    # a 1000-term sum was a RecursionError, an internal error with exit 1 (user-error sweep)
    operators = sum(text.count(c) for c in "+-*/%[(")
    if operators > MAX_OPERATORS:
        raise ExprSyntaxError(0, f"expression too long: {operators} operators, brackets and slices (at most "
                                 f"{MAX_OPERATORS}); compute it in a param in steps, or in the component")
    try:
        tree = _parser().parse(text)
        result = _ToAst().transform(tree) if isinstance(tree, Tree) else tree
    except RecursionError:
        raise ExprSyntaxError(0, "expression nested too deeply to read") from None
    except VisitError as exc:  # exceptions raised inside transformer methods arrive wrapped
        if isinstance(exc.orig_exc, ExprSyntaxError):
            raise exc.orig_exc from None
        if isinstance(exc.orig_exc, RecursionError):
            raise ExprSyntaxError(0, "expression nested too deeply to read") from None
        raise
    except UnexpectedCharacters as exc:
        at = exc.pos_in_stream or 0
        raise ExprSyntaxError(at, f"unexpected character {text[at]!r}; expected {_expected(exc)}") from None
    except UnexpectedEOF as exc:
        raise ExprSyntaxError(len(text), f"expression ends early; expected {_expected(exc)}") from None
    except UnexpectedToken as exc:
        if exc.token.type == "$END":
            raise ExprSyntaxError(len(text), f"expression ends early; expected {_expected(exc)}") from None
        raise ExprSyntaxError(exc.token.start_pos or 0, f"unexpected {exc.token.value!r}; expected {_expected(exc)}") from None
    if isinstance(result, Tree | Token | tuple):
        raise ExprSyntaxError(0, "not an expression")
    return result


def unparse(e: Expr) -> str:
    """The canonical text of an expression (parse(unparse(e)) == e up to offsets)."""
    match e:
        case Int(value=v):
            return str(v)
        case Param(name=n):
            return "${" + n + "}"
        case BinOp(op=op, left=a, right=b):
            return f"({_unparse_param(a)} {op} {_unparse_param(b)})" if _is_param_expr(e) else f"({unparse(a)} {op} {unparse(b)})"
        case Neg(operand=a):
            return f"-{unparse(a)}"
        case Ref(head=h, attr=a):
            return f"{h}.{a}"
        case IterRef(loop=loop, index=ix, inner=inner):
            return f"{loop}[{_unparse_index(ix)}].{unparse(inner)}"
        case Record(fields=fields):
            parts = []
            for name, value in fields:
                parts.append(unparse(value) if isinstance(value, Ref) and value.attr == name else f"{name}: {unparse(value)}")
            return "{" + ", ".join(parts) + "}"
        case Call(fn=fn, args=args):
            return f"{fn}(" + ", ".join(unparse(a) for a in args) + ")"
        case Slice(target=t, start=s, stop=p):
            return f"{unparse(t)}[{'' if s is None else unparse(s)}:{'' if p is None else unparse(p)}]"
    raise TypeError(f"not an expression: {e!r}")


def _is_param_expr(e: Expr) -> bool:
    return all(isinstance(x, Param | Int | BinOp | Neg) for x in walk(e)) and any(isinstance(x, Param) for x in walk(e))


def _unparse_param(e: Expr) -> str:
    if isinstance(e, Param):
        return "${" + e.name + "}"
    return unparse(e)


def _unparse_index(ix: Index) -> str:
    return {"int": str(ix.value), "last": "-1", "all": "*", "loop": f"{ix.loop}.i"}[ix.kind]


def children(e: Expr) -> tuple[Expr, ...]:
    """The direct sub-expressions of `e`, in source order (an iteration reference's index, then its
    inner part); a leaf has none. With `map_expr`, the one place that knows the shape of every node:
    each walk over expressions handles the nodes it cares about and leaves the rest to these two."""
    match e:
        case BinOp(left=a, right=b):
            return (a, b)
        case Neg(operand=a):
            return (a,)
        case IterRef(index=ix, inner=inner):
            return (ix, inner)
        case Record(fields=fields):
            return tuple(v for _, v in fields)
        case Call(args=args):
            return args
        case Slice(target=t, start=s, stop=p):
            return tuple(x for x in (t, s, p) if x is not None)
    return ()


def map_expr(e: Expr, fn: Callable[[Expr], Expr]) -> Expr:
    """`e` rebuilt with every direct sub-expression `x` (those `children` lists) replaced by `fn(x)`;
    a leaf is returned as is. A recursive rewrite calls it for the nodes it does not change itself."""
    match e:
        case BinOp(left=a, right=b):
            return replace(e, left=fn(a), right=fn(b))
        case Neg(operand=a):
            return replace(e, operand=fn(a))
        case IterRef(index=ix, inner=inner):
            new_ix = fn(ix)
            if not isinstance(new_ix, Index):
                raise TypeError(f"an iteration reference's index must stay an index, got {new_ix!r}")
            return replace(e, index=new_ix, inner=fn(inner))
        case Record(fields=fields):
            return replace(e, fields=tuple((n, fn(v)) for n, v in fields))
        case Call(args=args):
            return replace(e, args=tuple(fn(a) for a in args))
        case Slice(target=t, start=s, stop=p):
            return replace(e, target=fn(t), start=None if s is None else fn(s), stop=None if p is None else fn(p))
    return e


def walk(e: Expr) -> Iterator[Expr]:
    """Every sub-expression, pre-order."""
    yield e
    for c in children(e):
        yield from walk(c)
