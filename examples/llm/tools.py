"""Tools for the agent workload (`workflows/llm_agent_tools*.yaml`): a calculator over a small expression
grammar, called on a pool of CPU workers with a long-tailed latency and a timeout.

The policy writes a call (digits and `+ - *`) and ends it with the tool-call token `=` (`CALL`); the
tool parses the call's text with the lark grammar `CALC` (never `eval`/`exec` of generated text), under a
size limit (`max_chars` of call text, `max_digits` per number, values within +-10^`max_digits`), and
answers the value written as the task writes answers (least significant digit first,
`arithmetic.format_answer`), or `-` for a call that does not parse or is too large. Its output is appended to the sample's context by the agent (the KV cache extended, not
recomputed) and never trained on (masked out of the loss).

Latency, a **systems stand-in** for a sandbox, a search or a web call: each call sleeps a time drawn from
the lognormal with mean `latency_mean_ms` and 99th percentile `latency_p99_ms`, keyed by (seed, it,
prompt, sample, turn) -- every plan and row grouping draws the same latencies. A call whose draw exceeds
`timeout_ms` times out: it returns after `timeout_ms`, and the sample ends there (`done`, no answer: it
scores 0). `workers` calls run at once (threads: the calls sleep and parse a few characters).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from typing import Any

import torch

from examples.llm.arithmetic import answer_prefix_credit, answer_then_stop, format_answer
from examples.llm.sampling import lognormal_params
from examples.llm.seeding import mix_seed
from examples.llm.tokenizer import CharTokenizer

__all__ = ["CALC", "CALL", "ToolPool", "calculate", "final_answer", "final_prefix_credit"]

CALL = "="  # the tool-call token: the policy's text up to it is the call
CALC = r"""
?sum: product | sum ADD product -> binop
?product: NUMBER | product MUL NUMBER -> binop
ADD: "+" | "-"
MUL: "*"
NUMBER: /[0-9]+/
"""


class CallError(ValueError):
    """A call the calculator refuses: it does not parse, or it is too large."""


@lru_cache(maxsize=1)
def _parser() -> Any:
    from lark import Lark

    return Lark(CALC, start="sum", parser="lalr")


def calculate(text: str, max_chars: int = 16, max_digits: int = 4) -> int:
    """The value of a call's text in the calculator's grammar; CallError when it does not parse or is too
    large (longer than `max_chars`, a number or a partial value of more than `max_digits` digits)."""
    from lark import Token, Tree
    from lark.exceptions import LarkError

    if not text or len(text) > max_chars:
        raise CallError(f"a call of {len(text)} characters (1..{max_chars})")
    try:
        tree = _parser().parse(text)
    except LarkError as exc:
        raise CallError(f"does not parse: {text!r}") from exc
    bound = 10 ** max_digits

    def value(node: Any) -> int:
        if isinstance(node, Token):
            if len(node) > max_digits:
                raise CallError(f"number {node} has more than {max_digits} digits")
            return int(node)
        assert isinstance(node, Tree) and node.data == "binop"
        left, op, right = value(node.children[0]), str(node.children[1]), value(node.children[2])
        out = left + right if op == "+" else left - right if op == "-" else left * right
        if abs(out) >= bound:
            raise CallError(f"a value beyond {max_digits} digits")
        return out

    return value(tree)


def final_answer(completion: str, answer: int, reverse: bool = True) -> float:
    """The agent's verifiable reward: `answer_then_stop` on the policy's text after its last tool call."""
    return answer_then_stop(completion.rsplit(CALL, 1)[-1], answer, reverse)


def final_prefix_credit(completion: str, answer: int, reverse: bool = True) -> float:
    """The GPU variant's reward (random weights): `answer_prefix_credit` on the text after the last call."""
    return answer_prefix_credit(completion.rsplit(CALL, 1)[-1], answer, reverse)


def latency_ms(seed: int, it: int, pid: int, sample: int, turn: int, mean: float, p99: float) -> float:
    """One call's latency, drawn from the lognormal of `mean` and `p99` keyed by the call's identity."""
    if not mean:
        return 0.0
    mu, sigma = lognormal_params(mean, p99)
    rng = random.Random(mix_seed(seed, it, pid, sample, turn))
    return math.exp(rng.gauss(mu, sigma))


