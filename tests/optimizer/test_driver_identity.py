"""The whole `rose optimize` path below option parsing -- settings and budget, the run directory, layouts,
stage 1 (or a given `--stage1` plan), stage 2's verdict, the plan and stage1.yaml written, the hand-over
checkpoint, the report -- run on the shipped latency workflows with a deterministic fake measuring session
(`fake_session.FakeSession`), and compared with a golden record: the plan texts written, the report's
decisions, and every call the search and the driver made of the session, in order.

Why: the driver moved from the command (`rose_cli/optimize.py`) into the runtime's optimizer package
(`interpreter/optimize/driver.py`, issue 60); this record, written on the old code, proves the move changed
no decision and no measurement. When the search changes on purpose, regenerate it with
`ROSE_UPDATE_GOLDEN=1 python3 -m pytest -m '' tests/optimizer/test_driver_identity.py` and read the diff
(one file per case in `tests/optimizer/data/driver_identity/`). Six of the cases are marked `slow` (about
5 s each on the 2-core CI machine: the search's legality checks, not the fake); the others cover the
search's every kind of measurement (complete iterations, captures, local trials, layout switches, a given
`--stage1` plan).
"""

from __future__ import annotations

import io
import json
import os
import re
from contextlib import ExitStack, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from rose_dsl import load_workflow, load_workflow_text
from rose_dsl.ir import Workflow
from rose_dsl.optimizer.layouts import layouts
from rose_dsl.serialize import to_yaml
from rose_dsl.transforms.passes import Rewritten, apply

from .fake_session import FakeSession

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "optimizer" / "data" / "driver_identity"
PARAMS = {"iterations": 120}  # enough training iterations for stage 1's two rounds
GIVEN = ["split-time epoch 2", "interleave epoch"]  # the `--stage1` case's plan of latency_interaction.yaml
# name -> (workflow, --layout values, whether the plan is given with --stage1); the fast ones run in CI
CASES: dict[str, tuple[str, dict[str, list[Any]] | None, bool]] = {
    **{p.stem: (p.name, None, False) for p in sorted((ROOT / "workflows").glob("latency_*.yaml"))},
    "latency_sim_processes+layout": ("latency_sim_processes.yaml", {"sim_replicas": [1, 2]}, False),
    "latency_interaction+stage1": ("latency_interaction.yaml", None, True),
}
FAST = {"latency_gil_trap", "latency_rlhf_chain", "latency_until_episodes", "latency_sim_processes+layout",
        "latency_interaction+stage1"}
# what the report decided (its timings of the driver's own work are wall-clock and left out)
DECISIONS = ("plan_requests", "baseline_iteration_s", "plan_iteration_s", "speedup", "rounds", "stopped",
             "cut_short", "stage2", "layout", "before_after", "staleness", "budgets_unused", "settings", "interrupted")
COUNTS = ("complete", "local", "captures", "layout", "checkpoint")
WALL_CLOCK = {"trial_seconds"}  # (the layout section's time of the driver's own switches)
# `reorder.check_independent` names the first dependency it meets between two loops, in an order that
# depends on the string hash seed (`PYTHONHASHSEED`): the record keeps which loops, not which call
WITNESS = re.compile(r"(depends on '[^']*'): .*?, (so the two loops cannot take turns)")


def _stable(value: Any) -> Any:
    """`value` without what differs from run to run of the same decisions (wall-clock seconds, a witness,
    the checkout's directory in a message's file name)."""
    if isinstance(value, dict):
        return {k: _stable(v) for k, v in value.items() if k not in WALL_CLOCK}
    if isinstance(value, list):
        return [_stable(v) for v in value]
    if isinstance(value, str):
        return WITNESS.sub(r"\1 ... \2", value).replace(str(ROOT), "ROOT")
    return value


def _given(wf: Workflow) -> Workflow:
    """`--stage1`: the plan of `GIVEN`, as an earlier run's stage1.yaml records it."""
    plan = wf
    for request in GIVEN:
        done = apply(plan, request)
        assert isinstance(done, Rewritten), done
        plan = done.workflow
    return load_workflow_text(to_yaml(plan, plan={"source": wf.file, "rewrites": GIVEN}), "stage1.yaml")


def _text(path: Path, file: Path) -> str:
    """A written plan, without the machine's path of its workflow."""
    return re.sub(r"source: .*", "source: FILE", path.read_text().replace(str(file), "FILE"))


