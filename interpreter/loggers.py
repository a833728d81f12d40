"""Where a run's metrics go besides `metrics.jsonl`: TensorBoard (the default), MLflow or Weights & Biases,
chosen on the command line (`rose execute --logger tensorboard,mlflow`).

Why more than TensorBoard: RL users compare runs where they already keep them. Both trackers are optional
(`pip install 'rose[mlflow]'`, `'rose[wandb]'`: neither is a dependency of rose -- MLflow brings a web
stack, W&B a service binary) and both write locally, so a run needs no server and no account:

* **mlflow**: a local SQLite store in the run directory, `RUN/mlflow.db` (`mlflow ui --backend-store-uri
  sqlite:///RUN/mlflow.db`): MLflow 3 keeps its file store in maintenance mode and refuses to open one
  without `MLFLOW_ALLOW_FILE_STORE=true` (its UI and `MlflowClient` included); SQLite is the local store it
  recommends. One MLflow experiment per workflow name; the workflow's params are the run's MLflow params
  (runs compare by their settings in MLflow's UI). `MLFLOW_TRACKING_URI`, when set, wins (a server).
* **wandb**: offline mode (`wandb.init(mode="offline")`), files under `RUN/wandb` (`wandb sync RUN/wandb/...`
  uploads them later); `WANDB_MODE=online` in the environment logs online instead.

One step per RL iteration, as in TensorBoard. A run directory shows each iteration once
(`interpreter/rundir.py`): a run that continues from a checkpoint (`--resume`, a restart after a component
died) cuts `metrics.jsonl` back and tells TensorBoard to purge later steps, but neither tracker can delete
logged points -- so each segment is a run of its own, tagged with the iteration it starts at
(`rose.start_iteration`) and, after a restart in the same process, the run it continues (`rose.continues`):
each step appears once per tracker run, and the latest run holds the steps from its start on.
"""

from __future__ import annotations

import importlib.util
import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

__all__ = ["LOGGERS", "EXTRAS", "MetricsLogger", "Trackers", "parse_loggers", "missing", "make_logger"]

LOGGERS = ("tensorboard", "mlflow", "wandb")
# the module each needs, and the pip extra that installs it
EXTRAS = {"tensorboard": ("tensorboard", "rose"), "mlflow": ("mlflow", "rose[mlflow]"), "wandb": ("wandb", "rose[wandb]")}


class MetricsLogger(Protocol):
    """A tracker that receives each iteration's metrics; `close` ends its run (on every exit path)."""

    def log(self, iteration: int, metrics: Mapping[str, float]) -> None: ...

    def close(self) -> None: ...


def parse_loggers(text: str) -> tuple[str, ...]:
    """`tensorboard,mlflow` -> ("tensorboard", "mlflow"); `none`: metrics.jsonl only. ValueError naming the
    unknown ones, for an empty value (`--logger ""`: say `none`) and for `none` beside a logger."""
    names = tuple(dict.fromkeys(n.strip().lower() for n in text.split(",") if n.strip()))
    if not names:
        raise ValueError(f"{text!r} names no logger: say --logger none for metrics.jsonl only, or choose from "
                         f"{', '.join(LOGGERS)}")
    if names == ("none",):
        return ()
    if "none" in names:
        others = ",".join(n for n in names if n != "none")
        raise ValueError(f"none means no logger besides metrics.jsonl, so it goes alone: --logger none, or "
                         f"--logger {others}")
    unknown = [n for n in names if n not in LOGGERS]
    if unknown:
        raise ValueError(f"unknown logger(s) {', '.join(unknown)}: choose from {', '.join(LOGGERS)} "
                         "(comma-separated), or none")
    return names


# what else a logger needs: MLflow's SQLite store (the local one) is SQLAlchemy + Alembic, not in mlflow-skinny
NEEDS = {"mlflow": ("sqlalchemy", "alembic")}


def missing(names: tuple[str, ...]) -> list[str]:
    """The loggers among `names` whose packages are not installed, each as `NAME (pip install 'EXTRA')`."""
    import os

    def lacks(n: str) -> bool:
        extra = () if n == "mlflow" and os.environ.get("MLFLOW_TRACKING_URI") else NEEDS.get(n, ())
        return any(importlib.util.find_spec(m) is None for m in (EXTRAS[n][0], *extra))

    return [f"{n} (pip install '{EXTRAS[n][1]}')" for n in names if lacks(n)]


