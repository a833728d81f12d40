"""Writing into a run directory: never through a link, never a half-written file, one error that says what.

Why: a run directory is the user's (`--out`), and what lies in it may not be what rose wrote: a
`metrics.jsonl` or an `export/` that is a symbolic link to another run's file, a `checkpoints/` linked to
a shared disk. Writing through such a link replaces a file rose never wrote (issue 59: a symlinked
`export/` overwrote another run's `pi.pt`). So every write rose makes in a run directory goes through
this module:

* `open_new` / `atomic_writer` / `write_atomic` -- files are opened with `O_NOFOLLOW` (a link in the
  last component is refused by the kernel, not by a check that races with it) and written to a temporary
  name next to the target, then renamed over it (a rename replaces a link, it never writes through it);
* `real_dir` -- a directory rose writes into (`checkpoints/`, `export/`, `tb/`) is created, or checked
  to be a directory and not a link (`lstat`);
* a failed write (disk full, read-only, permission denied, a link) leaves no temporary file behind and
  becomes one `OutputError` naming the file and why (`rose execute` exits 5, the checkpoint-problem code,
  saying what was kept).
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

__all__ = ["OutputError", "LINK_HINT", "open_new", "atomic_writer", "write_atomic", "real_dir", "refuse_link",
           "describe_os_error"]

LINK_HINT = "rose writes nothing through a symbolic link in a run directory; remove the link or use another --out"


class OutputError(Exception):
    """A file of the run directory that could not be written (or would have been written through a link);
    the message names it and why."""


def describe_os_error(path: Path, exc: OSError) -> str:
    """`path: why` for a failed write, with the way out for the usual causes."""
    if exc.errno == errno.ELOOP:
        return f"{path}: a symbolic link; {LINK_HINT}"
    if exc.errno == errno.ENOSPC:
        return f"{path}: no space left on the device (free some and continue with --resume)"
    if exc.errno == errno.EDQUOT:
        return f"{path}: disk quota exceeded (free some and continue with --resume)"
    return f"{path}: {exc.strerror or exc}"


def refuse_link(path: Path) -> None:
    """OutputError if `path` is a symbolic link (missing is fine)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise OutputError(describe_os_error(path, exc)) from None
    if stat.S_ISLNK(mode):
        raise OutputError(f"{path}: a symbolic link; {LINK_HINT}")


def real_dir(path: Path) -> Path:
    """`path` as a directory rose may write into: created if absent (its parents too), refused if it is a
    link or not a directory."""
    refuse_link(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise OutputError(f"{path}: not a directory (rose writes its files there); move it away") from None
    except OSError as exc:
        raise OutputError(describe_os_error(path, exc)) from None
    refuse_link(path)  # (made a link between the two looks: refused all the same)
    return path


def open_new(path: Path, mode: str = "w", *, exclusive: bool = False) -> IO[Any]:
    """`path` opened for writing ("w", "a", "wb", "ab") without following a link in its last component."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    flags |= os.O_APPEND if mode.startswith("a") else os.O_TRUNC
    if exclusive:
        flags |= os.O_EXCL
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as exc:
        raise OutputError(describe_os_error(path, exc)) from None
    try:
        return os.fdopen(fd, mode) if "b" in mode else os.fdopen(fd, mode, encoding="utf-8")
    except BaseException:
        os.close(fd)
        raise


def _tmp_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


@contextmanager
def atomic_writer(path: Path, binary: bool = False, fsync: bool = False) -> Iterator[IO[Any]]:
    """A file to write `path`'s new content into: a temporary next to it, renamed over `path` when the block
    ends without an error (a link at `path` is replaced, never written through), removed on any error
    (Ctrl-C included). OSError becomes OutputError naming `path`."""
    path = Path(path)
    tmp = _tmp_name(path)
    try:
        try:
            os.unlink(tmp)  # (a leftover of an earlier process with this pid)
        except FileNotFoundError:
            pass
        with open_new(tmp, "wb" if binary else "w", exclusive=True) as f:
            yield f
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(exc, OSError):
            raise OutputError(describe_os_error(path, exc)) from None
        raise


def write_atomic(path: Path, data: str | bytes, fsync: bool = False) -> Path:
    """Replace `path`'s content with `data` (`atomic_writer`)."""
    with atomic_writer(path, binary=isinstance(data, bytes), fsync=fsync) as f:
        f.write(data)
    return path
