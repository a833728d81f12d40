"""`rose optimize` end to end on latency-bound CPU workflows: training through the optimizer and on with the
plan is bit-identical to training the declared workflow, the report's books add up, and bad input gets one
clear message.

Nothing here asserts on wall time or on a choice made from it (issue 42: a loaded 2-core CI machine
measures other times): which plan is faster, that it is not over-split and by how much it wins are
`benchmarks/optimize_cpu.py --check`'s (A/B rounds outside the optimizer, on a machine to itself); the
search's decisions and its budget are tested on fake measurements and a fake clock (test_search.py,
test_layouts.py, test_quota.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
WF = ROOT / "workflows"


def rose(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", "rose_cli", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


def _metrics(path: Path) -> dict[int, dict[str, float]]:
    out = {}
    for line in path.read_text().splitlines():
        d = json.loads(line)
        out[d["iteration"]] = d
    return out


def _states(run: Path) -> dict:
    from interpreter.checkpoint import latest_complete, load_checkpoint

    return load_checkpoint(latest_complete(run / "checkpoints")).states


def _training(d: dict) -> dict[str, float]:
    """What training computed (not how long it took)."""
    return {k: v for k, v in d.items() if "/" in k and not k.startswith("time/") and not k.endswith("_per_s")}


# what the latency components wait per call (examples/bench/latency.py): only how long a call sleeps,
# never what it computes
NO_WAIT = ["--set", "per_row_ms=0", "--set", "fixed_ms=0"]


def _same_training(a: dict[int, dict[str, float]], b: dict[int, dict[str, float]]) -> None:
    assert sorted(a) == sorted(b)
    for k in a:
        assert _training(a[k]) == _training(b[k]), k


DECODE_PLAN = "split-chain sample decode grade 4"


def _given_decode_plan(tmp_path: Path, n: int) -> Path:
    """latency_decode's decode loop copied per row group with the verifier pipelined behind it (what the
    optimizer finds there: benchmarks/optimize_cpu.py --check, `decode`), written as a plan for `--stage1`:
    given, its measurement takes a fixed number of iterations and does not depend on what this machine
    measures."""
    given = tmp_path / "given.yaml"
    r = rose("rewrite", str(WF / "latency_decode.yaml"), "--set", f"iterations={n}", "--do", DECODE_PLAN, "-o",
             str(given))
    assert r.returncode == 0, r.stderr
    return given


DECODE_N = 60


@pytest.fixture(scope="module")
def decode_declared(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """latency_decode's declared training, DECODE_N iterations without the calls' waits (they only sleep),
    checkpointed at the last, and the given plan for `--stage1`: one run for the module's tests that compare
    a run through the optimizer with it (each used to train its own)."""
    tmp = tmp_path_factory.mktemp("decode_declared")
    declared = tmp / "declared"
    r = rose("execute", str(WF / "latency_decode.yaml"), "--set", f"iterations={DECODE_N}", *NO_WAIT, "--out",
             str(declared), "--checkpoint-every", str(DECODE_N), "-q")
    assert r.returncode == 0, r.stderr
    return declared, _given_decode_plan(tmp, DECODE_N)


@pytest.mark.e2e
def test_interaction_loop_trains_bit_identically_through_the_optimizer(tmp_path: Path) -> None:
    # 240 iterations and one round of search (`--rounds 1`): the search trains about 170 of them (each
    # interleaved trial's first iteration after a switch of plan is training, not a measurement; the epoch
    # regions here are half an iteration, so their alternatives are measured on complete iterations,
    # `Settings.local_max_fraction`; the decision rule takes candidates to five interleaved rounds at least),
    # and the plan's own run, resumed from the hand-over, trains the rest
    n = 240
    # five steps per epoch instead of the workflow's ten and 32 rows instead of 64, at 0.1 ms a row: the same
    # calls, row groups and overlap in about half the time (the search's iterations are counted by its
    # decision rule, not by their length; which plan it finds is not asserted here)
    shape = ["--set", "steps=5", "--set", "num_envs=32"]
    timing = ["--set", "per_row_ms=0.1", "--set", "fixed_ms=0.5", *shape]
    sets = ["--set", f"iterations={n}", *timing]
    # the declared workflow's training, all n iterations, computed without the calls' waits (they only
    # sleep); the timed declared run below (the speed reference) checks on its iterations that the waits
    # change nothing it computes
    declared = tmp_path / "declared"
    r = rose("execute", str(WF / "latency_interaction.yaml"), "--set", f"iterations={n}", *NO_WAIT, *shape, "--out",
             str(declared), "--checkpoint-every", str(n), "-q")
    assert r.returncode == 0, r.stderr
    timed_n = 5  # (the waits only sleep: they change nothing the run computes)
    timed = tmp_path / "declared_timed"
    r = rose("execute", str(WF / "latency_interaction.yaml"), "--set", f"iterations={timed_n}", *timing, "--out",
             str(timed), "-q")
    assert r.returncode == 0, r.stderr
    a, a_timed = _metrics(declared / "metrics.jsonl"), _metrics(timed / "metrics.jsonl")
    _same_training({k: a[k] for k in range(timed_n)}, a_timed)
    plan = tmp_path / "plan.yaml"
    r = rose("optimize", str(WF / "latency_interaction.yaml"), *sets, "--rounds", "1", "-o", str(plan), "-q")
    assert r.returncode == 0, r.stderr
    assert "continue training" in r.stdout
    report = json.loads((tmp_path / "plan_report" / "report.json").read_text())
    assert report["rounds"] and rose("validate", str(plan)).returncode == 0
    # the rows add up: the set-up before the processes and the hand-over checkpoint are rows of their own
    trials = report["trials"]
    assert trials["checkpoint"]["count"] == 1 and trials["checkpoint"]["seconds"] > 0 and trials["setup"]["seconds"] > 0
    assert sum(row["seconds"] for row in trials.values()) == pytest.approx(report["overhead_s"]["total"])
    run = tmp_path / "plan_report" / "run"
    trained = len(_metrics(run / "metrics.jsonl"))
    assert 0 < trained <= n
    r = rose("execute", str(WF / "latency_interaction.yaml"), "--plan", str(plan), "--out", str(run), "--resume",
             "--checkpoint-every", str(n), "-q")
    assert r.returncode == 0, r.stderr
    b = _metrics(run / "metrics.jsonl")
    assert sorted(a) == sorted(b) == list(range(n))
    final_copies = any("split-time" in q for q in report["plan_requests"])
    for k in range(n):
        ta, tb = _training(a[k]), _training(b[k])
        # the optimizer's iterations say which plan ran them (its rewrites); the resumed ones run the plan
        copies = "split-time" in b[k]["plan"] if "plan" in b[k] else final_copies
        assert ta.keys() == tb.keys(), k
        for key in ta:
            if copies and key == "sim/reward":  # a mean over the temporal groups' copies: summation order
                assert tb[key] == pytest.approx(ta[key], rel=1e-12, abs=1e-12), (k, key)
            else:
                assert tb[key] == ta[key], (k, key)
    sa, sb = _states(declared), _states(run)
    for comp in ("sim", "policy", "trainer"):
        for name, value in sa[comp].items():
            assert torch.equal(value, sb[comp][name]), f"{comp}.{name}"


@pytest.mark.e2e
def test_train_goes_on_with_the_plan_in_the_same_processes_bit_identically(tmp_path: Path, decode_declared) -> None:
    """`rose optimize --train`: after the plan and the report, training goes on with the plan in the
    optimizer's own processes to the workflow's last iteration -- no second start-up, no hand-over
    checkpoint -- and the run directory holds what `rose execute` of the declared workflow writes, bit for
    bit. The report does not count the processes' start-up in the overhead (the training's own)."""
    # the graph is given (`--stage1`): its measurement takes a fixed number of iterations (five of each plan,
    # interleaved, after their warm-ups), where a search takes more the noisier this machine is -- so the
    # iterations left to train on do not depend on the machine's speed
    n = DECODE_N
    (declared, given), plan, run = decode_declared, tmp_path / "plan.yaml", tmp_path / "run"
    r = rose("optimize", str(WF / "latency_decode.yaml"), "--set", f"iterations={n}", "--stage1", str(given),
             "-o", str(plan), "--out", str(run), "--train", "--checkpoint-every", "25", "-q")
    assert r.returncode == 0, r.stderr
    assert "training goes on with the plan in the same processes" in r.stdout and "continue training" not in r.stdout
    report = json.loads((tmp_path / "plan_report" / "report.json").read_text())
    ov, trials = report["overhead_s"], report["trials"]
    assert ov["trains_on"] and trials["checkpoint"]["count"] == 0 and "settle" in trials
    assert ov["net"] == pytest.approx(max(0.0, ov["total"] - ov["retained_training"] - ov["startup"]))
    assert sum(row["seconds"] for row in trials.values()) == pytest.approx(ov["total"])
    trained = ov["retained_iterations"]
    assert 0 < trained < n
    b = _metrics(run / "metrics.jsonl")
    _same_training(_metrics(declared / "metrics.jsonl"), b)
    assert all("plan" not in b[k] for k in range(trained, n))  # the plan's own iterations, as rose execute logs them
    from interpreter.checkpoint import find_resumable

    assert find_resumable(run / "checkpoints")[0].iteration == n - 1  # every 25 and at the last
    sa, sb = _states(declared), _states(run)
    for comp in ("generator", "learner"):
        for name, value in sa[comp].items():
            assert torch.equal(value, sb[comp][name]), f"{comp}.{name}"
    # --checkpoint-every belongs to --train
    r = rose("optimize", str(WF / "latency_decode.yaml"), "-o", str(tmp_path / "p2.yaml"), "--checkpoint-every", "5")
    assert r.returncode == 2 and "--checkpoint-every applies to the training that --train" in r.stderr, r.stderr


def test_train_falls_back_to_the_hand_over_checkpoint_when_a_process_cannot_move(tmp_path: Path, monkeypatch) -> None:
    """`--train` first moves the processes stage 2 left at a reference to the plan's settings; a process that
    cannot move ends that: the plan, the report and the hand-over checkpoint are written as without `--train`
    (exit 0), and the output says why training did not go on."""
    from typer.testing import CliRunner

    import interpreter.optimize.driver as driver
    from interpreter.backends import CallFailed
    from rose_cli.main import app

    def cannot_move(plan, running, session, gpu):
        raise CallFailed("moving policy", "policy", "the new process did not start")

    monkeypatch.setattr(driver, "settle", cannot_move)  # (the driver's own name for it: it imports settle)
    given, plan, run = _given_decode_plan(tmp_path, 40), tmp_path / "plan.yaml", tmp_path / "run"
    # a given graph: its measurement takes a fixed number of iterations, so iterations are left to train on
    # however slow this machine is (a search could use all of them, and then --train has nothing to move)
    r = CliRunner().invoke(app, ["optimize", str(WF / "latency_decode.yaml"), "--set", "iterations=40", "--stage1",
                                 str(given), "-o", str(plan), "--out", str(run), "--train"])
    assert r.exit_code == 0, r.output
    assert "cannot go on training" in r.output and "continue training: rose execute" in r.output
    report = json.loads((tmp_path / "plan_report" / "report.json").read_text())
    assert not report["overhead_s"]["trains_on"] and report["trials"]["checkpoint"]["count"] == 1
    assert (run / "checkpoints").is_dir()


@pytest.mark.e2e
def test_nested_loops_get_a_plan_that_validates_and_a_report_whose_books_add_up(tmp_path: Path) -> None:
    """(Which plan, and that it is faster and not over-split: benchmarks/optimize_cpu.py --check, `nested`.)"""
    plan = tmp_path / "plan.yaml"
    r = rose("optimize", str(WF / "latency_nested.yaml"), "--set", "iterations=200", "--rounds", "1", "-o", str(plan), "-q")
    assert r.returncode == 0, r.stderr
    report = json.loads((tmp_path / "plan_report" / "report.json").read_text())
    assert report["rounds"] and report["rounds"][0]["combined"] is not None
    assert sum(row["seconds"] for row in report["trials"].values()) == pytest.approx(report["overhead_s"]["total"])
    assert rose("validate", str(plan)).returncode == 0


def test_chain_plan_validates_and_gets_a_reorder_bound(tmp_path: Path) -> None:
    """(That the plan is never slower: benchmarks/optimize_cpu.py --check, `chain`.)"""
    plan = tmp_path / "plan.yaml"
    # 16 rows and 60 iterations: the same chain, and the search cut short when the iterations are trained (the
    # bound comes from the reference profile, measured first; what the search then finds is not asserted here)
    r = rose("optimize", str(WF / "latency_chain.yaml"), "--set", "iterations=60", "--set", "rows=16", "--rounds", "1",
             "-o", str(plan), "-q")
    assert r.returncode == 0, r.stderr
    report = json.loads((tmp_path / "plan_report" / "report.json").read_text())
    r = rose("validate", str(plan))
    assert r.returncode == 0, r.stderr
    # the reorder bound: the declared chain's calls were matched to its invocations and give a bound
    bound = report["reorder_bound"]
    assert bound["matched"] == bound["invocations"] and 0 < bound["seconds"] <= bound["iteration_s"] * 1.05
    assert "Reorder bound" in (tmp_path / "plan_report" / "report.md").read_text()


def test_a_pipelined_decode_loop_trains_bit_identically_through_the_optimizer(tmp_path: Path, decode_declared) -> None:
    """An LLM-RL shape with a token-by-token decode loop, the loop copied per row group and the verifier
    pipelined behind it (`split-chain sample decode grade 4`, what the optimizer finds there: benchmarks/
    optimize_cpu.py --check, `decode`): given as the graph (`--stage1`, so the plan does not depend on what
    this machine measured), the training through the optimizer -- the declared workflow and the plan
    interleaved -- and on with the plan is the declared workflow's, bit for bit."""
    n = DECODE_N
    (declared, given), plan = decode_declared, tmp_path / "plan.yaml"
    r = rose("optimize", str(WF / "latency_decode.yaml"), "--set", f"iterations={n}", "--stage1", str(given), "-o",
             str(plan), "-q")
    assert r.returncode == 0, r.stderr
    report = json.loads((tmp_path / "plan_report" / "report.json").read_text())
    assert report["plan_requests"] == [DECODE_PLAN], report["plan_requests"]
    run = tmp_path / "plan_report" / "run"
    r = rose("execute", str(WF / "latency_decode.yaml"), "--plan", str(plan), "--out", str(run), "--resume",
             "--checkpoint-every", str(n), "-q")
    assert r.returncode == 0, r.stderr
    _same_training(_metrics(declared / "metrics.jsonl"), _metrics(run / "metrics.jsonl"))
    sa, sb = _states(declared), _states(run)
    for comp in ("generator", "learner"):
        for name, value in sa[comp].items():
            assert torch.equal(value, sb[comp][name]), f"{comp}.{name}"


