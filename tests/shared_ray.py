"""The worker's shared Ray cluster (`ray_session` in conftest.py) and a cluster of a test's own.

`ray.init` costs 5-18 s on the 2-core CI machine; the Ray tests share one cluster per pytest worker, and
only a test that needs other resources (logical GPUs) starts its own with `own_ray`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

RAY_ARGS: dict[str, object] = dict(num_cpus=4, include_dashboard=False, logging_level="ERROR")


@contextlib.contextmanager
def own_ray(**args: object) -> Iterator[object]:
    """A Ray cluster of this test's or module's own (e.g. `num_gpus=4` logical GPUs): the worker's shared
    cluster, if running, is stopped first, and this one is stopped after (`ray_session` starts the shared
    one again when next asked)."""
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        ray.shutdown()
    ray.init(**{**RAY_ARGS, **args})
    try:
        yield ray
    finally:
        ray.shutdown()
