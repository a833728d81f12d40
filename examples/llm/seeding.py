"""Counter-based seeds: a seed derived from a tuple of integers, independent of any RNG's history.

Split invariance (docs/components.md) forbids drawing per-row randomness from one stateful RNG advanced
per call; instead every random stream here is keyed by explicit integers such as
(seed, iteration, prompt index, sample index). Torch-free on purpose (used by the reward workers' task).
"""

from __future__ import annotations

import hashlib
import struct

_DOMAIN = b"rose.examples.llm"


def mix_seed(*parts: int) -> int:
    """A 63-bit seed from integer parts; different tuples give unrelated seeds (sha256 based)."""
    data = _DOMAIN + b"".join(struct.pack("<q", int(p)) for p in parts)
    return int.from_bytes(hashlib.sha256(data).digest()[:8], "little") >> 1
