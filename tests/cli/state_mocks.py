"""Components whose state a checkpoint cannot hold, or whose default snapshot would break training: for
`rose validate --import`'s state probe (tests/cli/test_import_check.py)."""

from __future__ import annotations

from typing import Any

import torch


class AdamAsState:
    """Declares its optimizer object as state (the default snapshot: the attribute itself)."""

    def __init__(self) -> None:
        self.weights = {"w": torch.zeros(2)}
        self.optimizer = torch.optim.Adam([torch.zeros(2, requires_grad=True)])

    def update(self, x: Any = 0) -> dict[str, Any]:
        return {"y": x}


class ParametersAsState:
    """Declares a dict of leaf tensors that require grad, without get_state/set_state."""

    def __init__(self, seed: int = 0) -> None:
        self.weights = {"w": torch.zeros(2, requires_grad=True)}

    def update(self, x: Any = 0) -> dict[str, Any]:
        return {"y": x}


class WithGetSet(ParametersAsState):
    """The same state behind get_state/set_state: accepted."""

    def get_state(self, name: str) -> Any:
        return {k: v.detach().clone() for k, v in self.weights.items()}

    def set_state(self, name: str, value: Any) -> None:
        with torch.no_grad():
            for k, v in value.items():
                self.weights[k].copy_(v)


class TakesAnything:
    def update(self, **inputs: Any) -> dict[str, Any]:
        return {"y": 0}