@pytest.mark.parametrize(("args", "message"), [
    (["optimize", "workflows/nope.yaml", "-o", "{tmp}/p.yaml"], "nope.yaml"),
    (["optimize", "workflows/latency_interaction.yaml", "-o", "{tmp}/p.yaml", "--backend", "gpu"], "--backend"),
    (["optimize", "workflows/latency_interaction.yaml", "-o", "{tmp}/p.yaml", "--rounds", "0"], "--rounds"),
    (["optimize", "workflows/latency_interaction.yaml", "-o", "{tmp}/p.yaml", "--local-max-fraction", "1.5"],
     "--local-max-fraction"),
    (["optimize", "workflows/latency_interaction.yaml", "-o", "{tmp}/p.yaml", "--set", "iterations=2"],
     "not even the reference profile"),
    (["optimize", "workflows/latency_interaction.yaml", "-o", "{tmp}/p.yaml", "--local-max-fraction", "nan"],
     "from 0 to 1, not nan"),
    # a budget the reference profile does not fit: no one-iteration "1.00x" with exit 0 (fourth unseen sweep)
    (["optimize", "workflows/latency_interaction.yaml", "-o", "{tmp}/p.yaml", "--budget-s", "0.05"],
     "the time budget of 0.05 s is spent: not even the reference profile fits"),
    (["optimize", "workflows/gpu_two_component.yaml", "-o", "{tmp}/p.yaml"], "need a GPU"),
    (["optimize", "workflows/latency_sim_processes.yaml", "-o", "{tmp}/p.yaml", "--layout", "sim_procs=1,2"],
     "not a param of latency-sim-processes"),
    (["optimize", "workflows/latency_sim_processes.yaml", "-o", "{tmp}/p.yaml", "--layout", "sim_replicas"],
     "NAME=V1,V2"),
    # a value the workflow is not valid with is the option's fault (it was "not tried" and the run went on)
    (["optimize", "workflows/latency_interaction.yaml", "-o", "{tmp}/p.yaml", "--layout", "steps=a,b"],
     "--layout steps=a: not a valid workflow"),
    (["optimize", "workflows/latency_sim_processes.yaml", "-o", "{tmp}/p.yaml", "--layout", "sim_replicas=2",
      "--stage1", "workflows/latency_sim_processes.yaml"], "do not go together"),
])
def test_bad_input_gets_one_clear_message(tmp_path: Path, args: list[str], message: str, monkeypatch) -> None:
    """In-process (`rose`'s own app under typer's runner): a `python -m rose_cli` per case cost its start-up
    and imports, twelve times; that the command line's process exits 2 with no traceback is
    tests/cli/test_conventions.py's, and `test_what_it_would_overwrite_...` below runs the real process."""
    from typer.testing import CliRunner

    from rose_cli.main import app

    if "need a GPU" in message and torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    monkeypatch.chdir(ROOT)  # the cases name workflows/... as a user in the checkout would
    r = CliRunner().invoke(app, [a.replace("{tmp}", str(tmp_path)) for a in args])
    assert r.exit_code == 2, (r.output, r.exception)
    assert message in " ".join(r.stderr.split()), r.stderr  # (rich wraps long lines at the runner's width)
    assert "Traceback" not in r.stderr and (r.exception is None or isinstance(r.exception, SystemExit))
    assert not (tmp_path / "p.yaml").exists()


