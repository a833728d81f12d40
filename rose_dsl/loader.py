"""Text -> YAML document with source positions, from the events of PyYAML's (libyaml's) parser.

We build the data ourselves from parser events (never `yaml.load`) so that every value keeps its line
and column, duplicate keys are errors instead of silently last-wins, and anchors/aliases cannot expand
into a huge document (billion laughs): the expanded node count and nesting depth are bounded. Scalars
are typed by PyYAML's safe resolver and constructor, so the data is what `yaml.safe_load` gives.

Why events and not PyYAML's composed node graph: for a 10,000-node workflow the graph (a node and two
marks per value, all alive at once) cost four times the parse, mostly in the cyclic garbage collector
scanning it; events are dropped as soon as they are read. Errors come in the order the composer gave
them: a syntax or composition error anywhere in the file wins over a building error (duplicate key,
limits), which is reported only once the rest of the stream has been read.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from yaml.composer import ComposerError
from yaml.constructor import SafeConstructor
from yaml.events import (
    AliasEvent,
    CollectionEndEvent,
    CollectionStartEvent,
    DocumentStartEvent,
    MappingEndEvent,
    MappingStartEvent,
    ScalarEvent,
    SequenceEndEvent,
    SequenceStartEvent,
    StreamEndEvent,
)

from .bulk import in_bulk
from .errors import Diagnostic, SourcePos, WorkflowError, shown

__all__ = ["Document", "FieldPositions", "Limits", "load_file", "load_text", "load_value", "Path_"]

Path_ = tuple[str | int, ...]


MAX_INT_DIGITS = 18  # every integer rose takes fits 62 bits (`expr.MAX_INT`); Python refuses 4,300+ digits


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
        p = path if type(path) is tuple else tuple(path)
        hit = self.positions.get(p)
        if hit is not None:
            return SourcePos(self.file, *hit)
        while p:
            if p in self.positions:
                return SourcePos(self.file, *self.positions[p])
            p = p[:-1]
        if () in self.positions:
            return SourcePos(self.file, *self.positions[()])
        return SourcePos(self.file, 1, 1)

    def pos_tuple(self, path: Path_) -> tuple[int, int, bool]:
        """`pos` as (line, col, inline), without making a SourcePos."""
        hit = self.positions.get(path)
        if hit is not None:
            return hit
        p = self.pos(path)
        return (p.line, p.col, p.inline)

    def key_pos(self, path: Path_) -> SourcePos:
        at = self.key_positions.get(path if type(path) is tuple else tuple(path))
        return SourcePos(self.file, *at) if at else self.pos(path)



class FieldPositions(dict):
    """Field -> SourcePos of one IR item ("in.obs" -> where its expression is), made on demand.

    Only diagnostics read them, yet building them eagerly was a third of building a 10,000-node
    workflow (a frozen SourcePos costs 2 us); this stores the loader's (line, col, inline) and makes the
    SourcePos when asked."""

    __slots__ = ("file",)

    def __init__(self, file: str, raw: dict[str, tuple[int, int, bool]] | None = None) -> None:
        super().__init__(raw or {})
        self.file = file

    def __setitem__(self, key: str, value: SourcePos | tuple[int, int, bool]) -> None:
        if isinstance(value, SourcePos):
            value = (value.line, value.col, value.inline)
        dict.__setitem__(self, key, value)

    def __getitem__(self, key: str) -> SourcePos:
        return SourcePos(self.file, *dict.__getitem__(self, key))

    def get(self, key: str, default: Any = None) -> Any:
        hit = dict.get(self, key)
        return default if hit is None else SourcePos(self.file, *hit)

    def values(self) -> Any:
        return [self[k] for k in self]

    def items(self) -> Any:
        return [(k, self[k]) for k in self]

    def __repr__(self) -> str:
        return f"FieldPositions({dict(self.items())!r})"

    def __reduce__(self) -> Any:
        return (FieldPositions, (self.file, dict(dict.items(self))))


# libyaml's parser when PyYAML was built with it (about 10x faster); the same events either way.
_BaseLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _SafeLoader(_BaseLoader):  # type: ignore[misc, valid-type]
    """PyYAML's safe loader, with YAML 1.2's floats: `1e-4` is a number (YAML 1.1 wants `1.0e-4`, and
    read `lr: 1e-4` or `--set lr=1e-4` as a string, which a number param then refused)."""


_SafeLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+.0123456789"))
_STR = "tag:yaml.org,2002:str"
_MERGE = "tag:yaml.org,2002:merge"
_SEQ = "tag:yaml.org,2002:seq"
_MAP = "tag:yaml.org,2002:map"
_INLINE_STYLES = (None, "", "'", '"')
_NODE_EVENTS = (ScalarEvent, MappingStartEvent, SequenceStartEvent, AliasEvent)
# PyYAML's events as the C parser makes them: the stubs type their marks as optional and the base class
# without the attributes each kind has; here every event comes from the parser, marks included.
Event = Any


def _mark(file: str, mark: Any) -> SourcePos:
    return SourcePos(file, mark.line + 1, mark.column + 1)


class _BuildError(Exception):
    """A fault found while building (duplicate key, limits, a scalar no constructor takes)."""

    def __init__(self, error: WorkflowError) -> None:
        super().__init__(str(error))
        self.error = error


class _Events:
    """The parser's event stream with the composer's checks (one document, an alias names an earlier
    anchor, no anchor twice), keeping the events of every anchored node for the aliases to replay."""

    def __init__(self, loader: Any) -> None:
        self._get = loader.get_event
        # anchor -> (its node's first event, all its events; None while the node is still being read)
        self.anchors: dict[str, tuple[Event, list[Event] | None]] = {}
        self._open: list[tuple[str, list[Event], list[int]]] = []  # anchored nodes being read: events, depth
        self._record = True

    def next(self) -> Event:
        ev = self._get()
        if self._open:
            self._keep(ev)
        kind = type(ev)
        if kind not in _NODE_EVENTS or ev.anchor is None:
            return ev
        anchor = ev.anchor
        if kind is AliasEvent:
            if anchor not in self.anchors:
                raise ComposerError(None, None, "found undefined alias", ev.start_mark)
        elif anchor in self.anchors:
            raise ComposerError("found duplicate anchor; first occurrence", self.anchors[anchor][0].start_mark,
                                "second occurrence", ev.start_mark)
        elif kind is ScalarEvent or not self._record:
            self.anchors[anchor] = (ev, [ev])
        else:
            self.anchors[anchor] = (ev, None)
            self._open.append((anchor, [ev], [1]))
        return ev

    def target(self, alias: Event) -> tuple[Event, list[Event] | None]:
        """The anchored node an alias names: its first event, and all its events once read."""
        hit = self.anchors.get(alias.anchor)
        if hit is None:
            raise ComposerError(None, None, "found undefined alias", alias.start_mark)
        return hit

    def _keep(self, ev: Event) -> None:
        step = 1 if isinstance(ev, CollectionStartEvent) else -1 if isinstance(ev, CollectionEndEvent) else 0
        for entry in list(self._open):
            name, events, depth = entry
            events.append(ev)
            depth[0] += step
            if depth[0] == 0:
                self._open.remove(entry)
                self.anchors[name] = (events[0], events)

    def drain(self, root: Event) -> None:
        """Read the rest of the stream, raising its syntax or composition error if it has one."""
        self._record = False
        self._open.clear()
        while True:
            ev: Event = self.next()
            if isinstance(ev, StreamEndEvent):
                return
            if isinstance(ev, DocumentStartEvent):
                second: Any = ev.start_mark
                raise ComposerError("expected a single document in the stream", root.start_mark,
                                    "but found another document", second)


class _Builder:
    """Plain data and the position of every value and key, from parser events in document order."""

    def __init__(self, file: str, limits: Limits, events: _Events, resolve: Callable[..., str]) -> None:
        self.file = file
        self.limits = limits
        self.max_depth = limits.max_depth
        self.events = events
        self.nodes = 0
        self.doc_positions: dict[Path_, tuple[int, int, bool]] = {}
        self.key_positions: dict[Path_, tuple[int, int, bool]] = {}
        self.constructor = SafeConstructor()
        self._resolve = resolve
        self._tags: dict[tuple[str, tuple[bool, bool]], str] = {}  # the implicit tags of plain scalars, cached
        resolvers = _SafeLoader.yaml_implicit_resolvers  # first character -> [(tag, regexp)]
        # a plain scalar whose first character starts no resolver is a string (unless one matches anything)
        self._resolved_first = frozenset(resolvers) if None not in resolvers else None

    def fail(self, mark: Any, path: Path_, message: str, hint: str | None = None) -> _BuildError:
        from .errors import format_path

        return _BuildError(WorkflowError([Diagnostic(_mark(self.file, mark), format_path(path), message, hint)]))

    def build(self, ev: Event, path: Path_, nxt: Callable[[], Event]) -> Any:
        """The value whose first event is `ev` (the next ones come from `nxt`), at `path`."""
        replay: list[Event] | None = None
        alias = type(ev) is AliasEvent
        if alias:  # the anchored node once more: its events again
            ev, replay = self.events.target(ev)
        self.nodes += 1
        if self.nodes > self.limits.max_nodes:
            raise self.fail(
                ev.start_mark,
                path,
                f"the document expands to more than {self.limits.max_nodes} YAML nodes",
                "anchors/aliases that multiply content are refused; write the workflow out",
            )
        if len(path) > self.max_depth:
            raise self.fail(ev.start_mark, path, f"nesting deeper than {self.max_depth} levels")
        if alias:
            if replay is None:
                raise self.fail(ev.start_mark, path, "recursive YAML alias (a node that contains itself)")
            nxt = iter(replay[1:]).__next__
        kind = type(ev)
        m = ev.start_mark
        if kind is ScalarEvent:
            style = ev.style
            inline = m.line == ev.end_mark.line and style in _INLINE_STYLES
            # Quoted scalars: point at the first character inside the quotes.
            self.doc_positions[path] = (m.line + 1, m.column + (2 if style in ("'", '"') else 1), inline)
            return ev.value if self.is_string(ev) else self.scalar(ev, self.tag(ev))
        self.doc_positions[path] = (m.line + 1, m.column + 1, False)
        tag = ev.tag
        if tag is not None and tag != "!" and tag != (_SEQ if kind is SequenceStartEvent else _MAP):
            raise self.fail(m, path, f"not valid YAML: unknown tag {tag!r} on a "
                            f"{'list' if kind is SequenceStartEvent else 'mapping'}")
        if kind is SequenceStartEvent:
            out: list[Any] = []
            while type(item := nxt()) is not SequenceEndEvent:
                out.append(self.build(item, path + (len(out),), nxt))
            return out
        return self.mapping(path, nxt)

    def mapping(self, path: Path_, nxt: Callable[[], Event]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        while type(key_ev := nxt()) is not MappingEndEvent:
            if type(key_ev) is AliasEvent:
                key_ev = self.events.target(key_ev)[0]
            if type(key_ev) is not ScalarEvent:
                raise self.fail(key_ev.start_mark, path, "mapping keys must be plain strings")
            if self.is_string(key_ev):
                key = key_ev.value
            else:
                tag = self.tag(key_ev)
                if tag == _MERGE:
                    raise self.fail(key_ev.start_mark, path, "YAML merge keys ('<<') are not supported", "write the keys out")
                key = self.scalar(key_ev, tag)
                if not isinstance(key, str):
                    key = str(key)
            at = path + (key,)
            if key in out:
                raise self.fail(key_ev.start_mark, at, f"duplicate key '{key}'")
            km: Any = key_ev.start_mark
            self.key_positions[at] = (km.line + 1, km.column + 1, False)
            out[key] = self.build(nxt(), at, nxt)
        return out

    def is_string(self, ev: Event) -> bool:
        """Whether a scalar is a string without asking the resolver (most are): no tag, and quoted or
        starting with a character that starts no implicit resolver."""
        if ev.tag is not None:
            return ev.tag == _STR
        first = self._resolved_first
        return not ev.implicit[0] or (first is not None and ev.value != "" and ev.value[0] not in first)

    def tag(self, ev: Event) -> str:
        """The scalar's tag: explicit, or resolved from a plain scalar's text as PyYAML's composer does."""
        tag = ev.tag
        if tag is None or tag == "!":
            key = (ev.value, ev.implicit)
            tag = self._tags.get(key)
            if tag is None:
                tag = self._tags[key] = self._resolve(yaml.ScalarNode, ev.value, ev.implicit)
        return tag

    def scalar(self, ev: Event, tag: str) -> Any:
        if tag == _STR:
            return ev.value
        node = yaml.ScalarNode(tag, ev.value, ev.start_mark, ev.end_mark, ev.style)
        make = self.constructor.yaml_constructors.get(tag)
        try:
            return make(self.constructor, node) if make is not None else self.constructor.construct_object(node, deep=True)
        except yaml.YAMLError as exc:  # at the value (it was 1:1, the position only inside the text)
            problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
            if "constructor for the tag" in problem:
                problem = f"YAML tags are not supported ({tag!r})"
            raise self.fail(ev.start_mark, (), f"not valid YAML: {problem}") from None
        except Exception:  # noqa: BLE001 - PyYAML's constructors fail on some text (`!!int ''`: IndexError)
            what = tag.rsplit(":", 1)[-1]
            digits = sum(c.isdigit() for c in ev.value)
            if what == "int" and digits > MAX_INT_DIGITS:  # past Python's int-from-text limit (4,300)
                raise self.fail(ev.start_mark, (), f"an integer of {digits} digits is too large") from None
            raise self.fail(ev.start_mark, (), f"not valid YAML: {shown(ev.value)} is not a valid {what}") from None


