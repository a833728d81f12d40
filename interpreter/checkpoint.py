"""Crash-safe checkpoints of component state, for ``rose execute --resume``.

Layout of one checkpoint, ``<run_dir>/ckpt-<iteration:06d>/``::

    meta.json             {"iteration": n, "meta": {...}, "components": [...]}
    state/<component>.pt  torch.save({state name: value}) per component
    inflight.pt           (an asynchronous plan stopped between checkpoint iterations) what was in flight:
                          the values the deferred calls still to come read, the pipeline's position
    COMPLETE              {"format": 1, "iteration": n, "files": {path: {sha256, size}}, "digest": ...}

Why this shape: a run may be killed at any instant (SIGKILL, OOM, node loss).  Everything is written
into ``.tmp-ckpt-...`` first, each file fsynced, the ``COMPLETE`` marker (holding every file's hash)
last, and only then is the directory renamed into place; so a ``ckpt-*`` directory is either whole or
absent, and a partial one can never be mistaken for the latest.  Loading verifies the hashes and uses
``torch.load(weights_only=True)`` only: a checkpoint is data, never code (no pickle of arbitrary
objects).  State that would not load that way is refused when saving, naming where it is.

Reading trusts nothing in the directory (it may have been copied, edited or planted): only regular files
inside it are opened, relative to it and without following links (a FIFO would block the read, a link to
/dev/zero never end it), each file's size is checked against the marker before it is read, the marker
may list nothing but ``meta.json``, ``state/<component>.pt`` and ``inflight.pt``, and the directory's name, the marker's
iteration and ``meta.json``'s must agree.  The marker's digest is a checksum, not a signature: it
catches damage, not a forger (docs/reliability.md, threat model).
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import re
import shutil
import socket
import stat
import tempfile
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .procs import pid_alive
from .safe_io import OutputError, describe_os_error, open_new, real_dir

__all__ = [
    "Checkpoint",
    "check_loadable",
    "CheckpointError",
    "Rejected",
    "find_resumable",
    "latest_complete",
    "list_complete",
    "load_checkpoint",
    "read_meta",
    "export_checkpoint",
    "exported_files",
    "save_checkpoint",
    "save_component_checkpoint",
    "write_state_file",
]

FORMAT = 1
MARKER = "COMPLETE"
_DIR_RE = re.compile(r"^ckpt-(\d{6,})$")
_TMP_RE = re.compile(r"^\.tmp-ckpt-\d+-(\d+)-")
# what pruning and replacing leave for a moment (renamed first, then removed: a kill in between leaves these,
# removed at the next save, never a `ckpt-*` directory missing some of its files)
_TRASH_RE = re.compile(r"^\.(?:trash|old)-ckpt-\d{6,}-(\d+)$")
IN_FLIGHT = "inflight.pt"
_OURS = {"meta.json", "state", IN_FLIGHT, MARKER}  # what a checkpoint directory holds
# `@`: a temporal split's copy (`sim@1`); `#`: a data-parallel replica's process (`sim#1`, `replicas:`)
_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.@#-]*$")
_MEMBER_RE = re.compile(r"^(meta\.json|inflight\.pt|state/[A-Za-z0-9_][A-Za-z0-9_.@#-]*\.pt)$")  # what a marker may list
MAX_MARKER_BYTES = 1 << 20  # a marker holds ~150 bytes per component: a bound far above any workflow's
_LEAVES = (int, float, bool, str, bytes, complex, type(None), torch.dtype, torch.device, torch.Size)


class CheckpointError(Exception):
    """A checkpoint that cannot be written or trusted; the message says which file and why."""


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    iteration: int
    states: dict[str, dict[str, Any]]
    meta: dict[str, Any]
    in_flight: dict[str, Any] | None = None  # `inflight.pt` (`interpreter/in_flight.py`), where there is one


# --- validation --------------------------------------------------------------------------------------
def check_loadable(value: Any, where: str) -> None:
    """Refuse anything ``torch.load(weights_only=True)`` would reject, naming the offending path."""
    t = type(value)
    if t in (torch.Tensor, torch.nn.Parameter) or t in _LEAVES:
        return
    if t in (dict, OrderedDict):
        for k, v in value.items():
            if type(k) not in (str, int, float, bool, type(None)):
                raise CheckpointError(f"{where}: key {k!r} of type {type(k).__name__} is not a plain key")
            check_loadable(v, f"{where}[{k!r}]")
        return
    if t in (list, tuple, set):
        for i, v in enumerate(value):
            check_loadable(v, f"{where}[{i}]")
        return
    hint = " (convert it to tensors: torch.from_numpy / torch.tensor)" if t.__module__.startswith("numpy") else ""
    raise CheckpointError(
        f"{where} is a {t.__module__}.{t.__qualname__}, which torch.load(weights_only=True) cannot load; "
        f"state must be tensors, dicts, lists, tuples, ints, floats, strings, bools or None{hint}")


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _digest(iteration: int, files: dict[str, dict[str, Any]]) -> str:
    return _sha256(json.dumps({"iteration": iteration, "files": files}, sort_keys=True).encode())


# --- low-level writes (separate functions: the crash tests interrupt them) ----------------------------
def _write_file(path: Path, data: bytes) -> None:
    with open_new(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _rose_wrote(path: Path) -> bool:
    """Whether `path` is a checkpoint directory as rose writes them (a real directory holding nothing but
    `meta.json`, `state/` and the marker, some possibly missing): what it may replace or remove."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode) and set(os.listdir(path)) <= _OURS
    except OSError:
        return False