def _finite(metrics: Mapping[str, float]) -> dict[str, float]:
    """The metrics a tracker takes: numbers that are finite (a NaN mean of no episodes is left out)."""
    out = {}
    for k, v in metrics.items():
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v):
            out[k] = float(v)
    return out


class MlflowLogger:
    """An MLflow run in the local SQLite store `out/mlflow.db` (experiment: the workflow's name), or at the user's
    `MLFLOW_TRACKING_URI` when one is set (a server, or a database with the full `mlflow`)."""

    def __init__(self, out: Path, name: str, start: int, previous: str | None = None,
                 params: Mapping[str, Any] | None = None) -> None:
        import os

        from mlflow.tracking import MlflowClient

        uri = os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{(out / 'mlflow.db').resolve()}"
        self.client = MlflowClient(tracking_uri=uri)
        found = self.client.get_experiment_by_name(name)
        experiment = found.experiment_id if found is not None else self.client.create_experiment(name)
        tags = {"rose.start_iteration": str(start), **({"rose.continues": previous} if previous else {})}
        self.run_id = self.client.create_run(experiment, run_name=f"{name} from iteration {start}", tags=tags).info.run_id
        if params:
            from mlflow.entities import Param

            # MLflow params are strings; a value as the workflow would write it (JSON), cut to MLflow's limit
            self.client.log_batch(self.run_id, params=[Param(k, _param_text(v)) for k, v in sorted(params.items())])

    def log(self, iteration: int, metrics: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)  # (MLflow's record of when: wall-clock milliseconds)
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, now, iteration) for k, v in _finite(metrics).items()])

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


def _param_text(value: Any) -> str:
    import json

    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text[:6000]  # (MLflow's limit on a param's value)


class WandbLogger:
    """A W&B run in offline mode under `out/wandb` (project: the workflow's name)."""

    def __init__(self, out: Path, name: str, start: int, previous: str | None = None,
                 params: Mapping[str, Any] | None = None) -> None:
        import os

        import wandb

        config = {**(params or {}), "rose.start_iteration": start, **({"rose.continues": previous} if previous else {})}
        self.run = wandb.init(project=name, name=f"{name} from iteration {start}", dir=str(out), config=config,
                              mode=os.environ.get("WANDB_MODE", "offline"))
        self.run_id = self.run.id

    def log(self, iteration: int, metrics: Mapping[str, float]) -> None:
        self.run.log(_finite(metrics), step=iteration)

    def close(self) -> None:
        self.run.finish()


_MAKERS: dict[str, Any] = {"mlflow": MlflowLogger, "wandb": WandbLogger}


def make_logger(kind: str, out: Path, name: str, start: int, previous: str | None = None,
                params: Mapping[str, Any] | None = None) -> MetricsLogger:
    """The tracker `kind` ("mlflow" | "wandb") for the run directory `out`, workflow `name`, from iteration
    `start`; `previous`: the run of the same tracker this one continues (a resume or a restart); `params`:
    the workflow's params, the run's own (MLflow params, W&B config)."""
    return _MAKERS[kind](out, name, start, previous, params)


class Trackers:
    """The trackers of one run directory (`MetricsLog` holds one): `open(start)` begins a run of each at
    iteration `start` (a rewind ends the current ones first, and the new runs name them), `log` sends an
    iteration's metrics to each, `close` ends them."""

    def __init__(self, out: Path, kinds: tuple[str, ...], name: str, params: Mapping[str, Any] | None = None) -> None:
        self.out, self.kinds, self.name = out, tuple(k for k in kinds if k in _MAKERS), name
        self.params = dict(params or {})
        self.open_ones: dict[str, MetricsLogger] = {}
        self._previous: dict[str, str] = {}

    def open(self, start: int) -> None:
        self.close()
        for kind in self.kinds:
            self.open_ones[kind] = make_logger(kind, self.out, self.name, start, self._previous.get(kind), self.params)

    def log(self, iteration: int, metrics: Mapping[str, float]) -> None:
        for logger in self.open_ones.values():
            logger.log(iteration, metrics)

    def close(self) -> None:
        while self.open_ones:
            kind, logger = self.open_ones.popitem()
            self._previous[kind] = getattr(logger, "run_id", "") or ""
            logger.close()
