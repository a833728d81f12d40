"""`rose`: the command on top of the language (`rose_dsl`) and the runtime (`interpreter`).

The layers point one way: `rose_dsl` (text -> IR -> analysis -> transforms -> plan) imports nothing
from `interpreter` (schedule, workers, backends, runner), and this package is the only one that imports
both. `main.py` assembles the command group; each command lives in a module of its own.
"""

from rose_dsl import __version__

__all__ = ["__version__"]
