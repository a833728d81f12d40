"""Where an iteration of the long-tail LLM workload spends its time on the GPU (issue 45), in one process.

    python3 benchmarks/llm_longtail_probe.py [--workflow workflows/llm_grpo_longtail_gpu.yaml] [--set k=v ...]
        [--out DIR] [--gen-cap-s 150]

The components are built from the workflow's own arguments (no Ray, no rose runtime) and driven the way
the declared iteration drives them: sample, submit, collect (decode to the end), reference, reward,
the learner's minibatch steps. Each phase's seconds and the GPU's utilization while it ran (NVML,
sampled every 50 ms) go to DIR/probe.json after every phase, so a call that runs out of time still
brings back what it measured; generation also logs its progress (decode steps, slots in use, tokens)
every few seconds. Before any full phase it times single decode steps at a few (slots, context) points,
the cost model of continuous batching's tail.

A measurement tool for choosing the workload's parameters, not a result: the table's figures come from
`benchmarks/paper_table.py` (interleaved, on Ray).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


class UtilSampler:
    """NVML GPU utilization (the fraction of time a kernel ran), sampled on a thread; None without NVML."""

    def __init__(self, period_s: float = 0.05) -> None:
        self.period_s, self.samples, self._stop = period_s, [], threading.Event()
        try:
            import pynvml

            pynvml.nvmlInit()
            self._h, self._nvml = pynvml.nvmlDeviceGetHandleByIndex(0), pynvml
        except Exception:  # noqa: BLE001 -- no NVML (CPU machine): the probe still times the phases
            self._nvml = None
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            if self._nvml is not None:
                self.samples.append(self._nvml.nvmlDeviceGetUtilizationRates(self._h).gpu / 100.0)

    def mean_since(self, n: int) -> float | None:
        part = self.samples[n:]
        return sum(part) / len(part) if part else None


def _build(wf: Any, name: str, device: str, extra: dict[str, Any] | None = None) -> Any:
    comp = wf.components[name]
    mod, _, cls = comp.impl.partition(":")
    args = {**comp.args, **(extra or {})}
    if comp.device == "gpu":
        args["device"] = device
    return getattr(importlib.import_module(mod), cls)(**args)


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def step_costs(gen: Any, points: list[tuple[int, int]], reps: int = 10) -> list[dict[str, float]]:
    """Seconds of one decode step at (active slots, context length) points, eager and from CUDA graphs,
    and the largest difference of their logits (bf16: a few 1e-2 is kernel-order noise)."""
    import torch

    from examples.llm.decode_graphs import DecodeGraphs

    model, dev, out = gen.model, gen.device, []
    cache = model.new_cache(gen.max_batch, dev, torch.bfloat16)
    graphs = DecodeGraphs(model, cache)
    for slots, ctx in points:
        tok = torch.randint(0, 16, (gen.max_batch,))
        tok[slots:] = 0
        pos = torch.zeros(gen.max_batch, dtype=torch.long)
        pos[:slots] = ctx - 1
        row: dict[str, float] = {"slots": slots, "context": ctx}
        with gen._autocast():
            calls = {"eager_s": (model.decode, tok[:slots].to(dev), pos[:slots].to(dev), cache, None, False),
                     "graph_s": (graphs.decode, tok, pos, slots)}
            ref, fast = (c[0](*c[1:]) for c in calls.values())
            row["max_abs_diff"] = float((ref.float() - fast.float()).abs().max())
            for name, (fn, *fargs) in calls.items():
                _sync()
                t0 = time.perf_counter()
                for _ in range(reps):
                    fn(*fargs)
                _sync()
                row[name] = (time.perf_counter() - t0) / reps
        out.append(row)
        print(f"decode step {row}", flush=True)
    return out


class Breakdown:
    """Seconds inside chosen methods of the generation loop (synchronized: a GPU wait lands where it is owed)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def wrap(self, obj: Any, name: str) -> None:
        fn = getattr(obj, name)

        def timed(*a: Any, **k: Any) -> Any:
            _sync()
            t0 = time.perf_counter()
            val = fn(*a, **k)
            _sync()
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0
            return val

        setattr(obj, name, timed)