def test_what_it_would_overwrite_or_run_without_leave_is_refused_before_anything_starts(tmp_path: Path) -> None:
    """rose execute's conventions: the trust policy first; the plan, the report and the run directory of
    an earlier optimize (or the workflow itself) are never written over without --overwrite."""
    untrusted = tmp_path / "w.yaml"
    untrusted.write_text((WF / "latency_interaction.yaml").read_text().replace(
        "examples.bench.latency:Trainer", "tests.optimizer.components:NoRows"))
    r = rose("optimize", str(untrusted), "-o", str(tmp_path / "p.yaml"))
    assert r.returncode == 2 and "allow it with --allow-module tests" in r.stderr, r.stderr
    r = rose("optimize", str(untrusted), "-o", str(untrusted))
    assert r.returncode == 2 and "allow it with --allow-module" in r.stderr  # (trust is checked first)
    r = rose("optimize", str(untrusted), "-o", str(untrusted), "--allow-module", "tests.")
    assert r.returncode == 2 and "is the workflow itself" in r.stderr, r.stderr
    plan, run = tmp_path / "p.yaml", tmp_path / "p_report" / "run"
    plan.write_text("an earlier plan\n")
    r = rose("optimize", "workflows/latency_interaction.yaml", "-o", str(plan))
    assert r.returncode == 2 and "already exists" in r.stderr and "--overwrite" in r.stderr, r.stderr
    plan.unlink()
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text("{}\n")
    r = rose("optimize", "workflows/latency_interaction.yaml", "-o", str(plan))
    assert r.returncode == 2 and "holds the outputs of an earlier run (metrics.jsonl)" in r.stderr, r.stderr
    # --overwrite clears the earlier run's outputs (here the run then stops: too few iterations to measure)
    r = rose("optimize", "workflows/latency_interaction.yaml", "-o", str(plan), "--overwrite", "--set", "iterations=2")
    assert r.returncode == 2 and "not even the reference profile" in r.stderr and not (run / "metrics.jsonl").exists()
    assert "Traceback" not in r.stderr and not plan.exists()


