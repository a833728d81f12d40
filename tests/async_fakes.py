"""Components whose state carries its version, for executing asynchronous plans (`defer:`).

Every write stamps the state with the RL iteration of the call that wrote it (an input `it:
iteration.i`, which a deferred call still takes from its own iteration), so a read knows exactly which
update it sees: the generator's read in RL iteration k of the declared workflow sees the sync of k-1
(stamp k-1, or -1, the initial value, at k = 0), and its lag is (k-1) - stamp. Calls sleep for the
durations a test draws, so that executions interleave differently; nothing is checked against time.

`Learner(report=True)`: each update's metrics say its iteration (`update_it`).
`Learner(wait_for_next=True)`: its update of iteration k waits (bounded: 30 s, or `wait_for_next` seconds
when a number) until the generator has started iteration k+1's rollout and records whether it did (also
as the metric `overlapped`) -- the overlap of a pipelined run observed as an event, not as a duration.
`last=K` (the run's last iteration, which has no next rollout): the update of K waits 1 s only -- the
bound is what a `False` costs, and 30 s of it were waiting for a rollout no iteration starts.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from typing import Any

import torch

STARTED: dict[str, dict[int, threading.Event]] = defaultdict(lambda: defaultdict(threading.Event))  # run -> k -> rollout k began


class _Napper:
    def __init__(self, sleeps: list[float] | None = None) -> None:
        self.sleeps = list(sleeps or [0.0])
        self.calls = 0

    def nap(self) -> None:
        s = self.sleeps[self.calls % len(self.sleeps)]
        self.calls += 1
        if s > 0:
            time.sleep(s)


class Generator(_Napper):
    """`weights` holds the stamp of the update it was synced from; `seen` logs (iteration, stamp) per rollout."""

    def __init__(self, sleeps: list[float] | None = None, run: str = "") -> None:
        super().__init__(sleeps)
        self.weights = torch.tensor([-1.0])
        self.seen: list[tuple[int, int]] = []
        self.run = run
        self._metrics: dict[str, float] = {}

    def generate(self, it: Any) -> dict[str, Any]:
        k = int(it)
        STARTED[self.run][k].set()
        stamp = int(self.weights.item())
        self.seen.append((k, stamp))
        self._metrics = {"rollout_it": float(k), "lag": float((k - 1) - stamp), "stamp": float(stamp)}
        self.nap()
        return {"rollouts": torch.tensor([float(k), float(stamp)])}

    def act(self, it: Any, t: Any) -> dict[str, Any]:
        """One trip of a rollout that ends on a condition and reads the weights at every trip (logged once per
        iteration, at its first trip: no trip writes them): done after 1 + it % 2 trips."""
        k, stamp = int(it), int(self.weights.item())
        if int(t) == 0:
            self.seen.append((k, stamp))
            self._metrics = {"stamp": float(stamp)}
        return {"rollouts": torch.tensor([float(k), float(stamp)]), "done": torch.tensor(float(int(t) + 1 >= 1 + k % 2))}

    def step(self, it: Any, t: Any) -> dict[str, Any]:
        """One trip of a rollout that ends on a condition: done after 1 + it % 3 trips (`trips` differ by
        iteration, so a metrics line holding another iteration's shows)."""
        return {"done": torch.tensor([float(int(t) + 1 >= 1 + int(it) % 3)])}

    def load(self, w: Any, it: Any = 0) -> dict[str, Any]:
        self.nap()
        self.weights = torch.as_tensor(w).clone()
        return {}

    def pop_metrics(self) -> dict[str, float]:
        out, self._metrics = self._metrics, {}
        return out


class Learner(_Napper):
    """`weights` holds the iteration of its last update."""

    def __init__(self, sleeps: list[float] | None = None, run: str = "", wait_for_next: bool | float = False,
                 report: bool = False, last: int = -1) -> None:
        super().__init__(sleeps)
        self.weights = torch.tensor([-1.0])
        self.run, self.wait_for_next, self.report, self.last = run, wait_for_next, report, int(last)
        self.overlapped: list[bool] = []
        self._metrics: dict[str, float] = {}

    def update(self, rollouts: Any, it: Any) -> dict[str, Any]:
        k = int(it)
        if self.wait_for_next:
            timeout = 30.0 if self.wait_for_next is True else float(self.wait_for_next)
            if k == self.last:
                timeout = min(timeout, 1.0)
            self.overlapped.append(STARTED[self.run][k + 1].wait(timeout=timeout))
            self._metrics = {"overlapped": float(self.overlapped[-1])}
        self.nap()
        self.weights = torch.tensor([float(k)])
        if self.report:  # which iteration's update this is: its metrics line must be that iteration's
            self._metrics = {**self._metrics, "update_it": float(k)}
        return {}

    def get(self) -> dict[str, Any]:
        self.nap()
        return {"w": self.weights.clone()}

    def pop_metrics(self) -> dict[str, float]:
        out, self._metrics = self._metrics, {}
        return out


class Scorer(_Napper):
    """A stateless call between rollout and update."""

    def score(self, rollouts: Any) -> dict[str, Any]:
        self.nap()
        return {"score": torch.as_tensor(rollouts).sum().reshape(1)}


class Stamper(_Napper):
    """A component for random workflows (`tests/strategies.py`): each method accesses the state objects its
    node declares (`behaviors`, as `tests.mocks.Mock`), and every write stamps the object with (method, RL
    iteration, n) -- the n-th call of that method in that RL iteration, the iteration read from the input
    `rl` (`iteration.i`: a deferred call still gets its own). `seen[(method, k, n, state)]` is the stamp each
    reading access saw, so two executions can be compared by which write each read saw, whatever the
    values (which an older read makes differ from then on)."""

    def __init__(self, name: str = "stamper", batch: int = 6, behaviors: dict[str, Any] | None = None,
                 states: list[str] | None = None, sleeps: list[float] | None = None) -> None:
        super().__init__(sleeps)
        self.name, self.batch, self.behaviors = name, batch, dict(behaviors or {})
        self.stamps: dict[str, tuple] = {s: ("init",) for s in states or []}
        self.seen: dict[tuple, tuple] = {}
        self._calls: dict[tuple[str, int], int] = defaultdict(int)
        for s in states or []:
            setattr(self, s, torch.zeros(1))

    def get_state(self, name: str) -> dict[str, Any]:
        """The state object's stamp, and how many calls of each method each RL iteration made so far (a resumed
        run numbers its calls as the uninterrupted one does): what a checkpoint keeps."""
        return {"stamp": list(self.stamps[name]), "calls": {f"{m}@{k}": n for (m, k), n in self._calls.items()}}

    def set_state(self, name: str, value: dict[str, Any]) -> None:
        self.stamps[name] = tuple(value["stamp"])
        self._calls = defaultdict(int, {(key.rsplit("@", 1)[0], int(key.rsplit("@", 1)[1])): n
                                        for key, n in value["calls"].items()})

    def __getattr__(self, method: str):
        behaviors = self.__dict__.get("behaviors", {})
        if method not in behaviors:
            raise AttributeError(method)
        spec = behaviors[method]

        def call(rows: slice | None = None, rl: Any = 0, **inputs: Any) -> dict[str, torch.Tensor]:
            k = int(rl)
            n = self._calls[(method, k)]
            self._calls[(method, k)] += 1
            self.nap()
            for state, mode in spec.get("state", {}).items():
                if mode != "refresh":
                    self.seen[(method, k, n, state)] = self.stamps[state]
                if mode != "read":
                    self.stamps[state] = (method, k, n)
            rows_n = len(range(*(rows or slice(0, self.batch)).indices(self.batch)))
            return {port: torch.zeros(rows_n, dtype=torch.float64) for port in spec.get("out", [])}

        return call


class Relay(_Napper):
    """A component between the learner and a generator: `load` stores the weights it is given, `get` hands
    them on (a second sync reads them from here): the stamp travels unchanged, so the generator at the end
    of the relay still logs the learner update its weights come from."""

    def __init__(self, sleeps: list[float] | None = None) -> None:
        super().__init__(sleeps)
        self.weights = torch.tensor([-1.0])
        self.seen: list[tuple[int, int]] = []  # (iteration, stamp) per `get` given its iteration

    def load(self, w: Any, it: Any = 0) -> dict[str, Any]:
        self.nap()
        self.weights = torch.as_tensor(w).clone()
        return {}

    def get(self, it: Any = None) -> dict[str, Any]:
        self.nap()
        if it is not None:
            self.seen.append((int(it), int(self.weights.item())))
            self._metrics = {"stamp": float(self.weights.item())}
        return {"w": self.weights.clone()}

    def pop_metrics(self) -> dict[str, float]:
        out, self._metrics = getattr(self, "_metrics", {}), {}
        return out
