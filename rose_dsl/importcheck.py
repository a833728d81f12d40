"""`rose validate --import`: does every `impl` import, and does it have the methods the workflow calls?

Errors a run would meet only when it starts a component are found here, before any run, and reported
where the user fixes them: at the `impl:` string (a module or class that does not exist) or at each
`call:` (a method the class lacks), with a did-you-mean from what the module or class does have.

User code is imported only here, only on request, only from allowed module prefixes (`trust.py`), and in
a child process per component with that component's own environment, import path and interpreter
(`venv`), so that a module with import side effects cannot change the validator's own state. The child
runs a self-contained script (standard library only): a `venv` interpreter need not have rose installed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from .errors import Diagnostic
from .ir import ExecutionNode, Workflow
from .trust import DEFAULT_ALLOWED, DENIED_MODULES, TrustPolicy, check_trust, module_allowed

__all__ = ["DENIED_MODULES", "DEFAULT_ALLOWED", "module_allowed", "check_imports", "import_problems",
           "component_env"]

# Runs in the child: {component: {"impl": [message, hint] | None, "methods": {method: [message, hint]}}}
_CHILD = r'''
import difflib, importlib, importlib.util, inspect, json, pkgutil, sys

def hint(name, candidates):
    m = difflib.get_close_matches(name, sorted(set(candidates)), n=3, cutoff=0.6)
    return ("did you mean " + " or ".join("'%s'" % x for x in m) + "?") if m else None

def missing_module(name):
    """Which part of a dotted module name does not exist, and what exists there instead."""
    parts = name.split(".")
    for i in range(len(parts)):
        head = ".".join(parts[: i + 1])
        try:
            found = importlib.util.find_spec(head) is not None
        except Exception:  # find_spec imports the parent, which may raise anything: then it is not there
            found = False
        if not found:
            if i == 0:
                return "no module named '%s'" % head, hint(head, (m.name for m in pkgutil.iter_modules()))
            parent = importlib.import_module(".".join(parts[:i]))
            names = [m.name for m in pkgutil.iter_modules(getattr(parent, "__path__", []))]
            return "module '%s' has no submodule '%s'" % (parent.__name__, parts[i]), hint(parts[i], names)
    return None

def arg_problems(obj, impl, args):
    """Each `args:` key the constructor cannot take (none when it takes **kwargs or has no signature)."""
    try:
        params = list(inspect.signature(obj).parameters.values())
    except (TypeError, ValueError):
        return {}
    if any(p.kind == p.VAR_KEYWORD for p in params):
        return {}
    names = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    return {a: ["'%s' takes no argument '%s' (it takes %s)" % (impl, a, ", ".join(names) or "none"), hint(a, names)]
            for a in args if a not in names}

def check(impl, methods, args=()):
    module_name, _, qual = impl.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        where = missing_module(module_name)
        if where is not None and exc.name and module_name.startswith(exc.name):
            return ["cannot import '%s': %s" % (module_name, where[0]), where[1]], {}
        return ["importing '%s' failed: %s: %s" % (module_name, type(exc).__name__, exc), None], {}
    except BaseException as exc:  # user code at import: any exception (SystemExit too) is its report
        return ["importing '%s' failed: %s: %s" % (module_name, type(exc).__name__, exc), None], {}
    obj, owner = module, module_name
    for part in qual.split("."):
        if not hasattr(obj, part):
            names = [n for n, v in vars(obj).items() if inspect.isclass(v)] if hasattr(obj, "__dict__") else []
            return ["'%s' has no class '%s'" % (owner, part), hint(part, names)], {}
        obj, owner = getattr(obj, part), owner + ("." if owner != module_name else ":") + part
    if not inspect.isclass(obj):
        return ["'%s' is a %s, not a class" % (impl, type(obj).__name__), None], {}
    if obj.__module__.split(".")[0] != module_name.split(".")[0]:
        return ["'%s' resolves to '%s.%s', outside '%s'" % (impl, obj.__module__, obj.__qualname__, module_name),
                None], {}
    public = [n for n in dir(obj) if not n.startswith("_") and callable(getattr(obj, n, None))]
    bad = {}
    for m in methods:
        if not callable(getattr(obj, m, None)):
            bad[m] = ["class '%s' has no method '%s'" % (impl, m), hint(m, public)]
    return None, bad, arg_problems(obj, impl, args)

specs = json.load(sys.stdin)
print(json.dumps({c: dict(zip(("impl", "methods", "args"), check(*spec))) for c, spec in specs.items()}))
'''

PROJECT_ROOT = str(Path(__file__).resolve().parent.parent)


def component_env(comp_env: Mapping[str, str], python_path: tuple[str, ...]) -> dict[str, str]:
    """The environment a component's own process gets (as the Ray backend builds it): its `env`, and its
    `python_path` ahead of the project root and this process's PYTHONPATH."""
    paths = [*python_path, PROJECT_ROOT, *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]]
    return {**{k: str(v) for k, v in comp_env.items()}, "PYTHONPATH": os.pathsep.join(dict.fromkeys(paths))}