def test_a_search_cut_short_says_so(tmp_path: Path) -> None:
    """With the workflow's own 20 iterations the search runs out of training before it decides its round:
    the plan is the declared graph for that reason, and the command says so (and how to give it more).
    (Short calls: running out of iterations does not depend on how long they take.) With --train, that nothing is
    left to train is said, and the command to continue names a new total (issue 59: `--resume` alone trained 0
    iterations)."""
    plan = tmp_path / "plan.yaml"
    r = rose("optimize", str(WF / "latency_interaction.yaml"), "--set", "per_row_ms=0.02", "--set", "fixed_ms=0.2",
             "-o", str(plan), "-q", "--local-max-fraction", "0.25", "--train")
    assert r.returncode == 0, r.stderr
    report = json.loads((tmp_path / "plan_report" / "report.json").read_text())
    assert report["settings"]["local_max_fraction"] == 0.25  # (the option reaches the search's settings)
    assert report["cut_short"] and "iterations are all trained" in report["stopped"]
    assert "cut short" in r.stdout and "--set iterations=N" in r.stdout
    assert "--train: nothing left to train with the plan" in r.stderr and "--resume -n N" in r.stdout, r.stdout


def test_stage1_given_skips_the_search_and_measures_the_plan(tmp_path: Path) -> None:
    """`--stage1 PLAN`: no graph search; the given plan is measured against the declared workflow
    (interleaved complete iterations) and is the plan written (stage 2 would follow on a GPU). A plan of
    other params is refused before anything starts."""
    # (short calls: what is checked is what is measured and written, not how fast the plan is)
    sets = ["--set", "iterations=40", "--set", "per_row_ms=0.02", "--set", "fixed_ms=0.2"]
    given = tmp_path / "given.yaml"
    r = rose("rewrite", str(WF / "latency_interaction.yaml"), *sets, "--do", "split-time epoch 2", "-o", str(given))
    assert r.returncode == 0, r.stderr
    plan = tmp_path / "plan.yaml"
    r = rose("optimize", str(WF / "latency_interaction.yaml"), *sets, "--stage1", str(given), "-o", str(plan), "-q")
    assert r.returncode == 0, r.stderr
    report = json.loads((tmp_path / "plan_report" / "report.json").read_text())
    assert report["plan_requests"] == ["split-time epoch 2"] and report["rounds"] == []
    assert "stage 1 skipped" in report["stopped"] and not report["cut_short"]
    assert report["baseline"]["n"] == report["plan"]["n"] == 5
    assert "split-time epoch 2" in plan.read_text()
    r = rose("optimize", str(WF / "latency_interaction.yaml"), "--set", "iterations=40", "--stage1", str(given),
             "-o", str(tmp_path / "other.yaml"), "-q")
    assert r.returncode == 2 and "does not compute what" in r.stderr and "Traceback" not in r.stderr


