"""`rose validate --import`: does every `impl` import, and does it have the methods the workflow calls?

Errors a run would meet only when it starts a component are found here, before any run, and reported
where the user fixes them: at the `impl:` string (a module or class that does not exist) or at each
`call:` (a method the class lacks), with a did-you-mean from what the module or class does have; a
class's `metric_merge` (how its metrics merge over a plan's copies and replicas) with a rule that is not one,
or naming a metric its `pop_metrics()` never reports (read from the method's source where every name it
reports is a literal), at the `impl:` too.

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
from typing import Any

from .errors import Diagnostic, SourcePos, did_you_mean
from .ir import ExecutionNode, LoopNode, Workflow
from .metric_rules import RULES
from .transforms.seeds import is_seed
from .trust import DEFAULT_ALLOWED, DENIED_MODULES, TrustPolicy, check_trust, module_allowed

__all__ = ["DENIED_MODULES", "DEFAULT_ALLOWED", "module_allowed", "check_imports", "import_problems",
           "component_env"]

# Runs in the child: {component: {"impl": [message, hint] | None, "methods": {method: [message, hint]}}}
_CHILD = r'''
import ast, difflib, importlib, importlib.util, inspect, json, pkgutil, sys, textwrap

def hint(name, candidates):
    m = difflib.get_close_matches(name, sorted(set(candidates)), n=3, cutoff=0.6)
    return ("did you mean " + " or ".join("'%s'" % x for x in m) + "?") if m else None

def missing_module(name, own_dirs):
    """Which part of a dotted module name does not exist, and what exists there instead: for a top-level
    name, only the modules of the user's own directories (the working directory, the component's
    python_path), never a stray module of some installed dependency ('example', 'tempfile')."""
    parts = name.split(".")
    for i in range(len(parts)):
        head = ".".join(parts[: i + 1])
        try:
            found = importlib.util.find_spec(head) is not None
        except Exception:  # find_spec imports the parent, which may raise anything: then it is not there
            found = False
        if not found:
            if i == 0:
                if head == "examples":
                    return ("no module named 'examples'", "the example components are not installed with rose: "
                            "`rose init DIR --workflow NAME` writes a workflow and the components it imports into DIR")
                return "no module named '%s'" % head, hint(head, (m.name for m in pkgutil.iter_modules(own_dirs)))
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

def signature_of(cls, name):
    """What a method takes: {"names": keywords, "required": those without a default, "any": **kwargs};
    None without a readable signature."""
    fn = getattr(cls, name, None)
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None
    if inspect.isfunction(fn) and not isinstance(inspect.getattr_static(cls, name, None), staticmethod) and params:
        params = params[1:]  # self
    named = [p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    return {"names": [p.name for p in named], "required": [p.name for p in named if p.default is p.empty],
            "any": any(p.kind == p.VAR_KEYWORD for p in params)}

def savable(value, where, depth=0):
    """Why a checkpoint cannot hold `value` (what torch.load(weights_only=True) loads), or None."""
    t = type(value)
    if depth > 50:
        return "%s is nested too deeply" % where
    if t.__module__.split(".")[0] == "torch" and t.__name__ in ("Tensor", "Parameter", "dtype", "device", "Size"):
        return None
    if t in (int, float, bool, str, bytes, complex, type(None)):
        return None
    if isinstance(value, dict) and t.__name__ in ("dict", "OrderedDict"):
        for k, v in value.items():
            if type(k) not in (str, int, float, bool, type(None)):
                return "%s has a key of type %s" % (where, type(k).__name__)
            why = savable(v, "%s[%r]" % (where, k), depth + 1)
            if why:
                return why
        return None
    if t in (list, tuple, set):
        for i, v in enumerate(value):
            why = savable(v, "%s[%d]" % (where, i), depth + 1)
            if why:
                return why
        return None
    return "%s is a %s.%s" % (where, t.__module__, t.__qualname__)

def grad_tensors(value, where, depth=0):
    """The first tensor in `value` that requires grad (a parameter), or None."""
    if getattr(value, "requires_grad", False) is True and type(value).__module__.split(".")[0] == "torch":
        return where
    if depth > 50:
        return None
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, (list, tuple)) else ()
    for k, v in items:
        found = grad_tensors(v, "%s[%r]" % (where, k), depth + 1)
        if found:
            return found
    return None

GET_SET = ("write get_state(name) and set_state(name, value) on the class (docs/components.md, State objects)")

def probe(cls, impl, spec):
    """Construct the component as a run would (on the CPU) and read each declared state object as a
    snapshot does: what a checkpoint cannot hold, and a default snapshot that would break training."""
    kwargs = dict(spec["args"])
    try:
        params = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        params = {}
    for name, value in (("device", "cpu"), ("seed", spec["seed"])):
        if name in params and name not in kwargs:
            kwargs[name] = value
    for name, value in (("replica", 0), ("replicas", 1)):
        if name in params:
            kwargs[name] = value
    try:
        obj = cls(**kwargs)
    except BaseException as exc:  # user code: any exception is its report
        return {"": ["constructing '%s' (to read its state) failed: %s: %s" % (impl, type(exc).__name__, exc), None]}
    stateful = callable(getattr(obj, "get_state", None)) and callable(getattr(obj, "set_state", None))
    out = {}
    for name, attr in spec["states"].items():
        try:
            value = obj.get_state(name) if stateful else getattr(obj, attr)
        except BaseException:  # a state made at the first call (lazily) is not there yet: nothing to say
            continue
        why = savable(value, "state '%s'" % name)
        if why:
            source = "get_state(%r)" % name if stateful else "attribute '%s'" % attr
            out[name] = ["%s (from %s), which a checkpoint cannot hold: state is tensors, dicts, lists, tuples, "
                         "ints, floats, strings, bools or None" % (why, source),
                         "return its state_dict() from get_state and load it in set_state" if stateful else
                         GET_SET + ", e.g. returning an optimizer's state_dict() and loading it back"]
            continue
        grad = None if stateful else grad_tensors(value, "state '%s'" % name)
        if grad:
            out[name] = ["%s requires grad: rose's default snapshot deep-copies attribute '%s' and restores it by "
                         "replacing it, which leaves the optimizer and autograd holding the old tensors" % (grad, attr),
                         GET_SET + ": get_state returning detached copies, set_state copying them in place "
                         "(with torch.no_grad(): t.copy_(v))"]
    close = getattr(obj, "close", None)
    if callable(close):
        try:
            close()
        except BaseException:
            pass
    return out

def _is_super_pop(node):
    """`super().pop_metrics()`: the metrics of a base class (read from its own pop_metrics)."""
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "pop_metrics"
            and isinstance(node.func.value, ast.Call) and isinstance(node.func.value.func, ast.Name)
            and node.func.value.func.id == "super")

def _method(call):
    return call.func.attr if isinstance(call.func, ast.Attribute) else None

def _literal_keys(fn):
    """The metric names one pop_metrics function reports, read from its source: the string keys of its dict
    literals, `out["name"] = ...`, `update(name=...)`, `dict(name=...)`. None when any name is computed (a
    comprehension, a non-literal key, a dict from elsewhere): then the names are not known here."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return None
    names, built = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.DictComp, ast.JoinedStr)):
            return None
        if isinstance(node, ast.Dict):
            for k, v in zip(node.keys, node.values):
                if k is None and not _is_super_pop(v):
                    return None
                if k is not None and not (isinstance(k, ast.Constant) and isinstance(k.value, str)):
                    return None
                if k is not None:
                    names.add(k.value)
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store):
            if not (isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str)):
                return None
            names.add(node.slice.value)
        elif isinstance(node, ast.Call) and _method(node) == "setdefault":
            key = node.args[0] if node.args else None
            if not (isinstance(key, ast.Constant) and isinstance(key.value, str)):
                return None
            names.add(key.value)
        elif isinstance(node, ast.Call) and (_method(node) == "update" or isinstance(node.func, ast.Name)
                                             and node.func.id == "dict"):
            if any(not isinstance(a, ast.Dict) for a in node.args) or any(k.arg is None for k in node.keywords):
                return None
            names.update(k.arg for k in node.keywords)
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            v = node.value
            if isinstance(v, ast.Dict) or _is_super_pop(v) or (isinstance(v, ast.Call) and isinstance(v.func, ast.Name)
                                                                and v.func.id == "dict"):
                built.add(node.targets[0].id)
    for node in ast.walk(tree):
        if isinstance(node, ast.Return) and node.value is not None and not _returns_built(node.value, built):
            return None
    return names

