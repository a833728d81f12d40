"""Building large, long-lived structures without the cyclic garbage collector re-scanning them.

Why: loading a workflow, building its IR and its invocation graph allocate hundreds of thousands of
small containers that all stay alive. CPython's generational collector scans young objects every 700
allocations, promotes the survivors, and fully re-scans everything each time the old generation has
grown by a quarter; for a 10,000-node workflow that was more than half of `rose validate`
(`benchmarks/validate_scale.py`, DEVELOPERS.md "What costs what"). Inside `bulk()` automatic
collection is paused; on leaving, what survived is moved straight to the oldest generation
(`gc.freeze(); gc.unfreeze()`), as mypy does after loading its cache, so it is not scanned again as
young objects. Reference counting still frees everything that dies meanwhile; only cycles wait for the
next full collection. Nested uses pause once.
"""

from __future__ import annotations

import functools
import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import ParamSpec, TypeVar

__all__ = ["bulk", "in_bulk"]

P = ParamSpec("P")
R = TypeVar("R")


@contextmanager
def bulk() -> Iterator[None]:
    """Pause automatic garbage collection while building; promote the survivors when done."""
    if not gc.isenabled():  # paused already (an enclosing bulk(), or the program's own choice)
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.unfreeze()
        gc.enable()


def in_bulk(fn: Callable[P, R]) -> Callable[P, R]:
    """`fn` run inside `bulk()`."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        with bulk():
            return fn(*args, **kwargs)

    return wrapper