def _record(name: str, tmp: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The driver's run of case `name` on the fake session: what it wrote, decided and asked to measure."""
    from rose_cli import run as run_module
    from rose_cli.optimize import OptimizeOptions, optimize_workflow
    from rose_cli.run import ExecuteOptions

    file_name, knobs, stage1 = CASES[name]
    file = ROOT / "workflows" / file_name
    wf = load_workflow(file, PARAMS)
    sessions: list[FakeSession] = []

    def start(wf: Any, opts: Any, gpu: Any, ctx: Any, teardown: Any, copies: Any, log: Any, started: Any = None) -> Any:
        sessions.append(FakeSession(wf, opts.out_dir))
        return sessions[-1]

    monkeypatch.setattr(run_module, "start_trial_session", start)
    found = tuple(layouts(wf, knobs, lambda extra: load_workflow(file, {**PARAMS, **extra}))) if knobs else ()
    opts = OptimizeOptions(file=file, output=tmp / "plan.yaml", report_dir=tmp / "report",
                           stage1=_given(wf) if stage1 else None, layouts=found)
    run = ExecuteOptions(backend="ray" if found else "local", out_dir=tmp / "run", quiet=True)
    console = Console(file=io.StringIO(), width=200)
    code = optimize_workflow(wf, opts, run, console, console)
    assert code == 0, console.file.getvalue()  # type: ignore[attr-defined]

    report = json.loads((opts.report_dir / "report.json").read_text())
    return _stable(json.loads(json.dumps({
        "plan": _text(opts.output, file), "stage1": _text(opts.report_dir / "stage1.yaml", file),
        "decisions": {k: report.get(k) for k in DECISIONS},
        "counts": {k: report["trials"][k]["count"] for k in COUNTS},
        "calls": [call for s in sessions for call in s.calls]})))


@pytest.mark.e2e
@pytest.mark.parametrize("name", [pytest.param(n, marks=() if n in FAST else pytest.mark.slow) for n in CASES])
def test_the_driver_decides_and_measures_as_recorded(name: str, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    got = _record(name, tmp_path, monkeypatch)
    golden = GOLDEN / f"{name}.json"
    if os.environ.get("ROSE_UPDATE_GOLDEN"):
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    want = json.loads(golden.read_text())
    for part in want:  # (one part at a time, so that a failure names it)
        assert got[part] == want[part], f"{name}: {part} differs from {golden.relative_to(ROOT)}"
    assert sorted(got) == sorted(want)


@dataclass(frozen=True)
class _Run:
    backend: str = "local"
    out_dir: Path | None = None
    overwrite: bool = False
    check_quotas: bool = True


class _Gpu:
    quotas_work = False

    def client_env(self, quota: int | None, priority: int | None = None) -> dict[str, str]:
        return {}


class _BareHost:
    """The driver's `Host` with nothing of the command: no run-directory rules, no GPU, no progress, no signals."""

    def __init__(self, out_dir: Path) -> None:
        self.run, self.teardown, self.sessions = _Run(out_dir=out_dir), ExitStack(), []

    def prepare(self, wf: Workflow) -> None:
        pass

    def gpu_session(self, wf: Workflow) -> Any:
        return nullcontext(_Gpu())

    def start_session(self, wf: Workflow, gpu: Any, copies: Any, log: Any, started: float) -> FakeSession:
        self.sessions.append(FakeSession(wf, self.run.out_dir))
        return self.sessions[-1]

    def progress_log(self, deadline: float | None) -> Any:
        return nullcontext(lambda line: None)

    def stop_on_signal(self, log: Any) -> Any:
        return nullcontext(lambda: None)

    def machine(self, backend: str) -> dict[str, Any]:
        return {}


def test_the_driver_runs_on_a_bare_host_as_under_the_command(tmp_path: Path) -> None:
    """`interpreter.optimize.optimize` needs nothing of `rose_cli`: on a host that only starts the fake
    session, it writes and measures what the command's run of the same case recorded."""
    from interpreter.optimize import OptimizeOptions, optimize

    file = ROOT / "workflows" / "latency_until_episodes.yaml"
    wf = load_workflow(file, PARAMS)
    host = _BareHost(tmp_path / "run")
    opts = OptimizeOptions(file=file, output=tmp_path / "plan.yaml", report_dir=tmp_path / "report")
    with host.teardown:
        outcome = optimize(wf, opts, host)
    want = json.loads((GOLDEN / "latency_until_episodes.json").read_text())
    assert outcome.report["plan_requests"] == want["decisions"]["plan_requests"]
    assert [call for s in host.sessions for call in s.calls] == want["calls"]
    assert _text(opts.output, file) == want["plan"] and outcome.run_dir == tmp_path / "run"


def test_the_record_sees_every_kind_of_measurement() -> None:
    """Non-vacuity: the fast cases' records hold complete iterations, captures, local trials, a layout
    switch and the hand-over, and a plan with rewrites."""
    records = [json.loads((GOLDEN / f"{n}.json").read_text()) for n in sorted(FAST)]
    kinds = {call[0] for r in records for call in r["calls"]}
    assert kinds == {"complete", "capture", "local", "use_layout", "finish"}, kinds
    assert any(r["decisions"]["plan_requests"] for r in records)
