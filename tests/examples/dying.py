"""The shipped LLM and embodied components, each killing its own process (SIGKILL) at one call, once per
`marker` file: a component process that dies in the middle of a run, for the recovery tests."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

from examples.embodied.policy import FlowPolicy
from examples.llm.generator import Generator
from examples.llm.learner import GRPOLearner


def dies_once(name: str, base: type, method: str) -> type:
    """`base` with two more constructor arguments, `marker` and `at_call`: its `at_call`-th call of `method`
    kills the process, unless `marker` exists (it is written first, so the restarted process lives)."""

    def __init__(self: Any, marker: str, at_call: int, **kwargs: Any) -> None:
        base.__init__(self, **kwargs)
        self.marker, self.at_call, self.calls = marker, int(at_call), 0

    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        if self.calls == self.at_call and not Path(self.marker).exists():
            Path(self.marker).write_text("died")
            os.kill(os.getpid(), signal.SIGKILL)
        return getattr(base, method)(self, *args, **kwargs)

    # (named as the module attribute it is bound to: imported and pickled by that name)
    return type(name, (base,), {"__init__": __init__, method: call, "__module__": __name__, "__qualname__": name})


GeneratorDiesOnce = dies_once("GeneratorDiesOnce", Generator, "collect")
LearnerDiesOnce = dies_once("LearnerDiesOnce", GRPOLearner, "update")
PolicyDiesOnce = dies_once("PolicyDiesOnce", FlowPolicy, "act")

