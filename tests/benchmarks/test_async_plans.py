"""benchmarks/async_plans.py on the CPU (issue 46's reward-against-wall-clock picture): every plan's run
from scratch stops at the same wall budget, a call cut short keeps every point it measured, and the
throughput blocks can be skipped. Wall time is a fake clock (each reading 10 s after the last), so
nothing here depends on the machine's speed."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks import async_plans  # noqa: E402
from rose_dsl.cli import app  # noqa: E402

# generate -> update -> publish -> sync, the generator's weights with a staleness budget of 1; the
# generator's metric `rollout_it` (its iteration) stands for the reward
_WF = """
rose: 1
name: versions
components:
  gen:
    impl: "tests.async_fakes:Generator"
    state: {weights: {max_staleness: 1}}
  learner:
    impl: "tests.async_fakes:Learner"
    state: [weights]
iteration:
  count: 20
  body:
    - node: generate
      call: gen.generate
      in: {it: iteration.i}
      state: {weights: read}
      out: [rollouts]
    - node: update
      call: learner.update
      in: {rollouts: generate.rollouts, it: iteration.i}
      state: {weights: update}
    - node: publish
      call: learner.get
      state: {weights: read}
      out: [w]
    - node: sync
      call: gen.load
      in: {w: publish.w, it: iteration.i}
      state: {weights: refresh}
"""
REWARD = "gen/rollout_it"


class Killed(BaseException):
    """What `timeout` does to the call: it ends wherever it is."""


class FakeClock:
    """10 s more at every reading; `kill_at`: the reading that ends the call instead. `seen` keeps, per
    reading, the curves async_plans.json held on disk then."""

    def __init__(self, out: Path, kill_at: int | None = None) -> None:
        self.t, self.readings, self.kill_at, self.out = 0.0, 0, kill_at, out
        self.seen: list[dict[str, Any]] = []

    def __call__(self) -> float:
        self.readings += 1
        path = self.out / "async_plans.json"
        self.seen.append(json.loads(path.read_text())["reward_vs_wall"] if path.exists() else {})
        if self.readings == self.kill_at:
            raise Killed
        self.t += 10.0
        return self.t


@pytest.fixture(scope="module")
def plans(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("plans")
    wf, plan = d / "versions.yaml", d / "async.yaml"
    wf.write_text(_WF)
    result = CliRunner().invoke(app, ["rewrite", str(wf), "--do", "defer sync 1", "-o", str(plan)])
    assert result.exit_code == 0, result.output
    return wf, plan


def run(plans: tuple[Path, Path], out: Path, *extra: str) -> dict[str, Any]:
    wf, plan = plans
    async_plans.main([str(wf), "--plan", f"async={plan}", "--backend", "local", "--allow", "tests.",
                      "--reward", REWARD, "--out", str(out), *extra])
    return json.loads((out / "async_plans.json").read_text())


@pytest.mark.timeout(300)
def test_every_run_stops_at_the_same_wall_budget_without_blocks(plans: tuple[Path, Path], tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Curves only (`--rounds 0`): each run ends after the first iteration that ends past 25 s (the
    asynchronous one also finishes the iterations it already had in flight: its iteration k's metrics line is
    written once its deferred call of iteration k has reported, during iteration k + 1, so two more), well
    before the cap of 20; the summary compares them up to the shorter run's 30 s."""
    out = tmp_path / "out"
    monkeypatch.setattr(async_plans, "clock", FakeClock(out))
    doc = run(plans, out, "--rounds", "0", "--iterations", "20", "--wall-s", "25")
    assert doc["seconds_per_iteration"] == {} and doc["throughput_vs_declared"] == {}
    curves = doc["reward_vs_wall"]
    assert curves["declared"] == [[10.0, 0.0], [20.0, 1.0], [30.0, 2.0]]
    assert curves["async"] == [[10.0, 0.0], [20.0, 1.0], [30.0, 2.0], [40.0, 3.0], [50.0, 4.0]]
    assert doc["curves_finished"] == ["declared", "async"] and doc["common_budget_s"] == 30.0
    for label in ("declared", "async"):  # held at 0 up to 10 s, then 0 -> 2 linearly: area 5 + 15 over 30 s
        assert doc["reward_summary"][label] == {"reward_at_budget": 2.0, "area": 20.0, "mean_reward": 20.0 / 30,
                                                "gain_per_s": 2.0 / 30, "iterations": 3}
    assert "(mean 0.667)" in (out / "reward_vs_wall.svg").read_text()


