"""The analysed graph as Graphviz DOT or Mermaid: loops and phases as nested clusters, data edges
solid, state edges dashed (ordering-only state edges dotted and grey), each labelled with its reason."""

from __future__ import annotations

from .analysis import Analysis
from .ir import ExecutionNode, Item, LoopNode, MergeNode

__all__ = ["to_dot", "to_mermaid"]


def _id(path: tuple[str, ...]) -> str:
    return "n_" + "__".join(p.replace("@", "_g") for p in path)


def _loop_label(a: Analysis, loop: LoopNode) -> str:
    kind = a.loops[loop.path].kind
    count = f"×{loop.count}" if loop.count is not None else "until"
    return f"loop {loop.name} ({kind}, {count})"


def _esc(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


def _label(*lines: str) -> str:
    """A DOT label of several lines: each line escaped, joined by DOT's own line break (escaping the
    joined text instead would turn the break into a literal backslash-n)."""
    return "\\n".join(_esc(line) for line in lines)


def to_dot(a: Analysis) -> str:
    lines = ["digraph rose {", "  rankdir=TB;", '  node [shape=box, style="rounded,filled", fillcolor="#f5f5f5", fontname="Helvetica"];',
             '  edge [fontname="Helvetica", fontsize=9];', '  compound=true;']

    def emit(item: Item, indent: str) -> None:
        if isinstance(item, LoopNode):
            lines.append(f"{indent}subgraph cluster_{_id(item.path)} {{")
            lines.append(f'{indent}  label="{_esc(_loop_label(a, item))}"; style=rounded; color="#7a7a7a";')
            for child in item.body:
                emit(child, indent + "  ")
            lines.append(f"{indent}}}")
        elif isinstance(item, ExecutionNode) and item.phases:
            lines.append(f"{indent}subgraph cluster_{_id(item.path)} {{")
            lines.append(f'{indent}  label="{_esc(item.name)} = {_esc(item.call)} (phases)"; style=dashed; color="#9a9aca";')
            lines.append(f'{indent}  {_id(item.path)} [label="{_label(item.name, item.call)}", fillcolor="#e8e8ff"];')
            for child in item.phases:
                emit(child, indent + "  ")
            lines.append(f"{indent}}}")
        elif isinstance(item, ExecutionNode):
            effects = ", ".join(f"{e.key.name}:{e.access.value}" for e in item.effects)
            label = _label(item.name, item.call, *([f"[{effects}]"] if effects else []))
            lines.append(f'{indent}{_id(item.path)} [label="{label}"];')
        elif isinstance(item, MergeNode):
            lines.append(f'{indent}{_id(item.path)} [label="merge {_esc(item.name)}", shape=invtrapezium];')

    for child in a.workflow.root.body:
        emit(child, "  ")
    for e in a.edges:
        label = _label(e.detail, *([e.relation] if e.relation != "same iteration" else []))
        if e.kind == "data":
            style = 'color="#1f4e9c"'
        elif e.flow:
            style = 'style=dashed, color="#b5473a"'
        else:
            style = 'style=dotted, color="#999999"'
        lines.append(f'  {_id(e.producer)} -> {_id(e.consumer)} [label="{label}", {style}];')
    lines.append("}")
    return "\n".join(lines) + "\n"


def to_mermaid(a: Analysis) -> str:
    lines = ["flowchart TD"]

    def emit(item: Item, indent: str) -> None:
        if isinstance(item, LoopNode):
            lines.append(f'{indent}subgraph {_id(item.path)}_c["{_loop_label(a, item)}"]')
            for child in item.body:
                emit(child, indent + "  ")
            lines.append(f"{indent}end")
        elif isinstance(item, ExecutionNode) and item.phases:
            lines.append(f'{indent}subgraph {_id(item.path)}_c["{item.name} phases"]')
            lines.append(f'{indent}  {_id(item.path)}["{item.name}<br/>{item.call}"]')
            for child in item.phases:
                emit(child, indent + "  ")
            lines.append(f"{indent}end")
        elif isinstance(item, ExecutionNode):
            lines.append(f'{indent}{_id(item.path)}["{item.name}<br/>{item.call}"]')
        elif isinstance(item, MergeNode):
            lines.append(f'{indent}{_id(item.path)}[/"merge {item.name}"\\]')

    for child in a.workflow.root.body:
        emit(child, "  ")
    for e in a.edges:
        label = e.detail + (f"; {e.relation}" if e.relation != "same iteration" else "")
        label = label.replace('"', "'").replace("|", "/")  # the whole label: the relation is text too
        arrow = "-->" if e.kind == "data" else "-.->"
        lines.append(f'  {_id(e.producer)} {arrow}|"{label}"| {_id(e.consumer)}')
    return "\n".join(lines) + "\n"
