"""Identity as values: a node's path, a state object's key, a process, a split group.

Why a module of its own: a node, a state object, a process and a split group each have a spelling --
`iteration.epoch.step.act`, `sim.episode`, `policy#1`, `act@1` -- and that spelling is what JSON, YAML,
traces, command lines and messages hold. Code that reads identity back out of a spelling breaks on the
first name that holds the separator (a workflow may name its own node `act@1`) and hides what a value is
behind `str`. So the code passes these small frozen values and asks them (`key.component`, never
`key.split('.')`); `parse` turns text into a value only where text is read (a YAML file, a trace, a
request on the command line), `str()` writes it. `tests/cli/test_identity_types.py` fails on a string
parse of an identity anywhere else.

A split group is not spelled at all: a plan item's `plan.split_of` and `plan.group` (`ir.PlanFields`)
say which group it is (`SplitGroup.of`), and `act@1` is only the name the rewrites give it (`.name`).
A temporal split's copy of a component is a component of its own in the plan (`Component.copy_of` says
whose copy), so a process is its component and its data-parallel replica.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["NodePath", "StateKey", "ProcessId", "SplitGroup"]


@dataclass(frozen=True, order=True)
class NodePath:
    """A node's path in the loop tree, outermost first: `("iteration", "epoch", "step", "act")` (the IR's
    `Item.path`). Names hold no '.' (the schema's pattern), so the dotted spelling is unambiguous."""

    parts: tuple[str, ...]

    @classmethod
    def parse(cls, text: str) -> NodePath:
        """`iteration.epoch.act` (a trace record's node, a request's path) -> the path."""
        return cls(tuple(text.split(".")))

    @classmethod
    def below_iteration(cls, text: str) -> NodePath:
        """A path written below the iteration (`update.sgd`, as `moved_from:` and requests write it)."""
        return cls(("iteration", *text.split(".")))

    def __str__(self) -> str:
        return ".".join(self.parts)

    @property
    def name(self) -> str:
        return self.parts[-1]

    @property
    def top(self) -> str:
        """The top-level item of the iteration this path is in (`iteration.rollout.step.act` -> `rollout`);
        the root itself for the root."""
        return self.parts[1] if len(self.parts) > 1 else self.parts[0]

    def prefixes(self) -> list[NodePath]:
        """The paths of the items enclosing this one, outermost first (the root's included, its own not)."""
        return [NodePath(self.parts[:n]) for n in range(1, len(self.parts))]


@dataclass(frozen=True, order=True)
class StateKey:
    """A state object: the component that owns it and its name (`StateObject.key`, spelled `sim.episode`)."""

    component: str
    name: str

    @classmethod
    def parse(cls, text: str) -> StateKey:
        """`sim.episode` -> the key; ValueError without a component."""
        component, dot, name = text.partition(".")
        if not dot or not component or not name:
            raise ValueError(f"a state object is written 'component.name', not '{text}'")
        return cls(component, name)

    def __str__(self) -> str:
        return f"{self.component}.{self.name}"

    def on(self, component: str) -> StateKey:
        """The same state object on another component (a temporal split's copy): `sim.episode` -> `sim@0.episode`."""
        return StateKey(component, self.name)


@dataclass(frozen=True, order=True)
class ProcessId:
    """A process: data-parallel replica `replica` of `component` (as the source workflow names it), or of
    its temporal split's copy `copy`. Spelled `sim@1#2` (`plan_component` `sim@1`, the plan's component
    that is the copy; replica 0 and no copy keep the component's name): how backends name their processes
    and traces and metrics write them."""

    component: str
    copy: str | None = None
    replica: int = 0

    @classmethod
    def parse(cls, text: str) -> ProcessId:
        """`sim@1#2` -> the process (a backend's process name, a trace's or a profile's `process`)."""
        named, _, r = text.partition("#")
        component, at, copy = named.partition("@")
        return cls(component, copy if at else None, int(r or 0))

    @property
    def plan_component(self) -> str:
        """The plan's component this process runs: the copy (`sim@1`) or the component itself."""
        return self.component if self.copy is None else f"{self.component}@{self.copy}"

    def __str__(self) -> str:
        return self.plan_component if self.replica == 0 else f"{self.plan_component}#{self.replica}"


@dataclass(frozen=True, order=True)
class SplitGroup:
    """Group `group` of the split of the item named `split_of` (`ir.PlanFields`): what a plan item is
    when a rewrite made it; `name` is the spelling the rewrites give it, never read back."""

    split_of: str
    group: int

    @classmethod
    def of(cls, item: object) -> SplitGroup | None:
        """The group an IR item is (its plan's `split_of` and `group`), None for an item that is no group."""
        plan = getattr(item, "plan", None)
        split_of, group = getattr(plan, "split_of", None), getattr(plan, "group", None)
        return cls(split_of, group) if split_of is not None and group is not None else None

    @property
    def name(self) -> str:
        return f"{self.split_of}@{self.group}"
