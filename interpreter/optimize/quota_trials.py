"""Stage 2's mechanics on the machine (the optimizer's decisions are in its `stage2` module, which this
one never imports): `QuotaTrials` implements the optimizer's `QuotaMeasurer` protocol structurally --
moving a GPU component to a new process under other MPS settings with its state (`replace_quota`, to a
parked process where there is one), timing iterations, and the GEMM self-check of a quota level
(`quota_safety.check_quotas`, cached per machine: a level whose products are wrong is never used);
`CheckPrefetch` runs the first self-checks beside the processes' start-up; `settle` moves every process to
the plan's settings before training goes on (`rose optimize --train`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from rose_dsl.ir import Workflow
from rose_dsl.measurement import Books

from ..mps import quota_levels
from ..quota_safety import QuotaVerdict, check_quotas, machine_fingerprint
from .trials import FEED_IMPL, PROBE_IMPL

__all__ = ["QuotaTrials", "CheckPrefetch", "settle", "quota_sms", "MpsClients"]

Mps = tuple[int, int]  # one process's MPS settings: (quota percent, client priority: 0 normal, 1 below normal)


class MpsClients(Protocol):
    """What stage 2 needs of the GPU set-up (the command's MPS daemon): the environment of an MPS client
    process under `quota` percent of the SMs, at MPS client `priority` (1: below normal)."""

    def client_env(self, quota: int | None, priority: int | None = None) -> dict[str, str]: ...


def _total_sms() -> int:
    import torch

    return int(torch.cuda.get_device_properties(0).multi_processor_count)


def quota_sms(total_sms: int | None = None) -> dict[int, int]:
    """For each quota percent 1..100, the SMs a process under it sees on this GPU (`mps.quota_levels`)."""
    return quota_levels(total_sms or _total_sms())


class QuotaTrials:
    """The runtime's side of stage 2 on a measuring session (`trials.TrialSession`) and the GPU set-up's
    MPS clients (`MpsClients`). `check(percents)` replaces the self-check (tests); `stop` ends a
    self-check batch early; `parallel` checks run side by side (fresh MPS clients)."""

    def __init__(self, session: Any, gpu: MpsClients, *, check: Callable[[list[int]], Mapping[int, QuotaVerdict]] | None = None,
                 stop: Callable[[], str | None] | None = None, total_sms: int | None = None, parallel: int = 6) -> None:
        self.session, self.gpu = session, gpu
        self._check, self._stop, self._total, self.parallel = check, stop, total_sms, parallel
        self._fingerprint: str | None = None
        self.feed_impl = getattr(session, "feed_impl", FEED_IMPL)
        self.probe_impl = getattr(session, "probe_impl", PROBE_IMPL)

    @property
    def books(self) -> Books:
        return self.session.books

    @property
    def prepare_s(self) -> float:
        return float(getattr(getattr(self.session, "executor", None), "prepare_s", 0.0) or 0.0)

    def iterations_left(self) -> int | None:
        limit, k = getattr(self.session, "limit", None), getattr(self.session, "k", None)
        return None if limit is None or k is None else limit - k

    def quota_sms(self) -> dict[int, int]:
        return quota_sms(self._total)

    def move(self, name: str, quota: int | None, env_priority: int | None, set_priority: int | None) -> None:
        env = self.gpu.client_env(quota, env_priority)
        if set_priority is None:
            self.session.replace_quota(name, quota, env)
        else:
            self.session.replace_quota(name, quota, env, priority=set_priority)

    def complete(self, plans: Sequence[Workflow], rounds: int, warmup: int = 0, labels: Sequence[str] = ()) -> Any:
        return self.session.complete(plans, rounds, warmup, labels)

    def capture(self, probe_wf: Workflow) -> Any:
        return self.session.capture(probe_wf)

    def local(self, graphs: Sequence[Any], repeats: int, captured: Any, probe_id: int) -> Any:
        return self.session.local(graphs, repeats, captured, probe_id)

    def check_levels(self, percents: list[int]) -> Mapping[int, QuotaVerdict]:
        if self._check is not None:
            return self._check(percents)
        if self._fingerprint is None:
            self._fingerprint = machine_fingerprint()
        return check_quotas(percents, self.gpu.client_env, fingerprint=self._fingerprint, parallel=self.parallel,
                            stop=self._stop)


class CheckPrefetch:
    """The self-check of the screening's first levels (`levels()`: the optimizer says which, the command
    wires it), started beside the component processes' start-up instead of after stage 1: a check is a
    fresh MPS client's CUDA start plus CPU references, about as long as the processes' start-up
    (docs/optimizer.md), and neither needs the other. `wait` joins it right before stage 1's first timed iteration
    (`TrialSession.pending`): the untimed warm-up iteration runs beside it, no measurement does. The
    verdicts land in the per-machine cache, where stage 2's own checks find them. A prefetch that fails
    leaves stage 2 to check as before. The thread is a daemon: an interrupted run does not wait
    for it (its check process, a few seconds of GEMMs, ends by itself)."""

    def __init__(self, gpu: MpsClients, levels: Callable[[], list[int]], check: Callable[[list[int]], Any] | None = None,
                 parallel: int = 6) -> None:
        import threading

        self.levels: list[int] = []
        self.error: str | None = None
        self.started = time.perf_counter()
        self.ended: float | None = None

        def run() -> None:
            try:
                self.levels = levels()
                if self.levels:
                    (check or (lambda percents: check_quotas(percents, gpu.client_env, parallel=parallel)))(
                        self.levels)
            except Exception as exc:  # noqa: BLE001 - stage 2 checks again; the report says why this did not
                self.error = f"{type(exc).__name__}: {exc}"
            finally:
                self.ended = time.perf_counter()

        self._thread = threading.Thread(target=run, name="rose-quota-check-prefetch", daemon=True)
        self._thread.start()

    def wait(self, books: Books, log: Callable[[str], None], training_since: float | None = None) -> None:
        """Join it. The seconds waited are the self-check's cost beyond the start-up, booked with the checks
        (`quota_check_s`); `quota_check_prefetch_s` is its whole wall time, beside the start-up;
        `quota_check_beside_training_s` the part of it after `training_since` (a `time.perf_counter()`
        value: when the first, untimed iteration began), beside training -- said in the report, since any
        slowdown it caused that iteration is counted as training."""
        t = time.perf_counter()
        if self._thread.is_alive():
            log("waiting for the quota self-check started with the processes (stage 2 needs it; it is cached per machine)")
        self._thread.join()
        waited = time.perf_counter() - t
        books.quota_check_s = books.quota_check_s + waited
        books.quota_check_prefetch_s = (self.ended or t) - self.started
        books.quota_check_prefetch_levels = len(self.levels)
        if training_since is not None:
            books.quota_check_beside_training_s = max(0.0, (self.ended or t) - training_since)
        if self.error:
            log(f"the quota self-check started with the processes failed ({self.error}); stage 2 checks again")


def settle(plan: Workflow, running: dict[str, Mps], session: Any, gpu: MpsClients) -> list[str]:
    """Move each process that runs under other MPS settings than `plan` declares (`running`, as stage 2 left
    them: a validation ends with its target at the reference) to a process under the plan's, its state
    moved with it -- to the parked process of those settings where there is one (`replace_actor`) -- so
    that training goes on in the processes as the plan runs them (`rose optimize --train`). The names moved."""
    moved = []
    for name, comp in plan.components.items():
        if name in running and running[name] != comp.mps_settings:
            session.replace_quota(name, comp.mps_quota, gpu.client_env(comp.mps_quota, comp.mps_priority),
                                  priority=comp.mps_priority)
            running[name] = comp.mps_settings
            moved.append(name)
    return moved
