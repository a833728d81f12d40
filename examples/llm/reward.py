"""RewardPool: the verifiable reward, computed by CPU worker processes (`reward.score`).

Why a pool of processes with a watchdog rather than `concurrent.futures`: a timed-out future keeps its
worker busy forever, and one killed worker breaks a whole `ProcessPoolExecutor`. Here the parent owns
one pipe per worker and hands it one item at a time, so it always knows which item a worker holds and
since when; a worker that overruns `timeout_s` is killed and replaced, a worker that dies is replaced,
and in both cases only its item fails (reward `failed_reward`, counted). Nothing can hang `score`.

Back-pressure: at most `queue_size` items wait for a free worker; `submit` blocks (while driving the
workers) until there is room, instead of letting the queue grow without bound (lecture: "reward worker
queue grows unboundedly").
"""

from __future__ import annotations

import multiprocessing as mp
import time
import weakref
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

import torch

from examples.llm.policy import PolicySpec
from examples.llm.reward_worker import worker_main
from examples.llm.tokenizer import CharTokenizer

_START_TIMEOUT_S = 60.0


@dataclass
class _Worker:
    proc: Any  # a SpawnProcess
    conn: Connection
    state: str = "starting"  # starting -> idle <-> busy
    ticket: int = -1
    since: float = field(default_factory=time.monotonic)


def _shutdown(workers: list[_Worker]) -> None:
    """Stop every worker: polite request, short grace period, then kill. Idempotent."""
    for w in workers:
        try:
            w.conn.send(None)
        except (OSError, ValueError):
            pass
    deadline = time.monotonic() + 2.0
    for w in workers:
        w.proc.join(timeout=max(0.0, deadline - time.monotonic()))
        if w.proc.is_alive():
            w.proc.kill()
            w.proc.join(timeout=5.0)
        w.conn.close()
    workers.clear()


