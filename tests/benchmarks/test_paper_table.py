"""The paper-table harness in its CPU smoke mode (what CI runs so that it cannot rot): tiny CPU variants
of the paper-shaped workflows, one round, every configuration's plan written by `rose rewrite`, run by
`rose execute`, read back into the JSON the GPU run writes. On the CPU every configuration must also
compute exactly what the declared workflow computes (the rewrites preserve semantics)."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest

from benchmarks.lib.paper_workloads import WORKLOADS
from benchmarks.paper_table import main

ROSE = f"{sys.executable} -m rose_cli"


def _metrics(run_dir: str) -> list[dict]:
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


def _same_training(runs: Path, workload: str, names: list[str]) -> None:
    """Every configuration's per-iteration losses and returns equal the declared workflow's."""
    ref = _metrics(str(runs / workload / "declared" / "round0"))
    keys = [k for k in ref[0] if k.startswith(("trainer/loss", "sim/episode_return", "learner/loss"))]
    assert keys
    for name in names:
        got = _metrics(str(runs / workload / name / "round0"))
        assert [[m.get(k) for k in keys] for m in got] == [[m.get(k) for k in keys] for m in ref], name


@pytest.mark.e2e
def test_smoke_mjx_writes_the_table_and_configurations_compute_the_same(tmp_path: Path) -> None:
    results, runs = tmp_path / "results", tmp_path / "runs"
    row_cmd = (f"mjx:stage1={ROSE} rewrite {{workflow}} {{sets}} --do 'split step 2' --do 'interleave step' "
               f"-o {{plan}}")
    code = main(["--smoke", "--workloads", "mjx", "--configs", "declared,pipe2,fuse,bogus", "--learn", "2",
                 "--row-cmd", row_cmd, "--results", str(results), "--runs", str(runs)])
    assert code == 0
    doc = json.loads((results / "paper_table.json").read_text())
    assert doc["machine"]["cpu_count"] and doc["versions"]["torch"]
    assert doc["settings"] == {"rounds": 1, "warmup": 1, "iterations": 1, "backend": "local", "smoke": True,
                               "session": False}
    wl = doc["workloads"]["mjx"]
    assert set(wl["configs"]) == {"declared", "pipe2", "fuse", "stage1"}
    assert "bogus" in wl["refused"]  # an unknown configuration is reported, not fatal
    for name, row in wl["configs"].items():
        assert len(row["rounds_seconds"]) == 1 and len(row["rounds_seconds"][0]) == 1, name
        assert row["throughput"]["median"] > 0 and row["iteration_s"]["median"] > 0
        assert row["ratio_to_declared"] > 0 and row["ratio_to_best_hand"] > 0
        if row["kind"] in ("declared", "hand"):  # (an optimizer row may beat the best hand-written one: here
            assert row["ratio_to_best_hand"] <= 1.0 + 1e-12  # stage1 is pipe2's graph, and one round each is noise)
    assert wl["configs"]["declared"]["ratio_to_declared"] == 1.0
    assert wl["configs"]["pipe2"]["plan"].endswith("pipe2.yaml")
    assert wl["configs"]["pipe2"]["requests"] == ["split step 2", "interleave step"]
    # best hand-written: the fastest of declared and the hand configurations, never an optimizer row
    hand = {n: r["throughput"]["median"] for n, r in wl["configs"].items() if r["kind"] in ("declared", "hand")}
    assert wl["best_hand"]["name"] == max(hand, key=hand.get)
    assert wl["stage1"]["kind"] == "stage1" and wl["stage1_mps"] is None and wl["rose"] is None
    bound = wl["lower_bound"]
    assert bound["critical_path_s"] > 0 and bound["gpu_work_s"] is None and bound["binding"] == "critical_path"
    assert bound["critical_path"][0].startswith("epoch.reset")
    shape = wl["shape"]
    assert 0 < shape["loop_share"] <= 1 and shape["halving_in_run"] > 0
    _same_training(runs, "mjx", ["pipe2", "fuse", "stage1"])
    learning = wl["learning"]
    assert learning["exit"] == 0 and learning["metric"] == "sim/episode_return" and len(learning["curve"]) == 2


def test_smoke_session_runs_every_configuration_on_one_set_of_workers(tmp_path: Path) -> None:
    """`--session`: one `rose compare` per workload (one start-up; one iteration of each plan per round,
    interleaved); its run directories give the same table. `simS` runs there as a layout plan (`rose
    rewrite --layout`), refused with the reason where it is none: the MJX workflow has no simulator
    processes to change."""
    results, runs = tmp_path / "results", tmp_path / "runs"
    code = main(["--smoke", "--session", "--workloads", "mjx", "--configs", "declared,pipe2,fuse,sim2", "--rounds", "2",
                 "--results", str(results), "--runs", str(runs)])
    assert code == 0
    doc = json.loads((results / "paper_table.json").read_text())
    assert doc["settings"]["session"] is True
    wl = doc["workloads"]["mjx"]
    assert set(wl["configs"]) == {"declared", "pipe2", "fuse"} and "sim_replicas: not a param" in wl["refused"]["sim2"]
    for name, row in wl["configs"].items():
        assert len(row["rounds_seconds"]) == 2 and all(len(r) == 1 for r in row["rounds_seconds"]), name
        assert row["throughput"]["median"] > 0 and row["policy_call_s"] > 0
    assert wl["lower_bound"]["critical_path_s"] > 0 and 0 < wl["shape"]["loop_share"] <= 1
    rows = json.loads((runs / "mjx" / "compare.json").read_text())["rows"]
    assert [r["label"] for r in rows] == ["declared", "pipe2", "fuse"]
    assert (runs / "mjx" / "session" / "declared" / "round1" / "trace.json").exists()  # what the timeline draws
    assert wl["timelines"]["declared"].endswith(".png") or "matplotlib" in wl["timelines"]["declared"]


def test_a_session_cut_short_keeps_its_finished_rounds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The session is cut when it has finished two rounds, as `--session-timeout` cuts it (exit 124) -- on an
    event, not after a wall time in which a loaded machine may not finish one round (8 s once gave none)."""
    import os
    import subprocess
    import time

    import benchmarks.paper_table as pt

    real = pt._rose

    def cut_after_two_rounds(args, *rest: str, timeout: float, log: Path | None = None):
        if "compare" not in rest:
            return real(args, *rest, timeout=timeout, log=log)
        js = Path(rest[rest.index("--json") + 1])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(pt.ROOT), os.environ.get("PYTHONPATH", "")])}
        proc = subprocess.Popen([*shlex.split(args.rose_cmd), *rest], cwd=pt.ROOT, env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        give_up = time.monotonic() + 450  # (a hung session, not a speed)
        while proc.poll() is None and time.monotonic() < give_up and not (
                js.exists() and json.loads(js.read_text()).get("rounds_done", 0) >= 2):
            time.sleep(0.2)
        proc.kill()
        proc.wait(30)
        return subprocess.CompletedProcess(rest, 124, "", "timed out")

    monkeypatch.setattr(pt, "_rose", cut_after_two_rounds)
    results, runs = tmp_path / "results", tmp_path / "runs"
    code = main(["--smoke", "--session", "--workloads", "mjx", "--configs", "declared,fuse", "--rounds", "500",
                 "--results", str(results), "--runs", str(runs)])
    assert code == 0
    wl = json.loads((results / "paper_table.json").read_text())["workloads"]["mjx"]
    for row in wl["configs"].values():
        done = len(row["rounds_seconds"])
        assert 2 <= done < 500 and row["throughput"]["n"] == done
        assert row["failed_rounds"] == [{"round": done, "exit": 124, "error": f"the session ended after {done} of 500 rounds"}]


def test_smoke_metaworld_with_simulator_processes_on_ray(tmp_path: Path) -> None:
    """Several simulator processes (hybrid replicas through Ray) roll out what one process does."""
    pytest.importorskip("metaworld", reason="Meta-World is an optional extra (pip install -e '.[metaworld]')")
    ray = pytest.importorskip("ray")
    if ray.is_initialized():  # the benchmark starts a cluster of its own: the worker's shared one stops first
        ray.shutdown()
    results, runs = tmp_path / "results", tmp_path / "runs"
    code = main(["--smoke", "--workloads", "metaworld", "--configs", "declared,sim2", "--backend", "ray",
                 "--results", str(results), "--runs", str(runs)])
    assert code == 0
    wl = json.loads((results / "paper_table.json").read_text())["workloads"]["metaworld"]
    assert wl["configs"]["sim2"]["sets"] == {"sim_replicas": "2"}
    _same_training(runs, "metaworld", ["sim2"])


def test_configuration_names() -> None:
    mjx = WORKLOADS["mjx"]
    assert mjx.config("pipe4+fuse").requests == ("split step 4", "interleave step", "fuse epoch update")
    assert mjx.config("sim8").sets == (("sim_replicas", "8"),)
    assert mjx.config("splittime2").requests == ("split-time epoch 2",)
    assert WORKLOADS["llm"].config("llmpipe").workflow.name == "llm_grpo_gpu_pipelined.yaml"
    with pytest.raises(ValueError, match="unknown configuration part 'pipe'"):
        mjx.config("pipe")
    assert shlex.split(ROSE)[0] == sys.executable


def test_calibration_gives_the_isolated_halving_and_phase_table(tmp_path: Path) -> None:
    from benchmarks.paper_table import _calibration

    def row(act: float) -> dict:
        return {"act_graph_ms": {"median": act}, "act_eager_ms": {"median": act + 5},
                "backbone_ms": {"median": act - 2}, "act_graph_sm_activity": 0.7}

    path = tmp_path / "shapes.json"
    path.write_text(json.dumps({"policy": {"d1024_l24_t256": {"batches": {"256": row(100.0), "128": row(55.0)}}}}))
    got = _calibration(path, WORKLOADS["mjx"], {"num_envs": 256})
    assert got["ratio"] == pytest.approx(0.55) and got["act_ms"] == 100.0
    assert got["phases_at_batch"] == {"act_graph": 100.0, "act_eager": 105.0, "backbone": 98.0,
                                      "act_graph_sm_activity": 0.7}
    assert _calibration(path, WORKLOADS["mjx"], {"num_envs": 64}) is None
    assert _calibration(tmp_path / "absent.json", WORKLOADS["mjx"], {}) is None


def test_merge_records_each_file_once_and_fills_the_halving_from_the_calibration(tmp_path: Path) -> None:
    from benchmarks.paper_table import merge

    def table(name: str, envs: int) -> dict:
        shape = {"targets": {}, "halving_in_run": None, "met": {"loop_share": True, "halving": None}}
        return {"date": "d", "workloads": {name: {
            "configs": {}, "refused": {}, "timelines": {}, "shape": shape, "throughput_unit": "env_steps_per_s",
            "best_hand": None, "lower_bound": None, "resolved_params": {"num_envs": envs}}}}

    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(table("mjx", 256)))
    b.write_text(json.dumps(table("metaworld", 32)))
    cal = tmp_path / "shapes.json"
    cal.write_text(json.dumps({"policy": {"img128_d1024_l24": {"batches": {
        "32": {"act_graph_ms": {"median": 40.0}}, "16": {"act_graph_ms": {"median": 30.0}}}}}}))
    assert merge([a, b], tmp_path / "out", cal) == 0
    doc = json.loads((tmp_path / "out" / "paper_table.json").read_text())
    assert [r["file"] for r in doc["runs"]] == [str(a), str(b)]
    mw, mjx = doc["workloads"]["metaworld"]["shape"], doc["workloads"]["mjx"]["shape"]
    assert mw["halving_isolated"]["ratio"] == pytest.approx(0.75) and mw["met"]["halving"] is False
    assert "halving_isolated" not in mjx and mjx["met"]["halving"] is None  # the calibration lacks its policy


