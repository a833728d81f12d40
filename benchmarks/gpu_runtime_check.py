#!/usr/bin/env python3
"""Check rose's runtime building blocks on a real GPU: MPS, SM quotas, SM-activity sampling, traces.

    python3 benchmarks/gpu_runtime_check.py OUT.json [--quotas 10,25,50,75,91,100] [--sweep-step 0]
                                                     [--activity-quotas 100,25] [--seconds 2]

What it does (every step is guarded: a failure is recorded in ``errors`` and the rest still runs, and
the JSON is always written):

1. machine and versions (NVML, torch, driver, CUDA), without initialising CUDA in this process;
2. the unrestricted SM count (a fresh client, no MPS);
3. starts MPS through ``interpreter.mps.MpsDaemon`` (or reuses a running daemon);
4. probes the SM count a fresh MPS client sees at each quota, next to ``expected_sms``;
5. for each activity quota: runs a bf16 matmul in a fresh MPS client (idle 0.5 s, busy ``--seconds``,
   idle 0.3 s) while two ``ActivitySampler``s run (GPM and the utilization fallback); records the
   phases in an ExecutionTrace and reports each phase's time-weighted mean SM activity, the fraction
   of time below 50%, and the sampling interval statistics;
6. writes ``OUT.trace.json`` (Chrome/Perfetto) of the last activity run, and stops MPS (checking that
   no daemon it started is left).

Needs torch with CUDA and nvidia-ml-py; not Ray.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from interpreter.chrome_trace import validate_trace_events, write_chrome_trace  # noqa: E402
from interpreter.gpu_activity import ActivitySampler, fraction_below, mean_activity  # noqa: E402
from interpreter.mps import (  # noqa: E402
    MpsDaemon,
    expected_sms,
    find_running_daemon,
    probe_sm_count,
)
from interpreter.trace import ExecutionTrace  # noqa: E402

_MATMUL = r"""
import json, sys, time, torch
n, seconds = int(sys.argv[1]), float(sys.argv[2])
a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
(a @ a); torch.cuda.synchronize()
props = torch.cuda.get_device_properties(0)
t_idle0 = time.perf_counter_ns(); time.sleep(0.5); t_idle1 = time.perf_counter_ns()
iters = 0
t0 = time.perf_counter_ns()
while time.perf_counter_ns() - t0 < seconds * 1e9:
    for _ in range(10):
        a @ a
    torch.cuda.synchronize()
    iters += 10
t1 = time.perf_counter_ns()
time.sleep(0.3)
t_end = time.perf_counter_ns()
print(json.dumps({"pid": __import__("os").getpid(), "sms": props.multi_processor_count, "n": n,
                  "iters": iters, "idle": [t_idle0, t_idle1], "busy": [t0, t1], "tail": [t1, t_end],
                  "tflops": 2 * n ** 3 * iters / ((t1 - t0) / 1e9) / 1e12}))