def _read(file: str, text: str, limits: Limits, loader: Any) -> Document:
    """The one document of the stream. Raises WorkflowError, or yaml's error for bad syntax."""
    top = SourcePos(file, 1, 1)
    events = _Events(loader)
    events.next()  # the start of the stream
    if isinstance(events.next(), StreamEndEvent):
        raise WorkflowError([Diagnostic(top, "<document>", "the file holds no YAML document")])
    root = events.next()
    builder = _Builder(file, limits, events, loader.resolve)
    # Without '&' in the text there is no anchor to record: read the parser's events directly (an alias
    # can then only be undefined, which the builder reports).
    failure: WorkflowError | None = None
    try:
        data = builder.build(root, (), events.next if "&" in text else loader.get_event)
    except _BuildError as exc:
        failure = exc.error
    except RecursionError:
        failure = WorkflowError([Diagnostic(top, "<document>", "document nested too deeply")])
    if failure is not None:
        # a syntax or composition error later in the file is reported first, as the composer did
        events.drain(root)
        raise failure
    events.next()  # the end of the document
    ev = events.next()
    if not isinstance(ev, StreamEndEvent):
        raise ComposerError("expected a single document in the stream", root.start_mark, "but found another document",
                            ev.start_mark)
    return Document(file, "", data, builder.doc_positions, builder.key_positions)


