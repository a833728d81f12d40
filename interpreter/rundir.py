"""The run directory (`rose execute --out DIR`): what a run writes there, and the rules that keep runs apart.

A run directory holds one training run: `metrics.jsonl` and TensorBoard's `tb/` (one step per RL
iteration), `checkpoints/`, `export/` (the final state, loadable without rose), the trace (`trace.json`,
`trace.jsonl`), `nodes.json`, `stacks.txt`, `recoveries.jsonl`, and `.rose.lock`. Three rules keep what a
reader sees true:

* **one process per directory.** A command that writes into a run directory (`execute`, `optimize`,
  `compare`) holds an exclusive lock on its `.rose.lock` (`RunDirLock`, `flock`) from before it checks the
  directory until it ends; a second one is refused naming the holder. Two resumes of one directory at
  once had interleaved their checkpoints and metrics (issue 42).
* **one run per directory.** Starting again into a directory that holds a run's outputs would append to
  its metrics and add a second TensorBoard file, so it is refused unless the user says which they mean:
  `--resume` (continue it) or `--overwrite` (replace it). `--overwrite` removes only what rose writes
  (`rose_outputs`: its file names and patterns); a user's own files there stay, and are named.
* **never a step twice.** A run that continues from the checkpoint of iteration k (`--resume`, or a
  restart after a component died) re-runs k+1...; before it does, `metrics.jsonl` is cut back to
  iterations <= k (rewritten atomically) and TensorBoard is told to purge steps > k (`purge_step`, which
  TensorBoard applies to the earlier event files too), so both show each iteration once, as computed by
  the run that continued.
"""

from __future__ import annotations

import errno
import fcntl
import json
import math
import os
import re
import shutil
import socket
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from .checkpoint import exported_files, list_complete
from .loggers import Trackers
from .procs import pid_alive
from .safe_io import LINK_HINT, OutputError, atomic_writer, open_new, real_dir

__all__ = ["OUTPUTS", "LOCK", "RunDirInUse", "RunDirLock", "check_out_link", "check_run_dir", "clear_outputs",
           "rose_outputs", "MetricsLog"]

# what rose writes at the top of a run directory (files), and in its own subdirectories (name patterns)
OUTPUTS = ("metrics.jsonl", "metrics.jsonl.tmp", "trace.json", "trace.jsonl", "nodes.json", "stacks.txt",
           "recoveries.jsonl", "staleness.json", "staleness.json.tmp", "mlflow.db")
# the temporaries of those (`safe_io.atomic_writer`: `.NAME.tmp-PID`), left only by a process killed mid-write
OWN_TEMPS = re.compile(r"^\.(metrics\.jsonl|trace\.jsonl|trace\.json|nodes\.json|staleness\.json|stacks\.txt)\.tmp-\d+$")
OWN_DIRS = {
    "tb": re.compile(r"^events\.out\.tfevents\..+$"),  # SummaryWriter's file names
    "checkpoints": re.compile(r"^(ckpt-\d{6,}|\.tmp-ckpt-\d+-\d+-.*|\.old-ckpt-\d{6,}-\d+|\.trash-ckpt-\d{6,}-\d+)$"),
    "export": re.compile(r"^(manifest\.json|\..+\.tmp-\d+)$"),  # and the files its manifest names
    # the optional trackers (loggers.py): MLflow's file store (experiment ids, its trash) and W&B's offline runs
    "mlruns": re.compile(r"^(\d+|\.trash|models)$"),
    "wandb": re.compile(r"^(offline-run-.+|run-.+|debug\.log|debug-internal\.log)$"),
}
LOCK = ".rose.lock"


class RunDirInUse(Exception):
    """The run directory holds another run's outputs, or cannot be used; the message says what to do."""


def rose_outputs(out: Path) -> tuple[list[Path], list[Path]]:
    """(what rose wrote in `out`, what else lies inside rose's own subdirectories): the first is what
    `--overwrite` removes, the second what it leaves (a user's `checkpoints/my_model.bin`, `tb/notes`).
    Links are never rose's (it writes none) and never followed (`out` itself is checked before:
    `check_out_link`); a `ckpt-NNNNNN` that is not a directory is a user's file, not a checkpoint."""
    if not out.is_dir():
        return [], []
    mine = [out / n for n in OUTPUTS if (out / n).is_file() and not (out / n).is_symlink()]
    mine += [p for p in sorted(out.iterdir()) if OWN_TEMPS.match(p.name) and p.is_file() and not p.is_symlink()]
    theirs: list[Path] = []
    for name, pattern in OWN_DIRS.items():
        sub = out / name
        if not sub.is_dir() or sub.is_symlink():
            continue
        exported = exported_files(sub) if name == "export" else set()
        for entry in sorted(sub.iterdir()):
            ours = (pattern.match(entry.name) or entry.name in exported) and not entry.is_symlink() and \
                (name != "checkpoints" or not entry.name.startswith("ckpt-") or entry.is_dir())
            (mine if ours else theirs).append(entry)
    return mine, theirs


