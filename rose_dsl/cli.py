"""The language's commands: `validate`, `graph`, `rewrite` -- and what every `rose` command shares.

The full `rose` command (`rose_cli`, on top of the language and the runtime) registers these next to
`execute` and `optimize`. This module stays runnable alone, `python -m rose_dsl.cli validate FILE`,
without the runtime installed or imported: checking a workflow must not need Ray or a GPU stack.

Conventions shared by every command (`make_app`, `load_or_exit`, `run_app`): `-h` and `--help`,
`--version`; exit codes from `ExitCode`; a user's mistake is one plain message and exit 2, never a
traceback; a bug is "internal error" and exit 1.
"""

from __future__ import annotations

import sys
from enum import IntEnum, StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from . import WorkflowError, __version__, load_workflow
from .analysis import analyze
from .errors import Diagnostic, SourcePos, printable, shown
from .ir import ExecutionNode, LoopNode, MergeNode, Workflow
from .trust import TrustPolicy, check_trust

__all__ = ["ExitCode", "app", "main", "make_app", "register", "run_app", "load_or_exit", "report_problems", "set_overrides",
           "write_output", "refuse_existing", "OverwriteOpt", "out", "err", "FileArg", "SetOpt", "AllowModuleOpt", "AllowEnvOpt", "AllowPathOpt"]


class ExitCode(IntEnum):
    """Every exit status of `rose` (docs/reliability.md)."""

    OK = 0
    INTERNAL = 1  # a bug in rose; the message says so
    INVALID = 2  # the user's input: a workflow, a plan, a command-line value, a run directory
    COMPONENT = 3  # a component failed (import, construction, a call), named by node and iteration
    WATCHDOG = 4  # a call did not return within --call-timeout
    CHECKPOINT = 5  # no usable checkpoint, or one could not be written
    INTERRUPTED = 130


