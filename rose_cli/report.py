"""What `rose execute` prints: per-iteration lines, the per-node table, the learning curve, and the
messages of resumes, restarts and the watchdog."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from interpreter.backends import Backend
from interpreter.runner import IterationResult, Resumed
from rose_dsl.ir import Workflow

__all__ = ["metrics_line", "processes", "resumed", "recovery", "stacks", "nodes", "curve", "staleness",
           "staleness_histogram"]

CURVE_METRICS = ("episode_return", "reward", "mean_reward")
STALENESS_KEY = re.compile(r"^(?P<source>.+)/staleness_hist_(?P<lag>-?\d+)$")  # a negative lag: a bug, shown  # a learner's per-iteration counts


def metrics_line(metrics: dict[str, float]) -> str:
    keys = ["iteration_s", "env_steps_per_s", "tokens_per_s", "sm_activity"]
    shown = [f"{k.replace('_per_s', '/s')} {metrics[k]:.4g}" for k in keys if k in metrics]
    shown += [f"{k} {v:.4g}" for k, v in metrics.items() if "/" in k and not k.startswith("time/")][:8]
    return "  ".join(shown)


def processes(out: Console, be: Backend) -> None:
    """One line per component process that sees a GPU: its pid, SMs visible, MPS quota."""
    for name in be.components():
        info = be.control(name, "info")
        if info and info.get("sm_count"):
            quota = f" (MPS quota {info['mps_quota']}%)" if info.get("mps_quota") else ""
            out.print(f"component {name}: pid {info['pid']}, {info['sm_count']} SMs visible{quota}", markup=False)


def checkpoint_drains(err: Console, depth: int, every: int) -> None:
    """What `--checkpoint-every N` costs an asynchronous plan (`depth` RL iterations in flight): a
    checkpoint holds the declared workflow's state, so the pipeline drains before each one and nothing runs
    ahead into it (`interpreter/pipeline.py`). At N = 1 no two iterations overlap: the plan runs as the
    synchronous workflow does, which a user asking for a checkpoint per iteration would not guess."""
    if depth <= 1 or every <= 0:
        return
    if every == 1:
        err.print("warning: --checkpoint-every 1 drains this asynchronous plan's pipeline after every iteration "
                  "(a checkpoint holds the declared workflow's state): no two iterations overlap, and it runs as "
                  "the synchronous workflow does; a larger N overlaps all but one iteration in N", markup=False)
    else:
        err.print(f"note: --checkpoint-every {every} drains this asynchronous plan's pipeline before each "
                  f"checkpoint: one iteration in {every} does not overlap the next", markup=False)


def resumed(err: Console, r: Resumed, iterations: int) -> None:
    """Which checkpoint a resume uses, and which newer ones it could not (never a silent skip). A stop of an
    asynchronous plan between checkpoint iterations keeps what it has in flight (`interpreter/in_flight.py`),
    said here with the deferred calls still to come; one that could not (`drained_at_stop`) ran them at the
    stop, a synchronisation point the uninterrupted run does not have: said not to be exact, and why."""
    for rej in r.rejected:
        err.print(f"warning: checkpoint {rej.path.name} rejected: {rej.reason}", markup=False)
    nxt = r.iteration + 1
    what = f"continuing at iteration {nxt} of {iterations}" if nxt < iterations else \
        f"nothing left to run: -n {iterations} iterations are done (give a larger -n to continue)"
    if r.in_flight and nxt < iterations:
        what += (f", with the deferred call{'s' * (len(r.in_flight) > 1)} still in flight there "
                 f"({', '.join(r.in_flight)}) run in {'their' if len(r.in_flight) > 1 else 'its'} own place")
    err.print(f"resuming from {r.checkpoint} (iteration {r.iteration}); {what}", markup=False)
    if r.drained_at_stop is not None and nxt < iterations:
        err.print(f"note: not exact -- the stop that took this checkpoint of an asynchronous plan could not keep what "
                  f"was in flight ({r.drained_at_stop}), so it ran its deferred calls there: from iteration {nxt} on "
                  "reads see values newer than an uninterrupted run's, and the final state differs from it "
                  "(docs/reliability.md, stopping an asynchronous plan)", markup=False)


def recovery(err: Console, rec: dict[str, Any]) -> None:
    gpu = " (the GPU fault domain under MPS)" if rec["gpu_fatal"] and len(rec["restarted"]) > 1 else ""
    for rej in rec.get("rejected", ()):
        err.print(f"warning: checkpoint {rej} rejected", markup=False)
    err.print(f"warning: {rec['failed'].splitlines()[0]}\n  restarted {', '.join(rec['restarted'])}{gpu} and "
              f"continued from the checkpoint of iteration {rec['from_checkpoint']} (restart {rec['attempt']})",
              markup=False)


def _call_thread(stack: str) -> list[str]:
    """The lines of the thread running the component's call in a faulthandler dump: the one inside
    rose's worker (a compiled graph runs calls off the main thread), else the current thread."""
    blocks = [b for b in stack.replace("Current thread", "\0Current thread").replace("Thread 0x", "\0Thread 0x")
              .split("\0") if b.strip()]
    for block in blocks:
        if "interpreter/worker.py" in block:
            return block.splitlines()
    current = [b for b in blocks if b.startswith("Current thread")]
    return (current or blocks or [""])[0].splitlines()


