"""Identity is a value, not a spelling (issue 60): no code of `rose_dsl`, `interpreter` or `rose_cli` reads
a node, a state object, a process or a split group back out of a string -- `x.split('.')`,
`x.partition('#')`, `'@' in name` -- outside the places that read text (`rose_dsl/identity.py`'s `parse`,
and the few functions in `ALLOWED`, each with its reason). The rest passes `NodePath`, `StateKey`,
`ProcessId` and the IR's fields.

Run as a script on another checkout to see what it finds there: `python3 tests/cli/test_identity_types.py
/work/main` (exit 1 and the places, one a line, when it finds any)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from rose_dsl.identity import NodePath, ProcessId, SplitGroup, StateKey

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("rose_dsl", "interpreter", "rose_cli")
SEPARATORS = frozenset(".@#")  # of a node path, a state key, a copy or split group, a replica
SPLITTERS = frozenset({"split", "rsplit", "partition", "rpartition"})

# (file, function) -> why a string is split there; "*" for a whole file. Nothing here reads an identity
# out of a name the code made: these read text (YAML, Python import paths) or check a spelling itself.
ALLOWED: dict[tuple[str, str], str] = {
    ("rose_dsl/identity.py", "*"): "the one parse of each identity's spelling",
    ("rose_dsl/build.py", "_ItemBuilder.node"): "reads the YAML document: `call: comp.method`, `state: {owner.name: ...}`",
    ("rose_dsl/build.py", "_moved_from"): "reads the YAML document: `moved_from: update.sgd`",
    ("rose_dsl/measurement.py", "legacy_identity"): "reads profile JSON / traces written before `source`/`base` existed",
    ("rose_dsl/resolve.py", "check_reserved_names"): "refuses the rewrites' spelling `@N` in a workflow's own names",
    ("rose_dsl/resolve.py", "_where"): "a YAML field key (`in.obs`), not an identity",
    ("rose_dsl/trust.py", "*"): "Python module paths and `env.NAME` arguments, not identities",
    ("interpreter/components.py", "resolve_impl"): "Python module and attribute paths, not identities",
    ("interpreter/shared_process.py", "*"): "file names (`mod.py`), not identities",
    ("rose_cli/init.py", "*"): "Python module paths of a component's `impl`, not identities",
}


def _parses(tree: ast.AST) -> list[tuple[int, str, str]]:
    """(line, enclosing function's qualified name, what) of every string parse by a separator of identity."""
    out: list[tuple[int, str, str]] = []

    def visit(node: ast.AST, scope: tuple[str, ...]) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            scope = (*scope, node.name)
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in SPLITTERS
                and node.args and isinstance(node.args[0], ast.Constant) and node.args[0].value in SEPARATORS):
            out.append((node.lineno, ".".join(scope) or "<module>", f".{node.func.attr}({node.args[0].value!r})"))
        if (isinstance(node, ast.Compare) and isinstance(node.left, ast.Constant)
                and node.left.value in SEPARATORS - {"."} and isinstance(node.ops[0], ast.In | ast.NotIn)):
            out.append((node.lineno, ".".join(scope) or "<module>", f"{node.left.value!r} in"))
        for child in ast.iter_child_nodes(node):
            visit(child, scope)

    visit(tree, ())
    return out


def identity_parses(root: Path) -> list[str]:
    """Every string parse of an identity under `root`'s packages outside `ALLOWED`: `file:line: function: what`."""
    bad = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            for line, func, what in _parses(ast.parse(path.read_text(), rel)):
                if (rel, "*") not in ALLOWED and (rel, func) not in ALLOWED:
                    bad.append(f"{rel}:{line}: {func}: {what}")
    return bad


def test_no_identity_parsed_outside_serialization() -> None:
    bad = identity_parses(ROOT)
    assert not bad, ("identity read out of a string (pass NodePath/StateKey/ProcessId or the IR's fields; parse "
                     "only where text is read, and say why in ALLOWED):\n" + "\n".join(bad))


def test_every_allowance_is_still_needed() -> None:
    """An allowance that covers no parse any more is removed, so the list says exactly what is left."""
    found = set()
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            rel = path.relative_to(ROOT).as_posix()
            for _, func, _ in _parses(ast.parse(path.read_text(), rel)):
                found |= {(rel, "*"), (rel, func)}
    assert not set(ALLOWED) - found, sorted(set(ALLOWED) - found)


@pytest.mark.parametrize("source", [
    "def f(node):\n    return node.split('.')[1]\n",
    "def f(process):\n    return process.partition('#')[0]\n",
    "def f(name):\n    return '@' in name\n",
    "class C:\n    def f(self, s):\n        return s.rsplit('.', 1)[-1]\n",
])
def test_the_check_sees_each_form(source: str) -> None:
    assert _parses(ast.parse(source)), source


def test_the_check_passes_other_splits() -> None:
    assert not _parses(ast.parse("def f(s):\n    return s.split(':'), s.split(), 'x' in s, '.' in s\n"))


def test_spellings_round_trip() -> None:
    path = NodePath(("iteration", "epoch", "act@1"))
    assert NodePath.parse(str(path)) == path and str(path) == "iteration.epoch.act@1"
    assert path.name == "act@1" and path.top == "epoch" and NodePath(("iteration",)).top == "iteration"
    assert NodePath.below_iteration("update.sgd") == NodePath(("iteration", "update", "sgd"))
    assert [str(p) for p in path.prefixes()] == ["iteration", "iteration.epoch"]
    key = StateKey("sim@0", "episode")
    assert StateKey.parse(str(key)) == key and str(key.on("sim")) == "sim.episode"
    with pytest.raises(ValueError, match="component.name"):
        StateKey.parse("episode")
    for text, pid in (("policy", ProcessId("policy")), ("policy#2", ProcessId("policy", None, 2)),
                      ("sim@1#1", ProcessId("sim", "1", 1)), ("sim@0", ProcessId("sim", "0"))):
        assert ProcessId.parse(text) == pid and str(pid) == text
    assert ProcessId("sim", "1", 2).plan_component == "sim@1" and ProcessId("sim").plan_component == "sim"


def test_a_split_group_is_its_fields_not_its_name() -> None:
    from rose_dsl.ir import ExecutionNode, NodePlan

    def node(name: str, **plan: object) -> ExecutionNode:
        return ExecutionNode(path=("iteration", name), component="c", method="m",
                             plan=NodePlan(**plan))  # type: ignore[arg-type]

    assert SplitGroup.of(node("act@1")) is None  # a workflow's own name, no group
    group = SplitGroup.of(node("act@1", split_of="act", group=1))
    assert group == SplitGroup("act", 1) and group.name == "act@1"


if __name__ == "__main__":
    found = identity_parses(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT)
    print("\n".join(found) or "none")
    sys.exit(1 if found else 0)
