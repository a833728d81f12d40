"""The `rose` command group: the language's commands (`validate`, `graph`, `rewrite`) and the runtime's.

Adding a command is one module and one line: write `rose_cli/<name>.py` with a `register(app)` that adds
its typer command(s) -- `execute.py` is the example: options in the command function, the work in a
module imported only when the command runs (so `rose validate` never imports Ray or torch) -- and add
its `register` to `COMMANDS` below. Use `rose_dsl.cli`'s shared pieces (`load_or_exit`, `ExitCode`,
the `--allow-*` options and `TrustPolicy`) so every command keeps the same conventions.
"""

from __future__ import annotations

import os
import sys

from rose_dsl import cli as language
from rose_dsl.cli import make_app, run_app

from . import compare, execute, init, optimize

__all__ = ["COMMANDS", "app", "main"]

COMMANDS = (
    language.register,  # validate, graph, rewrite
    execute.register,  # execute
    optimize.register,  # optimize
    compare.register,  # compare
    init.register,  # init
)

app = make_app("rose: declarative RL workflows, rewritten for overlap and run on Ray.")
for register in COMMANDS:
    register(app)


def main() -> None:
    # components are imported from the current directory as well, as under `python -m` and in Ray's
    # workers (Ray adds the driver's directory): a source checkout's `examples` from an installed rose
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.append(cwd)
    run_app(app, "rose")


if __name__ == "__main__":
    main()
