"""A component's process fields (`env`, `python_path`, `venv`) when every component shares one process.

On Ray each component runs in a process of its own, started with its `env`, its `python_path` ahead on
PYTHONPATH and its `venv`'s interpreter, so the fields apply to it alone. The local backend runs every
component as a thread of *this* process; silently ignoring the fields (as it once did) made a workflow
that imports from its `python_path` fail there with a confusing import error. So, for a shared process:

* `venv` (another interpreter) cannot be honoured: refused, naming the component and the way out.
* `env` is set in this process for the run, and restored after it; two components asking for different
  values of one variable are refused (one process has one environment).
* `python_path` entries go ahead on this process's import path (and its PYTHONPATH, for processes the
  components start) for the run. An entry that provides a module this process already imported from
  elsewhere is refused: the import would silently keep the other copy.

Which fields a workflow may set at all is the trust policy's business (`rose_dsl/trust.py`); this
module only gives them their meaning in one process.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

from rose_dsl.ir import Workflow

__all__ = ["SharedProcessError", "enter_shared_process"]


class SharedProcessError(Exception):
    """The workflow's process fields cannot hold in one shared process; the message names each and why."""


def _provides(entry: str) -> set[str]:
    """Top-level modules and packages an import-path directory provides."""
    root = Path(entry)
    if not root.is_dir():
        return set()
    names = set()
    for p in root.iterdir():
        if p.is_dir() and (p / "__init__.py").exists():
            names.add(p.name)
        elif p.suffix in (".py", ".so", ".pyd") and p.name.split(".")[0].isidentifier():
            names.add(p.name.split(".")[0])
    return names


def _shadowed(entry: str) -> list[str]:
    """Modules `entry` provides that this process already imported from somewhere else."""
    inside = os.path.realpath(entry) + os.sep
    out = []
    for name in sorted(_provides(entry)):
        module = sys.modules.get(name)
        where = getattr(module, "__file__", None) if module is not None else None
        if where and not os.path.realpath(where).startswith(inside):
            out.append(f"{name} (already imported from {os.path.dirname(where)})")
    return out


def enter_shared_process(wf: Workflow) -> Callable[[], None]:
    """Apply every component's `env` and `python_path` to this process; return the function that undoes
    it (idempotent). Raises SharedProcessError, changing nothing, when they cannot hold together."""
    problems: list[str] = []
    env: dict[str, tuple[str, str]] = {}  # variable -> (value, component that set it)
    paths: list[str] = []
    for c in wf.components.values():
        if c.venv is not None:
            problems.append(f"component '{c.name}' runs in its own interpreter (venv: {c.venv}), which needs a process "
                            "of its own: use --backend ray")
        for name, value in c.env.items():
            if name in env and env[name][0] != value:
                problems.append(f"components '{env[name][1]}' and '{c.name}' set {name} to different values "
                                f"({env[name][0]!r}, {value!r}), and the local backend runs both in one process: "
                                "use --backend ray")
            env.setdefault(name, (value, c.name))
        for entry in c.python_path:
            absolute = os.path.abspath(entry)
            for clash in _shadowed(absolute):
                problems.append(f"component '{c.name}': python_path {entry} provides {clash}; in one process the "
                                "import would keep that copy: use --backend ray")
            if absolute not in paths:
                paths.append(absolute)
    if problems:
        raise SharedProcessError("; ".join(problems))
    saved_env = {name: os.environ.get(name) for name in [*env, "PYTHONPATH"]}
    saved_path = list(sys.path)
    for name, (value, _) in env.items():
        os.environ[name] = value
    if paths:
        sys.path[:0] = [p for p in paths if p not in sys.path]
        old = os.environ.get("PYTHONPATH", "")
        os.environ["PYTHONPATH"] = os.pathsep.join([*paths, *([old] if old else [])])
    done = False

    def restore() -> None:
        nonlocal done
        if done:
            return
        done = True
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        sys.path[:] = [p for p in sys.path if p in saved_path or p not in paths]

    return restore
