"""Metrics where RL users look (issue 42): besides metrics.jsonl and TensorBoard, MLflow (local file store)
and Weights & Biases (offline), chosen with `rose execute --logger`. Neither package is a dependency of
rose, so the calls each logger makes are checked against fake modules that record them (always run), and
against the real packages, offline, where they are installed (`pip install 'rose[mlflow]' 'rose[wandb]'`)."""

from __future__ import annotations

import math
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from interpreter.loggers import parse_loggers
from interpreter.rundir import MetricsLog


class FakeMlflow:
    """`mlflow.tracking.MlflowClient` and `mlflow.entities.Metric`, recording every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.experiments: dict[str, str] = {}
        fake = self

        class Metric:
            def __init__(self, key: str, value: float, timestamp: int, step: int) -> None:
                self.key, self.value, self.timestamp, self.step = key, value, timestamp, step

        class Param:
            def __init__(self, key: str, value: str) -> None:
                assert isinstance(value, str)  # (MLflow's params are strings)
                self.key, self.value = key, value

        class MlflowClient:
            def __init__(self, tracking_uri: str) -> None:
                fake.calls.append(("client", tracking_uri))

            def get_experiment_by_name(self, name: str) -> Any:
                eid = fake.experiments.get(name)
                return None if eid is None else types.SimpleNamespace(experiment_id=eid)

            def create_experiment(self, name: str) -> str:
                fake.calls.append(("create_experiment", name))
                fake.experiments[name] = f"e{len(fake.experiments)}"
                return fake.experiments[name]

            def create_run(self, experiment_id: str, run_name: str, tags: dict[str, str]) -> Any:
                run_id = f"r{sum(1 for c in fake.calls if c[0] == 'create_run')}"
                fake.calls.append(("create_run", (experiment_id, run_name, dict(tags))))
                return types.SimpleNamespace(info=types.SimpleNamespace(run_id=run_id))

            def log_batch(self, run_id: str, metrics: list[Any] = (), params: list[Any] = ()) -> None:
                if metrics:
                    fake.calls.append(("log_batch", (run_id, {m.key: (m.value, m.step) for m in metrics})))
                if params:
                    fake.calls.append(("log_params", (run_id, {p.key: p.value for p in params})))

            def set_terminated(self, run_id: str) -> None:
                fake.calls.append(("set_terminated", run_id))

        self.modules = {"mlflow": types.ModuleType("mlflow"), "mlflow.tracking": types.ModuleType("mlflow.tracking"),
                        "mlflow.entities": types.ModuleType("mlflow.entities")}
        self.modules["mlflow.tracking"].MlflowClient = MlflowClient  # type: ignore[attr-defined]
        self.modules["mlflow.entities"].Metric = Metric  # type: ignore[attr-defined]
        self.modules["mlflow.entities"].Param = Param  # type: ignore[attr-defined]

    def named(self, name: str) -> list[Any]:
        return [arg for kind, arg in self.calls if kind == name]


class FakeWandb:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        fake = self

        class Run:
            def __init__(self, n: int) -> None:
                self.id = f"w{n}"

            def log(self, metrics: dict[str, float], step: int) -> None:
                fake.calls.append(("log", (self.id, step, dict(metrics))))

            def finish(self) -> None:
                fake.calls.append(("finish", self.id))

        def init(**kwargs: Any) -> Run:
            fake.calls.append(("init", kwargs))
            return Run(len(fake.named("init")))

        self.modules = {"wandb": types.ModuleType("wandb")}
        self.modules["wandb"].init = init  # type: ignore[attr-defined]

    def named(self, name: str) -> list[Any]:
        return [arg for kind, arg in self.calls if kind == name]


@pytest.fixture
def fake_mlflow(monkeypatch: pytest.MonkeyPatch) -> FakeMlflow:
    fake = FakeMlflow()
    for name, module in fake.modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return fake


@pytest.fixture
def fake_wandb(monkeypatch: pytest.MonkeyPatch) -> FakeWandb:
    fake = FakeWandb()
    for name, module in fake.modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    return fake


def test_the_option_names_known_loggers_only() -> None:
    assert parse_loggers("tensorboard, MLflow,wandb,mlflow") == ("tensorboard", "mlflow", "wandb")
    assert parse_loggers("none") == () and parse_loggers(" NONE ") == ()
    with pytest.raises(ValueError, match="unknown logger.*comet.*choose from tensorboard, mlflow, wandb"):
        parse_loggers("mlflow,comet")
    # `none,mlflow` said "unknown logger(s) none", `""` silently meant none (issue 59)
    with pytest.raises(ValueError, match="none means no logger besides metrics.jsonl, so it goes alone: --logger "
                                         "none, or --logger mlflow"):
        parse_loggers("none,mlflow")
    for empty in ("", " , "):
        with pytest.raises(ValueError, match="names no logger: say --logger none"):
            parse_loggers(empty)


def test_mlflow_gets_one_step_per_iteration_in_a_local_store(tmp_path: Path, fake_mlflow: FakeMlflow) -> None:
    """In a SQLite store (MLflow 3 refuses to open its file store without MLFLOW_ALLOW_FILE_STORE), with the
    workflow's params as the run's MLflow params (there were none: runs could not be compared by their
    settings, issue 59)."""
    log = MetricsLog(tmp_path, 0, tensorboard=False, loggers=("mlflow",), name="ppo",
                     params={"lr": 0.0003, "num_envs": 64, "algo": "ppo", "sizes": [64, 64]})
    log.log(0, {"iteration_s": 0.5, "sim/reward": -3.0, "sim/episode_return": math.nan})
    log.log(1, {"iteration_s": 0.4, "sim/reward": -2.0})
    log.close()
    assert fake_mlflow.named("client") == [f"sqlite:///{(tmp_path / 'mlflow.db').resolve()}"]
    assert fake_mlflow.named("log_params") == [
        ("r0", {"algo": "ppo", "lr": "0.0003", "num_envs": "64", "sizes": "[64, 64]"})]
    assert fake_mlflow.named("create_experiment") == ["ppo"]
    assert fake_mlflow.named("create_run") == [("e0", "ppo from iteration 0", {"rose.start_iteration": "0"})]
    assert fake_mlflow.named("log_batch") == [  # (a NaN is left out: no episode ended)
        ("r0", {"iteration_s": (0.5, 0), "sim/reward": (-3.0, 0)}),
        ("r0", {"iteration_s": (0.4, 1), "sim/reward": (-2.0, 1)})]
    assert fake_mlflow.named("set_terminated") == ["r0"]


def test_a_rewind_starts_a_new_tracker_run_that_names_the_one_it_continues(tmp_path: Path,
                                                                              fake_mlflow: FakeMlflow) -> None:
    """A restart from the checkpoint of iteration 0 runs iteration 1 again: trackers cannot delete points,
    so the iterations from 1 on go to a new run, tagged with where it starts and which run it continues."""
    log = MetricsLog(tmp_path, 0, tensorboard=False, loggers=("mlflow",), name="ppo")
    log.log(0, {"a": 1.0})
    log.log(1, {"a": 2.0})
    log.rewind(1)
    log.log(1, {"a": 3.0})
    log.close()
    runs = fake_mlflow.named("create_run")
    assert runs[1] == ("e0", "ppo from iteration 1", {"rose.start_iteration": "1", "rose.continues": "r0"})
    assert fake_mlflow.named("create_experiment") == ["ppo"]  # the same experiment
    assert fake_mlflow.named("log_batch")[-1] == ("r1", {"a": (3.0, 1)})
    assert fake_mlflow.named("set_terminated") == ["r0", "r1"]


def test_wandb_runs_offline_in_the_run_directory(tmp_path: Path, fake_wandb: FakeWandb) -> None:
    log = MetricsLog(tmp_path, 3, tensorboard=False, loggers=("wandb",), name="ppo")
    log.log(3, {"iteration_s": 0.5, "sim/reward": math.inf})
    log.close()
    (init,) = fake_wandb.named("init")
    assert init["mode"] == "offline" and init["dir"] == str(tmp_path) and init["project"] == "ppo"
    assert init["config"] == {"rose.start_iteration": 3}
    assert fake_wandb.named("log") == [("w1", 3, {"iteration_s": 0.5})]
    assert fake_wandb.named("finish") == ["w1"]


TINY = """rose: 1
name: tiny
components:
  a: {impl: "tests.mocks:Sleeper", args: {seconds: 0.0}}
