"""Plain-text renderings of an analysis, for golden files."""

from __future__ import annotations

from rose_dsl.analysis import Analysis


def analysis_text(a: Analysis) -> str:
    lines = [f"workflow {a.workflow.name}", "", "loops:"]
    for k in a.loops.values():
        lines.append(f"  {'.'.join(k.path)}: {k.kind} -- {'; '.join(k.reasons)}")
    lines += ["", "state accessors:"]
    for state, acc in a.accessors.items():
        lines.append(f"  {state}: " + ", ".join(f"{'.'.join(p[1:])}:{m.value}" for p, m in acc))
    lines += ["", "versions:"] + [f"  {v}" for v in a.versions]
    lines += ["", "edges:"]
    for e in a.edges:
        kind = e.kind if e.flow else f"{e.kind}(order)"
        lines.append(f"  {'.'.join(e.producer[1:])} -> {'.'.join(e.consumer[1:])} [{kind}] {e.relation} | {e.detail}")
    return "\n".join(lines) + "\n"
