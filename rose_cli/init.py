"""`rose init DIR`: a starter workflow and the example components it imports, written into DIR.

Why: the shipped workflows call components of the repository's `examples` package, which a wheel does not
install as such (a generic top-level name that would collide with a user's own `examples`, the package
every RL project seems to have). The wheel carries them as data instead (`rose_cli/starter/` links to
`examples/` and `workflows/` in the source tree, as `rose_dsl/schemas/` links to `schema/`; the wheel
holds copies), and this command writes one workflow and the `examples` subpackages its components come
from into a directory of the user's: `cd DIR && rose execute workflow.yaml` then works, because rose puts
the working directory on the components' import path and `examples.` is the default allowed prefix. The
user owns the copies: editing them is the way to start a project of one's own.
"""

from __future__ import annotations

import os
import re
import shutil
from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Annotated, Any

import typer

from rose_dsl.cli import ExitCode, err, out
from rose_dsl.errors import did_you_mean

__all__ = ["init", "register", "STARTER", "DEFAULT_WORKFLOW", "starter_workflows", "files_for", "describe"]

DEFAULT_WORKFLOW = "embodied_ppo"  # the README's first run: Reacher learns in a few minutes on two cores
WORKFLOW_FILE = "workflow.yaml"
STARTER = "starter"  # rose_cli/starter/: examples/ and workflows/ (links in the source tree, copies in the wheel)


def _starter() -> Traversable:
    return files("rose_cli").joinpath(STARTER)


def starter_workflows() -> dict[str, Traversable]:
    """The shipped workflows by name (file stem)."""
    return {f.name.removesuffix(".yaml"): f for f in _starter().joinpath("workflows").iterdir()
            if f.name.endswith(".yaml")}


def describe(text: str, width: int = 100) -> str:
    """A workflow's one-line description: its `description:` field, else the first sentence of its opening
    comment, cut to `width` characters."""
    field = re.search(r"^description:\s*(.+)$", text, re.MULTILINE)
    if field:
        line = field.group(1).strip().strip("\"'")
    else:
        comment = []
        for raw in text.splitlines():
            if not raw.startswith("#"):
                break
            comment.append(raw.lstrip("#").strip())
        words = " ".join(c for c in comment if c) + " "
        depth, end = 0, len(words)
        for i, ch in enumerate(words[:-1]):  # the first sentence: up to a '.' or ':' outside parentheses
            depth += (ch == "(") - (ch == ")")
            if ch in ".:" and depth <= 0 and words[i + 1] == " ":
                end = i
                break
        line = words[:end].strip()
    return line if len(line) <= width else line[: width - 1].rstrip() + "…"


def files_for(workflow_text: str) -> dict[str, Traversable]:
    """The component files a workflow needs, by path relative to DIR: `examples/__init__.py` and every file
    of each `examples` subpackage its `impl:`s name (a subpackage's modules import each other)."""
    from rose_dsl import load_workflow_text

    wf = load_workflow_text(workflow_text, WORKFLOW_FILE)
    root = _starter().joinpath("examples")
    wanted: dict[str, Traversable] = {"examples/__init__.py": root.joinpath("__init__.py")}
    for comp in wf.components.values():
        parts = comp.impl.partition(":")[0].split(".")
        if parts[0] != "examples" or len(parts) < 2:
            continue
        package = root.joinpath(parts[1])
        if not package.is_dir():
            continue
        for f in package.iterdir():
            if f.is_file() and f.name.endswith((".py", ".md")):
                wanted[f"examples/{parts[1]}/{f.name}"] = f
    return wanted


def init(
    directory: Annotated[Path | None, typer.Argument(help="where to write the workflow and its components (made if "
                                                          "missing)", file_okay=False, show_default=False)] = None,
    workflow: Annotated[str, typer.Option("--workflow", "-w", help="which shipped workflow (see --list)")]
        = DEFAULT_WORKFLOW,
    list_: Annotated[bool, typer.Option("--list", help="list the shipped workflows and exit")] = False,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="replace files an earlier rose init wrote there")]
        = False,
) -> None:
    """Write a starter workflow (DIR/workflow.yaml) and the example components it imports (DIR/examples/)."""
    shipped = starter_workflows()
    if list_:
        width = max(map(len, shipped))
        out.print("\n".join(f"{name:<{width}}  {describe(shipped[name].read_text())}" for name in sorted(shipped)),
                  markup=False)
        return
    if directory is None:
        err.print("error: missing DIR: `rose init DIR [--workflow NAME]` writes into DIR (`rose init --list` names "
                  "the workflows)", markup=False)
        raise typer.Exit(ExitCode.INVALID)
    source = shipped.get(workflow.removesuffix(".yaml"))
    if source is None:
        hint = did_you_mean(workflow, shipped) or f"the shipped workflows: {', '.join(sorted(shipped))}"
        err.print(f"error: --workflow {workflow}: no such shipped workflow ({hint})", markup=False)
        raise typer.Exit(ExitCode.INVALID)
    text = source.read_text()
    wanted = {WORKFLOW_FILE: source, **files_for(text)}
    there = [rel for rel in wanted if (directory / rel).exists()]
    if there and not overwrite:
        shown = ", ".join(there[:4]) + (f" and {len(there) - 4} more" if len(there) > 4 else "")
        err.print(f"error: {directory} already holds {shown}; choose another directory, or replace them with "
                  "--overwrite", markup=False)
        raise typer.Exit(ExitCode.INVALID)
    try:
        for rel, f in wanted.items():
            target = directory / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.parent.is_symlink():
                raise OSError(0, f"{target.parent} is a symbolic link; rose init writes nothing through a link")
            with f.open("rb") as src, _open_new(target) as dst:
                shutil.copyfileobj(src, dst)
    except OSError as exc:
        err.print(f"error: cannot write into {directory}: {exc.strerror or exc}", markup=False)
        raise typer.Exit(ExitCode.INVALID) from None
    out.print(f"wrote {directory / WORKFLOW_FILE} (the shipped '{workflow.removesuffix('.yaml')}') and "
              f"{len(wanted) - 1} component files under {directory / 'examples'}", markup=False)
    out.print(f"next: cd {directory} && rose validate --import {WORKFLOW_FILE} && rose execute {WORKFLOW_FILE} "
              "--out runs/first  (--out keeps the checkpoints, metrics and the trained state)", markup=False)


def _open_new(target: Path) -> Any:
    """`target` for writing, replacing a file but never writing through a link (`--overwrite` of a DIR
    whose workflow.yaml links elsewhere wrote into the file it pointed at, issue 59)."""
    if target.is_symlink():
        raise OSError(0, f"{target} is a symbolic link; rose init writes nothing through a link: remove it first")
    try:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise OSError(exc.errno, f"{target}: {exc.strerror}") from None
    return os.fdopen(fd, "wb")


def register(app: typer.Typer) -> None:
    app.command()(init)