def _publish(tmp: Path, final: Path) -> None:
    """Rename the finished temp dir into place (atomic on one filesystem); an existing checkpoint of that
    iteration is replaced; anything else by that name (a user's file or link, a directory of other files)
    is refused, never moved."""
    old = None
    if os.path.lexists(final):
        if not _rose_wrote(final):
            raise CheckpointError(f"{final}: not a checkpoint rose wrote (a file, a link, or a directory of other "
                                  "files); rose neither replaces nor moves it: move it out of checkpoints/")
        old = final.with_name(f".old-{final.name}-{os.getpid()}")
        os.rename(final, old)
    os.rename(tmp, final)
    _fsync_dir(final.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


_pid_alive = pid_alive  # kept under the old name for the tests' monkeypatching


# --- public API ----------------------------------------------------------------------------------------
def save_checkpoint(run_dir: str | os.PathLike[str], iteration: int, states: dict[str, dict[str, Any]],
                    meta: dict[str, Any] | None = None, *, keep_last: int | None = 3,
                    written_by: Mapping[str, Callable[[Path], dict[str, Any]]] | None = None,
                    in_flight: dict[str, Any] | None = None) -> Path:
    """Write ``ckpt-<iteration>`` atomically; keep the newest ``keep_last`` complete ones (None: all).

    ``states`` maps component -> {state name: value}; ``meta`` must be JSON-serialisable (the step
    counters, RNG seeds and plan hash a resume needs).  Raises :class:`CheckpointError` before writing
    anything if a value would not load with ``weights_only=True``.  ``written_by`` maps more components
    to a function that writes that component's state file at the path it is given and returns its
    marker entry (``write_state_file``'s): the process that holds the state writes it, all of them at
    once (`save_component_checkpoint`); their states are checked where they are written. ``in_flight``:
    what an asynchronous plan had in flight (`interpreter/in_flight.py`), written as ``inflight.pt``.
    """
    written_by = dict(written_by or {})
    if not isinstance(iteration, int) or iteration < 0:
        raise CheckpointError(f"iteration must be a non-negative int, got {iteration!r}")
    if keep_last is not None and keep_last < 1:
        raise ValueError(f"keep_last must be >= 1 or None, got {keep_last}")
    meta = dict(meta or {})
    for comp, st in states.items():
        if not _NAME_RE.match(comp):
            raise CheckpointError(f"component name {comp!r} cannot be a file name")
        if not isinstance(st, dict):
            raise CheckpointError(f"states[{comp!r}] must be a dict of state name -> value, "
                                  f"got {type(st).__name__}")
        for name, value in st.items():
            check_loadable(value, f"states[{comp!r}][{name!r}]")
    if in_flight is not None:
        check_loadable(in_flight, "in_flight")
    for comp in written_by:
        if not _NAME_RE.match(comp) or comp in states:
            raise CheckpointError(f"component name {comp!r} cannot be a file name, or is given twice")
    try:
        meta_bytes = json.dumps({"iteration": iteration, "meta": meta, "components": sorted({*states, *written_by})},
                                indent=1, sort_keys=True).encode()
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"checkpoint meta must be JSON-serialisable: {e}") from None

    run_dir = Path(run_dir)
    try:
        real_dir(run_dir)
    except OutputError as exc:
        raise CheckpointError(str(exc)) from None
    _remove_stale_temps(run_dir)
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-ckpt-{iteration:06d}-{os.getpid()}-", dir=run_dir))
    except OSError as exc:
        raise CheckpointError(_not_written(run_dir, iteration, describe_os_error(run_dir, exc))) from None
    try:
        (tmp / "state").mkdir()
        files: dict[str, dict[str, Any]] = {}
        with ThreadPoolExecutor(max_workers=max(1, len(written_by))) as pool:
            remote = {f"state/{comp}.pt": pool.submit(write, tmp / "state" / f"{comp}.pt")
                      for comp, write in written_by.items()}
            _write_file(tmp / "meta.json", meta_bytes)
            files["meta.json"] = {"sha256": _sha256(meta_bytes), "size": len(meta_bytes)}
            for comp in sorted(states):
                files[f"state/{comp}.pt"] = write_state_file(tmp / "state" / f"{comp}.pt", states[comp], comp)
            if in_flight is not None:
                buf = io.BytesIO()
                torch.save(in_flight, buf)
                _write_file(tmp / IN_FLIGHT, buf.getvalue())
                files[IN_FLIGHT] = {"sha256": _sha256(buf.getvalue()), "size": len(buf.getvalue())}
            for rel, future in remote.items():
                files[rel] = _entry(tmp / rel, future.result())
        files = dict(sorted(files.items()))
        _fsync_dir(tmp / "state")
        marker = {"format": FORMAT, "iteration": iteration, "files": files,
                  "digest": _digest(iteration, files)}
        _write_file(tmp / MARKER, json.dumps(marker, indent=1, sort_keys=True).encode())
        _fsync_dir(tmp)
        final = run_dir / f"ckpt-{iteration:06d}"
        _publish(tmp, final)
    except BaseException as exc:  # not a suppression: remove the partial checkpoint, then re-raise (Ctrl-C included)
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, OSError | OutputError):  # disk full, read-only...: a checkpoint problem (exit 5)
            why = describe_os_error(Path(exc.filename or tmp), exc) if isinstance(exc, OSError) else str(exc)
            raise CheckpointError(_not_written(run_dir, iteration, why)) from None
        if isinstance(exc, CheckpointError):
            raise CheckpointError(_not_written(run_dir, iteration, str(exc))) from None
        raise
    if keep_last is not None:
        _prune(run_dir, keep_last, final)
    return final


