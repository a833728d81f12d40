"""The paper table (issue 14): each paper-shaped workload, declared against every hand-written
configuration (and, once they exist, the optimizer's plans), interleaved, in one process tree.

    python3 benchmarks/paper_table.py --workloads mjx [--rounds 3] [--warmup 1] [--iterations 2]
    python3 benchmarks/paper_table.py --workloads mjx --row mjx:stage1=plans/mjx_stage1.yaml
    python3 benchmarks/paper_table.py --smoke                       # CPU, tiny, one round (CI)

Per workload: the configurations' plans are written first (`rose rewrite`, see paper_workloads.py); then
`--rounds` rounds run every configuration once each, in the same order (A B C ... A B C ...), each as
`rose execute` with `--warmup + --iterations` RL iterations on one Ray cluster that this process starts
and every run joins (`--address`). The warm-up iterations are dropped; a configuration's throughput is
its count (env steps or tokens) over the seconds of its measured iterations, per round; the table gives
the median over rounds and the spread.

Written to `--results` (default benchmarks/results/): `paper_table.json` (machine, versions,
settings, and per workload its params, shape figures, lower bound, every configuration's per-iteration
seconds of every round, throughput median/spread, SM activity, fraction of time below 50% activity, the
ratios to `declared` and to `best_hand`; top-level keys `declared`, `best_hand`, `stage1`, `stage1_mps`,
`rose`) and SM-activity timelines (PNG) of one iteration of declared, best hand-written and rose. Run
directories (traces, metrics) stay under `--runs`.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from benchmarks.lib.common import machine, summary, versions  # noqa: E402
from benchmarks.lib.paper_profile import critical_path, load_run, run_figures  # noqa: E402
from benchmarks.lib.paper_workloads import OPTIMIZER_ROWS, WORKLOADS, Config, Workload  # noqa: E402

TARGETS = {"loop_share_min": 0.60, "halving_max": 0.65, "sm_activity_max": 0.50}


def _sets(params: dict[str, Any]) -> list[str]:
    return [arg for k, v in params.items() for arg in ("--set", f"{k}={v}")]


def _rose(args: argparse.Namespace, *rest: str, timeout: float, log: Path | None = None) -> subprocess.CompletedProcess:
    cmd = [*shlex.split(args.rose_cmd), *rest]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "PYTHONUNBUFFERED": "1"}
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        proc = subprocess.CompletedProcess(cmd, 124, out, f"timed out after {timeout:.0f} s")
    if log is not None:
        log.write_text(f"$ {shlex.join(cmd)}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}\n")
    return proc


class Prepared:
    """A workload made ready to run: its workflow files (CPU variants in smoke mode), the params every
    configuration sets, and each configuration's plan file."""

    def __init__(self, wl: Workload, args: argparse.Namespace, work: Path) -> None:
        self.wl, self.work = wl, work
        self.params = dict(wl.smoke_params if args.smoke else wl.params)
        self.params.update(args.param.get(wl.name, {}))
        (work / "plans").mkdir(parents=True, exist_ok=True)
        self.workflow = self._materialize(wl.workflow, args.smoke)
        self.variants = {name: self._materialize(path, args.smoke) for name, path in wl.variants.items()}
        names = args.configs.split(",") if args.configs else list(wl.smoke_sweep if args.smoke else wl.sweep)
        self.configs: list[Config] = []
        self.errors: dict[str, str] = {}
        for name in names:
            try:
                cfg = wl.config(name)
            except ValueError as exc:
                self.errors[name] = str(exc)
                continue
            wf = self.variants.get(name, self.workflow) if name in wl.variants else self.workflow
            self.configs.append(replace(cfg, workflow=wf))
        for row, plan in args.row.get(wl.name, {}).items():
            self.configs.append(Config(row, self.workflow, plan=Path(plan).resolve(), kind=_row_kind(row)))
        for row, command in args.row_cmd.get(wl.name, {}).items():
            plan = work / "plans" / f"{row}.yaml"
            filled = command.format(workflow=self.workflow, plan=plan, sets=shlex.join(_sets(self.params)),
                                    trust=shlex.join(wl.trust))
            proc = subprocess.run(filled, shell=True, cwd=ROOT, capture_output=True, text=True)  # shell: the user's own command
            (work / "plans" / f"{row}.log").write_text(f"$ {filled}\n{proc.stdout}\n{proc.stderr}")
            if proc.returncode or not plan.exists():
                self.errors[row] = f"--row-cmd exited {proc.returncode}: {proc.stderr.strip()[-400:]}"
                continue
            self.configs.append(Config(row, self.workflow, plan=plan, kind=_row_kind(row)))
        self.configs = [self._plan(cfg, args) for cfg in self.configs]
        self.configs = [c for c in self.configs if c.name not in self.errors]

    def _materialize(self, path: Path, smoke: bool) -> Path:
        if not smoke or self.wl.smoke_edit is None:
            return path
        doc = yaml.safe_load(path.read_text())
        self.wl.smoke_edit(doc)
        out = self.work / f"{path.stem}.smoke.yaml"
        out.write_text(f"# CPU smoke variant of {path.relative_to(ROOT)} (benchmarks/paper_table.py --smoke)\n"
                       + yaml.safe_dump(doc, sort_keys=False))
        return out

    def _plan(self, cfg: Config, args: argparse.Namespace) -> Config:
        """Write the configuration's plan with `rose rewrite` (requests, params resolved). With --session a
        configuration that sets params (`simS`) gets a layout plan (`rose rewrite --layout`), which `rose
        compare` runs on the shared workers with its own simulator processes."""
        layout = bool(cfg.sets) and getattr(args, "session", False)
        if cfg.plan is not None or not (cfg.requests or layout):
            return cfg
        plan = self.work / "plans" / f"{cfg.name}.yaml"
        sets = dict(self.params) if layout else {**self.params, **dict(cfg.sets)}
        options = [a for k, v in cfg.sets for a in ("--layout", f"{k}={v}")] if layout else []
        proc = _rose(args, "rewrite", str(cfg.workflow), *_sets(sets), *options,
                     *[a for r in cfg.requests for a in ("--do", r)],
                     "-o", str(plan), "--overwrite", timeout=120, log=self.work / "plans" / f"{cfg.name}.log")
        if proc.returncode:
            self.errors[cfg.name] = f"rose rewrite refused: {(proc.stderr or proc.stdout).strip()[-400:]}"
            return cfg
        return replace(cfg, plan=plan)

    def command(self, cfg: Config, args: argparse.Namespace, run_dir: Path, address: str | None) -> list[str]:
        n = args.warmup + args.iterations
        cmd = ["execute", str(cfg.workflow), "--backend", args.backend, "-n", str(n), "--out", str(run_dir), "-q",
               *self.wl.trust]
        if cfg.plan is not None:
            cmd += ["--plan", str(cfg.plan)]
        else:
            cmd += _sets({**self.params, **dict(cfg.sets)})
        if address:
            cmd += ["--address", address]
        return cmd


