"""CUDA graphs of the decoder's decode step, one per (slot prefix, attention span) bucket.

Why: on the H200 one eager decode step of the 0.5B-shaped decoder took 16-20 ms whatever its size (16 or
512 slots, context 64 or 2048; `benchmarks/llm_longtail_probe.py`): the launches of its ~600 small kernels,
not their arithmetic, set its time, and the GPU was busy 7% of a generation. Serving engines (vLLM,
SGLang) capture the decode step per batch-size bucket for this reason; the generator does the same.
Hand-written rather than `torch.compile(mode="reduce-overhead")`: compiling a 24-layer decoder costs
minutes in every generator process and recompiles on every new dynamic shape, while the buckets here are
few, explicit and captured in well under a second each, on first use.

Buckets: the slot prefix A is a power of two (at least `MIN_SLOTS`, at most the cache's slot count), the
attention span T a power of two (at least `MIN_SPAN`, at most the context). A step decodes slots [0, A)
with attention over positions [0, T), each row masked to its own position -- the eager GPU path's
computation at a padded shape. Slots in the prefix that hold no sequence compute values nobody reads and
write their K/V at position 0 of a free slot, which the next occupant's prefix overwrites (as eagerly).

Correctness: a replay runs the kernels the eager step runs at that shape (bf16 autocast without its cast
cache, as `examples/embodied/policy.DenoiseGraphs`). A bucket's first use runs the step twice eagerly on
the real inputs before capturing it (cuBLAS handles, allocator): those runs write the K/V the replay then
writes again, so they change nothing. The captured graphs read the weights in place, and weight syncs
copy into them (`load_state_dict`), so the graphs stay valid across syncs; the cache is allocated once.
"""

from __future__ import annotations

from typing import Any

import torch

MIN_SLOTS = 8  # smallest slot-prefix bucket: below it a step costs the same, and fewer graphs are captured
MIN_SPAN = 128  # smallest attention-span bucket, for the same reason


def bucket(n: int, floor: int, cap: int) -> int:
    """The smallest power of two >= max(n, floor), capped at `cap`."""
    return min(cap, 1 << (max(n, floor) - 1).bit_length())


class DecodeGraphs:
    """`decode(tokens, pos, hi)`: the logits [hi, V] of the first `hi` slots, from a captured graph."""

    def __init__(self, model: Any, cache: Any) -> None:
        self.model, self.cache = model, cache
        self.slots, self.context = cache.slots, model.cfg.context
        dev = cache.k.device
        self.tokens = torch.zeros(self.slots, dtype=torch.long, device=dev)
        self.pos = torch.zeros(self.slots, dtype=torch.long, device=dev)
        self.pool = torch.cuda.graph_pool_handle()
        self._graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}

    @property
    def captured(self) -> int:
        return len(self._graphs)

    def decode(self, tokens: torch.Tensor, pos: torch.Tensor, hi: int) -> torch.Tensor:
        """tokens, pos: every slot's newest token and its position, on the CPU ([slots]; free slots 0)."""
        top = int(pos[:hi].max())
        self.model._check_pos(top)
        a = bucket(hi, MIN_SLOTS, self.slots)
        t = bucket(top + 1, MIN_SPAN, self.context)
        self.tokens[:a].copy_(tokens[:a])
        self.pos[:a].copy_(pos[:a])
        found = self._graphs.get((a, t))
        if found is None:
            found = self._graphs[(a, t)] = self._capture(a, t)
        found[0].replay()
        return found[1][:hi]

    def _step(self, a: int, t: int) -> torch.Tensor:
        with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
            return self.model.decode(self.tokens[:a], self.pos[:a], self.cache, None, False, span=t)

    @torch.no_grad()
    def _capture(self, a: int, t: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self._step(a, t)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = self._step(a, t)
        return graph, out