def _not_written(run_dir: Path, iteration: int, why: str) -> str:
    """Why checkpoint `iteration` was not written, and what is kept instead (nothing partial is left)."""
    kept = list_complete(run_dir)
    return (f"checkpoint of iteration {iteration} not written: {why}; " +
            (f"the last complete checkpoint, {kept[-1]}, is kept" if kept else "no earlier checkpoint to keep"))


def write_state_file(path: Path, states: dict[str, Any], component: str) -> dict[str, Any]:
    """One component's state file of a checkpoint (``state/<component>.pt`` in the checkpoint being
    written), fsynced: checked loadable first (nothing is written otherwise), then its marker entry, the
    sha256 and size. Called where the state is, so that a 4-GB trainer state does not cross to the driver
    first (H100, MJX: the end-of-run checkpoint through the driver took 16.4 s)."""
    for name, value in states.items():
        check_loadable(value, f"states[{component!r}][{name!r}]")
    buf = io.BytesIO()
    torch.save(states, buf)
    data = buf.getvalue()
    try:
        _write_file(path, data)
    except (OSError, OutputError) as exc:  # (in the component's process: said with its name, not as a crash)
        why = describe_os_error(path, exc) if isinstance(exc, OSError) else str(exc)
        raise CheckpointError(f"state file of component {component}: {why}") from None
    return {"sha256": _sha256(data), "size": len(data)}


