"""The component contract as types (docs/components.md): what rose calls on a component, named.

Why: rose finds a component's optional abilities by name (`get_state`, `pop_metrics`, `close`, the
constructor parameters `device`/`seed`/`replica`/`replicas`). Writing them down as Protocols lets a type
checker hold a component to the contract (`tests/examples/test_contract.py` runs mypy on the example
components against these) and gives the runtime one place that says what each name means.

Components still import nothing from rose: the Protocols are structural (typing.Protocol), so a class
satisfies one by having the methods with these signatures -- no base class, no registration.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

__all__ = ["Closable", "ConstructionContext", "ReportsMetrics", "Stateful", "wants_process_group"]


@runtime_checkable
class Stateful(Protocol):
    """Owns state objects that rose snapshots and restores (checkpoints, restarts, optimizer trials).

    `get_state(name)` returns a value `torch.load(..., weights_only=True)` can load back (tensors,
    containers of them, plain scalars and strings); `set_state(name, value)` makes the component continue
    exactly as the one the value was taken from. Without these methods rose deep-copies the attribute."""

    def get_state(self, name: str) -> Any: ...

    def set_state(self, name: str, value: Any) -> None: ...


@runtime_checkable
class ReportsMetrics(Protocol):
    """Reports what accumulated since the last call; rose calls it once per RL iteration and logs each
    value as `component/name`. Counts named `env_steps` or `tokens` feed the throughput figures. A class
    attribute `metric_merge` (metric -> sum | mean | last | max | min | copies) says how each merges over
    a component's processes (`interpreter/metric_merge.py`); a snapshot is `copies`."""

    def pop_metrics(self) -> Mapping[str, float]: ...


@runtime_checkable
class Closable(Protocol):
    """Holds resources to release when the run ends (GL contexts, worker pools, files)."""

    def close(self) -> None: ...


@dataclass(frozen=True)
class ConstructionContext:
    """What rose passes a component's constructor besides the workflow's `args`, each only to a class whose
    `__init__` has a parameter of that name: the torch device it placed the component on, the workflow
    seed (both unless `args` sets them), and its data-parallel replica index and count."""

    device: str = "cpu"
    seed: int = 0
    replica: int = 0
    replicas: int = 1

    def kwargs(self, cls: type, args: Mapping[str, Any]) -> dict[str, Any]:
        """The constructor's keyword arguments: `args`, plus the context values `cls` asks for."""
        params = inspect.signature(cls).parameters
        out = dict(args)
        for name in ("device", "seed"):
            if name in params and name not in out:
                out[name] = getattr(self, name)
        for name in ("replica", "replicas"):
            if name in params:
                out[name] = getattr(self, name)
        return out


def wants_process_group(cls: type) -> bool:
    """Does the class ask for a torch.distributed group over its replicas (`data_parallel_group = True`,
    e.g. a trainer that all-reduces gradients)?"""
    return bool(getattr(cls, "data_parallel_group", False))