LEARNING_METRICS = ("sim/episode_return", "sim/success_rate", "learner/reward", "reward/mean_reward")


def learning_curve(prep: Prepared, args: argparse.Namespace, address: str | None) -> dict[str, Any]:
    """The declared workflow for `--learn` iterations: does the GPU workload learn (synchronous semantics
    kept)? Records the per-iteration return (or reward) and the first and last thirds' means."""
    run_dir = args.runs / prep.wl.name / "_learning"
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    cmd = prep.command(replace(prep.wl.config("declared"), workflow=prep.workflow), args, run_dir, address)
    cmd[cmd.index("-n") + 1] = str(args.learn)
    proc = _rose(args, *cmd, timeout=args.run_timeout * 3, log=run_dir.parent / "_learning.log")
    metrics = load_run(run_dir).metrics
    key = next((k for k in LEARNING_METRICS if any(k in m for m in metrics)), None)
    curve = [m.get(key) for m in metrics] if key else []
    third = max(1, len(curve) // 3)
    first = [v for v in curve[:third] if v is not None]
    last = [v for v in curve[-third:] if v is not None]
    return {"exit": proc.returncode, "iterations": args.learn, "metric": key, "curve": curve,
            "first_third_mean": statistics.mean(first) if first else None,
            "last_third_mean": statistics.mean(last) if last else None,
            "error": (proc.stderr or proc.stdout).strip().splitlines()[-4:] if proc.returncode else None}


def _row_kind(row: str) -> str:
    """An optimizer row (`stage1`, `stage1_mps`, `rose`); `candidate...`: a plan measured beside the others
    that is neither the optimizer's output nor a hand-written configuration (not in `best_hand`); any other
    name: a hand-written configuration."""
    if row in OPTIMIZER_ROWS:
        return row
    return "candidate" if row.startswith("candidate") else "hand"


def run_rounds(prep: Prepared, args: argparse.Namespace, address: str | None,
               after_each: Callable[[dict[str, list[dict[str, Any]]]], None] | None = None) -> dict[str, list[dict[str, Any]]]:
    """Every configuration once per round, in order: A B C ... A B C ... `after_each` sees the runs so far
    after every run (the results are written as they come: a call cut short still returns them)."""
    runs: dict[str, list[dict[str, Any]]] = {c.name: [] for c in prep.configs}
    for r in range(args.rounds):
        for cfg in prep.configs:
            run_dir = args.runs / prep.wl.name / cfg.name / f"round{r}"
            if run_dir.exists():
                shutil.rmtree(run_dir)
            run_dir.parent.mkdir(parents=True, exist_ok=True)
            t0 = time.monotonic()
            proc = _rose(args, *prep.command(cfg, args, run_dir, address), timeout=args.run_timeout,
                         log=run_dir.parent / f"round{r}.log")
            wall = time.monotonic() - t0
            record = {"round": r, "run_dir": str(run_dir), "exit": proc.returncode, "wall_s": wall}
            if proc.returncode:
                record["error"] = (proc.stderr or proc.stdout).strip().splitlines()[-6:]
            runs[cfg.name].append(record)
            print(f"  {prep.wl.name} round {r} {cfg.name:<14} exit {proc.returncode}  {wall:6.1f} s", flush=True)
            if after_each is not None:
                after_each(runs)
    return runs


def run_session(prep: Prepared, args: argparse.Namespace, address: str | None) -> dict[str, list[dict[str, Any]]]:
    """`--session`: every configuration on ONE set of workers (`rose compare`): the components start once
    and each round trains one iteration of every plan, interleaved A B C / C B A, each plan's first
    iteration after a switch untimed; the measured iterations are written as run directories
    (runs/WORKLOAD/CONFIG/roundR, one iteration each) that the summary reads as it reads separate runs.
    Saves every configuration's start-up (a minute for the 360M-parameter VLA on the H200). Only plans of
    the workload's workflow can share the workers: `simS` runs as a layout plan (its simulator processes
    replaced on each switch); a configuration that runs another workflow file (a hand-written variant) is
    refused here and says so."""
    runs: dict[str, list[dict[str, Any]]] = {c.name: [] for c in prep.configs}
    rows = []
    for cfg in prep.configs:
        if cfg.kind == "declared":
            continue
        if cfg.sets and args.backend != "ray":
            prep.errors[cfg.name] = ("a layout plan (its own simulator processes) shares the workers in --session "
                                     "on --backend ray only; run without --session")
            continue
        if cfg.plan is None or cfg.workflow != prep.workflow:
            prep.errors[cfg.name] = ("not a plan of the workflow (it runs another workflow file): "
                                     "cannot share the workers in --session; run without --session")
            continue
        rows.append(cfg)
    prep.configs = [c for c in prep.configs if c.name not in prep.errors]
    session_dir = args.runs / prep.wl.name
    n = args.warmup + 2 * args.rounds * (len(rows) + 1) + 1
    cmd = ["compare", str(prep.workflow), *_sets({**prep.params, "iterations": n}), "--backend", args.backend,
           "--rounds", str(args.rounds), "--warmup", str(args.warmup), "--runs", str(session_dir / "session"),
           "--json", str(session_dir / "compare.json"), "--overwrite", "-q", *prep.wl.trust,
           *[a for c in rows for a in ("--plan", f"{c.name}={c.plan}")]]
    if address:
        cmd += ["--address", address]
    if (session_dir / "session").exists():
        shutil.rmtree(session_dir / "session")
    session_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    # a session cut short (--session-timeout, e.g. inside a device call's limit) still gives its finished rounds
    timeout = args.session_timeout or args.run_timeout * (len(rows) + 1) * max(1, args.rounds)
    proc = _rose(args, *cmd, timeout=timeout, log=session_dir / "compare.log")
    wall = time.monotonic() - t0
    doc = json.loads((session_dir / "compare.json").read_text()) if (session_dir / "compare.json").exists() else None
    done = (doc or {}).get("rounds_done", 0)
    print(f"  {prep.wl.name} session of {len(rows) + 1} configurations x {args.rounds} rounds: exit {proc.returncode} "
          f"{wall:6.1f} s, {done} round(s) finished", flush=True)
    failed = {r["label"]: r["failed"] for r in (doc or {}).get("rows", []) if r.get("failed")}
    for cfg in prep.configs:
        label = "declared" if cfg.kind == "declared" else cfg.name
        dirs = sorted((session_dir / "session" / label).glob("round*"), key=lambda p: int(p.name[5:]))
        dirs = [d for d in dirs if int(d.name[5:]) < done]  # (a round cut short mid-way is not a round)
        for r, d in enumerate(dirs):
            runs[cfg.name].append({"round": r, "run_dir": str(d), "exit": 0, "wall_s": wall})
        if not dirs or label in failed or done < args.rounds:
            why = failed.get(label) or (f"the session ended after {done} of {args.rounds} rounds" if dirs else
                                        (proc.stderr or proc.stdout).strip().splitlines()[-6:])
            runs[cfg.name].append({"round": len(dirs), "run_dir": None, "exit": proc.returncode or 3, "wall_s": wall,
                                   "error": why})
    return runs


def summarize(prep: Prepared, runs: dict[str, list[dict[str, Any]]], args: argparse.Namespace,
              calibration: dict[str, Any] | None) -> dict[str, Any]:
    wl = prep.wl
    out: dict[str, Any] = {"workflow": str(wl.workflow.relative_to(ROOT)), "params": prep.params,
                           "resolved_params": _resolved(prep), "notes": wl.notes,
                           "throughput_unit": wl.throughput, "configs": {}, "refused": prep.errors}
    figures: dict[str, list[dict[str, Any]]] = {}
    for cfg in prep.configs:
        per_round = []
        warmup = 0 if args.session else args.warmup  # a session's run directories hold measured iterations only
        for rec in runs.get(cfg.name, []):
            if rec["exit"] == 0:
                fig = run_figures(load_run(Path(rec["run_dir"])), warmup, wl.work_metric, wl.loop, wl.policy_node)
                per_round.append({**rec, **fig})
        figures[cfg.name] = per_round
        out["configs"][cfg.name] = _config_row(cfg, runs.get(cfg.name, []), per_round, args.rounds)
    hand = {n: c for n, c in out["configs"].items() if c["kind"] in ("declared", "hand") and c["throughput"]["median"]}
    best = max(hand, key=lambda n: hand[n]["throughput"]["median"]) if hand else None
    declared = out["configs"].get("declared")
    for row in out["configs"].values():
        med = row["throughput"]["median"]
        row["ratio_to_declared"] = med / declared["throughput"]["median"] \
            if med and declared and declared["throughput"]["median"] else None
        row["ratio_to_best_hand"] = med / hand[best]["throughput"]["median"] if med and best else None
    out["declared"] = declared
    out["best_hand"] = {"name": best, **hand[best]} if best else None
    for row in OPTIMIZER_ROWS:
        out[row] = out["configs"].get(row)
    out["shape"] = _shape(wl, figures, calibration)
    out["lower_bound"] = _bound(prep, figures.get("declared", []), args)
    bound = (out["lower_bound"] or {}).get("seconds")
    for row in out["configs"].values():
        med = row["iteration_s"]["median"]
        row["distance_to_bound"] = med / bound if med and bound else None
    return out


def _resolved(prep: Prepared) -> dict[str, Any]:
    """The declared workflow's params after --set (what the runs used)."""
    try:
        from rose_dsl import load_workflow

        return {k: v for k, v in load_workflow(prep.workflow, prep.params).params.items()
                if isinstance(v, int | float | str | bool)}
    except Exception as exc:  # noqa: BLE001 - descriptive only; the runs report their own errors
        return {"error": str(exc)}


def _config_row(cfg: Config, records: list[dict[str, Any]], per_round: list[dict[str, Any]], rounds: int
                ) -> dict[str, Any]:
    """One configuration's figures. `rounds_requested` against `rounds_measured`: a table whose process was
    killed (the device call's limit) is written after every run, so a round that was still running when
    the kill came is in neither the figures nor `failed_rounds` -- only the count says it is missing."""
    seconds = [s for f in per_round for s in f["iteration_s"]]
    sm = [f["sm_activity"] for f in per_round if f["sm_activity"] is not None]
    below = [f["frac_below_50"] for f in per_round if f["frac_below_50"] is not None]
    return {
        "name": cfg.name, "kind": cfg.kind, "plan": str(cfg.plan) if cfg.plan else None,
        "workflow": str(cfg.workflow), "requests": list(cfg.requests), "sets": dict(cfg.sets),
        "rounds_seconds": [f["iteration_s"] for f in per_round],
        "rounds_throughput": [f["throughput"] for f in per_round],
        "throughput": summary([f["throughput"] for f in per_round if f["throughput"]]),
        "iteration_s": summary(seconds),
        "sm_activity": statistics.mean(sm) if sm else None,
        "frac_below_50": statistics.mean(below) if below else None,
        "policy_call_s": _median([f["policy_call_s"] for f in per_round]),
        "failed_rounds": [{k: r[k] for k in ("round", "exit", "error") if k in r} for r in records if r["exit"]],
        "rounds_requested": rounds,
        "rounds_measured": len(per_round),
        "run_wall_s": [r["wall_s"] for r in records],
    }


def _median(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def _shape(wl: Workload, figures: dict[str, list[dict[str, Any]]], calibration: dict[str, Any] | None
           ) -> dict[str, Any]:
    """The shape targets, measured: interaction loop share and mean SM activity of the declared runs;
    the policy's call time at B/2 over B in the runs (pipe2 against declared, under the other processes'
    load) and, when given, in isolation (the calibration JSON)."""
    declared = figures.get("declared", [])
    if wl.targets is not None:
        return _policy_shape(wl.targets, declared)
    shape: dict[str, Any] = {"targets": TARGETS}
    shape["loop_share"] = _median([s for f in declared for s in f["loop_share"]]) if wl.loop else None
    sm = [f["sm_activity"] for f in declared if f["sm_activity"] is not None]
    shape["declared_sm_activity"] = statistics.mean(sm) if sm else None
    full = _median([f["policy_call_s"] for f in declared])
    half = _median([f["policy_call_s"] for f in figures.get("pipe2", [])])
    shape["policy_call_s"] = full
    shape["halving_in_run"] = half / full if half and full else None
    if calibration:
        shape["halving_isolated"] = calibration
    halving = shape.get("halving_isolated", {}).get("ratio") if calibration else shape["halving_in_run"]
    shape["met"] = {
        "loop_share": None if shape["loop_share"] is None else shape["loop_share"] >= TARGETS["loop_share_min"],
        "halving": None if halving is None else halving <= TARGETS["halving_max"],
        "sm_activity": None if shape["declared_sm_activity"] is None
        else shape["declared_sm_activity"] < TARGETS["sm_activity_max"],
    }
    return shape


def _policy_shape(targets: dict[str, float], declared: list[dict[str, Any]]) -> dict[str, Any]:
    """The LLM long-tail shape: the policy's (generation's) share of the declared iteration and the declared
    iteration's mean SM activity, both with lower bounds."""
    sm = [f["sm_activity"] for f in declared if f["sm_activity"] is not None]
    full = _median([f["policy_call_s"] for f in declared])
    iteration = _median([s for f in declared for s in f["iteration_s"]])
    shape: dict[str, Any] = {"targets": targets, "policy_call_s": full,
                             "policy_share": full / iteration if full and iteration else None,
                             "declared_sm_activity": statistics.mean(sm) if sm else None}
    shape["met"] = {
        "policy_share": None if shape["policy_share"] is None else shape["policy_share"] >= targets["policy_share_min"],
        "sm_activity": None if shape["declared_sm_activity"] is None
        else shape["declared_sm_activity"] >= targets["sm_activity_min"],
    }
    return shape


def _bound(prep: Prepared, declared: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any] | None:
    """max(critical path with unlimited overlap, total GPU work at full activity), from the declared runs."""
    if not declared:
        return None
    paths = []
    for f in declared:
        cp = critical_path(load_run(Path(f["run_dir"])), prep.workflow, prep.params, 0 if args.session else args.warmup)
        if cp:
            paths.append(cp)
    gpu = _median([w for f in declared for w in f["gpu_work_s"]])
    cp_s = _median([p["seconds"] for p in paths])
    candidates = [v for v in (cp_s, gpu) if v]
    return {
        "seconds": max(candidates) if candidates else None,
        "critical_path_s": cp_s, "gpu_work_s": gpu,
        "binding": None if not candidates else ("critical_path" if cp_s == max(candidates) else "gpu_work"),
        "critical_path": paths[0]["path"] if paths else None,
        "method": "critical path: the declared workflow's invocation graph of one RL iteration, each invocation "
                  "lasting its median measured duration, every call starting when its producers finish "
                  "(unlimited overlap, no contention); GPU work: the integral of device-wide SM activity over the "
                  "iteration (its time at 100% activity). Both from the declared runs; a split plan's chain can be "
                  "shorter than the declared one, its GPU work not.",
    }


def _timelines(result: dict[str, Any], wl_name: str, args: argparse.Namespace) -> dict[str, str | None]:
    """One iteration's timeline (calls per process + SM activity) of declared, best hand-written and rose."""
    try:
        from benchmarks.plot_timeline import plot
    except ImportError as exc:  # pragma: no cover - the module itself always imports
        return {"error": str(exc)}
    out: dict[str, str | None] = {}
    for key in ("declared", "best_hand", "rose"):
        row = result.get(key)
        name = row.get("name") if row else None
        cfg = result["configs"].get(name) if name else None
        if not cfg or not cfg["rounds_seconds"]:
            out[key] = None
            continue
        label = "declared" if name == "declared" else name
        run_dir = (args.runs / wl_name / "session" / label if args.session else args.runs / wl_name / name) \
            / f"round{len(cfg['rounds_seconds']) - 1}"
        png = args.results / f"{wl_name}_{key}_timeline.png"
        try:
            plot(run_dir / "trace.json", png, None, f"{wl_name}: {key} ({name})")
            out[key] = str(png.relative_to(ROOT) if png.is_relative_to(ROOT) else png)
        except Exception as exc:  # noqa: BLE001 - a missing plotting library or trace: say so in the JSON
            out[key] = f"not drawn: {type(exc).__name__}: {exc}"
    return out


def _calibration(path: Path | None, wl: Workload, params: dict[str, Any]) -> dict[str, Any] | None:
    """act(B/2)/act(B) from the calibration JSON (benchmarks/workload_shapes.py) for this workload's
    policy config and batch, when that file has it."""
    if path is None or not path.exists():
        return None
    doc = json.loads(path.read_text())
    name = {"mjx": "d1024_l24_t256", "metaworld": "img128_d1024_l24"}.get(wl.name)
    pol = (doc.get("policy") or {}).get(name or "", {})
    n = int(params.get("num_envs") or 0)
    rows = pol.get("batches", {})
    full, half = rows.get(str(n)), rows.get(str(n // 2))
    if not (full and half):
        return None
    key = "act_graph_ms" if "act_graph_ms" in full else "act_eager_ms"
    phases = {k.removesuffix("_ms"): (v["median"] if isinstance(v, dict) else v) for k, v in full.items()
              if k.endswith(("_ms", "_sm_activity"))}  # each phase before (eager) and after (CUDA graphs)
    return {"source": str(path), "policy": name, "batch": n, "act_ms": full[key]["median"],
            "act_half_ms": half[key]["median"], "ratio": half[key]["median"] / full[key]["median"],
            "phases_at_batch": phases}


def _table(results: dict[str, Any]) -> str:
    lines = []
    for name, wl in results["workloads"].items():
        lines.append(f"== {name} ({wl['throughput_unit']}; best hand-written: "
                     f"{(wl['best_hand'] or {}).get('name')}; bound {(wl['lower_bound'] or {}).get('seconds')})")
        lines.append(f"{'config':<16}{'median':>10}{'spread':>8}{'s/iter':>8}{'SM':>6}{'<50%':>6}{'vs decl':>8}"
                     f"{'vs best':>8}{'/bound':>7}  missing")
        for c in wl["configs"].values():
            def f(v: Any, spec: str) -> str:
                return format(v, spec) if v is not None else format("-", ">" + spec.split(".")[0])
            lines.append(f"{c['name']:<16}{f(c['throughput']['median'], '10.1f')}{f(c['throughput']['spread'], '8.2f')}"
                         f"{f(c['iteration_s']['median'], '8.2f')}{f(c['sm_activity'], '6.2f')}"
                         f"{f(c['frac_below_50'], '6.2f')}{f(c['ratio_to_declared'], '8.2f')}"
                         f"{f(c['ratio_to_best_hand'], '8.2f')}{f(c['distance_to_bound'], '7.2f')}  "
                         f"{_missing(c)}")
        shape = wl["shape"]
        lines.append(f"shape: loop share {shape.get('loop_share')}, declared SM {shape.get('declared_sm_activity')}, "
                     f"halving in run {shape.get('halving_in_run')}, met {shape.get('met')}")
        if wl["refused"]:
            lines.append(f"refused: {wl['refused']}")
    return "\n".join(lines)


def _missing(row: dict[str, Any]) -> int:
    """Rounds of a configuration without figures (failed, or never finished); older JSONs lack the counts."""
    measured = row.get("rounds_measured", len(row["rounds_seconds"]))
    return row.get("rounds_requested", measured + len(row["failed_rounds"])) - measured


def _recalibrate(name: str, wl: dict[str, Any], calibration: Path | None) -> None:
    """A merged workload's halving target from the calibration JSON when its run had none (the
    calibration was measured in another device call): `shape.halving_isolated` and `shape.met`."""
    shape = wl.get("shape") or {}
    if not shape or shape.get("halving_isolated"):
        return
    cal = _calibration(calibration, WORKLOADS[name], wl.get("resolved_params") or {}) if name in WORKLOADS else None
    if cal:
        shape["halving_isolated"] = cal
        shape.setdefault("met", {})["halving"] = cal["ratio"] <= TARGETS["halving_max"]


def merge(files: list[Path], results: Path, calibration: Path | None = None) -> int:
    """Combine the workloads of several runs (e.g. one device call per workload) into one table; later
    files win; the timeline PNGs are copied next to the merged JSON; a workload without the isolated
    halving figure gets it from `calibration` when that file has it."""
    results.mkdir(parents=True, exist_ok=True)
    target = results / "paper_table.json"
    merged: dict[str, Any] = json.loads(target.read_text()) if target.exists() else {}
    runs = merged.setdefault("runs", [])
    for path in files:
        doc = json.loads(path.read_text())
        for name, wl in doc.get("workloads", {}).items():
            for key, png in (wl.get("timelines") or {}).items():
                src = path.parent / Path(png).name if png and png.endswith(".png") else None
                if src is not None and src.exists():
                    shutil.copy(src, results / src.name)
                    wl["timelines"][key] = str((results / src.name).relative_to(ROOT)) \
                        if (results / src.name).is_relative_to(ROOT) else str(results / src.name)
            merged.setdefault("workloads", {})[name] = wl
        runs.append({k: doc.get(k) for k in ("argv", "date", "machine", "versions", "settings")} | {"file": str(path)})
        for key in ("machine", "versions", "settings", "definitions", "script"):
            merged[key] = doc.get(key, merged.get(key))
    for name, wl in merged.get("workloads", {}).items():
        _recalibrate(name, wl, calibration)
    target.write_text(json.dumps(merged, indent=1, default=str) + "\n")
    print(_table(merged))
    print(f"wrote {target}")
    return 0


class _Cluster:
    """One Ray cluster for every run (`rose execute --address`), owned by this process: stopping it stops
    only what this process started."""

    def __init__(self, args: argparse.Namespace, gpus: int) -> None:
        self.address: str | None = args.address
        self.started = False
        if args.backend == "ray" and not self.address:
            import ray

            ray.init(num_cpus=os.cpu_count() or 2, num_gpus=gpus, include_dashboard=False, logging_level="ERROR")
            self.address = ray.get_runtime_context().gcs_address
            self.started = True

    def close(self) -> None:
        if self.started:
            import ray

            ray.shutdown()


def _parse_rows(values: list[str], what: str) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for value in values:
        head, sep, target = value.partition("=")
        wl, colon, row = head.partition(":")
        if not (sep and colon and row):
            raise SystemExit(f"error: {what} takes WORKLOAD:ROW=VALUE, got {value!r}")
        out.setdefault(wl, {})[row] = target
    return out


def _parse_params(values: list[str]) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for value in values:
        head, sep, v = value.partition("=")
        wl, colon, name = head.partition(":")
        if not (sep and colon and name):
            raise SystemExit(f"error: --param takes WORKLOAD:NAME=VALUE, got {value!r}")
        out.setdefault(wl, {})[name] = v
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", default=None, help=f"comma-separated, of {', '.join(WORKLOADS)} (default: mjx; smoke: mjx,llm)")
    ap.add_argument("--configs", default=None, help="comma-separated configuration names (default: the workload's sweep)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1, help="RL iterations dropped at the start of every run")
    ap.add_argument("--iterations", type=int, default=2, help="measured RL iterations per run")
    ap.add_argument("--backend", default="ray", choices=("ray", "local"))
    ap.add_argument("--address", default=None, help="join this Ray cluster (default: start one for all runs)")
    ap.add_argument("--row", action="append", default=[], help="WORKLOAD:ROW=PLAN.yaml (ROW: stage1, stage1_mps, rose; candidate...: "
                                                                  "measured, counted as neither; any other: hand-written)")
    ap.add_argument("--row-cmd", action="append", default=[],
                    help="WORKLOAD:ROW=COMMAND writing {plan} from {workflow} with {sets} and {trust} (the "
                         "workload's --allow-* options), e.g. rose optimize")
    ap.add_argument("--param", action="append", default=[], help="WORKLOAD:NAME=VALUE for every configuration")
    ap.add_argument("--calibration", type=Path, default=ROOT / "benchmarks" / "results" / "workload_shapes.json")
    ap.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--runs", type=Path, default=Path("/tmp/paper_runs"))
    ap.add_argument("--run-timeout", type=float, default=300.0)
    ap.add_argument("--rose-cmd", default=f"{sys.executable} -m rose_cli", help="how to run the rose command")
    ap.add_argument("--learn", type=int, default=0, metavar="N",
                    help="after the rounds, run the declared workflow for N iterations and record its learning curve")
    ap.add_argument("--session-timeout", type=float, default=None, metavar="S",
                    help="--session: stop the session after S seconds, keeping the rounds it finished")
    ap.add_argument("--session", action="store_true",
                    help="every configuration on one set of workers (rose compare): one start-up, iterations interleaved")
    ap.add_argument("--smoke", action="store_true", help="CPU: tiny sizes, CPU simulators, one round, local backend")
    ap.add_argument("--merge", nargs="+", type=Path, default=None, metavar="JSON",
                    help="merge the workloads of these paper_table.json files (and their timelines) into --results")
    args = ap.parse_args(argv)
    if args.merge:
        return merge(args.merge, args.results.resolve(), args.calibration)
    if args.smoke:
        args.rounds = min(args.rounds, 1) if "--rounds" not in (argv or sys.argv) else args.rounds
        args.iterations = 1 if "--iterations" not in (argv or sys.argv) else args.iterations
        if "--backend" not in (argv or sys.argv):
            args.backend = "local"
    names = (args.workloads or ("mjx,llm" if args.smoke else "mjx")).split(",")
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        print(f"error: unknown workload(s) {unknown}; known: {', '.join(WORKLOADS)}", file=sys.stderr)
        return 2
    args.row, args.row_cmd = _parse_rows(args.row, "--row"), _parse_rows(args.row_cmd, "--row-cmd")
    args.param = _parse_params(args.param)
    args.runs, args.results = args.runs.resolve(), args.results.resolve()
    args.results.mkdir(parents=True, exist_ok=True)
    host = machine()
    results: dict[str, Any] = {
        "script": "benchmarks/paper_table.py", "argv": sys.argv[1:] if argv is None else argv, "machine": host,
        "versions": versions(), "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "settings": {k: v for k, v in vars(args).items() if k in ("rounds", "warmup", "iterations", "backend", "smoke",
                                                                     "session")},
        "definitions": {"throughput": "the workload's count (env steps or tokens) over the seconds of the measured "
                        "iterations of one run (one round); median and spread (max-min)/median over rounds",
                        "sm_activity": "time-weighted mean of the device-wide NVML GPM SM activity over the measured "
                        "iterations' windows", "frac_below_50": "share of that time with SM activity below 50%",
                        "best_hand": "the fastest of declared and the hand-written configurations"},
        "workloads": {},
    }
    out_json = args.results / "paper_table.json"
    cluster = _Cluster(args, gpus=len(host["gpus"]))
    try:
        for name in names:
            wl = WORKLOADS[name]
            print(f"== {name}: preparing plans", flush=True)
            prep = Prepared(wl, args, args.runs / name / "_prepared")
            calibration = _calibration(args.calibration, wl, {**_resolved(prep), **prep.params})

            def partial(runs: dict[str, list[dict[str, Any]]], prep: Prepared = prep, name: str = name,
                        calibration: Any = calibration) -> None:
                results["workloads"][name] = {**summarize(prep, runs, args, calibration), "partial": True}
                out_json.write_text(json.dumps(results, indent=1, default=str) + "\n")

            runs = run_session(prep, args, cluster.address) if args.session else \
                run_rounds(prep, args, cluster.address, partial)
            result = summarize(prep, runs, args, calibration)
            result["timelines"] = _timelines(result, name, args)
            if args.learn:
                result["learning"] = learning_curve(prep, args, cluster.address)
            results["workloads"][name] = result
            out_json.write_text(json.dumps(results, indent=1, default=str) + "\n")
    finally:
        cluster.close()
    out_json.write_text(json.dumps(results, indent=1, default=str) + "\n")
    print(_table(results))
    print(f"wrote {out_json}")
    failed = [c for wl in results["workloads"].values() for c in wl["configs"].values() if not c["throughput"]["n"]]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