def _entry(path: Path, entry: dict[str, Any]) -> dict[str, Any]:
    """A state file written by another process: its marker entry, after checking that the file is there
    with that size (a process on another host writes to its own file system)."""
    try:
        size = path.stat().st_size
    except OSError:
        size = -1
    if size != entry.get("size"):
        raise CheckpointError(f"{path}: written elsewhere or incompletely ({size} bytes here, {entry.get('size')} written)")
    return {"sha256": entry["sha256"], "size": entry["size"]}


def save_component_checkpoint(run_dir: str | os.PathLike[str], iteration: int, components: list[str],
                              control: Callable[..., Any], meta: dict[str, Any] | None = None, *,
                              keep_last: int | None = 3, in_flight: dict[str, Any] | None = None) -> Path:
    """`save_checkpoint` of running components, each state file written by the component's own process,
    all at once (`ComponentWorker.write_state_file`), where that process shares this host; a process on
    another host sends its state here to be written. `control(component, method, *args)` asks a
    component's process (`Backend.control`)."""
    host = socket.gethostname()

    def writer(comp: str) -> Callable[[Path], dict[str, Any]]:
        def write(path: Path) -> dict[str, Any]:
            entry = control(comp, "write_state_file", str(path), host)
            if "error" in entry:
                raise CheckpointError(entry["error"])
            if "elsewhere" in entry:
                return write_state_file(path, control(comp, "get_states"), comp)
            return dict(entry)
        return write

    return save_checkpoint(run_dir, iteration, {}, meta, keep_last=keep_last,
                           written_by={c: writer(c) for c in components}, in_flight=in_flight)


def _remove_stale_temps(run_dir: Path) -> None:
    """Temp dirs of writers that died (their pid is in the name) are garbage, and so are the checkpoints
    they were pruning or replacing (renamed to `.trash-…`, `.old-…` before being removed)."""
    for p in run_dir.iterdir():
        m = _TMP_RE.match(p.name) or _TRASH_RE.match(p.name)
        if m and p.is_dir() and not p.is_symlink() and not _pid_alive(int(m.group(1))):
            shutil.rmtree(p, ignore_errors=True)


def _open_dir(path: Path, dir_fd: int | None = None, where: str | None = None) -> int:
    """A checkpoint's directory (or its `state/`), opened without following a link: what a checkpoint
    reads must lie inside it, not wherever a link points."""
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError as e:
        try:
            link = stat.S_ISLNK(os.stat(path, dir_fd=dir_fd, follow_symlinks=False).st_mode)
        except OSError:
            link = False
        if link or e.errno == errno.ELOOP:
            raise CheckpointError(f"{where or path}: a symbolic link; a checkpoint is a plain directory of regular "
                                  "files") from None
        raise CheckpointError(f"{where or path}: not a checkpoint directory ({e.strerror})") from None


@contextmanager
def _opened(path: Path) -> Iterator[int]:
    """The checkpoint directory `path`, opened without following a link (closed on exit)."""
    fd = _open_dir(path)
    try:
        yield fd
    finally:
        os.close(fd)