class _Console(Console):
    """rich's Console, printing text with what a terminal would obey escaped (`errors.printable`): a name
    from a workflow, a plan or the command line (`\\e[2J`, an RTL override) is shown, never acted on. No emoji
    codes either: rich reads `:100:` as one, so `plan.yaml:100:1` printed as `plan.yaml💯1` (found by
    tests/cli/test_fuzz.py)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(emoji=False, **kwargs)

    def print(self, *objects: Any, **kwargs: Any) -> None:
        super().print(*(printable(o, lines=True) if isinstance(o, str) else o for o in objects), **kwargs)


out = _Console(highlight=False, soft_wrap=True)
err = _Console(stderr=True, highlight=False, soft_wrap=True)

FileArg = Annotated[Path, typer.Argument(help="workflow (or plan) YAML file", show_default=False, exists=True,
                                         dir_okay=False, readable=True)]
SetOpt = Annotated[list[str] | None, typer.Option("--set", help="override a param: NAME=VALUE (repeatable)")]


def _names_something(values: list[str] | None) -> list[str] | None:
    """An `--allow-*` value must name something: an empty one (`--allow-path "$DIR"` with DIR unset) allowed the
    current directory (`--allow-path ""`), or nothing while the command line read as if it allowed a module (found
    by tests/cli/test_fuzz.py)."""
    if any(not v.strip() for v in values or ()):
        raise typer.BadParameter("an empty value names nothing to allow (an unset shell variable?); name a module "
                                 "prefix, a variable or a directory")
    return values


AllowModuleOpt = Annotated[list[str] | None, typer.Option(
    "--allow-module", callback=_names_something,
    help="module prefix components may be imported from (repeatable; always allowed: examples.)")]
AllowEnvOpt = Annotated[list[str] | None, typer.Option(
    "--allow-env", callback=_names_something,
    help="let a component set this loader/interpreter variable, e.g. LD_LIBRARY_PATH (repeatable)")]
AllowPathOpt = Annotated[list[str] | None, typer.Option(
    "--allow-path", callback=_names_something,
    help="let components import from (python_path) or run an interpreter (venv) inside this directory (repeatable)")]


def _version(value: bool) -> None:
    if value:
        out.print(f"rose {__version__}", markup=False)
        raise typer.Exit(0)


def make_app(help: str) -> typer.Typer:
    """A `rose` command group: `-h` as well as `--help` on every command, and `--version`."""
    app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False, help=help,
                      context_settings={"help_option_names": ["-h", "--help"]}, rich_markup_mode=None)

    @app.callback()
    def _root(version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                                    help="print rose's version and exit")] = False) -> None:
        pass

    return app


def run_app(app: typer.Typer, prog_name: str | None = None) -> None:
    """Run a command group with rose's exit-code rules: a bug is exit 1 with one plain line (the traceback
    only with ROSE_DEBUG=1), Ctrl-C is exit 130."""
    import os

    try:
        app(prog_name=prog_name)
    except SystemExit:
        raise
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(ExitCode.INTERRUPTED)
    except Exception as exc:  # noqa: BLE001 - the last line of defence: a bug, said plainly
        import traceback

        err.print(f"internal error (a bug in rose, please report it): {type(exc).__name__}: {exc}", markup=False)
        if os.environ.get("ROSE_DEBUG"):
            traceback.print_exc()
        else:
            err.print("(ROSE_DEBUG=1 shows the traceback)", markup=False)
        sys.exit(ExitCode.INTERNAL)


def set_overrides(items: list[str] | None) -> dict[str, object]:
    """`--set NAME=VALUE` options as params, each value read as a workflow's values are
    (`loader.load_value`); a value that is not valid YAML (`[unclosed`, `*x`, a tag) is a WorkflowError
    at the command line, said once, exit 2 (they were PyYAML's errors, exit 1)."""
    from .loader import load_value

    result: dict[str, object] = {}
    problems = []
    for item in items or []:
        name, sep, raw = item.partition("=")
        if not sep or not name.strip():
            raise typer.BadParameter(f"--set expects NAME=VALUE, got {shown(item)}")
        try:
            result[name.strip()] = load_value(raw, f"--set {name.strip()}") if raw.strip() else ""
        except ValueError as exc:
            problems.append(Diagnostic(SourcePos("<command line>", 0, 0), f"params.{name.strip()}", str(exc)))
    if problems:
        raise WorkflowError(problems)
    return result


def load_or_exit(path: Path, sets: list[str] | None, source: Path | None = None,
                 source_sets: list[str] | None = None) -> Workflow:
    """The checked workflow, or every problem printed and exit 2. A plan is also checked against its
    source workflow (`source`, else the one its `plan: source:` records): it must keep every dependency
    of it (`transforms.plan_check`), since anyone may edit a plan by hand. `source_sets`: the `--set`s the
    source runs with beside the plan (`rose compare`), so a param the plan was written with is noted only
    where it differs from the source as run."""
    try:
        overrides = set_overrides(sets)
        as_run = set_overrides(source_sets)
        wf = load_workflow(path, overrides)
        _refuse_sets_on_a_plan(path, wf, overrides)
        # every file, plan or not: one with plan-only constructs and no `plan:` block (a plan cut short) is
        # refused there
        from .transforms.plan_check import check_plan_source

        differing = check_plan_source(wf, source, as_run)
        for name, (planned, declared) in differing.items():
            if name in overrides or (name in as_run and as_run[name] == planned):
                continue
            says = f"it runs with {as_run[name]!r} there" if name in as_run else f"its source says {declared!r}"
            err.print(f"note: the plan {path} was written with {name}={planned!r} ({says}), and runs with it",
                      markup=False)
        return wf
    except WorkflowError as exc:
        n = len(exc.diagnostics)
        err.print(exc.format(), markup=False)
        err.print(f"[red]{path}: invalid workflow ({n} problem{'s' if n != 1 else ''})[/red]")
        raise typer.Exit(ExitCode.INVALID) from None


def _refuse_sets_on_a_plan(path: Path, wf: Workflow, overrides: dict[str, Any]) -> None:
    """`--set` on a plan file changes nothing it runs (`rose optimize PLAN --set iterations=100` trained the
    plan's 4 iterations and then advised raising the iteration count): a plan holds its params resolved,
    its counts, args and quotas fixed when it was written. Each NAME is refused at the plan's `params:`
    entry for it, with the fix."""
    if wf.plan is None or not overrides:
        return
    import yaml

    text = path.read_text()
    marks: dict[str, SourcePos] = {}
    root = yaml.compose(text, Loader=yaml.SafeLoader)
    for key, value in root.value if isinstance(root, yaml.MappingNode) else []:
        if key.value == "params" and isinstance(value, yaml.MappingNode):
            marks = {k.value: SourcePos(str(path), k.start_mark.line + 1, k.start_mark.column + 1) for k, _ in value.value}
    problems = [Diagnostic(marks.get(name, SourcePos(str(path), 1, 1)), f"params.{name}",
                           f"--set {name}=... does not apply to a plan: a plan holds its params resolved (counts, "
                           "args and quotas were fixed when it was written)",
                           hint="write the plan again with the value (`rose rewrite SOURCE --set NAME=VALUE --do ...`), "
                                "or run the source workflow with --set and this plan with --plan")
                for name in overrides]
    raise WorkflowError(problems, text)


def report_problems(wf: Workflow, problems: list[Diagnostic], what: str) -> None:
    """Print positioned problems with their source lines, a count, and exit 2 (when there are any)."""
    if not problems:
        return
    try:
        text = Path(wf.file).read_text()
    except OSError:
        text = None
    err.print(WorkflowError(problems, text).format(), markup=False)
    n = len(problems)
    err.print(f"[red]{wf.file}: {n} problem{'s' if n != 1 else ''} {what}[/red]")
    raise typer.Exit(ExitCode.INVALID)


OverwriteOpt = Annotated[bool, typer.Option("--overwrite", help="replace the output file if it exists")]


def refuse_existing(path: Path, overwrite: bool, option: str = "-o") -> None:
    """The one rule of every file a user names for rose to write (`-o`, `--json`, `--report`...): an
    existing file is replaced only with `--overwrite`; otherwise exit 2 with the fix, before any work.
    Why: `rose rewrite -o` silently replaced a plan by hand while `rose optimize -o` refused (issue 42)."""
    if path.is_dir():
        err.print(f"error: {option} {path} is a directory; name a file", markup=False)
        raise typer.Exit(ExitCode.INVALID)
    if (path.exists() or path.is_symlink()) and not overwrite:
        err.print(f"error: {option} {path} already exists; choose another path, or replace it with --overwrite",
                  markup=False)
        raise typer.Exit(ExitCode.INVALID)


def write_output(path: Path, text: str) -> None:
    """Write a result file whole or not at all (temp file, rename); an unwritable path is the user's
    to fix: exit 2 naming it, nothing half-written. (Whether an existing file may be replaced is
    `refuse_existing`'s to say, asked before the work.)"""
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(text)
        tmp.replace(path)
    except OSError as exc:
        if tmp.parent.is_dir():
            tmp.unlink(missing_ok=True)
        err.print(f"error: cannot write {path}: {exc.strerror or exc}", markup=False)
        raise typer.Exit(ExitCode.INVALID) from None
    out.print(f"wrote {path}", markup=False)


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
               + (f" mps {c.mps_quota}%" if c.mps_quota else "")
               + (" mps priority below normal" if c.mps_priority else ""))
        t.add_row(c.name, c.impl, dev, ", ".join(s.name for s in c.state) or "-")
    out.print(t)
    t = Table(title="loops", title_justify="left", show_edge=False)
    for col in ("loop", "count", "kind", "why"):
        t.add_column(col)
    for loop in loops:
        k = a.loops[loop.path]
        count = str(loop.count) if not loop.dynamic else f"until, ≤{loop.count}"
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


