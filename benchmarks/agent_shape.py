"""The declared agent workflow's shape (issue 62), before any plan is built: how much of the declared
iteration is generation and how much is tool wait (the issue asks >= 40% and >= 30% on the GPU), and how
short the declared graph could get with unlimited overlap.

It runs the declared workflow in this process (the runtime's own pieces, as `rose execute` does, with no
run directory: no checkpoint or export to write at the end, which for the GPU variant's weights and
optimizer state would cost more than the whole time limit allows), one warm-up iteration and up to
`--timed` timed ones, each begun only when the time the last one took still fits `--limit-s`, counted from
this process's start, less `--margin-s` for the teardown; the JSON is rewritten after every iteration, so a
run killed at the limit leaves what it measured. Then, per
timed iteration, from the calls' own trace:

* `generation_share`: the seconds in the generation node's calls (`--gen-node`, default `turn.act`: decode
  until EOS, the tool-call token or the turn's budget) over the iteration's seconds;
* `tool_share`: the same for the tool node (`--tool-node`, default `turn.tool`: the calls on the pool, the
  wait for the slowest of a turn's calls included);
* `critical_path_s`: the declared graph's longest dependency chain, each call at its measured median
  (`rose_dsl.optimizer.bound.reorder_bound`, what `rose optimize`'s report calls the reorder bound): no
  rewire, fusion or interleave of whole calls can make an iteration shorter;
* `busiest_process_s`: the busiest process's busy time (its calls' merged intervals): no row-group split
  with unlimited overlap can go below it either, if k smaller calls take at least as long together as the
  one they replace (a fixed cost per call; `bound.local_saving_bound`'s assumption) -- the bound for the
  plans issue 62 builds, which split the turns into row groups;
* `lower_bound_s`, `speedup_bound`: the larger of the two, and the iteration over it.

Medians over the timed iterations; every iteration's figures are in `iterations`.

    python3 benchmarks/agent_shape.py workflows/llm_agent_tools_gpu.yaml --backend ray --out $OUT/agent_shape.json
    python3 benchmarks/agent_shape.py workflows/llm_agent_tools.yaml --set prompts=4 --set k=4 --out /tmp/s.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

STARTED = time.monotonic()
GEN_TARGET, TOOL_TARGET = 0.40, 0.30  # issue 62's shape


def _merged_s(intervals: list[tuple[int, int]]) -> float:
    total, end = 0, None
    for a, b in sorted(intervals):
        if end is None or a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total / 1e9


def shape(wf: Any, runs: list[Any], gen_node: str, tool_node: str) -> dict[str, Any]:
    """The figures of the module doc from measured iterations of `wf` (`IterationRun`s, the timed ones)."""
    from rose_dsl.optimizer.bound import reorder_bound

    gen_source, tool_source = f"iteration.{gen_node}", f"iteration.{tool_node}"
    rows = []
    for run in runs:
        gen = sum(c.seconds for c in run.calls if c.source == gen_source)
        tool = sum(c.seconds for c in run.calls if c.source == tool_source)
        busy: dict[str, list[tuple[int, int]]] = {}
        for c in run.calls:
            busy.setdefault(c.component, []).append((c.start_ns, c.end_ns))
        by_process = {p: _merged_s(iv) for p, iv in busy.items()}
        top = max(by_process, key=by_process.__getitem__)
        rows.append({"iteration": run.iteration, "iteration_s": run.seconds, "generation_s": gen, "tool_wait_s": tool,
                     "generation_share": gen / run.seconds, "tool_share": tool / run.seconds,
                     "busiest_process": top, "busiest_process_s": by_process[top],
                     "busy_s": dict(sorted(by_process.items()))})
    if not rows:
        return {"error": "no timed iteration completed within the limit"}

    def med(key: str) -> float:
        return statistics.median(r[key] for r in rows)

    bound = reorder_bound(wf, runs)
    critical = bound["seconds"] if bound else None
    busiest = med("busiest_process_s")
    lower = max(x for x in (critical, busiest) if x is not None)
    iteration = med("iteration_s")
    gen_share, tool_share = med("generation_share"), med("tool_share")
    return {"iteration_s": iteration, "generation_share": gen_share, "tool_share": tool_share,
            "shape_ok": gen_share >= GEN_TARGET and tool_share >= TOOL_TARGET,
            "targets": {"generation_share": GEN_TARGET, "tool_share": TOOL_TARGET},
            "critical_path_s": critical, "critical_path": (bound or {}).get("chain"),
            "busiest_process_s": busiest, "lower_bound_s": lower,
            "speedup_bound": iteration / lower if lower else None, "iterations": rows}


def _runs(wf: Any, records: list[Any], results: list[Any]) -> list[Any]:
    """The runner's trace as one `IterationRun` per completed iteration (its calls, identified as the
    optimizer identifies them)."""
    from rose_dsl.measurement import Call, IterationRun, call_identity

    identity = call_identity(wf)
    by_iteration: dict[int, list[Any]] = {}
    for r in records:
        end = r.end_ns
        if end is None or r.status != "ok":
            continue
        indices = tuple(i for _, i in r.loop_indices)
        k = indices[0] if indices else 0
        source, base = identity.get(r.node, ("", ""))
        by_iteration.setdefault(k, []).append(Call(r.node, r.component, k, indices, r.host_start_ns, end, r.rows,
                                                   None, source, base))
    runs = []
    for res in results:
        calls = tuple(sorted(by_iteration.get(res.iteration, ()), key=lambda c: c.start_ns))
        if calls:
            runs.append(IterationRun(res.seconds, calls, calls[0].start_ns, max(c.end_ns for c in calls), res.iteration))
    return runs


def _device() -> str:
    try:
        import torch

        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    except Exception:  # noqa: BLE001 - only a label
        return "unknown"


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from rich.console import Console

    from interpreter.runner import RunConfig, Runner
    from rose_cli.run import ExecuteOptions, build_backend, gpu_session, prepare
    from rose_dsl import load_workflow
    from rose_dsl.cli import set_overrides
    from rose_dsl.trust import DEFAULT_ALLOWED

    sets = set_overrides(args.set)
    n = args.warmup + args.timed
    wf = load_workflow(args.workflow, {**sets, "iterations": n})
    err = Console(stderr=True)
    opts = ExecuteOptions(backend=args.backend, iterations=n, quiet=True, loggers=(), export=False, trace=False,
                          allowed=DEFAULT_ALLOWED)
    deadline = STARTED + args.limit_s - args.margin_s
    stopped: list[str] = []

    def document(runner: Any) -> dict[str, Any]:
        results = list(runner.results)
        timed = [r for r in results if r.iteration >= args.warmup]
        out = shape(wf, _runs(wf, runner.trace.records(), timed or results), args.gen_node, args.tool_node)
        return {"workflow": args.workflow, "sets": sets, "device": _device(), "backend": args.backend,
                "warmup_iterations": args.warmup, "timed_iterations": len(timed),
                "warmup_only": not timed, "warmup_s": [r.seconds for r in results if r.iteration < args.warmup],
                "stopped": stopped[0] if stopped else "", "wall_s": time.monotonic() - STARTED, **out}

    with ExitStack() as teardown:
        schedule = prepare(wf, opts, teardown, err)
        gpu = teardown.enter_context(gpu_session(wf, opts, err))
        backend = build_backend(wf, schedule, opts, gpu, err)
        teardown.callback(backend.shutdown)
        started = time.monotonic()
        runner = Runner(wf, backend, RunConfig(iterations=n, loggers=(), tensorboard=False, export=False, trace=False),
                        schedule, None, gpu.sampler)

        def stop() -> str | None:
            """Before each iteration: what was measured so far written (a run killed at the limit leaves it), and
            a stop when the last iteration's time would not end before the deadline."""
            if not runner.results:
                return None
            write(args.out, document(runner))
            last = runner.results[-1].seconds
            if time.monotonic() + last > deadline:
                stopped.append(f"iteration {len(runner.results)} would end past the limit ({last:.1f} s the last one, "
                               f"{deadline - time.monotonic():.1f} s left)")
                return stopped[-1]
            return None

        runner.run(stop=stop)
        print(f"{len(runner.results)} iteration(s) in {time.monotonic() - started:.1f} s (after "
              f"{started - STARTED:.1f} s of start-up)", file=sys.stderr)
        doc = document(runner)
    return doc