def _kind(mode: int) -> str:
    return next((what for test, what in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO"),
                                         (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                                         (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory")) if test(mode)),
                "not a regular file")


def _read_member(ck_fd: int, rel: str, size: int | None, where: str) -> bytes:
    """The bytes of `rel` (`meta.json`, `state/<component>.pt`, the marker) inside the checkpoint opened as
    `ck_fd`: only a regular file there (a link, a FIFO or a device is refused before it is opened: a FIFO
    would block the read, /dev/zero never end it), of exactly `size` bytes (the marker's; checked before
    reading), or at most `MAX_MARKER_BYTES` for the marker itself."""
    parent, _, name = rel.rpartition("/")
    fd_dir = _open_dir(Path(parent), ck_fd, where.removesuffix(f"/{name}")) if parent else ck_fd
    try:
        try:
            st = os.stat(name, dir_fd=fd_dir, follow_symlinks=False)
        except OSError as e:
            raise CheckpointError(f"{where}: missing or unreadable ({e.strerror})") from None
        if not stat.S_ISREG(st.st_mode):
            raise CheckpointError(f"{where}: {_kind(st.st_mode)}; a checkpoint holds regular files only")
        if size is None and st.st_size > MAX_MARKER_BYTES:
            raise CheckpointError(f"{where}: {st.st_size} bytes, more than a marker's {MAX_MARKER_BYTES}")
        if size is not None and st.st_size != size:
            raise CheckpointError(f"{where}: {st.st_size} bytes, the marker says {size} (truncated or overwritten)")
        limit = MAX_MARKER_BYTES if size is None else size
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd_dir)
        except OSError as e:
            raise CheckpointError(f"{where}: missing or unreadable ({e.strerror})") from None
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):  # (replaced between the two looks)
                raise CheckpointError(f"{where}: not a regular file; a checkpoint holds regular files only")
            data = f.read(limit + 1)
        if len(data) > limit or (size is not None and len(data) != size):
            raise CheckpointError(f"{where}: changed while it was read ({len(data)} bytes)")
        return data
    finally:
        if fd_dir != ck_fd:
            os.close(fd_dir)


def _read_marker(path: Path, ck_fd: int) -> dict[str, Any]:
    """The marker of the checkpoint opened as `ck_fd`, checked: its digest, its iteration, its file list
    (only `meta.json` and `state/<component>.pt` with their sizes: no path leaving the directory)."""
    if not os.listdir(ck_fd):
        raise CheckpointError(f"{path}: empty checkpoint directory")
    try:
        os.stat(MARKER, dir_fd=ck_fd, follow_symlinks=False)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no {MARKER} marker, the checkpoint is partial "
                              "(the writer was interrupted)") from None
    raw = _read_member(ck_fd, MARKER, None, f"{path}/{MARKER}")
    try:
        marker = json.loads(raw)
    except ValueError as e:
        raise CheckpointError(f"{path}/{MARKER}: unreadable marker ({e})") from None
    if not isinstance(marker, dict) or marker.get("format") != FORMAT or not isinstance(marker.get("files"), dict):
        raise CheckpointError(f"{path}/{MARKER}: not a format-{FORMAT} checkpoint marker")
    if marker.get("digest") != _digest(marker.get("iteration"), marker["files"]):  # type: ignore[arg-type]
        raise CheckpointError(f"{path}/{MARKER}: marker digest mismatch (the marker was altered)")
    iteration = marker.get("iteration")
    if type(iteration) is not int or iteration < 0:
        raise CheckpointError(f"{path}/{MARKER}: iteration {iteration!r} is not a non-negative int")
    for rel, info in marker["files"].items():
        if not _MEMBER_RE.match(rel) or not isinstance(info, dict) or type(info.get("size")) is not int:
            raise CheckpointError(f"{path}/{MARKER}: lists {rel!r}, which is not a checkpoint file "
                                  "(meta.json, state/<component>.pt) with its size")
    return marker


def _check_name(path: Path, iteration: int) -> None:
    """A `ckpt-<n>` directory holds iteration n: a copied or renamed one would resume at another
    iteration than its name says."""
    named = _DIR_RE.match(path.name)
    if named and int(named.group(1)) != iteration:
        raise CheckpointError(f"{path}: named for iteration {int(named.group(1))} but its {MARKER} marker is of "
                              f"iteration {iteration} (a copied or renamed checkpoint)")