class RewardPool:
    """`workers` spawned processes scoring completions with `verifier(text, answer, **kwargs)`."""

    def __init__(
        self,
        workers: int,
        timeout_s: float,
        queue_size: int = 256,
        verifier: str = "examples.llm.arithmetic:check_answer",
        failed_reward: float = 0.0,
        policy: Mapping[str, Any] | None = None,
        tokenizer_hash: str | None = None,
    ) -> None:
        if int(workers) < 1:
            raise ValueError(f"RewardPool: workers must be >= 1, got {workers}")
        if not timeout_s > 0:
            raise ValueError(f"RewardPool: timeout_s must be > 0, got {timeout_s}")
        if int(queue_size) < 1:
            raise ValueError(f"RewardPool: queue_size must be >= 1, got {queue_size}")
        self.timeout_s, self.queue_size, self.failed_reward = float(timeout_s), int(queue_size), float(failed_reward)
        self.tokenizer = CharTokenizer()
        self.tokenizer_hash = self.tokenizer.hash()
        if tokenizer_hash is not None:
            self.tokenizer.check(tokenizer_hash, "RewardPool")
        spec = PolicySpec.from_args(policy)
        self._args = (verifier, {"reverse": spec.reverse}, self.tokenizer_hash)
        self._ctx = mp.get_context("spawn")
        self._workers: list[_Worker] = []
        self._finalizer = weakref.finalize(self, _shutdown, self._workers)  # also runs at interpreter exit
        self._pending: deque[tuple[int, list[int], int]] = deque()
        self._results: dict[int, float] = {}
        self._next_ticket = 0
        self._m: dict[str, float] = {}
        for _ in range(int(workers)):
            self._spawn()
        deadline = time.monotonic() + _START_TIMEOUT_S
        while any(w.state == "starting" for w in self._workers):
            if time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"RewardPool: workers did not start within {_START_TIMEOUT_S:.0f} s")
            self._pump(0.5)

    # -- public API ----------------------------------------------------------------------------------
    def score(self, rollouts: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """`{"reward": Tensor[P, K] float32}`: 1 for an exactly right answer, else 0 (or `failed_reward`)."""
        tokens, mask, answer = rollouts["tokens"], rollouts["mask"], rollouts["answer"]
        p_count, k, _ = tokens.shape
        t0 = time.perf_counter()
        tickets = [
            self.submit(tokens[p, j][mask[p, j]].tolist(), int(answer[p])) for p in range(p_count) for j in range(k)
        ]
        rewards = torch.tensor(self.collect(tickets), dtype=torch.float32).view(p_count, k)
        # summed in float64: exact for these float32 rewards, so row groups report the declared mean bit for bit
        self._add(seconds=time.perf_counter() - t0, items=float(rewards.numel()),
                  reward_sum=float(rewards.double().sum()))
        return {"reward": rewards}

    def submit(self, ids: Sequence[int], answer: int) -> int:
        """Queue one completion; blocks while `queue_size` items are already waiting. Returns a ticket."""
        self._check_open()
        if len(self._pending) >= self.queue_size:
            self._add(blocked_submits=1.0)
            while len(self._pending) >= self.queue_size:
                self._pump(0.05)
        ticket, self._next_ticket = self._next_ticket, self._next_ticket + 1
        self._pending.append((ticket, list(ids), int(answer)))
        self._m["queue_high_water"] = max(self._m.get("queue_high_water", 0.0), float(len(self._pending)))
        self._dispatch()
        return ticket

    def collect(self, tickets: Sequence[int]) -> list[float]:
        """Rewards of `tickets`, in order, waiting for them (bounded by the per-item timeout)."""
        while any(t not in self._results for t in tickets):
            self._pump(0.05)
        return [self._results.pop(t) for t in tickets]

    def worker_pids(self) -> list[int]:
        return [w.proc.pid for w in self._workers]

    def pop_metrics(self) -> dict[str, float]:
        """Items, mean reward, errors (verifier exceptions + dead workers), timeouts, restarts, queue use."""
        m, self._m = self._m, {}
        items = m.get("items", 0.0)
        out = {key: m.get(key, 0.0) for key in ("items", "errors", "timeouts", "crashes", "restarts")}
        out.update(
            mean_reward=m.get("reward_sum", 0.0) / items if items else 0.0,
            items_per_s=items / m["seconds"] if m.get("seconds") else 0.0,
            queue_high_water=m.get("queue_high_water", 0.0), blocked_submits=m.get("blocked_submits", 0.0),
        )
        return out

    def close(self) -> None:
        """Stop the workers (idempotent; also done on garbage collection and at interpreter exit)."""
        self._finalizer()

    def __enter__(self) -> RewardPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if hasattr(self, "_finalizer"):
            self._finalizer()

    # -- the watchdog --------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if not self._finalizer.alive:
            raise RuntimeError("RewardPool is closed")

    def _spawn(self) -> None:
        parent, child = self._ctx.Pipe(duplex=True)
        proc = self._ctx.Process(target=worker_main, args=(child, *self._args), daemon=True, name="rose-reward")
        proc.start()
        child.close()
        self._workers.append(_Worker(proc, parent))

    def _retire(self, w: _Worker, outcome: str) -> None:
        """Kill `w` (if needed), fail its item with `outcome` counted, and start a replacement."""
        if w.state == "starting":
            self._finalizer()
            raise RuntimeError(
                f"RewardPool: a reward worker failed to start (exit code {w.proc.exitcode}); "
                "check the verifier path and the tokenizer hash"
            )
        if w.state == "busy":
            self._results[w.ticket] = self.failed_reward
            self._add(**{outcome: 1.0})
            if outcome == "crashes":
                self._add(errors=1.0)
        if w.proc.is_alive():
            w.proc.kill()
        w.proc.join(timeout=5.0)
        w.conn.close()
        self._workers.remove(w)
        self._add(restarts=1.0)
        self._spawn()

    def _dispatch(self) -> None:
        for w in self._workers:
            if not self._pending:
                return
            if w.state == "idle":
                ticket, ids, answer = self._pending.popleft()
                try:
                    w.conn.send((ticket, ids, answer))
                except OSError:  # died since its last message: put the item back, the pump replaces it
                    self._pending.appendleft((ticket, ids, answer))
                    w.state = "dead"
                    continue
                w.state, w.ticket, w.since = "busy", ticket, time.monotonic()

    def _pump(self, max_wait: float) -> None:
        """Dispatch, wait for a reply, a death or the next deadline (at most `max_wait`), then handle it."""
        self._dispatch()
        watched = [w for w in self._workers if w.state != "idle"]
        if not watched:
            return
        now = time.monotonic()
        next_deadline = min(w.since + self._limit(w) for w in watched) - now
        wait([w.conn for w in watched] + [w.proc.sentinel for w in watched], max(0.0, min(max_wait, next_deadline)))
        for w in list(watched):
            msg, broken = None, False
            try:
                msg = w.conn.recv() if w.conn.poll() else None
            except (EOFError, OSError):  # the worker is gone (maybe not yet reaped)
                broken = True
            if msg is not None:
                ticket, value, err = msg
                if ticket == "ready":
                    w.state = "idle"
                    continue
                self._results[ticket] = value if err is None else self.failed_reward
                if err is not None:
                    self._add(errors=1.0)
                w.state, w.ticket = "idle", -1
            elif broken or w.state == "dead" or not w.proc.is_alive():
                self._retire(w, "crashes")
            elif time.monotonic() - w.since > self._limit(w):
                self._retire(w, "timeouts")
        self._dispatch()

    def _limit(self, w: _Worker) -> float:
        return self.timeout_s if w.state == "busy" else _START_TIMEOUT_S

    def _add(self, **values: float) -> None:
        for key, val in values.items():
            self._m[key] = self._m.get(key, 0.0) + val
