"""No two modules of `rose_dsl`, `interpreter` or `rose_cli` import each other, even through a
function-level import (issue 43): a cycle hidden in a function body still ties the two modules into
one, and it is how `transforms/split.py` and `transforms/chain.py` had become one module in two files
(the shared rewrite now lives in `transforms/forward.py`). The last two went the same way: the state flow
that the legality check and `analyze`'s lag lines share lives in `analysis`, and the pipelined run drives
the runner through a protocol (`pipeline.Runner`) instead of importing it."""

from __future__ import annotations

import ast
from pathlib import Path

from .clirun import ROOT

PACKAGES = ("rose_dsl", "interpreter", "rose_cli")

# cycles (sorted module names) that stay for now, each with its reason; remove an entry once broken
KNOWN: dict[tuple[str, ...], str] = {}


def _module(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _graph(root: Path, packages: tuple[str, ...]) -> dict[str, set[str]]:
    """module -> the modules of `packages` it imports anywhere in its file (relative imports resolved)."""
    files = {_module(root, p): p for pkg in packages for p in sorted((root / pkg).rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                base = ".".join(here[:len(here) - node.level + 1] + [node.module or ""]).strip(".") \
                    if node.level else node.module or ""
                targets = [base, *(f"{base}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            deps.update(t for t in targets if t in files and t != name)
        graph[name] = deps
    return graph


def _cycles(graph: dict[str, set[str]]) -> set[tuple[str, ...]]:
    """The strongly connected components of more than one module (Tarjan), each as sorted names."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: set[tuple[str, ...]] = set()

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while (w := stack.pop()) != v:
                comp.append(w)
            comp.append(v)
            if len(comp) > 1:
                out.add(tuple(sorted(comp)))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle_beyond_the_known_ones() -> None:
    found = _cycles(_graph(ROOT, PACKAGES))
    assert found - set(KNOWN) == set(), f"modules that import each other: {sorted(found - set(KNOWN))}"
    assert set(KNOWN) - found == set(), f"KNOWN cycles that are gone; remove them: {sorted(set(KNOWN) - found)}"


def test_the_check_sees_a_cycle_through_a_function_level_relative_import(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "a.py").write_text("from .b import f\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from ..sub.a import g\n")
    (pkg / "c.py").write_text("from .sub import a\n")
    assert _cycles(_graph(tmp_path, ("pkg",))) == {("pkg.sub.a", "pkg.sub.b")}