"""


def _nvml_index(cuda_index: int) -> int:
    """NVML numbers GPUs physically; CUDA_VISIBLE_DEVICES may remap (integers only handled)."""
    vis = os.environ.get("CUDA_VISIBLE_DEVICES")
    if vis:
        parts = [p.strip() for p in vis.split(",") if p.strip()]
        if cuda_index < len(parts) and parts[cuda_index].isdigit():
            return int(parts[cuda_index])
    return cuda_index


def _machine(gpu: int) -> tuple[dict, dict]:
    machine = {"hostname": socket.gethostname(), "platform": platform.platform(),
               "cpu_count": os.cpu_count(), "python": sys.version.split()[0]}
    versions: dict = {}
    try:
        import torch

        versions["torch"] = torch.__version__
        versions["torch_cuda"] = torch.version.cuda
    except Exception as e:  # noqa: BLE001 - recorded in the results instead of a version
        versions["torch"] = f"unavailable: {e}"
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(_nvml_index(gpu))
        name = pynvml.nvmlDeviceGetName(h)
        machine["gpu_name"] = name.decode() if isinstance(name, bytes) else name
        machine["gpu_count"] = pynvml.nvmlDeviceGetCount()
        machine["gpu_memory_gib"] = round(pynvml.nvmlDeviceGetMemoryInfo(h).total / 2**30, 1)
        for key, fn in (("driver", pynvml.nvmlSystemGetDriverVersion), ("nvml", pynvml.nvmlSystemGetNVMLVersion)):
            v = fn()
            versions[key] = v.decode() if isinstance(v, bytes) else v
        versions["cuda_driver_api"] = pynvml.nvmlSystemGetCudaDriverVersion()
        pynvml.nvmlShutdown()
    except Exception as e:  # noqa: BLE001 - no NVML here: recorded, the check goes on
        machine["nvml_error"] = str(e)
    try:
        versions["rose_commit"] = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"],
                                                 capture_output=True, text=True).stdout.strip()
    except OSError:
        pass
    return machine, versions


def _activity_run(mps: MpsDaemon, quota: int | None, gpu: int, n: int, seconds: float) -> tuple[dict, ExecutionTrace, dict]:
    env = dict(os.environ)
    env.pop("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", None)
    env.update(mps.client_env(quota))
    gpm = ActivitySampler(_nvml_index(gpu), interval_s=0.02, prefer="gpm")
    util = ActivitySampler(_nvml_index(gpu), interval_s=0.02, prefer="utilization")
    with gpm, util:
        time.sleep(0.2)
        t_call = time.perf_counter_ns()
        p = subprocess.run([sys.executable, "-c", _MATMUL, str(n), str(seconds)], env=env, capture_output=True,
                           text=True, timeout=300)
        t_ret = time.perf_counter_ns()
        time.sleep(0.1)
    if p.returncode != 0:
        raise RuntimeError(f"matmul client failed: {p.stderr.strip()[-800:]}")
    child = json.loads(p.stdout.strip().splitlines()[-1])
    trace = ExecutionTrace(meta={"quota": quota})
    root = trace.begin("check", component="driver", host_start_ns=t_call)
    for phase in ("idle", "busy", "tail"):
        cid = trace.begin(f"check.{phase}", component=f"matmul@{quota or 100}%", parent=root, pid=child["pid"],
                          gpu=gpu, host_start_ns=child[phase][0])
        trace.end(cid, host_end_ns=child[phase][1])
    trace.end(root, host_end_ns=t_ret)
    out: dict = {"quota": quota, "client_sms": child["sms"], "n": n, "iters": child["iters"],
                 "tflops": round(child["tflops"], 2), "sources": {}}
    for s in (gpm, util):
        samples = s.samples()
        dts = [(b.t_start_ns - a.t_start_ns) / 1e6 for a, b in zip(samples, samples[1:], strict=False)]
        res = {"source": s.source, "reason": s.reason, "errors": s.errors, "n_samples": len(samples),
               "interval_ms_median": round(statistics.median(dts), 3) if dts else None,
               "interval_ms_p95": round(sorted(dts)[int(0.95 * (len(dts) - 1))], 3) if dts else None,
               "fraction_below_0.5": fraction_below(samples, 0.5, (child["idle"][0], child["tail"][1]))}
        for phase in ("idle", "busy", "tail"):
            res[f"mean_{phase}"] = mean_activity(samples, trace.intervals(f"check.{phase}"))
        out["sources"][s.source if s.source != "none" else f"none(prefer={s.prefer})"] = res
    return out, trace, {0: gpm.samples()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--gpu", type=int, default=0, help="CUDA device index (default 0)")
    ap.add_argument("--quotas", default="10,25,50,75,91,100")
    ap.add_argument("--sweep-step", type=int, default=0, help="also probe every N percent (slow: ~3 s each)")
    ap.add_argument("--activity-quotas", default="100,25")
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--n", type=int, default=8192, help="matmul size")
    ap.add_argument("--run-dir", type=Path, default=None, help="where MPS's directory goes (default: a temp dir)")
    args = ap.parse_args(argv)
    t_start = time.time()
    errors: list[dict] = []

    def guard(step: str, fn, default=None):
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 - record and continue: partial results are still useful
            errors.append({"step": step, "error": f"{type(e).__name__}: {e}",
                           "traceback": traceback.format_exc()[-2000:]})
            print(f"[{step}] FAILED: {e}", file=sys.stderr)
            return default

    machine, versions = _machine(args.gpu)
    quotas = [int(q) for q in args.quotas.split(",") if q]
    if args.sweep_step > 0:
        quotas = sorted(set(quotas) | set(range(args.sweep_step, 101, args.sweep_step)))
    result: dict = {"benchmark": "gpu_runtime_check", "format": 1,
                    "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "machine": machine, "versions": versions, "config": {**vars(args), "out": str(args.out),
                                                                         "run_dir": str(args.run_dir)},
                    "errors": errors}
    total = guard("sm_count_without_mps", lambda: probe_sm_count(None))
    result["sm_count"] = total
    print(f"SMs without MPS: {total}")
    own_run_dir = args.run_dir is None
    run_dir = args.run_dir or Path(tempfile.mkdtemp(prefix="rose-gpu-check-"))
    mps = MpsDaemon(run_dir)
    try:
        guard("mps_start", mps.start)
        result["mps"] = {"active": mps.active, "owned": mps.owned, "warning": mps.warning,
                         "pipe_dir": mps.pipe_dir, "daemon_pid": mps.pid,
                         "detect_reason": mps.availability.reason if mps.availability else None}
        print(f"MPS: active={mps.active} owned={mps.owned} {mps.warning or ''}")
        probes = result["sm_probe"] = []
        for q in quotas:
            t0 = time.perf_counter()
            got = guard(f"probe_{q}", lambda q=q: probe_sm_count(q, mps.client_env(q)))
            exp = expected_sms(q, total) if isinstance(total, int) else None
            probes.append({"percent": q, "measured_sms": got, "expected_sms": exp, "match": got is not None and got == exp,
                           "probe_s": round(time.perf_counter() - t0, 2)})
            print(f"  quota {q:3d}%: measured {got} expected {exp}")
        acts = result["activity"] = []
        last = None
        for q in [int(x) for x in args.activity_quotas.split(",") if x]:
            r = guard(f"activity_{q}", lambda q=q: _activity_run(mps, None if q >= 100 else q, args.gpu, args.n,
                                                                 args.seconds))
            if r is not None:
                acts.append(r[0])
                last = r
                for src, v in r[0]["sources"].items():
                    print(f"  activity quota {q}% [{src}]: idle {v['mean_idle']} busy {v['mean_busy']} "
                          f"(n={v['n_samples']}, dt~{v['interval_ms_median']} ms), {r[0]['tflops']} TFLOP/s")
        if last is not None:
            tpath = args.out.with_suffix(".trace.json")
            guard("chrome_trace", lambda: write_chrome_trace(tpath, last[1], last[2]))
            result["chrome_trace"] = {"path": str(tpath), "problems": guard(
                "chrome_trace_validate", lambda: validate_trace_events(json.loads(tpath.read_text())))}
    finally:
        owned, pipe = mps.owned, mps.pipe_dir
        mps.stop()
        if owned:
            time.sleep(0.5)
            left = find_running_daemon(pipe_dir=pipe) if pipe else None
            result.setdefault("mps", {})["stopped_cleanly"] = left is None
            result["mps"]["daemon_pid_after_stop"] = left[0] if left else None
        if own_run_dir:
            shutil.rmtree(run_dir, ignore_errors=True)
    result["wall_s"] = round(time.time() - t_start, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1, default=str))
    print(f"wrote {args.out} ({len(errors)} errors)")
    return 0 if not errors else 1


if __name__ == "__main__":
    sys.exit(main())
