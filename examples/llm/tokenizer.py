"""A character-level tokenizer for the arithmetic task.

Every LLM component (generator, reference, learner, reward workers) builds its own tokenizer and
checks its hash at construction: the lecture's "tokenizer mismatch" failure (two components that
disagree on token ids) does not crash anything, training just silently stops working, so the hash is
compared up front instead. This module deliberately imports no torch, so that reward worker processes
start fast.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence

PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"
SPECIALS = (PAD, BOS, EOS)
ALPHABET = "0123456789+-*="


class TokenizerMismatch(ValueError):
    """Raised when a component is handed a tokenizer hash different from its own."""


class CharTokenizer:
    """Maps each character of `alphabet` to one id; ids 0, 1, 2 are PAD, BOS, EOS.

    The vocabulary order is fixed by the constructor arguments, so `hash()` is stable across processes,
    machines and Python versions (it is a sha256 of a canonical JSON of the vocabulary).
    """

    def __init__(self, alphabet: str = ALPHABET) -> None:
        if len(set(alphabet)) != len(alphabet):
            raise ValueError(f"tokenizer alphabet has repeated characters: {alphabet!r}")
        self.vocab: list[str] = [*SPECIALS, *alphabet]
        self._ids = {tok: i for i, tok in enumerate(self.vocab)}
        self.pad_id, self.bos_id, self.eos_id = 0, 1, 2
        self._hash = hashlib.sha256(json.dumps(self.vocab).encode("utf-8")).hexdigest()

    def __len__(self) -> int:
        return len(self.vocab)

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def hash(self) -> str:
        """sha256 hex digest of the vocabulary: equal hashes mean equal token ids for every string."""
        return self._hash

    def check(self, expected_hash: str, who: str = "component") -> None:
        """Raise `TokenizerMismatch` when `expected_hash` is not this tokenizer's hash."""
        if expected_hash != self._hash:
            raise TokenizerMismatch(
                f"{who}: tokenizer hash {expected_hash[:12]}... does not match {self._hash[:12]}...; "
                "components would disagree on token ids"
            )

    def encode(self, text: str, bos: bool = False, eos: bool = False) -> list[int]:
        """Ids of `text`, one per character; unknown characters raise a ValueError naming them."""
        try:
            ids = [self._ids[ch] for ch in text]
        except KeyError as e:
            raise ValueError(f"character {e.args[0]!r} of {text!r} is not in the tokenizer alphabet") from None
        return ([self.bos_id] if bos else []) + ids + ([self.eos_id] if eos else [])

    def decode(self, ids: Iterable[int], stop_at_eos: bool = True) -> str:
        """Text of `ids`, skipping PAD/BOS and (by default) stopping at the first EOS.

        Ids outside the vocabulary decode to '?' so that a corrupted completion is simply wrong, not
        an exception inside a reward worker.
        """
        out: list[str] = []
        for i in ids:
            i = int(i)
            if i == self.eos_id and stop_at_eos:
                break
            if i in (self.pad_id, self.bos_id, self.eos_id):
                continue
            out.append(self.vocab[i] if 0 <= i < len(self.vocab) else "?")
        return "".join(out)

    def decode_batch(self, rows: Sequence[Sequence[int]]) -> list[str]:
        return [self.decode(r) for r in rows]