def _quick_iteration(path: Path) -> int | None:
    """The marker's iteration of a complete checkpoint (marker good, every file a regular one of its
    size; hashes not read), else None. What pruning and `list_complete` go by."""
    try:
        with _opened(path) as fd:
            marker = _read_marker(path, fd)
            for rel, info in marker["files"].items():
                parent, _, name = rel.rpartition("/")
                st = os.stat(rel, dir_fd=fd, follow_symlinks=False)
                if not stat.S_ISREG(st.st_mode) or st.st_size != info["size"] or \
                        (parent and stat.S_ISLNK(os.stat(parent, dir_fd=fd, follow_symlinks=False).st_mode)):
                    return None
            return int(marker["iteration"])
    except (CheckpointError, OSError, KeyError, TypeError):
        return None


def _complete(run_dir: Path) -> list[tuple[int, Path]]:
    """(marker iteration, dir) of every complete `ckpt-*` directory, by that iteration, name unchecked."""
    if not run_dir.is_dir():
        return []
    found = [(it, p) for p in run_dir.iterdir() if _DIR_RE.match(p.name) and (it := _quick_iteration(p)) is not None]
    return sorted(found, key=lambda e: (e[0], e[1].name))


def list_complete(run_dir: str | os.PathLike[str]) -> list[Path]:
    """Complete checkpoint dirs (marker present, file sizes match, named for the marker's iteration), oldest first."""
    return [p for it, p in _complete(Path(run_dir)) if p.name == f"ckpt-{it:06d}"]


def _prune(run_dir: Path, keep_last: int, final: Path) -> None:
    """Keep the newest `keep_last` checkpoints, by the iteration their markers hold: a directory copied or
    renamed to a higher number is pruned once it is older than those, never kept for its name."""
    kept = list_complete(run_dir)[-keep_last:]
    if not kept:
        return
    oldest_kept = _quick_iteration(kept[0])
    if oldest_kept is None:
        return
    for it, path in _complete(run_dir):
        if it < oldest_kept and path != final:
            _discard(path)
    for path in run_dir.iterdir():  # a partial checkpoint older than those kept (an older rose's pruning, killed)
        named = _DIR_RE.match(path.name)
        if named and int(named.group(1)) < oldest_kept and _quick_iteration(path) is None and _rose_wrote(path):
            _discard(path)


def _discard(path: Path) -> None:
    """Remove checkpoint directory `path` atomically as far as a reader goes: renamed to a hidden name first
    (one rename: a kill leaves the whole checkpoint or none of it under its name), then deleted; a kill
    during the deletion leaves the hidden one, which the next save removes (`_remove_stale_temps`)."""
    trash = path.with_name(f".trash-{path.name}-{os.getpid()}")
    try:
        os.rename(path, trash)
    except OSError:
        return  # (gone already, or not ours to move: left as it is)
    shutil.rmtree(trash, ignore_errors=True)


def latest_complete(run_dir: str | os.PathLike[str], *, verify: bool = False) -> Path | None:
    """Newest complete checkpoint, ignoring temporary and partial dirs; ``verify`` also checks hashes
    (reads everything) and skips back past corrupt ones."""
    for p in reversed(list_complete(run_dir)):
        if not verify:
            return p
        try:
            load_checkpoint(p)
            return p
        except CheckpointError:
            continue
    return None


@dataclass(frozen=True)
class Rejected:
    """A checkpoint directory that cannot be resumed from, and why (truncated, altered, partial...)."""

    path: Path
    reason: str