def check_imports(specs: Mapping[str, tuple[str, list[str]] | tuple[str, list[str], list[str]]], timeout_s: float = 120.0,
                  env: Mapping[str, str] | None = None, python: str | None = None) -> dict[str, dict]:
    """Import each component class in a child process (`python`, default this interpreter) with `env`
    added to this environment (a spec: impl, called methods and, optionally, the `args:` keys): {component:
    {"impl": [message, hint] | None, "methods": {name: [message, hint]}, "args": {key: [message, hint]}}}."""
    try:
        proc = subprocess.run([python or sys.executable, "-c", _CHILD], input=json.dumps(specs), capture_output=True,
                              text=True, timeout=timeout_s, env={**os.environ, **(env or {})})
    except subprocess.TimeoutExpired:
        return {c: {"impl": [f"importing took longer than {timeout_s:.0f} s", None], "methods": {}} for c in specs}
    except OSError as exc:  # the venv's interpreter is missing or not executable
        return {c: {"impl": [f"cannot start {python}: {exc.strerror}", None], "methods": {}} for c in specs}
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {c: {"impl": [f"the import check crashed: {tail}", None], "methods": {}} for c in specs}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def import_problems(wf: Workflow, policy: TrustPolicy) -> list[Diagnostic]:
    """`rose validate --import`: what the trust policy refuses, then every impl that does not import and
    every called method its class lacks, each at the `impl:` or `call:` that names it."""
    refused = check_trust(wf, policy)
    if refused:  # nothing is imported from a workflow that asks for code outside the policy
        return refused
    calls: dict[str, dict[str, list[ExecutionNode]]] = {}
    for item in wf.items():
        if isinstance(item, ExecutionNode):
            calls.setdefault(item.component, {}).setdefault(item.method, []).append(item)
    out: list[Diagnostic] = []
    for c in wf.components.values():  # one child per component: each with its own environment
        methods = calls.get(c.name, {})
        python = str(Path(policy.cwd, c.venv, "bin", "python")) if c.venv else None
        result = check_imports({c.name: (c.impl, sorted(methods), sorted(c.args))},
                               env=component_env(c.env, c.python_path), python=python)[c.name]
        if result["impl"]:
            message, hint = result["impl"]
            out.append(Diagnostic(c.field_pos.get("impl", c.pos), f"components.{c.name}.impl", message, hint))
        for arg, (message, hint) in result.get("args", {}).items():  # what constructing it would refuse
            out.append(Diagnostic(c.field_pos.get(f"args.{arg}", c.field_pos.get("args", c.pos)),
                                  f"components.{c.name}.args.{arg}", message, hint))
        for method, (message, hint) in result["methods"].items():
            seen = set()
            for node in methods[method]:
                pos = node.field_pos.get("call", node.pos)
                if pos not in seen:  # split groups of one declared node share its position
                    seen.add(pos)
                    out.append(Diagnostic(pos, ".".join(node.path) + ".call", message, hint))
    return sorted(out, key=Diagnostic.sort_key)
