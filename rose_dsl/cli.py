"""The `rose` command line: validate, graph (and, as they land, rewrite / optimize / execute).

Exit codes: 0 success, 2 an invalid workflow or bad usage (one clear message each, never a
traceback), 1 an internal error (a bug: the message says so).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from . import WorkflowError, load_workflow
from .analysis import analyze
from .importcheck import DEFAULT_ALLOWED, check_imports, module_allowed
from .ir import ExecutionNode, LoopNode, MergeNode, Workflow

__all__ = ["app", "main"]

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="rose: declarative RL workflows, rewritten for overlap and run on Ray.")
out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)

FileArg = Annotated[Path, typer.Argument(help="workflow (or plan) YAML file", show_default=False)]
SetOpt = Annotated[list[str] | None, typer.Option("--set", help="override a param: NAME=VALUE (repeatable)")]


def _overrides(items: list[str] | None) -> dict[str, object]:
    import yaml

    result: dict[str, object] = {}
    for item in items or []:
        name, sep, raw = item.partition("=")
        if not sep or not name.strip():
            raise typer.BadParameter(f"--set expects NAME=VALUE, got {item!r}")
        result[name.strip()] = yaml.safe_load(raw) if raw.strip() else ""
    return result


def _load(path: Path, sets: list[str] | None, source: Path | None = None) -> Workflow:
    from .transforms.plan_check import check_plan_source

    try:
        wf = load_workflow(path, _overrides(sets))
        check_plan_source(wf, source)  # a plan must keep every dependency of its source workflow
        return wf
    except WorkflowError as exc:
        n = len(exc.diagnostics)
        err.print(exc.format(), markup=False)
        err.print(f"[red]{path}: invalid workflow ({n} problem{'s' if n != 1 else ''})[/red]")
        raise typer.Exit(2) from None


def _summary(wf: Workflow, explain: bool) -> None:
    a = analyze(wf, explain=explain)
    items = list(wf.items())
    nodes = [i for i in items if isinstance(i, ExecutionNode)]
    loops = [i for i in items if isinstance(i, LoopNode)]
    merges = [i for i in items if isinstance(i, MergeNode)]
    out.print(f"[bold]{wf.name}[/bold] ({wf.file}): valid. {len(wf.components)} components, {len(nodes)} nodes, "
              f"{len(loops)} loops" + (f", {len(merges)} merges" if merges else ""))
    t = Table(title="components", title_justify="left", show_edge=False)
    for col in ("name", "impl", "device", "state"):
        t.add_column(col)
    for c in wf.components.values():
        first = c.gpu or 0
        gpus = (f":{first}" if c.replicas == 1 else f":{first}-{first + c.replicas - 1}") if c.device == "gpu" else ""
        dev = (c.device + gpus + (f" ×{c.replicas}" if c.replicas > 1 else "")
               + (f" mps {c.mps_quota}%" if c.mps_quota else ""))
        t.add_row(c.name, c.impl, dev, ", ".join(s.name for s in c.state) or "-")
    out.print(t)
    t = Table(title="loops", title_justify="left", show_edge=False)
    for col in ("loop", "count", "kind", "why"):
        t.add_column(col)
    for loop in loops:
        k = a.loops[loop.path]
        count = str(loop.count) if loop.count is not None else "until"
        t.add_row(".".join(loop.path), count, k.kind, "; ".join(k.reasons))
    out.print(t)
    t = Table(title="state objects", title_justify="left", show_edge=False)
    t.add_column("state")
    t.add_column("accessed by (program order)")
    for key in wf.state_objects():
        acc = a.accessors.get(key, [])
        t.add_row(key, ", ".join(f"{p[-1]} ({m.value})" for p, m in acc) or "never accessed")
    out.print(t)
    if a.versions:
        out.print("[bold]versions across RL iterations[/bold]")
        for line in a.versions:
            out.print(f"  {line}")
    if explain:
        t = Table(title="dependencies (producer -> consumer)", title_justify="left", show_edge=False)
        for col in ("producer", "consumer", "kind", "iterations", "reason"):
            t.add_column(col)
        for e in a.edges:
            kind = e.kind if e.flow else f"{e.kind} (order)"
            t.add_row(".".join(e.producer[1:]), ".".join(e.consumer[1:]), kind, e.relation, e.detail)
        out.print(t)


@app.command()
def validate(
    file: FileArg,
    explain: Annotated[bool, typer.Option("--explain", help="print every derived dependency with its reason")] = False,
    import_: Annotated[bool, typer.Option("--import", help="also import every impl (in a child process) and check the called methods")] = False,
    allow_module: Annotated[list[str] | None, typer.Option("--allow-module", help="module prefix components may come from (repeatable; default: examples)")] = None,
    sets: SetOpt = None,
) -> None:
    """Parse, schema-check and legality-check a workflow; print its analysis."""
    wf = _load(file, sets)
    if import_:
        allowed = tuple(allow_module or ()) + DEFAULT_ALLOWED
        specs: dict[str, tuple[str, list[str]]] = {}
        problems = []
        for c in wf.components.values():
            reason = module_allowed(c.impl.partition(":")[0], allowed)
            if reason:
                problems.append(f"{c.pos}: components.{c.name}.impl: {reason}")
                continue
            methods = sorted({n.method for n in wf.items() if isinstance(n, ExecutionNode) and n.component == c.name})
            specs[c.name] = (c.impl, methods)
        import os

        root = str(Path(__file__).resolve().parent.parent)
        for name, spec in specs.items():  # one child per component: each with its own environment
            c = wf.components[name]
            paths = [*c.python_path, root, *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]]
            env = {**{k: str(v) for k, v in c.env.items()}, "PYTHONPATH": os.pathsep.join(dict.fromkeys(paths))}
            problem = check_imports({name: spec}, env=env).get(name)
            if problem:
                problems.append(f"{c.pos}: components.{name}.impl: {problem}")
        if problems:
            for p in problems:
                err.print(p, markup=False)
            err.print(f"[red]{file}: {len(problems)} component(s) failed the import check[/red]")
            raise typer.Exit(2)
    _summary(wf, explain)


@app.command()
def graph(
    file: FileArg,
    format: Annotated[str, typer.Option("--format", "-f", help="dot or mermaid")] = "dot",
    output: Annotated[Path | None, typer.Option("--output", "-o", help="write here instead of stdout")] = None,
    sets: SetOpt = None,
) -> None:
    """Print the analysed graph: loops as clusters, data edges solid, state edges dashed."""
    from .render import to_dot, to_mermaid

    if format not in ("dot", "mermaid"):
        err.print(f"--format must be 'dot' or 'mermaid', not {format!r}")
        raise typer.Exit(2)
    wf = _load(file, sets)
    a = analyze(wf, explain=True)
    text = to_dot(a) if format == "dot" else to_mermaid(a)
    if output is None:
        sys.stdout.write(text)
    else:
        output.write_text(text)
        out.print(f"wrote {output}")


@app.command()
def rewrite(
    file: FileArg,
    do: Annotated[list[str], typer.Option("--do", help="a rewrite request, applied in order (repeatable); see --help-requests")] = [],  # noqa: B006
    output: Annotated[Path | None, typer.Option("--output", "-o", help="write the plan here")] = None,
    help_requests: Annotated[bool, typer.Option("--help-requests", help="list the rewrite requests")] = False,
    sets: SetOpt = None,
) -> None:
    """Apply rewrites by hand and write the plan (itself a workflow file), or say why one is refused."""
    from .serialize import to_yaml
    from .transforms import REQUEST_HELP, Refused, apply_request

    if help_requests or not do:
        out.print(REQUEST_HELP, markup=False)
        if not do:
            raise typer.Exit(0 if help_requests else 2)
        return
    wf = _load(file, sets)
    applied = []
    for request in do:
        try:
            result = apply_request(wf, request)
        except Refused as exc:
            err.print(f"refused: {request}: {exc.reason}", markup=False)
            if applied:
                err.print(f"(after: {'; '.join(applied)}) -- nothing written", markup=False)
            raise typer.Exit(2) from None
        wf = result.workflow
        applied.append(result.description)
        out.print(f"applied: {result.description}", markup=False)
    header = "\n".join([f"# plan written by `rose rewrite` from {file}", *[f"#   {a}" for a in applied]])
    text = to_yaml(wf, plan={"source": str(file), "rewrites": list(do)}, header=header)
    from . import load_workflow_text

    try:
        load_workflow_text(text, "<plan, not written>")  # positions refer to the text shown, no file
    except WorkflowError as exc:  # a bug: a rewrite produced an invalid plan
        err.print(exc.format(), markup=False)
        err.print("internal error: the rewritten plan does not validate (a bug in rose); nothing written")
        raise typer.Exit(1) from None
    if output is None:
        sys.stdout.write(text)
    else:
        tmp = output.with_name(output.name + ".tmp")
        tmp.write_text(text)
        tmp.replace(output)
        out.print(f"wrote {output}")


@app.command()
def execute(
    file: FileArg,
    plan: Annotated[Path | None, typer.Option("--plan", help="run this plan (a rewritten workflow) instead of FILE")] = None,
    backend: Annotated[str, typer.Option("--backend", help="local (threads in this process) or ray (one actor per component)")] = "local",
    iterations: Annotated[int | None, typer.Option("--iterations", "-n", help="RL iterations (default: the workflow's count)")] = None,
    out_dir: Annotated[Path | None, typer.Option("--out", help="run directory: metrics.jsonl, tb/, trace.json, checkpoints/")] = None,
    checkpoint_every: Annotated[int, typer.Option("--checkpoint-every", help="checkpoint every N iterations (0: never)")] = 0,
    resume: Annotated[bool, typer.Option("--resume", help="continue from the last complete checkpoint in --out")] = False,
    address: Annotated[str | None, typer.Option("--address", help="join this Ray cluster instead of starting one")] = None,
    call_timeout: Annotated[float, typer.Option("--call-timeout", help="watchdog: seconds an iteration's calls may take")] = 900.0,
    allow_module: Annotated[list[str] | None, typer.Option("--allow-module", help="extra module prefix for impl (repeatable)")] = None,
    mps: Annotated[bool, typer.Option("--mps/--no-mps", help="run GPU components under NVIDIA MPS with their quotas")] = True,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no per-iteration lines")] = False,
    compiled: Annotated[bool, typer.Option("--compiled/--no-compiled", help="ray: compile each iteration into a Ray Compiled Graph")] = True,
    sets: SetOpt = None,
) -> None:
    """Train: run RL iterations of a workflow (or plan) on the local or Ray backend."""
    from .run_cli import execute_command

    if plan is not None and sets:
        err.print(f"error: --set does not apply to a plan ({plan}): a plan holds its params resolved (args, counts, "
                  "quotas); pass --set to `rose rewrite` when writing the plan", markup=False)
        raise typer.Exit(2)
    code = execute_command(out, err, _load(plan or file, sets, source=file if plan else None), backend=backend, iterations=iterations, out_dir=out_dir,
                           checkpoint_every=checkpoint_every, resume=resume, address=address, call_timeout=call_timeout,
                           allowed=tuple(allow_module or ()), mps=mps, quiet=quiet, compiled=compiled)
    raise typer.Exit(code)


def main() -> None:
    try:
        app()
    except SystemExit:
        raise
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)
    except Exception as exc:  # noqa: BLE001 - the last line of defence: a bug, said plainly
        import traceback

        err.print(f"internal error (a bug in rose, please report it): {type(exc).__name__}: {exc}", markup=False)
        if "--debug" in sys.argv or __import__("os").environ.get("ROSE_DEBUG"):
            traceback.print_exc()
        sys.exit(1)


if __name__ == "__main__":
    main()