def find_resumable(run_dir: str | os.PathLike[str], map_location: Any = "cpu") -> tuple[Checkpoint | None, list[Rejected]]:
    """The newest checkpoint that verifies (loaded), and every newer one rejected with its reason.

    Resuming must never skip a checkpoint silently: a truncated or bit-flipped newest checkpoint means
    the run goes back further than the user thinks, so the caller reports each rejection. With no usable
    checkpoint the list holds every ``ckpt-*`` directory found, newest first."""
    run_dir = Path(run_dir)
    found = sorted(((int(m.group(1)), p) for p in (run_dir.iterdir() if run_dir.is_dir() else ())
                    if (m := _DIR_RE.match(p.name))), reverse=True)
    rejected: list[Rejected] = []
    for _, path in found:
        try:
            return load_checkpoint(path, map_location), rejected
        except CheckpointError as exc:
            rejected.append(Rejected(path, str(exc).removeprefix(f"{path}: ").removeprefix(f"{path}/")))
    return None, rejected


def read_meta(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A checkpoint's `meta.json` (`{"iteration", "meta", "components"}`), its size and hash checked
    against the marker, without loading any state: what can be compared before processes start."""
    path = Path(path)
    with _opened(path) as fd:
        marker = _read_marker(path, fd)
        _check_name(path, marker["iteration"])
        return _head(path, fd, marker)


def _head(path: Path, fd: int, marker: dict[str, Any]) -> dict[str, Any]:
    """meta.json, verified, and cross-checked with the marker: the same iteration, and a state file for
    every component it lists."""
    info = marker["files"].get("meta.json")
    if info is None:
        raise CheckpointError(f"{path}/meta.json: not in the {MARKER} marker")
    data = _verified(path, fd, "meta.json", info)
    try:
        head = json.loads(data)
    except ValueError as e:
        raise CheckpointError(f"{path}/meta.json: not JSON ({e})") from None
    if not isinstance(head, dict) or head.get("iteration") != marker["iteration"]:
        raise CheckpointError(f"{path}/meta.json: iteration {head.get('iteration') if isinstance(head, dict) else None!r}, "
                              f"the {MARKER} marker says {marker['iteration']}")
    components = head.get("components", [])
    if not isinstance(components, list) or not all(isinstance(c, str) and _NAME_RE.match(c) for c in components):
        raise CheckpointError(f"{path}/meta.json: components {components!r} are not component names")
    for comp in components:
        if f"state/{comp}.pt" not in marker["files"]:
            raise CheckpointError(f"{path}/state/{comp}.pt: listed in meta.json but not in {MARKER}")
    return head


def _verified(path: Path, fd: int, rel: str, info: dict[str, Any]) -> bytes:
    data = _read_member(fd, rel, info["size"], f"{path}/{rel}")
    if _sha256(data) != info.get("sha256"):
        raise CheckpointError(f"{path}/{rel}: content hash mismatch (corrupt or modified file)")
    return data


def load_checkpoint(path: str | os.PathLike[str], map_location: Any = "cpu") -> Checkpoint:
    """Verify the marker, the directory's name, meta.json and every file's size (before reading) and hash,
    then load with ``weights_only=True``. Only regular files inside the directory are read."""
    path = Path(path)
    with _opened(path) as fd:
        marker = _read_marker(path, fd)
        _check_name(path, marker["iteration"])
        head = _head(path, fd, marker)
        states: dict[str, dict[str, Any]] = {}
        for comp in head.get("components", []):
            rel = f"state/{comp}.pt"
            data = _verified(path, fd, rel, marker["files"][rel])
            try:
                states[comp] = torch.load(io.BytesIO(data), map_location=map_location, weights_only=True)
            except Exception as e:  # noqa: BLE001 - unpickling errors have many types
                raise CheckpointError(f"{path}/{rel}: cannot be loaded with weights_only=True ({e})") from None
        in_flight = None
        if IN_FLIGHT in marker["files"]:
            data = _verified(path, fd, IN_FLIGHT, marker["files"][IN_FLIGHT])
            try:
                in_flight = torch.load(io.BytesIO(data), map_location=map_location, weights_only=True)
            except Exception as e:  # noqa: BLE001 - unpickling errors have many types
                raise CheckpointError(f"{path}/{IN_FLIGHT}: cannot be loaded with weights_only=True ({e})") from None
    meta = head.get("meta", {})
    return Checkpoint(path=path, iteration=marker["iteration"], states=states, meta=meta if isinstance(meta, dict) else {},
                      in_flight=in_flight if isinstance(in_flight, dict) else None)


# --- the export: a run's final state for whoever loads it without rose ----------------------------------
EXPORT_FORMAT = 1


def export_checkpoint(ckpt: str | os.PathLike[str], export_dir: str | os.PathLike[str],
                      about: dict[str, Any]) -> Path:
    """Copy each component's state file of the complete checkpoint `ckpt` to `export_dir/<component>.pt`
    and write `export_dir/manifest.json` (docs/components.md, "The export"): what a user loads with
    `torch.load(path, weights_only=True)` alone, no rose needed. `about` goes into the manifest (the
    workflow, its hash, the params, each component's state names). Copies, not links: a user who saves
    into an exported file must not change the checkpoint. Each file is replaced atomically and the
    manifest last, so a manifest never names a file of another export; files of components the previous
    export had and this one lacks are removed."""
    ckpt, export_dir = Path(ckpt), Path(export_dir)
    try:
        return _export(ckpt, export_dir, about)
    except (OSError, OutputError) as exc:  # disk full, a link...: nothing half-written left, the checkpoint kept
        for tmp in export_dir.glob(f".*.tmp-{os.getpid()}") if export_dir.is_dir() and not export_dir.is_symlink() else ():
            tmp.unlink(missing_ok=True)
        why = describe_os_error(Path(exc.filename or export_dir), exc) if isinstance(exc, OSError) else str(exc)
        raise CheckpointError(f"export not written: {why}; the checkpoint {ckpt} is kept (loadable the same way: "
                              "docs/components.md)") from None


def _export(ckpt: Path, export_dir: Path, about: dict[str, Any]) -> Path:
    with _opened(ckpt) as fd:
        marker = _read_marker(ckpt, fd)
    real_dir(export_dir)
    previous = exported_files(export_dir)
    components: dict[str, Any] = {}
    for rel, info in sorted(marker["files"].items()):
        if not rel.startswith("state/"):
            continue
        comp = rel.removeprefix("state/").removesuffix(".pt")
        tmp = export_dir / f".{comp}.pt.tmp-{os.getpid()}"
        _copy(ckpt / rel, tmp)
        os.replace(tmp, export_dir / f"{comp}.pt")  # (a link at the target is replaced, not written through)
        components[comp] = {"file": f"{comp}.pt", "sha256": info["sha256"], "size": info["size"],
                            **(about.get("states", {}).get(comp) or {})}
    manifest = {"format": EXPORT_FORMAT, "iteration": marker["iteration"], "checkpoint": ckpt.name,
                **{k: v for k, v in about.items() if k != "states"}, "components": components,
                "load": "torch.load(<component>.pt, weights_only=True) gives {state name: value} (tensors, dicts, "
                        "lists, numbers, strings); see rose's docs/components.md"}
    tmp = export_dir / f".manifest.json.tmp-{os.getpid()}"
    _write_file(tmp, (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode())
    os.replace(tmp, export_dir / "manifest.json")
    for name in previous - {c["file"] for c in components.values()}:
        (export_dir / name).unlink(missing_ok=True)
    _fsync_dir(export_dir)
    return export_dir


def _copy(src: Path, tmp: Path) -> None:
    """Copy `src` to the new file `tmp` (links followed at neither end); removed on any error."""
    try:
        tmp.unlink(missing_ok=True)
        with open(src, "rb", opener=lambda p, f: os.open(p, f | os.O_NOFOLLOW)) as s, open_new(tmp, "wb", exclusive=True) as d:
            shutil.copyfileobj(s, d)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def exported_files(export_dir: Path) -> set[str]:
    """The component files the export in `export_dir` names (its manifest's), to remove those a new one lacks."""
    try:
        manifest = json.loads((export_dir / "manifest.json").read_text())
        return {c["file"] for c in manifest["components"].values() if _NAME_RE.match(str(c["file"]))}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return set()
