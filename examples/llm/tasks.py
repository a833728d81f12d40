"""PromptSource: the prompt stream of the LLM GRPO workflow (`prompts.next_batch`)."""

from __future__ import annotations

import torch

from examples.llm.arithmetic import ArithmeticTask
from examples.llm.tokenizer import CharTokenizer

Record = dict[str, torch.Tensor]


def encode_prompts(
    tok: CharTokenizer, task: ArithmeticTask, texts: list[str], answers: list[int], first_index: int
) -> Record:
    """A prompts record (prompts on dim 0), right-padded with PAD to the task's fixed prompt width.

    The width depends on the task only, never on the batch, so that records of contiguous prompt
    groups concatenate into the record of the whole batch (split invariance downstream).
    """
    width = task.prompt_chars + 1  # + BOS
    tokens = torch.full((len(texts), width), tok.pad_id, dtype=torch.long)
    lengths = torch.empty(len(texts), dtype=torch.long)
    for r, text in enumerate(texts):
        ids = tok.encode(text, bos=True)
        tokens[r, : len(ids)] = torch.tensor(ids)
        lengths[r] = len(ids)
    return {
        "tokens": tokens,  # [P, Lp] int64, right-padded with PAD
        "lengths": lengths,  # [P] number of real tokens (BOS included)
        "answer": torch.tensor(answers, dtype=torch.long),  # [P] the integer the reward checks
        "index": torch.arange(first_index, first_index + len(texts), dtype=torch.long),  # [P] stream ids
    }


class PromptSource:
    """Serves `batch` arithmetic prompts per call, deterministically from (seed, cursor).

    State `cursor` (a Python int) is the position in the problem stream. `next_batch` reads and
    advances it (a state *update*); restoring it replays the same prompts.
    """

    def __init__(self, batch: int, seed: int = 0, digits: int = 2, ops: str = "+") -> None:
        if batch < 1:
            raise ValueError(f"PromptSource: batch must be >= 1, got {batch}")
        self.batch = int(batch)
        self.seed = int(seed)
        self.task = ArithmeticTask(digits=digits, ops=ops)
        self.tokenizer = CharTokenizer()
        self.tokenizer_hash = self.tokenizer.hash()
        self.cursor = 0

    def next_batch(self, it: int | None = None) -> dict[str, Record]:
        """Return `{"prompts": record}` and advance the cursor by `batch`.

        `it` (the iteration index) is accepted for the workflow's benefit but not used: the stream
        position is the cursor, so a restored cursor replays exactly, whatever the iteration count.
        """
        start = int(self.cursor)
        problems = [self.task.problem(self.seed, i) for i in range(start, start + self.batch)]
        record = encode_prompts(
            self.tokenizer, self.task, [p for p, _ in problems], [a for _, a in problems], start
        )
        self.cursor = start + self.batch
        return {"prompts": record}

    def peek(self, it: int | None = None) -> dict[str, Record]:
        """`{"prompts": the batch the next `next_batch` returns}`, the cursor unchanged (a state *read*): a
        workflow submits the next iteration's prompts early with it, so that they decode beside this
        iteration's (the generator's partial rollouts)."""
        cursor = self.cursor
        try:
            return self.next_batch(it)
        finally:
            self.cursor = cursor
