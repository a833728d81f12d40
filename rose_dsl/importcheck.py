"""`rose validate --import`: does every `impl` import, and does it have the methods the workflow calls?

User code is imported only here, only on request, and in a child process (so that a module with import
side effects cannot change the validator's own state), and only from allowed module prefixes.
"""

from __future__ import annotations

import importlib
import inspect
import json
import subprocess
import sys
from collections.abc import Iterable, Mapping

__all__ = ["DENIED_MODULES", "DEFAULT_ALLOWED", "module_allowed", "check_imports"]

DENIED_MODULES = ("os", "sys", "subprocess", "builtins", "importlib", "ctypes", "pickle", "shutil", "socket",
                  "multiprocessing", "runpy", "code", "marshal", "shelve")
DEFAULT_ALLOWED = ("examples.",)


def module_allowed(module: str, allowed: Iterable[str]) -> str | None:
    """None if `module` may be imported as a component, else the reason it may not."""
    top = module.split(".")[0]
    if top in DENIED_MODULES or module in DENIED_MODULES:
        return f"module '{module}' is never a component (it is on rose's deny list)"
    prefixes = tuple(allowed)
    if not any(module == p.rstrip(".") or module.startswith(p if p.endswith(".") else p + ".") for p in prefixes):
        return (f"module '{module}' is outside the allowed prefixes ({', '.join(prefixes)}); "
                f"allow it with --allow-module {top}")
    return None


def _check_in_child(specs: Mapping[str, tuple[str, list[str]]]) -> dict[str, str | None]:
    """Runs in the child: {component: error or None}."""
    results: dict[str, str | None] = {}
    for comp, (impl, methods) in specs.items():
        module_name, _, qual = impl.partition(":")
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:  # noqa: BLE001 - any import failure is reported, not raised
            results[comp] = f"cannot import '{module_name}': {type(exc).__name__}: {exc}"
            continue
        obj = module
        try:
            for part in qual.split("."):
                obj = getattr(obj, part)
        except AttributeError:
            results[comp] = f"module '{module_name}' has no '{qual}'"
            continue
        if not inspect.isclass(obj):
            results[comp] = f"'{impl}' is not a class"
            continue
        if obj.__module__.split(".")[0] != module_name.split(".")[0]:
            results[comp] = f"'{impl}' resolves to '{obj.__module__}.{obj.__qualname__}', outside '{module_name}'"
            continue
        missing = [m for m in methods if not callable(getattr(obj, m, None))]
        results[comp] = f"class '{impl}' has no method {', '.join(map(repr, missing))}" if missing else None
    return results


def check_imports(specs: Mapping[str, tuple[str, list[str]]], timeout_s: float = 120.0,
                  env: Mapping[str, str] | None = None) -> dict[str, str | None]:
    """Import each component class in a child process (with the components' own environment, e.g. a
    PYTHONPATH with another MuJoCo); {component: error or None}."""
    import os

    code = "import json,sys; from rose_dsl.importcheck import _check_in_child as c; print(json.dumps(c(json.load(sys.stdin))))"
    try:
        proc = subprocess.run([sys.executable, "-c", code], input=json.dumps(specs), capture_output=True, text=True,
                              timeout=timeout_s, env={**os.environ, **(env or {})})
    except subprocess.TimeoutExpired:
        return {comp: f"importing took longer than {timeout_s:.0f} s" for comp in specs}
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {comp: f"the import check crashed: {tail}" for comp in specs}
    return json.loads(proc.stdout.strip().splitlines()[-1])
