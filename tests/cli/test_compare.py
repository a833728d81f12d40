"""`rose compare`: plans measured against the declared workflow on one set of workers. The iterations it
trains are one training run, bit-identical to `rose execute` of the declared workflow for as many
iterations; its run directories read like `rose execute`'s; what it refuses, it refuses before anything
starts, with exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WF = ROOT / "workflows" / "latency_interaction.yaml"
SETS = ["--set", "iterations=40", "--set", "per_row_ms=0.02", "--set", "fixed_ms=0.2"]


def rose(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", "rose_cli", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def plans(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("plans")
    out = {}
    for name, requests in (("split2", ["split epoch.step 2", "interleave epoch.step"]),
                           ("copies", ["split-time epoch 2"])):
        out[name] = d / f"{name}.yaml"
        r = rose("rewrite", str(WF), *SETS, *[a for q in requests for a in ("--do", q)], "-o", str(out[name]))
        assert r.returncode == 0, r.stderr
    return out


def _training(line: dict) -> dict:
    return {k: v for k, v in line.items() if "/" in k and not k.startswith("time/") and not k.endswith("_per_s")}


def test_compare_measures_every_plan_and_trains_like_the_declared_workflow(tmp_path: Path, plans: dict[str, Path]) -> None:
    run, js, runs = tmp_path / "run", tmp_path / "c.json", tmp_path / "runs"
    r = rose("compare", str(WF), *SETS, "--plan", str(plans["split2"]), "--plan", f"time2={plans['copies']}",
             "--rounds", "3", "--out", str(run), "--json", str(js), "--runs", str(runs))
    assert r.returncode == 0, r.stderr
    assert "vs declared" in r.stdout and "split2" in r.stdout and "time2" in r.stdout
    # a progress line per round, in the order the round ran (A B C, then C B A): a long call shows where it is
    assert "round 1/3: declared" in r.stdout and "round 2/3: time2" in r.stdout, r.stdout
    # and a line as each row starts (a row of a GPU call takes minutes), in the round's order
    starts = [line.split(":", 1)[1].split("(")[0].strip() for line in r.stdout.splitlines()
              if line.startswith("  round 2/3:")]
    assert starts == ["time2", "split2", "declared"], r.stdout
    assert "round 1/3: declared (warm-up" in r.stdout and "round 1/3: declared (1 of 3" in r.stdout, r.stdout
    # the plans were written with SETS and the declared workflow runs with them: nothing differs to note
    # (it used to say "the plan ... was written with iterations=40 (its source says ...)")
    assert "was written with" not in r.stderr, r.stderr
    doc = json.loads(js.read_text())
    rows = {row["label"]: row for row in doc["rows"]}
    # the machine beside the figures (a result file is compared with others by its host, card and versions)
    assert doc["machine"]["backend"] == "local" and doc["machine"]["python"] and doc["machine"]["cpus"] >= 1
    assert list(rows) == ["declared", "split2", "time2"]
    assert rows["declared"]["speedup"] == 1.0
    assert rows["split2"]["requests"] == ["split epoch.step 2", "interleave epoch.step"]
    for row in rows.values():
        assert len(row["seconds"]) == 3 and row["median_s"] > 0 and not row["failed"]
        assert row["throughput"]["env_steps_per_s"] > 0
    # the training: every iteration it ran (measured or not), in order, is what the declared workflow
    # computes -- bit for bit against rose execute of as many iterations
    trained = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    n = len(trained)
    assert [t["iteration"] for t in trained] == list(range(n)) and n >= 1 + 3 * 3
    ref_dir = tmp_path / "ref"
    r = rose("execute", str(WF), *SETS, "-n", str(n), "--out", str(ref_dir), "-q")
    assert r.returncode == 0, r.stderr
    ref = [json.loads(line) for line in (ref_dir / "metrics.jsonl").read_text().splitlines()]
    for k, (a, b) in enumerate(zip(ref, trained, strict=True)):
        ta, tb = _training(a), _training(b)
        assert ta.keys() == tb.keys(), k
        for key in ta:  # the temporal copies' mean reward is summed in another order
            assert tb[key] == pytest.approx(ta[key], rel=1e-12, abs=1e-12), (k, key)
    # run directories the run-directory readers read: one measured iteration per round
    sys.path.insert(0, str(ROOT))
    from benchmarks.lib.paper_profile import load_run, run_figures

    for label in rows:
        for rnd in range(3):
            data = load_run(runs / label / f"round{rnd}")
            assert len(data.metrics) == 1 and data.calls
            fig = run_figures(data, 0, "env_steps", ("iteration", "epoch", "step"), "act")
            assert fig["iteration_s"] == [rows[label]["seconds"][rnd]] and fig["throughput"] > 0
            assert 0 < fig["loop_share"][0] <= 1.0
        assert {dict(c.loops).get("step") for c in data.calls if c.structural.endswith("step.act")} == set(range(10))


def test_compare_refuses_before_anything_starts(tmp_path: Path, plans: dict[str, Path]) -> None:
    other = tmp_path / "other.yaml"
    r = rose("rewrite", str(WF), *SETS, "--set", "num_envs=32", "--do", "split epoch.step 2", "-o", str(other))
    assert r.returncode == 0, r.stderr
    cases = [
        (["--plan", str(other)], "does not compute what"),  # another batch: another computation
        (["--plan", f"a={plans['split2']}", "--plan", f"a={plans['copies']}"], "one label"),
        (["--plan", str(tmp_path / "missing.yaml")], "no such file"),
        (["--plan", str(plans["split2"]), "--rounds", "30"], "raise its iteration count"),
    ]
    for extra, message in cases:
        r = rose("compare", str(WF), *SETS, *extra)
        assert r.returncode == 2, (extra, r.stdout, r.stderr)
        assert message in r.stderr and "Traceback" not in r.stderr, (extra, r.stderr)
    taken = tmp_path / "taken.json"
    taken.write_text("{}")
    r = rose("compare", str(WF), *SETS, "--json", str(taken))
    assert r.returncode == 2 and "--overwrite" in r.stderr


def test_every_finished_round_is_on_disk_when_a_run_is_cut_short(tmp_path: Path) -> None:
    """A comparison killed mid-way (a device call's time limit) leaves each round it finished: the JSON
    says how many, and their run directories are there."""
    import signal
    import time

    js, runs = tmp_path / "c.json", tmp_path / "runs"
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    slow = ["--set", "iterations=400", "--set", "per_row_ms=0.02", "--set", "fixed_ms=2.0"]
    proc = subprocess.Popen([sys.executable, "-m", "rose_cli", "compare", str(WF), *slow, "--rounds", "100", "-q",
                             "--json", str(js), "--runs", str(runs)], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 450  # (a give-up for a hung run, not a speed: a loaded machine is slow)
        while time.monotonic() < deadline and not (js.exists() and json.loads(js.read_text())["rounds_done"] >= 2):
            time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    doc = json.loads(js.read_text())
    done = doc["rounds_done"]
    assert 2 <= done < 100 and len(doc["rows"][0]["seconds"]) == done
    assert (runs / "declared" / f"round{done - 1}" / "trace.json").exists()


SIM_PROCESSES = ROOT / "workflows" / "latency_sim_processes.yaml"


@pytest.mark.e2e
def test_a_layout_plan_runs_its_own_processes_on_each_switch_and_trains_like_the_declared_workflow(
        tmp_path: Path, ray_session) -> None:
    """A plan written with a layout (`rose rewrite --layout sim_replicas=2`: two simulator processes) is
    compared on the same workers: on each switch to it and back, the simulator gets fresh processes (Ray,
    chosen by itself), and the training through every switch is what the declared workflow computes.
    (`rose compare` in this process, typer's runner, on the worker's Ray cluster: a process of its own
    started Ray again, 5-18 s on the 2-core machine; the other tests here run the command's process.)"""
    from typer.testing import CliRunner

    from rose_cli.main import app
    # (short calls: nothing here depends on how long they take)
    sets = ["--set", "iterations=30", "--set", "steps=5", "--set", "sim_per_row_ms=0.1", "--set", "per_row_ms=0.02",
            "--set", "fixed_ms=0.2"]
    plan = tmp_path / "sim2.yaml"
    r = rose("rewrite", str(SIM_PROCESSES), *sets, "--layout", "sim_replicas=2", "-o", str(plan))
    assert r.returncode == 0, r.stderr
    run, js = tmp_path / "run", tmp_path / "c.json"
    r = CliRunner().invoke(app, ["compare", str(SIM_PROCESSES), *sets, "--plan", f"sim2={plan}", "--rounds", "2",
                                 "--out", str(run), "--json", str(js)])
    assert r.exit_code == 0, (r.output, r.exception)
    assert "--backend ray" in r.stderr and r.stdout.count("new processes for sim") == 2  # A B, B A
    rows = {row["label"]: row for row in json.loads(js.read_text())["rows"]}
    assert len(rows["sim2"]["seconds"]) == len(rows["declared"]["seconds"]) == 2
    trained = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    ref_dir = tmp_path / "ref"
    r = rose("execute", str(SIM_PROCESSES), *sets, "-n", str(len(trained)), "--backend", "local", "--out", str(ref_dir),
             "-q")
    assert r.returncode == 0, r.stderr
    ref = [json.loads(line) for line in (ref_dir / "metrics.jsonl").read_text().splitlines()]
    for k, (a, b) in enumerate(zip(ref, trained, strict=True)):
        ta, tb = _training(a), _training(b)
        assert ta.keys() == tb.keys(), k
        for key in ta:  # the reward is a mean over the simulator processes' rows: only its summation order differs
            assert tb[key] == pytest.approx(ta[key], rel=1e-12), (k, key)


def test_a_layout_plan_is_refused_where_it_cannot_be_one(tmp_path: Path) -> None:
    sets = ["--set", "iterations=30"]
    plan = tmp_path / "sim2.yaml"
    r = rose("rewrite", str(SIM_PROCESSES), *sets, "--layout", "sim_replicas=2", "-o", str(plan))
    assert r.returncode == 0, r.stderr
    r = rose("compare", str(SIM_PROCESSES), *sets, "--plan", str(plan), "--backend", "local")
    assert r.returncode == 2 and "needs --backend ray" in r.stderr and "Traceback" not in r.stderr
    # a plan that says it is a layout but changes more than processes and arguments
    edited = tmp_path / "edited.yaml"
    edited.write_text(plan.read_text().replace("impl: examples.bench.latency:Sim\n", "impl: examples.bench.latency:Trainer\n", 1))
    assert edited.read_text() != plan.read_text()
    r = rose("compare", str(SIM_PROCESSES), *sets, "--plan", str(edited))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    # rose rewrite --layout checks the value as rose optimize --layout does
    for bad, message in ((["--layout", "nope=2"], "not a param"), (["--layout", "sim_replicas=1,2"], "one value"),
                         (["--layout", "sim_replicas=0"], "not a layout of")):
        r = rose("rewrite", str(SIM_PROCESSES), *sets, *bad)
        assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr, (bad, r.stderr)


def test_a_plan_moves_only_the_processes_whose_mps_settings_it_changes() -> None:
    """Before each plan runs, its GPU processes whose MPS quota or client priority (both fixed for a
    process's lifetime) differ from how they run now move to new processes; no quota is 100%, no priority
    is normal, so a plan that spells the defaults out moves nothing. The copies a plan adds are tracked
    like the declared components (the temporal groups' simulators: one at a low priority, one not)."""
    from dataclasses import replace

    from rose_cli.compare import mps_moves
    from rose_dsl import load_workflow
    from rose_dsl.ir import Component, Workflow

    def plan(**settings: tuple[int | None, int | None]) -> Workflow:
        comps = {n: Component(n, "m:C", {}, "gpu", mps_quota=q, mps_priority=p) for n, (q, p) in settings.items()}
        return replace(load_workflow(WF), components=comps)

    running = {"policy": (100, 0), "sim": (100, 0), "sim@0": (100, 0)}
    assert mps_moves(plan(policy=(None, None), sim=(100, 0), trainer=(50, 1)), running) == []  # (trainer: not running)
    moved = mps_moves(plan(policy=(94, None), sim=(None, 1), **{"sim@0": (None, 0)}), running)
    assert [(c.name, c.mps_quota, c.mps_priority) for c in moved] == [("policy", 94, None), ("sim", None, 1)]



_ASYNC = """
rose: 1
name: versions
components:
  gen:
    impl: "tests.async_fakes:Generator"
    args: {{sleeps: [0.02], run: "{run}"}}
    state: {{weights: {{max_staleness: 1}}}}
  learner:
    impl: "tests.async_fakes:Learner"
    args: {{sleeps: [0.02], run: "{run}", wait_for_next: 3.0}}
    state: [weights]
iteration:
  count: 24
  body:
    - node: generate
      call: gen.generate
      in: {{it: iteration.i}}
      state: {{weights: read}}
      out: [rollouts]
    - node: update
      call: learner.update
      in: {{rollouts: generate.rollouts, it: iteration.i}}
      state: {{weights: update}}
    - node: publish
      call: learner.get
      state: {{weights: read}}
      out: [w]
    - node: sync
      call: gen.load
      in: {{w: publish.w, it: iteration.i}}
      state: {{weights: refresh}}
"""


@pytest.mark.e2e
def test_an_asynchronous_plan_is_measured_over_a_pipelined_window(tmp_path: Path) -> None:
    """An asynchronous plan's gain shows only with iterations in flight together: `rose compare` measures it
    over a window of consecutive pipelined iterations (after one filling the pipeline, before one more and
    the drain), not one drained iteration at a time. Observed as events, not durations: each update waits
    (bounded) for the next rollout to start, which only a pipelined window lets happen (`overlapped`), and
    each rollout records how old its weights are (`lag`); the row says which staleness the plan uses."""
    import uuid

    wf, plan, js, runs = tmp_path / "versions.yaml", tmp_path / "async.yaml", tmp_path / "c.json", tmp_path / "runs"
    wf.write_text(_ASYNC.format(run=uuid.uuid4().hex))
    r = rose("rewrite", str(wf), "--do", "defer sync 1", "-o", str(plan))
    assert r.returncode == 0, r.stderr
    r = rose("compare", str(wf), "--plan", f"async={plan}", "--rounds", "2", "--backend", "local", "--allow-module",
             "tests", "--json", str(js), "--runs", str(runs))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "measured over windows of 3 consecutive pipelined iterations" in r.stdout
    rows = {row["label"]: row for row in json.loads(js.read_text())["rows"]}
    declared, pipelined = rows["declared"], rows["async"]
    assert declared["staleness"] == {} and declared["window"] == {"fill": 0, "measured": 1, "tail": 0}
    assert pipelined["staleness"] == {"gen.weights": {"lag": 1, "max_staleness": 1}}
    assert pipelined["window"] == {"fill": 1, "measured": 3, "tail": 1} and len(pipelined["seconds"]) == 2
    for it in pipelined["iterations"]:  # every measured update overlapped the next rollout; weights 1 update old
        assert it["metrics"]["window/iterations"] == 3.0
        assert it["metrics"]["learner/overlapped"] == 1.0 and it["metrics"]["gen/lag"] == 1.0
    for it in declared["iterations"]:  # drained between iterations: no update ever sees the next rollout start
        assert it["metrics"]["learner/overlapped"] == 0.0 and it["metrics"]["gen/lag"] == 0.0
    # the trace of each window: three consecutive RL iterations whose update k ends after rollout k+1 began
    for rnd in range(2):
        events = json.loads((runs / "async" / f"round{rnd}" / "trace.json").read_text())["traceEvents"]
        calls = {(e["name"].split(".")[-1], e["args"]["loops"]["iteration"]): e for e in events if e.get("ph") == "X"}
        ks = sorted(k for name, k in calls if name == "update")
        assert len(ks) >= 3 and ks == list(range(ks[0], ks[0] + len(ks)))
        overlaps = [k for k in ks if ("generate", k + 1) in calls
                    and calls[("generate", k + 1)]["ts"] < calls[("update", k)]["ts"] + calls[("update", k)]["dur"]]
        assert len(overlaps) >= 2, (rnd, overlaps)


def _row(label: str, seconds: list[float], failed: str | None = None) -> dict:
    return {"label": label, "seconds": seconds, "median_s": sorted(seconds)[len(seconds) // 2] if seconds else None,
            "spread": 0.1, "speedup": None, "throughput": {"env_steps_per_s": 1234.5}, "sm_activity": None,
            "staleness": {}, "window": {"fill": 0, "measured": 1, "tail": 0}, "failed": failed}


def test_compare_says_faster_slower_or_undecided_with_an_interval_and_keeps_its_table_whole_when_piped(capsys) -> None:
    """It printed ratios with no verdict or interval, and piped it cut its table to 80 columns ("decl…",
    "medi…", "gene…") -- in every device log too (issue 59)."""
    from types import SimpleNamespace

    from rose_cli.compare import _print_table, verdict

    declared = _row("declared", [1.00, 1.02, 0.99, 1.01, 1.03])
    rows = [declared, _row("a-plan-with-a-rather-long-descriptive-label", [0.50, 0.52, 0.49, 0.51, 0.50]),
            _row("noisy", [1.2, 0.8, 1.1, 0.9, 1.0]), _row("failed", [], "it failed")]
    for row in rows[1:]:
        row["verdict"] = verdict(declared, row)
        row["speedup"] = 1.0
    assert rows[1]["verdict"]["outcome"] == "faster" and rows[1]["verdict"]["low"] < 0.5 < rows[1]["verdict"]["high"]
    assert rows[2]["verdict"]["outcome"] == "undecided" and rows[3]["verdict"] is None
    assert verdict(declared, _row("slow", [2.0, 2.1, 1.9, 2.0, 2.2]))["outcome"] == "slower"
    _print_table(rows, 1.0, SimpleNamespace(complete_iterations=12))
    text = capsys.readouterr().out
    assert "…" not in text and "a-plan-with-a-rather-long-descriptive-label" in text and "env_steps_per_s" in text
    assert "a-plan-with-a-rather-long-descriptive-label vs declared: faster: 2.00x (interval" in text
    assert "noisy vs declared: undecided:" in text and "failed vs declared" not in text