iteration:
  count: 3
  body:
    - {node: w, call: a.work, in: {x: iteration.i}, out: [y]}
"""


def _execute(tmp_path: Path, *args: str) -> Any:
    from rose_cli.main import app

    wf = tmp_path / "wf.yaml"
    wf.write_text(TINY)
    return CliRunner().invoke(app, ["execute", str(wf), "--allow-module", "tests", "--backend", "local", "-q", *args])


def test_rose_execute_logs_to_the_trackers_named(tmp_path: Path, fake_mlflow: FakeMlflow, fake_wandb: FakeWandb,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    import interpreter.loggers as loggers

    monkeypatch.setattr(loggers, "missing", lambda names: [])  # (the fakes are not importable by find_spec)
    r = _execute(tmp_path, "--out", str(tmp_path / "run"), "--logger", "mlflow,wandb")
    assert r.exit_code == 0, r.output
    assert [step for _, (_, step) in ((rid, next(iter(m.values()))) for rid, m in fake_mlflow.named("log_batch"))
            ] == [0, 1, 2]
    assert [step for _, step, _ in fake_wandb.named("log")] == [0, 1, 2]
    assert not (tmp_path / "run" / "tb").exists()  # TensorBoard only when named
    assert (tmp_path / "run" / "metrics.jsonl").read_text().count("\n") == 3  # always


@pytest.mark.parametrize(("value", "message"), [
    ("comet", "--logger: unknown logger(s) comet"),
    ("mlflow", "--logger: not installed: mlflow (pip install 'rose[mlflow]')"),
])
def test_a_logger_that_cannot_run_is_exit_2_before_anything_starts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    value: str, message: str) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else real(name, *a))
    r = _execute(tmp_path, "--out", str(tmp_path / "run"), "--logger", value)
    assert r.exit_code == 2 and message in r.output and "Traceback" not in r.output, r.output
    assert not (tmp_path / "run").exists()


def test_the_real_mlflow_sqlite_store_holds_the_steps_and_params(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("mlflow", reason="MLflow is optional (pip install 'rose[mlflow]'); its calls are checked "
                                         "against a fake above")
    pytest.importorskip("sqlalchemy", reason="MLflow's SQLite store needs SQLAlchemy (pip install 'rose[mlflow]')")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)  # (not needed: no file store)
    from mlflow.tracking import MlflowClient

    log = MetricsLog(tmp_path, 0, tensorboard=False, loggers=("mlflow",), name="ppo", params={"lr": 0.001, "n": 4})
    for k in range(3):
        log.log(k, {"sim/reward": float(k)})
    log.close()
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")  # what `mlflow ui` opens
    (run,) = client.search_runs([client.get_experiment_by_name("ppo").experiment_id])
    history = client.get_metric_history(run.info.run_id, "sim/reward")
    assert [(m.step, m.value) for m in history] == [(0, 0.0), (1, 1.0), (2, 2.0)]
    assert run.info.status == "FINISHED" and run.data.params == {"lr": "0.001", "n": "4"}
    assert not (tmp_path / "mlruns").exists()


def test_the_real_wandb_writes_an_offline_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("wandb", reason="Weights & Biases is optional (pip install 'rose[wandb]'); its calls are "
                                        "checked against a fake above")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    log = MetricsLog(tmp_path, 0, tensorboard=False, loggers=("wandb",), name="ppo")
    for k in range(3):
        log.log(k, {"sim/reward": float(k)})
    log.close()
    runs = list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 1 and runs[0].stat().st_size > 0
