"""Components of the run-directory tests (tests/cli/test_run_dir.py)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch


class Holds:
    """Adds each call's input to a running total (its state, `acc`). At call `hold_at` it writes the file
    `inside` and waits until the file `go` exists: the test signals the run while an iteration is in
    flight, then lets that iteration end. `rows` only makes a param reach the component."""

    def __init__(self, inside: str = "", go: str = "", hold_at: int = 0, rows: int = 1) -> None:
        self.inside, self.go, self.hold_at = inside, go, hold_at
        self.calls = 0
        self.total = torch.zeros(rows)

    def work(self, x: Any = 0) -> dict[str, Any]:
        self.calls += 1
        if self.calls == self.hold_at:
            Path(self.inside).write_text("in the call")
            deadline = time.monotonic() + 300  # (a bound, not a measurement: the test creates `go` at once)
            while not Path(self.go).exists() and time.monotonic() < deadline:
                time.sleep(0.01)
        self.total = self.total + torch.as_tensor(x, dtype=torch.float32)
        return {"y": self.total.clone()}

    def get_state(self, name: str) -> Any:
        return {"total": self.total.clone(), "calls": self.calls}

    def set_state(self, name: str, value: Any) -> None:
        self.total = value["total"].clone()
        self.calls = value["calls"]


class RunningTotal:
    """The state of the signalling components below: their running total and how many calls they took."""

    total: torch.Tensor
    calls: int

    def get_state(self, name: str) -> Any:
        return {"total": self.total.clone(), "calls": self.calls}

    def set_state(self, name: str, value: Any) -> None:
        self.total, self.calls = value["total"].clone(), value["calls"]


class KickDriver(RunningTotal):
    """Adds each call's input to a running total (state `acc`); at call `at` it sends `times` SIGINTs to the
    process `target` (rose's, from a Ray worker), `gap` seconds apart: the signal pass on Ray."""

    def __init__(self, at: int = 0, times: int = 0, target: int = 0, gap: float = 1.5) -> None:
        self.at, self.times, self.target, self.gap, self.calls = at, times, target, gap, 0
        self.total = torch.zeros(1)

    def work(self, x: Any = 0) -> dict[str, Any]:
        import os
        import signal

        self.calls += 1
        if self.calls == self.at and self.target:
            for i in range(self.times):
                if i:
                    time.sleep(self.gap)
                try:
                    os.kill(self.target, signal.SIGINT)
                except ProcessLookupError:
                    break
        self.total = self.total + torch.as_tensor(x, dtype=torch.float32)
        return {"y": self.total.clone()}


class SignalAt(RunningTotal):
    """Adds each call's input to a running total (state `acc`); at its call `at` it sends one SIGINT to the
    process whose pid the file `pidfile` holds (rose's, written by the test once it started it): a stop at a
    chosen iteration from any backend's process, local or Ray, through the real signal path."""

    def __init__(self, at: int = 0, pidfile: str = "") -> None:
        self.at, self.pidfile, self.calls = at, pidfile, 0
        self.total = torch.zeros(1)

    def work(self, x: Any = 0) -> dict[str, Any]:
        import os
        import signal

        self.calls += 1
        if self.calls == self.at and self.pidfile and Path(self.pidfile).is_file():
            os.kill(int(Path(self.pidfile).read_text()), signal.SIGINT)
        self.total = self.total + torch.as_tensor(x, dtype=torch.float32)
        return {"y": self.total.clone()}
