"""Do the replica counts of components that pass values to each other fit? A static check.

A component with `replicas: n` runs n data-parallel processes, and every value flows replica to replica:
a consumer with as many replicas as its producer takes its own replica's value, one with fewer takes the
concatenation of a group (or a list, without `shard:`), one with more takes a shard of a producer replica's
value -- which needs `shard: DIM` on the node, the dimension to cut. Counts where neither divides the other
(3 and 2) cannot be mapped at all. The runtime maps them (`interpreter/schedule.py:for_replica`) and
refuses what it cannot map; the counts are resolved at validation (`${params}` included), so the same
rules are checked here, where `rose validate` says so at the `in:` to fix instead of `rose execute`.
"""

from __future__ import annotations

from .analysis import invocation_graph
from .errors import Diagnostic
from .ir import Workflow

__all__ = ["replica_problems"]


def replica_problems(wf: Workflow) -> list[Diagnostic]:
    """Each input port whose producers' replica counts its node cannot take, once per declared node and
    port, positioned at the port. [] when no component has more than one replica."""
    replicas = {name: c.replicas for name, c in wf.components.items()}
    if all(n == 1 for n in replicas.values()):
        return []
    graph = invocation_graph(wf, iterations=2)  # values carried from one RL iteration into the next too
    # (node path, port) -> the components whose values it takes
    sources: dict[tuple[tuple[str, ...], str], set[str]] = {}
    nodes = {}
    for consumer, producers in graph.deps.items():
        node = graph.node[consumer]
        for producer, reasons in producers.items():
            for dep in reasons:
                if dep.kind != "data":
                    continue
                port = (dep.input_field or "in.").removeprefix("in.")
                nodes[node.path] = node
                sources.setdefault((node.path, port), set()).add(graph.node[producer].component)
    out: list[Diagnostic] = []
    for (path, port), comps in sorted(sources.items()):
        node = nodes[path]
        n = replicas[node.component]
        counts = {replicas[c] for c in comps}
        where = node.field_pos.get(f"in.{port}", node.pos)
        field = ".".join(path) + f".in.{port}"
        named = ", ".join(f"'{c}' ({replicas[c]} replica{'s' if replicas[c] > 1 else ''})" for c in sorted(comps))
        mine = f"'{node.component}' runs {n} replica{'s' if n > 1 else ''}"
        if len(counts) > 1:
            out.append(Diagnostic(where, field, f"input '{port}' mixes values from components with different replica "
                                                f"counts: {named}",
                                  "give the producers one replica count, or pass their values through separate inputs"))
            continue
        (have,) = counts
        if have == n or have % n == 0:
            continue
        if n % have == 0:
            if node.shard is None:
                out.append(Diagnostic(where, field, f"{mine} and takes '{port}' from {named}: each of its replicas "
                                                    "needs a shard of a producer replica's value",
                                      f"declare `shard: DIM` on '{node.name}' (the dimension to cut)"))
            continue
        out.append(Diagnostic(where, field, f"{mine} and takes '{port}' from {named}: one replica count must divide "
                                            "the other", "make the counts equal, or one a multiple of the other"))
    return out
