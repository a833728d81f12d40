"""What an asynchronous plan has in flight when a stop ends it between checkpoint iterations, kept in the
stop's checkpoint so that `--resume` continues as the uninterrupted run would have (issue 58).

Why: under `defer learn 1` learn(k) runs in iteration k+1's place, so after any iteration's place the
deferred calls of the last `defer` iterations are still to come, and under `ahead act` the next iteration's
act has already run. A stop used to drain those calls before its checkpoint (and to run the iteration whose
calls ran ahead): a synchronisation point the uninterrupted run does not have, after which every read saw
values newer than it would have, and the resumed run ended elsewhere. Now a stop takes the checkpoint where
the pipeline is: each component's state after the last iteration's place (what the uninterrupted run's
components hold at that point) and, in `inflight.pt` (`checkpoint.IN_FLIGHT`), what the calls still to come
need:

* the schedule's position (`schedule.Pending`): the first RL iteration since the last drain, the iteration
  whose calls ran ahead, the trips loops that end on a condition ran in the iterations still read;
* the value behind every output of the last `depth` iterations' calls (what the deferred calls read, and the
  outputs of the calls run ahead), one per data-parallel replica where there are replicas;
* the metrics lines not yet written, whose iterations' deferred calls are still to come (`pipeline._Lines`):
  each process's metrics so far, the iteration's seconds and trips.

`restore` gives these values back to the backend as handles (`Backend.put`) and the schedule its position,
so the resumed run submits the same calls in the same order on the same state with the same inputs.

What cannot be kept this way -- a value that `torch.load(weights_only=True)` would not load, an RL iteration
that carries values (recipes over handles) -- leaves the stop as it was: it drains, and the checkpoint says
so (`drained_at_stop` in its meta), as `--resume` from it then does (`rose_cli/report.py`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from rose_dsl.ir import ExecutionNode
from rose_dsl.semantics import Invocation

from .backend_base import Backend
from .checkpoint import CheckpointError, check_loadable
from .schedule import Pending, ReplicaSet, Schedule

__all__ = ["FORMAT", "capture", "restore", "pending_calls"]

FORMAT = 1

Got = dict[int, dict[str, dict[str, Any]]]  # iteration -> process -> its metrics so far
Place = dict[int, tuple[int, int, dict[tuple[str, ...], int]]]  # iteration -> (t0, t1 in ns, trips)


def capture(schedule: Schedule, backend: Backend, got: Got, place: Place, timeout: float) -> dict[str, Any] | str:
    """What is in flight after the last iteration scheduled (every call submitted so far has ended), as
    `inflight.pt` holds it; or why it cannot be kept (a sentence)."""
    pending = schedule.pending()
    if pending is None:
        return "the RL iteration carries values from one iteration to the next"
    kept = []
    for inv, handles in sorted(pending.kept.items()):
        node = schedule.program.items[inv.path]
        ports: list[dict[str, Any]] = []
        if isinstance(node, ExecutionNode) and node.outputs:
            for port, h in zip(node.outputs, handles, strict=False):
                values = [backend.result(x, timeout) for x in (h.handles if isinstance(h, ReplicaSet) else (h,))]
                try:
                    for r, value in enumerate(values):
                        check_loadable(value, f"output '{port}' of {inv}" + (f" (replica {r})" if r else ""))
                except CheckpointError as exc:
                    return str(exc)
                ports.append({"component": h.component, "replicas": values} if isinstance(h, ReplicaSet)
                             else {"value": values[0]})
        kept.append({"path": list(inv.path), "indices": list(inv.indices), "ports": ports})
    lines = []
    for j in sorted(set(got) | set(place)):
        try:
            metrics = {proc: {name: v if type(v) in (int, float, bool) else float(v) for name, v in values.items()}
                       for proc, values in got.get(j, {}).items()}
        except (TypeError, ValueError) as exc:
            return f"a metric of iteration {j} is not a number ({exc})"
        t0, t1, trips = place.get(j, (0, 0, {}))
        lines.append({"iteration": j, "metrics": metrics, "placed": j in place, "ns": t1 - t0,
                      "trips": [[list(loop), n] for loop, n in trips.items()]})
    return {"format": FORMAT, "since": pending.since, "ran_ahead": -1 if pending.ran_ahead is None else pending.ran_ahead,
            "kept": kept, "ran": [[list(path), list(ix), list(r)] for (path, ix), r in pending.ran.items()],
            "lines": lines}


def restore(payload: Mapping[str, Any], schedule: Schedule, backend: Backend, k: int) -> tuple[Got, Place]:
    """Put what was in flight back: the schedule continues at RL iteration k with the kept values (as the
    backend's handles) and its position; returns the metrics lines still to be completed (their places'
    times end now, so no record of the resumed run is counted in them)."""
    if payload.get("format") != FORMAT:
        raise CheckpointError(f"inflight.pt: format {payload.get('format')!r}, this rose reads {FORMAT}")
    kept: dict[Invocation, tuple[Any, ...]] = {}
    for entry in payload["kept"]:
        handles = tuple(ReplicaSet(tuple(backend.put(v) for v in p["replicas"]), p["component"]) if "replicas" in p
                        else backend.put(p["value"]) for p in entry["ports"])
        kept[Invocation(tuple(entry["path"]), tuple(entry["indices"]))] = handles or (backend.put(None),)
    ran = {(tuple(path), tuple(ix)): list(r) for path, ix, r in payload["ran"]}
    ahead = payload["ran_ahead"]
    schedule.resume(k, Pending(payload["since"], None if ahead < 0 else ahead, kept, ran))
    now = time.perf_counter_ns()
    got: Got = {}
    place: Place = {}
    for line in payload["lines"]:
        got[line["iteration"]] = {proc: dict(m) for proc, m in line["metrics"].items()}
        if line["placed"]:
            place[line["iteration"]] = (now - line["ns"], now, {tuple(loop): n for loop, n in line["trips"]})
    return got, place


def pending_calls(payload: Mapping[str, Any], schedule: Schedule, k: int) -> list[str]:
    """The deferred calls still to come after RL iteration k (`node[i]`), for messages."""
    return [str(site.inv) for site in schedule.program.drain(k, payload["since"])]
