"""Text -> YAML document with source positions, through PyYAML's *safe* composer.

We compose the node graph ourselves (never `yaml.load`) so that every value keeps its line and
column, duplicate keys are errors instead of silently last-wins, and anchors/aliases cannot expand
into a huge document (billion laughs): the expanded node count and nesting depth are bounded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from yaml.constructor import SafeConstructor

from .errors import Diagnostic, SourcePos, WorkflowError

__all__ = ["Document", "Limits", "load_file", "load_text", "Path_"]

Path_ = tuple[str | int, ...]


@dataclass(frozen=True)
class Limits:
    """Bounds that keep a hostile or broken file from exhausting memory or time."""

    max_bytes: int = 4 * 1024 * 1024
    max_nodes: int = 200_000  # after alias expansion
    max_depth: int = 64


@dataclass
class Document:
    """A parsed workflow file: plain data plus where each value (and each mapping key) came from."""

    file: str
    text: str
    data: Any
    # (line, col, one-line scalar) per value and per mapping key; SourcePos objects are made on demand
    positions: dict[Path_, tuple[int, int, bool]] = field(default_factory=dict)
    key_positions: dict[Path_, tuple[int, int, bool]] = field(default_factory=dict)

    def pos(self, path: Path_) -> SourcePos:
        """The position of the value at `path`, or of its nearest ancestor that has one."""
        p = tuple(path)
        while p:
            if p in self.positions:
                return SourcePos(self.file, *self.positions[p])
            p = p[:-1]
        if () in self.positions:
            return SourcePos(self.file, *self.positions[()])
        return SourcePos(self.file, 1, 1)

    def key_pos(self, path: Path_) -> SourcePos:
        at = self.key_positions.get(tuple(path))
        return SourcePos(self.file, *at) if at else self.pos(path)



# libyaml's parser when PyYAML was built with it (about 10x faster); same safe constructor either way,
# and we only ask it for the node graph.
_SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _mark(file: str, mark: yaml.Mark) -> SourcePos:
    return SourcePos(file, mark.line + 1, mark.column + 1)


class _Builder:
    def __init__(self, file: str, limits: Limits) -> None:
        self.file = file
        self.limits = limits
        self.nodes = 0
        self.doc_positions: dict[Path_, tuple[int, int, bool]] = {}
        self.key_positions: dict[Path_, tuple[int, int, bool]] = {}
        self.constructor = SafeConstructor()
        self.scalar = self.constructor.yaml_constructors

    def fail(self, node: yaml.Node, path: Path_, message: str, hint: str | None = None) -> WorkflowError:
        from .errors import format_path

        return WorkflowError([Diagnostic(_mark(self.file, node.start_mark), format_path(path), message, hint)])

    def build(self, node: yaml.Node, path: Path_, active: frozenset[int]) -> Any:
        self.nodes += 1
        if self.nodes > self.limits.max_nodes:
            raise self.fail(
                node,
                path,
                f"the document expands to more than {self.limits.max_nodes} YAML nodes",
                "anchors/aliases that multiply content are refused; write the workflow out",
            )
        if len(path) > self.limits.max_depth:
            raise self.fail(node, path, f"nesting deeper than {self.limits.max_depth} levels")
        if id(node) in active:
            raise self.fail(node, path, "recursive YAML alias (a node that contains itself)")
        m = node.start_mark
        if isinstance(node, yaml.ScalarNode):
            inline = m.line == node.end_mark.line and node.style in (None, "", "'", '"')
            # Quoted scalars: point at the first character inside the quotes.
            shift = 2 if node.style in ("'", '"') else 1
            self.doc_positions[path] = (m.line + 1, m.column + shift, inline)
            make = self.scalar.get(node.tag)
            return make(self.constructor, node) if make is not None else self.constructor.construct_object(node, deep=True)
        self.doc_positions[path] = (m.line + 1, m.column + 1, False)
        inner = active | {id(node)}
        if isinstance(node, yaml.SequenceNode):
            return [self.build(child, path + (i,), inner) for i, child in enumerate(node.value)]
        if isinstance(node, yaml.MappingNode):
            out: dict[Any, Any] = {}
            for key_node, value_node in node.value:
                if not isinstance(key_node, yaml.ScalarNode):
                    raise self.fail(key_node, path, "mapping keys must be plain strings")
                if key_node.tag == "tag:yaml.org,2002:merge":
                    raise self.fail(key_node, path, "YAML merge keys ('<<') are not supported", "write the keys out")
                make = self.scalar.get(key_node.tag)
                key = make(self.constructor, key_node) if make else self.constructor.construct_object(key_node, deep=True)
                if not isinstance(key, str):
                    key = str(key)
                if key in out:
                    raise self.fail(key_node, path + (key,), f"duplicate key '{key}'")
                km = key_node.start_mark
                self.key_positions[path + (key,)] = (km.line + 1, km.column + 1, False)
                out[key] = self.build(value_node, path + (key,), inner)
            return out
        raise self.fail(node, path, f"unsupported YAML node {type(node).__name__}")


def load_text(text: str, file: str = "<string>", limits: Limits = Limits()) -> Document:
    """Parse YAML text into a Document or raise WorkflowError with one positioned message."""
    top = SourcePos(file, 1, 1)
    if len(text.encode("utf-8", errors="replace")) > limits.max_bytes:
        raise WorkflowError(
            [Diagnostic(top, "<document>", f"file is larger than {limits.max_bytes // (1024 * 1024)} MiB",
                        "a workflow describes one RL iteration; this is not one")]
        )
    if not text.strip():
        raise WorkflowError([Diagnostic(top, "<document>", "the file is empty", "start with 'rose: 1'")])
    try:
        loader = _SafeLoader(text)
        try:
            node = loader.get_single_node()
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        pos = _mark(file, mark) if mark is not None else top
        what = exc.problem or exc.context or "invalid YAML"
        raise WorkflowError([Diagnostic(pos, "<document>", f"not valid YAML: {what}")], text) from None
    except yaml.YAMLError as exc:
        raise WorkflowError([Diagnostic(top, "<document>", f"not valid YAML: {exc}")], text) from None
    if node is None:
        raise WorkflowError([Diagnostic(top, "<document>", "the file holds no YAML document")], text)
    builder = _Builder(file, limits)
    try:
        data = builder.build(node, (), frozenset())
    except WorkflowError as exc:
        exc.text = text
        raise
    except RecursionError:
        raise WorkflowError([Diagnostic(top, "<document>", "document nested too deeply")], text) from None
    except yaml.YAMLError as exc:
        raise WorkflowError([Diagnostic(top, "<document>", f"not valid YAML: {exc}")], text) from None
    return Document(file, text, data, builder.doc_positions, builder.key_positions)


def load_file(path: str | Path, limits: Limits = Limits()) -> Document:
    p = Path(path)
    name = str(path)
    try:
        size = p.stat().st_size
        if size > limits.max_bytes:
            raise WorkflowError([Diagnostic(SourcePos(name, 1, 1), "<document>",
                                            f"file is {size / 1e6:.1f} MB, larger than the "
                                            f"{limits.max_bytes // (1024 * 1024)} MiB limit")])
        raw = p.read_bytes()
    except FileNotFoundError:
        raise WorkflowError([Diagnostic(SourcePos(name, 0, 0), "<document>", "no such file")]) from None
    except IsADirectoryError:
        raise WorkflowError([Diagnostic(SourcePos(name, 0, 0), "<document>", "is a directory, not a file")]) from None
    except OSError as exc:
        raise WorkflowError([Diagnostic(SourcePos(name, 0, 0), "<document>", f"cannot read: {exc.strerror}")]) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise WorkflowError([Diagnostic(SourcePos(name, 1, 1), "<document>",
                                        f"not UTF-8 text (byte {exc.start})")]) from None
    return load_text(text, name, limits)
