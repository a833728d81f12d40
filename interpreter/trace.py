"""The ExecutionTrace data plane: one record per invocation of an ExecutionNode.

Why a trace of its own (and not only a profiler's): the optimizer needs durations and SM activity per
*structural* node (``iteration.epoch.step.act``), per loop iteration and per split group, and the
runtime has exactly that information at dispatch time.  Profilers see kernels and Python frames.

Timing rule (paper, App. A): the data plane records the host call for every invocation and the device
span when it is known; an invocation with device activity lasts from its host start to the *later* of
host return and device completion (host return is not GPU readiness).  Parent and child records are
alternative observation scopes of the same work; nothing here adds them up.

All timestamps are integers in nanoseconds on one clock shared with the GPU activity sampler
(default :func:`time.perf_counter_ns`, i.e. ``CLOCK_MONOTONIC`` on Linux, which every process of one
host shares; records from another host need an offset applied before they are appended).
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "TRACE_FORMAT_VERSION",
    "ExecutionTrace",
    "InvocationRecord",
    "TraceFormatError",
]

TRACE_FORMAT_VERSION = 1

_STATUSES = ("running", "ok", "error")
_MODES = ("read", "update", "refresh")


class TraceFormatError(ValueError):
    """A trace file that is not a rose ExecutionTrace (names the file and line)."""


@dataclass(frozen=True)
class InvocationRecord:
    """One invocation of one node (a loop iteration x split group instance of it).

    ``loop_indices`` lists the enclosing loops outermost first, e.g.
    ``(("iteration", 3), ("epoch", 0), ("step", 17))``.  ``group`` is the split-group index when the
    node runs split (the node path stays the unsplit path, so per-node queries aggregate the groups).
    ``state`` holds ``(state object, mode)`` pairs with mode ``read``/``update``/``refresh``.
    """

    call_id: int
    node: str
    component: str
    host_start_ns: int
    parent: int | None = None
    loop_indices: tuple[tuple[str, int], ...] = ()
    group: int | None = None
    inputs: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    state: tuple[tuple[str, str], ...] = ()
    pid: int | None = None
    gpu: int | None = None
    host_end_ns: int | None = None
    device_start_ns: int | None = None
    device_end_ns: int | None = None
    status: str = "running"
    error: str | None = None
    rows: int | None = None  # the rows the call computed when fewer than its node's (a loop that ends per row)

    def __post_init__(self) -> None:
        if self.status not in _STATUSES:
            raise ValueError(f"status must be one of {_STATUSES}, got {self.status!r}")
        for obj, mode in self.state:
            if mode not in _MODES:
                raise ValueError(f"state access {obj!r}: mode must be one of {_MODES}, got {mode!r}")
        if self.host_end_ns is not None and self.host_end_ns < self.host_start_ns:
            raise ValueError(f"call {self.call_id}: host end before host start")
        if (self.device_start_ns is None) != (self.device_end_ns is None):
            raise ValueError(f"call {self.call_id}: device start and end must be given together")
        if self.device_end_ns is not None and self.device_end_ns < self.device_start_ns:  # type: ignore[operator]
            raise ValueError(f"call {self.call_id}: device end before device start")

    @property
    def done(self) -> bool:
        return self.status != "running" and self.host_end_ns is not None

    @property
    def end_ns(self) -> int | None:
        """Completion: the later of host return and device completion (None while running)."""
        if self.host_end_ns is None:
            return None
        if self.device_end_ns is None:
            return self.host_end_ns
        return max(self.host_end_ns, self.device_end_ns)

    @property
    def duration_ns(self) -> int | None:
        end = self.end_ns
        return None if end is None else end - self.host_start_ns

    @property
    def interval(self) -> tuple[int, int] | None:
        """``[host start, completion)`` for activity queries, or None while running."""
        end = self.end_ns
        return None if end is None else (self.host_start_ns, end)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> InvocationRecord:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(obj) - known
        if unknown:
            raise ValueError(f"unknown fields {sorted(unknown)}")
        data = dict(obj)
        data["loop_indices"] = tuple((str(n), int(i)) for n, i in data.get("loop_indices", ()))
        data["inputs"] = tuple(data.get("inputs", ()))
        data["outputs"] = tuple(data.get("outputs", ()))
        data["state"] = tuple((str(s), str(m)) for s, m in data.get("state", ()))
        return cls(**data)


@dataclass
class ExecutionTrace:
    """Thread-safe, append-only collection of :class:`InvocationRecord` (ids unique per trace).

    Driver-side dispatch uses :meth:`begin`/:meth:`end`; records produced inside workers are added
    whole with :meth:`add` (which numbers them) or :meth:`append` (ids from :meth:`new_call_id`).
    """

    clock: Callable[[], int] = time.perf_counter_ns
    meta: dict[str, Any] = field(default_factory=dict)
    _records: dict[int, InvocationRecord] = field(default_factory=dict, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _next_id: int = field(default=1, init=False, repr=False)

    # --- writing ---------------------------------------------------------------------------------
    def new_call_id(self) -> int:
        with self._lock:
            cid = self._next_id
            self._next_id += 1
            return cid

    def append(self, record: InvocationRecord) -> None:
        with self._lock:
            if record.call_id in self._records:
                raise ValueError(f"duplicate call id {record.call_id} ({record.node})")
            self._records[record.call_id] = record
            self._next_id = max(self._next_id, record.call_id + 1)

    def add(self, record: InvocationRecord) -> InvocationRecord:
        """Append a record made elsewhere (a worker's), numbered with a fresh call id of this trace."""
        with self._lock:
            numbered = dataclasses.replace(record, call_id=self._next_id)
            self._next_id += 1
            self._records[numbered.call_id] = numbered
        return numbered

    def begin(
        self,
        node: str,
        *,
        component: str,
        parent: int | None = None,
        loop_indices: Iterable[tuple[str, int]] = (),
        group: int | None = None,
        inputs: Iterable[str] = (),
        outputs: Iterable[str] = (),
        state: Iterable[tuple[str, str]] = (),
        pid: int | None = None,
        gpu: int | None = None,
        host_start_ns: int | None = None,
    ) -> int:
        """Open a record (status ``running``) and return its call id."""
        start = self.clock() if host_start_ns is None else host_start_ns
        with self._lock:
            cid = self._next_id
            self._next_id += 1
            self._records[cid] = InvocationRecord(
                call_id=cid, node=node, component=component, host_start_ns=start, parent=parent,
                loop_indices=tuple((str(n), int(i)) for n, i in loop_indices), group=group,
                inputs=tuple(inputs), outputs=tuple(outputs), state=tuple((s, m) for s, m in state),
                pid=os.getpid() if pid is None else pid, gpu=gpu,
            )
        return cid

    def end(
        self,
        call_id: int,
        *,
        host_end_ns: int | None = None,
        status: str = "ok",
        error: str | None = None,
        outputs: Iterable[str] | None = None,
        device_start_ns: int | None = None,
        device_end_ns: int | None = None,
    ) -> InvocationRecord:
        """Close a record at host return; device times may come now or later via :meth:`set_device`."""
        end = self.clock() if host_end_ns is None else host_end_ns
        changes: dict[str, Any] = {"host_end_ns": end, "status": status, "error": error}
        if outputs is not None:
            changes["outputs"] = tuple(outputs)
        if device_start_ns is not None or device_end_ns is not None:
            changes["device_start_ns"] = device_start_ns
            changes["device_end_ns"] = device_end_ns
        return self._update(call_id, changes)

    def set_device(self, call_id: int, device_start_ns: int, device_end_ns: int) -> InvocationRecord:
        """Record the device span when the completion event fires (possibly after host return)."""
        return self._update(call_id, {"device_start_ns": device_start_ns, "device_end_ns": device_end_ns})

    def _update(self, call_id: int, changes: dict[str, Any]) -> InvocationRecord:
        with self._lock:
            try:
                old = self._records[call_id]
            except KeyError:
                raise KeyError(f"unknown call id {call_id}") from None
            new = dataclasses.replace(old, **changes)
            self._records[call_id] = new
            return new

    # --- reading ---------------------------------------------------------------------------------
    def __len__(self) -> int:
        with self._lock:
            return len(self._records)

    def __iter__(self) -> Iterator[InvocationRecord]:
        return iter(self.records())

    def get(self, call_id: int) -> InvocationRecord:
        with self._lock:
            return self._records[call_id]

    def records(self) -> list[InvocationRecord]:
        """A snapshot, in call-id order."""
        with self._lock:
            return sorted(self._records.values(), key=lambda r: r.call_id)

    def by_node(self, node: str) -> list[InvocationRecord]:
        """Records of exactly this node path (all loop iterations and split groups)."""
        return [r for r in self.records() if r.node == node]

    def children(self, call_id: int) -> list[InvocationRecord]:
        return [r for r in self.records() if r.parent == call_id]

    def node_paths(self) -> list[str]:
        """Node paths in first-seen order."""
        return list(dict.fromkeys(r.node for r in self.records()))

    def intervals(self, node: str) -> list[tuple[int, int]]:
        """``[start, completion)`` of every finished invocation of ``node`` (for activity means)."""
        return [r.interval for r in self.by_node(node) if r.done and r.interval is not None]

    def node_durations(self) -> dict[str, list[int]]:
        """Durations (ns, paper rule) of the finished ``ok`` invocations, per node path."""
        out: dict[str, list[int]] = {}
        for r in self.records():
            if r.done and r.status == "ok":
                out.setdefault(r.node, []).append(r.duration_ns)  # type: ignore[arg-type]
        return out

    # --- files -----------------------------------------------------------------------------------
    def dump_jsonl(self, path: str | os.PathLike[str]) -> Path:
        """Write a header line then one record per line; written to a temp file and renamed (`safe_io`)."""
        from .safe_io import atomic_writer

        path = Path(path)
        header = {"rose_trace": TRACE_FORMAT_VERSION, "clock": getattr(self.clock, "__name__", "?"),
                  "meta": self.meta}
        with atomic_writer(path) as f:  # (never through a link; no temporary left on an error)
            f.write(json.dumps(header) + "\n")
            for r in self.records():
                f.write(json.dumps(r.to_json(), separators=(",", ":")) + "\n")
        return path

    @classmethod
    def load_jsonl(cls, path: str | os.PathLike[str]) -> ExecutionTrace:
        path = Path(path)
        trace = cls()
        seen_header = False
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as e:
                    raise TraceFormatError(f"{path}:{lineno}: not JSON ({e.msg})") from None
                if not seen_header:
                    seen_header = True
                    if not isinstance(obj, dict) or obj.get("rose_trace") != TRACE_FORMAT_VERSION:
                        raise TraceFormatError(
                            f"{path}:{lineno}: not a rose trace (expected a header with rose_trace="
                            f"{TRACE_FORMAT_VERSION})")
                    trace.meta = dict(obj.get("meta") or {})
                    continue
                try:
                    trace.append(InvocationRecord.from_json(obj))
                except (TypeError, ValueError) as e:
                    raise TraceFormatError(f"{path}:{lineno}: bad record: {e}") from None
        if not seen_header:
            raise TraceFormatError(f"{path}: empty file, not a rose trace")
        return trace
