"""Test-wide settings.

hypothesis profiles: the default runs hundreds of examples per property (CI); `pytest
--hypothesis-profile=long` runs thousands (local soak).

Parallel runs: the README's test command runs the suite on two pytest-xdist workers (most tests wait on
process start-up -- Ray, torch imports -- more than they compute). A test marked `exclusive` runs with the
machine to itself: one that reads the machine's whole process table (no Ray process left behind). No test
asserts on wall time (issue 42: a loaded CI machine measures other times): budgets and deadlines are tested
on a fake clock (DEVELOPERS.md, Tests), and the optimizer's speed claims are `benchmarks/optimize_cpu.py
--check`'s, on a machine to itself. The
workers share a readers-writer lock in pytest's base temporary directory: every other test holds it
shared, an exclusive test holds it alone, and a turnstile in front of it lets a waiting exclusive test in
before the other worker's next test (without it, the other worker could take the shared lock back between
each of its tests for as long as it has tests). Without xdist the lock is not taken.

Balance: a test marked `e2e` is an end-to-end run of tens of seconds (a runtime started, `rose` in a
subprocess, an optimizer search). Their modules run first, half of them at the start of each worker's share
(`--dist worksteal` gives the first worker the first half of the collection and the second the rest), so
that the suite ends on short tests on both workers: a long test started last kept one worker busy for up to
two minutes after the other had finished. The `exclusive` tests come last.
"""

from __future__ import annotations

import fcntl
import os
import sys
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

from tests.shared_ray import RAY_ARGS

# One intra-op thread per process: the suite runs on two workers on two cores, and every process it starts
# (a benchmark's smoke run, `rose` in a subprocess) would otherwise take a torch thread per core for models
# of a few thousand parameters -- the workload_shapes smoke took 70 s instead of 27 s on the loaded machine.
# (LocalBackend already sets one thread in its process; Ray's workers get one.) A value set outside wins.
os.environ.setdefault("OMP_NUM_THREADS", "1")

_COMMON = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("default", max_examples=200, **_COMMON)
settings.register_profile("long", max_examples=3000, **_COMMON)
settings.load_profile("default")


def _e2e_first(items: list[pytest.Item]) -> list[pytest.Item]:
    """The collection with the modules holding `e2e` tests at the start of each half (modules whole: a
    module-scoped fixture is set up once), those with a Ray cluster of their own first, then the heaviest,
    the other modules in their order between, and the `exclusive` tests last (waiting for the machine, a
    test waits for the other worker's test in progress: at the end, a short one)."""
    modules: dict[str, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::")[0], []).append(item)
    weight = {m: sum(i.get_closest_marker("e2e") is not None for i in its) for m, its in modules.items()}
    # a module with a Ray cluster of its own (`own_ray`: a `ray_*` fixture other than `ray_session`) stops the
    # worker's shared one, and the next module that asks for it starts it again: those go first in their half
    own = {m for m, its in modules.items()
           if any(f.startswith("ray_") and f != "ray_session" for i in its for f in getattr(i, "fixturenames", ()))}
    halves: tuple[list[pytest.Item], list[pytest.Item]] = ([], [])
    loads = [0, 0]
    for m in sorted((m for m in modules if weight[m]), key=lambda m: (m not in own, -weight[m])):
        side = loads.index(min(loads))
        loads[side] += weight[m]
        halves[side].extend(modules[m])
    rest = [i for m, its in modules.items() if not weight[m] for i in its if i.get_closest_marker("exclusive") is None]
    last = [i for i in items if i.get_closest_marker("exclusive") is not None and not weight[i.nodeid.split("::")[0]]]
    cut = max(0, len(items) // 2 - len(halves[0]))
    return halves[0] + rest[:cut] + halves[1] + rest[cut:] + last


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items[:] = _e2e_first(items)


@pytest.fixture(autouse=True)
def _machine_share(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    if "PYTEST_XDIST_WORKER" not in os.environ:
        yield
        return
    root = tmp_path_factory.getbasetemp().parent  # one directory for all the workers of this run
    exclusive = request.node.get_closest_marker("exclusive") is not None
    with open(root / "machine.turnstile", "a") as turnstile, open(root / "machine.lock", "a") as lock:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        finally:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.fixture(scope="session")
def _ray_worker_teardown() -> Iterator[None]:
    """Stops the worker's shared Ray cluster when the worker's tests are done."""
    yield
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()


@pytest.fixture(scope="module")
def ray_session(_ray_worker_teardown: None) -> Iterator[object]:
    """The Ray cluster of this pytest worker, for in-process Ray runs: started by the first module that asks
    and kept for the next ones (a `ray.init` costs 5-18 s on the 2-core machine, and ~16 modules and tests
    started their own), stopped when the worker ends. The backends' actors take no CPU resource, so the
    count only has to be positive. A module that needs other resources (logical GPUs) runs its own cluster
    with `own_ray`, after which the next module here starts the shared one again. Skips where Ray is not
    installed."""
    ray = pytest.importorskip("ray")
    if not ray.is_initialized():
        ray.init(**RAY_ARGS)
    yield ray
