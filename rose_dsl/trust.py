"""Which code a workflow file may make rose run: the allowlist for `impl`, `env`, `python_path`, `venv`.

Why: workflow and plan files travel (a plan from a colleague, a config in a model repository), and a
file that names code to run is a program. Hydra's `_target_` is the cautionary tale: any importable
callable named in a config got instantiated, so a config file was enough to run code. rose keeps one
rule for every field of a component that chooses code: **the file alone may only choose code the
person running rose allowed on the command line.**

* `impl` -- the module imported: a prefix in `--allow-module` (default `examples.`), never a module
  on the deny list (`os`, `subprocess`, `pickle`...); the *resolved* class is checked again at import.
* `args` -- a string anywhere in a component's arguments that has the form of a code reference,
  `package.module:callable` (`verifier: "examples.llm.arithmetic:check_answer"`), names code the
  component will import and call: it passes the same allow-list as `impl` (issue 59: `verifier: "this:s"`
  imported an arbitrary module in every reward worker). A string that merely looks like one
  (`mode: "train:fast"`) is refused the same way; `--allow-module` lets it through.
* `env` -- variables that make a process load or run code (the dynamic loader's `LD_*`, Python's
  `PYTHON*`, `PATH`, shell start-up files, CUDA/NVTX injection, GL/Vulkan/OpenCL driver loaders, NCCL
  plugins, compiler caches and toolchains, Ray hooks) only with `--allow-env NAME`; other variables
  (`MUJOCO_GL`, `OMP_NUM_THREADS`...) are data.
* `python_path`, `venv` -- where imports come from and which interpreter runs: only inside a directory
  given with `--allow-path DIR`.

The policy is pure (no import, no process): `check_trust` returns positioned diagnostics and every
command that runs code (`rose validate --import`, `rose execute`, `rose optimize`) calls it before
starting anything. docs/reliability.md has the threat model.
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from .errors import Diagnostic, SourcePos
from .ir import Component, Workflow

__all__ = ["DENIED_MODULES", "DEFAULT_ALLOWED", "ENV_DENIED", "TrustPolicy", "module_allowed", "env_refused",
           "path_refused", "check_trust", "CODE_REF", "code_refs"]

DENIED_MODULES = ("os", "sys", "subprocess", "builtins", "importlib", "ctypes", "pickle", "shutil", "socket",
                  "multiprocessing", "runpy", "code", "marshal", "shelve")
DEFAULT_ALLOWED = ("examples.",)

_GLIBC = "glibc reads files or loads modules named by it (one of the variables glibc drops for setuid programs)"
_GRAPHICS = "a graphics or compute driver loader loads the library or layer it names"
_COMPILER = "a compiler run by the process takes its toolchain or its compiled (native) code from it"
# (fnmatch pattern on the upper-cased name, why a workflow may not set it); a family per group
ENV_DENIED: tuple[tuple[str, str], ...] = (
    ("LD_*", "the dynamic loader loads shared objects named by it into the process (LD_PRELOAD, LD_AUDIT, "
             "LD_LIBRARY_PATH)"),
    ("DYLD_*", "the macOS dynamic loader loads libraries named by it"),
    ("PYTHON*", "Python chooses the code it runs from it (PYTHONPATH, PYTHONSTARTUP, PYTHONHOME; PYTHONWARNINGS "
                "imports modules)"),
    ("PATH", "it chooses which programs the process and its children run"),
    ("BASH_ENV", "bash runs the file it names when the process starts a shell"),
    ("ENV", "sh runs the file it names when the process starts a shell"),
    ("BASH_FUNC_*", "bash imports functions from it"),
    ("SHELLOPTS", "it changes how every shell the process starts behaves"),
    ("PS4", "bash evaluates it when tracing"),
    *((name, _GLIBC) for name in ("GCONV_PATH", "GETCONF_DIR", "HOSTALIASES", "LOCALDOMAIN", "LOCPATH",
                                  "MALLOC_TRACE", "NIS_PATH", "NLSPATH", "RESOLV_HOST_CONF", "RES_OPTIONS")),
    ("CUDA_INJECTION*", "the CUDA driver loads the library it names into every CUDA process"),
    ("NVTX_INJECTION*", "NVTX loads the library it names"),
    ("PJRT_*", "JAX/XLA load the PJRT plugin libraries it names"),
    *((name, _GRAPHICS) for name in ("__EGL_VENDOR_LIBRARY_*", "__GLX_VENDOR_LIBRARY_NAME", "LIBGL_DRIVERS_PATH",
                                     "VK_ICD_FILENAMES", "VK_DRIVER_FILES", "VK_ADD_DRIVER_FILES", "VK_LAYER_PATH",
                                     "VK_ADD_LAYER_PATH", "VK_INSTANCE_LAYERS", "OCL_ICD_VENDORS",
                                     "OPENCL_VENDOR_PATH")),
    ("NCCL_*PLUGIN*", "NCCL loads the plugin library it names"),
    *((name, _COMPILER) for name in ("XLA_FLAGS", "JAX_COMPILATION_CACHE_DIR", "TRITON_*", "TORCHINDUCTOR_*",
                                     "TORCH_EXTENSIONS_DIR", "CUDA_HOME", "CUDA_PATH", "CUDA_CACHE_PATH")),
    ("RAY_*", "Ray reads hooks (RAY_RUNTIME_ENV_HOOK names a function it imports and calls) and worker settings "
              "from it"),
)


@dataclass(frozen=True)
class TrustPolicy:
    """What the person running rose allowed on the command line, beyond the defaults."""

    modules: tuple[str, ...] = DEFAULT_ALLOWED  # --allow-module prefixes (the defaults included)
    env: frozenset[str] = frozenset()  # --allow-env NAME
    paths: tuple[str, ...] = ()  # --allow-path DIR (absolute, symlinks resolved)
    cwd: str = field(default_factory=os.getcwd)  # relative python_path/venv entries resolve against it

    @classmethod
    def from_options(cls, modules: Iterable[str] | None = None, env: Iterable[str] | None = None,
                     paths: Iterable[str] | None = None) -> TrustPolicy:
        return cls(modules=(*(modules or ()), *DEFAULT_ALLOWED), env=frozenset(env or ()),
                   paths=tuple(os.path.realpath(p) for p in paths or ()))


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


def env_refused(name: str, allowed: Iterable[str] = ()) -> str | None:
    """None if a workflow may set the variable `name` for a component's process, else why not."""
    if name in set(allowed):
        return None
    upper = name.upper()
    for pattern, why in ENV_DENIED:
        if fnmatch.fnmatchcase(upper, pattern):
            return f"'{name}' may choose the code the process runs: {why}; allow it with --allow-env {name}"
    return None


