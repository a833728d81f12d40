"""Layout knobs: workflow params that change how many processes a component runs as, not what it computes.

The hand-written sweep a user of RLinf would try includes "simulator processes 1/2/4/8": a row-separable
simulator as several data-parallel processes, each with its share of the envs. No rewrite request says
that -- it changes placement and constructor arguments (`replicas`, per-process env counts) -- so the
workflow's author names the param (`rose optimize --layout sim_replicas=1,2,4`) and vouches that every
value computes the same rollout (a simulator keyed by global row does). What rose checks, before
anything runs, for each value:

* the workflow with that value is valid, has the same components, and changes only their `replicas` and
  `args` (not code, device, GPU, environment or interpreter);
* every component it changes has state that each RL iteration refreshes before anything reads or updates
  it (`state_access_order`), so the new processes need nothing from the old ones: a layout switch starts
  them fresh, while the unchanged components keep their processes and state.

Measuring a layout is `layout_search.py`'s, through the runtime's session: complete training iterations in
blocks R, V, R (the declared layout around each value), kept only past the noise margin. `rose compare`
measures a plan written with a layout (`plan: layout:`) the same way, checked by `layout_change`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..analysis import state_access_order
from ..errors import shown
from ..identity import StateKey
from ..ir import Access, Workflow
from ..loader import load_value

__all__ = ["Layout", "parse_layout_option", "layouts", "changed_components", "layout_change"]

# what a layout may change in a component: how many processes and their constructor arguments
_MAY_CHANGE = ("replicas", "args")
_MUST_KEEP = ("impl", "device", "gpu", "env", "python_path", "venv", "mps_quota", "mps_priority", "state", "copy_of")


@dataclass(frozen=True)
class Layout:
    """One value of the layout knobs: its workflow, the components it changes, and why it cannot be
    tried (None: admissible)."""

    values: Mapping[str, Any]
    workflow: Workflow | None
    changed: tuple[str, ...] = ()
    refused: str | None = None

    @property
    def label(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.values.items())


def parse_layout_option(text: str) -> tuple[str, list[Any]]:
    """`NAME=V1,V2,...` -> (NAME, [values]); each value read as YAML (so `2` is an int). ValueError with
    the reason otherwise."""
    name, sep, rest = text.partition("=")
    name = name.strip()
    if not sep or not name or not rest.strip():
        raise ValueError(f"--layout takes NAME=V1,V2,... (a workflow param and its values), not {shown(text)}")
    values = []
    for item in rest.split(","):
        if not item.strip():
            raise ValueError(f"--layout {shown(text)}: an empty value")
        values.append(load_value(item.strip(), f"--layout {name}"))
    if len(set(map(repr, values))) != len(values):
        raise ValueError(f"--layout {shown(text)}: a value is given twice")
    return name, values


def changed_components(base: Workflow, other: Workflow) -> tuple[list[str], str | None]:
    """The components `other` defines differently from `base`, and why `other` is not a layout of `base`
    (None: it is)."""
    if set(base.components) != set(other.components):
        added = sorted(set(other.components) - set(base.components))
        gone = sorted(set(base.components) - set(other.components))
        return [], f"it changes the components themselves (added {added or '-'}, removed {gone or '-'})"
    changed = []
    for name, comp in base.components.items():
        new = other.components[name]
        for field in _MUST_KEEP:
            if getattr(comp, field) != getattr(new, field):
                return [], (f"it changes component '{name}''s {field} (a layout may change only "
                            f"{' and '.join(_MAY_CHANGE)})")
        if any(getattr(comp, f) != getattr(new, f) for f in _MAY_CHANGE):
            changed.append(name)
    return changed, None


def layout_change(base: Workflow, plan: Workflow) -> tuple[list[str], str | None]:
    """The components of `base` that `plan` runs as another layout (other replicas or args), and why
    `plan` is not an admissible layout of `base` (None: it is) -- the checks `layouts` makes for each
    value, on a finished plan: the components `plan` adds (a temporal split's copies) are left out, and
    the state order is `plan`'s own graph's."""
    from dataclasses import replace

    view = replace(plan, components={n: c for n, c in plan.components.items() if n in base.components})
    changed, why = changed_components(base, view)
    if why is None:
        why = next((s for c in changed if (s := _stale_state(plan, c))), None)
    return changed, why


def _stale_state(wf: Workflow, comp: str) -> str | None:
    """A state of `comp` that an iteration reads or updates before refreshing it (None: every state of
    `comp` the iteration touches is refreshed first), described."""
    first: dict[StateKey, tuple[Access, tuple[str, ...]]] = {}
    for state, access, path in state_access_order(wf.root.body):
        first.setdefault(state, (access, path))
    for obj in wf.components[comp].state:
        hit = first.get(obj.state_key)
        if hit is None:
            return (f"component '{comp}''s state '{obj.name}' is never refreshed by the iteration (a new process "
                    "would start without it)")
        access, path = hit
        if access is not Access.REFRESH:
            done = "read" if access is Access.READ else "updated"
            return (f"component '{comp}''s state '{obj.name}' is {done} by {'.'.join(path)} before any "
                    "refresh (new processes would not have the old value)")
    return None


def layouts(base: Workflow, knobs: Mapping[str, Sequence[Any]],
            load: Callable[[Mapping[str, Any]], Workflow]) -> list[Layout]:
    """Every other value of each knob (one knob changed at a time, the rest as `base` has them), with its
    admissibility. `load(params)` builds the workflow with those params set (WorkflowError or ValueError
    when it is invalid: the value is refused with the first line of the message). A knob must be one of
    `base`'s params (ValueError)."""
    out: list[Layout] = []
    for name, values in knobs.items():
        if name not in base.params:
            known = ", ".join(sorted(base.params)) or "none"
            raise ValueError(f"--layout {name}: not a param of {base.name} (its params: {known})")
        for value in values:
            if value == base.params[name]:
                continue  # the declared layout: the reference every value is measured against
            try:
                wf = load({name: value})
            except (ValueError, TypeError) as exc:  # WorkflowError is a ValueError
                out.append(Layout({name: value}, None, refused=f"not a valid workflow: {str(exc).splitlines()[0]}"))
                continue
            changed, why = changed_components(base, wf)
            if why is None:
                why = next((s for c in changed if (s := _stale_state(wf, c))), None)
            out.append(Layout({name: value}, wf, tuple(changed), why))
    return out
