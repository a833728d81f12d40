"""The `rose` command's modules that sit on top of both the language (`rose_dsl`) and the runtime
(`interpreter`). `optimize.py` is `rose optimize`; `register(app)` adds it to a typer app."""
