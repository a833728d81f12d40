"""What a rewrite gives back: the new workflow and where each original call went (`Rewritten`), or why
it does not apply (`Refused`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ..errors import SourcePos
from ..ir import Workflow

__all__ = ["Refused", "Rewritten", "Locate", "identity_locate", "compose"]

Path = tuple[str, ...]
# Where an invocation of the original workflow (path, loop indices) is computed in the rewritten one;
# None for calls that exist once per group (phases of a split node, items nested in a split body).
Locate = Callable[[Path, tuple[int, ...]], tuple[Path, tuple[int, ...]] | None]


class Refused(Exception):
    """A rewrite that would change what training computes, or that does not apply. `reason` names the
    dependency or the property that forbids it, after the position (`at`) of the item or field at fault
    in the workflow the rewrite was asked of -- items a rewrite copies keep their positions, so this is a
    line of the user's file even several rewrites later. `internal` marks a refusal caused by a bug in
    rose (the rewrite could not be built or checked): still a clean refusal, so that a search moves on."""

    def __init__(self, reason: str, *, internal: bool = False, at: SourcePos | None = None) -> None:
        at = at if at is not None and at.line > 0 else None
        if at is not None:
            reason = f"{at}: {reason}"
        super().__init__(reason)
        self.reason = reason
        self.at = at
        self.internal = internal


@dataclass(frozen=True)
class Rewritten:
    workflow: Workflow
    locate: Locate
    description: str
    notes: tuple[str, ...] = field(default=())


def identity_locate(path: Path, indices: tuple[int, ...]) -> tuple[Path, tuple[int, ...]]:
    return path, indices


def compose(first: Rewritten, second: Rewritten) -> Rewritten:
    """`second` applied to `first.workflow`, as one rewrite of `first`'s input."""
    def locate(path: Path, idx: tuple[int, ...]):
        loc = first.locate(path, idx)
        return None if loc is None else second.locate(*loc)

    return Rewritten(second.workflow, locate, f"{first.description}; {second.description}", first.notes + second.notes)
