"""rose's language library: text -> YAML document -> IR -> analysed graph -> transformed plan.

The public entry points are `load_workflow` (file -> checked IR) and the modules' own small APIs:
`analysis`, `render`, `serialize`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .build import build_workflow
from .errors import Diagnostic, SourcePos, WorkflowError
from .ir import Workflow
from .loader import Document, load_file, load_text
from .resolve import check_reserved_names, check_workflow

__version__ = "0.1.0"  # the one place the version is written (pyproject.toml reads it)

__all__ = ["__version__", "load_workflow", "load_workflow_text", "check", "Workflow", "WorkflowError", "Diagnostic", "SourcePos"]


def check(wf: Workflow, text: str | None = None) -> Workflow:
    """Raise WorkflowError if the IR has cross-reference problems; return it otherwise."""
    diags = check_workflow(wf)
    if not diags:  # (the dataflow is only derived from a well-formed workflow)
        from .replicas import replica_problems

        diags = replica_problems(wf)
    if diags:
        raise WorkflowError(diags, text)
    return wf


def _from_doc(doc: Document, overrides: Mapping[str, Any] | None) -> Workflow:
    wf = build_workflow(doc, overrides)
    reserved = check_reserved_names(wf)  # (a file's names: the rewrites' own IR may hold `@N` without `plan:`)
    if reserved:
        raise WorkflowError(reserved, doc.text)
    return check(wf, doc.text)


def load_workflow(path: str | Path, overrides: Mapping[str, Any] | None = None) -> Workflow:
    """Parse, schema-check, build and check a workflow file."""
    return _from_doc(load_file(path), overrides)


def load_workflow_text(text: str, file: str = "<string>", overrides: Mapping[str, Any] | None = None) -> Workflow:
    return _from_doc(load_text(text, file), overrides)