def _returns_built(value, built):
    if isinstance(value, ast.IfExp):
        return _returns_built(value.body, built) and _returns_built(value.orelse, built)
    return isinstance(value, ast.Dict) or _is_super_pop(value) or isinstance(value, ast.Name) and value.id in built

def reported_metrics(cls):
    """Every metric name `cls.pop_metrics` can report (its own and its bases'), or None when not known."""
    names = set()
    for klass in cls.__mro__:
        fn = vars(klass).get("pop_metrics")
        if fn is None:
            continue
        own = _literal_keys(fn)
        if own is None:
            return None
        names |= own
    return names

def merge_problems(cls, impl, rules):
    """What is wrong with the class's `metric_merge` declaration: {metric ('' for the whole): [message, hint]}."""
    declared = inspect.getattr_static(cls, "metric_merge", None)
    if declared is None or rules is None:
        return {}
    try:
        where = " (%s:%d)" % (inspect.getsourcefile(cls), inspect.getsourcelines(cls)[1])
    except (OSError, TypeError):
        where = ""
    known = ", ".join(rules)
    if not isinstance(declared, dict):
        return {"": ["%s.metric_merge%s is a %s, not a dict of metric name -> rule" % (impl, where, type(declared).__name__),
                     "declare e.g. metric_merge = {'env_steps': 'sum', 'return_ema': 'copies'} (rules: %s)" % known]}
    if not callable(getattr(cls, "pop_metrics", None)):
        return {"": ["%s declares metric_merge%s but has no pop_metrics(): it reports no metrics to merge" % (impl, where),
                     "report the metrics from pop_metrics() (docs/components.md), or remove metric_merge"]}
    reported = reported_metrics(cls)
    out = {}
    for key, rule in declared.items():
        name = key if isinstance(key, str) else repr(key)
        if not isinstance(key, str) or not key:
            out[name] = ["%s.metric_merge%s has the key %r, not a metric name" % (impl, where, key),
                         "key each rule by the name pop_metrics() reports, or '*' for every other metric"]
        elif not isinstance(rule, str) or rule not in rules:
            out[name] = ["%s.metric_merge%s gives %r the rule %r, which is not a rule" % (impl, where, key, rule),
                         hint(str(rule), rules) or "the rules: %s; a snapshot (a running mean, a best-so-far) is 'copies'" % known]
        elif key != "*" and reported is not None and key not in reported:
            said = ", ".join("'%s'" % n for n in sorted(reported)) or "nothing"
            out[name] = ["%s.metric_merge%s names the metric %r, which its pop_metrics() never reports (it reports %s)"
                         % (impl, where, key, said), hint(key, reported) or "name a metric pop_metrics() returns, or remove the rule"]
    return out