def test_a_round_killed_while_running_is_counted_as_missing() -> None:
    """A table killed from outside (the device call's `timeout`) was written after its last finished run:
    the run still in progress left no record, and only rounds_requested > rounds_measured says so."""
    from benchmarks.lib.paper_workloads import Config
    from benchmarks.paper_table import _config_row, _missing

    cfg = Config(name="llmpipe", kind="hand", workflow=Path("w.yaml"))
    fig = {"iteration_s": [1.5, 1.6], "throughput": 10.0, "sm_activity": None, "frac_below_50": None,
           "policy_call_s": None}
    records = [{"round": r, "exit": 0, "wall_s": 30.0} for r in range(2)]
    row = _config_row(cfg, records, [fig, fig], rounds=3)
    assert (row["rounds_requested"], row["rounds_measured"], row["failed_rounds"]) == (3, 2, [])
    assert _missing(row) == 1
    assert _missing({"rounds_seconds": [[1.0]], "failed_rounds": [{"round": 1}]}) == 1  # an older JSON


def test_weight_transfer_benchmark_smoke_loads_the_same_weights_both_ways(tmp_path: Path) -> None:
    """benchmarks/weight_transfer.py (the publish -> sync edge with torch's pickling and with rose's tensor
    transport) runs on the CPU at tiny sizes and finds both transports load bit-identical weights."""
    ray = pytest.importorskip("ray")
    if ray.is_initialized():  # the benchmark starts a cluster of its own: the worker's shared one stops first
        ray.shutdown()  # (`ray_session` starts it again for the next module that asks)
    from benchmarks.weight_transfer import main as transfer

    out = tmp_path / "wt.json"
    assert transfer(["--smoke", "--device", "cpu", "--reps", "2", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["bit_identical"] and all(doc["seconds"][n]["n"] == 4 for n in
                                        ("default", "rose", "default_compiled", "rose_compiled"))


def test_row_kinds_keep_candidates_out_of_the_best_hand_written() -> None:
    """A `candidate...` row (a plan measured beside the table, e.g. one candidate of the optimizer's applied by
    hand) is neither hand-written nor the optimizer's: the best hand-written figure must not be taken from it."""
    from benchmarks.paper_table import _row_kind

    assert _row_kind("candidate_st2i") == "candidate"
    assert _row_kind("stage1") == "stage1" and _row_kind("rose") == "rose"
    assert _row_kind("sim8") == "hand"


def test_smoke_llm_longtail_streams_finished_groups_and_trains_the_same(tmp_path: Path) -> None:
    """The long-tail LLM workload (issue 45) in its CPU smoke variant: declared and `chain2` (finished
    prompt groups streamed to reference and reward scoring while the rest decodes), each its own run from
    the same start: the same losses, rewards and staleness (lag 0) bit for bit; tokens/s per row; the
    workload's own shape targets."""
    results, runs = tmp_path / "results", tmp_path / "runs"
    code = main(["--smoke", "--workloads", "llm_longtail", "--configs", "declared,chain2",
                 "--results", str(results), "--runs", str(runs)])
    assert code == 0
    wl = json.loads((results / "paper_table.json").read_text())["workloads"]["llm_longtail"]
    assert wl["throughput_unit"] == "tokens_per_s" and set(wl["configs"]) == {"declared", "chain2"}
    assert wl["configs"]["chain2"]["requests"] == ["split-chain generate ref score 2"]
    for row in wl["configs"].values():
        assert row["throughput"]["median"] > 0
    shape = wl["shape"]
    assert shape["targets"] == {"policy_share_min": 0.5, "sm_activity_min": 0.3}
    assert 0 < shape["policy_share"] <= 1 and shape["met"]["sm_activity"] is None  # no GPU: no activity
    ref, got = (_metrics(str(runs / "llm_longtail" / name / "round0")) for name in ("declared", "chain2"))
    # (the reward pool's own mean_reward sums per call: its float order follows the grouping, so not compared)
    keys = [k for k in ref[0] if k.startswith("learner/")]
    assert "learner/staleness_hist_0" in keys and "learner/ratio_mean" in keys
    assert [[m[k] for k in keys] for m in got] == [[m[k] for k in keys] for m in ref]
    assert ref[0]["generator/generated_tokens"] == got[0]["generator/generated_tokens"] > 0


def test_chain_configuration_name() -> None:
    assert WORKLOADS["llm_longtail"].config("chain4").requests == ("split-chain generate ref score 4",)
