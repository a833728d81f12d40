"""Diagnostics: every user-caused error is one message with file, line:column, field path, what and why.

The validator collects all diagnostics of a stage before failing (like Argo's validator, unlike a
first-error-wins parser), sorts them by position and reports them together, so that a user fixes a
workflow in one round trip. Internal errors are never wrapped as diagnostics: they are bugs.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

__all__ = ["SourcePos", "Diagnostic", "WorkflowError", "did_you_mean", "format_path", "excerpt", "printable",
           "shown"]

# What a terminal acts on instead of showing: C0 and C1 controls (an escape sequence can clear the screen
# or retitle the window) and the bidirectional overrides and isolates (an RTL override reverses what
# follows it, so a name reads as another). Tab and newline are kept where whole lines are printed.
_CONTROLS = "".join(chr(c) for c in [*range(0x00, 0x20), *range(0x7F, 0xA0)])
_BIDI = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
_UNPRINTABLE = re.compile("[" + re.escape(_CONTROLS + _BIDI) + "]")
_UNPRINTABLE_IN_LINES = re.compile("[" + re.escape(_CONTROLS.replace("\t", "").replace("\n", "") + _BIDI) + "]")


def _escape(m: re.Match[str]) -> str:
    c = ord(m.group())
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def printable(text: str, lines: bool = False) -> str:
    """`text` with every character a terminal would act on written as an escape (`\\x1b`, `\\u202e`), so
    that a name from a file or the command line is shown, never obeyed. `lines`: keep newlines and tabs
    (text made of whole lines); otherwise one line. Every message rose prints goes through it (the
    diagnostics' formatter, and the consoles of `rose_dsl.cli`)."""
    pattern = _UNPRINTABLE_IN_LINES if lines else _UNPRINTABLE
    return pattern.sub(_escape, text) if pattern.search(text) else text


def shown(value: object, limit: int = 80) -> str:
    """A value as a message quotes it: `repr`, cut to `limit` characters with the length said (a 5,000-digit
    number or a pasted file is not echoed whole), and printable."""
    if isinstance(value, int) and value.bit_length() > 3 * limit:
        try:
            return f"an integer of {len(str(abs(value)))} digits"
        except ValueError:  # past Python's int-to-text limit (4,300 digits)
            return f"an integer of about {int(value.bit_length() * 0.30103) + 1} digits"
    text = repr(value)
    if len(text) > limit:
        text = f"{text[:limit - 20]}... ({len(text)} characters)"
    return printable(text)


@dataclass(frozen=True, order=True, slots=True)
class SourcePos:
    """A position in a workflow file. `line` and `col` are 1-based (as editors show them)."""

    file: str
    line: int
    col: int
    # True when the value is a one-line scalar, so that a character offset inside it maps to a column.
    inline: bool = field(default=False, compare=False)

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"

    def at(self, offset: int) -> SourcePos:
        """The position of character `offset` of the scalar that starts here (exact for one-line scalars)."""
        return SourcePos(self.file, self.line, self.col + offset) if self.inline and offset else self


UNKNOWN_POS = SourcePos("<unknown>", 0, 0)


def format_path(path: Sequence[str | int]) -> str:
    """`("iteration", "body", 0, "in", "obs")` -> `iteration.body[0].in.obs`."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "<document>"


@dataclass(frozen=True)
class Diagnostic:
    """One problem in a workflow: where, which field, what was found and what was expected."""

    pos: SourcePos
    path: str
    message: str
    hint: str | None = None
    related: tuple[tuple[SourcePos, str], ...] = ()

    def sort_key(self) -> tuple:
        return (self.pos.file, self.pos.line, self.pos.col, self.path, self.message)

    def format(self, text: str | None = None) -> str:
        lines = [printable(f"{self.pos}: {self.path}: {self.message}")]
        if text is not None and self.pos.line > 0:
            lines.extend(printable(line) for line in excerpt(text, self.pos.line, self.pos.col))
        if self.hint:
            lines.append(printable(f"  hint: {self.hint}"))
        for pos, what in self.related:
            lines.append(printable(f"  {pos}: note: {what}"))
        return "\n".join(lines)


def excerpt(text: str, line: int, col: int) -> list[str]:
    """The offending source line with a caret under the column."""
    src = text.splitlines()
    if not 1 <= line <= len(src):
        return []
    body = src[line - 1]
    if len(body) > 160:
        start = max(0, col - 80)
        body, col = body[start : start + 160], col - start
    return [f"  | {body}", "  | " + " " * max(0, col - 1) + "^"]


@dataclass
class WorkflowError(Exception):
    """Raised with every diagnostic a stage found; the CLI prints them and exits 2."""

    diagnostics: list[Diagnostic] = field(default_factory=list)
    text: str | None = None
    # the text of each file the diagnostics name, when they name several (a plan checked against its
    # source): a diagnostic is shown with its own file's line, never another file's at the same number
    texts: dict[str, str] | None = None

    def __post_init__(self) -> None:
        self.diagnostics = sorted(self.diagnostics, key=Diagnostic.sort_key)
        super().__init__(self.format())

    def format(self) -> str:
        return "\n".join(d.format(self.texts.get(d.pos.file) if self.texts is not None else self.text)
                         for d in self.diagnostics)

    def __str__(self) -> str:  # dataclass would otherwise override Exception.__str__
        return self.format()


def did_you_mean(name: str, candidates: Iterable[str]) -> str | None:
    """A hint naming the closest known names, or None when nothing is close."""
    matches = difflib.get_close_matches(name, sorted(set(candidates)), n=3, cutoff=0.6)
    if not matches:
        return None
    return "did you mean " + " or ".join(f"'{m}'" for m in matches) + "?"