def path_refused(entry: str, policy: TrustPolicy) -> str | None:
    """None if `entry` (a python_path entry or a venv) lies inside a directory the policy allows."""
    resolved = os.path.realpath(os.path.join(policy.cwd, entry))
    for allowed in policy.paths:
        if resolved == allowed or resolved.startswith(allowed.rstrip(os.sep) + os.sep):
            return None
    shown = entry if resolved == entry else f"{entry} (= {resolved})"
    return (f"{shown} would choose the code the process imports or runs; allow it with --allow-path "
            f"{resolved if Path(entry).is_absolute() else entry}")


# `package.module:attr.attr` -- the form `impl:` has, and how components name a callable in their args
_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
CODE_REF = re.compile(rf"^\s*({_IDENT}(?:\.{_IDENT})*)\s*:\s*{_IDENT}(?:\.{_IDENT})*\s*$")


def code_refs(value: object, path: str = "") -> Iterator[tuple[str, str]]:
    """(where, module) of every string in `value` (args: dicts, lists, scalars) that names code."""
    if isinstance(value, str):
        m = CODE_REF.match(value)
        if m:
            yield path, m.group(1)
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from code_refs(v, f"{path}.{k}" if path else str(k))
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            yield from code_refs(v, f"{path}[{i}]")


def check_trust(wf: Workflow, policy: TrustPolicy) -> list[Diagnostic]:
    """Every field of every component that chooses code outside the policy, positioned at its value."""
    out: list[Diagnostic] = []
    for c in wf.components.values():
        where = f"components.{c.name}"

        def at(key: str, c: Component = c) -> SourcePos:
            return c.field_pos.get(key, c.pos)

        reason = module_allowed(c.impl.partition(":")[0], policy.modules)
        if reason:
            out.append(Diagnostic(at("impl"), f"{where}.impl", reason))
        for arg, module in code_refs(c.args):  # an argument that names a callable the component will import
            reason = module_allowed(module, policy.modules)
            if reason:
                key = arg.split(".")[0].split("[")[0]
                out.append(Diagnostic(at(f"args.{key}"), f"{where}.args.{arg}",
                                      f"names code to import and call; {reason}"))
        for name in c.env:
            reason = env_refused(name, policy.env)
            if reason:
                out.append(Diagnostic(at(f"env.{name}"), f"{where}.env.{name}", reason))
        for i, entry in enumerate(c.python_path):
            reason = path_refused(entry, policy)
            if reason:
                out.append(Diagnostic(at(f"python_path[{i}]"), f"{where}.python_path[{i}]", reason))
        if c.venv is not None:
            reason = path_refused(c.venv, policy)
            if reason:
                out.append(Diagnostic(at("venv"), f"{where}.venv", reason))
    return sorted(out, key=Diagnostic.sort_key)