def generate(gen: Any, prompts: Any, it: int, cap_s: float, log_every_s: float = 5.0) -> dict[str, Any]:
    """Submit and decode every completion to its end (the declared `collect`), logging progress."""
    flight = gen._flight
    parts = Breakdown()
    for name in ("_admit", "_step", "_sample", "_record"):
        parts.wrap(flight, name)
    keys = flight.add(prompts, it, gen._prompt_ids(prompts, None))
    want = flight._rows_of(keys)
    t0 = last = time.perf_counter()
    while not bool(flight.done[want].all()):
        flight._admit()
        if flight.active:
            flight._step()
        now = time.perf_counter()
        if now - last > log_every_s:
            last = now
            print(f"  gen {now - t0:6.1f} s: {flight.counts['decode_steps']} steps, {len(flight.active)} slots "
                  f"active, {int(flight.done[want].sum())}/{len(want)} done", flush=True)
        if now - t0 > cap_s:
            return {"capped": True, "seconds": now - t0, "done": int(flight.done[want].sum()), "rows": len(want),
                    "counts": dict(flight.counts), "breakdown_s": parts.seconds}
    _sync()
    counts = dict(flight.counts)
    roll = gen.collect(prompts, it)["rollouts"]  # everything is decoded: this only assembles the record
    return {"capped": False, "seconds": time.perf_counter() - t0, "rows": len(want), "counts": counts,
            "breakdown_s": parts.seconds, "graphs": flight.graphs.captured if flight.graphs is not None else 0,
            "tokens": int(roll["lengths"].sum()), "max_len": int(roll["lengths"].max()), "rollouts": roll}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workflow", default=str(ROOT / "workflows" / "llm_grpo_longtail_gpu.yaml"))
    ap.add_argument("--set", action="append", default=[], help="NAME=VALUE (a workflow param)")
    ap.add_argument("--out", default="/tmp/probe")
    ap.add_argument("--gen-cap-s", type=float, default=150.0)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--gen-arg", action="append", default=[], help="NAME=VALUE for the generator (e.g. cuda_graphs=false)")
    ap.add_argument("--iterations", type=int, default=2)
    ap.add_argument("--no-steps", action="store_true", help="skip the single-step timings")
    args = ap.parse_args()
    import torch

    from rose_dsl import load_workflow

    sets = {k: yaml.safe_load(v) for k, v in (s.split("=", 1) for s in args.set)}
    wf = load_workflow(Path(args.workflow), sets)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    res: dict[str, Any] = {"workflow": args.workflow, "sets": sets, "params": dict(wf.params),
                           "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
                           "torch": torch.__version__, "phases": {}}
    util = UtilSampler()

    def phase(name: str, fn: Any, *fargs: Any) -> Any:
        n, t0 = len(util.samples), time.perf_counter()
        val = fn(*fargs)
        _sync()
        res["phases"][name] = {"seconds": time.perf_counter() - t0, "gpu_util": util.mean_since(n)}
        print(f"{name}: {res['phases'][name]}", flush=True)
        (out_dir / "probe.json").write_text(json.dumps(res, indent=1, default=str))
        return val

    gen_args = {k: yaml.safe_load(v) for k, v in (s.split("=", 1) for s in args.gen_arg)}
    res["gen_args"] = gen_args
    gen = phase("build_generator", _build, wf, "generator", args.device, gen_args)
    points = [(512, 64), (512, 2048), (128, 2048), (16, 2048), (16, 256)]
    res["step_costs"] = step_costs(gen, points) if gen.device.type == "cuda" and not args.no_steps else []
    src = _build(wf, "prompts", args.device)
    ref = phase("build_reference", _build, wf, "reference", args.device)
    learner = phase("build_learner", _build, wf, "learner", args.device)
    reward = phase("build_reward", _build, wf, "reward", args.device)
    for it in range(args.iterations):
        prompts = src.next_batch(it)["prompts"]
        g = phase(f"generate_{it}", generate, gen, prompts, it, args.gen_cap_s)
        res["phases"][f"generate_{it}"].update({k: v for k, v in g.items() if k != "rollouts"})
        (out_dir / "probe.json").write_text(json.dumps(res, indent=1, default=str))
        if g["capped"]:
            return 0
        roll = g["rollouts"]
        ref_logp = phase(f"reference_{it}", ref.score, roll)["ref_logp"]
        rew = phase(f"reward_{it}", reward.score, roll)["reward"]
        for mb in range(int(wf.params["minibatches"])):
            phase(f"learn_{it}_{mb}", learner.update, roll, ref_logp, rew, mb)
        w = phase(f"publish_{it}", learner.get_weights)
        phase(f"sync_{it}", gen.load_weights, w["w"], w["hash"])
    reward.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
