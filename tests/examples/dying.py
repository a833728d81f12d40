"""The shipped LLM and embodied components, each killing its own process (SIGKILL) at one call, once per
`marker` file: a component process that dies in the middle of a run, for the recovery tests."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

from examples.embodied.policy import FlowPolicy
from examples.embodied.ppo import PPOTrainer
from examples.llm.generator import Generator
from examples.llm.learner import GRPOLearner


class _DiesOnce:
    marker: str
    at_call: int
    calls: int

    def _count(self) -> None:
        self.calls += 1
        if self.calls == self.at_call and not Path(self.marker).exists():
            Path(self.marker).write_text("died")
            os.kill(os.getpid(), signal.SIGKILL)


def _arm(obj: _DiesOnce, marker: str, at_call: int) -> None:
    obj.marker, obj.at_call, obj.calls = marker, int(at_call), 0


class GeneratorDiesOnce(Generator, _DiesOnce):
    """Dies at its `at_call`-th `collect`."""

    def __init__(self, marker: str, at_call: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        _arm(self, marker, at_call)

    def collect(self, *args: Any, **kwargs: Any) -> Any:
        self._count()
        return super().collect(*args, **kwargs)


class LearnerDiesOnce(GRPOLearner, _DiesOnce):
    """Dies at its `at_call`-th `update`."""

    def __init__(self, marker: str, at_call: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        _arm(self, marker, at_call)

    def update(self, *args: Any, **kwargs: Any) -> Any:
        self._count()
        return super().update(*args, **kwargs)


class PolicyDiesOnce(FlowPolicy, _DiesOnce):
    """Dies at its `at_call`-th `act`."""

    def __init__(self, marker: str, at_call: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        _arm(self, marker, at_call)

    def act(self, *args: Any, **kwargs: Any) -> Any:
        self._count()
        return super().act(*args, **kwargs)


class TrainerDiesOnce(PPOTrainer, _DiesOnce):
    """Dies at its `at_call`-th `update`."""

    def __init__(self, marker: str, at_call: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        _arm(self, marker, at_call)

    def update(self, *args: Any, **kwargs: Any) -> Any:
        self._count()
        return super().update(*args, **kwargs)
