"""IR -> workflow YAML. A plan written by a transformation is itself a workflow file: `rose validate`
accepts it, `git diff` shows what changed, and loading it gives back the same IR (tested)."""

from __future__ import annotations

from typing import Any

import yaml

from .expr import Expr, Int, unparse
from .ir import Component, ExecutionNode, Item, LoopNode, MergeNode, StateObject, Workflow

__all__ = ["to_document", "to_yaml"]


def _expr(e: Expr) -> Any:
    return e.value if isinstance(e, Int) else unparse(e)


def _component(c: Component) -> dict[str, Any]:
    out: dict[str, Any] = {"impl": c.impl}
    if c.args:
        out["args"] = c.args
    out["device"] = c.device
    if c.gpu is not None:
        out["gpu"] = c.gpu
    if c.mps_quota is not None:
        out["mps_quota"] = c.mps_quota
    if c.mps_priority is not None:
        out["mps_priority"] = c.mps_priority
    if c.replicas != 1:
        out["replicas"] = c.replicas
    if c.state:
        if all(s.attr == s.name and not s.max_staleness for s in c.state):
            out["state"] = [s.name for s in c.state]
        else:
            out["state"] = {s.name: _state_spec(s) for s in c.state}
    if c.env:
        out["env"] = dict(c.env)
    if c.python_path:
        out["python_path"] = list(c.python_path)
    if c.venv:
        out["venv"] = c.venv
    if c.copy_of:
        out["copy_of"] = c.copy_of
    return out


def _state_spec(s: StateObject) -> dict[str, Any] | None:
    spec: dict[str, Any] = {}
    if s.attr != s.name:
        spec["attr"] = s.attr
    if s.max_staleness:
        spec["max_staleness"] = s.max_staleness
    return spec or None


def _plan_fields(item: Item, out: dict[str, Any]) -> None:
    if item.after:
        out["after"] = list(item.after)
    if isinstance(item, ExecutionNode) and item.plan.defer:
        out["defer"] = item.plan.defer
    if isinstance(item, ExecutionNode) and item.plan.ahead:
        out["ahead"] = item.plan.ahead


def _item(item: Item, inherited: int | None = None) -> dict[str, Any]:
    """One item as YAML; `inherited` is the group of the enclosing item (`group:` is written only where an
    item's group is not the one it would inherit: on groups, and on items moved in from another group)."""
    if isinstance(item, ExecutionNode):
        out: dict[str, Any] = {"node": item.name, "call": item.call}
        if item.inputs:
            out["in"] = {port: _expr(e) for port, e in item.inputs}
        if item.outputs:
            out["out"] = list(item.outputs)
        if item.effects:
            out["state"] = {e.key.name: e.access.value for e in item.effects}
        if item.batch is not None:
            batch: dict[str, Any] = {"dim": item.batch}
            if item.batch_size is not None:
                batch["size"] = item.batch_size
            if not item.separable:
                batch["separable"] = False
            out["batch"] = batch if len(batch) > 1 else item.batch
        if item.phases:
            out["phases"] = [_item(p, item.plan.group) for p in item.phases]
        if item.plan.expand:
            out["expand"] = True
        if item.plan.rows is not None:
            out["rows"] = list(item.plan.rows)
        if item.plan.split_of:
            out["split_of"] = item.plan.split_of
        if item.plan.group is not None and item.plan.group != inherited:
            out["group"] = item.plan.group
        if item.plan.moved_from:
            out["moved_from"] = ".".join(item.plan.moved_from[1:])
        if item.idempotent:
            out["idempotent"] = True
        if item.timeout_s is not None:
            out["timeout_s"] = item.timeout_s
        if item.shard is not None:
            out["shard"] = item.shard
        _plan_fields(item, out)
        return out
    if isinstance(item, LoopNode):
        out = {"loop": item.name}
        if item.count is not None:
            out["count"] = item.count
        if item.until is not None:
            out["until"] = _expr(item.until)
        if item.carries:
            out["carry"] = {c.name: {"init": _expr(c.init), "next": _expr(c.next)} for c in item.carries}
        if item.plan.iterations is not None:
            out["iterations"] = list(item.plan.iterations)
        if item.plan.split_of:
            out["split_of"] = item.plan.split_of
        if item.plan.group is not None and item.plan.group != inherited:
            out["group"] = item.plan.group
        if item.plan.interleaved:
            out["interleave"] = True
        if item.plan.moved_from:
            out["moved_from"] = ".".join(item.plan.moved_from[1:])
        _plan_fields(item, out)
        out["body"] = [_item(c, item.plan.group) for c in item.body]
        if item.collects:
            out["collect"] = {name: _expr(e) for name, e in item.collects}
        return out
    assert isinstance(item, MergeNode)
    out = {"merge": item.name, "from": list(item.sources), "ports": dict(item.ports)}
    _plan_fields(item, out)
    return out


def to_document(wf: Workflow, plan: dict[str, Any] | None = None) -> dict[str, Any]:
    root: dict[str, Any] = {"count": wf.root.count}
    if wf.root.carries:
        root["carry"] = {c.name: {"init": _expr(c.init), "next": _expr(c.next)} for c in wf.root.carries}
    root["body"] = [_item(c) for c in wf.root.body]
    doc: dict[str, Any] = {"rose": wf.version, "name": wf.name}
    if plan:  # first: a plan cut short still names its source, so it is checked (and refused) against it
        doc["plan"] = plan
    if wf.params:
        doc["params"] = dict(wf.params)
    doc["components"] = {name: _component(c) for name, c in wf.components.items()}
    doc["iteration"] = root
    return doc


class _Dumper(yaml.SafeDumper):
    """Block style for the structure, flow style for small leaves, and never an anchor: a component copy
    shares its `args` dict with the original, and `&id001` / `*id001` in a plan file read as if the user
    had written them."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _flow_small(dumper: yaml.SafeDumper, data: dict) -> yaml.Node:
    small = len(data) <= 6 and all(isinstance(v, str | int | float | bool) and len(str(v)) < 40 for v in data.values())
    return dumper.represent_mapping("tag:yaml.org,2002:map", data, flow_style=small)


def _flow_list(dumper: yaml.SafeDumper, data: list) -> yaml.Node:
    small = len(data) <= 8 and all(isinstance(v, str | int | float | bool) and len(str(v)) < 30 for v in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=small)


_Dumper.add_representer(dict, _flow_small)
_Dumper.add_representer(list, _flow_list)


def to_yaml(wf: Workflow, plan: dict[str, Any] | None = None, header: str | None = None) -> str:
    text = yaml.dump(to_document(wf, plan), Dumper=_Dumper, sort_keys=False, width=120, allow_unicode=True)
    return (header.rstrip() + "\n" if header else "") + text