class ToolPool:
    """The calculator on `workers` threads. `run` takes one turn's calls of the given prompt rows (every
    sample that ended its turn on the tool-call token) and returns each sample's tool output and whether
    it is done (it ended by EOS, reached its last turn, or its call timed out), and per prompt row whether
    all its samples are done (the turn loop's condition)."""

    def __init__(self, workers: int = 4, seed: int = 0, latency_mean_ms: float = 0.0, latency_p99_ms: float = 0.0,
                 timeout_ms: float = 1000.0, max_chars: int = 16, max_digits: int = 4, obs_tokens: int = 6) -> None:
        if int(workers) < 1:
            raise ValueError(f"ToolPool: workers must be >= 1, got {workers}")
        if latency_mean_ms:
            lognormal_params(float(latency_mean_ms), float(latency_p99_ms))  # an impossible pair fails here
        self.seed, self.timeout_ms = int(seed), float(timeout_ms)
        self.latency = (float(latency_mean_ms), float(latency_p99_ms))
        self.max_chars, self.max_digits, self.obs_tokens = int(max_chars), int(max_digits), int(obs_tokens)
        self.tokenizer = CharTokenizer()
        self.pool = ThreadPoolExecutor(int(workers), thread_name_prefix="tool")
        self._m: dict[str, float] = {}

    def run(self, call: Mapping[str, torch.Tensor], sdone: torch.Tensor, turn: int, it: int,
            rows: Any = None) -> dict[str, torch.Tensor]:
        """call: the agent's turn record (`text` [P, K, S] the call's tokens, `text_len`, `called` [P, K],
        `index` [P]); sdone [P, K]: samples done before this turn. Returns obs [P, K, O] (PAD-padded),
        obs_len [P, K], sdone [P, K] and done [P]."""
        p_count, k, _ = call["text"].shape
        obs = torch.full((p_count, k, self.obs_tokens), self.tokenizer.pad_id, dtype=torch.long)
        obs_len = torch.zeros(p_count, k, dtype=torch.long)
        done = sdone.clone() | call["ended"]
        jobs = {}
        t0 = time.perf_counter()
        for p in range(p_count):
            pid = int(call["index"][p])
            for j in range(k):
                if bool(call["called"][p, j]) and not bool(done[p, j]):
                    ids = call["text"][p, j, : int(call["text_len"][p, j])].tolist()
                    jobs[(p, j)] = self.pool.submit(self._one, self.tokenizer.decode(ids), pid, j, int(turn), int(it))
        timeouts = errors = 0
        for (p, j), fut in jobs.items():
            out, timed_out = fut.result()
            timeouts += timed_out
            errors += out == "-"
            if timed_out:
                done[p, j] = True
                continue
            ids = self.tokenizer.encode(out)[: self.obs_tokens]
            obs[p, j, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            obs_len[p, j] = len(ids)
        self._add(calls=float(len(jobs)), wait_s=time.perf_counter() - t0, timeouts=float(timeouts),
                  call_errors=float(errors))
        return {"obs": obs, "obs_len": obs_len, "sdone": done, "done": done.all(dim=1)}

    def _one(self, text: str, pid: int, sample: int, turn: int, it: int) -> tuple[str, bool]:
        wait = latency_ms(self.seed, it, pid, sample, turn, *self.latency)
        time.sleep(min(wait, self.timeout_ms) / 1e3)
        if wait > self.timeout_ms:
            return "", True
        try:
            value = calculate(text.rstrip(CALL), self.max_chars, self.max_digits)
        except CallError:
            return "-", False
        return format_answer(value), False

    def _add(self, **kw: float) -> None:
        for key, v in kw.items():
            self._m[key] = self._m.get(key, 0.0) + v

    def pop_metrics(self) -> dict[str, float]:
        m, self._m = self._m, {}
        return m

    def close(self) -> None:
        self.pool.shutdown(wait=False)