def validate(
    file: FileArg,
    explain: Annotated[bool, typer.Option("--explain", help="print every derived dependency with its reason")] = False,
    import_: Annotated[bool, typer.Option("--import", help="also import every impl (a child process per component) and check the called methods")] = False,
    allow_module: AllowModuleOpt = None,
    allow_env: AllowEnvOpt = None,
    allow_path: AllowPathOpt = None,
    sets: SetOpt = None,
) -> None:
    """Parse, schema-check and legality-check a workflow; print its analysis."""
    wf = load_or_exit(file, sets)
    policy = TrustPolicy.from_options(allow_module, allow_env, allow_path)
    if import_:
        from .importcheck import import_problems

        report_problems(wf, import_problems(wf, policy), "found by importing the components")
    _summary(wf, explain)
    for d in check_trust(wf, policy):  # valid, but running it needs the command line's permission
        err.print(f"note: {d.pos}: {d.path}: {d.message}", markup=False)
    for loop in (i for i in wf.items() if isinstance(i, LoopNode) and i.dynamic):  # how it ends, said once
        err.print(f"note: {loop.field_pos.get('until') or loop.pos}: {until_note(wf, loop)}", markup=False)


def until_note(wf: Workflow, loop: LoopNode) -> str:
    """How a loop that ends on a condition runs (docs/language.md, `until`): per row, or as a whole."""
    from .resolve import Resolver
    from .until import whole_reason

    why = whole_reason(Resolver(wf), loop)
    if why is None:
        inner = [i.name for i in loop.body if isinstance(i, LoopNode)]
        what = ("every call in it declares batch:" if not inner else
                f"every call in it declares batch: and {', '.join(repr(n) for n in inner)} ends per row, "
                "starting with the rows done here done")
        return (f"loop '{loop.name}' ends per row ({what}): after each iteration a row whose "
                f"condition holds is done -- its values are final and later calls get only the rows not done -- and "
                f"the loop ends when every row is done, at most {loop.count} iterations")
    return (f"loop '{loop.name}' ends as a whole ({why}): every row runs every iteration until the condition holds for "
            f"all rows, at most {loop.count} iterations")