def _summary(out: Path, paths: list[Path]) -> str:
    return ", ".join(sorted({p.relative_to(out).parts[0] for p in paths}))


def check_out_link(out: Path, follow_links: bool) -> None:
    """A `--out` that is a symbolic link is refused unless the user said `--follow-links`: writing through
    it would replace what lies where it points (another run's outputs)."""
    if out.is_symlink() and not follow_links:
        raise RunDirInUse(f"--out {out} is a symbolic link (to {os.readlink(out)}); rose writes through it only "
                          "when asked: pass --follow-links, or give the directory itself")


def _links(out: Path) -> list[str]:
    """The paths rose writes in `out` that are symbolic links (`safe_io`: never written through)."""
    return sorted({n for n in (*OUTPUTS, *OWN_DIRS, LOCK) if (out / n).is_symlink()})


def check_run_dir(out: Path, *, resume: bool, overwrite: bool) -> None:
    """Refuse a run directory that would mix two runs (before anything starts). Each message names only
    a way out that works for this directory: --resume only where a checkpoint is. A path rose writes that
    is a link is refused whatever the options."""
    if resume and overwrite:
        raise RunDirInUse("--resume continues the run in --out and --overwrite replaces it: choose one")
    if out.exists() and not out.is_dir():
        raise RunDirInUse(f"--out {out} is a file, not a directory")
    links = _links(out) if out.is_dir() else []
    if links:
        raise RunDirInUse(f"{out}: {', '.join(links)} {'is a symbolic link' if len(links) == 1 else 'are symbolic links'}; "
                          f"{LINK_HINT}")
    mine, _ = rose_outputs(out)
    checkpoints = list_complete(out / "checkpoints")
    if resume:
        if not mine:
            raise RunDirInUse(f"--resume: {out} holds no run to continue; start one without --resume")
        if not any(p.parent.name == "checkpoints" and p.name.startswith("ckpt-") for p in mine):
            raise RunDirInUse(f"--resume: {out} holds no checkpoint to continue from (a run writes one at its end, "
                              "on Ctrl-C or SIGTERM, and every N iterations with --checkpoint-every N: the run there "
                              "was killed before its first); start it again with --overwrite, or use a new --out")
    elif mine and not overwrite:
        if checkpoints:
            raise RunDirInUse(f"{out} holds the outputs of an earlier run ({_summary(out, mine)}); continue it with "
                              f"--resume (its last checkpoint is {checkpoints[-1].name}), write to a new --out "
                              "directory, or replace them with --overwrite")
        raise RunDirInUse(f"{out} holds the outputs of an earlier run ({_summary(out, mine)}) but no checkpoint to "
                          "continue from; write to a new --out directory, or replace them with --overwrite")


def clear_outputs(out: Path) -> tuple[list[str], list[str]]:
    """Remove an earlier run's outputs (`--overwrite`): only what rose writes (`rose_outputs`); rose's
    subdirectories are removed when nothing else is left in them. Returns (removed, left): paths
    relative to `out`, `left` being the files of others found in rose's subdirectories."""
    mine, theirs = rose_outputs(out)
    for path in mine:
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()
    for name in OWN_DIRS:
        sub = out / name
        if sub.is_dir() and not sub.is_symlink() and not any(sub.iterdir()):
            sub.rmdir()
    return sorted(str(p.relative_to(out)) for p in mine), sorted(str(p.relative_to(out)) for p in theirs)


