"""`python3 -m rose_cli ...` is the `rose` command (no install needed with the source tree on PYTHONPATH)."""

from .main import main

main()