class GraphFormat(StrEnum):
    DOT = "dot"
    MERMAID = "mermaid"


def graph(
    file: FileArg,
    format: Annotated[GraphFormat, typer.Option("--format", "-f", help="dot or mermaid")] = GraphFormat.DOT,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="write here instead of stdout", dir_okay=False)] = None,
    overwrite: OverwriteOpt = False,
    sets: SetOpt = None,
) -> None:
    """Print the analysed graph: loops as clusters, data edges solid, state edges dashed."""
    from .render import to_dot, to_mermaid

    if output is not None:
        refuse_existing(output, overwrite)
    wf = load_or_exit(file, sets)
    a = analyze(wf, explain=True)
    text = to_dot(a) if format is GraphFormat.DOT else to_mermaid(a)
    if output is None:
        sys.stdout.write(text)
    else:
        write_output(output, text)


def rewrite(
    file: FileArg,
    do: Annotated[list[str] | None, typer.Option("--do", help="a rewrite request, applied in order (repeatable); see --help-requests")] = None,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="write the plan here", dir_okay=False)] = None,
    overwrite: OverwriteOpt = False,
    help_requests: Annotated[bool, typer.Option("--help-requests", help="list the rewrite requests")] = False,
    layout: Annotated[list[str] | None, typer.Option("--layout", help="NAME=VALUE: the plan runs with this value of a "
                                                     "layout param (e.g. sim_replicas=4: simulator processes), "
                                                     "checked as `rose optimize --layout` checks it (repeatable)")] = None,
    sets: SetOpt = None,
) -> None:
    """Apply rewrites by hand and write the plan (itself a workflow file), or say why one is refused."""
    from . import load_workflow_text
    from .serialize import to_yaml
    from .transforms import REQUEST_HELP, Refused, apply_request

    if help_requests or not (do or layout):
        out.print(REQUEST_HELP, markup=False)
        if not (do or layout):
            raise typer.Exit(ExitCode.OK if help_requests else ExitCode.INVALID)
        return
    if output is not None:
        if output.exists() and output.resolve() == file.resolve():
            err.print(f"error: -o {output} is the workflow itself; write the plan to another file", markup=False)
            raise typer.Exit(ExitCode.INVALID)
        refuse_existing(output, overwrite)
    wf = load_or_exit(file, sets)
    values = _layout_values(file, wf, sets, layout or [])
    if values:
        wf = load_or_exit(file, [*(sets or []), *(f"{k}={v}" for k, v in values.items())])
    applied: list[str] = [f"layout {k} = {v}" for k, v in values.items()]
    for request in do or []:
        try:
            result = apply_request(wf, request)
        except Refused as exc:
            err.print(f"refused: {request}: {exc.reason}", markup=False)
            if applied:
                err.print(f"(after: {'; '.join(applied)}) -- nothing written", markup=False)
            raise typer.Exit(ExitCode.INVALID) from None
        wf = result.workflow
        applied.append(result.description)
        out.print(f"applied: {result.description}", markup=False)
    header = "\n".join([f"# plan written by `rose rewrite` from {file}", *[f"#   {a}" for a in applied]])
    from .transforms.plan_check import recorded_source

    meta: dict[str, Any] = {"source": recorded_source(file, output), "rewrites": list(do or [])}
    if values:  # (the plan's params hold them too: `rose execute FILE --plan` checks it against FILE with them)
        meta["layout"] = values
    text = to_yaml(wf, plan=meta, header=header)
    try:
        load_workflow_text(text, "<plan, not written>")  # positions refer to the text shown, no file
    except WorkflowError as exc:  # a bug: a rewrite produced an invalid plan
        err.print(exc.format(), markup=False)
        err.print("internal error: the rewritten plan does not validate (a bug in rose); nothing written")
        raise typer.Exit(ExitCode.INTERNAL) from None
    if output is None:
        sys.stdout.write(text)
    else:
        write_output(output, text)


