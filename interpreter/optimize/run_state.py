"""The state a run of `rose optimize --train --max-overhead P` keeps in its run directory
(`optimize_state.json`): what `--resume` needs of the search -- the current plan's requests, its expected
iteration time, the overhead spent. Its own module so that the driver (which reads it on `--resume`) and
the continuous loop (which writes it and calls the driver's plan writer) do not import each other."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..safe_io import write_atomic

__all__ = ["STATE_FILE", "read_state", "write_state"]

STATE_FILE = "optimize_state.json"


def read_state(out_dir: Path) -> dict[str, Any]:
    """`optimize_state.json` of a run directory (ValueError naming what is wrong)."""
    path = out_dir / STATE_FILE
    try:
        state = json.loads(path.read_text())
        float(state["expected_s"]), list(state["plan_requests"]), float(state["overhead"]["spent_s"])
    except FileNotFoundError:
        raise ValueError(f"{path} does not exist: --resume continues a run of rose optimize --train "
                         "--max-overhead in that run directory") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path} is not a state rose optimize wrote ({type(exc).__name__}: {exc})") from None
    return dict(state)


def write_state(out_dir: Path, state: dict[str, Any]) -> None:
    """Writes `state` to `out_dir`'s state file, whole or not at all."""
    out_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(out_dir / STATE_FILE, json.dumps(state, indent=1) + "\n")
