"""The verifiable task: integer arithmetic on short operands ("23+58=" -> "18", i.e. 81 reversed).

Answers are written least-significant digit first by default (`reverse`): each answer digit then
depends on the operand digits already seen plus a carry, which small transformers learn several times
faster than most-significant-first (cf. Lee et al. 2023, "Teaching Arithmetic to Small Transformers").

Why this task: its answers are checkable exactly (a verifiable reward, as in the lecture's math
problems), a transformer of ~100k-1M parameters learns it partially from a few hundred supervised
steps (so a warm-started policy starts with a non-zero but imperfect reward) and RL then sharpens it
within minutes on a CPU. Torch-free: reward worker processes import `check_answer` from here.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from examples.llm.seeding import mix_seed

_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


@dataclass(frozen=True)
class ArithmeticTask:
    """Problems `a<op>b=` with 0 <= a, b < 10**digits; `ops` is a subset of "+-*"."""

    digits: int = 2
    ops: str = "+"
    reverse: bool = True  # write answers least-significant digit first (much easier to learn)

    def __post_init__(self) -> None:
        if self.digits < 1:
            raise ValueError(f"digits must be >= 1, got {self.digits}")
        if not self.ops or any(op not in _OPS for op in self.ops):
            raise ValueError(f"ops must be a non-empty subset of '+-*', got {self.ops!r}")

    @property
    def prompt_chars(self) -> int:
        """Longest prompt text (without BOS): two operands, the operator and '='."""
        return 2 * self.digits + 2

    @property
    def answer_chars(self) -> int:
        """Longest answer text (without EOS)."""
        hi = 10**self.digits - 1
        return max(len(str(_OPS[op](a, b))) for op in self.ops for a in (0, hi) for b in (0, hi))

    def problem(self, seed: int, index: int) -> tuple[str, int]:
        """The `index`-th problem of the stream `seed`: (prompt text, integer answer).

        Each problem has its own RNG keyed by (seed, index), so the stream does not depend on how it is
        cut into batches, and restoring a cursor replays exactly the same prompts.
        """
        rng = random.Random(mix_seed(seed, index))
        hi = 10**self.digits
        a, b = rng.randrange(hi), rng.randrange(hi)
        op = self.ops[rng.randrange(len(self.ops))]
        return f"{a}{op}{b}=", _OPS[op](a, b)

    def answer_text(self, answer: int) -> str:
        return format_answer(answer, self.reverse)


def format_answer(answer: int, reverse: bool = True) -> str:
    """The expected completion text of `answer` (digits reversed after the sign when `reverse`)."""
    text = str(int(answer))
    if not reverse:
        return text
    sign, digits = ("-", text[1:]) if text.startswith("-") else ("", text)
    return sign + digits[::-1]


def check_answer(completion: str, answer: int, reverse: bool = True) -> float:
    """The verifiable reward: 1.0 iff the completion (decoded up to EOS) is exactly the answer's text."""
    return 1.0 if completion == format_answer(answer, reverse) else 0.0


def answer_prefix_credit(completion: str, answer: int, reverse: bool = True) -> float:
    """The verifiable reward of the long-tail workload, whose completion lengths are forced (the answer
    is followed by whatever fills the drawn length): partial credit for each leading character of the
    answer written in place, and full credit (1.0) when the answer is complete and followed by a
    non-digit or the end. Dense, so that GRPO has signal from a weak (even random) policy."""
    target = format_answer(answer, reverse)
    n = 0
    while n < len(target) and n < len(completion) and completion[n] == target[n]:
        n += 1
    ended = n == len(target) and (n == len(completion) or not completion[n].isdigit())
    return (n + ended) / (len(target) + 1)


def answer_then_stop(completion: str, answer: int, reverse: bool = True) -> float:
    """The long-tail workload's exact reward: 1.0 iff the completion starts with the answer followed by a
    non-digit or its end (`answer_prefix_credit` without the partial credit), else 0.0."""
    return 1.0 if answer_prefix_credit(completion, answer, reverse) == 1.0 else 0.0