def stacks(err: Console, by_component: dict[str, str], out_dir: Path | None) -> None:
    """The innermost frames of every component's stack after the watchdog fired."""
    for comp, stack in by_component.items():
        lines = [ln for ln in stack.strip().splitlines() if ln.strip()]
        if "most recent call first" in stack:  # faulthandler's order (a component process)
            lines = [ln for ln in _call_thread(stack) if ln.strip().startswith("File")][:6][::-1]
        err.print(f"  stack of {comp} (innermost last):", markup=False)
        for ln in lines[-6:]:
            err.print(f"    {ln}", markup=False)
    if out_dir is not None:
        err.print(f"  full stacks in {out_dir / 'stacks.txt'}", markup=False)


def nodes(out: Console, rows: list[dict[str, Any]]) -> None:
    t = Table(title="time per node (per iteration; split groups merged)", title_justify="left", show_edge=False)
    for col in ("node", "calls", "mean", "per iteration", "SM activity"):
        t.add_column(col, justify="left" if col == "node" else "right")
    for r in rows[:12]:
        act = r.get("sm_activity")
        t.add_row(r["node"].removeprefix("iteration."), str(r["invocations"]), f"{r['mean_s'] * 1e3:.2f} ms",
                  f"{r['per_iteration_s']:.3f} s", "-" if act is None else f"{act:.0%}")
    out.print(t)