def write(path: Path | None, doc: dict[str, Any]) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc, indent=1) + "\n")
        tmp.replace(path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("workflow")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE")
    p.add_argument("--backend", default="local", choices=("local", "ray"))
    p.add_argument("--warmup", type=int, default=1, help="iterations run first and not timed")
    p.add_argument("--timed", type=int, default=3, help="at most this many timed iterations")
    p.add_argument("--limit-s", type=float, default=150.0, help="wall seconds for the whole measurement, from start")
    p.add_argument("--margin-s", type=float, default=20.0, help="of which kept for the teardown")
    p.add_argument("--gen-node", default="turn.act")
    p.add_argument("--tool-node", default="turn.tool")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    doc = measure(args)
    write(args.out, doc)
    print(json.dumps(doc, indent=1))
    if "error" in doc:
        return 1
    print(f"shape on {doc['device']}: generation {doc['generation_share']:.0%} (>= {GEN_TARGET:.0%}), tool wait "
          f"{doc['tool_share']:.0%} (>= {TOOL_TARGET:.0%}) of {doc['iteration_s']:.2f} s; lower bound "
          f"{doc['lower_bound_s']:.2f} s (critical path {doc['critical_path_s'] or float('nan'):.2f} s, busiest process "
          f"{doc['busiest_process_s']:.2f} s): at most {doc['speedup_bound']:.2f}x", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