@in_bulk
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
            doc = _read(file, text, limits, loader)
        finally:
            loader.dispose()
    except WorkflowError as exc:
        exc.text = text
        raise
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        pos = _mark(file, mark) if mark is not None else top
        what = exc.problem or exc.context or "invalid YAML"
        # where the parser was when it gave up is often lines after the mistake: the bracket or quote it was
        # inside is where the user looks (an unclosed `[` on line 59 was reported on line 60 alone)
        related: tuple[tuple[SourcePos, str], ...] = ()
        if exc.problem and exc.context and exc.context_mark is not None and exc.context_mark is not mark:
            related = ((_mark(file, exc.context_mark), f"{exc.context} here"),)
        raise WorkflowError([Diagnostic(pos, "<document>", f"not valid YAML: {what}", related=related)], text) from None
    except yaml.YAMLError as exc:
        what = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise WorkflowError([Diagnostic(top, "<document>", f"not valid YAML: {what}")], text) from None
    doc.text = text
    return doc


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


# what a command-line value may hold: what JSON holds (a YAML tag's timestamp, bytes or set is refused)
_PLAIN = (str, int, float, bool, type(None))


def load_value(text: str, where: str) -> Any:
    """A value given on the command line (`--set NAME=VALUE`, a `--layout` value), read as a workflow's
    values are (this loader: safe, bounded, YAML 1.2's floats), or ValueError with one line saying why.
    `where` names the option in the message (`--set num_envs`)."""
    try:
        value = load_text(text, where).data
    except WorkflowError as exc:
        d = exc.diagnostics[0]
        at = f" (at character {d.pos.col})" if d.pos.line == 1 and d.pos.col > 1 else ""
        raise ValueError(f"{where}={shown(text, 40)}: {d.message}{at}") from None

    def check(v: Any) -> None:
        if isinstance(v, list):
            for x in v:
                check(x)
        elif isinstance(v, dict):
            for x in v.values():
                check(x)
        elif not isinstance(v, _PLAIN):
            raise ValueError(f"{where}={shown(text, 40)}: YAML tags are not supported here ({type(v).__name__})")

    check(value)
    return value