class RunDirLock:
    """The exclusive lock of one run directory: `flock` on `DIR/.rose.lock`, which records the holder
    (pid, host, command, since when). The kernel drops the lock when its process dies, however it dies,
    so a lock is never stale; a record left by a holder that did not release (killed) is said when the
    lock is taken over. The file itself is never removed (removing a lock file races with its next taker)."""

    def __init__(self, out: Path, command: str | None = None) -> None:
        self.out = out
        self.command = command or " ".join(["rose", *sys.argv[1:2]])
        self.fd: int | None = None
        self.note: str | None = None  # set by `acquire` when it took over a lock left by a killed holder

    def acquire(self) -> RunDirLock:
        path = self.out / LOCK
        try:
            self.out.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise RunDirInUse(f"{self.out}: {LOCK} is a symbolic link; {LINK_HINT}") from None
            raise RunDirInUse(f"--out {self.out}: cannot open its lock file {path} ({exc.strerror})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = _holder(fd)
            os.close(fd)
            raise RunDirInUse(f"{self.out} is in use by another rose process ({_describe(holder)}); wait for it to "
                              "end, or use another --out") from None
        left = _holder(fd)
        if left:
            self.note = (f"note: {self.out} was last locked by {_describe(left, held=False)}, which ended without "
                         "releasing it (killed?); taken over")
        record = {"pid": os.getpid(), "host": socket.gethostname(), "command": self.command,
                  "since": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(record).encode(), 0)
        self.fd = fd
        return self

    def release(self) -> None:
        if self.fd is not None:
            os.ftruncate(self.fd, 0)  # (an empty record: released in order)
            os.close(self.fd)  # drops the lock
            self.fd = None

    def __enter__(self) -> RunDirLock:
        return self.acquire()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.release()


def _holder(fd: int) -> dict[str, Any]:
    try:
        record = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def _describe(holder: dict[str, Any], held: bool = True) -> str:
    """The recorded holder; `held`: the lock is held now (by it, or by a process it started, which
    inherited the lock's file descriptor), so a holder found dead is said to have left one running."""
    if not holder:
        return "a process that has not recorded itself yet"
    pid, host = holder.get("pid"), holder.get("host")
    text = f"pid {pid} on host {host}, `{holder.get('command', 'rose')}` since {holder.get('since', '?')}"
    if held and host == socket.gethostname() and isinstance(pid, int) and not pid_alive(pid):
        text += f"; pid {pid} has ended, and a process it started still holds the lock"
    return text


def _json_value(v: Any) -> Any:
    return None if isinstance(v, float) and math.isnan(v) else v


class MetricsLog:
    """`metrics.jsonl` and TensorBoard for one run directory, starting at iteration `start`: what an
    earlier segment logged for iterations >= `start` is dropped first (see the module docstring)."""

    def __init__(self, out: Path, start: int = 0, tensorboard: bool = True, loggers: tuple[str, ...] = (),
                 name: str = "rose", params: dict[str, Any] | None = None) -> None:
        self.out = out
        self.tensorboard = tensorboard
        self.trackers = Trackers(out, loggers, name, params)  # MLflow, W&B (`--logger`), with the run's params
        self._file: Any = None
        self._tb: Any = None
        self.unavailable: str | None = None  # why TensorBoard is not written, if it is not
        out.mkdir(parents=True, exist_ok=True)  # (`out` itself may be a link the user allowed: --follow-links)
        self._open(start)

    def _open(self, start: int) -> None:
        path = self.out / "metrics.jsonl"
        if start > 0 and path.exists():
            self._cut(path, start)
        self._file = open_new(path, "a" if start > 0 else "w")
        self.trackers.open(start)
        if self.tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as exc:  # the `tensorboard` package is missing: metrics.jsonl only, said once
                self.tensorboard, self.unavailable = False, f"TensorBoard output off ({exc})"
                return
            # purge_step: TensorBoard drops every event at a step >= start from the earlier files
            self._tb = SummaryWriter(str(real_dir(self.out / "tb")), purge_step=start if start > 0 else None)

    @staticmethod
    def _cut(path: Path, start: int) -> None:
        """Keep the lines of iterations < start (a torn last line, from a kill mid-write, goes too)."""
        kept = []
        for line in path.read_text().splitlines():
            try:
                if json.loads(line)["iteration"] < start:
                    kept.append(line)
            except (ValueError, KeyError, TypeError):
                continue
        with atomic_writer(path) as f:
            f.write("".join(f"{line}\n" for line in kept))

    def rewind(self, start: int) -> None:
        """The run continues from iteration `start` again (a restart from a checkpoint)."""
        self.close()
        self._open(start)

    def log(self, iteration: int, metrics: dict[str, float]) -> None:
        try:
            self._file.write(json.dumps({"iteration": iteration, **{k: _json_value(v) for k, v in metrics.items()}})
                             + "\n")
            self._file.flush()
        except OSError as exc:  # (disk full: exit 5, naming the file)
            raise OutputError(f"{self.out / 'metrics.jsonl'}: {exc.strerror or exc}") from None
        self.trackers.log(iteration, metrics)
        if self._tb is not None:
            for name, value in metrics.items():
                self._tb.add_scalar(name, value, iteration)

    def close(self) -> None:
        self.trackers.close()
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._tb is not None:
            self._tb.flush()
            self._tb.close()
            self._tb = None
