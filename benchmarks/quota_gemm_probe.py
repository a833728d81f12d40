"""Is a bf16 GEMM correct under every MPS SM quota? The kernel-level half of the quota-NaN root cause
(issue 16; `quota_nan_root_cause.py` found the first non-finite value in a bf16 Linear with finite inputs
at 78 SMs, finite when the same module ran alone on fresh memory).

Per quota, a fresh process (a quota is fixed when CUDA starts) runs the GEMM shapes of the embodied
trainer (forward x @ W^T + b and the two backward products) in bf16 and checks every output against a
float32 reference on the CPU, twice: with the output memory POISONED (the caching allocator is first
filled with NaN and freed, so any output element the kernel does not write reads NaN) and with it zeroed
(an unwritten element then reads 0: finite, but wrong). Variants change one suspect at a time:
`ws0` (no cuBLASLt workspace: no split-K reductions through it), `carveout` (cuBLASLt told to target
fewer SMs), `fp16`. Writes OUT_DIR/quota_gemm_probe.json; prints a table last.

  python3 benchmarks/quota_gemm_probe.py OUT_DIR [--quotas 100,60,50] [--variants default,ws0]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r'''
import json, os, sys, torch
variant = sys.argv[1]
dev = torch.device("cuda")
if variant == "carveout":
    torch._C._set_sm_carveout_experimental(int(os.environ.get("PROBE_CARVEOUT", "8")))
dtype = torch.float16 if variant == "fp16" else torch.bfloat16
# (rows, in, out): the trainer's Linear layers (hidden 512, mlp 2048, kv 1024) over the row counts of its
# minibatches (1600 x 4 tokens), value batches (4096 x 4, 2304 x 4) and the expert's chunk tokens (x 2)
shapes = [(r, k, n) for r in (6400, 9216, 16384) for k, n in ((512, 1024), (512, 2048), (2048, 512))]
out = {"variant": variant, "sm_count": torch.cuda.get_device_properties(0).multi_processor_count,
       "quota": os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), "cases": []}
g = torch.Generator().manual_seed(0)

def poison(value):
    # fill (nearly) all the memory the allocator will hand out next with `value`, then free it
    blocks = [torch.full((64 << 20,), value, dtype=torch.float32, device=dev) for _ in range(24)]
    del blocks

bad_total = 0
for rows, k, n in shapes:
    x = (torch.randn(rows, k, generator=g) * 0.5)
    w = (torch.randn(n, k, generator=g) / k ** 0.5)
    b = torch.randn(n, generator=g) * 0.1
    gy = torch.randn(rows, n, generator=g)
    ref_y = (x @ w.T + b).double()  # float32 on the CPU: far more exact than bf16, and no GPU kernel
    ref_gx = (gy @ w).double()
    ref_gw = (gy.T @ x).double()
    xd, wd, bd, gyd = (t.to(dev, dtype) for t in (x, w, b, gy))
    row = {"shape": [rows, k, n]}
    for fill in ("nan", "zero"):
        for name, fn, ref in (("fwd", lambda: torch.nn.functional.linear(xd, wd, bd), ref_y),
                              ("dgrad", lambda: gyd @ wd, ref_gx),
                              ("wgrad", lambda: gyd.T @ xd, ref_gw)):
            torch.cuda.synchronize()
            poison(float("nan") if fill == "nan" else 0.0)
            y = fn()
            torch.cuda.synchronize()
            yc = y.double().cpu()
            nonfinite = int((~torch.isfinite(yc)).sum())
            err = float(((yc - ref).abs().nan_to_num(posinf=1e30)).max() / ref.abs().max())
            wrong = int(((yc - ref).abs() > 0.05 * ref.abs().max()).sum())  # far beyond bf16 rounding
            row[f"{name}_{fill}"] = {"nonfinite": nonfinite, "wrong": wrong, "max_rel_err": err}
            bad_total += nonfinite + wrong
    out["cases"].append(row)
out["bad_elements"] = bad_total
print("PROBE " + json.dumps(out))
'''


def main() -> None:
    dest = Path(sys.argv[1])
    dest.mkdir(parents=True, exist_ok=True)
    args = sys.argv[2:]
    quotas = [int(q) for q in (args[args.index("--quotas") + 1] if "--quotas" in args else
                               "100,60,50,70,80,30,20,40,90,10").split(",")]
    variants = (args[args.index("--variants") + 1] if "--variants" in args else "default").split(",")
    root = tempfile.mkdtemp(prefix="mps-")
    env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=f"{root}/pipe", CUDA_MPS_LOG_DIRECTORY=f"{root}/log",
               PYTHONPATH=f"{ROOT}:{os.environ.get('PYTHONPATH', '')}")
    os.makedirs(f"{root}/pipe")
    os.makedirs(f"{root}/log")
    subprocess.run(["nvidia-cuda-mps-control", "-d"], env=env, check=True)
    import torch

    report: dict = {"torch": torch.__version__, "cuda": torch.version.cuda, "gpu": torch.cuda.get_device_name(0),
                    "runs": []}
    try:
        for variant in variants:
            for quota in quotas:
                extra = {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(quota)}
                if variant == "ws0":
                    extra["CUBLASLT_WORKSPACE_SIZE"] = "0"
                    extra["CUBLAS_WORKSPACE_CONFIG"] = ":0:0"
                t0 = time.perf_counter()
                p = subprocess.run([sys.executable, "-c", CHILD, variant], env=dict(env, **extra), capture_output=True,
                                   text=True, timeout=180)
                line = next((ln for ln in reversed(p.stdout.splitlines()) if ln.startswith("PROBE ")), None)
                r = json.loads(line[6:]) if line else {"variant": variant, "quota": quota, "rc": p.returncode,
                                                       "stderr": p.stderr[-1500:]}
                r["wall_s"] = round(time.perf_counter() - t0, 1)
                report["runs"].append(r)
                (dest / "quota_gemm_probe.json").write_text(json.dumps(report, indent=1))
                worst = [c["shape"] for c in r.get("cases", []) if any(v["nonfinite"] or v["wrong"]
                                                                       for k, v in c.items() if k != "shape")]
                print(f"{variant:<9} quota {quota:>3} SMs {r.get('sm_count')}: bad elements {r.get('bad_elements')} "
                      f"in {len(worst)} shapes {worst[:4]} ({r['wall_s']} s) {r.get('stderr', '')[-200:]}", flush=True)
    finally:
        subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", env=env, text=True)


if __name__ == "__main__":
    main()