@pytest.mark.timeout(300)
def test_a_call_cut_short_keeps_its_blocks_and_every_point(plans: tuple[Path, Path], tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """One round of blocks, then curves; the call is killed while the asynchronous run's third iteration
    ends. On disk: the blocks, the declared curve, the two points measured before, and the picture of both."""
    out = tmp_path / "out"
    # readings: 2 per block (4), then per curve one at its start and one per iteration: declared 1 + 3,
    # async 1 + the kill at its third iteration's end
    clock = FakeClock(out, kill_at=4 + 4 + 1 + 3)
    monkeypatch.setattr(async_plans, "clock", clock)
    with pytest.raises(Killed):
        run(plans, out, "--rounds", "1", "--block", "2", "--iterations", "20", "--wall-s", "25")
    doc = json.loads((out / "async_plans.json").read_text())
    assert doc["seconds_per_iteration"] == {"declared": [5.0], "async": [5.0]}
    assert doc["throughput_vs_declared"] == {"declared": 1.0, "async": 1.0}
    assert doc["reward_vs_wall"] == {"declared": [[10.0, 0.0], [20.0, 1.0], [30.0, 2.0]],
                                     "async": [[10.0, 0.0], [20.0, 1.0]]}
    assert doc["curves_finished"] == ["declared"]
    # the picture and the summary cover both runs up to where the one cut short got (20 s)
    assert doc["common_budget_s"] == 20.0 and doc["reward_summary"]["async"]["reward_at_budget"] == 1.0
    picture = (out / "reward_vs_wall.svg").read_text()
    assert "declared (mean" in picture and "async (mean" in picture
    # each point was on disk before the next reading of the clock (the end of the next iteration)
    points = [("declared", 1), ("declared", 2), ("declared", 3), ("async", 1), ("async", 2)]
    # the readings that came right after each of those points (1-based): declared 5 (start), 6, 7, 8 (its
    # iterations' ends), async 9 (start), 10, 11, 12 (the kill)
    for (label, n), reading in zip(points, [7, 8, 9, 11, 12], strict=True):
        assert len(clock.seen[reading - 1].get(label, [])) == n, (label, n, clock.seen)


def test_curve_plans_picks_the_curves_and_refuses_an_unknown_label(plans: tuple[Path, Path], tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    monkeypatch.setattr(async_plans, "clock", FakeClock(out))
    doc = run(plans, out, "--rounds", "0", "--iterations", "2", "--curve-plans", "async")
    assert list(doc["reward_vs_wall"]) == ["async"] and len(doc["reward_vs_wall"]["async"]) == 2  # (the cap)
    with pytest.raises(SystemExit) as exc:
        run(plans, tmp_path / "other", "--rounds", "0", "--curve-plans", "async,best")
    assert exc.value.code == 2 and "--curve-plans: best is not a plan here" in capsys.readouterr().err


def test_the_reward_summary_of_a_known_curve() -> None:
    """Held at the first reward (0) until its iteration ends at 10 s, then linear to 1 at 20 s."""
    pts = [(10.0, 0.0), (20.0, 1.0)]
    assert async_plans.reward_summary(pts, 20.0) == {"reward_at_budget": 1.0, "area": 5.0, "mean_reward": 0.25,
                                                     "gain_per_s": 0.05, "iterations": 2}
    assert async_plans.reward_summary(pts, 15.0) == {"reward_at_budget": 0.5, "area": 1.25,
                                                     "mean_reward": 1.25 / 15, "gain_per_s": 0.5 / 15,
                                                     "iterations": 1}


def test_each_curve_run_gets_the_gpu_setup_of_its_own_plan(plans: tuple[Path, Path], tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The curves run as `rose execute` runs (`rose_cli.run.gpu_session`: on a GPU, an MPS daemon, so that the
    processes of an asynchronous plan share the SMs instead of taking turns, and each process at its plan's
    quota and priority). Before this, the curve runs started no MPS daemon at all, and an asynchronous plan
    measured at 6.4 s an iteration by `rose compare` took 12 s an iteration on its curve (MJX, H100)."""
    import contextlib

    from interpreter.schedule import Schedule
    from rose_cli import run as run_module

    entered: list[Any] = []
    real = run_module.gpu_session

    @contextlib.contextmanager
    def recording(wf: Any, opts: Any, err: Any) -> Any:
        assert opts.mps and opts.check_quotas  # the daemon, and the self-check of any quota below 100%
        entered.append(wf)
        with real(wf, opts, err) as gpu:
            yield gpu

    monkeypatch.setattr(async_plans, "gpu_session", recording)
    out = tmp_path / "out"
    monkeypatch.setattr(async_plans, "clock", FakeClock(out))
    run(plans, out, "--rounds", "0", "--iterations", "2")
    # one set-up per curve run, each with its own plan: the declared workflow, then the pipelined plan
    assert [Schedule(wf).depth for wf in entered] == [1, 2]


def test_a_gpu_workflow_without_a_gpu_exits_2_saying_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    wf = tmp_path / "gpu.yaml"
    wf.write_text(_WF.replace('    impl: "tests.async_fakes:Generator"\n',
                              '    impl: "tests.async_fakes:Generator"\n    device: gpu\n'))
    with pytest.raises(SystemExit) as exc:
        async_plans.main([str(wf), "--backend", "local", "--allow", "tests.", "--rounds", "0", "--iterations", "2",
                          "--reward", REWARD, "--out", str(tmp_path / "out")])
    assert exc.value.code == 2
    assert "component(s) gen need a GPU" in capsys.readouterr().err