def layout_loader(file: Path, sets: list[str] | None) -> Any:
    """`optimizer.layouts.layouts`'s `load`: `file` with the `--set` values and a layout's params, an
    invalid one as ValueError with the first line of its message."""
    base_sets = set_overrides(sets)

    def load(extra: Any) -> Workflow:
        try:
            return load_workflow(file, {**base_sets, **extra})
        except WorkflowError as exc:
            raise ValueError(exc.format().strip().splitlines()[0]) from None

    return load


def _layout_values(file: Path, wf: Workflow, sets: list[str] | None, options: list[str]) -> dict[str, Any]:
    """`--layout NAME=VALUE` options as {NAME: VALUE}, each an admissible layout of `wf`
    (`optimizer/layouts.py`); exit 2 with the reason otherwise."""
    from .optimizer.layouts import layouts, parse_layout_option

    values: dict[str, Any] = {}
    try:
        for text in options:
            name, (value, *more) = parse_layout_option(text)
            if more or name in values:
                raise ValueError(f"--layout {text!r}: one value per param here (rose optimize --layout tries several)")
            values[name] = value
        for lay in layouts(wf, {k: [v] for k, v in values.items()}, layout_loader(file, sets)):
            if lay.refused:
                raise ValueError(f"--layout {lay.label} is not a layout of {file}: {lay.refused}")
    except ValueError as exc:
        err.print(f"error: {exc}", markup=False)
        raise typer.Exit(ExitCode.INVALID) from None
    return {k: v for k, v in values.items() if v != wf.params.get(k)}


def register(app: typer.Typer) -> None:
    """Add the language's commands to a `rose` command group."""
    app.command()(validate)
    app.command()(graph)
    app.command()(rewrite)


app = make_app("rose (language only): validate, graph and rewrite workflows. The full command, with "
               "`execute`, is `rose` (python -m rose_cli).")
register(app)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] in ("execute", "optimize"):  # commands of the full `rose`
        err.print(f"error: `{sys.argv[1]}` is a command of the full `rose` (python3 -m rose_cli {sys.argv[1]} ...); "
                  "`python3 -m rose_dsl.cli` has the language's commands only (validate, graph, rewrite)",
                  markup=False)
        sys.exit(ExitCode.INVALID)
    run_app(app, "python3 -m rose_dsl.cli")


if __name__ == "__main__":
    main()