def curve(out: Console, results: list[IterationResult]) -> None:
    """The learning curve at the end of a run: the first reward-like metric, averaged over windows."""
    if len(results) < 2:
        return
    name = next((k for k in results[-1].metrics for m in CURVE_METRICS if k.endswith("/" + m)), None)
    if name is None:
        return
    values = [(r.iteration, r.metrics[name]) for r in results if name in r.metrics]
    windows = min(10, len(values))
    size = max(1, len(values) // windows)
    blocks = "▁▂▃▄▅▆▇█"
    means = []
    for w in range(0, len(values), size):
        chunk = values[w:w + size]
        means.append((chunk[0][0], chunk[-1][0], sum(v for _, v in chunk) / len(chunk)))
    lo, hi = min(m for *_, m in means), max(m for *_, m in means)
    spark = "".join(blocks[int((m - lo) / (hi - lo + 1e-12) * (len(blocks) - 1))] for *_, m in means)
    out.print(f"{name}: {spark}  " + "  ".join(f"[{a}-{b}] {m:.3g}" for a, b, m in means), markup=False)


def staleness_histogram(lines: Iterable[Mapping[str, Any]]) -> dict[str, dict[int, float]]:
    """Per learner (the metric's prefix), how many samples it trained at each lag over `lines` (metrics
    lines, each with its own iteration's `PREFIX/staleness_hist_LAG` counts): the run's histogram."""
    out: dict[str, dict[int, float]] = {}
    for line in lines:
        for key, value in line.items():
            m = STALENESS_KEY.match(key)
            if m and isinstance(value, int | float):
                hist = out.setdefault(m["source"], {})
                hist[int(m["lag"])] = hist.get(int(m["lag"]), 0.0) + float(value)
    return out


def staleness_proof(wf: Workflow) -> dict[str, Any]:
    """What the checker proves of an asynchronous plan (issue 58), for `staleness.json`: per read (node and
    state), the largest lag in learner updates against the synchronous run and the chain it comes through;
    per source state (what is updated), the largest lag any read derives from it. {} for a synchronous plan."""
    from rose_dsl.versions import chain_text, version_proof

    budgets = {k: o.max_staleness for k, o in wf.state_objects().items()}
    reads: dict[tuple[str, str], dict[str, Any]] = {}
    sources: dict[str, int] = {}
    for (inv, state), p in version_proof(wf).items():
        key = (".".join(inv.path[1:]), state)
        if key not in reads or p.lag >= reads[key]["lag"]:
            reads[key] = {"read": key[0], "state": state, "lag": p.lag, "max_staleness": budgets.get(state, 0),
                          "chain": chain_text(p) if p.lag else None}
        if p.source:
            sources[p.source] = max(sources.get(p.source, 0), p.lag)
    if not reads:
        return {}
    return {"reads": [reads[k] for k in sorted(reads)], "by_source": dict(sorted(sources.items()))}


def staleness(out: Console, out_dir: Path | None, results: list[IterationResult], wf: Workflow | None = None) -> str | None:
    """The run's staleness histogram (issue 46): written to `staleness.json` in the run directory and printed
    in a line per learner. From `metrics.jsonl` when there is one (every iteration of the run, those before
    a resume too), else from this process's iterations. Nothing for a run whose learners report none and
    that is synchronous; an asynchronous plan's file also holds the checker's proof (`proof`: per read and
    per source state, the lag in learner updates), so a run's measurements can be held against it. Returns
    what is wrong when a learner measured a lag larger than any the checker proves (a bug in the checker),
    else None."""
    lines: list[Mapping[str, Any]] = [r.metrics for r in results]
    log = out_dir / "metrics.jsonl" if out_dir is not None else None
    if log is not None and log.is_file():
        lines = [json.loads(x) for x in log.read_text().splitlines() if x.strip()]
    hist = staleness_histogram(lines)
    proof = staleness_proof(wf) if wf is not None else {}
    if not hist and not proof:
        return None
    if out_dir is not None:
        doc: dict[str, Any] = {src: {"samples_by_lag": {str(k): v for k, v in sorted(h.items())}, "max_lag": max(h),
                                     "samples": sum(h.values())} for src, h in sorted(hist.items())}
        if proof:
            doc["proof"] = proof
        from interpreter.safe_io import write_atomic

        write_atomic(out_dir / "staleness.json", json.dumps(doc, indent=1) + "\n")
    for src, h in sorted(hist.items()):
        total = sum(h.values()) or 1.0
        parts = ", ".join(f"lag {k}: {v:.0f} ({v / total:.0%})" for k, v in sorted(h.items()))
        out.print(f"staleness ({src}): {parts}", markup=False)
    proved = max(proof.get("by_source", {}).values(), default=0)
    over = sorted((max(h), src) for src, h in hist.items() if proof and max(h) > proved)
    if over:
        lag, src = over[-1]
        return (f"the run measured lag {lag} ({src}: samples {lag} learner updates old) where the checker proves "
                f"at most {proved} for every read of this plan (staleness.json, `proof`): the checker accepted a "
                "plan it should not have")
    return None