def test_a_sigterm_stops_the_search_and_still_writes_the_plan_and_report(tmp_path: Path) -> None:
    """`timeout` or a scheduler sends SIGTERM: the search ends at its next decision point, as a spent
    budget would, writes the plan and the report of what it measured and exits 130 (H200, 2026-12-02:
    a killed run had left nothing of several minutes of measurements)."""
    import signal
    import threading

    plan = tmp_path / "plan.yaml"
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    # (short calls: the search's next decision point comes within seconds of the signal -- with 0.5 +
    # 0.2 ms/row calls a first block of complete-iteration trials once ran ~40 s past it)
    p = subprocess.Popen([sys.executable, "-m", "rose_cli", "optimize", str(WF / "latency_interaction.yaml"),
                          "--set", "iterations=400", "--set", "per_row_ms=0.02", "--set", "fixed_ms=0.2",
                          "-o", str(plan)], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    signalled = threading.Event()

    def read() -> None:
        assert p.stdout is not None
        for line in p.stdout:
            lines.append(line)
            if "trials of" in line and not signalled.is_set():  # a search step: local or complete trials
                signalled.set()
                p.send_signal(signal.SIGTERM)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        code = p.wait(timeout=240)
    finally:
        if p.poll() is None:
            p.kill()
    reader.join(10)
    err = p.stderr.read() if p.stderr else ""
    out = "".join(lines)
    assert signalled.is_set(), out[-2000:] + err[-2000:]
    assert code == 130, out[-2000:] + err[-2000:]
    assert "stopped by SIGTERM" in out and "interrupted: stopped by SIGTERM" in err
    report = json.loads((tmp_path / "plan_report" / "report.json").read_text())
    assert report["cut_short"] and "SIGTERM" in report["stopped"] and report["interrupted"] == "stopped by SIGTERM"
    assert rose("validate", str(plan)).returncode == 0


def test_stage1_gets_the_whole_budget_when_stage2_cannot_run() -> None:
    """Stage 1's share of `--budget-s` (two thirds with stage 2 to come) depends on whether stage 2 will run:
    the same reasons decide both, so a GPU workflow on a machine without MPS does not leave a third of the
    budget to a stage that is then skipped."""
    from types import SimpleNamespace

    from interpreter.optimize.driver import stage2_skipped
    from rose_cli.run import Gpu
    from rose_dsl import load_workflow

    gpu_wf = load_workflow(WF / "embodied_ppo_gpu.yaml")
    cpu_wf = load_workflow(WF / "latency_interaction.yaml")
    mps = Gpu(device="cuda", daemon=SimpleNamespace(active=True))
    assert stage2_skipped(gpu_wf, True, "ray", mps) is None
    assert "MPS is not active" in (stage2_skipped(gpu_wf, True, "ray", Gpu(device="cuda")) or "")
    assert "MPS is not active" in (stage2_skipped(gpu_wf, True, "ray", Gpu(device="cuda", daemon=SimpleNamespace(active=False))) or "")
    assert stage2_skipped(gpu_wf, False, "ray", mps) == "--no-quota"
    assert "--backend ray" in (stage2_skipped(gpu_wf, True, "local", mps) or "")
    assert "no GPU components" in (stage2_skipped(cpu_wf, True, "ray", mps) or "")


def test_a_stage1_plan_with_its_own_mps_settings_is_refused(tmp_path: Path) -> None:
    """`--stage1` takes stage 1's graph: its before/after runs each process under the workflow's MPS
    settings, so a plan that sets its own quota or priority would be measured without them, and stage 2
    would start from settings no process runs under. Refused, naming the process and the setting."""
    text = (WF / "latency_interaction.yaml").read_text()
    given = tmp_path / "given.yaml"
    given.write_text(text.replace("  policy:\n", "  policy:\n    mps_priority: 1\n", 1))
    r = rose("optimize", str(WF / "latency_interaction.yaml"), "--stage1", str(given), "-o", str(tmp_path / "p.yaml"))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "other MPS settings" in r.stderr and "policy: below-normal priority" in r.stderr
    assert not (tmp_path / "p.yaml").exists()


def test_a_failed_optimize_writes_no_plan(tmp_path: Path, monkeypatch) -> None:
    """Issue 42: a run that failed writing its hand-over checkpoint (exit 5) left the plan, headed "no rewrite:
    the declared graph was fastest", which then blocked the re-run. A failed run leaves no plan."""
    from typer.testing import CliRunner

    from interpreter.checkpoint import CheckpointError
    from interpreter.optimize.trials import TrialSession
    from rose_cli.main import app

    def cannot_write(self, plan_label):
        raise CheckpointError("cannot write the checkpoint: a test's failure")

    monkeypatch.setattr(TrialSession, "finish", cannot_write)
    plan, run = tmp_path / "plan.yaml", tmp_path / "run"
    r = CliRunner().invoke(app, ["optimize", str(WF / "latency_decode.yaml"), *NO_WAIT, "--rounds", "1",
                                 "--top-k", "1", "--alternatives", "1", "-o", str(plan), "--out", str(run)])
    assert r.exit_code == 5, r.output
    assert not plan.exists() and not (tmp_path / "plan_report" / "stage1.yaml").exists()