def check(impl, methods, args=(), own_dirs=(), state=None, rules=None):
    module_name, _, qual = impl.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        where = missing_module(module_name, list(own_dirs))
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
    bad, signatures = {}, {}
    for m in methods:
        if not callable(getattr(obj, m, None)):
            bad[m] = ["class '%s' has no method '%s'" % (impl, m), hint(m, public)]
        else:
            signatures[m] = signature_of(obj, m)
    problems = arg_problems(obj, impl, args)
    states = probe(obj, impl, state) if state is not None and not bad and not problems else {}
    return None, bad, problems, signatures, states, merge_problems(obj, impl, rules)

specs = json.load(sys.stdin)
keys = ("impl", "methods", "args", "signatures", "state", "merge")
print(json.dumps({c: dict(zip(keys, check(*spec))) for c, spec in specs.items()}))
'''

PROJECT_ROOT = str(Path(__file__).resolve().parent.parent)


def component_env(comp_env: Mapping[str, str], python_path: tuple[str, ...]) -> dict[str, str]:
    """The environment a component's own process gets (as the Ray backend builds it): its `env`, and its
    `python_path` ahead of the project root and this process's PYTHONPATH."""
    paths = [*python_path, PROJECT_ROOT, *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]]
    return {**{k: str(v) for k, v in comp_env.items()}, "PYTHONPATH": os.pathsep.join(dict.fromkeys(paths))}


def check_imports(specs: Mapping[str, tuple[Any, ...]], timeout_s: float = 120.0,
                  env: Mapping[str, str] | None = None, python: str | None = None) -> dict[str, dict]:
    """Import each component class in a child process (`python`, default this interpreter) with `env`
    added to this environment (a spec: impl, called methods and, optionally, the `args:` keys, the directories
    whose modules a missing top-level name is compared with, what to construct to read its state, and the
    metric merge rules its `metric_merge` may use):
    {component: {"impl": [message, hint] | None, "methods": {name: [message, hint]}, "args": {key: [message,
    hint]}, "signatures": {method: {"names", "required", "any"}}, "state": {name: [message, hint]}, "merge":
    {metric: [message, hint]}}}."""
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
        if isinstance(item, ExecutionNode) and not is_seed(item):  # a split's seeding: answered by rose itself
            calls.setdefault(item.component, {}).setdefault(item.method, []).append(item)
    per_row = _per_row_loops(wf)
    out: list[Diagnostic] = []
    for c in wf.components.values():  # one child per component: each with its own environment
        methods = calls.get(c.name, {})
        python = str(Path(policy.cwd, c.venv, "bin", "python")) if c.venv else None
        own_dirs = [str(Path(policy.cwd, d)) for d in ("", *c.python_path)]
        state = ({"args": c.args, "seed": wf.seed, "states": {s.name: s.attr for s in c.state}}
                 if c.state and _plain(c.args) else None)
        result = check_imports({c.name: (c.impl, sorted(methods), sorted(c.args), own_dirs, state, list(RULES))},
                               env=component_env(c.env, c.python_path), python=python)[c.name]
        if result["impl"]:
            message, hint = result["impl"]
            out.append(Diagnostic(c.field_pos.get("impl", c.pos), f"components.{c.name}.impl", message, hint))
        out += _port_problems(c.impl, methods, result.get("signatures") or {})
        out += _rows_problems(c.impl, per_row, methods, result.get("signatures") or {})
        for name, (message, hint) in (result.get("state") or {}).items():
            if not name:  # it could not be constructed here: on the CPU, a GPU component may not be
                if c.device == "cpu":
                    out.append(Diagnostic(c.field_pos.get("impl", c.pos), f"components.{c.name}.impl", message, hint))
                continue
            so = c.state_object(name)
            pos = so.pos if so is not None and so.pos.line else c.field_pos.get("state", c.pos)
            out.append(Diagnostic(pos, f"components.{c.name}.state.{name}", message, hint))
        for metric, (message, hint) in (result.get("merge") or {}).items():  # its metric_merge declaration
            out.append(Diagnostic(c.field_pos.get("impl", c.pos), f"components.{c.name}.impl"
                                  + (f".metric_merge.{metric}" if metric else ".metric_merge"), message, hint))
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


def _plain(value: object) -> bool:
    """Whether constructor args travel to the child as JSON unchanged."""
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_plain(v) for v in value)
    return isinstance(value, str | int | float | bool | type(None))


def _per_row_loops(wf: Workflow) -> dict[int, str]:
    """id(node) -> the loop's name, for every node of a loop that ends per row (`until:` over batch rows)."""
    from .resolve import Resolver
    from .until import whole_reason

    loops = [i for i in wf.items() if isinstance(i, LoopNode) and i.dynamic]
    if not loops:
        return {}
    resolver = Resolver(wf)
    return {id(item): loop.name for loop in loops if whole_reason(resolver, loop) is None
            for item in loop.body if isinstance(item, ExecutionNode)}


def _rows_problems(impl: str, per_row: Mapping[int, str], methods: Mapping[str, list[ExecutionNode]],
                   signatures: Mapping[str, dict | None]) -> list[Diagnostic]:
    """Each stateful call in a loop that ends per row whose method takes no `rows=`: from the first trip on
    which a row is done it gets only the rows not done, and its state cannot tell which (it stopped the run
    at that trip, exit 3, after `validate --import` had passed it, issue 59)."""
    out = []
    for method, nodes in methods.items():
        sig = signatures.get(method)
        if sig is None or sig["any"] or "rows" in sig["names"]:
            continue
        for node in nodes:
            if id(node) in per_row and node.effects:
                out.append(Diagnostic(node.field_pos.get("call", node.pos), ".".join(node.path) + ".call",
                                      f"{node.call} runs in loop '{per_row[id(node)]}', which ends per row (on the rows "
                                      f"not yet done), and declares state ({', '.join(e.state for e in node.effects)}), "
                                      f"but {impl}.{method}() takes no `rows=` argument",
                                      "a stateful method in such a loop must take `rows` (the indices of the rows it "
                                      "computes; docs/components.md)"))
    return out


def _port_problems(impl: str, methods: Mapping[str, list[ExecutionNode]],
                   signatures: Mapping[str, dict | None]) -> list[Diagnostic]:
    """Each `in:` port a called method does not take (a TypeError at the first call, exit 3, an hour in),
    and each argument it requires that no port gives, at the node (`rows` is rose's to pass)."""
    out = []
    for method, nodes in methods.items():
        sig = signatures.get(method)
        if sig is None:
            continue
        seen: set[tuple[SourcePos, str]] = set()
        for node in nodes:
            ports = [p for p, _ in node.inputs]
            if not sig["any"]:
                for port in ports:
                    if port not in sig["names"]:
                        pos = node.field_pos.get(f"in.{port}", node.field_pos.get("call", node.pos))
                        if (pos, port) not in seen:  # split groups of one declared node share its position
                            seen.add((pos, port))
                            out.append(Diagnostic(pos, f"{'.'.join(node.path)}.in.{port}",
                                                  f"{impl}.{method}() takes no argument '{port}' (it takes "
                                                  f"{', '.join(sig['names']) or 'none'})",
                                                  did_you_mean(port, sig["names"])))
            lacking = [n for n in sig["required"] if n not in ports and n != "rows"]
            pos = node.field_pos.get("call", node.pos)
            if lacking and (pos, "") not in seen:
                seen.add((pos, ""))
                out.append(Diagnostic(pos, f"{'.'.join(node.path)}.in",
                                      f"{impl}.{method}() requires {', '.join(repr(n) for n in lacking)}, which "
                                      "no port of `in:` gives"))
    return out
