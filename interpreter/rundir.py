"""The run directory (`rose execute --out DIR`): what a run writes there, and the rules that keep runs apart.

A run directory holds one training run: `metrics.jsonl` and TensorBoard's `tb/` (one step per RL
iteration), `checkpoints/`, the trace (`trace.json`, `trace.jsonl`), `nodes.json`, `stacks.txt`,
`recoveries.jsonl`. Two rules keep what a reader sees true:

* **one run per directory.** Starting again into a directory that holds a run's outputs would append to
  its metrics and add a second TensorBoard file, so it is refused unless the user says which they mean:
  `--resume` (continue it) or `--overwrite` (replace it).
* **never a step twice.** A run that continues from the checkpoint of iteration k (`--resume`, or a
  restart after a component died) re-runs k+1...; before it does, `metrics.jsonl` is cut back to
  iterations <= k (rewritten atomically) and TensorBoard is told to purge steps > k (`purge_step`, which
  TensorBoard applies to the earlier event files too), so both show each iteration once, as computed by
  the run that continued.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path
from typing import Any

from .loggers import Trackers

__all__ = ["OUTPUTS", "RunDirInUse", "check_run_dir", "clear_outputs", "MetricsLog"]

OUTPUTS = ("metrics.jsonl", "tb", "checkpoints", "trace.json", "trace.jsonl", "nodes.json", "stacks.txt",
           "recoveries.jsonl", "mlruns", "wandb")  # (mlruns, wandb: the optional loggers, loggers.py)


class RunDirInUse(Exception):
    """The run directory holds another run's outputs, or cannot be used; the message says what to do."""


def _existing(out: Path) -> list[str]:
    return [name for name in OUTPUTS if (out / name).exists()]


def check_run_dir(out: Path, *, resume: bool, overwrite: bool) -> None:
    """Refuse a run directory that would mix two runs (before anything starts)."""
    if resume and overwrite:
        raise RunDirInUse("--resume continues the run in --out and --overwrite replaces it: choose one")
    if out.exists() and not out.is_dir():
        raise RunDirInUse(f"--out {out} is a file, not a directory")
    existing = _existing(out) if out.is_dir() else []
    if resume:
        if not (out / "checkpoints").is_dir():
            raise RunDirInUse(f"--resume: {out} holds no checkpoints/ to continue from (was the run started with "
                              "--checkpoint-every N?)")
    elif existing and not overwrite:
        raise RunDirInUse(f"{out} holds the outputs of an earlier run ({', '.join(existing)}); continue it with "
                          "--resume, write to a new --out directory, or replace them with --overwrite")


def clear_outputs(out: Path) -> list[str]:
    """Remove an earlier run's outputs (`--overwrite`); other files in the directory are left alone."""
    removed = _existing(out) if out.is_dir() else []
    for name in removed:
        path = out / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    return removed


def _json_value(v: Any) -> Any:
    return None if isinstance(v, float) and math.isnan(v) else v


class MetricsLog:
    """`metrics.jsonl` and TensorBoard for one run directory, starting at iteration `start`: what an
    earlier segment logged for iterations >= `start` is dropped first (see the module docstring)."""

    def __init__(self, out: Path, start: int = 0, tensorboard: bool = True, loggers: tuple[str, ...] = (),
                 name: str = "rose") -> None:
        self.out = out
        self.tensorboard = tensorboard
        self.trackers = Trackers(out, loggers, name)  # MLflow, W&B (`--logger`)
        self._file: Any = None
        self._tb: Any = None
        self.unavailable: str | None = None  # why TensorBoard is not written, if it is not
        out.mkdir(parents=True, exist_ok=True)
        self._open(start)

    def _open(self, start: int) -> None:
        path = self.out / "metrics.jsonl"
        if start > 0 and path.exists():
            self._cut(path, start)
        self._file = path.open("a" if start > 0 else "w")
        self.trackers.open(start)
        if self.tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as exc:  # the `tensorboard` package is missing: metrics.jsonl only, said once
                self.tensorboard, self.unavailable = False, f"TensorBoard output off ({exc})"
                return
            # purge_step: TensorBoard drops every event at a step >= start from the earlier files
            self._tb = SummaryWriter(str(self.out / "tb"), purge_step=start if start > 0 else None)

    @staticmethod
    def _cut(path: Path, start: int) -> None:
        """Keep the lines of iterations < start (a torn last line, from a kill mid-write, goes too)."""
        kept = []
        for line in path.read_text().splitlines():
            try:
                if json.loads(line)["iteration"] < start:
                    kept.append(line)
            except (ValueError, KeyError, TypeError):
                continue
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text("".join(f"{line}\n" for line in kept))
        os.replace(tmp, path)

    def rewind(self, start: int) -> None:
        """The run continues from iteration `start` again (a restart from a checkpoint)."""
        self.close()
        self._open(start)

    def log(self, iteration: int, metrics: dict[str, float]) -> None:
        self._file.write(json.dumps({"iteration": iteration, **{k: _json_value(v) for k, v in metrics.items()}}) + "\n")
        self._file.flush()
        self.trackers.log(iteration, metrics)
        if self._tb is not None:
            for name, value in metrics.items():
                self._tb.add_scalar(name, value, iteration)

    def close(self) -> None:
        self.trackers.close()
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._tb is not None:
            self._tb.flush()
            self._tb.close()
            self._tb = None
