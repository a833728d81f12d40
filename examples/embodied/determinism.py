"""Split invariance helpers: keyed randomness and batch-invariant evaluation.

The component contract requires *split invariance*: calling a method on all rows at once or on any
partition of the rows into contiguous groups must give bit-identical results. A stateful RNG that is
advanced per call breaks this (the second group would see a different stream). Instead every random
draw here is keyed by explicit values -- the workflow seed, the loop indices passed in through `in:`
and the global row (or group) index -- and a fresh generator is seeded from those keys.
Arithmetic must not depend on the grouping either: see `blocked_apply`.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

import numpy as np
import torch

Key = int | str


def derive_seed(*keys: Key) -> int:
    """Mix integer/string keys into a 63-bit seed (stable across processes and Python versions).

    Strings are folded with CRC32 (Python's `hash` is salted per process); negative integers are
    mapped injectively onto the non-negative range that `numpy.random.SeedSequence` accepts.
    """
    words: list[int] = []
    for key in keys:
        if isinstance(key, str):
            words.append(zlib.crc32(key.encode()))
        else:
            k = int(key)
            words.append(2 * k if k >= 0 else -2 * k - 1)
    lo, hi = np.random.SeedSequence(words).generate_state(2, dtype=np.uint32)
    return (int(hi) << 31) ^ int(lo)


def keyed_generator(*keys: Key) -> torch.Generator:
    """A CPU `torch.Generator` seeded from `derive_seed(*keys)`."""
    gen = torch.Generator(device="cpu")
    gen.manual_seed(derive_seed(*keys))
    return gen


def resolve_rows(rows: slice | None, total: int) -> range:
    """The global row indices a call covers (`None` = all rows), validated against `total`."""
    if rows is None:
        return range(total)
    if not isinstance(rows, slice):
        raise TypeError(f"rows must be a slice or None, got {type(rows).__name__}")
    selected = range(total)[rows]
    if selected.step != 1:
        raise ValueError(f"rows must be a contiguous slice, got {rows}")
    return selected


def keyed_normal(shape_per_row: tuple[int, ...], total_rows: int, rows: slice | None, *keys: Key) -> torch.Tensor:
    """Standard-normal noise for the global rows in `rows`, identical however the rows are grouped.

    Draws `[total_rows, *shape_per_row]` from a generator keyed by `keys` and returns the slice, so
    row r's noise depends only on (keys, r). Drawing all rows costs little next to a forward pass.
    """
    selected = resolve_rows(rows, total_rows)
    noise = torch.randn((total_rows, *shape_per_row), generator=keyed_generator(*keys))
    return noise[selected.start : selected.stop]


Tree = torch.Tensor | dict[str, torch.Tensor]


def _take(tree: Tree, local: slice, pos: slice, block: int) -> Tree:
    """Rows `local` of `tree`, placed at positions `pos` of a zero-padded block of `block` rows."""
    if isinstance(tree, dict):
        return {k: _take(v, local, pos, block) for k, v in tree.items()}
    part = tree[local]
    if pos.stop - pos.start == block:
        return part
    padded = tree.new_zeros((block, *tree.shape[1:]))
    padded[pos] = part
    return padded


def blocked_apply(fn: Callable[..., torch.Tensor], args: tuple[Tree, ...], selected: range,
                  block: int | None) -> torch.Tensor:
    """Evaluate a row-wise `fn` on fixed blocks of `block` rows aligned to *global* row indices.

    Why: CPU GEMM kernels (MKL/oneDNN) pick their blocking from the number of rows, so row r of
    `x[:3] @ W` and of `x @ W` can differ in the last bit. Evaluating every row at the same position
    of a block of the same size -- padding a group's partial blocks with zero rows, which no row-wise
    op can mix into real rows -- makes the result independent of how the rows were grouped.
    `block=None` evaluates the batch as is (GPU: bit-invariance across groups is not promised).
    `args` are tensors or records with the rows `selected` (global indices) on dim 0.
    """
    if block is None or len(selected) == 0:
        return fn(*args)
    outs = []
    for b in range(selected.start // block, (selected.stop - 1) // block + 1):
        lo, hi = max(b * block, selected.start), min((b + 1) * block, selected.stop)
        local, pos = slice(lo - selected.start, hi - selected.start), slice(lo - b * block, hi - b * block)
        out = fn(*(_take(a, local, pos, block) for a in args))
        outs.append(out[pos])
    return outs[0] if len(outs) == 1 else torch.cat(outs)
